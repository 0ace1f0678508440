"""Benchmark: the store's commits, Delta Lake tables (this tree) against the previous store.

Two figures the ingest/analyze A/B scripts do not give (for those, run
``bench_ingest.py --old`` and ``bench_analyze_ab.py --old``: see docs/performance.md):

``latency``
    A live commit: ``Store.write_batch`` of a 2,000-event batch with its checkpoint (live
    row groups and pages), p50/p95/max over ``--commits`` commits into one growing store,
    new tree against ``--old``, interleaved ``--repeat`` times (best p50/p95 of the rounds).
``aged``
    A live commit on a table that has already taken ``--aged-commits`` commits whose log
    entries are a day old (a tail that has run for a while): p50/p95 of ``--commits``
    commits with the log retention of the tables (``tables.LOG_RETENTION``) against the
    two days of the first Delta release. This tree only; the log is what differs.
``writers``
    1, 2 and 3 writer processes appending to one store at once, each its own stream:
    ``write_batch`` calls per second and rows per second of all of them together, from the
    moment all have started (each waits for a go file after its imports). Both trees: the
    previous store let several writers commit too (one flock'd rename phase at a time).

Each side runs in a child process with its tree's ``toolwatch`` first on ``PYTHONPATH``
(``bench_parse.overlay``), so the same interpreter and packages measure both codes::

    git archive 9a9c7cc | tar -x -C /tmp/base_9a9c
    flock /tmp/tw-bench.lock .venv/bin/python benchmarks/bench_store.py --old /tmp/base_9a9c
    flock /tmp/tw-bench.lock .venv/bin/python benchmarks/bench_store.py --old /tmp/base_9a9c \\
        --new /tmp/head latency --commits 200 --repeat 3

Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parse import overlay

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


# ------------------------------------------------------------------ child side
def _events(fp: str, start: int, n: int) -> object:
    """``n`` events of stream ``fp`` from line ``start``: realistic widths, fixed content."""
    import pyarrow as pa

    from toolwatch import schema

    offs = list(range(start, start + n))
    ts = [1_767_000_000_000_000 + o * 1000 for o in offs]
    cols = {
        "event_id": [f"{fp}:{o}" for o in offs],
        "ts": pa.array(ts, schema.TS),
        "session_id": [f"s-{o // 20:08d}" for o in offs],
        "session_derived": [False] * n,
        "caller_id": [f"caller-{o % 997}" for o in offs],
        "client_ip": [f"10.0.{o % 251}.{o % 13}" for o in offs],
        "server": ["files"] * n,
        "tool": [("read_file", "list_dir", "search", "write_file")[o % 4] for o in offs],
        "args": [f'{{"path": "/srv/data/project-{o % 50}/file-{o}.txt"}}' for o in offs],
        "resource_key": ["path"] * n,
        "resource_id": [f"/srv/data/project-{o % 50}/file-{o}.txt" for o in offs],
        "status": ["ok"] * n,
        "status_raw": ["ok"] * n,
        "is_error": [False] * n,
        "bytes": [o % 40_000 for o in offs],
        "rows": [None] * n,
        "duration_ms": [float(o % 300) for o in offs],
        "start_ts": pa.array(ts, schema.TS),
        "end_ts": pa.array([t + 1000 for t in ts], schema.TS),
        "format": ["call"] * n,
        "source": [f"/var/log/mcp/{fp}.jsonl"] * n,
        "source_fp": [fp] * n,
        "offset": offs,
        "line_no": [o + 1 for o in offs],
        "raw": [f'{{"ts": {t}, "tool": "read_file", "session_id": "s-{o // 20:08d}", '
                f'"caller": "caller-{o % 997}", "args": {{"path": "/srv/data/project-'
                f'{o % 50}/file-{o}.txt"}}, "status": "ok", "bytes": {o % 40_000}}}'
                for o, t in zip(offs, ts, strict=True)],
        "ingested_at": pa.array(ts, schema.TS),
    }
    sch = schema.EVENTS
    return pa.table([pa.array(cols[f.name], f.type) if f.name in cols
                     else pa.nulls(n, f.type) for f in sch], schema=sch)


def child_latency(store_dir: str, commits: int, batch: int) -> None:
    """Print the seconds of each live ``write_batch`` (2,000 events + checkpoint)."""
    from toolwatch import store as st

    s = st.Store(store_dir)
    tables = [_events("fp-live", i * batch, batch) for i in range(commits)]
    out = []
    for i, tbl in enumerate(tables):
        t = time.perf_counter()
        s.write_batch({"events": tbl}, [st.Checkpoint("fp-live", "live", (i + 1) * batch)],
                      row_group_rows=st.LIVE_ROW_GROUP_ROWS, page_bytes=st.LIVE_PAGE_BYTES)
        out.append(time.perf_counter() - t)
    print(json.dumps(out))


def child_aged(store_dir: str, retention: str, aged: int, commits: int, batch: int) -> None:
    """Seconds of each live ``write_batch`` on a table with ``aged`` day-old log entries."""
    from toolwatch import store as st
    from toolwatch import tables

    tables.TABLE_CONFIG["delta.logRetentionDuration"] = retention
    tables._OLD_LOG_RETENTION = "none"  # keep the retention measured
    s = st.Store(store_dir)
    # The history: commits of a checkpoint alone (no data file: a live table's files are
    # kept few by compaction, and the log is what is measured), as fast as they go.
    empty = _events("fp-live", 0, 0)
    for i in range(aged):
        s.write_batch({"events": empty}, [st.Checkpoint("fp-live", "live", i + 1)])
    day_ago = time.time() - 86_400
    for p in (Path(store_dir) / "events" / "_delta_log").iterdir():
        os.utime(p, (day_ago, day_ago))
    tables_ = [_events("fp-live", aged + i * batch, batch) for i in range(commits)]
    out = []
    for i, tbl in enumerate(tables_):
        t = time.perf_counter()
        s.write_batch({"events": tbl}, [st.Checkpoint("fp-live", "live", aged + (i + 1) * batch)],
                      row_group_rows=st.LIVE_ROW_GROUP_ROWS, page_bytes=st.LIVE_PAGE_BYTES)
        out.append(time.perf_counter() - t)
    logs = len(list((Path(store_dir) / "events" / "_delta_log").glob("*.json")))
    print(json.dumps({"seconds": out, "log_entries": logs}))


def child_append(store_dir: str, fp: str, commits: int, batch: int, go: str) -> None:
    """Wait for ``go``, then ``commits`` batches of ``batch`` events of stream ``fp``."""
    from toolwatch import store as st

    s = st.Store(store_dir)
    tables = [_events(fp, i * batch, batch) for i in range(commits)]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    t0 = time.time()
    for i, tbl in enumerate(tables):
        s.write_batch({"events": tbl}, [st.Checkpoint(fp, fp, (i + 1) * batch)],
                      row_group_rows=st.LIVE_ROW_GROUP_ROWS, page_bytes=st.LIVE_PAGE_BYTES)
    print(json.dumps({"start": t0, "end": time.time(), "commits": commits,
                      "rows": commits * batch}))


# ------------------------------------------------------------------ parent side
def _child(tree: Path, args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.Popen([PY, __file__, "_child", *args], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=tree)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def latency(trees: dict[str, Path], work: Path, commits: int, batch: int,
            repeat: int) -> None:
    """Interleaved rounds of :func:`child_latency` per tree; best p50/p95 per tree."""
    res: dict[str, list[tuple[float, float, float]]] = {t: [] for t in trees}
    for r in range(repeat):
        for tag, tree in trees.items():
            out, _ = _child(tree, ["latency", str(work / f"lat-{tag}-{r}"), str(commits),
                                   str(batch)]).communicate()
            xs = json.loads(out)
            res[tag].append((statistics.median(xs), _pct(xs, 0.95), max(xs)))
            print(f"  round {r + 1} {tag}: p50 {res[tag][-1][0] * 1000:.1f} ms, p95 "
                  f"{res[tag][-1][1] * 1000:.1f} ms, max {res[tag][-1][2] * 1000:.1f} ms",
                  flush=True)
    best = {t: (min(x[0] for x in v), min(x[1] for x in v)) for t, v in res.items()}
    print(f"live commit ({batch:,} events + checkpoint, {commits} commits, best of {repeat}):")
    for tag in trees:
        print(f"  {tag}: p50 {best[tag][0] * 1000:.1f} ms, p95 {best[tag][1] * 1000:.1f} ms")
    if "old" in best:
        print(f"  new/old: p50 {best['new'][0] / best['old'][0]:.2f}x, "
              f"p95 {best['new'][1] / best['old'][1]:.2f}x")


def aged(tree: Path, work: Path, aged_commits: int, commits: int, batch: int,
         repeat: int) -> None:
    """Interleaved rounds of :func:`child_aged`: this tree's retention against two days."""
    sys.path.insert(0, str(tree))
    from toolwatch.tables import LOG_RETENTION

    res: dict[str, list[tuple[float, float]]] = {LOG_RETENTION: [], "interval 2 days": []}
    for r in range(repeat):
        for i, ret in enumerate(res):
            out, _ = _child(tree, ["aged", str(work / f"aged-{r}-{i}"),
                                   ret, str(aged_commits), str(commits), str(batch)]
                            ).communicate()
            got = json.loads(out)
            xs = got["seconds"]
            res[ret].append((statistics.median(xs), _pct(xs, 0.95)))
            print(f"  round {r + 1}, log retention {ret!r}: p50 {res[ret][-1][0] * 1000:.1f} ms,"
                  f" p95 {res[ret][-1][1] * 1000:.1f} ms; {got['log_entries']} log entries "
                  "left", flush=True)
    best = {k: (min(x[0] for x in v), min(x[1] for x in v)) for k, v in res.items()}
    print(f"live commit after {aged_commits:,} day-old commits ({batch:,} events + checkpoint, "
          f"{commits} commits, best of {repeat}):")
    for k, (p50, p95) in best.items():
        print(f"  retention {k!r}: p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms")


