"""Unmapping cold library code (toolwatch/codepages.py): what is dropped, when, and safely."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolwatch.codepages import MADV_DONTNEED, CodePages
from toolwatch.config import Config
from toolwatch.live.config import LiveConfig
from toolwatch.live.memgate import MemoryGate

LIB = "/usr/lib/libfoo.so"
# start-end perms offset dev inode path, as /proc/self/maps writes them.
MAPS = textwrap.dedent(f"""\
    10000-20000 r--p 00000000 08:01 11 {LIB}
    20000-30000 r-xp 00001000 08:01 11 {LIB}
    30000-40000 rw-p 00002000 08:01 11 {LIB}
    40000-50000 r-xp 00000000 00:00 0
    50000-60000 r-xp 00000000 08:01 12 /tmp/gone.so (deleted)
    60000-70000 r-xp 00000000 00:00 0 [vdso]
    70000-80000 r-xp 00003000 08:01 13 /usr/lib/libtextrel.so
    """)


def smaps_for(maps: str, private: dict[str, int]) -> str:
    """An smaps text for ``maps``: each mapping with the given Anonymous KiB (default 0)."""
    out = []
    for line in maps.splitlines():
        rng = line.split()[0]
        out.append(line)
        out += ["Size:                 64 kB", "Rss:                  64 kB",
                "Private_Dirty:         0 kB",
                f"Anonymous:      {private.get(rng, 0):>8} kB", "VmFlags: rd ex mr mw me"]
    return "\n".join(out) + "\n"


class FakeMadvise:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, addr: int, length: int, advice: int) -> int:
        self.calls.append((addr, length, advice))
        return 0


def dropper(tmp_path: Path, maps: str, private: dict[str, int] | None = None
            ) -> tuple[CodePages, FakeMadvise]:
    (tmp_path / "maps").write_text(maps)
    (tmp_path / "smaps").write_text(smaps_for(maps, private or {}))
    fake = FakeMadvise()
    cp = CodePages(str(tmp_path / "maps"), str(tmp_path / "smaps"), madvise=fake)
    cp.enabled = True
    return cp, fake


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_only_verified_clean_code_of_files_is_dropped(tmp_path: Path) -> None:
    cp, fake = dropper(tmp_path, MAPS, {"70000-80000": 8})  # text relocations: private pages
    assert cp.drop() == 0 and fake.calls == []  # first sight: nothing is trusted yet
    assert cp.drop() == 1
    assert fake.calls == [(0x20000, 0x10000, MADV_DONTNEED)]
    assert cp.stats.skipped == 1  # the written mapping is never dropped, on any later call
    assert cp.drop() == 1 and fake.calls[-1] == (0x20000, 0x10000, MADV_DONTNEED)
    assert len(fake.calls) == 2 and cp.stats.drops == 3


DELTA = "/venv/site-packages/deltalake/_internal.abi3.so"
# A library's read-only data (r--p at 0), code, and RELRO (r--p, relocated: private pages).
DELTA_MAPS = MAPS + textwrap.dedent(f"""\
    90000-a0000 r--p 00000000 08:01 21 {DELTA}
    a0000-b0000 r-xp 00010000 08:01 21 {DELTA}
    b0000-c0000 r--p 00020000 08:01 21 {DELTA}
    c0000-d0000 rw-p 00030000 08:01 21 {DELTA}
    """)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_one_library_with_its_read_only_data(tmp_path: Path) -> None:
    (tmp_path / "maps").write_text(DELTA_MAPS)
    (tmp_path / "smaps").write_text(smaps_for(DELTA_MAPS, {"b0000-c0000": 12}))
    fake = FakeMadvise()
    cp = CodePages(str(tmp_path / "maps"), str(tmp_path / "smaps"), madvise=fake,
                   only=b"/deltalake/_internal", read_only_data=True)
    cp.enabled = True
    assert cp.drop() == 0 and fake.calls == []
    assert cp.drop() == 2
    # Its read-only data and code; not its relocated RELRO, not its writable data, and
    # no other library (libfoo's code is what the process-wide dropper handles).
    assert fake.calls == [(0x90000, 0x10000, MADV_DONTNEED), (0xA0000, 0x10000, MADV_DONTNEED)]
    assert cp.stats.skipped == 1
    # The process-wide dropper leaves read-only data alone and still takes every library.
    every, fake2 = dropper(tmp_path, DELTA_MAPS, {"b0000-c0000": 12})
    every.drop(), every.drop()
    assert [c[0] for c in fake2.calls] == [0x20000, 0x70000, 0xA0000]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_disabled_or_failing_drops_nothing_and_never_raises(tmp_path: Path) -> None:
    cp, fake = dropper(tmp_path, MAPS)
    cp.enabled = False
    cp.drop(), cp.drop()
    assert fake.calls == [] and cp.stats.drops == 0
    cp.enabled = True
    (tmp_path / "maps").write_text("garbage\x00 line\n1-2 r-xp zz 08:01 1 /x\n")
    assert cp.drop() == 0  # unparsable maps: nothing, no exception
    (tmp_path / "maps").unlink()
    assert cp.drop() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_a_library_mapped_again_is_verified_again(tmp_path: Path) -> None:
    cp, fake = dropper(tmp_path, MAPS)
    cp.drop(), cp.drop()
    assert len(fake.calls) == 2  # libfoo and libtextrel (clean here)
    # libfoo unloaded, another library at its address: it must be seen twice again.
    maps2 = MAPS.replace(f"00001000 08:01 11 {LIB}", "00001000 08:01 99 /usr/lib/libbar.so")
    (tmp_path / "maps").write_text(maps2)
    (tmp_path / "smaps").write_text(smaps_for(maps2, {"20000-30000": 4}))
    fake.calls.clear()
    cp.drop()
    assert [c[0] for c in fake.calls] == [0x70000]
    fake.calls.clear()
    cp.drop()  # verified now: it holds private pages, so it is skipped for good
    assert [c[0] for c in fake.calls] == [0x70000]


def test_gate_calls_on_start_once_per_phase_only_while_memory_is_high() -> None:
    started: list[int] = []
    gate = MemoryGate(460, rss=lambda: 500.0, on_start=lambda: started.append(1))
    with gate.hold("parse"), gate.hold("parse"):  # nested on one thread
        pass
    with gate.hold("detect"):
        pass
    assert len(started) == 2
    low = MemoryGate(460, rss=lambda: 400.0, on_start=lambda: started.append(1))
    with low.hold("detect"):  # real time sits below the gate: no drop, no re-faults
        pass
    off = MemoryGate(0, rss=lambda: 900.0, on_start=lambda: started.append(1))
    with off.hold("detect"):
        pass
    assert len(started) == 2


def test_live_config_turns_it_on_by_default_and_off_on_request() -> None:
    assert LiveConfig().drop_code_pages is True
    off = LiveConfig.from_config(Config(live={"drop_code_pages": False}))
    assert off.drop_code_pages is False


@pytest.mark.slow  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_real_process_rss_falls_and_the_libraries_still_compute() -> None:
    """In a fresh interpreter: RSS of library code falls, and polars/DuckDB still answer."""
    code = textwrap.dedent("""
        import json
        import duckdb, polars as pl
        from toolwatch.codepages import CODE_PAGES

        def code_kib():
            total, cur = 0, False
            for line in open("/proc/self/smaps"):
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    parts = line.split()
                    cur = parts[1] == "r-xp" and len(parts) > 5 and parts[5].startswith("/")
                elif cur and head == "Rss:":
                    total += int(line.split()[1])
            return total

        def work():
            df = pl.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
            g = df.group_by("k").agg(pl.col("v").sum()).sort("k").rows()
            d = duckdb.sql("SELECT sum(x) FROM range(1000) t(x)").fetchall()
            return [list(r) for r in g], d[0][0]

        first = work()
        CODE_PAGES.enabled = True
        before = code_kib()
        CODE_PAGES.drop(); CODE_PAGES.drop()
        after = code_kib()
        print(json.dumps({"before": before, "after": after, "first": first,
                          "again": work(), "mappings": CODE_PAGES.stats.mappings}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["mappings"] > 5  # python, polars, duckdb, arrow, libc, ...
    # Fell by at least 1 MiB. (Not "by half": in a fresh install's first run, right after
    # pip wrote the libraries, the share the drop removed varied and once fell short.)
    assert res["after"] < res["before"] - 1024, res
    assert res["again"] == res["first"] == [[["a", 4], ["b", 2]], 499500]


@pytest.mark.slow  # starts a process
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
@pytest.mark.parametrize("drop", [True, False])
def test_a_live_commit_unmaps_the_store_library_once_done(tmp_path: Path, drop: bool) -> None:
    """In a fresh interpreter: after each live commit, delta-rs's library holds (almost)
    no resident pages (on; off: they stay), and every event is stored all the same."""
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        from test_live_support import call_line, config_for, stored_count
        from toolwatch.ingest.sources.file_tail import LineAssembler
        from toolwatch.live import LivePipeline
        from toolwatch.store import Store
        from toolwatch.codepages import STORE_CODE

        def delta_kib():
            total, cur = 0, False
            for line in open("/proc/self/smaps"):
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    parts = line.split()
                    cur = len(parts) > 5 and "/deltalake/_internal" in parts[5]
                elif cur and head == "Rss:":
                    total += int(line.split()[1])
            return total

        data = Path({str(tmp_path / "store")!r})
        cfg = config_for(data, detect=False, drop_code_pages={drop!r})
        lp = LivePipeline(cfg, Store(data))
        asm = LineAssembler("feed", {{}})
        after = []
        for k in range(4):
            lp.add(asm.feed(b"".join(call_line(10 * k + i) for i in range(10))))
            lp.flush()
            after.append(delta_kib())
        lp.close()
        print(json.dumps({{"after": after, "stored": stored_count(data),
                          "mappings": STORE_CODE.stats.mappings}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["stored"] == 40
    # The first commit only sees the mappings (they are verified clean at the second).
    if drop:
        assert res["mappings"] == 2  # code and read-only data; the RELRO is skipped
        # What stays: the relocated RELRO's private pages (~3 MiB), whatever a runtime
        # thread ran since; a commit maps ~50 MiB of it.
        assert max(res["after"][1:]) < 8192, res
    else:
        assert res["mappings"] == 0
        assert min(res["after"]) > 16384, res
