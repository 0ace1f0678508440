"""Session detail: the alert (reasons, contributions, triage) and what the session did.

Deep links: ``?alert=ID`` (an alert; its session is shown), ``?session=ID`` (a session),
or both.
"""

from __future__ import annotations

from typing import Any

import orjson
import plotly.express as px
import polars as pl
import streamlit as st
from toolwatch.dashboard import data, ui
from toolwatch.dashboard.data import SEQUENCE_CATEGORIES
from toolwatch.dashboard.triage import STATUSES, TriageStore, false_positive
from toolwatch.detectors.suppress import parse_expiry, rule_scope_for

st.title("Session detail")
ui.tz_caption()
tz = ui.timezone()

alert_id = ui.query_param("alert")
session_id = ui.query_param("session")


def _pick() -> None:
    """Nothing chosen yet: offer the flagged alerts and a session id box."""
    alerts = ui.alerts()
    if alerts.height:
        labels = {
            r["alert_id"]: f"{r['severity']} · {r['category']} · {r['entity_type']} "
            f"{r['entity_id']} · {ui.fmt_time(r['first_seen'], tz)}"
            for r in alerts.iter_rows(named=True)
        }
        choice = st.selectbox(
            "Alert",
            [None, *labels],
            # labels quote logged ids: bidi/zero-width/control characters as escapes
            format_func=lambda a: "…" if a is None else ui.option_text(labels[a]),
            key="sd_pick_alert",
        )
        if choice:
            st.query_params["alert"] = choice
            st.rerun()
    sid = st.text_input("…or a session id", key="sd_pick_session")
    if sid:
        st.query_params["session"] = sid.strip()
        st.rerun()


def _alert_panel(alert: dict[str, Any]) -> None:
    st.subheader("Alert")
    c = st.columns([1, 2, 1])
    c[0].metric("Severity", str(alert.get("severity")))
    c[1].metric("Category", str(alert.get("category")))
    c[2].metric("Score", f"{alert.get('score') or 0:.2f}")
    # ids and reasons quote logged strings: bidi/zero-width/control characters as escapes
    st.text(
        ui.option_text(f"Alert id: {alert['alert_id']}   ·   detector: {alert.get('detector')}")
    )
    st.text(ui.option_text(f"Entity: {alert.get('entity_type')} = {alert.get('entity_id')}"))
    st.text(
        f"Window: {ui.fmt_time(alert.get('first_seen'), tz)} → "
        f"{ui.fmt_time(alert.get('last_seen'), tz)}   (detected "
        f"{ui.fmt_time(alert.get('detected_at'), tz)})"
    )
    st.text("Reasons:")
    for r in alert.get("reasons") or []:
        st.text(ui.option_text(f"  • {r}"))
    action = data.alert_action(alert)
    if action:
        # quotes logged tool names and ids: plain text, not Markdown
        st.text(ui.option_text(f"Recommended action: {action}"))
    contrib = data.feature_contributions(alert.get("evidence"))
    if contrib.height:
        st.text(
            "Isolation-forest feature contributions (score drop when the feature is reset "
            "to its median; positive pushed the session towards anomalous)"
        )
        df = ui.plot_safe(contrib, ["feature"]).to_pandas()
        fig = px.bar(
            df,
            x="contribution",
            y="feature",
            orientation="h",
            color="contribution",
            color_continuous_scale="RdBu_r",
            color_continuous_midpoint=0.0,
            hover_data={"value": True, "typical": True},
        )
        fig.update_layout(
            yaxis={"autorange": "reversed"}, coloraxis_showscale=False, height=80 + 28 * len(df)
        )
        ui.plotly(fig, key="sd_contrib")
        if contrib["value"].is_not_null().any():
            ui.table(contrib, key="sd_contrib_table")
    with st.expander("Evidence (JSON)"):
        st.json(data.parse_evidence(alert.get("evidence")))
    b = st.columns(3)
    if alert.get("caller_id") and b[0].button(
        "Open caller", key="sd_open_caller", help="All sessions and alerts of this caller"
    ):
        ui.open_entity("caller_id", alert["caller_id"])
    if alert.get("client_ip") and b[1].button("Open client address", key="sd_open_ip"):
        ui.open_entity("client_ip", alert["client_ip"])


