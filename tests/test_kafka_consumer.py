"""``toolwatch kafka``: a consumer-group member against a real Kafka-protocol broker.

No mocks: every test talks to the Tansu broker started by ``tests/kafka_broker.py``.
Group settings follow docs/kafka-notes.md (session 3 s, heartbeat 0.5 s, max poll
interval 5 s) so joins take ~2 s.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import polars as pl
import pytest
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition

from toolwatch.live import SinkConfig
from toolwatch.live.sinks import build_sinks
from toolwatch.live_cli import consume_kafka

try:
    from tests.kafka_broker import create_topic, kafka_broker
    from tests.test_live_support import (
        LiveThread,
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_events,
        wait_for,
    )
except ImportError:  # tests/ itself on sys.path
    from kafka_broker import create_topic, kafka_broker  # type: ignore[no-redef]  # noqa: F401
    from test_live_support import (  # type: ignore[no-redef]
        LiveThread,
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_events,
        wait_for,
    )

pytestmark = [pytest.mark.kafka, pytest.mark.alone, pytest.mark.timeout(90)]

GROUP_OPTS = {
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 500,
    "max_poll_interval_ms": 5000,
}


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, start: int, stop: int, callers: int = 8,
            **kw: object) -> None:
    prod = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for i in range(start, stop):
            caller = f"agent-{i % callers}"
            line = call_line(i, session=f"s-{caller}", caller=caller, **kw)  # type: ignore[arg-type]
            prod.send(topic, key=caller.encode(), value=line.rstrip(b"\n"))
        prod.flush(timeout=30)
    finally:
        prod.close(timeout=10)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int | None]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: c.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        c.close()


def seqs(data: Path) -> list[int]:
    ev = stored_events(data)
    return sorted(orjson.loads(r)["seq"] for r in ev["raw"].to_list())


def test_consume_store_then_commit_and_produce_alerts(kafka_broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap
    topic, alerts_topic, group = uniq("logs"), uniq("alerts"), uniq("g")
    create_topic(bs, topic, partitions=4)
    create_topic(bs, alerts_topic, partitions=1)
    produce(bs, topic, 0, 400, status="not_found")
    data = tmp_path / "store"
    cfg = config_for(data, detect=True)
    sinks = build_sinks([SinkConfig(type="kafka", topic=alerts_topic, notify="alerts")],
                        default_bootstrap=bs)
    with LiveThread(consume_kafka, cfg, bootstrap_servers=bs, topics=[topic], group_id=group,
                    consumer_options=GROUP_OPTS, sinks=sinks, detector=enum_detector(5)) as lt:
        wait_for(lambda: stored_events(data).height == 400, timeout=45)
        produce(bs, topic, 400, 480, status="not_found")
        wait_for(lambda: stored_events(data).height == 480, timeout=30)
    lp = lt.result
    assert seqs(data) == list(range(480))
    ev = stored_events(data)
    assert ev["event_id"].n_unique() == 480
    assert sorted(ev["source_fp"].unique().to_list()) == [f"kafka:{topic}:{p}" for p in range(4)]
    # Kafka offsets were committed, and equal the store's checkpoints (stored first).
    from toolwatch.store import Store

    cps = Store(data).checkpoints()
    com = committed(bs, group, topic, 4)
    for p in range(4):
        assert com[p] == cps[f"kafka:{topic}:{p}"]
    assert sum(com.values()) == 480  # type: ignore[arg-type]
    assert lp.status.extra["kafka"]["commits"] >= 1
    # One alert per session (8 callers -> 8 sessions), updated as evidence grew, never
    # duplicated; every version also went to the alerts topic.
    latest = stored_alerts(data)
    assert latest.height == 8 and latest["alert_id"].n_unique() == 8
    c = KafkaConsumer(alerts_topic, bootstrap_servers=bs, auto_offset_reset="earliest",
                      consumer_timeout_ms=3000)
    try:
        produced = [orjson.loads(m.value) for m in c]
    finally:
        c.close()
    assert {a["alert_id"] for a in produced} == set(latest["alert_id"].to_list())
    assert len(produced) == stored_alerts(data, latest=False).height
    assert all(m["entity_type"] == "session" for m in produced)


def test_two_consumers_share_partitions_exactly_once(kafka_broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap
    topic, group = uniq("logs"), uniq("g")
    create_topic(bs, topic, partitions=4)
    produce(bs, topic, 0, 600, callers=16)
    data = tmp_path / "store"
    cfg = config_for(data)
    a = LiveThread(consume_kafka, cfg, bootstrap_servers=bs, topics=[topic], group_id=group,
                   consumer_options=GROUP_OPTS)
    b = LiveThread(consume_kafka, cfg, bootstrap_servers=bs, topics=[topic], group_id=group,
                   consumer_options=GROUP_OPTS)
    with a, b:
        wait_for(lambda: stored_events(data).height >= 600, timeout=45)
        # Let the group settle on two members, then produce more: both must take part.
        wait_for(lambda: all(
            t.thread.is_alive() for t in (a, b)), timeout=5)
        produce(bs, topic, 600, 1200, callers=16)
        wait_for(lambda: stored_events(data).height >= 1200, timeout=45)
    ra, rb = a.result, b.result
    assert seqs(data) == list(range(1200))  # every message once, none twice
    sa = ra.status.events_stored
    sb = rb.status.events_stored
    assert sa + sb == 1200 and sa > 0 and sb > 0
    # Per-caller correlation stays on one consumer: a caller's events share a partition.
    ev = stored_events(data)
    per_caller = ev.group_by("caller_id").agg(pl.col("source_fp").n_unique().alias("n"))
    assert per_caller["n"].max() == 1


def test_restart_resumes_from_the_store_not_from_kafka(kafka_broker, tmp_path: Path) -> None:
    """Kafka offsets behind the store (lost commit, kill -9 after the store commit): the
    redelivered messages are skipped because the consumer seeks to the store checkpoint."""
    bs = kafka_broker.bootstrap
    topic, group = uniq("logs"), uniq("g")
    create_topic(bs, topic, partitions=2)
    produce(bs, topic, 0, 200)
    data = tmp_path / "store"
    cfg = config_for(data)
    consume_kafka(cfg, bootstrap_servers=bs, topics=[topic], group_id=group,
                  consumer_options=GROUP_OPTS, idle_exit_s=1.5, max_seconds=40)
    assert stored_events(data).height == 200
    # Rewind the group's committed offsets to 0, as if the commits had been lost.
    c = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    try:
        c.assign([TopicPartition(topic, p) for p in range(2)])
        c.commit({TopicPartition(topic, p): OffsetAndMetadata(0, "", -1) for p in range(2)})
    finally:
        c.close()
    assert set(committed(bs, group, topic, 2).values()) == {0}
    produce(bs, topic, 200, 260)
    lp = consume_kafka(cfg, bootstrap_servers=bs, topics=[topic], group_id=group,
                       consumer_options=GROUP_OPTS, idle_exit_s=1.5, max_seconds=40)
    assert lp.status.events_stored == 60
    ev = stored_events(data)
    assert ev.height == 260 and ev["event_id"].n_unique() == 260
    assert sum(committed(bs, group, topic, 2).values()) == 260  # type: ignore[arg-type]


def test_lost_partitions_drop_unflushed_lines_and_assignment_seeks_store(
    kafka_broker, tmp_path: Path
) -> None:
    """Forced eviction discards what was read but not stored (the new owner re-reads it
    from the store checkpoint); an assignment seeks to the store's offset. The source
    reaches the pipeline only through the driver's control (the source contract)."""
    from toolwatch.ingest.records import RawBatch
    from toolwatch.ingest.sources.kafka import KafkaSource

    from toolwatch.live import LivePipeline
    from toolwatch.live.driver import Driver
    from toolwatch.store import Store

    bs = kafka_broker.bootstrap
    topic, group = uniq("logs"), uniq("g")
    create_topic(bs, topic, partitions=2)
    produce(bs, topic, 0, 40, callers=8)
    data = tmp_path / "store"
    cfg = config_for(data)
    store = Store(data)
    lp = LivePipeline(cfg, store, kind="kafka")
    src = KafkaSource(bootstrap_servers=bs, topics=[topic], group_id=group, store=store,
                      consumer_options=GROUP_OPTS)
    d = Driver(src, lp)  # opens the source: it joins the group on its first poll
    try:
        got = 0
        started = None
        deadline = time.monotonic() + 30
        while got < 40 and time.monotonic() < deadline:
            for item in src.poll(0.2):
                if isinstance(item, RawBatch):
                    lp.add(item)
                    got += len(item)
                else:
                    started = item
                    d.handle(item)
        assert got == 40 and lp.pending_lines == 40 and src.counters.processed == 40
        assert started is not None and set(started.fps) == {f"kafka:{topic}:0",
                                                             f"kafka:{topic}:1"}
        tp0 = TopicPartition(topic, 0)
        n0 = sum(len(b) for b in lp._pending.get(f"kafka:{topic}:0", []))
        assert 0 < n0 < 40
        src.handle_lost({tp0})
        assert lp.pending_lines == 40 - n0 and f"kafka:{topic}:0" not in lp._pending
        assert tp0 not in src.assigned
        lp.flush()
        d.deliver_acks()
        assert stored_events(data).height == 40 - n0  # the lost partition's lines: not stored
        # The store now has partition 1's checkpoint: an assignment seeks there.
        tp1 = TopicPartition(topic, 1)
        src.handle_assigned({tp1}, {})
        assert src.consumer.position(tp1) == Store(data).checkpoints()[f"kafka:{topic}:1"]
    finally:
        src.close()
        lp.close()
