"""Score alerts against ground-truth labels: precision/recall per category, FPs per role.

Labels (``labels.ndjson``, written by ``sample_logs/generate.py`` or by hand) are one JSON
object per line::

    {"kind": "session", "session_id": ..., "caller_id": ..., "client_ip": ...,
     "label": "benign" | <category>, "role": ..., "variant": ..., "first_seen": ...,
     "last_seen": ..., "also": [<category>, ...]}   # "also" optional
    {"kind": "entity", "entity_type": "client_ip" | "caller_id", "entity_id": ...,
     "label": "credential_stuffing", "variant": "distributed", "first_seen": ..., "last_seen": ...}

Matching rules:

* An alert **names** a labelled session when it is a session alert on that session id —
  or, for sessions logged without an id (``session_id`` null in the label), a session
  alert on a derived session of the same caller (else client address) overlapping its
  time — or when it is an entity alert on the session's caller / client address whose
  ``[first_seen, last_seen]`` overlaps the session (and whose ``evidence.session_ids``,
  when complete, lists it — for a session logged without an id, lists a derived session
  of the same caller / address starting within it).
* An attack label is **caught** when an alert of its category names it; an entity label
  when an entity alert of its category is on that entity and overlaps its time, or alerts
  of its category name sessions of that entity inside its time span.
* A **benign** session is a false positive when any alert names it.
* An alert is a true positive for its category when it names an attack of that category
  (``anomaly``: any attack) or matches an entity label of it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from toolwatch.detectors.config import CATEGORIES
from toolwatch.ingest.sessionize import DERIVED_PREFIX, parse_derived

#: Slack when comparing label and alert times (log clocks, derived-session boundaries).
SLACK = timedelta(seconds=5)


def _ts(v: Any) -> datetime | None:
    if v is None:
        return None
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    s = str(v).replace("Z", "+00:00")
    d = datetime.fromisoformat(s)
    return d if d.tzinfo else d.replace(tzinfo=UTC)


def _overlap(a0: Any, a1: Any, b0: Any, b1: Any) -> bool:
    if None in (a0, a1, b0, b1):
        return True
    return a0 - SLACK <= b1 and b0 - SLACK <= a1


def _parse_derived(sid: str) -> tuple[str, str, datetime | None]:
    """``derived:caller:alice@2026-11-02T10:00:00.000000Z`` → (caller_id, alice, start)."""
    parsed = parse_derived(sid)
    actor, ts = parsed if parsed else (sid[len(DERIVED_PREFIX):].rpartition("@")[0], None)
    kind, _, value = actor.partition(":")
    etype = {"caller": "caller_id", "ip": "client_ip"}.get(kind, kind)
    return etype, value, ts


def _derived_matches(d: tuple[str, str, datetime | None], lb: dict[str, Any]) -> bool:
    etype, value, start = d
    if lb.get(etype) != value:
        return False
    return start is None or _overlap(lb["_first"], lb["_last"], start, start)


@dataclass
class Evaluation:
    """Result of :func:`evaluate`.

    Attributes
    ----------
    categories
        Per category: ``labels`` (attack labels), ``caught``, ``recall``, ``alerts``,
        ``true_alerts``, ``wrong_category`` (alerts only on other attacks), ``on_benign``
        (alerts naming only benign sessions), ``unmatched`` (naming nothing labelled) and
        ``precision`` (true / (true + wrong_category + on_benign)).
    benign_roles
        Per benign role: ``sessions``, ``flagged`` (false positives), ``fp_rate`` and
        ``by_category`` (which categories flagged them).
    missed
        Attack labels not caught, with the categories that *did* name them.
    false_positives
        Benign sessions flagged, with the alert categories and ids.
    """

    categories: pl.DataFrame
    benign_roles: pl.DataFrame
    missed: pl.DataFrame
    false_positives: pl.DataFrame
    totals: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {
            "categories": self.categories.to_dicts(),
            "benign_roles": self.benign_roles.to_dicts(),
            "missed": self.missed.to_dicts(),
            "false_positives": self.false_positives.to_dicts(),
            "totals": self.totals,
        }

    def to_text(self) -> str:
        """Plain-text tables (what ``toolwatch evaluate`` prints)."""
        lines = ["category              labels caught recall  alerts  TP  wrong benign  precision"]
        for r in self.categories.iter_rows(named=True):
            rec = "-" if r["recall"] is None else f"{r['recall']:.2f}"
            prec = "-" if r["precision"] is None else f"{r['precision']:.2f}"
            lines.append(
                f"{r['category']:<21} {r['labels']:>6} {r['caught']:>6} {rec:>6} "
                f"{r['alerts']:>7} {r['true_alerts']:>3} {r['wrong_category']:>5} "
                f"{r['on_benign']:>6} {prec:>10}"
            )
        lines.append("")
        lines.append("benign role          sessions flagged fp_rate  by category")
        for r in self.benign_roles.iter_rows(named=True):
            lines.append(
                f"{r['role']:<20} {r['sessions']:>8} {r['flagged']:>7} {r['fp_rate']:>7.3f}  "
                f"{r['by_category'] or ''}"
            )
        t = self.totals
        lines.append("")
        lines.append(
            f"attack labels caught: {t.get('caught', 0)}/{t.get('attack_labels', 0)}; "
            f"benign sessions flagged: {t.get('benign_flagged', 0)}/{t.get('benign_sessions', 0)}; "
            f"alerts: {t.get('alerts', 0)}"
        )
        return "\n".join(lines)


def read_labels(path: str | Path) -> list[dict[str, Any]]:
    """Labels from a JSON-lines file (blank lines ignored)."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            line = line.strip()
            if line:
                rec = orjson.loads(line)
                rec["_first"] = _ts(rec.get("first_seen"))
                rec["_last"] = _ts(rec.get("last_seen"))
                out.append(rec)
    return out


