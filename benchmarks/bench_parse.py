"""Benchmark: CPU per event of parse/normalize on live-sized micro-batches, by stage.

Live sources (``toolwatch tail``, ``kafka``, ``run``) hand ``Pipeline.transform`` one
micro-batch per stream per flush: 1k-10k lines, sometimes 80k on catch-up. Fixed per-call
costs (statement binding, Arrow registration, schema casts, polars frames) that vanish in
a 1M-line ``ingest`` dominate there. This prints, per batch size, the CPU microseconds
per event of each stage, measured as process CPU time (``time.process_time``: steadier than
the wall clock on a shared machine, and it counts polars' worker threads):

* ``prepare``   -- byte checks, secret scan and redaction (``Parser._prepare``);
* ``sql``       -- the DuckDB statement (``Parser._run_sql_safely``);
* ``post``      -- rest of ``Parser._parse`` (ordering, outcome, raw column);
* ``transform`` -- ``Pipeline._transform`` after parsing (pair, sessionize, events);
* ``total``     -- ``Pipeline.transform`` end to end (parse included).

With ``--old TREE`` the same figures are measured for another checkout in a child
process, interleaved with this one (best of ``--repeat`` rounds each), and the old/new
ratios of ``total`` are printed: run both in one go on a shared machine.

Usage::

    git archive HEAD | tar -x -C /tmp/old
    python benchmarks/bench_parse.py [--events 160000] [--sizes 1000,10000,80000] \
        [--repeat 5] [--old /tmp/old]
    python benchmarks/bench_parse.py --streams 4,2500 --repeat 8   # one parse per flush
    python benchmarks/bench_parse.py --scan --sizes 10000,40000     # scan engines, GIL

``--scan`` compares the secret/rare-name scan of ``Parser._prepare`` by engine: the RE2
buffer scan (one call per hit line), Arrow's ``match_substring_regex`` (one call per
pattern, compiled per call) and a DuckDB prepared statement (one call per batch), alone
and beside a thread spinning in Python (the commit thread's GIL contention). Figures are
the scanning thread's CPU and wall us/line, and the GIL releases (RE2 calls) per batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
STAGES = ("prepare", "sql", "post", "transform", "total")
#: Top-level folders installed under ``toolwatch.`` (pyproject's package-dir mapping).
MAPPED = ("ingest", "detectors", "dashboard", "sample_logs")


def overlay(tree: Path, into: Path) -> Path:
    """A directory whose ``toolwatch`` package is ``tree``'s, subpackages included.

    The editable install maps ``toolwatch.ingest`` (etc.) to this checkout's folders
    whatever ``PYTHONPATH`` says, so a bare ``PYTHONPATH=/tmp/old`` would measure the old
    ``toolwatch/`` with the new ``ingest/``. Symlinks put every package of ``tree`` under
    one ``toolwatch`` folder that the path finder resolves first.
    """
    pkg = into / "toolwatch"
    pkg.mkdir(parents=True, exist_ok=True)
    for p in (tree / "toolwatch").iterdir():
        if not (pkg / p.name).exists():
            (pkg / p.name).symlink_to(p.resolve())
    for name in MAPPED:
        if (tree / name).is_dir() and not (pkg / name).exists():
            (pkg / name).symlink_to((tree / name).resolve())
    return into


def bench_file(events: int) -> Path:
    """The generator's mixed-style bench file, cached in the temp directory."""
    path = Path(tempfile.gettempdir()) / f"tw-bench-parse-{events}.jsonl"
    if not path.exists():
        from toolwatch.sample_logs.generate import generate_bench

        generate_bench(events, path)
    return path


