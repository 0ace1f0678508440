"""Source ``kafka``: a kafka-python consumer-group member feeding live mode.

Delivery semantics
    * Stream identity of a partition: ``source_fp = "kafka:<topic>:<partition>"``; the
      message offset is the line offset, so event ids (``<fp>:<offset>``) are stable
      across redeliveries; the checkpoint is ``last offset + 1``.
    * The **store is the source of truth**: events, alerts and the partition checkpoints
      are committed in one atomic store batch. On every assignment the consumer seeks
      each partition to the store's checkpoint (when it has one), so messages redelivered
      after a crash, a kill -9 or a rebalance are skipped, never stored twice. Messages
      below the stored offset that still arrive are dropped and counted
      (``redelivered_skipped``).
    * Kafka offsets are committed (auto-commit off) only *after* the store commit that
      covers them — they give lag/visibility to Kafka tooling and a starting point for a
      store that has no checkpoint yet.

Rebalances
    kafka-python 3 runs rebalance callbacks on its network thread, where a blocking
    ``commit()`` is refused, so the listener is an :class:`AsyncConsumerRebalanceListener`:
    on revoke it flushes the pipeline (data of the revoked partitions reaches the store),
    awaits the Kafka commit of those offsets, then drops the revoked partitions' detection
    state; on loss (forced eviction) it drops their unflushed lines and state without
    committing (the new owner re-reads them from the store's checkpoint); on assignment
    it seeks to the store checkpoints and asks the main loop to reload the partitions'
    recent events into the detection window. A lock serializes the listener with the main
    loop; the main loop commits with ``commit_async`` so it never waits on the network
    thread while holding that lock.

Errors, as the library documents them
    ``CommitFailedError`` ("the group has already rebalanced and assigned the partitions
    to another member"): the data is already in the store and the new owner seeks to the
    store checkpoint; logged and counted, nothing to redo. ``RebalanceInProgressError``:
    the next ``poll()`` rejoins; the commit is retried with the next flush (it covers the
    newer offsets). Both are counted in ``toolwatch status``.

Message key
    Produce with key = caller id (or session id): Kafka's default partitioner keeps one
    key on one partition, hence on one consumer, so per-caller windows are complete on
    that consumer even with many instances in the group. See docs/live.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import orjson
import pyarrow as pa
from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata
from toolwatch.ingest.records import RawBatch

from toolwatch.live import FlushResult, LivePipeline, StopFlag
from toolwatch.store import Store

log = logging.getLogger("toolwatch.kafka")


def partition_fp(topic: str, partition: int) -> str:
    """Stream fingerprint of a Kafka partition."""
    return f"kafka:{topic}:{partition}"


def _tp_of(fp: str) -> TopicPartition | None:
    if not fp.startswith("kafka:"):
        return None
    topic, _, part = fp[len("kafka:") :].rpartition(":")
    try:
        return TopicPartition(topic, int(part))
    except ValueError:
        return None


def consumer_settings(bootstrap_servers: str, group_id: str) -> dict[str, Any]:
    """The :class:`kafka.KafkaConsumer` settings ``toolwatch kafka`` starts from.

    Sized for throughput (see docs/kafka-notes.md, "Throughput"): a fetch returns up to
    64 MiB (16 MiB per partition) and the broker waits up to 100 ms to fill at least
    1 MiB, so a backlog arrives in few large responses; ``max_poll_records`` is large
    because messages only get collected per poll, the work happens once per flush.
    Auto-commit is always off (offsets are committed after the store commit).
    """
    return {
        "bootstrap_servers": bootstrap_servers.split(","),
        "group_id": group_id,
        "client_id": f"toolwatch-{group_id}",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": 50_000,
        "fetch_max_bytes": 64 << 20,
        "max_partition_fetch_bytes": 16 << 20,
        "fetch_min_bytes": 1 << 20,
        "fetch_max_wait_ms": 100,
        "receive_buffer_bytes": 4 << 20,
    }


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


def message_count(msgs: list[Any]) -> int:
    """Messages in a poll's list for one partition (chunks or plain records)."""
    if msgs and type(msgs[0].value) is RecordChunk:
        return sum(len(m.value.offsets) for m in msgs)
    return len(msgs)


def _chunk_batch(tp: TopicPartition, chunks: list[RecordChunk], floor: int) -> RawBatch:
    """:func:`message_batch` for chunk-decoded records: no per-message Python at all."""
    fp = partition_fp(tp.topic, tp.partition)
    source = f"kafka:{tp.topic}/{tp.partition}"
    lens = chunks[0].lens if len(chunks) == 1 else np.concatenate([c.lens for c in chunks])
    offs = (chunks[0].offsets if len(chunks) == 1
            else np.concatenate([c.offsets for c in chunks]))
    n = len(offs)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=starts[1:])
    data = chunks[0].data if len(chunks) == 1 else b"".join(c.data for c in chunks)
    lines = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(starts), pa.py_buffer(data)]
    )
    if n and offs[0] < floor:  # a redelivery below what the store holds
        keep = offs >= floor
        lines = lines.filter(pa.array(keep))
        offs = offs[keep]
        n = len(offs)
    if n == 0:
        return RawBatch(source, fp, pa.array([], pa.large_binary()),  # type: ignore[arg-type]
                        np.empty(0, np.int64), None, floor)
    return RawBatch(source, fp, lines, offs, None, int(offs[-1]) + 1)


