"""A live pass scores its batch with per-session figures its fit computed on history + batch.

A live detection pass fits every detector on ``history.union(batch)`` and then scores
``batch``. Bulk extraction's per-call inputs and the concurrency sweep are per session,
so the batch's rows of what fit() computed are taken instead of computing them again
(:func:`toolwatch.detectors.base.union_part`). The scores must be the ones computed from
scratch, to the bit, and the reuse must actually happen.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from polars.testing import assert_frame_equal


def _traffic() -> pl.DataFrame:
    from tests.fixtures import traffic_concurrency as tc
    from tests.fixtures.traffic import T0, Traffic

    tr = Traffic(seed=11)
    tr.background(days=2, users=15, per_day=3)
    for k in range(3):
        t = T0 + timedelta(hours=5 + 7 * k)
        tr.bulk_extraction(f"bulk-{k}", t)
        tr.scraping(f"scrape-{k}", t + timedelta(minutes=30))
        tc.burst(tr, f"burst-{k}", t + timedelta(minutes=50))
        tc.modest_parallel(tr, f"par-{k}", t + timedelta(hours=1))
    # A walk resumed session after session (scraping's entity rows).
    tr.resumed_walk("walk", T0 + timedelta(hours=30), sessions=6, per_session=15)
    return tr.events().sort("ts")


def _live_pass(ev: pl.DataFrame, cut: float, *, reuse_rows: bool,
               monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, pl.DataFrame], int]:
    from toolwatch.detectors import DetectorsConfig, bulk, concurrency
    from toolwatch.detectors.pipeline import detect

    if not reuse_rows:
        monkeypatch.setattr(bulk, "union_part", lambda *a, **k: None)
        monkeypatch.setattr(concurrency, "union_part", lambda *a, **k: None)
    calls = {"inputs": 0}
    real = bulk.BulkExtractionDetector._inputs

    def counted(self: object, fs: object) -> pl.DataFrame:
        calls["inputs"] += 1
        return real(self, fs)  # type: ignore[arg-type]

    monkeypatch.setattr(bulk.BulkExtractionDetector, "_inputs", counted)
    k = int(ev.height * cut)
    # Live: the history is the newest events before the batch's end, part of them the
    # batch's own sessions (FeatureSet.union drops those).
    hist, batch = ev.head(k + 50), ev.slice(k)
    res = detect(batch, None, DetectorsConfig(), history=hist, reuse={"live": True},
                 keep_scores=True)
    monkeypatch.undo()
    return res.scores, calls["inputs"]


@pytest.mark.parametrize("cut", [0.4, 0.7])
def test_live_pass_scores_equal_scores_from_scratch(
        cut: float, monkeypatch: pytest.MonkeyPatch) -> None:
    ev = _traffic()
    got, n_got = _live_pass(ev, cut, reuse_rows=True, monkeypatch=monkeypatch)
    want, n_want = _live_pass(ev, cut, reuse_rows=False, monkeypatch=monkeypatch)
    # fit() computes the inputs on history + batch; score() took the batch's rows.
    assert (n_got, n_want) == (1, 2)
    assert got.keys() == want.keys()
    # Entity-window rows come out of group-bys in no fixed order (from scratch too).
    key = ["entity_type", "entity_id", "window_start", "session_id"]
    for name in want:
        assert_frame_equal(got[name].sort(key, nulls_last=True),
                           want[name].sort(key, nulls_last=True), check_exact=True)
    assert (got["bulk_rules"]["score"] > 0).any()
    assert (got["concurrency_rules"]["score"] > 0).any()


def test_union_part_names_the_batch_of_a_union_only() -> None:
    from toolwatch.detectors import DetectorsConfig
    from toolwatch.detectors.base import FeatureSet, union_part

    cfg = DetectorsConfig()
    ev = _traffic()
    k = ev.height // 2
    hist = FeatureSet.build(ev.head(k + 50), None, cfg)
    batch = FeatureSet.build(ev.slice(k), None, cfg)
    whole = hist.union(batch)
    found = union_part(whole, batch)
    assert found is not None and found[0] is batch
    # The batch's session rows end the union, unchanged.
    assert_frame_equal(whole.sessions.slice(found[1]), batch.sessions)
    assert whole.events.tail(batch.events.height)["sh"].equals(batch.events["sh"])
    assert union_part(batch) is None  # not a union
    assert union_part(whole, hist) is None  # another set than its batch
    # Annotations looked for different names (none computed): not the same rows.
    assert union_part(whole, batch, annotation=True) is None


@pytest.mark.parametrize("annotate", [False, True])
def test_a_union_names_every_row_once_and_keeps_the_batch_rows(annotate: bool) -> None:
    """``i`` names an event's row; fits join arguments back on it (tool loop, cross-server
    flow), so a union whose history and batch both counted from 0 paired rows wrongly."""
    from toolwatch.detectors import DetectorsConfig
    from toolwatch.detectors.base import FeatureSet
    from toolwatch.detectors.tools import annotated

    ev = _traffic()
    cut = ev["ts"].min() + (ev["ts"].max() - ev["ts"].min()) * 0.7
    cfg = DetectorsConfig()
    hist = FeatureSet.build(ev.filter(pl.col("ts") < cut), None, cfg)
    batch = FeatureSet.build(ev.filter(pl.col("ts") >= cut), None, cfg)
    if annotate:
        annotated(hist)
        annotated(batch)
    whole = hist.union(batch)
    assert whole.events["i"].n_unique() == whole.events.height > batch.events.height
    n = batch.events.height
    assert_frame_equal(whole.events.tail(n), batch.events)  # the batch's rows, unchanged
    if annotate:
        ann = annotated(whole)
        assert ann["i"].n_unique() == ann.height
        assert ann["i"].to_list() == whole.events["i"].to_list()
    # Every history row keeps its event (renumbered), so arguments join back right.
    kept = whole.events.head(whole.events.height - n)
    mine = hist.events.join(batch.events.select("session_id").unique(), on="session_id",
                            how="anti")
    assert_frame_equal(kept.drop("i"), mine.drop("i"))
    assert (kept["i"] == mine["i"] + n).all()
