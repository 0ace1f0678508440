"""Benchmark: ``toolwatch ingest`` throughput and peak memory on mixed-style events.

Prints events/s and peak RSS for ``toolwatch ingest`` (a real subprocess, end to end:
interpreter start, parse, normalize, Parquet commit, compaction), next to two reference
points measured in the same run on the same file, so the figures can be read as ratios on
a shared, noisy machine:

* DuckDB ``read_json`` with explicit columns counting the file (the issue's ~1.4M lines/s);
* a plain ``orjson.loads`` loop over the lines (the issue's ~320k lines/s).

It also ingests a file 3x larger to show peak RSS does not grow with file size.

Usage::

    python benchmarks/bench_ingest.py [--events 1000000] [--repeat 3]
    python benchmarks/bench_ingest.py --old /tmp/base --skip-large   # A/B, interleaved
    python benchmarks/bench_ingest.py --old /tmp/base --new /tmp/mine --skip-large

With ``--old TREE`` (a checkout: ``git worktree add /tmp/base REV``) each round also runs
``toolwatch ingest`` with that tree's code (``benchmarks/run_tree.py``), interleaved with
this one, and prints the old/new ratios of wall and CPU time (best of ``--repeat``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TOOLWATCH = str(Path(PY).with_name("toolwatch"))


def make_file(path: Path, n: int, seed: int = 11) -> None:
    """Mixed-style per-call events from the project's seeded generator."""
    subprocess.run(
        [
            PY,
            str(ROOT / "sample_logs" / "generate.py"),
            "--bench-events",
            str(n),
            "--bench-out",
            str(path),
            "--seed",
            str(seed),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, int, float]:
    """Run ``cmd``; return its wall seconds, peak RSS (KiB) and CPU seconds (user + sys).

    CPU time is the steadier figure on a shared machine: other processes stretch the
    wall clock far more than they stretch the work the command itself does.
    """
    code = (
        "import resource,subprocess,sys,time;t=time.perf_counter();"
        "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL);"
        "u=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(time.perf_counter()-t, u.ru_maxrss, u.ru_utime+u.ru_stime)"
    )
    out = subprocess.run(
        [PY, "-c", code, *cmd], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    return float(out[0]), int(out[1]), float(out[2])


def peak_rss_of(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of ``cmd`` (see :func:`run_measured`)."""
    wall, rss, _cpu = run_measured(cmd, env)
    return wall, rss


def duckdb_baseline(path: Path) -> float:
    """Lines/s of DuckDB read_json with explicit columns (count only)."""
    import duckdb

    con = duckdb.connect()
    t = time.perf_counter()
    n = con.execute(
        "SELECT count(*) FROM read_json($p, format='newline_delimited', "
        "columns={ts: 'VARCHAR', tool: 'VARCHAR', session_id: 'VARCHAR'}, ignore_errors=true)",
        {"p": str(path)},
    ).fetchone()[0]
    return n / (time.perf_counter() - t)


def orjson_baseline(path: Path) -> float:
    """Lines/s of a plain orjson.loads loop."""
    import orjson

    t = time.perf_counter()
    n = 0
    with open(path, "rb") as fh:
        for line in fh:
            with contextlib.suppress(orjson.JSONDecodeError):
                orjson.loads(line)
            n += 1
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true", help="skip the 3x memory check")
    ap.add_argument("--old", default=None, help="another checkout to A/B against (interleaved)")
    ap.add_argument("--new", default=None,
                    help="run the 'new' side from this checkout too (run_tree.py), not from "
                         "the working tree: A/B of one change while others edit the tree")
    args = ap.parse_args()
    run_tree = str(Path(__file__).with_name("run_tree.py"))
    new_cmd = [PY, run_tree, args.new] if args.new else [TOOLWATCH]

    work = Path(tempfile.mkdtemp(prefix="tw-bench-"))
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg")}
    try:
        small = work / "events.jsonl"
        print(f"generating {args.events:,} mixed-style events ...", flush=True)
        make_file(small, args.events)
        size_mb = small.stat().st_size / 1e6
        print(f"file: {size_mb:,.0f} MB")

        walls, rss, cpus = [], [], []
        old: list[tuple[float, int, float]] = []
        for _ in range(args.repeat):
            if args.old:
                old.append(run_measured(
                    [PY, run_tree, args.old, "ingest", str(small), "-d", str(work / "store"),
                     "--no-progress", "--json"], env))
                shutil.rmtree(work / "store", ignore_errors=True)
            w, r, c = run_measured(
                [
                    *new_cmd,
                    "ingest",
                    str(small),
                    "-d",
                    str(work / "store"),
                    "--no-progress",
                    "--json",
                ],
                env,
            )
            shutil.rmtree(work / "store", ignore_errors=True)
            walls.append(w)
            rss.append(r)
            cpus.append(c)
        if old:
            ow = min(o[0] for o in old)
            oc = min(o[2] for o in old)
            print(f"old tree {args.old}: best wall {ow:.2f} s, CPU {oc:.2f} s, peak RSS "
                  f"{max(o[1] for o in old) / 1024:,.0f} MiB; old/new wall {ow / min(walls):.2f}x, "
                  f"CPU {oc / min(cpus):.2f}x (load average {os.getloadavg()[0]:.1f})")
        duck = duckdb_baseline(small)
        orj = orjson_baseline(small)
        best = min(walls)
        eps = args.events / best
        print(
            f"toolwatch ingest : {eps:>10,.0f} events/s  (best of {args.repeat}: {best:.2f} s; "
            f"all: {', '.join(f'{w:.2f}' for w in walls)} s)  peak RSS {max(rss) / 1024:,.0f} MiB"
        )
        cpu = cpus[walls.index(best)]
        print(
            f"                   CPU {cpu:.2f} s in that run = {cpu / best:.2f} of "
            f"{os.cpu_count()} cores busy; {args.events / cpu:,.0f} events per CPU-second"
        )
        print(f"duckdb read_json : {duck:>10,.0f} lines/s   (toolwatch = {eps / duck:.2f}x)")
        print(f"orjson loop      : {orj:>10,.0f} lines/s   (toolwatch = {eps / orj:.2f}x)")
        print(f"target 300k events/s: {'MET' if eps >= 300_000 else 'NOT MET'}")

        if not args.skip_large:
            large = work / "large.jsonl"
            make_file(large, args.events * 3, seed=12)
            w, r = peak_rss_of(
                [
                    TOOLWATCH,
                    "ingest",
                    str(large),
                    "-d",
                    str(work / "store"),
                    "--no-progress",
                    "--json",
                ],
                env,
            )
            print(
                f"3x file ({args.events * 3:,} events): {args.events * 3 / w:,.0f} events/s, "
                f"peak RSS {r / 1024:,.0f} MiB (1x: {max(rss) / 1024:,.0f} MiB)"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
