"""Isolation forest over log-scaled session features: the ``anomaly`` category.

Rules catch the attacks we can name; the forest catches sessions that are simply unlike
the rest. Features (:data:`FOREST_FEATURES`) describe the *shape* of a session — rates,
shares and per-call figures, log-scaled where they are counts — never its sheer size: a
long, busy, diverse session is not anomalous for being long. Each is oriented so that
*higher means more suspicious* and floored at a tolerance (everyday noise) and at the top
of its ordinary range in training (median + ``floor_mads`` robust standard deviations),
so a session is never "anomalous" for being small, quiet or short, nor for ordinary
variation in one figure.
Missing figures (sessions known only from summaries, shares of tiny sessions) take the
floor (neutral).

The score is the isolation score of Liu et al. (``2^(-E[h(x)] / c(n))``, i.e. minus
scikit-learn's ``score_samples``): about 0.5 for ordinary sessions, approaching 1 for
isolated ones. An alert needs both the configured ``threshold`` and the learned
``1 - contamination`` quantile of training scores. A caller whose typical session over
several days is itself isolated (a service account's nightly run) is habitual: its
sessions alert only ``habit_margin`` above its own typical score. Reasons name the
features that drove the score, found by resetting each feature to its median and
measuring the score drop.

Persistence uses skops (never pickle) with an explicit list of trusted types, stamped with
the scikit-learn version; a model from another scikit-learn major.minor raises
:class:`~toolwatch.errors.ModelError` (``run_batch`` refits instead when
``anomaly.on_version_mismatch = "refit"``). ``save`` also writes the trees as plain arrays
beside it (``<model>.npz``, stamped with the model file's SHA-256).

Scoring never needs scikit-learn: :class:`~toolwatch.detectors.forest_trees.TreeEnsemble`
evaluates the fitted trees in numpy with the same result, bit for bit. A live process
(``load_or_fit(..., isolated=True)``) fits or loads its forest once in a short-lived child
process (:mod:`toolwatch.detectors.forest_child`) or from the ``.npz``, so scikit-learn and
scipy (~90 MiB of RSS) are never imported there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from sklearn.ensemble import IsolationForest

from toolwatch.detectors.base import Detector, FeatureSet, session_frame
from toolwatch.detectors.baseline import habits, habitual_gate
from toolwatch.detectors.forest_child import TRUSTED_TYPES, import_sklearn
from toolwatch.detectors.forest_trees import ChildResult, TreeEnsemble, run_child
from toolwatch.detectors.scoring import all_of, gate
from toolwatch.detectors.text import clean, num, pct

from toolwatch.errors import ModelError

log = logging.getLogger("toolwatch.detectors.forest")

#: (feature, transform, plain words, tolerance). ``log`` = log1p of a count; ``ratio`` as
#: is. Values up to the tolerance (raw units) are everyday noise — a few misses, a couple of
#: mistyped keys, a second page, a short run of ids — and are floored to it, so a session
#: cannot be isolated merely for having a little of what most sessions have none of.
FOREST_FEATURES: list[tuple[str, str, str, float]] = [
    ("calls_per_min", "log", "calls per minute", 10.0),
    ("new_resource_share", "ratio", "share of calls touching a new resource", 0.5),
    ("miss_ratio", "ratio", "share of lookups not found or denied", 0.1),
    ("auth_fail_ratio", "ratio", "share of calls failing authentication", 0.1),
    ("failed_creds", "log", "distinct failing credentials", 2.0),
    ("bytes_per_call", "log", "bytes per call", 0.0),
    ("rows_per_call", "log", "rows per call", 0.0),
    ("regularity", "ratio", "regularity of gaps between calls", 0.7),
    ("top_tool_share", "ratio", "share of calls to a single tool", 0.7),
    ("page_share", "ratio", "share of calls paging through one tool", 0.1),
    ("dup_ratio", "ratio", "share of identical repeated calls", 0.4),
    ("seq_run", "log", "longest sequential id run", 4.0),
    ("dense_ids", "log", "longest block of consecutive ids", 4.0),
]

FORMAT_VERSION = 2

#: Smallest robust scale of a share feature for the outlier check (5 percentage points).
RATIO_MIN_SCALE = 0.05


#: From this many (distinct) rows on, a forest fitted or loaded in this process scores with
#: scikit-learn's compiled tree code (numpy/sklearn speed: 24x at 50 rows, 1.5x at 10k,
#: 0.8x at 100k; benchmarks/bench_forest.py); below it (and always
#: in a live process, which has no scikit-learn) the numpy scorer. Both give the same
#: scores bit for bit (tests/test_forest_numpy.py), so the choice never changes a result.
SKLEARN_MIN_ROWS = 50_000

#: Seconds a live process waits before trying its forest child again after a failure
#: (doubling per consecutive failure, up to :data:`CHILD_RETRY_MAX_S`).
CHILD_RETRY_S = 30.0
CHILD_RETRY_MAX_S = 900.0

_import_sklearn = import_sklearn  # the name analyze.py and benchmarks use


def sklearn_version() -> str:
    """Installed scikit-learn version, read from its package metadata (no import).

    scikit-learn (with scipy) takes ~1 s of CPU and ~90 MiB of RSS to import, so this
    module imports it only when a forest is fitted or loaded in-process: a live process
    never does, and ``analyze`` can overlap that import with work that does not need it.
    """
    import sys

    mod = sys.modules.get("sklearn")
    if mod is not None:
        return str(mod.__version__)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scikit-learn")
    except PackageNotFoundError:  # pragma: no cover - not installed from a distribution
        _import_sklearn()
        import sklearn

        return str(sklearn.__version__)


def sklearn_minor(version: str) -> str:
    """``'1.9.1'`` → ``'1.9'``."""
    return ".".join(version.split(".")[:2])


def raw_feature_frame(sessions: pl.DataFrame) -> pl.DataFrame:
    """The forest's features in raw units (before log and clipping)."""
    calls = pl.col("calls").cast(pl.Float64)
    many = calls >= 10  # shares mean little in a handful of calls
    return sessions.select(
        pl.col("calls_per_min").fill_null(0.0),
        pl.when(many).then((pl.col("distinct_resources") / calls).clip(0.0, 1.0))
        .alias("new_resource_share"),
        pl.col("miss_ratio"),
        pl.col("auth_fail_ratio"),
        pl.col("failed_creds").cast(pl.Float64),
        pl.when(calls > 0).then(pl.col("total_bytes") / calls).otherwise(0.0)
        .alias("bytes_per_call"),
        pl.when(calls > 0).then(pl.col("total_rows") / calls).otherwise(0.0)
        .alias("rows_per_call"),
        pl.when(many & pl.col("gap_cv").is_not_null()).then(1.0 / (1.0 + pl.col("gap_cv")))
        .alias("regularity"),
        pl.when(many).then(pl.col("top_tool_share")).alias("top_tool_share"),
        pl.when(many).then((pl.col("max_pages") / calls).clip(0.0, 1.0)).alias("page_share"),
        pl.when(many).then(pl.col("dup_ratio")).alias("dup_ratio"),
        pl.col("seq_run").cast(pl.Float64),
        pl.col("dense_ids").cast(pl.Float64),
    )


