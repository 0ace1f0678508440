"""Source ``file``: read whole log files (plain or gzip) in bounded chunks."""

from __future__ import annotations

import contextlib
import glob
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
from toolwatch.ingest.records import NEWLINE, RawBatch, fingerprint, split_lines
from toolwatch.ingest.sources.base import display_name

from toolwatch.errors import SourceError

_GZIP_MAGIC = b"\x1f\x8b"


def _plain_or_link(path: str) -> bool:
    """Whether a glob or directory match is a file to read: a regular file (or a link to
    one). A FIFO, socket or device matched by ``logs/*`` would block ``open(2)`` or never
    end; it is skipped with a warning (a FIFO named on the command line, ``<(zcat x)``, is
    read as given)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return True
    import logging

    logging.getLogger("toolwatch.ingest").warning(
        "skipping %s: not a regular file (a FIFO, socket or device)", display_name(path))
    return False


def expand_paths(patterns: list[str]) -> list[str]:
    """Expand globs; ``-`` stays as stdin. A pattern that matches nothing is an error.

    Glob and directory matches that are not regular files (FIFOs, sockets, devices) are
    skipped; a path given as such is used as given.
    """
    out: list[str] = []
    for pat in patterns:
        if pat == "-":
            out.append(pat)
            continue
        hits = ([h for h in sorted(glob.glob(pat, recursive=True)) if _plain_or_link(h)]
                if glob.has_magic(pat) else [pat])
        hits = [h for h in hits if not Path(h).is_dir()] or (
            sorted(str(p) for p in Path(pat).rglob("*") if p.is_file())
            if Path(pat).is_dir()
            else hits
        )
        if not hits:
            raise SourceError("no file matches this pattern", source=pat)
        out.extend(hits)
    return out


class GzipStream(io.RawIOBase):
    """Decompress a gzip file as it is read, keeping what precedes any damage.

    :class:`gzip.GzipFile` raises from the read that meets a truncated stream (a log
    compressed while it was still being written, a copy cut short), corrupt data or bytes
    after the last member, and the data of that read is lost with it: a ``.gz`` cut in
    half stored nothing. Here everything that decompresses is returned first; the damage
    is then kept in :attr:`error` and the stream ends (the reader stores the complete
    lines, holds back a partial last one and reports the file as failed). Concatenated
    members are read in turn; NUL padding after the last member is ignored, as gzip(1)
    does.

    Parameters
    ----------
    fileobj
        The compressed file, opened for binary reading.
    """

    def __init__(self, fileobj: BinaryIO):
        self.fileobj = fileobj  # progress() reports its position (compressed bytes)
        self._d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        self._carry = b""  # compressed bytes read but not yet fed (the next member's)
        self._in_member = False  # bytes of a member were fed and its end not reached
        self._eof = False
        #: What ended the stream early (truncation, corruption, trailing data), if any.
        self.error: str | None = None
        #: The data ends inside a member (truncated or corrupt): its last line is cut.
        self.cut = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        # Fills ``b`` (as the BufferedReader of GzipFile does): a batch is a whole chunk.
        out = memoryview(b).cast("B")
        want = len(out)
        pos = 0
        while not self._eof and pos < want:
            data = self._d.unconsumed_tail or self._carry or self.fileobj.read(1 << 18)
            self._carry = b""
            if not data:
                self._eof = True
                if self._in_member:
                    self.cut = True
                    self.error = (
                        "compressed file ended before the end-of-stream marker "
                        "(truncated): the lines before it were read"
                    )
                break
            if not self._in_member and data[:2] != _GZIP_MAGIC[: len(data[:2])]:
                self._trailing(data)  # after the last member
                break
            try:
                got = self._d.decompress(data, want - pos)
            except zlib.error as exc:
                self._eof = True
                self.cut = True
                self.error = f"corrupt gzip data ({exc}): the lines before it were read"
                break
            self._in_member = True
            if self._d.eof:
                self._next_member(self._d.unused_data)
            out[pos : pos + len(got)] = got
            pos += len(got)
        return pos

    def _next_member(self, rest: bytes) -> None:
        """After a member's end: start the next member, or end on padding/garbage."""
        self._in_member = False
        self._d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        if not rest:
            return  # the next read decides (end of file, or another member)
        self._carry = rest  # another member, or padding/garbage (see readinto)

    def _trailing(self, data: bytes) -> None:
        """Bytes after the last member that start no member: NUL padding is ignored,
        anything else is reported (the data before it is complete and kept)."""
        self._eof = True
        if (data + self.fileobj.read(1 << 16)).strip(b"\0"):
            self.error = "data after the last gzip member is not gzip (ignored)"

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return self.readall()
        buf = bytearray(n)
        got = self.readinto(memoryview(buf))
        return bytes(buf[:got])

    def close(self) -> None:
        self.fileobj.close()
        super().close()


