"""Alert records: deterministic ids, severity bands, suppression, de-duplication.

An alert is one (entity, category, window): a session (the window is the session), or a
caller id / client address over one hopping entity window. Its ``alert_id`` is a hash of
exactly that identity — never of the score, the detection time or the batch — so re-runs,
restarts, live micro-batches and parallel workers produce the *same* id for the same
alert, and a later version (more evidence, higher score) supersedes the earlier one in the
store's ``alerts`` view (latest ``detected_at`` wins).

Entity windows overlap (they hop by half a window by default); when several windows of one
entity and category fire on evidence contained in another's, only the widest (then
earliest) is kept.

The record (columns of ``toolwatch.schema.ALERTS``) is documented in
``docs/alert.schema.json``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
from toolwatch.detectors.base import Detector
from toolwatch.detectors.config import SEVERITIES, DetectorsConfig  # noqa: F401 - re-exported
from toolwatch.detectors.text import iso

#: Output columns and types (mirrors ``toolwatch.schema.ALERTS``).
ALERT_COLUMNS: dict[str, pl.DataType] = {
    "alert_id": pl.String(),
    "category": pl.String(),
    "detector": pl.String(),
    "severity": pl.String(),
    "score": pl.Float64(),
    "entity_type": pl.String(),
    "entity_id": pl.String(),
    "session_id": pl.String(),
    "caller_id": pl.String(),
    "client_ip": pl.String(),
    "server": pl.String(),
    "first_seen": pl.Datetime("us", "UTC"),
    "last_seen": pl.Datetime("us", "UTC"),
    "detected_at": pl.Datetime("us", "UTC"),
    "reasons": pl.List(pl.String()),
    "evidence": pl.String(),
}

#: Categories never folded into each other on one session: scraping (walking a listing by
#: page) and bulk extraction (volume) are two findings when a session does both.
#: Pairs of categories that are two findings on one session, never folded into one:
#: walking a listing *and* pulling volume; firing calls at once *and* pulling volume;
#: firing calls at once *and* racing writes on one key or on the session's own state
#: (seed 004 files its lost update on a usage counter under concurrent requests, and it
#: is a race too: both findings are reported).
_BOTH_KEPT = ({"scraping_loop", "bulk_extraction"}, {"concurrency_abuse", "bulk_extraction"},
              {"concurrency_abuse", "race_condition"})


def alert_id(entity_type: str, entity_id: str, category: str, window_start: int | None) -> str:
    """Deterministic id of (entity type, entity, category, window start bucket).

    Parameters
    ----------
    window_start
        Start of the entity window in µs since the epoch; ``None`` for session alerts
        (the session *is* the window).
    """
    bucket = "session" if window_start is None else iso(window_start)
    key = "\x1f".join((entity_type, entity_id, category, str(bucket)))
    return hashlib.blake2b(key.encode("utf-8"), digest_size=12).hexdigest()


def _dedupe_windows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop entity-window alerts whose evidence span lies inside a kept one's."""
    sessions = [r for r in rows if r["window_start"] is None]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["window_start"] is not None:
            groups.setdefault((r["entity_type"], r["entity_id"], r["category"]), []).append(r)
    kept: list[dict[str, Any]] = []
    for group in groups.values():
        # Widest evidence span first, then highest score, then earliest window.
        group.sort(key=lambda r: (-(r["last_t"] - r["first_t"]), -r["score"], r["window_start"]))
        chosen: list[dict[str, Any]] = []
        for r in group:
            if any(c["first_t"] <= r["first_t"] and r["last_t"] <= c["last_t"] for c in chosen):
                continue
            chosen.append(r)
        kept.extend(chosen)
    return sessions + kept