def _triage_panel(alert: dict[str, Any]) -> None:
    st.subheader("Triage")
    ts = TriageStore(ui.data_dir())
    cur = ts.current(alert["alert_id"])
    # Filled after the form is handled, so a verdict just saved shows in this same run.
    status_slot = st.empty()
    who_scope = rule_scope_for(alert)
    actor_text = (f"caller {who_scope['caller_id']}" if who_scope["caller_id"]
                  else f"address {who_scope['client_ip']}" if who_scope["client_ip"]
                  else "this session")
    with st.form("triage_form", clear_on_submit=True):
        status = st.radio(
            "Verdict",
            [s for s in STATUSES],
            horizontal=True,
            index=STATUSES.index(cur.status) if cur else 1,
        )
        who = st.text_input("Who", value=ui.default_actor())
        note = st.text_area("Note", placeholder="why; ticket; what was checked")
        suppress = st.checkbox(
            "False positive: also suppress future alerts of this actor",
            help="Writes a rule to _triage/suppressions.json that analyze and a running "
            "tail apply: the caller, else the client address (a session id never "
            "recurs). For other scopes use the incident page or `toolwatch suppress add`.",
        )
        scope = st.radio(
            "Suppression scope",
            ["entity_category", "entity"],
            horizontal=True,
            format_func=lambda s: {
                "entity_category": "this actor, this category",
                "entity": "this actor, every category",
            }[s],
        )
        expires = st.selectbox("Rule expires after", ["1h", "1d", "7d", "30d", "never"],
                               index=2)
        submitted = st.form_submit_button("Save verdict")
    st.text(ui.option_text(f"A rule would name {actor_text}."))
    if submitted:
        try:
            if status == "false_positive":
                _, rule = false_positive(
                    ui.data_dir(), alert, who, note, suppress=suppress, scope=scope,
                    expires_at=parse_expiry(expires),
                )
                if rule:
                    st.success("Saved; suppression rule created.")
                    st.text(
                        f"Rule {rule.id}: {rule.entity_type} = {rule.entity_id}, "
                        f"category {rule.category or 'any'}"
                    )
                else:
                    st.success("Saved.")
            else:
                ts.mark(alert["alert_id"], status, who, note)
                st.success("Saved.")
        except ValueError as exc:
            ui.error(exc)  # may quote an entity id: plain text, not Markdown
        cur = ts.current(alert["alert_id"])
    status_slot.text(
        f"Current status: {cur.status if cur else 'open'}"
        + (f" (by {cur.actor} at {ui.fmt_time(cur.at, tz)})" if cur else "")
    )
    hist = ts.history(alert["alert_id"])
    if hist:
        st.text("History")
        ui.table(
            pl.DataFrame(
                [
                    {
                        "at": v.at,
                        "status": v.status,
                        "who": v.actor,
                        "note": v.note,
                        "suppression": v.suppression_id,
                    }
                    for v in hist
                ]
            ),
            key="sd_history",
        )


