"""Benchmark: CPU added to ``detectors.run_batch`` by the concurrency detectors.

Loads the same 1M-event bench store as ``bench_detectors.py`` (generated and ingested once,
cached under ``--work``), then times ``detectors.detect`` with ``concurrency_abuse`` and
``race_condition`` disabled (baseline) and enabled, interleaved ``--repeat`` times in one
process, and prints the best CPU seconds of each and the ratio. Nothing is asserted.

``--callers N`` reassigns the sessions to N callers first (the bench log gives almost
every session its own caller): many concurrent sessions per caller is the worst case of
the caller-wide sweep, which only looks at callers whose sessions overlap in time.

    flock /tmp/tw-bench.lock .venv/bin/python benchmarks/bench_concurrency.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_detectors import _ingest, _load  # noqa: E402
from toolwatch.sample_logs.generate import generate_bench  # noqa: E402

from toolwatch import detectors  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tw-bench-concurrency"))
    ap.add_argument("--callers", type=int, default=0,
                    help="reassign sessions to this many callers (0: as generated)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    src = a.work / f"bench-{a.events}-{a.seed}.jsonl"
    if not src.exists():
        generate_bench(a.events, src, seed=a.seed)
    store = a.work / f"store-{a.events}-{a.seed}"
    if not store.exists():
        env = {**os.environ, "TOOLWATCH_HMAC_KEY": "ab" * 32}
        _ingest([str(src)], store, env)
    ev, su = _load(store)
    if a.callers > 0:
        import polars as pl

        ev = ev.with_columns(
            (pl.lit("caller-") + (pl.col("session_id").hash(1) % a.callers).cast(pl.String))
            .alias("caller_id")
        )
        print(f"sessions reassigned to {a.callers:,} callers")
    with_iv = ev.filter(ev["start_ts"].is_not_null()).height if "start_ts" in ev.columns else 0
    print(f"{ev.height:,} events ({with_iv:,} with an interval), {su.height:,} summaries")
    off = detectors.DetectorsConfig.from_dict(
        {"concurrency_abuse": {"enabled": False}, "race_condition": {"enabled": False}})
    on = detectors.DetectorsConfig.from_dict({})
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    stage: dict[str, float] = {}
    for _ in range(a.repeat):
        for name, cfg in (("off", off), ("on", on)):
            c0 = time.process_time()
            res = detectors.detect(ev, su, cfg)
            cpu[name].append(time.process_time() - c0)
            if name == "on":
                for k in ("score:concurrency_rules", "score:race_rules"):
                    stage[k] = min(stage.get(k, 1e9), res.timings.get(k, 0.0))
    b_off, b_on = min(cpu["off"]), min(cpu["on"])
    print(f"run_batch CPU without concurrency detectors: best {b_off:.3f} s of "
          f"{', '.join(f'{x:.3f}' for x in cpu['off'])}")
    print(f"run_batch CPU with    concurrency detectors: best {b_on:.3f} s of "
          f"{', '.join(f'{x:.3f}' for x in cpu['on'])}")
    print(f"added: {b_on - b_off:+.3f} s CPU ({(b_on / b_off - 1) * 100:+.1f}%)")
    for k, v in stage.items():
        print(f"  {k:<28} {v:.3f} s wall (best)")


if __name__ == "__main__":
    main()
