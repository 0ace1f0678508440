"""Source ``run``: an MCP stdio server started as a child, its stderr as the log stream.

``toolwatch run -- CMD ARGS…`` sits *beside* the server, not in its protocol path: the
child inherits toolwatch's stdin and stdout file descriptors, so the client's requests
and the server's responses flow between the client and the server through the operating
system, byte for byte, with no copy and no added latency. toolwatch never writes to
stdout. The child's stderr is a spool file under the store
(:mod:`toolwatch.ingest.sources.wrapper`),
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
import hmac
import os
import queue
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from toolwatch.ingest import arrays
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.base import Item, LiveSource, StreamsEnded, StreamsStarted

# The wrapped server itself lives in toolwatch.ingest.sources.wrapper: it is started
# before anything heavy is imported (this module pulls in numpy and pyarrow).
# heavy is imported (this module pulls in numpy and pyarrow).
from toolwatch.ingest.sources.wrapper import FORWARDED_SIGNALS, WrappedServer  # noqa: F401


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


# --------------------------------------------------------------------------- trust boundary
#: Quarantine reason of a JSON line that a wrapped server printed on stderr but that is
#: not a record of its toolwatch middleware (no valid tag on a stream whose records are
#: tagged): the agent may have written it (issue 28), so it is never an event.
UNTAGGED_REASON = "untagged_record"
_TAG_MARK = b',"tw_tag":"'
_TAG_HEX = 32
_TAG_SUFFIX_LEN = len(_TAG_MARK) + _TAG_HEX + 2  # ... ,"tw_tag":"<32 hex>"}
#: The middleware's hello event name as it appears in its (tagged) line.
HELLO_MARK = b'"TOOLWATCH_HELLO"'
#: A line that ends with a tag field (as the middleware writes it, before the newline).
_TAG_PATTERN = r',"tw_tag":"[0-9a-f]{32}"\}\r?\n?$'


class StreamTrust:
    """What the collector knows of one wrapped server's stderr (``toolwatch run``).

    Parameters
    ----------
    key
        The run's record key (handed to the server as ``TOOLWATCH_RECORD_KEY``), or
        ``None``: the stream is unauthenticated, every JSON line is read as a record.

    Attributes
    ----------
    authenticated
        The server's middleware announced itself with a verified ``TOOLWATCH_HELLO``:
        from then on only lines with a valid tag are records.
    """

    def __init__(self, key: bytes | None, authenticated: bool = False):
        self.key = key
        self.authenticated = authenticated
        self.verified = 0
        self.refused = 0

    def verify(self, line: bytes) -> bool:
        """Whether ``line`` (one JSON record, maybe with its newline) carries a valid tag."""
        if self.key is None:
            return False
        body = line.rstrip(b"\r\n")
        if len(body) <= _TAG_SUFFIX_LEN or not body.endswith(b'"}'):
            return False
        cut = len(body) - _TAG_SUFFIX_LEN
        if body[cut : cut + len(_TAG_MARK)] != _TAG_MARK:
            return False
        tag = body[cut + len(_TAG_MARK) : -2]
        mac = hmac.digest(self.key, body[:cut] + b"}", "sha256")  # one-shot: C all along
        return hmac.compare_digest(mac[: _TAG_HEX // 2].hex().encode(), tag)

    def probe(self, head: bytes) -> bool:
        """Look for a verified hello in the first bytes of a stream (a collector resuming
        a spool past its start); sets and returns :attr:`authenticated`."""
        if self.key is not None and not self.authenticated:
            for ln in head.split(b"\n")[:-1]:
                if HELLO_MARK in ln and self.verify(ln):
                    self.authenticated = True
                    break
        return self.authenticated


@dataclass
class TextLines:
    """Lines of a wrapped server's stderr kept as quarantine rows with one reason."""

    reason: str
    lines: list[bytes]
    offsets: list[int]
    line_nos: list[int] | None


_TRACEBACK_START = b"Traceback (most recent call last):"
_CHAIN_LINES = (b"During handling of the above exception",
                b"The above exception was the direct cause")


