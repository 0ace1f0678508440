"""Bulk extraction: far more data than the population — and than the caller itself — pulls.

Volumes (bytes, and rows where servers log them) are compared in log units with robust
z-scores (median / MAD):

* versus the **population** of sessions (or of entity windows), and
* versus the **caller's own** sessions (or the entity's own windows) once that baseline is
  established (enough sessions over enough distinct days). Then the session must be
  unusual for the caller too, which is what keeps a service account that exports large
  volumes every night quiet while a user who suddenly downloads gigabytes is not.

An absolute floor (``min_bytes`` / ``min_rows``) keeps huge ratios on tiny volumes out.
Per caller and client address, sessions not flagged on their own are summed per hopping
window, so extraction spread over many modest sessions still surfaces.
"""

from __future__ import annotations

from typing import Any, Self

import polars as pl

from detectors.base import Detector, FeatureSet, session_frame
from detectors.baseline import Baseline
from detectors.enumeration import _single
from detectors.scoring import all_of, band
from detectors.text import clean, duration, num, size

_VOL = ["total_bytes", "total_rows"]
_EVIDENCE = ["calls", "total_bytes", "max_bytes", "total_rows", "max_rows", "span_s", "basis",
             "top_tool", "z_pop", "z_own", "own_n", "own_days", "own_typical_total_bytes",
             "own_typical_total_rows", "p_pop", "p_own", "gate"]


def _rows_logged(df: pl.DataFrame) -> pl.DataFrame:
    """Rows = 0 means 'not logged' for baselines: such sessions do not shape the rows median."""
    return df.with_columns(pl.when(pl.col("total_rows") > 0).then(pl.col("total_rows")))


