"""Source ``spool``: the collector of wrapped servers' spools, as a live source.

Reading lives in :class:`toolwatch.spool.SpoolSource` (light imports: the wrapper side
of :mod:`toolwatch.spool` must start in milliseconds); this adds the contract of
:mod:`toolwatch.ingest.sources.base`: server text travels as :class:`ServerText`, a
spool whose wrapper is gone ends its stream with a synchronous :class:`StreamsEnded`,
and the spool is deleted only on the acknowledgement that follows that commit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolwatch.ingest.sources.base import (
    Item,
    LiveSource,
    ServerText,
    StreamsEnded,
)
from toolwatch.ingest.sources.process import split_stream

if TYPE_CHECKING:
    from toolwatch.store import Checkpoint


class SpoolLive(LiveSource):
    """Every spool of a store (``toolwatch run`` wrappers) read like ``tail`` reads files.

    Parameters
    ----------
    data_dir
        The store.
    checkpoints
        The store's checkpoints (fingerprint -> offset).
    orphans_only
        Only spools whose wrapper is gone; exhausted once they are ingested (recovery).
    read_bytes, max_line_bytes
        Read size per call; line cut length.
    poll_interval_s
        Sleep between polls that found nothing.
    writer_grace_s
        How long a final pass waits for a child of an exited server that still writes
        to its spool (see :meth:`toolwatch.spool.SpoolSource.draining`).
    """

    name = "spool"
    blocking = False
    #: Once stopped, one last pass finishes the spools whose wrapper is gone.
    drain_on_stop = True

    def __init__(
        self,
        data_dir: str | Path,
        checkpoints: dict[str, int],
        *,
        orphans_only: bool = False,
        read_bytes: int = 4 << 20,
        max_line_bytes: int = 1_048_576,
        poll_interval_s: float = 0.1,
        writer_grace_s: float | None = None,
    ):
        from toolwatch.spool import WRITER_GRACE_S, SpoolSource

        super().__init__()
        self.reader = SpoolSource(
            data_dir, checkpoints, orphans_only=orphans_only, read_bytes=read_bytes,
            max_line_bytes=max_line_bytes,
            writer_grace_s=WRITER_GRACE_S if writer_grace_s is None else writer_grace_s)
        self.orphans_only = orphans_only
        self.idle_wait_s = poll_interval_s
        self._ending: list[str] = []  # finished spools waiting for their acknowledgement
        self.removed = 0

    def poll(self, timeout: float) -> Iterator[Item]:
        """Lines appended to the spools; the end of spools whose wrapper is gone."""
        src = self.reader
        for batch in src.poll():
            ev = self._started(src.new_fingerprints)
            if ev is not None:
                yield ev
            # The trust boundary: only the middleware's tagged records of a server that
            # announced it are events; other JSON lines there are kept as text.
            batch, groups = split_stream(batch, src.trust_of(batch.source_fp))
            for g in groups:
                self.counters.rejected += len(g.lines)
                yield ServerText(batch.source, batch.source_fp, g.lines, g.offsets,
                                 g.line_nos, reason=g.reason)
            yield from self._counted(batch)
        fin = [w for w in src.finished() if w not in self._ending]
        if fin:
            fps = tuple(e.asm.fp for w in fin if (e := src.entries.get(w)) and e.asm.fp)
            self._ending.extend(fin)
            # sync: the driver commits the spools' last lines, then acknowledges.
            yield StreamsEnded(fps, sync=True)

    def ack(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Delete the finished spools: the commit that covered their end is done."""
        if self._ending:
            done, self._ending = self._ending, []
            self.reader.remove(done)
            self.removed += len(done)

    def behind(self) -> bool:
        """More than one read step (``read_bytes``) of the spools is unread."""
        return self.reader.lag_bytes() >= self.reader.read_bytes

    def draining(self) -> bool:
        """After a stop: the final pass has more to read (the whole spool, and a child
        of an exited server still writing, for up to the grace)."""
        return self.reader.draining()

    def exhausted(self) -> bool:
        """Recovery only: every orphaned spool has been ingested."""
        return self.orphans_only and not self.reader.entries

    def idle_ok(self) -> bool:
        """No spool is still open."""
        return not self.reader.entries

    def status(self) -> dict[str, Any]:
        """Unread spool bytes and the spools being read."""
        src = self.reader
        self.counters.extra = {"spools_removed": self.removed,
                               "files_rejected": len(src.rejected),
                               "truncations": src.truncations}
        self.counters.dropped = src.lost_partial_bytes
        return {"lag": {"bytes": src.lag_bytes()},
                "sources": {"spools": sorted(src.entries), "spool_bytes_read": src.bytes_read,
                            "rejected_files": dict(src.rejected)}}

    def close(self) -> None:
        """Close the spools (they stay for the next collector)."""
        if not self._closed:
            self.reader.close()
        super().close()
