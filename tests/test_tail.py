"""``toolwatch tail``: appends, partial lines, rotation, copy-truncate, globs, resume."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from toolwatch.ingest.sources.file_tail import LineAssembler, TailSource

from toolwatch.live_cli import tail_files

try:
    from tests.test_live_support import (
        LiveThread,
        call_line,
        config_for,
        stored_count,
        stored_events,
        wait_for,
        write,
    )
except ImportError:  # tests/ itself on sys.path
    from test_live_support import (  # type: ignore[no-redef]
        LiveThread,
        call_line,
        config_for,
        stored_count,
        stored_events,
        wait_for,
        write,
    )

pytestmark = pytest.mark.timeout(60)


def lines(a: int, b: int, **kw: object) -> bytes:
    return b"".join(call_line(i, **kw) for i in range(a, b))  # type: ignore[arg-type]


def seqs(data_dir: Path) -> list[int]:
    ev = stored_events(data_dir)
    return sorted(orjson.loads(r)["seq"] for r in ev["raw"].to_list())


# ----------------------------------------------------------------------------- unit
def test_line_assembler_waits_for_newline_and_skips_to_checkpoint() -> None:
    asm = LineAssembler("x", {})
    assert asm.feed(b'{"a":1}\n{"b"') is not None
    assert asm.buf == b'{"b"'
    assert asm.feed(b":2") is None
    b = asm.feed(b"}\n")
    assert b is not None and b.lines.to_pylist() == [b'{"b":2}\n']
    assert int(b.offsets[0]) == 8 and b.end_offset == 16 and list(b.line_nos) == [2]
    # Resuming the same stream skips what the store holds, and keeps line numbers.
    fp = asm.fp
    asm2 = LineAssembler("x", {fp: 8})
    b2 = asm2.feed(b'{"a":1}\n{"b":2}\n{"c":3}\n')
    assert b2 is not None and b2.lines.to_pylist() == [b'{"b":2}\n', b'{"c":3}\n']
    assert list(b2.line_nos) == [2, 3] and asm2.skipped_bytes == 8


def test_line_assembler_cuts_overlong_lines() -> None:
    asm = LineAssembler("x", None, max_line_bytes=100)
    asm.feed(b'{"a":1}\n')
    assert asm.feed(b"x" * 500) is None
    cut = asm.cut_long_line()
    # its prefix (limit + 3 bytes + newline: reads as over-long), like the batch reader
    assert cut is not None and len(cut.lines[0].as_py()) == 104
    assert list(cut.sizes) == [500]
    assert asm.buf == b""


def test_tail_source_rotation_and_truncation_unit(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    write(log, lines(0, 3))
    src = TailSource([str(log)], {}, rotate_wait_s=0.0)
    got = [b for b in src.poll()]
    assert sum(len(b) for b in got) == 3
    # copy-truncate: the file shrinks and starts over with other content
    write(log, lines(100, 102), mode="wb")
    got = [b for b in src.poll()]
    assert src.counters.truncations == 1
    assert sum(len(b) for b in got) == 2 and got[0].source_fp != None  # noqa: E711
    src.close()


# ----------------------------------------------------------------------------- loop
def test_appends_and_partial_last_line(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 3))
    cfg = config_for(data)
    with LiveThread(tail_files, cfg, [str(log)]):
        wait_for(lambda: stored_count(data) == 3)
        partial = call_line(3)
        write(log, partial[:-10])  # no newline yet
        time.sleep(0.8)
        assert stored_count(data) == 3, "a partial line must wait for its newline"
        write(log, partial[-10:] + lines(4, 6))
        wait_for(lambda: stored_count(data) == 6)
    assert seqs(data) == list(range(6))


def test_rotation_by_rename_reads_old_file_to_end(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 5))
    cfg = config_for(data)
    with LiveThread(tail_files, cfg, [str(log)]):
        wait_for(lambda: stored_count(data) == 5)
        with open(log, "ab") as fh:  # the writer keeps its descriptor across the rename
            os.rename(log, tmp_path / "app.log.1")
            fh.write(lines(5, 8))  # late writes to the old inode
            fh.flush()
            write(log, lines(100, 104, session="s-2"))  # the new file
            fh.write(lines(8, 9))
        wait_for(lambda: stored_count(data) == 13)
    assert seqs(data) == [*range(9), *range(100, 104)]
    ev = stored_events(data)
    assert ev["event_id"].n_unique() == 13
    assert ev["source_fp"].n_unique() == 2


def test_copy_truncate_starts_a_new_stream(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 6))
    cfg = config_for(data)
    with LiveThread(tail_files, cfg, [str(log)]) as lt:
        wait_for(lambda: stored_count(data) == 6)
        shutil.copy(log, tmp_path / "app.log.1")  # (not followed: not in the pattern)
        with open(log, "r+b") as fh:
            fh.truncate(0)
        write(log, lines(200, 203))
        wait_for(lambda: stored_count(data) == 9)
    assert seqs(data) == [*range(6), *range(200, 203)]
    assert lt.result.status.events_stored == 9


def test_copy_truncate_detected_even_when_file_regrew(tmp_path: Path) -> None:
    """Truncated and rewritten past the old offset between two polls: first line differs."""
    log = tmp_path / "app.log"
    write(log, lines(0, 2))
    src = TailSource([str(log)], {})
    assert sum(len(b) for b in src.poll()) == 2
    write(log, lines(300, 310), mode="wb")  # bigger than before
    got = list(src.poll())
    assert src.counters.truncations == 1
    assert sum(len(b) for b in got) == 10
    src.close()


def test_new_files_matching_glob_are_picked_up(tmp_path: Path) -> None:
    data = tmp_path / "store"
    (tmp_path / "logs").mkdir()
    write(tmp_path / "logs" / "a.jsonl", lines(0, 2, session="a"))
    cfg = config_for(data)
    with LiveThread(tail_files, cfg, [str(tmp_path / "logs" / "*.jsonl")]):
        wait_for(lambda: stored_count(data) == 2)
        write(tmp_path / "logs" / "b.jsonl", lines(10, 13, session="b"))
        write(tmp_path / "logs" / "ignored.txt", lines(50, 52, session="c"))
        wait_for(lambda: stored_count(data) == 5)
        time.sleep(0.3)
    assert seqs(data) == [0, 1, 10, 11, 12]


def test_same_inode_under_two_matching_names_is_read_once(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 4))
    cfg = config_for(data)
    with LiveThread(tail_files, cfg, [str(tmp_path / "app.log*")]):
        wait_for(lambda: stored_count(data) == 4)
        os.rename(log, tmp_path / "app.log.1")
        write(log, lines(10, 12, session="s-new"))
        write(tmp_path / "app.log.1", lines(4, 5))
        wait_for(lambda: stored_count(data) == 7)
        time.sleep(0.5)
    assert seqs(data) == [0, 1, 2, 3, 4, 10, 11]


def test_restart_resumes_exactly(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 50))
    cfg = config_for(data)
    tail_files(cfg, [str(log)], idle_exit_s=0.5)
    assert stored_count(data) == 50
    write(log, lines(50, 80))
    lp = tail_files(cfg, [str(log)], idle_exit_s=0.5)
    assert lp.status.events_stored == 30
    tail_files(cfg, [str(log)], idle_exit_s=0.5)  # nothing new: nothing stored
    ev = stored_events(data)
    assert ev.height == 80 and ev["event_id"].n_unique() == 80
    assert seqs(data) == list(range(80))
    assert sorted(ev["line_no"].to_list()) == list(range(1, 81))


def test_start_at_end_skips_existing_content(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 10))
    cfg = config_for(data, start_at_end=True)
    with LiveThread(tail_files, cfg, [str(log)]):
        time.sleep(0.5)
        write(log, lines(10, 12))
        wait_for(lambda: stored_count(data) == 2)
    assert seqs(data) == [10, 11]


@pytest.mark.slow  # starts a process
def test_cli_tail_sigterm_flushes_and_reports_status(tmp_path: Path, tw_env: dict) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    write(log, lines(0, 20))
    cfg_file = tmp_path / "tw.toml"
    cfg_file.write_text("[live]\nflush_interval_s = 0.2\nstatus_interval_s = 0.2\n")
    exe = str(Path(sys.executable).with_name("toolwatch"))
    proc = subprocess.Popen(
        [exe, "tail", str(log), "-d", str(data), "-c", str(cfg_file), "--no-stdout"],
        env={**tw_env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        try:
            wait_for(lambda: stored_count(data) == 20, timeout=30)
        except AssertionError as exc:  # say what the process was doing
            proc.send_signal(signal.SIGABRT)
            _, errb = proc.communicate(timeout=30)
            raise AssertionError(f"{exc}; stored {stored_count(data)}; tail's stderr:\n"
                                 f"{errb.decode(errors='replace')[-8000:]}") from None
        st = subprocess.run(
            [exe, "status", "-d", str(data), "--json"], env=tw_env, capture_output=True,
            text=True, timeout=30, check=True,
        )
        rows = orjson.loads(st.stdout)
        assert len(rows) == 1 and rows[0]["kind"] == "tail" and rows[0]["alive"]
        wait_for(lambda: orjson.loads(subprocess.run(
            [exe, "status", "-d", str(data), "--json"], env=tw_env, capture_output=True,
            text=True, timeout=30).stdout)[0]["events_stored"] == 20, timeout=10)
        write(log, lines(20, 25))
        proc.send_signal(signal.SIGTERM)
        out, errb = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, errb.decode()
    assert out == b""  # --no-stdout: nothing on stdout
    # Everything read before the stop was flushed; a restart picks up the rest exactly.
    subprocess.run([exe, "tail", str(log), "-d", str(data), "-c", str(cfg_file), "--no-stdout",
                    "--exit-when-idle", "0.5"], env=tw_env, check=True, timeout=60,
                   capture_output=True)
    assert seqs(data) == list(range(25))
    st = subprocess.run([exe, "status", "-d", str(data), "--json", "--all"], env=tw_env,
                        capture_output=True, text=True, timeout=30, check=True)
    assert all(not r["alive"] for r in orjson.loads(st.stdout))
    # The table, piped (rich would use 80 columns): one line per process, cells unfolded,
    # the name without the store path the title already shows.
    table = subprocess.run([exe, "status", "-d", str(data), "--all"], env=tw_env,
                           capture_output=True, text=True, timeout=30, check=True).stdout
    assert "events/s" in table and "quarantined" in table
    rows = [ln for ln in table.splitlines() if "stopped" in ln]
    assert rows and all(" tail " in ln or "│ tail" in ln for ln in rows), table
