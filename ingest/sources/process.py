"""Source ``run``: an MCP stdio server started as a child, its stderr as the log stream.

``toolwatch run -- CMD ARGS…`` sits *beside* the server, not in its protocol path: the
child inherits toolwatch's stdin and stdout file descriptors, so the client's requests
and the server's responses flow between the client and the server through the operating
system, byte for byte, with no copy and no added latency. toolwatch never writes to
stdout. The child's stderr is a spool file under the store (:mod:`toolwatch.spool`),
echoed to toolwatch's own stderr and read by the collector
(:func:`toolwatch.live_cli.collect_spools`), which splits it here.

On that stream, lines whose first non-blank byte is ``{`` are log records (parsed like any
log; malformed ones are quarantined as usual). Every other line is *server text* (banners,
tracebacks, plain log messages): counted, kept in the quarantine dataset with reason
``server_text`` (``live.keep_server_text``), never treated as a failure.

Signals SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 received by toolwatch are
forwarded to the child; toolwatch exits with the child's exit code (``128 + N`` when the
child was killed by signal N). ``ingest --follow -`` reads standard input with
:class:`PipeReader`.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from toolwatch.ingest import arrays
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.base import Item, LiveSource, StreamsEnded, StreamsStarted

# The wrapped server itself lives in toolwatch.spool: it is started before anything
# heavy is imported (this module pulls in numpy and pyarrow).
from toolwatch.spool import FORWARDED_SIGNALS, WrappedServer  # noqa: F401


class PipeReader:
    """Read a file descriptor to EOF on a thread; optionally echo every chunk elsewhere.

    Parameters
    ----------
    fd
        Descriptor to read (a pipe: ``os.read`` returns what is there, never waits for a
        full buffer, so lines arrive as soon as they are written).
    echo_fd
        Descriptor each chunk is written to before anything else (``2`` for ``run``).
    chunk
        Read size.
    max_queued
        Chunks waiting for the pipeline; past it the reader blocks (back-pressure on the
        writer through the pipe rather than unbounded memory). Echo happens first, so
        the server's stderr stays visible.
    """

    def __init__(
        self, fd: int, *, echo_fd: int | None = None, chunk: int = 1 << 16, max_queued: int = 4096
    ):
        self.fd = fd
        self.echo_fd = echo_fd
        self.chunk = chunk
        self.q: queue.Queue[bytes | None] = queue.Queue(maxsize=max_queued)
        self.bytes_read = 0
        self.echo_errors = 0
        self.eof = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pipe-reader-{fd}", daemon=True)

    def start(self) -> PipeReader:
        """Start the reader thread."""
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while True:
                try:
                    data = os.read(self.fd, self.chunk)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                self.bytes_read += len(data)
                if self.echo_fd is not None:
                    self._echo(data)
                self.q.put(data)
        finally:
            self.eof.set()
            self.q.put(None)

    def _echo(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.echo_fd, view)  # type: ignore[arg-type]
            except InterruptedError:
                continue
            except OSError:
                self.echo_errors += 1  # our stderr is gone: keep monitoring anyway
                return
            view = view[n:]

    def chunks(self, timeout: float) -> Iterator[bytes | None]:
        """Chunks available within ``timeout`` seconds; ``None`` marks EOF."""
        try:
            first = self.q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return
        yield first
        if first is None:
            return
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return
            yield item
            if item is None:
                return

    def join(self, timeout: float | None = None) -> None:
        """Wait for the reader thread."""
        self._thread.join(timeout)


#: A log record's line: an optional UTF-8 byte order mark (the parser strips one at the
#: start of any line, as ``ingest`` does: a record behind a BOM was kept as server text,
#: hidden from detection), ASCII blanks (what ``bytes.lstrip`` strips), then ``{``.
#: (``lines`` is binary: RE2 matches it byte by byte, so ``\xef`` is the byte.)
_JSON_START = r"^(?:\xef\xbb\xbf)?[ \t\n\r\x0b\x0c]*\{"


def split_server_text(batch: RawBatch) -> tuple[RawBatch, list[bytes], list[int], list[int]]:
    """Separate JSON log lines from server text.

    Returns
    -------
    (json_batch, text_lines, text_offsets, text_line_nos)
        ``json_batch`` keeps the original offsets and ``end_offset``.
    """
    # Columnar: one regex over the batch (the bytes ``bytes.lstrip`` strips, then "{"),
    # so only server-text lines (few, on a log stream) become Python objects.
    mask = pc.match_substring_regex(batch.lines, _JSON_START)
    if pc.all(mask).as_py() is not False:  # every line (or none at all) is a record
        return batch, [], [], []
    text_mask = pc.invert(mask)
    # Through int8: BooleanArray.to_numpy imports pandas (~0.2 s, once per process).
    is_json = arrays.to_numpy(pc.cast(mask, pa.int8())).astype(bool)
    text = pc.filter(batch.lines, text_mask).to_pylist()
    offs = batch.offsets[~is_json].tolist()
    nos = batch.line_nos[~is_json].tolist() if batch.line_nos is not None else []
    keep = RawBatch(
        source=batch.source,
        source_fp=batch.source_fp,
        lines=pc.filter(batch.lines, mask),  # type: ignore[arg-type]
        offsets=batch.offsets[is_json],
        line_nos=batch.line_nos[is_json] if batch.line_nos is not None else None,
        end_offset=batch.end_offset,
        final=batch.final,
        sizes=batch.sizes[is_json] if batch.sizes is not None else None,
    )
    return keep, text, offs, nos


def stdin_reader() -> PipeReader:
    """A :class:`PipeReader` over standard input (``ingest --follow -``)."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdin.flush()
    return PipeReader(0).start()


