"""Enumeration: walking resource ids, fast or low-and-slow, in one session or spread out.

Signals (any pattern may decide; see ``docs/detectors.md``):

* **sequential run** — ids of one shape stepping by a constant (doc-1001, doc-1002, …);
  a long run alerts even when every lookup succeeds, which catches low-and-slow harvesting
  (30 ids over three hours) that volume thresholds miss;
* **run with misses** — a shorter run whose lookups mostly return not_found / denied;
* **sparse probing** — many distinct ids in any order, mostly missing;
* **dense range** — many ids covering most of a numeric range (shuffled enumeration);
* **summary only** — sessions known only from a SESSION_END/ANOMALY summary: nearly every
  call touched a new resource, many of them.

A walk that is the caller's own job is capped (``_cap_rewrites``): ids written back (a
migration), ids acted on without being read (a payroll run paying each employee), or
large files read without a single miss (a backup of a tree: bulk extraction's business).

Per caller and client address, the same figures are computed per hopping window over the
events of sessions *not* flagged on their own, so a walk split across sessions (each
below the bar) still surfaces, as one entity alert per window.
"""

from __future__ import annotations

from typing import Any, Self

import polars as pl
from toolwatch.detectors.base import Detector, FeatureSet, empty_scores, session_frame
from toolwatch.detectors.baseline import Baseline, established_rows, habits, habitual_gate
from toolwatch.detectors.bulk import established_count
from toolwatch.detectors.entities import IDENTITY_AGGS, KEYS, finish, sessions_of
from toolwatch.detectors.features import (
    ENTITY_TYPES,
    SEED,
    explode_entities,
    group_agg,
    resource_features,
)
from toolwatch.detectors.scoring import all_of, any_of, band, gate, ratio
from toolwatch.detectors.text import clean, duration, iso, pct, span_us
from toolwatch.detectors.tools import annotated

_EVIDENCE = [
    "calls", "distinct_resources", "resource_key", "resource_calls", "res_misses",
    "not_found", "denied", "miss_ratio", "seq_run", "seq_step", "seq_first", "seq_last",
    "seq_first_t", "seq_last_t", "seq_miss", "dense_ids", "dense_lo", "dense_hi", "span_s",
    "basis", "top_tool",
]


def _established(sessions: pl.DataFrame, min_rows: int) -> pl.DataFrame:
    """Sessions of callers with at least ``min_rows`` sessions (:func:`established_rows`),
    counted on the caller column alone first: usually there are none to copy."""
    if established_count(sessions, ["caller_id"], min_rows) == 0:
        return sessions.clear()
    return established_rows(sessions, ["caller_id"], min_rows)


def _acted() -> pl.Expr:
    """Per (session, id) group: the caller acted on that id (see ``_cap_rewrites``).

    True when a successful mutating call names it, or a successful outbound call names
    it and no read of it does. Needs ``ok``, ``mutates``, ``outbound`` and ``tool_role``.
    """
    ok = pl.col("ok")
    reads = pl.col("tool_role").is_in(["read", "list_search"])
    return (pl.col("mutates") & ok).any() | ((pl.col("outbound") & ok).any() & ~reads.any())


