"""Session and entity features as polars expressions (vectorized, no per-event Python).

Three steps, each a handful of columnar passes over the batch:

1. :func:`prepare_events` selects the columns detectors use from ``schema.EVENTS`` and
   derives per-event figures: outcome flags, the *shape* and numeric part of each resource
   id (``doc-1001`` → shape ``doc-#``, number 1001), page numbers and cursors found in the
   arguments, and a hash of (tool, arguments) to spot identical repeats.
2. :func:`session_features` aggregates per session: calls, distinct tools and resources,
   not-found / denied / auth-failure counts and ratios, distinct credential hashes,
   bytes and rows (total and largest single call), inter-call gap regularity (coefficient
   of variation), calls per minute, longest run of sequential resource ids, dense id
   ranges, pagination progression, share of the top tool and of identical repeats. Sessions
   known only from ``SESSION_END`` / ``SESSION_ANOMALY`` summaries get the figures the
   summary carries (calls, unique resources, bytes, auth failures, duration).
3. :func:`resource_features` is the id-walking part of (2) for any grouping key, so the
   same code scores sessions and (caller / client address, window) entities;
   :func:`window_starts` assigns times to the hopping entity windows.

Sequential runs: within one group and one id shape, distinct ids are taken in the order
they were first requested (repeats — several tools on one document, retries — count
once), ids with no other id within ``enumeration.max_step`` are set aside (they can be
part of no run; decoy lookups far from the walk therefore do not break it), and a run is
a stretch where the numeric part keeps stepping by the same non-zero constant of at most
``max_step``. Its length counts ids (1001..1030 is 30). A *walk* is also measured: the
longest stretch of consecutive integers first requested in time order (up or down),
whatever was requested in between; the longer of the two is ``seq_run``. A *dense block*
is the longest stretch of consecutive integers all requested, in any order.
"""

from __future__ import annotations

import re

import polars as pl
from toolwatch.detectors.config import DetectorsConfig

#: Columns of ``schema.EVENTS`` the detectors read, with their polars types.
EVENT_COLUMNS: dict[str, pl.DataType] = {
    "ts": pl.Datetime("us", "UTC"),
    "session_id": pl.String(),
    "caller_id": pl.String(),
    "client_ip": pl.String(),
    "server": pl.String(),
    "tool": pl.String(),
    "args": pl.String(),
    "resource_key": pl.String(),
    "resource_id": pl.String(),
    "status": pl.String(),
    "is_error": pl.Boolean(),
    "bytes": pl.Int64(),
    "rows": pl.Int64(),
    "duration_ms": pl.Float64(),
    "start_ts": pl.Datetime("us", "UTC"),  # when the call was in flight (concurrency)
    "end_ts": pl.Datetime("us", "UTC"),
    "credential_hash": pl.String(),
    # not a feature: read by the triage suppressions (caller rules need it, issue 28)
    "caller_authenticated": pl.Boolean(),
}

#: Columns of ``schema.SUMMARIES`` the detectors read.
SUMMARY_COLUMNS: dict[str, pl.DataType] = {
    "ts": pl.Datetime("us", "UTC"),
    "kind": pl.String(),
    "session_id": pl.String(),
    "caller_id": pl.String(),
    "client_ip": pl.String(),
    "server": pl.String(),
    "call_count": pl.Int64(),
    "unique_resources": pl.Int64(),
    "total_bytes": pl.Int64(),
    "auth_failures": pl.Int64(),
    "duration_ms": pl.Float64(),
}

#: Resource ids are split into shape and number: the *last* run of digits is the number
#: (doc-1001 → doc-#, 1001; /book/chapter-03.md → /book/chapter-#.md, 3).
_ID_SHAPE = r"(?<num>\d{1,18})(?<suf>\D*)$"

US_PER_MIN = 60_000_000

#: Engine of the detectors' lazy queries. polars 2's default ("auto") runs lazy queries on
#: the streaming engine, which costs ~0.4 ms more per query on the small frames of a live
#: pass and may combine partial aggregates in another order; eager calls (and these) run
#: on the in-memory engine, so fusing eager steps into a lazy query keeps every value.
ENGINE = "in-memory"
US_PER_DAY = 86_400_000_000