def message_batch(tp: TopicPartition, msgs: list[Any], floor: int) -> RawBatch:
    """One Arrow batch from the messages of one partition, skipping offsets below ``floor``.

    Chunk-decoded records (:class:`RecordChunk`) are concatenated with numpy. For plain
    ``ConsumerRecord`` s the only per-message Python work is collecting each value and
    its offset; the values are joined into ONE buffer and the offsets of the binary array
    are a cumulative sum of their lengths, as the file source's batches share their read
    buffer. A tombstone (null value) becomes an empty line (quarantined as such).
    """
    if msgs and type(msgs[0].value) is RecordChunk:
        return _chunk_batch(tp, [m.value for m in msgs], floor)
    if msgs and msgs[0].offset < floor:
        msgs = [m for m in msgs if m.offset >= floor]
    fp = partition_fp(tp.topic, tp.partition)
    source = f"kafka:{tp.topic}/{tp.partition}"
    n = len(msgs)
    if n == 0:
        return RawBatch(source, fp, pa.array([], pa.large_binary()),  # type: ignore[arg-type]
                        np.empty(0, np.int64), None, floor)
    values = [m.value for m in msgs]
    try:
        buf = b"".join(values)
    except TypeError:  # a null value somewhere
        values = [v if v is not None else b"" for v in values]
        buf = b"".join(values)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=n), out=starts[1:])
    first, last = msgs[0].offset, msgs[-1].offset
    if last - first == n - 1:  # contiguous (no compaction gaps, no txn markers)
        offsets = np.arange(first, last + 1, dtype=np.int64)
    else:
        offsets = np.fromiter((m.offset for m in msgs), dtype=np.int64, count=n)
    lines = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(starts), pa.py_buffer(buf)]
    )
    return RawBatch(source, fp, lines, offsets, None, last + 1)

# --------------------------------------------------------------------------- fast records
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
        if buf[pos] < 0x80:  # timestamp delta: not needed (toolwatch reads the line's)
            pos += 1
        else:
            _, pos = dv(buf, pos)
        b = buf[pos]
        if b < 0x80:
            od = (b >> 1) ^ -(b & 1)
            pos += 1
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
                bytes(buf[pos:pos + hk]).decode("utf-8")  # as kafka-python: keys are UTF-8
                pos += hk
                hv, pos = dv(buf, pos)
                if hv > 0:
                    pos += hv
        if pos - start != length or pos > len(buf):
            raise CorruptRecordError(
                f"Invalid record size: expected to read {length} bytes in record "
                f"payload, but instead read {pos - start}")
    return vstarts, vlens, odeltas, pos


