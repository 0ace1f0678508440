"""One parse per flush for many streams (Kafka partitions, tailed files), and the
pipelined fetch of ``KafkaSource``.

The live pipeline parses the lines of every stream of a flush in ONE parser call
(:func:`toolwatch.ingest.records.join_streams`), then pairs and sessionizes each stream
on its own. What it stores must be exactly what transforming each stream alone stores:
the same events (ids, sessions, pairs), summaries, quarantine and checkpoints, also for
hostile lines and JSON-RPC requests answered in a later flush.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.pipeline import Pipeline
from toolwatch.ingest.records import RawBatch, join_streams, slice_batch

from toolwatch.live import LivePipeline
from toolwatch.live.pipeline import merge_batches
from toolwatch.store import Store

try:
    from tests.kafka_broker import create_topic, kafka_broker
    from tests.test_live_support import LiveThread, call_line, config_for, stored_events, wait_for
except ImportError:  # tests/ itself on sys.path
    from kafka_broker import create_topic, kafka_broker  # type: ignore[no-redef]  # noqa: F401
    from test_live_support import (  # type: ignore[no-redef]
        LiveThread,
        call_line,
        config_for,
        stored_events,
        wait_for,
    )

pytestmark = pytest.mark.timeout(120)

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _ts(i: int) -> str:
    return (T0 + timedelta(seconds=i)).isoformat().replace("+00:00", "Z")


def line_of(kind: str, i: int, text: str) -> bytes:
    """One log line of a given kind; ``text`` is attacker-chosen content."""
    if kind == "call":
        return orjson.dumps({"ts": _ts(i), "session_id": f"s-{i % 3}", "caller_id": "alice",
                             "tool": "getDocument", "args": {"documentId": text},
                             "status": "ok"})
    if kind == "nosession":  # sessionized per caller
        return orjson.dumps({"ts": _ts(i), "caller_id": f"c-{i % 2}", "tool": "search",
                             "args": {"q": text}, "status": "not_found"})
    if kind == "secret":
        return orjson.dumps({"ts": _ts(i), "session_id": "s-x", "tool": "connect",
                             "args": {"api_key": f"sk-{text}", "url": f"https://u:{text}@h/"}})
    if kind == "req":
        return orjson.dumps({"ts": _ts(i), "session_id": "conn-1", "direction": "request",
                             "message": {"jsonrpc": "2.0", "id": i % 5, "method": "tools/call",
                                         "params": {"name": "getDocument",
                                                    "arguments": {"documentId": text}}}})
    if kind == "resp":
        return orjson.dumps({"ts": _ts(i), "session_id": "conn-1", "direction": "response",
                             "message": {"jsonrpc": "2.0", "id": i % 5,
                                         "result": {"content": [{"type": "text",
                                                                 "text": text}]}}})
    if kind == "summary":
        return orjson.dumps({"event": "SESSION_END", "sessionId": f"s-{i % 3}", "callCount": i,
                             "ts": _ts(i), "callerId": "alice"})
    if kind == "bad_json":
        return b'{"ts": "' + text.encode("utf-8", "surrogatepass") + b'", '
    if kind == "bad_utf8":
        return b'{"tool": "x\xff\xfe' + text.encode("utf-8", "surrogatepass") + b'"}'
    return text.encode("utf-8", "surrogatepass")  # raw text


KINDS = ["call", "nosession", "secret", "req", "resp", "summary", "bad_json", "bad_utf8", "raw"]


def stream_batches(fp: str, lines: list[bytes], cuts: list[int], start: int,
                   *, newline: bool) -> list[RawBatch]:
    """The lines of one stream as consecutive batches (Kafka-like or file-like)."""
    if newline:
        data = [ln + b"\n" for ln in lines]
        sizes = np.array([len(d) for d in data], dtype=np.int64)
        offs = start + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        nos = np.arange(1, len(data) + 1, dtype=np.int64)
    else:
        data = lines
        offs = np.arange(start, start + len(lines), dtype=np.int64)
        nos = None
    whole = RawBatch(source=f"src/{fp}", source_fp=fp,
                     lines=pa.array(data, pa.large_binary()),  # type: ignore[arg-type]
                     offsets=offs, line_nos=nos,
                     end_offset=int(offs[-1]) + (len(data[-1]) if newline else 1))
    bounds = sorted({0, len(lines), *[c for c in cuts if 0 < c < len(lines)]})
    return [slice_batch(whole, a, b) for a, b in itertools.pairwise(bounds)]


def _rows(tbl: pa.Table) -> list[dict[str, Any]]:
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    return df.drop("ingested_at").sort(df.columns[0]).to_dicts()


def _compare(job: Any, outs: list[Any]) -> None:
    from toolwatch import schema
    from toolwatch.live.commit import _concat

    for name, sch in (("events", schema.EVENTS), ("summaries", schema.SUMMARIES),
                      ("quarantine", schema.QUARANTINE)):
        got = getattr(job, name)
        want = _concat([getattr(o, name) for o in outs], sch)
        assert got.num_rows == want.num_rows, name
        assert _rows(got) == _rows(want), name
    def key(c: Any) -> tuple[str, int]:
        return (c.source_fp, c.end_offset)

    assert sorted(job.checkpoints, key=key) == sorted(
        (o.checkpoint for o in outs if o.checkpoint.end_offset >= 0), key=key)


stream_st = st.lists(
    st.tuples(st.sampled_from(KINDS), st.text(max_size=12)), min_size=1, max_size=25)


def _two_flushes(tmp_path: Path, streams: list[Any], newline: bool) -> None:
    """Feed two flushes of ``streams`` to a LivePipeline (one parse per flush) and to a
    Pipeline transforming each stream alone; every output must be the same."""
    data = tmp_path / uuid.uuid4().hex
    cfg = config_for(data)
    lp = LivePipeline(cfg, Store(data), kind="kafka")
    ref = Pipeline(cfg, None)
    try:
        starts = [0] * len(streams)
        for rnd in range(2):
            per_stream: dict[str, list[RawBatch]] = {}
            for k, (first, second, cuts) in enumerate(streams):
                spec = first if rnd == 0 else second
                fp = f"kafka:t:{k}"
                lines = [line_of(kind, i + 1000 * rnd, text)
                         for i, (kind, text) in enumerate(spec)]
                bl = stream_batches(fp, lines, cuts, starts[k], newline=newline)
                starts[k] = bl[-1].end_offset
                per_stream[fp] = bl
                for b in bl:
                    lp.add(b)
            job = lp._transform_pending()
            assert job is not None
            outs = [ref.transform(merge_batches(bl)) for bl in per_stream.values()]
            _compare(job, outs)
        assert lp.pipe.counters.lines_read == ref.counters.lines_read
        assert dict(lp.pipe.counters.quarantined) == dict(ref.counters.quarantined)
        assert lp.pipe.counters.rpc_responses_merged == ref.counters.rpc_responses_merged
        assert lp.pipe.counters.rpc_requests_unanswered == ref.counters.rpc_requests_unanswered
    finally:
        lp._stop_worker()
        lp.pipe.close()
        ref.close()


@pytest.mark.parametrize("newline", [False, True], ids=["kafka", "files"])
def test_one_parse_for_three_streams_every_kind_of_line(tmp_path: Path, newline: bool) -> None:
    """Requests answered in the next flush, session-less calls of one caller in two
    streams, secrets, summaries, broken JSON and UTF-8, in three streams."""
    every = [(k, f"v{i}") for i, k in enumerate(KINDS)]
    streams = [
        ([*every, ("req", "a"), ("call", "b")], [("resp", "a"), ("nosession", "c")], [3, 7]),
        ([("nosession", "x"), ("raw", "\u0000"), ("secret", "tok")], every, []),
        ([("req", "z")] * 4, [("resp", "z")] * 2 + [("summary", "")], [1, 2, 3]),
    ]
    _two_flushes(tmp_path, streams, newline)


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(streams=st.lists(st.tuples(stream_st, stream_st, st.lists(st.integers(0, 25),
                                                                   max_size=3)),
                        min_size=1, max_size=4),
       newline=st.booleans())
def test_one_parse_for_many_streams_stores_what_one_parse_per_stream_does(
        tmp_path: Path, streams: list[Any], newline: bool) -> None:
    """Two flushes over 1-4 generated streams (hostile text in every kind of line)."""
    _two_flushes(tmp_path, streams, newline)


def test_join_streams_keeps_each_streams_lines_offsets_and_flags() -> None:
    a = stream_batches("a", [b"1", b"22", b"333"], [1], 10, newline=True)
    b = stream_batches("b", [b"x", b"yy"], [], 0, newline=True)
    b[-1].final = True
    joined, parts = join_streams([a, b])
    assert joined.lines.to_pylist() == [b"1\n", b"22\n", b"333\n", b"x\n", b"yy\n"]
    assert joined.fps.to_pylist() == ["a"] * 3 + ["b"] * 2  # type: ignore[union-attr]
    assert joined.end_offset == -1  # never a checkpoint
    assert [p.source_fp for p in parts] == ["a", "b"]
    assert parts[0].lines.to_pylist() == [b"1\n", b"22\n", b"333\n"]
    assert parts[0].offsets.tolist() == [10, 12, 15] and parts[0].end_offset == 19
    assert parts[0].line_nos.tolist() == [1, 2, 3] and not parts[0].final  # type: ignore[union-attr]
    assert parts[1].final and parts[1].end_offset == 5
    # A slice of the joined batch (the parser's fallback halves) keeps its streams.
    assert slice_batch(joined, 2, 4).fps.to_pylist() == ["a", "b"]  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        join_streams([a, stream_batches("c", [b"k"], [], 0, newline=False)])


def test_a_cut_line_keeps_its_original_size_when_joined(tmp_path: Path) -> None:
    """``sizes`` (a source cut an over-long line) survives the join; other streams'
    sizes are their line lengths."""
    a = stream_batches("a", [call_line(1).rstrip(b"\n")], [], 0, newline=True)
    a[0].sizes = np.array([99_999], dtype=np.int64)
    b = stream_batches("b", [call_line(2).rstrip(b"\n")], [], 0, newline=True)
    joined, _parts = join_streams([a, b])
    assert joined.sizes.tolist() == [99_999, len(b[0].lines[0].as_py())]  # type: ignore[union-attr]
    cfg = config_for(tmp_path / "s")
    ref = Pipeline(cfg, None)
    try:
        parsed = ref.parser.parse(joined)
        assert parsed.column("raw_bytes").to_pylist() == [99_998, len(b[0].lines[0].as_py()) - 1]
        assert parsed.column("event_id").to_pylist() == ["a:0", "b:0"]
    finally:
        ref.close()


# --------------------------------------------------------------------------- real broker
@pytest.mark.kafka
def test_pipelined_fetch_stores_every_message_once(kafka_broker, tmp_path: Path) -> None:
    """The next fetch is requested as soon as a poll returned records (counted as
    ``prefetches``), and every message is still stored exactly once."""
    from kafka import KafkaProducer

    from toolwatch.live_cli import consume_kafka

    bs = kafka_broker.bootstrap
    topic, group = f"pf-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bs, topic, partitions=4)
    prod = KafkaProducer(bootstrap_servers=bs, linger_ms=5, batch_size=4096)
    try:
        for i in range(3000):
            caller = f"agent-{i % 16}"
            prod.send(topic, key=caller.encode(),
                      value=call_line(i, session=f"s-{caller}", caller=caller).rstrip(b"\n"))
        prod.flush(timeout=30)
    finally:
        prod.close(timeout=10)
    data = tmp_path / "store"
    cfg = config_for(data)
    box: dict[str, Any] = {}
    with LiveThread(consume_kafka, cfg, bootstrap_servers=bs, topics=[topic], group_id=group,
                    consumer_options={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500,
                                      "max_poll_interval_ms": 5000, "max_poll_records": 4},
                    on_start=lambda src: box.__setitem__("src", src)):
        wait_for(lambda: stored_events(data).height >= 3000, timeout=60)
    ev = stored_events(data)
    assert ev.height == 3000 and ev["event_id"].n_unique() == 3000
    src = box["src"]
    assert src._prefetch is not None
    assert src.counters.extra["prefetches"] >= 1
    assert src.counters.processed == 3000


@pytest.mark.slow  # starts a process
def test_a_flush_of_several_partitions_never_imports_pandas(tmp_path: Path) -> None:
    """The joined parse of several Kafka partitions stays pandas-free.

    Shifting each partition's ``ord`` back with ``pc.subtract(col, pa.scalar(start))``
    imported pandas on the first flush (``pa.scalar`` asks pyarrow's pandas shim): ~0.2 s
    of the poll thread per ``toolwatch kafka`` process. A fresh interpreter runs one
    LivePipeline flush of three partitions (every kind of line) and reports whether
    pandas was imported.
    """
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = f"""
import json, sys
sys.path.insert(0, {str(root / "tests")!r})
import numpy as np, pyarrow as pa
from pathlib import Path
from test_kafka_transform import KINDS, line_of, config_for
from toolwatch.ingest import arrays
from toolwatch.ingest.records import RawBatch
from toolwatch.live import LivePipeline
from toolwatch.store import Store

data = Path({str(tmp_path / "store")!r})
lp = LivePipeline(config_for(data), Store(data), kind="kafka")
try:
    for k in range(3):
        lines = [line_of(kind, i + 10 * k, f"v{{i}}") for i, kind in enumerate(KINDS * 2)]
        lp.add(RawBatch(source=f"kafka:t/{{k}}", source_fp=f"kafka:t:{{k}}",
                        lines=arrays.strings(lines, pa.large_binary()),
                        offsets=np.arange(len(lines), dtype=np.int64), line_nos=None,
                        end_offset=len(lines)))
    job = lp._transform_pending()
    print(json.dumps({{"events": job.events.num_rows, "pandas": "pandas" in sys.modules}}))
finally:
    lp._stop_worker()
    lp.pipe.close()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=root, check=True, timeout=120)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["events"] > 0  # the flush really parsed and stored events
    assert res["pandas"] is False
