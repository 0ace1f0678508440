"""Flagged sessions: every alert with filters and search; click a row for its detail."""

from __future__ import annotations

import zoneinfo
from datetime import datetime, time, timedelta

import polars as pl
import streamlit as st
from toolwatch.dashboard import data, ui
from toolwatch.dashboard.triage import STATUSES

st.title("Flagged sessions")
ui.tz_caption()

RANGES = {
    "All time": None,
    "Last hour": timedelta(hours=1),
    "Last 24 hours": timedelta(days=1),
    "Last 7 days": timedelta(days=7),
    "Custom": "custom",
}

opts = ui.q("alert_filter_options")
_, newest = ui.q("time_bounds")

row1 = st.columns([2, 2, 2, 2])
rng = row1[0].selectbox(
    "Time range",
    list(RANGES),
    key="fl_range",
    help="Relative ranges end at the newest event or alert in the store.",
)
# every option list below holds logged values: shown through ui.option_text (escapes)
categories = row1[1].multiselect(
    "Category", opts["categories"], key="fl_cat", format_func=ui.option_text
)
severities = row1[2].multiselect(
    "Severity", opts["severities"], key="fl_sev", format_func=ui.option_text
)
statuses = row1[3].multiselect("Triage status", list(STATUSES), key="fl_status")
row2 = st.columns([2, 2, 4])
servers = row2[0].multiselect(
    "Server", opts["servers"], key="fl_server", format_func=ui.option_text
)
caller = row2[1].selectbox(
    "Caller", ["(any)", *opts["callers"]], key="fl_caller", format_func=ui.option_text
)
search = row2[2].text_input(
    "Search", key="fl_search", placeholder="id, caller, address, server, reason text …"
)

start = end = None
choice = RANGES[rng]
if choice == "custom":
    tz = zoneinfo.ZoneInfo(ui.timezone())
    today = (newest or datetime.now(tz)).astimezone(tz).date()
    picked = st.date_input("Dates", value=(today - timedelta(days=7), today), key="fl_dates")
    if isinstance(picked, tuple | list) and len(picked) == 2:
        start = datetime.combine(picked[0], time.min, tz)
        end = datetime.combine(picked[1], time.max, tz)
elif choice is not None and newest is not None:
    end = newest
    start = newest - choice

flt = data.AlertFilter(
    start=start,
    end=end,
    categories=tuple(categories),
    severities=tuple(severities),
    servers=tuple(servers),
    caller=None if caller == "(any)" else caller,
    search=search or None,
    statuses=tuple(statuses),
)


@st.fragment(run_every=ui.refresh_every())
def flagged(flt: data.AlertFilter) -> None:
    """The alert table; re-queries on its own while live refresh is on."""
    df = ui.alerts(flt)
    st.text(f"{df.height} alert(s). Click a row to open the session detail.")
    if df.height == 0:
        st.info("No alerts match these filters.")
        return
    shown = df.with_columns(
        pl.concat_str(
            [pl.col("entity_type"), pl.lit(": "), pl.col("entity_id").fill_null("")]
        ).alias("entity")
    ).select(
        # who first (caller, address), then what and how bad; ids last (issue 27)
        "caller_id",
        "client_ip",
        "severity",
        "category",
        "first_reason",
        "score",
        "first_seen",
        "status",
        "server",
        "suppressed_by",
        "last_seen",
        "entity",
        "detector",
        "alert_id",
        "session_id",
    )
    event = ui.table(
        shown,
        key="flagged_table",
        select=True,
        height=min(36 * (shown.height + 1) + 3, 640),
        column_config={
            "first_seen": st.column_config.DatetimeColumn(
                "window start", format="MM-DD HH:mm:ss", width=110
            ),
            "last_seen": st.column_config.DatetimeColumn(
                "window end", format="YYYY-MM-DD HH:mm:ss"
            ),
            "first_reason": st.column_config.TextColumn("first reason", width=420),
            "caller_id": st.column_config.TextColumn("caller", width=110),
            "client_ip": st.column_config.TextColumn("address", width=115),
            "severity": st.column_config.TextColumn("severity", width=65),
            "score": st.column_config.ProgressColumn(
                "score", min_value=0.0, max_value=1.0, format="%.2f", width=70
            ),
        },
    )
    row = ui.selected_row(event, shown)
    if row is not None:
        ui.open_session(session_id=row.get("session_id"), alert_id=row["alert_id"])
    st.download_button(
        "Download CSV", data.csv_bytes(df), file_name="alerts.csv", mime="text/csv", key="fl_csv"
    )


flagged(flt)


with st.expander("Suppression rules"):
    from toolwatch.detectors.suppress import load_suppressions, remove_suppression, rules_frame

    rules = load_suppressions(ui.data_dir())
    if not rules:
        st.text(
            "No suppression rules. Make one on an incident's page, by marking an alert a "
            "false positive on its detail page, or with `toolwatch suppress add`; analyze "
            "and a running tail then drop matching alerts until the rule expires."
        )
    else:
        st.text("analyze and a running tail drop future alerts matching the active rules.")
        ui.table(rules_frame(rules), key="fl_rules")
        rid = st.selectbox(
            "Rule", [r.id for r in rules], key="fl_rule_pick", format_func=ui.option_text
        )
        if st.button("Delete rule", key="fl_rule_delete"):
            remove_suppression(ui.data_dir(), rid)
            st.rerun()
