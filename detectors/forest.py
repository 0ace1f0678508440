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
``anomaly.on_version_mismatch = "refit"``).
"""

from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from sklearn.ensemble import IsolationForest

from toolwatch.detectors.base import Detector, FeatureSet, session_frame
from toolwatch.detectors.baseline import habits, habitual_gate
from toolwatch.detectors.scoring import all_of, gate
from toolwatch.detectors.text import clean, num, pct

from toolwatch.errors import ModelError

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

#: Every type a saved model may contain beyond skops' built-in safe set. Loading refuses
#: files holding anything else.
TRUSTED_TYPES: list[str] = [
    "sklearn.ensemble._iforest.IsolationForest",
    "sklearn.tree._classes.ExtraTreeRegressor",
    "sklearn.tree._tree.Tree",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.float64",
    "numpy.int64",
    "builtins.dict",
    "builtins.list",
    "builtins.str",
    "builtins.int",
    "builtins.float",
]

FORMAT_VERSION = 2

#: Smallest robust scale of a share feature for the outlier check (5 percentage points).
RATIO_MIN_SCALE = 0.05


def _import_sklearn() -> None:
    """Import scikit-learn's forest without pandas when pandas is not loaded yet.

    ``sklearn.utils.fixes`` imports pandas whenever it is installed (for its optional
    DataFrame output, which the forest never uses): ~37 MiB of RSS and ~0.3 s of CPU in
    every live process that fits or loads a forest. pandas is hidden for the duration of
    that first import only; ``import pandas`` works normally afterwards, and a process
    that already has pandas (the dashboard) is not affected.
    """
    import sys

    if "sklearn.ensemble" in sys.modules:
        return
    hide = "pandas" not in sys.modules
    if hide:
        sys.modules["pandas"] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        import sklearn.ensemble  # noqa: F401
    finally:
        if hide and sys.modules.get("pandas", 0) is None:
            del sys.modules["pandas"]


def sklearn_version() -> str:
    """Installed scikit-learn version.

    scikit-learn (with scipy and pandas, which it imports) takes ~1 s of CPU to import,
    so this module imports it only when a forest is fitted or loaded: ``import detectors``
    stays cheap and ``analyze`` can overlap that import with work that does not need it.
    """
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


def _iso_scores(model: IsolationForest, x: np.ndarray) -> np.ndarray:
    """Isolation scores (``-score_samples``) of the rows of ``x``.

    After flooring, many sessions share the exact same feature vector; each distinct row
    is scored once (a forest pass costs far more than finding duplicates). A row's score
    does not depend on the other rows scored with it, so the result is the same.
    """
    if x.shape[0] < 2:
        return -model.score_samples(x)
    x = np.ascontiguousarray(x)
    rows = x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    return (-model.score_samples(x[first]))[inverse.ravel()]


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
    def fit(self, history: FeatureSet) -> Self:
        """Fit on history sessions; too few sessions leave it unfitted (neutral scores)."""
        a = self.settings
        self.fitted_ = True
        self.model_ = None
        self._cache = None
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
        _import_sklearn()
        from sklearn.ensemble import IsolationForest

        model = IsolationForest(
            n_estimators=a.n_estimators,
            max_samples=min(a.max_samples, x.shape[0]),
            random_state=a.random_state,
            n_jobs=1,
        ).fit(x)
        # The alert quantile from (at most) 20k training sessions: precise enough, cheap.
        step = 1 if x.shape[0] <= 20_000 else max(1, x.shape[0] // 20_000)
        if sampled:
            train_scores = _iso_scores(model, x[::step])
        else:
            # x holds every history session, prepared exactly as scoring prepares it:
            # score them all once, for the quantile, the habits and (batch) scoring.
            all_scores = _iso_scores(model, x)
            train_scores = all_scores[::step]
            self._cache = (history.sessions, all_scores)
        self.model_ = model
        self.medians_ = med
        self.raw_medians_ = np.array(
            [float(np.nanmedian(raw[:, j])) if np.isfinite(raw[:, j]).any() else 0.0
             for j in range(raw.shape[1])]
        )
        self.learned_threshold_ = float(np.quantile(train_scores, 1.0 - a.contamination))
        self.n_train_ = int(x.shape[0])
        self.sklearn_version_ = sklearn_version()
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
        scores = self._score_sessions(history.sessions)
        self.habit_ = habits(
            history.sessions.select("caller_id", "first_t").with_columns(
                pl.Series("_raw", scores, dtype=pl.Float64)
            ),
            "_raw", ["caller_id"], min_rows=cfg.baseline_min_sessions,
            min_days=cfg.baseline_min_days,
        )
        return self

    def _score_sessions(self, sessions: pl.DataFrame) -> np.ndarray:
        cached = getattr(self, "_cache", None)
        if cached is not None and cached[0] is sessions:
            return cached[1]
        raw = raw_feature_frame(sessions).to_numpy().astype(np.float64)
        scores, _ = self._score_raw(raw)
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
        return getattr(self, "model_", None) is not None

    # ------------------------------------------------------------------ scoring
    def _score_raw(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self._prep(_transform(raw), self.medians_)
        return _iso_scores(self.model_, x), x  # type: ignore[arg-type]

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
            scores = self._score_sessions(sessions)
            z = self._outlier_z(raw.to_numpy().astype(np.float64))
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
        drops = np.zeros((x.shape[0], k))
        for j in range(k):
            xc = x.copy()
            xc[:, j] = self.medians_[j]
            drops[:, j] = base - (-self.model_.score_samples(xc))  # type: ignore[union-attr]
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
    def save(self, path: str | Path) -> Path:
        """Write the fitted model with skops (no pickle), stamped with versions.

        Raises
        ------
        ModelError
            When there is no fitted forest to save.
        """
        _import_sklearn()
        import skops.io as sio

        if not self.model_fitted:
            raise ModelError(
                "no isolation forest to save: fit needs at least "
                f"{self.settings.min_train_sessions} sessions"
            )
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "format_version": FORMAT_VERSION,
            "sklearn_version": self.sklearn_version_,
            "features": [f[0] for f in FOREST_FEATURES],
            "model": self.model_,
            "medians": self.medians_,
            "center": self.center_,
            "scale": self.scale_,
            "raw_medians": self.raw_medians_,
            "learned_threshold": self.learned_threshold_,
            "n_train": self.n_train_,
            "trained_at": self.trained_at_,
        }
        tmp = p.with_suffix(p.suffix + ".tmp")
        sio.dump(state, tmp)
        tmp.replace(p)
        return p

    def load(self, path: str | Path) -> Self:
        """Load a model written by :meth:`save`.

        Raises
        ------
        ModelError
            Missing/unreadable file, types outside :data:`TRUSTED_TYPES`, another feature
            set, or a scikit-learn major.minor different from the running one.
        """
        _import_sklearn()
        import skops.io as sio

        p = Path(path)
        if not p.is_file():
            raise ModelError(f"model file {p} not found (run `toolwatch train`)")
        try:
            untrusted = sio.get_untrusted_types(file=p)
        except Exception as exc:  # skops raises various errors on corrupt files
            raise ModelError(f"model file {p} is not a readable skops file: {exc}") from exc
        bad = sorted(set(untrusted) - set(TRUSTED_TYPES))
        if bad:
            raise ModelError(f"model file {p} holds untrusted types {bad}; refusing to load")
        try:
            state = sio.load(p, trusted=TRUSTED_TYPES)
        except Exception as exc:
            raise ModelError(f"cannot load model file {p}: {exc}") from exc
        if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
            raise ModelError(f"model file {p} has an unknown format; retrain it")
        saved = str(state.get("sklearn_version", "?"))
        if sklearn_minor(saved) != sklearn_minor(sklearn_version()):
            raise ModelError(
                f"model file {p} was trained with scikit-learn {saved} but "
                f"{sklearn_version()} is installed; retrain with `toolwatch train` "
                "(or set detectors.anomaly.on_version_mismatch = 'refit')"
            )
        if list(state.get("features", [])) != [f[0] for f in FOREST_FEATURES]:
            raise ModelError(f"model file {p} uses another feature set; retrain it")
        self.model_ = state["model"]
        self._cache = None
        self.medians_ = np.asarray(state["medians"], dtype=np.float64)
        self.center_ = np.asarray(state["center"], dtype=np.float64)
        self.scale_ = np.asarray(state["scale"], dtype=np.float64)
        self.raw_medians_ = np.asarray(state["raw_medians"], dtype=np.float64)
        self.learned_threshold_ = float(state["learned_threshold"])
        self.n_train_ = int(state["n_train"])
        self.sklearn_version_ = saved
        self.trained_at_ = str(state.get("trained_at", ""))
        self.fitted_ = True
        return self


def _f(v: float) -> float | None:
    v = float(v)
    return None if math.isnan(v) or math.isinf(v) else v


def load_or_fit(
    detector: IsolationForestDetector, model_path: Path | None, fit_on: FeatureSet
) -> str:
    """Load ``model_path`` when given and present, else fit on ``fit_on``.

    Returns how the model was obtained: ``loaded``, ``fitted`` or ``refit`` (saved model
    incompatible and ``on_version_mismatch = 'refit'``).

    Raises
    ------
    ModelError
        When the saved model is incompatible and the config says ``'error'``, or the file
        is untrusted/corrupt.
    """
    if model_path is not None and Path(model_path).is_file():
        try:
            detector.load(model_path)
            detector.learn_habits(fit_on)
            return "loaded"
        except ModelError as exc:
            version_issue = "scikit-learn" in str(exc)
            if not version_issue or detector.settings.on_version_mismatch == "error":
                raise
            warnings.warn(f"{exc}; refitting on the data at hand", stacklevel=2)
            detector.fit(fit_on)
            return "refit"
    detector.fit(fit_on)
    return "fitted"
