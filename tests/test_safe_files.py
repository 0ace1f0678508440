"""Planted files in the store and in tailed directories (issue 28, item 6; item 10's tail).

A wrapped server's shell tool can write into the store (its spool lives there) and into
a log directory that ``toolwatch tail`` follows. Real FIFOs (``os.mkfifo``), real
symlinks, real processes, each with a timeout: a hang fails the test instead of
blocking CI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from toolwatch.ingest.sources.file_tail import TailSource
from toolwatch.ingest.sources.wrapper import spool_dir

from toolwatch.query import query
from toolwatch.safe_open import UnsafeFile, looks_binary, open_regular, read_regular
from toolwatch.store import Store

try:
    from tests.test_live_support import call_line
except ImportError:  # tests/ itself on sys.path
    from test_live_support import call_line  # type: ignore[no-redef]

pytestmark = pytest.mark.timeout(120)

TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
MARKER = "TOP-SECRET-7f3a9c"


def tw(data: Path, env: dict, *args: str) -> subprocess.CompletedProcess[str]:
    """A toolwatch command on ``data``; a hang fails (timeout) instead of blocking."""
    return subprocess.run([TOOLWATCH, *args, "-d", str(data)], env=env, timeout=60,
                          capture_output=True, text=True)


def store_text(data: Path) -> str:
    """Every row of every view of the store, as text."""
    con = Store(data).connect()
    try:
        out = []
        for view in ("events", "quarantine", "summaries", "alerts_raw"):
            out.append(str(con.execute(f"SELECT * FROM {view}").fetchall()))
        return "\n".join(out)
    finally:
        con.close()


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A readable file outside the store that must never reach it."""
    p = tmp_path / "secret.txt"
    p.write_text("".join(f"line {i} {MARKER}\n" for i in range(20))
                 + '{"ts":"2026-11-28T10:00:00Z","tool":"x","args":{"k":"' + MARKER + '"}}\n')
    return p


