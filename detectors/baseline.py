"""Robust baselines: the population's and each entity's own "normal", in log units.

Volumes are heavy-tailed, so figures are compared as ``log1p(x)`` with the median and the
median absolute deviation (MAD, scaled by 1.4826 to match a standard deviation). A robust
z-score of 3.5 is the usual outlier cut. An entity's *own* baseline counts only once it is
established — enough sessions spread over enough distinct days — so an attacker's burst
cannot become its own normal while a service account exporting every night can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import polars as pl
from toolwatch.detectors.features import ENGINE, SEED, US_PER_DAY

MAD_SCALE = 1.4826


def log1p(col: str) -> pl.Expr:
    """``log(1 + max(x, 0))`` of a column, nulls as 0."""
    return pl.col(col).cast(pl.Float64).fill_null(0.0).clip(lower_bound=0.0).log1p()


@dataclass
class Baseline:
    """Population and per-key medians/MADs of log figures.

    Parameters
    ----------
    cols
        Figure columns (raw units; logged internally).
    keys
        Columns identifying an entity for its own baseline (e.g. ``["caller_id"]``).
    min_rows, min_days
        An entity's own baseline is established with at least ``min_rows`` rows over
        ``min_days`` distinct UTC days.
    min_mad
        Floor of the MAD (log units).
    """

    cols: list[str]
    keys: list[str]
    min_rows: int = 3
    min_days: int = 2
    min_mad: float = 0.5
    pop_: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    own_: pl.DataFrame | None = None

    def fit(self, frame: pl.DataFrame, t_col: str = "first_t") -> Baseline:
        """Learn from ``frame`` (one row per observation: session or entity window)."""
        self.pop_ = {}
        # Every figure's population median, MAD and count in one query, and the entities'
        # own figures in a second one run beside it (``collect_all``): a fit on a small
        # live pass was ~20 polars calls, each with a fixed cost, for a few thousand rows.
        # The MAD subtracts the median computed in the same query: the same float64
        # arithmetic as subtracting it in Python.
        pop: list[pl.Expr] = []
        for i, c in enumerate(self.cols):
            v = log1p(c).filter(pl.col(c).is_not_null())
            pop += [v.median().alias(f"m{i}"), (v - v.median()).abs().median().alias(f"d{i}"),
                    v.len().alias(f"n{i}")]
        queries = [frame.lazy().select(pop)] if pop else []
        own_q = None
        if self.keys and frame.height:
            # Only entities with enough observations can be established: drop the rest
            # before anything per entity is computed. With many distinct callers (most
            # seen once) this keeps the per-entity state to the few that can matter; the
            # count runs on a 64-bit hash of the key, not on the strings.
            own = _established_lazy(frame.lazy(), self.keys, self.min_rows).select(
                *self.keys,
                (pl.col(t_col) // US_PER_DAY).alias("_day"),
                *[log1p(c).alias(f"_l_{c}") for c in self.cols],
            )
            aggs: list[pl.Expr] = [pl.len().alias("_n"), pl.col("_day").n_unique().alias("_days")]
            for c in self.cols:
                lc = pl.col(f"_l_{c}")
                aggs.append(lc.median().alias(f"_med_{c}"))
                # Robust spread per entity from the interquartile range in one pass (the MAD
                # needs the median first): for normal data MAD = IQR / 2.
                aggs.append(((lc.quantile(0.75) - lc.quantile(0.25)) / 2.0).alias(f"_mad_{c}"))
            own_q = _group_agg_lazy(own, self.keys, *aggs).with_columns(
                ((pl.col("_n") >= self.min_rows) & (pl.col("_days") >= self.min_days))
                .alias("_established")
            )
            queries.append(own_q)
        done = pl.collect_all(queries, engine=ENGINE) if queries else []
        if pop:
            row = done[0].row(0)
            for i, c in enumerate(self.cols):
                med, mad, n = row[3 * i], row[3 * i + 1], row[3 * i + 2]
                if n:
                    self.pop_[c] = (float(med), float(mad), int(n))
        self.own_ = done[-1] if own_q is not None else None
        return self

    @property
    def is_fitted(self) -> bool:
        """Whether any population figure was learned."""
        return bool(self.pop_)

    def z_pop(self, col: str, value: pl.Expr | None = None) -> pl.Expr:
        """Robust z of ``col`` versus the population (0 when unknown)."""
        if col not in self.pop_:
            return pl.lit(0.0)
        med, mad, _ = self.pop_[col]
        scale = max(mad * MAD_SCALE, self.min_mad)
        v = log1p(col) if value is None else value
        return (v - med) / scale

    def pop_typical(self, col: str) -> float | None:
        """Population median in raw units (for reasons)."""
        if col not in self.pop_:
            return None
        return math.expm1(self.pop_[col][0])

    def with_own(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Join each row's own baseline: adds ``own_z_<col>`` (null unless established),
        ``own_typical_<col>`` (raw units), ``own_n`` and ``own_days``."""
        if self.own_ is None or not self.keys:
            extra = [pl.lit(None, pl.Float64).alias(f"own_z_{c}") for c in self.cols]
            extra += [pl.lit(None, pl.Float64).alias(f"own_typical_{c}") for c in self.cols]
            return frame.with_columns(
                *extra, pl.lit(0, pl.Int64).alias("own_n"), pl.lit(0, pl.Int64).alias("own_days")
            )
        out = frame.lazy().join(self.own_.lazy(), on=self.keys, how="left", nulls_equal=False)
        exprs: list[pl.Expr] = []
        for c in self.cols:
            scale = pl.max_horizontal(pl.col(f"_mad_{c}") * MAD_SCALE, pl.lit(self.min_mad))
            z = (log1p(c) - pl.col(f"_med_{c}")) / scale
            exprs.append(pl.when(pl.col("_established")).then(z).alias(f"own_z_{c}"))
            exprs.append(pl.col(f"_med_{c}").exp().sub(1.0).alias(f"own_typical_{c}"))
        exprs.append(pl.col("_n").fill_null(0).cast(pl.Int64).alias("own_n"))
        exprs.append(pl.col("_days").fill_null(0).cast(pl.Int64).alias("own_days"))
        drop = [c for c in self.own_.columns if c not in self.keys]
        return out.with_columns(exprs).drop(drop).collect(engine=ENGINE)


