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
from typing import Any

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata

from ingest.records import messages_to_batch
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
        self.owner.handle_assigned(set(assigned))

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
        max_poll_records: int = 10_000,
    ):
        self.lp = lp
        self.store = store
        self.topics = topics
        self.group_id = group_id
        self.max_poll_records = max_poll_records
        opts: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers.split(","),
            "group_id": group_id,
            "client_id": f"toolwatch-{group_id}",
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_poll_records": max_poll_records,
            "fetch_max_bytes": 52_428_800,
            "max_partition_fetch_bytes": 8_388_608,
        }
        opts.update(consumer_options or {})
        opts["enable_auto_commit"] = False
        self.consumer = KafkaConsumer(**opts)
        self.lock = threading.RLock()
        self.stored: dict[str, int] = {}  # fp -> offset the store holds up to
        self.assigned: set[TopicPartition] = set()
        self._to_warm: set[str] = set()
        self.counters: dict[str, int] = {
            "messages": 0,
            "redelivered_skipped": 0,
            "commits": 0,
            "commit_failed": 0,
            "rebalance_in_progress": 0,
            "revocations": 0,
            "assignments": 0,
            "lost": 0,
        }
        self.lp.on_commit.append(self._after_store_commit)
        self.consumer.subscribe(topics=topics, listener=_Listener(self))
        self.on_poll: Callable[[], None] | None = None

    # ------------------------------------------------------------------ callbacks
    def _after_store_commit(self, res: FlushResult) -> list[Any]:
        """Advance in-memory stored offsets and commit them to Kafka (asynchronously)."""
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        for c in res.checkpoints:
            tp = _tp_of(c.source_fp)
            if tp is None:
                continue
            self.stored[c.source_fp] = max(self.stored.get(c.source_fp, 0), c.end_offset)
            if tp in self.assigned:
                offsets[tp] = OffsetAndMetadata(c.end_offset, "", -1)
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
        """Flush everything read so far, commit it, drop the revoked partitions' state."""
        with self.lock:
            self.counters["revocations"] += 1
            futures: list[Any] = []
            hook_results: list[list[Any]] = []

            def capture(res: FlushResult) -> None:
                hook_results.append(self._after_store_commit(res))

            # Run the flush with a capturing hook so the listener can await the commit.
            self.lp.on_commit.remove(self._after_store_commit)
            self.lp.on_commit.append(capture)
            try:
                fps = [partition_fp(tp.topic, tp.partition) for tp in revoked]
                self.lp.finalize_streams(fps)
                self.lp.flush()
            finally:
                self.lp.on_commit.remove(capture)
                self.lp.on_commit.append(self._after_store_commit)
            for r in hook_results:
                futures.extend(r)
            self._drop(revoked)
            return futures

    def handle_lost(self, lost: set[TopicPartition]) -> None:
        """Forced eviction: discard unflushed lines and state of the lost partitions."""
        with self.lock:
            self.counters["lost"] += 1
            self.lp.drop_pending(partition_fp(tp.topic, tp.partition) for tp in lost)
            self._drop(lost)

    def _drop(self, tps: set[TopicPartition]) -> None:
        fps = [partition_fp(tp.topic, tp.partition) for tp in tps]
        self.lp.window.drop_streams(fps)
        for fp in fps:
            self.lp.pipe.pairers.pop(fp, None)
            self.stored.pop(fp, None)
            self._to_warm.discard(fp)
            self.lp.forget_stream(fp)
        self.assigned -= tps

    def handle_assigned(self, assigned: set[TopicPartition]) -> None:
        """Seek every assigned partition to the store's checkpoint (source of truth)."""
        with self.lock:
            self.counters["assignments"] += 1
            self.store.recover()  # roll forward a batch a killed member committed
            cps = self.store.checkpoints()
            for tp in assigned:
                fp = partition_fp(tp.topic, tp.partition)
                if fp in cps:
                    self.consumer.seek(tp, cps[fp])
                    self.stored[fp] = cps[fp]
                self._to_warm.add(fp)
            self.assigned |= assigned

    # ------------------------------------------------------------------ loop
    def _add(self, tp: TopicPartition, msgs: list[Any]) -> int:
        fp = partition_fp(tp.topic, tp.partition)
        floor = self.stored.get(fp, 0)
        fresh = [m for m in msgs if m.offset >= floor]
        self.counters["redelivered_skipped"] += len(msgs) - len(fresh)
        if not fresh:
            return 0
        payloads = [m.value if m.value is not None else b"" for m in fresh]
        offsets = [m.offset for m in fresh]
        batch = messages_to_batch(
            f"kafka:{tp.topic}/{tp.partition}", fp, payloads, offsets, offsets[-1] + 1
        )
        self.lp.add(batch)
        self.counters["messages"] += len(fresh)
        return len(fresh)

    def lag(self) -> dict[str, int]:
        """Messages behind the high watermark, per partition and in total."""
        per: dict[str, int] = {}
        for tp in list(self.assigned):
            try:
                hw = self.consumer.highwater(tp)
                pos = self.consumer.position(tp, timeout_ms=100)
            except Exception as exc:  # lag is informational
                log.debug("lag of %s unknown: %s", tp, exc)
                continue
            if hw is not None and pos is not None:
                per[f"{tp.topic}/{tp.partition}"] = max(0, hw - pos)
        return per

    def run(self, stop: StopFlag, *, idle_exit_s: float | None = None,
            max_seconds: float | None = None, poll_timeout_ms: int = 200) -> None:
        """Poll, buffer and flush until ``stop`` is set (then flush and leave the group).

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
        try:
            while not stop:
                timeout = min(poll_timeout_ms / 1000, self.lp.time_to_due())
                try:
                    recs = self.consumer.poll(
                        timeout_ms=int(timeout * 1000), max_records=self.max_poll_records
                    )
                except (CommitFailedError, RebalanceInProgressError) as exc:
                    self.note_commit_error(exc)
                    continue
                with self.lock:
                    n = 0
                    for tp, msgs in recs.items():
                        n += self._add(tp, msgs)
                    if self._to_warm:
                        warm, self._to_warm = set(self._to_warm), set()
                        self.lp.warm_up(warm)
                    if self.lp.due():
                        self.lp.flush()
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
                self.lp.flush()
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
