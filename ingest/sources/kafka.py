"""Source ``kafka``: a kafka-python consumer-group member feeding live mode.

The source contract
    :class:`KafkaSource` is a :class:`~toolwatch.ingest.sources.base.LiveSource` run by the
    live driver; it never touches the live pipeline. ``poll(timeout)`` is one
    ``consumer.poll``: one Arrow batch per partition (:func:`message_batch`, from record
    batches decoded whole by the chunk decoder) and a ``StreamsStarted`` for newly
    assigned partitions (the driver warms their window up). ``ack(checkpoints)`` (after
    the store commit, on the driver thread, which is the poll thread) notes the offsets;
    the next ``poll`` commits them. ``behind()`` tells a backlog; ``counters``:
    ``processed`` (messages handed on), ``dropped`` (redelivered below what the store
    holds), ``rejected`` (always 0: the source parses nothing) and the Kafka extras
    (``prefetches``: fetches sent right after a poll, while the driver works);
    ``status()`` the lag per partition and its growth warning.

Delivery semantics
    * Stream identity of a partition: ``source_fp = "kafka:<topic>:<partition>"``; the
      message offset is the line offset, so event ids (``<fp>:<offset>``) are stable
      across redeliveries; the checkpoint is ``last offset + 1``.
    * The **store is the source of truth**: events, alerts and the partition checkpoints
      are committed in one atomic store batch. On every assignment the consumer seeks
      each partition to the store's checkpoint (or to the group's committed offset when
      that is ahead: another machine's store holds those messages), so messages
      redelivered after a crash, a kill -9 or a rebalance are skipped, never stored
      twice. Messages below the stored offset that still arrive are dropped and counted.
    * Kafka offsets are committed (auto-commit off) only *after* the store commit that
      covers them — they give lag/visibility to Kafka tooling and a starting point for a
      store that has no checkpoint yet.

Rebalances
    kafka-python 3 runs rebalance callbacks on its network thread (synchronously inside
    ``poll()``/``close()``, while the driver thread waits), where a blocking ``commit()``
    is refused, so the listener is an :class:`AsyncConsumerRebalanceListener`. On revoke
    it hands ``StreamsEnded(fps, sync=True)`` to the driver's control (finalize, flush,
    wait for the store commit, acknowledge), awaits the Kafka commit of those offsets,
    then ``StreamsRevoked(fps)`` (the driver forgets their state); on loss (forced
    eviction) ``StreamsRevoked(fps, discard_pending=True)`` without committing (the new
    owner re-reads them from the store's checkpoint); on assignment it reads the group's
    committed offsets (awaited, before any fetch) and seeks each partition once.

Errors, as the library documents them
    ``CommitFailedError`` ("the group has already rebalanced and assigned the partitions
    to another member"): the data is already in the store and the new owner seeks to the
    store checkpoint; logged and counted, nothing to redo. ``RebalanceInProgressError``:
    the next ``poll()`` rejoins; the commit is retried with the next flush (it covers the
    newer offsets). Both are counted in ``toolwatch status``.

Message key
    Produce with key = caller id (or session id): Kafka's default partitioner keeps one
    key on one partition, hence on one consumer, so per-caller windows are complete on
    that consumer even with many instances in the group. See docs/live.md; the producer
    is :mod:`toolwatch.kafka_forward`.

The record decoder patched into kafka-python is :mod:`toolwatch.ingest.sources.kafka_records`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.base import (
    Item,
    LiveSource,
    SourceControl,
    StreamsEnded,
    StreamsRevoked,
    StreamsStarted,
)
from toolwatch.ingest.sources.kafka_records import RecordChunk, install_fast_records

if TYPE_CHECKING:  # the store (DuckDB) is only handed in
    from toolwatch.store import Checkpoint, Store

log = logging.getLogger("toolwatch.kafka")


class _SlowIoSteps(logging.Filter):
    """Counts kafka-python's "Task ... ran for 0.1xs (>0.100s threshold)" warnings instead
    of printing them.

    kafka-python 3 warns when one step of its IO thread takes over 0.1 s of wall time,
    as a sign of a coroutine stuck in a loop. In a live process the step was waiting for
    the GIL while the parse and the detection ran: under load that printed a warning
    every few seconds, telling an on-call reader that the consumer hangs when it does
    not. The count is in the source's status (``io_slow_steps``).
    """

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if record.levelno == logging.WARNING and msg.startswith("Task ") and (
                "threshold" in msg):
            _SlowIoSteps.count += 1
            return False
        return True


_SLOW_IO_STEPS = _SlowIoSteps()
logging.getLogger("kafka.net.selector").addFilter(_SLOW_IO_STEPS)


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


def message_count(msgs: list[Any]) -> int:
    """Messages in a poll's list for one partition (chunks or plain records)."""
    if msgs and type(msgs[0].value) is RecordChunk:
        return sum(len(m.value.offsets) for m in msgs)
    return len(msgs)


