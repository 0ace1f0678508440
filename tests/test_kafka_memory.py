"""The consumer's fetch buffers get pages of their own (``tune_fetch_malloc``).

Each check runs in a fresh interpreter: the setting is process-wide (glibc ``mallopt``),
and glibc's dynamic mmap threshold depends on what the process freed before. The
behaviour asserted is glibc's own accounting (``mallinfo2``): after a large buffer was
freed, a 1 MiB ``bytes`` is carved from the heap by default (its freed pages then stay
resident until a ``malloc_trim``), and is mmapped -- returned to the OS when freed -- once
the consumer's threshold is set.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, sys
from toolwatch.ingest.sources.kafka import tune_fetch_malloc

class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MI
tuned = tune_fetch_malloc()
big = bytearray(8 << 20)  # like a fetch answer: glibc raises its threshold when freed
del big
before = libc.mallinfo2().hblkhd
buf = bytes(1 << 20)  # like a joined record batch
mapped = libc.mallinfo2().hblkhd - before
del buf
after_free = libc.mallinfo2().hblkhd - before
print(json.dumps({"tuned": tuned, "mapped": mapped, "after_free": after_free}))
"""


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc >= 2.33"),
    pytest.mark.slow,  # starts a process
]


def _probe(**env: str) -> dict[str, int | bool]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("MALLOC_MMAP_THRESHOLD_", "TOOLWATCH_MEMORY_TUNING")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=e, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_tuned_fetch_buffers_are_mmapped_and_returned_when_freed() -> None:
    r = _probe()
    assert r["tuned"] is True
    assert r["mapped"] >= 1 << 20  # its own pages...
    assert r["after_free"] <= 0  # ...given back at free, no malloc_trim needed


def test_untuned_glibc_carves_them_from_the_heap() -> None:
    """What the setting is for: glibc's default after an 8 MiB buffer was freed."""
    r = _probe(TOOLWATCH_MEMORY_TUNING="0")
    assert r["tuned"] is False
    assert r["mapped"] < 1 << 20


def test_a_users_threshold_wins() -> None:
    r = _probe(MALLOC_MMAP_THRESHOLD_=str(64 << 20))
    assert r["tuned"] is False
    assert r["mapped"] < 1 << 20  # the user's 64 MiB threshold is what applies
