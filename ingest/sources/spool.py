"""Source ``spool``: the collector of wrapped servers' spools, as a live source.

:class:`SpoolSource` reads the spool files that :mod:`toolwatch.ingest.sources.wrapper`
writes; :class:`SpoolLive` adds the contract of
:mod:`toolwatch.ingest.sources.base`: server text travels as :class:`ServerText`, a
spool whose wrapper is gone ends its stream with a synchronous :class:`StreamsEnded`,
and the spool is deleted only on the acknowledgement that follows that commit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolwatch.ingest.sources.base import (
    Item,
    LiveSource,
    ServerText,
    StreamsEnded,
)
from toolwatch.ingest.sources.process import HELLO_MARK, split_stream
from toolwatch.ingest.sources.wrapper import (
    HELLO_CARRY_BYTES,
    HELLO_PROBE_BYTES,
    META_MAX_BYTES,
    REJECTED_DIR,
    WRITER_GRACE_S,
    WRITER_SCAN_INTERVAL_S,
    _lock_nb,
    _pid_alive,
    _refused,
    spool_dir,
    stat_is_regular,
)

from toolwatch.safe_open import (
    UnsafeFile,
    open_regular,
    read_regular,
    set_aside,
    store_owners,
)

if TYPE_CHECKING:
    from toolwatch.ingest.records import RawBatch
    from toolwatch.ingest.sources.file_tail import LineAssembler

    from toolwatch.store import Checkpoint


# --------------------------------------------------------------------------- reader
class _Entry:
    """One spool being read by a collector."""

    def __init__(
        self, wid: str, meta: dict[str, Any], fd: int, asm: LineAssembler, lock: Any = None
    ):
        self.wid = wid
        self.meta = meta
        self.fd = fd
        self.asm = asm
        self.lock = lock  # held once the wrapper is gone
        self.done = False
        self.announced = False
        self.trust: Any = None  # toolwatch.ingest.sources.process.StreamTrust
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        #: Truncations seen (salts the stream id of what follows each one).
        self.generation = 0
        #: The server has exited and its wrapper is gone, but another process (a child
        #: the server forked) still holds the spool open for writing: since when.
        self.writers_since: float | None = None
        self._writers_checked = 0.0
        self._writers = False


def _spool_writers(path: Path, dev: int, ino: int) -> bool:
    """Whether a process other than this one has the spool open for writing (Linux).

    Looks through ``/proc/<pid>/fd`` for the spool's inode (a readlink per descriptor,
    a stat and the fdinfo flags only for those naming the spool). A child the server
    forked inherits its stderr and may outlive it; its lines reach the spool after the
    server's exit. Where ``/proc`` is not there (not Linux) there are never writers.
    """
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return False
    me = str(os.getpid())
    real = os.path.realpath(path)
    names = (real, real + " (deleted)")
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(base)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{base}/{fd}") not in names:
                    continue
                st = os.stat(f"{base}/{fd}")
                if (st.st_dev, st.st_ino) != (dev, ino):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                    flags = next((int(ln.split()[1], 8) for ln in fh if ln.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            if flags & 3:  # O_WRONLY or O_RDWR
                return True
    return False


def _trust_of(meta: dict[str, Any], fd: int) -> Any:
    """The trust state of a spool: its run's record key, and whether the middleware's
    hello is already in the spool (a collector resuming past it must still know)."""
    from toolwatch.ingest.sources.process import StreamTrust

    key = None
    text = meta.get("record_key")
    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            key = bytes.fromhex(text)
    trust = StreamTrust(key or None)
    if trust.key is not None:
        with contextlib.suppress(OSError):
            _probe_hello(trust, fd)
    return trust


def _probe_hello(trust: Any, fd: int) -> None:
    """Search the whole spool for the middleware's verified hello.

    Not only its first bytes: a server may print far more than that before the
    middleware says hello, and a collector resuming past the hello that did not find it
    would read the agent-controlled untagged lines as records. The scan is a C-level
    search per chunk; only a chunk holding the marker is split into lines.
    """
    pos, carry = 0, b""
    while not trust.authenticated:
        chunk = os.pread(fd, HELLO_PROBE_BYTES, pos)
        if not chunk:
            return
        pos += len(chunk)
        buf = carry + chunk
        cut = buf.rfind(b"\n") + 1
        if HELLO_MARK in buf[:cut]:
            trust.probe(buf[:cut])
        # A line longer than a record can be is nobody's hello: keep a bounded tail.
        carry = buf[cut:][-HELLO_CARRY_BYTES:]


class SpoolSource:
    """Read every spool of a store like ``tail`` reads files (collector side).

    A spool is a stream of its own: source ``run:<server name>``, fingerprint of its
    first line salted with the wrapper id, offsets = file offsets, resumed from the
    store's checkpoint. A spool whose wrapper is gone (its lock is free) and whose server
    no longer runs is read to its end, emitted with ``final=True`` (waiting JSON-RPC
    requests are stored unanswered) and reported by :meth:`finished`; the caller removes it
    with :meth:`remove` once that batch is committed.

    Parameters
    ----------
    data_dir
        Store directory.
    checkpoints
        The store's checkpoints (fingerprint -> offset).
    orphans_only
        Only spools whose wrapper is gone (recovery by a process that is not a collector).
    read_bytes, max_line_bytes
        Read size per call; line cut length.
    writer_grace_s
        How long a final pass waits for a child of an exited server that still writes
        to its spool (see :meth:`draining`).
    """

    def __init__(
        self,
        data_dir: str | Path,
        checkpoints: dict[str, int],
        *,
        orphans_only: bool = False,
        read_bytes: int = 4 << 20,
        max_line_bytes: int = 1_048_576,
        writer_grace_s: float = WRITER_GRACE_S,
    ):
        self.dir = spool_dir(data_dir)
        self.checkpoints = checkpoints
        self.orphans_only = orphans_only
        self.read_bytes = read_bytes
        self.max_line_bytes = max_line_bytes
        self.writer_grace_s = writer_grace_s
        self.owners = store_owners(data_dir)
        self.entries: dict[str, _Entry] = {}
        self.new_fingerprints: list[str] = []
        self.bytes_read = 0
        self._finished: list[str] = []
        #: Spool files set aside (name -> reason): never read.
        self.rejected: dict[str, str] = {}
        #: Spools left for a later collector (recovery while a writer still has them).
        self.deferred: set[str] = set()
        #: Truncations or rewrites of a spool noticed (each starts a new stream).
        self.truncations = 0
        #: Bytes of partial lines lost to truncations.
        self.lost_partial_bytes = 0
        self._drain_started: float | None = None
        self._drain_target: dict[str, int] = {}

    def _assembler(self, wid: str, meta: dict[str, Any], generation: int) -> LineAssembler:
        """The line assembler of a spool's ``generation``-th stream (0: before any
        truncation; each truncation starts a stream with an id of its own)."""
        from toolwatch.ingest.sources.file_tail import LineAssembler

        salt = f"spool:{wid}" if not generation else f"spool:{wid}:{generation}"
        return LineAssembler(
            f"run:{meta.get('name', 'server')}",
            self.checkpoints,
            salt=salt.encode(),
            max_line_bytes=self.max_line_bytes,
        )

    def _reject(self, name: str, reason: str) -> None:
        """Set a spool-directory file aside (moved under ``spool/rejected/``), log it."""
        path = self.dir / name
        self.rejected[name] = reason
        _refused(path, reason)
        set_aside(path, self.dir / REJECTED_DIR)

    def _open(self, wid: str) -> _Entry | None:
        import json

        lock = None
        try:
            meta = json.loads(
                read_regular(self.dir / f"{wid}.meta", META_MAX_BYTES, owners=self.owners)
            )
            if not isinstance(meta, dict):
                raise ValueError("meta is not an object")
        except UnsafeFile as exc:
            self._reject(f"{wid}.meta", exc.reason)
            return None
        except (OSError, ValueError):
            # No meta yet: a wrapper writes it right after starting its server. While the
            # wrapper holds its lock, wait for it (the meta names the stream); a wrapper
            # that died before writing it leaves a free lock: read the spool as "server".
            lock = _lock_nb(self.dir / f"{wid}.lock")
            if lock is None:
                return None
            meta = {"name": "server"}
        if self.orphans_only and lock is None:
            lock = _lock_nb(self.dir / f"{wid}.lock")
            if lock is None or _pid_alive(meta.get("child_pid")):
                if lock is not None:
                    lock.close()
                return None
        try:
            # O_NOFOLLOW | O_NONBLOCK, a plain file of ours with one link: a FIFO here
            # hung every collector, a symlink copied any readable file into quarantine.
            fd = open_regular(self.dir / f"{wid}.log", owners=self.owners, single_link=True)
        except UnsafeFile as exc:
            if lock is not None:  # ours (taken just now, or the dead wrapper's): drop it
                (self.dir / f"{wid}.lock").unlink(missing_ok=True)
                lock.close()
            self._reject(f"{wid}.log", exc.reason)
            return None
        except OSError:
            if lock is not None:
                lock.close()
            return None
        asm = self._assembler(wid, meta, 0)
        e = _Entry(wid, meta, fd, asm, lock=lock)
        e.trust = _trust_of(meta, fd)
        return e

    def trust_of(self, source_fp: str) -> Any:
        """The :class:`~toolwatch.ingest.sources.process.StreamTrust` of the spool whose
        stream is ``source_fp`` (None: unknown stream, read as unauthenticated)."""
        for e in self.entries.values():
            if e.asm.fp == source_fp:
                return e.trust
        return None

    def scan(self) -> None:
        """Pick up spools that appeared."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for n in names:
            if not n.endswith(".log"):
                continue
            wid = n[:-4]
            if wid in self.entries or wid in self.deferred:
                continue
            e = self._open(wid)
            if e is not None:
                self.entries[wid] = e

    def _server_gone(self, e: _Entry) -> bool:
        """Whether the wrapper and its server are gone (takes the wrapper's lock if so)."""
        if e.lock is None:
            e.lock = _lock_nb(self.dir / f"{e.wid}.lock")
            if e.lock is None:
                return False
        return not _pid_alive(e.meta.get("child_pid"))

    def _has_writers(self, e: _Entry) -> bool:
        """Whether another process still has the spool open for writing (cached for
        :data:`WRITER_SCAN_INTERVAL_S`)."""
        now = time.monotonic()
        if now - e._writers_checked >= WRITER_SCAN_INTERVAL_S:
            e._writers_checked = now
            e._writers = _spool_writers(self.dir / f"{e.wid}.log", e.dev, e.ino)
            if e._writers and e.writers_since is None:
                e.writers_since = now
        return e._writers

    def _check_rewrite(self, e: _Entry) -> None:
        """A spool truncated or rewritten under the reader starts a new stream from 0.

        A server may truncate its stderr (``ftruncate(2, 0)``); with ``O_APPEND`` its next
        lines go to the new end, below where this reader's file offset points, and were
        never read (51 of 53 calls lost). Detected by size and content
        (:meth:`LineAssembler.rewritten`), looked at only when the size or mtime changed.
        """
        try:
            st = os.fstat(e.fd)
        except OSError:
            return
        changed = (st.st_size, st.st_mtime_ns) != (e.size, e.mtime_ns)
        e.size, e.mtime_ns = st.st_size, st.st_mtime_ns
        if not changed or not e.asm.rewritten(e.fd, st.st_size):
            return
        self.truncations += 1
        self.lost_partial_bytes += len(e.asm.buf)
        e.generation += 1
        e.asm = self._assembler(e.wid, e.meta, e.generation)
        e.announced = False
        os.lseek(e.fd, 0, os.SEEK_SET)
        if e.wid in self._drain_target:  # a final pass reads what the new stream holds
            self._drain_target[e.wid] = st.st_size

    def _read(self, e: _Entry, budget: int) -> Iterator[RawBatch]:
        """Up to ``budget`` bytes of ``e`` as batches; long lines cut as they grow."""
        left = budget
        while left > 0:
            if not e.asm.fp:
                # A checkpoint beyond the end names a stream that was truncated since.
                e.asm.size_hint = e.size
            try:
                data = os.read(e.fd, min(self.read_bytes, left))
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                data = b""
            if not data:
                return
            left -= len(data)
            self.bytes_read += len(data)
            b = e.asm.feed(data)
            self._announce(e)
            if b is not None and len(b):
                yield b
            # Cut an over-long line as it grows, not after the budget: a 500 MiB line
            # was held whole and its checkpoint never moved (collect --once stuck at 64 MiB).
            cut = e.asm.cut_long_line()
            if cut is not None:
                yield cut

    def poll(self, budget: int = 64 << 20) -> Iterator[RawBatch]:
        """Batches of complete lines appended to the spools since the last call.

        A spool whose wrapper, server and every other writer are gone is read to its
        end (any size, in ``budget`` steps between which the caller flushes) and
        finished; one whose server has exited while a child still writes is read on
        (a recovery, ``orphans_only``, leaves it to a later collector instead).
        """
        self.scan()
        for e in list(self.entries.values()):
            if e.done:
                continue
            self._check_rewrite(e)
            before = self.bytes_read
            yield from self._read(e, budget)
            if self.bytes_read - before >= budget:
                continue  # more to read: the next poll goes on
            cut = e.asm.cut_long_line()
            if cut is not None:
                yield cut
            if not self._server_gone(e):
                continue
            if self._has_writers(e):
                if self.orphans_only:
                    self._defer(e)  # its checkpoint covers what was read
                continue
            # Gone: whatever reached the file is all there will be.
            while True:
                got = self.bytes_read
                yield from self._read(e, self.read_bytes)
                if self.bytes_read == got:
                    break
            b = e.asm.feed(b"", final=True)
            self._announce(e)
            e.done = True
            self._finished.append(e.wid)
            if b is not None and (len(b) or b.final):
                yield b

    def _defer(self, e: _Entry) -> None:
        """Stop reading ``e`` in this process; a later collector resumes it."""
        self.entries.pop(e.wid, None)
        self.deferred.add(e.wid)
        with contextlib.suppress(OSError):
            os.close(e.fd)
        if e.lock is not None:
            e.lock.close()

    def draining(self) -> bool:
        """After a stop: whether the final pass has more to read before it may end.

        True while a spool holds bytes that were there when the drain began (a wrapper's
        final pass, ``collect --once``: the whole spool, not one 64 MiB step), and, for up
        to ``writer_grace_s``, while a spool whose server exited is still held open for
        writing by a child of it. Past the grace the rest stays for the next collector.
        """
        now = time.monotonic()
        if self._drain_started is None:
            self._drain_started = now
            for e in self.entries.values():
                with contextlib.suppress(OSError):
                    self._drain_target[e.wid] = os.fstat(e.fd).st_size
        for e in self.entries.values():
            if e.done:
                continue
            target = self._drain_target.get(e.wid)
            if target is None:  # appeared during the drain
                with contextlib.suppress(OSError):
                    target = self._drain_target[e.wid] = os.fstat(e.fd).st_size
            if target is not None and e.asm.read_offset < target:
                return True
            if (
                now - self._drain_started < self.writer_grace_s
                and self._server_gone(e)
                and self._has_writers(e)
            ):
                return True
        return False

    def _announce(self, e: _Entry) -> None:
        if not e.announced and e.asm.fp is not None:
            e.announced = True
            if e.asm.resumed_from > 0:
                self.new_fingerprints.append(e.asm.fp)

    def finished(self) -> list[str]:
        """Wrapper ids whose last batch has been emitted (remove after the commit)."""
        return list(self._finished)

    def remove(self, wids: list[str]) -> None:
        """Delete committed, finished spools."""
        for wid in wids:
            e = self.entries.pop(wid, None)
            with contextlib.suppress(ValueError):
                self._finished.remove(wid)
            for suffix in (".log", ".meta"):
                (self.dir / f"{wid}{suffix}").unlink(missing_ok=True)
            (self.dir / f"{wid}.lock").unlink(missing_ok=True)
            if e is not None:
                with contextlib.suppress(OSError):
                    os.close(e.fd)
                if e.lock is not None:
                    e.lock.close()

    def lag_bytes(self) -> int:
        """Bytes in the spools not yet read."""
        n = 0
        for e in self.entries.values():
            with contextlib.suppress(OSError):
                n += max(0, os.fstat(e.fd).st_size - e.asm.read_offset)
        return n

    def close(self) -> None:
        """Close every spool (they stay for the next collector)."""
        for e in self.entries.values():
            with contextlib.suppress(OSError):
                os.close(e.fd)
            if e.lock is not None:
                e.lock.close()
        self.entries.clear()


