"""The isolation forest without scikit-learn: numpy scorer, child process, live isolation.

- :class:`TreeEnsemble` scores exactly as ``IsolationForest.score_samples`` on generated
  matrices (NaN, ±inf, values beyond float32, constant columns, one row, duplicates).
- ``load_or_fit(..., isolated=True)`` fits/loads in a child process: same trees, same
  scores, same learned threshold as in-process; its failures (bad model file, crash,
  kill, timeout) leave the forest unfitted, are counted and are retried only later.
- A real ``toolwatch tail`` never imports scikit-learn or scipy, and its alerts equal
  those of the in-process (scikit-learn) path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import types
from datetime import timedelta
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import orjson
import polars as pl
import pytest
import sklearn.ensemble as sklearn_ensemble
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig, FeatureSet, forest_trees
from toolwatch.detectors import forest as fmod
from toolwatch.detectors.forest import IsolationForestDetector, child_stats, load_or_fit
from toolwatch.detectors.forest_trees import TreeEnsemble

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors
from toolwatch.errors import ModelError

# Values the detector's _prep can hand the forest: log-scaled counts, shares, floors, and
# the extremes a hostile log can produce (log1p(huge) stays finite; inf stays inf; raw
# values beyond float32 become inf in float32).
VALUES = st.one_of(
    st.floats(-5, 50, allow_nan=False),
    st.sampled_from([0.0, 0.5, 1.0, np.inf, -np.inf, 1e300, -1e300, 3.5e38, 1e-45,
                     np.finfo(np.float32).max]),
)
SCORE_VALUES = st.one_of(VALUES, st.just(np.nan))


def _matrix(draw: st.DrawFn, rows: st.SearchStrategy[int], cols: int,
            elements: st.SearchStrategy[float]) -> np.ndarray:
    n = draw(rows)
    x = draw(hnp.arrays(np.float64, (n, cols), elements=elements))
    if draw(st.booleans()):  # a constant column
        x[:, draw(st.integers(0, cols - 1))] = draw(elements)
    if n > 1 and draw(st.booleans()):  # duplicated rows
        k = draw(st.integers(1, n - 1))
        x[n - k:] = x[:k][: k]
    return x


@st.composite
def forests(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    cols = draw(st.integers(1, 6))
    train = _matrix(draw, st.integers(1, 120), cols, VALUES)
    test = _matrix(draw, st.integers(1, 60), cols, SCORE_VALUES)
    params = {
        "n_estimators": draw(st.integers(1, 12)),
        "max_samples": draw(st.sampled_from(["auto", 1, 2, 3, 17, 64])),
        "max_features": draw(st.sampled_from([1.0, 0.5, 1])),
        "random_state": draw(st.integers(0, 2**16)),
    }
    return train, test, params


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests())
def test_numpy_scores_equal_sklearn_score_samples(case) -> None:  # type: ignore[no-untyped-def]
    train, test, params = case
    if isinstance(params["max_samples"], int):
        params["max_samples"] = min(int(params["max_samples"]), train.shape[0])
    with np.errstate(over="ignore"), _quiet():
        try:
            model = sklearn_ensemble.IsolationForest(**params, n_jobs=1).fit(train)
        except ValueError:  # scikit-learn refuses this input (e.g. inf in a split)
            assume(False)
        want = -model.score_samples(test)
        got = TreeEnsemble.from_sklearn(model).iso_scores(test)
        got_train = TreeEnsemble.from_sklearn(model).iso_scores(train)
        want_train = -model.score_samples(train)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_train, want_train, rtol=0, atol=1e-12)


class _quiet:
    """Silence scikit-learn's float32 overflow warnings inside a hypothesis example."""

    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


def test_tree_arrays_are_validated() -> None:
    model = sklearn_ensemble.IsolationForest(n_estimators=3, random_state=0).fit(
        np.random.default_rng(0).normal(size=(50, 3)))
    arrays = TreeEnsemble.from_sklearn(model).to_arrays()
    cyc = {k: v.copy() for k, v in arrays.items()}
    inner = np.flatnonzero(cyc["children_left"] != -1)
    cyc["children_left"][inner[1]] = 0  # a child pointing back at the root
    with pytest.raises(ModelError, match="trees"):
        TreeEnsemble.from_arrays(cyc)
    bad = {k: v.copy() for k, v in arrays.items()}
    bad["feature"][inner[0]] = 99
    with pytest.raises(ModelError, match="features out of range"):
        TreeEnsemble.from_arrays(bad)
    with pytest.raises(ModelError, match="lack"):
        TreeEnsemble.from_arrays({k: v for k, v in arrays.items() if k != "threshold"})
    with pytest.raises(ValueError, match="matrix"):
        TreeEnsemble.from_arrays(arrays).iso_scores(np.zeros((2, 4)))


