"""A session's calls as intervals on a time axis, stacked in lanes (no Streamlit here).

Concurrency alerts are about calls that were *in flight at the same time*; a point per
call hides that. :func:`swimlane` turns :func:`toolwatch.dashboard.data.session_events` rows (with
``start_ts`` / ``end_ts``) into one bar per call, overlapping calls in separate lanes,
and marks the calls an alert is about:

* ``racing`` — the overlapping mutating calls listed in a ``race_condition`` alert's
  ``evidence.overlapping_calls`` (matched on tool and start time to the millisecond, in this
  session);
* ``at peak`` — the calls in flight at a ``concurrency_abuse`` alert's ``evidence.peak_at``.

Lanes are assigned greedily in start order (each call takes the lowest lane free at its
start), which uses exactly as many lanes as the most calls ever in flight at once. That
is a Python loop, bounded by :data:`MAX_CALLS` rows of one session. :func:`figure` draws
the bars with Plotly; every log-derived string goes into the hover text HTML-escaped
(Plotly renders tags such as ``<b>``/``<a>`` in hover labels).
"""

from __future__ import annotations

import heapq
import html
from datetime import datetime
from typing import Any

import polars as pl
from toolwatch.dashboard.chain import evidence_dict

#: Calls drawn at most (one session); beyond it, the window around the marked calls.
MAX_CALLS = 2000

#: Colours of the call kinds.
PART_COLORS = {"racing": "#d62728", "at peak": "#ff7f0e", "other": "#9e9e9e"}

#: Columns of :func:`swimlane` output.
COLUMNS = ("lane", "start", "end", "span_ms", "tool", "resource_id", "status", "part",
           "event_id")


def _ms(col: pl.Expr) -> pl.Expr:
    return col.dt.convert_time_zone("UTC").dt.replace_time_zone(None).dt.truncate("1ms")


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    s = pl.Series([value]).str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
    return s[0]


def racing_calls(evidence: Any, session_id: str) -> pl.DataFrame:
    """``(tool, start ms)`` of the calls a race alert lists for ``session_id``.

    A listed call without a ``session_id`` (older evidence) counts for any session.
    """
    ev = evidence_dict(evidence)
    calls = ev.get("overlapping_calls")
    if calls is None and isinstance(ev.get("calls"), list):
        calls = ev["calls"]  # alerts written before the key was renamed
    rows = []
    if isinstance(calls, list):
        for c in calls:
            if not isinstance(c, dict) or not isinstance(c.get("tool"), str):
                continue
            if c.get("session_id") not in (None, session_id):
                continue
            rows.append({"_tool": c["tool"], "_start": c.get("start") if isinstance(
                c.get("start"), str) else None})
    df = pl.DataFrame(rows, schema={"_tool": pl.String, "_start": pl.String})
    return df.with_columns(
        pl.col("_start").str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
        .dt.replace_time_zone(None).alias("_k")
    ).filter(pl.col("_k").is_not_null()).select("_tool", "_k").unique()


