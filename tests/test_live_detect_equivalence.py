"""Live detection's shortcuts change no alert: history features built once per detection,
forest explanations computed only for the alerts that show them."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.alerts import build_alerts
from toolwatch.detectors.base import FeatureSet
from toolwatch.detectors.forest import IsolationForestDetector
from toolwatch.detectors.pipeline import _fit_all, detect
from toolwatch.detectors.registry import build

from tests.fixtures.traffic import T0, Traffic

#: A forest that fits on the small scenario and decides some sessions (the default
#: contamination makes it decide one or two), so the explanation paths are exercised.
CFG = DetectorsConfig.from_dict({"anomaly": {
    "min_train_sessions": 100, "threshold": 0.5, "contamination": 0.05,
    "quantile_margin": 0.0}})


def _traffic(seed: int) -> Traffic:
    tr = Traffic(seed=seed)
    tr.background(days=3, users=40, per_day=3)
    tr.enumeration("enum", T0 + timedelta(hours=3))
    tr.stuffing_session("stuff", T0 + timedelta(hours=4))
    tr.distributed_stuffing("ds", T0 + timedelta(days=1, hours=2), ip="192.0.2.77")
    tr.stuck_loop("loop", T0 + timedelta(days=1, hours=6))
    tr.scraping("sweep", T0 + timedelta(days=2, hours=1))
    tr.oddball("odd", T0 + timedelta(days=2, hours=5))
    tr.oddball("odd2", T0 + timedelta(days=1, hours=9), caller="odd2")
    return tr


@pytest.fixture(scope="module")
def traffic() -> Traffic:
    return _traffic(11)


def _decided(events: pl.DataFrame, summaries: pl.DataFrame) -> list[tuple[Any, pl.DataFrame]]:
    """Every detector's decided rows, fitted on the batch itself (as analyze does)."""
    fs = FeatureSet.build(events, summaries, CFG)
    dets = build(CFG)
    _fit_all(dets, fs, None)
    return [(d, d.decide(d.score(fs))) for d in dets]


class CountingForest(IsolationForestDetector):
    """The real forest, counting the rows it is asked to explain."""

    explained = 0

    def explain_all(self, decided: pl.DataFrame) -> list[tuple[list[str], dict[str, Any]]]:
        type(self).explained += decided.height
        return super().explain_all(decided)


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns
    assert a.sort("alert_id").to_dicts() == b.sort("alert_id").to_dicts()


def test_lazy_explanations_give_the_same_alerts(traffic: Traffic) -> None:
    decided = _decided(traffic.events(), traffic.summaries())
    forest_rows = sum(f.height for d, f in decided if d.category == "anomaly")
    assert forest_rows > 0, "the scenario must make the forest decide some sessions"
    lazy, lazy_sup = build_alerts(decided, CFG, None)
    eager, eager_sup = build_alerts(decided, CFG, None, lazy=False)
    _same(lazy, eager)
    _same(lazy_sup, eager_sup)


def test_forest_rows_folded_into_entity_alerts_are_not_explained(traffic: Traffic) -> None:
    decided = _decided(traffic.events(), traffic.summaries())
    forest = next(d for d, _ in decided if d.category == "anomaly")
    counting = CountingForest(CFG)
    counting.__dict__.update(forest.__dict__)
    decided = [(counting if d is forest else d, f) for d, f in decided]
    CountingForest.explained = 0
    build_alerts(decided, CFG, None, lazy=False)
    eager_n = CountingForest.explained
    CountingForest.explained = 0
    alerts, _ = build_alerts(decided, CFG, None)
    lazy_n = CountingForest.explained
    assert eager_n == sum(f.height for d, f in decided if d is counting)
    # Never more than the eager path; as many as the forest alerts that survive folding
    # (or were folded into a rule alert of the same session, which quotes them).
    assert lazy_n <= eager_n
    assert lazy_n >= int((alerts["detector"] == "isolation_forest").sum()) > 0
    assert lazy_n < eager_n  # the sessions of the distributed stuffing are only counted


@pytest.mark.slow  # detection over generated traffic per case
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cut=st.floats(0.2, 0.8))
def test_lazy_equals_eager_on_generated_traffic(seed: int, cut: float) -> None:
    tr = _traffic(seed)
    ev, su = tr.events(), tr.summaries()
    # A live-like slice: the newest part of the stream, fitted on itself.
    ev = ev.tail(max(1, int(ev.height * cut)))
    decided = _decided(ev, su)
    for at in (None, 1_900_000_000_000_000):
        a, a_sup = build_alerts(decided, CFG, at)
        b, b_sup = build_alerts(decided, CFG, at, lazy=False)
        _same(a, b)
        _same(a_sup, b_sup)


