"""Allocator tuning of a live process: what freed memory goes back to the OS, and when.

Standard library only: :func:`tune_memory` runs in the console entry
(:func:`toolwatch.spool.main`) before polars, pyarrow or DuckDB are imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Commands whose process lives long beside a production server (``ingest`` only with
#: ``--follow``): their allocators are tuned to hand freed memory back (:func:`tune_memory`).
LIVE_COMMANDS = frozenset({"tail", "collect", "kafka", "run"})

#: jemalloc options of polars' allocator in a live process: freed pages go back to the OS
#: after 250 ms (jemalloc's default keeps them ~10 s, polars' own default 0.5 s + 1 s
#: muzzy), a background thread does the purging, so an idle process shrinks too, and one
#: arena instead of 4 per core (polars' worker threads, the reader and the commit thread
#: each filled an arena of their own with the same micro-batch-sized blocks). Without it a
#: live process keeps the high-water mark of the last detection passes. Decay 0 (return
#: at once) measured the least memory but costs ~25% throughput (every micro-batch's
#: buffers page-fault back in); 250 ms keeps a micro-batch's worth for the next one.
#: The hour of log time at 10k events/s as a backlog (docs/performance.md "Live memory",
#: session 7): decay 250 peak 483 / VmHWM 494 MiB at 85.6k events/s; decay 0 447 / 470
#: at 66.3k; polars' defaults (untuned) 525 / 531 at ~78k.
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:250,muzzy_decay_ms:0,narenas:1"

#: glibc malloc arenas in a live process (default: 8 per core). Arrow buffers that DuckDB
#: exports (every parsed micro-batch) are glibc-allocated on the parser threads; each
#: arena keeps its own free memory.
MALLOC_ARENAS = 2

#: Seconds between two ``malloc_trim(0)`` (and Arrow pool releases) in a live process.
TRIM_INTERVAL_S = 5.0

_M_ARENA_MAX = -8  # glibc mallopt parameter

#: Dirty/muzzy decay (ms) set on DuckDB's own jemalloc in a live process (its default is
#: 1000 with no background thread, so what the parser connection freed stays resident
#: until later allocations let it decay: measured 25-58 MiB resident for ~2 MiB in use
#: between micro-batches at 10k events/s). 0: freed pages go back at once.
DUCKDB_DECAY_MS = 0

_ARENAS_ALL = 4096  # jemalloc's MALLCTL_ARENAS_ALL


def _duckdb_mallctl() -> Any:
    """``duckdb_je_mallctl`` of the loaded DuckDB module (its bundled jemalloc), or None."""
    mod = sys.modules.get("_duckdb")
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(path).duckdb_je_mallctl
    except (OSError, AttributeError):  # a DuckDB built without jemalloc (macOS, musl)
        return None
    fn.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    fn.restype = ctypes.c_int
    return fn


def tune_duckdb_allocator(decay_ms: int = DUCKDB_DECAY_MS) -> bool:
    """Make DuckDB's bundled jemalloc return freed pages after ``decay_ms`` (all arenas).

    DuckDB (Linux wheels) allocates through a jemalloc of its own, configured when it
    loads (decay 1000 ms, no background thread, so decay only advances while DuckDB
    allocates); ``_RJEM_MALLOC_CONF`` is polars' and does not reach it. Its options
    can be changed at run time through ``duckdb_je_mallctl``: the default for new arenas
    (``arenas.*_decay_ms``) and each existing arena's (``arena.<i>.*_decay_ms``), then
    one purge of what it holds. Call after ``import duckdb``.

    Returns
    -------
    bool
        Whether DuckDB's jemalloc was found and set.
    """
    fn = _duckdb_mallctl()
    if fn is None:
        return False
    import ctypes

    val = ctypes.c_ssize_t(decay_ms)
    size = ctypes.sizeof(val)
    ok = True
    for kind in ("dirty", "muzzy"):
        ok &= fn(f"arenas.{kind}_decay_ms".encode(), None, None, ctypes.byref(val), size) == 0
    n = ctypes.c_uint(0)
    nsz = ctypes.c_size_t(ctypes.sizeof(n))
    if fn(b"arenas.narenas", ctypes.byref(n), ctypes.byref(nsz), None, 0) == 0:
        for i in range(n.value):
            for kind in ("dirty", "muzzy"):
                # Arenas not initialized yet answer an error: they take arenas.* above.
                fn(f"arena.{i}.{kind}_decay_ms".encode(), None, None, ctypes.byref(val), size)
    fn(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, 0)
    return bool(ok)


#: In a live process with detection, allocations of at least this many bytes get pages of
#: their own (:func:`fix_mmap_threshold`).
MMAP_THRESHOLD = 256 << 10

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Give large heap blocks pages of their own, returned to the OS when freed (glibc).

    glibc serves blocks above its mmap threshold with ``mmap`` and unmaps them on
    ``free``; the threshold is *dynamic*, rising to the size of the largest mmapped block
    freed (up to 32 MiB). A live process frees multi-MiB buffers every micro-batch (numpy
    arrays and Python buffers of a detection pass, a fetch answer's bytes), so after the
    first ones the threshold sits high, these blocks are carved from the heap, and their
    pages stay resident after ``free`` until the next ``malloc_trim``. The probe of a
    1-hour backlog found the highest RSS samples inside a detection pass with 59 MiB of
    glibc heap free but resident. A fixed threshold keeps such blocks mmapped (1M-event
    backlog, interleaved: p95 RSS 416 vs 459 MiB, the same speed;
    docs/performance.md, Live memory).

    Skipped when ``MALLOC_MMAP_THRESHOLD_`` is set (the user's choice), when
    ``TOOLWATCH_MEMORY_TUNING=0``, and where the C library is not glibc. Process-wide:
    called by the live commands when they detect.

    Returns
    -------
    bool
        Whether the threshold was set.
    """
    if (
        os.environ.get("TOOLWATCH_MEMORY_TUNING", "1") == "0"
        or "MALLOC_MMAP_THRESHOLD_" in os.environ
    ):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # not glibc
        return False


