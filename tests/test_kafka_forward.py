"""Producer side: an MCP server's stderr piped into ``python -m toolwatch.kafka_forward``.

A real subprocess writes JSON log lines (and some noise) to its stderr; the forwarder
sends them to the real broker keyed by caller id (else session id); a consumer checks the
keys, that a caller stays on one partition, and that ``toolwatch kafka`` stores them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka import KafkaConsumer

from toolwatch.kafka_forward import message_key

try:
    from tests.kafka_broker import create_topic, kafka_broker
    from tests.test_live_support import config_for, stored_events
except ImportError:  # tests/ itself on sys.path
    from kafka_broker import create_topic, kafka_broker  # type: ignore[no-redef]  # noqa: F401
    from test_live_support import config_for, stored_events  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]

SERVER = textwrap.dedent("""
    import json, sys
    for i in range(300):
        d = {"ts": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z", "tool": "getDocument",
             "args": {"documentId": f"doc-{i}"}, "status": "ok", "seq": i}
        if i % 10 == 0:
            d["sessionId"] = f"s-{i % 3}"      # no caller: keyed by session
        else:
            d["callerId" if i % 2 else "caller_id"] = f"agent-{i % 7}"
        print(json.dumps(d), file=sys.stderr)
        if i % 100 == 0:
            print("server started, not JSON", file=sys.stderr)
""")


def test_message_key_aliases_and_noise() -> None:
    assert message_key(b'{"callerId": "a", "sessionId": "s"}') == b"a"
    assert message_key(b'{"user_id": 42}') == b"42"
    assert message_key(b'{"session_id": "s-1"}') == b"s-1"
    assert message_key(b'{"caller_id": ""}') is None
    assert message_key(b'{"caller_id": true}') is None
    assert message_key(b"not json") is None
    assert message_key(b"[1, 2]") is None


@given(st.binary(max_size=200))
def test_message_key_never_raises(line: bytes) -> None:
    key = message_key(line)
    assert key is None or isinstance(key, bytes)


@pytest.mark.slow  # starts a process
@pytest.mark.kafka
@pytest.mark.timeout(120)
def test_server_stderr_forwarded_keyed_and_stored(kafka_broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap
    topic = f"fwd-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions=4)
    server = subprocess.Popen([sys.executable, "-c", SERVER], stderr=subprocess.PIPE)
    fwd = subprocess.run(
        [sys.executable, "-m", "toolwatch.kafka_forward", "-b", bs, "-t", topic],
        stdin=server.stderr, cwd=ROOT, capture_output=True, timeout=60)
    assert server.wait(timeout=30) == 0
    assert fwd.returncode == 0, fwd.stderr.decode()[-2000:]

    c = KafkaConsumer(topic, bootstrap_servers=bs, group_id=f"g-{uuid.uuid4().hex[:8]}",
                      auto_offset_reset="earliest", enable_auto_commit=False,
                      session_timeout_ms=3000, heartbeat_interval_ms=500)
    msgs: list = []
    deadline = time.monotonic() + 45
    try:
        while len(msgs) < 303 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                msgs.extend(recs)
        for recs in c.poll(timeout_ms=500).values():  # nothing beyond the 303
            msgs.extend(recs)
    finally:
        c.close()
    assert len(msgs) == 303  # 300 JSON lines + 3 noise lines, none lost
    parts: dict[bytes, set[int]] = {}
    for m in msgs:
        if m.value.startswith(b"{"):
            d = orjson.loads(m.value)
            want = d.get("callerId") or d.get("caller_id") or d["sessionId"]
            assert m.key == want.encode()
            parts.setdefault(m.key, set()).add(m.partition)
        else:
            assert m.key is None
    assert all(len(p) == 1 for p in parts.values())  # a caller stays on one partition
    assert len(parts) == 7 + 3

    from toolwatch.live_cli import consume_kafka

    data = tmp_path / "store"
    cfg = config_for(data)
    consume_kafka(cfg, bootstrap_servers=bs, topics=[topic], group_id=f"tw-{topic}",
                  consumer_options={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500},
                  idle_exit_s=2.0, max_seconds=60)
    ev = stored_events(data)
    assert sorted(orjson.loads(r)["seq"] for r in ev["raw"].to_list()) == list(range(300))
