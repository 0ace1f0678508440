"""toolwatch's lean Kafka record decoder against kafka-python's own, on the same bytes.

Record batches are built with kafka-python's MemoryRecordsBuilder (the producer's
encoder), in every message format and codec, from generated keys, values and headers;
both decoders must yield identical ConsumerRecords and fetch positions, and a damaged
buffer must not decode to different data. The chunk decoder (toolwatch's consumer) differs
from kafka-python only where kafka-python is wrong, stated precisely in
kafka_python_by_position: records at an offset already passed (kafka-python only skips
leading ones) or past their batch's lastOffsetDelta, and a position that goes back.
The end-to-end path (a real broker) is covered by tests/test_kafka_consumer.py, whose
consumers use the lean decoder.
"""

from __future__ import annotations

from itertools import dropwhile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kafka.consumer.fetcher import Fetcher
from kafka.errors import KafkaError
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.structs import TopicPartition
from toolwatch.ingest.sources.kafka import message_batch
from toolwatch.ingest.sources.kafka_records import (
    RecordChunk,
    _fast_partition_records,
    _kept_deltas,
    _walk_v2,
    _walk_v2_fast,
)

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
# Found by a CI run: the magic byte (outside the CRC) damaged to 3; kafka-python reads the
# records with their headers and counts the headers' size, the old-format path said -1.
@example(batches=[[(0, None, None, [("\x80\x80\U00010000", None), ("0000000", None),
                                     ("000\x80\x80\x80\x80\x80" + "\U00010000" * 4, None)])]],
         at=252, byte=3)
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
    records below the fetch offset dropped, kafka-python's next fetch position, except
    that the position never goes back below the fetch offset (kafka-python moves it back
    to the end of the data when every record is below the fetch offset: a re-fetch)."""
    if (magic < 2 and codec == 4) or (magic == 0 and codec == 3):
        return
    buf = build(batches, magic, codec)
    want, want_next = read(Fetcher.PartitionRecords, buf, start)
    got, got_next = read(Chunked, buf, start)
    assert got_next == max(want_next, start)
    values, offsets = flatten(got)
    assert values == [r.value if r.value is not None else b"" for r in want]
    assert offsets == [r.offset for r in want]
    if magic == 2:
        assert len(got) <= len(batches)  # never a record per message
    b = message_batch(TP, got, start + 1)
    assert b.offsets.tolist() == [o for o in offsets if o >= start + 1]
    assert b.lines.to_pylist() == [v for v, o in zip(values, offsets, strict=True)
                                   if o >= start + 1]


ERRORS = (KafkaError, ValueError, IndexError, AssertionError, RuntimeError)


def kafka_python_by_position(buf: bytes, start: int) -> Any:
    """What the chunk decoder must deliver from ``buf``: kafka-python's own records, less
    those at an offset the position has already passed or outside their batch's range.

    Walks the batches with kafka-python's own batch/record decoding; a record is kept when
    ``position <= offset <= base_offset + lastOffsetDelta`` (the position: ``start``, then
    one past every kept record and every batch's end), Kafka's Java consumer's rule
    (``CompletedFetch.nextFetchedRecord`` skips any record below ``nextFetchOffset``).
    kafka-python's ``PartitionRecords`` only drops *leading* records below the fetch offset
    (``itertools.dropwhile``): it delivers a record at an offset below one it delivered
    before (a damaged base offset, which no CRC covers: e.g. -2**63 + 1 after 0) and
    moves the position back to such a batch's end. Checked here: without the rule, this
    walk yields exactly kafka-python's records. Returns ``(values, offsets, position)``,
    or None when the decoder must refuse (CRC/structure error before any kept record).
    """
    try:
        recs, _ = read(Fetcher.PartitionRecords, buf, start)
        theirs: Any = [r.offset for r in recs]
    except ERRORS:
        theirs = None
    pos, values, offsets, every = start, [], [], []
    refused = False
    mr = MemoryRecords(buf)
    try:
        while (batch := mr.next_batch()) is not None:
            if not batch.validate_crc():
                raise KafkaError("crc")
            for r in list(batch):
                every.append(r.offset)
                if pos <= r.offset <= batch.base_offset + batch.last_offset_delta:
                    values.append(r.value if r.value is not None else b"")
                    offsets.append(r.offset)
                    pos = r.offset + 1
            pos = max(pos, batch.next_offset)
    except ERRORS:
        refused = True
    plain = list(dropwhile(lambda o: o < start, every))
    # The oracle's walk is kafka-python's: same records before the rule, same refusals.
    assert theirs == (None if refused and not plain else plain)
    if refused and not offsets:
        return None
    return values, offsets, pos


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(record, min_size=1, max_size=6), min_size=1, max_size=2),
       at=st.integers(0, 10**6), byte=st.integers(0, 255))
# Found by hypothesis: the 2nd batch's base offset (outside the batch CRC) damaged to -2**63;
# kafka-python delivers its record at offset -2**63 + 1 after offset 0 and moves the
# position to -2**63 + 2 (an OffsetOutOfRange, then a re-read of the whole partition).
@example(batches=[[(0, None, None, [("", b"\x00"), ("00\x80", None)])],
                  [(0, None, None, [("", b"\x00"), ("00\x80", None)])]],
         at=34881, byte=128)
def test_chunks_of_a_damaged_buffer_never_differ(batches: list, at: int, byte: int) -> None:
    """A damaged buffer: the chunk decoder refuses what kafka-python refuses (CRC, sizes)
    and otherwise delivers kafka-python's records less those below the position
    (:func:`kafka_python_by_position`); the position never goes back."""
    buf = bytearray(build(batches, 2, 0))
    buf[at % len(buf)] = byte
    want = kafka_python_by_position(bytes(buf), 0)
    try:
        recs, got_next = read(Chunked, bytes(buf))
        got: Any = (*flatten(recs), got_next)
    except ERRORS:
        got = None
    assert got == want
    if got is not None:
        assert got[2] >= 0 and all(o >= 0 for o in got[1])


def test_damaged_base_offset_keeps_the_position_and_the_next_good_batch() -> None:
    """Three batches, the middle one's base offset damaged to -2**63 (its CRC still
    passes): the chunk decoder delivers the first and last batches, drops the middle
    one's record (an offset already passed), and the position ends after the last."""
    buf = bytearray(build([[(0, None, b"a", [])], [(0, None, b"b", [])],
                           [(0, None, b"c", [])]], 2, 0))
    at = 12 + int.from_bytes(buf[8:12], "big")  # 1st batch: offset, length, then length bytes
    buf[at] = 0x80  # high byte of the 2nd batch's baseOffset
    recs, nxt = read(Fetcher.PartitionRecords, bytes(buf))
    assert [r.offset for r in recs] == [0, -(2**63) + 1, 2]  # kafka-python goes back
    got, got_next = read(Chunked, bytes(buf))
    assert flatten(got) == ([b"a", b"c"], [0, 2])
    assert got_next == nxt == 3
    b = message_batch(TP, got, 0)
    assert b.offsets.tolist() == [0, 2] and b.lines.to_pylist() == [b"a", b"c"]


