"""The chunk decoder: kafka-python's fetched record batches decoded whole.

kafka-python decodes a fetch answer record by record (``Fetcher.PartitionRecords``); at
~9.5 us per message that was most of a consumer's CPU. :func:`install_fast_records`
gives one consumer a subclass of that private class (:func:`_fast_partition_records`)
that reads the record values straight from the batch buffer, optionally as one
:class:`RecordChunk` per record batch. It subclasses a private class, so it is checked
against the kafka-python it was written for (:data:`WRITTEN_FOR`): on another version
:func:`install_fast_records` logs why and leaves the consumer on kafka-python's own
decoder (:func:`check_kafka_python` raises the same message as an error).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np
from kafka import KafkaConsumer

log = logging.getLogger("toolwatch.kafka")

#: kafka-python versions the decoder was written and tested for: [low, high). The
#: ``Fetcher.PartitionRecords`` internals it relies on are those of 2.2 to 3.x
#: (pyproject.toml pins the same range).
WRITTEN_FOR = ((2, 2), (4, 0))


class UnsupportedKafkaPython(RuntimeError):
    """The installed kafka-python is not one the chunk decoder was written for."""


def _version_tuple(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_kafka_python(version: str | None = None) -> str:
    """The kafka-python version in use, if the chunk decoder was written for it.

    Parameters
    ----------
    version
        The version to check (default: the installed ``kafka.__version__``).

    Returns
    -------
    str
        The version.

    Raises
    ------
    UnsupportedKafkaPython
        When it is outside :data:`WRITTEN_FOR`: the decoder subclasses kafka-python's
        private ``Fetcher.PartitionRecords`` and must be checked against that release
        before it is used there.
    """
    if version is None:
        import kafka

        version = str(getattr(kafka, "__version__", "0"))
    low, high = WRITTEN_FOR
    if not low <= _version_tuple(version) < high:
        raise UnsupportedKafkaPython(
            f"kafka-python {version}: toolwatch's record decoder was written for "
            f"kafka-python >= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))} "
            "(it subclasses the private Fetcher.PartitionRecords); install a version in "
            "that range, or expect kafka-python's slower stock decoder"
        )
    return version


class RecordChunk(NamedTuple):
    """The values of many Kafka records of one partition, as the chunk decoder yields them.

    With :func:`install_fast_records` ``(chunks=True)`` a poll returns, per partition, one
    ``ConsumerRecord`` per record batch whose ``value`` is a ``RecordChunk``: the record
    values joined into one buffer, their lengths and their offsets. A null value
    (tombstone) has length 0 (an empty line, quarantined as such).
    """

    data: bytes
    lens: np.ndarray
    offsets: np.ndarray


def _walk_v2(buf: bytes, pos: int, n: int) -> tuple[list[int], list[int], list[int], int]:
    """Where the values of ``n`` v2 records start, their lengths and offset deltas.

    The one per-record loop left on the consumer's path: it walks the varints of each
    record (most are one or two bytes, decoded inline; longer ones by kafka-python's
    ``decode_varint``), validates every record's size and header structure as
    kafka-python does, and copies nothing. Returns ``(value_starts, value_lengths,
    offset_deltas, end_position)``; a null value has length -1.
    """
    from kafka.errors import CorruptRecordError
    from kafka.record.util import decode_varint as dv

    vstarts: list[int] = []
    vlens: list[int] = []
    odeltas: list[int] = []
    va, la, oa = vstarts.append, vlens.append, odeltas.append
    for _ in range(n):
        b = buf[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        elif buf[pos + 1] < 0x80:
            r = (b & 0x7F) | (buf[pos + 1] << 7)
            length = (r >> 1) ^ -(r & 1)
            pos += 2
        else:
            length, pos = dv(buf, pos)
        start = pos
        if buf[pos] < 0x80:  # attributes (read as a varint, as kafka-python does)
            pos += 1
        else:
            _, pos = dv(buf, pos)
        # timestamp delta: not needed (toolwatch reads the line's own), only skipped
        if buf[pos] < 0x80:
            pos += 1
        elif buf[pos + 1] < 0x80:
            pos += 2
        else:
            _, pos = dv(buf, pos)
        b = buf[pos]
        if b < 0x80:
            od = (b >> 1) ^ -(b & 1)
            pos += 1
        elif buf[pos + 1] < 0x80:  # offset deltas past 63 (most of a large batch)
            r = (b & 0x7F) | (buf[pos + 1] << 7)
            od = (r >> 1) ^ -(r & 1)
            pos += 2
        else:
            od, pos = dv(buf, pos)
        b = buf[pos]
        if b < 0x80:
            kl = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            kl, pos = dv(buf, pos)
        if kl > 0:
            pos += kl
        b = buf[pos]
        if b < 0x80:
            vl = (b >> 1) ^ -(b & 1)
            pos += 1
        elif buf[pos + 1] < 0x80:
            r = (b & 0x7F) | (buf[pos + 1] << 7)
            vl = (r >> 1) ^ -(r & 1)
            pos += 2
        else:
            vl, pos = dv(buf, pos)
        va(pos)
        la(vl)
        oa(od)
        if vl > 0:
            pos += vl
        if buf[pos] == 0:  # no headers
            pos += 1
        else:
            nh, pos = dv(buf, pos)
            if nh < 0:
                raise CorruptRecordError(f"Found invalid number of record headers {nh}")
            for _h in range(nh):
                hk, pos = dv(buf, pos)
                if hk < 0:
                    raise CorruptRecordError(f"Invalid negative header key size {hk}")
                bytes(buf[pos : pos + hk]).decode("utf-8")  # as kafka-python: keys are UTF-8
                pos += hk
                hv, pos = dv(buf, pos)
                if hv > 0:
                    pos += hv
        if pos - start != length or pos > len(buf):
            raise CorruptRecordError(
                f"Invalid record size: expected to read {length} bytes in record "
                f"payload, but instead read {pos - start}"
            )
    return vstarts, vlens, odeltas, pos


def _varints(arr: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Zigzag varints of at most 5 bytes starting at ``at`` in ``arr`` (zero-padded by 5
    bytes): their values and sizes, or None when one is longer."""
    b = arr[at].astype(np.int64)
    raw = b & 0x7F
    more = b >= 0x80
    size = np.ones(len(at), dtype=np.int64)
    for k in range(1, 5):
        if not more.any():
            break
        b = arr[at + k].astype(np.int64)
        raw |= np.where(more, (b & 0x7F) << (7 * k), 0)
        size += more
        more &= b >= 0x80
    if more.any():
        return None
    return (raw >> 1) ^ -(raw & 1), size


