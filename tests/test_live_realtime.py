"""Real time vs backlog in live mode (issue 13).

At a sustained rate of about ``flush_events`` lines per flush interval, most micro-batches
are full by size although the source is not behind: they are real-time traffic and must be
detected at once (in ``detect_passes`` passes), not deferred like a backlog's micro-batches
(which wait for ``backlog_detect_events`` and then run as one large pass: the live RSS peak
and seconds of alert latency). A backlog is told by the source (``behind()``: more than one
read step unread), not by the micro-batch's size alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.file_tail import FileTailLive

from toolwatch.live import LivePipeline
from toolwatch.live.driver import Driver
from toolwatch.store import Store

try:
    from tests.test_live_support import (
        call_line,
        config_for,
        enum_detector,
        recording_detector,
        stored_alerts,
        stored_count,
        wait_for,
        write,
    )
except ImportError:  # pytest's rootdir-relative import
    from test_live_support import (  # type: ignore[no-redef]
        call_line,
        config_for,
        enum_detector,
        recording_detector,
        stored_alerts,
        stored_count,
        wait_for,
        write,
    )

pytestmark = pytest.mark.timeout(120)


def _lines(start: int, n: int) -> bytes:
    """``n`` not-found reads of one enumerating session (the test detector's rule)."""
    return b"".join(
        call_line(i, session="s-enum", resource=f"r{i}", status="not_found")
        for i in range(start, start + n)
    )


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 6_000), min_size=1, max_size=6),
       read_bytes=st.sampled_from([512, 4096, 65536]))