class PipeLive(LiveSource):
    """A pipe (``ingest --follow -``, a child's stderr) as a live source.

    Reads chunks from a :class:`PipeReader`, assembles lines
    (:class:`~toolwatch.ingest.sources.file_tail.LineAssembler`), announces the stream
    once its fingerprint is known (:class:`StreamsStarted`, unless ``split_text``) and
    ends it at EOF (:class:`StreamsEnded`). A pipe cannot be re-read: acknowledgements
    need no action.

    Parameters
    ----------
    reader
        The started pipe reader.
    asm
        Line assembler of the stream (resumes from the store's checkpoint).
    split_text
        Separate non-JSON lines as :class:`ServerText` (a wrapped server's stderr).
    """

    name = "pipe"
    blocking = True

    def __init__(self, reader: PipeReader, asm: Any, *, split_text: bool = False):
        super().__init__()
        self.reader = reader
        self.asm = asm
        self.split_text = split_text
        self._eof = False
        self._warmed = False

    def poll(self, timeout: float) -> Iterator[Item]:
        """Lines read within ``timeout`` seconds; at EOF the stream's end."""
        if self._eof:
            return
        asm = self.asm
        for chunk in self.reader.chunks(timeout):
            batch = asm.feed(b"", final=True) if chunk is None else asm.feed(chunk)
            if chunk is None:
                self._eof = True
            if batch is None or (len(batch) == 0 and not batch.final):
                continue
            if not self._warmed and asm.fp is not None and not self.split_text:
                self._warmed = True
                yield StreamsStarted((asm.fp,))
            yield from self._counted(batch, split_text=self.split_text)
        cut = asm.cut_long_line()
        if cut is not None:
            self.counters.processed += len(cut)
            yield cut
        if self._eof and asm.fp is not None:
            yield StreamsEnded((asm.fp,))

    def exhausted(self) -> bool:
        """EOF reached: nothing more will come."""
        return self._eof

    def status(self) -> dict[str, Any]:
        """Bytes read from the pipe."""
        return {"lag": {"pipe_bytes_read": self.reader.bytes_read}}