def _forest_scores(
    trees: TreeEnsemble, model: IsolationForest | None, x: np.ndarray
) -> np.ndarray:
    """Isolation scores of distinct rows: scikit-learn for large inputs when it is loaded
    in this process anyway, else numpy (identical results, see :data:`SKLEARN_MIN_ROWS`)."""
    if model is not None and x.shape[0] >= SKLEARN_MIN_ROWS:
        return -model.score_samples(x)
    return trees.iso_scores(x)


@dataclass
class RowMemo:
    """Scores of the distinct rows of the last history scored (sorted row bytes).

    A live process rescores the whole history for the callers' habits at every flush,
    and that history is mostly the same rows as at the previous flush: only rows not
    seen then go through the forest. Rows are matched on their exact bytes and the
    forest is fixed for the memo's life, so a remembered score is the score.
    """

    keys: np.ndarray | None = None
    scores: np.ndarray | None = None
    hits: int = 0
    misses: int = 0


def _iso_scores(
    trees: TreeEnsemble, x: np.ndarray, model: IsolationForest | None = None,
    memo: RowMemo | None = None, remember: bool = False,
) -> np.ndarray:
    """Isolation scores (``-score_samples``) of the rows of ``x``.

    After flooring, many sessions share the exact same feature vector; each distinct row
    is scored once (a forest pass costs far more than finding duplicates), or not at
    all when ``memo`` has it (``remember``: the memo then holds this call's rows). A
    row's score does not depend on the other rows scored with it, so the result is the
    same.
    """
    if x.shape[0] < 2 and memo is None:
        return _forest_scores(trees, model, x)
    x = np.ascontiguousarray(x)
    rows = x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()
    keys, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    if memo is None or memo.keys is None or memo.keys.size == 0 or keys.size == 0:
        scores = _forest_scores(trees, model, x[first])
        if memo is not None:
            memo.misses += int(keys.size)
    else:
        pos = np.minimum(np.searchsorted(memo.keys, keys), memo.keys.size - 1)
        hit = memo.keys[pos] == keys
        scores = np.empty(keys.size, dtype=np.float64)
        scores[hit] = memo.scores[pos[hit]]  # type: ignore[index]
        miss = ~hit
        if miss.any():
            scores[miss] = _forest_scores(trees, model, x[first[miss]])
        memo.hits += int(hit.sum())
        memo.misses += int(miss.sum())
    if memo is not None and remember:
        memo.keys, memo.scores = keys, scores
    return scores[inverse.ravel()]


