"""What the current settings would alert on: a noise preview before alerts go live.

``toolwatch train`` fits on the store's history; before an operator turns on live alerts
they want to know what the detectors, as configured, would raise on that same history:
how many alerts a day, of which categories, and which callers and tools are behind them.
A category that fires fifty times a day on one service account is a config fix
(``[detectors.<category>] allow_callers``, a declared workflow, a tool role) to make
*before* paging anyone.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import polars as pl

from toolwatch.detectors.config import CATEGORIES, SEVERITY_RANK

#: Evidence keys that name the tool an alert is about (rule detectors' own words).
_TOOL_KEYS = ("top_tool", "loop_tool", "tool", "outbound_tool", "skipped_step", "race_tool")


@dataclass
class NoisePreview:
    """Alerts the settings would raise on history, summarised.

    Attributes
    ----------
    per_day
        One row per category that fired: ``alerts``, ``per_day`` (over the days the
        history spans), ``busiest_day`` (most alerts on one UTC day), ``days_firing``.
    top_callers
        ``caller_id`` (else ``client_ip`` with an ``ip:`` prefix), ``alerts``,
        ``categories`` (comma-separated), most alerts first.
    top_tools
        ``server``, ``tool``, ``alerts``, ``categories``, most alerts first.
    n_alerts, n_days
        Totals; ``n_days`` counts the days the history spans.
    """

    per_day: pl.DataFrame
    top_callers: pl.DataFrame
    top_tools: pl.DataFrame
    n_alerts: int
    n_days: int


def _evidence_tool(evidence: str | None) -> str | None:
    if not evidence:
        return None
    try:
        doc = orjson.loads(evidence)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    for k in _TOOL_KEYS:
        v = doc.get(k)
        if isinstance(v, str) and v:
            return v
    return None


def preview(alerts: pl.DataFrame, events: pl.DataFrame, *, min_severity: str = "low",
            top: int = 10) -> NoisePreview:
    """Summarise ``alerts`` (schema.ALERTS columns) raised on ``events``.

    Parameters
    ----------
    alerts
        Alerts of a detection pass over the history (not stored).
    events
        The history's events (``ts``, ``session_id``, ``server``, ``tool``): the tool
        behind a session alert whose evidence names none is the session's most used tool.
    min_severity
        Only alerts at this severity or above are counted.
    top
        Rows in the top-callers and top-tools tables.
    """
    rank = SEVERITY_RANK[min_severity]
    a = alerts.filter(pl.col("severity").replace_strict(SEVERITY_RANK, default=0) >= rank)
    days = 0
    if events.height:
        lo, hi = events["ts"].min(), events["ts"].max()
        days = (hi.date() - lo.date()).days + 1  # type: ignore[union-attr]
    if a.height == 0:
        empty = pl.DataFrame()
        return NoisePreview(empty, empty, empty, 0, days)
    a = a.with_columns(pl.col("first_seen").dt.date().alias("day"))
    daily = a.group_by("category", "day").len()
    order = {c: i for i, c in enumerate(CATEGORIES)}
    per_day = daily.group_by("category").agg(
        pl.col("len").sum().alias("alerts"),
        (pl.col("len").sum() / max(days, 1)).round(1).alias("per_day"),
        pl.col("len").max().alias("busiest_day"),
        pl.len().alias("days_firing"),
    ).with_columns(pl.col("category").replace_strict(order, default=99).alias("_o")).sort(
        "_o").drop("_o")
    who = pl.coalesce(pl.col("caller_id"), pl.lit("ip:") + pl.col("client_ip"))
    top_callers = a.filter(who.is_not_null()).group_by(who.alias("actor")).agg(
        pl.len().alias("alerts"),
        pl.col("category").unique().sort().str.join(", ").alias("categories"),
    ).sort(["alerts", "actor"], descending=[True, False]).head(top)
    # The tool: from the evidence when a rule named it, else the session's commonest tool.
    named = pl.Series("tool", [_evidence_tool(e) for e in a["evidence"].to_list()],
                      pl.String)
    a = a.with_columns(named)
    commonest = events.filter(pl.col("session_id").is_not_null()).group_by(
        "session_id", "server", "tool").len().sort("len", descending=True).group_by(
        "session_id").first().select("session_id", pl.col("server").alias("_srv"),
                                     pl.col("tool").alias("_tool"))
    a = a.join(commonest, on="session_id", how="left").with_columns(
        pl.coalesce("tool", "_tool").alias("tool"), pl.coalesce("server", "_srv").alias("server"))
    top_tools = a.filter(pl.col("tool").is_not_null()).group_by("server", "tool").agg(
        pl.len().alias("alerts"),
        pl.col("category").unique().sort().str.join(", ").alias("categories"),
    ).sort(["alerts", "server", "tool"], descending=[True, False, False]).head(top)
    return NoisePreview(per_day, top_callers, top_tools, a.height, days)
