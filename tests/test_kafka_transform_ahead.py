"""Transform ahead (issue 14): Kafka's micro-batches are parsed and transformed on a thread
of their own while the driver decodes the next polls. The store must hold exactly what the
serial path stores: same rows, same order of stateful transforms (JSON-RPC pairing,
sessions derived per caller), same quarantine, same alerts, every line once, also across
streams ended with a synchronous flush in the middle (a partition revoked).

The driver, pipeline, parser, store and commit thread are the real ones; the source is a
scripted :class:`~toolwatch.ingest.sources.base.LiveSource` so both runs see exactly the
same polls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.sources.base import Item, StreamsEnded, StreamsStarted

from toolwatch.live import LivePipeline
from toolwatch.live.driver import Driver
from toolwatch.live.stop import StopFlag
from toolwatch.query import query
from toolwatch.store import Store

try:
    from tests.test_kafka_backlog_end import ScriptedSource
    from tests.test_kafka_transform import KINDS, line_of
    from tests.test_live_support import config_for, enum_detector
except ImportError:  # pytest's rootdir-relative import
    from test_kafka_backlog_end import ScriptedSource  # type: ignore[no-redef]
    from test_kafka_transform import KINDS, line_of  # type: ignore[no-redef]
    from test_live_support import config_for, enum_detector  # type: ignore[no-redef]

import numpy as np
import pyarrow as pa
from toolwatch.ingest.records import RawBatch

pytestmark = pytest.mark.timeout(300)

FPS = ("kafka:t:0", "kafka:t:1", "kafka:t:2")


class AheadSource(ScriptedSource):
    """The scripted source with the Kafka source's transform-ahead setting."""

    transform_ahead = True


def _polls(draw_polls: list[list[tuple[int, list[tuple[str, str]]]]],
           end_at: int | None) -> list[tuple[list[Item], bool]]:
    """Scripted polls: per poll, per partition, its next lines (offsets continue)."""
    nxt = dict.fromkeys(FPS, 0)
    out: list[tuple[list[Item], bool]] = [([StreamsStarted(FPS)], True)]
    for k, poll in enumerate(draw_polls):
        items: list[Item] = []
        for part, kinds in poll:
            fp = FPS[part]
            start = nxt[fp]
            lines = [line_of(kind, start + i, text) for i, (kind, text) in enumerate(kinds)]
            nxt[fp] = start + len(lines)
            items.append(RawBatch(
                source=fp, source_fp=fp,
                lines=pa.array(lines, pa.large_binary()),  # type: ignore[arg-type]
                offsets=np.arange(start, start + len(lines), dtype=np.int64),
                line_nos=None, end_offset=start + len(lines)))
        if end_at == k:
            items.append(StreamsEnded((FPS[1],), sync=True))
        out.append((items, k < len(draw_polls) - 1))
    return out


def _run(tmp: Path, polls: list[tuple[list[Item], bool]], ahead: bool) -> dict[str, Any]:
    data = tmp / ("ahead" if ahead else "serial")
    cfg = config_for(data, detect=True, flush_events=25, backlog_detect_events=60,
                     backlog_detect_interval_s=0.0)
    lp = LivePipeline(cfg, Store(data), detector=enum_detector(3))
    stop = StopFlag()
    src = (AheadSource if ahead else ScriptedSource)(polls, stop)
    src.lp = lp
    try:
        drv = Driver(src, lp, stop=stop, poll_timeout_s=0.01)
        assert lp.transform_ahead is ahead
        drv.run()
    finally:
        lp.close()
    store = Store(data)

    def rows(view: str, drop: tuple[str, ...]) -> pl.DataFrame:
        if not store.files(view):
            return pl.DataFrame()
        df = pl.from_arrow(query(store, f"SELECT * FROM {view}"))
        assert isinstance(df, pl.DataFrame)
        return df.drop([c for c in drop if c in df.columns]).sort(
            [c for c in ("source_fp", "offset", "event_id") if c in df.columns])

    return {
        "events": rows("events", ("ingested_at",)),
        "summaries": rows("summaries", ("ingested_at",)),
        "quarantine": rows("quarantine", ("ingested_at",)),
        "alerts": rows("alerts", ("detected_at", "batch_id")).select(
            "alert_id", "category", "entity_id", "score") if store.files("alerts")
        else pl.DataFrame(),
        "checkpoints": {k: v for k, v in store.checkpoints().items() if k in FPS},
    }


_line = st.tuples(st.sampled_from(KINDS), st.text(max_size=12))
_poll = st.lists(st.tuples(st.integers(0, 2), st.lists(_line, min_size=1, max_size=30)),
                 min_size=1, max_size=3)


@pytest.mark.slow  # ~13 s
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(polls=st.lists(_poll, min_size=1, max_size=6), end=st.none() | st.integers(0, 5))
def test_transform_ahead_stores_what_the_serial_path_stores(
    tmp_path_factory: pytest.TempPathFactory, polls: Any, end: int | None
) -> None:
    tmp = tmp_path_factory.mktemp("ahead")
    script = _polls(polls, end)
    serial = _run(tmp, script, ahead=False)
    ahead = _run(tmp, script, ahead=True)
    sent: dict[str, int] = {}
    for poll in polls:
        for part, kinds in poll:
            sent[FPS[part]] = sent.get(FPS[part], 0) + len(kinds)
    assert serial["checkpoints"] == sent  # every line consumed, by both paths
    for key in ("events", "summaries", "quarantine", "alerts"):
        assert serial[key].equals(ahead[key]), key
    assert serial["checkpoints"] == ahead["checkpoints"]
    if serial["events"].height:  # every line once
        assert ahead["events"]["event_id"].n_unique() == ahead["events"].height
