"""Incident notifications (toolwatch/live/notify.py): Alertmanager-like timing on a fake clock,
update contents, severity threshold, Slack escaping, and how sinks are wired.

The notifier is driven with real alert frames (``toolwatch.schema.ALERTS`` columns) and the
real incident roll-up; only the clock is ours, so group_wait / group_interval /
repeat_interval are checked exactly, without sleeping.
"""

from __future__ import annotations

import http.server
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import orjson
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwatch import schema
from toolwatch.errors import ConfigError
from toolwatch.live import LiveConfig
from toolwatch.live.config import SinkConfig
from toolwatch.live.notify import (
    IncidentNotifier,
    IncidentSink,
    incident_link,
    notify_mode,
    slack_incident_payload,
)
from toolwatch.live.sinks import FileSink, WebhookSink, build_sinks
from toolwatch.output import is_unsafe_char

try:
    from tests.test_live_support import config_for
except ImportError:  # tests/ itself on sys.path
    from test_live_support import config_for  # type: ignore[no-redef]

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)

#: category -> (severity, evidence) of a realistic alert of that kind
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "enumeration": ("critical", {"resource_key": "documentId", "distinct_resources": 60,
                                 "top_tool": "getDocument", "run_first_id": "doc-2000",
                                 "run_last_id": "doc-2059"}),
    "credential_stuffing": ("critical", {"distinct_failed_credentials": 30}),
    "bulk_extraction": ("low", {"total_bytes": 2_880_000, "top_tool": "searchItems"}),
    "scraping_loop": ("low", {"distinct_pages": 60, "top_tool": "searchItems"}),
}


def alert(category: str, start_s: float, *, caller: str = "mallory",
          ip: str = "203.0.113.7", severity: str | None = None, n: int = 1,
          dur_s: float = 30.0) -> dict[str, Any]:
    """One alert version of ``category`` for a session of ``caller``."""
    sev, ev = KINDS[category]
    sid = f"s-{caller}-{category}"
    return {
        "alert_id": f"a-{caller}-{category}",
        "category": category, "detector": f"{category}_rules",
        "severity": severity or sev, "score": 0.9,
        "entity_type": "session", "entity_id": sid, "session_id": sid,
        "caller_id": caller, "client_ip": ip, "server": "docs-server",
        "first_seen": T0 + timedelta(seconds=start_s),
        "last_seen": T0 + timedelta(seconds=start_s + dur_s),
        "detected_at": T0 + timedelta(seconds=start_s + dur_s + n),
        "reasons": [f"{category} version {n}"],
        "evidence": orjson.dumps({**ev, "version": n}).decode(),
    }


def frame(*rows: dict[str, Any]) -> pl.DataFrame:
    tbl = pl.DataFrame(list(rows)).to_arrow().select(schema.ALERTS.names)
    return pl.from_arrow(tbl.cast(schema.ALERTS))  # type: ignore[return-value]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def at(self, dt: float) -> Clock:
        self.t = 1000.0 + dt
        return self


def notifier(clock: Clock, **kw: Any) -> IncidentNotifier:
    cfg = SinkConfig(type="webhook", url="http://x", group_wait_s=30, group_interval_s=300,
                     repeat_interval_s=3600, dashboard_url="https://tw.example/", **kw)
    return IncidentNotifier(cfg, clock=clock)