def _lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Greedy lane of each interval (inputs sorted by start; half-open ``[s, e)``)."""
    free: list[int] = []  # lanes free again, lowest first
    busy: list[tuple[int, int]] = []  # (end, lane) of calls still in flight
    lanes = []
    n_lanes = 0
    for s, e in zip(starts, ends, strict=True):
        while busy and busy[0][0] <= s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = n_lanes
            n_lanes += 1
        heapq.heappush(busy, (e, lane))
        lanes.append(lane)
    return lanes


def swimlane(
    events: pl.DataFrame, session_id: str, evidence: Any = None, category: str | None = None,
    max_calls: int = MAX_CALLS,
) -> tuple[pl.DataFrame, int]:
    """One row per call with a known interval: its lane and whether the alert marks it.

    Parameters
    ----------
    events
        :func:`toolwatch.dashboard.data.session_events` output (``start_ts``, ``end_ts`` UTC).
    session_id
        The session shown (race evidence may list calls of several sessions).
    evidence, category
        The alert's evidence (JSON text or dict) and category, or None.
    max_calls
        Most calls returned: beyond it, the ones around the first marked call (or the
        first ones).

    Returns
    -------
    tuple[polars.DataFrame, int]
        :data:`COLUMNS` sorted by start (``start``/``end`` UTC, ``lane`` from 0), and the
        number of calls without an interval (not drawn).
    """
    empty = pl.DataFrame(schema={
        "lane": pl.Int64, "start": pl.Datetime("us", "UTC"), "end": pl.Datetime("us", "UTC"),
        "span_ms": pl.Float64, "tool": pl.String, "resource_id": pl.String,
        "status": pl.String, "part": pl.String, "event_id": pl.String,
    })
    if events.height == 0 or "start_ts" not in events.columns:
        return empty, events.height
    ev = events.with_columns(
        pl.col("start_ts").alias("start"), pl.col("end_ts").alias("end")
    ).filter(
        pl.col("start").is_not_null() & pl.col("end").is_not_null()
        & (pl.col("end") >= pl.col("start"))
    )
    no_iv = events.height - ev.height
    if ev.height == 0:
        return empty, no_iv
    ev = ev.sort("start", "end")
    part = pl.lit("other")
    info = evidence_dict(evidence)
    if category == "race_condition":
        racing = racing_calls(info, session_id)
        ev = ev.with_columns(_ms(pl.col("start")).alias("_k")).join(
            racing.with_columns(pl.lit(True).alias("_race")),
            left_on=["tool", "_k"], right_on=["_tool", "_k"], how="left",
        )
        part = pl.when(pl.col("_race").fill_null(False)).then(pl.lit("racing")).otherwise(part)
    elif category == "concurrency_abuse":
        peak = _parse_time(info.get("peak_at"))
        if peak is not None:
            # peak_at is to the ms; a call in flight then overlaps that millisecond.
            at_peak = (_ms(pl.col("start")) <= peak.replace(tzinfo=None)) & (
                pl.col("end").dt.convert_time_zone("UTC").dt.replace_time_zone(None)
                > peak.replace(tzinfo=None)
            )
            part = pl.when(at_peak).then(pl.lit("at peak")).otherwise(part)
    ev = ev.with_columns(part.alias("part"))
    if ev.height > max_calls:
        marked = ev["part"].ne("other").arg_true()
        first = int(marked[0]) if marked.len() else 0
        lo = max(0, min(first - max_calls // 4, ev.height - max_calls))
        ev = ev.slice(lo, max_calls)
    us = ev.select(
        pl.col("start").dt.epoch("us").alias("s"),
        pl.max_horizontal(pl.col("end").dt.epoch("us"), pl.col("start").dt.epoch("us") + 1)
        .alias("e"),
    )
    lanes = _lanes(us["s"].to_list(), us["e"].to_list())
    ev = ev.with_columns(
        pl.Series("lane", lanes, pl.Int64),
        # Time in flight from the UTC ends (display times may cross a DST change).
        ((us["e"] - us["s"]) / 1000.0).alias("span_ms"),
    )
    for c in COLUMNS:
        if c not in ev.columns:
            ev = ev.with_columns(pl.lit(None, empty.schema[c]).alias(c))
    return ev.select(COLUMNS), no_iv


def _hover(v: Any) -> str:
    """Log text for a Plotly hover label: HTML-escaped (Plotly renders some tags)."""
    return html.escape("" if v is None else str(v), quote=False)


def figure(lanes: pl.DataFrame, tz_label: str) -> Any:
    """Plotly figure: one horizontal bar per call (start → end), one row per lane.

    Parameters
    ----------
    lanes
        :func:`swimlane` output with ``start``/``end`` already in display time.
    tz_label
        Zone name for the axis title.
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    for part in ("other", "at peak", "racing"):
        d = lanes.filter(pl.col("part") == part)
        if d.height == 0:
            continue
        start = d["start"].to_list()
        width_ms = d["span_ms"].to_list()
        custom = [
            [_hover(t), _hover(r), _hover(s), f"{w:,.1f}", _hover(a), _hover(b)]
            for t, r, s, w, a, b in zip(
                d["tool"].to_list(), d["resource_id"].to_list(), d["status"].to_list(),
                width_ms, [x.isoformat(timespec="milliseconds") for x in start],
                [x.isoformat(timespec="milliseconds") for x in d["end"].to_list()],
                strict=True,
            )
        ]
        fig.add_trace(go.Bar(
            name=part,
            orientation="h",
            base=start,
            # A call shorter than a pixel still shows (1 ms minimum bar).
            x=[max(w, 1.0) for w in width_ms],
            y=d["lane"].to_list(),
            marker={"color": PART_COLORS[part]},
            customdata=custom,
            hovertemplate=(
                "%{customdata[0]}<br>resource: %{customdata[1]}<br>status: %{customdata[2]}"
                "<br>%{customdata[4]} → %{customdata[5]} (%{customdata[3]} ms)"
                f"<extra>{part}</extra>"
            ),
        ))
    n_lanes = int(lanes["lane"].max() or 0) + 1 if lanes.height else 1
    fig.update_layout(
        barmode="overlay",
        height=max(220, 80 + 22 * n_lanes),
        xaxis={"type": "date", "title": f"time ({tz_label})"},
        yaxis={"title": "lane (calls in flight at once)", "autorange": "reversed",
               "dtick": 1 if n_lanes <= 12 else None},
        legend={"title": "call"},
    )
    return fig
