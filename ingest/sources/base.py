"""The one contract every source follows.

Two kinds of sources, one unit of work (:class:`~toolwatch.ingest.records.RawBatch`):

*Batch source* (``ingest``/``analyze``: files, stdin)
    :meth:`BatchSource.batches` yields raw batches until the input is exhausted.

*Live source* (``tail``, ``run``, ``ingest --follow -``, ``kafka``)
    :meth:`LiveSource.poll` yields what has arrived, waiting at most ``timeout`` seconds
    so the driver (:func:`toolwatch.live.driver.drive`) can flush on time; after the
    store commit that covers a batch the driver hands the committed checkpoints back to
    :meth:`LiveSource.ack` — the way Vector's sources get end-to-end acknowledgements. A
    source acts on an acknowledgement only: a file tail records its committed offsets, the
    spool collector deletes a spool once it is fully acknowledged, Kafka commits offsets,
    a pipe needs nothing. Acknowledgements are delivered on the driver's thread (never
    the commit thread), so a source needs no locking for them.

Stream lifecycle travels through the contract, never by a source touching the live
pipeline: :meth:`LiveSource.poll` yields small events next to batches, and a source
that learns something *inside* a library callback (a Kafka rebalance listener runs
inside ``consumer.poll()``) hands the same events to :attr:`LiveSource.control`, which
the driver dispatches synchronously:

* :class:`StreamsStarted` — streams seen for the first time by this process (the
  driver reloads their recent stored events into the detection window: warm-up);
* :class:`ServerText` — non-JSON lines of a wrapped server's stderr (quarantined);
* :class:`StreamsEnded` — streams ended (EOF, a finished spool, a revoked partition):
  requests still waiting for their response are emitted; ``sync=True`` also flushes,
  waits for the commit and delivers its acknowledgements before returning;
* :class:`StreamsRevoked` — streams this process no longer owns: their pairing state,
  window rows and warm-up mark are forgotten (``discard_pending``: also their lines not
  yet flushed — a Kafka partition lost without a chance to commit).

Every source counts ``processed`` (lines/messages handed on), ``rejected`` (refused by
the source itself, e.g. non-JSON server text) and ``dropped`` (never handed on: a
redelivered message already stored, bytes lost at a truncation), in
:attr:`LiveSource.counters`, and returns its extras (lag, streams) from
:meth:`LiveSource.status`; the driver publishes both in ``toolwatch status`` and
``/metrics``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from toolwatch.ingest.records import RawBatch


def display_name(name: str) -> str:
    """A source name (a path) as valid text for the store, status and metrics.

    A file name is bytes: one that is not UTF-8 reaches Python with surrogate escapes
    (``bad\udcff.jsonl``), which no Arrow column, JSON status file or HTTP body can hold,
    so a log file named that way (an agent that can create files under a tailed glob)
    stopped ``ingest`` and ``tail``. Such characters are shown as ``\udcff`` escapes; the
    file itself is still opened by its real path.
    """
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")

if TYPE_CHECKING:  # the store (DuckDB) is not imported by sources
    from toolwatch.store import Checkpoint


# --------------------------------------------------------------------------- events
@dataclass(frozen=True)
class StreamsStarted:
    """Streams seen for the first time: the driver warms the detection window up."""

    fps: tuple[str, ...]


@dataclass(frozen=True)
class ServerText:
    """Non-JSON lines of a wrapped server's stderr (kept as quarantine ``server_text``).

    ``offsets``/``line_nos`` locate each line in its stream (``line_nos`` may be None).
    """

    source: str
    source_fp: str
    lines: list[bytes]
    offsets: list[int]
    line_nos: list[int] | None
    #: Quarantine reason: ``server_text``, or ``untagged_record`` (a JSON line that is not
    #: the middleware's on a stream whose records are tagged: toolwatch.spool).
    reason: str = "server_text"


@dataclass(frozen=True)
class StreamsEnded:
    """Streams ended: waiting JSON-RPC requests are emitted unanswered.

    ``sync``: also flush, wait for the store commit and deliver its acknowledgements
    before the driver returns (a spool about to be deleted, a partition about to be
    released).
    """

    fps: tuple[str, ...]
    sync: bool = False


@dataclass(frozen=True)
class StreamsRevoked:
    """Streams no longer owned: forget their pairing, window and warm-up state.

    ``discard_pending``: their lines not flushed yet are dropped too (the new owner
    re-reads them from the store's checkpoint).
    """

    fps: tuple[str, ...]
    discard_pending: bool = False


#: What a live source's :meth:`LiveSource.poll` yields besides batches.
StreamEvent = StreamsStarted | ServerText | StreamsEnded | StreamsRevoked
#: One item of :meth:`LiveSource.poll`.
Item = RawBatch | StreamEvent


class SourceControl(Protocol):
    """The driver side a source may call synchronously (from a library callback)."""

    def handle(self, event: StreamEvent) -> None:
        """Dispatch one lifecycle event now (see the event classes)."""


class _NoControl:
    """Control of a source not driven yet: events are refused loudly."""

    def handle(self, event: StreamEvent) -> None:
        raise RuntimeError(f"{event!r} before the source was opened by a driver")


# --------------------------------------------------------------------------- counters
@dataclass
class SourceCounters:
    """What every source counts (extras go in :attr:`extra`)."""

    #: Lines/messages handed on in batches.
    processed: int = 0
    #: Lines the source refused itself (non-JSON server text, ...).
    rejected: int = 0
    #: Lines or bytes never handed on (already stored, lost at a truncation, ...).
    dropped: int = 0
    #: Source-specific counters (files opened, rebalances, ...).
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        """Flat mapping: the three shared counters, then the extras."""
        return {"processed": self.processed, "rejected": self.rejected,
                "dropped": self.dropped, **self.extra}


# --------------------------------------------------------------------------- sources
@runtime_checkable
class BatchSource(Protocol):
    """A finite source: yields raw batches until exhausted (``ingest``, ``analyze``)."""

    def batches(self) -> Iterator[RawBatch]:
        """Raw batches in stream order; the last batch of each stream is ``final``."""

    def progress(self) -> int:
        """Bytes read so far (progress display)."""


class LiveSource(ABC):
    """A source that runs until stopped, driven by :func:`toolwatch.live.driver.drive`.

    Subclasses implement :meth:`poll` and may override :meth:`ack`, :meth:`behind`,
    :meth:`exhausted`, :meth:`idle_ok`, :meth:`status` and :meth:`close`.

    Attributes
    ----------
    name
        Registry name (:mod:`toolwatch.ingest.sources.registry`) and status key.
    blocking
        True when :meth:`poll` itself waits up to its timeout for data (a pipe, Kafka);
        False: :meth:`poll` returns at once and the driver sleeps ``idle_wait_s``
        (interruptible by the stop flag) when nothing came.
    idle_wait_s
        Longest sleep between empty polls of a non-blocking source.
    drain_on_stop
        True: once the stop flag is set, one last :meth:`poll` collects what is there
        (the spool collector finishes the spools of wrappers that are gone).
    counters
        :class:`SourceCounters`.
    control
        Set by the driver (:meth:`open`); for events raised inside library callbacks.
    """

    name: ClassVar[str] = ""
    blocking: ClassVar[bool] = False
    idle_wait_s: float = 0.1
    drain_on_stop: ClassVar[bool] = False

    def __init__(self) -> None:
        self.counters = SourceCounters()
        self.control: SourceControl = _NoControl()
        self._closed = False

    def open(self, control: SourceControl) -> None:
        """Called once by the driver before the first :meth:`poll`."""
        self.control = control

    # Helpers shared by the sources built on a file-like reader (tail, spool, pipe).
    @staticmethod
    def _started(fps: list[str]) -> StreamsStarted | None:
        """A :class:`StreamsStarted` for the streams a reader found since the last call
        (``fps`` is the reader's list of new fingerprints; it is emptied)."""
        if not fps:
            return None
        ev = StreamsStarted(tuple(fps))
        fps.clear()
        return ev

    def _counted(self, batch: RawBatch, split_text: bool = False) -> Iterator[Item]:
        """``batch`` counted as processed; with ``split_text``, its non-JSON lines first
        go out as one :class:`ServerText` (counted as rejected)."""
        if split_text:
            from toolwatch.ingest.sources.process import split_server_text

            batch, text, offs, nos = split_server_text(batch)
            if text:
                self.counters.rejected += len(text)
                yield ServerText(batch.source, batch.source_fp, text, offs, nos)
        self.counters.processed += len(batch)
        yield batch

    @abstractmethod
    def poll(self, timeout: float) -> Iterable[Item]:
        """What has arrived: batches (in stream order) and lifecycle events.

        Waits at most ``timeout`` seconds when nothing is there (blocking sources).
        """

    def ack(self, checkpoints: Sequence[Checkpoint]) -> None:  # noqa: B027 (optional hook)
        """The store holds every line before these checkpoints (driver thread).

        Called after every store commit the driver sees, with the checkpoints it
        covered (possibly none: a commit of server text only, a synchronous flush
        with nothing waiting).
        """

    def behind(self) -> bool:
        """Whether more than a micro-batch is waiting beyond what was polled (a backlog).

        While behind, the driver lets interval flushes wait for size (detection is
        amortized over bigger micro-batches) and does not treat an empty poll as
        caught up.
        """
        return False

    def exhausted(self) -> bool:
        """True once nothing more will ever arrive (a pipe's EOF): the driver returns."""
        return False

    def idle_ok(self) -> bool:
        """Whether ``idle_exit_s`` may end the run now (e.g. no spool still open)."""
        return True

    def status(self) -> dict[str, Any]:
        """Extras for ``toolwatch status``: ``lag`` (merged into the status lag),
        ``sources`` (what is followed) and ``extra`` (per-source counters)."""
        return {}

    def close(self) -> None:
        """Release files, sockets and threads; idempotent."""
        self._closed = True


__all__ = [
    "BatchSource",
    "Item",
    "LiveSource",
    "ServerText",
    "SourceControl",
    "SourceCounters",
    "StreamEvent",
    "StreamsEnded",
    "StreamsRevoked",
    "StreamsStarted",
]
