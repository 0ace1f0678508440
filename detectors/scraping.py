"""Scraping loop: a session walking a listing or search by page number or cursor.

Many calls, progressing (new pages, new cursors), often machine-regular — whatever the
volume (volume is bulk extraction's business; a session that does both gets both alerts).
Repetition *without* progress (the same call again and again) is a tool loop
(``detectors/sequence.py``), not scraping.

Patterns (the strongest decides):

* **sweep** — ``pages_lo`` distinct pages / offsets / cursors of one tool in one session;
* **mechanical crawl** — many calls, machine-regular gaps (low coefficient of variation:
  people and LLM agents think between calls, CV ≈ 1), one dominant tool, progressing
  (mostly not exact repeats);
* **sustained rate** — a high call rate kept up over many calls of one dominant tool,
  progressing;
* **query sweep** — ``pages_lo`` distinct (query, page) argument sets of one paging tool
  at machine pace (queries ``a`` … ``z``, a few pages each).

Walking resource ids belongs to enumeration, so the cadence and rate patterns do not count
calls explained by an id run.

**Following a growing file is not walking a listing** (``tail_short_share_lo``): a log
tailer reads one file at growing byte offsets, asking for a fixed ``length`` and getting
back only the few kB written since its last read. Its offsets are new "pages", but each
read comes back *short* of the length asked (the reader is at the end of the data); a
scraper reading a file or export by byte ranges gets full chunks until the last one.
When most successful paged calls of a session are such short byte-range reads, its pages
are not progress through a listing and count for none of the patterns.

Then, when the caller *habitually* scores at alert level (its typical session over several
days does), the session must also be far beyond its own median (calls, pages):
a sync job that pages through the same listing every night is its normal.
Benign retries, polling and long, diverse power-user sessions stay low.
"""

from __future__ import annotations

from typing import Any, Self

import polars as pl
from toolwatch.detectors.base import Detector, FeatureSet, empty_scores, session_frame
from toolwatch.detectors.baseline import (
    Baseline,
    established_rows,
    habits,
    habitual_gate,
    summary_routine_gate,
    summary_routines,
)
from toolwatch.detectors.bulk import established_count
from toolwatch.detectors.entities import IDENTITY_AGGS, KEYS, finish, sessions_of
from toolwatch.detectors.features import _arg_pattern, explode_entities, group_agg
from toolwatch.detectors.scoring import all_of, any_of, band, gate, ratio
from toolwatch.detectors.text import clean, duration, num, pct

_EVIDENCE = ["calls", "span_s", "calls_per_min", "gap_cv", "top_tool", "top_tool_share",
             "page_tool", "max_pages", "dup_ratio", "distinct_tools", "basis", "z_own", "own_n",
             "own_days", "own_typical_calls", "habitual", "p_mech", "p_sweep", "p_rate",
             "p_rate_summary", "p_calls_summary", "p_own", "distinct_resources",
             "p_query_sweep", "listing_pages"]


def _dup() -> pl.Expr:
    """Share of repeated calls; for sessions known only from a summary, the share of calls
    that touched no new resource stands in."""
    return pl.when(pl.col("basis") == "summary").then(
        1.0 - ratio(pl.col("distinct_resources"), pl.col("calls"))
    ).otherwise(pl.col("dup_ratio"))


def _established(sessions: pl.DataFrame, min_rows: int) -> pl.DataFrame:
    """Sessions of callers with at least ``min_rows`` sessions (:func:`established_rows`),
    counted on the caller column alone first: usually there are none to copy."""
    if established_count(sessions, ["caller_id"], min_rows) == 0:
        return sessions.clear()
    return established_rows(sessions, ["caller_id"], min_rows)


