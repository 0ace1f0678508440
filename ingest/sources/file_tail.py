"""Source ``tail``: follow growing log files like ``tail -F``.

What is followed
    Every file matching the given paths/globs, re-expanded at each poll, so files created
    later are picked up. Files are tracked by ``(device, inode)`` while open, so a file
    seen under two names (``app.log`` renamed to ``app.log.1``, both matching
    ``app.log*``) is read once.

Stream identity and resume
    A file's stream identity is the fingerprint of its first line
    (:func:`toolwatch.ingest.records.fingerprint`), computed once the first line is complete; its
    checkpoint is the byte offset after the last stored line. On start (and for every file
    that appears), the store's checkpoint for that fingerprint is applied: lines before it
    are skipped (counted so line numbers stay right). A restart therefore resumes exactly
    where the last committed micro-batch stopped.

Rotation
    *By rename* (``mv app.log app.log.1; touch app.log``): the path now names a new inode;
    the old one is kept open and read to its end until it has been idle for
    ``rotate_wait_s`` (a writer may append before it reopens), then its last partial line
    is flushed and it is closed; the new file is read from its beginning.
    *By copy-truncate*: the file shrinks below the read offset, or its first line changes;
    that is a new stream (new first line, new fingerprint), read from offset 0. Lines
    written between the last read and the truncation are lost — inherent to copy-truncate.

Partial lines
    A last line without its newline waits for it; it is only flushed (as if terminated)
    when a rotated-away or deleted file is closed. Lines longer than ``max_line_bytes`` are
    cut so memory stays bounded (the parser quarantines them as ``line_too_long``).

Compressed files matching a glob (``app.log.1.gz``) are skipped: tail follows text logs;
``toolwatch ingest`` reads archives.

Planted files (docs/security.md, "Planted files")
    Every file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and read only if ``fstat`` says
    it is a regular file: a FIFO never hangs the reader, a device is never read. A path
    that is a symlink is reported and set aside, not read, unless ``follow_symlinks`` is
    on (a server that can write its log directory could otherwise point ``app.log`` at
    any file it cannot read itself, and have toolwatch copy it into quarantine). A file
    whose first bytes are not text (NUL bytes, control bytes, not UTF-8-like) is set
    aside with its reason instead of being quarantined line by line.
"""

from __future__ import annotations

import errno
import glob as _glob
import os
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from toolwatch.ingest.records import RawBatch, fingerprint, split_lines
from toolwatch.ingest.sources.base import Item, LiveSource, display_name

from toolwatch.safe_open import SNIFF_BYTES, UnsafeFile, looks_binary, open_regular

if TYPE_CHECKING:  # the store (DuckDB) is not imported by sources
    from toolwatch.store import Checkpoint

_GZIP_MAGIC = b"\x1f\x8b"
#: Bytes before a stream's read offset kept as its content mark (see LineAssembler.mark).
MARK_BYTES = 64


