"""The one loop that runs any live source (:class:`~toolwatch.ingest.sources.base.LiveSource`).

One iteration: deliver the acknowledgements of what the commit thread committed since
the last one (on this thread, so sources need no locks) → poll the source (waiting at
most until the next flush is due) → add its batches and dispatch its lifecycle events →
flush when due (``flush(wait=False)``: the commit thread detects and commits while this
thread reads on) → status tick → stop flag, exhaustion, idle exit, time limit.

The source never touches the pipeline: everything it needs from it goes through the
events of :mod:`toolwatch.ingest.sources.base`, dispatched by :meth:`Driver.handle`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.base import (
    LiveSource,
    ServerText,
    StreamEvent,
    StreamsEnded,
    StreamsRevoked,
    StreamsStarted,
)
from toolwatch.live.commit import FlushResult
from toolwatch.live.pipeline import LivePipeline
from toolwatch.live.stop import StopFlag
from toolwatch.store import Checkpoint

#: Longest wait of one poll of a blocking source (the stop flag is looked at between).
POLL_TIMEOUT_S = 0.2


class Driver:
    """Runs one live source into one :class:`LivePipeline` (see the module docstring).

    Parameters
    ----------
    source
        The live source (opened by the driver: :meth:`LiveSource.open`).
    lp
        The pipeline (flushes, commit thread, status).
    stop
        Ends the loop (signal handlers set it).
    publish
        Writes the status file (called every ``live.status_interval_s``); None: no file.
    idle_exit_s
        Return once nothing arrived for this long, nothing is pending and the source
        agrees (:meth:`LiveSource.idle_ok`).
    max_seconds
        Return after this long.
    poll_timeout_s
        Longest wait of one poll of a blocking source.
    on_iteration
        Called once per loop iteration on this thread (the Kafka entity pass).
    """

    def __init__(
        self,
        source: LiveSource,
        lp: LivePipeline,
        *,
        stop: StopFlag | None = None,
        publish: Callable[[], None] | None = None,
        idle_exit_s: float | None = None,
        max_seconds: float | None = None,
        poll_timeout_s: float = POLL_TIMEOUT_S,
        on_iteration: Callable[[], None] | None = None,
    ):
        self.source = source
        self.lp = lp
        self.stop = stop if stop is not None else StopFlag()
        self.publish = publish
        self.idle_exit_s = idle_exit_s
        self.max_seconds = max_seconds
        self.poll_timeout_s = poll_timeout_s
        self.on_iteration = on_iteration
        # Checkpoints committed on the commit thread, acknowledged on this one.
        self._acks: deque[list[Checkpoint]] = deque()
        self._thread = threading.get_ident()
        self._last_status = 0.0
        self._deferred = False
        lp.on_commit.append(self._committed)
        # Sources whose reading costs CPU of their own (Kafka decodes record batches on
        # this thread) get the parse and transforms of a micro-batch on a thread of
        # their own, overlapped with reading the next one.
        lp.transform_ahead = bool(getattr(source, "transform_ahead", False))
        source.open(self)

    # ------------------------------------------------------------------ acknowledgements
    def _committed(self, res: FlushResult) -> None:
        """on_commit hook (commit thread or this one): queue the acknowledgement."""
        self._acks.append(list(res.checkpoints))

    def deliver_acks(self, *, force: bool = False) -> None:
        """Hand the queued acknowledgements to the source (one call, in commit order).

        ``force``: call :meth:`LiveSource.ack` even with nothing queued (after a
        synchronous barrier, so a source waiting for it can act).
        """
        cps: list[Checkpoint] = []
        n = 0
        while self._acks:
            cps.extend(self._acks.popleft())
            n += 1
        if n or force:
            self.source.ack(cps)

    # ------------------------------------------------------------------ events
    def handle(self, event: StreamEvent) -> None:
        """Dispatch one lifecycle event (the :class:`SourceControl` of the source)."""
        lp = self.lp
        if not isinstance(event, ServerText):
            lp.settle_transform()  # these read or change the transforms' stream state
        if isinstance(event, StreamsStarted):
            lp.warm_up(event.fps)
        elif isinstance(event, ServerText):
            lp.add_server_text(event.source, event.source_fp, event.lines, event.offsets,
                               event.line_nos, reason=event.reason)
        elif isinstance(event, StreamsEnded):
            lp.finalize_streams(event.fps)
            if event.sync:
                lp.flush()  # waits for the commit thread: the streams' lines are stored
                self.deliver_acks(force=True)
        elif isinstance(event, StreamsRevoked):
            if event.discard_pending:
                # Micro-batches already handed to the commit thread were read before
                # the loss; lines still waiting here are re-read by the new owner.
                lp.drain()
                lp.drop_pending(event.fps)
            lp.forget_streams(event.fps)
        else:  # pragma: no cover - a source bug
            raise TypeError(f"not a stream event: {event!r}")

    # ------------------------------------------------------------------ loop
    def _flush_if_due(self, *, in_poll: bool = False) -> None:
        lp = self.lp
        if in_poll and lp.pending_lines < 2 * lp.live.flush_events \
                and not self.source.behind():
            # Between the items of the poll that ended a backlog only a micro-batch twice
            # the size flushes: the rest of the poll is already read, and a flush at
            # flush_events would leave its last lines to wait for the interval and a
            # detection of their own (a Kafka poll of two partitions' last messages).
            # Behind, micro-batches stay at flush_events (memory: a tail poll reads up
            # to 64 MiB).
            return
        if not lp.due():
            return
        # Behind the log end (a backlog, a replay) interval flushes wait for size: the
        # commit thread then detects several micro-batches together.
        behind = self.source.behind()
        if lp.pending_lines >= lp.live.flush_events or not behind:
            lp.flush(wait=False, behind=behind)
            self._deferred = False
        else:
            self._deferred = True

    def tick(self, *, force: bool = False) -> None:
        """Publish the status (rate, the source's counters and extras) when due."""
        now = time.monotonic()
        if not force and now - self._last_status < self.lp.live.status_interval_s:
            return
        self._last_status = now
        self.apply_status()
        if self.publish is not None:
            self.publish()

    def apply_status(self) -> None:
        """Copy the source's counters and extras into the pipeline's status."""
        st = self.lp.status
        st.events_per_s = round(self.lp.rate.rate(), 1)
        extra: dict[str, Any] = self.source.status() or {}
        st.lag.update(extra.get("lag") or {})
        if "sources" in extra:
            st.sources = extra["sources"]
        st.extra[self.source.name or type(self.source).__name__] = (
            self.source.counters.as_dict()
        )

    def run(self) -> None:
        """Poll, add, flush, acknowledge until stopped, exhausted, idle or out of time.

        Ends with a synchronous flush (everything read is committed) and its
        acknowledgements; the caller then closes the source and the pipeline.
        """
        src, lp, stop = self.source, self.lp, self.stop
        started = last_data = time.monotonic()
        drain_from: float | None = None
        ok = False
        try:
            while True:
                final = bool(stop)
                if final and not src.drain_on_stop:
                    break
                self.deliver_acks()
                if src.blocking:
                    timeout = self.poll_timeout_s if self._deferred else min(
                        self.poll_timeout_s, lp.time_to_due())
                else:
                    timeout = 0.0
                got = 0
                for item in src.poll(timeout):
                    if isinstance(item, RawBatch):
                        lp.add(item)
                        got += len(item)
                    else:
                        self.handle(item)
                        got += len(item.lines) if isinstance(item, ServerText) else 1
                    self._flush_if_due(in_poll=True)
                    if stop and not final and not src.drain_on_stop:
                        break
                if lp.pending_lines and lp.backlog_waiting() and not src.behind():
                    # A backlog just ended: its last lines go with the detection it left
                    # waiting now, not one flush interval later in a detection of their own.
                    # Also after an empty poll: a Kafka backlog's last poll can be a whole
                    # fetch answer (still "behind"); only the empty poll after it shows the
                    # end, and waiting for the interval then held the last lines up to
                    # flush_interval_s (bench_kafka: ~1 s of 4 in about half the rounds).
                    lp.flush(wait=False, behind=False)
                    self._deferred = False
                self._flush_if_due()
                if not got and not src.behind():
                    lp.caught_up()  # nothing more for now: commit what is queued
                self.tick()
                if self.on_iteration is not None:
                    self.on_iteration()
                now = time.monotonic()
                if got:
                    last_data = now
                if final:
                    # A draining source's final pass is every poll until it has read what
                    # was there (a wrapper's whole spool, not one 64 MiB step)...
                    draining = getattr(src, "draining", None)
                    if not (src.drain_on_stop and draining is not None and draining()):
                        break
                    # ...but a signal is obeyed: within signal_drain_s, at once on a
                    # second one. The rest stays for the next collector (checkpointed).
                    drain_from = drain_from if drain_from is not None else now
                    if stop.signals >= 2 or (
                        stop.signals and now - drain_from >= lp.live.signal_drain_s
                    ):
                        break
                    if not got:
                        time.sleep(src.idle_wait_s)  # the stop flag is set: no wait there
                    continue
                if src.exhausted():
                    break
                if self.max_seconds is not None and now - started >= self.max_seconds:
                    break
                if (
                    self.idle_exit_s is not None
                    and now - last_data >= self.idle_exit_s
                    and lp.pending_lines == 0
                    and src.idle_ok()
                ):
                    break
                if not got and not src.blocking:
                    stop.event.wait(min(src.idle_wait_s, max(lp.time_to_due(), 0.01)))
            ok = True
        finally:
            if ok:  # a failure propagates as it is; nothing after it is committed
                lp.flush()
                self.deliver_acks()
            self.tick(force=True)


def drive(source: LiveSource, lp: LivePipeline, **kwargs: Any) -> Driver:
    """Run ``source`` into ``lp`` until it ends (see :class:`Driver`); returns the driver."""
    d = Driver(source, lp, **kwargs)
    d.run()
    return d


__all__ = ["POLL_TIMEOUT_S", "Driver", "drive"]