def test_group_wait_interval_and_repeat_on_a_fake_clock() -> None:
    clk = Clock()
    n = notifier(clk)
    n.add(frame(alert("enumeration", 0)))
    assert n.due() == [] and n.next_due() == 1030.0
    # more evidence for the same alert inside group_wait: still one first message
    clk.at(10)
    n.add(frame(alert("enumeration", 0, n=2, dur_s=40)))
    assert n.due() == []
    clk.at(29.9)
    assert n.due() == []
    clk.at(30)
    (first,) = n.due()
    assert first["update"] is False and first["repeat"] is False
    assert first["stages"] == ["discovery"] and first["caller_ids"] == ["mallory"]
    assert first["client_ips"] == ["203.0.113.7"] and first["recommended_actions"]
    assert first["dashboard_url"] == (
        f"https://tw.example/incident?incident={first['incident_id']}")
    # evidence growing without a new alert, stage or severity is no change: no message
    clk.at(100)
    n.add(frame(alert("enumeration", 0, n=3, dur_s=50)))
    clk.at(400)
    assert n.due() == [] and n.pending() == 0
    # a new stage 20 s after the first message waits for group_interval (300 s)
    clk.at(50)
    n.add(frame(alert("credential_stuffing", 60)))
    assert n.next_due() == 1000 + 30 + 300
    clk.at(329.9)
    assert n.due() == []
    clk.at(330)
    (upd,) = n.due()
    assert upd["update"] is True and upd["incident_id"] == first["incident_id"]
    assert upd["changes"]["new_stages"] == ["credential_access"]
    assert upd["changes"]["new_categories"] == ["credential_stuffing"]
    assert upd["changes"]["new_alerts"] == 1 and upd["changes"]["risk_delta"] > 0
    # two more alerts inside the next interval: one update carrying both
    clk.at(340)
    n.add(frame(alert("bulk_extraction", 120)))
    clk.at(350)
    n.add(frame(alert("scraping_loop", 120)))
    clk.at(629)
    assert n.due() == []
    clk.at(630)
    (upd2,) = n.due()
    assert upd2["changes"]["new_stages"] == ["collection"]
    assert sorted(upd2["changes"]["new_categories"]) == ["bulk_extraction", "scraping_loop"]
    assert upd2["stages"] == ["discovery", "credential_access", "collection"]
    # unchanged: re-sent once per repeat_interval, marked as a repeat
    clk.at(630 + 3599)
    assert n.due() == []
    clk.at(630 + 3600)
    (rep,) = n.due()
    assert rep["repeat"] is True and rep["update"] is True and rep["changes"] == {}
    assert n.counters.notifications == 4 and n.counters.updates == 2
    assert n.counters.repeats == 1 and n.counters.incidents == 1


def test_each_actor_is_its_own_incident_and_message() -> None:
    clk = Clock()
    n = notifier(clk)
    n.add(frame(alert("enumeration", 0), alert("enumeration", 5, caller="eve",
                                                ip="198.51.100.9")))
    clk.at(30)
    msgs = n.due()
    assert sorted(m["actor_id"] for m in msgs) == ["eve", "mallory"]
    assert len({m["incident_id"] for m in msgs}) == 2


def test_min_severity_applies_to_the_incident() -> None:
    clk = Clock()
    n = notifier(clk, min_severity="high")
    # a lone low bulk alert: a low-risk incident, not worth a page
    n.add(frame(alert("bulk_extraction", 0)))
    clk.at(60)
    assert n.due() == [] and n.counters.below_severity == 1
    # the same actor's credential stuffing makes it critical: the first message then
    clk.at(100)
    n.add(frame(alert("credential_stuffing", 10)))
    clk.at(129)
    assert n.due() == []
    clk.at(130)
    (m,) = n.due()
    assert m["update"] is False and m["severity"] == "critical"
    assert set(m["categories"]) == {"bulk_extraction", "credential_stuffing"}


def test_flush_sends_pending_changes_at_once() -> None:
    clk = Clock()
    n = notifier(clk)
    n.add(frame(alert("enumeration", 0)))
    clk.at(1)
    (m,) = n.flush()  # shutdown before group_wait: not lost
    assert m["update"] is False
    assert n.flush() == []  # nothing left
    clk.at(2)
    n.add(frame(alert("credential_stuffing", 60)))
    (u,) = n.flush()
    assert u["update"] is True and u["changes"]["new_stages"] == ["credential_access"]