def key_hash(keys: list[str]) -> pl.Expr:
    """A 64-bit hash of the key columns (cheaper to count and group by than strings)."""
    if len(keys) == 1:
        return pl.col(keys[0]).hash(SEED)
    return pl.struct(keys).hash(SEED)


def established_rows(frame: pl.DataFrame, keys: list[str], min_rows: int) -> pl.DataFrame:
    """Rows of ``frame`` whose key columns are all set and whose key has at least
    ``min_rows`` rows (a hash collision can only keep a few rows too many, which the
    callers' own ``_n >= min_rows`` checks then reject)."""
    own = frame.filter(pl.all_horizontal([pl.col(k).is_not_null() for k in keys]))
    if min_rows <= 1 or own.height == 0:
        return own
    return own.filter(pl.len().over(key_hash(keys)) >= min_rows)


def _established_lazy(frame: pl.LazyFrame, keys: list[str], min_rows: int) -> pl.LazyFrame:
    """:func:`established_rows` as a lazy query (same rows, same order)."""
    own = frame.filter(pl.all_horizontal([pl.col(k).is_not_null() for k in keys]))
    if min_rows <= 1:
        return own
    return own.filter(pl.len().over(key_hash(keys)) >= min_rows)


def _group_agg_lazy(lf: pl.LazyFrame, keys: list[str], *aggs: pl.Expr) -> pl.LazyFrame:
    """:func:`toolwatch.detectors.features.group_agg` as a lazy query."""
    if len(keys) == 1:
        return lf.group_by(keys).agg(*aggs)
    return (
        lf.group_by(pl.struct(keys).hash(SEED).alias("_gk"))
        .agg(*[pl.col(k).first() for k in keys], *aggs)
        .drop("_gk")
    )


