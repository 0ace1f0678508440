"""Unit tests of the dashboard's data layer, triage store and launcher (no Streamlit)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from toolwatch.dashboard import data, triage
from toolwatch.dashboard.launch import is_loopback, streamlit_argv
from toolwatch.detectors import suppress

from tests.fixtures.dashboard_store import BASE, XSS_TOOL, build_store
from toolwatch.errors import QueryError
from toolwatch.store import Store


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash-data")
    info = build_store(root)
    return info, Store(root)


def test_health_counters(fx):
    info, store = fx
    h = data.health_counters(store)
    assert h["alerts"] == len(info.alerts)  # latest version per alert only
    assert h["events"] > 400
    assert h["quarantined"] == 4
    assert h["summaries"] == 1
    assert h["first_event"] <= h["last_event"]


def test_alerts_over_time_and_bucket_validation(fx):
    _, store = fx
    df = data.alerts_over_time(store, "day")
    assert df["alerts"].sum() == 6
    assert set(df.columns) == {"bucket", "category", "severity", "alerts"}
    with pytest.raises(ValueError):
        data.alerts_over_time(store, "fortnight")


def test_pick_bucket():
    t = BASE
    assert data.pick_bucket(t, t + timedelta(hours=1)) == "minute"
    assert data.pick_bucket(t, t + timedelta(days=2)) == "hour"
    assert data.pick_bucket(t, t + timedelta(days=40)) == "day"
    assert data.pick_bucket(None, None) == "hour"


def test_events_over_time_sums_to_total(fx):
    _, store = fx
    df = data.events_over_time(store, "hour")
    assert df["events"].sum() == data.health_counters(store)["events"]
    assert df.schema["bytes"] == pl.Int64


def test_top_values_allow_list_and_alert_counts(fx):
    info, store = fx
    top = data.top_values(store, "caller_id", 3)
    assert top.height == 3
    assert top["value"][0] == info.enum_caller
    assert top["alerts"][0] == 1
    with pytest.raises(ValueError):
        data.top_values(store, "caller_id; DROP TABLE events", 3)


def test_list_alerts_sorted_by_severity(fx):
    _, store = fx
    df = data.list_alerts(store)
    assert df["severity"].to_list() == ["critical", "high", "high", "medium", "medium", "low"]
    assert (df["status"] == "open").all()
    # the enumeration alert has two versions; the latest wins
    enum = df.filter(pl.col("alert_id") == "al-enum-0001").row(0, named=True)
    assert enum["severity"] == "high"
    assert enum["first_reason"].startswith("150 calls")


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (data.AlertFilter(categories=("anomaly",)), {"al-anom-0004", "al-anom-0006"}),
        (data.AlertFilter(severities=("critical",)), {"al-bulk-0002"}),
        (data.AlertFilter(servers=("wiki-server",)), {"al-loop-0005"}),
        (data.AlertFilter(caller="crawler-9"), {"al-loop-0005"}),
        (data.AlertFilter(search="ONERROR"), {"al-anom-0004"}),
        (data.AlertFilter(search="198.51.100"), {"al-cred-0003"}),
        (
            data.AlertFilter(start=BASE + timedelta(hours=39), end=BASE + timedelta(hours=41)),
            {"al-loop-0005"},
        ),
    ],
)
def test_list_alerts_filters(fx, flt, expected):
    _, store = fx
    assert set(data.list_alerts(store, flt)["alert_id"]) == expected


def test_filters_are_bound_not_interpolated(fx):
    _, store = fx
    # SQL metacharacters in filter values are just text that matches nothing.
    for evil in ("' OR 1=1 --", "x'); SELECT * FROM events; --", "%a%"):
        assert data.list_alerts(store, data.AlertFilter(search=evil)).height == 0
        assert data.list_alerts(store, data.AlertFilter(caller=evil)).height == 0
        assert data.session_summary(store, evil) is None
    # search is a literal substring, not a LIKE pattern: '%' matches only a literal '%'
    pct = data.list_alerts(store, data.AlertFilter(search="%"))
    assert pct["alert_id"].to_list() == ["al-enum-0001"]


def test_triage_status_filter(fx, tmp_path):
    _, store = fx
    ts = triage.TriageStore(tmp_path)
    ts.mark("al-bulk-0002", "escalated", "alice", "paged on-call")
    df = data.list_alerts(
        store, data.AlertFilter(statuses=("escalated",)), triage=ts.current_frame()
    )
    assert df["alert_id"].to_list() == ["al-bulk-0002"]
    assert df["triaged_by"].to_list() == ["alice"]
    opened = data.list_alerts(
        store, data.AlertFilter(statuses=("open",)), triage=ts.current_frame()
    )
    assert "al-bulk-0002" not in opened["alert_id"].to_list()
    assert opened.height == 5


def test_filter_options(fx):
    info, store = fx
    o = data.alert_filter_options(store)
    assert o["severities"] == ["critical", "high", "medium", "low"]
    assert "crawler-9" in o["callers"]  # entity-only caller
    assert info.xss_caller in o["callers"]


def test_session_views(fx):
    info, store = fx
    s = data.session_summary(store, info.enum_session)
    assert s["calls"] == 150 and s["caller_id"] == info.enum_caller
    ev = data.session_events(store, info.enum_session)
    assert ev.height == 150 and ev["ts"].is_sorted()
    tools = data.session_tools(ev)
    assert tools.row(0, named=True) == {
        "tool": info.enum_tool,
        "calls": 150,
        "errors": 100,
        "bytes": ev["bytes"].sum(),
    }
    res = data.session_resources(ev)
    assert res.height == 150
    cum = data.bytes_over_time(ev)
    assert cum["cumulative"][-1] == ev["bytes"].sum()
    raw = data.event_raw(store, ev["event_id"][0])
    assert json.loads(raw)["sessionId"] == info.enum_session


def test_session_helpers_on_empty_frames():
    empty = pl.DataFrame(
        schema={
            "ts": pl.Datetime("us", "UTC"),
            "tool": pl.Utf8,
            "status": pl.Utf8,
            "bytes": pl.Int64,
            "resource_id": pl.Utf8,
        }
    )
    assert data.session_tools(empty).height == 0
    assert data.session_resources(empty).height == 0
    assert data.bytes_over_time(empty).height == 0


def test_sessions_for_alert(fx):
    info, store = fx
    cred = data.get_alert(store, "al-cred-0003")
    sess = data.sessions_for_alert(store, cred)
    assert sorted(sess["session_id"]) == [f"sess-cred-{k}" for k in range(6)]
    enum = data.get_alert(store, "al-enum-0001")
    assert data.sessions_for_alert(store, enum)["session_id"].to_list() == [info.enum_session]
    assert data.get_alert(store, "nope") is None
    assert data.alerts_for_session(store, info.xss_session)["alert_id"].to_list() == [
        "al-anom-0004"
    ]


def test_feature_contributions_shapes():
    as_map = data.feature_contributions('{"contributions": {"a": 0.1, "b": -0.5, "c": "x"}}')
    assert as_map["feature"].to_list() == ["b", "a"]
    as_list = data.feature_contributions(
        {"feature_contributions": [{"feature": "f", "contribution": 0.3}, ["g", 0.4]]}
    )
    assert as_list["feature"].to_list() == ["g", "f"]
    forest = data.feature_contributions(
        {
            "driving_features": {
                "calls": {"value": 900, "typical": 12, "score_drop": 0.2},
                "error_ratio": {"value": 0.5, "typical": 0.0, "score_drop": 0.35},
            }
        }
    )
    assert forest.rows() == [("error_ratio", 0.35, 0.5, 0.0), ("calls", 0.2, 900.0, 12.0)]
    assert data.feature_contributions(None).height == 0
    assert data.feature_contributions("not json").height == 0
    assert data.parse_evidence("[1]") == {"value": [1]}


def test_entity_views(fx):
    info, store = fx
    s = data.entity_summary(store, "caller_id", info.enum_caller)
    assert s["sessions"] == 2 and s["others"] == 2 and s["alerts"] == 1
    sess = data.entity_sessions(store, "caller_id", info.enum_caller)
    assert set(sess["session_id"]) == {"sess-enum-0", info.enum_session}
    ips = data.entity_breakdown(store, "caller_id", info.enum_caller, "client_ip")
    assert set(ips["value"]) == {"203.0.113.7", "203.0.113.8"}
    al = data.entity_alerts(store, "client_ip", info.stuffing_ip)
    assert al["alert_id"].to_list() == ["al-cred-0003"]
    act = data.entity_activity(store, "client_ip", info.stuffing_ip, "minute")
    assert act["calls"].sum() == 48
    assert data.known_entities(store, "caller_id")[0] in {"crawler-9", info.enum_caller}
    with pytest.raises(ValueError):
        data.entity_summary(store, "tool", "x")


def test_saved_queries_run_with_bound_params(fx):
    info, store = fx
    for sq in data.SAVED_QUERIES:
        values = {
            "resource": "contact/1001",
            "caller": info.enum_caller,
            "alert_id": "al-enum-0001",
            "ip": info.stuffing_ip,
        }
        res = data.run_forensic_sql(store, sq.sql, data.coerce_params(sq, values) or None)
        assert isinstance(res.frame, pl.DataFrame), sq.name
    touched = data.run_forensic_sql(store, data.SAVED_QUERIES[0].sql, {"resource": "contact/1001"})
    assert touched.frame["session_id"].to_list() == [info.enum_session]
    hour = data.run_forensic_sql(
        store, data.SAVED_QUERIES[1].sql, {"caller": info.enum_caller, "alert_id": "al-enum-0001"}
    )
    # the earlier session from the other address is inside the hour before
    assert set(hour.frame["session_id"]) == {"sess-enum-0", info.enum_session}
    with pytest.raises(ValueError):
        data.coerce_params(data.SAVED_QUERIES[0], {"resource": "  "})


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM events",
        "CREATE TABLE x AS SELECT 1",
        "ATTACH '/tmp/x.db' AS x",
        "COPY (SELECT 1) TO '/tmp/out.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT 1; SELECT 2",
        "SET enable_external_access = true",
        "PRAGMA version",
        "INSTALL httpfs",
    ],
)
def test_forensic_sql_refuses_writes_and_files(fx, sql):
    _, store = fx
    with pytest.raises(QueryError):
        data.run_forensic_sql(store, sql)


def test_forensic_sql_row_cap(fx):
    _, store = fx
    res = data.run_forensic_sql(store, "SELECT * FROM events", max_rows=10)
    assert res.frame.height == 10 and res.truncated
    res = data.run_forensic_sql(store, "SELECT count(*) AS n FROM events")
    assert not res.truncated and res.frame["n"][0] > 400


def test_forensic_sql_timeout(fx):
    _, store = fx
    with pytest.raises(QueryError, match="interrupted"):
        data.run_forensic_sql(store, "SELECT count(*) FROM range(10000000000) a", timeout_s=0.3)


def test_view_columns(fx):
    _, store = fx
    cols = data.view_columns(store)
    assert {"events", "alerts", "sessions"} <= set(cols["view"])


def test_to_timezone():
    df = pl.DataFrame({"ts": [datetime(2026, 7, 1, 12, tzinfo=UTC)]})
    out = data.to_timezone(df, "Europe/Berlin")
    assert out["ts"][0] == datetime(2026, 7, 1, 14)
    naive = pl.DataFrame({"ts": [datetime(2026, 1, 1, 12)]})
    assert data.to_timezone(naive, "America/New_York")["ts"][0] == datetime(2026, 1, 1, 7)


def test_exports_keep_hostile_text_literal(fx):
    info, store = fx
    ev = data.session_events(store, info.xss_session)
    csv = data.csv_bytes(ev).decode()
    assert XSS_TOOL in csv
    rows = json.loads(data.json_safe_rows(ev))
    assert rows[0]["tool"] == XSS_TOOL
    nested = data.run_forensic_sql(store, data.SAVED_QUERIES[0].sql, {"resource": "contact/1001"})
    assert '"[""crm.getContact""]"' in data.csv_bytes(nested.frame).decode()


# ---------------------------------------------------------------- triage
def test_triage_history_and_current(tmp_path):
    ts = triage.TriageStore(tmp_path)
    assert ts.current("a1") is None
    ts.mark("a1", "acknowledged", "alice", "looking")
    ts.mark("a1", "escalated", "bob", "confirmed exfil")
    ts.mark("a2", "false_positive", "alice")
    hist = ts.history("a1")
    assert [v.status for v in hist] == ["acknowledged", "escalated"]
    assert hist[1].actor == "bob" and hist[1].note == "confirmed exfil"
    cur = ts.current_frame()
    assert dict(zip(cur["alert_id"], cur["status"], strict=True)) == {
        "a1": "escalated",
        "a2": "false_positive",
    }
    assert cur.schema["at"] == pl.Datetime("us", "UTC")
    assert ts.counts() == {"escalated": 1, "false_positive": 1}
    # persisted across instances (a restart), in WAL mode, under _triage/
    again = triage.TriageStore(tmp_path)
    assert again.current("a1").status == "escalated"
    assert (tmp_path / "_triage" / "triage.sqlite").exists()
    import sqlite3

    mode = sqlite3.connect(again.path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_triage_validation(tmp_path):
    ts = triage.TriageStore(tmp_path)
    with pytest.raises(ValueError):
        ts.mark("a1", "deleted", "alice")
    with pytest.raises(ValueError):
        ts.mark("a1", "acknowledged", "  ")
    with pytest.raises(ValueError):
        ts.mark("", "acknowledged", "alice")


def test_false_positive_creates_suppression(tmp_path):
    alert = {
        "alert_id": "al-1",
        "entity_type": "caller_id",
        "entity_id": "svc-export",
        "category": "bulk_extraction",
        "caller_id": "svc-export",
        "server": "docs",
    }
    v, rule = triage.false_positive(tmp_path, alert, "alice", "approved job", suppress=True)
    assert v.status == "false_positive" and v.suppression_id == rule.id
    doc = json.loads((tmp_path / "_triage" / "suppressions.json").read_text())
    assert doc["version"] == 1
    r = doc["rules"][0]
    assert r["entity_type"] == "caller_id" and r["entity_id"] == "svc-export"
    assert r["category"] == "bulk_extraction" and r["created_by"] == "alice"
    assert r["expires_at"] is None and r["alert_id"] == "al-1"
    # idempotent: the same rule is reused
    _, again = triage.false_positive(tmp_path, alert, "bob", suppress=True)
    assert again.id == rule.id and len(suppress.load_suppressions(tmp_path)) == 1
    rules = suppress.load_suppressions(tmp_path)
    same_caller_other_session = {
        "entity_type": "session",
        "entity_id": "s9",
        "caller_id": "svc-export",
        "category": "bulk_extraction",
    }
    assert suppress.is_suppressed(same_caller_other_session, rules) is not None
    assert (
        suppress.is_suppressed({**same_caller_other_session, "category": "enumeration"}, rules)
        is None
    )
    assert (
        suppress.is_suppressed(
            {"entity_type": "caller_id", "entity_id": "other", "category": "bulk_extraction"}, rules
        )
        is None
    )
    assert suppress.remove_suppression(tmp_path, rule.id)
    assert not suppress.remove_suppression(tmp_path, rule.id)
    assert suppress.load_suppressions(tmp_path) == []


def test_suppression_scope_and_expiry(tmp_path):
    rule = suppress.add_suppression(
        tmp_path,
        entity_type="client_ip",
        entity_id="1.2.3.4",
        created_by="a",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    alert = {"entity_type": "client_ip", "entity_id": "1.2.3.4", "category": "anomaly"}
    assert suppress.matches(rule, alert, now=datetime(2029, 1, 1, tzinfo=UTC))
    assert not suppress.matches(rule, alert, now=datetime(2031, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError):
        suppress.add_suppression(tmp_path, entity_type="tool", entity_id="x", created_by="a")
    assert suppress.rules_frame(suppress.load_suppressions(tmp_path)).height == 1


def test_triage_does_not_touch_the_datasets(tmp_path):
    build_store(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.parquet"))
    triage.TriageStore(tmp_path).mark("al-enum-0001", "acknowledged", "alice")
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.parquet"))
    assert before == after


# ---------------------------------------------------------------- launcher
def test_is_loopback():
    for h in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(h)
    for h in ("0.0.0.0", "10.0.0.1", "example.org", "::"):
        assert not is_loopback(h)


def test_streamlit_argv(tmp_path):
    argv = streamlit_argv("127.0.0.1", 9999, tmp_path)
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "9999"
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    assert argv[-2:] == ["--data-dir", str(tmp_path)]


@pytest.mark.slow  # starts a process
def test_dashboard_refuses_public_bind_without_password(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from toolwatch.cli import app

    monkeypatch.delenv("TOOLWATCH_DASHBOARD_PASSWORD", raising=False)
    monkeypatch.delenv("TOOLWATCH_DASHBOARD_AUTH", raising=False)
    res = CliRunner().invoke(app, ["dashboard", "--host", "0.0.0.0", "-d", str(tmp_path)])
    assert res.exit_code == 2
    assert "refusing to bind" in res.output
