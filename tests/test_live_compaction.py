"""Live compaction is spread over commits: no commit waits for a whole compaction round.

A live process compacted every ``compact_interval_s`` in one call over every small file.
In an hour's backlog (23M events written by then) that call held the commit thread, and
with it every alert, for ~100 s. Now each commit does at most ``compact_budget_s`` of
merges (at least one) and the next commits go on where it stopped.
"""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from toolwatch import schema
from toolwatch.errors import ConfigError
from toolwatch.live import LiveConfig, LivePipeline
from toolwatch.store import Store

try:
    from tests.test_live import Feeder
    from tests.test_live_support import call_line, config_for, stored_events
except ImportError:  # tests/ itself on sys.path
    from test_live import Feeder  # type: ignore[no-redef]
    from test_live_support import call_line, config_for, stored_events  # type: ignore[no-redef]

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def _batch(k: int, n: int = 200) -> pa.Table:
    cols = {f.name: pa.nulls(n, f.type) for f in schema.EVENTS}
    # batch k repeats batch k-1's last 10 ids (a replay): kept once within a merge
    cols["event_id"] = pa.array([f"fp:{k * (n - 10) + i:09d}" for i in range(n)], pa.string())
    cols["ts"] = pa.array([T0 + timedelta(seconds=k)] * n, schema.EVENTS.field("ts").type)
    cols["ingested_at"] = pa.array([T0] * n, schema.EVENTS.field("ingested_at").type)
    # incompressible text, so a file's size follows its rows (as real events' do)
    cols["tool"] = pa.array([os.urandom(16).hex() for _ in range(n)], pa.string())
    return pa.table(cols, schema=schema.EVENTS)


class _Threes(Store):
    """A store whose merges take 3 of the test's files each, and whose merged files are
    not small any more (as a real 4 MiB merge's are not): set by :func:`_size`."""

    COMPACT_MAX_BYTES = 0
    SMALL_FILE_BYTES = 0


def _size(cls: type[Store], store: Store) -> None:
    biggest = max(os.path.getsize(f) for f in store.files("events"))
    cls.COMPACT_MAX_BYTES = 3 * biggest
    cls.SMALL_FILE_BYTES = int(1.5 * biggest)


def _rows(files: list[str]) -> list[str]:
    con = duckdb.connect()
    try:
        return sorted(r[0] for r in con.execute(
            "SELECT DISTINCT event_id FROM read_parquet($f)", {"f": files}).fetchall())
    finally:
        con.close()


def test_compact_within_a_zero_budget_merges_once_per_call(tmp_path: Path) -> None:
    """Budget 0: one merge per call, ``more`` while groups are left; the ids kept are the
    one-call compaction's. Each call looks at the files anew, so the last few small files
    (fewer than ``compact_min_files``) wait for the next round instead of being merged
    into one more small file."""
    a = _Threes(tmp_path / "a", compact_min_files=4)
    for k in range(12):
        a.write_batch({"events": _batch(k)})
    _size(_Threes, a)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    b = _Threes(tmp_path / "b", compact_min_files=4)

    steps = []
    while True:
        merges, more = a.compact_within("events", 0.0)
        steps.append((merges, more))
        if not more:
            break
    assert steps == [(1, True), (1, True), (1, True), (0, False)]
    assert len(a.files("events")) == 3 + 3  # three merges, three small files waiting

    assert b.compact("events") == 4  # the one-call compaction of the same files
    assert len(b.files("events")) == 4
    assert _rows(a.files("events")) == _rows(b.files("events"))
    assert len(_rows(a.files("events"))) == 12 * 190 + 10  # nothing lost


def test_compact_within_a_budget_stops_starting_merges(tmp_path: Path) -> None:
    """A budget that the first merge already spends stops there; None does them all."""

    class Slow(_Threes):
        calls = 0

    s = Slow(tmp_path / "s", compact_min_files=4)
    table = s.table("events")
    replace = table.replace

    def counted(*a: object, **k: object) -> bool:
        s.calls += 1
        return replace(*a, **k)  # type: ignore[arg-type]

    table.replace = counted  # type: ignore[method-assign]
    for k in range(12):
        s.write_batch({"events": _batch(k)})
    _size(Slow, s)
    assert s.compact_within("events", 1e-9) == (1, True)
    assert s.compact_within("events", None) == (3, False)
    assert s.calls == 4


