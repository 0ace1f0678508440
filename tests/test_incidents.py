"""Incidents: alerts rolled up per actor (detectors/incidents.py), the store's ``incidents``
view, incident verdicts, and the ``toolwatch incidents`` / ``alerts --status`` commands."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import polars as pl
import pytest
from toolwatch.detectors.alerts import ALERT_COLUMNS
from toolwatch.detectors.incidents import (
    INCIDENT_COLUMNS,
    STAGES,
    IncidentConfig,
    alert_actions,
    build_incidents,
)

from tests.conftest import CLI

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _alert(
    alert_id: str,
    category: str,
    minutes: float,
    *,
    severity: str = "high",
    caller: str | None = "mallory",
    ip: str | None = "203.0.113.66",
    entity_type: str = "session",
    entity_id: str | None = None,
    length_min: float = 5,
    evidence: dict | None = None,
    detected_min: float | None = None,
) -> dict:
    first = T0 + timedelta(minutes=minutes)
    last = first + timedelta(minutes=length_min)
    return {
        "alert_id": alert_id, "category": category, "detector": f"{category}_rules",
        "severity": severity, "score": 0.9, "entity_type": entity_type,
        "entity_id": entity_id or f"s-{alert_id}",
        "session_id": f"s-{alert_id}" if entity_type == "session" else None,
        "caller_id": caller, "client_ip": ip, "server": "docs-server",
        "first_seen": first, "last_seen": last,
        "detected_at": T0 + timedelta(minutes=detected_min if detected_min is not None
                                      else minutes + length_min),
        "reasons": [f"{category} reason"],
        "evidence": orjson.dumps(evidence or {}).decode(),
    }


def _frame(*rows: dict) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=ALERT_COLUMNS)


def _story() -> list[dict]:
    """One caller: enumeration, then credential stuffing, then bulk extraction."""
    return [
        _alert("a1", "enumeration", 0, evidence={
            "top_tool": "getDocument", "resource_key": "documentId", "distinct_resources": 40,
            "run_first_id": "doc-1000", "run_last_id": "doc-1039"}),
        _alert("a2", "credential_stuffing", 30, evidence={"distinct_failed_credentials": 12}),
        _alert("a3", "bulk_extraction", 90, evidence={"top_tool": "exportDocs",
                                                      "total_bytes": 64_000_000}),
    ]


def test_one_actor_story_is_one_incident_in_kill_chain_order() -> None:
    # Given in the wrong order on purpose: stages follow the kill chain, not the input.
    inc = build_incidents(_frame(*reversed(_story())))
    assert inc.height == 1
    assert inc.schema == pl.Schema(INCIDENT_COLUMNS)
    r = inc.row(0, named=True)
    assert r["actor_type"] == "caller_id" and r["actor_id"] == "mallory"
    assert r["stages"] == ["discovery", "credential_access", "collection"]
    assert r["categories"] == ["enumeration", "credential_stuffing", "bulk_extraction"]
    for t in ("T1083", "T1110.004", "T1119"):
        assert t in r["techniques"]
    assert r["client_ips"] == ["203.0.113.66"] and r["caller_ids"] == ["mallory"]
    assert r["alert_ids"] == ["a1", "a2", "a3"] and r["n_alerts"] == 3
    assert r["first_seen"] == T0 and r["last_seen"] == T0 + timedelta(minutes=95)
    assert r["incident_id"].startswith("inc-") and r["status"] == "open"
    # Three high categories in three stages: worse than any one (75), below 100.
    assert 85 <= r["peak_risk"] < 100 and r["risk"] == r["peak_risk"]
    assert r["severity"] == "critical"
    acts = r["recommended_actions"]
    assert acts[0] == "Revoke caller mallory's token and sessions until reviewed"
    assert any("getDocument" in a and "doc-1000 … doc-1039" in a for a in acts)
    assert any("64.0 MB" in a and "exportDocs" in a for a in acts)
    assert r["summary"].startswith("caller mallory from 203.0.113.66: discovery → "
                                   "credential access → collection")


def test_incident_id_survives_alert_updates_and_new_alerts() -> None:
    first = build_incidents(_frame(*_story()))
    story = _story()
    # A later version of a1 (more evidence, higher severity, later last_seen), a new
    # alert in the same window, and an old version of a2 still in the input (alerts_raw).
    a1v2 = {**story[0], "severity": "critical", "last_seen": T0 + timedelta(minutes=20),
            "detected_at": T0 + timedelta(minutes=200)}
    stale = {**story[1], "severity": "low", "detected_at": T0}
    new = _alert("a4", "cross_server_flow", 120)
    second = build_incidents(_frame(a1v2, story[1], stale, story[2], new))
    assert second.height == 1
    assert second["incident_id"][0] == first["incident_id"][0]
    assert second["alert_ids"][0].to_list() == ["a1", "a2", "a3", "a4"]
    assert second["stages"][0].to_list()[-1] == "exfiltration"
    assert second["peak_risk"][0] > first["peak_risk"][0]


def test_gap_splits_incidents_and_actors_never_mix() -> None:
    cfg = IncidentConfig(gap_hours=6)
    rows = [*_story(), _alert("late", "scraping_loop", 60 * 24),
            _alert("other", "enumeration", 10, caller="alice", ip="198.51.100.7")]
    inc = build_incidents(_frame(*rows), config=cfg)
    assert inc.height == 3
    by_first = {r["alert_ids"][0]: r for r in inc.iter_rows(named=True)}
    assert by_first["late"]["actor_id"] == "mallory" and by_first["late"]["n_alerts"] == 1
    assert by_first["other"]["actor_id"] == "alice"
    assert len(set(inc["incident_id"])) == 3


def test_risk_decays_with_time_since_last_seen() -> None:
    alerts = _frame(*_story())
    last = T0 + timedelta(minutes=95)
    fresh = build_incidents(alerts, now=last)
    day = build_incidents(alerts, now=last + timedelta(hours=24))
    week = build_incidents(alerts, now=last + timedelta(days=7))
    assert fresh["risk"][0] == fresh["peak_risk"][0]
    assert day["risk"][0] == pytest.approx(fresh["risk"][0] / 2, abs=0.1)
    assert week["risk"][0] < 2 and week["severity"][0] == "low"
    assert week["peak_risk"][0] == fresh["peak_risk"][0]
    assert build_incidents(alerts, now=last + timedelta(days=7),
                           config=IncidentConfig(half_life_hours=0))["risk"][0] == \
        fresh["risk"][0]


def test_address_incident_lists_the_callers_it_serves() -> None:
    rows = [
        # An address-level stuffing alert (many callers, so no caller on it) ...
        _alert("ip1", "credential_stuffing", 0, caller=None, ip="5.188.89.38",
               entity_type="client_ip", entity_id="5.188.89.38"),
        # ... and two callers with their own alerts from that address.
        _alert("c1", "enumeration", 30, caller="bot-1", ip="5.188.89.38"),
        _alert("c2", "bulk_extraction", 60, caller="bot-2", ip="5.188.89.38"),
        # Same address, a week later: not linked.
        _alert("c3", "enumeration", 60 * 24 * 7, caller="bot-3", ip="5.188.89.38"),
    ]
    inc = build_incidents(_frame(*rows))
    assert inc.height == 4
    addr = inc.filter(pl.col("actor_type") == "client_ip").row(0, named=True)
    assert addr["actor_id"] == "5.188.89.38" and addr["caller_ids"] == ["bot-1", "bot-2"]
    callers = {r["actor_id"]: r for r in inc.iter_rows(named=True) if r["actor_type"] ==
               "caller_id"}
    assert sorted(addr["linked_incident_ids"]) == sorted(
        [callers["bot-1"]["incident_id"], callers["bot-2"]["incident_id"]])
    assert callers["bot-1"]["linked_incident_ids"] == [addr["incident_id"]]
    assert callers["bot-3"]["linked_incident_ids"] == []
    assert "serves 2 callers" in addr["recommended_actions"][0]
    assert addr["summary"].startswith("address 5.188.89.38 (2 callers): credential access")


def test_status_from_incident_and_alert_verdicts() -> None:
    alerts = _frame(*_story())
    iid = build_incidents(alerts)["incident_id"][0]
    fp = {"a1": "false_positive", "a2": "false_positive", "a3": "false_positive"}
    assert build_incidents(alerts, alert_status=fp)["status"][0] == "false_positive"
    assert build_incidents(alerts, alert_status={"a1": "false_positive"})["status"][0] == "open"
    assert build_incidents(alerts, alert_status={**fp, "a2": "acknowledged"})["status"][0] == \
        "acknowledged"
    assert build_incidents(alerts, alert_status={"a3": "escalated"})["status"][0] == "escalated"
    assert build_incidents(alerts, alert_status=fp,
                           incident_status={iid: "open"})["status"][0] == "open"


def test_every_category_has_a_stage_techniques_and_an_action() -> None:
    from toolwatch.detectors.config import CATEGORIES

    rows = [_alert(f"x{i}", c, i * 10, caller=f"c{i}") for i, c in enumerate(CATEGORIES)]
    inc = build_incidents(_frame(*rows))
    assert inc.height == len(CATEGORIES)
    for r in inc.iter_rows(named=True):
        assert r["stages"][0] in STAGES
        assert (r["techniques"] == []) == (r["categories"] == ["anomaly"])
        # Fields missing from the evidence still give a readable action.
        assert len(r["recommended_actions"]) >= 2 and all(r["recommended_actions"])
    assert build_incidents(_frame()).schema == pl.Schema(INCIDENT_COLUMNS)


def test_alert_actions_name_each_alerts_own_evidence() -> None:
    """Per-finding actions (what ``toolwatch alerts -f json`` and the session page show):
    one per alert, in the alerts' order, quoting that alert's tool, ids and volume."""
    story = _story()
    # An older version of a1 before the latest: the action follows the latest evidence.
    stale = _alert("a1", "enumeration", 0, evidence={"top_tool": "listDocs"}, detected_min=1)
    frame = _frame(story[2], stale, *story)
    out = alert_actions(frame)
    assert out["alert_id"].to_list() == ["a3", "a1", "a1", "a2", "a3"]
    assert out.columns == [*frame.columns, "action"]
    act = dict(zip(out["alert_id"], out["action"], strict=False))
    assert act["a1"] == ("Rate-limit getDocument on docs-server for caller mallory and check "
                         "object-level access to documentId (walked 40 ids, doc-1000 … doc-1039)")
    assert "12 distinct credentials failed from caller mallory" in act["a2"]
    assert act["a3"].startswith("Review the 64.0 MB caller mallory pulled with exportDocs")
    # The same texts are the incident's per-finding actions.
    assert set(act.values()) <= set(build_incidents(frame)["recommended_actions"][0])
    assert alert_actions(_frame())["action"].dtype == pl.String


# ------------------------------------------------------------- end to end, real CLI
def _small_log(path: Path) -> Path:
    """One caller walks document ids, then tries a dozen keys; five callers read normally."""
    rows: list[dict] = []

    def add(t: datetime, **kw: object) -> None:
        rows.append({"ts": t.isoformat().replace("+00:00", "Z"), **kw})

    who = {"caller_id": "mallory", "client_ip": "203.0.113.66", "server": "docs-server"}
    for i in range(40):
        add(T0 + timedelta(seconds=2 * i), session_id="s-enum", tool="getDocument",
            args={"documentId": f"doc-{1000 + i}"}, status="not_found" if i % 5 else "ok",
            bytes=200, **who)
    for i in range(12):
        add(T0 + timedelta(minutes=20, seconds=3 * i), session_id="s-cred", tool="login",
            args={"apiKey": f"sk-test-{i:04d}-abcdef"}, status="auth_failed", bytes=50, **who)
    for c in range(5):
        for i in range(6):
            add(T0 + timedelta(minutes=5 * c, seconds=30 * i), session_id=f"s-ok-{c}",
                caller_id=f"user-{c}", client_ip=f"198.51.100.{c}", server="docs-server",
                tool="getDocument", args={"documentId": f"doc-{c * 7 + i % 2}"}, status="ok",
                bytes=3000)
    rows.sort(key=lambda r: str(r["ts"]))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> CLI:
    import os

    tmp = tmp_path_factory.mktemp("incidents")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "cfg")
    cli = CLI(data_dir=tmp / "store", env=env)
    out = cli("analyze", str(_small_log(tmp / "small.jsonl")), "-d", str(cli.data_dir)).stdout
    assert f"toolwatch incidents -d {cli.data_dir}" in out
    return cli


@pytest.mark.slow  # starts a process
def test_cli_incidents_json_and_table(analyzed: CLI) -> None:
    d = str(analyzed.data_dir)
    alerts = [json.loads(x) for x in analyzed("alerts", "-d", d, "-f", "json").stdout
              .splitlines()]
    assert {a["category"] for a in alerts} >= {"enumeration", "credential_stuffing"}
    inc = json.loads(analyzed("incidents", "-d", d, "-f", "json").stdout)
    assert isinstance(inc, list) and len(inc) == 1
    r = inc[0]
    assert r["actor"] == {"type": "caller_id", "id": "mallory", "caller_id": "mallory",
                          "client_ip": "203.0.113.66"}
    assert r["stages"][:2] == ["discovery", "credential_access"]
    assert {"T1083", "T1110.004"} <= set(r["techniques"])
    assert sorted(r["alert_ids"]) == sorted(a["alert_id"] for a in alerts)
    assert r["status"] == "open" and r["severity"] in ("high", "critical")
    assert 0 < r["risk"] <= 100 and r["recommended_actions"]
    # Each alert carries its own action, built from its evidence; the incident's list is
    # the actor's cut-off action then these.
    by_cat = {a["category"]: a["action"] for a in alerts}
    assert by_cat["enumeration"].startswith("Rate-limit ") and "mallory" in by_cat["enumeration"]
    assert "failed from caller mallory" in by_cat["credential_stuffing"]
    assert set(by_cat.values()) & set(r["recommended_actions"])
    assert r["first_seen"].startswith("2026-11-02T10:00") and r["last_seen"] > r["first_seen"]
    # The forensic view holds the same incident, through the query guard.
    rows = analyzed.query("SELECT incident_id, n_alerts FROM incidents")
    assert rows == [{"incident_id": r["incident_id"], "n_alerts": len(alerts)}]

    table = analyzed("incidents", "-d", d).stdout
    assert "mallory" in table and "discovery" in table
    assert max(len(line) for line in table.splitlines()) <= 100, table
    assert analyzed("incidents", "-d", d, "--severity", "urgent", check=False).returncode == 2
    assert analyzed("incidents", "-d", d, "--status", "closed", check=False).returncode == 2


@pytest.mark.slow  # starts a process
def test_cli_status_filters_follow_triage(analyzed: CLI) -> None:
    from toolwatch.dashboard.triage import TriageStore

    from toolwatch.triage_store import set_incident_verdict

    d = str(analyzed.data_dir)

    def ids(*args: str) -> list[str]:
        out = analyzed(*args, "-d", d, "-f", "json").stdout
        if args[0] == "incidents":
            return [r["incident_id"] for r in json.loads(out)]
        return [json.loads(x)["alert_id"] for x in out.splitlines()]

    every = ids("alerts")
    fp = every[0]
    TriageStore(d).mark(fp, "false_positive", "tester", "known scanner")
    assert ids("alerts", "--status", "false_positive") == [fp]
    assert sorted(ids("alerts", "--status", "open")) == sorted(every[1:])
    assert "false_positive" in analyzed("alerts", "-d", d).stdout
    # One alert of the incident is still open: so is the incident.
    (iid,) = ids("incidents", "--status", "open")
    set_incident_verdict(d, iid, "acknowledged", "on it", "tester")
    assert ids("incidents", "--status", "open") == []
    assert ids("incidents", "--status", "acknowledged") == [iid]


@pytest.mark.slow  # starts a process
def test_cli_mistakes_exit_with_a_clear_error(analyzed: CLI, tmp_path: Path) -> None:
    d = str(analyzed.data_dir)
    bad = analyzed("alerts", "-d", d, "--category", "enumerashun", check=False)
    assert bad.returncode == 2 and "unknown --category enumerashun" in bad.stderr
    bad = analyzed("alerts", "-d", d, "--status", "closed", check=False)
    assert bad.returncode == 2 and "unknown --status" in bad.stderr
    gone = analyzed("status", "-d", str(tmp_path / "nonexistent"), check=False)
    assert gone.returncode != 0 and "no toolwatch store" in gone.stderr


@pytest.mark.slow  # starts a process
def test_cli_json_matches_the_documented_schema(analyzed: CLI) -> None:
    import jsonschema

    from tests.conftest import ROOT

    schema = json.loads((ROOT / "docs" / "incident.schema.json").read_text())
    out = json.loads(analyzed("incidents", "-d", str(analyzed.data_dir), "-f", "json").stdout)
    assert out
    for r in out:
        jsonschema.validate(r, schema)


@pytest.mark.slow  # starts a process
def test_cut_incident_queries_exit_cleanly(analyzed: CLI) -> None:
    """A result cut at --max-rows used to abort the process now and then at exit
    ("terminate called without an active exception", 2-4 runs in 10): the query's
    worker thread was still tearing its DuckDB reader down. Timing-dependent: seen on a
    loaded machine, not on a quiet one, so this guards the path rather than proves it."""
    sql = ("SELECT i.actor_id, a.category FROM incidents i, unnest(i.alert_ids) AS "
           "u(alert_id) JOIN alerts a USING (alert_id) ORDER BY i.risk DESC, a.first_seen")
    for _ in range(3):
        proc = analyzed("query", sql, "-d", str(analyzed.data_dir), "--max-rows", "1",
                        check=False)
        assert proc.returncode == 0, proc.stderr
        assert "mallory" in proc.stdout and "result cut at 1 rows" in proc.stderr


@pytest.mark.slow  # starts a process
def test_live_tail_gives_the_same_incident_as_analyze(analyzed: CLI) -> None:
    """Batch and live alike: ``tail`` writes the same alerts, so the view rolls them up
    into the same incident (id, alerts, stages). Its risk is decayed to the live clock
    (``detected_at`` of a live alert is the wall clock; these logs are from 2026-11-02)."""
    log = analyzed.data_dir.parent / "small.jsonl"
    live = CLI(data_dir=analyzed.data_dir.parent / "live", env=analyzed.env)
    live("tail", str(log), "-d", str(live.data_dir), "--exit-when-idle", "2")

    def story(cli: CLI) -> list[tuple]:
        out = json.loads(cli("incidents", "-d", str(cli.data_dir), "-f", "json").stdout)
        return [(r["incident_id"], r["alert_ids"], r["stages"], r["peak_risk"]) for r in out]

    assert story(live) == story(analyzed)
    assert len(story(live)) == 1


def test_evidence_of_another_shape_still_rolls_up() -> None:
    """A hand-made alerts file whose evidence has other shapes than the detectors write
    (a number where text is expected, an object, not JSON at all) still gives incidents."""
    rows = _story()
    rows[0]["evidence"] = orjson.dumps({"top_tool": {"name": "x"}, "chain": 3}).decode()
    rows[1]["evidence"] = "not json"
    inc = build_incidents(_frame(*rows))
    assert inc.height == 1 and inc["n_alerts"][0] == 3
    acts = inc["recommended_actions"][0].to_list()
    assert any("64.0 MB" in a for a in acts) and any("object-level" in a for a in acts)


def test_cli_version_and_short_help(tw: CLI) -> None:
    from toolwatch import __version__

    assert tw("--version").stdout.strip() == __version__
    assert "incidents" in tw("-h").stdout
    assert "--status" in tw("incidents", "-h").stdout
    assert "sample_logs/demo/*.jsonl*" in tw("analyze", "-h").stdout


@pytest.mark.slow  # starts a process
def test_cli_incidents_read_the_config_table(analyzed: CLI, tmp_path: Path) -> None:
    """``[detectors.incidents]`` reaches the view: stricter bands change the severity."""
    d = str(analyzed.data_dir)
    base = json.loads(analyzed("incidents", "-d", d, "-f", "json").stdout)[0]
    cfg = tmp_path / "toolwatch.toml"
    cfg.write_text("[detectors.incidents]\nrisk_medium = 99.0\nrisk_high = 99.5\n"
                   "risk_critical = 99.9\n")
    strict = json.loads(analyzed("incidents", "-d", d, "-c", str(cfg), "-f", "json").stdout)[0]
    assert base["severity"] != "low" and strict["severity"] == "low"
    assert strict["incident_id"] == base["incident_id"] and strict["risk"] == base["risk"]
    assert "detectors.incidents.gap_hours" in analyzed("config").stdout
