"""Fault injection: ``kill -9`` of ``toolwatch tail`` at random points while a writer
appends (and rotates), restart, and check that the store holds every event exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

try:
    from tests.test_live_support import call_line, stored_events
except ImportError:  # tests/ itself on sys.path
    from test_live_support import call_line, stored_events  # type: ignore[no-redef]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
N = 30_000


def writer(log: Path, done: threading.Event) -> None:
    """Append N lines in bursts (partial lines included); rotate by rename half-way."""
    rng = random.Random(7)
    i = 0
    fh = open(log, "ab")  # noqa: SIM115 - rotated below
    try:
        while i < N:
            n = min(rng.randint(200, 1500), N - i)
            data = b"".join(
                call_line(j, session=f"s-{j // 500}", caller=f"c-{j % 13}") for j in range(i, i + n)
            )
            cut = rng.randint(0, len(data))
            fh.write(data[:cut])
            fh.flush()
            time.sleep(0.01)
            fh.write(data[cut:])
            fh.flush()
            i += n
            if i >= N // 2 and not (log.parent / "app.log.1").exists():
                os.rename(log, log.parent / "app.log.1")  # rotate: old fd still written once
                fh.write(call_line(i, session="rot", caller="c-rot"))
                fh.flush()
                fh.close()
                i += 1
                fh = open(log, "ab")  # noqa: SIM115
            time.sleep(rng.uniform(0.1, 0.5))
    finally:
        fh.close()
        done.set()


def test_kill9_tail_at_random_points_stores_every_event_once(tmp_path: Path, tw_env: dict) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    log.touch()
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[live]\nflush_interval_s = 0.3\nflush_events = 3000\nrotate_wait_s = 1.0\n"
                   "detect = false\n")
    cmd = [TOOLWATCH, "tail", str(tmp_path / "app.log*"), "-d", str(data), "-c", str(cfg),
           "--no-stdout"]
    done = threading.Event()
    w = threading.Thread(target=writer, args=(log, done), daemon=True)
    w.start()
    rng = random.Random(11)
    kills = 0
    deadline = time.monotonic() + 80
    while not done.is_set() and time.monotonic() < deadline:
        proc = subprocess.Popen(cmd, env=tw_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.6, 2.5))  # mid-read, mid-parse or mid-commit
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        kills += 1
    w.join(30)
    assert done.is_set() and kills >= 3
    fin = subprocess.run([*cmd, "--exit-when-idle", "2"], env=tw_env, timeout=90,
                         capture_output=True)
    assert fin.returncode == 0, fin.stderr.decode(errors="replace")[-8000:]
    ev = stored_events(data)
    seqs = sorted(orjson.loads(r)["seq"] for r in ev["raw"].to_list())
    assert ev["event_id"].n_unique() == ev.height  # none stored twice
    assert seqs == list(range(N))  # none lost (the line written to the rotated file included)


def test_kill9_during_commit_rolls_forward(tmp_path: Path, tw_env: dict) -> None:
    """Kills landing inside Store.write_batch: staged-but-committed batches roll forward,
    uncommitted ones are discarded and re-read — checked over many quick kills."""
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    log.write_bytes(b"".join(call_line(j) for j in range(60_000)))
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[live]\nflush_interval_s = 0.05\nflush_events = 2000\nread_bytes = 65536\n"
                   "detect = false\n")
    cmd = [TOOLWATCH, "tail", str(log), "-d", str(data), "-c", str(cfg), "--no-stdout"]
    rng = random.Random(5)
    for _ in range(6):
        proc = subprocess.Popen(cmd, env=tw_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    fin = subprocess.run([*cmd, "--exit-when-idle", "1.5"], env=tw_env, timeout=90,
                         capture_output=True)
    assert fin.returncode == 0, fin.stderr.decode(errors="replace")[-8000:]
    ev = stored_events(data)
    assert ev.height == 60_000 and ev["event_id"].n_unique() == 60_000
    assert not list((data / "_staging").glob("*_*"))  # no batch left half-applied
