"""Isolation forest: training, safe persistence, version stamps, explanations."""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pytest
import skops.io as sio
from toolwatch.detectors import DetectorsConfig, FeatureSet
from toolwatch.detectors.forest import TRUSTED_TYPES, IsolationForestDetector

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors
from toolwatch.errors import ModelError


@pytest.fixture(scope="module")
def history() -> Traffic:
    tr = Traffic(seed=5)
    tr.background(days=3, users=120, per_day=2)
    for i in range(8):  # heavy but legitimate use, in realistic proportion
        tr.power_user(f"power-{i}", T0 + timedelta(days=i % 3, hours=2 + i), caller=f"pow{i}")
    return tr


def test_train_save_load_round_trip(history: Traffic, tmp_path: Path) -> None:
    cfg = DetectorsConfig()
    path = tmp_path / "models" / "forest.skops"
    info = detectors.train(history.events(), history.summaries(), cfg, path)
    assert path.is_file() and info["n_train"] >= 500
    assert info["sklearn_version"].count(".") >= 1
    fs = FeatureSet.build(history.events(), history.summaries(), cfg)
    a = IsolationForestDetector(cfg).fit(fs).score(fs)["score"]
    b = IsolationForestDetector(cfg).load(path)
    b.learn_habits(fs)
    assert np.allclose(a.to_numpy(), b.score(fs)["score"].to_numpy())
    # Only the listed types are ever trusted, and the file holds nothing else.
    assert set(sio.get_untrusted_types(file=path)) <= set(TRUSTED_TYPES)


def test_too_little_history_raises(tmp_path: Path) -> None:
    tr = Traffic(seed=1)
    tr.background(days=1, users=5)
    with pytest.raises(ModelError, match="min_train_sessions"):
        detectors.train(tr.events(), None, DetectorsConfig(), tmp_path / "m.skops")


@pytest.mark.slow  # refits the forest, ~3 s
def test_other_sklearn_version_raises_or_refits(history: Traffic, tmp_path: Path) -> None:
    cfg = DetectorsConfig()
    fs = FeatureSet.build(history.events(), None, cfg)
    det = IsolationForestDetector(cfg).fit(fs)
    det.sklearn_version_ = "0.99.0"
    path = det.save(tmp_path / "old.skops")
    with pytest.raises(ModelError, match=r"scikit-learn 0\.99\.0"):
        IsolationForestDetector(cfg).load(path)
    strict = DetectorsConfig.from_dict({"anomaly": {"on_version_mismatch": "error"}})
    with pytest.raises(ModelError):
        detectors.detect(history.events(), None, strict, model_path=path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = detectors.detect(history.events(), None, cfg, model_path=path)
    assert res.model == "refit"
    assert any("refitting" in str(w.message) for w in caught)


def test_untrusted_model_file_is_refused(tmp_path: Path) -> None:
    from datetime import datetime

    path = tmp_path / "evil.skops"
    sio.dump({"format_version": 1, "payload": datetime(2020, 1, 1)}, path)
    with pytest.raises(ModelError, match="untrusted"):
        IsolationForestDetector(DetectorsConfig()).load(path)
    garbage = tmp_path / "garbage.skops"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ModelError):
        IsolationForestDetector(DetectorsConfig()).load(garbage)


def test_loaded_model_is_used(history: Traffic, tmp_path: Path) -> None:
    path = tmp_path / "f.skops"
    detectors.train(history.events(), None, DetectorsConfig(), path)
    res = detectors.detect(history.events(), None, DetectorsConfig(), model_path=path)
    assert res.model == "loaded"


def test_anomaly_alert_names_driving_features_in_plain_words(history: Traffic) -> None:
    tr = Traffic(seed=5)
    tr.rows = list(history.rows)
    tr.oddball("odd", T0 + timedelta(days=1, hours=5))  # unlike others, below every rule
    res = detectors.detect(tr.events(), None, DetectorsConfig())
    assert res.alerts["category"].to_list() == ["anomaly"], res.alerts
    hit = res.alerts.row(0, named=True)
    assert hit["session_id"] == "odd"
    reason = hit["reasons"][0]
    assert reason.startswith("Isolation-forest score")
    assert "bytes per call 30,0" in reason and "(typical" in reason
    ev = orjson.loads(hit["evidence"])
    assert "bytes_per_call" in ev["driving_features"]


def test_legitimate_heavy_use_in_a_realistic_population_is_not_isolated(history: Traffic) -> None:
    res = detectors.detect(history.events(), None, DetectorsConfig())
    flagged = res.alerts.filter(pl.col("session_id").str.starts_with("power-"))
    assert flagged.height == 0, flagged.select("category", "entity_id", "reasons").to_dicts()