def _session_panel(sid: str) -> None:
    summary = ui.q("session_summary", sid)
    st.subheader("Session")
    st.text(ui.option_text(f"Session id: {sid}"))
    if summary is None:
        st.warning("No events or summary for this session in the store.")
        return
    st.text(ui.option_text(
        f"Caller: {summary.get('caller_id') or '–'}   ·   client address: "
        f"{summary.get('client_ip') or '–'}   ·   server: {summary.get('server') or '–'}"
    ))
    st.text(
        f"{ui.fmt_time(summary.get('first_seen'), tz)} → "
        f"{ui.fmt_time(summary.get('last_seen'), tz)}"
        + (
            "   (session derived from caller/address and inactivity gap)"
            if summary.get("session_derived")
            else ""
        )
    )
    c = st.columns(6)
    c[0].metric("Calls", f"{summary.get('calls') or 0:,}")
    tools = summary.get("distinct_tools")
    c[1].metric("Tools", "–" if tools is None else f"{tools:,}")
    c[2].metric("Resources", f"{summary.get('distinct_resources') or 0:,}")
    c[3].metric("Bytes out", ui.fmt_bytes(summary.get("total_bytes")))
    c[4].metric("Errors", f"{summary.get('errors') or 0:,}")
    c[5].metric("Auth failures", f"{summary.get('auth_failures') or 0:,}")
    b = st.columns(3)
    if summary.get("caller_id") and b[0].button("Open this caller", key="sd_s_caller"):
        ui.open_entity("caller_id", summary["caller_id"])
    if summary.get("client_ip") and b[1].button("Open this address", key="sd_s_ip"):
        ui.open_entity("client_ip", summary["client_ip"])

    events = ui.q("session_events", sid)
    if events.height == 0:
        st.info("Known only from a session summary line: no individual calls stored.")
        return
    local = data.to_timezone(events, tz)
    st.text("Calls on a timeline, coloured by outcome")
    pdf = ui.plot_safe(local, ["tool", "resource_id", "status"]).to_pandas()
    fig = px.scatter(
        pdf,
        x="ts",
        y="tool",
        color="status",
        color_discrete_map=ui.STATUS_COLORS,
        hover_data={"resource_id": True, "bytes": True, "duration_ms": True},
        labels={"ts": f"time ({tz})"},
    )
    fig.update_traces(marker={"size": 9, "opacity": 0.8})
    fig.update_layout(height=max(260, 60 + 30 * events["tool"].n_unique()))
    ui.plotly(fig, key="sd_timeline")

    left, right = st.columns(2)
    with left:
        st.text("Tools used")
        ui.table(data.session_tools(events), key="sd_tools")
    with right:
        st.text("Bytes returned over time (cumulative)")
        bt = data.to_timezone(data.bytes_over_time(events), tz).to_pandas()
        fig = px.line(
            bt,
            x="ts",
            y="cumulative",
            markers=True,
            labels={"ts": f"time ({tz})", "cumulative": "bytes"},
        )
        ui.plotly(fig, key="sd_bytes")
    st.text("Resources touched")
    ui.table(data.session_resources(events), key="sd_resources", height=300)
    st.text("Raw events (click a row for the original log line)")
    ev = ui.table(events, key="sd_events", select=True, height=400)
    row = ui.selected_row(ev, events)
    if row is not None:
        raw = ui.q("event_raw", row["event_id"])
        try:
            pretty = orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2).decode()
        except (orjson.JSONDecodeError, TypeError):
            pretty = str(raw)
        st.code(pretty, language="json")
    st.download_button(
        "Download events (CSV)",
        data.csv_bytes(events),
        file_name="session-events.csv",
        mime="text/csv",
        key="sd_csv",
    )


def _call_sequence_panel(sid: str, alert: dict[str, Any] | None) -> None:
    """The session's calls in order, the alert's chain (evidence.chain) highlighted."""
    from toolwatch.dashboard.chain import call_sequence

    events = ui.q("session_events", sid)
    if events.height == 0:
        return
    seq = call_sequence(events, alert.get("evidence") if alert else None)
    n_chain = int(seq["chain_step"].is_not_null().sum())
    st.subheader("Call sequence")
    if n_chain:
        st.text(
            f"{n_chain} of the session's {seq.height:,} calls make the chain of this "
            f"{alert.get('category') if alert else ''} alert (highlighted, numbered in "
            "chain order)."
        )
    elif alert is not None and alert.get("category") in SEQUENCE_CATEGORIES:
        st.text("The alert's chain lies in another session (see its evidence).")
    shown = ui.plot_safe(seq, ["server", "tool", "resource_id", "status"]).with_columns(
        pl.when(pl.col("chain_step").is_not_null()).then(pl.lit("chain"))
        .otherwise(pl.lit("other")).alias("part")
    )
    fig = px.scatter(
        shown.to_pandas(),
        x="step",
        y="tool",
        color="part",
        symbol="part",
        color_discrete_map={"chain": "#d62728", "other": "#c7c7c7"},
        hover_data={"chain_step": True, "resource_id": True, "status": True, "server": True},
        labels={"step": "call # in the session"},
    )
    fig.update_traces(marker={"size": 8})
    fig.update_traces(selector={"name": "chain"}, marker={"size": 14})
    fig.update_layout(height=max(240, 60 + 30 * seq["tool"].n_unique()))
    ui.plotly(fig, key="sd_sequence")
    ui.table(
        seq.with_columns(
            pl.when(pl.col("chain_step").is_not_null())
            .then(pl.format("◆ {}", pl.col("chain_step"))).otherwise(pl.lit(""))
            .alias("chain")
        ),
        key="sd_sequence_table",
        height=300,
        column_order=["step", "chain", "ts", "server", "tool", "resource_id", "status", "bytes"],
    )