def _conform(df: pl.DataFrame | None, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    """Select ``columns`` with their types; missing ones become nulls (tolerant input)."""
    if df is None or df.width == 0:
        return pl.DataFrame(schema=columns)
    exprs = []
    for name, dtype in columns.items():
        if name in df.columns:
            col = pl.col(name)
            if isinstance(dtype, pl.Datetime):
                src = df.schema[name]
                if isinstance(src, pl.Datetime) and src.time_zone is None:
                    col = col.dt.replace_time_zone("UTC")
                col = col.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
            exprs.append(col.cast(dtype).alias(name))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(exprs)


def _arg_pattern(keys: list[str], value: str) -> str:
    alt = "|".join(re.escape(k) for k in keys)
    return rf'"(?:{alt})"\s*:\s*{value}'


def _h(col: str) -> pl.Expr:
    """64-bit hash of a string column, null where the value is null."""
    return pl.when(pl.col(col).is_not_null()).then(pl.col(col).hash(SEED))


SEED = 0x7077


def prepare_events(events: pl.DataFrame | None, config: DetectorsConfig) -> pl.DataFrame:
    """Detector view of events: typed columns plus per-event derived figures.

    Heavy work (grouping, sorting) runs on 64-bit hashes of the string columns; strings
    are only looked up again for the rows that end up in results. The frame keeps the
    input's row order (sorting a wide frame costs more than everything else together).
    String parsing (id shapes, pagination arguments) runs once per *distinct* resource id
    and argument text — far fewer than events — and is joined back on their hashes.

    Parameters
    ----------
    events
        Rows following ``schema.EVENTS`` (extra columns ignored, missing ones null).
    config
        Supplies the argument names of page numbers and cursors.

    Returns
    -------
    polars.DataFrame
        One row per event with ``i`` (row index), ``t`` (µs since epoch), hashes ``sh``
        (session), ``ceh``/``ieh`` (caller, client address), ``rh`` (resource), ``tlh``
        (tool), ``crh`` (credential), ``ch`` (tool + arguments), ``cuh`` (cursor), outcome
        flags ``nf``/``den``/``authf``/``ok``/``miss``/``has_res``, ``th``/``rnum`` (id
        shape hash and number) and ``page``.
    """
    # One chunk per column first: events arrive as many batches, and every group-by
    # below would otherwise concatenate the string columns it touches again (measured:
    # ~10% of detection CPU on 1M events in 17 batches; the copy here costs a third).
    ev = _conform(events, EVENT_COLUMNS).rechunk()
    status = pl.col("status").fill_null("unknown")
    session_id = pl.col("session_id")
    if ev["session_id"].null_count():
        # Only pay for building the stand-in ids when some event lacks a session id.
        session_id = pl.coalesce(
            pl.col("session_id"),
            pl.lit("nosession:")
            + pl.coalesce(pl.col("caller_id"), pl.col("client_ip"), pl.lit("?")),
        )
    ev = ev.with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("i"),
        pl.col("ts").dt.epoch("us").alias("t"),
        session_id.alias("session_id"),
        (status == "not_found").alias("nf"),
        (status == "denied").alias("den"),
        (status == "auth_failed").alias("authf"),
        (status == "ok").alias("ok"),
        status.is_in(["not_found", "denied"]).alias("miss"),
        pl.coalesce(pl.col("is_error"), ~status.is_in(["ok", "unknown"])).alias("is_error"),
        pl.col("resource_id").is_not_null().alias("has_res"),
        pl.col("args").fill_null("").hash(SEED).alias("_ah"),
        _h("caller_id").alias("ceh"),
        _h("client_ip").alias("ieh"),
        _h("resource_id").alias("rh"),
        _h("credential_hash").alias("crh"),
        pl.col("tool").fill_null("").hash(SEED).alias("tlh"),
    )
    # Look up the per-value figures on the key columns alone (the right sides are unique
    # per key, so row i of the result is row i of ev) instead of joining the wide frame.
    shapes = ev.select("rh").join(_id_shapes(ev), on="rh", how="left", maintain_order="left")
    pages = ev.select("_ah").join(
        _pagination(ev, config), on="_ah", how="left", maintain_order="left"
    )
    return ev.with_columns(
        shapes["th"],
        shapes["rnum"],
        pages["page"],
        pages["cuh"],
        pl.col("session_id").hash(SEED).alias("sh"),
        # Identical calls: same tool and same argument text (a pair of hashes).
        pl.struct("tlh", "_ah").hash(SEED).alias("ch"),
    ).drop("_ah")