def pending_spools(data_dir: str | Path) -> list[dict[str, Any]]:
    """Spools on a store: wrapper id, bytes, whether its wrapper still runs (``status``)."""
    import json

    d = spool_dir(data_dir)
    out: list[dict[str, Any]] = []
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.log")):
        wid = p.stem
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if not stat_is_regular(st):
            # Planted (a FIFO, a symlink): never opened here; listed as orphaned so the
            # next writing command's recovery sets it aside (SpoolSource._reject).
            out.append(
                {
                    "wid": wid,
                    "name": "",
                    "bytes": 0,
                    "wrapper_alive": False,
                    "server_pid": None,
                    "orphaned": True,
                    "planted": True,
                }
            )
            continue
        try:
            meta = json.loads(read_regular(d / f"{wid}.meta", META_MAX_BYTES))
        except (OSError, ValueError):
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
        lock = _lock_nb(d / f"{wid}.lock")
        alive = lock is None
        if lock is not None:
            lock.close()
        with contextlib.suppress(OSError):
            out.append(
                {
                    "wid": wid,
                    "name": meta.get("name", ""),
                    "bytes": st.st_size,
                    "wrapper_alive": alive,
                    "server_pid": meta.get("child_pid"),
                    "orphaned": not alive and not _pid_alive(meta.get("child_pid")),
                }
            )
    return out


