"""Start-up cost of running a forensic query in a child process (toolwatch.query_child).

Compares, on a small real store, the same query run in process
(``toolwatch.query._run_in_process``, the old path) and in a query child
(``toolwatch.query.run_query``): the first child (the fork
server starts and imports DuckDB), then warm children (one fork each), and the CLI's
wall time for ``toolwatch query``.

Usage: .venv/bin/python benchmarks/bench_query_child.py [--repeat 20] [--old-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from toolwatch import query_child, schema
from toolwatch.config import QueryConfig
from toolwatch.query import _run_in_process
from toolwatch.store import DATASETS, Store

SQL = "SELECT tool, count(*) AS n FROM events GROUP BY tool"


def _store(root: Path) -> Store:
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    rows = [
        {"event_id": f"fp:{i}", "ts": t0 + timedelta(seconds=i), "session_id": f"s{i % 50}",
         "tool": f"t{i % 7}", "source": "x", "source_fp": "fp", "offset": i, "raw": "{}",
         "ingested_at": t0}
        for i in range(10_000)
    ]
    st = Store(root)
    st.write_batch({"events": pa.Table.from_pylist(rows, schema=schema.EVENTS)})
    st.close()
    return st


def _ms(samples: list[float]) -> str:
    s = sorted(samples)
    return (f"median {statistics.median(s) * 1000:.0f} ms, p90 "
            f"{s[int(0.9 * (len(s) - 1))] * 1000:.0f} ms (n={len(s)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--old-tree", help="a checkout of toolwatch/ to compare the CLI with")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        st = _store(Path(tmp) / "store")
        t = time.perf_counter()
        _run_in_process(st, SQL)
        print(f"in process, first: {(time.perf_counter() - t) * 1000:.0f} ms")
        warm_in = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            _run_in_process(st, SQL)
            warm_in.append(time.perf_counter() - t)
        print(f"in process, warm: {_ms(warm_in)}")
        files = {n: st.files(n) for n in DATASETS}
        cfg = QueryConfig()
        t = time.perf_counter()
        query_child.warm()
        query_child.run(st.root, files, SQL, None, cfg, start_method="forkserver")
        print(f"child, first (fork server starts): {(time.perf_counter() - t) * 1000:.0f} ms")
        for method in ("forkserver", "fork"):
            warm_child = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                query_child.run(st.root, files, SQL, None, cfg, start_method=method)
                warm_child.append(time.perf_counter() - t)
            extra = statistics.median(warm_child) - statistics.median(warm_in)
            print(f"child ({method}): {_ms(warm_child)}; {extra * 1000:+.0f} ms vs in process")
        exe = str(Path(sys.executable).with_name("toolwatch"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
        trees = {"this tree": env}
        if args.old_tree:  # e.g. git archive <commit> toolwatch dashboard | tar -x -C DIR
            trees["--old-tree"] = {**env, "PYTHONPATH": args.old_tree}
        cli: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(max(3, args.repeat // 2)):
            for name, e in trees.items():  # interleaved: load drifts
                t = time.perf_counter()
                subprocess.run([exe, "query", "-d", str(st.root), "-f", "csv", SQL], env=e,
                               check=True, capture_output=True)
                cli[name].append(time.perf_counter() - t)
        for name, samples in cli.items():
            print(f"CLI toolwatch query ({name}), wall: {_ms(samples)}")


if __name__ == "__main__":
    main()
