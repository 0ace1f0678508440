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
    from toolwatch.ingest.records import RawBatch, split_lines

    from toolwatch.config import Config
    from toolwatch.pipeline import Pipeline

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
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    path = bench_file(a.events)
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