def message_batch(tp: TopicPartition, msgs: list[Any], floor: int) -> RawBatch:
    """One Arrow batch from the messages of one partition, skipping offsets below ``floor``.

    Chunk-decoded records (:class:`RecordChunk`) are concatenated with numpy; plain
    ``ConsumerRecord`` s become one such chunk (the only per-message Python work is
    collecting each value and its offset). The values share ONE buffer and the offsets
    of the binary array are a cumulative sum of their lengths, as the file source's
    batches share their read buffer. A tombstone (null value) becomes an empty line
    (quarantined as such).
    """
    if msgs and type(msgs[0].value) is RecordChunk:
        chunks = [m.value for m in msgs]
    else:
        values = [b"" if m.value is None else m.value for m in msgs]
        n = len(values)
        first, last = (msgs[0].offset, msgs[-1].offset) if n else (0, -1)
        if last - first == n - 1:  # contiguous (no compaction gaps, no txn markers)
            offsets = np.arange(first, last + 1, dtype=np.int64)
        else:
            offsets = np.fromiter((m.offset for m in msgs), dtype=np.int64, count=n)
        lens = np.fromiter(map(len, values), dtype=np.int64, count=n)
        chunks = [RecordChunk(b"".join(values), lens, offsets)]
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


def prefetcher(consumer: KafkaConsumer) -> Any:
    """``consumer``'s fetcher method that sends the next fetch requests, or None.

    None when the kafka-python in use is not laid out as expected (another major
    version): polling then works as kafka-python does it, without the pipelined fetch.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    send = getattr(fetcher, "send_fetches", None)
    return send if callable(send) and hasattr(fetcher, "fetch_records") else None


#: glibc ``mallopt`` parameter number of ``M_MMAP_THRESHOLD``.
#: Allocations of at least this many bytes get pages of their own (:func:`tune_fetch_malloc`).
FETCH_MMAP_THRESHOLD = 256 << 10


def tune_fetch_malloc(threshold: int = FETCH_MMAP_THRESHOLD) -> bool:
    """Give a consumer's multi-megabyte fetch buffers pages of their own (glibc only).

    Every poll of a backlog goes through several buffers of a whole fetch answer (~5 MiB
    of messages): kafka-python's receive buffer and the decoded records field, a copy of
    each record batch, the joined values. They are Python ``bytes``/``bytearray``, i.e.
    glibc ``malloc``. glibc's *dynamic* mmap threshold rises to the size of the largest
    mmapped block freed (up to 32 MiB), so after the first poll these buffers are carved
    from the heap instead, and their freed pages stay resident until the next
    ``malloc_trim`` (``toolwatch.allocator``: every 5 s). Sampled every 50 ms, a consumer with
    detection held 30-60 MiB of such free heap at its peaks (``tail`` of the same events:
    15-30). A fixed threshold keeps them mmapped: freeing one returns its pages at once
    (docs/kafka-notes.md, "Throughput", Memory).

    Skipped when ``MALLOC_MMAP_THRESHOLD_`` is set (the user's choice), when
    ``TOOLWATCH_MEMORY_TUNING=0``, and where the C library is not glibc. Process-wide: call
    it from the process that consumes (``toolwatch kafka``), not from a library user's.

    Returns
    -------
    bool
        Whether the threshold was set.
    """
    from toolwatch.allocator import fix_mmap_threshold

    return fix_mmap_threshold(threshold)


#: ``live.flush_events``'s default (:class:`toolwatch.live.config.LiveConfig`; kept equal by
#: a test): a source is below the live engine and gets the configured value as an argument.
DEFAULT_FLUSH_EVENTS = 10_000


class _Listener(AsyncConsumerRebalanceListener):
    """Rebalance callbacks (kafka-python's IO thread, inside ``poll()``/``close()``)."""

    def __init__(self, owner: KafkaSource):
        self.owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        futures = self.owner.handle_revoked(set(revoked))
        for fut in futures:
            try:
                await fut
            except KafkaError as exc:  # CommitFailed, RebalanceInProgress, ...
                self.owner.note_commit_error(exc)
        self.owner.release(set(revoked))

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


class KafkaSource(LiveSource):
    """Consume topics as a consumer-group member: the ``kafka`` live source.

    Runs under the live driver (:func:`toolwatch.live.driver.drive`) like every live
    source: :meth:`poll` returns one Arrow batch per partition per poll (record batches
    decoded by the chunk decoder, no object per message) and a :class:`StreamsStarted`
    for newly assigned partitions; :meth:`ack` notes the offsets a store commit covers
    and the next :meth:`poll` commits them to Kafka (``commit_async``, once per store
    commit; ``KafkaConsumer`` is not thread-safe, and acknowledgements arrive on the
    driver's thread, which is also the poll thread). Rebalances reach the driver through
    :attr:`control` (see the module docstring): revoked partitions are ended with a
    synchronous flush, committed, then released (``StreamsRevoked``); lost partitions
    are released with their unflushed lines discarded.

    Parameters
    ----------
    bootstrap_servers
        ``host:port[,host:port…]``.
    topics
        Topics to subscribe to.
    group_id
        Consumer group.
    store
        The store: its checkpoints are where an assigned partition resumes (source of
        truth); nothing is written to it from here.
    consumer_options
        Extra :class:`kafka.KafkaConsumer` settings (e.g. ``max_poll_interval_ms``,
        ``session_timeout_ms``, security settings). Auto-commit is always off.
    max_poll_records
        Records per poll (with the chunk decoder: record batches per poll).
    fast_records
        Decode fetched record batches with the chunk decoder
        (:func:`install_fast_records`); False: kafka-python's own records.
    flush_events
        A lag of this many messages counts as a backlog (:meth:`behind`): the caller
        passes ``live.flush_events`` (None: that setting's default).
    lag_warn_s
        Lag growth (seconds) after which :meth:`status` warns (0: never); the caller
        passes ``live.kafka_lag_warn_s``.
    """

    name = "kafka"
    blocking = True
    #: True: the driver parses and transforms a micro-batch on a thread of its own while
    #: this source decodes the next polls (the pipeline's ``transform_ahead``). Off: on a
    #: shared 2-core host it measured more CPU per message and no gain (docs/kafka-notes.md,
    #: item 11); ``bench_kafka.py --modes c-ahead,d-ahead`` measures it again.
    transform_ahead = False

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topics: list[str],
        group_id: str,
        store: Store,
        consumer_options: dict[str, Any] | None = None,
        max_poll_records: int | None = None,
        fast_records: bool = True,
        flush_events: int | None = None,
        lag_warn_s: float = 0.0,
    ):
        super().__init__()
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
        #: Sends the next fetch requests right after a poll returned records (None:
        #: kafka-python's internals differ; the next poll sends them, as before).
        self._prefetch = prefetcher(self.consumer)
        self.counters.extra["prefetches"] = 0
        self.lag_warn_s = float(lag_warn_s)
        self.flush_events = DEFAULT_FLUSH_EVENTS if flush_events is None else int(flush_events)
        self.stored: dict[str, int] = {}  # fp -> offset the store holds up to
        self._noted: dict[str, int] = {}  # fp -> stored offset not yet committed to Kafka
        self.assigned: set[TopicPartition] = set()
        self._to_warm: set[str] = set()
        self._check_committed: set[TopicPartition] = set()
        self._last_got = 0
        self.counters.extra.update({
            "commits": 0,
            "commit_failed": 0,
            "rebalance_in_progress": 0,
            "revocations": 0,
            "assignments": 0,
            "lost": 0,
            "lag_warnings": 0,
            "skipped_to_committed": 0,
        })
        self.lag_watch = LagWatch()
        #: ``time.perf_counter()`` when the first message arrived (benchmarks).
        self.first_message_at_perf: float | None = None
        self._subscribed = False
        self._ever_assigned = False
        self._rebalancing = False  # revoked, not assigned again yet

    def open(self, control: SourceControl) -> None:
        """Take the driver's control, then join the group (callbacks need the control)."""
        super().open(control)
        if not self._subscribed:
            self.consumer.subscribe(topics=self.topics, listener=_Listener(self))
            self._subscribed = True

    # ------------------------------------------------------------------ contract
    def poll(self, timeout: float) -> list[Item]:
        """One ``consumer.poll``: a batch per partition, after any :class:`StreamsStarted`.

        Commits (asynchronously) what the store holds and Kafka does not yet first, so
        the offsets trail the store by one poll at most. A poll that returned records
        sends the next fetch requests before returning (:meth:`_send_next_fetch`).
        """
        self._commit_noted()
        try:
            recs = self.consumer.poll(timeout_ms=max(0, int(timeout * 1000)),
                                      max_records=self.max_poll_records)
        except (CommitFailedError, RebalanceInProgressError) as exc:
            self.note_commit_error(exc)
            return []
        if recs:
            if self.first_message_at_perf is None:
                self.first_message_at_perf = time.perf_counter()
            self._send_next_fetch()
        if self._check_committed:
            self._skip_to_committed()
        out: list[Item] = []
        if self._to_warm:
            out.append(StreamsStarted(tuple(sorted(self._to_warm))))
            self._to_warm = set()
        got = 0
        for tp, msgs in recs.items():
            fp = partition_fp(tp.topic, tp.partition)
            batch = message_batch(tp, msgs, self.stored.get(fp, 0))
            n, total = len(batch), message_count(msgs)
            got += total
            self.counters.dropped += total - n  # redelivered below what the store holds
            if n:
                self.counters.processed += n
                out.append(batch)
        self._last_got = got
        return out

    def _send_next_fetch(self) -> None:
        """Pipeline: request the next records while the driver parses these ones.

        kafka-python 3.0's ``poll()`` sends fetch requests only before it waits, so a
        consumer that polls, then works, then polls again waits one whole fetch round trip
        per poll (the broker's response time plus its decoding on the IO thread). Sent
        here, the response arrives while the driver transforms and flushes, and the next
        ``poll()`` finds it buffered. Only partitions without buffered data or a fetch
        in flight are requested (kafka-python's own rule), and a response for a partition
        that was seeked or revoked meanwhile is discarded by kafka-python as stale.
        """
        if self._prefetch is None:
            return
        try:
            if self._prefetch():
                self.counters.extra["prefetches"] += 1
        except KafkaError as exc:  # the next poll() sends them again
            log.debug("pipelined fetch not sent: %s", exc)

    def ack(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Note the offsets a store commit covers; :meth:`poll` commits them to Kafka."""
        for c in checkpoints:
            if _tp_of(c.source_fp) is None:
                continue
            self.stored[c.source_fp] = max(self.stored.get(c.source_fp, 0), c.end_offset)
            self._noted[c.source_fp] = max(self._noted.get(c.source_fp, 0), c.end_offset)

    def behind(self) -> bool:
        """Whether a micro-batch's worth is still waiting beyond the last poll.

        A poll of at least :attr:`flush_events` messages (a whole fetch answer: real
        time brings far fewer per poll), or a lag of at least that many: waiting for
        size then fills the micro-batch within a few polls. A smaller lag after a small
        poll (messages fetched ahead, a trickle) is not a backlog, so the flush interval
        keeps latency low. The poll rule keeps a backlog's last full fetch answers a
        backlog until a poll comes back short: its end is then detected once (as
        ``tail`` does), not once when the lag drops below a micro-batch and again for
        the last messages.
        """
        if self._last_got >= min(self.max_poll_records, self.flush_events):
            return True
        return sum(self.lag().values()) >= self.flush_events

    def idle_ok(self) -> bool:
        """Idle exit only once partitions were assigned, and never mid-rebalance.

        The group join takes seconds: idle time counts from the assignment (its
        ``StreamsStarted`` is activity). A member that leaves between its revocation and
        its next assignment leaves during the join/sync round; Tansu 0.6.0 then wedges
        the group (every later SyncGroup fails with REBALANCE_IN_PROGRESS, see
        docs/kafka-notes.md), so an idle exit waits for the round to end.
        """
        return self._ever_assigned and not self._rebalancing

    def leads_entities(self) -> bool:
        """Whether this member runs the group's entity pass: it owns partition 0 of the
        first topic (one member at a time; a rebalance moves the role with it)."""
        first = min(self.topics)
        return not self._rebalancing and any(
            tp.topic == first and tp.partition == 0 for tp in self.assigned)

    def status(self) -> dict[str, Any]:
        """``lag`` (with the growth warning) and the assigned partitions."""
        lag = self.lag()
        self.counters.extra["io_slow_steps"] = _SlowIoSteps.count
        return {
            "lag": self.watch_lag(lag, self.lag_warn_s),
            "sources": {
                "partitions": sorted(f"{tp.topic}/{tp.partition}" for tp in self.assigned),
                "lag_by_partition": lag,
            },
        }

    def close(self) -> None:
        """Commit what the store holds, then leave the group (idempotent).

        Leaving runs the revoke listener: the driver flushes what is still pending
        (the pipeline is closed after the source), and those offsets are committed too.
        """
        if self._closed:
            return
        self._closed = True
        offsets = {
            tp: OffsetAndMetadata(self.stored[partition_fp(tp.topic, tp.partition)], "", -1)
            for tp in self.assigned
            if partition_fp(tp.topic, tp.partition) in self.stored
        }
        self._noted.clear()
        if offsets:
            try:
                self.consumer.commit(offsets, timeout_ms=5000)
                self.counters.extra["commits"] += 1
            except Exception as exc:
                self.note_commit_error(exc)
        try:
            self.consumer.close()
        except Exception as exc:
            log.info("consumer close: %s", exc)

    # ------------------------------------------------------------------ commits
    def _commit_noted(self) -> list[Any]:
        """Commit (asynchronously) the offsets the store holds and Kafka does not yet.

        One commit per store commit at most, whatever the number of messages: the Kafka
        offsets trail the store, which stays the source of truth.
        """
        if not self._noted:
            return []
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for fp, end in self._noted.items():
            tp = _tp_of(fp)
            if tp is not None and tp in self.assigned:
                offsets[tp] = OffsetAndMetadata(end, "", -1)
        self._noted = {}
        if not offsets:
            return []
        try:
            fut = self.consumer.commit_async(offsets, callback=self._commit_done)
        except KafkaError as exc:
            self.note_commit_error(exc)
            return []
        return [fut]

    def _commit_done(self, offsets: Any, response: Any) -> None:
        if isinstance(response, Exception):
            self.note_commit_error(response)
        else:
            self.counters.extra["commits"] += 1

    def note_commit_error(self, exc: BaseException) -> None:
        """Count a failed Kafka commit (the store already holds the data)."""
        if isinstance(exc, RebalanceInProgressError):
            self.counters.extra["rebalance_in_progress"] += 1
            log.info("offset commit during a rebalance; retried with the next flush")
        else:
            self.counters.extra["commit_failed"] += 1
            log.info("offset commit failed (%s); the store holds the data", exc)

    # ------------------------------------------------------------------ rebalances
    def handle_revoked(self, revoked: set[TopicPartition]) -> list[Any]:
        """End the revoked partitions' streams, store everything read, commit it.

        Inside ``poll()``/``close()``: the synchronous :class:`StreamsEnded` makes the
        driver flush and wait for the store commit (acknowledged to :meth:`ack`) before
        the partitions are released, so the next owner's seek to the store checkpoint
        sees all of it. Returns the commit futures (the listener awaits them, then calls
        :meth:`release`).
        """
        self.counters.extra["revocations"] += 1
        self._rebalancing = not self._closed  # close() revokes too: no round follows
        fps = tuple(sorted(partition_fp(tp.topic, tp.partition) for tp in revoked))
        if fps:
            self.control.handle(StreamsEnded(fps, sync=True))
        return self._commit_noted()

    def release(self, tps: set[TopicPartition]) -> None:
        """Revoked and committed: the driver forgets the partitions' streams."""
        fps = tuple(sorted(partition_fp(tp.topic, tp.partition) for tp in tps))
        if fps:
            self.control.handle(StreamsRevoked(fps))
        self._drop(tps)

    def handle_lost(self, lost: set[TopicPartition]) -> None:
        """Forced eviction: the driver discards their unflushed lines and state."""
        self.counters.extra["lost"] += 1
        fps = tuple(sorted(partition_fp(tp.topic, tp.partition) for tp in lost))
        if fps:
            self.control.handle(StreamsRevoked(fps, discard_pending=True))
        self._drop(lost)

    def _drop(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            fp = partition_fp(tp.topic, tp.partition)
            self.stored.pop(fp, None)
            self._noted.pop(fp, None)
            self._to_warm.discard(fp)
        self._check_committed -= tps
        self.assigned -= tps

    # ------------------------------------------------------------------ positions
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
        self.counters.extra["assignments"] += 1
        self._ever_assigned = self._ever_assigned or bool(assigned)
        self._rebalancing = False
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
                    self.counters.extra["skipped_to_committed"] += 1
                    target = committed[tp]
                self.consumer.seek(tp, target)
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
            floor = self.stored.get(fp)
            if committed is None or floor is None or committed <= floor:
                continue
            self.stored[fp] = committed
            log.info("%s: Kafka commit %d ahead of this store's checkpoint %d; resuming there",
                     tp, committed, floor)
            self.counters.extra["skipped_to_committed"] += 1
            # The assigning poll may already have returned records past the commit (they
            # are kept: the new floor only drops those below it). Seeking back to the
            # commit would fetch them a second time, before the store commit that raises
            # the floor past them: seek only forward of what this member already read.
            pos = self._position(tp)
            if pos is None or pos < committed:
                self.consumer.seek(tp, committed)

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
            self.counters.extra["lag_warnings"] += 1
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