def has_orphans(data_dir: str | Path) -> bool:
    """Whether any spool waits for ingestion with its wrapper gone (cheap check)."""
    return any(s["orphaned"] for s in pending_spools(data_dir))


# ------------------------------------------------------------------- live source
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
    poll_interval_s
        Sleep between polls that found nothing.
    **options
        See :class:`SpoolSource` (``read_bytes``, ``max_line_bytes``, ``writer_grace_s``).
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
        poll_interval_s: float = 0.1,
        **options: Any,
    ):
        super().__init__()
        self.reader = SpoolSource(data_dir, checkpoints, orphans_only=orphans_only, **options)
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
                yield ServerText(
                    batch.source, batch.source_fp, g.lines, g.offsets, g.line_nos, reason=g.reason
                )
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
        self.counters.extra = {
            "spools_removed": self.removed,
            "files_rejected": len(src.rejected),
            "truncations": src.truncations,
        }
        self.counters.dropped = src.lost_partial_bytes
        return {
            "lag": {"bytes": src.lag_bytes()},
            "sources": {
                "spools": sorted(src.entries),
                "spool_bytes_read": src.bytes_read,
                "rejected_files": dict(src.rejected),
            },
        }

    def close(self) -> None:
        """Close the spools (they stay for the next collector)."""
        if not self._closed:
            self.reader.close()
        super().close()
