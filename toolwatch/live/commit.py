"""The commit thread: detect and commit transformed micro-batches in order, atomically."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from toolwatch import schema
from toolwatch.codepages import CODE_PAGES, STORE_CODE
from toolwatch.detectors.stream import _US
from toolwatch.live.config import LiveConfig
from toolwatch.live.memgate import MemoryGate, release_memory
from toolwatch.store import LIVE_PAGE_BYTES, LIVE_ROW_GROUP_ROWS, Checkpoint

log = logging.getLogger("toolwatch.live")

#: Default bound of the commit thread's queue (``live.max_queued_events = 0``): this many
#: times ``flush_events`` transformed events (4 or 8 measured the same throughput and peak
#: RSS; the smaller bound wins).
_QUEUE_FACTOR = 4


def queue_bound(live: LiveConfig) -> int:
    """Most transformed events queued for the commit thread (``live.max_queued_events``)."""
    return live.max_queued_events or live.flush_events * _QUEUE_FACTOR


@dataclass
class FlushResult:
    """What one flush stored and emitted."""

    lines: int = 0
    events: int = 0
    alerts: pl.DataFrame | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    #: Rows the store committed (rows a replay had already stored are not counted).
    stored: int = 0
    seconds: float = 0.0


@dataclass
class _Job:
    """One transformed micro-batch waiting for detection and its commit."""

    events: pa.Table
    summaries: pa.Table
    quarantine: pa.Table
    checkpoints: list[Checkpoint]
    lines: int
    lines_read: int
    quarantined: dict[str, int]
    #: Flushed by size (lines arrive faster than micro-batches), not by the interval.
    backlog: bool = False
    created: float = field(default_factory=time.monotonic)


@dataclass
class _Detected:
    """Micro-batches detected and waiting for their store commit (then their alerts)."""

    jobs: list[_Job]
    tables: dict[str, pa.Table]
    res: FlushResult
    t0: float
    defer: bool
    backlog: bool



def _concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return pa.Table.from_batches([], schema=sch)  # Schema.empty_table imports pandas
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables([t.cast(sch) for t in tables])


_GATE_LOCK = threading.Lock()


class CommitMixin:
    """The commit thread of a :class:`~toolwatch.live.pipeline.LivePipeline`."""

    @property
    def memory_gate(self) -> MemoryGate:
        """The process's gate of heavy phases (``live.memory_gate_mib``; created on use)."""
        gate: MemoryGate | None = self.__dict__.get("_memory_gate")
        if gate is None:
            with _GATE_LOCK:
                gate = self.__dict__.get("_memory_gate")
                if gate is None:
                    gate = MemoryGate(self.live.memory_gate_mib, release=release_memory,
                                      on_start=CODE_PAGES.drop)
                    self.__dict__["_memory_gate"] = gate
        return gate

    def _parse_gate(self, lines: int) -> AbstractContextManager[None]:
        """The memory gate around the reader's parse of ``lines`` lines.

        Only a backlog's parse takes part (more than 1.5 x ``flush_events`` lines: a
        tail reads 4 MiB, ~18k lines, at once): a real-time micro-batch (~``flush_events``
        lines, +25-35 MiB) never waits for a detection, so the gate adds no alert latency
        when the source keeps up.
        """
        if lines * 2 > self.live.flush_events * 3:
            return self.memory_gate.hold("parse")
        return nullcontext()

    def _enqueue(self, job: _Job) -> None:
        """Hand a transformed micro-batch to the commit thread (blocks while it is full)."""
        cap = queue_bound(self.live)
        with self._cv:
            # Back-pressure: transformed rows waiting for the commit thread are bounded.
            while self._queued_events >= cap and self._worker_error is None:
                self._cv.wait()
            self._raise_worker_error()
            self._queue.append(job)
            self._queued_events += max(1, job.events.num_rows)
            if not job.backlog:
                self._urgent = True
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="toolwatch-commit", daemon=True
                )
                self._worker.start()
            self._cv.notify_all()

    def _ready(self) -> float:
        """0 when the queue should be committed now, else how long to wait at most.

        Detection costs about the window of the touched entities, whatever the number of
        new events, so under a backlog the commit thread waits until as many events as
        the window holds (at least ``flush_events``, at most the queue bound) have queued
        up, or ``backlog_detect_interval_s`` has passed since the first was queued (the
        window's size measured 8% more throughput than a quarter of it). Lines that
        waited for the flush interval (normal rates), a caught-up source, a drain and a
        stop are committed at once, so the latency at normal rates does not change.
        """
        if not self._queue:
            return float("inf")
        if self._urgent or self._stopping:
            return 0.0
        base = self.live.flush_events
        target = min(queue_bound(self.live), max(base, self.window.size))
        if self._queued_events >= target:
            return 0.0
        age = time.monotonic() - self._queue[0].created
        return max(0.0, self.live.backlog_detect_interval_s - age)

    def _work(self) -> None:
        while True:
            with self._cv:
                while True:
                    wait = self._ready()
                    if wait == 0.0 or (self._stopping and not self._queue):
                        break
                    self._cv.wait(None if wait == float("inf") else wait)
                if not self._queue:
                    break
                # Only a backlog's micro-batches (none flushed by the interval, no
                # caught-up source, drain or stop waiting on them) may defer detection.
                defer = not (self._urgent or self._stopping) and all(
                    j.backlog for j in self._queue
                )
                jobs = list(self._queue)
                self._queue.clear()
                self._queued_events = 0
                self._urgent = False
                self._busy = True
                self._cv.notify_all()
            try:
                self._hand_to_store(self._detect_batch(jobs, defer=defer))
            except BaseException as exc:  # handed to the caller's thread
                log.debug("commit thread stopped", exc_info=True)
                self._fail(exc)
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
                break
            with self._cv:
                self._busy = False
                self._cv.notify_all()
        with self._cv:  # the last batch is stored before the thread ends
            while self._storing:
                self._cv.wait()

    def _hand_to_store(self, batch: _Detected) -> None:
        """Commit ``batch`` on the store thread, after the batch before it.

        The commit thread then detects the next micro-batches while this one is written
        (a live commit is ~20-50 ms of Delta commits and Parquet writing): batches are
        still stored one at a time and in order, and each one's alerts still go to the
        sinks only after its commit.
        """
        with self._cv:
            while self._storing and self._worker_error is None:
                self._cv.wait()
            self._raise_worker_error()
            self._storing = True
            if self._store_pool is None:
                self._store_pool = ThreadPoolExecutor(1, thread_name_prefix="toolwatch-store")
        self._store_pool.submit(self._store_on_thread, batch)

    def _store_on_thread(self, batch: _Detected) -> None:
        try:
            self._store_batch(batch)
        except BaseException as exc:  # handed to the caller's thread, and the commit thread's
            log.debug("store thread stopped", exc_info=True)
            self._fail(exc)
        finally:
            with self._cv:
                self._storing = False
                self._cv.notify_all()

    def _fail(self, exc: BaseException) -> None:
        """Stop on ``exc`` (the first failure is kept): nothing queued is committed after it."""
        with self._cv:
            if self._worker_error is None:
                self._worker_error = exc
            self._queue.clear()  # never commit past a failed batch
            self._cv.notify_all()

    def _raise_worker_error(self) -> None:
        if self._worker_error is not None:
            raise self._worker_error

    def drain(self) -> None:
        """Wait until every queued micro-batch is committed (re-raises its failure)."""
        if self._worker is None:
            return
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            while (self._queue or self._busy or self._storing) and self._worker_error is None:
                self._cv.wait()
        self._raise_worker_error()

    def _stop_worker(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        if self._store_pool is not None:
            self._store_pool.shutdown(wait=True)
            self._store_pool = None
        self._stopping = False

    def _commit(
        self, jobs: list[_Job], t0: float | None = None, *, defer: bool = False,
        backlog: bool = False,
    ) -> FlushResult:
        """Detect over transformed micro-batches, commit them as one batch, then emit.

        ``t0``: when the flush started (synchronous flushes count their transform too).
        ``defer``: backlog micro-batches; their detection may wait for more
        (``live.backlog_detect_events``), they are committed now either way.
        ``backlog``: a size-triggered synchronous flush (detected at once, in
        ``live.backlog_detect_passes`` passes).
        """
        return self._store_batch(self._detect_batch(jobs, t0, defer=defer, backlog=backlog))

    def _detect_batch(
        self, jobs: list[_Job], t0: float | None = None, *, defer: bool = False,
        backlog: bool = False,
    ) -> _Detected:
        """The detection half of :meth:`_commit`: the batch's tables, alerts included."""
        t0 = time.monotonic() if t0 is None else t0
        res = FlushResult()
        if len(jobs) == 1:
            events, summaries, quarantine = jobs[0].events, jobs[0].summaries, jobs[0].quarantine
        else:
            events = _concat([j.events for j in jobs], schema.EVENTS)
            summaries = _concat([j.summaries for j in jobs], schema.SUMMARIES)
            quarantine = _concat([j.quarantine for j in jobs], schema.QUARANTINE)
        # One checkpoint per stream: the last one (micro-batches are in stream order).
        last: dict[str, Checkpoint] = {}
        for j in jobs:
            for cp in j.checkpoints:
                last.pop(cp.source_fp, None)
                last[cp.source_fp] = cp
        res.checkpoints = list(last.values())
        res.lines = sum(j.lines for j in jobs)

        alerts_tbl = None
        new_alerts = None
        td = time.monotonic()
        if self.detector is not None:
            with self.memory_gate.hold("detect"):
                new_alerts = self._detect(events, summaries, defer=defer, backlog=backlog)
            if new_alerts is not None and new_alerts.height:
                alerts_tbl = new_alerts.select(schema.ALERTS.names).to_arrow().cast(
                    schema.ALERTS
                )
        self.status.detect_ms = round((time.monotonic() - td) * 1000, 1)

        tables = {"events": events, "summaries": summaries, "quarantine": quarantine}
        if alerts_tbl is not None:
            tables["alerts"] = alerts_tbl
        res.alerts = new_alerts
        return _Detected(jobs, tables, res, t0, defer, backlog)

    def _store_batch(self, batch: _Detected) -> FlushResult:
        """The store half of :meth:`_commit`: commit, count, emit the alerts, run hooks."""
        jobs, tables, res, t0 = batch.jobs, batch.tables, batch.res, batch.t0
        defer, backlog = batch.defer, batch.backlog
        events, summaries, quarantine = tables["events"], tables["summaries"], \
            tables["quarantine"]
        new_alerts = res.alerts
        if (
            events.num_rows
            or summaries.num_rows
            or quarantine.num_rows
            or res.checkpoints
            or "alerts" in tables
        ):
            # Not gated: in pages of LIVE_PAGE_BYTES a write adds ~5-9 MiB, and the
            # commit thread waiting for the reader's parse costs catch-up speed.
            res.stored = self.store.write_batch(tables, res.checkpoints,
                                               row_group_rows=LIVE_ROW_GROUP_ROWS,
                                               page_bytes=LIVE_PAGE_BYTES)
        res.events = events.num_rows

        c = self.pipe.counters
        c.batches += 1
        c.events_stored += events.num_rows
        c.summaries_stored += summaries.num_rows
        st = self.status
        st.lines_read = jobs[-1].lines_read
        st.events_stored = c.events_stored
        st.summaries_stored = c.summaries_stored
        st.quarantined = jobs[-1].quarantined
        st.flushes += 1
        self.rate.add(events.num_rows)
        st.events_per_s = round(self.rate.rate(), 1)
        st.window_events = self.window.size
        st.window_evicted = self.window.evicted
        st.late_events = self.window.late
        st.active_sessions = self.window.active_sessions()
        gate = self.memory_gate
        if gate.enabled:
            gs = gate.stats
            st.extra["memory_gate_waits"] = gs.waited
            st.extra["memory_gate_wait_s"] = round(gs.wait_s, 3)
            st.extra["memory_gate_overlaps"] = gs.overlapped
            st.extra["memory_gate_wait_s_by_phase"] = {
                k: round(v, 3) for k, v in gs.wait_s_by_phase.items()}
            st.extra["memory_gate_releases"] = gs.releases
            st.extra["memory_gate_release_s"] = round(gs.release_s, 3)
        if CODE_PAGES.enabled:
            cs = CODE_PAGES.stats
            st.extra["code_drops"] = cs.drops
            st.extra["code_drop_s"] = round(cs.seconds, 3)
            st.extra["code_drop_mappings"] = cs.mappings
            st.extra["code_drop_skipped"] = cs.skipped
        if self.window.newest_us is not None:
            st.watermark = datetime.fromtimestamp(self.window.newest_us / _US, UTC).isoformat()
            st.lag["log_time_s"] = round(time.time() - self.window.newest_us / _US, 3)

        if new_alerts is not None and new_alerts.height and self.sinks is not None:
            self.sinks.emit(new_alerts)
        res.seconds = time.monotonic() - t0
        for hook in self.on_commit:
            hook(res)
        if self.sinks is not None:
            st.sinks = self.sinks.counters()
        res.seconds = time.monotonic() - t0
        st.last_flush_ms = round(res.seconds * 1000, 1)
        st.last_flush_at = time.time()
        if len(jobs) == 1 and not self.live.overlap_detection:
            # Synchronous mode: under a backlog (size-triggered flushes that take longer
            # than the interval) the micro-batch grows up to 8x flush_events, amortizing
            # detection over more events; it shrinks back once the pipeline keeps up.
            base = self.live.flush_events
            if res.lines >= self._flush_events and res.seconds > self.live.flush_interval_s:
                self._flush_events = min(self._flush_events * 2, base * 8)
            elif res.lines < self._flush_events // 2:
                self._flush_events = max(base, self._flush_events // 2)
        self._maybe_compact(behind=defer or backlog or any(j.backlog for j in jobs))
        # delta-rs's code runs only while the store is written: unmap the ~50 MiB of its
        # library this commit mapped (toolwatch/codepages.py). After the alerts went
        # out, so the drop (~2.5 ms) is not on their path; the next commit maps the
        # pages back for ~1 ms.
        STORE_CODE.drop()
        return res

    def _empty_job(self) -> _Job:
        """A micro-batch with nothing in it: commits run the detection a backlog deferred."""
        c = self.pipe.counters
        return _Job(
            events=_concat([], schema.EVENTS),
            summaries=_concat([], schema.SUMMARIES),
            quarantine=_concat([], schema.QUARANTINE),
            checkpoints=[],
            lines=0,
            lines_read=c.lines_read,
            quarantined=dict(c.quarantined),
        )

    def _vacuum(self) -> None:
        """Delete files compactions replaced more than ``store.vacuum_hours`` ago."""
        for name in ("events", "quarantine", "summaries", "alerts", "streams"):
            try:
                self.store.vacuum(name)
            except Exception as exc:
                log.warning("vacuum of %s failed: %s", name, exc)

    def _maybe_compact(self, behind: bool = False) -> None:
        """Compact the store's small files, a budget's worth per commit.

        A round over the datasets starts ``compact_interval_s`` after the last one ended;
        each commit does at most ``compact_budget_s`` of its merges and the next commits
        go on where it stopped, so no commit waits for a whole round. ``behind``: the
        commit is a backlog's; then the round waits (up to 4 intervals since the last one
        ended, so a reader that never catches up still compacts): catching up, storing
        and detecting come first, and every file is merged once either way, later.
        """
        iv = self.live.compact_interval_s
        if iv <= 0:
            return
        left = self._compact_left
        since = time.monotonic() - self._last_compact
        if (behind and since < 4 * iv) or (not left and since < iv):
            return
        if not left:
            left.extend(("events", "quarantine", "summaries", "alerts", "streams"))
        t0 = time.monotonic()
        extra = self.status.extra
        try:
            while left:
                budget = max(0.0, self.live.compact_budget_s - (time.monotonic() - t0))
                try:
                    with self.memory_gate.hold("compact"):
                        merges, more = self.store.compact_within(left[0], budget)
                except Exception as exc:
                    log.warning("compaction of %s failed: %s", left[0], exc)
                    merges, more = 0, False
                extra["compact_merges"] = extra.get("compact_merges", 0) + merges
                if more:
                    return  # the budget is spent: the next commit goes on
                left.pop(0)
                if not left:
                    self._last_compact = time.monotonic()  # the round is done
                    self._vacuum()
                elif time.monotonic() - t0 >= self.live.compact_budget_s:
                    return
        finally:
            spent = time.monotonic() - t0
            extra["compact_s"] = round(extra.get("compact_s", 0.0) + spent, 3)
            extra["compact_max_step_s"] = round(max(extra.get("compact_max_step_s", 0.0),
                                                    spent), 3)
