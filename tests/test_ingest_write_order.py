"""Batches commit in stream order, and nothing commits after a failed commit.

``ingest`` parses, transforms and writes different batches at the same time, with up to
two writes queued. A queued batch must never commit after an earlier one failed: its
checkpoint would tell the next run to resume past lines that were never stored.
"""

from __future__ import annotations

import os

import pytest
from toolwatch.ingest.pipeline import Pipeline
from toolwatch.ingest.runner import ingest_paths

from toolwatch.config import Config
from toolwatch.errors import StoreError
from toolwatch.store import Store


@pytest.fixture
def many_batches(write_lines):
    lines = [
        {"ts": f"2026-11-02T10:{i // 60:02d}:{i % 60:02d}Z", "session_id": f"s-{i % 7}",
         "tool": "getDocument", "args": {"documentId": f"doc-{i}"}, "status": "ok"}
        for i in range(3000)
    ]
    return write_lines(*lines)


def _config(tmp_path) -> Config:
    cfg = Config()
    cfg.store.data_dir = str(tmp_path / "store")
    cfg.ingest.chunk_bytes = 16_384  # ~120 lines a batch: ~25 batches
    return cfg


@pytest.mark.slow  # starts a process
def test_batches_commit_in_order_with_checkpoints_advancing(tmp_path, many_batches, monkeypatch):
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", "11" * 32)
    seen: list[int] = []
    real_write = Pipeline.write

    def spy(self, out):
        seen.append(out.checkpoint.end_offset)
        real_write(self, out)

    monkeypatch.setattr(Pipeline, "write", spy)
    res = ingest_paths(_config(tmp_path), [str(many_batches)], progress=False)
    assert res.counters.events_stored == 3000
    assert len(seen) > 10
    assert seen == sorted(seen)  # commit order is stream order
    assert Store(tmp_path / "store").checkpoints() == {
        res.fingerprints[0]: os.path.getsize(many_batches)
    }


@pytest.mark.slow  # starts a process
def test_no_batch_commits_after_a_failed_commit(tmp_path, many_batches, monkeypatch):
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", "11" * 32)
    committed: list[int] = []
    calls = 0
    real_write = Pipeline.write

    def flaky(self, out):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise StoreError("disk full (simulated)")
        real_write(self, out)
        committed.append(out.checkpoint.end_offset)

    monkeypatch.setattr(Pipeline, "write", flaky)
    with pytest.raises(StoreError):
        ingest_paths(_config(tmp_path), [str(many_batches)], progress=False)
    assert len(committed) == 2
    store = Store(tmp_path / "store")
    (offset,) = store.checkpoints().values()
    assert offset == committed[-1]  # resume point: right after the last stored batch
    con = store.connect()
    try:
        (stored,) = con.sql('SELECT count(*), max("offset") FROM events').fetchall()
    finally:
        con.close()
    assert stored[1] < offset  # nothing beyond the checkpoint was stored
    # A re-run resumes there and stores the rest exactly once.
    monkeypatch.setattr(Pipeline, "write", real_write)
    ingest_paths(_config(tmp_path), [str(many_batches)], progress=False)
    con = store.connect()
    try:
        ((total, distinct),) = con.sql(
            "SELECT count(*), count(DISTINCT event_id) FROM events"
        ).fetchall()
    finally:
        con.close()
    assert total == distinct == 3000


@pytest.mark.slow  # not xdist-safe: the worker's execnet thread allocates
def test_gc_pause_nests_and_restores() -> None:
    """``analyze`` pauses collection around ``ingest``, which pauses it again: the inner
    exit must not turn collection back on, the outer exit must restore everything."""
    import gc

    from toolwatch.gc_pause import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        frozen = gc.get_freeze_count()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled() and gc.get_freeze_count() == frozen
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