def _chunk_of(buf: bytes, vstarts: list[int], vlens: list[int],
              offsets: np.ndarray) -> RecordChunk:
    """A :class:`RecordChunk` from value positions in ``buf`` (null values -> empty)."""
    data = b"".join([buf[a:a + n] for a, n in zip(vstarts, vlens, strict=True) if n > 0])
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
    v0/v1) takes kafka-python's own path.
    """
    from kafka.consumer.fetcher import ConsumerRecord
    from kafka.errors import CorruptRecordError
    from kafka.protocol.consumer import IsolationLevel
    from kafka.record.util import decode_varint

    class FastPartitionRecords(base):  # type: ignore[misc, valid-type]
        def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any,
                            value_deserializer: Any) -> Any:
            if (key_deserializer is not None or value_deserializer is not None
                    or self.isolation_level != IsolationLevel.READ_UNCOMMITTED):
                yield from super()._unpack_records(tp, records, key_deserializer,
                                                   value_deserializer)
                return
            try:
                batch = records.next_batch()
                last_batch = None
                while batch is not None:
                    last_batch = batch
                    if self.check_crcs and not batch.validate_crc():
                        raise CorruptRecordError(
                            f"Record batch for partition {tp} at offset "
                            f"{batch.base_offset} failed crc check")
                    if batch.magic != 2:
                        yield from self._old_format(tp, batch)
                    elif batch.is_control_batch:
                        self.leader_epoch = batch.leader_epoch
                        self.next_fetch_offset = batch.next_offset
                    elif chunks:
                        self.leader_epoch = batch.leader_epoch
                        yield from self._v2_chunk(tp, batch)
                    else:
                        self.leader_epoch = batch.leader_epoch
                        yield from self._v2(tp, batch)
                    batch = records.next_batch()
                if last_batch is not None and last_batch.magic == 2:
                    self.next_fetch_offset = last_batch.next_offset
                self.drain()
            except StopIteration as exc:  # as kafka-python: never end the generator silently
                raise RuntimeError("StopIteration raised unpacking messageset") from exc

        def _v2_chunk(self, tp: Any, batch: Any) -> Any:
            """One ``ConsumerRecord`` holding a :class:`RecordChunk` per record batch."""
            batch._maybe_uncompress()
            buf = bytes(batch._buffer)  # bytes: indexing is faster than a memoryview's
            try:
                vstarts, vlens, odeltas, pos = _walk_v2(buf, batch._pos,
                                                        batch._num_records)
            except (ValueError, IndexError) as err:
                raise CorruptRecordError(f"Found invalid record structure: {err!r}") from err
            if pos != len(buf):
                raise CorruptRecordError(f"{len(buf) - pos} unconsumed bytes after all records")
            n = len(odeltas)
            self.records_read += n
            self.bytes_read += pos - batch._pos
            self.next_fetch_offset = batch.next_offset
            if n == 0:
                return
            first = batch.base_offset
            if odeltas[0] == 0 and odeltas[-1] == n - 1:
                # Producer-written batches: deltas 0..n-1 (strictly increasing by format)
                offsets = np.arange(first, first + n, dtype=np.int64)
            else:
                offsets = first + np.array(odeltas, dtype=np.int64)
            # kafka-python drops records below the fetch offset one by one (a fetch from
            # inside a batch returns the whole batch); the chunk does it here, once.
            if offsets[0] < self.fetch_offset:
                keep = np.flatnonzero(offsets >= self.fetch_offset)
                if len(keep) == 0:
                    return
                vstarts = [vstarts[i] for i in keep]
                vlens = [vlens[i] for i in keep]
                offsets = offsets[keep]
            chunk = _chunk_of(buf, vstarts, vlens, offsets)
            self.next_fetch_offset = max(int(offsets[-1]) + 1, batch.next_offset)
            yield ConsumerRecord(
                tp.topic, tp.partition, self.leader_epoch, int(offsets[0]),
                batch.first_timestamp, batch.timestamp_type, None, chunk, [], None, -1,
                len(chunk.data), -1)

        def _old_format(self, tp: Any, batch: Any) -> Any:
            if chunks:
                yield from self._old_format_chunk(tp, batch)
                return
            for record in batch:
                if self.check_crcs and not record.validate_crc():
                    raise CorruptRecordError(
                        f"Record for partition {tp} at offset {record.offset} failed crc check")
                key, value = record.key, record.value
                self.records_read += 1
                self.bytes_read += record.size_in_bytes
                self.next_fetch_offset = record.offset + 1
                yield ConsumerRecord(
                    tp.topic, tp.partition, self.leader_epoch, record.offset,
                    record.timestamp, record.timestamp_type, key, value, record.headers,
                    record.checksum, -1 if key is None else len(key),
                    -1 if value is None else len(value), -1)

        def _old_format_chunk(self, tp: Any, batch: Any) -> Any:
            """Message formats v0/v1 (pre-0.11 brokers) as one chunk per wrapper batch."""
            values: list[bytes] = []
            offs: list[int] = []
            for record in batch:
                if self.check_crcs and not record.validate_crc():
                    raise CorruptRecordError(
                        f"Record for partition {tp} at offset {record.offset} failed crc check")
                self.records_read += 1
                self.bytes_read += record.size_in_bytes
                self.next_fetch_offset = record.offset + 1
                if record.offset >= self.fetch_offset:
                    values.append(record.value or b"")
                    offs.append(record.offset)
            if offs:
                yield ConsumerRecord(
                    tp.topic, tp.partition, self.leader_epoch, offs[0], -1, 0, None,
                    RecordChunk(b"".join(values),
                                np.fromiter(map(len, values), np.int64, len(values)),
                                np.array(offs, dtype=np.int64)),
                    [], None, -1, -1, -1)

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
                        key: bytes | None = bytes(buf[pos:pos + klen])
                        pos += klen
                    else:
                        key = None
                    vlen, pos = dv(buf, pos)
                    if vlen >= 0:
                        value: bytes | None = bytes(buf[pos:pos + vlen])
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
                            h_key = bytes(buf[pos:pos + hk]).decode("utf-8")
                            pos += hk
                            hv, pos = dv(buf, pos)
                            h_val = None
                            if hv >= 0:
                                h_val = bytes(buf[pos:pos + hv])
                                pos += hv
                            headers.append((h_key, h_val))
                            hsize += hk + (hv if hv >= 0 else 0)
                    if pos - start != length or pos > end_all:
                        raise CorruptRecordError(
                            f"Invalid record size: expected to read {length} bytes in record "
                            f"payload, but instead read {pos - start}")
                    offset = base_offset + offset_delta
                    self.records_read += 1
                    self.bytes_read += length
                    self.next_fetch_offset = offset + 1
                    yield ConsumerRecord(
                        topic, partition, epoch, offset,
                        fixed_ts if fixed_ts is not None else first_ts + ts_delta, ts_type,
                        key, value, headers, None, klen, vlen, hsize)
            except (ValueError, IndexError) as err:
                raise CorruptRecordError(f"Found invalid record structure: {err!r}") from err
            if pos != end_all:
                raise CorruptRecordError(f"{end_all - pos} unconsumed bytes after all records")

    return FastPartitionRecords


def install_fast_records(consumer: KafkaConsumer, chunks: bool = False) -> bool:
    """Make ``consumer`` decode fetched records with :func:`_fast_partition_records`.

    Only this consumer's fetcher is changed (an instance attribute), never kafka-python
    globally. Returns False, leaving the consumer as it was, when the kafka-python in
    use is not laid out as expected (another major version).

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
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(type(fetcher), "PartitionRecords", None)
    if base is None or not hasattr(base, "_unpack_records"):
        return False
    conf = getattr(consumer, "config", {})
    if chunks and (conf.get("key_deserializer") is not None
                   or conf.get("value_deserializer") is not None
                   or conf.get("isolation_level", "read_uncommitted") != "read_uncommitted"):
        chunks = False
    try:
        fetcher.PartitionRecords = _fast_partition_records(  # type: ignore[union-attr]
            base, chunks=chunks)
    except ImportError:
        return False
    return True


