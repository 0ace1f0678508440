"""Benchmark: detection quality on traffic written independently of the detectors.

``benchmarks/independent/generate.py`` was written by someone who had read only the seed
articles (the specification of what toolwatch must catch) and the log contract
(docs/log-format.md), never ``detectors/``: every attack the seeds describe, in several
variants, beside everyday hard negatives of each class (treasury and payroll runs, job
polling with back-off, CI bots, approved exports, …). A score on the project's own
generator says the code does what was meant; this one says whether it finds attacks.

For each seed the generator writes a labelled set, the real CLI analyzes it (``toolwatch
analyze`` into a fresh store, ``--alerts-out``; with ``--tree DIR`` the code of another
checkout runs, through ``benchmarks/run_tree.py``, for a before/after in one run) and the
real ``toolwatch evaluate --json`` of *this* checkout scores the alerts against the labels.
Printed per seed set (development seeds, held-out seeds):

* recall per attack class, with the right category, and refused attempts apart;
* benign sessions flagged at any severity and at medium or higher, per role;
* ``power_user_day`` sessions flagged.

Run::

    .venv/bin/python benchmarks/bench_independent.py                  # dev 1-3, held out 101-103
    .venv/bin/python benchmarks/bench_independent.py --tree /tmp/old  # the same, old code
    .venv/bin/python benchmarks/bench_independent.py --seeds 1 --details

``--generator independent2`` scores a second author's traffic (``benchmarks/independent2``,
development seeds 11-13, held out 111-113).

Seeds 1-3 are the development set; 101-103 are held out (see the generator's README):
their misses and false positives are printed only with ``--details``, and a held-out seed
whose details were read to change a detector becomes a development seed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
#: Generator name -> (development seeds, held-out seeds). Two authors, each of whom read only
#: the seeds and docs/log-format.md: ``independent2`` was written after the detectors had
#: been tuned on ``independent``'s development seeds, so it also measures how far that
#: tuning carries to a second author's traffic.
GENERATORS = {"independent": ((1, 2, 3), (101, 102, 103)),
              "independent2": ((11, 12, 13), (111, 112, 113))}
SEVERITIES = ("low", "medium", "high", "critical")


def _log_files(d: Path) -> list[str]:
    return sorted(str(p) for p in d.iterdir()
                  if p.name.endswith((".jsonl", ".jsonl.gz")) and p.name != "labels.ndjson")


def _analyze(paths: list[str], store: Path, alerts: Path, tree: Path | None,
             config: Path | None) -> None:
    shutil.rmtree(store, ignore_errors=True)
    head = ([sys.executable, str(ROOT / "benchmarks" / "run_tree.py"), str(tree)] if tree
            else [TOOLWATCH])
    cfg = ["-c", str(config)] if config else []
    subprocess.run([*head, "analyze", *paths, "-d", str(store), "-q", "--no-progress",
                    "--alerts-out", str(alerts), *cfg], check=True, stdout=subprocess.DEVNULL)


def _evaluate(labels: Path, alerts: Path) -> dict[str, Any]:
    out = subprocess.run([TOOLWATCH, "evaluate", str(labels), str(alerts), "--json"],
                         check=True, capture_output=True).stdout
    return orjson.loads(out)


def _at_least(alerts: Path, severity: str, out: Path) -> Path:
    """The alerts of ``alerts`` at ``severity`` or above, as a new JSON-lines file."""
    keep = set(SEVERITIES[SEVERITIES.index(severity):])
    lines = [x for x in alerts.read_bytes().splitlines()
             if x.strip() and orjson.loads(x)["severity"] in keep]
    out.write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
    return out


def _entity_ids(labels: Path) -> None:
    """Name entity labels' value ``entity_id`` as ``toolwatch evaluate`` reads it
    (``independent2`` was asked for the key ``entity``)."""
    rows = [orjson.loads(x) for x in labels.read_bytes().splitlines() if x.strip()]
    for r in rows:
        if r.get("kind") == "entity" and "entity_id" not in r:
            r["entity_id"] = r.pop("entity")
    labels.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def run_seed(seed: int, work: Path, tree: Path | None, config: Path | None,
             scale: float, generator: str) -> dict[str, Any]:
    """Generate, analyze and evaluate one seed."""
    gen = work / f"gen{seed}"
    script = ROOT / "benchmarks" / generator / "generate.py"
    subprocess.run([sys.executable, str(script), "--seed", str(seed), "--out", str(gen),
                    "--scale", str(scale)], check=True, stdout=subprocess.DEVNULL)
    labels = gen / "labels.ndjson"
    _entity_ids(labels)
    alerts = work / f"alerts{seed}.jsonl"
    _analyze(_log_files(gen), work / f"store{seed}", alerts, tree, config)
    every = _evaluate(labels, alerts)
    medium = _evaluate(labels, _at_least(alerts, "medium", work / f"medium{seed}.jsonl"))
    rows = [orjson.loads(x) for x in labels.read_bytes().splitlines() if x.strip()]
    by_id = {r["alert_id"]: r for r in
             (orjson.loads(x) for x in alerts.read_bytes().splitlines() if x.strip())}
    return {"seed": seed, "every": every, "medium": medium, "labels": rows, "alerts": by_id}


def _label_id(lb: dict[str, Any]) -> str:
    """The id ``toolwatch evaluate`` gives a label in its ``missed`` rows."""
    if lb.get("kind") == "entity":
        return f"{lb['entity_type']}={lb['entity_id']}"
    return lb.get("session_id") or f"{lb.get('caller_id')}@{lb.get('first_seen')}"


def report(results: list[dict[str, Any]], title: str, details: bool) -> dict[str, Any]:
    """Pool the seeds' evaluations and print the figures."""
    caught: Counter[str] = Counter()
    total: Counter[str] = Counter()
    att_caught: Counter[str] = Counter()
    att_total: Counter[str] = Counter()
    roles: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    misses, fps = [], []
    for r in results:
        missed = {(m["id"], m["label"]) for m in r["every"]["missed"]}
        for lb in r["labels"]:
            if lb["label"] == "benign":
                continue
            hit = (_label_id(lb), lb["label"]) not in missed
            if lb.get("attempt"):
                att_total[lb["label"]] += 1
                att_caught[lb["label"]] += hit
            else:
                total[lb["label"]] += 1
                caught[lb["label"]] += hit
        for row in r["every"]["benign_roles"]:
            roles[row["role"]][0] += row["sessions"]
            roles[row["role"]][1] += row["flagged"]
        for row in r["medium"]["benign_roles"]:
            roles[row["role"]][2] += row["flagged"]
        misses += [(r["seed"], m) for m in r["every"]["missed"]]
        fps += [(r["seed"], f, r["alerts"]) for f in r["every"]["false_positives"]]
    print(f"\n== {title} ==")
    print(f"{'category':22} {'caught':>9} {'recall':>7}   {'refused attempts':>16}")
    worst = 1.0
    for cat in sorted(set(total) | set(att_total)):
        rec = caught[cat] / total[cat] if total[cat] else float("nan")
        worst = min(worst, rec) if total[cat] else worst
        att = (f"{att_caught[cat]}/{att_total[cat]}" if att_total[cat] else "-")
        print(f"{cat:22} {caught[cat]:>4}/{total[cat]:<4} {rec:7.3f}   {att:>16}")
    n = sum(v[0] for k, v in roles.items())
    f_any = sum(v[1] for k, v in roles.items())
    f_med = sum(v[2] for k, v in roles.items())
    print(f"\n{'benign role':30} {'sessions':>8} {'flagged':>8} {'>=medium':>9}")
    for role, (s, f, m) in sorted(roles.items()):
        if f or details:
            print(f"{role:30} {s:>8} {f:>8} {m:>9}")
    pw = roles.get("power_user_day", [0, 0, 0])
    print(f"benign sessions flagged: {f_any}/{n} = {100 * f_any / max(n, 1):.3f}% "
          f"(>= medium: {f_med}, {100 * f_med / max(n, 1):.3f}%); power_user_day "
          f"{pw[1]}/{pw[0]}; lowest class recall {worst:.3f}")
    if details:
        for seed, m in misses:
            print(f"  MISS seed {seed}: {m['label']} variant={m.get('variant')} "
                  f"id={m['id']} named_as={m.get('named_as')}")
        for seed, f, alerts in fps:
            for aid in (f.get("alert_ids") or "").split(","):
                a = alerts.get(aid)
                if a:
                    print(f"  FP seed {seed}: {f.get('role')} {a['category']}/{a['severity']} "
                          f"caller={f.get('caller_id')}: {(a.get('reasons') or [''])[0][:160]}")
    return {"recall": {c: caught[c] / total[c] for c in total if total[c]},
            "attempts": {c: att_caught[c] / att_total[c] for c in att_total},
            "benign": [f_any, f_med, n], "power": pw[:2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generator", choices=sorted(GENERATORS), default="independent",
                    help="which independent author's traffic (benchmarks/<name>/generate.py)")
    ap.add_argument("--seeds", type=int, nargs="+", help="only these seeds (one set)")
    ap.add_argument("--tree", type=Path, help="analyze with another checkout's code")
    ap.add_argument("--config", type=Path, help="toolwatch config passed to analyze")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--details", action="store_true", help="list misses and false positives")
    ap.add_argument("--json", type=Path, help="write the pooled figures here")
    args = ap.parse_args()
    dev, held = GENERATORS[args.generator]
    sets = ({"seeds": tuple(args.seeds)} if args.seeds
            else {"development seeds": dev, "held-out seeds": held})
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tw-indep-") as tmp:
        for title, seeds in sets.items():
            res = [run_seed(s, Path(tmp), args.tree, args.config, args.scale, args.generator)
                   for s in seeds]
            out[title] = report(res, f"{args.generator} {title} {list(seeds)}"
                                + (f" - code of {args.tree}" if args.tree else ""),
                                args.details)
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
