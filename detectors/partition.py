"""Partitioning by entity: detect more events than fit in one pass, caller by caller.

A detection pass needs ~2 KB of working memory per event it reads, so large detections
run in partitions, with one rule everywhere: a caller's sessions (a session without a
caller: the session alone) go to one partition, so every session and every caller's
window is whole in one pass.

* :func:`detect_in_parts` — the streaming engine (``toolwatch.detectors.stream``), when
  a flush touches more events than ``live.max_detect_events``: the events are in memory,
  split by a hash of their caller; a client address used by callers of different passes
  is scored per pass on its share of their events.
* :func:`detect_partitioned` — batch ``analyze`` past ``analyze.max_events_in_memory``:
  the events stay in the store (``toolwatch.analyze.run_partitioned`` reads each
  partition back), and a second pass partitioned by client address scores the address
  windows whole (:data:`ADDRESS_DETECTORS`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
from toolwatch.detectors import registry
from toolwatch.detectors.base import FeatureSet
from toolwatch.detectors.config import DetectorsConfig

#: A detector over (events, summaries) of one pass; None or an empty frame: no alerts.
DetectPass = Callable[[pl.DataFrame, pl.DataFrame], pl.DataFrame | None]


def caller_partition(ev: pl.DataFrame, n: int) -> pl.Series:
    """Pass number (0..n-1) of each event: a hash of its caller, else of its session."""
    key = pl.coalesce(pl.col("caller_id"), pl.col("session_id")).hash(seed=7) % n
    return ev.select(key.alias("p"))["p"]


def detect_in_parts(
    ev: pl.DataFrame, su: pl.DataFrame, n: int, detect: DetectPass
) -> pl.DataFrame | None:
    """Run ``detect`` over ``ev`` split into ``n`` caller partitions; merged alerts.

    Parameters
    ----------
    ev, su
        Events and session summaries. A summary goes with the pass holding its session's
        events; summaries of sessions without an event here go with pass 0.
    n
        Number of passes.
    detect
        Called once per non-empty pass with that pass's events and summaries.

    Returns
    -------
    polars.DataFrame or None
        The alerts of every pass, an alert id scored by two passes keeping its highest
        score (a client address or credential used by callers of different passes is
        scored per pass on its share of their events); None when no pass alerted.
    """
    part = caller_partition(ev, n)
    sessions = ev["session_id"].drop_nulls().unique()
    out: list[pl.DataFrame] = []
    for i in range(n):
        evi = ev.filter(part == i)
        if su.height:
            own = pl.col("session_id").is_in(evi["session_id"].drop_nulls().implode())
            if i == 0:  # summaries of sessions without a touched event go with pass 0
                own = own | ~pl.col("session_id").is_in(sessions.implode())
            sui = su.filter(own)
        else:
            sui = su
        if evi.height == 0 and sui.height == 0:
            continue
        alerts = detect(evi, sui)
        if alerts is not None and alerts.height:
            out.append(alerts)
    if not out:
        return None
    return (
        pl.concat(out, how="vertical_relaxed")
        .sort("score", descending=True, nulls_last=True)
        .unique(subset="alert_id", keep="first", maintain_order=True)
    )


#: Detectors that score client-address windows (the others score sessions and callers
#: only): the address pass of :func:`detect_partitioned` runs just these.
#: tests/test_analyze_partitioned.py checks that no other detector yields an address row.
ADDRESS_DETECTORS = (
    "enumeration_rules", "bulk_rules", "credential_rules", "concurrency_rules", "race_rules",
)

#: ``(key, i) -> (events, summaries)``: partition ``i`` by ``key`` (``"caller"`` or
#: ``"address"``) plus the sample of the population its detectors are fitted on, both
#: with a boolean ``_part`` column marking the partition's own rows.
ReadPartition = Callable[[str, int], tuple[pl.DataFrame, pl.DataFrame]]


def detect_partitioned(
    read: ReadPartition, n: int, config: DetectorsConfig, *, detected_at: int | None,
    model_path: Path | None = None, reuse: dict[str, Any] | None = None,
) -> list[pl.DataFrame]:
    """Detect in ``n`` caller partitions, then ``n`` address partitions; their alerts.

    The caller pass keeps every alert but those on client addresses; the address pass
    runs :data:`ADDRESS_DETECTORS` and keeps only address alerts (an address's windows
    cross callers). Each partition's detectors are fitted on the partition plus the
    sample ``read`` returns with it (per-caller baselines exact, population baselines
    from the sample) and score the partition alone.

    Parameters
    ----------
    read
        Reads one partition plus its sample (:data:`ReadPartition`).
    n
        Partitions per pass.
    detected_at
        Latest log time (µs) of the whole input, so alert records do not depend on how
        the input was cut.
    model_path, reuse
        The forest (saved, or fitted once on the first partition and reused).
    """
    from toolwatch.detectors.pipeline import fit_and_score

    reuse = {} if reuse is None else reuse
    found: list[pl.DataFrame] = []
    for key in ("caller", "address"):
        names = [d for d in registry.REGISTRY if d in ADDRESS_DETECTORS] \
            if key == "address" else None
        for i in range(n):
            ev, su = read(key, i)
            if ev.height == 0 and su.height == 0:
                continue
            mask_ev, mask_su = ev["_part"], su["_part"]
            ev, su = ev.drop("_part"), su.drop("_part")
            fit_on = FeatureSet.build(ev, su, config)
            batch = _subset(fit_on, mask_ev, su["session_id"].filter(mask_su))
            del ev, su
            alerts = fit_and_score(fit_on, batch, config, detected_at=detected_at,
                                   model_path=model_path, reuse=reuse, detectors=names)
            del fit_on, batch
            is_ip = pl.col("entity_type") == "client_ip"
            found.append(alerts.filter(is_ip if key == "address" else ~is_ip))
    return found


def _subset(fs: FeatureSet, mask_ev: pl.Series, summary_sids: pl.Series) -> FeatureSet:
    """The partition's part of a feature set (whole sessions), without preparing its
    events again: per-event figures depend on the event alone (value look-ups), session
    figures on the session's own rows. Row ids ``i`` are renumbered to stay positions."""
    ev = fs.events.filter(mask_ev).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("i"))
    sids = pl.concat([ev["session_id"], summary_sids.drop_nulls()]).unique()
    sessions = fs.sessions.filter(pl.col("session_id").is_in(sids.implode()))
    return FeatureSet(ev, sessions, fs.config)