class LagWatch:
    """Tells when a consumer's lag keeps growing.

    The lag "grows" from the moment it is above zero until it falls below the value it
    had then: catching up starts a new episode at the lower value, reaching zero ends
    it. A steady lag that never shrinks counts as growing (the member is not keeping
    up with the producers).
    """

    def __init__(self) -> None:
        self.episode: tuple[float, int] | None = None  # (since, lag then)
        self.warned = False

    def update(self, per: dict[str, int], warn_after_s: float,
               now: float | None = None) -> tuple[dict[str, Any], bool]:
        """Take a sample of the lag per partition.

        Parameters
        ----------
        per
            Messages behind the high watermark, per partition.
        warn_after_s
            Growth longer than this adds a ``warning`` (0: never).
        now
            ``time.monotonic()`` of the sample (tests).

        Returns
        -------
        (entries, newly_warned)
            ``messages`` (total), ``growing_s`` (seconds of the current episode),
            ``by_partition`` (``topic/p=n ...``) and, past the limit, ``warning``;
            ``newly_warned`` is true on the first sample past the limit of an episode.
        """
        now = time.monotonic() if now is None else now
        total = sum(per.values())
        if total == 0:
            self.episode = None
        elif self.episode is None or total < self.episode[1]:
            self.episode = (now, total)
        growing = 0.0 if self.episode is None else now - self.episode[0]
        out: dict[str, Any] = {
            "messages": total,
            "growing_s": round(growing, 1),
            "by_partition": " ".join(f"{k}={v}" for k, v in sorted(per.items())),
        }
        newly = False
        if warn_after_s > 0 and growing > warn_after_s:
            out["warning"] = f"lag growing for {growing:.0f}s (> {warn_after_s:g}s)"
            newly, self.warned = not self.warned, True
        else:
            self.warned = False
        return out, newly


