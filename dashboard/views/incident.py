"""Incident detail: one actor's story, what to do, the verdict and a suppression rule.

Deep link: ``?incident=inc-…``. The alerts are listed in kill-chain stage order
(discovery → credential access → collection → exfiltration → impact), then by time;
click one for its session detail.
"""

from __future__ import annotations

from typing import Any

import plotly.express as px
import polars as pl
import streamlit as st
from toolwatch.dashboard import data, ui
from toolwatch.dashboard.triage import STATUSES
from toolwatch.detectors.incidents import STAGES

from toolwatch.triage_store import incident_history, set_incident_verdict

st.title("Incident")
tz = ui.timezone()
incident_id = ui.query_param("incident")
inc_all = ui.incidents()

if not incident_id:
    if inc_all.height == 0:
        st.info("No incidents in this store.")
        st.stop()
    labels = {
        r["incident_id"]: f"{r['risk']:.0f} {r['severity']} · {r['actor_type']} "
        f"{r['actor_id']} · {r['n_alerts']} alert(s)"
        for r in inc_all.iter_rows(named=True)
    }
    pick = st.selectbox("Incident", [None, *labels], key="ic_pick",
                        format_func=lambda i: "…" if i is None else ui.option_text(labels[i]))
    if pick:
        st.query_params["incident"] = pick
        st.rerun()
    st.stop()

found = inc_all.filter(pl.col("incident_id") == incident_id)
if found.height == 0:
    st.warning("No incident with this id in the store (its alerts may have changed).")
    st.stop()


def _verdict_panel(inc: dict[str, Any], status_slot: Any) -> None:
    """Incident-level verdict; the status line above is filled after saving, so it shows
    the new status in the same run."""
    st.subheader("Verdict")
    with st.form("ic_verdict", clear_on_submit=True):
        status = st.radio("Verdict", list(STATUSES), horizontal=True,
                          index=STATUSES.index(inc["status"]) if inc["status"] in STATUSES
                          else 0)
        who = st.text_input("Who", value=ui.default_actor())
        note = st.text_area("Note", placeholder="why; ticket; what was checked", height=80)
        saved = st.form_submit_button("Save verdict")
    current = inc["status"]
    if saved:
        try:
            set_incident_verdict(ui.data_dir(), inc["incident_id"], status, note, who)
        except ValueError as exc:
            ui.error(exc)
        else:
            current = status
            st.success("Saved.")
    status_slot.metric("Status", current)
    hist = incident_history(ui.data_dir(), inc["incident_id"])
    if hist:
        st.text("History")
        ui.table(pl.DataFrame(hist).select("at", "status", "actor", "note"), key="ic_hist")


def _suppress_panel(inc: dict[str, Any]) -> None:
    """A suppression rule prefilled with the actor (caller, else address), never a
    session id: those never recur."""
    from toolwatch.detectors.suppress import add_suppression, parse_expiry

    st.subheader("Suppress future alerts")
    callers, ips = inc["caller_ids"] or [], inc["client_ips"] or []
    caller0 = inc["actor_id"] if inc["actor_type"] == "caller_id" else None
    ip0 = inc["actor_id"] if inc["actor_type"] == "client_ip" else None
    if caller0 and ui.q("caller_vouched", caller0) is False:
        # A caller rule silences only callers the log vouched for (caller_authenticated):
        # anyone can claim a self-declared name. Suggest the address instead.
        st.text(ui.option_text(
            f"Caller {caller0} is self-declared (caller_authenticated false in its logs): "
            "a caller rule would not apply, so the address is suggested."))
        caller0, ip0 = None, (ips[0] if len(ips) == 1 else None)
    with st.form("ic_suppress", clear_on_submit=False):
        c = st.columns(2)
        caller = c[0].text_input("Caller", value=caller0 or "", key="ic_s_caller",
                                 help="Exact caller id; empty: any caller.")
        address = c[1].text_input("Client address", value=ip0 or "", key="ic_s_ip",
                                  help="Exact address; empty: any address.")
        c = st.columns(2)
        server = c[0].selectbox("Server", ["(any)", *(inc["servers"] or [])], key="ic_s_srv",
                                format_func=ui.option_text)
        category = c[1].selectbox("Category", ["(any)", *(inc["categories"] or [])],
                                  key="ic_s_cat", format_func=ui.option_text)
        c = st.columns(2)
        tool = c[0].text_input("Tool", value="", key="ic_s_tool", help="Empty: any tool.")
        expires = c[1].text_input("Expires after", value="7d", key="ic_s_exp",
                                  help="A duration (90s, 30m, 12h, 7d, 2w), an ISO time, "
                                  "or never.")
        note = st.text_input("Note", key="ic_s_note", placeholder="why; ticket")
        made = st.form_submit_button("Create suppression rule")
    if made:
        try:
            rule = add_suppression(
                ui.data_dir(),
                caller_id=caller.strip() or None,
                client_ip=address.strip() or None,
                server=None if server == "(any)" else server,
                category=None if category == "(any)" else category,
                tool=tool.strip() or None,
                expires_at=parse_expiry(expires),
                note=note,
                created_by=ui.default_actor(),
                incident_id=inc["incident_id"],
            )
        except ValueError as exc:
            ui.error(exc)
        else:
            st.success("Rule created: analyze and a running tail drop matching alerts.")
            st.text(ui.option_text(
                f"{rule.id}: {rule.scope_text()} until {rule.expires_at or 'never'}"))
    if len(callers) > 1 or len(ips) > 1:
        st.text(ui.option_text(f"Callers seen: {', '.join(callers) or '–'}   ·   "
                               f"addresses: {', '.join(ips) or '–'}"))