def _id_shapes(ev: pl.DataFrame) -> pl.DataFrame:
    """Shape hash ``th`` and number ``rnum`` of each distinct resource id, keyed by ``rh``.

    Ids without digits get no shape (null ``th``/``rnum``).
    """
    rid = (
        ev.select("rh", "resource_id")
        .filter(pl.col("rh").is_not_null() & pl.col("rh").is_first_distinct())
        .with_columns(pl.col("resource_id").str.extract_groups(_ID_SHAPE).alias("_s"))
    )
    num, suf = pl.col("_s").struct.field("num"), pl.col("_s").struct.field("suf")
    prefix_len = (
        pl.col("resource_id").str.len_chars() - num.str.len_chars() - suf.str.len_chars()
    )
    rnum = num.cast(pl.Int64, strict=False)
    th = (pl.col("resource_id").str.head(prefix_len) + "#" + suf).hash(SEED)
    return rid.select(
        "rh",
        pl.when(rnum.is_not_null()).then(th).alias("th"),
        rnum.alias("rnum"),
    )


def _pagination(ev: pl.DataFrame, config: DetectorsConfig) -> pl.DataFrame:
    """Page number ``page`` and cursor hash ``cuh`` per distinct argument text (``_ah``).

    Only texts mentioning a page or cursor key (one Aho-Corasick pass over the distinct
    texts) go through the regular expressions; texts not listed have neither.
    """
    keys = [f'"{k}"' for k in (*config.page_keys, *config.cursor_keys)]
    hits = (
        ev.select("_ah", "args").filter(pl.col("_ah").is_first_distinct())
        .with_columns(pl.col("args").fill_null(""))
        .filter(pl.col("args").str.contains_any(keys))
    )
    return hits.select(
        "_ah",
        pl.col("args").str.extract(_arg_pattern(config.page_keys, r'"?(\d{1,12})\b'), 1)
        .cast(pl.Int64, strict=False).alias("page"),
        pl.col("args").str.extract(_arg_pattern(config.cursor_keys, r'"([^"]{1,512})"'), 1)
        .alias("_c"),
    ).select("_ah", "page", pl.when(pl.col("_c").is_not_null()).then(pl.col("_c").hash(SEED))
             .alias("cuh"))


def prepare_summaries(summaries: pl.DataFrame | None) -> pl.DataFrame:
    """Summaries reduced to one row per session (latest figures, ANOMALY if any said so)."""
    su = _conform(summaries, SUMMARY_COLUMNS).filter(pl.col("session_id").is_not_null())
    return (
        su.with_columns(pl.col("ts").dt.epoch("us").alias("t"))
        .group_by("session_id")
        .agg(
            pl.col("t").max().alias("s_t"),
            (pl.col("kind").str.to_uppercase() == "SESSION_ANOMALY").any().alias("s_anomaly"),
            pl.col("caller_id").drop_nulls().first().alias("s_caller"),
            pl.col("client_ip").drop_nulls().first().alias("s_ip"),
            pl.col("server").drop_nulls().first().alias("s_server"),
            pl.col("call_count").max().alias("s_calls"),
            pl.col("unique_resources").max().alias("s_resources"),
            pl.col("total_bytes").max().alias("s_bytes"),
            pl.col("auth_failures").max().alias("s_auth_failures"),
            pl.col("duration_ms").max().alias("s_duration_ms"),
        )
    )


def group_agg(df: pl.DataFrame, keys: list[str], *aggs: pl.Expr) -> pl.DataFrame:
    """``df.group_by(keys).agg(*aggs)``, grouping several key columns by one 64-bit hash.

    polars groups a single integer column several times faster than a tuple of columns;
    the key columns are carried as the first value of each group (equal within it). Rows
    keep their input order within a group, as with ``group_by``.
    """
    if len(keys) == 1:
        return df.group_by(keys).agg(*aggs)
    return (
        df.group_by(pl.struct(keys).hash(SEED).alias("_gk"))
        .agg(*[pl.col(k).first() for k in keys], *aggs)
        .drop("_gk")
    )


