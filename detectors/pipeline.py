"""Entry points: detection (``run_batch``/``detect``) and training (``train``).

Batch and live share this code path: features of a set of events → every registered
detector scores them → decided rows become alert records. Batch fits baselines on the
history (or, without one, on the batch itself); the streaming engine
(:class:`toolwatch.detectors.stream.StreamDetector`) calls :func:`run_batch` on each
micro-batch's touched entities over its window, so alert ids — functions of (entity,
category, window) only — come out identical.
"""

from __future__ import annotations

import logging
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from toolwatch.detectors import registry
from toolwatch.detectors.alerts import build_alerts
from toolwatch.detectors.base import Detector, FeatureSet
from toolwatch.detectors.config import DetectorsConfig
from toolwatch.detectors.features import prepare_events, prepare_summaries, session_features
from toolwatch.detectors.forest import IsolationForestDetector, load_or_fit
from toolwatch.detectors.sequence import WORKFLOWS_FILE, learn_workflows, save_workflows
from toolwatch.detectors.tools import _annotate, annotate, annotated

from toolwatch.errors import ModelError

log = logging.getLogger("toolwatch.detectors")

#: Detectors that read the per-event tool annotation (computed beside the session
#: features when one of them runs; the race detector only reuses it when present).
ANNOTATION_USERS = frozenset({
    "tool_loop_rules", "privilege_chain_rules", "step_skip_rules",
    "duplicate_execution_rules", "cross_server_flow_rules",
})
#: Detectors fitted on the forest's thread, after the forest (their fit caches nothing
#: another detector's fit reads).
FIT_BESIDE_FOREST = frozenset({"concurrency_rules"})
#: Detectors scored on a second thread (in registry order) while the others score on the
#: calling one. The sequence detectors and the race detector share the tool annotation
#: cached on the feature set, so they stay on one thread (computed once, in live mode too).
SCORE_BESIDE = frozenset({
    "isolation_forest", "enumeration_rules", "tool_loop_rules", "privilege_chain_rules",
    "step_skip_rules", "duplicate_execution_rules", "cross_server_flow_rules", "race_rules",
})


def _to_us(now: datetime | None) -> int | None:
    if now is None:
        return None
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    return int(now.timestamp() * 1_000_000)


@dataclass
class DetectResult:
    """What one detection run produced.

    Attributes
    ----------
    alerts
        Alert records (``toolwatch.schema.ALERTS`` columns), suppressed ones removed.
    suppressed
        Alerts dropped by an allowlist, with ``suppressed_by`` naming it.
    scores
        Detector name → full score frame (every session / entity window), when requested.
    model
        How the isolation forest was obtained: ``loaded``, ``fitted``, ``refit``,
        ``unfitted`` (too little data) or ``disabled``.
    timings
        Seconds per stage.
    """

    alerts: pl.DataFrame
    suppressed: pl.DataFrame
    scores: dict[str, pl.DataFrame] = field(default_factory=dict)
    model: str = "disabled"
    timings: dict[str, float] = field(default_factory=dict)
    n_events: int = 0
    n_sessions: int = 0

    @property
    def suppressed_count(self) -> int:
        """Number of alerts dropped by allowlists."""
        return self.suppressed.height


