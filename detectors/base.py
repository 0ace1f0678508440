"""The detector contract, stated once.

A :class:`Detector` is built from the :class:`~toolwatch.detectors.config.DetectorsConfig` (its
constructor arguments *are* config), learns whatever it needs from history in
:meth:`Detector.fit` (learned state ends in ``_``, river/scikit-learn style), and
:meth:`Detector.score` turns a :class:`FeatureSet` into one row per scored entity with a
float ``score`` in ``[0, 1]`` — higher is more anomalous. Scoring is separate from deciding:
:meth:`Detector.decide` keeps rows at or above the configured threshold, and
:meth:`Detector.explain` turns one such row into plain-sentence reasons and an evidence
object. A detector never raises on a cold start: fitted on nothing (or never fitted), it
scores whatever needs no history and returns the neutral score 0.0 for the rest.

Score frame columns (:data:`SCORE_COLUMNS`) are shared by every detector; each adds its
own evidence columns after them.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import polars as pl
from toolwatch.detectors.config import DetectorsConfig
from toolwatch.detectors.features import (
    ENGINE,
    prepare_events,
    prepare_summaries,
    session_features,
)
from toolwatch.detectors.scoring import zero_nan

#: Columns every score frame starts with.
SCORE_COLUMNS: dict[str, pl.DataType] = {
    "entity_type": pl.String(),  # session | caller_id | client_ip
    "entity_id": pl.String(),
    "window_start": pl.Int64(),  # µs; null for session rows (the window is the session)
    "score": pl.Float64(),
    "session_id": pl.String(),
    "caller_id": pl.String(),
    "client_ip": pl.String(),
    "server": pl.String(),
    "first_t": pl.Int64(),  # µs, log time of the first piece of evidence
    "last_t": pl.Int64(),
}


@dataclass
class FeatureSet:
    """Everything detectors read about one batch (or one history).

    Attributes
    ----------
    events
        Prepared events (:func:`toolwatch.detectors.features.prepare_events`).
    sessions
        Session features (:func:`~toolwatch.detectors.features.session_features`), one row
        per session.
    config
        The configuration the features were computed with.
    """

    events: pl.DataFrame
    sessions: pl.DataFrame
    config: DetectorsConfig

    @classmethod
    def build(
        cls,
        events: pl.DataFrame | None,
        summaries: pl.DataFrame | None,
        config: DetectorsConfig,
    ) -> FeatureSet:
        """Compute features of raw ``schema.EVENTS`` / ``schema.SUMMARIES`` rows."""
        ev = prepare_events(events, config)
        su = prepare_summaries(summaries)
        return cls(ev, session_features(ev, su, config), config)

    @classmethod
    def empty(cls, config: DetectorsConfig) -> FeatureSet:
        """No history at all (cold start)."""
        return cls.build(None, None, config)

    def union(self, other: FeatureSet) -> FeatureSet:
        """History plus batch; a session present in both keeps ``other``'s figures."""
        sessions = pl.concat(
            [self.sessions.join(other.sessions, on="session_id", how="anti"), other.sessions],
            how="diagonal_relaxed",
        )
        known = other.events.select("session_id").unique()
        # Rows are named by ``i`` (their row in their own set; fits join arguments back on
        # it): the history's rows are renumbered after the batch's, which keep theirs.
        renumber = pl.col("i") + other.events.height
        ann = _stacked_annotation(self, other, known, renumber)
        if ann is not None:
            # The events are the annotated rows' event columns: the same rows, in order.
            fs = FeatureSet(ann.select(pl.concat(
                [self.events.clear(), other.events.clear()], how="diagonal_relaxed").columns),
                sessions, other.config)
            fs._tools_annotated = ann  # type: ignore[attr-defined]
            fs._tools_keys = other._tools_keys  # type: ignore[attr-defined]
        else:
            events = pl.concat(
                [self.events.join(known, on="session_id", how="anti").with_columns(renumber),
                 other.events],
                how="diagonal_relaxed",
            )
            fs = FeatureSet(events, sessions, other.config)
        if fs.sessions.schema == other.sessions.schema \
                and fs.events.schema == other.events.schema:
            # ``other``'s rows, unchanged (no column added or cast by the relaxed concat),
            # end both frames: see union_part. Weakly held, like the live caches.
            fs._union_part = (  # type: ignore[attr-defined]
                weakref.ref(other), sessions.height - other.sessions.height,
                fs.events.height - other.events.height)
        return fs

    @property
    def max_t(self) -> int | None:
        """Latest log time (µs) seen in the set, or None when empty."""
        if self.sessions.height == 0:
            return None
        return self.sessions["last_t"].max()  # type: ignore[return-value]


def _stacked_annotation(
    hist: FeatureSet, batch: FeatureSet, known: pl.DataFrame, renumber: pl.Expr
) -> pl.DataFrame | None:
    """The tool annotation of ``hist.union(batch)`` from the two sets' own annotations.

    Each event's annotation depends on the event and on the argument names looked for
    (the idempotency and business keys of the tools present, ``_tools_keys``); when both
    sets looked for the same names, the union's annotation is the two stacked, as the
    union stacks the events (history rows of sessions the batch holds dropped). None when
    either set is not annotated or the names differ: it is then computed when needed.
    """
    a = getattr(hist, "_tools_annotated", None)
    b = getattr(batch, "_tools_annotated", None)
    if a is None or b is None or a.height != hist.events.height \
            or b.height != batch.events.height:
        return None
    if getattr(hist, "_tools_keys", None) != getattr(batch, "_tools_keys", ()):
        return None
    if a.schema != b.schema:
        return None
    return pl.concat([a.join(known, on="session_id", how="anti").with_columns(renumber), b],
                     how="vertical")


