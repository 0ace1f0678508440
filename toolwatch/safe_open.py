"""Opening files that someone else may have planted: never follow, never block.

A wrapped server's shell tool can write into the store (its stderr spool lives there) and
into any log directory ``toolwatch tail`` follows. What it plants there must not make a
toolwatch process hang or read a file it was not meant to:

* a **FIFO** opened for reading blocks until a writer appears (forever), and SIGTERM's
  handler never runs while ``open(2)`` waits;
* a **symlink** copies whatever it points at (``~/.ssh/id_rsa``) into the store's
  quarantine, where query and dashboard users can read it;
* a **device** or a socket is not a log.

Every path toolwatch reads from the store (and every tailed file) is therefore opened
with ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` on the descriptor it got
(no stat-then-open race): only regular files pass, in the store only files owned by
this process's user or the store's owner. Anything else raises :class:`UnsafeFile` with a
reason; the caller sets it aside (:func:`set_aside`) and counts it.

Standard library only: the wrapper's cold start imports this module.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: Bytes of a tailed file's start inspected to tell a text log from a binary file.
SNIFF_BYTES = 4096


class UnsafeFile(OSError):
    """A path that is not a regular file we may read (the message is the reason)."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        super().__init__(reason)
        self.path = os.fspath(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def check_fd(fd: int, path: str | os.PathLike[str], *,
             owners: tuple[int, ...] | None = None, single_link: bool = False
             ) -> os.stat_result:
    """``fstat(fd)`` if it is a regular file (owned by one of ``owners``); else raise.

    Parameters
    ----------
    fd
        An open descriptor.
    path
        Its name (for the reason only).
    owners
        Accepted owner uids (``None``: any owner).
    single_link
        Refuse a file with more than one hard link (a spool toolwatch created has one; a
        hard link planted in its place names some other file's data).

    Raises
    ------
    UnsafeFile
        With the reason.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFile(path, f"{_kind(st.st_mode)}, not a regular file")
    if owners is not None and st.st_uid not in owners:
        raise UnsafeFile(path, f"owned by uid {st.st_uid}, not by {'/'.join(map(str, owners))}")
    if single_link and st.st_nlink > 1:
        raise UnsafeFile(path, f"has {st.st_nlink} hard links (a link to another file)")
    return st


def open_regular(
    path: str | os.PathLike[str],
    flags: int = os.O_RDONLY,
    mode: int = 0o600,
    *,
    owners: tuple[int, ...] | None = None,
    follow: bool = False,
    single_link: bool = False,
) -> int:
    """Open ``path`` without following a symlink or blocking; a regular file only.

    The descriptor is returned in blocking mode again (a regular file never blocks
    anyway; ``O_NONBLOCK`` is only there so that a FIFO's open returns at once).

    Parameters
    ----------
    path
        The file.
    flags
        ``os.O_*`` access flags (``O_CREAT`` and friends allowed).
    mode
        Permissions of a created file.
    owners
        Accepted owner uids (see :func:`store_owners`); ``None``: any.
    follow
        Follow a symlink at the last component (a tail source configured so).
    single_link
        See :func:`check_fd`.

    Raises
    ------
    UnsafeFile
        The path is a symlink (and ``follow`` is off), a FIFO, a device, a socket, a
        directory, or has the wrong owner.
    OSError
        Any other failure of ``open(2)`` (missing file, permissions).
    """
    nofollow = 0 if follow else _NOFOLLOW
    try:
        fd = os.open(path, flags | nofollow | _NONBLOCK | _CLOEXEC, mode)
    except OSError as exc:
        # ELOOP: O_NOFOLLOW met a symlink. ENXIO: a FIFO opened for writing with no reader
        # (O_NONBLOCK) or a socket; both are planted files, not missing ones.
        import errno

        if exc.errno == errno.ELOOP and not follow:
            raise UnsafeFile(path, "a symlink (not followed)") from None
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):
            raise UnsafeFile(path, "a FIFO, socket or device, not a regular file") from None
        raise
    try:
        check_fd(fd, path, owners=owners, single_link=single_link)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], limit: int = 16 << 20, *,
                 owners: tuple[int, ...] | None = None) -> bytes:
    """The contents of a small regular file (at most ``limit`` bytes), safely opened.

    Raises
    ------
    UnsafeFile
        See :func:`open_regular`; also when the file is longer than ``limit``.
    OSError
        A missing or unreadable file.
    """
    fd = open_regular(path, owners=owners)
    try:
        chunks = []
        got = 0
        while True:
            data = os.read(fd, min(1 << 20, limit + 1 - got))
            if not data:
                break
            chunks.append(data)
            got += len(data)
            if got > limit:
                raise UnsafeFile(path, f"larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def store_owners(root: str | os.PathLike[str]) -> tuple[int, ...]:
    """The uids whose files a store may hold: this process's and the store directory's.

    A writer reads what it or the store's owner wrote (a collector under a service
    account, a dashboard under another, both reading one store owned by the first).
    """
    uid = os.geteuid()
    with contextlib.suppress(OSError):
        owner = os.lstat(root).st_uid
        if owner != uid:
            return (uid, owner)
    return (uid,)


def looks_binary(head: bytes) -> bool:
    """Whether a file starting with ``head`` is not a text log.

    More than 1% NUL bytes in the first :data:`SNIFF_BYTES`, or more than 30% bytes that
    are neither printable ASCII, whitespace, nor part of a UTF-8 sequence (an image, an
    archive, an executable, a database file). Text logs in any ASCII-compatible encoding
    pass, and so does a log holding a few hostile lines: one NUL written by an attacker
    must not make a whole log unread.
    """
    head = head[:SNIFF_BYTES]
    if not head:
        return False
    if head.count(b"\0") * 100 > len(head):
        return True
    # Control bytes other than \t \n \r \f \v \x1b (ANSI colours) are rare in text.
    bad = sum(1 for b in head if b < 0x20 and b not in (9, 10, 11, 12, 13, 27))
    if bad * 100 > len(head) * 5:
        return True
    try:
        head.decode("utf-8")
        return False
    except UnicodeDecodeError as exc:
        if exc.start >= len(head) - 4:  # cut inside a sequence at the sniff's end
            return False
    high = sum(1 for b in head if b >= 0x80)
    return high * 100 > len(head) * 30


def set_aside(path: str | os.PathLike[str], dest_dir: str | os.PathLike[str]) -> str | None:
    """Move ``path`` (never followed: a rename moves the link or FIFO itself) out of the
    way into ``dest_dir``; the new path, or None when it could not be moved."""
    name = os.path.basename(os.fspath(path))
    try:
        os.makedirs(dest_dir, mode=0o700, exist_ok=True)
        dest = os.path.join(dest_dir, f"{name}.{time.time_ns()}")
        os.rename(path, dest)
        return dest
    except OSError:
        return None


__all__ = [
    "SNIFF_BYTES",
    "UnsafeFile",
    "check_fd",
    "looks_binary",
    "open_regular",
    "read_regular",
    "set_aside",
    "store_owners",
]