def _swimlane_panel(sid: str, alert: dict[str, Any] | None) -> None:
    """Calls as bars on a time axis, overlapping calls stacked in lanes; the racing calls
    of a race_condition alert (or the calls in flight at a concurrency_abuse alert's
    peak) highlighted."""
    from toolwatch.dashboard.swimlane import MAX_CALLS, figure, swimlane

    events = ui.q("session_events", sid)
    if events.height == 0:
        return
    category = alert.get("category") if alert else None
    lanes, no_iv = swimlane(events, sid, alert.get("evidence") if alert else None, category)
    st.subheader("Calls in flight (swimlane)")
    if lanes.height == 0:
        st.text("No call of this session carries a duration or start/end times: "
                "nothing to draw as intervals.")
        return
    n_lanes = int(lanes["lane"].max() or 0) + 1
    marked = {p: int((lanes["part"] == p).sum()) for p in ("racing", "at peak")}
    note = f"Up to {n_lanes} call(s) in flight at once."
    if marked["racing"]:
        note += f" {marked['racing']} racing call(s) of the alert highlighted."
    elif marked["at peak"]:
        note += f" {marked['at peak']} call(s) in flight at the alert's peak highlighted."
    elif category == "race_condition":
        note += " The alert's racing calls lie in another session (see its evidence)."
    if no_iv:
        note += f" {no_iv:,} call(s) without a duration are not drawn."
    if lanes.height >= MAX_CALLS:
        note += f" Showing {MAX_CALLS:,} calls around the highlighted ones."
    st.text(note)
    shown = data.to_timezone(lanes, tz, ["start", "end"])
    ui.plotly(figure(shown, tz), key="sd_swimlane")


alert = ui.q("get_alert", alert_id) if alert_id else None
if alert_id and alert is None:
    st.warning("No alert with this id in the store.")
if alert is None and session_id is None:
    _pick()
    st.stop()

if alert is not None:
    left, right = st.columns([3, 2], gap="large")
    with left:
        _alert_panel(alert)
    with right:
        _triage_panel(alert)
    if session_id is None:
        sessions = ui.q("sessions_for_alert", alert)
        ids = sessions["session_id"].to_list() if sessions.height else []
        if len(ids) > 1:
            st.text(f"{len(ids)} sessions of this {alert.get('entity_type')} in the window")
            session_id = st.selectbox(
                "Session", ids, key="sd_alert_session", format_func=ui.option_text
            )
        elif ids:
            session_id = ids[0]
if session_id:
    # A session opened by id shows its alerts first, not under the swimlane (issue 27).
    others = ui.q("alerts_for_session", session_id)
    if alert is None and others.height:
        st.subheader("Alerts on this session")
        others = others.select("caller_id", "client_ip", *[
            c for c in others.columns if c not in ("caller_id", "client_ip")])
        ev = ui.table(others, key="sd_alerts", select=True)
        row = ui.selected_row(ev, others)
        if row is not None:
            ui.open_session(session_id=session_id, alert_id=row["alert_id"])
    _session_panel(session_id)
    _call_sequence_panel(session_id, alert)
    _swimlane_panel(session_id, alert)