def evaluate(
    labels_path: str | Path,
    alerts: pl.DataFrame,
    events: pl.DataFrame | None = None,
    summaries: pl.DataFrame | None = None,
) -> Evaluation:
    """Compare ``alerts`` (ALERTS columns) with the labels in ``labels_path``.

    Parameters
    ----------
    labels_path
        ``labels.ndjson`` (see module docs).
    alerts
        Alerts as returned by ``run_batch`` or read from the store / ``--alerts-out``.
    events, summaries
        Optional; used only to widen time spans of sessionless labels to the derived
        sessions actually stored (labels alone are enough otherwise).
    """
    labels = read_labels(labels_path)
    sess_labels = [lb for lb in labels if lb.get("kind", "session") == "session"]
    ent_labels = [lb for lb in labels if lb.get("kind") == "entity"]
    by_sid: dict[str, dict[str, Any]] = {}
    sessionless: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    by_entity: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for i, lb in enumerate(sess_labels):
        lb["_i"] = i
        if lb.get("session_id"):
            by_sid[lb["session_id"]] = lb
        else:
            key = ("caller_id", lb["caller_id"]) if lb.get("caller_id") else (
                "client_ip", lb.get("client_ip"))
            sessionless[key].append(lb)
        for et in ("caller_id", "client_ip"):
            if lb.get(et):
                by_entity[(et, lb[et])].append(lb)

    named_by: dict[int, list[tuple[str, str]]] = defaultdict(list)  # label -> (category, id)
    alert_rows = alerts.to_dicts() if alerts.height else []
    verdicts = []
    for a in alert_rows:
        a0, a1 = _ts(a.get("first_seen")), _ts(a.get("last_seen"))
        named: list[dict[str, Any]] = []
        if a["entity_type"] == "session":
            sid = a.get("session_id") or a.get("entity_id")
            if sid in by_sid:
                named.append(by_sid[sid])
            else:
                for et in ("caller_id", "client_ip"):
                    if a.get(et):
                        named.extend(
                            lb for lb in sessionless.get((et, a[et]), [])
                            if _overlap(lb["_first"], lb["_last"], a0, a1)
                        )
                    if named:
                        break
        else:
            ev = orjson.loads(a["evidence"]) if a.get("evidence") else {}
            listed = set(ev.get("session_ids") or [])
            complete = bool(listed) and not ev.get("session_ids_truncated", False)
            derived = [_parse_derived(x) for x in listed if x.startswith(DERIVED_PREFIX)]
            for lb in by_entity.get((a["entity_type"], a["entity_id"]), []):
                if not _overlap(lb["_first"], lb["_last"], a0, a1):
                    continue
                if complete and lb.get("session_id") and lb["session_id"] not in listed:
                    continue
                if complete and not lb.get("session_id") and not any(
                    _derived_matches(d, lb) for d in derived
                ):
                    continue
                named.append(lb)
        for lb in named:
            named_by[lb["_i"]].append((a["category"], a["alert_id"]))
        ent_match = [
            el for el in ent_labels
            if a["entity_type"] == el.get("entity_type") and a["entity_id"] == el.get("entity_id")
            and _overlap(el["_first"], el["_last"], a0, a1)
        ]
        attack_cats = {lb["label"] for lb in named if lb["label"] != "benign"}
        # A label may name second categories the session legitimately earns ("also": a
        # bulk extraction paging through a listing is also a scraping loop).
        attack_cats |= {c for lb in named if lb["label"] != "benign" for c in lb.get("also") or []}
        attack_cats |= {el["label"] for el in ent_match}
        cat = a["category"]
        if not named and not ent_match:
            verdict = "unmatched"
        elif (cat == "anomaly" and attack_cats) or cat in attack_cats:
            verdict = "true"
        elif attack_cats:
            verdict = "wrong_category"
        else:
            verdict = "on_benign"
        verdicts.append((cat, verdict))

    # Recall.
    caught_by_cat: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    missed = []
    for lb in sess_labels:
        if lb["label"] == "benign":
            continue
        cats = {c for c, _ in named_by.get(lb["_i"], [])}
        ok = lb["label"] in cats
        caught_by_cat[lb["label"]][0] += 1
        caught_by_cat[lb["label"]][1] += int(ok)
        if not ok:
            ident = lb.get("session_id") or f"{lb.get('caller_id')}@{lb.get('first_seen')}"
            missed.append({"kind": "session", "label": lb["label"], "variant": lb.get("variant"),
                           "id": ident, "named_as": ",".join(sorted(cats)) or None})
    for el in ent_labels:
        c = el["label"]
        ok = any(
            a["category"] == c and a["entity_type"] == el.get("entity_type")
            and a["entity_id"] == el.get("entity_id")
            and _overlap(el["_first"], el["_last"], _ts(a["first_seen"]), _ts(a["last_seen"]))
            for a in alert_rows
        )
        if not ok:
            members = [
                lb for lb in by_entity.get((el["entity_type"], el["entity_id"]), [])
                if lb["label"] == c
                and _overlap(lb["_first"], lb["_last"], el["_first"], el["_last"])
            ]
            ok = any(c in {x for x, _ in named_by.get(lb["_i"], [])} for lb in members)
        caught_by_cat[c][0] += 1
        caught_by_cat[c][1] += int(ok)
        if not ok:
            missed.append({"kind": "entity", "label": c, "variant": el.get("variant"),
                           "id": f"{el['entity_type']}={el['entity_id']}", "named_as": None})

    cat_rows = []
    for cat in CATEGORIES:
        n_lab, n_caught = caught_by_cat.get(cat, [0, 0])
        vs = [v for c, v in verdicts if c == cat]
        tp, wrong = vs.count("true"), vs.count("wrong_category")
        ben, unm = vs.count("on_benign"), vs.count("unmatched")
        judged = tp + wrong + ben
        cat_rows.append({
            "category": cat,
            "labels": n_lab,
            "caught": n_caught,
            "recall": (n_caught / n_lab) if n_lab else None,
            "alerts": len(vs),
            "true_alerts": tp,
            "wrong_category": wrong,
            "on_benign": ben,
            "unmatched": unm,
            "precision": (tp / judged) if judged else None,
        })

    role_rows: dict[str, dict[str, Any]] = {}
    fps = []
    for lb in sess_labels:
        if lb["label"] != "benign":
            continue
        role = lb.get("role") or "benign"
        rr = role_rows.setdefault(role, {"role": role, "sessions": 0, "flagged": 0,
                                         "_cats": defaultdict(int)})
        rr["sessions"] += 1
        hits = named_by.get(lb["_i"], [])
        if hits:
            rr["flagged"] += 1
            for c in {c for c, _ in hits}:
                rr["_cats"][c] += 1
            fps.append({"role": role, "session_id": lb.get("session_id"),
                        "caller_id": lb.get("caller_id"),
                        "categories": ",".join(sorted({c for c, _ in hits})),
                        "alert_ids": ",".join(sorted({i for _, i in hits}))})
    roles = []
    for rr in sorted(role_rows.values(), key=lambda r: r["role"]):
        cats = rr.pop("_cats")
        rr["fp_rate"] = rr["flagged"] / rr["sessions"] if rr["sessions"] else 0.0
        rr["by_category"] = ", ".join(f"{c}={n}" for c, n in sorted(cats.items())) or None
        roles.append(rr)

    n_attack = sum(v[0] for v in caught_by_cat.values())
    totals = {
        "attack_labels": n_attack,
        "caught": sum(v[1] for v in caught_by_cat.values()),
        "benign_sessions": sum(r["sessions"] for r in roles),
        "benign_flagged": sum(r["flagged"] for r in roles),
        "alerts": len(alert_rows),
    }
    return Evaluation(
        categories=pl.DataFrame(cat_rows, schema={
            "category": pl.String, "labels": pl.Int64, "caught": pl.Int64,
            "recall": pl.Float64, "alerts": pl.Int64, "true_alerts": pl.Int64,
            "wrong_category": pl.Int64, "on_benign": pl.Int64, "unmatched": pl.Int64,
            "precision": pl.Float64}),
        benign_roles=pl.DataFrame(roles, schema={
            "role": pl.String, "sessions": pl.Int64, "flagged": pl.Int64,
            "fp_rate": pl.Float64, "by_category": pl.String}),
        missed=pl.DataFrame(missed, schema={
            "kind": pl.String, "label": pl.String, "variant": pl.String, "id": pl.String,
            "named_as": pl.String}),
        false_positives=pl.DataFrame(fps, schema={
            "role": pl.String, "session_id": pl.String, "caller_id": pl.String,
            "categories": pl.String, "alert_ids": pl.String}),
        totals=totals,
    )