def _fold(rows: list[dict[str, Any]], config: DetectorsConfig) -> tuple[list[dict[str, Any]], int]:
    """Fold redundant alerts into the one that explains them (see ``fold_overlaps``)."""
    if not config.fold_overlaps:
        return rows, 0
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["window_start"] is None:
            by_session.setdefault(r["session_id"], []).append(r)
    dropped: set[int] = set()
    for group in by_session.values():
        if len(group) < 2:
            continue
        rules = sorted((r for r in group if r["category"] != "anomaly"),
                       key=lambda r: (-r["score"], r["category"]))
        if not rules:
            continue
        top = rules[0]
        # A session known only from its summary offers a handful of figures that every
        # category reads: report it once, under the category those figures support most.
        summary_only = (top["_evidence"] or {}).get("basis") == "summary"
        for r in group:
            if r is top:
                continue
            if {r["category"], top["category"]} in _BOTH_KEPT and not summary_only:
                continue  # e.g. walking a listing *and* pulling volume: two findings
            if (r["category"] == "anomaly" or summary_only
                    or r["score"] <= top["score"] - config.fold_margin):
                _absorb(top, r)
                dropped.add(id(r))
    # Forest alerts on sessions an entity alert already lists. A session can be listed by
    # several (overlapping hopping windows, its caller's and its address's): it is
    # counted in the first of a fixed order, not of the rows' order (which follows a
    # polars group-by and changed from one run to the next). The order is
    # _dedupe_windows' (widest evidence span, then highest score, then earliest window),
    # so the host is never a window that de-duplication drops afterwards.
    covered: dict[str, dict[str, Any]] = {}
    hosts = sorted(
        (r for r in rows if r["window_start"] is not None and id(r) not in dropped),
        key=lambda r: (-(r["last_t"] - r["first_t"]), -r["score"], r["window_start"],
                       r["entity_type"], r["entity_id"], r["category"]))
    for r in hosts:
        for sid in r.get("session_ids") or []:
            covered.setdefault(sid, r)
    for r in rows:
        if r["category"] == "anomaly" and r["window_start"] is None and id(r) not in dropped:
            host = covered.get(r["session_id"])
            if host is not None:
                _absorb(host, r, session=r["session_id"])
                dropped.add(id(r))
    return [r for r in rows if id(r) not in dropped], len(dropped)


def _absorb(host: dict[str, Any], other: dict[str, Any], session: str | None = None) -> None:
    also = host["_evidence"].setdefault("also", {})
    if session is None:
        also[other["category"]] = round(float(other["score"]), 4)
        first = (other["_reasons"] or [""])[0]
        host["_reasons"] = [*host["_reasons"],
                            f"Also scored {other['score']:.2f} as {other['category']}: {first}"]
    else:
        n = also.get("anomaly_sessions", 0) + 1
        also["anomaly_sessions"] = n


def suppression_reason(record: dict[str, Any], config: DetectorsConfig) -> str | None:
    """Why an alert is allowlisted (``callers``, ``tool_patterns``, ...) or None."""
    sup = config.suppress
    caller, ip, server = record.get("caller_id"), record.get("client_ip"), record.get("server")
    tool = (record.get("_evidence") or {}).get("top_tool") or (
        (record.get("_evidence") or {}).get("page_tool")
    )
    if caller is not None and caller in sup.callers:
        return "callers"
    if ip is not None and ip in sup.client_ips:
        return "client_ips"
    if server is not None and server in sup.servers:
        return "servers"
    if tool is not None and tool in sup.tools:
        return "tools"
    if caller is not None and any(re.search(p, caller) for p in sup.caller_patterns):
        return "caller_patterns"
    if tool is not None and any(re.search(p, tool) for p in sup.tool_patterns):
        return "tool_patterns"
    return None


def _string_lists(name: str, lists: list[list[str]]) -> pl.Series:
    """A ``List(String)`` column from Python lists of strings (none of them null).

    polars converts such a list one inner list at a time (~10 us per alert); this builds
    the flat strings and the offsets once. Not ``pyarrow.array``: it imports pandas
    (~37 MiB a live process does not otherwise load).
    """
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    flat = pl.Series(name, [s for x in lists for s in x], dtype=pl.String)
    # Arrow arrays from polars, never pyarrow.array(): even on numpy input it imports
    # pandas.
    arr = pa.LargeListArray.from_arrays(
        pl.Series(offsets).to_arrow(), flat.to_arrow().cast(pa.large_string()))
    out = pl.from_arrow(arr)
    assert isinstance(out, pl.Series)
    return out.cast(pl.List(pl.String())).alias(name)