inc = found.row(0, named=True)
kind = {"caller_id": "Caller", "client_ip": "Address"}.get(inc["actor_type"], "Session")
who = ui.option_text(f"{kind} {inc['actor_id']}")
st.text(who)
m = st.columns([1, 1, 1, 1, 3])
m[0].metric("Risk", f"{inc['risk']:.0f}", help="0-100, decays with time; peak shown below")
m[1].metric("Severity", str(inc["severity"]))
m[2].metric("Alerts", f"{inc['n_alerts']}")
status_slot = m[3].empty()
m[4].metric("Stages", " → ".join(data.STAGE_LABELS.get(s, s) for s in inc["stages"] or []))
st.text(ui.option_text(
    f"Callers: {', '.join(inc['caller_ids'] or []) or '–'}   ·   addresses: "
    f"{', '.join(inc['client_ips'] or []) or '–'}   ·   servers: "
    f"{', '.join(inc['servers'] or []) or '–'}"
))
st.text(
    f"{ui.fmt_time(inc['first_seen'], tz)} → {ui.fmt_time(inc['last_seen'], tz)} ({tz})"
    f"   ·   peak risk {inc['peak_risk']:.0f}   ·   ATT&CK "
    f"{', '.join(inc['techniques'] or []) or '–'}   ·   {inc['incident_id']}"
)
st.subheader("Recommended actions")
for a in inc["recommended_actions"] or []:
    st.text(ui.option_text(f"• {a}"))

st.subheader("Timeline (stage order)")
al = ui.q("incident_alerts", tuple(inc["alert_ids"] or []))
shown = al.select("stage", "category", "severity", "caller_id", "client_ip", "first_seen",
                  "last_seen", "first_reason", "server", "score", "alert_id", "session_id")
ev = ui.table(
    shown, key="ic_alerts", select=True, height=min(35 * (shown.height + 1) + 3, 420),
    column_config={"first_reason": st.column_config.TextColumn("first reason", width="large"),
                   "caller_id": st.column_config.TextColumn("caller"),
                   "client_ip": st.column_config.TextColumn("address")},
)
row = ui.selected_row(ev, shown)
if row is not None:
    ui.open_session(session_id=row.get("session_id"), alert_id=row["alert_id"])
if al.height:
    chart = ui.plot_safe(data.to_timezone(al, tz), ["category", "first_reason", "alert_id"])
    fig = px.timeline(
        chart.to_pandas(), x_start="first_seen", x_end="last_seen", y="stage", color="category",
        color_discrete_map=ui.CATEGORY_COLORS, hover_data=["alert_id", "first_reason"],
        category_orders={"stage": [s for s in STAGES if s in set(al["stage"])]},
        labels={"first_seen": f"time ({tz})"},
    )
    # A zero-length alert window would draw nothing: give every bar a visible minimum.
    fig.update_traces(marker_line_width=6, marker_line_color="rgba(0,0,0,0)")
    fig.update_layout(height=120 + 40 * al["stage"].n_unique())
    ui.plotly(fig, key="ic_timeline")

left, right = st.columns(2, gap="large")
with left:
    _verdict_panel(inc, status_slot)
with right:
    _suppress_panel(inc)