class EnumerationDetector(Detector):
    """Flags sessions and entities walking through resource ids."""

    name = "enumeration_rules"
    category = "enumeration"
    config_key = "enumeration"
    summary = "Sequential / dense / mostly-missing resource id walks per session and entity."

    def _patterns(self) -> dict[str, pl.Expr]:
        e = self.settings
        miss = band(pl.col("miss_ratio"), e.miss_ratio_lo, e.miss_ratio_hi)
        return {
            "p_run": band(pl.col("seq_run"), e.run_lo, e.run_hi),
            "p_miss_run": all_of(
                band(pl.col("seq_run"), e.miss_run_lo, e.miss_run_hi),
                band(pl.col("seq_miss"), e.miss_ratio_lo, e.miss_ratio_hi),
            ),
            "p_sparse": all_of(
                band(pl.col("distinct_resources"), e.distinct_lo, e.distinct_hi), miss
            ),
            # A shuffled walk asks for each id once; re-reading the same few items all
            # day (a person triaging the newest issues) also covers a block of
            # consecutive ids, but most of its lookups are repeats.
            "p_dense": all_of(
                band(pl.col("dense_ids"), e.dense_lo, e.dense_hi),
                gate(ratio(pl.col("distinct_resources"), pl.col("resource_calls")),
                     e.dense_new_share_lo),
            ),
        }

    def fit(self, history: FeatureSet) -> Self:
        """Learn each caller's typical walk figures and whether it walks habitually."""
        cfg = self.config
        figures = ["distinct_resources", "seq_run", "dense_ids"]
        # Narrow frames first: filters on the whole session feature frame copy ~60 columns.
        self.caller_baseline_ = Baseline(
            figures, ["caller_id"],
            min_rows=cfg.baseline_min_sessions, min_days=cfg.baseline_min_days,
            min_mad=cfg.baseline_min_mad,
        ).fit(history.sessions.select("caller_id", "first_t", *figures))
        multi = history.sessions.lazy().select("calls", "basis", "total_bytes").filter(
            (pl.col("calls") >= 2) & (pl.col("basis") != "summary")).collect(engine="in-memory")
        bpc = (multi["total_bytes"] / multi["calls"]).median() if multi.height else None
        self.typical_bytes_per_call_ = float(bpc) if bpc is not None else None  # type: ignore[arg-type]
        # habits() keeps only callers with baseline_min_sessions sessions (established_rows)
        # and a raw score depends on its own row: score just those sessions, or none (a live
        # pass's short history rarely holds one). Same habits, far less work.
        known = _established(history.sessions, cfg.baseline_min_sessions)
        self.habit_ = habits(
            self._raw(known), "_raw", ["caller_id"],
            min_rows=cfg.baseline_min_sessions,
            min_days=max(cfg.baseline_min_days, cfg.habit_min_days),
        ) if known.height else pl.DataFrame(
            schema={"caller_id": history.sessions.schema["caller_id"], "habit_score": pl.Float64})
        self.fitted_ = True
        return self

    def _raw(self, sessions: pl.DataFrame) -> pl.DataFrame:
        """Pattern scores and their maximum ``_raw`` (before the caller's own baseline)."""
        e = self.settings
        pats = self._patterns()
        typ = self.typical_bytes_per_call_
        # In stages: the ratios the summary pattern grades become columns first. Nested
        # into band()/gate() (whose NaN guard repeats its input), each was copied many
        # times into the query, and planning + running those copies cost more than the
        # rows did on small batches. Same element-wise operations, same values.
        small = (
            gate(e.summary_bytes_factor * typ / pl.col("_bytes_per_call")
                 .clip(lower_bound=1e-9), 1.0)
            if typ else pl.lit(1.0)
        )
        p_summary = pl.when(pl.col("basis") == "summary").then(
            all_of(
                band(pl.col("distinct_resources"), e.summary_distinct_lo, e.summary_distinct_hi),
                band(pl.col("_new_share"), e.summary_new_share_lo, 1.0),
                small,
            )
        ).otherwise(0.0)
        cols = sessions.columns
        return sessions.lazy().with_columns(
            ratio(pl.col("total_bytes"), pl.col("calls")).alias("_bytes_per_call"),
            ratio(pl.col("distinct_resources"), pl.col("calls")).alias("_new_share"),
        ).with_columns(**pats, p_summary=p_summary).with_columns(
            any_of(*[pl.col(k) for k in (*pats, "p_summary")]).alias("_raw")
        ).select(*cols, *pats, "p_summary", "_raw").collect(engine="in-memory")

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """Session rows for every session plus entity-window rows (see module docs)."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        e = self.settings
        s = self.caller_baseline_.with_own(features.sessions)
        s = s.with_columns(
            pl.max_horizontal(
                pl.col("own_z_distinct_resources"), pl.col("own_z_seq_run"),
                pl.col("own_z_dense_ids"),
            ).alias("z_own")
        )
        s = habitual_gate(self._raw(s), self.habit_, ["caller_id"], self.threshold,
                          pl.col("z_own"), e.self_z)
        scored = self._cap_rewrites(
            features, s.with_columns(all_of(pl.col("_raw"), pl.col("p_own")).alias("_score")))
        scored = self._name_walked_field(scored, ["sh"], None, features, "_score")
        scored = self._stored_distinct(features, scored)
        pats = list(self._patterns())
        out = session_frame(
            scored, pl.col("_score"), [*_EVIDENCE, *pats, "p_summary", "z_own", "own_n",
                                       "own_days", "habitual", "p_own", "stored_distinct",
                                       pl.lit(None, pl.List(pl.String)).alias("session_ids"),
                                       pl.lit(1, pl.Int64).alias("n_sessions")]
        )
        if not self.settings.entity or features.events.height == 0:
            return out
        # Sessions explained on their own — flagged, or habitual for their caller — are
        # not evidence of a distributed walk.
        flagged = scored.filter(pl.col("_raw") >= self.threshold).select("session_id")
        ent = self._entities(features, flagged)
        if ent.height == 0:
            return out
        ent = ent.with_columns(pl.lit(None, pl.Int64).alias("stored_distinct"))
        return pl.concat([out, ent.select(out.columns)], how="vertical_relaxed")

    def _stored_distinct(self, features: FeatureSet, scored: pl.DataFrame) -> pl.DataFrame:
        """``stored_distinct``: distinct resources of the stored calls, for flagged sessions
        that also have a summary line (``basis`` both); null for the others.

        Such a session's ``distinct_resources`` is the larger of its calls' count and the
        summary's ``uniqueResourcesAccessed``, which counts what the logger chose (the SDK
        middleware counts every call's first argument, a search query too): 151 where
        150 documentId values are stored. Scoring keeps the larger figure; the reason names
        values of the resource key, so it counts the stored calls only (issue 27).
        """
        if scored.height == 0 or features.events.height == 0:
            return scored.with_columns(pl.lit(None, pl.Int64).alias("stored_distinct"))
        both = scored.lazy().filter(
            (pl.col("basis") == "both") & (pl.col("_score") >= self.threshold)).select("sh")
        per = (
            features.events.lazy().select("sh", "rh").join(both, on="sh", how="semi")
            .group_by("sh").agg(pl.col("rh").drop_nulls().n_unique().cast(pl.Int64)
                                .alias("stored_distinct"))
            .collect(engine="in-memory")
        )
        return scored.join(per, on="sh", how="left", maintain_order="left")

    def _cap_rewrites(self, features: FeatureSet, scored: pl.DataFrame) -> pl.DataFrame:
        """Cap the score of walks that are the caller's own job, not lookups of others' ids.

        Enumeration (seed 001's IDOR) is a walk of *lookups* over other people's resources.
        Three walks are not:

        * **write-back** — a schema migration or backfill reads and updates each document
          in id order; an agent probing for ids it may read, or harvesting them, does not
          write them back;
        * **acting without reading** — a payroll run pays each employee of a batch in turn
          (``sendPayout({recipientId})``), a notifier messages each subscriber: the ids are
          destinations of the caller's own operations (sends, payments, writes), none of
          them is read back. An id counts as acted on when a successful mutating call, or a
          successful outbound call with no read of that id, names it (an id read *and*
          sent out is still a lookup: reading a document and forwarding it is exfiltration);
        * **content in bulk** (``harvest_bytes_factor``) — a backup agent reads every file
          of the tree it is configured to back up (``part-00000`` … ``part-00126``), each a
          large file: a walk that never misses and returns on average many times the
          population's typical call reads content, and volume is bulk extraction's business
          (judged by size and the caller's routine), not probing.

        An acted-on walk stays visible at ``rewrite_score`` (low) instead of paging; when
        (nearly) none of its lookups failed either (``rewrite_clean_miss``), the caller read
        and wrote ids it is allowed to: maintenance, capped at ``rewrite_clean_score``. A
        clean content walk is capped at ``rewrite_clean_score`` too. A walk with misses
        (not found, denied) is never excused by its size: that is what probing looks like."""
        e = self.settings
        if scored.height == 0 or not (e.rewrite_share_lo or e.harvest_bytes_factor):
            return scored
        cand = scored.lazy().filter(pl.col("_score") >= self.threshold).select("sh")
        acted = _acted()
        per = (
            annotated(features).lazy().join(cand, on="sh", how="semi")
            .filter(pl.col("rh").is_not_null())
            .group_by("sh", "rh").agg(acted.alias("_w"))
            .group_by("sh").agg(pl.col("_w").mean().alias("_rewritten"))
            .collect(engine="in-memory")
        )
        if per.height == 0:
            return scored
        no_miss = ratio(pl.col("res_misses"), pl.col("resource_calls")) < e.rewrite_clean_miss
        capped = (pl.col("_rewritten").fill_null(0.0) >= e.rewrite_share_lo) if \
            e.rewrite_share_lo else pl.lit(False)
        clean = capped & no_miss
        typ = self.typical_bytes_per_call_
        if e.harvest_bytes_factor and typ:
            heavy = ratio(pl.col("total_bytes"), pl.col("calls")) >= e.harvest_bytes_factor * typ
            clean = clean | (no_miss & heavy)
        return scored.join(per, on="sh", how="left", maintain_order="left").with_columns(
            pl.when(clean).then(pl.min_horizontal(pl.col("_score"),
                                                  pl.lit(e.rewrite_clean_score)))
            .when(capped).then(pl.min_horizontal(pl.col("_score"), pl.lit(e.rewrite_score)))
            .otherwise(pl.col("_score")).alias("_score")).drop("_rewritten")

    def _candidates(self, residual: pl.DataFrame) -> pl.DataFrame:
        """Entity windows that could reach the threshold, from cheap session-level upper
        bounds (sessions per window, summed distinct resources and misses)."""
        cfg, e = self.config, self.settings
        f = min(1.0, 2.0 * self.threshold)  # band(x, lo, hi) >= threshold needs x >= f * lo
        hop, n = cfg.hop_us, cfg.entity_window_minutes // cfg.entity_hop_minutes
        # One lazy plan (the parts were ~14 eager queries, a fixed cost on small batches).
        base = residual.lazy().select(
            "sh", "ceh", "ieh", "first_t", "last_t", "distinct_resources", "res_misses",
            "resource_calls",
        ).filter(pl.col("resource_calls") > 0).drop("resource_calls")
        parts = []
        for code, (_, hcol) in enumerate(ENTITY_TYPES):
            b = base.filter(pl.col(hcol).is_not_null()).with_columns(
                pl.lit(code, pl.Int8).alias("et"), pl.col(hcol).alias("eh")
            )
            # Every window a session overlaps (sessions up to half a window longer than one).
            for j in range(n + 2):
                parts.append(b.with_columns(((pl.col("last_t") // hop) * hop - j * hop).alias("w")))
        if not parts:
            return pl.DataFrame(schema={"et": pl.Int8, "eh": pl.UInt64, "w": pl.Int64})
        x = pl.concat(parts).filter(pl.col("w") + cfg.window_us > pl.col("first_t")).collect(
            engine="in-memory")
        g = group_agg(
            x, KEYS,
            pl.len().alias("n"),
            pl.col("distinct_resources").sum().alias("d"),
            pl.col("res_misses").sum().alias("m"),
        )
        return g.lazy().filter(
            (pl.col("n") >= cfg.entity_min_sessions)
            & (
                (pl.col("d") >= f * min(e.run_lo, e.dense_lo))
                | ((pl.col("d") >= f * min(e.miss_run_lo, e.distinct_lo)) & (pl.col("m") >= 1))
            )
        ).select(KEYS).collect(engine="in-memory")

    def _entities(self, features: FeatureSet, flagged: pl.DataFrame) -> pl.DataFrame:
        """Entity-window rows: a walk split across sessions, per caller / client address.

        Three rules keep a busy person's day from reading as one walk (issue 26):

        * **one id space per walk** — distinct ids, misses, runs and dense blocks are
          counted per resource field (``resource_key``; ids logged without a field are a
          space of their own), never mixed across fields: a person touches many objects of
          many kinds in a day (orders, carts, documents, charts, files), and that variety is
          not a walk. A window scores as its highest-scoring field;
        * **own objects are not lookups** — an id the caller acted on in the same session
          (``_acted``, the session rule of ``_cap_rewrites``: a successful mutating call on
          it, e.g. checkout / charge / fulfil of the order it just created) is not counted;
        * **evidence sessions** — the alert names (``session_ids``, ``n_sessions``) the
          sessions carrying the walk's evidence: a missed lookup in the walked field, or an
          id inside the reported run / dense block; not every session of the caller that
          touched a resource. ``entity_min_sessions`` counts those sessions.
        """
        cfg, e = self.config, self.settings
        # The columns read below only (the anti join would copy every feature column).
        residual = features.sessions.select(
            "session_id", "sh", "ceh", "ieh", "first_t", "last_t", "distinct_resources",
            "res_misses", "resource_calls",
        ).join(flagged, on="session_id", how="anti")
        cand = self._candidates(residual)
        if cand.height == 0:
            return empty_scores()
        callers = cand.filter(pl.col("et") == 0)["eh"].unique().implode()
        ips = cand.filter(pl.col("et") == 1)["eh"].unique().implode()
        ann = annotated(features)
        # One in-memory query (what the eager calls ran, one after another): the filter
        # reads a few columns instead of copying every event column first. ``rkh`` is the
        # id space (the field name's hash; a bare id's null field hashes to one value).
        ev = (
            features.events.lazy().filter(
                pl.col("has_res") & (pl.col("ceh").is_in(callers) | pl.col("ieh").is_in(ips))
            )
            .select("t", "sh", "ceh", "ieh", "rh", "tlh", "th", "rnum", "miss", "nf", "den", "i",
                    "ok", pl.col("resource_key").hash(SEED).alias("rkh"))
            .join(residual.lazy().select("sh"), on="sh", how="semi", maintain_order="left")
            .collect(engine="in-memory")
        )
        if ev.height == 0:
            return empty_scores()
        # Own objects: ids acted on in their session leave the walk (annotated() keeps
        # the events' rows in order, so its role columns are gathered by row index).
        idx = ev["i"]
        ev = ev.with_columns(
            ann["mutates"].gather(idx).fill_null(False).alias("mutates"),
            ann["outbound"].gather(idx).fill_null(False).alias("outbound"),
            ann["tool_role"].gather(idx).alias("tool_role"),
        )
        own = ev.group_by("sh", "rh").agg(_acted().alias("_own")).filter(pl.col("_own"))
        ev = ev.join(own.select("sh", "rh"), on=["sh", "rh"], how="anti",
                     maintain_order="left").drop("ok", "mutates", "outbound", "tool_role")
        if ev.height == 0:
            return empty_scores()
        gk = [*KEYS, "rkh"]
        ee = explode_entities(ev, cfg).join(cand, on=KEYS, how="semi")
        agg = group_agg(
            ee, gk,
            pl.col("sh").n_unique().alias("n_sessions"),
            pl.len().alias("resource_calls"),
            pl.col("rh").n_unique().alias("distinct_resources"),
            pl.col("miss").sum().alias("res_misses"),
            # Ids that missed, not lookups: one missing id retried a hundred times is a
            # loop (tool_loop's business), not a hundred probes.
            pl.col("rh").filter(pl.col("miss")).n_unique().alias("_miss_ids"),
            pl.col("nf").sum().alias("not_found"),
            pl.col("den").sum().alias("denied"),
            pl.col("t").min().alias("first_t"),
            pl.col("t").max().alias("last_t"),
            pl.col("i").first().alias("_i"),
            *IDENTITY_AGGS,
        ).filter(
            (pl.col("n_sessions") >= cfg.entity_min_sessions)
            & (pl.col("distinct_resources") >= e.miss_run_lo)
        )
        if agg.height == 0:
            return empty_scores()
        ids = features.events["resource_id"]
        rf = resource_features(ee, gk, cfg, ids)
        feats = agg.join(rf, on=gk, how="left").with_columns(
            pl.col("seq_run").fill_null(0),
            pl.col("seq_miss").fill_null(0.0),
            pl.col("dense_ids").fill_null(0),
            ratio(pl.col("_miss_ids"), pl.col("distinct_resources")).alias("miss_ratio"),
            pl.col("resource_calls").alias("calls"),
            ((pl.col("last_t") - pl.col("first_t")) / 1e6).alias("span_s"),
            pl.lit("events").alias("basis"),
            # One field per group: the walked field is the group's own.
            features.events["resource_key"].gather(agg["_i"]).alias("resource_key"),
        )
        pats = self._patterns()
        feats = feats.with_columns(**pats, p_summary=pl.lit(0.0)).with_columns(
            any_of(*[pl.col(k) for k in pats]).alias("score")
        )
        # A window scores as its highest-scoring id space (one row per window).
        feats = feats.sort(["score", "distinct_resources", "_i"],
                           descending=[True, True, False]).unique(KEYS, keep="first",
                                                                  maintain_order=True)
        feats = self._evidence_sessions(feats, ee, features)
        feats = finish(feats, features)
        return feats.select(
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
            *_EVIDENCE,
            *pats,
            "p_summary",
            pl.lit(None, pl.Float64).alias("z_own"),
            pl.lit(None, pl.Int64).alias("own_n"),
            pl.lit(None, pl.Int64).alias("own_days"),
            pl.lit(False).alias("habitual"),
            pl.lit(1.0).alias("p_own"),
            "session_ids",
            "n_sessions",
        )

    def _evidence_sessions(self, feats: pl.DataFrame, ee: pl.DataFrame,
                           features: FeatureSet) -> pl.DataFrame:
        """``session_ids``, ``n_sessions`` and ``top_tool`` of the windows at the threshold:
        the sessions with a missed lookup in the walked field, or with an id inside the
        run (``seq_run`` >= ``miss_run_lo``, ids of the run's shape between its first and
        last id, on its step) or dense block (``dense_ids`` >= ``dense_lo`` / 2) when that
        pattern decided the alert.
        Windows whose evidence spans fewer than ``entity_min_sessions`` sessions are a
        session's business, not a distributed walk: their score drops to 0."""
        e, cfg = self.settings, self.config
        gk = [*KEYS, "rkh"]
        # The run / block is the walk's evidence when its pattern decides: it reaches the
        # threshold on its own, or is the strongest pattern. A dozen documents re-read all
        # day form a small block beside a sparse probe; they are not what alerted.
        thr = self.threshold
        p_seq = pl.max_horizontal("p_run", "p_miss_run")
        top = pl.max_horizontal("p_run", "p_miss_run", "p_sparse", "p_dense")
        hot = feats.filter(pl.col("score") >= thr).select(
            *gk, "seq_step", "seq_first", "seq_last", "dense_lo", "dense_hi",
            pl.when((p_seq >= thr) | ((p_seq >= top) & (p_seq > 0)))
            .then(pl.col("seq_run")).otherwise(0).alias("seq_run"),
            pl.when((pl.col("p_dense") >= thr) | ((pl.col("p_dense") >= top)
                                                  & (pl.col("p_dense") > 0)))
            .then(pl.col("dense_ids")).otherwise(0).alias("dense_ids"))
        none = pl.lit(None, pl.List(pl.String))
        if hot.height == 0:
            return feats.with_columns(none.alias("session_ids"),
                                      pl.lit(None, pl.String).alias("top_tool"))
        sub = ee.join(hot.select(gk), on=gk, how="semi")
        sub = sub.with_columns(features.events["resource_id"].gather(sub["i"]).alias("_rid"))

        def at(col: str, what: str) -> pl.Expr:
            return pl.col(what).filter(pl.col("_rid") == pl.col(col)).first().over(gk)

        step = pl.col("seq_step").fill_null(1).abs().clip(lower_bound=1)
        r_lo = pl.min_horizontal(pl.col("_r0"), pl.col("_r1"))
        r_hi = pl.max_horizontal(pl.col("_r0"), pl.col("_r1"))
        in_run = (
            (pl.col("seq_run").fill_null(0) >= e.miss_run_lo) & (pl.col("th") == pl.col("_tr"))
            & pl.col("rnum").is_between(r_lo, r_hi) & ((pl.col("rnum") - r_lo) % step == 0)
        ).fill_null(False)
        in_blk = (
            (pl.col("dense_ids").fill_null(0) >= e.dense_lo // 2)
            & (pl.col("th") == pl.col("_tb"))
            & pl.col("rnum").is_between(pl.col("_b0"), pl.col("_b1"))
        ).fill_null(False)
        evid = (
            sub.lazy().join(hot.lazy(), on=gk)
            .with_columns(at("seq_first", "rnum").alias("_r0"), at("seq_last", "rnum").alias("_r1"),
                          at("seq_first", "th").alias("_tr"), at("dense_lo", "rnum").alias("_b0"),
                          at("dense_hi", "rnum").alias("_b1"), at("dense_lo", "th").alias("_tb"))
            .filter(pl.col("miss") | in_run | in_blk)
            .select(*KEYS, "sh", "tlh")
            .collect(engine="in-memory")
        )
        n = group_agg(evid, KEYS, pl.col("sh").n_unique().alias("_n_ev"))
        who = sessions_of(evid, hot.select(KEYS), features)
        return (
            feats.join(n, on=KEYS, how="left").join(who, on=KEYS, how="left")
            .with_columns(
                pl.when(pl.col("score") >= self.threshold).then(
                    pl.when(pl.col("_n_ev").fill_null(0) >= cfg.entity_min_sessions)
                    .then(pl.col("score")).otherwise(0.0)).otherwise(pl.col("score"))
                .alias("score"),
                pl.coalesce(pl.col("_n_ev"), pl.col("n_sessions")).cast(pl.Int64)
                .alias("n_sessions"),
            ).drop("_n_ev")
        )

    def _name_walked_field(self, rows: pl.DataFrame, keys: list[str],
                           ev: pl.DataFrame | None, features: FeatureSet,
                           score: str) -> pl.DataFrame:
        """``resource_key`` of the alerting rows: the field that was walked.

        The feature's ``resource_key`` is merely the first resource field the group named
        (a session that polls ``jobId`` and then walks ``documentId`` would be reported as
        walking ``jobId``). The walked field is the one that carried the walk's first id
        (``seq_first``, else the dense block's ``dense_lo``) — null when that id was logged
        without a field name; without a run or block (sparse probing), the field most of
        the group's lookups named. Only rows at the threshold
        are looked up: their events are a small subset.

        Parameters
        ----------
        rows
            Scored rows with ``keys``, ``score``, ``seq_run``, ``seq_first``, ``dense_ids``,
            ``dense_lo`` and ``resource_key``.
        keys
            Group columns shared by ``rows`` and ``ev``.
        ev
            ``keys`` and ``i`` (row of ``features.events``) of the groups' resource calls;
            None for sessions (``keys == ["sh"]``: looked up in ``features.events``).
        """
        wid = (
            pl.when(pl.col("seq_run").fill_null(0) >= 2).then(pl.col("seq_first"))
            .when(pl.col("dense_ids").fill_null(0) >= 2).then(pl.col("dense_lo"))
        )
        hot = rows.lazy().filter(pl.col(score) >= self.threshold).select(
            *keys, wid.alias("_wid")).collect(engine="in-memory")
        if hot.height == 0:
            return rows
        # One in-memory query from here (the eager steps were ~16 queries); the final left
        # join keeps the rows' order, as the eager join did.
        if ev is None:
            x = features.events.lazy().filter(
                pl.col("has_res") & pl.col("sh").is_in(hot["sh"].implode())
            ).select("sh", "i", pl.col("resource_id").alias("_rid"),
                     pl.col("resource_key").alias("_rk"))
        else:
            x = ev.join(hot.select(keys), on=keys, how="semi")
            x = x.with_columns(
                features.events["resource_id"].gather(x["i"]).alias("_rid"),
                features.events["resource_key"].gather(x["i"]).alias("_rk"),
            ).lazy()
        # A walked id logged without its field name (a bare resource_id) leaves the field
        # unknown: the reason then says "resource", never a field of other calls.
        walked = (
            x.join(hot.lazy(), on=keys).filter(pl.col("_rid") == pl.col("_wid"))
            .group_by(keys).agg(pl.col("_rk").sort_by("i").first().alias("_wk"),
                                pl.lit(True).alias("_walk"))
        )
        mode = (
            x.filter(pl.col("_rk").is_not_null())
            .group_by(*keys, "_rk").agg(pl.len().alias("_n"), pl.col("i").min().alias("_i0"))
            .sort(["_n", "_i0"], descending=[True, False])
            .group_by(keys, maintain_order=True).first()
            .select(*keys, pl.col("_rk").alias("_mk"))
        )
        named = (
            hot.lazy().select(keys).join(walked, on=keys, how="left")
            .join(mode, on=keys, how="left")
            .select(*keys, pl.when(pl.col("_walk").fill_null(False)).then(pl.col("_wk"))
                    .otherwise(pl.col("_mk")).alias("_key"), pl.lit(True).alias("_named"))
        )
        return rows.lazy().join(named, on=keys, how="left", maintain_order="left").with_columns(
            pl.when(pl.col("_named").fill_null(False)).then(pl.col("_key"))
            .otherwise(pl.col("resource_key")).alias("resource_key")
        ).drop("_key", "_named").collect(engine="in-memory")

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons such as "143 distinct documentId values in 4 min, 92% not found or
        denied" and "143 ids in one sequential run (doc-1001 … doc-1143, step 1)"."""
        key = row.get("resource_key") or "resource"
        dur = duration(row.get("span_s"))
        reasons: list[str] = []
        # values of the key counted on the stored calls, not the summary line's count
        stored = row.get("stored_distinct")
        distinct = row.get("distinct_resources") if stored is None else stored
        entity = row["entity_type"] != "session"
        if row.get("basis") == "summary":
            reasons.append(
                f"Session summary only: {row['calls']} calls touched "
                f"{row['distinct_resources']} distinct resources "
                f"({pct(row['distinct_resources'] / max(row['calls'] or 1, 1))} of calls) "
                f"in {dur}."
            )
        else:
            where = f" across {row['n_sessions']} sessions" if entity else ""
            # An entity window's miss share counts ids (see _entities), a session's lookups.
            of = "of them" if entity else "of lookups"
            reasons.append(
                f"{distinct} distinct {key} values in {dur}{where}, "
                f"{pct(row.get('miss_ratio'))} {of} not found or denied."
            )
            if distinct != row["distinct_resources"]:
                reasons.append(
                    f"The session's summary line counts {row['distinct_resources']} "
                    "distinct resources (of every kind its logger counts)."
                )
        run = row.get("seq_run") or 0
        if run >= self.settings.miss_run_lo and row.get("seq_first"):
            reasons.append(
                f"{run} ids in one sequential run ({row['seq_first']} … {row['seq_last']}, "
                f"step {row['seq_step']}) over "
                f"{duration(span_us(row.get('seq_first_t'), row.get('seq_last_t')))}, "
                f"{pct(row.get('seq_miss'))} of them missing."
            )
        dense = row.get("dense_ids") or 0
        if dense >= self.settings.dense_lo // 2 and row.get("dense_lo"):
            reasons.append(
                f"{dense} ids requested densely covering the range {row['dense_lo']} … "
                f"{row['dense_hi']}."
            )
        if row.get("habitual"):
            reasons.append(
                f"This caller walks resources habitually, but this session is far beyond its "
                f"own normal (z-score {row['z_own']:.1f} over {row.get('own_n')} sessions on "
                f"{row.get('own_days')} days)."
            )
        evidence = clean(
            {
                "calls": row.get("calls"),
                "distinct_resources": distinct,
                "summary_distinct_resources": (
                    row.get("distinct_resources") if distinct != row.get("distinct_resources")
                    else None),
                "resource_key": row.get("resource_key"),
                "not_found": row.get("not_found"),
                "denied": row.get("denied"),
                "miss_ratio": row.get("miss_ratio"),
                "longest_sequential_run": run,
                "run_step": row.get("seq_step"),
                "run_first_id": row.get("seq_first"),
                "run_last_id": row.get("seq_last"),
                "run_first_seen": iso(row.get("seq_first_t")),
                "run_last_seen": iso(row.get("seq_last_t")),
                "run_miss_ratio": row.get("seq_miss") if run > 1 else None,
                "dense_range_ids": dense or None,
                "duration_s": row.get("span_s"),
                "basis": row.get("basis"),
                "top_tool": row.get("top_tool"),
                "z_own_baseline": row.get("z_own"),
                "pattern_scores": {
                    k: round(float(row[k] or 0.0), 3)
                    for k in ("p_run", "p_miss_run", "p_sparse", "p_dense", "p_summary", "p_own")
                },
            }
        )
        return reasons, evidence