def measure(path: Path, sizes: list[int]) -> dict[str, dict[str, float]]:
    """Per batch size, CPU us/event of each stage over the whole file (one pass)."""
    import numpy as np
    import pyarrow as pa
    from toolwatch.ingest.outcome import outcome_column
    from toolwatch.ingest.parse import ParserPool, _line_offsets, in_input_order
    from toolwatch.ingest.pipeline import Pipeline
    from toolwatch.ingest.records import RawBatch, split_lines

    from toolwatch.config import Config

    os.environ.setdefault("TOOLWATCH_HMAC_KEY", "00" * 32)
    buf = path.read_bytes()
    lines, offsets, _ = split_lines(buf)
    n = len(lines)
    out: dict[str, dict[str, float]] = {}
    for size in sizes:
        cfg = Config()
        cfg.store.data_dir = tempfile.mkdtemp(prefix="tw-bench-parse-")
        cfg.ingest.parse_workers = 1
        # Two pipelines: one timed stage by stage, one end to end (same batches).
        staged = Pipeline(cfg, None, ParserPool.from_config(cfg))
        whole = Pipeline(cfg, None, ParserPool.from_config(cfg))
        parser = staged.parser._parsers[0]
        t = dict.fromkeys(STAGES, 0.0)
        for start in range(0, n, size):
            stop = min(n, start + size)
            batch = RawBatch(
                source="bench", source_fp="benchfp", lines=lines.slice(start, stop - start),
                offsets=offsets[start:stop], line_nos=np.arange(start + 1, stop + 1),
                end_offset=int(offsets[stop]) if stop < n else len(buf),
            )
            c0 = time.process_time()
            tbl = parser._prepare(batch)
            c1 = time.process_time()
            res = parser._run_sql_safely(tbl)
            c2 = time.process_time()
            res = in_input_order(res, tbl.num_rows)
            res = (res.append_column("status", outcome_column(res.column("status_raw"),
                                                              res.column("is_error_b")))
                   .append_column("raw", tbl.column("line"))
                   .append_column("raw_bytes", pa.array(np.diff(_line_offsets(batch.lines)))))
            c3 = time.process_time()
            staged._transform(batch, res)
            c4 = time.process_time()
            whole.transform(batch)
            c5 = time.process_time()
            for k, a, b in (("prepare", c0, c1), ("sql", c1, c2), ("post", c2, c3),
                            ("transform", c3, c4), ("total", c4, c5)):
                t[k] += b - a
        staged.close()
        whole.close()
        out[str(size)] = {k: v / n * 1e6 for k, v in t.items()}
    return out


def streams(path: Path, n_streams: int, per: int, rounds: int) -> dict[str, list[float]]:
    """CPU us/line of a live flush over ``n_streams`` streams of ``per`` lines each.

    ``joined``: ``LivePipeline._transform_pending`` (one parse for every stream, then
    pairing and sessionizing per stream); ``per-stream``: ``Pipeline.transform`` once per
    stream, as flushes did before. Kafka-shaped batches (no newlines, message offsets),
    interleaved, ``rounds`` flushes each; fresh lines every flush.
    """
    import numpy as np
    import pyarrow as pa
    from toolwatch.ingest.records import RawBatch

    from toolwatch.config import Config
    from toolwatch.live import LivePipeline
    from toolwatch.live.pipeline import merge_batches
    from toolwatch.store import Store

    lines = path.read_bytes().splitlines()
    need = 2 * rounds * n_streams * per
    if len(lines) < need:
        raise SystemExit(f"--streams needs --events >= {need}")
    with tempfile.TemporaryDirectory(prefix="tw-bench-streams-") as work:
        cfg = Config()
        cfg.store.data_dir = work
        cfg.live = {"detect": False, "compact_interval_s": 0}
        lp = LivePipeline(cfg, Store(work), kind="kafka")
        pos = [0] * n_streams
        nxt = 0
        out: dict[str, list[float]] = {"joined": [], "per-stream": []}
        for _ in range(rounds):
            for mode in out:
                for k in range(n_streams):
                    seg = lines[nxt:nxt + per]
                    nxt += per
                    offs = np.arange(pos[k], pos[k] + per, dtype=np.int64)
                    pos[k] += per
                    lp.add(RawBatch(f"kafka:t/{k}", f"kafka:t:{k}",
                                    pa.array(seg, pa.large_binary()),  # type: ignore[arg-type]
                                    offs, None, int(offs[-1]) + 1))
                c0 = time.process_time()
                if mode == "joined":
                    lp._transform_pending()
                else:
                    pending, lp._pending = lp._pending, {}
                    lp._pending_lines, lp._first_pending_at = 0, None
                    for bl in pending.values():
                        lp.pipe.transform(merge_batches(bl))
                out[mode].append((time.process_time() - c0) / (n_streams * per) * 1e6)
        lp.close()
    return out


