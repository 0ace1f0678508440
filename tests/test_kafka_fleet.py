"""Three `toolwatch kafka` machines, one Delta table on S3 (moto), one address campaign.

Each member is a real process with its own HOME and state directory; they share nothing
but the table (on moto's S3 server) and the consumer group (on a real Kafka-protocol
broker). The producer keys by caller over 8 partitions, so a credential-stuffing
campaign from one address (40 callers, 2 failures each) is spread over every member. A
member is killed with SIGKILL mid-stream and another joins late. Every event must be
stored exactly once, and the address alert raised once, from all 80 failures.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

from tests.kafka_broker import create_topic, kafka_broker  # noqa: F401
from tests.s3_server import S3Server, s3_server  # noqa: F401
from tests.test_live_support import T0, call_line

pytestmark = [pytest.mark.kafka, pytest.mark.alone, pytest.mark.slow, pytest.mark.timeout(600)]

TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
ADDRESS = "203.0.113.66"
PARTITIONS = 8


class Member:
    """One `toolwatch kafka` process on its own machine (HOME, state dir, config)."""

    def __init__(self, home: Path, s3: S3Server, bootstrap: str, topic: str, group: str,
                 uri: str):
        self.home = home
        home.mkdir()
        cfg = home / "toolwatch.toml"
        cfg.write_text(
            f'[store]\nendpoint_url = "{s3.endpoint}"\nallow_http = true\n'
            f'state_dir = "{home / "state"}"\n'
            "[live]\nflush_interval_s = 0.5\nentity_pass_s = 1.0\n")
        env = {**os.environ, **s3.env(), "HOME": str(home)}
        self.log = open(home / "stderr.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [TOOLWATCH, "kafka", "-b", bootstrap, "-t", topic, "-g", group, "-d", uri,
             "-c", str(cfg), "--no-stdout", "--alerts-out", str(home / "alerts.jsonl"),
             "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000"],
            cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=self.log)

    def status(self) -> dict:
        files = sorted((self.home / "state" / "_state" / "live").glob("kafka-*.json"))
        for f in files:
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                st = orjson.loads(f.read_bytes())
                if st.get("pid") == self.proc.pid:
                    return st
        return {}

    def partitions(self) -> list[str]:
        return list((self.status().get("sources") or {}).get("partitions") or [])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def _wait(what: str, cond, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _produce(bs: str, topic: str, lines: list[tuple[str, bytes]]) -> None:
    prod = KafkaProducer(bootstrap_servers=bs, linger_ms=5)
    for key, value in lines:
        prod.send(topic, key=key.encode(), value=value.rstrip())
    prod.flush(timeout=30)
    prod.close(timeout=10)


def _background(start: int, n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(start, start + n):
        caller = f"bg-{i % 30}"
        out.append((caller, call_line(i, caller=caller, session=f"s-{caller}",
                                      ip=f"10.1.{i % 30}.{i % 7 + 1}", seconds=0.5)))
    return out


def _campaign(first: int, callers: range) -> list[tuple[str, bytes]]:
    out = []
    for k, c in enumerate(callers):
        caller = f"victim-{c:02d}"
        for j in range(2):
            i = first + 2 * k + j
            out.append((caller, call_line(
                i, caller=caller, session=f"s-{caller}", ip=ADDRESS, tool="login",
                status="auth_failed", ts=T0 + timedelta(seconds=600 + c * 3 + j))))
    return out


@pytest.fixture
def reader(s3_server: S3Server, tmp_path: Path,  # noqa: F811
           monkeypatch: pytest.MonkeyPatch) -> Iterator:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOME", str(tmp_path / "reader-home"))
    yield


def test_three_members_one_table_one_address_alert(
    kafka_broker, s3_server: S3Server, tmp_path: Path, reader  # noqa: F811
) -> None:
    from toolwatch.config import Config, locate_store
    from toolwatch.query import query
    from toolwatch.store import Store

    bs = kafka_broker.bootstrap
    topic, group = f"fleet-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions=PARTITIONS)
    s3_server.create_bucket("fleet")
    uri = "s3://fleet/prod"
    cfg = Config()
    cfg.store.data_dir, cfg.store.state_dir = uri, str(tmp_path / "reader-state")

    def store() -> Store:
        return Store(locate_store(cfg).store.data_dir)

    def counts() -> tuple[int, int]:
        try:
            row = query(store(),
                "SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM events").to_pylist()
        except Exception:
            return 0, 0
        return row[0]["n"], row[0]["d"]

    members: list[Member] = []
    try:
        a = Member(tmp_path / "a", s3_server, bs, topic, group, uri)
        members.append(a)
        _wait("a to hold every partition", lambda: len(a.partitions()) == PARTITIONS)
        sent = _background(0, 1500) + _campaign(10_000, range(0, 20))
        _produce(bs, topic, sent)

        b = Member(tmp_path / "b", s3_server, bs, topic, group, uri)
        members.append(b)
        _wait("b to join", lambda: b.partitions() and len(a.partitions()) < PARTITIONS)
        more = _background(1500, 1500)
        _produce(bs, topic, more)
        sent += more
        _wait("b to store events", lambda: (b.status().get("events_stored") or 0) > 0)
        b.proc.kill()  # SIGKILL mid-stream: its uncommitted work is re-read by others
        b.proc.wait(10)

        c = Member(tmp_path / "c", s3_server, bs, topic, group, uri)  # joins late
        members.append(c)
        _wait("c to join", lambda: c.partitions() and
              sorted(a.partitions() + c.partitions()) ==
              sorted(f"{topic}/{p}" for p in range(PARTITIONS)), timeout=120)
        last = _background(3000, 1500) + _campaign(20_000, range(20, 40))
        _produce(bs, topic, last)
        sent += last

        _wait("every event stored", lambda: counts()[0] >= len(sent), timeout=120)

        def address_alerts() -> list[dict]:
            return query(store(),
                "SELECT * FROM alerts WHERE entity_type = 'client_ip' AND entity_id = $ip "
                "AND category = 'credential_stuffing'", {"ip": ADDRESS}).to_pylist()

        def complete() -> bool:
            rows = address_alerts()
            return bool(rows) and any(
                orjson.loads(r["evidence"]).get("auth_failures") == 80 for r in rows)

        _wait("the address alert over all 80 failures", complete, timeout=60)
    finally:
        for m in members:
            m.stop()

    n, distinct = counts()
    assert n == distinct == len(sent)  # every event once, the killed member's included
    rows = address_alerts()
    assert len(rows) == 1, rows  # one alert for the address, whoever scored it
    ev = orjson.loads(rows[0]["evidence"])
    assert ev["auth_failures"] == 80 and ev["failing_callers"] == 40
    # No member raised the address from its own share of the partitions: every version
    # any member emitted is of that one alert.
    emitted = []
    for m in members:
        out = m.home / "alerts.jsonl"
        for line in out.read_bytes().splitlines() if out.exists() else []:
            alert = orjson.loads(line)
            if alert["entity_type"] == "client_ip" and alert["category"] == "credential_stuffing":
                emitted.append(alert["alert_id"])
    assert emitted and set(emitted) == {rows[0]["alert_id"]}
    # Every process that wrote the table is known from the table itself.
    writers = store().writers()["writer"].to_pylist()
    assert len(writers) >= 3