# ---------------------------------------------------------------------- detector level
@pytest.fixture(scope="module")
def traffic() -> Traffic:
    tr = Traffic(seed=5)
    tr.background(days=3, users=120, per_day=2)
    tr.oddball("odd", T0 + timedelta(days=1, hours=5))
    return tr


@pytest.fixture(scope="module")
def fs(traffic: Traffic) -> FeatureSet:
    return FeatureSet.build(traffic.events(), traffic.summaries(), DetectorsConfig())


def _same_detector(a: IsolationForestDetector, b: IsolationForestDetector,
                   fs: FeatureSet) -> None:
    assert a.learned_threshold_ == b.learned_threshold_
    assert a.n_train_ == b.n_train_ and a.sklearn_version_ == b.sklearn_version_
    for f in ("medians_", "center_", "scale_", "raw_medians_"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    sa, sb = a.score(fs), b.score(fs)
    np.testing.assert_array_equal(sa["score"].to_numpy(), sb["score"].to_numpy())
    decided = sa.filter(pl.col("score") > 0).head(20)
    assert a.explain_all(decided) == b.explain_all(decided)


@pytest.mark.slow  # starts the forest child process
def test_isolated_fit_equals_in_process_fit(fs: FeatureSet,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DetectorsConfig()
    inproc = IsolationForestDetector(cfg)
    assert load_or_fit(inproc, None, fs) == "fitted"
    iso = IsolationForestDetector(cfg)
    runs = child_stats()["forest_child_runs"]
    assert load_or_fit(iso, None, fs, isolated=True) == "fitted"
    assert child_stats()["forest_child_runs"] == runs + 1
    assert iso.model_ is None and iso.model_fitted  # no scikit-learn object here
    _same_detector(inproc, iso, fs)
    # In-process scoring of large inputs goes through scikit-learn: same numbers.
    monkeypatch.setattr(fmod, "SKLEARN_MIN_ROWS", 500)
    x = np.random.default_rng(1).lognormal(size=(fmod.SKLEARN_MIN_ROWS + 5, 13))
    np.testing.assert_allclose(
        fmod._forest_scores(inproc.trees_, inproc.model_, x),  # type: ignore[arg-type]
        inproc.trees_.iso_scores(x), rtol=0, atol=1e-12)  # type: ignore[union-attr]


def test_history_rescored_at_every_flush_reuses_remembered_rows(traffic: Traffic) -> None:
    """Live: habits rescore the history each flush; rows seen at the previous flush are
    taken from the memo, and the scores are those of a fresh detector."""
    cfg = DetectorsConfig()
    events = traffic.events()
    first = FeatureSet.build(events, None, cfg)
    det = IsolationForestDetector(cfg).fit(first)
    assert det.model_fitted
    det.learn_habits(FeatureSet.build(events.head(events.height * 2 // 3), None, cfg))
    before = det._memo.hits
    # The next flush: more of the same (the window moved on).
    later = FeatureSet.build(events.slice(events.height // 4), None, cfg)
    det.learn_habits(later)
    assert det._memo.hits > before and det._memo.misses > 0
    fresh = IsolationForestDetector(cfg).fit(first)
    fresh._memo = fmod.RowMemo()  # nothing remembered
    got = det._score_sessions(later.sessions.clone())
    want = fmod._iso_scores(fresh.trees_, fresh._prep(fmod._transform(  # type: ignore[arg-type]
        fmod.raw_feature_frame(later.sessions).to_numpy().astype(np.float64)),
        fresh.medians_))
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow  # starts the forest child process
def test_isolated_load_uses_the_arrays_beside_the_model(
    traffic: Traffic, fs: FeatureSet, tmp_path: Path
) -> None:
    cfg = DetectorsConfig()
    path = tmp_path / "models" / "forest.skops"
    detectors.train(traffic.events(), traffic.summaries(), cfg, path)
    side = fmod.trees_path(path)
    assert side.is_file()
    ref = IsolationForestDetector(cfg).load(path)
    ref.learn_habits(fs)
    runs = child_stats()["forest_child_runs"]
    fast = IsolationForestDetector(cfg)
    assert load_or_fit(fast, path, fs, isolated=True) == "loaded"
    assert child_stats()["forest_child_runs"] == runs  # no child: the .npz matched
    _same_detector(ref, fast, fs)
    # A stale or broken .npz is ignored: the model is loaded in a child instead.
    side.write_bytes(b"not an npz")
    child = IsolationForestDetector(cfg)
    assert load_or_fit(child, path, fs, isolated=True) == "loaded"
    assert child_stats()["forest_child_runs"] == runs + 1
    _same_detector(ref, child, fs)


@pytest.mark.slow  # starts the forest child process
def test_isolated_load_checks_versions_like_in_process(fs: FeatureSet, tmp_path: Path) -> None:
    cfg = DetectorsConfig()
    det = IsolationForestDetector(cfg).fit(fs)
    det.sklearn_version_ = "0.99.0"
    path = det.save(tmp_path / "old.skops")
    fmod.trees_path(path).unlink()  # through the child, then through the .npz
    for _ in range(2):
        with pytest.raises(ModelError, match=r"scikit-learn 0\.99\.0"):
            IsolationForestDetector(cfg).load(path, isolated=True)
        det.save(path)
    with pytest.warns(UserWarning, match="refitting"):
        assert fmod._load_or_fit(IsolationForestDetector(cfg), path, fs,
                                 isolated=True) == "refit"


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fmod, "_retry_at", 0.0)
    monkeypatch.setattr(fmod, "_failures_in_row", 0)


@pytest.mark.slow  # starts the forest child process
def test_child_refusing_a_bad_model_file_leaves_the_forest_unfitted(
    fs: FeatureSet, tmp_path: Path, no_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    import skops.io as sio

    evil = tmp_path / "evil.skops"
    sio.dump({"format_version": 2, "payload": types.SimpleNamespace}, evil)
    garbage = tmp_path / "garbage.skops"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    for path, why in ((evil, "untrusted"), (garbage, "not a readable skops file")):
        with pytest.raises(ModelError, match=why):  # batch: the error, as before
            load_or_fit(IsolationForestDetector(DetectorsConfig()), path, fs)
        fmod._retry_at = 0.0
        failures = child_stats()["forest_child_failures"]
        det = IsolationForestDetector(DetectorsConfig())
        assert load_or_fit(det, path, fs, isolated=True) == "failed"
        assert not det.model_fitted
        assert det.score(fs)["score"].max() == 0.0  # neutral, like an unfitted forest
        assert child_stats()["forest_child_failures"] == failures + 1
        assert why in child_stats()["forest_child_last_error"]
        assert why in caplog.text and "detection goes on without it" in caplog.text
    # Backing off: the next flush does not start another child at once.
    runs = child_stats()["forest_child_runs"]
    assert load_or_fit(IsolationForestDetector(DetectorsConfig()), garbage, fs,
                       isolated=True) == "failed"
    assert child_stats()["forest_child_runs"] == runs


def test_child_killed_or_hung_gives_a_clear_error(
    fs: FeatureSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_backoff: None
) -> None:
    # A real child that is killed by a signal (as the OOM killer would).
    script = tmp_path / "killed_child.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    fake = types.SimpleNamespace(__file__=str(script), BAD_INPUT=2)
    monkeypatch.setattr(forest_trees, "forest_child", fake)
    with pytest.raises(ModelError, match=f"killed by signal {int(signal.SIGKILL)}"):
        forest_trees.run_child("fit", "x.npy", "1", "1", "1")
    det = IsolationForestDetector(DetectorsConfig())
    assert load_or_fit(det, None, fs, isolated=True) == "failed" and not det.model_fitted
    assert "killed by signal" in child_stats()["forest_child_last_error"]
    # A hung child is killed at the time limit.
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(ModelError, match="timed out"):
        forest_trees.run_child("fit", "x.npy", "1", "1", "1", timeout=0.5)
    monkeypatch.undo()
    # Garbage in: the real child says what is wrong.
    bad = tmp_path / "x.npy"
    bad.write_bytes(b"nope")
    with pytest.raises(ModelError, match="cannot read the feature matrix"):
        forest_trees.run_child("fit", str(bad), "10", "256", "7")


# ---------------------------------------------------------------------- a live process
def _write_log(traffic: Traffic, path: Path) -> None:
    cols = ["ts", "session_id", "caller_id", "client_ip", "server", "tool", "args", "status",
            "bytes", "rows", "duration_ms"]
    with open(path, "wb") as fh:
        for r in traffic.events().select(cols).iter_rows(named=True):
            r["ts"] = r["ts"].isoformat()
            r["args"] = orjson.loads(r["args"]) if r["args"] else {}
            fh.write(orjson.dumps({k: v for k, v in r.items() if v is not None}) + b"\n")


def _alerts(data_dir: Path) -> list[tuple[object, ...]]:
    from toolwatch.query import query
    from toolwatch.store import Store

    st = Store(data_dir)
    if not st.files("alerts"):
        return []
    df = pl.from_arrow(query(st,
        "SELECT alert_id, category, entity_id, score, reasons FROM alerts"))
    assert isinstance(df, pl.DataFrame)
    return sorted(df.rows())


def _tail_cli(log: Path, data_dir: Path, env: dict[str, str]) -> set[str]:
    """Run the real ``toolwatch tail`` over ``log``; the modules it imported."""
    conf = data_dir.parent / f"{data_dir.name}.toml"
    conf.write_text(LIVE_TOML)
    out = subprocess.run(
        [str(Path(sys.executable).with_name("toolwatch")), "tail", str(log), "-c", str(conf),
         "-d", str(data_dir), "--exit-when-idle", "0.5", "--no-stdout"],
        capture_output=True, text=True, env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return {ln.rsplit("|", 1)[-1].strip() for ln in out.stderr.splitlines()
            if ln.startswith("import time:")}


LIVE_TOML = "[live]\ncompact_interval_s = 0\n"


@pytest.mark.slow
def test_live_tail_never_imports_sklearn_and_alerts_like_the_sklearn_path(
    traffic: Traffic, tmp_path: Path
) -> None:
    """A trained model (as `toolwatch train` leaves it) makes the forest's presence in a
    live run independent of how the file happens to be cut into flushes."""
    log = tmp_path / "calls.jsonl"
    late = Traffic(seed=5)
    late.rows = list(traffic.rows)
    late.oddball("odd-late", T0 + timedelta(days=3, hours=1))  # inside the live window
    _write_log(late, log)
    env = {**os.environ, "TOOLWATCH_HMAC_KEY": "00" * 32}
    model = tmp_path / "forest.skops"
    detectors.train(traffic.events(), traffic.summaries(), DetectorsConfig(), model)
    runs = {}
    for name, beside in (("npz", True), ("child", False), ("ref", True)):
        d = tmp_path / name
        (d / "models").mkdir(parents=True)
        (d / "models" / "forest.skops").write_bytes(model.read_bytes())
        if beside:
            (d / "models" / "forest.skops.npz").write_bytes(fmod.trees_path(model).read_bytes())
        runs[name] = d
    # 1. The real CLI, loading the trees from the .npz, then through the child process;
    #    Python reports every module it imports (stderr; the child runs with -I: silent).
    for name in ("npz", "child"):
        imported = _tail_cli(log, runs[name], env)
        assert "toolwatch.detectors.forest" in imported  # detection (and the forest) ran
        heavy = sorted(m for m in imported if m.split(".")[0] in ("sklearn", "scipy"))
        assert heavy == [], name
    live = _alerts(runs["npz"])
    assert any(cat == "anomaly" for _, cat, *_ in live), live
    assert _alerts(runs["child"]) == live

    # 2. The same tail in a fresh interpreter, forest loaded in-process by scikit-learn.
    code = textwrap.dedent(f"""
        import sys
        import toolwatch.detectors.forest as F
        import toolwatch.detectors.pipeline as P
        real = F.load_or_fit
        P.load_or_fit = lambda d, m, f, isolated=False: real(d, m, f, isolated=False)
        from toolwatch.config import Config
        from toolwatch.live_cli import tail_files
        cfg = Config()
        cfg.store.data_dir = {str(runs["ref"])!r}
        cfg.live = {{"compact_interval_s": 0}}
        tail_files(cfg, [{str(log)!r}], idle_exit_s=0.5)
        print('sklearn' in sys.modules)
    """)
    ref = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert ref.stdout.split()[-1] == "True"  # this one did use scikit-learn
    assert _alerts(runs["ref"]) == live


@pytest.mark.slow  # starts a process
def test_live_tail_with_a_broken_model_keeps_ingesting_and_counts_the_failure(
    traffic: Traffic, tmp_path: Path
) -> None:
    """The child refusing the store's model file: every event stored, rule alerts still
    raised, the forest unfitted, the failure counted in the live status."""
    log = tmp_path / "calls.jsonl"
    tr = Traffic(seed=5)
    tr.rows = list(traffic.rows)
    tr.scraping("scrape", T0 + timedelta(days=3, hours=1))  # a rule alert, no forest needed
    _write_log(tr, log)
    data = tmp_path / "store"
    (data / "models").mkdir(parents=True)
    (data / "models" / "forest.skops").write_bytes(b"PK\x03\x04 a broken model file")
    code = textwrap.dedent(f"""
        import json, sys
        from toolwatch.config import Config
        from toolwatch.live_cli import tail_files
        cfg = Config()
        cfg.store.data_dir = {str(data)!r}
        cfg.live = {{"compact_interval_s": 0}}
        lp = tail_files(cfg, [{str(log)!r}], idle_exit_s=0.5)
        extra = lp.status.extra
        print(json.dumps({{"stored": lp.status.events_stored,
                          "failures": extra.get("forest_child_failures"),
                          "error": extra.get("forest_child_last_error"),
                          "sklearn": "sklearn" in sys.modules}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TOOLWATCH_HMAC_KEY": "00" * 32}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert res["stored"] == tr.events().height
    assert res["failures"] >= 1 and "not a readable skops file" in res["error"]
    assert res["sklearn"] is False
    assert "isolation forest unavailable" in out.stderr  # logged with its reason
    cats = {cat for _, cat, *_ in _alerts(data)}
    assert "scraping_loop" in cats and "anomaly" not in cats, cats