class ScrapingLoopDetector(Detector):
    """Flags sessions crawling mechanically."""

    name = "scraping_rules"
    category = "scraping_loop"
    config_key = "scraping_loop"
    summary = "Walking a listing by page or cursor: sweeps, machine-regular crawls, rate."

    def fit(self, history: FeatureSet) -> Self:
        """Learn each caller's typical calls per session and whether it loops habitually."""
        cfg = self.config
        # A narrow frame: the baseline's filters would otherwise copy every feature column.
        self.caller_baseline_ = Baseline(
            ["calls", "max_pages"], ["caller_id"], min_rows=cfg.baseline_min_sessions,
            min_days=cfg.baseline_min_days, min_mad=cfg.baseline_min_mad,
        ).fit(history.sessions.select("caller_id", "first_t", "calls", "max_pages"))
        # habits() keeps only callers with baseline_min_sessions sessions (established_rows)
        # and a raw score depends on its own row: score just those sessions, or none (a live
        # pass's short history rarely holds one). Same habits, far less work.
        known = _established(history.sessions, cfg.baseline_min_sessions)
        raw = self._raw(self._with_tail(history, known)) if known.height else None
        self.habit_ = habits(
            raw, "_raw", ["caller_id"],
            min_rows=cfg.baseline_min_sessions,
            min_days=max(cfg.baseline_min_days, cfg.habit_min_days),
        ) if raw is not None else pl.DataFrame(
            schema={"caller_id": history.sessions.schema["caller_id"], "habit_score": pl.Float64})
        # Summary routines per caller, and per client address: a sync host running one job
        # under several service accounts (one per tenant) is the workload's source, and
        # each account alone may write only a few summaries a day. The address's
        # sessions need no baseline_min_sessions per caller, so they come from all
        # summary sessions, not from ``known``.
        summ = history.sessions.filter(pl.col("basis") == "summary")
        summ_raw = self._raw(self._with_tail(history, summ)) if summ.height else summ
        self.routine_ = {
            key: summary_routines(
                summ_raw, "_raw", "calls", [key],
                min_rows=cfg.summary_routine_sessions, min_hours=cfg.summary_routine_hours,
                min_mad=cfg.baseline_min_mad, threshold=self.threshold,
                max_spread=cfg.summary_routine_spread,
            ) if summ.height else pl.DataFrame()
            for key in ("caller_id", "client_ip")
        }
        self.fitted_ = True
        return self

    def _routine_gate(self, df: pl.DataFrame) -> pl.DataFrame:
        """Summary-only sessions of a caller (or client address) whose summaries are its
        routine (:func:`summary_routines`) alert only far beyond its own median calls: the
        few counts of a summary line cannot tell a sync service's run from a crawl, but
        the caller's own runs all day long can."""
        df = summary_routine_gate(df, self.routine_, "calls", self.settings.self_z)
        routine = pl.col("summary_n").is_not_null()
        return df.with_columns(
            pl.when(routine).then(pl.col("summary_z")).otherwise(pl.col("z_own"))
            .alias("z_own"),
            pl.when(routine).then(pl.col("summary_n")).otherwise(pl.col("own_n"))
            .alias("own_n"),
            pl.when(routine).then(pl.col("summary_typical"))
            .otherwise(pl.col("own_typical_calls")).alias("own_typical_calls"),
        ).drop("summary_z", "summary_typical", "summary_n")

    def _raw(self, sessions: pl.DataFrame) -> pl.DataFrame:
        """Pattern scores and their maximum ``_raw`` (before the caller's own baseline)."""
        s = self.settings
        share_hi = min(1.0, s.top_tool_share_lo + 0.25)
        cv = pl.col("gap_cv")
        # In stages: each graded figure (and the grades used by two patterns) becomes a
        # column first, and the patterns combine columns. Nested into one expression,
        # band()'s NaN guard repeated its input and every shared grade was copied per use:
        # on small batches planning and running those copies cost more than the rows.
        # Same element-wise operations, same values.
        grades = {
            "_calls": band(pl.col("calls"), s.calls_lo, s.calls_hi),
            "_regular": pl.when(cv.is_null()).then(0.0).otherwise(
                band(pl.col("_cv_ratio"), 1.0, 3.0)
            ),
            # Progress means new pages / cursors of a listing: new resource ids are an id
            # walk (enumeration's business) and exact repeats a tool loop's.
            "_progressing": band(pl.col("_sweep"), 0.3, 0.6),
            "_one_tool": band(pl.col("top_tool_share"), s.top_tool_share_lo, share_hi),
        }
        progressing, one_tool = pl.col("_progressing"), pl.col("_one_tool")
        pats = {
            "p_sweep": band(pl.col("_pages"), s.pages_lo, s.pages_hi),
            "p_mech": all_of(pl.col("_calls"), pl.col("_regular"), one_tool, progressing),
            # A sweep of a listing through its queries (a … z, a few pages each) rather than
            # its page numbers: distinct (query, page) sets of one tool, at machine pace
            # (rate_lo) and on one dominant tool. A person runs many different searches
            # too, but between other work and at reading pace.
            "p_query_sweep": all_of(
                band(pl.col("_listing"), s.pages_lo, s.pages_hi),
                gate(pl.col("calls_per_min"), s.rate_lo), one_tool),
            "p_rate": pl.when(pl.col("calls") >= s.rate_min_calls)
            .then(all_of(band(pl.col("calls_per_min"), s.rate_lo, s.rate_hi), progressing,
                         one_tool))
            .otherwise(0.0),
            # Known only from its summary line: no pages or tools to see progress in, but a
            # sustained rate over few resources returning content is the seed's "callCount >
            # 50" crawl signal. An id walk touches many resources (enumeration's business);
            # a service polling a status gets a few hundred bytes a call.
            "p_rate_summary": pl.when(
                (pl.col("basis") == "summary") & (pl.col("calls") >= s.rate_min_calls))
            .then(all_of(band(pl.col("calls_per_min"), s.rate_lo, s.rate_hi),
                         gate(_dup(), s.summary_repeat_lo),
                         gate(ratio(pl.col("total_bytes"), pl.col("calls")),
                              s.summary_min_bytes_per_call)))
            .otherwise(0.0),
            # Seed 001's own rule for a summary line: more than 50 calls in one session is
            # its scraping-loop signal, whatever the rate. Counted from summary_calls_lo
            # (51) calls mostly over resources already touched, returning content, as above.
            "p_calls_summary": pl.when(pl.col("basis") == "summary").then(
                all_of(band(pl.col("calls"), s.summary_calls_lo, s.calls_hi),
                       gate(_dup(), s.summary_repeat_lo),
                       gate(ratio(pl.col("total_bytes"), pl.col("calls")),
                            s.summary_min_bytes_per_call))
            ).otherwise(0.0),
        }
        cols = sessions.columns
        # A session following a growing file (see the module docs) makes no progress
        # through a listing: its offsets are not pages.
        tail = (pl.col("tail_share").fill_null(0.0) >= s.tail_short_share_lo) \
            if s.tail_short_share_lo and "tail_share" in cols else pl.lit(False)
        return sessions.lazy().with_columns(
            (s.gap_cv_max / cv.clip(lower_bound=0.01)).alias("_cv_ratio"),
            pl.when(tail).then(0).otherwise(pl.col("max_pages")).alias("_pages"),
            pl.when(tail).then(0).otherwise(
                pl.col("listing_pages").fill_null(0) if "listing_pages" in cols else pl.lit(0)
            ).alias("_listing"),
        ).with_columns(
            ratio(pl.col("_pages"), pl.col("calls")).alias("_sweep"),
        ).with_columns(**grades).with_columns(**pats).with_columns(
            any_of(*[pl.col(k) for k in pats]).alias("_raw")
        ).select(*cols, *pats, "_raw").collect(engine="in-memory")

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        df = self.caller_baseline_.with_own(features.sessions)
        df = df.with_columns(
            pl.max_horizontal(pl.col("own_z_calls"), pl.col("own_z_max_pages")).alias("z_own")
        )
        df = self._with_tail(features, df)
        df = habitual_gate(self._raw(df), self.habit_, ["caller_id"], self.threshold,
                           pl.col("z_own"), self.settings.self_z)
        df = self._routine_gate(df)
        score = all_of(pl.col("_raw"), pl.col("p_own"))
        out = session_frame(df, score, [
            *_EVIDENCE,
            pl.lit(None, pl.List(pl.String)).alias("session_ids"),
            pl.lit(1, pl.Int64).alias("n_sessions"),
        ])
        if not self.settings.entity:
            return out
        flagged = out.filter(pl.col("score") >= self.threshold).select("session_id")
        # Sessions following a growing file resume at a later offset each time (where the
        # file ended), but they follow the file, not a listing: not part of a walk.
        lo = self.settings.tail_short_share_lo
        tails = df.filter(pl.col("tail_share").fill_null(0.0) >= lo).select("session_id") \
            if lo else df.clear().select("session_id")
        ent = self._entities(features, pl.concat([flagged, tails]))
        if ent.height == 0:
            return out
        return pl.concat([out, ent.select(out.columns)], how="vertical_relaxed")

    def _with_tail(self, features: FeatureSet, sessions: pl.DataFrame) -> pl.DataFrame:
        """Paging figures the session features do not hold, from the paged calls only:

        * ``tail_share`` — share of the successful paged calls that are short byte-range
          reads (fewer bytes returned than the ``byte_length_keys`` argument asked for);
        * ``listing_pages`` — most distinct argument sets among the paged calls of one
          tool: each (query, page) is a page of a listing, so a sweep of queries ``a`` …
          ``z``, one to three pages each, fetches 52 listing pages though its page numbers
          never pass 3.

        Both null for sessions without paged calls."""
        s = self.settings
        ev = features.events
        if ev.height == 0 or "page" not in ev.columns:
            return sessions.with_columns(pl.lit(None, pl.Float64).alias("tail_share"),
                                         pl.lit(None, pl.Int64).alias("listing_pages"))
        if s.tail_short_share_lo and s.byte_length_keys:
            asked = pl.col("args").fill_null("").str.extract(
                _arg_pattern(s.byte_length_keys, r'"?(\d{1,15})\b'), 1
            ).cast(pl.Int64, strict=False)
        else:
            asked = pl.lit(None, pl.Int64)
        short = (pl.col("ok") & pl.col("_asked").is_not_null() & pl.col("bytes").is_not_null()
                 & (pl.col("bytes") < pl.col("_asked")))
        paged = (
            ev.lazy().filter(pl.col("page").is_not_null() | pl.col("cuh").is_not_null())
            .select("sh", "tlh", "ch", "ok", "bytes", asked.alias("_asked"))
        )
        per = (
            paged.group_by("sh", "tlh").agg(
                short.sum().alias("_short"), pl.col("ok").sum().alias("_ok"),
                pl.col("ch").n_unique().alias("_sets"))
            .group_by("sh").agg(
                ratio(pl.col("_short").sum(), pl.col("_ok").sum()).alias("tail_share"),
                pl.col("_sets").max().cast(pl.Int64).alias("listing_pages"))
            .collect(engine="in-memory")
        )
        return sessions.join(per, on="sh", how="left", maintain_order="left")

    def _entities(self, features: FeatureSet, flagged: pl.DataFrame) -> pl.DataFrame:
        """A walk spread over sessions: distinct pages / cursors of one tool per caller and
        client address and window, over sessions not flagged on their own that resume a
        listing (seed 001: the session budget hit, a new session continues the walk).
        ``flagged``: sessions left out (flagged on their own, or following a growing file)."""
        cfg, c = self.config, self.settings
        s = features.sessions.lazy()
        flagged_sh = s.select("session_id", "sh").join(
            flagged.lazy(), on="session_id", how="semi").select("sh")
        ev = features.events
        if "page" not in ev.columns:
            return empty_scores()
        rows = (
            ev.lazy().filter(pl.col("page").is_not_null() | pl.col("cuh").is_not_null())
            .select("t", "sh", "ceh", "ieh", "tlh", "page", "cuh")
            .join(flagged_sh, on="sh", how="anti").collect(engine="in-memory")
        )
        # Only sessions that *resume* a listing count: their first paging call of the tool
        # already asks for a later page (a page number above 1, or a cursor). A sync job
        # or a reader starts each session at the first page; a walk dodging a session
        # budget goes on where the last session stopped.
        # (The first call of the tool in the session, paging arguments or not: a listing's
        # first page usually carries neither.)
        first = ev.lazy().select("t", "sh", "tlh", "page", "cuh").join(
            rows.lazy().select("sh", "tlh").unique(), on=["sh", "tlh"], how="semi").sort(
            "t").group_by("sh", "tlh").agg(
            ((pl.col("page").first().fill_null(0) > 1) | pl.col("cuh").first().is_not_null())
            .alias("_resumes")).collect(engine="in-memory")
        if not first["_resumes"].any():
            return empty_scores()
        ee = explode_entities(rows.join(first, on=["sh", "tlh"], how="left"), cfg)
        # The session a resuming one goes on from (its first page is past this one's
        # first and at most one past its last: refused pages are asked again) started the
        # walk at page 1, where a sync job also starts: it belongs to the walk, though
        # only resuming sessions count towards entity_min_sessions.
        # The next session of the walk: the next row once sorted by walk and start (a
        # shift over the walk's window, .over(), cost ~30 ms a live pass for this).
        walk = [*KEYS, "tlh"]
        same_walk = pl.all_horizontal(
            [pl.col(k).shift(-1) == pl.col(k) for k in walk]).fill_null(False)
        # A walk without a resuming session keeps none of its rows (a session is kept
        # when it resumes, or when the next one does): drop those walks first, most of
        # them in ordinary traffic (the semi joins keep the rows' order).
        ee = ee.join(ee.lazy().filter(pl.col("_resumes")).select(walk).unique()
                     .collect(engine="in-memory"), on=walk, how="semi")
        per_session = ee.group_by([*walk, "sh"]).agg(
            pl.col("t").min().alias("_t0"), pl.col("_resumes").first(),
            pl.col("page").sort_by("t").drop_nulls().first().alias("_p0"),
            pl.col("page").max().alias("_p1"),
        ).sort([*walk, "_t0", "sh"]).with_columns(
            (same_walk & pl.col("_resumes").shift(-1).fill_null(False)
             & pl.col("_p0").shift(-1)
             .is_between(pl.col("_p0") + 1, pl.col("_p1") + 1).fill_null(False))
            .alias("_resumed")
        )
        ee = ee.join(
            per_session.filter(pl.col("_resumes") | pl.col("_resumed"))
            .select(*KEYS, "tlh", "sh"),
            on=[*KEYS, "tlh", "sh"], how="semi",
        )
        per_tool = ee.group_by([*KEYS, "tlh"]).agg(
            (pl.col("page").drop_nulls().n_unique() + pl.col("cuh").drop_nulls().n_unique())
            .alias("_pages"),
            pl.col("sh").filter(pl.col("_resumes")).n_unique().alias("_tool_sessions"),
        ).filter(pl.col("_tool_sessions") >= cfg.entity_min_sessions)
        if per_tool.height == 0:
            return empty_scores()
        best = per_tool.sort("_pages", descending=True).group_by(KEYS).agg(
            pl.col("_pages").first().alias("max_pages"),
            pl.col("_tool_sessions").first().alias("n_sessions"))
        agg = group_agg(
            ee.join(best.select(KEYS), on=KEYS, how="semi"), KEYS,
            pl.len().alias("calls"),
            pl.col("t").min().alias("first_t"),
            pl.col("t").max().alias("last_t"),
            *IDENTITY_AGGS,
        ).join(best, on=KEYS)
        agg = agg.with_columns(band(pl.col("max_pages"), c.pages_lo, c.pages_hi)
                               .alias("score"))
        hot = agg.filter(pl.col("score") >= self.threshold)
        if hot.height == 0:
            return empty_scores()
        agg = finish(hot.join(sessions_of(ee, hot, features), on=KEYS, how="left"), features)
        span = (pl.col("last_t") - pl.col("first_t")) / 1e6
        return agg.select(
            "entity_type", "entity_id", pl.col("w").alias("window_start"), "score",
            pl.lit(None, pl.String).alias("session_id"), "caller_id", "client_ip", "server",
            "first_t", "last_t", "calls", span.alias("span_s"),
            (pl.col("calls") / (span / 60).clip(lower_bound=1 / 60)).alias("calls_per_min"),
            pl.lit(None, pl.Float64).alias("gap_cv"), "top_tool",
            pl.lit(None, pl.Float64).alias("top_tool_share"),
            pl.col("top_tool").alias("page_tool"), "max_pages",
            *[pl.lit(None).alias(k) for k in ("dup_ratio", "distinct_tools")],
            pl.lit("events").alias("basis"),
            *[pl.lit(None).alias(k) for k in ("z_own", "own_n", "own_days",
                                             "own_typical_calls", "habitual", "p_mech")],
            pl.col("score").alias("p_sweep"),
            *[pl.lit(None).alias(k) for k in ("p_rate", "p_rate_summary", "p_calls_summary",
                                              "p_own")],
            "session_ids", "n_sessions", pl.lit(None, pl.Int64).alias("distinct_resources"),
            pl.lit(None, pl.Float64).alias("p_query_sweep"),
            pl.lit(None, pl.Int64).alias("listing_pages"),
        )

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons naming the crawl's cadence, pages, repeats and the caller's own normal."""
        reasons = [
            f"{num(row['calls'])} calls in {duration(row.get('span_s'))} "
            f"({num(row.get('calls_per_min'))} per minute), {pct(row.get('top_tool_share'))} "
            f"of them to {row.get('top_tool') or 'one tool'}."
        ] if row.get("basis") != "summary" else [
            f"Known from the server's session summary only: {num(row['calls'])} calls in "
            f"{duration(row.get('span_s'))} ({num(row.get('calls_per_min'))} per minute) "
            f"touching {num(row.get('distinct_resources'))} distinct resources."
        ]
        if row.get("gap_cv") is not None:
            reasons.append(
                f"Gaps between calls vary by {pct(row['gap_cv'])} of their mean (coefficient "
                f"of variation {num(row['gap_cv'])}; people and reasoning agents are ≈ 100%)."
            )
        if row.get("entity_type") in ("caller_id", "client_ip"):
            what = "client address" if row["entity_type"] == "client_ip" else "caller"
            reasons = [
                f"One {what} walked {num(row.get('max_pages'))} distinct pages/cursors of "
                f"{row.get('page_tool') or 'one tool'} over {num(row.get('n_sessions'))} "
                f"sessions in {duration(row.get('span_s'))}: each session stays under a "
                "per-session budget, the walk goes on in the next one.",
            ]
        elif (row.get("p_query_sweep") or 0) >= self.threshold and (
                row.get("p_query_sweep") or 0) >= (row.get("p_sweep") or 0):
            reasons.append(
                f"{num(row.get('listing_pages'))} distinct query/page combinations of "
                f"{row.get('page_tool') or 'one tool'}: sweeping a listing query by query."
            )
        elif (row.get("max_pages") or 0) >= 2:
            reasons.append(
                f"{num(row['max_pages'])} distinct pages/cursors of "
                f"{row.get('page_tool') or 'one tool'}: walking a listing page by page."
            )
        if row.get("habitual") and row.get("basis") == "summary":
            reasons.append(
                "This caller's session summaries are its routine, but not on this scale: "
                f"it typically makes {num(row.get('own_typical_calls'))} calls per session "
                f"({row.get('own_n')} summaries spread over hours)."
            )
        elif row.get("habitual"):
            reasons.append(
                "This caller crawls habitually, but not on this scale: it typically "
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
                "listing_pages": row.get("listing_pages"),
                "duplicate_call_ratio": row.get("dup_ratio"),
                "distinct_tools": row.get("distinct_tools"),
                "z_own_baseline": row.get("z_own"),
                "own_typical_calls": row.get("own_typical_calls"),
                "own_baseline_sessions": row.get("own_n"),
                "own_baseline_days": row.get("own_days"),
                "basis": row.get("basis"),
                "pattern_scores": clean({k: row.get(k) for k in
                                         ("p_mech", "p_sweep", "p_query_sweep", "p_rate",
                                          "p_rate_summary",
                                          "p_calls_summary", "p_own")}),
            }
        )
        return reasons, evidence
