"""Caller partitioning in memory: detect a frame of events in passes of bounded size.

A detection pass needs ~2 KB of working memory per event it reads. :func:`detect_in_parts`
splits the events by caller (by session when there is none), so every session and every
caller's window is whole in one pass, runs a detector callable per pass and merges the
alerts. The live engine calls it when a flush touches more events than
``live.max_detect_events``. Batch ``analyze`` partitions on disk instead
(``toolwatch.analyze.run_partitioned``: the events need not fit in memory there) with the
same rule: a caller's sessions go to one partition.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

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
