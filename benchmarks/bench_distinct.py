"""Benchmark: peak RSS of ``toolwatch analyze`` by distinct values in the log.

Issue 28 item 8: memory grew with log *content*: 1M distinct tool names in a 90 MB file
took analyze to 6.0 GB, and one caller with 3M events to 4.3 GB. Two shapes:

* ``--tools N``: N events, each with its own tool name (``tool-000000123``), spread over
  1,000 callers;
* ``--caller-events M``: M events of one caller (one client address, a few tools and
  resources), in one session after another.

For each shape it writes the log (DuckDB ``COPY``), runs the real CLI as a subprocess
(``toolwatch analyze FILE -q --alerts-out …``) and prints wall seconds, CPU seconds,
peak RSS (``getrusage(RUSAGE_CHILDREN)`` of a wrapper process, i.e. of analyze alone)
and alert count. ``--tree DIR`` measures another checkout (``git worktree add DIR REV``)
with the same interpreter, through ``benchmarks/run_tree.py`` (a bare ``PYTHONPATH``
would still load this checkout's ``detectors`` and ``ingest``); give it twice, as
``--tree DIR --tree .``, and each size runs on both trees back to back, for before/after
ratios from one run on one machine.

Usage::

    python benchmarks/bench_distinct.py --tools 1000000
    python benchmarks/bench_distinct.py --caller-events 1000000,3000000
    python benchmarks/bench_distinct.py --caller-events 3000000 --tree /tmp/old --tree .
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze_ab import run_measured

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def make_tools_log(path: Path, tools: int) -> None:
    """``tools`` events, each with a distinct tool name, over 1,000 callers (DuckDB COPY)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    con.execute(
        f"""
        COPY (
          SELECT
            strftime(TIMESTAMP '2026-11-02 00:00:00' + to_milliseconds(r * 20),
                     '%Y-%m-%dT%H:%M:%S.%gZ') AS ts,
            'agent-' || (r % 1000) AS caller_id,
            'docs-server' AS server,
            'tool-' || lpad(CAST(r AS VARCHAR), 9, '0') AS tool,
            {{'documentId': 'doc-' || (r % 5000)}} AS args,
            'ok' AS status,
            200 + (r * 31 % 5000) AS bytes
          FROM range({tools}) t(r)
        ) TO '{path}' (FORMAT json)
        """
    )
    con.close()


def make_caller_log(path: Path, events: int) -> None:
    """``events`` events of one caller, 100 ms apart (DuckDB COPY)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    con.execute(
        f"""
        COPY (
          SELECT
            strftime(TIMESTAMP '2026-11-02 00:00:00' + to_milliseconds(r * 100),
                     '%Y-%m-%dT%H:%M:%S.%gZ') AS ts,
            's-' || (r // 5000) AS session_id,
            'agent-solo' AS caller_id,
            '10.9.9.9' AS client_ip,
            'docs-server' AS server,
            ['searchItems', 'getDocument', 'summarizeDocument'][1 + r % 3] AS tool,
            {{'documentId': 'doc-' || (r * 7919 % 100000)}} AS args,
            CASE WHEN r % 17 = 0 THEN 'not_found' ELSE 'ok' END AS status,
            200 + (r * 31 % 5000) AS bytes,
            10 + r % 400 AS duration_ms
          FROM range({events}) t(r)
        ) TO '{path}' (FORMAT json)
        """
    )
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tools", type=int, default=0, help="events with distinct tool names")
    ap.add_argument("--caller-events", default="0",
                    help="events of one caller (comma-separated sizes)")
    ap.add_argument("--tree", type=Path, action="append", default=None,
                    help="checkout to measure (repeatable: each size runs on each tree)")
    ap.add_argument("--keep", type=Path, default=None, help="keep logs here between runs")
    args = ap.parse_args()
    caller_sizes = [int(x) for x in args.caller_events.split(",") if int(x)]
    if not (args.tools or caller_sizes):
        args.tools = 1_000_000
    work = Path(tempfile.mkdtemp(prefix="tw-bench-distinct-"))
    logs = args.keep or work
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg"), "OPENBLAS_NUM_THREADS": "1"}
    env["TOOLWATCH_HMAC_KEY"] = "00" * 32
    trees = [t.resolve() for t in args.tree] if args.tree else [None]
    head = ("tree", "shape", "events", "MB", "alerts", "wall s", "CPU s", "peak RSS")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (12, 14, 10, 6, 7, 7, 7, 10), strict=True)))
    cases = [("distinct-tools", args.tools, make_tools_log)] + [
        ("one-caller", n, make_caller_log) for n in caller_sizes]
    try:
        for shape, n, make in cases:
            if not n:
                continue
            path = logs / f"{shape}-{n}.jsonl"
            if not path.exists():
                t = time.perf_counter()
                make(path, n)
                print(f"  (wrote {path.name} in {time.perf_counter() - t:.0f} s)", flush=True)
            for tree in trees:
                store = work / "store"
                shutil.rmtree(store, ignore_errors=True)
                out = work / "alerts.jsonl"
                out.unlink(missing_ok=True)
                args_ = ["analyze", str(path), "-d", str(store), "--no-progress", "-q",
                         "--alerts-out", str(out)]
                if tree is None:
                    cmd, cwd = [PY, "-m", "toolwatch.cli", *args_], ROOT
                else:
                    cmd = [PY, str(ROOT / "benchmarks" / "run_tree.py"), str(tree), *args_]
                    cwd = tree
                wall, rss, cpu = run_measured(cmd, env, cwd=cwd)
                n_alerts = len(out.read_bytes().splitlines()) if out.exists() else 0
                mb = path.stat().st_size / 1e6
                name = "this" if tree is None else (tree.name or str(tree))[-12:]
                print(f"{name:>12} {shape:>14} {n:>10,} {mb:>6.0f} {n_alerts:>7} {wall:>7.1f} "
                      f"{cpu:>7.1f} {rss / 2**20:>6.2f} GiB", flush=True)
                shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
