"""The detector contract, checked once over every registered detector."""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from toolwatch.detectors import CATEGORIES, REGISTRY, Detector, DetectorsConfig, FeatureSet
from toolwatch.detectors.base import SCORE_COLUMNS

from tests.fixtures import traffic_concurrency as conc
from tests.fixtures import traffic_sequence as seq
from tests.fixtures.traffic import T0, Traffic

# Per category, a scenario the detector must rank above ordinary traffic.
ATTACK = {
    "enumeration": lambda tr: tr.enumeration("attack", T0 + timedelta(hours=2)),
    "bulk_extraction": lambda tr: tr.bulk_extraction("attack", T0 + timedelta(hours=2)),
    "credential_stuffing": lambda tr: tr.stuffing_session("attack", T0 + timedelta(hours=2)),
    # walking a listing by page (issue 11: repetition without progress is tool_loop)
    "scraping_loop": lambda tr: tr.scraping("attack", T0 + timedelta(hours=2)),
    "anomaly": lambda tr: tr.oddball("attack", T0 + timedelta(hours=2)),
    "tool_loop": lambda tr: seq.tool_loop(tr, "attack", T0 + timedelta(hours=2)),
    "privilege_chain": lambda tr: seq.privilege_chain(tr, "attack", T0 + timedelta(hours=2)),
    "step_skip": lambda tr: seq.order_flow(tr, "attack", T0 + timedelta(hours=2), "ord-1001",
                                           charge=False),
    "duplicate_execution": lambda tr: seq.double_charge(tr, "attack", T0 + timedelta(hours=2),
                                                        "ord-2002"),
    "cross_server_flow": lambda tr: seq.exfil_flow(tr, "attack", T0 + timedelta(hours=2)),
    "concurrency_abuse": lambda tr: conc.burst(tr, "attack", T0 + timedelta(hours=2)),
    "race_condition": lambda tr: conc.race(tr, "attack", T0 + timedelta(hours=2)),
}


@pytest.fixture(scope="module")
def traffic() -> tuple[pl.DataFrame, pl.DataFrame]:
    tr = Traffic(seed=3)
    # 1500 sessions: enough to fit the forest, and for its alert quantile (0.5%) to sit
    # below the ten attack sessions mixed in.
    tr.background(days=3, users=250, per_day=2)
    for cat, make in ATTACK.items():
        t = Traffic(seed=4)
        make(t)
        for row in t.rows:
            row["session_id"] = f"attack-{cat}"
        tr.rows.extend(t.rows)
    return tr.events(), tr.summaries()


@pytest.fixture(scope="module")
def features(traffic: tuple[pl.DataFrame, pl.DataFrame]) -> FeatureSet:
    return FeatureSet.build(*traffic, DetectorsConfig())


def test_registry_covers_every_category() -> None:
    cats = {cls.category for cls in REGISTRY.values()}
    assert cats == set(CATEGORIES)
    for name, cls in REGISTRY.items():
        assert issubclass(cls, Detector)
        assert cls.name == name


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_fit_on_empty_history_then_score(name: str, features: FeatureSet) -> None:
    cfg = DetectorsConfig()
    det = REGISTRY[name](cfg).fit(FeatureSet.empty(cfg))
    assert det.is_fitted
    scores = det.score(features)
    for col, dtype in SCORE_COLUMNS.items():
        assert col in scores.columns
        assert scores.schema[col] == dtype, col
    sessions = scores.filter(pl.col("entity_type") == "session")
    # One row per session, and per (entity, window) for entity rows.
    assert sessions.height == features.sessions.height
    assert sessions["entity_id"].n_unique() == sessions.height
    ent = scores.filter(pl.col("entity_type") != "session")
    assert ent.select("entity_type", "entity_id", "window_start").is_unique().all()
    assert scores["score"].is_between(0.0, 1.0).all()
    assert scores["score"].null_count() == 0


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_unfitted_detector_is_neutral_or_rule_based(name: str, features: FeatureSet) -> None:
    """Never fitted: scoring must not raise (cold start)."""
    det = REGISTRY[name](DetectorsConfig())
    scores = det.score(features)
    assert scores.height >= features.sessions.height


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_higher_score_means_more_anomalous(name: str, features: FeatureSet) -> None:
    det = REGISTRY[name](DetectorsConfig()).fit(features)
    scores = det.score(features).filter(pl.col("entity_type") == "session")
    attack = scores.filter(pl.col("session_id") == f"attack-{det.category}")["score"][0]
    benign = scores.filter(pl.col("session_id").str.starts_with("bg-"))["score"]
    assert attack > benign.max(), (attack, benign.max())
    assert attack >= det.threshold


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_deterministic(name: str, traffic: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    cfg = DetectorsConfig()
    runs = []
    for _ in range(2):
        fs = FeatureSet.build(*traffic, cfg)
        det = REGISTRY[name](cfg).fit(fs)
        runs.append(det.score(fs).sort("entity_type", "entity_id", "window_start"))
    assert runs[0].equals(runs[1])


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_decide_and_explain(name: str, features: FeatureSet) -> None:
    det = REGISTRY[name](DetectorsConfig()).fit(features)
    decided = det.decide(det.score(features))
    assert decided.height >= 1
    assert (decided["score"] >= det.threshold).all()
    for reasons, evidence in det.explain_all(decided):
        assert reasons and all(isinstance(r, str) and r.endswith(".") for r in reasons)
        assert any(ch.isdigit() for ch in reasons[0]), reasons[0]
        assert isinstance(evidence, dict)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_empty_batch(name: str) -> None:
    cfg = DetectorsConfig()
    empty = FeatureSet.empty(cfg)
    det = REGISTRY[name](cfg).fit(empty)
    assert det.score(empty).height == 0
