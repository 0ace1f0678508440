"""Scale-out: several ``toolwatch kafka`` processes in one group on one store.

Members join while messages flow, one is killed with ``kill -9`` mid-load; the group
rebalances each time. The store must end up with every message exactly once (event ids
unique, every sequence number present) and no alert version stored twice. Functional
only: the timing figures are in benchmarks/bench_kafka.py (``scale``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

try:
    from tests.kafka_broker import create_topic, kafka_broker
    from tests.test_live_support import call_line, stored_alerts, stored_events, wait_for
except ImportError:  # tests/ itself on sys.path
    from kafka_broker import create_topic, kafka_broker  # type: ignore[no-redef]  # noqa: F401
    from test_live_support import (  # type: ignore[no-redef]
        call_line,
        stored_alerts,
        stored_events,
        wait_for,
    )

pytestmark = [pytest.mark.kafka, pytest.mark.alone, pytest.mark.slow, pytest.mark.timeout(240)]

TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
N = 9_000


def producer(bs: str, topic: str, done: threading.Event, seconds: float) -> None:
    """Send N keyed messages spread over about ``seconds``."""
    prod = KafkaProducer(bootstrap_servers=bs, linger_ms=5)
    step = 300
    try:
        for i in range(0, N, step):
            for j in range(i, min(N, i + step)):
                caller = f"agent-{j % 13}"
                line = call_line(j, session=f"s-{caller}-{j // 1500}", caller=caller,
                                 resource=f"doc-{j}", status="not_found" if j % 3 else "ok",
                                 seconds=0.05)
                prod.send(topic, key=caller.encode(), value=line.rstrip(b"\n"))
            prod.flush(timeout=30)
            time.sleep(seconds * step / N)
    finally:
        prod.close(timeout=10)
        done.set()


def distinct_seqs(data: Path) -> int:
    ev = stored_events(data)
    return ev["event_id"].n_unique() if ev.height else 0


def test_processes_join_and_die_mid_load_exactly_once(
    kafka_broker, tmp_path: Path, tw_env: dict
) -> None:
    bs = kafka_broker.bootstrap
    topic, group = f"scale-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions=4)
    data = tmp_path / "store"
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[live]\nflush_interval_s = 0.3\nflush_events = 2000\n"
                   "status_interval_s = 0.3\n")
    cmd = [TOOLWATCH, "kafka", "-b", bs, "-t", topic, "-g", group, "-d", str(data),
           "-c", str(cfg), "--no-stdout", "--session-timeout-ms", "3000",
           "--heartbeat-interval-ms", "500", "--max-poll-interval-ms", "20000"]
    done = threading.Event()
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        procs[name] = subprocess.Popen(cmd, env=tw_env, stdout=subprocess.DEVNULL,
                                       stderr=(tmp_path / f"{name}.log").open("wb"))

    try:
        threading.Thread(target=producer, args=(bs, topic, done, 25.0), daemon=True).start()
        start("a")
        wait_for(lambda: distinct_seqs(data) > 0, timeout=60, interval=0.3)
        start("b")  # joins while a consumes: a gives up half the partitions
        time.sleep(5.0)
        start("c")  # a third member: another rebalance
        time.sleep(5.0)
        assert not done.is_set()  # the kill below lands while messages still flow
        assert procs["b"].poll() is None, (tmp_path / "b.log").read_text()[-2000:]
        procs["b"].send_signal(signal.SIGKILL)  # dies mid-load, maybe mid-commit
        procs["b"].wait(timeout=10)
        assert done.wait(90)
        # b's partitions move to a and c once its session times out (3 s).
        wait_for(lambda: distinct_seqs(data) >= N, timeout=120, interval=0.5)
        for name in ("a", "c"):
            assert procs[name].poll() is None, (tmp_path / f"{name}.log").read_text()[-2000:]
            procs[name].send_signal(signal.SIGTERM)
        for name in ("a", "c"):
            assert procs[name].wait(timeout=60) == 0, (tmp_path / f"{name}.log").read_text()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)

    ev = stored_events(data)
    assert ev["event_id"].n_unique() == ev.height  # no message stored twice
    seqs = sorted(orjson.loads(r)["seq"] for r in ev["raw"].to_list())
    assert seqs == list(range(N))  # none lost
    versions = stored_alerts(data, latest=False)
    if versions.height:
        key = versions.select("alert_id", "severity", "score", "evidence", "last_seen")
        assert key.unique().height == key.height  # no alert version stored twice