def _walk_v2_fast(
    buf: bytes, pos: int, n: int
) -> tuple[list[int], list[int], list[int], int] | None:
    """:func:`_walk_v2` for the usual record shape, with numpy across the records.

    Python walks only the records' length prefixes (a record's start depends on the one
    before); every field of every record is then decoded at once: attributes and
    timestamp delta (skipped), offset delta, key length (the key skipped), value length
    and a zero header count. Returns what :func:`_walk_v2` returns, or None -- a record
    with headers, a field varint longer than 5 bytes, a negative or inconsistent size
    -- and then :func:`_walk_v2` decides (and raises what it raises).
    """
    try:
        return _walk_fields(buf, pos, n)
    except (IndexError, ValueError):  # damaged: _walk_v2 says how
        return None


def _walk_fields(
    buf: bytes, pos: int, n: int
) -> tuple[list[int], list[int], list[int], int] | None:
    """The body of :func:`_walk_v2_fast` (which turns its index errors into None)."""
    from kafka.record.util import decode_varint as dv

    end = len(buf)
    bodies: list[int] = []
    sizes: list[int] = []
    ba, sa = bodies.append, sizes.append
    for _ in range(n):
        b = buf[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        elif buf[pos + 1] < 0x80:
            r = (b & 0x7F) | (buf[pos + 1] << 7)
            length = (r >> 1) ^ -(r & 1)
            pos += 2
        else:
            length, pos = dv(buf, pos)
        if length < 0:
            return None
        ba(pos)
        sa(length)
        pos += length
    if pos > end or n == 0:
        return None
    arr = np.frombuffer(buf + bytes(5), dtype=np.uint8)
    start = np.array(bodies, dtype=np.int64)
    at = start.copy()
    fields = []
    for _field in range(5):  # attributes, timestamp delta, offset delta, key/value length
        got = _varints(arr, at)
        if got is None:
            return None
        value, size = got
        at += size
        if _field == 3:  # key length: the key follows (-1: null key)
            at += np.maximum(value, 0)
        fields.append(value)
    vlens = fields[4]
    vstarts = at.copy()
    at += np.maximum(vlens, 0)
    if (at >= end).any() or arr[at].any():  # a header count other than 0
        return None
    at += 1
    if not (at - start == np.array(sizes, dtype=np.int64)).all():
        return None
    return vstarts.tolist(), vlens.tolist(), fields[2].tolist(), pos


_INT64_MAX = (1 << 63) - 1


def _kept_deltas(
    odeltas: list[int], lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Which records of a v2 batch the chunk decoder delivers, by their offset deltas.

    A record is kept when its offset is at or past the position reached so far (the
    fetch offset, then one past every record delivered and the end of every batch
    before it: ``lo`` relative to the batch's base offset) and within the batch's
    declared range (``hi`` = lastOffsetDelta, capped so base + delta stays an Int64).
    This is Kafka's Java consumer's rule (``CompletedFetch.nextFetchedRecord`` skips
    *any* record below ``nextFetchOffset``). kafka-python only drops the *leading*
    records below the fetch offset (``itertools.dropwhile``), so for a log whose
    offsets go backwards (a batch whose base offset, outside the batch CRC, is damaged)
    it delivers records at offsets already passed (even negative ones) and moves the
    position back; toolwatch would store them and checkpoint a position below what it
    stored. A record claiming an offset past its batch's lastOffsetDelta (offset deltas
    are producer-written) would collide with the records the broker puts there, and
    advancing the position past it would skip them. On a well-formed log (increasing
    offsets, deltas within the batch) every record is kept, as kafka-python keeps them.

    Returns None when no record is kept, else ``(deltas, keep)``: the kept deltas
    (int64) and the kept indexes, or ``keep`` None when every record is kept.
    """
    lo = max(lo, 0)
    if not odeltas or lo > hi:
        return None
    try:
        deltas = np.array(odeltas, dtype=np.int64)
    except OverflowError:  # a varint past Int64: outside any batch anyway
        deltas = np.array([d if 0 <= d <= hi else -1 for d in odeltas], dtype=np.int64)
    n = len(deltas)
    if deltas[0] >= lo and deltas[-1] <= hi and (n == 1 or bool((deltas[1:] > deltas[:-1]).all())):
        return deltas, None  # strictly increasing inside [lo, hi]: the producer's 0..n-1
    ok = (deltas >= lo) & (deltas <= hi)
    # Kept = in range and above every earlier in-range delta (a record below the running
    # maximum is below the position; out-of-range ones never raise the maximum).
    below = np.maximum.accumulate(np.where(ok, deltas, -1))
    ok[1:] &= deltas[1:] > below[:-1]
    keep = np.flatnonzero(ok)
    if len(keep) == 0:
        return None
    return deltas[keep], keep


def _chunk_of(buf: bytes, vstarts: list[int], vlens: list[int], offsets: np.ndarray) -> RecordChunk:
    """A :class:`RecordChunk` from value positions in ``buf`` (null values -> empty)."""
    data = b"".join([buf[a : a + n] for a, n in zip(vstarts, vlens, strict=True) if n > 0])
    lens = np.array(vlens, dtype=np.int64)
    np.maximum(lens, 0, out=lens)
    return RecordChunk(data, lens, offsets)


def _fast_partition_records(base: type, chunks: bool = False) -> type:
    """kafka-python's ``Fetcher.PartitionRecords`` with a leaner v2 record decoder.

    After the C CRC-32C, decoding records was most of a consumer's CPU (~9.5 us per
    message): per record kafka-python builds a ``DefaultRecord``, calls several
    properties and a deserializer hook, then a ``ConsumerRecord``. This reads the same
    fields straight from the (decompressed) batch buffer into the same
    ``ConsumerRecord`` tuples and keeps the fetcher's bookkeeping (``next_fetch_offset``
    per record, ``leader_epoch``, control batches skipped, batch CRC checked, record size
    validated). Anything else (custom deserializers, read_committed, message format
    v0/v1) takes kafka-python's own path. With ``chunks`` (toolwatch's consumer) a record
    at an offset already passed or outside its batch is dropped and the position never
    goes back, where kafka-python delivers it and moves back (:func:`_kept_deltas`).
    """
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.errors import CorruptRecordError
    from kafka.protocol.consumer import IsolationLevel
    from kafka.record.util import decode_varint

    class FastPartitionRecords(base):  # type: ignore[misc, valid-type]
        def _unpack_records(
            self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any
        ) -> Any:
            if (
                key_deserializer is not None
                or value_deserializer is not None
                or self.isolation_level != IsolationLevel.READ_UNCOMMITTED
            ):
                yield from super()._unpack_records(
                    tp, records, key_deserializer, value_deserializer
                )
                return
            try:
                batch = records.next_batch()
                last_batch = None
                while batch is not None:
                    last_batch = batch
                    if self.check_crcs and not batch.validate_crc():
                        raise CorruptRecordError(
                            f"Record batch for partition {tp} at offset "
                            f"{batch.base_offset} failed crc check"
                        )
                    if batch.magic != 2:
                        yield from self._old_format(tp, batch)
                    elif batch.is_control_batch:
                        self.leader_epoch = batch.leader_epoch
                        self.next_fetch_offset = (
                            max(self.next_fetch_offset, batch.next_offset)
                            if chunks
                            else batch.next_offset
                        )
                    elif chunks:
                        self.leader_epoch = batch.leader_epoch
                        yield from self._v2_chunk(tp, batch)
                    else:
                        self.leader_epoch = batch.leader_epoch
                        yield from self._v2(tp, batch)
                    batch = records.next_batch()
                if last_batch is not None and last_batch.magic == 2:
                    # kafka-python sets the position to the last batch's end even when that
                    # is below it (a damaged base offset: negative -> OffsetOutOfRange ->
                    # the whole partition re-read). Chunks: the position never goes back
                    # (Kafka's Java consumer only ever advances it).
                    self.next_fetch_offset = (
                        max(self.next_fetch_offset, last_batch.next_offset)
                        if chunks
                        else last_batch.next_offset
                    )
                self.drain()
            except StopIteration as exc:  # as kafka-python: never end the generator silently
                raise RuntimeError("StopIteration raised unpacking messageset") from exc

        def _v2_chunk(self, tp: Any, batch: Any) -> Any:
            """One ``ConsumerRecord`` holding a :class:`RecordChunk` per record batch."""
            batch._maybe_uncompress()
            buf = bytes(batch._buffer)  # bytes: indexing is faster than a memoryview's
            try:
                walked = _walk_v2_fast(buf, batch._pos, batch._num_records)
                if walked is None:
                    walked = _walk_v2(buf, batch._pos, batch._num_records)
                vstarts, vlens, odeltas, pos = walked
            except (ValueError, IndexError) as err:
                raise CorruptRecordError(f"Found invalid record structure: {err!r}") from err
            if pos != len(buf):
                raise CorruptRecordError(f"{len(buf) - pos} unconsumed bytes after all records")
            n = len(odeltas)
            self.records_read += n
            self.bytes_read += pos - batch._pos
            first = batch.base_offset
            kept = _kept_deltas(
                odeltas,
                self.next_fetch_offset - first,
                min(batch.last_offset_delta, _INT64_MAX - first),
            )
            # The position never goes back (see _kept_deltas) and a batch's end is its
            # declared lastOffsetDelta, never a record's own claim past it.
            self.next_fetch_offset = max(self.next_fetch_offset, batch.next_offset)
            if kept is None:
                return
            deltas, keep = kept
            if keep is not None:
                vstarts = [vstarts[i] for i in keep]
                vlens = [vlens[i] for i in keep]
            offsets = first + deltas
            chunk = _chunk_of(buf, vstarts, vlens, offsets)
            yield ConsumerRecord(
                tp.topic,
                tp.partition,
                self.leader_epoch,
                int(offsets[0]),
                batch.first_timestamp,
                batch.timestamp_type,
                None,
                chunk,
                [],
                None,
                -1,
                len(chunk.data),
                -1,
            )

        def _old_format(self, tp: Any, batch: Any) -> Any:
            if chunks:
                yield from self._old_format_chunk(tp, batch)
                return
            for record in batch:
                if self.check_crcs and not record.validate_crc():
                    raise CorruptRecordError(
                        f"Record for partition {tp} at offset {record.offset} failed crc check"
                    )
                key, value, headers = record.key, record.value, record.headers
                self.records_read += 1
                self.bytes_read += record.size_in_bytes
                self.next_fetch_offset = record.offset + 1
                # A batch whose magic byte is damaged (not covered by the CRC) is read by
                # kafka-python as records with headers: their size as kafka-python has it.
                hsize = (
                    sum(len(k.encode("utf-8")) + (0 if v is None else len(v)) for k, v in headers)
                    if headers
                    else -1
                )
                yield ConsumerRecord(
                    tp.topic,
                    tp.partition,
                    self.leader_epoch,
                    record.offset,
                    record.timestamp,
                    record.timestamp_type,
                    key,
                    value,
                    headers,
                    record.checksum,
                    -1 if key is None else len(key),
                    -1 if value is None else len(value),
                    hsize,
                )

        def _old_format_chunk(self, tp: Any, batch: Any) -> Any:
            """Message formats v0/v1 (pre-0.11 brokers) as one chunk per wrapper batch."""
            values: list[bytes] = []
            offs: list[int] = []
            for record in batch:
                if self.check_crcs and not record.validate_crc():
                    raise CorruptRecordError(
                        f"Record for partition {tp} at offset {record.offset} failed crc check"
                    )
                self.records_read += 1
                self.bytes_read += record.size_in_bytes
                if record.offset >= self.next_fetch_offset:  # the rule of _kept_deltas
                    values.append(record.value or b"")
                    offs.append(record.offset)
                    self.next_fetch_offset = record.offset + 1
            if offs:
                yield ConsumerRecord(
                    tp.topic,
                    tp.partition,
                    self.leader_epoch,
                    offs[0],
                    -1,
                    0,
                    None,
                    RecordChunk(
                        b"".join(values),
                        np.fromiter(map(len, values), np.int64, len(values)),
                        np.array(offs, dtype=np.int64),
                    ),
                    [],
                    None,
                    -1,
                    -1,
                    -1,
                )

        def _v2(self, tp: Any, batch: Any) -> Any:
            batch._maybe_uncompress()
            buf = memoryview(batch._buffer)
            pos = batch._pos
            end_all = len(buf)
            base_offset = batch.base_offset
            ts_type = batch.timestamp_type
            first_ts = batch.first_timestamp
            fixed_ts = batch.max_timestamp if ts_type == 1 else None  # LOG_APPEND_TIME
            topic, partition, epoch = tp.topic, tp.partition, self.leader_epoch
            dv = decode_varint
            try:
                for _ in range(batch._num_records):
                    length, pos = dv(buf, pos)
                    start = pos
                    _attrs, pos = dv(buf, pos)
                    ts_delta, pos = dv(buf, pos)
                    offset_delta, pos = dv(buf, pos)
                    klen, pos = dv(buf, pos)
                    if klen >= 0:
                        key: bytes | None = bytes(buf[pos : pos + klen])
                        pos += klen
                    else:
                        key = None
                    vlen, pos = dv(buf, pos)
                    if vlen >= 0:
                        value: bytes | None = bytes(buf[pos : pos + vlen])
                        pos += vlen
                    else:
                        value = None
                    nh, pos = dv(buf, pos)
                    headers: list[tuple[str, bytes | None]] = []
                    hsize = -1
                    if nh < 0:
                        raise CorruptRecordError(f"Found invalid number of record headers {nh}")
                    if nh:
                        hsize = 0
                        for _h in range(nh):
                            hk, pos = dv(buf, pos)
                            if hk < 0:
                                raise CorruptRecordError(f"Invalid negative header key size {hk}")
                            h_key = bytes(buf[pos : pos + hk]).decode("utf-8")
                            pos += hk
                            hv, pos = dv(buf, pos)
                            h_val = None
                            if hv >= 0:
                                h_val = bytes(buf[pos : pos + hv])
                                pos += hv
                            headers.append((h_key, h_val))
                            hsize += hk + (hv if hv >= 0 else 0)
                    if pos - start != length or pos > end_all:
                        raise CorruptRecordError(
                            f"Invalid record size: expected to read {length} bytes in record "
                            f"payload, but instead read {pos - start}"
                        )
                    offset = base_offset + offset_delta
                    self.records_read += 1
                    self.bytes_read += length
                    self.next_fetch_offset = offset + 1
                    yield ConsumerRecord(
                        topic,
                        partition,
                        epoch,
                        offset,
                        fixed_ts if fixed_ts is not None else first_ts + ts_delta,
                        ts_type,
                        key,
                        value,
                        headers,
                        None,
                        klen,
                        vlen,
                        hsize,
                    )
            except (ValueError, IndexError) as err:
                raise CorruptRecordError(f"Found invalid record structure: {err!r}") from err
            if pos != end_all:
                raise CorruptRecordError(f"{end_all - pos} unconsumed bytes after all records")

    return FastPartitionRecords


def install_fast_records(consumer: KafkaConsumer, chunks: bool = False) -> bool:
    """Make ``consumer`` decode fetched records with :func:`_fast_partition_records`.

    Only this consumer's fetcher is changed (an instance attribute), never kafka-python
    globally. Returns False, leaving the consumer on kafka-python's own decoder, when the
    kafka-python in use is not a version it was written for (:func:`check_kafka_python`,
    logged) or not laid out as expected.

    Parameters
    ----------
    consumer
        A consumer that has not polled yet.
    chunks
        Yield one record per record batch whose value is a :class:`RecordChunk` (no
        ``ConsumerRecord`` and no ``bytes`` object per message; ``max_records`` of a poll
        then counts record batches, the fetch sizes bound a poll). Only for consumers
        without deserializers reading uncommitted data (toolwatch's own): otherwise
        the per-record decoder is installed.
    """
    try:
        check_kafka_python()
    except UnsupportedKafkaPython as exc:
        log.warning("%s", exc)
        return False
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(type(fetcher), "PartitionRecords", None)
    if base is None or not hasattr(base, "_unpack_records"):
        return False
    conf = getattr(consumer, "config", {})
    if chunks and (
        conf.get("key_deserializer") is not None
        or conf.get("value_deserializer") is not None
        or conf.get("isolation_level", "read_uncommitted") != "read_uncommitted"
    ):
        chunks = False
    try:
        fetcher.PartitionRecords = _fast_partition_records(  # type: ignore[union-attr]
            base, chunks=chunks
        )
    except ImportError:
        return False
    return True
