"""Incident queue (the first page): each actor's alerts as one story, riskiest first.

Who (caller, address), how far it got (kill-chain stages), how bad (risk, severity),
since when, its triage status and the first thing to do. Click a row for the incident:
its alerts in stage order, all recommended actions, the verdict and suppression forms.
"""

from __future__ import annotations

import polars as pl
import streamlit as st
from toolwatch.dashboard import data, ui
from toolwatch.dashboard.triage import STATUSES

# Notification links (toolwatch.live.notify) point at /incidents?incident=ID: open it.
if ui.query_param("incident"):
    ui.open_incident(str(ui.query_param("incident")))

st.title("Incidents")


@st.fragment(run_every=ui.refresh_every())
def queue() -> None:
    """The queue; re-queries on its own while live refresh is on."""
    inc = ui.incidents()
    n_alerts = int(inc["n_alerts"].sum()) if inc.height else 0
    c = st.columns([3, 2, 2])
    statuses = c[1].multiselect(
        "Status", list(STATUSES), default=["open", "escalated"], key="iq_status",
        help="Triage status; clear it to list every incident.",
    )
    min_sev = c[2].selectbox("At least", ["low", "medium", "high", "critical"], key="iq_sev")
    sev_ok = list(data.SEVERITIES[: data.SEVERITIES.index(min_sev) + 1])
    shown = inc.filter(pl.col("severity").is_in(sev_ok))
    if statuses:
        shown = shown.filter(pl.col("status").is_in(statuses))
    by_sev = inc.group_by("severity").len()
    sev_counts = dict(zip(by_sev["severity"], by_sev["len"], strict=True))
    sev_line = ", ".join(f"{sev_counts[s]} {s}" for s in data.SEVERITIES if s in sev_counts)
    c[0].text(
        f"{inc.height} incident(s) from {n_alerts} alert(s)"
        + (f" ({sev_line})" if sev_line else "")
        + f"\n{shown.height} shown. Times in {ui.timezone()}. Click a row to open it."
    )
    if inc.height == 0:
        st.info("No incidents: no alerts in this store yet.")
        return
    if shown.height == 0:
        st.info("No incident matches these filters.")
        return
    q = data.incident_queue(shown)
    # Sized to fit 1440 px without horizontal scrolling; the other columns of ``q``
    # (alerts, last seen, servers, id) are on the incident page.
    event = ui.table(
        q,
        key="iq_table",
        select=True,
        height=min(35 * (q.height + 1) + 3, 666),
        column_order=["caller", "address", "stages", "risk", "severity", "since", "status",
                      "do first"],
        column_config={
            "caller": st.column_config.TextColumn("caller", width=100),
            "address": st.column_config.TextColumn("address", width=112),
            "stages": st.column_config.TextColumn("stages", width=130),
            "risk": st.column_config.ProgressColumn(
                "risk", min_value=0.0, max_value=100.0, format="%.0f", width=70
            ),
            "severity": st.column_config.TextColumn("severity", width=62),
            "since": st.column_config.DatetimeColumn("since", format="MM-DD HH:mm", width=82),
            "status": st.column_config.TextColumn("status", width=75),
            "do first": st.column_config.TextColumn("do first", width=600),
        },
    )
    row = ui.selected_row(event, q)
    if row is not None:
        ui.open_incident(row["incident_id"])


queue()
