"""toolwatch's lean Kafka record decoder against kafka-python's own, on the same bytes.

Record batches are built with kafka-python's MemoryRecordsBuilder (the producer's
encoder), in every message format and codec, from generated keys, values and headers;
both decoders must yield identical ConsumerRecords and fetch positions, and a damaged
buffer must not decode to different data. The end-to-end path (a real broker) is covered
by tests/test_kafka_consumer.py, whose consumers use the lean decoder.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.consumer.fetcher import Fetcher
from kafka.errors import KafkaError
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.structs import TopicPartition
from toolwatch.ingest.sources.kafka import RecordChunk, _fast_partition_records, message_batch

TP = TopicPartition("logs", 3)
Fast = _fast_partition_records(Fetcher.PartitionRecords)

blobs = st.one_of(
    st.none(),
    st.binary(max_size=300),
    st.sampled_from([b"", b"x" * 127, b"y" * 128, b"z" * 16_383, b"w" * 16_384]),
)
headers = st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=40))),
                   max_size=3)
record = st.tuples(st.integers(0, 2**41), blobs, blobs, headers)


def build(batches: list[list[tuple[Any, ...]]], magic: int, codec: int) -> bytes:
    out = b""
    offset = 0
    for recs in batches:
        b = MemoryRecordsBuilder(magic=magic, compression_type=codec, batch_size=1 << 24,
                                 offset=offset)
        for ts, key, value, hdrs in recs:
            if value is None and key is None:
                value = b""  # the builder refuses a record with neither
            b.append(timestamp=ts, key=key, value=value, headers=hdrs if magic == 2 else None)
        b.close()
        out += b.buffer()
        offset += len(recs)
    return out


def read(cls: type, buf: bytes, fetch_offset: int = 0) -> tuple[list[Any], int]:
    pr = cls(fetch_offset, TP, MemoryRecords(buf))
    recs = pr.take()
    return recs, pr.next_fetch_offset


@pytest.mark.parametrize("magic", [0, 1, 2])
@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])  # none, gzip, snappy, lz4, zstd
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(record, min_size=1, max_size=12), min_size=1, max_size=3))
def test_same_records_as_kafka_python(magic: int, codec: int, batches: list) -> None:
    if (magic < 2 and codec == 4) or (magic == 0 and codec == 3):
        return  # zstd needs format v2; v0 lz4 (0.8/0.9 brokers) needs xxhash
    buf = build(batches, magic, codec)
    want, want_next = read(Fetcher.PartitionRecords, buf)
    got, got_next = read(Fast, buf)
    assert got == want
    assert got_next == want_next == sum(len(b) for b in batches)
    assert [r.offset for r in got] == list(range(len(got)))


@settings(max_examples=10, deadline=None)
@given(batches=st.lists(st.lists(record, min_size=1, max_size=8), min_size=2, max_size=3),
       start=st.integers(0, 20))
def test_fetch_offset_inside_a_batch_skips_earlier_records(batches: list, start: int) -> None:
    buf = build(batches, 2, 0)
    want, _ = read(Fetcher.PartitionRecords, buf, start)
    got, _ = read(Fast, buf, start)
    assert got == want and all(r.offset >= start for r in got)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=2),
       at=st.integers(0, 10**6), byte=st.integers(0, 255))
def test_damaged_buffer_never_decodes_to_other_data(batches: list, at: int, byte: int) -> None:
    buf = bytearray(build(batches, 2, 0))
    buf[at % len(buf)] = byte
    errors = (KafkaError, ValueError, IndexError, AssertionError, RuntimeError)
    try:
        want: Any = read(Fetcher.PartitionRecords, bytes(buf))
    except errors:
        want = None
    try:
        got: Any = read(Fast, bytes(buf))
    except errors:
        got = None
    # What kafka-python refuses (CRC, sizes) is refused; what it reads is read the same.
    assert got == want


Chunked = _fast_partition_records(Fetcher.PartitionRecords, chunks=True)


def flatten(recs: list[Any]) -> tuple[list[bytes], list[int]]:
    """Values and offsets of chunk records, as message_batch sees them."""
    values: list[bytes] = []
    offsets: list[int] = []
    for r in recs:
        c = r.value
        assert isinstance(c, RecordChunk) and r.offset == int(c.offsets[0])
        ends = np.cumsum(c.lens)
        values += [c.data[e - n:e] for e, n in zip(ends.tolist(), c.lens.tolist(), strict=True)]
        offsets += c.offsets.tolist()
    return values, offsets


@pytest.mark.parametrize("magic", [0, 1, 2])
@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])  # none, gzip, snappy, lz4, zstd
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(st.lists(record, min_size=1, max_size=12), min_size=1, max_size=3),
       start=st.integers(0, 40))
def test_chunks_hold_the_same_values_and_offsets(magic: int, codec: int, batches: list,
                                                 start: int) -> None:
    """One chunk per record batch; the values (null -> b"") and offsets kafka-python reads,
    records below the fetch offset dropped, the same next fetch position."""
    if (magic < 2 and codec == 4) or (magic == 0 and codec == 3):
        return
    buf = build(batches, magic, codec)
    want, want_next = read(Fetcher.PartitionRecords, buf, start)
    got, got_next = read(Chunked, buf, start)
    assert got_next == want_next
    values, offsets = flatten(got)
    assert values == [r.value if r.value is not None else b"" for r in want]
    assert offsets == [r.offset for r in want]
    if magic == 2:
        assert len(got) <= len(batches)  # never a record per message
    b = message_batch(TP, got, start + 1)
    assert b.offsets.tolist() == [o for o in offsets if o >= start + 1]
    assert b.lines.to_pylist() == [v for v, o in zip(values, offsets, strict=True)
                                   if o >= start + 1]


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=2),
       at=st.integers(0, 10**6), byte=st.integers(0, 255))
def test_chunks_of_a_damaged_buffer_never_differ(batches: list, at: int, byte: int) -> None:
    buf = bytearray(build(batches, 2, 0))
    buf[at % len(buf)] = byte
    errors = (KafkaError, ValueError, IndexError, AssertionError, RuntimeError)
    try:
        recs, _ = read(Fetcher.PartitionRecords, bytes(buf))
        want: Any = ([r.value if r.value is not None else b"" for r in recs],
                     [r.offset for r in recs])
    except errors:
        want = None
    try:
        got: Any = flatten(read(Chunked, bytes(buf))[0])
    except errors:
        got = None
    assert got == want