@settings(max_examples=300, deadline=None)
@given(deltas=st.lists(st.integers(-3, 40), min_size=1, max_size=30),
       lo=st.integers(-5, 45), hi=st.integers(-2, 45))
@example(deltas=[0, 2, 1, 3], lo=0, hi=3)  # first 0, last n-1, yet not 0..n-1
@example(deltas=[0, 100, 1], lo=0, hi=2)  # a producer-written delta past lastOffsetDelta
def test_kept_deltas_is_the_position_rule(deltas: list[int], lo: int, hi: int) -> None:
    """Offset deltas a v2 batch keeps: those at or past the position (``lo``) and within
    the batch (``<= hi``), each above every delta kept before it; a forged delta past
    the batch neither survives nor moves the position past the batch's later records."""
    pos, want = max(lo, 0), []
    for i, d in enumerate(deltas):
        if pos <= d <= hi:
            want.append(i)
            pos = d + 1
    got = _kept_deltas(deltas, lo, hi)
    if not want:
        assert got is None
        return
    assert got is not None
    kept, keep = got
    idx = list(range(len(deltas))) if keep is None else keep.tolist()
    assert idx == want and kept.tolist() == [deltas[i] for i in want]


def _records_area(recs: list[tuple[Any, ...]]) -> tuple[bytes, int, int]:
    """An uncompressed v2 batch's buffer, where its records start, and how many."""
    batch = MemoryRecords(build([recs], 2, 0)).next_batch()
    batch._maybe_uncompress()
    return bytes(batch._buffer), batch._pos, batch._num_records


def _walk_or_error(buf: bytes, pos: int, n: int) -> Any:
    try:
        return _walk_v2(buf, pos, n)
    except (KafkaError, ValueError, IndexError) as exc:
        return type(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(record, min_size=1, max_size=40), no_headers=st.booleans(),
       at=st.integers(0, 10**6), byte=st.integers(0, 255), damage=st.booleans())
@example(recs=[(0, None, b"v" * 9000, [])], no_headers=True, at=0, byte=0, damage=False)
def test_vectorized_walk_is_the_walk(recs: list, no_headers: bool, at: int, byte: int,
                                     damage: bool) -> None:
    """:func:`_walk_v2_fast` answers exactly what :func:`_walk_v2` answers, or defers to
    it (None): on well-formed records with and without headers, and on records with any
    byte damaged (the walkers see what the batch CRC would have refused)."""
    if no_headers:
        recs = [(ts, k, v, []) for ts, k, v, _ in recs]
    buf, pos, n = _records_area(recs)
    if damage:
        b = bytearray(buf)
        b[pos + at % (len(buf) - pos)] = byte
        buf = bytes(b)
    fast = _walk_v2_fast(buf, pos, n)
    want = _walk_or_error(buf, pos, n)
    if fast is not None:
        assert fast == want
        assert all(type(x) is int for part in fast[:3] for x in part)
    elif no_headers and not damage:
        # Well-formed records without headers take the vectorized path unless a field
        # varint is longer than 5 bytes: a timestamp 2**34 ms (~198 days) from the first.
        spread = max(abs(ts - recs[0][0]) for ts, *_ in recs)
        assert spread >= 2**34, "the usual record shape fell back to the Python walk"