_LIBC_TRIM: Any = None


def release_memory() -> None:
    """Return freed heap memory to the OS now: glibc's free pages, Arrow's unused pool.

    What the periodic trimmer of :func:`tune_memory` does every :data:`TRIM_INTERVAL_S`;
    the live memory gate (:mod:`toolwatch.live.memgate`) calls it between two heavy phases
    that take turns, so the second starts from what the first freed. ~1-5 ms.
    """
    global _LIBC_TRIM
    if _LIBC_TRIM is None:
        try:
            import ctypes

            _LIBC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _LIBC_TRIM = False
    with contextlib.suppress(Exception):
        if _LIBC_TRIM:
            _LIBC_TRIM(0)
        pa = sys.modules.get("pyarrow")
        if pa is not None:
            pa.default_memory_pool().release_unused()


#: What ``import polars`` writes into ``_RJEM_MALLOC_CONF`` (its own default, prepended to
#: any value there). A child process of a Python program that imported polars (a
#: supervisor, a notebook, a test or benchmark harness) inherits it: it is polars'
#: setting, not the user's, and must not switch the live tuning off.
POLARS_JEMALLOC_DEFAULT = "dirty_decay_ms:500,muzzy_decay_ms:1000"


def _user_jemalloc_conf(value: str) -> bool:
    """Whether ``_RJEM_MALLOC_CONF`` holds anything beyond polars' own default(s)."""
    rest = value.replace(POLARS_JEMALLOC_DEFAULT, "")
    return any(part.strip() for part in rest.split(","))


def tune_memory(argv: list[str]) -> bool:
    """Allocator settings for a live process; must run before polars/pyarrow are imported.

    A live process (``tail``, ``collect``, ``kafka``, ``run``, ``ingest --follow``)
    allocates and frees a micro-batch's worth of memory every flush through three
    allocators: polars' jemalloc, glibc malloc (Arrow data exported by DuckDB, numpy) and
    Arrow's mimalloc pool. Left at their defaults each keeps what it freed for reuse, and
    the process sits at the sum of their high-water marks. This sets
    ``_RJEM_MALLOC_CONF`` (:data:`JEMALLOC_CONF`, read by polars' jemalloc at its first
    allocation, hence before ``import polars``), caps glibc's arenas
    (:data:`MALLOC_ARENAS`) and starts a daemon thread that returns free heap pages
    (``malloc_trim``) and Arrow's unused pool memory every :data:`TRIM_INTERVAL_S`.

    Settings a user made win: an existing ``_RJEM_MALLOC_CONF`` or ``MALLOC_ARENA_MAX``
    is left alone (but not the value ``import polars`` leaves in the environment of a
    parent process, :data:`POLARS_JEMALLOC_DEFAULT`, which every child inherits);
    ``TOOLWATCH_MEMORY_TUNING=0`` turns all of it off. Other commands (``analyze``,
    ``ingest`` of files) are batch jobs and keep the allocators' defaults.

    Returns
    -------
    bool
        Whether the settings were applied.
    """
    if os.environ.get("TOOLWATCH_MEMORY_TUNING", "1") == "0" or not argv:
        return False
    cmd = argv[0]
    if cmd not in LIVE_COMMANDS and not (cmd == "ingest" and "--follow" in argv):
        return False
    if not _user_jemalloc_conf(os.environ.get("_RJEM_MALLOC_CONF", "")):
        os.environ["_RJEM_MALLOC_CONF"] = JEMALLOC_CONF
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if "MALLOC_ARENA_MAX" not in os.environ:
            libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): jemalloc settings only
        return True

    def trimmer() -> None:
        duck_done = False
        started = time.monotonic()
        next_trim = started + TRIM_INTERVAL_S
        while True:
            # Until DuckDB is loaded, look every 0.1 s: a backlog's first parses and its
            # first detection (the process's first RSS peak, ~3-4 s after start) must
            # find DuckDB's allocator already returning what it frees (it held 30+ MiB
            # resident for ~2 MiB in use at that peak when it was tuned after 5 s).
            # (A process that has not loaded it within 30 s looks at trim times only.)
            now = time.monotonic()
            soon = not duck_done and now - started < 30.0
            time.sleep(0.1 if soon else max(0.0, next_trim - now))
            if not duck_done and "_duckdb" in sys.modules:
                duck_done = True
                with contextlib.suppress(Exception):
                    tune_duckdb_allocator()
            if time.monotonic() < next_trim:
                continue
            next_trim = time.monotonic() + TRIM_INTERVAL_S
            with contextlib.suppress(Exception):
                trim(0)
                pa = sys.modules.get("pyarrow")
                if pa is not None:
                    pa.default_memory_pool().release_unused()

    threading.Thread(target=trimmer, name="toolwatch-trim", daemon=True).start()
    return True
