"""Overview: alerts over time, busiest callers/addresses/tools, ingest health."""

from __future__ import annotations

import zoneinfo
from datetime import timedelta

import plotly.express as px
import polars as pl
import streamlit as st
from toolwatch.dashboard import data, ui

st.title("Overview")
ui.tz_caption()


def _severity_breakdown() -> None:
    """Incidents and alerts per severity, most severe first, in the severity colours."""
    inc = ui.incidents()
    al = ui.alerts()
    rows = [
        {"what": what, "severity": sev, "count": int((df["severity"] == sev).sum())}
        for what, df in (("incidents", inc), ("alerts", al))
        for sev in data.SEVERITIES
        if df.height
    ]
    st.subheader("By severity")
    if not rows:
        st.info("No alerts yet.")
        return
    counts = pl.DataFrame(rows)
    c = st.columns(len(data.SEVERITIES))
    for col, sev in zip(c, data.SEVERITIES, strict=True):
        n_inc = counts.filter((pl.col("what") == "incidents") & (pl.col("severity") == sev))
        n_al = counts.filter((pl.col("what") == "alerts") & (pl.col("severity") == sev))
        col.metric(
            f"{sev.capitalize()}: incidents / alerts",
            f"{int(n_inc['count'].sum()):,} / {int(n_al['count'].sum()):,}",
        )
    fig = px.bar(
        counts.to_pandas(), x="count", y="what", color="severity", orientation="h",
        color_discrete_map=ui.SEVERITY_COLORS,
        category_orders={"severity": list(data.SEVERITIES), "what": ["incidents", "alerts"]},
        labels={"what": "", "count": ""},
    )
    fig.update_layout(height=170, legend_title_text="", legend_orientation="h",
                      legend_y=-0.35)
    ui.plotly(fig, key="ov_severity")


@st.fragment(run_every=ui.refresh_every())
def overview() -> None:
    """Everything on this page; re-runs on its own while live refresh is on."""
    tz = ui.timezone()
    h = ui.q("health_counters")
    open_alerts = ui.alerts().filter(pl.col("status") == "open").height
    c = st.columns(6)
    c[0].metric("Events", f"{h.get('events') or 0:,}")
    c[1].metric("Sessions", f"{h.get('sessions') or 0:,}")
    c[2].metric("Alerts", f"{h.get('alerts') or 0:,}")
    c[3].metric("Open alerts", f"{open_alerts:,}")
    c[4].metric("Quarantined lines", f"{h.get('quarantined') or 0:,}")
    c[5].metric("Callers / addresses", f"{h.get('callers') or 0:,} / {h.get('client_ips') or 0:,}")
    st.text(
        f"Events {ui.fmt_time(h.get('first_event'), tz)} → {ui.fmt_time(h.get('last_event'), tz)}"
        f"   ·   last ingested {ui.fmt_time(h.get('last_ingested'), tz)}"
        f"   ·   last alert {ui.fmt_time(h.get('last_alert'), tz)}"
        f"   ·   {h.get('streams', 0)} stream(s) checkpointed"
        f"   ·   {h.get('summaries') or 0:,} session summaries"
    )

    _severity_breakdown()

    lo, hi = ui.q("time_bounds")
    bucket = data.pick_bucket(lo, hi)
    # both charts share the store's time span, so bars line up by eye
    span = None
    if lo is not None and hi is not None:
        pad = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1)}.get(
            bucket, timedelta(days=1)
        )
        zone = zoneinfo.ZoneInfo(tz)
        span = [
            (lo - pad).astimezone(zone).replace(tzinfo=None),
            (hi + pad).astimezone(zone).replace(tzinfo=None),
        ]
    left, right = st.columns(2)
    with left:
        st.subheader("Alerts over time")
        at = ui.q("alerts_over_time", bucket)
        if at.height == 0:
            st.info("No alerts yet.")
        else:
            by = (
                st.segmented_control(
                    "Colour by", ["category", "severity"], default="category", key="ov_alert_color"
                )
                or "category"
            )
            df = data.to_timezone(at, tz)
            df = df.group_by("bucket", by).agg(pl.col("alerts").sum()).sort("bucket")
            fig = px.bar(
                df.to_pandas(),
                x="bucket",
                y="alerts",
                color=by,
                color_discrete_map=ui.SEVERITY_COLORS if by == "severity" else ui.CATEGORY_COLORS,
                category_orders={"severity": list(data.SEVERITIES),
                                 "category": list(data.CATEGORIES)},
                labels={"bucket": f"first seen ({tz}, per {bucket})"},
            )
            fig.update_xaxes(range=span)
            ui.plotly(ui.time_bars(fig, bucket, df, "alerts"), key="ov_alerts_chart")
    with right:
        st.subheader("Events ingested")
        et = ui.q("events_over_time", bucket)
        if et.height == 0:
            st.info("No events yet: run toolwatch ingest or analyze.")
        else:
            df = data.to_timezone(et, tz).to_pandas()
            fig = px.bar(
                df,
                x="bucket",
                y="events",
                color="status",
                color_discrete_map=ui.STATUS_COLORS,
                labels={"bucket": f"time ({tz}, per {bucket})"},
            )
            fig.update_xaxes(range=span)
            ui.plotly(ui.time_bars(fig, bucket, et, "events"), key="ov_events_chart")

    st.subheader("Top callers, client addresses and tools")
    cols = st.columns(3)
    for col, (column, title) in zip(
        cols,
        (("caller_id", "Callers"), ("client_ip", "Client addresses"), ("tool", "Tools")),
        strict=True,
    ):
        with col:
            st.text(title)
            top = ui.q("top_values", column, 10)
            ui.table(
                top,
                key=f"ov_top_{column}",
                column_config={
                    "value": st.column_config.TextColumn(column),
                    "bytes": st.column_config.NumberColumn("bytes", format="compact"),
                },
            )

    st.subheader("Health")
    live = ui.q("live_processes")
    if live.height:
        st.text("Live processes writing to this store (as `toolwatch status` shows them)")
        ui.table(live, key="ov_live")
        for w in live.filter(pl.col("warning") != "").iter_rows(named=True):
            st.text(f"⚠ {w['kind']} pid {w['pid']}: {w['warning']} ({w['partitions']})")
    qr = ui.q("quarantine_by_reason")
    if qr.height == 0:
        st.text("No quarantined lines.")
    else:
        st.text("Quarantined lines by reason (see `toolwatch query` on the quarantine view)")
        ui.table(qr, key="ov_quarantine")


overview()