def writers(trees: dict[str, Path], work: Path, commits: int, batch: int,
            repeat: int) -> None:
    """1, 2, 3 concurrent :func:`child_append` processes per tree; best of ``repeat``."""
    for n in (1, 2, 3):
        for tag, tree in trees.items():
            best = (0.0, 0.0)
            for r in range(repeat):
                store, go = work / f"w{n}-{tag}-{r}", work / f"go-{n}-{tag}-{r}"
                procs = [_child(tree, ["append", str(store), f"fp{i}", str(commits),
                                       str(batch), str(go)]) for i in range(n)]
                for p in procs:  # every child past its imports and batch building
                    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
                go.touch()
                outs = [json.loads(p.communicate()[0]) for p in procs]
                span = max(o["end"] for o in outs) - min(o["start"] for o in outs)
                rate = (sum(o["commits"] for o in outs) / span, sum(o["rows"] for o in outs) / span)
                best = max(best, rate)
            print(f"  {n} writer(s), {tag}: {best[0]:,.1f} commits/s, {best[1]:,.0f} rows/s "
                  f"(all writers together; {commits} commits of {batch:,} events each)",
                  flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        a = sys.argv[2:]
        if a[0] == "latency":
            child_latency(a[1], int(a[2]), int(a[3]))
        elif a[0] == "aged":
            child_aged(a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
        else:
            child_append(a[1], a[2], int(a[3]), int(a[4]), a[5])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old", type=Path, default=None, help="the previous store's tree")
    ap.add_argument("--new", type=Path, default=ROOT, help="tree measured (default: this)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("what", nargs="*", help="latency, aged, writers (default: latency, writers)")
    ap.add_argument("--commits", type=int, default=200, help="latency: commits per round")
    ap.add_argument("--batch", type=int, default=2000, help="events per commit")
    ap.add_argument("--writer-commits", type=int, default=60, help="writers: per process")
    ap.add_argument("--aged-commits", type=int, default=3000, help="aged: commits before")
    args = ap.parse_args()
    args.what = args.what or ["latency", "writers"]
    if set(args.what) - {"latency", "aged", "writers"}:
        ap.error(f"unknown: {args.what}")
    work = Path(tempfile.mkdtemp(prefix="tw-bench-store-"))
    try:
        trees = {"new": overlay(args.new.resolve(), work / "tree-new")}
        if args.old:
            trees["old"] = overlay(args.old.resolve(), work / "tree-old")
        print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
        if "latency" in args.what:
            latency(trees, work, args.commits, args.batch, args.repeat)
        if "aged" in args.what:
            aged(trees["new"], work, args.aged_commits, args.commits, args.batch, args.repeat)
        if "writers" in args.what:
            print("concurrent writers, one store, one stream each:")
            writers(trees, work, args.writer_commits, args.batch, args.repeat)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
