"""Benchmark: ``toolwatch analyze`` (or ``ingest``) throughput of two checkouts, interleaved.

Runs the real CLI (``python -m toolwatch.cli analyze FILE -q``) on one generated file
(``bench_ingest.make_file``), alternating the checkouts ``--repeat`` times, each with its
tree first on ``PYTHONPATH`` and the same interpreter. Prints events/s (best wall), CPU
seconds and peak RSS per tree, and the new/old ratios: on a shared machine the CPU ratio
is the steadier figure.

Usage::

    git archive HEAD~3 | tar -x -C /tmp/old
    python benchmarks/bench_analyze_ab.py --old /tmp/old --events 1000000 --repeat 3
    python benchmarks/bench_analyze_ab.py --old /tmp/old --command ingest
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import PY, make_file
from bench_parse import overlay

ROOT = Path(__file__).resolve().parents[1]


def run_measured(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (KiB), CPU seconds of ``cmd`` run in ``cwd``: the measured
    tree, since ``python -m`` puts the working directory ahead of ``PYTHONPATH``."""
    code = (
        "import resource,subprocess,sys,time;t=time.perf_counter();"
        "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL);"
        "u=resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(time.perf_counter()-t, u.ru_maxrss, u.ru_utime+u.ru_stime)"
    )
    out = subprocess.run([PY, "-c", code, *cmd], check=True, capture_output=True, text=True,
                         env=env, cwd=cwd).stdout.split()
    return float(out[0]), int(out[1]), float(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="checkout to compare against")
    ap.add_argument("--new", type=Path, default=ROOT, help="checkout measured (default: this)")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--command", choices=("analyze", "ingest"), default="analyze")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tw-bench-ab-"))
    try:
        path = work / "events.jsonl"
        make_file(path, args.events)
        runs: dict[str, list[tuple[float, int, float]]] = {"old": [], "new": []}
        # Each tree as one ``toolwatch`` package (see bench_parse.overlay): with a bare
        # PYTHONPATH the editable install would load this checkout's ingest/detectors.
        roots = {tag: overlay(tree.resolve(), work / f"tree-{tag}")
                 for tag, tree in (("old", args.old), ("new", args.new))}
        for _ in range(args.repeat):
            for tag, tree in roots.items():
                env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg"),
                       "PYTHONPATH": str(tree.resolve()), "TOOLWATCH_HMAC_KEY": "00" * 32}
                store = work / "store"
                shutil.rmtree(store, ignore_errors=True)
                alerts = work / f"alerts-{tag}.jsonl"
                alerts.write_bytes(b"")
                cmd = [PY, "-m", "toolwatch.cli", args.command, str(path), "-d", str(store),
                       "--no-progress"]
                if args.command == "analyze":  # ingest has no -q: its summary goes to /dev/null
                    cmd += ["-q", "--alerts-out", str(alerts)]
                runs[tag].append(run_measured(cmd, env, tree.resolve()))
        best = {}
        for tag, rs in runs.items():
            wall = min(r[0] for r in rs)
            cpu = min(r[2] for r in rs)
            rss = max(r[1] for r in rs)
            best[tag] = (wall, cpu)
            print(f"{tag}: {args.events / wall:>10,.0f} events/s (walls "
                  f"{', '.join(f'{r[0]:.2f}' for r in rs)} s), CPU best {cpu:.2f} s, "
                  f"peak RSS {rss / 2**20:.2f} GiB")
        same = (work / "alerts-old.jsonl").read_bytes() == (work / "alerts-new.jsonl").read_bytes()
        print(f"new/old throughput (wall) {best['old'][0] / best['new'][0]:.3f}x, "
              f"CPU {best['new'][1] / best['old'][1]:.3f}x; alert files identical: {same}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
