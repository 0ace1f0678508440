"""The end of a backlog (issue 14): its last lines go with the detection it left waiting.

A Kafka backlog ends with a poll of the partitions' last messages (often two partitions'
tails in one poll) and the source is then no longer behind. Before, the first partition's
batch reached ``flush_events`` and flushed alone as a *backlog* micro-batch (its detection
deferred once more), the second waited a whole flush interval and was detected in a
detection of its own, and the deferred one ran after an empty poll: three detections where
``tail`` of the same events runs one. These tests drive the real driver, pipeline, store
and commit thread with a scripted source (the poll sequence of such a backlog end) so the
order of polls is exact.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.base import Item, LiveSource, StreamsStarted

from toolwatch.live import LivePipeline
from toolwatch.live.driver import Driver
from toolwatch.live.stop import StopFlag
from toolwatch.store import Store

try:
    from tests.kafka_broker import kafka_broker
    from tests.test_live_support import (
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_count,
    )
except ImportError:  # pytest's rootdir-relative import
    from kafka_broker import kafka_broker  # type: ignore[no-redef]  # noqa: F401
    from test_live_support import (  # type: ignore[no-redef]
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_count,
    )

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # real-time polls, ~12 s each


def _batch(fp: str, start: int, n: int) -> RawBatch:
    """``n`` not-found reads of one enumerating session as stream ``fp``'s lines."""
    lines = [
        call_line(i, session="s-enum", resource=f"r{i}", status="not_found").rstrip(b"\n")
        for i in range(start, start + n)
    ]
    return RawBatch(
        source=fp,
        source_fp=fp,
        lines=pa.array(lines, pa.large_binary()),  # type: ignore[arg-type]
        offsets=np.arange(start, start + n, dtype=np.int64),
        line_nos=None,
        end_offset=start + n,
    )


class ScriptedSource(LiveSource):
    """Returns one scripted poll per call (then nothing), with its ``behind()`` answer.

    ``pending_at_poll`` records the pipeline's waiting lines when each poll starts.
    """

    name = "scripted"
    blocking = True

    def __init__(self, polls: list[tuple[list[Item], bool]], stop: StopFlag):
        super().__init__()
        self.polls = list(polls)
        self.stop = stop
        self._behind = False
        self.lp: LivePipeline | None = None
        self.pending_at_poll: list[int] = []
        self.empty_polls = 0

    def poll(self, timeout: float) -> Iterable[Item]:
        assert self.lp is not None
        self.pending_at_poll.append(self.lp.pending_lines)
        if self.polls:
            items, self._behind = self.polls.pop(0)
            return items
        self._behind = False
        self.empty_polls += 1
        if self.empty_polls >= 3:
            self.stop.set()
        return []

    def behind(self) -> bool:
        return self._behind


def _run(tmp_path: Path, polls: list[tuple[list[Item], bool]], **live: Any) -> tuple[
        LivePipeline, ScriptedSource, list[int], Path]:
    data = tmp_path / "store"
    cfg = config_for(data, detect=True, **live)
    calls: list[int] = []
    lock = threading.Lock()
    inner = enum_detector(5)

    def detector(ev: pl.DataFrame, su: pl.DataFrame, history: Any = None) -> pl.DataFrame:
        with lock:
            calls.append(ev.height)
        return inner(ev, su, history)

    lp = LivePipeline(cfg, Store(data), detector=detector)
    stop = StopFlag()
    src = ScriptedSource(polls, stop)
    src.lp = lp
    try:
        Driver(src, lp, stop=stop, poll_timeout_s=0.01).run()
    finally:
        lp.close()
    return lp, src, calls, data


@settings(max_examples=8, deadline=None)
@given(first=st.integers(1, 4), tail_a=st.integers(50, 90), tail_b=st.integers(1, 45))
def test_last_poll_of_a_backlog_is_flushed_and_detected_together(
    tmp_path_factory: pytest.TempPathFactory, first: int, tail_a: int, tail_b: int
) -> None:
    """Backlog polls of 60 lines (behind), then one poll with two partitions' last lines
    (``tail_a`` >= flush_events, ``tail_b`` below it; no longer behind): both are flushed
    before the next poll (no line waits for the hour-long interval), one detection covers
    the whole backlog, and every line is stored once with the alert over all of them."""
    tmp_path = tmp_path_factory.mktemp("end")
    polls: list[tuple[list[Item], bool]] = [
        ([StreamsStarted(("p0", "p1", "p2"))], True)]
    n = 0
    for _ in range(first):
        polls.append(([_batch("p0", n, 60)], True))
        n += 60
    polls.append(([_batch("p1", 0, tail_a), _batch("p2", 0, tail_b)], False))
    total = n + tail_a + tail_b
    _lp, src, calls, data = _run(
        tmp_path, polls, flush_events=50, flush_interval_s=3600.0,
        backlog_detect_interval_s=0.0, backlog_detect_events=100_000)
    # The poll after the backlog's last one finds nothing waiting.
    assert src.pending_at_poll[len(polls)] == 0
    assert stored_count(data) == total
    # One detection over everything the backlog brought (each earlier micro-batch was
    # stored and its detection deferred), not one per tail.
    assert calls == [total]
    ev = stored_alerts(data)["evidence"][0]
    # p1/p2 reuse resource ids of p0: distinct ids = the longest stream.
    assert f'"distinct_not_found":{max(n, tail_a, tail_b)}' in ev