class LineAssembler:
    """Turn arbitrary byte chunks of one stream into batches of complete lines.

    Computes the stream fingerprint from the first complete line and skips what the store
    already holds (``checkpoints``). Shared by the tail, pipe and wrapped-server sources.

    Parameters
    ----------
    source
        Name shown in quarantine and errors.
    checkpoints
        Fingerprint -> stored offset; ``None``: never skip (a wrapped server's stderr).
    salt
        Mixed into the fingerprint (``run`` uses the child's pid and start time, so two runs
        of one server are two streams even if their first lines are equal).
    max_line_bytes
        A line longer than this is cut: its first ``max_line_bytes`` bytes (and a little)
        are emitted as one line, which the parser quarantines as ``line_too_long``, and
        the rest of the line is dropped as it arrives, up to its newline — like the batch
        reader (:class:`~toolwatch.ingest.sources.file.StreamReader`), so the same bytes
        give the same lines, offsets and line numbers however they were split. Parsing
        the rest as lines of their own gave one row per read of a huge line, numbered
        every later line wrong, and let a cut-off piece that happens to be a JSON object
        (an argument array of objects) be stored as an event nobody logged.
    """

    def __init__(
        self,
        source: str,
        checkpoints: dict[str, int] | None = None,
        *,
        salt: bytes = b"",
        max_line_bytes: int = 1_048_576,
    ):
        self.source = display_name(source)  # a label (the caller holds the file)
        self.checkpoints = checkpoints
        self.salt = salt
        self.max_line_bytes = max_line_bytes
        self.fp: str | None = None
        self.first_line: bytes | None = None
        self.buf = b""
        self.offset = 0  # stream offset of buf[0]
        self.line_no = 0
        self.skip_to = 0
        self.skipped_bytes = 0
        self.resumed_from = 0
        #: Inside an over-long line already emitted (cut): drop bytes up to its newline.
        self.dropping = False
        #: The last bytes fed (up to :data:`MARK_BYTES`), those just before
        #: :attr:`read_offset`: the content fingerprint that shows a rewrite.
        self.mark = b""
        #: The stream's current size, when known: a checkpoint beyond it names what was
        #: there before a truncation, and is not applied (the stream is read from 0).
        self.size_hint: int | None = None

    @property
    def consumed(self) -> int:
        """Stream offset after the last complete line handed out (or skipped)."""
        return self.offset

    @property
    def read_offset(self) -> int:
        """Stream offset after every byte fed so far."""
        return self.offset + len(self.buf)

    def feed(self, data: bytes, *, final: bool = False) -> RawBatch | None:
        """Add bytes; return a batch of the complete lines now available, if any.

        Parameters
        ----------
        data
            Next bytes of the stream.
        final
            The stream ended: a last partial line is emitted as if it had its newline.
        """
        if data:
            self.mark = (self.mark + data[-MARK_BYTES:])[-MARK_BYTES:]
        if self.dropping:
            nl = data.find(b"\n")
            if nl < 0:
                self.offset += len(data)
                if final:
                    self.dropping = False
                return None
            self.offset += nl + 1
            data = data[nl + 1 :]
            self.dropping = False
        buf = self.buf + data if self.buf else data
        if final and buf and not buf.endswith(b"\n"):
            buf += b"\n"
        if self.fp is None:
            nl = buf.find(b"\n")
            if nl < 0 and len(buf) <= self.max_line_bytes + 2:
                self.buf = buf
                return None
            # An over-long first line is identified by its first max_line_bytes bytes.
            self.first_line = buf[:nl] if nl >= 0 else buf[: self.max_line_bytes]
            self.fp = (
                fingerprint(self.first_line)
                if not self.salt
                else fingerprint(self.salt + b"\0" + self.first_line)
            )
            if self.checkpoints is not None:
                self.skip_to = self.checkpoints.get(self.fp, 0)
                if self.size_hint is not None and self.skip_to > self.size_hint:
                    # The store read further than the file now goes: it was truncated
                    # and written again since (same first line). Waiting for it to grow
                    # past the old offset lost everything written meanwhile.
                    self.skip_to = 0
                self.resumed_from = self.skip_to
        if self.skip_to > self.offset:
            take = min(len(buf), self.skip_to - self.offset)
            self.line_no += buf.count(b"\n", 0, take)
            self.offset += take
            self.skipped_bytes += take
            buf = buf[take:]
            if not buf:
                self.buf = b""
                return None
        lines, offs, consumed = split_lines(buf, self.offset)
        if consumed == 0:
            self.buf = buf
            return None
        n = len(lines)
        batch = RawBatch(
            source=self.source,
            source_fp=self.fp,
            lines=lines,
            offsets=offs,
            line_nos=np.arange(self.line_no + 1, self.line_no + n + 1, dtype=np.int64),
            end_offset=self.offset + consumed,
            final=final,
        )
        self.line_no += n
        self.offset += consumed
        self.buf = buf[consumed:]
        return batch

    def rewritten(self, fd: int, size: int) -> bool:
        """Whether the file ``fd`` this stream reads was truncated or rewritten under it.

        Inode plus content: the caller keeps the inode (``fd``); this compares the
        content. The file shrank below what was read; or its first line is no longer
        there; or the :data:`MARK_BYTES` bytes just before :attr:`read_offset` changed (a
        truncate-and-rewrite back to the same size or past it between two looks, which a
        size check alone never saw: ``tail`` lost 49 lines of a same-size rewrite).
        """
        if size < self.read_offset:
            return True
        first = self.first_line
        if first:
            head = os.pread(fd, len(first), 0)
            if len(head) == len(first) and head != first:
                return True
        mark = self.mark
        return bool(mark) and self.read_offset >= len(mark) and (
            os.pread(fd, len(mark), self.read_offset - len(mark)) != mark)

    def cut_long_line(self) -> RawBatch | None:
        """Emit a waiting line that exceeds ``max_line_bytes`` as one cut line (its
        prefix); the rest of it is dropped as it arrives (see ``max_line_bytes``)."""
        if len(self.buf) <= self.max_line_bytes + 2 or self.fp is None:
            return None
        size = len(self.buf)
        # One byte more than the limit (plus the newline) still reads as over-long.
        piece = self.buf[: self.max_line_bytes + 3] + b"\n"
        self.buf = b""
        lines, offs, _ = split_lines(piece, self.offset)
        batch = RawBatch(
            source=self.source,
            source_fp=self.fp,
            lines=lines,
            offsets=offs,
            line_nos=np.array([self.line_no + 1], dtype=np.int64),
            end_offset=self.offset + size,
            sizes=np.array([size], dtype=np.int64),  # so far: the line is still growing
        )
        self.line_no += 1
        self.offset += size
        self.dropping = True
        return batch


