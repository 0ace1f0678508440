"""Source ``file``: read whole log files (plain or gzip) in bounded chunks."""

from __future__ import annotations

import contextlib
import glob
import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ingest.records import RawBatch, fingerprint, split_lines
from toolwatch.errors import SourceError

_GZIP_MAGIC = b"\x1f\x8b"


def expand_paths(patterns: list[str]) -> list[str]:
    """Expand globs; ``-`` stays as stdin. A pattern that matches nothing is an error."""
    out: list[str] = []
    for pat in patterns:
        if pat == "-":
            out.append(pat)
            continue
        hits = sorted(glob.glob(pat, recursive=True)) if glob.has_magic(pat) else [pat]
        hits = [h for h in hits if not Path(h).is_dir()] or (
            sorted(str(p) for p in Path(pat).rglob("*") if p.is_file())
            if Path(pat).is_dir()
            else hits
        )
        if not hits:
            raise SourceError("no file matches this pattern", source=pat)
        out.extend(hits)
    return out


def open_maybe_gzip(path: str) -> BinaryIO:
    """Open a file for binary reading, transparently decompressing gzip (by magic bytes)."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller
    except OSError as exc:
        raise SourceError(f"cannot open: {exc.strerror}", source=path) from exc
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    if head == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
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
    """

    def __init__(self, fh: BinaryIO, source: str, chunk_bytes: int, checkpoints: dict[str, int]):
        self.fh = fh
        self.source = source
        self.chunk_bytes = chunk_bytes
        self.checkpoints = checkpoints
        self.bytes_read = 0
        self.skipped_bytes = 0
        self.fingerprint: str | None = None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Turn a failed read (I/O, corrupt gzip) into a SourceError naming the source."""
        try:
            yield
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise SourceError(
                f"read failed after {self.bytes_read} bytes: {exc}", source=self.source
            ) from exc

    def _read(self, n: int) -> bytes:
        with self._reading():
            data = self.fh.read(n)
        self.bytes_read += len(data)
        return data

    def _read_after(self, head: bytes | bytearray, n: int) -> bytearray:
        """``head`` followed by up to ``n`` more bytes of the stream, in one new buffer.

        Reading straight behind the carried-over partial line saves copying every chunk
        once more (``head + read(n)``); the buffer is never changed once lines of it are
        handed out in a batch.
        """
        buf = bytearray(len(head) + n)
        buf[: len(head)] = head
        with self._reading():
            got = self.fh.readinto(memoryview(buf)[len(head) :]) or 0
        self.bytes_read += got
        if got < n:
            del buf[len(head) + got :]
        return buf

    def batches(self) -> Iterator[RawBatch]:
        """Yield batches of complete lines; the last partial line is flushed at EOF."""
        buf = self._read(self.chunk_bytes)
        if not buf:
            return
        while b"\n" not in buf:  # the fingerprint needs the whole first line
            more = self._read(self.chunk_bytes)
            if not more:
                break
            buf += more
        fp = fingerprint(buf.split(b"\n", 1)[0])
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
        while True:
            if len(buf) < self.chunk_bytes:
                before = len(buf)
                buf = self._read_after(buf, self.chunk_bytes)
                more = len(buf) > before
            else:
                more = False
            eof = not more and len(buf) < self.chunk_bytes
            if eof and buf and not buf.endswith(b"\n"):
                buf += b"\n"  # a file's last line need not end with a newline
            if not buf:
                return
            lines, offs, consumed = split_lines(buf, offset)
            if consumed == 0 and not eof:
                continue  # one line longer than a chunk: keep reading (max_line_bytes caps it)
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
    """

    def __init__(self, path: str, chunk_bytes: int, checkpoints: dict[str, int]):
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.checkpoints = checkpoints
        self.size = Path(path).stat().st_size if Path(path).exists() else 0

    def batches(self) -> Iterator[RawBatch]:
        """Yield the file's lines in batches."""
        fh = open_maybe_gzip(self.path)
        with fh:
            reader = StreamReader(fh, self.path, self.chunk_bytes, self.checkpoints)
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
