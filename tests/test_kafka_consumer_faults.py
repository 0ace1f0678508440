"""Fault injection: ``kill -9`` of a ``toolwatch kafka`` consumer mid-batch, restart.

Redelivered messages (offsets committed to Kafka lag the store, or were never committed)
must be deduplicated: the store holds every message exactly once and no alert version
is stored twice.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import polars as pl
import pytest
from kafka import KafkaProducer

try:
    from tests.kafka_broker import create_topic, kafka_broker
    from tests.test_live_support import call_line, stored_alerts, stored_events
except ImportError:  # tests/ itself on sys.path
    from kafka_broker import create_topic, kafka_broker  # type: ignore[no-redef]  # noqa: F401
    from test_live_support import (  # type: ignore[no-redef]
        call_line,
        stored_alerts,
        stored_events,
    )

pytestmark = [pytest.mark.kafka, pytest.mark.alone, pytest.mark.slow, pytest.mark.timeout(150)]

TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
N = 12_000


def producer(bs: str, topic: str, done: threading.Event) -> None:
    prod = KafkaProducer(bootstrap_servers=bs, linger_ms=5)
    rng = random.Random(3)
    try:
        i = 0
        while i < N:
            n = min(rng.randint(300, 900), N - i)
            for j in range(i, i + n):
                caller = f"agent-{j % 11}"
                # Enumeration-like sessions so the real detectors raise and update alerts.
                line = call_line(j, session=f"s-{caller}-{j // 2000}", caller=caller,
                                 resource=f"doc-{j}", status="not_found" if j % 3 else "ok",
                                 seconds=0.05)
                prod.send(topic, key=caller.encode(), value=line.rstrip(b"\n"))
            prod.flush(timeout=30)
            i += n
            time.sleep(rng.uniform(0.1, 0.4))
    finally:
        prod.close(timeout=10)
        done.set()


def test_kill9_consumer_mid_batch_exactly_once(kafka_broker, tmp_path: Path, tw_env: dict) -> None:
    bs = kafka_broker.bootstrap
    topic, group = f"faults-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions=3)
    data = tmp_path / "store"
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[live]\nflush_interval_s = 0.3\nflush_events = 2000\n")
    cmd = [TOOLWATCH, "kafka", "-b", bs, "-t", topic, "-g", group, "-d", str(data),
           "-c", str(cfg), "--no-stdout", "--session-timeout-ms", "3000",
           "--heartbeat-interval-ms", "500", "--max-poll-interval-ms", "10000"]
    done = threading.Event()
    threading.Thread(target=producer, args=(bs, topic, done), daemon=True).start()
    rng = random.Random(17)
    kills = 0
    deadline = time.monotonic() + 70
    while (not done.is_set() or kills < 3) and time.monotonic() < deadline:
        proc = subprocess.Popen(cmd, env=tw_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(3.0, 6.0))  # join (~2 s) + some batches, then mid-batch
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kills += 1
    assert done.is_set() and kills >= 3
    subprocess.run([*cmd, "--exit-when-idle", "4"], env=tw_env, timeout=90, check=True,
                   capture_output=True)
    ev = stored_events(data)
    seqs = sorted(orjson.loads(r)["seq"] for r in ev["raw"].to_list())
    assert ev["event_id"].n_unique() == ev.height  # redeliveries deduplicated
    assert seqs == list(range(N))  # nothing lost
    versions = stored_alerts(data, latest=False)
    if versions.height:
        key = versions.select("alert_id", "severity", "score", "evidence", "last_seen")
        assert key.unique().height == key.height  # no alert version stored twice
        latest = stored_alerts(data)
        assert latest["alert_id"].n_unique() == latest.height
        per = latest.group_by("entity_type", "entity_id", "category", "first_seen").len()
        assert per["len"].max() == 1
    assert pl.Series(seqs).is_sorted()