@dataclass
class TailedFile:
    """One open file being followed."""

    path: str
    fd: int
    dev: int
    ino: int
    asm: LineAssembler
    size: int = 0
    detached_at: float | None = None  # renamed away / deleted: closing after idle
    last_growth: float = field(default_factory=time.monotonic)
    mtime_ns: int = 0
    sniffed: bool = False  # its first bytes were checked to be text

    @property
    def key(self) -> tuple[int, int]:
        """``(device, inode)``."""
        return (self.dev, self.ino)


@dataclass
class TailCounters:
    """What the tail source saw."""

    files_opened: int = 0
    files_closed: int = 0
    rotations: int = 0
    truncations: int = 0
    skipped_compressed: int = 0
    bytes_read: int = 0
    resumed_bytes_skipped: int = 0
    lost_partial_bytes: int = 0
    #: Paths set aside unread: symlinks (unless followed), FIFOs, devices, binary files.
    files_rejected: int = 0


class TailSource:
    """Follow files and globs; yields batches of new complete lines.

    Parameters
    ----------
    patterns
        Paths and globs (re-expanded at every poll).
    checkpoints
        Fingerprint -> stored offset (from :meth:`toolwatch.store.Store.checkpoints`).
    read_bytes
        Bytes per read call.
    rotate_wait_s
        How long a renamed-away/deleted file is still read after it stops growing.
    start_at_end
        Files present at the first poll with no checkpoint are read from their end.
    max_line_bytes
        Bound of a waiting partial line.
    follow_symlinks
        Read a path that is a symlink (off: reported in :attr:`rejected`, never read).
    """

    def __init__(
        self,
        patterns: list[str],
        checkpoints: dict[str, int],
        *,
        read_bytes: int = 4 << 20,
        rotate_wait_s: float = 5.0,
        start_at_end: bool = False,
        max_line_bytes: int = 1_048_576,
        follow_symlinks: bool = False,
    ):
        self.patterns = patterns
        self.checkpoints = checkpoints
        self.read_bytes = read_bytes
        self.rotate_wait_s = rotate_wait_s
        self.start_at_end = start_at_end
        self.max_line_bytes = max_line_bytes
        self.files: dict[tuple[int, int], TailedFile] = {}
        self.by_path: dict[str, tuple[int, int]] = {}
        self.counters = TailCounters()
        self._first_scan = True
        self.new_fingerprints: list[str] = []
        self.follow_symlinks = follow_symlinks
        #: Paths set aside, never read: path -> reason (reported once each).
        self.rejected: dict[str, str] = {}
        self._rejected_keys: dict[str, tuple[int, int, int]] = {}

    def _reject(self, path: str, st: os.stat_result, reason: str) -> None:
        """Set ``path`` aside (as it is now: ``(dev, ino, mtime)``) with a reason, once."""
        key = (st.st_dev, st.st_ino, st.st_mtime_ns)
        if self._rejected_keys.get(path) == key:
            return
        self._rejected_keys[path] = key
        self.rejected[path] = reason
        self.counters.files_rejected += 1
        import logging

        logging.getLogger("toolwatch.tail").error(
            "tail: not reading %s: %s", display_name(path), reason)

    # ------------------------------------------------------------------ discovery
    def _expand(self) -> list[str]:
        out: list[str] = []
        for pat in self.patterns:
            if _glob.has_magic(pat):
                out.extend(sorted(_glob.glob(pat, recursive=True)))
            elif Path(pat).is_dir():
                out.extend(sorted(str(p) for p in Path(pat).iterdir() if p.is_file()))
            else:
                out.append(pat)
        seen: set[str] = set()
        return [p for p in out if not (p in seen or seen.add(p))]

    def _open(self, path: str, st: os.stat_result) -> None:
        try:
            # O_NOFOLLOW | O_NONBLOCK, then fstat: a FIFO swapped in after the stat
            # does not block us, a symlink is not followed (unless configured).
            fd = open_regular(path, follow=self.follow_symlinks)
        except UnsafeFile as exc:
            self._reject(path, st, exc.reason)
            return
        except OSError:
            return
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)  # replaced between stat and open: next poll sees the new one
            return
        head = os.pread(fd, 2, 0)
        if head == _GZIP_MAGIC:
            os.close(fd)
            self.counters.skipped_compressed += 1
            self.by_path[path] = (st.st_dev, -st.st_ino)  # remember: don't retry each poll
            return
        asm = LineAssembler(path, self.checkpoints, max_line_bytes=self.max_line_bytes)
        tf = TailedFile(path=path, fd=fd, dev=st.st_dev, ino=st.st_ino, asm=asm)
        if self._first_scan and self.start_at_end and st.st_size > 0:
            self._start_at_end(tf, st.st_size)
        self.files[tf.key] = tf
        self.by_path[path] = tf.key
        self.counters.files_opened += 1

    def _start_at_end(self, tf: TailedFile, size: int) -> None:
        """Position a file with no checkpoint at its end (its first line still fingerprints)."""
        first = os.pread(tf.fd, min(size, self.max_line_bytes + 2), 0)
        nl = first.find(b"\n")
        if nl < 0:
            return
        fp = fingerprint(first[:nl])
        if fp in self.checkpoints:
            return  # known stream: resume from its checkpoint instead
        # Skip to after the last complete line present now.
        tail = os.pread(tf.fd, min(size, 1 << 20), max(0, size - (1 << 20)))
        last_nl = tail.rfind(b"\n")
        end = max(0, size - len(tail)) + last_nl + 1 if last_nl >= 0 else 0
        tf.asm.checkpoints = {**(tf.asm.checkpoints or {}), fp: end}

    def _scan(self) -> None:
        now = time.monotonic()
        present: set[tuple[int, int]] = set()
        for path in self._expand():
            try:
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode):
                    if not self.follow_symlinks:
                        self._reject(path, st, "a symlink (follow_symlinks is off)")
                        continue
                    st = os.stat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                if not stat.S_ISDIR(st.st_mode):
                    self._reject(path, st, "not a regular file (a FIFO, socket or device)")
                continue
            key = (st.st_dev, st.st_ino)
            present.add(key)
            old_key = self.by_path.get(path)
            if old_key == (st.st_dev, -st.st_ino):
                continue  # a compressed file already skipped
            if key in self.files:
                tf = self.files[key]
                if tf.path != path:  # same inode under a new name (rename into the glob)
                    if self.by_path.get(tf.path) == key:
                        del self.by_path[tf.path]
                    tf.path = path
                    tf.asm.source = display_name(path)
                self.by_path[path] = key
                tf.detached_at = None
                continue
            if old_key is not None and old_key in self.files and old_key != key:
                # The path names a new inode: rotation by rename (or delete + recreate).
                self.counters.rotations += 1
                self._detach(self.files[old_key], now)
            self._open(path, st)
        for key, tf in list(self.files.items()):
            if key not in present and tf.detached_at is None:
                self._detach(tf, now)
        self._first_scan = False

    def _detach(self, tf: TailedFile, now: float) -> None:
        tf.detached_at = now
        if self.by_path.get(tf.path) == tf.key:
            del self.by_path[tf.path]

    # ------------------------------------------------------------------ reading
    def _check_truncation(self, tf: TailedFile, size: int, mtime_ns: int = 0) -> bool:
        """Copy-truncate or rewrite: the file shrank below what was read, its first line
        changed, or the bytes before the read offset did (:meth:`LineAssembler.rewritten`).
        Looked at when the size or the mtime changed (a same-size rewrite keeps the size)."""
        if size == tf.size and mtime_ns == tf.mtime_ns:
            return False
        truncated = tf.asm.rewritten(tf.fd, size)
        if truncated:
            self.counters.truncations += 1
            self.counters.lost_partial_bytes += len(tf.asm.buf)
            tf.asm = LineAssembler(tf.path, self.checkpoints, max_line_bytes=self.max_line_bytes)
            # A truncated file restarts a stream: its old checkpoint must not apply if the
            # new first line happens to equal the old one.
            tf.asm.checkpoints = None
            tf.sniffed = False
        return truncated

    def _read_file(self, tf: TailedFile, budget: int) -> Iterator[RawBatch]:
        try:
            st = os.fstat(tf.fd)
        except OSError:
            return
        size = st.st_size
        self._check_truncation(tf, size, st.st_mtime_ns)
        tf.size = size
        tf.mtime_ns = st.st_mtime_ns
        if not tf.sniffed and size > 0 and tf.asm.read_offset == 0:
            tf.sniffed = True
            if looks_binary(os.pread(tf.fd, min(size, SNIFF_BYTES), 0)):
                # Not a log: never quarantined line by line (a key, a database file).
                self._reject(tf.path, st, "not a text log (binary content)")
                self._drop(tf)
                return
        if tf.asm.fp is None:
            tf.asm.size_hint = size  # a checkpoint past the end: truncated since
        got = 0
        while got < budget:
            pos = tf.asm.read_offset
            if pos >= size:
                break
            # Skip straight to a checkpoint once the fingerprint is known.
            if tf.asm.fp is not None and tf.asm.skip_to > pos and not tf.asm.buf:
                data = self._count_skip(tf, size)
                if data is None:
                    break
                continue
            try:
                data = os.pread(tf.fd, min(self.read_bytes, size - pos), pos)
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.ESTALE):
                    break
                raise
            if not data:
                break
            got += len(data)
            self.counters.bytes_read += len(data)
            tf.last_growth = time.monotonic()
            was_fp = tf.asm.fp
            batch = tf.asm.feed(data)
            if was_fp is None and tf.asm.fp is not None:
                self.new_fingerprints.append(tf.asm.fp)
                if tf.asm.resumed_from:
                    self.counters.resumed_bytes_skipped += min(tf.asm.resumed_from, size)
            if batch is not None and len(batch):
                yield batch
            cut = tf.asm.cut_long_line()
            if cut is not None:
                yield cut

    def _count_skip(self, tf: TailedFile, size: int) -> bytes | None:
        """Advance a resumed file to its checkpoint, counting newlines for line numbers."""
        asm = tf.asm
        target = min(asm.skip_to, size)
        while asm.offset < target:
            n = min(16 << 20, target - asm.offset)
            data = os.pread(tf.fd, n, asm.offset)
            if not data:
                return None
            asm.line_no += data.count(b"\n")
            asm.offset += len(data)
            asm.skipped_bytes += len(data)
            asm.mark = data[-MARK_BYTES:]
        if asm.skip_to > size:
            return None  # checkpoint beyond the end: wait for the file to grow
        return b""

    def poll(self, budget: int = 64 << 20) -> Iterator[RawBatch]:
        """Rescan paths, read what is new in every file; yield batches.

        Parameters
        ----------
        budget
            Bytes read per file per poll at most (a backlog is read over several polls,
            so flushes keep happening).
        """
        self._scan()
        now = time.monotonic()
        for key, tf in list(self.files.items()):
            yield from self._read_file(tf, budget)
            if tf.detached_at is not None:
                idle_since = max(tf.last_growth, tf.detached_at)
                if now - idle_since >= self.rotate_wait_s:
                    yield from self._close(key, tf)

    def _drop(self, tf: TailedFile) -> None:
        """Close a file set aside unread; it is not retried until it changes."""
        with_key = self.files.pop(tf.key, None)
        if with_key is not None:
            os.close(tf.fd)
            self.counters.files_closed += 1
        # Remember it like a compressed file (negative inode): not reopened every poll.
        self.by_path[tf.path] = (tf.dev, -tf.ino)

    def _close(self, key: tuple[int, int], tf: TailedFile) -> Iterator[RawBatch]:
        if tf.asm.buf and tf.asm.fp is not None:
            batch = tf.asm.feed(b"", final=True)
            if batch is not None:
                yield batch
        elif tf.asm.buf:
            # The whole file is one line without newline: emit it too.
            batch = tf.asm.feed(b"", final=True)
            if batch is not None:
                yield batch
        os.close(tf.fd)
        del self.files[key]
        self.counters.files_closed += 1

    def lag_bytes(self) -> int:
        """Bytes present in followed files and not yet read."""
        total = 0
        for tf in self.files.values():
            try:
                total += max(0, os.fstat(tf.fd).st_size - tf.asm.read_offset)
            except OSError:
                continue
        return total

    def streams(self) -> dict[str, dict[str, object]]:
        """Per-file state for ``toolwatch status``."""
        return {
            display_name(tf.path): {
                "fingerprint": tf.asm.fp,
                "offset": tf.asm.consumed,
                "size": tf.size,
                "rotated": tf.detached_at is not None,
            }
            for tf in self.files.values()
        }

    def close(self) -> None:
        """Close every file (without flushing partial lines: a restart resumes them)."""
        for tf in self.files.values():
            os.close(tf.fd)
        self.files.clear()


