"""Benchmark: peak RSS of ``toolwatch analyze`` as the number of distinct callers grows.

For each size, writes a log where every caller makes a few calls (``--per-caller``, one
session each, client addresses drawn from a fixed pool), runs the real CLI as a
subprocess (``toolwatch analyze FILE -q --alerts-out …``) and prints wall seconds, CPU
seconds and peak RSS (``getrusage(RUSAGE_CHILDREN)`` of a wrapper process, i.e. the
analyze process alone).

Two curves can be read from one run:

* ``--per-caller 3`` (default): events grow with callers (3M events at 1M callers), the
  issue's shape (~3.6 GB at 1M callers before the 2026-11 fix);
* ``--fixed-events N``: the same N events spread over more and more callers, which
  isolates what *per-caller* state costs from what the events themselves cost.

Above ``[analyze] max_events_in_memory`` (default 1M events) analyze no longer holds every
event: it detects in hash partitions read back from the store
(``toolwatch.analyze.run_partitioned``), so the peak stays near that of a 1M-event single
pass whatever the number of callers; at or below it the single pass is unchanged.

``--tree DIR`` measures another checkout (e.g. ``git archive HEAD | tar -x -C DIR``) with
the same interpreter, for before/after figures from one machine.

Usage::

    python benchmarks/bench_analyze_memory.py --callers 100000,1000000,2000000
    python benchmarks/bench_analyze_memory.py --callers 100000,1000000 --fixed-events 3000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def make_log(path: Path, callers: int, events: int) -> None:
    """``events`` per-call lines over ``callers`` callers, in time order (DuckDB COPY)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = true")
    # Row r belongs to caller r * callers // events: each caller's calls are consecutive,
    # 2 s apart in log time overall, so no caller is split by the session gap.
    con.execute(
        f"""
        COPY (
          SELECT
            strftime(TIMESTAMP '2026-11-02 00:00:00' + to_milliseconds(r * 20),
                     '%Y-%m-%dT%H:%M:%S.%gZ') AS ts,
            's-' || (r * {callers} // {events}) AS session_id,
            'agent-' || lpad(CAST(r * {callers} // {events} AS VARCHAR), 9, '0') AS caller_id,
            '10.' || ((r * {callers} // {events}) % 200) || '.'
                  || ((r * {callers} // {events}) // 200 % 250) || '.7' AS client_ip,
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


def run_measured(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (KiB) and CPU seconds of ``cmd`` run as a child.

    ``cwd`` must be the measured tree: ``python -m`` puts the working directory first on
    ``sys.path``, ahead of ``PYTHONPATH``.
    """
    code = (
        "import resource,subprocess,sys,time;t=time.perf_counter();"
        "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL);"
        "u=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(time.perf_counter()-t, u.ru_maxrss, u.ru_utime+u.ru_stime)"
    )
    out = subprocess.run(
        [PY, "-c", code, *cmd], check=True, capture_output=True, text=True, env=env, cwd=cwd
    ).stdout.split()
    return float(out[0]), int(out[1]), float(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--callers", default="100000,1000000,2000000", help="comma-separated sizes")
    ap.add_argument("--per-caller", type=int, default=3, help="events per caller")
    ap.add_argument("--fixed-events", type=int, default=0, help="same event count at every size")
    ap.add_argument("--tree", type=Path, default=None, help="checkout to measure (PYTHONPATH)")
    ap.add_argument("--keep", type=Path, default=None, help="keep logs here between runs")
    args = ap.parse_args()
    sizes = [int(x) for x in args.callers.split(",") if x]
    work = Path(tempfile.mkdtemp(prefix="tw-bench-mem-"))
    logs = args.keep or work
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg"), "OPENBLAS_NUM_THREADS": "1"}
    env["TOOLWATCH_HMAC_KEY"] = "00" * 32
    if args.tree is not None:
        env["PYTHONPATH"] = str(args.tree.resolve())
    tree = args.tree.resolve() if args.tree else ROOT
    print(f"code: {tree}")
    head = ("callers", "events", "alerts", "wall s", "CPU s", "peak RSS")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (10, 11, 7, 7, 7, 10), strict=True)))
    try:
        for n in sizes:
            events = args.fixed_events or n * args.per_caller
            path = logs / f"callers-{n}-events-{events}.jsonl"
            if not path.exists():
                t = time.perf_counter()
                make_log(path, n, events)
                print(f"  (wrote {path.name}: {path.stat().st_size / 2**30:.2f} GiB in "
                      f"{time.perf_counter() - t:.0f} s)", flush=True)
            store = work / "store"
            shutil.rmtree(store, ignore_errors=True)
            out = work / "alerts.jsonl"
            cmd = [PY, "-m", "toolwatch.cli", "analyze", str(path), "-d", str(store),
                   "--no-progress", "-q", "--alerts-out", str(out)]
            wall, rss, cpu = run_measured(cmd, env, cwd=tree)
            n_alerts = len(out.read_bytes().splitlines())
            print(f"{n:>10,} {events:>11,} {n_alerts:>7} {wall:>7.1f} {cpu:>7.1f} "
                  f"{rss / 2**20:>7.2f} GiB", flush=True)
            shutil.rmtree(store, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
