"""analyze hands ingest's freed pages back before detection (issue 28, memory by content).

``toolwatch.allocator.release_freed_memory`` is what ``analyze``'s single pass calls between
ingest and detection; it must reach DuckDB's own jemalloc (decay 0, purged) unless the
user turned the tuning off. Run in a child process: the allocator settings are
process-wide and must not leak into other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import ctypes
    import duckdb
    from toolwatch import allocator

    duckdb.connect().execute("SELECT sum(range) FROM range(3000000)").fetchall()
    fn = allocator._duckdb_mallctl()
    if fn is None:
        print("no-jemalloc")
        raise SystemExit(0)

    def decay() -> int:
        val = ctypes.c_ssize_t(-2)
        size = ctypes.c_size_t(ctypes.sizeof(val))
        assert fn(b"arenas.dirty_decay_ms", ctypes.byref(val), ctypes.byref(size),
                  None, 0) == 0
        return val.value

    before = decay()
    allocator.release_freed_memory()
    print(before, decay())
    """
)


def _child(tuning: str) -> str:
    env = {**os.environ, "TOOLWATCH_MEMORY_TUNING": tuning}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("tuning", ["1", "0"])
def test_release_reaches_duckdb_unless_tuning_is_off(tuning: str) -> None:
    out = _child(tuning)
    assert out != "no-jemalloc", "DuckDB's Linux wheels bundle jemalloc"
    before, after = (int(x) for x in out.split())
    assert before != 0  # DuckDB's own default, so the check below can fail
    assert after == (0 if tuning == "1" else before)