def _fit_all(
    dets: list[Detector], fit_on: FeatureSet, model_path: Path | None,
    reuse: dict[str, Any] | None = None,
) -> str:
    if model_path is not None:
        # Learned workflows are saved beside the forest (toolwatch train).
        for det in dets:
            if hasattr(det, "model_dir"):
                det.model_dir = Path(model_path).parent
    # The forest is fitted on its own thread while the rule detectors fit here: both spend
    # their time in native code that releases the GIL (scikit-learn's tree builder,
    # polars), so on two cores the forest costs little wall time on top of the rules.
    if reuse is not None and reuse.get("forest") is not None:
        # Live mode: the forest was loaded or fitted once for the process; only the
        # callers' habits follow the history (scoring, no fit).
        cached = reuse["forest"]
        for i, d in enumerate(dets):
            if isinstance(d, IsolationForestDetector):
                dets[i] = cached
        for det in dets:
            if det is cached:
                det.learn_habits(fit_on)
            else:
                det.fit(fit_on)
        return "reused"
    forests = [d for d in dets if isinstance(d, IsolationForestDetector)]
    # Detectors whose fit shares no cached work with the others (the concurrency sweep)
    # fit on the forest's thread after it, which balances the two threads: the forest
    # (~0.3 CPU-s on 1M events) alone is shorter than the rules (~0.6).
    beside = [d for d in dets if d.name in FIT_BESIDE_FOREST] if forests else []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="forest-fit") as pool:
        # Live processes (reuse["live"]) fit or load the forest in a short-lived child, so
        # they never import scikit-learn (~90 MiB); batch analyze fits in process.
        isolated = bool(reuse and reuse.get("live"))
        fitting = [pool.submit(load_or_fit, det, model_path, fit_on, isolated=isolated)
                   for det in forests]
        others = [pool.submit(det.fit, fit_on) for det in beside]
        for det in dets:
            if not isinstance(det, IsolationForestDetector) and det not in beside:
                det.fit(fit_on)
        hows = [f.result() for f in fitting]
        for f in others:
            f.result()
    model = "disabled"
    for det, how in zip(forests, hows, strict=True):
        model = how if det.model_fitted else "unfitted"
        if reuse is not None and det.model_fitted:
            reuse["forest"] = det
    return model


def _score_all(
    dets: list[Detector], batch: FeatureSet, config: DetectorsConfig, detected_at: int | None,
    keep_scores: bool, timings: dict[str, float],
) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, pl.DataFrame]]:
    scores: dict[str, pl.DataFrame] = {}

    def run(det: Detector) -> tuple[pl.DataFrame, pl.DataFrame, float]:
        t0 = time.perf_counter()
        sc = det.score(batch)
        return sc, det.decide(sc), time.perf_counter() - t0

    # Scoring reads what fitting cached on the feature set, so the detectors score on two
    # threads (polars and scikit-learn release the GIL); see SCORE_BESIDE. Results keep
    # registry order, so alerts come out as before.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="score") as pool:
        side = {id(d): pool.submit(run, d) for d in dets if d.name in SCORE_BESIDE}
        done = {id(d): run(d) for d in dets if id(d) not in side}
        done.update({k: f.result() for k, f in side.items()})
    decided: list[tuple[Detector, pl.DataFrame]] = []
    for det in dets:
        sc, dec, secs = done[id(det)]
        decided.append((det, dec))
        if keep_scores:
            scores[det.name] = sc
        timings[f"score:{det.name}"] = secs
    t0 = time.perf_counter()
    alerts, suppressed = build_alerts(decided, config, detected_at)
    timings["alerts"] = time.perf_counter() - t0
    return alerts, suppressed, scores


def _features(
    events: pl.DataFrame | None, summaries: pl.DataFrame | None, config: DetectorsConfig,
    *, annotate_too: bool,
) -> FeatureSet:
    """:meth:`FeatureSet.build`; with ``annotate_too``, the tool annotation the sequence
    detectors read (:func:`toolwatch.detectors.tools.annotated`) is computed on a second
    thread while the session features are aggregated, and cached on the feature set."""
    if not annotate_too:
        return FeatureSet.build(events, summaries, config)
    ev = prepare_events(events, config)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="annotate") as pool:
        tools = pool.submit(_annotate, ev, config)
        fs = FeatureSet(ev, session_features(ev, prepare_summaries(summaries), config), config)
        fs._tools_annotated, fs._tools_keys = tools.result()  # type: ignore[attr-defined]
    return fs


def _history_features(
    history: pl.DataFrame, config: DetectorsConfig, reuse: dict[str, Any] | None
) -> FeatureSet:
    """Features of the baseline history; live mode computes them once per history frame.

    Live detection splits a large detection into passes that all get the *same* history
    frame: its features are computed on the first call and reused while that frame is
    alive. The cache holds the frame weakly and is emptied when the frame is let go (the
    detection is over), so nothing more than before is held between flushes.
    """
    if reuse is None:
        return FeatureSet.build(history, None, config)
    cached = reuse.get("history_features")
    if cached is not None and cached[0]() is history and cached[1] is config:
        return cached[2]
    reuse.pop("history_features", None)  # drop the previous one before building the next
    fs = FeatureSet.build(history, None, config)
    reuse["history_features"] = entry = (weakref.ref(history), config, fs)

    def forget() -> None:
        if reuse.get("history_features") is entry:
            reuse.pop("history_features", None)

    weakref.finalize(history, forget)
    reuse["history_builds"] = reuse.get("history_builds", 0) + 1
    return fs


