"""Per-call cost of each detector module: fit + score CPU and polars collects per call.

A live detection pass fits every detector on (history ∪ batch) and scores the batch, so a
pass has a fixed cost whatever its size. This replays that shape per detector, at several
batch sizes (default 100, 2k, 20k, 80k events of the 1M bench store, after a history of
``--history`` events), and prints for each detector and size the best CPU of ``--repeat``
for ``fit`` and ``score`` and the number of polars query executions (``collect``,
``collect_all`` and the eager frame operations, which polars runs as one lazy query each).
Features (and the sequence detectors' tool annotation) are built before the clock starts:
they are the shared layer's cost, not the modules'. The isolation forest is fitted once
(as a live process does) and each call then re-learns the callers' habits and scores.

``--base DIR`` also runs the same measurement on another source tree (e.g. a
``git worktree add /tmp/h2-base HEAD``) in a child process, interleaved, and prints
new/old ratios per detector and for the whole stack, plus whether every detector's score
frame (all rows, all columns, in order) is identical between the two trees.

Example::

    .venv/bin/python benchmarks/bench_detector_calls.py --base /tmp/h2-base --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
_PACKAGES = {
    "toolwatch": "toolwatch", "toolwatch.detectors": "detectors",
    "toolwatch.ingest": "ingest", "toolwatch.sample_logs": "sample_logs",
    "toolwatch.dashboard": "dashboard",
}
# Same import mapping as the editable install, rooted at another tree (see
# bench_live_detect.py).
_CHILD = r'''
import importlib.abc, importlib.machinery, importlib.util, json, os, sys
root, mapping = sys.argv[1], json.loads(sys.argv[2])

class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in mapping:
            d = os.path.join(root, mapping[name])
            return importlib.util.spec_from_file_location(
                name, os.path.join(d, "__init__.py"), submodule_search_locations=[d])
        return None

sys.path = [p for p in sys.path if p not in ("", ".")]
sys.meta_path.insert(0, _Finder())
sys.argv = [sys.argv[0], *sys.argv[3:]]
exec(compile(open(os.environ["BENCH_SELF"]).read(), os.environ["BENCH_SELF"], "exec"),
     {"__name__": "__child__", "__file__": os.environ["BENCH_SELF"]})
'''

DEFAULT_STORE = Path("/tmp/tw-bench-detectors/store-1000000-s11")


class _Counter:
    """Counts polars query executions (outermost only: one eager op = one query)."""

    def __init__(self) -> None:
        import polars as pl

        self.n = 0
        self._depth = 0
        lf = pl.LazyFrame
        for owner, attr in ((lf, "collect"), (lf, "_collect_eager"), (pl, "collect_all")):
            real = getattr(owner, attr)
            setattr(owner, attr, self._wrap(real))

    def _wrap(self, real):
        def inner(*a, **k):
            if self._depth == 0:
                self.n += 1
            self._depth += 1
            try:
                return real(*a, **k)
            finally:
                self._depth -= 1
        return inner


def _digest(df) -> str:
    """Digest of a whole frame: every row and column, in order; then the same with the
    rows sorted (equal only there: same rows in another order)."""
    import hashlib

    rows = df.hash_rows(seed=1).to_numpy() if df.height else None
    out = []
    for r in (rows, None if rows is None else sorted(rows.tolist())):
        h = hashlib.sha1(str(df.schema).encode())
        h.update(str(r if r is None or isinstance(r, list) else r.tobytes()).encode())
        out.append(h.hexdigest()[:10])
    return "/".join(out)


def _same(a: str, b: str) -> str:
    if a == b:
        return "identical"
    return "same-rows-other-order" if a.split("/")[1] == b.split("/")[1] else "DIFFERENT"


def _child(store: str, sizes: list[int], history: int, repeat: int, out: str) -> None:
    from toolwatch.detectors import registry
    from toolwatch.detectors.base import FeatureSet
    from toolwatch.detectors.forest import IsolationForestDetector
    from toolwatch.detectors.tools import annotated

    from toolwatch import detectors
    from toolwatch.analyze import load_events
    from toolwatch.store import Store

    st = Store(store)
    try:
        ev, _su = load_events(st, None)
    finally:
        st.close()
    ev = ev.sort("ts", "event_id")
    cfg = detectors.DetectorsConfig.from_dict({})
    counter = _Counter()
    res: dict[str, dict] = {}
    hist_fs = FeatureSet.build(ev.slice(0, history), None, cfg) if history else None
    for n in sizes:
        batch = FeatureSet.build(ev.slice(history, n), None, cfg)
        fit_on = hist_fs.union(batch) if hist_fs is not None else batch
        annotated(batch)
        annotated(fit_on)
        forest = None
        for det in registry.build(cfg):
            if isinstance(det, IsolationForestDetector):
                forest = det.fit(fit_on)  # once per process, as live does
        per: dict[str, dict] = {}
        for _ in range(repeat):
            for det in registry.build(cfg):
                if isinstance(det, IsolationForestDetector):
                    det = forest
                    fit = det.learn_habits
                else:
                    fit = det.fit
                c0, k0 = time.process_time(), counter.n
                fit(fit_on)
                c1, k1 = time.process_time(), counter.n
                sc = det.score(batch)
                dec = det.decide(sc)
                det.explain_all(dec)
                c2, k2 = time.process_time(), counter.n
                r = per.setdefault(det.name, {"fit": [], "score": []})
                r["fit"].append(c1 - c0)
                r["score"].append(c2 - c1)
                r["q_fit"], r["q_score"] = k1 - k0, k2 - k1
                r["rows"], r["digest"] = sc.height, _digest(sc)
        res[str(n)] = {k: {"fit": min(v["fit"]), "score": min(v["score"]),
                           "q_fit": v["q_fit"], "q_score": v["q_score"],
                           "rows": v["rows"], "digest": v["digest"]}
                       for k, v in per.items()}
    Path(out).write_text(json.dumps(res))


def _run(tree: Path, args: argparse.Namespace, out: Path) -> dict:
    env = {**os.environ, "BENCH_SELF": str(Path(__file__).resolve())}
    cmd = [sys.executable, "-c", _CHILD, str(tree), json.dumps(_PACKAGES), "--child",
           str(args.store), ",".join(map(str, args.sizes)), str(args.history),
           str(args.repeat), str(out)]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(out.read_text())


def _merge(best: dict | None, r: dict) -> dict:
    if best is None:
        return r
    for n, dets in r.items():
        for d, v in dets.items():
            b = best[n][d]
            b["fit"] = min(b["fit"], v["fit"])
            b["score"] = min(b["score"], v["score"])
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=DEFAULT_STORE)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                    default=[100, 2000, 20000, 80000])
    ap.add_argument("--history", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3, help="calls per child (best kept)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved child runs per tree")
    ap.add_argument("--base", type=Path, help="old source tree to compare with")
    ap.add_argument("--new", type=Path, default=HERE,
                    help="source tree under test (default: this working tree)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-det-calls-"))
    trees = {"new": args.new} | ({"old": args.base} if args.base else {})
    print(f"load average {os.getloadavg()[0]:.2f}; history {args.history} events; "
          f"sizes {args.sizes}; trees {trees}", flush=True)
    best: dict[str, dict | None] = dict.fromkeys(trees)
    for rnd in range(args.rounds):
        order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
        for name in order:
            best[name] = _merge(best[name], _run(trees[name], args, work / f"{name}{rnd}.json"))
    print(f"load average {os.getloadavg()[0]:.2f}")
    new, old = best["new"], best.get("old")
    for n in map(str, args.sizes):
        tot = {"fit": 0.0, "score": 0.0, "q": 0}
        tot_old = {"fit": 0.0, "score": 0.0, "q": 0}
        print(f"\n== batch {int(n):,} events (+{args.history:,} history): CPU ms per call, "
              "polars queries (fit/score)")
        rows = sorted(new[n].items(), key=lambda kv: -(kv[1]["fit"] + kv[1]["score"]))
        for d, v in rows:
            line = (f"  {d:28s} fit {1e3 * v['fit']:7.1f} score {1e3 * v['score']:7.1f} "
                    f"q {v['q_fit']:3d}/{v['q_score']:3d}")
            tot["fit"] += v["fit"]
            tot["score"] += v["score"]
            tot["q"] += v["q_fit"] + v["q_score"]
            if old is not None:
                o = old[n][d]
                tot_old["fit"] += o["fit"]
                tot_old["score"] += o["score"]
                tot_old["q"] += o["q_fit"] + o["q_score"]
                t_new, t_old = v["fit"] + v["score"], o["fit"] + o["score"]
                line += (f" | old {1e3 * o['fit']:7.1f} {1e3 * o['score']:7.1f} "
                         f"q {o['q_fit']:3d}/{o['q_score']:3d} | new/old {t_new / t_old:5.2f}x"
                         f" scores {_same(v['digest'], o['digest'])}")
            print(line)
        line = (f"  {'TOTAL':28s} fit {1e3 * tot['fit']:7.1f} score {1e3 * tot['score']:7.1f}"
                f" q {tot['q']}")
        if old is not None:
            t_new = tot["fit"] + tot["score"]
            t_old = tot_old["fit"] + tot_old["score"]
            line += (f" | old {1e3 * tot_old['fit']:7.1f} {1e3 * tot_old['score']:7.1f} "
                     f"q {tot_old['q']} | new/old {t_new / t_old:5.2f}x")
        print(line)


if __name__ in ("__main__", "__child__"):
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4]),
               int(sys.argv[5]), sys.argv[6])
    else:
        main()