def fold_text_lines(lines: list[bytes], offsets: list[int], line_nos: list[int] | None,
                    positions: list[int]) -> tuple[list[bytes], list[int], list[int] | None]:
    """Fold multi-line server text into one record per message.

    A line joins the one before it (adjacent in the stream: ``positions`` are the lines'
    indexes in their batch) when it is indented (a traceback frame, a continuation), or
    while a Python traceback is open: from ``Traceback (most recent call last):`` on,
    chained-exception notices, blank lines and further tracebacks join, and the first
    other unindented line (the exception line) closes it. A traceback became one
    quarantine row per frame line before (5,076 rows for 151 calls, issue 27).
    The folded record's offset and line number are its first line's.
    """
    if len(lines) < 2:
        return lines, offsets, line_nos
    out: list[bytes] = []
    offs: list[int] = []
    nos: list[int] | None = [] if line_nos else None
    in_tb = False
    prev_pos = -2
    for i, ln in enumerate(lines):
        body = ln.rstrip(b"\r\n")
        joins = False
        if out and positions[i] == prev_pos + 1:
            if body[:1] in (b" ", b"\t"):
                joins = True
            elif in_tb:
                joins = True
                if not body or body.startswith(_TRACEBACK_START) or body.startswith(
                        _CHAIN_LINES):
                    pass  # still inside the (chained) traceback
                else:
                    in_tb = False  # the exception line ends it
        if joins:
            out[-1] = out[-1].rstrip(b"\r\n") + b"\n" + body
        else:
            out.append(body)
            offs.append(offsets[i])
            if nos is not None and line_nos:
                nos.append(line_nos[i])
            in_tb = body.startswith(_TRACEBACK_START)
        prev_pos = positions[i]
    return out, offs, nos


def split_stream(batch: RawBatch, trust: StreamTrust | None, *,
                 fold: bool = True) -> tuple[RawBatch, list[TextLines]]:
    """Records of a wrapped server's stderr, and its other lines as quarantine text.

    Without a record key (``trust`` None or keyless) this is :func:`split_server_text`:
    every JSON line is a record. With one, a line carrying a ``tw_tag`` field is a record
    only if the tag verifies (a forged tag is refused), the middleware's hello marks the
    stream authenticated (and is dropped), and on an authenticated stream an untagged JSON
    line is server text with reason :data:`UNTAGGED_REASON`, never an event. Plain server
    text is folded (:func:`fold_text_lines`) with reason ``server_text``.

    Only lines that carry a tag are looked at one by one (an HMAC each, ~1 us); the rest
    is one regex pass over the batch.
    """
    n = len(batch)
    is_json_a = pc.match_substring_regex(batch.lines, _JSON_START)
    is_json = arrays.to_numpy(pc.cast(is_json_a, pa.int8())).astype(bool) if n else (
        np.zeros(0, bool))
    groups: list[TextLines] = []
    untrusted = np.zeros(n, bool)
    hello = np.zeros(n, bool)
    if trust is not None and trust.key is not None and n:
        tagged_a = pc.match_substring_regex(batch.lines, _TAG_PATTERN)  # RE2: one DFA pass
        tagged = arrays.to_numpy(pc.cast(tagged_a, pa.int8())).astype(bool) & is_json
        idx = np.flatnonzero(tagged)
        ok = np.zeros(n, bool)
        if len(idx):
            for i, ln in zip(idx.tolist(), pc.filter(batch.lines, pa.array(tagged)).to_pylist(),
                             strict=True):
                if trust.verify(ln):
                    ok[i] = True
                    if HELLO_MARK in ln:
                        hello[i] = True
        # authenticated from the first verified hello on (or already)
        auth = np.zeros(n, bool)
        if trust.authenticated:
            auth[:] = True
        elif hello.any():
            auth[int(np.flatnonzero(hello)[0]):] = True
            trust.authenticated = True
        untrusted = is_json & ((tagged & ~ok) | (~tagged & auth))
        trust.verified += int(ok.sum())
        trust.refused += int(untrusted.sum())
    keep_mask = is_json & ~untrusted & ~hello
    text_mask = ~is_json
    if keep_mask.all():
        return batch, groups
    line_nos = batch.line_nos

    def take(mask: np.ndarray) -> tuple[list[bytes], list[int], list[int] | None, list[int]]:
        pos = np.flatnonzero(mask)
        lines = pc.take(batch.lines, pa.array(pos)).to_pylist()
        nos = line_nos[pos].tolist() if line_nos is not None else None
        return lines, batch.offsets[pos].tolist(), nos, pos.tolist()

    if text_mask.any():
        lines, offs, nos, pos = take(text_mask)
        if fold:
            lines, offs, nos = fold_text_lines(lines, offs, nos, pos)
        groups.append(TextLines("server_text", lines, offs, nos))
    if untrusted.any():
        lines, offs, nos, _ = take(untrusted)
        groups.append(TextLines(UNTAGGED_REASON, lines, offs, nos))
    keep = RawBatch(
        source=batch.source,
        source_fp=batch.source_fp,
        lines=pc.filter(batch.lines, pa.array(keep_mask)),  # type: ignore[arg-type]
        offsets=batch.offsets[keep_mask],
        line_nos=line_nos[keep_mask] if line_nos is not None else None,
        end_offset=batch.end_offset,
        final=batch.final,
        sizes=batch.sizes[keep_mask] if batch.sizes is not None else None,
    )
    return keep, groups


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
