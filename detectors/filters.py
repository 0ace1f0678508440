"""Filtering alerts for ``toolwatch alerts`` (category, severity, entity, time)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import polars as pl
from toolwatch.detectors.config import CATEGORIES, SEVERITIES

from toolwatch.errors import ToolwatchError


def _as_list(v: str | Iterable[str] | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    return list(v)


def _utc(v: datetime | str | None) -> datetime | None:
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ToolwatchError(f"not an ISO-8601 time: {v!r}") from exc
    return v if v.tzinfo else v.replace(tzinfo=UTC)


def filter_alerts(
    alerts: pl.DataFrame,
    *,
    category: str | Iterable[str] | None = None,
    severity: str | None = None,
    entity: str | None = None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
) -> pl.DataFrame:
    """Alerts matching every given filter, most severe and most recent first.

    Parameters
    ----------
    alerts
        Alerts with ``toolwatch.schema.ALERTS`` columns.
    category
        One category or several (list, or comma-separated string).
    severity
        Minimum severity: ``high`` keeps high and critical.
    entity
        Matches an alert when equal to its entity id, session id, caller id or client
        address; ``type=value`` (``caller_id=alice``, ``client_ip=10.0.0.1``,
        ``session=s-1``) restricts to one field.
    since, until
        Keep alerts whose evidence window ``[first_seen, last_seen]`` overlaps this range
        (ISO-8601 strings or aware datetimes; naive ones are UTC).

    Raises
    ------
    ToolwatchError
        On an unknown category or severity, or an unparseable time.
    """
    out = alerts
    cats = _as_list(category)
    if cats:
        bad = sorted(set(cats) - set(CATEGORIES))
        if bad:
            raise ToolwatchError(f"unknown category {bad}; known: {', '.join(CATEGORIES)}")
        out = out.filter(pl.col("category").is_in(cats))
    if severity:
        if severity not in SEVERITIES:
            raise ToolwatchError(f"unknown severity {severity!r}; known: {', '.join(SEVERITIES)}")
        keep = list(SEVERITIES[SEVERITIES.index(severity):])
        out = out.filter(pl.col("severity").is_in(keep))
    if entity:
        field, sep, value = entity.partition("=")
        if sep and field in ("caller_id", "client_ip", "session", "session_id"):
            col = "session_id" if field in ("session", "session_id") else field
            out = out.filter(
                (pl.col(col) == value)
                | ((pl.col("entity_type") == field) & (pl.col("entity_id") == value))
            )
        else:
            v = entity
            out = out.filter(
                (pl.col("entity_id") == v) | (pl.col("session_id") == v)
                | (pl.col("caller_id") == v) | (pl.col("client_ip") == v)
            )
    lo, hi = _utc(since), _utc(until)
    if lo is not None:
        out = out.filter(pl.col("last_seen") >= lo)
    if hi is not None:
        out = out.filter(pl.col("first_seen") <= hi)
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    return (
        out.with_columns(pl.col("severity").replace_strict(order, default=9).alias("_o"))
        # Most recent by the evidence's log time: detected_at is the same for every alert
        # of one analyze run (the batch's latest log time).
        .sort(["_o", "last_seen", "score", "alert_id"], descending=[False, True, True, False])
        .drop("_o")
    )