def _history_rest(history: pl.DataFrame, batch: FeatureSet) -> pl.DataFrame | None:
    """History events of the sessions ``batch`` holds no event of, or None: use it all.

    ``FeatureSet.union(history, batch)`` drops every history event and session row of a
    session the batch has events of, and session features are per session (each row
    aggregates its own session's events, in their order), so featurizing only these
    events gives the union the same rows. Worth it when they are a minority: under a
    live backlog the history (the window's newest events) lies wholly inside the
    detection's own events, and its features (~20% of an 80k pass) were all dropped.
    None when most of the history stays (the whole-frame features are then built once
    and shared by a detection's passes, see :func:`_history_features`).
    """
    if "session_id" not in history.columns or batch.events.height == 0:
        return None
    sid = pl.col("session_id")
    if history["session_id"].null_count():
        # The stand-in id prepare_events gives an event logged without a session.
        stand = [pl.col(c) for c in ("caller_id", "client_ip") if c in history.columns]
        sid = pl.coalesce(sid, pl.lit("nosession:") + pl.coalesce(*stand, pl.lit("?")))
    # The batch's sessions with events, one row each (session_features groups the
    # prepared events by session): the distinct session ids of batch.events without
    # another pass over every event's string (~2 ms of an 80k-event pass).
    known = batch.sessions.filter(pl.col("basis") != "summary")["session_id"]
    keep = history.select((~sid.is_in(known.implode())).alias("k"))["k"]
    if int(keep.sum()) * 2 > history.height:
        return None
    return history.filter(keep)


