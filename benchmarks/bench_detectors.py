"""Benchmark: CPU cost of the detectors alone (``detectors.run_batch``) on loaded events.

Generates (once, cached) a file with the seeded generator's bench mode, ingests it into a
temporary store with the real CLI, reads events and summaries back with
``toolwatch.analyze.load_events`` and then times ``detectors.detect`` — what ``run_batch``
runs — best of ``--repeat``, with the per-stage breakdown of ``DetectResult.timings``.
The same is done for the bundled demo sample. Prints figures only; nothing is asserted.

``--compare-sequence`` also times, in the same run and interleaved with the full set, the
detectors with the five sequence detectors of issue 11 disabled (``enabled = false`` in
their config sections: tool_loop, privilege_chain, step_skip, duplicate_execution,
cross_server_flow), and the core set (those five and the two concurrency detectors of
issue 12 disabled), and prints the CPU ratios: what the new detectors add to
``run_batch``. "core" is the four rule detectors of the first release (enumeration,
bulk extraction, credential stuffing, scraping loop) plus the isolation forest, over the
same features; the output lists the detectors of each variant.

``--alerts-out DIR`` writes each dataset's alerts as canonical JSON lines (alert id,
category, severity, score rounded to 9 digits, reasons, evidence, times) so two code
versions can be compared with ``diff``.

Run it under the shared lock so timings do not collide with other benchmarks::

    flock /tmp/tw-bench.lock .venv/bin/python benchmarks/bench_detectors.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolwatch.detectors import registry  # noqa: E402

from toolwatch import detectors  # noqa: E402
from toolwatch.analyze import load_events  # noqa: E402
from toolwatch.store import Store  # noqa: E402

TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


def _ingest(paths: list[str], store: Path, env: dict[str, str]) -> None:
    shutil.rmtree(store, ignore_errors=True)
    subprocess.run(
        [TOOLWATCH, "ingest", *paths, "-d", str(store), "--no-progress", "--json"],
        check=True, env=env, stdout=subprocess.DEVNULL,
    )


def _load(store: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    st = Store(store)
    try:
        return load_events(st, None)
    finally:
        st.close()


def _canonical(alerts: pl.DataFrame) -> list[bytes]:
    """One stable JSON line per alert (what must not change between code versions)."""
    out = []
    for r in alerts.sort("alert_id").iter_rows(named=True):
        out.append(orjson.dumps({
            "alert_id": r["alert_id"],
            "category": r["category"],
            "severity": r["severity"],
            "score": round(float(r["score"]), 9),
            "entity": [r["entity_type"], r["entity_id"]],
            "seen": [str(r["first_seen"]), str(r["last_seen"]), str(r["detected_at"])],
            "reasons": r["reasons"],
            "evidence": r["evidence"],
        }, option=orjson.OPT_SORT_KEYS))
    return out


#: Config sections of the sequence detectors (issue 11) and the concurrency ones (issue 12).
SEQUENCE = ("tool_loop", "privilege_chain", "step_skip", "duplicate_execution",
            "cross_server_flow")
CONCURRENCY = ("concurrency_abuse", "race_condition")

#: The configurations --compare-sequence times: name -> detectors config dict.
VARIANTS: dict[str, dict[str, object]] = {
    "all": {},
    "no-sequence": {k: {"enabled": False} for k in SEQUENCE},
    "core": {k: {"enabled": False} for k in (*SEQUENCE, *CONCURRENCY)},
}


def _time_once(ev: pl.DataFrame, su: pl.DataFrame,
               cfg: detectors.DetectorsConfig) -> tuple[float, float, detectors.DetectResult]:
    c0, w0 = time.process_time(), time.perf_counter()
    res = detectors.detect(ev, su, cfg)
    return time.perf_counter() - w0, time.process_time() - c0, res


def _compare(name: str, ev: pl.DataFrame, su: pl.DataFrame, repeat: int) -> None:
    """Interleaved runs of each variant (so machine load hits them alike); best CPU each."""
    cfgs = {k: detectors.DetectorsConfig.from_dict(v) for k, v in VARIANTS.items()}
    cpu: dict[str, list[float]] = {k: [] for k in cfgs}
    wall: dict[str, list[float]] = {k: [] for k in cfgs}
    for _ in range(repeat):
        for k, cfg in cfgs.items():
            w, c, _res = _time_once(ev, su, cfg)
            wall[k].append(w)
            cpu[k].append(c)
    print(f"[{name}] sequence detectors on/off, {ev.height:,} events, best of {repeat} "
          "interleaved runs:")
    # Say exactly what each variant runs (feature extraction is the same for all three).
    for k, cfg in cfgs.items():
        names = ", ".join(d.name for d in registry.build(cfg))
        print(f"  {k:<12} = features + {names}")
    for k in cfgs:
        print(f"  {k:<12} CPU {min(cpu[k]):7.3f} s  wall {min(wall[k]):7.3f} s  "
              f"(CPU runs {', '.join(f'{c:.3f}' for c in cpu[k])})")
    base = min(cpu["no-sequence"])
    print(f"  sequence detectors add {min(cpu['all']) / base - 1:+.1%} CPU to run_batch "
          f"(all / no-sequence = {min(cpu['all']) / base:.3f}); sequence + concurrency add "
          f"{min(cpu['all']) / min(cpu['core']) - 1:+.1%} (all / core)")


def _bench(name: str, ev: pl.DataFrame, su: pl.DataFrame, repeat: int,
           alerts_dir: Path | None) -> None:
    cfg = detectors.DetectorsConfig.from_dict({})
    walls, cpus, runs = [], [], []
    for _ in range(repeat):
        w, c, res = _time_once(ev, su, cfg)
        walls.append(w)
        cpus.append(c)
        runs.append(res)
    best = min(range(repeat), key=lambda i: walls[i])
    res = runs[best]
    n = ev.height
    print(f"[{name}] {n:,} events, {su.height:,} summaries, {res.n_sessions:,} sessions, "
          f"{res.alerts.height} alerts, model {res.model}")
    print(f"  run_batch wall: best {walls[best]:.3f} s of "
          f"{', '.join(f'{w:.3f}' for w in walls)}  -> {n / walls[best]:,.0f} events/s"
          f"  ({walls[best] / n * 1e6:.3f} s per 1M events)")
    print(f"  run_batch CPU : {cpus[best]:.3f} s (min {min(cpus):.3f})")
    for stage, s in res.timings.items():
        print(f"    {stage:<28} {s:7.3f} s")
    if alerts_dir is not None:
        alerts_dir.mkdir(parents=True, exist_ok=True)
        path = alerts_dir / f"{name}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in _canonical(res.alerts)))
        print(f"  alerts written to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tw-bench-detectors"),
                    help="cache directory for the generated file and the stores")
    ap.add_argument("--alerts-out", type=Path, default=None,
                    help="directory to write canonical alerts per dataset")
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--compare-sequence", action="store_true",
                    help="also time with the sequence (and concurrency) detectors disabled "
                         "and print the CPU ratios")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    # A throwaway HMAC key: hashes only need to be consistent within one run's store.
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg")}
    print(f"polars {pl.__version__}, threads {pl.thread_pool_size()}")
    if not args.skip_demo:
        store = work / "demo-store"
        if not (store / "COMMIT.json").exists() and not any(store.glob("**/*.parquet")):
            _ingest(sorted(glob.glob(str(ROOT / "sample_logs/demo/*.jsonl*"))), store, env)
        ev, su = _load(store)
        _bench("demo", ev, su, args.repeat, args.alerts_out)
        if args.compare_sequence:
            _compare("demo", ev, su, args.repeat)
    if not args.skip_bench:
        src = work / f"bench-{args.events}-s{args.seed}.jsonl"
        if not src.exists():
            print(f"generating {args.events:,} events ...", flush=True)
            subprocess.run(
                [sys.executable, str(ROOT / "sample_logs/generate.py"), "--bench-events",
                 str(args.events), "--bench-out", str(src), "--seed", str(args.seed)],
                check=True, stdout=subprocess.DEVNULL,
            )
        store = work / f"store-{args.events}-s{args.seed}"
        if not any(store.glob("**/*.parquet")):
            print("ingesting ...", flush=True)
            _ingest([str(src)], store, env)
        ev, su = _load(store)
        _bench(f"bench{args.events}", ev, su, args.repeat, args.alerts_out)
        if args.compare_sequence:
            _compare(f"bench{args.events}", ev, su, args.repeat)


if __name__ == "__main__":
    main()