class FileTailLive(LiveSource):
    """``toolwatch tail`` as a :class:`~toolwatch.ingest.sources.base.LiveSource`.

    Wraps :class:`TailSource` (the file follower). A file seen again with a stored
    checkpoint is announced with :class:`StreamsStarted` (warm-up); acknowledgements
    advance :attr:`committed` (fingerprint -> offset the store holds), which is also
    where a file reopened after a truncation check resumes.

    Parameters
    ----------
    patterns, checkpoints, **options
        See :class:`TailSource` (``read_bytes``, ``rotate_wait_s``, ``start_at_end``,
        ``max_line_bytes``, ``follow_symlinks``).
    poll_interval_s
        Sleep between polls that found nothing.
    """

    name = "tail"
    blocking = False

    def __init__(
        self,
        patterns: list[str],
        checkpoints: dict[str, int],
        *,
        poll_interval_s: float = 0.1,
        **options: Any,
    ):
        super().__init__()
        self.committed = dict(checkpoints)
        self.reader = TailSource(patterns, checkpoints, **options)
        self.idle_wait_s = poll_interval_s

    def poll(self, timeout: float) -> Iterator[Item]:
        """New complete lines of every followed file (never waits: files do not block)."""
        for batch in self.reader.poll():
            ev = self._started(self.reader.new_fingerprints)
            if ev is not None:
                yield ev
            yield from self._counted(batch)
        ev = self._started(self.reader.new_fingerprints)
        if ev is not None:
            yield ev

    def behind(self) -> bool:
        """More than one read step (``read_bytes``) of the followed files is unread."""
        return self.reader.lag_bytes() >= self.reader.read_bytes

    def ack(self, checkpoints: Sequence[Checkpoint]) -> None:
        """Record the offsets the store now holds."""
        for c in checkpoints:
            if c.end_offset > self.committed.get(c.source_fp, -1):
                self.committed[c.source_fp] = c.end_offset

    def status(self) -> dict[str, Any]:
        """Unread bytes and the per-file state."""
        c = self.reader.counters
        self.counters.dropped = c.lost_partial_bytes
        self.counters.extra = dict(c.__dict__)
        sources: dict[str, Any] = self.reader.streams()
        if self.reader.rejected:  # paths set aside unread, with the reason
            sources["rejected_files"] = {display_name(p): r
                                         for p, r in self.reader.rejected.items()}
        return {"lag": {"bytes": self.reader.lag_bytes()}, "sources": sources}

    def close(self) -> None:
        """Close every file (partial lines stay: a restart resumes them)."""
        if not self._closed:
            self.reader.close()
        super().close()
