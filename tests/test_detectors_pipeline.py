"""run_batch contract: alert records, ids, windows, suppression (streams: test_detectors_stream)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import orjson
import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.evaluate import evaluate
from toolwatch.detectors.filters import filter_alerts

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors, schema
from toolwatch.errors import ConfigError, ToolwatchError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def traffic() -> Traffic:
    tr = Traffic(seed=11)
    tr.background(days=3, users=40, per_day=2)
    tr.enumeration("enum", T0 + timedelta(hours=3))
    tr.stuffing_session("stuff", T0 + timedelta(hours=4))
    tr.distributed_stuffing("ds", T0 + timedelta(days=1, hours=2), ip="192.0.2.77")
    tr.stuck_loop("loop", T0 + timedelta(days=1, hours=6))
    tr.scraping("sweep", T0 + timedelta(days=2, hours=1))
    tr.summary("sum-cs", T0 + timedelta(days=2, hours=3), calls=300, auth_failures=290,
               unique_resources=0)
    return tr


@pytest.fixture(scope="module")
def result(traffic: Traffic) -> detectors.DetectResult:
    return detectors.detect(traffic.events(), traffic.summaries(), DetectorsConfig())


def test_alerts_match_the_store_schema(result: detectors.DetectResult) -> None:
    alerts = result.alerts
    assert alerts.columns == schema.ALERTS.names
    tbl = alerts.to_arrow().cast(schema.ALERTS)
    assert tbl.num_rows == alerts.height
    # The stuck loop is tool_loop (repetition without progress), the sweep scraping_loop.
    assert set(alerts["category"]) == {
        "enumeration", "credential_stuffing", "scraping_loop", "bulk_extraction", "tool_loop"
    }
    assert alerts["alert_id"].is_unique().all()
    # One alert per (entity, category, window).
    assert alerts.select("entity_type", "entity_id", "category", "first_seen").is_unique().all()


def test_detected_at_is_log_time_not_wall_clock(traffic: Traffic,
                                                result: detectors.DetectResult) -> None:
    latest = max(traffic.events()["ts"].max(), traffic.summaries()["ts"].max())
    assert (result.alerts["detected_at"] == latest).all()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    again = detectors.run_batch(traffic.events(), traffic.summaries(), DetectorsConfig(), now=now)
    assert (again["detected_at"] == now).all()
    assert again["alert_id"].sort().to_list() == result.alerts["alert_id"].sort().to_list()


def test_alert_ids_are_deterministic(result: detectors.DetectResult) -> None:
    a = result.alerts.row(0, named=True)
    ev = orjson.loads(a["evidence"])
    start = ev.get("window_start")
    ws = None if start is None else int(
        datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp() * 1_000_000)
    assert a["alert_id"] == detectors.alert_id(a["entity_type"], a["entity_id"], a["category"], ws)


def test_superset_window_gives_identical_ids(traffic: Traffic,
                                             result: detectors.DetectResult) -> None:
    more = Traffic(seed=11)
    more.rows = list(traffic.rows)
    more.summary_rows = list(traffic.summary_rows)
    more.background(days=5, users=10, per_day=1)  # extra (and later) benign traffic
    wider = detectors.run_batch(more.events(), more.summaries(), DetectorsConfig())
    assert set(result.alerts["alert_id"]) <= set(wider["alert_id"])


def test_entity_alert_covers_its_window(result: detectors.DetectResult) -> None:
    ent = result.alerts.filter(pl.col("entity_type") == "client_ip").row(0, named=True)
    assert ent["entity_id"] == "192.0.2.77" and ent["category"] == "credential_stuffing"
    ev = orjson.loads(ent["evidence"])
    ws = datetime.fromisoformat(ev["window_start"].replace("Z", "+00:00"))
    we = datetime.fromisoformat(ev["window_end"].replace("Z", "+00:00"))
    assert ws <= ent["first_seen"] <= ent["last_seen"] < we
    assert ev["n_sessions"] == len(ev["session_ids"]) == 30


def test_summary_only_session_alert(result: detectors.DetectResult) -> None:
    hit = result.alerts.filter(pl.col("session_id") == "sum-cs")
    assert hit["category"].to_list() == ["credential_stuffing"]
    assert orjson.loads(hit["evidence"][0])["basis"] == "summary"


def test_suppression_allowlists_drop_and_count(traffic: Traffic,
                                               result: detectors.DetectResult) -> None:
    cfg = DetectorsConfig.from_dict(
        {"suppress": {"callers": ["mallory"], "tool_patterns": ["^search"],
                      "client_ips": ["192.0.2.77"]}}
    )
    res = detectors.detect(traffic.events(), traffic.summaries(), cfg)
    assert "mallory" not in res.alerts["caller_id"].to_list()
    assert "192.0.2.77" not in res.alerts["client_ip"].to_list()
    assert res.suppressed_count == result.alerts.height - res.alerts.height >= 3
    assert set(res.suppressed["suppressed_by"]) <= {"callers", "tool_patterns", "client_ips"}
    assert "tool_patterns" in set(res.suppressed["suppressed_by"])  # the stuck search loop


def test_alerts_jsonl_validates_against_the_schema(result: detectors.DetectResult,
                                                   tmp_path: Path) -> None:
    """Every line ``analyze --alerts-out`` writes (the real writer) fits the published
    schema, over alerts of every category the fixture traffic raises."""
    from toolwatch.analyze import write_alerts_jsonl

    doc = json.loads((ROOT / "docs" / "alert.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(doc)
    path = tmp_path / "alerts.jsonl"
    write_alerts_jsonl(result.alerts, path)
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    # An empty file validates trivially: the fixture must raise alerts of several kinds.
    assert len(lines) == result.alerts.height >= 5
    assert {x["category"] for x in lines} >= {"enumeration", "credential_stuffing",
                                              "scraping_loop"}
    for line in lines:
        validator.validate(line)


def test_evaluate_counts_recall_precision_and_fp_roles(traffic: Traffic,
                                                       result: detectors.DetectResult,
                                                       tmp_path: Path) -> None:
    labels = [
        {"kind": "session", "session_id": "enum", "caller_id": "mallory", "label": "enumeration",
         "role": "enumeration", "variant": "fast"},
        {"kind": "session", "session_id": "loop", "caller_id": "loopy", "label": "scraping_loop",
         "role": "scraping_loop", "variant": None},
        {"kind": "entity", "entity_type": "client_ip", "entity_id": "192.0.2.77",
         "label": "credential_stuffing", "variant": "distributed",
         "first_seen": (T0 + timedelta(days=1)).isoformat(),
         "last_seen": (T0 + timedelta(days=2)).isoformat()},
        {"kind": "session", "session_id": "bg-0-0-0", "caller_id": "user-0", "label": "benign",
         "role": "normal_user", "variant": None},
        {"kind": "session", "session_id": "sweep", "caller_id": "crawler", "label": "benign",
         "role": "power_user", "variant": None},
    ]
    path = tmp_path / "labels.ndjson"
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in labels) + b"\n")
    ev = evaluate(path, result.alerts)
    cats = {r["category"]: r for r in ev.categories.iter_rows(named=True)}
    assert cats["enumeration"]["recall"] == 1.0 and cats["enumeration"]["precision"] == 1.0
    assert cats["credential_stuffing"]["caught"] == 1
    roles = {r["role"]: r for r in ev.benign_roles.iter_rows(named=True)}
    assert roles["normal_user"]["flagged"] == 0
    assert roles["power_user"]["flagged"] == 1  # the sweep, deliberately mislabelled
    assert "bulk_extraction=1" in roles["power_user"]["by_category"]
    assert "precision" in ev.to_text()


def test_filter_alerts(result: detectors.DetectResult) -> None:
    a = result.alerts
    assert filter_alerts(a, category="enumeration")["category"].unique().to_list() == [
        "enumeration"]
    assert set(filter_alerts(a, severity="high")["severity"]) <= {"high", "critical"}
    assert filter_alerts(a, entity="client_ip=192.0.2.77").height >= 1
    assert filter_alerts(a, entity="mallory")["caller_id"].to_list() == ["mallory"]
    late = filter_alerts(a, since=T0 + timedelta(days=2))
    assert (late["last_seen"] >= T0 + timedelta(days=2)).all()
    assert filter_alerts(a, until="2000-01-01T00:00:00Z").height == 0
    with pytest.raises(ToolwatchError):
        filter_alerts(a, category="nope")
    with pytest.raises(ToolwatchError):
        filter_alerts(a, severity="urgent")


def test_config_is_typed_and_rejects_unknown_keys() -> None:
    cfg = DetectorsConfig.from_dict({"enumeration": {"run_lo": 20}, "entity_window_minutes": 60,
                                     "entity_hop_minutes": 30})
    assert cfg.enumeration.run_lo == 20 and cfg.window_us == 3_600_000_000
    with pytest.raises(ConfigError, match="run_low"):
        DetectorsConfig.from_dict({"enumeration": {"run_low": 20}})
    with pytest.raises(ConfigError, match="must divide"):
        DetectorsConfig.from_dict({"entity_window_minutes": 60, "entity_hop_minutes": 25})
    with pytest.raises(ConfigError, match="regular expression"):
        DetectorsConfig.from_dict({"suppress": {"caller_patterns": ["("]}})
    with pytest.raises(ConfigError):
        DetectorsConfig.from_dict({"credential_stuffing": {"creds_lo": "five"}})


def test_disabled_detector_does_not_run(traffic: Traffic) -> None:
    cfg = DetectorsConfig.from_dict({"enumeration": {"enabled": False}})
    out = detectors.run_batch(traffic.events(), traffic.summaries(), cfg)
    assert "enumeration" not in out["category"].to_list()


def test_tolerates_missing_optional_columns() -> None:
    tr = Traffic(seed=2)
    tr.stuffing_session("s", T0, tries=30)
    ev = tr.events().drop("rows", "duration_ms", "resource_key", "args")
    out = detectors.run_batch(ev, None, DetectorsConfig())
    assert out["category"].to_list() == ["credential_stuffing"]


def test_empty_input() -> None:
    out = detectors.run_batch(pl.DataFrame(), None, DetectorsConfig())
    assert out.height == 0 and out.columns == schema.ALERTS.names


def test_history_supplies_the_callers_own_normal() -> None:
    """A nightly export seen alone looks like extraction; with its history it is routine."""
    past = Traffic(seed=21)
    past.background(days=3, users=30, per_day=2)
    for d in range(3):
        past.nightly_export(f"night-{d}", d, pages=80)
    today = Traffic(seed=22)
    today.nightly_export("night-3", 3, pages=80)
    for u in range(30):
        today.normal_session(f"today-{u}", T0 + timedelta(days=3, hours=8, minutes=u),
                             caller=f"user-{u}", ip=f"10.9.0.{u}")
    alone = detectors.run_batch(today.events(), None, DetectorsConfig())
    assert "night-3" in alone["session_id"].to_list()
    with_history = detectors.run_batch(today.events(), None, DetectorsConfig(),
                                       history=past.events())
    assert "night-3" not in with_history["session_id"].to_list()
