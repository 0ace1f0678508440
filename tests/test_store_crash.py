"""SIGKILL a store writer at random points of its Delta commits: exactly once, no torn reads.

Each of :data:`TRIALS` trials (seeded, so the kill plan is reproducible; where a timed
kill lands is not) runs real processes on a fresh store (``tests/store_crash_child.py``):

* a writer appending lines ``0..N-1`` of one stream in batches, events plus (in most
  trials) summaries and quarantine rows in the same ``write_batch``, resuming from the
  store's checkpoint, with batch boundaries cut differently on every run (and sometimes a
  resume point rewound), so a replay never lines up with the batches it repeats;
* the test SIGKILLs it :data:`KILLS` times, restarting it after each kill, then lets it
  finish;
* a reader process polls the three tables throughout.

Writers are forked by a "zygote" process that has imported pyarrow, DuckDB, delta-rs and
toolwatch once (each writer is still a process of its own, SIGKILLed by pid): 80 fresh
interpreters would spend ~1 min of the 2 shared cores on imports alone.

Where the kills land. A tenth come within 50 ms of the writer's fork (opening the store,
the first batch), two fifths at a random 0-0.6 s after it has read its checkpoint
(between batches, anywhere in a commit). The other half are aimed: the writer prints a marker
before each Parquet write, table creation and Delta commit, and after each creation and
commit sleeps a few milliseconds (the "sleep hook", :data:`store_crash_child.HOOK_S`);
the test waits for the k-th marker of a chosen kind and kills 0-6 ms later, which lands
inside delta-rs's commit (writing and renaming the log entry), inside a table's creation,
or between two tables' commits of one batch (events committed, streams not yet). The
writer's last marker before it died says which, and the test checks that most kills did
land inside a ``write_batch``.

What must hold:

* the reader never saw a partial batch or a duplicate: every batch commits the ids that
  follow the table's previous end, so each snapshot of ``events`` holds exactly ids
  ``0..k-1`` (count == distinct == max + 1), ``summaries`` exactly the multiples of 5
  below some bound, ``quarantine`` of 11; counts never go down; no poll failed;
* at the end every line is stored exactly once in each table and the checkpoint is N.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from toolwatch.query import query
from toolwatch.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # starts processes, ~1 min

ROOT = Path(__file__).resolve().parents[1]
CHILD = str(ROOT / "tests" / "store_crash_child.py")
TRIALS = 20
KILLS = 3
N = 600
SEED = 20261129
#: Seconds after which a writer counts as hung (a whole run takes ~2 s).
HUNG_S = 60
#: Markers an aimed kill waits for (see store_crash_child's module doc).
AIMS = ("commit", "commit", "committed", "parquet", "create", "created")
#: Last markers that mean the writer died inside a write_batch.
INSIDE = {"batch", "parquet", "create", "created", "commit", "committed"}
EVERY = {"events": 1, "summaries": 5, "quarantine": 11}


class _Writer:
    """A writer forked by the zygote: its stdout (a named pipe), SIGKILL, exit code."""

    def __init__(self, zygote: subprocess.Popen[str], pid: int, fifo: Path, err: Path):
        self.zygote, self.pid, self.err = zygote, pid, err
        self.stdout = open(fifo)  # noqa: SIM115  (blocks until the writer opens its end)
        self.returncode: int | None = None
        self.hung = False

    def _hung(self) -> None:
        self.hung = True
        self.kill()

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> str:
        """Read the rest of stdout, then the zygote's ``exit <code>`` for this writer.

        A writer still running after :data:`HUNG_S` is killed and the test fails (a hang
        is a finding too, and must not take the whole suite's timeout).
        """
        watchdog = threading.Timer(HUNG_S, self._hung)
        watchdog.start()
        try:
            rest = self.stdout.read()
        finally:
            watchdog.cancel()
        assert not self.hung, f"writer {self.pid} hung (> {HUNG_S} s): {self.err.read_text()}"
        self.stdout.close()
        assert self.zygote.stdout is not None
        word, code = self.zygote.stdout.readline().split()
        assert word == "exit"
        self.returncode = int(code)
        return rest


def _writer(zygote: subprocess.Popen[str], store: Path, seed: int, extra: bool) -> _Writer:
    assert zygote.stdin is not None and zygote.stdout is not None
    fifo = Path(f"{store}.{seed}.fifo")
    os.mkfifo(fifo)
    err = Path(f"{store}.stderr")
    zygote.stdin.write(f"writer {store} {N} {seed} {int(extra)} {fifo} {err}\n")
    zygote.stdin.flush()
    word, pid = zygote.stdout.readline().split()
    assert word == "pid", pid
    return _Writer(zygote, int(pid), fifo, err)


def _run_and_kill(proc: _Writer, rng: random.Random) -> tuple[str, str]:
    """SIGKILL ``proc`` at a random point; returns (the plan, the writer's last marker).

    A tenth of the kills come within 50 ms of the fork (opening the store, reading the
    checkpoint, the first batch); other timed kills count from the writer's ``resume``
    marker; aimed kills wait for the ``nth`` marker of one kind. Lines the writer printed
    before it died are still in the pipe, so the last one read says where it died.
    """
    kill = proc.kill
    timer = None
    r = rng.random()
    if r < 0.1:
        aim, nth, delay = "", 0, rng.uniform(0, 0.05)
        plan = f"at start-up +{delay:.2f}s"
        timer = threading.Timer(delay, kill)
        timer.start()
    elif r < 0.5:
        aim, nth, delay = "resume", 1, rng.uniform(0, 0.6)
        plan = f"timed resume+{delay:.2f}s"
    else:
        aim, nth, delay = rng.choice(AIMS), rng.randint(1, 5), rng.uniform(0, 0.006)
        plan = f"aimed {aim}#{nth}+{delay * 1000:.1f}ms"
    last, seen = "?", 0
    for line in proc.stdout:
        last = line.split()[0]
        if last == aim:
            seen += 1
            if seen == nth:
                if aim == "resume":
                    timer = threading.Timer(delay, kill)
                    timer.start()
                else:
                    time.sleep(delay)
                    kill()
    if timer is not None:
        timer.cancel()
        timer.join()
    proc.wait()
    if proc.returncode == 0:
        return plan, "finished"  # the writer got to N before the kill
    assert proc.returncode == -signal.SIGKILL, proc.err.read_text()
    return plan, last


def _check_snapshot(rec: dict[str, list[int | None]], extra: bool) -> None:
    """One reader answer: each table holds exactly its ids from 0 up to some bound."""
    for name, every in EVERY.items():
        count, distinct, top = rec[name]
        assert count == distinct, f"duplicate in {name}: {rec}"
        if not extra and name != "events":
            assert count == 0, rec
        if count == 0:
            assert top is None, rec
        else:
            assert top is not None and top % every == 0 and top // every + 1 == count, (
                f"{name} is not ids 0..k-1 (partial batch or gap): {rec}")


def test_sigkill_during_commits_stores_every_line_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with open(tmp_path / "zygote-stderr", "w") as err:
        zygote = subprocess.Popen([sys.executable, CHILD, "zygote"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    try:
        _trials(zygote, rng, tmp_path)
    finally:
        zygote.kill()
        zygote.wait()


def _trials(zygote: subprocess.Popen[str], rng: random.Random, tmp_path: Path) -> None:
    landed: Counter[str] = Counter()
    plans: list[str] = []
    for trial in range(TRIALS):
        store = tmp_path / f"t{trial}"
        extra = trial % 4 != 3  # most trials write three tables per batch
        out, stop = tmp_path / f"t{trial}.reads", tmp_path / f"t{trial}.stop"
        with open(tmp_path / f"t{trial}.reader-stderr", "w") as err:
            reader = subprocess.Popen([sys.executable, CHILD, "reader", str(store), str(out),
                                       str(stop)], stderr=err, cwd=ROOT)
        try:
            for run in range(KILLS):
                plan, marker = _run_and_kill(
                    _writer(zygote, store, SEED + 100 * trial + run, extra), rng)
                landed[marker] += 1
                plans.append(f"t{trial}r{run}: {plan} -> died after {marker!r}")
            final = _writer(zygote, store, SEED + 100 * trial + KILLS, extra)
            stdout = final.wait()
            assert final.returncode == 0, (
                f"trial {trial}: {final.err.read_text()}\n{plans[-KILLS:]}")
            assert stdout.rstrip().endswith("finished")
        finally:
            stop.touch()
            try:
                reader.wait(timeout=30)
            finally:
                reader.kill()
        assert reader.returncode == 0, (tmp_path / f"t{trial}.reader-stderr").read_text()

        reads = [json.loads(ln) for ln in out.read_text().splitlines()]
        assert reads, f"trial {trial}: the reader answered nothing"
        assert not [r for r in reads if "error" in r], [r for r in reads if "error" in r][:3]
        previous = {name: 0 for name in EVERY}
        for rec in reads:
            _check_snapshot(rec, extra)
            for name in EVERY:
                assert rec[name][0] >= previous[name], f"{name} went back: {rec}"
                previous[name] = rec[name][0]

        s = Store(store)
        got = query(s,
            'SELECT count(*) AS n, count(DISTINCT event_id) AS d, min("offset") AS lo, '
            'max("offset") AS hi FROM events').to_pylist()[0]
        assert got == {"n": N, "d": N, "lo": 0, "hi": N - 1}, (trial, got, plans[-KILLS:])
        for name in ("summaries", "quarantine"):
            want = len(range(0, N, EVERY[name])) if extra else 0
            n, d = query(s, f"SELECT count(*), count(DISTINCT event_id) FROM {name}").to_pylist(
            )[0].values()
            assert (n, d) == (want, want), (trial, name, n, d, plans[-KILLS:])
        assert s.checkpoints() == {"fp": N}

    # The kills did what they were for: most landed inside a write_batch (a Parquet write,
    # a table creation, a commit, or between two tables' commits), not only between
    # batches or during the interpreter's start-up.
    inside = sum(landed[m] for m in INSIDE)
    print(f"where {TRIALS * KILLS} kills landed (last marker): {dict(landed)}")
    assert inside >= TRIALS * KILLS // 2, (landed, plans)
    assert landed["commit"] + landed["create"] >= 3, (landed, plans)