class _Listener(AsyncConsumerRebalanceListener):
    def __init__(self, owner: KafkaLiveSource):
        self.owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        futures = self.owner.handle_revoked(set(revoked))
        for fut in futures:
            try:
                await fut
            except (CommitFailedError, RebalanceInProgressError) as exc:
                self.owner.note_commit_error(exc)
            except KafkaError as exc:
                self.owner.note_commit_error(exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        assigned = set(assigned)
        # The group's committed offsets are read HERE, before the first fetch of the
        # new partitions: a seek made after a poll has already returned records would
        # send the fetcher back over messages this member has just read (the bug of
        # test_store_per_machine_resumes_at_group_commit: offsets 200-299 stored twice).
        committed = await self.owner.fetch_committed_async(assigned)
        self.owner.handle_assigned(assigned, committed)

    async def on_partitions_lost(self, lost: Any) -> None:
        self.owner.handle_lost(set(lost))


class KafkaLiveSource:
    """Consume topics as a group member into a :class:`~toolwatch.live.LivePipeline`.

    Parameters
    ----------
    lp
        The live pipeline (its store is the checkpoint source of truth).
    store
        The store.
    bootstrap_servers
        ``host:port[,host:port…]``.
    topics
        Topics to subscribe to.
    group_id
        Consumer group.
    consumer_options
        Extra :class:`kafka.KafkaConsumer` settings (e.g. ``max_poll_interval_ms``,
        ``session_timeout_ms``, security settings). Auto-commit is always off.
    max_poll_records
        Records per poll.
    fast_records
        Decode fetched records with the lean decoder (:func:`install_fast_records`);
        False: kafka-python's own.
    """

    def __init__(
        self,
        lp: LivePipeline,
        store: Store,
        *,
        bootstrap_servers: str,
        topics: list[str],
        group_id: str,
        consumer_options: dict[str, Any] | None = None,
        max_poll_records: int | None = None,
        fast_records: bool = True,
    ):
        self.lp = lp
        self.store = store
        self.topics = topics
        self.group_id = group_id
        opts = consumer_settings(bootstrap_servers, group_id)
        opts.update(consumer_options or {})
        if max_poll_records is not None:
            opts["max_poll_records"] = max_poll_records
        opts["enable_auto_commit"] = False
        self.max_poll_records = int(opts["max_poll_records"])
        self.consumer = KafkaConsumer(**opts)
        self.fast_records = fast_records and install_fast_records(self.consumer, chunks=True)
        self.lock = threading.RLock()
        self.stored: dict[str, int] = {}  # fp -> offset the store holds up to
        self._noted: dict[str, int] = {}  # fp -> stored offset not yet committed to Kafka
        self._noted_lock = threading.Lock()  # stored/_noted: the commit thread writes them
        self.assigned: set[TopicPartition] = set()
        self._to_warm: set[str] = set()
        self._check_committed: set[TopicPartition] = set()
        self.counters: dict[str, int] = {
            "messages": 0,
            "redelivered_skipped": 0,
            "commits": 0,
            "commit_failed": 0,
            "rebalance_in_progress": 0,
            "revocations": 0,
            "assignments": 0,
            "lost": 0,
            "lag_warnings": 0,
            "skipped_to_committed": 0,
        }
        self.lag_watch = LagWatch()
        self.lp.on_commit.append(self._after_store_commit)
        self.consumer.subscribe(topics=topics, listener=_Listener(self))
        self.on_poll: Callable[[], None] | None = None
        #: ``time.perf_counter()`` when the first message arrived (benchmarks).
        self.first_message_at_perf: float | None = None

    # ------------------------------------------------------------------ callbacks
    def _after_store_commit(self, res: FlushResult) -> None:
        """Note the offsets a store commit covers (runs on the pipeline's commit thread).

        ``KafkaConsumer`` is not thread-safe, so nothing is sent from here: the poll
        thread commits what is noted (:meth:`_commit_noted`) after its next poll, or the
        revoke listener does before giving partitions up.
        """
        with self._noted_lock:
            for c in res.checkpoints:
                if _tp_of(c.source_fp) is None:
                    continue
                self.stored[c.source_fp] = max(self.stored.get(c.source_fp, 0), c.end_offset)
                self._noted[c.source_fp] = max(self._noted.get(c.source_fp, 0), c.end_offset)

    def _commit_noted(self, only: set[TopicPartition] | None = None) -> list[Any]:
        """Commit (asynchronously) the offsets the store holds and Kafka does not yet.

        One commit per store commit at most, whatever the number of messages: the Kafka
        offsets trail the store, which stays the source of truth.
        """
        with self._noted_lock:
            if not self._noted:
                return []
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            for fp in list(self._noted):
                tp = _tp_of(fp)
                if tp is None or (only is not None and tp not in only):
                    continue
                end = self._noted.pop(fp)
                if tp in self.assigned:
                    offsets[tp] = OffsetAndMetadata(end, "", -1)
        if not offsets:
            return []
        try:
            fut = self.consumer.commit_async(offsets, callback=self._commit_done)
        except (CommitFailedError, RebalanceInProgressError, KafkaError) as exc:
            self.note_commit_error(exc)
            return []
        return [fut]

    def _commit_done(self, offsets: Any, response: Any) -> None:
        if isinstance(response, Exception):
            self.note_commit_error(response)
        else:
            self.counters["commits"] += 1

    def note_commit_error(self, exc: BaseException) -> None:
        """Count a failed Kafka commit (the store already holds the data)."""
        if isinstance(exc, RebalanceInProgressError):
            self.counters["rebalance_in_progress"] += 1
            log.info("offset commit during a rebalance; retried with the next flush")
        else:
            self.counters["commit_failed"] += 1
            log.info("offset commit failed (%s); the store holds the data", exc)

    def handle_revoked(self, revoked: set[TopicPartition]) -> list[Any]:
        """Flush everything read so far, commit it, drop the revoked partitions' state.

        Runs inside ``poll()`` on the poll thread: the flush waits for the commit thread
        (every queued micro-batch reaches the store) before the partitions are released,
        so the next owner's seek to the store checkpoint sees all of it.
        """
        with self.lock:
            self.counters["revocations"] += 1
            fps = [partition_fp(tp.topic, tp.partition) for tp in revoked]
            self.lp.finalize_streams(fps)
            self.lp.flush(wait=True)
            futures = self._commit_noted()
            self._drop(revoked)
            return futures

    def handle_lost(self, lost: set[TopicPartition]) -> None:
        """Forced eviction: discard unflushed lines and state of the lost partitions."""
        with self.lock:
            self.counters["lost"] += 1
            # Micro-batches already handed to the commit thread were read before the
            # eviction (a synchronous flush would have stored them before this poll).
            self.lp.drain()
            self.lp.drop_pending(partition_fp(tp.topic, tp.partition) for tp in lost)
            self._drop(lost)

    def _drop(self, tps: set[TopicPartition]) -> None:
        fps = [partition_fp(tp.topic, tp.partition) for tp in tps]
        self.lp.window.drop_streams(fps)
        with self._noted_lock:
            for fp in fps:
                self.stored.pop(fp, None)
                self._noted.pop(fp, None)
        for fp in fps:
            self.lp.pipe.pairers.pop(fp, None)
            self._to_warm.discard(fp)
            self.lp.forget_stream(fp)
        self._check_committed -= tps
        self.assigned -= tps

    async def fetch_committed_async(
        self, tps: set[TopicPartition]
    ) -> dict[TopicPartition, int] | None:
        """The group's committed offsets of ``tps``, read from the rebalance listener.

        Awaited on kafka-python's IO thread (a blocking ``committed()`` there would wait
        on itself). None when the lookup failed or kafka-python's internals differ: the
        poll thread then checks after the assigning poll (:meth:`_skip_to_committed`).
        """
        fetch = getattr(getattr(self.consumer, "_coordinator", None),
                        "fetch_committed_offsets_async", None)
        if fetch is None or not tps:
            return None if fetch is None else {}
        try:
            got = await fetch(set(tps), timeout_ms=5000)
        except Exception as exc:
            log.info("committed offsets unknown at assignment (%s): checked after the poll",
                     exc)
            return None
        return {tp: om.offset for tp, om in got.items()
                if om is not None and om.offset is not None and om.offset >= 0}

    def handle_assigned(self, assigned: set[TopicPartition],
                        committed: dict[TopicPartition, int] | None = None) -> None:
        """Seek every assigned partition to where this store resumes it.

        That is the store's checkpoint (source of truth), or the group's committed offset
        when it is ahead of the checkpoint: with one store per machine, Kafka offsets are
        committed only after some store holds the data, so a commit ahead of this store's
        checkpoint means another machine stored those messages. ``committed`` (looked up
        by the listener before any fetch) makes this one seek; None defers the check to
        the poll thread.
        """
        with self.lock:
            self.counters["assignments"] += 1
            self.store.recover()  # roll forward a batch a killed member committed
            cps = self.store.checkpoints()
            for tp in assigned:
                fp = partition_fp(tp.topic, tp.partition)
                if fp in cps:
                    target = cps[fp]
                    if committed is None:
                        self._check_committed.add(tp)
                    elif committed.get(tp, -1) > target:
                        log.info("%s: Kafka commit %d ahead of this store's checkpoint %d; "
                                 "resuming there", tp, committed[tp], target)
                        self.counters["skipped_to_committed"] += 1
                        target = committed[tp]
                    self.consumer.seek(tp, target)
                    with self._noted_lock:
                        self.stored[fp] = target
                self._to_warm.add(fp)
            self.assigned |= assigned

    def _skip_to_committed(self) -> None:
        """Move partitions whose Kafka commit is ahead of this store's checkpoint to it.

        With one store per machine, a partition that comes back to a machine resumes from
        that store's older checkpoint, while another member has stored (and committed)
        more since: Kafka offsets are only committed after some store holds the data, so
        a committed offset ahead of the checkpoint means another store has those messages
        (or an operator moved the group forward). With one shared store the checkpoint is
        never behind. Runs on the poll thread, which may block on the coordinator; records
        of the assigning poll below the new floor are dropped by :func:`message_batch`.
        """
        tps, self._check_committed = self._check_committed & self.assigned, set()
        for tp in tps:
            try:
                committed = self.consumer.committed(tp)
            except KafkaError as exc:
                log.info("committed offset of %s unknown (%s): resuming from the store", tp, exc)
                continue
            fp = partition_fp(tp.topic, tp.partition)
            with self._noted_lock:
                floor = self.stored.get(fp)
                if committed is None or floor is None or committed <= floor:
                    continue
                self.stored[fp] = committed
            log.info("%s: Kafka commit %d ahead of this store's checkpoint %d; resuming there",
                     tp, committed, floor)
            self.counters["skipped_to_committed"] += 1
            # The assigning poll may already have returned records past the commit (they
            # are kept: the new floor only drops those below it). Seeking back to the
            # commit would fetch them a second time, before the store commit that raises
            # the floor past them: seek only forward of what this member already read.
            pos = self._position(tp)
            if pos is None or pos < committed:
                self.consumer.seek(tp, committed)

    # ------------------------------------------------------------------ loop
    def _add(self, tp: TopicPartition, msgs: list[Any]) -> int:
        fp = partition_fp(tp.topic, tp.partition)
        batch = message_batch(tp, msgs, self.stored.get(fp, 0))
        n = len(batch)
        self.counters["redelivered_skipped"] += message_count(msgs) - n
        if not n:
            return 0
        self.lp.add(batch)
        self.counters["messages"] += n
        return n

    def _behind(self, got: int) -> bool:
        """Whether a micro-batch's worth is still waiting beyond this poll.

        A full poll, or a lag of at least ``live.flush_events`` messages: waiting for size
        then fills the micro-batch within a few polls. A smaller lag (messages fetched
        ahead, a trickle) is not a backlog, so the flush interval keeps latency low.
        """
        if got >= self.max_poll_records:
            return True
        lag = 0
        for tp in self.assigned:
            hw = self.consumer.highwater(tp)
            pos = self._position(tp) if hw is not None else None
            if hw is not None and pos is not None:
                lag += max(0, hw - pos)
        return lag >= self.lp.live.flush_events

    def _position(self, tp: TopicPartition) -> int | None:
        """The consumer's fetch position of ``tp`` without any network round trip.

        ``KafkaConsumer.position()`` may refresh committed offsets from the coordinator
        (a blocking request); this reads the position kafka-python already holds, or
        None when it has none (yet) or its internals differ.
        """
        try:
            state = self.consumer._subscription.assignment[tp]
            pos = state.position
        except (AttributeError, KeyError):
            return None
        return getattr(pos, "offset", pos) if pos is not None else None

    def watch_lag(self, per: dict[str, int], warn_after_s: float) -> dict[str, Any]:
        """Status ``lag`` entries for ``per`` partition lags (see :class:`LagWatch`)."""
        out, newly = self.lag_watch.update(per, warn_after_s)
        if newly:
            self.counters["lag_warnings"] += 1
            log.warning("consumer lag has grown for %.0fs to %d messages (%s): this member "
                        "does not keep up; add members or partitions",
                        out["growing_s"], out["messages"], out["by_partition"])
        return out

    def lag(self) -> dict[str, int]:
        """Messages behind the high watermark, per partition and in total."""
        per: dict[str, int] = {}
        for tp in list(self.assigned):
            hw = self.consumer.highwater(tp)
            pos = self._position(tp)
            if hw is not None and pos is not None:
                per[f"{tp.topic}/{tp.partition}"] = max(0, hw - pos)
        return per

    def run(self, stop: StopFlag, *, idle_exit_s: float | None = None,
            max_seconds: float | None = None, poll_timeout_ms: int = 200) -> None:
        """Poll, buffer and flush until ``stop`` is set (then flush and leave the group).

        Each poll's messages become one Arrow batch per partition; batches wait in the
        pipeline until a flush is due (``live.flush_interval_s`` / ``flush_events``),
        are transformed on this thread, then detected and stored on the commit thread
        while this one keeps polling. Kafka offsets are committed after the store
        commit that covers them, once per flush.

        Parameters
        ----------
        stop
            Set by signal handlers.
        idle_exit_s
            Also stop after this long without a message, counted from the first message
            or the first assignment (replays, tests).
        max_seconds
            Also stop after this long.
        poll_timeout_ms
            Longest wait of one poll.
        """
        started = time.monotonic()
        last_msg = time.monotonic()
        got_any = False
        deferred = False
        try:
            while not stop:
                # A flush held back for a backlog is "due" at once: waiting for it would
                # make every poll a zero-timeout spin (CPU and GIL taken from the fetcher
                # and the commit thread). poll() returns as soon as records are there.
                timeout = poll_timeout_ms / 1000 if deferred else min(
                    poll_timeout_ms / 1000, self.lp.time_to_due())
                try:
                    recs = self.consumer.poll(
                        timeout_ms=int(timeout * 1000), max_records=self.max_poll_records
                    )
                except (CommitFailedError, RebalanceInProgressError) as exc:
                    self.note_commit_error(exc)
                    continue
                if recs and self.first_message_at_perf is None:
                    self.first_message_at_perf = time.perf_counter()
                with self.lock:
                    if self._check_committed:
                        self._skip_to_committed()
                    n = 0
                    for tp, msgs in recs.items():
                        n += self._add(tp, msgs)
                    if self._to_warm:
                        warm, self._to_warm = set(self._to_warm), set()
                        self.lp.warm_up(warm)
                    # The transform runs here; detection and the store commit run on
                    # the pipeline's commit thread while the next polls are read.
                    # Behind the log end (a backlog, a replay), flushes wait for size
                    # (live.flush_events): the commit thread then treats them as backlog
                    # and detects several together, as tail does when it reads a file
                    # faster than the interval. Interval flushes here would run the
                    # detectors once per ~1 s of reading, over the whole window each time.
                    deferred = False
                    if self.lp.due():
                        if (self.lp.pending_lines >= self.lp.live.flush_events
                                or not self._behind(n)):
                            self.lp.flush(wait=False)
                        else:
                            deferred = True
                    if not recs and not self._behind(0):
                        # Truly caught up (an empty poll mid-backlog only means the
                        # next fetch is still on its way): commit what is queued now.
                        self.lp.caught_up()
                self._commit_noted()
                if n or (not got_any and self.assigned):
                    # Idle time counts from the first message, or from the assignment
                    # when there is nothing (left) to read.
                    last_msg = time.monotonic()
                    got_any = True
                if self.on_poll is not None:
                    self.on_poll()
                now = time.monotonic()
                if max_seconds is not None and now - started >= max_seconds:
                    break
                if (
                    idle_exit_s is not None
                    and got_any
                    and now - last_msg >= idle_exit_s
                    and self.lp.pending_lines == 0
                ):
                    break
        finally:
            with self.lock:
                self.lp.flush(wait=True)
            with self._noted_lock:
                self._noted.clear()
            offsets = {
                tp: OffsetAndMetadata(self.stored[partition_fp(tp.topic, tp.partition)], "", -1)
                for tp in self.assigned
                if partition_fp(tp.topic, tp.partition) in self.stored
            }
            if offsets:
                try:
                    self.consumer.commit(offsets, timeout_ms=5000)
                    self.counters["commits"] += 1
                except Exception as exc:
                    self.note_commit_error(exc)

    def close(self) -> None:
        """Leave the group (the revoke listener flushes and commits)."""
        try:
            self.consumer.close()
        except Exception as exc:
            log.info("consumer close: %s", exc)


# --------------------------------------------------------------------------- producer side
def message_key(line: bytes) -> bytes | None:
    """The Kafka key for a log line: its caller id, else its session id, else None.

    Top-level fields under any alias of docs/log-format.md (``caller_id``, ``callerId``,
    ``user_id``, ... then ``session_id``, ``sessionId``, ...). Keying by caller keeps a
    caller on one partition, hence on one ``toolwatch kafka`` member. A line that is not a
    JSON object, or has neither field, gets no key (the producer spreads those).
    """
    from toolwatch.ingest.aliases import ALIASES

    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    for field in ("caller_id", "session_id"):
        for name in ALIASES[field]:
            v = obj.get(name)
            if isinstance(v, str) and v:
                return v.encode()
            if isinstance(v, int) and not isinstance(v, bool):
                return str(v).encode()
    return None


def forward_lines(stream: BinaryIO, producer: Any, topic: str,
                  tee: BinaryIO | None = None) -> int:
    """Send every non-empty line of ``stream`` to ``topic``, keyed by :func:`message_key`.

    ``tee`` also gets each line as read (so a server's stderr still reaches its log).
    Returns the number of messages sent; the producer is flushed at the end of the stream.
    """
    n = 0
    for raw in stream:
        if tee is not None:
            tee.write(raw)
        line = raw.rstrip(b"\r\n")
        if not line:
            continue
        producer.send(topic, key=message_key(line), value=line)
        n += 1
    producer.flush()
    if tee is not None:
        tee.flush()
    return n


def forward_main(argv: list[str] | None = None) -> int:
    """``python -m toolwatch.ingest.sources.kafka -b HOST:PORT -t TOPIC``: stdin lines to Kafka.

    For an MCP server that logs JSON lines to stderr::

        python my_server.py 2> >(python -m toolwatch.ingest.sources.kafka -b kafka:9092 -t mcp-logs)
    """
    import argparse
    import sys

    from kafka import KafkaProducer

    p = argparse.ArgumentParser(prog="python -m toolwatch.ingest.sources.kafka",
                                description="Forward JSON log lines from stdin to Kafka, "
                                "keyed by caller id (else session id).")
    p.add_argument("-b", "--bootstrap-servers", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("--compression", default="zstd",
                   choices=["none", "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--linger-ms", type=int, default=50)
    p.add_argument("--tee", action="store_true", help="also copy the lines to stderr")
    a = p.parse_args(argv)
    prod = KafkaProducer(bootstrap_servers=a.bootstrap_servers.split(","),
                         linger_ms=a.linger_ms,
                         compression_type=None if a.compression == "none" else a.compression)
    try:
        forward_lines(sys.stdin.buffer, prod, a.topic, sys.stderr.buffer if a.tee else None)
    finally:
        prod.close(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(forward_main())