def _passes(ev: pl.DataFrame, n: int) -> list[pl.DataFrame]:
    key = pl.coalesce(pl.col("caller_id"), pl.col("session_id")).hash(seed=7) % n
    part = ev.select(key.alias("p"))["p"]
    return [ev.filter(part == i) for i in range(n)]


@pytest.mark.slow  # fits on generated traffic per example, ~20 s
def test_history_features_built_once_per_history_frame(traffic: Traffic) -> None:
    ev = traffic.events().sort("ts")
    hist, live = ev.head(ev.height // 2), ev.tail(ev.height - ev.height // 2)
    parts = _passes(live, 4)
    cached: dict[str, Any] = {}
    fresh: dict[str, Any] = {}
    for p in parts:
        a = detect(p, None, CFG, history=hist, reuse=cached).alerts
        fresh.pop("history_features", None)  # the uncached path: features every call
        b = detect(p, None, CFG, history=hist, reuse=fresh).alerts
        _same(a, b)
    assert cached["history_builds"] == 1
    assert fresh["history_builds"] == len(parts)
    # A new history frame (the next flush) is built again; the old one is let go.
    hist2 = ev.head(ev.height // 2 + 10)
    detect(parts[0], None, CFG, history=hist2, reuse=cached)
    assert cached["history_builds"] == 2
    assert cached["history_features"][0]() is hist2
    # Once the detection lets its history go, its features are not held either.
    del hist2
    gc.collect()
    assert "history_features" not in cached


def _full_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference path: featurize the whole history frame, as before the shortcut."""
    import toolwatch.detectors.pipeline as dp

    monkeypatch.setattr(dp, "_history_rest", lambda history, batch: None)


@pytest.mark.slow  # fits on generated traffic per example, ~20 s
@settings(max_examples=6, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), cut=st.floats(0.3, 0.8), back=st.floats(0.0, 0.6),
       no_sid=st.floats(0.0, 0.3))
def test_history_inside_the_batch_gives_the_same_alerts(
    monkeypatch: pytest.MonkeyPatch, seed: int, cut: float, back: float, no_sid: float
) -> None:
    """Only the history sessions a pass does not hold are featurized; alerts unchanged.

    Live catch-up: the baseline history is the window's newest events, which the
    detection reads too (``back`` = 0), or reaches back before them (``back`` > 0, so
    some history sessions are outside the batch); some events carry no session id
    (``no_sid``: prepare_events' stand-in session ids must be matched the same way).
    """
    ev = _traffic(seed).events().sort("ts")
    if no_sid:
        drop = pl.int_range(pl.len()).hash(seed) % 1000 < int(no_sid * 1000)
        ev = ev.with_columns(pl.when(drop).then(None).otherwise(pl.col("session_id"))
                             .alias("session_id"))
    batch = ev.tail(max(1, int(ev.height * cut)))
    n_hist = max(1, batch.height // 4)
    start = max(0, ev.height - batch.height - int(back * batch.height))
    hist = ev.slice(start, batch.height + int(back * batch.height)).tail(
        n_hist + int(back * batch.height))
    # One forest for both paths, fitted once as a live process does (its habits are
    # learned again on each pass's fit set, which is what the shortcut changes).
    fitted: dict[str, Any] = {}
    detect(batch, None, CFG, history=hist, reuse=fitted)
    forest = fitted.get("forest")
    for passes in (1, 3):
        for part in _passes(batch, passes):
            got = detect(part, None, CFG, history=hist, reuse={"forest": forest}).alerts
            with monkeypatch.context() as m:
                _full_history(m)
                want = detect(part, None, CFG, history=hist, reuse={"forest": forest}).alerts
            _same(got, want)
            if passes == 1:
                assert got.height > 0




@pytest.mark.slow  # fits on generated traffic
def test_history_covered_by_the_batch_is_not_featurized(traffic: Traffic) -> None:
    """The catch-up case: every history event's session is in the batch."""
    ev = traffic.events().sort("ts")
    batch = ev.tail(ev.height // 2)
    hist = batch.tail(batch.height // 5)
    reuse: dict[str, Any] = {}
    got = detect(batch, None, CFG, history=hist, reuse=reuse).alerts
    assert reuse.get("history_covered") == 1 and "history_builds" not in reuse
    ref: dict[str, Any] = {}
    import toolwatch.detectors.pipeline as dp

    real = dp._history_rest
    try:
        dp._history_rest = lambda history, batch: None  # type: ignore[assignment]
        want = detect(batch, None, CFG, history=hist, reuse=ref).alerts
    finally:
        dp._history_rest = real
    assert ref.get("history_builds") == 1
    _same(got, want)
    assert got.height > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.randoms(use_true_random=False))
def test_folding_does_not_depend_on_row_order(order: Any) -> None:
    """A forest session listed by two overlapping entity windows is counted in the same
    one whatever order the detectors' frames come in (a polars group-by has none).

    The distributed stuffing from one address spans two hopping windows; the forest
    singles out some of its sessions, and each is folded into one window's alert.
    """
    decided = _FOLD_DECIDED
    assert any(d.category == "anomaly" and f.height for d, f in decided)
    want, want_sup = build_alerts(decided, CFG, None)
    shuffled = []
    for d, f in decided:
        idx = list(range(f.height))
        order.shuffle(idx)
        shuffled.append((d, f[idx] if f.height else f))
    got, got_sup = build_alerts(shuffled, CFG, None)
    _same(got, want)
    _same(got_sup, want_sup)
    ev = [e for e in want["evidence"].to_list() if '"anomaly_sessions"' in e]
    assert ev, "the scenario must fold forest sessions into an entity alert"


_FOLD_DECIDED = _decided(_traffic(0).events(), _traffic(0).summaries())


@contextmanager
def _counted_window_sums() -> Iterator[dict[str, int]]:
    """Count bulk's entity-window sums while the block runs (``calls["n"]``)."""
    from toolwatch.detectors import bulk as bulk_mod

    calls = {"n": 0}
    real = bulk_mod._entity_windows

    def counted(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        return real(*a, **k)

    bulk_mod._entity_windows = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        bulk_mod._entity_windows = real  # type: ignore[assignment]


@pytest.mark.slow  # fits on generated traffic
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), attack=st.booleans(), cut=st.floats(0.2, 1.0))
def test_bulk_windows_reused_from_the_fit_give_the_same_scores(
    seed: int, attack: bool, cut: float
) -> None:
    """A pass fitted on the very sessions it scores (live catch-up, analyze without
    history) sums the entity windows once: the scores equal those of summing them again.

    With a sweep and a bulk extraction in the traffic, their sessions are set aside
    (flagged) and the windows are summed again without them; ordinary traffic sets
    nothing aside and fit()'s windows are reused.
    """
    from toolwatch.detectors import bulk as bulk_mod

    tr = Traffic(seed=seed)
    tr.background(days=2, users=30, per_day=3)
    if attack:
        tr.scraping("sweep", T0 + timedelta(days=1, hours=1))
        tr.bulk_extraction("dump", T0 + timedelta(days=1, hours=3))
    ev = tr.events().sort("ts")
    fs = FeatureSet.build(ev.tail(max(1, int(ev.height * cut))), tr.summaries(), CFG)
    det = bulk_mod.BulkExtractionDetector(CFG)
    with _counted_window_sums() as calls:
        det.fit(fs)
        got = det.score(fs)
        sums = calls["n"]
        det.fit(fs)
        det._windows_cache = None  # the old way: always summed again from the residual
        want = det.score(fs)
    key = ["entity_type", "entity_id", "window_start"]
    assert got.columns == want.columns
    assert got.sort(key).to_dicts() == want.sort(key).to_dicts()
    assert sums in (1, 2)  # fit()'s windows, and the residual's only if it differs


@pytest.mark.parametrize("attack", [False, True])
def test_bulk_windows_summed_again_only_when_sessions_are_set_aside(attack: bool) -> None:
    """Ordinary traffic: fit()'s windows are reused (one sum). A sweep and a dump are
    flagged: the windows are summed again without them (two sums)."""
    from toolwatch.detectors import bulk as bulk_mod

    tr = Traffic(seed=3)
    tr.background(days=2, users=30, per_day=3)
    if attack:
        tr.scraping("sweep", T0 + timedelta(days=1, hours=1))
        tr.bulk_extraction("dump", T0 + timedelta(days=1, hours=3))
    fs = FeatureSet.build(tr.events(), tr.summaries(), CFG)
    det = bulk_mod.BulkExtractionDetector(CFG)
    with _counted_window_sums() as calls:
        det.fit(fs)
        got = det.score(fs)
    assert det.entity_baselines_
    assert calls["n"] == (2 if attack else 1)
    assert (got.filter(pl.col("score") >= det.threshold).height >= 1) == attack
