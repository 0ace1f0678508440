"""Forensics: read-only SQL over the store's views, with saved parameterized queries.

Queries run through :func:`toolwatch.dashboard.data.run_forensic_sql`: the whitelist guard (one
plain SELECT over the views; see docs/query.md), a locked connection with no file access
beyond the views' own files, bounded memory/threads (``[query]`` config), results capped,
runaway queries interrupted. Saved queries bind their inputs as parameters (never pasted
into SQL). Errors quote the SQL and logged values: they are shown with ``st.error``,
every line escaped by :func:`ui.md_text` first (``st.error`` renders Markdown: an unescaped
image link in a caller id would make the browser fetch it).
"""

from __future__ import annotations

import streamlit as st
from toolwatch.dashboard import data, ui

from toolwatch.config import QueryConfig, load_config
from toolwatch.errors import QueryError, QueryRefusedError, ToolwatchError
from toolwatch.query_child import warm

# Queries run in a child forked from a fork server that has DuckDB loaded: start it with
# the page, so the first Run pays a fork (~0.1 s), not the server's imports (~1 s).
warm()


def _limits() -> QueryConfig:
    """The ``[query]`` bounds (memory, threads, timeout) from the configuration."""
    try:
        return load_config().query
    except ToolwatchError:  # a bad config file is reported by the CLI; defaults here
        return QueryConfig()


def error_markdown(what: str, exc: Exception) -> str:
    """One error message: ``what`` once (the guard's own "query refused:" prefix is
    dropped), then every line of the error — DuckDB's hints ("Candidate bindings: …",
    "LINE 1: …") kept — each escaped (:func:`ui.md_text`) and joined by Markdown line
    breaks, since ``st.error`` renders Markdown and the text quotes logged values."""
    msg = str(exc)
    for prefix in ("query refused: ", "query failed: "):
        if msg.lower().startswith(prefix):
            msg = msg[len(prefix):]
    lines = [ln.rstrip() for ln in msg.splitlines() if ln.strip()] or [""]
    return "  \n".join(ui.md_text(ln) for ln in [f"{what}: {lines[0]}", *lines[1:]])


st.title("Forensics")
st.caption(
    "One plain DuckDB SELECT over the views events, sessions, incidents, alerts, alerts_raw, "
    "summaries and quarantine, run in a child process with a memory cap and killed at the "
    "timeout. EXPLAIN, COPY, PRAGMA/SET, ATTACH, table functions reading files and "
    "anything but a SELECT are refused. "
    f"Times shown in {ui.timezone()}; downloads keep UTC."
)

names = ["(write your own)", *[sq.name for sq in data.SAVED_QUERIES]]
choice = st.selectbox("Saved query", names, key="fx_saved")
saved = next((sq for sq in data.SAVED_QUERIES if sq.name == choice), None)

params: dict[str, str] = {}
if saved is not None:
    st.text(saved.description)
    st.code(saved.sql, language="sql")
    cols = st.columns(max(1, len(saved.params)))
    for col, p in zip(cols, saved.params, strict=False):
        params[p.name] = col.text_input(p.label, value=p.default, key=f"fx_p_{saved.name}_{p.name}")
    sql = saved.sql
else:
    sql = st.text_area(
        "SQL",
        key="fx_sql",
        height=180,
        value="SELECT tool, count(*) AS calls, count(DISTINCT session_id) AS sessions\n"
        "FROM events GROUP BY tool ORDER BY calls DESC LIMIT 20",
    )
max_rows = st.number_input(
    "Row limit", min_value=1, max_value=100_000, value=5_000, step=1000, key="fx_limit"
)

if st.button("Run", type="primary", key="fx_run"):
    try:
        bound = data.coerce_params(saved, params) if saved is not None else None
        lim = _limits()
        res = data.run_forensic_sql(
            ui.store(),
            sql,
            bound,
            max_rows=int(max_rows),
            timeout_s=lim.timeout_seconds,
            limits=lim,
        )
    except (QueryError, ValueError) as exc:
        st.session_state.pop("fx_result", None)
        what = "Query refused" if isinstance(exc, QueryRefusedError) else "Query failed"
        st.error(error_markdown(what, exc))
    else:
        st.session_state["fx_result"] = res

res = st.session_state.get("fx_result")
if res is not None:
    note = " (truncated at the row limit)" if res.truncated else ""
    st.text(f"{res.frame.height:,} row(s) in {res.seconds:.2f} s{note}")
    ui.table(res.frame, key="fx_table")
    c = st.columns(2)
    c[0].download_button(
        "Download CSV",
        data.csv_bytes(res.frame),
        file_name="query.csv",
        mime="text/csv",
        key="fx_csv",
    )
    c[1].download_button(
        "Download JSON",
        data.json_safe_rows(res.frame),
        file_name="query.json",
        mime="application/json",
        key="fx_json",
    )

with st.expander("Views and columns"):
    ui.table(ui.q("view_columns"), key="fx_columns", height=400)