def test_tail_is_behind_exactly_while_more_than_a_read_step_is_unread(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], read_bytes: int
) -> None:
    """``FileTailLive.behind()`` after every item it yields equals "unread bytes of the
    followed file >= read_bytes", and a fully read file is never behind."""
    path = tmp_path_factory.mktemp("tail") / "app.jsonl"
    path.write_bytes(b"")
    src = FileTailLive([str(path)], {}, read_bytes=read_bytes)
    try:
        assert not src.behind()
        for k, size in enumerate(sizes):
            # Whole lines of roughly ``size`` bytes (a line is ~200 bytes).
            write(path, _lines(k * 1000, max(1, size // 200)))
            total = path.stat().st_size
            for item in src.poll(0.0):
                if isinstance(item, RawBatch):
                    unread = total - src.reader.files[next(iter(src.reader.files))].asm.read_offset
                    assert src.behind() == (unread >= read_bytes)
            assert not src.behind()  # everything written was read
    finally:
        src.close()


def _driver(tmp_path: Path, **live: object) -> tuple[LivePipeline, Driver, FileTailLive, Path]:
    data = tmp_path / "store"
    cfg = config_for(data, detect=True, **live)
    lp = LivePipeline(cfg, Store(data), detector=enum_detector(5))
    src = FileTailLive([str(tmp_path / "app.jsonl")], {}, read_bytes=lp.live.read_bytes)
    return lp, Driver(src, lp), src, data


def _poll_into(drv: Driver, src: FileTailLive, lp: LivePipeline) -> None:
    """One driver step by hand: poll, add, flush when due (as ``Driver.run`` does)."""
    for item in src.poll(0.0):
        if isinstance(item, RawBatch):
            lp.add(item)
        else:
            drv.handle(item)
        drv._flush_if_due()


def test_a_full_micro_batch_in_real_time_is_detected_at_once(tmp_path: Path) -> None:
    """Micro-batches full by size from a source that has read everything (real time at
    ~flush_events per interval) are each detected when committed: none is deferred, and
    the alert grows with every micro-batch."""
    (tmp_path / "app.jsonl").write_bytes(b"")
    lp, drv, src, data = _driver(tmp_path, flush_events=40, backlog_detect_interval_s=60.0,
                                 backlog_detect_events=1_000)
    try:
        for k in range(4):
            write(tmp_path / "app.jsonl", _lines(k * 40, 40))
            _poll_into(drv, src, lp)  # 40 lines: due by size, the source is not behind
            wait_for(lambda k=k: stored_count(data) == 40 * (k + 1) and not lp._busy
                     and not lp._queue)
            alerts = stored_alerts(data)
            assert alerts.height == 1
            assert f'"distinct_not_found":{40 * (k + 1)}' in alerts["evidence"][0]
        assert lp.status.extra.get("detect_deferred", 0) == 0
    finally:
        src.close()
        lp.close()


def test_a_backlog_still_defers_its_detection(tmp_path: Path) -> None:
    """The same micro-batches read from a file far longer than one read step (a backlog):
    detection waits for ``backlog_detect_events`` (stored at once, detected together)."""
    (tmp_path / "app.jsonl").write_bytes(_lines(0, 400))  # ~80 KB, read 4 KB at a time
    lp, drv, src, data = _driver(tmp_path, flush_events=10, backlog_detect_interval_s=0.0,
                                 backlog_detect_events=1_000, read_bytes=4096)
    try:
        _poll_into(drv, src, lp)
        lp.drain()
        assert lp.status.extra.get("detect_deferred", 0) > 0
        lp.caught_up()  # the source has nothing more: the waiting detection runs
        lp.drain()
        wait_for(lambda: stored_alerts(data).height == 1)
    finally:
        src.close()
        lp.close()
    assert stored_count(data) == 400
    assert '"distinct_not_found":400' in stored_alerts(data)["evidence"][0]


def test_passes_halve_while_memory_is_high_with_the_same_alerts(tmp_path: Path) -> None:
    """With the RSS at ``live.memory_high_mib`` (1 MiB: always) a detection reads the same
    events in passes of half the size (never below ``max_detect_events / 2``) and raises
    the same alerts; 0 turns it off. Negative values are refused."""
    import threading

    from toolwatch.errors import ConfigError
    from toolwatch.live import LiveConfig

    def run(name: str, high: int) -> tuple[list[int], set[str], int]:
        detector, calls, ids = recording_detector(5)

        data = tmp_path / name
        cfg = config_for(data, detect=True, flush_events=10, backlog_detect_interval_s=0.0,
                         backlog_detect_events=60, max_detect_events=30, detect_passes=2,
                         backlog_detect_passes=1, history_events=0, memory_high_mib=high)
        lp = LivePipeline(cfg, Store(data), detector=detector)
        gate = threading.Event()
        lp.on_commit.append(lambda r: gate.set())
        from toolwatch.ingest.sources.file_tail import LineAssembler

        asm = LineAssembler("feed", {})
        for k in range(6):  # size-triggered flushes of a backlog: one 60-event detection
            lines = b"".join(
                call_line(k * 10 + i, caller=f"c{i}", session=f"s{i}",
                          resource=f"r{k * 10 + i}", status="not_found")
                for i in range(10))
            batch = asm.feed(lines)
            assert batch is not None
            lp.add(batch)
            gate.clear()
            lp.flush(wait=False)
            assert gate.wait(10)
        lp.drain()
        halved = int(lp.status.extra.get("detect_memory_halved", 0))
        lp.close()
        return calls, ids, halved

    low, ids_low, n_low = run("low", 0)
    high, ids_high, n_high = run("high", 1)
    assert low == [60] and n_low == 0  # one backlog pass of 60
    assert n_high == 1 and len(high) >= 2 and sum(high) == 60  # halved: passes of <= 30
    assert ids_low == ids_high and len(ids_high) == 10
    with pytest.raises(ConfigError):
        LiveConfig(memory_high_mib=-1).validate()


def test_a_deferred_detection_never_gathers_more_than_it_can_read(tmp_path: Path) -> None:
    """Backlog micro-batches larger than a third of ``backlog_detect_events``: the
    detection runs before the next one would take the gathered events past what one
    detection reads (``max_detect_events x detect_passes``), so no new event is left out
    of every detection (``detect_capped`` stays 0) and every session's alert counts all
    of its events."""
    import threading

    calls: list[int] = []
    inner = enum_detector(5)

    def detector(events, summaries, history=None):  # type: ignore[no-untyped-def]
        calls.append(events.height)
        return inner(events, summaries, history=history)

    data = tmp_path / "store"
    # 35 + 35 = 70 <= 80 waits; a third 35 would make 105 > 80 (the newest 80 read).
    cfg = config_for(data, detect=True, flush_events=35, backlog_detect_interval_s=0.0,
                     max_detect_events=40, detect_passes=2, backlog_detect_passes=1,
                     history_events=0, memory_high_mib=0)
    lp = LivePipeline(cfg, Store(data), detector=detector)
    gate = threading.Event()
    lp.on_commit.append(lambda r: gate.set())
    from toolwatch.ingest.sources.file_tail import LineAssembler

    asm = LineAssembler("feed", {})
    n = 0
    for _ in range(6):  # six size-triggered flushes of 35 (7 sessions x 5 not-found reads)
        lines = b"".join(
            # entities of their own per flush: only its own events are touched
            call_line(n + i, caller=f"c{n}-{i % 7}", session=f"s{n}-{i % 7}",
                      ip=f"10.0.{n}.{i % 7}", resource=f"r{n + i}", status="not_found")
            for i in range(35))
        n += 35
        batch = asm.feed(lines)
        assert batch is not None
        lp.add(batch)
        gate.clear()
        lp.flush(wait=False)
        assert gate.wait(10)
    lp.drain()
    lp.close()
    assert lp.status.extra.get("detect_capped", 0) == 0
    assert max(calls) <= 80 and sum(calls) == 210  # every new event read, once
    alerts = stored_alerts(data)
    assert alerts.height == 42  # 6 flushes x 7 sessions of 5 not-found reads each
