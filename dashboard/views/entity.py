"""Entity: one caller or client address across all its sessions and alerts.

Deep link: ``?type=caller_id&id=VALUE`` (or ``type=client_ip``).
"""

from __future__ import annotations

import plotly.express as px
import streamlit as st
from toolwatch.dashboard import data, ui

st.title("Entity")
ui.tz_caption()
tz = ui.timezone()

KINDS = {"caller_id": "Caller", "client_ip": "Client address"}
qp_type = ui.query_param("type")
qp_id = ui.query_param("id")
if qp_type in KINDS and "en_type" not in st.session_state:
    st.session_state["en_type"] = qp_type

c = st.columns([1, 3])
etype = c[0].radio("Kind", list(KINDS), format_func=KINDS.get, key="en_type")
known = ui.q("known_entities", etype)
if qp_id and qp_type == etype and qp_id not in known:
    known = [qp_id, *known]
index = known.index(qp_id) if qp_id in known and qp_type == etype else None
eid = c[1].selectbox(
    KINDS[etype],
    known,
    index=index,
    key=f"en_id_{etype}",
    placeholder="choose one (most alerts first)",
    format_func=ui.option_text,  # logged ids: bidi/zero-width/control chars as escapes
)
if not eid:
    st.stop()
if eid != qp_id or etype != qp_type:
    st.query_params.update({"type": etype, "id": eid})

st.text(ui.option_text(f"{KINDS[etype]}: {eid}"))  # a logged id: escapes shown
s = ui.q("entity_summary", etype, eid)
m = st.columns(6)
m[0].metric("Sessions", f"{s.get('sessions') or 0:,}")
m[1].metric("Calls", f"{s.get('calls') or 0:,}")
m[2].metric("Alerts", f"{s.get('alerts') or 0:,}")
m[3].metric("Resources", f"{s.get('resources') or 0:,}")
m[4].metric("Addresses" if etype == "caller_id" else "Callers", f"{s.get('others') or 0:,}")
m[5].metric("Bytes out", ui.fmt_bytes(s.get("bytes")))
st.text(f"Active {ui.fmt_time(s.get('first_seen'), tz)} → {ui.fmt_time(s.get('last_seen'), tz)}")

st.subheader("Alerts")
al = ui.q("entity_alerts", etype, eid)
if al.height == 0:
    st.text("No alerts name this entity.")
else:
    ev = ui.table(al, key="en_alerts", select=True)
    row = ui.selected_row(ev, al)
    if row is not None:
        ui.open_session(session_id=row.get("session_id"), alert_id=row["alert_id"])

st.subheader("Activity")
ebucket = data.pick_bucket(s.get("first_seen"), s.get("last_seen"))
act = ui.q("entity_activity", etype, eid, ebucket)
if act.height:
    fig = px.bar(
        data.to_timezone(act, tz).to_pandas(),
        x="bucket",
        y="calls",
        color="status",
        color_discrete_map=ui.STATUS_COLORS,
        labels={"bucket": f"time ({tz}, per {ebucket})"},
    )
    ui.plotly(ui.time_bars(fig, ebucket, act, "calls"), key="en_activity")

st.subheader("Sessions")
sess = ui.q("entity_sessions", etype, eid)
st.text(f"{sess.height} session(s). Click a row to open it.")
ev = ui.table(sess, key="en_sessions", select=True, height=min(40 + 35 * sess.height, 500))
row = ui.selected_row(ev, sess)
if row is not None:
    ui.open_session(session_id=row["session_id"])

left, mid, right = st.columns(3)
other = "client_ip" if etype == "caller_id" else "caller_id"
for col, by, title in (
    (left, "tool", "Tools"),
    (mid, "resource_id", "Resources touched"),
    (
        right,
        other,
        "Client addresses used" if other == "client_ip" else "Callers from this address",
    ),
):
    with col:
        st.text(title)
        ui.table(ui.q("entity_breakdown", etype, eid, by), key=f"en_by_{by}", height=350)
