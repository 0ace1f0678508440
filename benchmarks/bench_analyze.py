"""Benchmark: ``toolwatch analyze`` end to end (ingest + every detector) over N events.

Runs the real CLI as a subprocess on a file from the seeded generator's bench mode and
prints events/s and peak RSS, next to ``toolwatch ingest`` alone on the same file in the
same run (so the detectors' share can be read as a ratio on a noisy machine).

Usage::

    python benchmarks/bench_analyze.py [--events 1000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import TOOLWATCH, make_file, run_measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tw-bench-analyze-"))
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg")}
    try:
        path = work / "events.jsonl"
        print(f"generating {args.events:,} events ...", flush=True)
        make_file(path, args.events)
        res: dict[str, list[tuple[float, int, float]]] = {"ingest": [], "analyze": []}
        for _ in range(args.repeat):
            for cmd in ("ingest", "analyze"):
                store = work / "store"
                shutil.rmtree(store, ignore_errors=True)
                extra = (
                    ["--alerts-out", str(work / "alerts.jsonl"), "-q"]
                    if cmd == "analyze"
                    else ["--json"]
                )
                res[cmd].append(
                    run_measured(
                        [TOOLWATCH, cmd, str(path), "-d", str(store), "--no-progress", *extra], env
                    )
                )
        n_alerts = len((work / "alerts.jsonl").read_bytes().splitlines())
        for cmd, runs in res.items():
            best, _, cpu = min(runs)
            rss = max(r for _, r, _ in runs)
            print(
                f"toolwatch {cmd:<8}: {args.events / best:>10,.0f} events/s  (best {best:.2f} s "
                f"of {', '.join(f'{w:.2f}' for w, _, _ in runs)})  peak RSS {rss / 1024:,.0f} MiB"
                f"  CPU {cpu:.2f} s in the best run ({cpu / best:.2f} cores busy)"
            )
        ing = min(w for w, _, _ in res["ingest"])
        ana = min(w for w, _, _ in res["analyze"])
        print(
            f"detectors share of analyze: {(ana - ing) / ana:.0%} ({ana - ing:.2f} s); "
            f"{n_alerts} alerts"
        )
        print(f"target 200k events/s: {'MET' if args.events / ana >= 200_000 else 'NOT MET'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
