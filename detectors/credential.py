"""Credential stuffing: many failed authentications with many different secrets.

Secrets never reach the store: ingestion replaces them with a keyed hash, so equal keys
hash equal and the detector can count *distinct* failing credentials without seeing one.

* **Session** — distinct failing credential hashes (without hashes: auth failures) *and*
  the share of the session's calls that failed authentication. A user who mistypes a key
  twice (2 failures, then success) and a client retrying one bad key (1 credential) stay
  far below the bar.
* **Entity** (caller id, client address; per hopping window) — over sessions not flagged
  on their own (a session reported only as an attempt still counts): distinct failing
  credentials (sessions without hashes count one each), and for an address the distinct
  caller ids that failed, gated by the share of failing sessions that *never*
  authenticated. Stuffing spread over many sessions with ≤ 2
  failures each is invisible per session but obvious here, while an office NAT where a
  few people mistype (and then succeed) is not. Summary-only sessions contribute their
  ``auth_failures``.
"""

from __future__ import annotations

from typing import Any

import polars as pl
from toolwatch.detectors.base import Detector, FeatureSet, empty_scores, session_frame
from toolwatch.detectors.entities import IDENTITY_AGGS, KEYS, finish, sessions_of
from toolwatch.detectors.features import explode_entities, group_agg
from toolwatch.detectors.scoring import all_of, any_of, band, ratio
from toolwatch.detectors.text import clean, duration, pct

_EVIDENCE = ["calls", "auth_failures", "failed_creds", "auth_fail_ratio", "ok_calls", "span_s",
             "basis", "top_tool"]