def window_starts(t: pl.Expr, config: DetectorsConfig, j: int) -> pl.Expr:
    """Start (µs) of the ``j``-th hopping window containing time ``t`` (µs).

    Windows are ``entity_window_minutes`` long and start every ``entity_hop_minutes``
    (aligned to the Unix epoch), so a time lies in ``window / hop`` windows, j = 0 being
    the latest.
    """
    hop = config.hop_us
    return (t // hop) * hop - j * hop


#: Entity types scored per window, with the hash column and string column of each.
ENTITY_TYPES = (("caller_id", "ceh"), ("client_ip", "ieh"))


def explode_entities(df: pl.DataFrame, config: DetectorsConfig, t_col: str = "t") -> pl.DataFrame:
    """Stack rows once per entity type and per hopping window holding them.

    Adds ``et`` (0 = caller_id, 1 = client_ip), ``eh`` (hash of the entity value) and
    ``w`` (window start, µs). Rows whose entity is null are dropped for that type. Only
    numeric columns should be carried (the frame grows ``2 * window / hop`` times).
    """
    n = config.entity_window_minutes // config.entity_hop_minutes
    parts = []
    # One lazy query (parts stacked in the same order): eagerly this was 2 + 2n polars
    # calls, a fixed cost that dominated on a small live pass.
    lf = df.lazy()
    for code, (_, hcol) in enumerate(ENTITY_TYPES):
        base = lf.filter(pl.col(hcol).is_not_null()).with_columns(
            pl.lit(code, pl.Int8).alias("et"), pl.col(hcol).alias("eh")
        )
        for j in range(n):
            parts.append(base.with_columns(window_starts(pl.col(t_col), config, j).alias("w")))
    return pl.concat(parts, how="vertical").collect(engine=ENGINE)


def entity_names(df: pl.DataFrame, lookup: pl.DataFrame) -> pl.DataFrame:
    """Add ``entity_type`` / ``entity_id`` strings to rows keyed by ``et`` / ``eh``.

    ``lookup`` maps hashes back to strings: columns ``ceh``, ``caller_id``, ``ieh``,
    ``client_ip`` (e.g. the session features).
    """
    lk = lookup.lazy()
    callers = lk.select("ceh", "caller_id").drop_nulls().unique("ceh")
    ips = lk.select("ieh", "client_ip").drop_nulls().unique("ieh")
    out = df.lazy().join(callers, left_on="eh", right_on="ceh", how="left").join(
        ips, left_on="eh", right_on="ieh", how="left"
    )
    return out.with_columns(
        pl.when(pl.col("et") == 0).then(pl.lit("caller_id")).otherwise(pl.lit("client_ip"))
        .alias("entity_type"),
        pl.when(pl.col("et") == 0).then(pl.col("caller_id")).otherwise(pl.col("client_ip"))
        .alias("entity_id"),
    ).drop("caller_id", "client_ip").collect(engine=ENGINE)


def resource_features(
    ev: pl.DataFrame,
    keys: list[str],
    config: DetectorsConfig,
    ids: pl.Series,
    *,
    time_ordered: bool = False,
) -> pl.DataFrame:
    """Id-walking figures per group: longest sequential run and longest dense block.

    Works on the distinct ids of each group and id shape, with the time each was first
    requested. Ids with no other id of the same shape within ``max_step`` can belong to
    no run or block and are dropped first — in ordinary traffic that is nearly all of
    them, which keeps this cheap.

    Parameters
    ----------
    ev
        Rows with the numeric ``keys`` columns and ``th``, ``t``, ``rnum``, ``miss``, ``i``
        (see :func:`prepare_events`).
    keys
        Numeric grouping columns, e.g. ``["sh"]`` or ``["et", "eh", "w"]``.
    config
        Supplies ``enumeration.max_step``.
    ids
        The ``resource_id`` column the ``i`` indices point into (example ids).
    time_ordered
        Unused (kept for callers); first-request times are computed, not assumed.

    Returns
    -------
    polars.DataFrame
        One row per group having a run or block of at least two ids: ``seq_run`` (ids in
        the longest progression: first requests stepping by a constant, or consecutive ids
        first requested in time order whatever came in between), ``seq_step``,
        ``seq_first``/``seq_last`` (example ids), ``seq_first_t``/``seq_last_t``,
        ``seq_miss`` (share of its ids whose lookups missed), ``dense_ids`` (the longest
        block of consecutive ids all requested, in any order) and ``dense_lo``/``dense_hi``.
    """
    del time_ordered
    max_step = config.enumeration.max_step
    gcols = [*keys, "th"]
    # Lazy up to the screened distinct ids (one query), then one query for the blocks and
    # runs: ~20 eager polars calls before, each with a fixed cost on a small live pass.
    r = ev.lazy().filter(pl.col("rnum").is_not_null()).select(*gcols, "t", "rnum", "miss", "i")
    # Cheap hash prefilter: an id can only have a neighbour within max_step (< W = max_step
    # + 1) if it shares a cell of width 2W with another request on one of two grids offset
    # by W (an interval shorter than W crosses at most one boundary of the two grids).
    # Ids failing both are dropped before grouping; the exact neighbour test follows.
    width = 2 * (max_step + 1)
    r = r.filter(
        pl.struct([*gcols, (pl.col("rnum") // width).alias("_b")]).hash(SEED).is_duplicated()
        | pl.struct([*gcols, ((pl.col("rnum") + width // 2) // width).alias("_b")])
        .hash(SEED).is_duplicated()
    )
    u = (
        # One 64-bit key per (group, shape, id): far faster to group than several columns.
        r.group_by(pl.struct([*gcols, "rnum"]).hash(SEED).alias("_k"))
        .agg(
            *[pl.col(c).first() for c in (*gcols, "rnum")],
            pl.col("t").min().alias("ft"),
            pl.col("i").sort_by("t").first().alias("fi"),
            pl.col("miss").any().alias("m"),
        )
        .drop("_k")
        .with_columns(pl.struct(gcols).hash(SEED).alias("g"))
        .sort(["g", "rnum"])
    )
    same_prev = pl.col("g") == pl.col("g").shift(1)
    same_next = pl.col("g") == pl.col("g").shift(-1)
    near = (
        (same_prev & (pl.col("rnum") - pl.col("rnum").shift(1) <= max_step))
        | (same_next & (pl.col("rnum").shift(-1) - pl.col("rnum") <= max_step))
    ).fill_null(False)
    u = u.filter(near).collect(engine=ENGINE)
    empty = {
        **{k: ev.schema[k] for k in keys}, "dense_ids": pl.Int64, "seq_run": pl.Int64,
        "seq_step": pl.Int64, "seq_first_t": pl.Int64, "seq_last_t": pl.Int64,
        "seq_miss": pl.Float64, "seq_first": pl.String, "seq_last": pl.String,
        "dense_lo": pl.String, "dense_hi": pl.String,
    }
    if u.height == 0:
        return pl.DataFrame(schema=empty)
    consec = (same_prev & (pl.col("rnum") == pl.col("rnum").shift(1) + 1)).fill_null(False)
    later = (pl.col("ft") > pl.col("ft").shift(1)).fill_null(False)
    u = u.lazy().with_columns(
        (~consec).cum_sum().alias("_blk"),
        (~(consec & later)).cum_sum().alias("_up"),
        (~(consec & ~later)).cum_sum().alias("_down"),
    )
    first_keys = [pl.col(k).first() for k in keys]
    # Dense block: consecutive ids all requested, in any order (a shuffled walk).
    dense = (
        u.group_by("_blk")
        .agg(
            *first_keys,
            pl.len().alias("dense_ids"),
            pl.col("fi").first().alias("_lo_i"),
            pl.col("fi").last().alias("_hi_i"),
        )
        .sort(["dense_ids", "_blk"], descending=[True, False])
        .group_by(keys, maintain_order=True)
        .first()
        .select([*keys, "dense_ids", "_lo_i", "_hi_i"])
    )
    runs = []
    # Walk: consecutive ids first requested in increasing (decreasing) time order.
    for col, step in (("_up", 1), ("_down", -1)):
        runs.append(
            u.group_by(col)
            .agg(
                *first_keys,
                pl.len().alias("seq_run"),
                pl.col("ft").min().alias("seq_first_t"),
                pl.col("ft").max().alias("seq_last_t"),
                pl.col("fi").sort_by("ft").first().alias("_first_i"),
                pl.col("fi").sort_by("ft").last().alias("_last_i"),
                pl.col("m").mean().alias("seq_miss"),
            )
            .with_columns(pl.lit(step, pl.Int64).alias("seq_step"))
            .drop(col)
        )
    # Run: first requests, in time order, stepping by one constant of at most max_step.
    v = u.sort(["g", "ft", "rnum"])
    same = pl.col("g") == pl.col("g").shift(1)
    d = pl.when(same).then(pl.col("rnum") - pl.col("rnum").shift(1))
    v = v.with_columns(
        pl.when(d.abs().is_between(1, max_step)).then(d).alias("d"),
        pl.col("fi").shift(1).alias("_prev_i"),
        pl.col("ft").shift(1).alias("_prev_t"),
        pl.col("m").shift(1).alias("_prev_m"),
    )
    cont = (
        pl.col("d").is_not_null() & (pl.col("d") == pl.col("d").shift(1)) & same
    ).fill_null(False)
    v = v.with_columns((pl.col("d").is_not_null() & ~cont).cum_sum().alias("_chain"))
    runs.append(
        v.filter(pl.col("d").is_not_null())
        .group_by("_chain")
        .agg(
            *first_keys,
            (pl.len() + 1).alias("seq_run"),
            pl.col("_prev_t").first().alias("seq_first_t"),
            pl.col("ft").last().alias("seq_last_t"),
            pl.col("_prev_i").first().alias("_first_i"),
            pl.col("fi").last().alias("_last_i"),
            ((pl.col("m").sum() + pl.col("_prev_m").first().cast(pl.Int64)) / (pl.len() + 1))
            .alias("seq_miss"),
            pl.col("d").first().alias("seq_step"),
        )
        .drop("_chain")
    )
    cols = [*keys, "seq_run", "seq_first_t", "seq_last_t", "_first_i", "_last_i", "seq_miss",
            "seq_step"]
    best = (
        pl.concat([x.select(cols) for x in runs], how="vertical_relaxed")
        .filter(pl.col("seq_run") >= 2)
        .sort(["seq_run", "seq_first_t", "seq_step", "_first_i"],
              descending=[True, False, True, False])
        .group_by(keys, maintain_order=True)
        .first()
    )
    out = dense.join(best, on=keys, how="full", coalesce=True).collect(engine=ENGINE)
    return out.with_columns(
        pl.col("seq_run").fill_null(1),
        pl.col("seq_miss").fill_null(0.0),
        pl.col("dense_ids").fill_null(0),
        ids.gather(out["_first_i"]).alias("seq_first"),
        ids.gather(out["_last_i"]).alias("seq_last"),
        pl.when(pl.col("dense_ids").fill_null(0) >= 2).then(ids.gather(out["_lo_i"]))
        .alias("dense_lo"),
        pl.when(pl.col("dense_ids").fill_null(0) >= 2).then(ids.gather(out["_hi_i"]))
        .alias("dense_hi"),
    ).drop("_first_i", "_last_i", "_lo_i", "_hi_i")


#: Session feature columns with their meaning (docs and anomaly explanations use these).
SESSION_FEATURES: dict[str, str] = {
    "calls": "calls",
    "distinct_tools": "distinct tools",
    "distinct_resources": "distinct resources",
    "resource_calls": "calls naming a resource",
    "not_found": "not-found results",
    "denied": "denied results",
    "auth_failures": "authentication failures",
    "failed_creds": "distinct failing credentials",
    "distinct_creds": "distinct credentials",
    "total_bytes": "bytes returned",
    "max_bytes": "largest single response (bytes)",
    "beyond_bytes": "bytes returned beyond the largest single response",
    "total_rows": "rows returned",
    "max_rows": "largest single response (rows)",
    "gap_cv": "variation of gaps between calls",
    "calls_per_min": "calls per minute",
    "span_s": "session length (s)",
    "top_tool_share": "share of calls to one tool",
    "max_pages": "distinct pages/cursors of one tool",
    "dup_ratio": "share of identical repeated calls",
    "seq_run": "longest sequential id run",
    "dense_ids": "ids covering a dense range",
}


def _gap_stats_lazy(ev: pl.DataFrame, keys: list[str]) -> pl.LazyFrame:
    """Mean, standard deviation and count of gaps (µs) between consecutive calls per group."""
    cols = [*keys, "t"]
    g = ev.lazy().select(cols)
    # Already in time order (the store returns events by ts): a stable sort on the key is
    # enough and much cheaper than sorting on (key, t).
    g = g.sort(keys, maintain_order=True) if ev["t"].is_sorted() else g.sort(cols)
    same = pl.all_horizontal([pl.col(k) == pl.col(k).shift(1) for k in keys])
    g = g.with_columns(
        pl.when(same).then(pl.col("t") - pl.col("t").shift(1)).cast(pl.Float64).alias("gap")
    )
    return g.group_by(keys).agg(
        pl.col("gap").mean().alias("gap_mean"),
        pl.col("gap").std().alias("gap_std"),
        pl.col("gap").count().alias("n_gaps"),
    )


def session_features(ev: pl.DataFrame, su: pl.DataFrame, config: DetectorsConfig) -> pl.DataFrame:
    """One row per session with every figure the detectors use.

    Parameters
    ----------
    ev
        Prepared events (:func:`prepare_events`).
    su
        Prepared summaries (:func:`prepare_summaries`).
    config
        Detector configuration.

    Returns
    -------
    polars.DataFrame
        Identity columns (``session_id``, ``caller_id``, ``client_ip``, ``server``,
        ``basis`` = events | summary | both, ``s_anomaly``, hashes ``sh``/``ceh``/``ieh``),
        time columns ``first_t`` / ``last_t`` (µs), the figures of
        :data:`SESSION_FEATURES`, ratios ``nf_ratio``, ``denied_ratio``, ``miss_ratio``,
        ``auth_fail_ratio``, and the example columns of :func:`resource_features` plus
        ``top_tool``, ``page_tool``, ``resource_key``.
    """
    authf = pl.col("authf")
    lev = ev.lazy()
    base = lev.group_by("sh").agg(
        pl.col("session_id").first(),
        pl.len().alias("calls"),
        pl.col("t").min().alias("first_t"),
        pl.col("t").max().alias("last_t"),
        pl.col("caller_id").drop_nulls().first(),
        pl.col("client_ip").drop_nulls().first(),
        pl.col("server").drop_nulls().first(),
        pl.col("rh").drop_nulls().n_unique().alias("distinct_resources"),
        pl.col("resource_key").drop_nulls().first().alias("resource_key"),
        pl.col("has_res").sum().alias("resource_calls"),
        pl.col("nf").sum().alias("not_found"),
        pl.col("den").sum().alias("denied"),
        (pl.col("miss") & pl.col("has_res")).sum().alias("res_misses"),
        authf.sum().alias("auth_failures"),
        pl.col("is_error").sum().alias("errors"),
        pl.col("ok").sum().alias("ok_calls"),
        pl.col("bytes").sum().alias("total_bytes"),
        pl.col("bytes").max().alias("max_bytes"),
        pl.col("rows").sum().alias("total_rows"),
        pl.col("rows").max().alias("max_rows"),
        pl.col("duration_ms").mean().alias("mean_duration_ms"),
        pl.col("ch").n_unique().alias("distinct_calls"),
    )
    # Credential hashes are on few events (authenticating calls): count them there only.
    creds = lev.filter(pl.col("crh").is_not_null()).group_by("sh").agg(
        pl.col("crh").filter(authf).n_unique().alias("failed_creds"),
        pl.col("ok").any().alias("_ok_with_cred"),
        pl.col("crh").n_unique().alias("distinct_creds"),
    )
    # One 64-bit key per (session, tool): polars groups a single integer column far
    # faster than a pair of columns.
    tools = (
        lev.group_by(pl.struct("sh", "tlh").hash(SEED).alias("_st"))
        .agg(
            pl.col("sh").first(),
            pl.len().alias("n"),
            pl.col("tool").first(),
            (pl.col("page").drop_nulls().n_unique() + pl.col("cuh").drop_nulls().n_unique())
            .alias("pages"),
            # The tool that failed authentication later succeeded: the caller got in.
            (pl.col("authf").any() & pl.col("ok").any()).alias("_recovered"),
        )
        .group_by("sh")
        .agg(
            pl.len().alias("distinct_tools"),
            pl.col("_recovered").any().alias("auth_recovered"),
            pl.col("tool").sort_by(["n", "tool"], descending=[True, False]).first()
            .alias("top_tool"),
            pl.col("n").max().alias("top_tool_calls"),
            pl.col("tool").sort_by(["pages", "tool"], descending=[True, False]).first()
            .alias("page_tool"),
            pl.col("pages").max().alias("max_pages"),
        )
    )
    # The four aggregations run as one batch of queries (in parallel, one fixed cost), and
    # the assembly below is one lazy query: on a small live pass each eager polars call
    # cost more than its rows.
    base, creds, tools, gaps = (
        x.lazy() for x in pl.collect_all([base, creds, tools, _gap_stats_lazy(ev, ["sh"])],
                                     engine=ENGINE)
    )
    res = resource_features(ev, ["sh"], config, ev["resource_id"],
                            time_ordered=ev["t"].is_sorted()).lazy()
    # Column order as the sessions frame has always had it.
    base = base.join(tools.select("sh", "distinct_tools"), on="sh", how="left").join(
        creds, on="sh", how="left"
    ).with_columns(
        pl.col("failed_creds", "distinct_creds").fill_null(0),
        pl.col("_ok_with_cred").fill_null(False),
    ).select(
        "sh", "session_id", "calls", "first_t", "last_t", "caller_id", "client_ip", "server",
        "distinct_tools", "distinct_resources", "resource_key", "resource_calls", "not_found",
        "denied", "res_misses", "auth_failures", "errors", "ok_calls", "failed_creds",
        "_ok_with_cred", "distinct_creds", "total_bytes", "max_bytes", "total_rows", "max_rows",
        "mean_duration_ms", "distinct_calls",
    )
    feats = (
        base.join(gaps, on="sh", how="left")
        .join(tools.drop("distinct_tools"), on="sh", how="left")
        .join(res, on="sh", how="left")
        .drop("sh")
    )
    # Sessions seen as summaries: merge (the larger figure wins, as in the sessions view).
    feats = feats.join(su.lazy(), on="session_id", how="full", coalesce=True)
    span_ev = (pl.col("last_t") - pl.col("first_t")).cast(pl.Float64) / 1e6
    feats = feats.with_columns(
        pl.when(pl.col("calls").is_null() & pl.col("s_t").is_not_null())
        .then(pl.lit("summary"))
        .when(pl.col("s_t").is_null())
        .then(pl.lit("events"))
        .otherwise(pl.lit("both"))
        .alias("basis"),
        pl.col("s_anomaly").fill_null(False),
        pl.coalesce("caller_id", "s_caller").alias("caller_id"),
        pl.coalesce("client_ip", "s_ip").alias("client_ip"),
        pl.coalesce("server", "s_server").alias("server"),
        pl.coalesce(
            "first_t",
            pl.col("s_t") - (pl.col("s_duration_ms").fill_null(0) * 1000).cast(pl.Int64),
        ).alias("first_t"),
        pl.max_horizontal("last_t", "s_t").alias("last_t"),
        pl.max_horizontal(pl.col("calls").fill_null(0), pl.col("s_calls").fill_null(0))
        .cast(pl.Int64).alias("calls"),
        pl.max_horizontal(
            pl.col("distinct_resources").fill_null(0), pl.col("s_resources").fill_null(0)
        ).cast(pl.Int64).alias("distinct_resources"),
        pl.max_horizontal(pl.col("total_bytes").fill_null(0), pl.col("s_bytes").fill_null(0))
        .cast(pl.Int64).alias("total_bytes"),
        pl.max_horizontal(
            pl.col("auth_failures").fill_null(0), pl.col("s_auth_failures").fill_null(0)
        ).cast(pl.Int64).alias("auth_failures"),
        pl.max_horizontal(span_ev.fill_null(0.0), (pl.col("s_duration_ms") / 1000).fill_null(0.0))
        .alias("span_s"),
    )
    feats = feats.with_columns(
        (pl.col("auth_recovered").fill_null(False) | pl.col("_ok_with_cred").fill_null(False)
         | (pl.col("basis") == "summary") & (pl.col("calls") > 2 * pl.col("auth_failures")))
        .alias("auth_recovered"),
    ).drop("_ok_with_cred")
    zero_int = [
        "distinct_tools", "resource_calls", "not_found", "denied", "res_misses", "errors",
        "ok_calls", "failed_creds", "distinct_creds", "max_bytes", "total_rows", "max_rows",
        "distinct_calls", "top_tool_calls", "max_pages", "dense_ids", "seq_run", "n_gaps",
    ]
    feats = feats.with_columns(
        [pl.col(c).fill_null(0).cast(pl.Int64) for c in zero_int]
        + [pl.col("seq_miss").fill_null(0.0)]
    )
    calls = pl.col("calls").cast(pl.Float64)
    ev_calls = pl.col("distinct_calls")  # >0 only when events exist
    feats = feats.with_columns(
        pl.when(pl.col("n_gaps") >= 3)
        .then(pl.col("gap_std") / pl.col("gap_mean"))
        .otherwise(None)
        .fill_nan(None)
        .alias("gap_cv"),
        (calls / (pl.col("span_s") / 60.0).clip(lower_bound=1.0)).alias("calls_per_min"),
        pl.when(ev_calls > 0).then(pl.col("top_tool_calls") / calls).otherwise(0.0)
        .alias("top_tool_share"),
        pl.when(ev_calls > 0).then(1.0 - ev_calls / calls).otherwise(0.0).alias("dup_ratio"),
        (pl.col("not_found") / calls).fill_nan(0.0).alias("nf_ratio"),
        (pl.col("denied") / calls).fill_nan(0.0).alias("denied_ratio"),
        pl.when(pl.col("resource_calls") > 0)
        .then(pl.col("res_misses") / pl.col("resource_calls"))
        .otherwise(0.0)
        .alias("miss_ratio"),
        (pl.col("auth_failures") / calls).fill_nan(0.0).clip(0.0, 1.0).alias("auth_fail_ratio"),
        (pl.col("total_bytes") - pl.col("max_bytes")).clip(lower_bound=0).alias("beyond_bytes"),
        (pl.col("total_rows") - pl.col("max_rows")).clip(lower_bound=0).alias("beyond_rows"),
        _h("session_id").alias("sh"),
        _h("caller_id").alias("ceh"),
        _h("client_ip").alias("ieh"),
    )
    keep_ids = ["session_id", "caller_id", "client_ip", "server", "basis", "s_anomaly"]
    drop = {"s_t", "s_caller", "s_ip", "s_server", "s_calls", "s_resources", "s_bytes",
            "s_auth_failures", "s_duration_ms", "gap_mean", "gap_std"}
    rest = [c for c in feats.collect_schema().names() if c not in drop and c not in keep_ids]
    return feats.select(keep_ids + rest).sort("session_id").collect(engine=ENGINE)