def _ascii_only(pattern: str) -> str:
    """``pattern`` with every negated class and ``.`` limited to ASCII: the same matches
    on ASCII text, and a UTF-8 program small enough for RE2's default 8 MiB (DuckDB's)."""
    non_ascii, out, i, in_cls = r"\x{80}-\x{10FFFF}", [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif in_cls:
            if pattern.startswith("[:", i):
                j = pattern.index(":]", i) + 2
                out.append(pattern[i:j])
                i = j
                continue
            in_cls = c != "]"
            out.append(c)
            i += 1
        elif c == "[":
            in_cls = True
            neg = pattern.startswith("[^", i)
            out.append("[^" + non_ascii if neg else "[")
            i += 2 if neg else 1
            if pattern.startswith("]", i):
                out.append("]")
                i += 1
        else:
            out.append(r"[^\n" + non_ascii + "]" if c == "." else c)
            i += 1
    return "".join(out)


def scan_engines(path: Path, sizes: list[int], rounds: int) -> None:
    """Print CPU/wall us per line of each scan engine, alone and beside a busy thread."""
    import threading

    import duckdb
    import numpy as np
    import pyarrow as pa
    from toolwatch.ingest import parse as P
    from toolwatch.ingest.records import split_lines
    from toolwatch.ingest.secrets import SecretHasher

    from toolwatch.config import IngestConfig

    p = P.Parser(IngestConfig(), SecretHasher(b"k" * 32, [], []), threads=1)
    lines, _, _ = split_lines(path.read_bytes())
    calls = [0]
    rx_match = {k: rx.Match for k, rx in p._scan._rx.items()}

    class Counting:  # counts RE2 calls (each releases and re-takes the GIL)
        def __init__(self, k: str) -> None:
            self.k = k

        def Match(self, *a: object) -> object:
            calls[0] += 1
            return rx_match[self.k](*a)

    p._scan._rx = {k: Counting(k) for k in rx_match}
    con = duckdb.connect(config={"threads": 1})

    def lit(x: str) -> str:
        return "'" + x.replace("'", "''") + "'"

    groups = {g: q for g, q in p._group_patterns.items() if q}
    text_t = pa.table({"ord": pa.array([], pa.int64()), "line": pa.array([], pa.large_string())})
    holder = P._CurrentBatch()
    holder.table = text_t
    tw_scan_batch = holder  # noqa: F841 - found by DuckDB's replacement scan
    odd = r"[^\x01-\x09\x0b-\x7f]"  # non-ASCII, NUL, inner newline: rescanned in Latin-1
    cols = ", ".join(f"regexp_matches(l, {lit(_ascii_only(q))}, 'i') AS {g}"
                     for g, q in groups.items())
    con.execute(
        f"PREPARE tw_scan AS SELECT ord, regexp_matches(l, {lit(odd)}) AS odd, "
        f"regexp_matches(l, {lit(_ascii_only(p._scan_pattern))}, 'i') AS need, {cols}, "
        f"regexp_matches(l, '\\\\u', 'i') AS esc FROM (SELECT ord, CASE WHEN "
        f"suffix(line, chr(10)) THEN line[:-2] ELSE line END AS l FROM tw_scan_batch) "
        f"WHERE regexp_matches(l, {lit(_ascii_only(p._scan_all) + '|' + odd)}, 'i')")

    def duck(sl: pa.Array) -> object:
        off = P._line_offsets(sl)
        bad = {i: b"" for i in P._non_ascii_lines(sl, off)
               if not _valid(sl[i].as_py())}
        holder.table = pa.table({"ord": pa.array(np.arange(len(sl))),
                                 "line": P._splice_text(sl, off, bad)})
        return P._execute_arrow(con, "EXECUTE tw_scan")

    def buffer(sl: pa.Array) -> object:
        p._skip_pruning = 0
        return p._scan_hits(*P._BufferScan.segments(sl))

    def short(sl: pa.Array) -> object:  # the buffer scan with shortened GIL waits
        with P._short_gil_waits():
            return buffer(sl)

    def arrow(sl: pa.Array) -> object:
        p._skip_pruning = 0
        return p._scan_arrow(sl, len(sl))

    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    print(f"scan engines, us/line of the scanning thread (best of {rounds}), "
          f"load average {os.getloadavg()[0]:.2f}")
    for size in sizes:
        for busy in (False, True):
            if busy:
                stop.clear()
                spinner = threading.Thread(target=spin, daemon=True)
                spinner.start()
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(rounds):
                for name, f in (("buffer", buffer), ("short", short), ("arrow", arrow),
                                ("duckdb", duck)):
                    n, calls[0] = 0, 0
                    c0, w0 = time.thread_time(), time.perf_counter()
                    for s in range(0, min(len(lines), 4 * size), size):
                        f(lines.slice(s, size))
                        n += min(size, len(lines) - s)
                    r = ((time.thread_time() - c0) / n * 1e6,
                         (time.perf_counter() - w0) / n * 1e6, calls[0] / (n / size))
                    best[name] = min(best.get(name, r), r)
            if busy:
                stop.set()
                spinner.join()
            for name, (cpu, wall, k) in best.items():
                print(f"  {size:>7,} {'busy' if busy else 'alone':5s} {name:7s} "
                      f"CPU {cpu:6.2f} wall {wall:6.2f} RE2 calls/batch {k:6.0f}")
    con.close()
    p.close()


def _valid(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _child(tree: Path, path: Path, sizes: list[int], work: Path) -> dict[str, dict[str, float]]:
    """:func:`measure` of ``tree`` in a fresh interpreter."""
    root = overlay(tree, work / f"overlay-{abs(hash(str(tree)))}")
    env = {**os.environ, "PYTHONPATH": str(root), "TOOLWATCH_HMAC_KEY": "00" * 32}
    code = ("import json,sys;sys.path.insert(0,sys.argv[1]);import bench_parse as b;"
            "print(json.dumps(b.measure(__import__('pathlib').Path(sys.argv[2]),"
            "[int(x) for x in sys.argv[3].split(',')])))")
    res = subprocess.run(
        [PY, "-c", code, str(Path(__file__).parent), str(path), ",".join(map(str, sizes))],
        check=True, capture_output=True, text=True, env=env, cwd=root,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=160_000)
    ap.add_argument("--sizes", default="1000,2500,10000,80000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--old", type=Path, help="checkout to compare against (interleaved)")
    ap.add_argument("--streams", default=None, metavar="N,LINES",
                    help="instead: one live flush over N streams of LINES lines each, "
                         "one parse for all vs one per stream (e.g. 4,2500)")
    ap.add_argument("--scan", action="store_true",
                    help="instead: the scan engines' CPU and wall per line, GIL included")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    path = bench_file(a.events)
    if a.scan:
        scan_engines(path, sizes, a.repeat)
        return 0
    if a.streams:
        ns, per = (int(x) for x in a.streams.split(","))
        r = streams(path, ns, per, a.repeat)
        print(f"{ns} streams x {per:,} lines per flush, CPU us/line over {a.repeat} flushes "
              f"each (interleaved), load average {os.getloadavg()[0]:.2f}")
        for mode, v in r.items():
            print(f"  {mode:10s} best {min(v):6.2f}  median {sorted(v)[len(v) // 2]:6.2f}")
        print(f"  per-stream/joined (best): {min(r['per-stream']) / min(r['joined']):.2f}x")
        return 0
    trees = {"new": ROOT} | ({"old": a.old} if a.old else {})
    best: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tw-bench-parse-") as work:
        for _ in range(a.repeat):
            for tag, tree in trees.items():
                r = _child(tree, path, sizes, Path(work))
                for size, stages in r.items():
                    b = best.setdefault(tag, {}).setdefault(size, stages)
                    for k, v in stages.items():
                        b[k] = min(b[k], v)
    print(f"{a.events:,} events, CPU us/event (best of {a.repeat}), "
          f"load average {os.getloadavg()[0]:.2f}")
    for tag, per in best.items():
        print(f"[{tag}] " + " ".join(f"{k:>10}" for k in STAGES))
        for size, stages in per.items():
            print(f"{int(size):>7,} " + " ".join(f"{stages[k]:>10.2f}" for k in STAGES))
    if "old" in best:
        print("old/new CPU per event (total): " + ", ".join(
            f"{int(s):,}: {best['old'][s]['total'] / best['new'][s]['total']:.2f}x"
            for s in best["new"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