@settings(max_examples=8, deadline=None)
@given(first=st.integers(1, 4), last=st.integers(1, 49))
def test_a_backlog_whose_last_poll_was_full_is_flushed_at_the_empty_poll(
    tmp_path_factory: pytest.TempPathFactory, first: int, last: int
) -> None:
    """A Kafka backlog can end on a whole fetch answer: that poll still says "behind",
    its remainder below flush_events waits, and only the empty poll after it shows the
    end. Those lines are flushed at that empty poll (with the detection the backlog left
    waiting), not one flush interval later (here an hour: before, they waited until the
    run's final flush, so the poll after the empty one still found them waiting)."""
    tmp_path = tmp_path_factory.mktemp("full-end")
    polls: list[tuple[list[Item], bool]] = [
        ([StreamsStarted(("p0",))], True)]
    n = 0
    for _ in range(first):
        polls.append(([_batch("p0", n, 60)], True))
        n += 60
    # A whole fetch answer of two partitions (still behind): p0's part reaches
    # flush_events and is flushed inside the poll, p1's `last` lines wait.
    polls.append(([_batch("p0", n, 60), _batch("p1", 0, last)], True))
    total = n + 60 + last
    _lp, src, calls, data = _run(
        tmp_path, polls, flush_events=50, flush_interval_s=3600.0,
        backlog_detect_interval_s=0.0, backlog_detect_events=100_000)
    # Poll len(polls) is the first empty one; it leaves `last` lines behind it that the
    # end-of-backlog rule flushes before the next poll starts.
    assert src.pending_at_poll[len(polls)] == last
    assert src.pending_at_poll[len(polls) + 1] == 0
    assert stored_count(data) == total
    assert calls == [total]  # one detection over the whole backlog


def test_a_poll_in_real_time_flushes_at_flush_events_without_a_backlog(tmp_path: Path) -> None:
    """Not behind and nothing waiting from a backlog: the usual rules (a micro-batch is
    flushed by size, below it by the interval, here only at the end of the run)."""
    polls: list[tuple[list[Item], bool]] = [
        ([StreamsStarted(("p0",))], False),
        ([_batch("p0", 0, 120)], False),
        ([_batch("p0", 120, 10)], False),
    ]
    lp, src, _calls, data = _run(tmp_path, polls, flush_events=50, flush_interval_s=3600.0)
    assert src.pending_at_poll[2] == 0  # 120 >= flush_events: flushed after its poll
    assert src.pending_at_poll[3] == 10  # below flush_events: waits for the interval
    assert stored_count(data) == 130
    assert lp.status.extra.get("detect_deferred", 0) == 0


@pytest.mark.kafka
def test_kafka_is_behind_after_a_full_fetch_until_a_poll_comes_back_short(
    tmp_path: Path, kafka_broker: Any
) -> None:
    """``KafkaSource.behind()``: a poll of at least ``flush_events`` messages counts as a
    backlog even when the lag is already 0 (the backlog's last full fetch answer: its
    micro-batch must stay a backlog one so the end is detected once), and a poll that
    comes back short with no lag is not."""
    from kafka import KafkaProducer
    from toolwatch.ingest.sources.kafka import KafkaSource

    try:
        from tests.kafka_broker import create_topic
        from tests.test_kafka_consumer import GROUP_OPTS, uniq
    except ImportError:  # pytest's rootdir-relative import
        from kafka_broker import create_topic  # type: ignore[no-redef]
        from test_kafka_consumer import GROUP_OPTS, uniq  # type: ignore[no-redef]

    bs = kafka_broker.bootstrap
    topic = uniq("end")
    create_topic(bs, topic, partitions=1)
    prod = KafkaProducer(bootstrap_servers=bs, linger_ms=20, batch_size=1 << 20)
    for i in range(600):
        prod.send(topic, key=b"k", value=call_line(i).rstrip(b"\n"))
    prod.flush(timeout=30)
    prod.close(timeout=10)
    store = Store(tmp_path / "store")
    src = KafkaSource(bootstrap_servers=bs, topics=[topic], group_id=uniq("g"), store=store,
                      consumer_options=GROUP_OPTS)
    src.flush_events = 100
    try:
        src.open(src.control)
        got, polls, full = 0, 0, 0
        while got < 600 and polls < 200:
            polls += 1
            n = sum(len(i) for i in src.poll(0.2) if isinstance(i, RawBatch))
            got += n
            if n >= 100:
                full += 1
                assert src.behind()  # a full poll: behind, whatever the lag
        assert got == 600 and full >= 1
        assert sum(src.lag().values()) == 0
        assert not any(isinstance(i, RawBatch) for i in src.poll(0.2))
        assert not src.behind()  # a short poll with nothing left: caught up
    finally:
        src.close()
        store.close()