def test_an_incident_whose_id_changes_keeps_its_group() -> None:
    """An alert starting earlier than the incident moves its window start (the id is a
    hash of actor and start): the next message is an update naming the earlier id."""
    clk = Clock()
    n = notifier(clk)
    n.add(frame(alert("credential_stuffing", 600)))
    clk.at(30)
    (first,) = n.due()
    clk.at(40)
    n.add(frame(alert("enumeration", 0)))  # detected later, started earlier
    clk.at(330)
    (upd,) = n.due()
    assert upd["update"] is True and upd["incident_id"] != first["incident_id"]
    assert upd["previous_incident_ids"] == [first["incident_id"]]
    assert upd["notification_key"] == first["notification_key"]
    assert upd["changes"]["new_stages"] == ["discovery"]


def test_closed_incidents_are_forgotten_and_a_new_window_is_a_new_incident() -> None:
    clk = Clock()
    n = notifier(clk)
    n.add(frame(alert("enumeration", 0)))
    clk.at(30)
    (first,) = n.due()
    # the same caller 7 h later (gap_hours 6): a new incident, a first message again
    clk.at(60)
    n.add(frame(alert("credential_stuffing", 7 * 3600)))
    clk.at(90)
    (second,) = n.due()
    assert second["update"] is False and second["incident_id"] != first["incident_id"]
    assert n.counters.incidents == 2
    # the closed one is not repeated
    clk.at(30 + 3600)
    assert [m["incident_id"] for m in n.due()] == []


HOSTILE = "ev\u202eil <!channel> & <https://evil.example|click> `x` *b*"


def test_slack_incident_message_escapes_attacker_strings() -> None:
    clk = Clock()
    n = notifier(clk)
    n.add(frame(alert("enumeration", 0, caller=HOSTILE, ip="<!here>")))
    clk.at(30)
    (m,) = n.due()
    text = slack_incident_payload(m)["text"]
    assert "<!channel>" not in text and "<!here>" not in text and "\u202e" not in text
    assert "&lt;!channel&gt; &amp;" in text
    # the only link is the operator's dashboard link; no attacker URL outside code spans
    assert text.count("<") == 1 and "<https://tw.example/incident?incident=inc-" in text
    outside = text.split("`")[0::2]
    assert not any("evil.example" in part for part in outside), text
    assert "*Action:*" in text and "*Stages:* discovery" in text


@settings(max_examples=200, deadline=None)
@given(who=st.text(max_size=40), ip=st.text(max_size=20), action=st.text(max_size=60))
def test_slack_incident_text_keeps_any_log_value_inert(who: str, ip: str, action: str) -> None:
    """Whatever the caller id, address or action text: nothing unsafe on screen, no Slack
    control sequence but our one link, and each value inside its own code span."""
    msg = {"type": "toolwatch.incident", "update": True, "severity": "high",
           "actor_type": "caller_id", "actor_id": who, "caller_ids": [who],
           "client_ips": [ip], "servers": ["docs-server"], "stages": ["discovery"],
           "categories": ["enumeration"], "summary": f"caller {who} from {ip}",
           "risk": 70.0, "n_alerts": 2, "recommended_actions": [action],
           "changes": {"new_alerts": 1, "new_categories": [], "new_stages": [],
                       "risk_delta": 0.0, "severity_from": "high"},
           "incident_id": "inc-0123456789abcdef0123",
           "dashboard_url": "https://tw.example/incident?incident=inc-0123456789abcdef0123"}
    text = slack_incident_payload(msg)["text"]
    assert not [c for c in text.replace("\n", " ") if is_unsafe_char(c)]
    assert text.count("<") == 1 and text.count(">") == 1 and text.endswith(">")
    # 5 values in code spans (caller, address, server, summary, action): 10 backticks
    assert text.count("`") == 10, text


def test_incident_link_forms() -> None:
    assert incident_link("", "inc-1") is None
    assert incident_link("http://h:8501", "inc-1") == "http://h:8501/incident?incident=inc-1"
    assert incident_link("http://h/i/{incident_id}/view", "inc-1") == "http://h/i/inc-1/view"