def open_maybe_gzip(path: str) -> BinaryIO:
    """Open a file for binary reading, transparently decompressing gzip (by magic bytes)."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise SourceError(f"cannot open: {exc.strerror}", source=path) from exc
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == _GZIP_MAGIC:
        return GzipStream(raw)  # type: ignore[return-value]
    return raw


class StreamReader:
    """Chunked line reader over a binary stream, shared by file and stdin sources.

    Parameters
    ----------
    fh
        Binary stream.
    source
        Name for errors and quarantine.
    chunk_bytes
        Bytes per read; a batch holds the complete lines of one read.
    checkpoints
        Fingerprint -> offset already stored; lines before it are skipped, which makes
        re-ingesting the same stream a no-op.
    max_line_bytes
        Lines longer than this are quarantined unparsed (``line_too_long``). The reader
        keeps only a prefix of such a line and skips the rest as it reads, so one huge
        line (a runaway argument, a binary blob) costs neither its size in memory nor a
        copy per chunk. ``None`` keeps every line whole.
    """

    def __init__(
        self,
        fh: BinaryIO,
        source: str,
        chunk_bytes: int,
        checkpoints: dict[str, int],
        max_line_bytes: int | None = None,
    ):
        self.fh = fh
        self.source = display_name(source)  # a label: the file is ``fh``
        self.chunk_bytes = chunk_bytes
        self.checkpoints = checkpoints
        self.max_line_bytes = max_line_bytes
        self.bytes_read = 0
        self.skipped_bytes = 0
        self.fingerprint: str | None = None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Turn a failed read (I/O, corrupt gzip) into a SourceError naming the source."""
        try:
            yield
        except (OSError, EOFError, zlib.error) as exc:
            raise SourceError(
                f"read failed after {self.bytes_read} bytes: {exc}", source=self.source
            ) from exc

    def _read(self, n: int) -> bytes:
        with self._reading():
            data = self.fh.read(n)
        self.bytes_read += len(data)
        return data

    def _read_after(self, head: bytes | pa.Buffer, n: int) -> pa.Buffer:
        """``head`` followed by up to ``n`` more bytes of the stream, in one new buffer.

        Reading straight behind the carried-over partial line saves copying every chunk
        once more (``head + read(n)``); the buffer is never changed once lines of it are
        handed out in a batch. It comes from Arrow's memory pool, which hands back the
        memory of batches already written: a fresh ``bytearray`` would be zero-filled and
        fault in 16 MiB of new pages from the kernel on every read.
        """
        buf = pa.allocate_buffer(len(head) + n)
        view = memoryview(buf).cast("B")  # Arrow exports signed bytes
        view[: len(head)] = memoryview(head).cast("B")
        with self._reading():
            got = self.fh.readinto(view[len(head) :]) or 0
        self.bytes_read += got
        return buf if got == n else buf.slice(0, len(head) + got)

    def _cap(self) -> int:
        """Bytes a line may reach before it is known to be over-long."""
        return sys.maxsize if self.max_line_bytes is None else self.max_line_bytes + 2

    def _cut_long_line(
        self, head: bytes | pa.Buffer, offset: int, line_no: int, fp: str
    ) -> tuple[RawBatch, bytes, bool]:
        """Emit the over-long line starting ``head`` as a one-line batch of its prefix.

        Reads on to the line's end, keeping none of it. Returns the batch (its ``sizes``
        holds the line's real size, its ``end_offset`` the offset after it), the bytes
        read after the line, and whether the stream ended.
        """
        assert self.max_line_bytes is not None
        size = len(head)
        rest = b""
        eof = False
        while True:
            data = self._read(self.chunk_bytes)
            if not data:
                eof = True
                size += 1  # the newline a file's last line may lack (as for other lines)
                break
            nl = data.find(b"\n")
            if nl >= 0:
                size += nl + 1
                rest = data[nl + 1 :]
                break
            size += len(data)
        # One byte more than the limit (plus the newline) still reads as over-long.
        prefix = bytes(memoryview(head).cast("B")[: self.max_line_bytes + 3]) + b"\n"
        lines, _, _ = split_lines(prefix, offset)
        batch = RawBatch(
            source=self.source,
            source_fp=fp,
            lines=lines,
            offsets=np.array([offset], dtype=np.int64),
            line_nos=np.array([line_no + 1], dtype=np.int64),
            end_offset=offset + size,
            final=eof,
            sizes=np.array([size], dtype=np.int64),
        )
        return batch, rest, eof

    def _end(self, fp: str, offset: int) -> RawBatch:
        """An empty batch marking the end of the stream."""
        lines, _, _ = split_lines(b"", offset)
        empty = np.empty(0, dtype=np.int64)
        return RawBatch(
            source=self.source, source_fp=fp, lines=lines, offsets=empty, line_nos=empty,
            end_offset=offset, final=True,
        )

    def batches(self) -> Iterator[RawBatch]:
        """Yield batches of complete lines; the last partial line is flushed at EOF.

        Raises
        ------
        SourceError
            After the lines it could read, when the stream was damaged (a truncated or
            corrupt ``.gz``, see :class:`GzipStream`).
        """
        yield from self._batches()
        damage = getattr(self.fh, "error", None)
        if damage is not None:
            raise SourceError(damage, source=self.source)

    def _batches(self) -> Iterator[RawBatch]:
        buf = self._read(self.chunk_bytes)
        if not buf:
            return
        # The fingerprint needs the first line: all of it, or (like the file_tail
        # source) its first max_line_bytes bytes when it is longer than that.
        cap = self._cap()
        while b"\n" not in buf and len(buf) <= cap:
            more = self._read(self.chunk_bytes)
            if not more:
                break
            buf += more
        nl = buf.find(b"\n")  # not split(): that would copy the whole chunk
        if nl < 0 or nl > cap:
            nl = len(buf) if self.max_line_bytes is None else min(len(buf), self.max_line_bytes)
        fp = fingerprint(buf[:nl])
        self.fingerprint = fp
        offset = 0
        line_no = 0
        resume = self.checkpoints.get(fp, 0)
        while resume > offset:
            # Skip what the store already has, counting lines so numbers stay right.
            take = min(len(buf), resume - offset)
            line_no += buf.count(b"\n", 0, take)
            offset += take
            self.skipped_bytes += take
            buf = buf[take:]
            if not buf:
                buf = self._read(self.chunk_bytes)
                if not buf:
                    return
        whole_chunk = False  # buf is a chunk or more with no complete line in it
        while True:
            more = False
            reads = len(buf) < self.chunk_bytes or whole_chunk
            if reads:
                before = len(buf)
                buf = self._read_after(buf, self.chunk_bytes)
                more = len(buf) > before
            eof = reads and not more
            if eof and getattr(self.fh, "cut", False):
                # A cut archive: its complete lines are stored, a partial last line is not
                # (the checkpoint stays before it, so an intact copy read later continues
                # there); batches() then reports the file as failed.
                lines, offs, consumed = split_lines(buf, offset)
                if len(lines):
                    yield RawBatch(
                        source=self.source, source_fp=fp, lines=lines, offsets=offs,
                        line_nos=np.arange(line_no + 1, line_no + len(lines) + 1,
                                           dtype=np.int64),
                        end_offset=offset + consumed,
                    )
                return
            if eof and buf and memoryview(buf)[-1] != NEWLINE:
                buf = bytes(buf) + b"\n"  # a file's last line need not end with a newline
            if not buf:
                if eof:
                    # The last lines went out before the end was seen: say it now, so
                    # state held for the stream (e.g. unanswered JSON-RPC requests) is
                    # released.
                    yield self._end(fp, offset)
                return
            lines, offs, consumed = split_lines(buf, offset)
            whole_chunk = consumed == 0 and not eof
            if whole_chunk and len(buf) > self._cap():
                cut, buf, eof = self._cut_long_line(buf, offset, line_no, fp)
                line_no += 1
                offset = cut.end_offset
                yield cut
                if eof:
                    return
                whole_chunk = False
                continue
            if whole_chunk:
                continue  # a line longer than a chunk: read on
            n = len(lines)
            batch = RawBatch(
                source=self.source,
                source_fp=fp,
                lines=lines,
                offsets=offs,
                line_nos=np.arange(line_no + 1, line_no + n + 1, dtype=np.int64),
                end_offset=offset + consumed,
                final=eof,
            )
            line_no += n
            offset += consumed
            buf = buf[consumed:]
            yield batch
            if eof:
                return


