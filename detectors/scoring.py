"""Small score-shaping helpers shared by the rule detectors (polars expressions).

Scores live in ``[0, 1]``. :func:`band` maps a raw figure to a score that is exactly 0.5
at ``lo`` (where the signal starts to count; the default alert threshold) and reaches 1.0
at ``hi`` (unmistakable), so config keys read naturally as "alert from here" and
"critical from here". Signals are combined with :func:`all_of` (every condition must
hold: the weakest decides) and :func:`any_of` (the strongest pattern decides).
"""

from __future__ import annotations

import polars as pl

IntoExpr = pl.Expr | float | int


def _expr(x: IntoExpr) -> pl.Expr:
    return x if isinstance(x, pl.Expr) else pl.lit(x)


_NAN = float("nan")


def zero_nan(x: pl.Expr) -> pl.Expr:
    """``x.fill_nan(0.0)`` for a Float64 expression, with ``x`` evaluated once.

    polars expands ``fill_nan`` into ``when(x.is_not_nan() | x.is_null()).then(x)
    .otherwise(0.0)``: three copies of ``x``, so score expressions that nest it (a band
    of an all_of of bands …) grow exponentially, and planning them took milliseconds
    per query even on a few rows. ``replace`` matches every NaN bit pattern (polars
    compares floats with NaN equal to NaN) and keeps every other value, -0.0 and nulls
    included, so the result is the same.
    """
    return x.replace(_NAN, 0.0)


def band(x: IntoExpr, lo: float, hi: float) -> pl.Expr:
    """Score of figure ``x``: ``0.5 * x / lo`` below ``lo``, then linear from 0.5 to 1 at ``hi``.

    Parameters
    ----------
    x
        The figure (expression or number); null counts as 0.
    lo
        Figure at which the score is 0.5 (the default alert threshold).
    hi
        Figure at which the score saturates at 1.0 (must exceed ``lo``).

    Returns
    -------
    polars.Expr
        Float64 score in ``[0, 1]``, monotone non-decreasing in ``x``.
    """
    xv = zero_nan(_expr(x).cast(pl.Float64).fill_null(0.0))
    lo = float(lo)
    hi = max(float(hi), lo + 1e-9)
    below = (xv / lo).clip(0.0, 1.0) if lo > 0 else pl.lit(1.0)
    above = ((xv - lo) / (hi - lo)).clip(0.0, 1.0)
    return 0.5 * below + 0.5 * above


def gate(x: IntoExpr, lo: float) -> pl.Expr:
    """A condition as a score: 1.0 once ``x`` reaches ``lo``, else ``0.5 * x / lo``.

    Used for requirements that should pass or block (an absolute floor, "unusual for this
    caller") rather than grade: the pattern's own score then decides the severity.
    """
    xv = zero_nan(_expr(x).cast(pl.Float64).fill_null(0.0))
    if lo <= 0:
        return pl.lit(1.0)
    return pl.when(xv >= lo).then(1.0).otherwise((0.5 * xv / lo).clip(0.0, 0.5))


def all_of(*scores: pl.Expr) -> pl.Expr:
    """Conjunction of signals: the weakest one decides."""
    return pl.min_horizontal(*scores)


def any_of(*scores: pl.Expr) -> pl.Expr:
    """Alternative patterns: the strongest one decides."""
    return pl.max_horizontal(*scores)


def ratio(num: IntoExpr, den: IntoExpr) -> pl.Expr:
    """``num / den`` with 0 when the denominator is 0 or null."""
    n = _expr(num).cast(pl.Float64)
    d = _expr(den).cast(pl.Float64)
    return pl.when(d > 0).then(n / d).otherwise(0.0).fill_null(0.0)