def _entity_windows(sessions: pl.DataFrame, config: Any) -> pl.DataFrame:
    """Sessions summed per (entity type, entity, window), assigned by their first call."""
    hop = config.hop_us
    n = config.entity_window_minutes // config.entity_hop_minutes
    parts = []
    for etype in ("caller_id", "client_ip"):
        base = sessions.filter(pl.col(etype).is_not_null()).with_columns(
            pl.lit(etype).alias("entity_type"), pl.col(etype).alias("entity_id")
        )
        for j in range(n):
            parts.append(base.with_columns(((pl.col("first_t") // hop) * hop - j * hop).alias("w")))
    if not parts:
        return pl.DataFrame()
    stacked = pl.concat(parts, how="vertical_relaxed")
    return stacked.group_by(["entity_type", "entity_id", "w"]).agg(
        pl.len().alias("n_sessions"),
        pl.col("calls").sum(),
        pl.col("total_bytes").sum(),
        pl.col("max_bytes").max(),
        pl.col("total_rows").sum(),
        pl.col("max_rows").max(),
        pl.col("first_t").min(),
        pl.col("last_t").max(),
        pl.col("caller_id").unique().alias("_callers"),
        pl.col("client_ip").unique().alias("_ips"),
        pl.col("server").drop_nulls().first(),
        pl.col("top_tool").drop_nulls().mode().sort().first(),
        pl.col("session_id").unique().sort().head(200).alias("session_ids"),
    )


class BulkExtractionDetector(Detector):
    """Flags sessions and entity windows pulling unusual volumes."""

    name = "bulk_rules"
    category = "bulk_extraction"
    config_key = "bulk_extraction"
    summary = "Volume versus population and versus the caller's own baseline."

    def fit(self, history: FeatureSet) -> Self:
        """Learn population and per-caller (and per-entity-window) volume baselines."""
        cfg = self.config
        mk = {"min_rows": cfg.baseline_min_sessions, "min_days": cfg.baseline_min_days,
              "min_mad": cfg.baseline_min_mad}
        self.session_baseline_ = Baseline(_VOL, ["caller_id"], **mk).fit(
            _rows_logged(history.sessions)
        )
        self.entity_baselines_: dict[str, Baseline] = {}
        if self.settings.entity and history.sessions.height:
            win = _entity_windows(history.sessions, cfg)
            for etype in ("caller_id", "client_ip"):
                part = _rows_logged(win.filter(pl.col("entity_type") == etype))
                self.entity_baselines_[etype] = Baseline(
                    _VOL, ["entity_type", "entity_id"], **mk
                ).fit(part)
        self.fitted_ = True
        return self

    def _score_volume(self, df: pl.DataFrame, bl: Baseline) -> pl.DataFrame:
        b = self.settings
        rows_known = pl.col("total_rows") > 0
        z_pop = pl.max_horizontal(
            bl.z_pop("total_bytes"), pl.when(rows_known).then(bl.z_pop("total_rows")).otherwise(0.0)
        )
        df = bl.with_own(df)
        z_own = pl.max_horizontal(
            pl.col("own_z_total_bytes"),
            pl.when(rows_known).then(pl.col("own_z_total_rows")),
        )
        floor = pl.max_horizontal(
            pl.col("total_bytes").fill_null(0) / b.min_bytes,
            pl.col("total_rows").fill_null(0) / b.min_rows,
        )
        return df.with_columns(
            z_pop.alias("z_pop"),
            z_own.alias("z_own"),
            band(z_pop, b.z_lo, b.z_hi).alias("p_pop"),
            pl.when(z_own.is_null()).then(1.0)
            .otherwise(band(z_own, b.self_z_lo, b.self_z_hi)).alias("p_own"),
            pl.when(floor >= 1.0).then(1.0).otherwise(0.5 * floor).alias("gate"),
        ).with_columns(
            (all_of(pl.col("p_pop"), pl.col("p_own"), pl.col("gate")) if bl.is_fitted
             else pl.lit(0.0)).alias("_score")
        )

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """Session rows for every session plus entity-window rows."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        scored = self._score_volume(features.sessions, self.session_baseline_)
        out = session_frame(scored, pl.col("_score"), _EVIDENCE).with_columns(
            pl.lit(None, pl.List(pl.String)).alias("session_ids"),
            pl.lit(1, pl.Int64).alias("n_sessions"),
        )
        if not self.settings.entity or not self.entity_baselines_:
            return out
        flagged = out.filter(pl.col("score") >= self.threshold).select("session_id")
        residual = features.sessions.join(flagged, on="session_id", how="anti")
        win = _entity_windows(residual, self.config)
        if win.height == 0:
            return out
        win = win.filter(pl.col("n_sessions") >= self.config.entity_min_sessions)
        parts = []
        for etype, bl in self.entity_baselines_.items():
            part = win.filter(pl.col("entity_type") == etype)
            if part.height:
                parts.append(self._score_volume(part, bl))
        if not parts:
            return out
        ent = pl.concat(parts, how="vertical_relaxed").with_columns(
            pl.lit("events").alias("basis"),
            ((pl.col("last_t") - pl.col("first_t")) / 1e6).alias("span_s"),
        )
        ent = ent.select(
            "entity_type",
            "entity_id",
            pl.col("w").alias("window_start"),
            pl.col("_score").alias("score"),
            pl.lit(None, pl.String).alias("session_id"),
            pl.when(pl.col("entity_type") == "caller_id").then(pl.col("entity_id"))
            .otherwise(_single("_callers")).alias("caller_id"),
            pl.when(pl.col("entity_type") == "client_ip").then(pl.col("entity_id"))
            .otherwise(_single("_ips")).alias("client_ip"),
            "server",
            "first_t",
            "last_t",
            *_EVIDENCE,
            "session_ids",
            "n_sessions",
        )
        if ent.height == 0:
            return out
        return pl.concat([out, ent.select(out.columns)], how="vertical_relaxed")

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons with volumes, the population's typical figure and the caller's own."""
        entity = row["entity_type"] != "session"
        etype = row["entity_type"]
        bl = self.entity_baselines_.get(etype) if entity else self.session_baseline_
        typical = bl.pop_typical("total_bytes") if bl else None
        where = f" across {row['n_sessions']} sessions" if entity else ""
        rows = row.get("total_rows") or 0
        rows_txt = f", {num(rows)} rows" if rows else ""
        reasons = [
            f"Returned {size(row['total_bytes'])}{rows_txt} in {num(row['calls'])} calls over "
            f"{duration(row.get('span_s'))}{where} (largest single response "
            f"{size(row.get('max_bytes'))})."
        ]
        unit = "entity-window" if entity else "session"
        if typical:
            factor = (row["total_bytes"] or 0) / max(typical, 1.0)
            reasons.append(
                f"That is {num(factor)}× the typical {unit} volume ({size(typical)}), robust "
                f"z-score {num(row.get('z_pop'))}."
            )
        who = "caller" if etype in ("session", "caller_id") else "address"
        if row.get("z_own") is not None:
            reasons.append(
                f"It is also unusual for this {who}: its own typical {unit} returns "
                f"{size(row.get('own_typical_total_bytes'))} over {row.get('own_n')} "
                f"{unit}s on {row.get('own_days')} days (z-score {num(row.get('z_own'))})."
            )
        else:
            reasons.append(
                f"The {who} has no established baseline yet ({row.get('own_n') or 0} "
                f"{unit}s on {row.get('own_days') or 0} days), so only the population is used."
            )
        evidence = clean(
            {
                "calls": row.get("calls"),
                "total_bytes": row.get("total_bytes"),
                "max_bytes_per_call": row.get("max_bytes"),
                "total_rows": rows or None,
                "max_rows_per_call": row.get("max_rows") or None,
                "duration_s": row.get("span_s"),
                "population_typical_bytes": typical,
                "z_population": row.get("z_pop"),
                "z_own_baseline": row.get("z_own"),
                "own_typical_bytes": row.get("own_typical_total_bytes"),
                "own_baseline_observations": row.get("own_n"),
                "own_baseline_days": row.get("own_days"),
                "basis": row.get("basis"),
                "top_tool": row.get("top_tool"),
                "pattern_scores": clean(
                    {"p_pop": row.get("p_pop"), "p_own": row.get("p_own"), "gate": row.get("gate")}
                ),
            }
        )
        return reasons, evidence
