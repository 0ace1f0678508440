"""The live status says how many events detection read (``detect_runs``,
``detect_events``), so configurations can be compared by what they detect, not only by
how fast they ingest: a backlog configuration that detects a fraction of its events looks
faster for that reason alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolwatch.live_cli import tail_files

try:
    from tests.test_live_support import config_for
except ImportError:  # tests/ itself on sys.path
    from test_live_support import config_for  # type: ignore[no-redef]

DEMO = Path(__file__).resolve().parents[1] / "sample_logs" / "demo"
FILES = [str(DEMO / n) for n in ("crm-server.jsonl", "docs-server.jsonl",
                                 "proxy-transcript.jsonl")]


def _run(tmp_path: Path, name: str, **live: object) -> tuple[int, dict]:
    cfg = config_for(tmp_path / name, detect=True, flush_events=2_000, read_bytes=262_144,
                     history_events=0, backlog_detect_events=1, **live)
    lp = tail_files(cfg, FILES, idle_exit_s=0.5)
    return lp.status.events_stored, dict(lp.status.extra)


@pytest.mark.slow  # live detection over generated traffic
def test_detection_reads_every_new_event_when_uncapped(tmp_path: Path) -> None:
    stored, extra = _run(tmp_path, "whole", max_detect_events=0)
    assert stored > 0
    assert 1 <= extra["detect_runs"] <= max(1, stored)
    # Every commit detects (backlog_detect_events=1) and a detection reads every event
    # of the entities its micro-batch touched: at least the micro-batch itself.
    assert extra["detect_events"] >= stored


@pytest.mark.slow  # live detection over generated traffic
def test_capped_detection_counts_only_what_it_read(tmp_path: Path) -> None:
    stored, extra = _run(tmp_path, "capped", max_detect_events=300, detect_passes=1)
    assert stored > 300 and extra.get("detect_capped", 0) > 0
    # Each capped detection reads its newest 300 touched events at most.
    assert 0 < extra["detect_events"] <= 300 * extra["detect_runs"]
