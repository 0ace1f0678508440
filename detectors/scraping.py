"""Scraping loop: an agent looping — repetition no person or thinking agent produces.

Patterns (the strongest decides):

* **stuck loop** — many calls, most of them exact repeats (same tool and arguments);
* **mechanical loop** — many calls, machine-regular gaps (low coefficient of variation:
  people and LLM agents think between calls, CV ≈ 1) and one dominant tool;
* **sustained rate** — a high call rate kept up over many calls of one dominant tool,
  mostly not touching new resources (a fast walk over new ids is enumeration's).

Sessions known only from a summary carry no tools or arguments: there, calls that touched
no new resource (``1 - unique resources / calls``) stand in for exact repeats.

Walking resource ids belongs to enumeration and paging through a listing to bulk
extraction, so the cadence and rate patterns do not count calls explained by an id run or
a pagination sweep.

Then, when the caller *habitually* scores at alert level (its typical session over several
days does), the session must also be far beyond its own median (calls, repeated calls):
a CI probe or a polling job that loops the same way every day is its normal.
Benign retries (a few identical calls) and long, diverse power-user sessions stay low.
"""

from __future__ import annotations

from typing import Any, Self

import polars as pl

from detectors.base import Detector, FeatureSet, session_frame
from detectors.baseline import Baseline, habits, habitual_gate
from detectors.scoring import all_of, any_of, band, ratio
from detectors.text import clean, duration, num, pct

_EVIDENCE = ["calls", "span_s", "calls_per_min", "gap_cv", "top_tool", "top_tool_share",
             "page_tool", "max_pages", "dup_ratio", "distinct_tools", "basis", "z_own", "own_n",
             "own_days", "own_typical_calls", "habitual", "p_mech", "p_stuck", "p_rate",
             "p_own"]


def _dup() -> pl.Expr:
    """Share of repeated calls; for sessions known only from a summary, the share of calls
    that touched no new resource stands in (when the summary reports resources)."""
    return pl.when((pl.col("basis") == "summary") & (pl.col("distinct_resources") > 0)).then(
        1.0 - ratio(pl.col("distinct_resources"), pl.col("calls"))
    ).otherwise(pl.col("dup_ratio"))


def _with_dup_calls(sessions: pl.DataFrame) -> pl.DataFrame:
    return sessions.with_columns((_dup() * pl.col("calls")).alias("dup_calls"))