def test_sink_wiring_defaults_and_config_validation(tmp_path: Path) -> None:
    assert notify_mode(SinkConfig(type="webhook", url="u")) == "incidents"
    assert notify_mode(SinkConfig(type="kafka", topic="t")) == "incidents"
    assert notify_mode(SinkConfig(type="file", path="p")) == "alerts"
    assert notify_mode(SinkConfig(type="webhook", url="u", notify="alerts")) == "alerts"
    ss = build_sinks([SinkConfig(type="webhook", url="http://127.0.0.1:9/x"),
                      SinkConfig(type="file", path=str(tmp_path / "a.jsonl"))])
    try:
        assert isinstance(ss.sinks[0], IncidentSink)
        assert isinstance(ss.sinks[0].inner, WebhookSink)
        assert isinstance(ss.sinks[1], FileSink)
    finally:
        ss.close()
    cfg = config_for(tmp_path / "s", sinks=[{"type": "webhook", "url": "http://x",
                                             "notify": "pager"}])
    with pytest.raises(ConfigError, match="notify"):
        LiveConfig.from_config(cfg)
    cfg = config_for(tmp_path / "s", sinks=[{"type": "webhook", "url": "http://x",
                                             "group_wait": 5}])
    with pytest.raises(ConfigError, match="group_wait"):
        LiveConfig.from_config(cfg)
    cfg = config_for(tmp_path / "s", sinks=[{"type": "webhook", "url": "http://x",
                                             "group_interval_s": -1}])
    with pytest.raises(ConfigError, match="group_interval_s"):
        LiveConfig.from_config(cfg)
    cfg = config_for(tmp_path / "s", sinks=[{"type": "webhook", "url": "http://x",
                                             "group_wait_s": 0.5, "dashboard_url": "http://d"}])
    s = LiveConfig.from_config(cfg).sinks[0]
    assert s.group_wait_s == 0.5 and s.dashboard_url == "http://d"


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(orjson.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        return


def test_incident_sink_thread_delivers_and_close_flushes_pending() -> None:
    """Through SinkSet.emit and a real HTTP endpoint: emit returns at once, nothing is
    sent before group_wait, and close() sends what is pending (group_wait of an hour)."""
    _Hook.received = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    try:
        ss = build_sinks([SinkConfig(type="webhook", url=url, group_wait_s=3600, slack=True)])
        ss.emit(frame(alert("enumeration", 0)))
        ss.emit(frame(alert("credential_stuffing", 60)))
        assert _Hook.received == []
        ss.close()
    finally:
        srv.shutdown()
    (msg,) = _Hook.received
    assert msg["update"] is False and msg["incident_id"].startswith("inc-")
    assert "credential access" in msg["text"] and "`mallory`" in msg["text"]
    c = ss.counters()["webhook[0]"]
    assert c["sent"] == 1 and c["notifications"] == 1 and c["incidents"] == 1


def test_partial_roll_up_matches_a_full_one() -> None:
    """Between full roll-ups only the touched actors are rolled up; their incidents must
    be the ones a roll-up of every held alert gives (ids, stages, risk, linked callers)."""
    from toolwatch.detectors.incidents import build_incidents

    clk = Clock()
    n = notifier(clk)
    rows = [alert(cat, 60 * k + c, caller=f"c{c}", ip=f"10.0.0.{c % 4}")
            for c in range(30) for k, cat in enumerate(KINDS) if (c + k) % 3]
    # two address-only alerts from an address the callers share
    rows += [{**alert("enumeration", 5, caller="x"), "alert_id": f"ip-{i}", "caller_id": None,
              "client_ip": "10.0.0.1", "entity_type": "client_ip",
              "entity_id": "10.0.0.1", "session_id": None} for i in range(2)]
    n.add(frame(*rows))  # full
    clk.at(1)
    more = [alert("credential_stuffing", 90, caller="c3", ip="10.0.0.3"),
            {**rows[-1], "alert_id": "ip-2", "first_seen": T0 + timedelta(seconds=200),
             "last_seen": T0 + timedelta(seconds=230)}]
    n.add(frame(*more))  # partial
    clk.at(30)
    got = {m["incident_id"]: m for m in n.flush()}
    full = build_incidents(frame(*rows, *more), now=max(r["last_seen"] for r in rows + more))
    for r in full.filter(pl.col("actor_id").is_in(["c3", "10.0.0.1"])).to_dicts():
        m = got[r["incident_id"]]
        assert (m["stages"], m["risk"], m["n_alerts"], m["caller_ids"]) == (
            r["stages"], r["risk"], r["n_alerts"], r["caller_ids"])
    assert len(got) == full.height


def test_kafka_sink_produces_incident_messages_keyed_by_incident(kafka_broker) -> None:
    """A ``[[live.sinks]]`` kafka table sends incident messages (the default), keyed by
    ``notification_key`` so one incident's messages stay on one partition, in order."""
    import uuid

    from kafka import KafkaConsumer

    try:
        from tests.kafka_broker import create_topic
    except ImportError:  # tests/ itself on sys.path
        from kafka_broker import create_topic  # type: ignore[no-redef]

    bs = kafka_broker.bootstrap
    topic = f"incidents-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions=2)
    ss = build_sinks([SinkConfig(type="kafka", topic=topic, group_wait_s=3600)],
                     default_bootstrap=bs)
    ss.emit(frame(alert("enumeration", 0), alert("enumeration", 0, caller="eve",
                                                 ip="198.51.100.9")))
    ss.emit(frame(alert("credential_stuffing", 60)))
    ss.close()  # group_wait of an hour: the shutdown flush sends both incidents
    c = KafkaConsumer(topic, bootstrap_servers=bs, auto_offset_reset="earliest",
                      consumer_timeout_ms=3000)
    try:
        got = [(m.key.decode(), orjson.loads(m.value)) for m in c]
    finally:
        c.close()
    assert sorted(m["actor_id"] for _, m in got) == ["eve", "mallory"]
    for key, m in got:
        assert m["type"] == "toolwatch.incident" and key == m["notification_key"]
        assert m["update"] is False and m["recommended_actions"]
    (mal,) = [m for _, m in got if m["actor_id"] == "mallory"]
    assert mal["stages"] == ["discovery", "credential_access"]


def test_triage_verdicts_silence_or_quiet_an_incident(tmp_path: Path) -> None:
    """The store's verdicts (written as the dashboard and CLI write them): acknowledged
    stops repeats but not updates; false_positive stops every message, also at shutdown."""
    from toolwatch.triage_store import set_incident_verdict

    store = tmp_path / "store"
    clk = Clock()
    cfg = SinkConfig(type="webhook", url="http://x", group_wait_s=30, group_interval_s=300,
                     repeat_interval_s=3600)
    n = IncidentNotifier(cfg, clock=clk, store_dir=store)
    n.add(frame(alert("enumeration", 0), alert("enumeration", 0, caller="eve",
                                                ip="198.51.100.9")))
    clk.at(30)
    first = {m["actor_id"]: m for m in n.due()}
    assert {m["status"] for m in first.values()} == {"open"}
    set_incident_verdict(store, first["mallory"]["incident_id"], "acknowledged", who="ana")
    set_incident_verdict(store, first["eve"]["incident_id"], "false_positive", who="ana")
    clk.at(60)
    n.add(frame(alert("credential_stuffing", 60),
                alert("credential_stuffing", 60, caller="eve", ip="198.51.100.9")))
    clk.at(330)
    (upd,) = n.due()  # eve is silenced
    assert upd["actor_id"] == "mallory" and upd["status"] == "acknowledged"
    clk.at(330 + 3600)
    assert n.due() == []  # acknowledged: no repeat
    clk.at(330 + 3700)
    n.add(frame(alert("bulk_extraction", 120, caller="eve", ip="198.51.100.9")))
    assert n.flush() == []  # eve still silenced at shutdown; mallory has nothing new