def habits(
    frame: pl.DataFrame,
    raw_col: str,
    keys: list[str],
    *,
    min_rows: int,
    min_days: int,
    t_col: str = "first_t",
) -> pl.DataFrame:
    """Each established entity's typical (median) raw pattern score.

    An entity whose *typical* session already scores at alert level does this habitually
    (the nightly export, the sync job, the health probe): only a session far beyond its own
    normal should alert for it.

    Returns
    -------
    polars.DataFrame
        ``keys`` plus ``habit_score`` for entities with at least ``min_rows`` observations
        on ``min_days`` distinct UTC days.
    """
    if frame.height == 0:
        empty = frame.select(keys).clear()
        return empty.with_columns(pl.lit(None, pl.Float64).alias("habit_score"))
    # Entities with fewer rows are filtered out below anyway: drop them first, so the
    # group-by only holds state for the entities that can be established.
    own = _established_lazy(frame.lazy(), keys, min_rows)
    return (
        _group_agg_lazy(
            own, keys,
            pl.len().alias("_n"),
            (pl.col(t_col) // US_PER_DAY).n_unique().alias("_days"),
            pl.col(raw_col).median().alias("habit_score"),
        )
        .filter((pl.col("_n") >= min_rows) & (pl.col("_days") >= min_days))
        .drop("_n", "_days")
        .collect(engine=ENGINE)
    )


def habitual_gate(
    frame: pl.DataFrame,
    habit: pl.DataFrame | None,
    keys: list[str],
    threshold: float,
    z_own: pl.Expr,
    self_z: float,
    *,
    slack: float = 0.0,
) -> pl.DataFrame:
    """Add ``habitual`` and ``p_own``: 1.0 unless the entity habitually scores at alert
    level (its typical score within ``slack`` of ``threshold``), in which case the row must
    also be ``self_z`` robust z-scores above its own median
    (:func:`toolwatch.detectors.scoring.gate`)."""
    from toolwatch.detectors.scoring import gate

    if habit is None or habit.height == 0:
        # Same column order as the join below (habit_score, habitual, p_own): callers
        # concatenate frames from both branches.
        return frame.with_columns(
            pl.lit(None, pl.Float64).alias("habit_score"), pl.lit(False).alias("habitual"),
            pl.lit(1.0).alias("p_own"),
        )
    out = frame.join(habit, on=keys, how="left")
    habitual = pl.col("habit_score").fill_null(0.0) >= threshold - slack
    return out.with_columns(
        habitual.alias("habitual"),
        pl.when(habitual).then(gate(z_own.fill_null(0.0), self_z)).otherwise(1.0).alias("p_own"),
    )


def daily_habits(
    frame: pl.DataFrame,
    raw_col: str,
    keys: list[str],
    *,
    min_rows: int,
    min_days: int,
    t_col: str = "first_t",
) -> pl.DataFrame:
    """Each established entity's typical *day*: the (lower) median over its active UTC days
    of the day's highest raw pattern score.

    :func:`habits` asks whether an entity's typical *session* scores at alert level; a
    pattern that a person shows once or twice on every working day (reading from a few
    servers, then posting a summary to chat) is in few of its many sessions, yet it is
    that person's routine. Here each (entity, day) is one observation, so ``min_rows``
    counts active days (an entity needs at least that many, and at least ``min_days``).

    Returns
    -------
    polars.DataFrame
        ``keys`` plus ``habit_score``, for established entities only.
    """
    if frame.height == 0:
        empty = frame.select(keys).clear()
        return empty.with_columns(pl.lit(None, pl.Float64).alias("habit_score"))
    # One query (the steps below used to be ~8 polars calls, each with a fixed cost).
    per_day = _group_agg_lazy(
        frame.lazy().filter(pl.all_horizontal([pl.col(k).is_not_null() for k in keys]))
        .with_columns((pl.col(t_col) // US_PER_DAY).alias("_day")),
        [*keys, "_day"],
        pl.col(raw_col).fill_null(0.0).max().alias("_day_raw"),
        (pl.col("_day") * US_PER_DAY).first().alias(t_col),
    )
    # "Most of its days": the lower median, so that with an even number of days an entity
    # whose two attack days sit beside two quiet ones is not habitual (the plain median
    # averages the middle two: half an attack day).
    own = _established_lazy(per_day, keys, min_rows)
    return (
        _group_agg_lazy(
            own, keys,
            pl.len().alias("_n"),
            (pl.col(t_col) // US_PER_DAY).n_unique().alias("_days"),
            pl.col("_day_raw").quantile(0.5, interpolation="lower").alias("habit_score"),
        )
        .filter((pl.col("_n") >= min_rows) & (pl.col("_days") >= min_days))
        .drop("_n", "_days")
        .collect(engine=ENGINE)
    )


def summary_routines(
    frame: pl.DataFrame,
    raw_col: str,
    value_col: str,
    keys: list[str],
    *,
    min_rows: int,
    min_hours: float,
    min_mad: float,
    threshold: float,
    value_min: float | None = None,
    max_spread: float = 1.0,
    t_col: str = "first_t",
) -> pl.DataFrame:
    """Entities whose *summary-only* sessions are a routine within the data at hand.

    A session known only from the server's summary line is a handful of counts (calls,
    unique resources, bytes). When one entity writes such summaries all day long, at least
    ``min_rows`` of them spread over ``min_hours`` or more, and its typical (median) one
    already scores at alert level (``threshold``), that count is its workload (a sync
    service the server marks SESSION_ANOMALY every run), not an attack: :func:`habits`
    needs several UTC days of history, which a one-day batch never has. A burst of
    sessions in one sitting is not spread over hours and stays out, and so does a series
    whose runs are not alike (robust spread of ``log1p(value_col)`` above ``max_spread``):
    a routine repeats, an escalation (7 calls, then 900, 2,400, 5,200) does not. With
    ``value_min``,
    the typical one must instead reach that much ``value_col`` (heavy by an absolute
    measure, such as seed 001's 1 MB, where the score of a summary varies with figures it
    barely has).

    Returns
    -------
    polars.DataFrame
        ``keys`` plus ``routine_med`` and ``routine_sd`` (median and scaled MAD of
        ``log1p(value_col)``, the MAD floored at ``min_mad``) and ``routine_n``, for
        routine entities only.
    """
    if frame.height == 0 or min_rows <= 0:
        return frame.select(keys).clear().with_columns(
            pl.lit(None, pl.Float64).alias("routine_med"),
            pl.lit(None, pl.Float64).alias("routine_sd"),
            pl.lit(None, pl.UInt32).alias("routine_n"))
    lv = pl.col(value_col).cast(pl.Float64).log1p()
    return (
        _group_agg_lazy(
            _established_lazy(frame.lazy(), keys, min_rows), keys,
            pl.len().alias("routine_n"),
            ((pl.col(t_col).max() - pl.col(t_col).min()) / 3.6e9).alias("_hours"),
            pl.col(raw_col).median().alias("_typical"),
            lv.median().alias("routine_med"),
            ((lv - lv.median()).abs().median() * 1.4826).alias("routine_sd"),
        )
        .filter((pl.col("routine_n") >= min_rows) & (pl.col("_hours") >= min_hours)
                & (pl.col("routine_sd") <= max_spread)
                & ((pl.col("routine_med") >= math.log1p(value_min))
                   if value_min is not None else (pl.col("_typical") >= threshold)))
        .with_columns(pl.col("routine_sd").clip(lower_bound=min_mad))
        .drop("_hours", "_typical")
        .collect(engine=ENGINE)
    )


def summary_routine_gate(
    frame: pl.DataFrame,
    routines: dict[str, pl.DataFrame],
    value_col: str,
    self_z: float,
) -> pl.DataFrame:
    """Gate the summary-only rows of routine entities (:func:`summary_routines`).

    ``routines`` maps a key column (``caller_id``, ``client_ip``) to its routines; a row
    takes the first key's routine it has (the caller's own before its address's). Routine
    summary rows get ``habitual`` set and ``p_own`` = ``gate(z, self_z)``, where ``z`` is
    ``log1p(value_col)``'s robust z-score against the routine; the other rows keep theirs.
    Adds ``summary_z``, ``summary_typical`` (the routine's median ``value_col``) and
    ``summary_n`` (null outside a routine).
    """
    from toolwatch.detectors.scoring import gate

    parts = [(k, r) for k, r in routines.items() if r.height]
    cols = ("routine_med", "routine_sd", "routine_n")
    if not parts:
        return frame.with_columns(pl.lit(None, pl.Float64).alias("summary_z"),
                                  pl.lit(None, pl.Float64).alias("summary_typical"),
                                  pl.lit(None, pl.Int64).alias("summary_n"))
    df = frame
    for key, r in parts:
        df = df.join(r.rename({c: f"_{c}_{key}" for c in cols}), on=key, how="left",
                     maintain_order="left")
    med, sd, n = (pl.coalesce([pl.col(f"_{c}_{k}") for k, _ in parts]) for c in cols)
    routine = (pl.col("basis") == "summary") & n.is_not_null()
    z = (pl.col(value_col).cast(pl.Float64).log1p() - med) / sd
    return df.with_columns(
        (pl.col("habitual") | routine).alias("habitual"),
        pl.when(routine).then(gate(z, self_z)).otherwise(pl.col("p_own")).alias("p_own"),
        pl.when(routine).then(z).alias("summary_z"),
        pl.when(routine).then(med.exp() - 1.0).alias("summary_typical"),
        pl.when(routine).then(n.cast(pl.Int64)).alias("summary_n"),
    ).drop([f"_{c}_{k}" for k, _ in parts for c in cols])