def union_part(whole: FeatureSet, part: FeatureSet | None = None,
               *, annotation: bool = False) -> tuple[FeatureSet, int] | None:
    """The batch ``whole`` was built from by ``hist.union(batch)``, and where its sessions
    start in ``whole.sessions``; None when ``whole`` is no such union (or ``part`` is given
    and is not that batch).

    The batch's session rows end ``whole.sessions`` and its events end ``whole.events``,
    unchanged (same values, same dtypes, same order), and no other row of ``whole``
    belongs to one of its sessions. So a per-session figure a detector's fit computed on
    ``whole`` (the history plus the batch, in a live pass) is, for the batch's sessions,
    what scoring the batch would compute again: the rows of its sessions can be taken
    instead. With ``annotation``, also only when both sets' tool annotations looked for
    the same argument names (each event's annotation is then the same in both, see
    :func:`toolwatch.detectors.tools.annotated`).
    """
    entry = getattr(whole, "_union_part", None)
    if entry is None:
        return None
    batch = entry[0]()
    if batch is None or (part is not None and batch is not part):
        return None
    if annotation and (
            getattr(whole, "_tools_keys", None) is None
            or getattr(whole, "_tools_keys", None) != getattr(batch, "_tools_keys", None)):
        return None
    return batch, entry[1]


class Detector(ABC):
    """Base class of every detector.

    Parameters
    ----------
    config
        The whole detector configuration; the detector reads its own table
        (``config.<config_key>``) and the shared windows/baselines.

    Notes
    -----
    Subclasses set the class attributes, implement :meth:`score` and :meth:`explain`, and
    override :meth:`fit` when they learn from history. Learned attributes end in ``_``.
    """

    #: Registry name (also the ``detector`` field of alerts).
    name: ClassVar[str]
    #: Alert category (one of :data:`toolwatch.detectors.config.CATEGORIES`).
    category: ClassVar[str]
    #: Attribute of :class:`DetectorsConfig` holding this detector's settings.
    config_key: ClassVar[str]
    #: One line for docs and ``toolwatch config``.
    summary: ClassVar[str] = ""
    #: The detector's own settings dataclass, kept beside it, for a detector whose
    #: ``config_key`` is not a table of :class:`DetectorsConfig` (one added outside this
    #: package): ``[detectors.<config_key>]`` is then parsed with it
    #: (:meth:`DetectorsConfig.table`). Must have ``enabled`` and ``threshold`` fields.
    config_class: ClassVar[type | None] = None

    def __init__(self, config: DetectorsConfig):
        self.config = config

    @property
    def settings(self) -> Any:
        """This detector's own config table."""
        own = getattr(self.config, self.config_key, None)
        if own is None and self.config_class is not None:
            return self.config.table(self.config_key, self.config_class)
        return own

    @property
    def enabled(self) -> bool:
        """Whether the config enables this detector."""
        return bool(getattr(self.settings, "enabled", True))

    @property
    def threshold(self) -> float:
        """Score from which :meth:`decide` keeps a row."""
        return float(self.settings.threshold)

    @property
    def is_fitted(self) -> bool:
        """True once :meth:`fit` ran (on any history, even empty)."""
        return getattr(self, "fitted_", False)

    def fit(self, history: FeatureSet) -> Self:
        """Learn from history. Stateless detectors only record that they were fitted.

        Parameters
        ----------
        history
            Past traffic (possibly empty). Must never raise on an empty set.
        """
        self.fitted_ = True
        return self

    @abstractmethod
    def score(self, features: FeatureSet) -> pl.DataFrame:
        """Score a batch: one row per entity (session, or entity and window).

        Returns
        -------
        polars.DataFrame
            :data:`SCORE_COLUMNS` followed by detector-specific evidence columns. Every
            session of ``features.sessions`` gets a row (score 0.0 when nothing applies);
            entity rows are added for (entity, window) pairs with evidence.
        """

    def decide(self, scores: pl.DataFrame) -> pl.DataFrame:
        """Rows whose score reaches the threshold (scoring and deciding are separate)."""
        return scores.filter(pl.col("score") >= self.threshold)

    @abstractmethod
    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Plain-sentence reasons (with the numbers) and evidence figures for one row."""

    def explain_all(self, decided: pl.DataFrame) -> list[tuple[list[str], dict[str, Any]]]:
        """:meth:`explain` for every row of ``decided`` (override to vectorize)."""
        return [self.explain(r) for r in decided.iter_rows(named=True)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, fitted={self.is_fitted})"


def empty_scores(extra: dict[str, pl.DataType] | None = None) -> pl.DataFrame:
    """A score frame with no rows."""
    return pl.DataFrame(schema={**SCORE_COLUMNS, **(extra or {})})


def session_frame(
    sessions: pl.DataFrame, score: pl.Expr, extra: list[str | pl.Expr]
) -> pl.DataFrame:
    """Score frame rows for every session: identity columns, ``score`` and evidence."""
    # Lazy, so polars evaluates sub-expressions shared by the nested score terms once.
    return sessions.lazy().select(
        pl.lit("session").alias("entity_type"),
        pl.col("session_id").alias("entity_id"),
        pl.lit(None, pl.Int64).alias("window_start"),
        zero_nan(score.cast(pl.Float64).fill_null(0.0)).alias("score"),
        "session_id",
        "caller_id",
        "client_ip",
        "server",
        pl.col("first_t"),
        pl.col("last_t"),
        *extra,
    ).collect(engine=ENGINE)
