"""Isolation forest without scikit-learn: scorer speed, child cost, live-process RSS.

Prints, in one run (interleaved, best of N, with the load average):

1. ``score``: the numpy scorer (:class:`TreeEnsemble`) vs scikit-learn's
   ``score_samples`` on the same fitted forest (detector settings: 100 trees, 256
   samples, 13 features), for several row counts, and whether the scores are equal.
2. ``child``: fitting / loading the forest in the child process (wall, child peak RSS)
   vs in-process (wall, including the scikit-learn import, in a fresh interpreter).
3. ``rss``: a fresh process that imports toolwatch's live modules and gets a fitted
   forest: in-process (scikit-learn imported) vs ``isolated=True`` (child process).

Usage::

    .venv/bin/python benchmarks/bench_forest.py [--rows 50,1000,10000,100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

# The child imports the test fixtures, which live under tests/ (not in the wheel): put the
# repository root on its path whatever the working directory.
TRAIN = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
import numpy as np
from tests.fixtures.traffic import Traffic
from toolwatch.detectors import DetectorsConfig, FeatureSet
tr = Traffic(seed=5)
tr.background(days=3, users=400, per_day=2)
fs = FeatureSet.build(tr.events(), tr.summaries(), DetectorsConfig())
"""


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_score(rows: list[int], repeat: int) -> None:
    from sklearn.ensemble import IsolationForest
    from toolwatch.detectors.forest_trees import TreeEnsemble

    rng = np.random.default_rng(0)
    model = IsolationForest(n_estimators=100, max_samples=256, random_state=7, n_jobs=1)
    model.fit(np.log1p(rng.lognormal(size=(20_000, 13))))
    trees = TreeEnsemble.from_sklearn(model)
    print(f"score (load avg {_load()}): 100 trees x 256 samples, 13 features, best of {repeat}")
    print(f"{'rows':>8} {'sklearn ms':>11} {'numpy ms':>9} {'numpy/sklearn speed':>20} equal")
    for n in rows:
        x = np.log1p(rng.lognormal(size=(n, 13)) * rng.choice([1, 1, 1, 50], size=(n, 1)))
        ts, tn = [], []
        for _ in range(repeat):  # interleaved: both see the same load
            t = time.perf_counter()
            a = -model.score_samples(x)
            ts.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = trees.iso_scores(x)
            tn.append(time.perf_counter() - t)
        print(f"{n:>8} {min(ts) * 1e3:>11.1f} {min(tn) * 1e3:>9.1f} "
              f"{min(ts) / min(tn):>19.2f}x {bool(np.array_equal(a, b))}")


def _run(code: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout.strip().splitlines()[-1])


LIVE_IMPORTS = "import toolwatch.live.driver, toolwatch.live_cli, toolwatch.detectors.pipeline\n"

PEAK = """
def peak():
    for line in open('/proc/self/status'):
        if line.startswith(('VmHWM:', 'VmRSS:')):
            yield line.split()[0], int(line.split()[1]) / 1024
"""


def bench_child(repeat: int) -> None:
    from toolwatch.detectors import forest_trees

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "x.npy"
        np.save(src, np.log1p(rng.lognormal(size=(20_000, 13))))
        model = Path(tmp) / "forest.skops"
        code = TRAIN + "from toolwatch.detectors import train\n" + \
            f"train(tr.events(), tr.summaries(), DetectorsConfig(), {str(model)!r})\n"
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        inproc_fit = textwrap.dedent(f"""
            import time, json, numpy as np
            t = time.perf_counter()
            from toolwatch.detectors.forest_child import fit_model
            fit_model(np.load({str(src)!r}), 100, 256, 7)
        """) + PEAK + 'print(json.dumps({"wall": time.perf_counter() - t, **dict(peak())}))\n'
        print(f"\nchild (load avg {_load()}): 20k x 13 matrix / a trained model, best of "
              f"{repeat}")
        fits, loads, inp = [], [], []
        for _ in range(repeat):
            r = forest_trees.run_child("fit", str(src), "100", "256", "7")
            fits.append((r.wall_s, r.peak_rss_mib))
            r = forest_trees.run_child("load", str(model), json.dumps(
                __import__("toolwatch.detectors.forest_child",
                           fromlist=["TRUSTED_TYPES"]).TRUSTED_TYPES))
            loads.append((r.wall_s, r.peak_rss_mib))
            inp.append(_run(inproc_fit)["wall"])
        print(f"  child fit : wall {min(w for w, _ in fits):.2f} s, "
              f"peak RSS {max(p for _, p in fits):.0f} MiB (child only; it exits)")
        print(f"  child load: wall {min(w for w, _ in loads):.2f} s, "
              f"peak RSS {max(p for _, p in loads):.0f} MiB")
        print(f"  in-process fit incl. sklearn import (fresh interpreter): {min(inp):.2f} s")


def bench_rss(repeat: int) -> None:
    code = "import sys, json, time\n" + LIVE_IMPORTS + TRAIN + PEAK + textwrap.dedent("""
        from toolwatch.detectors.forest import IsolationForestDetector, load_or_fit
        before = dict(peak())["VmRSS:"]
        det = IsolationForestDetector(DetectorsConfig())
        t = time.perf_counter()
        how = load_or_fit(det, None, fs, isolated=ISO)
        wall = time.perf_counter() - t
        det.score(fs)
        p = dict(peak())
        print(json.dumps({"before": before, "rss": p["VmRSS:"], "hwm": p["VmHWM:"],
                          "wall": wall, "how": how, "sklearn": "sklearn" in sys.modules,
                          "scipy": "scipy" in sys.modules}))
    """)
    print(f"\nrss (load avg {_load()}): fresh process, live modules imported, forest fitted "
          f"on ~2,400 sessions (400 callers x 3 days x 2), best of {repeat}")
    res: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(repeat):
        for iso in (False, True):
            res[iso].append(_run(code.replace("ISO", str(iso))))
    for iso in (False, True):
        r = min(res[iso], key=lambda d: d["rss"])
        name = "isolated (child)" if iso else "in-process sklearn"
        print(f"  {name:<19}: RSS {r['before']:.0f} -> {r['rss']:.0f} MiB "
              f"({r['rss'] - r['before']:+.0f}), peak {r['hwm']:.0f} MiB, "
              f"fit wall {min(d['wall'] for d in res[iso]):.2f} s, sklearn imported: "
              f"{bool(r['sklearn'])}, scipy: {bool(r['scipy'])}")
    a = min(d["rss"] for d in res[False])
    b = min(d["rss"] for d in res[True])
    print(f"  isolated saves {a - b:.0f} MiB of RSS ({b / a:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="50,1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["score", "child", "rss"], default=None)
    a = ap.parse_args()
    if a.only in (None, "rss"):
        bench_rss(min(a.repeat, 3))
    if a.only in (None, "child"):
        bench_child(min(a.repeat, 3))
    if a.only in (None, "score"):
        bench_score([int(r) for r in a.rows.split(",")], a.repeat)


if __name__ == "__main__":
    main()