# ----------------------------------------------------------------------- safe_open
@pytest.mark.slow  # starts a process
def test_open_regular_refuses_fifo_symlink_device_and_foreign_owner(
    tmp_path: Path, secret: Path
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(secret)
    for path, why in ((fifo, "FIFO"), (link, "symlink"), (Path("/dev/null"), "device")):
        with pytest.raises(UnsafeFile, match=why):
            open_regular(path)
    with pytest.raises(UnsafeFile, match="FIFO"):  # for writing: ENXIO, no reader
        open_regular(fifo, os.O_WRONLY | os.O_CREAT)
    with pytest.raises(UnsafeFile, match="owned by"):
        read_regular(secret, owners=(os.geteuid() + 1,))
    assert MARKER.encode() in read_regular(secret)
    assert looks_binary(Path(sys.executable).read_bytes()[:4096])
    assert not looks_binary(call_line(1) + "é ünïcode\n".encode())


# ----------------------------------------------------------------------- the store
@pytest.mark.slow  # starts a process
def test_a_fifo_in_the_spool_hangs_nothing_and_is_set_aside(
    tmp_path: Path, tw_env: dict, write_lines: object
) -> None:
    """FIFOs named like a spool, its meta and lock, and the collector lock: collect,
    ingest and analyze finish; the spool FIFO is moved under spool/rejected/."""
    data = tmp_path / "store"
    d = spool_dir(data)
    d.mkdir(parents=True)
    os.mkfifo(d / "x.log")
    os.mkfifo(d / "y.log")
    os.mkfifo(d / "y.meta")
    os.mkfifo(d / "y.lock")
    os.mkfifo(d / "collector.lock")
    log = tmp_path / "calls.jsonl"
    log.write_bytes(b"".join(call_line(i) for i in range(5)))
    r = tw(data, tw_env, "collect", "--once", "--no-stdout")
    assert r.returncode == 0, r.stderr
    assert "refusing" in r.stderr and "FIFO" in r.stderr
    rejected = sorted(p.name.split(".")[0] for p in (d / "rejected").iterdir())
    assert "x" in rejected and not (d / "x.log").exists()
    for args in (("ingest", str(log)), ("analyze", str(log))):
        os.mkfifo(d / "z.log")  # planted again before each command
        r = tw(data, tw_env, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert not (d / "z.log").exists()
    assert query(Store(data), "SELECT count(*) AS n FROM events").column("n")[0].as_py() == 5


@pytest.mark.slow  # starts a process
def test_a_symlinked_spool_never_copies_its_target_into_the_store(
    tmp_path: Path, tw_env: dict, secret: Path
) -> None:
    data = tmp_path / "store"
    d = spool_dir(data)
    d.mkdir(parents=True)
    (d / "s.log").symlink_to(secret)
    (d / "t.meta").symlink_to(secret)
    (d / "t.log").write_bytes(b"")
    os.link(secret, d / "h.log")  # a hard link to another file's data
    r = tw(data, tw_env, "collect", "--once", "--no-stdout")
    assert r.returncode == 0, r.stderr
    assert "symlink" in r.stderr and "hard link" in r.stderr
    assert not (d / "s.log").exists() and not (d / "h.log").exists()
    assert secret.read_text().count(MARKER) == 21  # the target itself is untouched
    assert MARKER not in store_text(data)


@pytest.mark.slow  # starts a process
def test_planted_fifos_in_the_store_state_hang_no_writer(
    tmp_path: Path, tw_env: dict
) -> None:
    """FIFOs as the tables pointer, an old checkpoints file, and the next commits of the
    events and streams tables: ingest finishes and stores the file."""
    data = tmp_path / "store"
    Store(data)  # the layout
    for rel in ("events/_delta_log", "streams/_delta_log"):
        (data / rel).mkdir(parents=True)
    for rel in ("_state/tables.json", "_state/checkpoints.json",
                "events/_delta_log/00000000000000000000.json",
                "streams/_delta_log/00000000000000000001.json"):
        os.mkfifo(data / rel)
    log = tmp_path / "calls.jsonl"
    log.write_bytes(b"".join(call_line(i) for i in range(7)))
    r = tw(data, tw_env, "ingest", str(log))
    assert r.returncode == 0, r.stderr
    st = Store(data)
    assert query(st, "SELECT count(*) AS n FROM events").column("n")[0].as_py() == 7
    assert list(st.checkpoints().values()) == [len(log.read_bytes())]


@pytest.mark.slow  # starts processes
def test_a_planted_last_checkpoint_hangs_no_command(tmp_path: Path, tw_env: dict) -> None:
    """A FIFO (or a link) as a table's ``_last_checkpoint``, which delta-rs opens on every
    load: query, ingest, analyze and collect finish, and the rows are all there (red
    team round 3: every command hung, collect and tail ignoring SIGTERM)."""
    data = tmp_path / "store"
    log = tmp_path / "calls.jsonl"
    log.write_bytes(b"".join(call_line(i) for i in range(4)))
    assert tw(data, tw_env, "ingest", str(log)).returncode == 0
    last = data / "events" / "_delta_log" / "_last_checkpoint"
    more = tmp_path / "more.jsonl"
    for i, args in enumerate((("query", "SELECT count(*) FROM events"), ("ingest", str(more)),
                              ("analyze", str(more)), ("collect", "--once", "--no-stdout"))):
        last.unlink(missing_ok=True)
        if i % 2:
            last.symlink_to("/dev/zero")
        else:
            os.mkfifo(last)
        more.write_bytes(call_line(100 + i))
        r = tw(data, tw_env, *args)  # a hang fails here (timeout) rather than blocking CI
        assert r.returncode == 0, (args, r.stderr)
        assert not last.is_fifo() and not last.is_symlink(), args
    # 4 + one line by ingest and one by analyze (collect has no spool to read)
    assert query(Store(data), "SELECT count(*) AS n FROM events").column("n")[0].as_py() == 6


@pytest.mark.slow  # starts a process
def test_a_stop_signal_ends_the_final_pass_over_a_huge_planted_spool(
    tmp_path: Path, tw_env: dict
) -> None:
    """A 1 TB sparse file planted as a dead wrapper's spool: ``collect --once`` reads it
    as the final pass, and SIGTERM still ends the process (within live.signal_drain_s);
    the spool is left for the next collector."""
    import contextlib
    import json
    import signal
    import time

    data = tmp_path / "store"
    Store(data)
    d = spool_dir(data)
    d.mkdir(parents=True, exist_ok=True)
    (d / "444-dddddddd.meta").write_text(json.dumps({
        "wid": "444-dddddddd", "argv": ["x"], "name": "x", "wrapper_pid": 999_999,
        "child_pid": 999_998, "started_ns": 1}))
    with open(d / "444-dddddddd.log", "wb") as fh:
        fh.truncate(1 << 40)
    cfg = tmp_path / "toolwatch.toml"
    cfg.write_text("[live]\nsignal_drain_s = 1.0\n")
    proc = subprocess.Popen([TOOLWATCH, "collect", "--once", "--no-stdout", "-d", str(data),
                             "-c", str(cfg)], env=tw_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    spool = str(d / "444-dddddddd.log")
    try:
        # Signal once it reads the spool (its handlers are installed by then).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            fds = Path(f"/proc/{proc.pid}/fd")
            with contextlib.suppress(OSError):
                if any(os.readlink(f) == spool for f in fds.iterdir()):
                    break
            time.sleep(0.1)
        time.sleep(1)  # well into the final pass
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)  # a stop that hangs fails here
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert (d / "444-dddddddd.log").exists()


# ----------------------------------------------------------------------- tail
def _read_all(src: TailSource) -> list[bytes]:
    out: list[bytes] = []
    for b in src.poll():
        out.extend(b.lines.to_pylist())
    return out


def test_tail_does_not_follow_a_symlink_unless_configured(
    tmp_path: Path, secret: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_bytes(call_line(1))
    (logs / "b.log").symlink_to(secret)
    src = TailSource([str(logs / "*.log")], {})
    got = b"".join(_read_all(src))
    assert got == call_line(1)
    assert "symlink" in src.rejected[str(logs / "b.log")]
    assert src.counters.files_rejected == 1
    _read_all(src)
    assert src.counters.files_rejected == 1  # reported once, not every poll
    src.close()
    follow = TailSource([str(logs / "*.log")], {}, follow_symlinks=True)
    assert MARKER.encode() in b"".join(_read_all(follow))
    follow.close()


def test_a_tailed_log_swapped_for_a_symlink_is_not_read(
    tmp_path: Path, secret: Path
) -> None:
    log = tmp_path / "app.log"
    log.write_bytes(call_line(1))
    src = TailSource([str(log)], {}, rotate_wait_s=0.0)
    assert _read_all(src) == [call_line(1)]
    with open(log, "ab") as fh:
        fh.write(call_line(2))
    tmp = tmp_path / "swap"
    tmp.symlink_to(secret)
    os.replace(tmp, log)  # the log's name now a link to the secret
    got = b"".join(_read_all(src) + _read_all(src))
    assert got == call_line(2)  # the old file's last line; nothing of the target
    assert "symlink" in src.rejected[str(log)]
    src.close()


def test_tail_sets_aside_fifos_and_binary_files(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / "pipe.log")
    (logs / "key.log").write_bytes(b"\x7fELF\x02\x01\x01\x00" + os.urandom(3000))
    (logs / "ok.log").write_bytes(call_line(1))
    src = TailSource([str(logs / "*.log")], {})
    assert _read_all(src) == [call_line(1)]
    assert "FIFO" in src.rejected[str(logs / "pipe.log")]
    assert "binary" in src.rejected[str(logs / "key.log")]
    assert _read_all(src) == []
    src.close()


def test_tail_reads_a_same_size_truncate_and_rewrite(tmp_path: Path) -> None:
    """49 lines, then truncated and rewritten with 49 others of the same total size and
    the same first line: the 48 new ones are read (were never read: 49 lost)."""
    log = tmp_path / "app.log"
    first = call_line(0)
    old = first + b"".join(call_line(i) for i in range(100, 148))
    new = first + b"".join(call_line(i) for i in range(200, 248))
    assert len(old) == len(new)
    log.write_bytes(old)
    src = TailSource([str(log)], {})
    assert len(_read_all(src)) == 49
    with open(log, "r+b") as fh:
        fh.truncate(0)
        fh.write(new)
    assert os.path.getsize(log) == len(old)
    got = _read_all(src)
    assert b"".join(got) == new
    assert src.counters.truncations == 1
    src.close()


def test_tail_checkpoint_past_the_end_reads_the_rewritten_file_from_the_start(
    tmp_path: Path,
) -> None:
    """The store read 10 lines; while toolwatch was down the file was truncated and 3
    lines written (same first line): the 3 are read, not skipped waiting for growth."""
    log = tmp_path / "app.log"
    log.write_bytes(b"".join(call_line(i) for i in range(10)))
    src = TailSource([str(log)], {})
    _read_all(src)
    cps = {src.files[next(iter(src.files))].asm.fp: os.path.getsize(log)}
    src.close()
    log.write_bytes(b"".join(call_line(i) for i in range(3)))
    again = TailSource([str(log)], cps)
    assert len(_read_all(again)) == 3
    again.close()


@pytest.mark.slow  # starts a process
def test_ingest_of_a_glob_skips_a_fifo_it_matches(tmp_path: Path, tw_env: dict) -> None:
    """``ingest 'logs/*'`` with a FIFO among the matches: the FIFO is skipped (it would
    block ``open(2)`` forever), the log is stored."""
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / "b-pipe.jsonl")
    (logs / "a.jsonl").write_bytes(b"".join(call_line(i) for i in range(4)))
    data = tmp_path / "store"
    r = tw(data, tw_env, "ingest", str(logs / "*"))
    assert r.returncode == 0, r.stderr
    assert query(Store(data), "SELECT count(*) AS n FROM events").column("n")[0].as_py() == 4