def _transform(raw: np.ndarray) -> np.ndarray:
    out = raw.copy()
    for j, (_, kind, _, tol) in enumerate(FOREST_FEATURES):
        col = np.where(np.isnan(out[:, j]), np.nan, np.maximum(out[:, j], tol))
        out[:, j] = np.log1p(np.clip(col, 0.0, None)) if kind == "log" else col
    return out


class IsolationForestDetector(Detector):
    """Isolation forest over session features; alerts name the driving features."""

    name = "isolation_forest"
    category = "anomaly"
    config_key = "anomaly"
    summary = "Isolation forest over log-scaled session features (one-sided)."

    # ------------------------------------------------------------------ learning
    def fit(self, history: FeatureSet, *, isolated: bool = False) -> Self:
        """Fit on history sessions; too few sessions leave it unfitted (neutral scores).

        ``isolated``: fit the trees in a child process (:func:`fit_isolated`), so this
        process never imports scikit-learn (live processes).

        Raises
        ------
        ModelError
            ``isolated`` and the child failed (crashed, killed, timed out).
        """
        a = self.settings
        self.fitted_ = True
        self.model_ = None
        self.trees_ = None
        self._cache = None
        self._memo = RowMemo()
        raw = raw_feature_frame(history.sessions).to_numpy().astype(np.float64)
        if raw.shape[0] < a.min_train_sessions:
            return self
        sampled = raw.shape[0] > a.max_train_sessions
        if sampled:
            rng = np.random.default_rng(a.random_state)
            raw = raw[np.sort(rng.choice(raw.shape[0], a.max_train_sessions, replace=False))]
        x = _transform(raw)
        # Floor each feature at the top of its ordinary range (median + floor_mads robust
        # standard deviations): only what lies clearly beyond it can isolate a session.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
            center = np.nanmedian(x, axis=0)
            mad = np.nanmedian(np.abs(x - center), axis=0)
        med = np.where(np.isnan(center), 0.0, center + a.floor_mads * 1.4826 * np.nan_to_num(mad))
        self.center_ = np.where(np.isnan(center), 0.0, center)
        # Scale floors: 0.05 for shares, baseline_min_mad (log units) for counts, so a hair
        # above a near-constant figure is not "many standard deviations".
        min_scale = np.array([
            self.config.baseline_min_mad if kind == "log" else RATIO_MIN_SCALE
            for _, kind, _, _ in FOREST_FEATURES
        ])
        self.scale_ = np.maximum(1.4826 * np.nan_to_num(mad), min_scale)
        x = self._prep(x, med)
        if isolated:
            res = fit_isolated(x, a.n_estimators, a.max_samples, a.random_state)
            model, trees, version = None, res.trees, str(res.meta["sklearn_version"])
        else:
            from toolwatch.detectors.forest_child import fit_model

            model = fit_model(x, a.n_estimators, a.max_samples, a.random_state)
            trees, version = TreeEnsemble.from_sklearn(model), sklearn_version()
        # The alert quantile from (at most) 20k training sessions: precise enough, cheap.
        step = 1 if x.shape[0] <= 20_000 else max(1, x.shape[0] // 20_000)
        if sampled:
            train_scores = _iso_scores(trees, x[::step], model)
        else:
            # x holds every history session, prepared exactly as scoring prepares it:
            # score them all once, for the quantile, the habits and (batch) scoring.
            all_scores = _iso_scores(trees, x, model, self._memo, remember=True)
            train_scores = all_scores[::step]
            self._cache = (history.sessions, all_scores)
        self.model_ = model
        self.trees_ = trees
        self.medians_ = med
        self.raw_medians_ = np.array(
            [float(np.nanmedian(raw[:, j])) if np.isfinite(raw[:, j]).any() else 0.0
             for j in range(raw.shape[1])]
        )
        self.learned_threshold_ = float(np.quantile(train_scores, 1.0 - a.contamination))
        self.n_train_ = int(x.shape[0])
        self.sklearn_version_ = version
        self.trained_at_ = datetime.now(UTC).isoformat()
        self.learn_habits(history)
        return self

    def learn_habits(self, history: FeatureSet) -> Self:
        """Each established caller's typical isolation score (a service account whose every
        nightly run is isolated is habitually 'anomalous': only a run beyond its own
        typical score by ``habit_margin`` alerts). Scores are cached for :meth:`score`."""
        cfg = self.config
        self.habit_ = None
        if not self.model_fitted or history.sessions.height == 0:
            return self
        scores = self._score_sessions(history.sessions, remember=True)
        self.habit_ = habits(
            history.sessions.select("caller_id", "first_t").with_columns(
                pl.Series("_raw", scores, dtype=pl.Float64)
            ),
            "_raw", ["caller_id"], min_rows=cfg.baseline_min_sessions,
            min_days=cfg.baseline_min_days,
        )
        return self

    def _score_sessions(self, sessions: pl.DataFrame, remember: bool = False,
                        raw: np.ndarray | None = None) -> np.ndarray:
        """Scores of sessions; ``remember``: this is the history (see :class:`RowMemo`).
        ``raw``: the sessions' :func:`raw_feature_frame` as float64, when the caller has it."""
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] is sessions:
            return cached[1]
        if raw is None:
            raw = raw_feature_frame(sessions).to_numpy().astype(np.float64)
        x = self._prep(_transform(raw), self.medians_)
        scores = _iso_scores(self.trees_, x, self.model_,  # type: ignore[arg-type]
                             getattr(self, "_memo", None), remember)
        self._cache = (sessions, scores)
        return scores

    @staticmethod
    def _prep(x: np.ndarray, med: np.ndarray) -> np.ndarray:
        x = np.where(np.isnan(x), med, x)
        return np.maximum(x, med)  # one-sided: only "more than usual" isolates

    @property
    def threshold(self) -> float:
        """The configured threshold, or the learned training quantile plus
        ``quantile_margin`` if higher."""
        if not self.model_fitted:
            return float(self.settings.threshold)
        learned = getattr(self, "learned_threshold_", 0.0) + self.settings.quantile_margin
        return max(float(self.settings.threshold), learned)

    @property
    def model_fitted(self) -> bool:
        """Whether a forest exists (fit on enough sessions, or loaded)."""
        return getattr(self, "trees_", None) is not None

    # ------------------------------------------------------------------ scoring
    def _score_raw(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self._prep(_transform(raw), self.medians_)
        return _iso_scores(self.trees_, x, self.model_), x  # type: ignore[arg-type]

    def _outlier_z(self, raw: np.ndarray) -> np.ndarray:
        """Largest robust z-score of any single feature (after tolerances)."""
        x = _transform(raw)
        x = np.where(np.isnan(x), self.center_, x)
        return np.max((x - self.center_) / self.scale_, axis=1)

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session; 0.0 for every session while unfitted (cold start).

        The raw feature values ride along as ``f_<feature>`` columns for :meth:`explain`.
        """
        sessions = features.sessions
        raw = raw_feature_frame(sessions)
        s = pl.concat([sessions, raw.rename({c: f"f_{c}" for c in raw.columns})],
                      how="horizontal")
        if self.model_fitted and s.height:
            # The raw features once: the isolation scores and the outlier z both read them.
            raw_np = raw.to_numpy().astype(np.float64)
            scores = self._score_sessions(sessions, raw=raw_np)
            z = self._outlier_z(raw_np)
            s = s.with_columns(
                pl.Series("_iso", scores, dtype=pl.Float64),
                pl.Series("outlier_z", z, dtype=pl.Float64),
            )
        else:
            s = s.with_columns(pl.lit(0.0).alias("_iso"), pl.lit(0.0).alias("outlier_z"))
        s = habitual_gate(
            s, getattr(self, "habit_", None), ["caller_id"], self.threshold,
            pl.col("_iso") - pl.col("habit_score"), self.settings.habit_margin,
            slack=self.settings.habit_margin,
        )
        # Isolation alone can come from mild variation in a near-constant figure: require
        # one figure to lie clearly outside its ordinary range too.
        return session_frame(
            s, all_of(pl.col("_iso"), pl.col("p_own"),
                      gate(pl.col("outlier_z"), self.settings.outlier_z)),
            ["calls", "span_s", "basis", "top_tool", "habitual", "outlier_z",
             *[f"f_{c}" for c in raw.columns]],
        )

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Name the features whose reset to the median lowers the score most."""
        return self.explain_all(pl.DataFrame([row]))[0]

    def explain_all(self, decided: pl.DataFrame) -> list[tuple[list[str], dict[str, Any]]]:
        """Reasons and evidence for many rows at once (one forest pass per feature)."""
        if decided.height == 0:
            return []
        if not self.model_fitted:
            return [([], {}) for _ in range(decided.height)]
        raw = decided.select([pl.col(f"f_{n}").cast(pl.Float64) for n, *_ in FOREST_FEATURES])
        raw_np = raw.to_numpy().astype(np.float64)
        base, x = self._score_raw(raw_np)
        k = len(FOREST_FEATURES)
        n = x.shape[0]
        # All k perturbed copies (feature j reset to its median) in ONE scoring call: a
        # forest pass has a fixed cost per call that k small calls would pay k times.
        xc = np.tile(x, (k, 1))
        for j in range(k):
            xc[j * n: (j + 1) * n, j] = self.medians_[j]
        reset = _iso_scores(self.trees_, xc, self.model_)  # type: ignore[arg-type]
        drops = base[:, None] - reset.reshape(k, n).T
        out = []
        for i in range(x.shape[0]):
            order = [int(j) for j in np.argsort(-drops[i]) if drops[i, j] > 1e-4]
            top = order[: self.settings.explain_top] or [int(np.argmax(x[i] - self.medians_))]
            parts = []
            driving = {}
            for j in top:
                name, kind, words, _ = FOREST_FEATURES[j]
                val, typ = raw_np[i, j], self.raw_medians_[j]
                fmt = pct if kind == "ratio" and name != "regularity" else num
                parts.append(f"{words} {fmt(_f(val))} (typical {fmt(_f(typ))})")
                driving[name] = clean(
                    {"value": _f(val), "typical": _f(typ), "score_drop": _f(drops[i, j])}
                )
            reasons = [
                f"Isolation-forest score {base[i]:.2f} (alert threshold {self.threshold:.2f}, "
                f"trained on {self.n_train_:,} sessions): unlike other sessions mainly in "
                + "; ".join(parts) + "."
            ]
            evidence = {
                "driving_features": driving,
                "features": clean({n: _f(raw_np[i, j]) for j, (n, *_) in
                                   enumerate(FOREST_FEATURES)}),
                "threshold": round(self.threshold, 4),
                "n_train": self.n_train_,
                "sklearn_version": self.sklearn_version_,
                "top_tool": decided["top_tool"][i] if "top_tool" in decided.columns else None,
            }
            out.append((reasons, clean(evidence)))
        return out

    # ------------------------------------------------------------------ persistence
    def _state_fields(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "sklearn_version": self.sklearn_version_,
            "features": [f[0] for f in FOREST_FEATURES],
            "medians": self.medians_,
            "center": self.center_,
            "scale": self.scale_,
            "raw_medians": self.raw_medians_,
            "learned_threshold": self.learned_threshold_,
            "n_train": self.n_train_,
            "trained_at": self.trained_at_,
        }

    def save(self, path: str | Path) -> Path:
        """Write the fitted model with skops (no pickle), stamped with versions, and its
        trees as plain arrays beside it (``<path>.npz``, see :func:`trees_path`).

        Raises
        ------
        ModelError
            When there is no fitted forest to save, or it was fitted out of process
            (a live process has no scikit-learn model to save).
        """
        if not self.model_fitted:
            raise ModelError(
                "no isolation forest to save: fit needs at least "
                f"{self.settings.min_train_sessions} sessions"
            )
        if getattr(self, "model_", None) is None:
            raise ModelError("this forest was fitted out of process; fit it in-process "
                             "(toolwatch train) to save it")
        _import_sklearn()
        import skops.io as sio

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        state = {**self._state_fields(), "model": self.model_}
        tmp = p.with_suffix(p.suffix + ".tmp")
        sio.dump(state, tmp)
        tmp.replace(p)
        _write_trees(self, p)
        return p

    def load(self, path: str | Path, *, isolated: bool = False) -> Self:
        """Load a model written by :meth:`save`.

        ``isolated``: read the trees from the ``.npz`` beside the model when it matches
        the model file, else load the model in a child process; either way this process
        never imports scikit-learn.

        Raises
        ------
        ModelError
            Missing/unreadable file, types outside :data:`TRUSTED_TYPES`, another feature
            set, or a scikit-learn major.minor different from the installed one (or, when
            ``isolated``, the child failed).
        """
        p = Path(path)
        if not p.is_file():
            raise ModelError(f"model file {p} not found (run `toolwatch train`)")
        if isolated:
            got = _read_trees(p)
            if got is None:
                res = _child("load", str(p), json.dumps(TRUSTED_TYPES))
                got = (res.trees, res.meta, res.state)
            trees, meta, arrays = got
            state: dict[str, Any] = {**meta, **arrays}
            model = None
        else:
            from toolwatch.detectors.forest_child import BadInput, load_state

            try:
                state = load_state(p)
            except BadInput as exc:
                raise ModelError(str(exc)) from exc
            model = state.get("model")
            if type(model).__name__ != "IsolationForest":
                raise ModelError(f"model file {p} holds no isolation forest; retrain it")
            trees = TreeEnsemble.from_sklearn(model)
        if state.get("format_version") != FORMAT_VERSION:
            raise ModelError(f"model file {p} has an unknown format; retrain it")
        saved = str(state.get("sklearn_version", "?"))
        if sklearn_minor(saved) != sklearn_minor(sklearn_version()):
            raise ModelError(
                f"model file {p} was trained with scikit-learn {saved} but "
                f"{sklearn_version()} is installed; retrain with `toolwatch train` "
                "(or set detectors.anomaly.on_version_mismatch = 'refit')"
            )
        if list(state.get("features") or []) != [f[0] for f in FOREST_FEATURES]:
            raise ModelError(f"model file {p} uses another feature set; retrain it")
        k = len(FOREST_FEATURES)
        try:
            fields = {n: np.asarray(state[n], dtype=np.float64).reshape(k)
                      for n in ("medians", "center", "scale", "raw_medians")}
            learned, n_train = float(state["learned_threshold"]), int(state["n_train"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"model file {p} lacks learned fields ({exc}); retrain it") \
                from exc
        if trees.n_features != k:
            raise ModelError(f"model file {p} uses another feature set; retrain it")
        self.model_ = model
        self.trees_ = trees
        self._cache = None
        self._memo = RowMemo()
        self.medians_ = fields["medians"]
        self.center_ = fields["center"]
        self.scale_ = fields["scale"]
        self.raw_medians_ = fields["raw_medians"]
        self.learned_threshold_ = learned
        self.n_train_ = n_train
        self.sklearn_version_ = saved
        self.trained_at_ = str(state.get("trained_at") or "")
        self.fitted_ = True
        return self


def _f(v: float) -> float | None:
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


# ---------------------------------------------------------------------- trees beside the model
def trees_path(model_path: str | Path) -> Path:
    """Where :meth:`IsolationForestDetector.save` puts the trees as arrays:
    ``forest.skops`` → ``forest.skops.npz``."""
    p = Path(model_path)
    return p.with_name(p.name + ".npz")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_trees(det: IsolationForestDetector, model_path: Path) -> None:
    """The ``.npz`` beside a saved model: its trees, learned fields and the model file's
    SHA-256 (a live process uses it only while it matches the model file)."""
    meta = {k: v for k, v in det._state_fields().items()
            if k not in ("medians", "center", "scale", "raw_medians")}
    meta["model_sha256"] = _sha256(model_path)
    arrays = {**det.trees_.to_arrays(),  # type: ignore[union-attr]
              **{f"state_{k}": np.asarray(getattr(det, f"{k}_"), dtype=np.float64)
                 for k in ("medians", "center", "scale", "raw_medians")}}
    out = trees_path(model_path)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
    tmp.replace(out)


def _read_trees(
    model_path: Path,
) -> tuple[TreeEnsemble, dict[str, Any], dict[str, np.ndarray]] | None:
    """The ``.npz`` beside ``model_path`` if it is there, readable and made from this very
    model file; else ``None`` (the caller loads the model in a child instead)."""
    side = trees_path(model_path)
    if not side.is_file():
        return None
    try:
        with np.load(side, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(str(arrays.pop("meta")))
        if not isinstance(meta, dict) or meta.get("model_sha256") != _sha256(model_path):
            return None
        state = {k.removeprefix("state_"): v for k, v in arrays.items()
                 if k.startswith("state_")}
        trees = TreeEnsemble.from_arrays(arrays)
    except (OSError, ValueError, KeyError, ModelError) as exc:
        log.warning("ignoring %s (%s); loading the model file instead", side, exc)
        return None
    return trees, meta, state


# ---------------------------------------------------------------------- child process
_stats_lock = threading.Lock()
_STATS: dict[str, Any] = {
    "forest_child_runs": 0, "forest_child_failures": 0, "forest_child_last_error": None,
    "forest_child_wall_s": None, "forest_child_peak_rss_mib": None,
}
_retry_at = 0.0
_failures_in_row = 0


def child_stats() -> dict[str, Any]:
    """This process's forest-child counters (for live status): runs, failures, the last
    error, and the last run's wall time and peak RSS."""
    with _stats_lock:
        return dict(_STATS)


def _child(cmd: str, *args: str) -> ChildResult:
    """Run the forest child, counting runs and failures (:func:`child_stats`)."""
    try:
        res = run_child(cmd, *args)
    except ModelError as exc:
        with _stats_lock:
            _STATS["forest_child_runs"] += 1
            _STATS["forest_child_failures"] += 1
            _STATS["forest_child_last_error"] = str(exc)
        raise
    with _stats_lock:
        _STATS["forest_child_runs"] += 1
        _STATS["forest_child_wall_s"] = round(res.wall_s, 3)
        _STATS["forest_child_peak_rss_mib"] = round(res.peak_rss_mib, 1)
    log.info("isolation forest %s in a child process: %.2f s, peak RSS %.0f MiB",
             cmd, res.wall_s, res.peak_rss_mib)
    return res


def fit_isolated(x: np.ndarray, n_estimators: int, max_samples: int,
                 random_state: int) -> ChildResult:
    """Fit the trees on the prepared matrix ``x`` in a child process (same estimator,
    parameters and seed as in-process, so the same trees).

    Raises
    ------
    ModelError
        The child failed (see :func:`~toolwatch.detectors.forest_trees.run_child`).
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="toolwatch-forest-x-") as tmp:
        src = Path(tmp) / "x.npy"
        np.save(src, np.ascontiguousarray(x, dtype=np.float64), allow_pickle=False)
        return _child("fit", str(src), str(n_estimators), str(max_samples),
                      str(random_state))


def load_or_fit(
    detector: IsolationForestDetector, model_path: Path | None, fit_on: FeatureSet,
    *, isolated: bool = False,
) -> str:
    """Load ``model_path`` when given and present, else fit on ``fit_on``.

    Returns how the model was obtained: ``loaded``, ``fitted`` or ``refit`` (saved model
    incompatible and ``on_version_mismatch = 'refit'``); ``failed`` when ``isolated`` and
    the child process failed.

    ``isolated`` (live processes): fitting or loading runs in a short-lived child process
    and this process never imports scikit-learn. A child that fails (bad model file,
    crash, kill, timeout) is logged and counted (:func:`child_stats`); the forest stays
    unfitted, the other detectors go on, and the child is not tried again for
    :data:`CHILD_RETRY_S` seconds (doubling per consecutive failure).

    Raises
    ------
    ModelError
        (Not ``isolated``.) When the saved model is incompatible and the config says
        ``'error'``, or the file is untrusted/corrupt.
    """
    if not isolated:
        return _load_or_fit(detector, model_path, fit_on, isolated=False)
    global _retry_at, _failures_in_row
    if time.monotonic() < _retry_at:
        return "failed"
    try:
        how = _load_or_fit(detector, model_path, fit_on, isolated=True)
    except ModelError as exc:
        _failures_in_row += 1
        wait = min(CHILD_RETRY_MAX_S, CHILD_RETRY_S * 2 ** (_failures_in_row - 1))
        _retry_at = time.monotonic() + wait
        detector.model_ = None
        detector.trees_ = None
        log.error("isolation forest unavailable (detection goes on without it; "
                  "retrying in %.0f s): %s", wait, exc)
        return "failed"
    _failures_in_row = 0
    return how


def _load_or_fit(
    detector: IsolationForestDetector, model_path: Path | None, fit_on: FeatureSet,
    *, isolated: bool,
) -> str:
    if model_path is not None and Path(model_path).is_file():
        try:
            detector.load(model_path, isolated=isolated)
            detector.learn_habits(fit_on)
            return "loaded"
        except ModelError as exc:
            version_issue = "scikit-learn" in str(exc)
            if not version_issue or detector.settings.on_version_mismatch == "error":
                raise
            warnings.warn(f"{exc}; refitting on the data at hand", stacklevel=3)
            detector.fit(fit_on, isolated=isolated)
            return "refit"
    detector.fit(fit_on, isolated=isolated)
    return "fitted"
