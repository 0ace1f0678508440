"""AppTest (headless Streamlit) tests of every dashboard page on a fixture store."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest
from toolwatch.dashboard.triage import TriageStore
from toolwatch.detectors.suppress import load_suppressions

from tests.fixtures.dashboard_store import XSS_ARG, XSS_CALLER, XSS_TOOL, build_store

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
TIMEOUT = 120  # generous: CI is a 2-core shared box


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash-app")
    build_store(root)
    return root


@pytest.fixture
def fresh_store(tmp_path):
    """A store of its own, for tests that write triage verdicts."""
    build_store(tmp_path)
    return tmp_path


def make_app(data_dir: Path, **query) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.session_state["toolwatch_data_dir"] = str(data_dir)
    at.context["timezone"] = "Europe/Berlin"
    at.query_params.update(query)
    return at


def open_page(data_dir: Path, page: str, **query) -> AppTest:
    at = make_app(data_dir).run()
    assert not at.exception, [e.value for e in at.exception]
    at.query_params.update(query)
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def find_df(at: AppTest, *columns: str, nth: int = 0):
    """The nth dataframe shown whose columns include ``columns`` (read-only tables have no
    key in AppTest)."""
    found = [d.value for d in at.dataframe if set(columns) <= set(d.value.columns)]
    assert len(found) > nth, (columns, [list(d.value.columns) for d in at.dataframe])
    return found[nth]


def texts(at: AppTest) -> str:
    return "\n".join(t.value for t in at.text)


_HOSTILE = re.compile(r"<img|<script|onerror", re.IGNORECASE)


def assert_no_markup_from_logs(at: AppTest) -> None:
    """No log string reached an element that interprets Markdown/HTML."""
    rendered = [
        *(m.value for m in at.markdown),
        *(m.value for m in at.caption),
        *(t.value for t in at.title),
        *(h.value for h in at.header),
        *(h.value for h in at.subheader),
        *(m.label for m in at.metric),
        *(m.value for m in at.metric),
        *(b.label for b in at.button),
        *(e.label for e in at.expander),
    ]
    offenders = [r for r in rendered if _HOSTILE.search(str(r))]
    assert not offenders, offenders
    assert not at.get("html"), "st.html must not be used"


@pytest.mark.slow  # runs the app (AppTest)
def test_overview(store_dir):
    at = open_page(store_dir, "overview")
    assert at.title[0].value == "Overview"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Alerts"] == "6"
    assert metrics["Open alerts"] == "6"
    assert metrics["Quarantined lines"] == "4"
    assert int(metrics["Events"].replace(",", "")) > 400
    # severity breakdown, alerts over time, events ingested
    assert len(at.get("plotly_chart")) == 3
    assert metrics["Critical: incidents / alerts"].endswith("/ 1")
    callers, _addresses, tools = (find_df(at, "value", "calls", nth=i) for i in range(3))
    assert callers["value"].iloc[0] == "agent-harvester"
    assert "crm.getContact" in tools["value"].to_list()
    assert "invalid_json" in find_df(at, "reason", "lines")["reason"].to_list()
    assert "Times shown in Europe/Berlin." in [c.value for c in at.caption]
    assert_no_markup_from_logs(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_overview_timezone_switch(store_dir):
    at = open_page(store_dir, "overview")
    at.selectbox(key="tz").set_value("UTC").run()
    assert "Times shown in UTC." in [c.value for c in at.caption]
    assert "Events 2026-11-02 08:20:00" in texts(at)
    at.selectbox(key="tz").set_value("Asia/Tokyo").run()
    assert "Events 2026-11-02 17:20:00" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_flagged_lists_filters_and_clicks_through(store_dir):
    at = open_page(store_dir, "flagged")
    assert at.title[0].value == "Flagged sessions"
    table = at.dataframe(key="flagged_table_0").value
    assert len(table) == 6
    assert table["severity"].iloc[0] == "critical"
    assert "session: sess-enum-1" in table["entity"].to_list()
    assert any(r.startswith("unusual tool <img") for r in table["first_reason"])

    at.multiselect(key="fl_sev").set_value(["high"]).run()
    assert sorted(at.dataframe(key="flagged_table_0").value["alert_id"]) == [
        "al-cred-0003",
        "al-enum-0001",
    ]
    at.multiselect(key="fl_sev").set_value([]).run()
    at.text_input(key="fl_search").set_value("onerror").run()
    assert at.dataframe(key="flagged_table_0").value["alert_id"].to_list() == ["al-anom-0004"]
    at.text_input(key="fl_search").set_value("no such thing").run()
    assert not at.dataframe and "No alerts match these filters." in [i.value for i in at.info]
    at.text_input(key="fl_search").set_value("").run()
    at.selectbox(key="fl_caller").set_value("crawler-9").run()
    assert at.dataframe(key="flagged_table_0").value["alert_id"].to_list() == ["al-loop-0005"]
    at.selectbox(key="fl_caller").set_value("(any)").run()
    at.selectbox(key="fl_range").set_value("Last 24 hours").run()
    # relative ranges end at the newest data in the store, not at the wall clock
    assert set(at.dataframe(key="flagged_table_0").value["alert_id"]) == {
        "al-bulk-0002",
        "al-cred-0003",
        "al-anom-0004",
        "al-loop-0005",
    }
    at.selectbox(key="fl_range").set_value("Last hour").run()
    assert "No alerts match these filters." in [i.value for i in at.info]
    at.selectbox(key="fl_range").set_value("All time").run()
    assert_no_markup_from_logs(at)

    # click the second row (the enumeration alert) -> session detail
    at.session_state["flagged_table_0"] = {"selection": {"rows": [1], "columns": [], "cells": []}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Session detail"
    assert at.query_params["alert"] == "al-enum-0001"
    assert "Session id: sess-enum-1" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_flagged_triage_status_filter(fresh_store):
    TriageStore(fresh_store).mark("al-bulk-0002", "escalated", "alice")
    at = open_page(fresh_store, "flagged")
    at.multiselect(key="fl_status").set_value(["escalated"]).run()
    df = at.dataframe(key="flagged_table_0").value
    assert df["alert_id"].to_list() == ["al-bulk-0002"]
    assert df["status"].to_list() == ["escalated"]


@pytest.mark.slow  # runs the app (AppTest)
def test_session_detail_by_alert_shows_reasons_contributions_and_raw(store_dir):
    at = open_page(store_dir, "session", alert="al-anom-0004")
    body = texts(at)
    assert f"• unusual tool {XSS_TOOL} called 5 times" in body
    assert f"Caller: {XSS_CALLER}" in body
    # The finding's own action, quoting the (hostile) caller as plain text.
    assert any(t.startswith("Recommended action: Review session ") and XSS_CALLER in t
               for t in body.split("\n")), body
    assert "Isolation-forest feature contributions" in body
    charts = at.get("plotly_chart")
    # contributions, timeline, bytes, call sequence (others may follow)
    assert {c.key for c in charts} >= {"sd_contrib", "sd_timeline", "sd_bytes", "sd_sequence"}
    assert at.get("json")  # evidence
    events = at.dataframe(key="sd_events_0").value
    assert XSS_TOOL in events["tool"].to_list()
    assert any(XSS_ARG in a for a in events["args"])
    tools = find_df(at, "tool", "calls", "errors")
    assert tools["tool"].iloc[0] == XSS_TOOL
    assert find_df(at, "resource_id", "statuses")["calls"].sum() == 9
    assert_no_markup_from_logs(at)

    # click a raw event -> its original log line, as code (text)
    at.session_state["sd_events_0"] = {"selection": {"rows": [0], "columns": [], "cells": []}}
    at.run()
    assert not at.exception
    assert any(XSS_ARG in c.value for c in at.code)


@pytest.mark.slow  # runs the app (AppTest)
def test_session_detail_by_session_id(store_dir):
    at = open_page(store_dir, "session", session="sess-enum-1")
    body = texts(at)
    assert "Caller: agent-harvester" in body
    assert {m.label: m.value for m in at.metric}["Calls"] == "150"
    assert find_df(at, "tool", "calls", "errors")["tool"].to_list() == ["crm.getContact"]
    # alerts on this session are listed, click-through opens the alert
    assert at.dataframe(key="sd_alerts_0").value["alert_id"].to_list() == ["al-enum-0001"]


@pytest.mark.slow  # runs the app (AppTest)
def test_session_detail_entity_alert_picks_among_sessions(store_dir):
    at = open_page(store_dir, "session", alert="al-cred-0003")
    assert "6 sessions of this client_ip in the window" in texts(at)
    at.selectbox(key="sd_alert_session").set_value("sess-cred-3").run()
    assert "Session id: sess-cred-3" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_session_detail_without_params_offers_a_picker(store_dir):
    at = open_page(store_dir, "session")
    assert at.selectbox(key="sd_pick_alert")
    at.text_input(key="sd_pick_session").set_value("sess-bulk-1").run()
    assert at.query_params["session"] == "sess-bulk-1"
    assert "Session id: sess-bulk-1" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_session_detail_unknown_ids(store_dir):
    at = open_page(store_dir, "session", alert="nope", session="nope")
    assert "No alert with this id in the store." in [w.value for w in at.warning]
    assert "No events or summary for this session in the store." in [w.value for w in at.warning]


@pytest.mark.slow  # runs the app (AppTest)
def test_triage_from_session_detail_persists(fresh_store):
    at = open_page(fresh_store, "session", alert="al-loop-0005")
    at.radio[0].set_value("escalated")
    at.text_input[0].set_value("carol")  # "Who"
    at.text_area[0].set_value("paged the wiki owners")
    submit = next(b for b in at.button if b.label == "Save verdict")
    submit.click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Saved." in [s.value for s in at.success]
    cur = TriageStore(fresh_store).current("al-loop-0005")
    assert (cur.status, cur.actor, cur.note) == ("escalated", "carol", "paged the wiki owners")
    assert find_df(at, "who", "status")["status"].to_list() == ["escalated"]
    # the status line says so in the same run, without a reload (issue 27)
    assert "Current status: escalated (by carol" in texts(at)

    # a fresh session (restart) sees it, and a false positive can create a suppression
    at2 = open_page(fresh_store, "session", alert="al-loop-0005")
    assert "Current status: escalated (by carol" in texts(at2)
    at2.radio[0].set_value("false_positive")
    at2.text_input[0].set_value("carol")
    at2.checkbox[0].check()
    next(b for b in at2.button if b.label == "Save verdict").click().run()
    assert not at2.exception, [e.value for e in at2.exception]
    assert "Saved; suppression rule created." in [s.value for s in at2.success]
    rules = load_suppressions(fresh_store)
    assert [(r.entity_type, r.entity_id, r.category) for r in rules] == [
        ("caller_id", "crawler-9", "scraping_loop")
    ]


@pytest.mark.slow  # runs the app (AppTest)
def test_entity_page(store_dir):
    at = open_page(store_dir, "entity", type="caller_id", id="agent-harvester")
    assert "Caller: agent-harvester" in texts(at)
    sessions = at.dataframe(key="en_sessions_0").value
    assert set(sessions["session_id"]) == {"sess-enum-0", "sess-enum-1"}
    assert at.dataframe(key="en_alerts_0").value["alert_id"].to_list() == ["al-enum-0001"]
    ips = find_df(at, "value", "calls", nth=2)
    assert set(ips["value"]) == {"203.0.113.7", "203.0.113.8"}
    assert len(at.get("plotly_chart")) == 1
    # click a session -> session detail
    row = sessions["session_id"].to_list().index("sess-enum-0")
    at.session_state["en_sessions_0"] = {"selection": {"rows": [row], "columns": [], "cells": []}}
    at.run()
    assert at.title[0].value == "Session detail"
    assert "Session id: sess-enum-0" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_entity_page_client_address_and_hostile_caller(store_dir):
    at = open_page(store_dir, "entity", type="client_ip", id="198.51.100.23")
    assert {m.label: m.value for m in at.metric}["Sessions"] == "6"
    assert set(find_df(at, "value", "calls", nth=2)["value"]) == {f"user{k}" for k in range(6)}
    at = open_page(store_dir, "entity", type="caller_id", id=XSS_CALLER)
    assert f"Caller: {XSS_CALLER}" in texts(at)
    assert_no_markup_from_logs(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_entity_page_picker_without_params(store_dir):
    at = open_page(store_dir, "entity")
    assert at.selectbox(key="en_id_caller_id").value is None
    at.selectbox(key="en_id_caller_id").set_value("crawler-9").run()
    assert at.query_params["id"] == "crawler-9"
    assert "Caller: crawler-9" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_forensics_saved_query(store_dir):
    at = open_page(store_dir, "forensics")
    at.selectbox(key="fx_saved").set_value("Sessions that touched a resource").run()
    at.text_input(key="fx_p_Sessions that touched a resource_resource").set_value(
        "contact/1001"
    ).run()
    at.button(key="fx_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    df = find_df(at, "session_id", "first_touch")
    assert df["session_id"].to_list() == ["sess-enum-1"]
    assert "1 row(s)" in texts(at)
    assert len(at.get("download_button")) == 2


@pytest.mark.slow  # runs the app (AppTest)
def test_forensics_custom_sql_and_refusals(store_dir):
    at = open_page(store_dir, "forensics")
    at.text_area(key="fx_sql").set_value("SELECT count(*) AS n FROM alerts").run()
    at.button(key="fx_run").click().run()
    assert find_df(at, "n")["n"].iloc[0] == 6
    for bad in (
        "DELETE FROM events",
        "COPY events TO '/tmp/x.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "ATTACH '/tmp/x.db'",
    ):
        at.text_area(key="fx_sql").set_value(bad).run()
        at.button(key="fx_run").click().run()
        # One st.error, every punctuation escaped (st.error renders Markdown and errors
        # quote logged values), "query refused" said once.
        assert len(at.error) == 1, bad
        shown = re.sub(r"\\(.)", r"\1", at.error[0].value)
        assert shown.startswith("Query refused: "), shown
        assert shown.lower().count("query refused") == 1, shown
        assert not any("Query refused" in m.value for m in at.markdown), bad
        assert all("n" not in d.value.columns for d in at.dataframe)
    assert not Path("/tmp/x.csv").exists() or Path("/tmp/x.csv").stat().st_size == 0


@pytest.mark.slow  # runs the app (AppTest)
def test_password_gate(store_dir, monkeypatch):
    monkeypatch.setenv("TOOLWATCH_DASHBOARD_PASSWORD", "s3cret-pass")
    at = make_app(store_dir).run()
    assert at.title[0].value == "toolwatch"
    assert not at.metric  # nothing from the store before login
    at.text_input[0].set_value("wrong")
    next(b for b in at.button if b.label == "Sign in").click().run()
    assert at.error[0].value == "Wrong password."
    assert not at.metric
    at.text_input[0].set_value("s3cret-pass")
    next(b for b in at.button if b.label == "Sign in").click().run()
    assert at.title[0].value == "Incidents"
    assert "6 incident(s) from 6 alert(s)" in texts(at)


@pytest.mark.slow  # runs the app (AppTest)
def test_empty_store_renders(tmp_path):
    at = make_app(tmp_path).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "No incidents: no alerts in this store yet." in [i.value for i in at.info]
    for page in ("overview", "incident", "flagged", "session", "entity", "forensics"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])


def test_no_unsafe_rendering_in_source():
    """Static guard: nothing in the dashboard can render HTML or Markdown from data."""
    root = APP.parent
    for path in root.rglob("*.py"):
        src = path.read_text()
        assert not re.search(r"unsafe_allow_html\s*=", src), path
        assert "st.html(" not in src, path
        assert "st.write(" not in src, path
        assert "components.html" not in src, path
        # st.markdown is allowed only with literal strings (none today)
        assert "st.markdown(" not in src, path


@pytest.mark.slow  # runs the app (AppTest)
def test_flagged_shows_and_deletes_suppression_rules(fresh_store):
    from toolwatch.detectors.suppress import add_suppression

    rule = add_suppression(
        fresh_store,
        entity_type="caller_id",
        entity_id="crawler-9",
        category="scraping_loop",
        created_by="alice",
        note="known crawler",
    )
    at = open_page(fresh_store, "flagged")
    df = at.dataframe(key="flagged_table_0").value
    by_id = dict(zip(df["alert_id"], df["suppressed_by"], strict=True))
    assert by_id["al-loop-0005"] == rule.id
    assert pd.isna(by_id["al-enum-0001"])
    assert find_df(at, "entity_id", "created_by")["entity_id"].to_list() == ["crawler-9"]
    at.button(key="fl_rule_delete").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert load_suppressions(fresh_store) == []
