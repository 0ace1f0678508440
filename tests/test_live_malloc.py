"""A live command that detects fixes glibc's mmap threshold (``spool.fix_mmap_threshold``).

In a fresh interpreter each (the setting is process-wide), a live runner is built as
``toolwatch tail`` builds it; then glibc's own accounting (``mallinfo2``) tells whether a
1 MiB buffer, allocated after an 8 MiB one was freed (which raises glibc's dynamic
threshold), got pages of its own that go back to the OS when it is freed.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = r"""
import ctypes, json, sys
from toolwatch.config import Config
from toolwatch.live.config import LiveConfig
from toolwatch.live_cli import _Runner

class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MI
config = Config()
config.store.data_dir = sys.argv[1]
detect = sys.argv[2] == "1"
r = _Runner(config, kind="tail", name="t", sinks=None, detector=None,
            live=LiveConfig(detect=detect))
big = bytearray(8 << 20)
del big
before = libc.mallinfo2().hblkhd
buf = bytes(1 << 20)
mapped = libc.mallinfo2().hblkhd - before
del buf
after_free = libc.mallinfo2().hblkhd - before
r.close()
print(json.dumps({"mapped": mapped, "after_free": after_free}))
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


def _probe(tmp_path: Path, detect: bool, **env: str) -> dict[str, int]:
    e = {k: v for k, v in os.environ.items()
         if k not in ("MALLOC_MMAP_THRESHOLD_", "TOOLWATCH_MEMORY_TUNING")}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "store"),
                          "1" if detect else "0"],
                         env=e, capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_detecting_live_process_returns_large_blocks_when_freed(tmp_path: Path) -> None:
    r = _probe(tmp_path, detect=True)
    assert r["mapped"] >= 1 << 20 and r["after_free"] <= 0


@pytest.mark.parametrize("detect,env", [(False, {}), (True, {"TOOLWATCH_MEMORY_TUNING": "0"}),
                                        (True, {"MALLOC_MMAP_THRESHOLD_": str(64 << 20)})])
def test_left_alone_without_detection_or_when_the_user_chose(
        tmp_path: Path, detect: bool, env: dict[str, str]) -> None:
    r = _probe(tmp_path, detect=detect, **env)
    assert r["mapped"] < 1 << 20  # glibc's dynamic threshold (or the user's) applies