class CredentialStuffingDetector(Detector):
    """Flags sessions and entities cycling through credentials."""

    name = "credential_rules"
    category = "credential_stuffing"
    config_key = "credential_stuffing"
    summary = "Distinct failing credentials per session, and per caller/address across sessions."

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """Session rows for every session plus entity-window rows with failures."""
        c = self.settings
        units = (
            pl.when(pl.col("failed_creds") > 0)
            .then(band(pl.col("failed_creds"), c.creds_lo, c.creds_hi))
            .otherwise(band(pl.col("auth_failures"), c.failures_lo, c.failures_hi))
        )
        main = all_of(units, band(pl.col("auth_fail_ratio"), c.fail_ratio_lo, c.fail_ratio_hi))
        score = main
        # Seed 001's own signal (authFailures > 2): three or more different credentials
        # failed and nothing in the session ever succeeded (a lockout cut it short, or the
        # stuffer gave up). Below creds_lo it is reported low, as an attempt.
        tried = ((pl.col("failed_creds") >= c.attempt_creds)
                 & (pl.col("ok_calls").fill_null(0) == 0)).fill_null(False) & (
            c.attempt_creds > 0)
        # A session known only from its summary line carries no credential hashes: seed
        # 001's line itself (authFailures > 2) is the signal, when the session reached no
        # resource at all (uniqueResourcesAccessed 0: it never got in). A client whose key
        # failed once and then worked reached its resources.
        summary_tried = ((pl.col("basis") == "summary")
                         & (pl.col("auth_failures") >= c.attempt_creds)
                         & (pl.col("distinct_resources").fill_null(0) == 0)).fill_null(False) & (
            c.attempt_creds > 0)
        tried = tried | summary_tried
        score = pl.max_horizontal(score, pl.when(tried).then(c.attempt_score).otherwise(0.0))
        # The constant columns ride in session_frame's query (no second query to add them).
        out = session_frame(features.sessions, score, [
            *_EVIDENCE,
            pl.lit(None, pl.List(pl.String)).alias("session_ids"),
            pl.lit(1, pl.Int64).alias("n_sessions"),
            pl.lit(None, pl.Int64).alias("fail_sessions"),
            pl.lit(None, pl.Int64).alias("fail_only_sessions"),
            pl.lit(None, pl.Int64).alias("fail_callers"),
            pl.lit(None, pl.Int64).alias("max_session_failures"),
            pl.lit(None, pl.Float64).alias("p_creds"),
            pl.lit(None, pl.Float64).alias("p_callers"),
        ])
        # Sessions stuffing on their own are not evidence of a campaign spread over many;
        # attempts (a lockout after three tries) are exactly what such a campaign is made of.
        flagged = features.sessions.lazy().filter(main >= self.threshold).select(
            "session_id").collect(engine="in-memory")
        ent = self._entities(features, flagged)
        if ent.height == 0:
            return out
        return pl.concat([out, ent.select(out.columns)], how="vertical_relaxed")

    def _entities(self, features: FeatureSet, flagged: pl.DataFrame) -> pl.DataFrame:
        cfg = self.config
        c = self.settings
        s = features.sessions.lazy()
        # One in-memory query (the eager steps were ~9, a fixed cost on small batches);
        # the joins keep the left order, as the eager calls did.
        flagged_sh = s.select("session_id", "sh").join(
            flagged.lazy(), on="session_id", how="semi", maintain_order="left").select("sh")
        cols = ["t", "sh", "ceh", "ieh", "crh", "tlh", "weight"]
        fe = (
            features.events.lazy().filter(pl.col("authf"))
            .with_columns(pl.lit(1, pl.Int64).alias("weight"))
            .select(cols)
        )
        summ = s.filter((pl.col("basis") == "summary") & (pl.col("auth_failures") > 0)).select(
            pl.col("last_t").alias("t"),
            "sh",
            "ceh",
            "ieh",
            pl.lit(None, pl.UInt64).alias("crh"),
            pl.lit(None, pl.UInt64).alias("tlh"),
            pl.col("auth_failures").cast(pl.Int64).alias("weight"),
        )
        succeeded = s.select("sh", pl.col("auth_recovered").alias("succ"))
        rows = (
            pl.concat([fe, summ], how="vertical_relaxed")
            .join(flagged_sh, on="sh", how="anti", maintain_order="left")
            .join(succeeded, on="sh", how="left", maintain_order="left")
            .with_columns(pl.col("succ").fill_null(False))
            .collect(engine="in-memory")
        )
        if rows.height == 0:
            return empty_scores()
        ee = explode_entities(rows, cfg)
        ee = ee.with_columns(pl.col("weight").sum().over([*KEYS, "sh"]).alias("_per_session"))
        no_hash_fail_only = pl.col("sh").filter(pl.col("crh").is_null() & ~pl.col("succ"))
        agg = group_agg(
            ee, KEYS,
            pl.col("weight").sum().alias("auth_failures"),
            pl.col("crh").drop_nulls().n_unique().alias("_creds"),
            no_hash_fail_only.n_unique().alias("_nohash_sessions"),
            pl.col("sh").n_unique().alias("fail_sessions"),
            pl.col("sh").filter(~pl.col("succ")).n_unique().alias("fail_only_sessions"),
            pl.col("ceh").drop_nulls().n_unique().alias("fail_callers"),
            pl.col("_per_session").max().alias("max_session_failures"),
            pl.col("t").min().alias("first_t"),
            pl.col("t").max().alias("last_t"),
            *IDENTITY_AGGS,
        ).filter(pl.col("fail_sessions") >= cfg.entity_min_sessions)
        if agg.height == 0:
            return empty_scores()
        fail_only = band(
            ratio(pl.col("fail_only_sessions"), pl.col("fail_sessions")), c.fail_only_lo,
            c.fail_only_hi,
        )
        units = pl.col("_creds") + pl.col("_nohash_sessions")
        agg = agg.with_columns(
            all_of(band(units, c.entity_creds_lo, c.entity_creds_hi), fail_only).alias("p_creds"),
            pl.when(pl.col("et") == 1)
            .then(all_of(band(pl.col("fail_callers"), c.entity_callers_lo, c.entity_callers_hi),
                         fail_only))
            .otherwise(0.0)
            .alias("p_callers"),
            units.alias("failed_creds"),
        ).with_columns(any_of(pl.col("p_creds"), pl.col("p_callers")).alias("score"))
        hot = agg.filter(pl.col("score") >= self.threshold)
        agg = agg.join(sessions_of(ee, hot, features), on=KEYS, how="left")
        agg = finish(agg, features)
        return agg.select(
            "entity_type",
            "entity_id",
            pl.col("w").alias("window_start"),
            "score",
            pl.lit(None, pl.String).alias("session_id"),
            "caller_id",
            "client_ip",
            "server",
            "first_t",
            "last_t",
            pl.col("auth_failures").alias("calls"),
            "auth_failures",
            "failed_creds",
            pl.lit(None, pl.Float64).alias("auth_fail_ratio"),
            pl.lit(None, pl.Int64).alias("ok_calls"),
            ((pl.col("last_t") - pl.col("first_t")) / 1e6).alias("span_s"),
            pl.lit("events").alias("basis"),
            "top_tool",
            "session_ids",
            pl.col("fail_sessions").alias("n_sessions"),
            "fail_sessions",
            "fail_only_sessions",
            "fail_callers",
            "max_session_failures",
            "p_creds",
            "p_callers",
        )

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons with the failure counts, distinct credentials and success share."""
        dur = duration(row.get("span_s"))
        reasons: list[str] = []
        if row["entity_type"] == "session":
            creds = row.get("failed_creds") or 0
            if creds:
                reasons.append(
                    f"{creds} distinct credentials failed authentication in {dur} "
                    f"({row['auth_failures']} failures, {pct(row.get('auth_fail_ratio'))} of "
                    f"{row['calls']} calls)."
                )
            else:
                reasons.append(
                    f"{row['auth_failures']} authentication failures in {dur} "
                    f"({pct(row.get('auth_fail_ratio'))} of {row['calls']} calls); the logs "
                    "carry no credential hash to count distinct keys."
                )
            if row.get("basis") == "summary":
                reasons.append("Known only from the session summary.")
            if (row.get("ok_calls") or 0) > 0 and creds:
                reasons.append(
                    f"{row['ok_calls']} calls succeeded afterwards: a tried credential may work."
                )
        else:
            what = "client address" if row["entity_type"] == "client_ip" else "caller"
            reasons.append(
                f"{row['auth_failures']} authentication failures with {row['failed_creds']} "
                f"distinct credentials across {row['fail_sessions']} sessions from {what} "
                f"{row['entity_id']} in {dur}, at most {row['max_session_failures']} per "
                "session (no single session stands out)."
            )
            reasons.append(
                f"{row['fail_only_sessions']} of those {row['fail_sessions']} sessions "
                f"({pct(ratio_py(row['fail_only_sessions'], row['fail_sessions']))}) never "
                "got past the failing authentication (people who mistype retry and succeed)."
            )
            if row["entity_type"] == "client_ip" and (row.get("fail_callers") or 0) > 1:
                reasons.append(f"{row['fail_callers']} different caller ids failed from it.")
        evidence = clean(
            {
                "calls": row.get("calls") if row["entity_type"] == "session" else None,
                "auth_failures": row.get("auth_failures"),
                "distinct_failed_credentials": row.get("failed_creds"),
                "auth_failure_ratio": row.get("auth_fail_ratio"),
                "ok_calls": row.get("ok_calls"),
                "failing_sessions": row.get("fail_sessions"),
                "never_succeeded_sessions": row.get("fail_only_sessions"),
                "failing_callers": row.get("fail_callers"),
                "max_failures_per_session": row.get("max_session_failures"),
                "duration_s": row.get("span_s"),
                "basis": row.get("basis"),
                "top_tool": row.get("top_tool"),
                "pattern_scores": clean(
                    {"p_creds": row.get("p_creds"), "p_callers": row.get("p_callers")}
                )
                or None,
            }
        )
        return reasons, evidence


def ratio_py(a: float | None, b: float | None) -> float:
    """``a / b`` or 0."""
    return (a or 0) / b if b else 0.0
