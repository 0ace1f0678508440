"""Live detection cost: CPU-µs per event of the live detection path, old code vs new.

Replays a store's events through the real :class:`toolwatch.live.pipeline.LivePipeline`
detection step (``_detect``: window, touched entities, passes, baseline history, the
detectors, alert tracking) in micro-batches of ``flush_events``, once as a caught-up
stream (``tail``: every micro-batch is detected) and once as a backlog (``backlog``:
detection deferred to ``backlog_detect_events``), and prints the process CPU spent in
detection per event. The old code is a ``git archive`` of ``--base`` imported in a child
process (the same import mapping as the editable install), so old and new run in one
session, interleaved, best of ``--repeat``; the alert ids and scores of both must agree.

Example::

    .venv/bin/python benchmarks/bench_live_detect.py --events 400000 --base HEAD --repeat 3

(``--store`` reuses an ingested store; otherwise ``--events`` bench lines are generated
and ingested into the work directory; ``--old-tree`` / ``--new-tree`` compare extracted
trees.) ``--passes 100,2000,20000,80000`` measures single detection passes instead: the
CPU of one live ``detect`` call of each size with the 20k preceding events as baseline
history, the fixed cost per pass (intercept) and the marginal CPU-us/event::

    .venv/bin/python benchmarks/bench_live_detect.py --store STORE --old-tree /tmp/base \
        --passes 100,2000,20000,80000 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]

#: Import mapping of the editable install (pyproject's package-dir), rooted at a tree.
_PACKAGES = {
    "toolwatch": "toolwatch", "toolwatch.detectors": "detectors",
    "toolwatch.ingest": "ingest", "toolwatch.sample_logs": "sample_logs",
    "toolwatch.dashboard": "dashboard",
}

_CHILD = r'''
import importlib.abc, importlib.machinery, json, os, sys, time
root, mapping = sys.argv[1], json.loads(sys.argv[2])

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in mapping:
            d = os.path.join(root, mapping[name])
            return importlib.machinery.PathFinder.find_spec(name, [os.path.dirname(d)]) \
                if os.path.basename(d) == name.rsplit(".", 1)[-1] else \
                importlib.util.spec_from_file_location(
                    name, os.path.join(d, "__init__.py"), submodule_search_locations=[d])
        return None

import importlib.util
sys.path = [p for p in sys.path if p not in ("", ".")]
sys.meta_path.insert(0, _Finder())
sys.argv = [sys.argv[0], *sys.argv[3:]]
exec(compile(open(os.environ["BENCH_SELF"]).read(), os.environ["BENCH_SELF"], "exec"),
     {"__name__": "__child__", "__file__": os.environ["BENCH_SELF"]})
'''


def _child(store_dir: str, mode: str, overrides: list[str], out_json: str) -> None:
    """Run one replay in this process (imports resolve to the tree under test)."""
    import polars as pl
    import pyarrow as pa

    import toolwatch
    from toolwatch.config import Config
    from toolwatch.live.config import LiveConfig
    from toolwatch.live.pipeline import LivePipeline
    from toolwatch.store import Store

    src = Store(store_dir)
    con = src.connect()
    events = con.sql("SELECT * FROM events ORDER BY ts, event_id").to_arrow_table()
    try:
        summaries = con.sql("SELECT * FROM summaries ORDER BY ts").to_arrow_table()
    except Exception:
        summaries = None
    con.close()
    work = tempfile.mkdtemp(prefix="bld-")
    cfg = Config()
    cfg.store.data_dir = work
    live = dict(cfg.live) if isinstance(cfg.live, dict) else {}
    for kv in overrides:
        k, v = kv.split("=", 1)
        live[k] = json.loads(v) if v[:1].isdigit() or v in ("true", "false") else v
    cfg.live = live
    lp = LivePipeline(cfg, Store(work), live=LiveConfig.from_config(cfg))
    # Count forest loads/fits: after the first fit the live forest must be reused.
    import toolwatch.detectors.pipeline as dp

    fits = {"forest_load_or_fit": 0}
    real_load_or_fit = dp.load_or_fit

    def counted(*a: object, **k: object) -> object:
        fits["forest_load_or_fit"] += 1
        return real_load_or_fit(*a, **k)

    dp.load_or_fit = counted
    # Where the commit thread's detection-path CPU goes: the window's add (and expiry)
    # vs the detector passes (the rest: touched ids, selection, history, tracking).
    phases = {"window_add_cpu": 0.0, "detect_cpu": 0.0}

    def timed(fn: Any, key: str) -> Any:
        def run(*a: object, **k: object) -> object:
            c0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                phases[key] += time.process_time() - c0
        return run

    lp.window.add = timed(lp.window.add, "window_add_cpu")  # type: ignore[method-assign]
    dp.detect = timed(dp.detect, "detect_cpu")
    n = events.num_rows
    step = lp.live.flush_events
    ts_s = pl.from_arrow(summaries.select(["ts"])) if summaries is not None else None
    # Warm the imports (detectors, scikit-learn) outside the measurement, as a live
    # process does while it reads its first lines.
    lp._detect(events.slice(0, 0), summaries.slice(0, 0) if summaries is not None
               else pa.table({}), defer=False)
    cpu = wall = 0.0
    got: dict[str, list] = {}
    defer = mode == "backlog"
    s_lo = 0
    for lo in range(0, n, step):
        ev = events.slice(lo, step)
        hi_ts = ev.column("ts")[-1]
        if summaries is not None:
            s_hi = int((ts_s["ts"] <= hi_ts.as_py()).sum()) if lo + step < n else ts_s.height
            su = summaries.slice(s_lo, s_hi - s_lo)
            s_lo = s_hi
        else:
            su = pa.table({})
        last = lo + step >= n
        c0, w0 = time.process_time(), time.perf_counter()
        out = lp._detect(ev, su, defer=defer and not last)
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        if out is not None:
            # The latest version of each alert: id, score and a digest of its text.
            for aid, sc, ev, rs in out.select("alert_id", "score", "evidence",
                                               "reasons").iter_rows():
                txt = hashlib.sha1(json.dumps([ev, rs]).encode()).hexdigest()[:12]
                got[aid] = [sc, txt]
    digest = sorted(got.items())
    with open(out_json, "w") as f:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        json.dump({"cpu": cpu, "wall": wall, "events": n, "alerts": digest, "peak_mib": rss,
                   "root": str(Path(toolwatch.__file__).parents[1]),
                   "extra": {k: v for k, v in lp.status.extra.items()
                             if isinstance(v, int | float)} | fits
                   | {k: round(v, 2) for k, v in phases.items()}}, f)


def _child_passes(store_dir: str, sizes: str, repeat: int, out_json: str) -> None:
    """CPU of single detection passes of each size (the live call: history + reuse).

    Each pass reads ``n`` consecutive events from the 200,000th on (earlier in a smaller
    store) with the ``history_events`` (20k) events before them as baseline history,
    exactly the call a live detection makes (``detectors.run_batch(..., reuse={"live":
    True})``, the forest fitted once in a child). A fresh history frame per pass, as
    every live detection builds one. Best of ``repeat`` after a warm-up pass of each size.
    """
    import polars as pl

    from toolwatch import detectors
    from toolwatch.store import Store

    con = Store(store_dir).connect()
    n_max = max(int(x) for x in sizes.split(","))
    hist_n = 20_000
    # From the 200,000th event, or as far in as the store allows: past its end the passes
    # read nothing and every size costs the same (a 200k store gave empty passes).
    total = int(con.sql("SELECT count(*) FROM events").fetchall()[0][0])
    start = min(200_000, total - n_max)
    if start < hist_n:
        sys.exit(f"--passes needs {hist_n + n_max} events in the store, it has {total}")
    df = pl.from_arrow(con.sql(
        "SELECT * FROM events ORDER BY ts, event_id LIMIT ? OFFSET ?",
        params=[n_max + hist_n, start - hist_n]).to_arrow_table())
    con.close()
    assert isinstance(df, pl.DataFrame)
    cfg = detectors.DetectorsConfig()
    reuse: dict = {"live": True}
    hist_base = df.head(hist_n)
    empty_su = pl.DataFrame()
    res: dict[str, dict] = {}
    for size in (int(x) for x in sizes.split(",")):
        ev = df.slice(hist_n, size)
        best = None
        digest = None
        stages: dict[str, float] = {}
        for rep in range(repeat + 1):
            hist = hist_base.clone()  # a new frame: history features rebuilt, as live
            c0, w0 = time.process_time(), time.perf_counter()
            r = detectors.detect(ev, empty_su, cfg, history=hist, reuse=reuse)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            al = r.alerts
            digest = hashlib.sha1(json.dumps(
                al.select("alert_id", "score", "evidence", "reasons").rows()).encode()
            ).hexdigest()[:12]
            if rep and (best is None or cpu < best[0]):
                best = (cpu, wall)
                stages = dict(r.timings)
        res[str(size)] = {"cpu": best[0], "wall": best[1], "alerts": al.height,
                          "digest": digest, "stages": stages}
    with open(out_json, "w") as f:
        json.dump(res, f)


def _passes_main(args: argparse.Namespace, trees: dict[str, Path], store: Path,
                 work: Path) -> None:
    """``--passes``: fixed cost per pass and CPU-µs/event at each size, old vs new."""
    best: dict[tuple[str, str], dict] = {}
    for rep in range(args.repeat):
        for name, root in (trees.items() if rep % 2 == 0 else reversed(trees.items())):
            out = work / f"{name}-passes-{rep}.json"
            env = {**os.environ, "BENCH_SELF": str(Path(__file__).resolve())}
            subprocess.run([sys.executable, "-c", _CHILD, str(root), json.dumps(_PACKAGES),
                            "--passes-child", str(store), args.passes, str(args.inner),
                            str(out)], check=True, env=env)
            r = json.loads(out.read_text())
            for size, v in r.items():
                k = (name, size)
                if k not in best or v["cpu"] < best[k]["cpu"]:
                    best[k] = v
            print(f"  rep {rep} {name}: " + ", ".join(
                f"{s}: {1e3 * v['cpu']:.0f} CPU-ms" for s, v in r.items()), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    sizes = args.passes.split(",")
    for name in trees:
        print(f"{name}:")
        for s in sizes:
            v = best[name, s]
            top = sorted(v["stages"].items(), key=lambda kv: -kv[1])[:6]
            print(f"  {int(s):6d} events: {1e3 * v['cpu']:7.1f} CPU-ms/pass "
                  f"({1e6 * v['cpu'] / int(s):8.1f} CPU-us/event), wall "
                  f"{1e3 * v['wall']:6.1f} ms, {v['alerts']} alerts [{v['digest']}]; "
                  + ", ".join(f"{k} {1e3 * t:.0f}" for k, t in top), flush=True)
        if len(sizes) >= 2:
            # Fixed cost: the intercept of CPU vs events between the two smallest passes.
            a, b = int(sizes[0]), int(sizes[-1])
            ca, cb = best[name, sizes[0]]["cpu"], best[name, sizes[-1]]["cpu"]
            slope = (cb - ca) / (b - a)
            print(f"  fixed ~{1e3 * (ca - slope * a):.0f} CPU-ms/pass, marginal "
                  f"{1e6 * slope:.1f} CPU-us/event ({a}..{b})")
    if len(trees) == 2:
        for s in sizes:
            o, n = best["old", s], best["new", s]
            print(f"  {int(s):6d}: new/old CPU {n['cpu'] / o['cpu']:.2f}x; same alerts "
                  f"{o['digest'] == n['digest']}")


def _ingest(work: Path, events: int) -> Path:
    from toolwatch.sample_logs.generate import generate_bench

    log = work / "bench.log"
    generate_bench(events, log)
    store = work / "store"
    subprocess.run([str(Path(sys.executable).with_name("toolwatch")), "ingest", str(log),
                    "-d", str(store), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--store", type=Path, help="an ingested store to replay")
    ap.add_argument("--base", default="HEAD", help="git revision of the old code")
    ap.add_argument("--old-tree", type=Path, help="old code already extracted here")
    ap.add_argument("--new", dest="new_rev", help="git revision of the new code "
                    "(default: the working tree, with everyone's uncommitted edits)")
    ap.add_argument("--new-tree", type=Path, help="new code already extracted here")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="tail,backlog")
    ap.add_argument("--live", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--only", choices=["old", "new"], help="run one tree only")
    ap.add_argument("--passes", metavar="SIZES",
                    help="measure single detection passes of these sizes instead "
                    "(e.g. 100,2000,20000,80000): fixed CPU per pass and CPU-us/event")
    ap.add_argument("--inner", type=int, default=3,
                    help="--passes: timed passes of each size per child (best kept)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-live-detect-"))
    work.mkdir(parents=True, exist_ok=True)
    store = args.store or _ingest(work, args.events)
    old = args.old_tree
    if old is None:
        old = work / "old"
        old.mkdir(exist_ok=True)
        arc = subprocess.run(["git", "-C", str(HERE), "archive", args.base],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=arc, check=True)
    new = args.new_tree or HERE
    if args.new_rev:
        new = work / "new"
        new.mkdir(exist_ok=True)
        arc = subprocess.run(["git", "-C", str(HERE), "archive", args.new_rev],
                             check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(new)], input=arc, check=True)
    trees = {"old": old, "new": new}
    if args.only:
        trees = {args.only: trees[args.only]}
    print(f"load average {os.getloadavg()[0]:.2f}; store {store}; "
          f"old {args.old_tree or args.base}, "
          f"new {args.new_tree or args.new_rev or 'working tree'}")
    if args.passes:
        _passes_main(args, trees, store, work)
        return
    best: dict[tuple[str, str], dict] = {}
    for mode in args.modes.split(","):
        for rep in range(args.repeat):
            for name, root in (trees.items() if rep % 2 == 0 else reversed(trees.items())):
                out = work / f"{name}-{mode}-{rep}.json"
                env = {**os.environ, "BENCH_SELF": str(Path(__file__).resolve())}
                subprocess.run([sys.executable, "-c", _CHILD, str(root), json.dumps(_PACKAGES),
                                "--child", str(store), mode, out, *args.live],
                               check=True, env=env)
                r = json.loads(out.read_text())
                if r["extra"].get("detector_errors"):
                    sys.exit(f"{name} tree: detection failed ({r['extra']}); see the log above")
                if (mode, name) not in best or r["cpu"] < best[mode, name]["cpu"]:
                    best[mode, name] = r
                print(f"  {mode:8s} {name}: {1e6 * r['cpu'] / r['events']:6.1f} CPU-us/event "
                      f"({r['cpu']:.1f} CPU-s, {r['wall']:.1f} s wall, "
                      f"{len(r['alerts'])} alerts, peak RSS {r['peak_mib']:.0f} MiB) "
                      f"{r['extra']}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for mode in args.modes.split(","):
        if len(trees) < 2:
            break
        o, n = best[mode, "old"], best[mode, "new"]
        same = o["alerts"] == n["alerts"]
        ids = {a for a, _ in o["alerts"]} == {a for a, _ in n["alerts"]}
        h = hashlib.sha1(json.dumps(n["alerts"]).encode()).hexdigest()[:10]
        print(f"{mode:8s} best-of-{args.repeat}: old {1e6 * o['cpu'] / o['events']:.1f}, "
              f"new {1e6 * n['cpu'] / n['events']:.1f} detection CPU-us/event "
              f"(new/old {n['cpu'] / o['cpu']:.2f}x); alerts {len(o['alerts'])} vs "
              f"{len(n['alerts'])}, same ids {ids}, same ids+scores+text {same} [{h}]")


if __name__ in ("__main__", "__child__"):
    if len(sys.argv) > 1 and sys.argv[1] == "--passes-child":
        _child_passes(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], sys.argv[5:], sys.argv[4])
    else:
        main()