def build_alerts(
    decided: list[tuple[Detector, pl.DataFrame]],
    config: DetectorsConfig,
    detected_at_us: int | None,
    *,
    lazy: bool = True,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Alert records from each detector's decided rows.

    Parameters
    ----------
    decided
        ``(detector, rows at or above its threshold)`` pairs.
    config
        For severity bands and suppression.
    detected_at_us
        Detection time (µs): ``now`` in live mode, the latest log time in batch replay.
    lazy
        Explain isolation-forest session rows only when their explanation is read (see
        below); False explains every decided row first (same records, more work).

    Returns
    -------
    (alerts, suppressed)
        Two frames with :data:`ALERT_COLUMNS`; ``suppressed`` has an extra
        ``suppressed_by`` column naming the allowlist that matched.
    """
    rows: list[dict[str, Any]] = []
    # Forest (anomaly) session rows are explained only if they can be read: one forest
    # pass per feature makes their explanation the costliest step, and most of them are
    # folded into an entity alert that lists their session, which only counts them. A
    # session row that shares its session with a rule row may be folded into it (its first
    # reason is quoted), so it is explained at once; the others after folding, if they
    # survive it. Explanations are per row, so the survivors get exactly the same text.
    rule_sessions: set[Any] = set()
    for det, frame in decided:
        if det.category != "anomaly" and frame.height and "window_start" in frame.columns:
            rule_sessions.update(
                frame.filter(pl.col("window_start").is_null())["session_id"].to_list())
    later: dict[int, tuple[Detector, pl.DataFrame]] = {}
    for k, (det, frame) in enumerate(decided):
        if frame.height == 0:
            continue
        recs = [dict(r) for r in frame.iter_rows(named=True)]
        if lazy and det.category == "anomaly":
            now = [i for i, r in enumerate(recs)
                   if r["window_start"] is not None or r["session_id"] in rule_sessions]
            later[k] = (det, frame)
        else:
            now = list(range(len(recs)))
        explained = det.explain_all(frame if len(now) == frame.height else frame[now])
        for i, (reasons, evidence) in zip(now, explained, strict=True):
            recs[i]["_reasons"], recs[i]["_evidence"] = reasons, evidence
        for i, r in enumerate(recs):
            r["category"] = det.category
            r["detector"] = det.name
            if "_evidence" not in r:  # explained after folding, if it survives
                r["_reasons"], r["_evidence"], r["_at"] = None, None, (k, i)
            rows.append(r)
    rows, _ = _fold(rows, config)
    rows = _dedupe_windows(rows)
    todo: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if "_at" in r:
            todo.setdefault(r["_at"][0], []).append(r)
    for k, waiting in todo.items():
        det, frame = later[k]
        explained = det.explain_all(frame[[r["_at"][1] for r in waiting]])
        for r, (reasons, evidence) in zip(waiting, explained, strict=True):
            r["_reasons"], r["_evidence"] = reasons, evidence
    out: list[dict[str, Any]] = []
    suppressed: list[dict[str, Any]] = []
    hop = config.hop_us
    for r in rows:
        ev: dict[str, Any] = dict(r["_evidence"])
        n_anom = (ev.get("also") or {}).get("anomaly_sessions")
        if n_anom:
            r["_reasons"] = [*r["_reasons"], f"{n_anom} of these sessions were also singled "
                             "out by the isolation forest."]
        if r["window_start"] is not None:
            ev["window_start"] = iso(r["window_start"])
            ev["window_end"] = iso(r["window_start"] + config.window_us)
            ev["window_hop_minutes"] = hop // 60_000_000
            ids = r.get("session_ids") or []
            ev["session_ids"] = list(ids)
            ev["n_sessions"] = r.get("n_sessions")
            ev["session_ids_truncated"] = (r.get("n_sessions") or 0) > len(ids)
        record = {
            "alert_id": alert_id(r["entity_type"], r["entity_id"], r["category"],
                                 r["window_start"]),
            "category": r["category"],
            "detector": r["detector"],
            "severity": config.severity(float(r["score"])),
            "score": round(float(r["score"]), 6),
            "entity_type": r["entity_type"],
            "entity_id": r["entity_id"],
            "session_id": r["session_id"],
            "caller_id": r["caller_id"],
            "client_ip": r["client_ip"],
            "server": r["server"],
            # µs since the epoch here; typed as datetimes column-wise in frame().
            "first_seen": r["first_t"],
            "last_seen": r["last_t"],
            "detected_at": detected_at_us if detected_at_us is not None else r["last_t"],
            "reasons": list(r["_reasons"]),
            "evidence": orjson.dumps(ev, option=orjson.OPT_SORT_KEYS).decode(),
            "_evidence": ev,
        }
        why = suppression_reason(record, config)
        if why is not None:
            record["suppressed_by"] = why
            suppressed.append(record)
        else:
            out.append(record)

    def frame(recs: list[dict[str, Any]], extra: dict[str, pl.DataType]) -> pl.DataFrame:
        schema = {**ALERT_COLUMNS, **extra}
        if not recs:
            return pl.DataFrame(schema=schema)
        # Column-wise construction: far cheaper than one dict per row. The reasons (a list
        # per alert) go through Arrow's converter: polars builds a list column from Python
        # one inner list at a time (~10 us per alert, a third of this function).
        times = {"first_seen", "last_seen", "detected_at"}
        cols: list[pl.Series] = []
        for k, v in schema.items():
            vals = [rec.get(k) for rec in recs]
            if k in times:
                cols.append(pl.Series(k, vals, pl.Int64))
            elif k == "reasons":
                cols.append(_string_lists(k, vals))
            else:
                cols.append(pl.Series(k, vals, v))
        df = pl.DataFrame(cols).with_columns(pl.col(*times).cast(pl.Datetime("us", "UTC")))
        return df.sort(["first_seen", "alert_id"])

    return frame(out, {}), frame(suppressed, {"suppressed_by": pl.String()})