class ScrapingLoopDetector(Detector):
    """Flags sessions crawling mechanically."""

    name = "scraping_rules"
    category = "scraping_loop"
    config_key = "scraping_loop"
    summary = "Pagination sweeps, machine-regular loops, exact repeats, sustained rate."

    def fit(self, history: FeatureSet) -> Self:
        """Learn each caller's typical calls per session and whether it loops habitually."""
        cfg = self.config
        self.caller_baseline_ = Baseline(
            ["calls", "dup_calls"], ["caller_id"], min_rows=cfg.baseline_min_sessions,
            min_days=cfg.baseline_min_days, min_mad=cfg.baseline_min_mad,
        ).fit(_with_dup_calls(history.sessions))
        self.habit_ = habits(
            self._raw(history.sessions), "_raw", ["caller_id"],
            min_rows=cfg.baseline_min_sessions, min_days=cfg.baseline_min_days,
        )
        self.fitted_ = True
        return self

    def _raw(self, sessions: pl.DataFrame) -> pl.DataFrame:
        """Pattern scores and their maximum ``_raw`` (before the caller's own baseline)."""
        s = self.settings
        calls = band(pl.col("calls"), s.calls_lo, s.calls_hi)
        cv = pl.col("gap_cv")
        regular = pl.when(cv.is_null()).then(0.0).otherwise(
            band(s.gap_cv_max / cv.clip(lower_bound=0.01), 1.0, 3.0)
        )
        share_hi = min(1.0, s.top_tool_share_lo + 0.25)
        # An id walk (most calls one sequential/dense run) is enumeration's business, and a
        # pagination sweep (most calls new pages of a listing) bulk extraction's.
        walk = ratio(pl.max_horizontal("seq_run", "dense_ids"), pl.col("calls"))
        sweep = ratio(pl.col("max_pages"), pl.col("calls"))
        other = band(1.0 - pl.max_horizontal(walk, sweep), 0.5, 0.8)
        # Speed alone is no loop: a fast session touching a new resource with nearly every
        # call is walking or harvesting (enumeration, bulk extraction), not looping.
        new = ratio(pl.col("distinct_resources"), pl.col("calls"))
        repeating = band(1.0 - pl.max_horizontal(new, sweep), 0.5, 0.8)
        one_tool = band(pl.col("top_tool_share"), s.top_tool_share_lo, share_hi)
        pats = {
            "p_mech": all_of(calls, regular, other, one_tool),
            "p_stuck": all_of(calls, band(_dup(), s.dup_ratio_lo, 0.95)),
            "p_rate": pl.when(pl.col("calls") >= s.rate_min_calls)
            .then(all_of(band(pl.col("calls_per_min"), s.rate_lo, s.rate_hi), repeating,
                         one_tool))
            .otherwise(0.0),
        }
        # Lazy: shared sub-expressions of the patterns are evaluated once.
        return sessions.lazy().with_columns(**pats).with_columns(
            any_of(*[pl.col(k) for k in pats]).alias("_raw")
        ).collect()

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        df = self.caller_baseline_.with_own(_with_dup_calls(features.sessions))
        df = df.with_columns(
            pl.max_horizontal(pl.col("own_z_calls"), pl.col("own_z_dup_calls")).alias("z_own")
        )
        df = habitual_gate(self._raw(df), self.habit_, ["caller_id"], self.threshold,
                           pl.col("z_own"), self.settings.self_z)
        score = all_of(pl.col("_raw"), pl.col("p_own"))
        return session_frame(df, score, _EVIDENCE).with_columns(
            pl.lit(None, pl.List(pl.String)).alias("session_ids"),
            pl.lit(1, pl.Int64).alias("n_sessions"),
        )

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons naming the crawl's cadence, pages, repeats and the caller's own normal."""
        reasons = [
            f"{num(row['calls'])} calls in {duration(row.get('span_s'))} "
            f"({num(row.get('calls_per_min'))} per minute), {pct(row.get('top_tool_share'))} "
            f"of them to {row.get('top_tool') or 'one tool'}."
        ]
        if row.get("gap_cv") is not None:
            reasons.append(
                f"Gaps between calls vary by {pct(row['gap_cv'])} of their mean (coefficient "
                f"of variation {num(row['gap_cv'])}; people and reasoning agents are ≈ 100%)."
            )
        if (row.get("dup_ratio") or 0) >= 0.2:
            reasons.append(
                f"{pct(row['dup_ratio'])} of calls repeat an earlier call with identical "
                "arguments."
            )
        if row.get("habitual"):
            reasons.append(
                "This caller repeats itself habitually, but not on this scale: it typically "
                f"makes {num(row.get('own_typical_calls'))} calls per session "
                f"({row.get('own_n')} sessions on {row.get('own_days')} days)."
            )
        evidence = clean(
            {
                "calls": row.get("calls"),
                "duration_s": row.get("span_s"),
                "calls_per_min": row.get("calls_per_min"),
                "gap_cv": row.get("gap_cv"),
                "top_tool": row.get("top_tool"),
                "top_tool_share": row.get("top_tool_share"),
                "page_tool": row.get("page_tool"),
                "distinct_pages": row.get("max_pages"),
                "duplicate_call_ratio": row.get("dup_ratio"),
                "distinct_tools": row.get("distinct_tools"),
                "z_own_baseline": row.get("z_own"),
                "own_typical_calls": row.get("own_typical_calls"),
                "own_baseline_sessions": row.get("own_n"),
                "own_baseline_days": row.get("own_days"),
                "basis": row.get("basis"),
                "pattern_scores": clean({k: row.get(k) for k in
                                         ("p_mech", "p_stuck", "p_rate", "p_own")}),
            }
        )
        return reasons, evidence