@pytest.mark.slow  # many live commits and merges
def test_live_commits_compact_a_merge_at_a_time_and_lose_nothing(tmp_path: Path) -> None:
    """Through the real live pipeline: with ``compact_budget_s = 0`` no commit does more
    than one merge, the small files are merged over the following commits, the status
    counts it, and every event is stored exactly once."""
    data = tmp_path / "store"
    calls: list[int] = []

    class Counting(Store):
        COMPACT_MAX_BYTES = 0  # set after the first commits: ~2 live files a merge

        def compact_within(self, dataset: str, budget_s: float | None) -> tuple[int, bool]:
            merges, more = super().compact_within(dataset, budget_s)
            if dataset == "events":
                calls.append(merges)
            return merges, more

    cfg = config_for(data, compact_interval_s=0.001, compact_budget_s=0.0)
    store = Counting(data, compact_min_files=2)
    lp = LivePipeline(cfg, store)
    feed = Feeder()
    n = 0
    for k in range(30):
        lp.add(feed.batch(b"".join(call_line(n + i, session=f"s-{k % 3}") for i in range(20))))
        n += 20
        lp.flush()
        if k == 1:
            Counting.COMPACT_MAX_BYTES = int(2.5 * max(os.path.getsize(f)
                                                       for f in store.files("events")))
    lp.close()

    assert calls and max(calls) <= 1  # never a whole round in one commit
    assert sum(calls) >= 5  # and the merges did happen, commit after commit
    assert lp.status.extra["compact_merges"] >= sum(calls)
    assert lp.status.extra["compact_max_step_s"] >= 0.0
    ev = stored_events(data)
    assert ev.height == n and ev["event_id"].n_unique() == n  # nothing lost or doubled
    assert len(store.files("events")) < 30  # fewer files than commits: merges landed


def test_negative_compact_budget_is_refused(tmp_path: Path) -> None:
    cfg = config_for(tmp_path / "store", compact_budget_s=-1)
    with pytest.raises(ConfigError, match="compact_budget_s"):
        LiveConfig.from_config(cfg)


def test_a_backlog_defers_compaction_up_to_four_intervals(tmp_path: Path) -> None:
    """Catching up, a round waits (storing and detecting come first; every file is merged
    once either way); past 4 intervals since the last round it runs even so, and once
    started it goes on across backlog commits until it is done."""
    data = tmp_path / "store"
    calls: list[str] = []

    class Recording(Store):
        def compact_within(self, dataset: str, budget_s: float | None) -> tuple[int, bool]:
            calls.append(dataset)
            return (1, True) if dataset == "events" and calls.count("events") < 3 else (0, False)

    iv = 300.0
    lp = LivePipeline(config_for(data, compact_interval_s=iv, compact_budget_s=0.0),
                      Recording(data))
    now = time.monotonic()
    try:
        lp._last_compact = now - 2 * iv  # due, but a backlog is being read
        lp._maybe_compact(behind=True)
        assert calls == []
        lp._maybe_compact(behind=False)  # caught up: the round starts, one merge
        assert calls == ["events"]
        lp._maybe_compact(behind=True)  # a backlog again: the round waits
        assert calls == ["events"]

        lp._last_compact = now - 5 * iv  # behind for 4 intervals: it runs even so
        for _ in range(6):  # budget 0: a step a commit, on to the end of the round
            lp._maybe_compact(behind=True)
        assert calls == ["events", "events", "events", "quarantine", "summaries", "alerts",
                         "streams"]
        assert time.monotonic() - lp._last_compact < 60  # the round ended just now
        lp._maybe_compact(behind=False)  # the next round waits an interval
        assert len(calls) == 7
    finally:
        lp.close()