def detect(
    events: pl.DataFrame,
    summaries: pl.DataFrame | None,
    config: DetectorsConfig,
    *,
    history: pl.DataFrame | None = None,
    model_path: Path | None = None,
    now: datetime | None = None,
    detectors: list[str] | None = None,
    keep_scores: bool = False,
    reuse: dict[str, Any] | None = None,
) -> DetectResult:
    """Run every enabled detector over a batch; the full result (see :func:`run_batch`).

    Parameters
    ----------
    detectors
        Registry names to run (default: all enabled).
    keep_scores
        Also return every detector's full score frame (evaluation, notebooks).
    reuse
        Live mode's per-process cache: the first fitted (or loaded) forest is kept here
        and reused by later calls instead of being fitted or loaded again; so are the
        features of the last ``history`` frame (the passes of one live detection share
        it) and the forest's explanations of unchanged rows (:class:`ExplainMemo`).
    """
    timings: dict[str, float] = {}
    dets = registry.build(config, detectors)
    t0 = time.perf_counter()
    batch = _features(events, summaries, config,
                      annotate_too=any(d.name in ANNOTATION_USERS for d in dets))
    timings["features"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fit_on = batch
    if history is not None and history.height:
        # FeatureSet.union keeps only the history sessions the batch does not hold; when
        # that is a minority of the history (a live catch-up: the history is the newest
        # window events, which the detection reads anyway), only those are featurized.
        rest = _history_rest(history, batch)
        if rest is None:
            hist_fs = _history_features(history, config, reuse)
        elif rest.height:
            hist_fs = FeatureSet.build(rest, None, config)
            if reuse is not None:
                reuse["history_rest_builds"] = reuse.get("history_rest_builds", 0) + 1
        else:
            hist_fs = None
            if reuse is not None:
                reuse["history_covered"] = reuse.get("history_covered", 0) + 1
        if hist_fs is not None:
            if reuse is not None and hasattr(batch, "_tools_annotated"):
                # Live: annotate the shared history once per detection (cached on its
                # features); each pass's fit set then stacks it with the pass's
                # annotation instead of annotating history + pass again
                # (FeatureSet.union).
                annotated(hist_fs)
            fit_on = hist_fs.union(batch)
    model = _fit_all(dets, fit_on, model_path, reuse)
    timings["fit"] = time.perf_counter() - t0
    detected_at = _to_us(now) if now is not None else batch.max_t
    alerts, suppressed, scores = _score_all(dets, batch, config, detected_at, keep_scores,
                                            timings)
    if suppressed.height:
        log.info("%d alert(s) suppressed by allowlists", suppressed.height)
    return DetectResult(
        alerts=alerts,
        suppressed=suppressed,
        scores=scores,
        model=model,
        timings=timings,
        n_events=batch.events.height,
        n_sessions=batch.sessions.height,
    )


def fit_and_score(
    fit_on: FeatureSet,
    batch: FeatureSet,
    config: DetectorsConfig,
    *,
    detected_at: int | None,
    model_path: Path | None = None,
    reuse: dict[str, Any] | None = None,
    detectors: list[str] | None = None,
) -> pl.DataFrame:
    """Fit every enabled detector (or those named) on ``fit_on``, score ``batch``; alerts.

    The building block of partitioned analysis (``toolwatch.analyze``): ``fit_on`` is a
    partition plus a sample of the population, ``batch`` the partition alone, and
    ``detected_at`` (µs) the latest log time of the whole input, so that alert records do
    not depend on how the input was cut. ``reuse`` carries the forest across partitions.
    """
    dets = registry.build(config, detectors)
    _fit_all(dets, fit_on, model_path, reuse)
    at = detected_at if detected_at is not None else batch.max_t
    alerts, _, _ = _score_all(dets, batch, config, at, False, {})
    return alerts


def run_batch(
    events: pl.DataFrame,
    summaries: pl.DataFrame | None,
    config: DetectorsConfig,
    *,
    history: pl.DataFrame | None = None,
    model_path: Path | None = None,
    now: datetime | None = None,
    reuse: dict[str, Any] | None = None,
) -> pl.DataFrame:
    """Alerts for a batch of events and session summaries.

    Parameters
    ----------
    events
        Rows of ``toolwatch.schema.EVENTS`` (missing optional columns are tolerated).
    summaries
        Rows of ``toolwatch.schema.SUMMARIES`` (or None).
    config
        Detector configuration.
    history
        Earlier events: baselines (population, per caller) and — when no saved model is
        given — the isolation forest are fitted on history plus batch. Without history
        they are fitted on the batch itself.
    model_path
        A forest saved by :func:`train`; used when the file exists.
    now
        Detection time; defaults to the latest log time in the batch (batch and forensic
        replay never use the wall clock).

    Returns
    -------
    polars.DataFrame
        One row per (entity, category, window) with ``toolwatch.schema.ALERTS`` columns,
        allowlisted alerts removed (see :func:`detect` for the count).
    """
    return detect(events, summaries, config, history=history, model_path=model_path,
                  now=now, reuse=reuse).alerts


def train(
    events: pl.DataFrame,
    summaries: pl.DataFrame | None,
    config: DetectorsConfig,
    model_path: Path,
) -> dict[str, Any]:
    """Fit the isolation forest on history and save it (skops) to ``model_path``.

    Returns
    -------
    dict
        ``path``, ``n_train`` (sessions), ``threshold`` (effective alert threshold),
        ``learned_threshold``, ``sklearn_version``, ``trained_at``.

    Raises
    ------
    ModelError
        When history has fewer than ``anomaly.min_train_sessions`` sessions.
    """
    fs = FeatureSet.build(events, summaries, config)
    det = IsolationForestDetector(config).fit(fs)
    if not det.model_fitted:
        raise ModelError(
            f"only {fs.sessions.height} sessions in history; the forest needs at least "
            f"{config.anomaly.min_train_sessions} (detectors.anomaly.min_train_sessions)"
        )
    path = det.save(model_path)
    wf_path = Path(model_path).parent / WORKFLOWS_FILE
    rules = learn_workflows(annotate(fs.events, config), config)
    save_workflows(rules, wf_path)
    return {
        "path": str(path),
        "workflows_path": str(wf_path),
        "workflow_rules": len(rules),
        "n_train": det.n_train_,
        "threshold": det.threshold,
        "learned_threshold": det.learned_threshold_,
        "sklearn_version": det.sklearn_version_,
        "trained_at": det.trained_at_,
    }
