"""The live pipeline: buffers batches, transforms them, hands them to the commit thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from toolwatch import schema
from toolwatch.codepages import CODE_PAGES, STORE_CODE
from toolwatch.config import Config
from toolwatch.detectors.stream import ID_COLUMNS, AlertTracker, DetectionWindow, StreamDetector
from toolwatch.ingest import arrays
from toolwatch.ingest.pipeline import BatchOutput, Pipeline
from toolwatch.ingest.records import RawBatch, join_streams
from toolwatch.live.commit import CommitMixin, FlushResult, _concat, _Job
from toolwatch.live.config import LiveConfig
from toolwatch.live.detection import DetectFn, DetectMixin, default_detector
from toolwatch.live.status import LiveStatus, RateMeter
from toolwatch.live.warmup import WarmUpMixin
from toolwatch.store import Checkpoint, Store

log = logging.getLogger("toolwatch.live")


def merge_batches(batches: list[RawBatch]) -> RawBatch:
    """Concatenate consecutive batches of one stream into one (no line copies)."""
    if len(batches) == 1:
        return batches[0]
    first, last = batches[0], batches[-1]
    lines = pa.concat_arrays([b.lines for b in batches])
    offs = np.concatenate([b.offsets for b in batches])
    nos = (
        np.concatenate([b.line_nos for b in batches])  # type: ignore[misc]
        if all(b.line_nos is not None for b in batches)
        else None
    )
    return RawBatch(
        source=last.source,
        source_fp=first.source_fp,
        lines=lines,  # type: ignore[arg-type]
        offsets=offs,
        line_nos=nos,
        end_offset=last.end_offset,
        final=last.final,
    )


#: Quarantine detail of each kind of wrapped-server text.
_SERVER_TEXT_DETAIL = {
    "server_text": "non-JSON line on the server's stderr",
    "untagged_record": "JSON line without a valid record tag on a stream whose records are "
    "tagged: not written by the toolwatch middleware, never an event",
}


class LivePipeline(CommitMixin, DetectMixin, WarmUpMixin):
    """Micro-batching, incremental detection and atomic commits for live sources.

    Parameters
    ----------
    config
        Full configuration (``config.live`` is parsed into :class:`LiveConfig`).
    store
        Destination store (the source of truth for checkpoints and alerts).
    kind
        ``tail``, ``run``, ``kafka`` or ``follow`` — names the status file.
    name
        Human-readable name of what is followed.
    sinks
        Alert sinks (:class:`toolwatch.live.sinks.SinkSet`); ``None``: store only.
    detector
        Detection function ``(events, summaries) -> alerts``; default: the detectors
        package (absent: detection off). Tests inject simple rules here.
    live
        Pre-parsed live settings (default: from ``config``).
    """

    def __init__(
        self,
        config: Config,
        store: Store,
        *,
        kind: str = "tail",
        name: str = "",
        sinks: Any = None,
        detector: DetectFn | None = None,
        live: LiveConfig | None = None,
    ):
        self.config = config
        self.live = live or LiveConfig.from_config(config)
        # The process's code-page dropper: the memory gate's phases and the periodic
        # trimmer call it (toolwatch/codepages.py).
        CODE_PAGES.enabled = self.live.drop_code_pages
        # ...and the store library's, which each commit drops once done (commit.py).
        STORE_CODE.enabled = self.live.drop_code_pages
        self.store = store
        self.pipe = Pipeline(config, store)
        self.sinks = sinks
        if sinks is not None and hasattr(sinks, "bind"):
            sinks.bind(config)  # incident notifications roll up as the store's view does
        retention = self.live.window_minutes
        if detector is None and self.live.detect:
            detector, det_retention = default_detector(config)
            if detector is None:
                log.warning("detectors package unavailable: live detection is off")
            retention = retention or det_retention
        detector = detector if self.live.detect else None
        # The detection engine's streaming state (detector, window, tracker); the
        # DetectMixin decides when it runs and how much it reads.
        self.engine = StreamDetector(detector, DetectionWindow(
            retention or 60.0,
            self.live.session_idle_minutes,
            self.live.out_of_order_tolerance_s,
            self.live.max_window_events,
            # Without detection the window only holds warmed-up rows: no need to import
            # the detectors (and scikit-learn) just to learn their columns.
            columns=None if detector is not None else ID_COLUMNS,
        ), AlertTracker(self.live.max_tracked_alerts))
        self.detector, self.window, self.tracker = detector, self.engine.window, self.engine.tracker
        self.status = LiveStatus(kind=kind, name=name)
        self.rate = RateMeter()
        self.on_commit: list[Callable[[FlushResult], None]] = []
        self._pending: dict[str, list[RawBatch]] = {}
        self._pending_lines = 0
        self._extra_quarantine: list[pa.Table] = []
        self._first_pending_at: float | None = None
        self._last_compact = time.monotonic()
        #: Datasets the running compaction round has still to go through (commit.py).
        self._compact_left: list[str] = []
        self._warmed: set[str] = set()
        self._history_base: pl.DataFrame | None = None
        # Under a backlog (size-triggered flushes that take longer than the interval) the
        # micro-batch grows up to 8x flush_events, amortizing detection over more events;
        # it shrinks back once the pipeline keeps up. Latency is unaffected when caught up.
        self._flush_events = self.live.flush_events
        self._history_loaded = False
        self._last_backlog = False  # the last micro-batch handed over was a backlog's
        #: flush(wait=False) parses and transforms on a thread of its own (one micro-batch
        #: at a time, in order) while the caller reads on; the driver turns it on for
        #: sources whose reading costs CPU of its own (Kafka's record decoding).
        self.transform_ahead = False
        self._xform: ThreadPoolExecutor | None = None
        self._xform_future: Future[None] | None = None
        # Commit thread (flush(wait=False)): transformed micro-batches queue here, in
        # order; the thread detects and commits whatever is queued when it gets free.
        self._cv = threading.Condition()
        self._queue: list[_Job] = []
        self._queued_events = 0
        self._busy = False
        # A detected batch is being committed on the store thread (at most one).
        self._storing = False
        self._store_pool: ThreadPoolExecutor | None = None
        self._urgent = False
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._worker_error: BaseException | None = None
        self._load_alert_memory()

    # ------------------------------------------------------------------ input
    def add(self, batch: RawBatch) -> None:
        """Buffer one batch of a stream (flushed by :meth:`flush`)."""
        if len(batch) == 0 and not batch.final and batch.end_offset <= 0:
            return
        self._pending.setdefault(batch.source_fp, []).append(batch)
        self._pending_lines += len(batch)
        if self._first_pending_at is None:
            self._first_pending_at = time.monotonic()

    def add_server_text(
        self,
        source: str,
        source_fp: str,
        lines: list[bytes],
        offsets: list[int],
        line_nos: list[int] | None,
        reason: str = "server_text",
    ) -> None:
        """Keep non-JSON stderr lines of a wrapped server (quarantine, reason ``server_text``;
        ``untagged_record``: a JSON line refused at the trust boundary, toolwatch.spool)."""
        self.status.server_text_lines += len(lines)
        if not lines or not self.live.keep_server_text:
            return
        keep = self.config.ingest.quarantine_raw_chars
        scrub = self.pipe.hasher.scrub_text
        raws = [
            scrub(b.rstrip(b"\r\n")[: keep * 4]).decode("utf-8", "backslashreplace")[:keep]
            for b in lines
        ]
        now = datetime.now(UTC)
        n = len(lines)
        tbl = pa.table(
            {
                "event_id": [f"{source_fp}:{o}" for o in offsets],
                "reason": [reason] * n,
                "detail": [_SERVER_TEXT_DETAIL.get(reason, reason)] * n,
                "source": [source] * n,
                "source_fp": [source_fp] * n,
                "offset": pa.array(offsets, pa.int64()),
                "line_no": pa.array(line_nos if line_nos else [None] * n, pa.int64()),
                "raw": raws,
                "raw_bytes": pa.array([len(b.rstrip(b"\r\n")) for b in lines], pa.int64()),
                "ingested_at": pa.array([now] * n, schema.TS),
            },
            schema=schema.QUARANTINE,
        )
        self._extra_quarantine.append(tbl)
        if self._first_pending_at is None:
            self._first_pending_at = time.monotonic()

    def drop_pending(self, fps: Iterable[str]) -> int:
        """Discard unflushed lines of some streams (Kafka partitions lost); returns lines."""
        n = 0
        for fp in fps:
            dropped = self._pending.pop(fp, None)
            if dropped:
                n += sum(len(b) for b in dropped)
        self._pending_lines -= n
        if not self._pending and not self._extra_quarantine:
            self._first_pending_at = None
        return n

    @property
    def pending_lines(self) -> int:
        """Lines waiting for the next flush."""
        return self._pending_lines

    def _committing(self) -> bool:
        """Whether the commit thread is detecting/committing right now.

        Not merely "something is queued": queued backlog micro-batches may be waiting for
        more, and an interval flush is what tells the commit thread to stop waiting.
        """
        return self._busy

    def caught_up(self) -> None:
        """The source has nothing more to read for now: commit what is queued at once.

        Backlog micro-batches wait to be detected together; once the backlog is read
        there is nothing left to wait for.
        """
        self.settle_transform()  # the micro-batch being transformed is queued first
        if self._queue:
            with self._cv:
                self._urgent = True
                self._cv.notify_all()
        elif self._deferred_touched is not None:
            # Stored backlog micro-batches whose detection waited: detect them now (after
            # the commit running now, if any: not one empty poll later).
            self._enqueue(self._empty_job())

    def backlog_waiting(self) -> bool:
        """Whether backlog micro-batches wait for their detection (queued or stored)."""
        # The last micro-batch handed over, not the queue: the commit thread may hold
        # it right now (taken from the queue, its deferral not yet noted).
        return self._deferred_touched is not None or self._last_backlog

    def due(self, now: float | None = None) -> bool:
        """Whether a flush is due (interval elapsed since the first waiting line, or size).

        While the commit thread is busy, only size makes a flush due: lines keep
        gathering and are parsed once it is free, so the detection that follows includes
        the newest lines instead of queueing a micro-batch that would wait anyway.

        Raises
        ------
        Exception
            The failure that stopped the commit thread, if any.
        """
        # Loops poll this: a failed commit thread stops them even when no data arrives.
        self._raise_worker_error()
        if self._first_pending_at is None:
            return False
        if self._pending_lines >= self._flush_events:
            return True
        if self._committing():
            return False
        now = time.monotonic() if now is None else now
        return now - self._first_pending_at >= self.live.flush_interval_s

    def time_to_due(self) -> float:
        """Seconds until the pending data must be flushed (inf when nothing waits)."""
        if self._first_pending_at is None:
            return float("inf")
        left = max(0.0, self._first_pending_at + self.live.flush_interval_s - time.monotonic())
        # Busy commit thread: look again soon (not a busy loop) rather than at the interval.
        return max(left, 0.02) if self._committing() else left


    # ------------------------------------------------------------------ flush
    def finalize_streams(self, fps: Iterable[str] | None = None) -> None:
        """Mark streams ended: JSON-RPC requests still waiting are emitted unanswered."""
        self.settle_transform()
        for fp in list(self.pipe.pairers if fps is None else fps):
            if fp not in self.pipe.pairers:
                continue
            pend = self._pending.get(fp)
            if pend:
                pend[-1].final = True
            else:
                self.add(
                    RawBatch(
                        source=fp,
                        source_fp=fp,
                        lines=pa.array([], pa.large_binary()),  # type: ignore[arg-type]
                        offsets=np.zeros(0, np.int64),
                        line_nos=None,
                        end_offset=-1,
                        final=True,
                    )
                )

    def flush(self, *, wait: bool = True, behind: bool = True) -> FlushResult:
        """Transform the waiting lines, then detect, commit atomically, emit, run hooks.

        Parameters
        ----------
        wait
            True: everything happens before this returns (the result carries the batch
            id and the alerts). False, with ``live.overlap_detection`` on: the transformed
            micro-batch is queued for the commit thread, which detects and commits it
            while the caller reads and parses the next one; the result then only says
            what was transformed. Queued micro-batches are committed in order, and all
            that wait when the commit thread becomes free are detected together and
            committed as one atomic batch (under a backlog detection runs less often, as
            its cost follows the window, not the new events). Call :meth:`drain` to wait.
        behind
            Whether the source still has lines waiting beyond this flush
            (:meth:`LiveSource.behind`). A size-triggered flush counts as a backlog
            micro-batch (its detection may wait for more) only while behind: the last
            one of a backlog, or a real-time flush that reached ``flush_events``, is
            detected at once (with whatever a backlog left waiting), not after the
            next empty poll.

        Raises
        ------
        Exception
            Whatever stopped the commit thread (re-raised here; nothing after the failed
            batch is committed, so the checkpoints never skip data).
        """
        t0 = time.monotonic()
        # A flush forced by size, not by the interval, means lines arrive faster than
        # micro-batches: a backlog (or a very high rate).
        by_size = self._pending_lines >= self._flush_events
        if not wait and self.live.overlap_detection and self.transform_ahead:
            self.settle_transform()  # one micro-batch in transform at a time, in order
            taken = self._take_pending()
            res = FlushResult()
            if taken is not None:
                backlog = by_size and behind
                self._last_backlog = backlog
                res.lines = taken[2]
                if self._xform is None:
                    self._xform = ThreadPoolExecutor(1, thread_name_prefix="toolwatch-transform")
                self._xform_future = self._xform.submit(self._transform_and_enqueue, taken,
                                                        backlog)
            res.seconds = time.monotonic() - t0
            return res
        self.settle_transform()
        job = self._transform_pending()
        if not wait and self.live.overlap_detection:
            self._raise_worker_error()
            res = FlushResult()
            if job is not None:
                job.backlog = by_size and behind
                self._last_backlog = job.backlog
                res.lines, res.events, res.checkpoints = job.lines, job.events.num_rows, \
                    job.checkpoints
                self._enqueue(job)
            res.seconds = time.monotonic() - t0
            return res
        self.drain()
        if job is None and self._deferred_touched is not None:
            job = self._empty_job()  # detection a backlog deferred runs now
        if job is None:
            return FlushResult()
        return self._commit([job], t0, backlog=by_size)

    def settle_transform(self) -> None:
        """Wait until the micro-batch being transformed ahead (if any) is queued.

        Called before anything that reads or changes the transforms' state (pairers,
        sessionizer, counters) on the caller's thread, and before a drain.

        Raises
        ------
        Exception
            The failure of that transform (or of the commit thread).
        """
        fut, self._xform_future = self._xform_future, None
        if fut is not None:
            fut.result()
        self._raise_worker_error()

    def drain(self) -> None:
        """Wait until every micro-batch is transformed and committed (re-raises failures)."""
        self.settle_transform()
        super().drain()

    def _transform_and_enqueue(self, taken: tuple[dict[str, list[RawBatch]],
                                                  list[pa.Table], int], backlog: bool) -> None:
        """Transform thread: transform a micro-batch and queue it for the commit thread."""
        try:
            job = self._transform_taken(*taken)
            if job is not None:
                job.backlog = backlog
                self._enqueue(job)
        except BaseException as exc:  # handed to the caller's thread, as a commit failure
            log.debug("transform thread failed", exc_info=True)
            with self._cv:
                if self._worker_error is None:
                    self._worker_error = exc
                self._cv.notify_all()

    def _take_pending(self) -> tuple[dict[str, list[RawBatch]], list[pa.Table], int] | None:
        """Take the waiting lines (caller's thread): streams, server text, line count."""
        if not self._pending and not self._extra_quarantine:
            self._first_pending_at = None
            return None
        pending, self._pending = self._pending, {}
        extra_q, self._extra_quarantine = self._extra_quarantine, []
        lines = self._pending_lines
        self._pending_lines = 0
        self._first_pending_at = None
        return pending, extra_q, lines

    def _transform_pending(self) -> _Job | None:
        """Run the transforms over every waiting stream (caller's thread; parser state)."""
        taken = self._take_pending()
        return None if taken is None else self._transform_taken(*taken)

    def _transform_taken(self, pending: dict[str, list[RawBatch]], extra_q: list[pa.Table],
                         lines: int) -> _Job:
        """The transforms over taken streams (one thread at a time: parser state)."""
        with self._parse_gate(lines):  # H2's memory gate (toolwatch/live/memgate.py)
            return self._transform_taken_gated(pending, extra_q, lines)

    def _transform_taken_gated(self, pending: dict[str, list[RawBatch]],
                               extra_q: list[pa.Table], lines: int) -> _Job:
        checkpoints: list[Checkpoint] = []
        outs: list[BatchOutput] = []
        # Streams with lines are parsed together, one parse per kind (with and without
        # line numbers: their byte sizes count the newline differently): a parse has a
        # fixed cost (~4 ms of DuckDB statement, buffer scans) that one parse per stream
        # paid once per Kafka partition or tailed file per flush. Pairing and
        # sessionizing stay per stream, in stream order (Pipeline.transform).
        joint: dict[bool, list[list[RawBatch]]] = {}
        for fp, bl in pending.items():
            n = sum(len(b) for b in bl)
            if n == 0:
                merged = merge_batches(bl)
                if not (merged.final and fp in self.pipe.pairers):
                    # Nothing to parse (e.g. only server text): just advance the checkpoint.
                    if merged.end_offset >= 0:
                        checkpoints.append(
                            Checkpoint(merged.source_fp, merged.source, merged.end_offset)
                        )
                    continue
                try:
                    outs.append(self.pipe.transform(merged))
                except ValueError:
                    # An empty final batch only flushes waiting JSON-RPC requests; a
                    # parser that cannot take an empty batch must not stop the flush.
                    log.warning("could not flush pending requests of %s", merged.source)
                continue
            joint.setdefault(bl[0].line_nos is not None, []).append(
                [b for b in bl if len(b) or b is bl[-1]]
            )
        for streams in joint.values():
            outs.extend(self._transform_streams(streams))
        c = self.pipe.counters
        return _Job(
            events=_concat([o.events for o in outs], schema.EVENTS),
            summaries=_concat([o.summaries for o in outs], schema.SUMMARIES),
            quarantine=_concat([o.quarantine for o in outs] + extra_q, schema.QUARANTINE),
            checkpoints=checkpoints
            + [o.checkpoint for o in outs if o.checkpoint.end_offset >= 0],
            lines=lines,
            # Snapshot on this thread: the parser keeps counting while the commit runs.
            lines_read=c.lines_read,
            quarantined=dict(c.quarantined),
        )


    def _transform_streams(self, streams: list[list[RawBatch]]) -> list[BatchOutput]:
        """Parse the lines of several streams in one go, then transform each stream."""
        if len(streams) == 1:
            return [self.pipe.transform(merge_batches(streams[0]))]
        joined, parts = join_streams(streams)
        parsed = self.pipe.parser.parse(joined)
        outs = []
        start = 0
        ord_at = parsed.schema.get_field_index("ord")
        for part in parts:
            n = len(part)
            tbl = parsed.slice(start, n)
            if ord_at >= 0:  # positions within the stream's own batch, as if parsed alone
                # numpy, not pc.subtract(col, start): that goes through pa.scalar, whose
                # first call imports pandas (~0.2 s of the poll thread per process; see
                # toolwatch.ingest.arrays). "ord" is int64 without nulls.
                tbl = tbl.set_column(ord_at, "ord", arrays.from_numpy(
                    arrays.to_numpy(tbl.column(ord_at)) - np.int64(start)))
            outs.append(self.pipe.transform(part, tbl))
            start += n
        return outs

    def close(self) -> None:
        """Flush what is pending and release resources (store writer lock, parser)."""
        try:
            self.finalize_streams()
            self.flush()
        finally:
            if self._xform is not None:
                self._xform.shutdown(wait=True)
                self._xform = None
            self._stop_worker()
            self.pipe.close()
            if self.sinks is not None:
                self.sinks.close()
                self.status.sinks = self.sinks.counters()


