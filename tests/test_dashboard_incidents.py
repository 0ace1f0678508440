"""AppTest of the incident queue (the first page) and the incident page on the fixture
store: who first, click-through, alerts in stage order, verdicts shown at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from toolwatch.detectors.incidents import STAGES

from tests.fixtures.dashboard_store import build_store
from toolwatch.triage_store import incident_statuses

pytestmark = pytest.mark.slow  # runs the app (AppTest)

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    build_store(tmp_path)
    return tmp_path


def _app(store: Path) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["toolwatch_data_dir"] = str(store)
    return at


def _df(at: AppTest, prefix: str):
    """The dataframe whose key starts with ``prefix`` (selectable tables get a suffix
    that changes after each navigation)."""
    found = [d for d in at.dataframe if str(getattr(d, "key", "")).startswith(prefix)]
    assert found, [getattr(d, "key", None) for d in at.dataframe]
    return found[0]


def _incident_page(store: Path, incident_id: str) -> AppTest:
    at = _app(store).run()
    at.query_params["incident"] = incident_id
    at.switch_page("views/incident.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_queue_is_the_first_page_with_who_first(store: Path) -> None:
    at = _app(store).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Incidents"
    q = _df(at, "iq_table_").value
    assert list(q.columns[:8]) == ["caller", "address", "stages", "risk", "severity", "since",
                                   "status", "do first"]
    assert q.columns[-1] == "incident_id"
    assert (q["do first"].str.len() > 10).all() and (q["stages"] != "").all()
    assert list(q["risk"]) == sorted(q["risk"], reverse=True)
    row = q.index[q["caller"] == "agent-harvester"][0]
    assert q.loc[row, "stages"] == "discovery"
    # click a row -> the incident page for it
    at.session_state[_df(at, "iq_table_").key] = {"selection": {"rows": [int(row)], "columns": [],
                                                    "cells": []}}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Incident"
    assert "Caller agent-harvester" in [t.value for t in at.text]


def test_incident_page_timeline_actions_and_verdict(store: Path) -> None:
    at = _app(store).run()
    q = _df(at, "iq_table_").value
    iid = q.loc[q["caller"] == "svc-export", "incident_id"].iloc[0]
    at = _incident_page(store, iid)
    texts = [t.value for t in at.text]
    assert any(t.startswith("• ") for t in texts), "recommended actions listed"
    alerts = _df(at, "ic_alerts_").value
    ranks = [STAGES.index(s) for s in alerts["stage"]]
    assert ranks == sorted(ranks), "timeline in kill-chain stage order"
    assert {m.label: m.value for m in at.metric}["Status"] == "open"
    at.radio[0].set_value("acknowledged")
    at.text_input(key="ic_s_caller")  # the suppression form is there too
    next(b for b in at.button if b.label == "Save verdict").click().run()
    assert not at.exception, [e.value for e in at.exception]
    # shown at once, in the same run (no reload)
    assert {m.label: m.value for m in at.metric}["Status"] == "acknowledged"
    assert incident_statuses(store) == {iid: "acknowledged"}
    # the queue (open/escalated by default) no longer lists it; with every status it does
    at.query_params.clear()  # (the nav drops them; /incidents?incident=ID redirects)
    at.switch_page("views/incidents.py").run()
    assert iid not in set(_df(at, "iq_table_").value["incident_id"])
    at.multiselect(key="iq_status").set_value([]).run()
    q = _df(at, "iq_table_").value
    assert q.loc[q["incident_id"] == iid, "status"].iloc[0] == "acknowledged"


def test_notification_link_opens_the_incident(store: Path) -> None:
    """toolwatch.live.notify links to /incidents?incident=ID."""
    at = _app(store).run()
    iid = _df(at, "iq_table_").value["incident_id"].iloc[0]
    at = _app(store)
    at.query_params["incident"] = iid
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Incident"
    assert any(iid in t.value for t in at.text)


def test_hostile_caller_incident_renders_as_text(store: Path) -> None:
    from tests.fixtures.dashboard_store import XSS_CALLER
    from tests.test_dashboard_app import assert_no_markup_from_logs

    at = _app(store).run()
    assert_no_markup_from_logs(at)
    q = _df(at, "iq_table_").value
    iid = q.loc[q["caller"] == XSS_CALLER, "incident_id"].iloc[0]
    at = _incident_page(store, iid)
    assert f"Caller {XSS_CALLER}" in [t.value for t in at.text]
    assert at.text_input(key="ic_s_caller").value == XSS_CALLER
    assert_no_markup_from_logs(at)