class FileSource:
    """Source ``file``: one log file, plain or gzip.

    Parameters
    ----------
    path
        File path.
    chunk_bytes
        Read size; memory stays bounded by a few chunks whatever the file size.
    checkpoints
        Already-stored offsets per stream fingerprint.
    max_line_bytes
        Over-long lines are cut while read (see :class:`StreamReader`).
    """

    def __init__(
        self,
        path: str,
        chunk_bytes: int,
        checkpoints: dict[str, int],
        max_line_bytes: int | None = None,
    ):
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.checkpoints = checkpoints
        self.max_line_bytes = max_line_bytes
        self.size = Path(path).stat().st_size if Path(path).exists() else 0

    def batches(self) -> Iterator[RawBatch]:
        """Yield the file's lines in batches."""
        fh = open_maybe_gzip(self.path)
        with fh:
            reader = StreamReader(
                fh, self.path, self.chunk_bytes, self.checkpoints, self.max_line_bytes
            )
            self.reader = reader
            yield from reader.batches()

    def progress(self) -> int:
        """Compressed bytes consumed so far (for progress bars)."""
        fh = getattr(self, "reader", None)
        if fh is None:
            return 0
        inner = getattr(fh.fh, "fileobj", None) or fh.fh
        try:
            return int(inner.tell())
        except (OSError, ValueError):
            return 0
