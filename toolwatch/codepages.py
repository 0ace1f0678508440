"""Unmap shared libraries' cold code pages so a live process's RSS counts what it uses.

A live process maps ~200 MiB of library code (polars ~180 MiB, DuckDB ~70 MiB, Arrow,
numpy, Python). Code pages are clean and file-backed: the page cache holds them, shared
with every other process that maps the same files, and the kernel can drop them whenever
it needs the memory. RSS still counts every one of them a process has touched, and on
kernels that keep large page-cache folios and map a folio whole on a fault (Linux ≥ 6.16
on ext4, among others) one touched instruction maps up to hundreds of KiB around it:
measured here, one byte read per MiB of polars' library mapped ~730 KiB per touch, and a
1M-event live backlog held ~230 MiB of library code against ~290 MiB of its own memory.

:func:`CodePages.drop` tells the kernel (``madvise(MADV_DONTNEED)``) that this process
no longer needs the resident pages of its read-only executable file mappings. The pages
stay in the page cache; the next instruction fetched from one maps it back with a minor
fault (no I/O). So the RSS falls to the code used since the last drop. The live pipeline
drops as a heavy phase starts while the RSS is at or above ``live.memory_gate_mib``
(:mod:`toolwatch.live.memgate`): under a backlog, where the peaks are. Not in real time,
and not periodically: re-faulting the code at every flush cost alert latency (p99 4-6 s
vs 1.3 s at 10k events/s). ``live.drop_code_pages`` turns it off.

One library is the exception: delta-rs (:data:`STORE_CODE`), the store's, whose code runs
only while the commit thread writes to the store. Each live commit unmaps its pages once
done, at every flush: mapping them back costs the next commit a few hundred minor faults.

Safety: ``MADV_DONTNEED`` on a private file mapping discards the process's private copies
of pages it wrote, which would undo text relocations a loader applied to a library's
code. A mapping is therefore dropped only once it has been seen on two calls with no
private (anonymous) page in ``/proc/self/smaps`` at the second, so a library still being
relocated by the loader is never touched; mappings that hold private pages are skipped
for good. Linux only; elsewhere (or without ``/proc``) this does nothing. Imports nothing
heavy: the trimmer thread of a wrapper may call it.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

#: ``madvise(2)`` advice that drops the page-table entries of a range (Linux, all arches).
MADV_DONTNEED = 4

_Key = tuple[int, int, int, bytes]  # start, end, offset, path


@dataclass
class CodeDropStats:
    """What :class:`CodePages` did (exported in the live status as ``code_drop_*``)."""

    #: Calls that dropped pages.
    drops: int = 0
    #: Seconds those calls took, in total.
    seconds: float = 0.0
    #: Mappings dropped on the last call.
    mappings: int = 0
    #: Mappings never dropped because they hold private (written) pages.
    skipped: int = 0


class CodePages:
    """Drops the resident pages of safe read-only executable file mappings.

    Parameters
    ----------
    maps_path, smaps_path
        The process's memory maps (``/proc/self/maps`` and ``/proc/self/smaps``);
        tests point them elsewhere.
    madvise
        ``madvise(addr, length, advice) -> int`` (None: libc's, loaded on first use).
    only
        Drop only mappings whose path contains this (empty: every library).
    read_only_data
        Also drop read-only data mappings (``r--p``: a library's constants, relocation
        tables and unwind tables), with the same check for private pages (a relocated
        RELRO segment holds some, so it is skipped).
    """

    def __init__(self, maps_path: str = "/proc/self/maps",
                 smaps_path: str = "/proc/self/smaps", madvise: object = None, *,
                 only: bytes = b"", read_only_data: bool = False):
        self.maps_path = maps_path
        self.smaps_path = smaps_path
        self._madvise = madvise
        self._only = only
        self._perms = (b"r-xp", b"r--p") if read_only_data else (b"r-xp",)
        self._lock = threading.Lock()
        #: Whether :meth:`drop` does anything (set by the live pipeline from its config).
        self.enabled = False
        #: Mapping -> True (verified clean: dropped on every call), False (holds private
        #: pages: never dropped), None (seen once: verified on the next call).
        self._state: dict[_Key, bool | None] = {}
        self.stats = CodeDropStats()

    def _libc_madvise(self) -> object:
        if self._madvise is None:
            import ctypes

            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                self._madvise = fn
            except (OSError, AttributeError):
                self._madvise = False
        return self._madvise

    def _code_mappings(self) -> list[_Key]:
        """Read-only executable (and, with ``read_only_data``, read-only) mappings of
        regular files (containing ``only``), in the order of the maps."""
        keys: list[_Key] = []
        with open(self.maps_path, "rb") as f:
            for line in f:
                if self._only and self._only not in line:
                    continue
                parts = line.split(None, 5)
                if len(parts) < 6 or parts[1] not in self._perms or parts[4] == b"0":
                    continue
                path = parts[5].rstrip(b"\n")
                if not path.startswith(b"/") or path.endswith(b"(deleted)"):
                    continue
                if self._only and self._only not in path:
                    continue
                lo, _, hi = parts[0].partition(b"-")
                keys.append((int(lo, 16), int(hi, 16), int(parts[2], 16), path))
        return keys

    def _private_kib(self, wanted: set[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """Anonymous (private copy) KiB of each wanted mapping, from ``smaps``."""
        out: dict[tuple[int, int], int] = {}
        cur: tuple[int, int] | None = None
        with open(self.smaps_path, "rb") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if b"-" in head and not head.endswith(b":"):
                    lo, _, hi = head.partition(b"-")
                    try:
                        rng = (int(lo, 16), int(hi, 16))
                    except ValueError:
                        cur = None
                        continue
                    cur = rng if rng in wanted else None
                elif cur is not None and head in (b"Anonymous:", b"Private_Dirty:"):
                    out[cur] = out.get(cur, 0) + int(line.split()[1])
        return out

    def drop(self) -> int:
        """Unmap the resident pages of verified code mappings; returns how many were.

        Never raises: memory hygiene must not stop a pipeline.
        """
        if not self.enabled or not sys.platform.startswith("linux"):
            return 0
        if not self._lock.acquire(blocking=False):  # another thread is dropping right now
            return 0
        t = time.monotonic()
        try:
            madvise = self._libc_madvise()
            if not madvise:
                return 0
            keys = self._code_mappings()
            pending = [k for k in keys if k in self._state and self._state[k] is None]
            if pending:
                private = self._private_kib({(k[0], k[1]) for k in pending})
                for k in pending:
                    clean = private.get((k[0], k[1]), 0) == 0
                    self._state[k] = clean
                    self.stats.skipped += not clean
            n = 0
            for k in keys:
                state = self._state.setdefault(k, None)
                if state and madvise(k[0], k[1] - k[0], MADV_DONTNEED) == 0:  # type: ignore[operator]
                    n += 1
            live = set(keys)  # forget unmapped libraries (their addresses may be reused)
            if len(self._state) > len(live):
                self._state = {k: v for k, v in self._state.items() if k in live}
            self.stats.drops += 1
            self.stats.mappings = n
            return n
        except Exception:  # no /proc, an odd line: do nothing
            return 0
        finally:
            self.stats.seconds += time.monotonic() - t
            self._lock.release()


#: The process's dropper (one per process: the maps are the process's).
CODE_PAGES = CodePages()

#: The store library's pages: delta-rs (``deltalake/_internal*.so``, 130 MB) runs only
#: while a batch is committed, compacted or listed, yet the folios one commit touches map
#: ~50 MiB of it (``update_incremental`` alone ~43), and a live process kept 55-65 MiB of
#: its code and read-only data resident: most of its growth over the store before Delta
#: (delta-rs's own heap adds ~5 MiB). A live commit unmaps them once done
#: (:meth:`toolwatch.live.commit.CommitMixin._commit`); the next commit maps them back
#: with ~200 minor faults (commit median +1 ms, no I/O) and the drop reads the maps
#: (~2.5 ms), unlike polars' and DuckDB's code, which every flush runs (:data:`CODE_PAGES`).
STORE_CODE = CodePages(only=b"/deltalake/_internal", read_only_data=True)
