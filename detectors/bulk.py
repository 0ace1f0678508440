"""Bulk extraction: far more data than the population — and than the caller itself — pulls.

Three patterns (the strongest decides). When the caller *habitually* scores at alert
level — its typical session over several days already does, like a service account that
exports every night — a session must also be far beyond the caller's own median to alert;
a user who suddenly pulls far more than they ever do is not shielded:

* **sustained volume** — bytes (rows) returned *beyond the single largest response*,
  compared in log units with a robust z-score (median / MAD) against the population
  (combined with the caller's own z-score once established), from *heavy* calls (the
  other calls average ``heavy_factor`` × a typical call). Discounting the largest response
  keeps the person who downloads one big report out; requiring heavy calls keeps the long,
  busy session that piles up volume from ordinary calls out; and *focused* (a share
  ``focus_min`` of the calls to one tool): a person's working day spreads its volume over
  documents, queries, tickets and reports, an extraction asks one resource for it;
* **single response** — one response far beyond the population's largest ones (a
  one-shot dump), with a high absolute floor;
* **pagination sweep** — many distinct pages / offsets / cursors of one tool, returning
  real data: walking a listing to its end is extraction whatever the page size. Only full
  pages count: a page returning under half of what it asked for reached the end of what
  there is (a log follower's reads at growing offsets);
* **named reads** — reads of people's or a business's records returning more than 1 MB
  (seed 001) or ``oversized_min_rows`` records, in heavy, focused calls, whatever their
  tool's baseline (an export tool's typical response is an export), except on a tool whose
  large responses are routine and for records handed on whole to another server;
* **refused exports** — an export of named records refused again and again: an attempt;
* **oversized responses** — calls returning far more (bytes, or records) than their
  (server, tool) typically returns, adding up to ``oversized_min_bytes`` /
  ``oversized_min_rows``: a read is judged by what it returns against what that tool
  returns to everyone else, so a few dumps of a small-response tool count even under the
  sustained-volume floor, while an export tool returning its usual large files does not.

An absolute floor (``min_bytes`` / ``min_rows``) keeps big ratios on tiny volumes out.
Per caller and client address, sessions not explained on their own are summed per
hopping window (each session's largest response discounted), so extraction spread over
many modest sessions still surfaces.
"""

from __future__ import annotations

import math
from typing import Any, Self

import polars as pl
from toolwatch.detectors.base import Detector, FeatureSet, session_frame, union_part
from toolwatch.detectors.baseline import (
    Baseline,
    daily_habits,
    established_rows,
    habits,
    habitual_gate,
    key_hash,
    summary_routine_gate,
    summary_routines,
)
from toolwatch.detectors.entities import IDENTITY_AGGS, KEYS, finish, sessions_of
from toolwatch.detectors.features import ENTITY_TYPES, US_PER_DAY, explode_entities, group_agg
from toolwatch.detectors.scoring import all_of, any_of, band, gate
from toolwatch.detectors.text import clean, duration, num, size
from toolwatch.detectors.tools import _pair_key, annotated

#: Figures with baselines.
_VOL = ["beyond_bytes", "beyond_rows", "max_bytes", "max_pages"]
_EVIDENCE = ["calls", "total_bytes", "max_bytes", "beyond_bytes", "total_rows", "max_rows",
             "beyond_rows", "max_pages", "page_tool", "span_s", "basis", "top_tool", "z_pop",
             "z_combined", "beyond_per_call",
             "z_single", "z_own", "own_n", "own_days", "own_typical_beyond_bytes",
             "own_typical_max_pages", "z_own_day", "own_typical_day_beyond_bytes", "own_days_n",
             "discounted", "habitual", "p_volume", "p_single", "p_sweep", "p_own",
             "p_request", "req_rows", "req_refused", "over_bytes", "over_rows", "over_calls",
             "over_share", "p_oversized", "z_routine", "routine_n", "p_routine",
             "named_bytes", "named_rows", "named_calls", "refused_exports", "p_named",
             "p_refused", "summary_z", "summary_typical", "summary_n"]

#: Figures of the caller's routine with a tool: what its sessions of that kind return.
_ROUTINE = ["total_bytes", "total_rows"]



def established_count(frame: pl.DataFrame, keys: list[str], min_rows: int) -> int:
    """Number of rows :func:`~toolwatch.detectors.baseline.established_rows` would keep,
    in one query over the key columns only (no row is copied)."""
    own = frame.lazy().select(keys).filter(
        pl.all_horizontal([pl.col(k).is_not_null() for k in keys]))
    if min_rows > 1:
        own = own.filter(pl.len().over(key_hash(keys)) >= min_rows)
    return int(own.select(pl.len()).collect(engine="in-memory").item())

def _for_baseline(df: pl.DataFrame) -> pl.DataFrame:
    """Observations that can shape a baseline: volume beyond the largest response only
    exists with two calls or more, and 0 rows means 'not logged'."""
    multi = pl.col("calls") >= 2
    return df.with_columns(
        pl.when(multi).then(pl.col("beyond_bytes")).alias("beyond_bytes"),
        pl.when(multi & (pl.col("beyond_rows") > 0)).then(pl.col("beyond_rows"))
        .alias("beyond_rows"),
    )


#: Arguments that say how many records a call asks for (a page size, a row limit).
_LIMIT_KEYS = ("limit", "pageSize", "page_size", "per_page", "maxResults", "max_results")
_LIMIT_RE = r'"(?:' + "|".join(_LIMIT_KEYS) + r')"\s*:\s*"?(\d{1,12})\b'


def _requested(fs: FeatureSet) -> pl.DataFrame:
    """Per session: the most records one call asked for (``req_rows``, from a row-limit
    or page-size argument) and whether every call asking for that many was refused
    (``req_refused``). Volume is records as much as bytes, and asking counts: a server
    that caps results refuses the dump, it does not make the request harmless."""
    ev = fs.events
    if ev.height == 0:
        return pl.DataFrame(schema={"sh": ev.schema.get("sh", pl.UInt64), "req_rows": pl.Int64,
                                    "req_refused": pl.Boolean})
    # Only the calls naming a limit key can match (one Aho-Corasick pass, the regular
    # expression then runs on those alone).
    keys = [f'"{k}"' for k in _LIMIT_KEYS]
    return (
        ev.lazy().select("sh", "ok", "args").filter(pl.col("args").str.contains_any(keys))
        .select("sh", "ok", pl.col("args").str.extract(_LIMIT_RE, 1)
                .cast(pl.Int64, strict=False).alias("_lim"))
        .filter(pl.col("_lim").is_not_null())
        .group_by("sh")
        .agg(pl.col("_lim").max().alias("req_rows"),
             pl.col("ok").filter(pl.col("_lim") == pl.col("_lim").max()).not_().all()
             .alias("req_refused"))
        .collect(engine="in-memory")
    )


#: Arguments that say how much one read asks for: records (a row limit, a page size) or
#: bytes (a read length). A read returning far less than it asked for reached the end of
#: what there is (see :func:`_reads`).
_ASK_KEYS = (*_LIMIT_KEYS, "length", "max_bytes", "maxBytes", "bytes", "size", "count")
_ASK_RE = r'"(?:' + "|".join(_ASK_KEYS) + r')"\s*:\s*"?(\d{1,12})\b'

_READS_SCHEMA = {"full_pages": pl.Int64, "named_bytes": pl.Int64, "named_rows": pl.Int64,
                 "named_calls": pl.Int64, "named_heavy_calls": pl.Int64,
                 "named_share": pl.Float64,
                 "refused_exports": pl.Int64, "handed_share": pl.Float64}


def _reads(fs: FeatureSet, export_terms: list[str], short_share: float,
           typ: pl.DataFrame | None = None, heavy_share: float = 0.0,
           heavy_bytes: float = 0.0, heavy_rows: float = 0.0,
           record_terms: list[str] | None = None) -> pl.DataFrame:
    """Per session, from its calls:

    * ``full_pages`` — distinct pages / offsets / cursors of one tool (the most of any
      tool) among the calls that did *not* come back short: a call asking for N records
      (``limit``, ``pageSize`` …) or N bytes (``length`` …) and receiving under
      ``short_share`` of it reached the end of what there is. Walking a listing returns
      full pages until the last one; a follower of a growing log reads at ever larger
      offsets and gets back only the few lines written since its last read — every page
      short. A call without a size argument (or without a logged size) counts as full.
    * ``named_bytes`` / ``named_rows`` / ``named_calls`` / ``named_share`` — what the
      successful reads of people's or a business's records (``data``) or of sensitive
      places returned, how many such calls and their share of the session's calls — not
      counting the tools whose large responses are routine for their population (at least
      ``heavy_share`` of their sessions hold one, see :func:`tool_typicals`: a query tool
      serving dashboards and a data team's exports), which the oversized pattern judges
      against what they typically return; ``named_heavy_calls``: those of them returning
      ``heavy_bytes`` or ``heavy_rows`` or more (pulls, not lookups).
    * ``refused_exports`` — refused calls to a tool whose name says it exports / dumps
      (``export_terms``) named records, in a session where no such call succeeded.
    """
    ev = annotated(fs)
    if ev.height == 0:
        return pl.DataFrame(schema={"sh": fs.events.schema.get("sh", pl.UInt64),
                                    **_READS_SCHEMA})
    # Each figure is computed on the only calls it can count, not on every event: pages
    # on the calls naming a page or cursor, named reads and refused exports on the calls
    # of named records, handed-on records on the successful calls returning records —
    # and no join of every call back to its marks (measured on 1M events: half the CPU
    # of one pass over every call carrying every flag).
    lf = ev.lazy().with_row_index("_i").select(
        "_i", "sh", "server", "t", "tool", "ok", "page", "cuh", "args", "bytes", "data",
        "sensitive",
        pl.col("rows").fill_null(0).alias("r"))
    ask = pl.col("_ask")
    got = pl.when(pl.col("r") > 0).then(pl.col("r")).otherwise(pl.col("bytes"))
    short = (ask.is_not_null() & got.is_not_null() & (ask > 0)
             & (got < short_share * ask)).fill_null(False)
    pages = (
        lf.filter(pl.col("page").is_not_null() | pl.col("cuh").is_not_null())
        # The argument parsed once, as a column: inside the filter each use of the
        # expression ran the regular expression again.
        .with_columns(pl.col("args").str.extract(_ASK_RE, 1).cast(pl.Int64, strict=False)
                      .alias("_ask"))
        .filter(~short)
        .group_by("sh", "tool")
        .agg((pl.col("page").drop_nulls().n_unique() + pl.col("cuh").drop_nulls().n_unique())
             .alias("_p"))
        .group_by("sh").agg(pl.col("_p").max().cast(pl.Int64).alias("full_pages"))
    )
    # Reads of named records (``_nr0``: not on a routine tool; ``nr``: and successful);
    # the records handed on whole (below) are taken back out of these sums.
    # Named (``data`` or ``sensitive``): what refused exports count. Whose records
    # (``_rec``): what the named-read volume counts. An export or dump says how much
    # leaves, not what: a report exported as a PDF is a document, get_customer_export
    # returns people. Such a read counts when its tool or arguments name records
    # (record_terms), or a sensitive place.
    named = pl.col("data").fill_null(False) | pl.col("sensitive").fill_null(False)
    # The tool's name names the records (listCustomers): see also not_routine below.
    by_name = (pl.col("tool").fill_null("").str.contains_any(record_terms,
                                                            ascii_case_insensitive=True)
               if record_terms else pl.lit(False))
    rec = ((by_name
            | pl.col("args").fill_null("").str.contains_any(record_terms,
                                                            ascii_case_insensitive=True)
            | ~pl.col("data").fill_null(False))
           if record_terms else pl.lit(True))
    hot = None
    if typ is not None and typ.height and heavy_share > 0:
        hot = typ.lazy().filter(pl.col("heavy_share") >= heavy_share).select(
            "server", "tool", pl.lit(True).alias("_routine"))

    # A tool whose *name* names the records (listCustomers, get_customer_export) returns
    # them by design: its reads count whatever its population pulls. Only a generic tool
    # named by its arguments (run_query, "SELECT * FROM orders") whose large responses
    # are routine is judged against what it returns (p_oversized) instead.
    def not_routine(part: pl.LazyFrame) -> pl.LazyFrame:
        if hot is None:
            return part.with_columns(pl.lit(True).alias("_nr0"))
        return part.join(hot, on=["server", "tool"], how="left").with_columns(
            (~pl.col("_routine").fill_null(False) | by_name).alias("_nr0"))

    exportish = (pl.col("tool").fill_null("").str.to_lowercase()
                 .str.contains_any([t.lower() for t in export_terms])
                 if export_terms else pl.lit(False))
    nr = pl.col("ok") & pl.col("_nr0") & pl.col("_rec")
    b = pl.col("bytes").fill_null(0)
    # A pull, not a lookup: heavy_bytes or more (heavy_factor x the population's typical
    # call; 0: every call counts), or heavy_rows records where the size is not logged
    # (a typical call returns a record or two, so records alone over-count small lists).
    heavy = pl.when(b > 0).then(b >= heavy_bytes).otherwise(
        pl.col("r") >= heavy_rows if heavy_rows > 0 else pl.lit(True))
    named_per = (
        not_routine(lf.filter(named).with_columns(rec.alias("_rec"))).group_by("sh").agg(
            b.filter(nr).sum().cast(pl.Int64).alias("_nb"),
            pl.col("r").filter(nr).sum().cast(pl.Int64).alias("_nrw"),
            (nr & heavy).sum().cast(pl.Int64).alias("named_heavy_calls"),
            nr.sum().cast(pl.Int64).alias("_nc"),
            pl.when((exportish & pl.col("ok")).any()).then(0)
            .otherwise((exportish & ~pl.col("ok")).sum()).cast(pl.Int64)
            .alias("refused_exports"))
    )
    all_per = lf.group_by("sh").agg(
        pl.len().alias("_n"),
        pl.col("r").filter(pl.col("ok")).sum().cast(pl.Int64).alias("_ok_r"))
    # Records handed on whole: a later call of the session to another tool or server
    # reports the same number of records (a load of what was read into the warehouse, a
    # query result exported to a table). A pipeline
    # moving records between systems is a flow — where they land is cross_server_flow's
    # to judge — not records pulled out by the caller.
    # Another tool (or server): pages of one listing all return the same page size.
    # Per (session, record count), by aggregation rather than pairing calls (a session may
    # read thousands of pages of one size): a group holding calls of two tools or more;
    # the calls of the tool that came first are the reads handed on, the others the loads.
    pair = pl.struct(pl.col("server").fill_null(""), pl.col("tool").fill_null("")).hash(0x9A1D)
    okr_rows = lf.filter(pl.col("ok") & (pl.col("r") > 0)).with_columns(pair.alias("_pt"))
    groups = okr_rows.group_by("sh", "r").agg(
        pl.col("_pt").n_unique().alias("_n"),
        pl.col("_pt").sort_by("t", "_i").first().alias("_first_pt"),
    ).filter(pl.col("_n") >= 2).drop("_n")
    load = pl.col("_pt") != pl.col("_first_pt")
    hnr = named & pl.col("_nr0") & rec
    handed_per = not_routine(okr_rows.join(groups, on=["sh", "r"], how="inner")).group_by(
        "sh").agg(
        b.filter(hnr).sum().cast(pl.Int64).alias("_hb"),
        pl.col("r").filter(hnr).sum().cast(pl.Int64).alias("_hr"),
        hnr.sum().cast(pl.Int64).alias("_hc"),
        pl.col("r").filter(~load).sum().cast(pl.Int64).alias("_src_r"),
        pl.col("r").filter(load).sum().cast(pl.Int64).alias("_load_r"),
    )
    # One after the other: run side by side (collect_all) on a busy two-core machine
    # their threads wait on each other, and the waiting costs CPU (measured on 1M
    # events: ~30% more for these four).
    all_per, named_per, handed_per, pages = (
        q.collect(engine="in-memory") for q in (all_per, named_per, handed_per, pages))
    zero = {c: 0 for c in ("_nb", "_nrw", "_nc", "refused_exports", "_hb", "_hr", "_hc",
                           "_src_r", "_load_r", "full_pages", "named_heavy_calls")}
    per = (all_per.join(named_per, on="sh", how="left")
           .join(handed_per, on="sh", how="left").join(pages, on="sh", how="left")
           .with_columns(pl.col(c).fill_null(v) for c, v in zero.items()))
    # The share of the records the session read that it handed on whole (the loads
    # themselves aside): all of them, and the session is a pipeline (see handed_share).
    calls = pl.col("_nc") - pl.col("_hc")
    return per.select(
        "sh",
        pl.col("full_pages"),
        (pl.col("_nb") - pl.col("_hb")).alias("named_bytes"),
        (pl.col("_nrw") - pl.col("_hr")).alias("named_rows"),
        calls.alias("named_calls"),
        pl.col("named_heavy_calls"),
        (calls / pl.col("_n")).cast(pl.Float64).alias("named_share"),
        pl.col("refused_exports"),
        (pl.col("_src_r") / (pl.col("_ok_r") - pl.col("_load_r")).clip(lower_bound=1))
        .cast(pl.Float64).alias("handed_share"),
    ).select("sh", *_READS_SCHEMA)


_OVER_SCHEMA = {"over_bytes": pl.Int64, "over_rows": pl.Int64, "over_calls": pl.Int64,
                "over_share": pl.Float64}
#: Volume beyond the largest response of the calls that can count as extraction (see
#: :func:`_oversized`): not ordinary reads of a tool whose large responses are routine.
_NAMED_SCHEMA = {"named_beyond_bytes": pl.Int64, "named_beyond_rows": pl.Int64}


def _big(factor: float, pop_b: float, pop_r: float) -> pl.Expr:
    """A call returning at least ``factor`` times its tool's typical response (``typ_b`` /
    ``typ_r``, else the population's typical call), in bytes or in records."""
    tb = pl.coalesce(pl.col("typ_b"), pl.lit(pop_b or None, pl.Float64))
    tr = pl.coalesce(pl.col("typ_r"), pl.lit(pop_r or None, pl.Float64))
    return ((pl.col("bytes") >= factor * tb).fill_null(False)
            | ((pl.col("rows") > 0) & (pl.col("rows") >= factor * tr)).fill_null(False))


def tool_typicals(events: pl.DataFrame, min_sessions: int,
                  factor: float) -> tuple[pl.DataFrame, float, float]:
    """The typical (median) response of each (server, tool) called in at least
    ``min_sessions`` sessions, in bytes (``typ_b``) and records (``typ_r``); the share of
    its sessions holding a call ``factor`` times that large (``heavy_share``: a query
    tool serving both dashboards and analysts' exports has many, a document store
    almost none); and the population's typical call (bytes, records) for the others.

    Only successful calls with a logged size count (0 rows means 'not logged')."""
    empty = pl.DataFrame(schema={"server": pl.String, "tool": pl.String, "typ_b": pl.Float64,
                                 "typ_r": pl.Float64, "heavy_share": pl.Float64})
    if events.height == 0 or factor <= 0:
        return empty, 0.0, 0.0
    ok = events.lazy().filter(pl.col("ok")).select("sh", "server", "tool", "bytes", "rows")
    pop = ok.select(pl.col("bytes").filter(pl.col("bytes") > 0).median().alias("b"),
                    pl.col("rows").filter(pl.col("rows") > 0).median().alias("r")
                    ).collect(engine="in-memory")
    pop_b, pop_r = float(pop["b"][0] or 0.0), float(pop["r"][0] or 0.0)
    # Everything per pair on one 64-bit key, hashed once: at a million distinct tools the
    # string group-by with two medians per pair was analyze's peak, and the string join
    # and group-bys of the heavy shares were a third of this function's CPU. (A pair
    # with a null server or tool never had a share: the string join left it out.)
    keyed = ok.filter(pl.col("server").is_not_null() & pl.col("tool").is_not_null()).select(
        _pair_key().alias("_k"), "server", "tool", "sh", "bytes", "rows"
    ).collect(engine="in-memory").lazy()
    # Medians only for the pairs in enough sessions.
    many = (keyed.group_by("_k").agg(pl.col("sh").n_unique().alias("_n"))
            .filter(pl.col("_n") >= min_sessions))
    typ = (
        keyed.join(many, on="_k", how="semi").group_by("_k")
        .agg(pl.col("server").first(), pl.col("tool").first(),
             pl.col("bytes").filter(pl.col("bytes") > 0).median().cast(pl.Float64)
             .alias("typ_b"),
             pl.col("rows").filter(pl.col("rows") > 0).median().cast(pl.Float64)
             .alias("typ_r"))
        .collect(engine="in-memory")
    )
    if typ.height == 0:
        return empty, pop_b, pop_r
    heavy = (
        keyed.join(typ.lazy().select("_k", "typ_b", "typ_r"), on="_k", how="inner")
        .group_by("_k", "sh").agg(_big(factor, 0.0, 0.0).any().alias("_heavy"))
        .group_by("_k").agg(pl.col("_heavy").mean().cast(pl.Float64).alias("heavy_share"))
    )
    return (typ.lazy().join(heavy, on="_k")
            .select(empty.columns).collect(engine="in-memory")), pop_b, pop_r


def _oversized(fs: FeatureSet, typ: pl.DataFrame | None, pop_b: float, pop_r: float,
               factor: float, heavy_share: float) -> pl.DataFrame:
    """Per session: bytes and records returned by *oversized* calls — at least ``factor``
    times the typical response of their (server, tool), or of the population's typical
    call for a tool without a baseline of its own — and how many such calls.

    On a tool where such responses are routine (at least ``heavy_share`` of its sessions
    hold one: a query tool some teams export with), or without a baseline of its own,
    size alone says nothing: only reads of people's or a business's records (``data``) or
    of sensitive places count there.

    Also, per session, ``named_beyond_bytes`` / ``named_beyond_rows``: the volume beyond
    the largest response of the calls that can count as extraction at all — every call
    but the ordinary reads (no named records, no sensitive place) of a tool whose large
    responses are routine for its population (the analysts' aggregate queries on a query
    tool). The sustained-volume pattern reads these (see :meth:`BulkExtractionDetector.
    _inputs`): a read is judged by what it returns and by its tool's peers."""
    ev = fs.events
    if ev.height == 0 or factor <= 0 or typ is None or (pop_b <= 0 and typ.height == 0):
        return pl.DataFrame(schema={"sh": ev.schema.get("sh", pl.UInt64), **_OVER_SCHEMA,
                                    **_NAMED_SCHEMA})
    # A tool without a baseline of its own (seen in few sessions) is compared with the
    # population's typical call, which says little about *that* tool (an account record
    # may always be 400 kB): there too only named records count.
    routine = pl.col("heavy_share").is_null() | (pl.col("heavy_share") >= heavy_share)
    named = pl.col("data").fill_null(False) | pl.col("sensitive").fill_null(False)
    big = pl.col("ok") & _big(factor, pop_b, pop_r) & (~routine | named)
    # Peer-routine: a known tool whose large responses are routine, read without naming
    # records. (A tool without a baseline of its own still counts for volume.)
    countable = ~((pl.col("heavy_share") >= heavy_share).fill_null(False) & ~named)
    cb = pl.col("bytes").fill_null(0).filter(countable)
    cr = pl.col("rows").fill_null(0).filter(countable)
    calls = (
        annotated(fs).lazy()
        # On a 64-bit (server, tool) key, not the two strings: a million distinct tools.
        .select("sh", _pair_key().alias("_k"), "ok", "bytes", "rows", "data", "sensitive")
        .join(typ.lazy().filter(pl.col("server").is_not_null() & pl.col("tool").is_not_null())
              .select(_pair_key().alias("_k"), pl.exclude("server", "tool")),
              on="_k", how="left", maintain_order="left")
        .with_columns(big.alias("_big"))
        .collect(engine="in-memory")
    )
    named_q = calls.lazy().group_by("sh").agg(
        (cb.sum() - cb.max().fill_null(0)).cast(pl.Int64).alias("named_beyond_bytes"),
        (cr.sum() - cr.max().fill_null(0)).cast(pl.Int64).alias("named_beyond_rows"))
    over_q = (
        calls.lazy()
        # Only sessions with an oversized call get oversized figures (the others: null):
        # drop them before the per-(session, tool) window (a million distinct tools are a
        # million groups).
        .filter(pl.col("_big").any().over("sh"))
        # The calls to a tool that returned an oversized response: an extraction asks
        # that tool again and again; a working session has a report among many reads.
        .with_columns(pl.col("_big").any().over("sh", "_k").alias("_big_tool"))
        .group_by("sh")
        .agg(pl.col("bytes").filter(pl.col("_big")).fill_null(0).sum().cast(pl.Int64)
             .alias("over_bytes"),
             pl.col("rows").filter(pl.col("_big")).fill_null(0).sum().cast(pl.Int64)
             .alias("over_rows"),
             pl.col("_big").sum().cast(pl.Int64).alias("over_calls"),
             pl.col("_big_tool").mean().cast(pl.Float64).alias("over_share"))
    )
    # One after the other (see _reads): cheaper in CPU than the two run side by side.
    named, over = named_q.collect(engine="in-memory"), over_q.collect(engine="in-memory")
    return named.join(over, on="sh", how="left").select(
        "sh", *_OVER_SCHEMA, *_NAMED_SCHEMA)


def _beyond_reports(fs: FeatureSet, every: int) -> pl.DataFrame:
    """Sessions whose volume counts beyond their ``1 + calls // every`` largest responses.

    A long working session may hold a report or an export now and then (one per
    ``every`` calls); those are discounted like the single largest response of any
    session, so a long, busy session is judged by its ordinary calls. Only sessions with
    at least ``2 * every`` calls change (``discounted`` > 1); the figures never grow.
    """
    s = fs.sessions
    if every <= 0 or fs.events.height == 0 or s.height == 0:
        return s.with_columns(pl.lit(1, pl.Int64).alias("discounted"))
    long = s.lazy().select("sh", "calls").filter(pl.col("calls") >= 2 * every).select(
        "sh", (1 + pl.col("calls") // every).cast(pl.Int64).alias("_k")).collect(
        engine="in-memory")
    if long.height == 0:
        return s.with_columns(pl.lit(1, pl.Int64).alias("discounted"))
    k_max = int(long["_k"].max())  # type: ignore[arg-type]
    top = (
        fs.events.select("sh", pl.col("bytes").fill_null(0), pl.col("rows").fill_null(0))
        .join(long, on="sh", how="semi")
        .group_by("sh")
        .agg(pl.col("bytes").sum().alias("_sum_b"), pl.col("rows").sum().alias("_sum_r"),
             # sort + head: top_k inside a group-by returned wrong values (polars 2.1).
             pl.col("bytes").sort(descending=True).head(k_max).alias("_tb"),
             pl.col("rows").sort(descending=True).head(k_max).alias("_tr"))
        .join(long, on="sh")
        .select(
            "sh", "_k",
            (pl.col("_sum_b") - pl.col("_tb").list.head(pl.col("_k")).list.sum())
            .clip(lower_bound=0).alias("_bb"),
            (pl.col("_sum_r") - pl.col("_tr").list.head(pl.col("_k")).list.sum())
            .clip(lower_bound=0).alias("_br"),
        )
    )
    return s.join(top, on="sh", how="left").with_columns(
        pl.min_horizontal(pl.col("beyond_bytes"), pl.col("_bb")).alias("beyond_bytes"),
        pl.when(pl.col("_br").is_not_null() & (pl.col("beyond_rows") > 0))
        .then(pl.min_horizontal(pl.col("beyond_rows"), pl.col("_br")))
        .otherwise(pl.col("beyond_rows")).alias("beyond_rows"),
        pl.col("_k").fill_null(1).cast(pl.Int64).alias("discounted"),
    ).drop("_k", "_bb", "_br")


def _daily_max(df: pl.DataFrame) -> pl.DataFrame:
    """One row per (caller, UTC day): the day's largest value of each volume figure."""
    day = (pl.col("first_t") // US_PER_DAY) * US_PER_DAY
    return group_agg(
        df.filter(pl.col("caller_id").is_not_null()).with_columns(day.alias("_day")),
        ["caller_id", "_day"],
        *[pl.col(c).max() for c in _VOL],
    ).rename({"_day": "first_t"})


#: Session columns the entity windows sum (see :func:`_entity_windows`).
_WINDOW_COLS = ["first_t", "last_t", "sh", "ceh", "ieh", "calls", "total_bytes", "max_bytes",
                "total_rows", "max_rows", "max_pages", "beyond_bytes", "beyond_rows"]


def _entity_windows(sessions: pl.DataFrame, config: Any) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Sessions summed per (entity type, entity, window), assigned by their first call.

    Returns the aggregated windows and the exploded session rows behind them.
    """
    # Only the sessions that walked a listing themselves (pages_lo distinct pages or more)
    # feed the sweep's volume floor: on a shared address (a corporate NAT), one caller's
    # small crawl plus other callers' ordinary reads is not a sweep that returned data —
    # the crawl is a scraping loop, the reads are nobody's extraction.
    swept = pl.col("max_pages").fill_null(0) >= config.bulk_extraction.pages_lo
    narrow = sessions.select(*_WINDOW_COLS,
                             pl.when(swept).then(pl.col("total_bytes")).otherwise(0)
                             .alias("sweep_bytes"),
                             pl.when(swept).then(pl.col("total_rows")).otherwise(0)
                             .alias("sweep_rows"))
    ee = explode_entities(narrow, config, t_col="first_t")
    agg = group_agg(
        ee, KEYS,
        pl.len().alias("n_sessions"),
        pl.col("calls").sum(),
        pl.col("total_bytes").sum(),
        pl.col("max_bytes").max(),
        pl.col("total_rows").sum(),
        pl.col("max_rows").max(),
        pl.col("max_pages").max(),
        # Each session may download one big thing (a report): only what came beyond each
        # session's largest response adds up.
        pl.col("beyond_bytes").sum(),
        pl.col("beyond_rows").sum(),
        pl.col("sweep_bytes").sum(),
        pl.col("sweep_rows").sum(),
        pl.col("first_t").min(),
        pl.col("last_t").max(),
        *IDENTITY_AGGS,
    )
    return agg, ee


class BulkExtractionDetector(Detector):
    """Flags sessions and entity windows pulling unusual volumes."""

    name = "bulk_rules"
    category = "bulk_extraction"
    config_key = "bulk_extraction"
    summary = "Sustained volume, one-shot dumps and pagination sweeps vs population and self."

    def fit(self, history: FeatureSet) -> Self:
        """Learn population and per-caller (and per-entity-window) volume baselines."""
        cfg = self.config
        mk = {"min_rows": cfg.baseline_min_sessions, "min_days": cfg.baseline_min_days,
              "min_mad": cfg.baseline_min_mad}
        # Session volumes count beyond the largest response — and, in long sessions, beyond
        # one report per report_every_calls calls.
        # What each (server, tool) typically returns: a read is judged against its tool.
        self.tool_typ_, self.pop_call_b_, self.pop_call_r_ = tool_typicals(
            history.events, self.settings.tool_min_sessions, self.settings.tool_factor)
        sessions = self._inputs(history)
        # Batch mode scores the sessions it fits on: score() reuses these inputs (their
        # per-call passes over every event are a fifth of the detector's CPU). A live pass
        # fits on history + batch (FeatureSet.union) and scores the batch: its sessions'
        # inputs are the last rows of these (see _batch_inputs).
        self._inputs_cache = (history.sessions, sessions)
        self._union_inputs = (union_part(history, annotation=True), sessions)
        # The baselines read a handful of columns: select them before the filters and
        # group-bys, which would otherwise copy all ~60 session feature columns.
        # The population's and callers' norms are what sessions pull (_pulled_*): the
        # volume a session's patterns count (without a routine tool's unnamed reads) is
        # compared with them, never with a norm lowered by the same discount.
        narrow = _for_baseline(sessions.select(
            "caller_id", "first_t", "calls",
            pl.col("_pulled_bytes").alias("beyond_bytes"),
            pl.col("_pulled_rows").alias("beyond_rows"), "max_bytes", "max_pages"))
        self.session_baseline_ = Baseline(_VOL, ["caller_id"], **mk).fit(narrow)
        multi = sessions.lazy().select("calls", pl.col("_pulled_bytes").alias("beyond_bytes"),
                                       pl.col("_pulled_rows").alias("beyond_rows")).filter(
            pl.col("calls") >= 2).collect(engine="in-memory")
        typ = (multi["beyond_bytes"] / (multi["calls"] - 1)).median() if multi.height else None
        self.typical_call_bytes_ = float(typ) if typ else None  # type: ignore[arg-type]
        self.typical_call_sessions_ = multi.height
        # The same in records, over the sessions whose servers log them: a server that
        # logs rows but no sizes is judged by its records.
        with_rows = multi.filter(pl.col("beyond_rows") > 0)
        typ_r = ((with_rows["beyond_rows"] / (with_rows["calls"] - 1)).median()
                 if with_rows.height else None)
        self.typical_call_rows_ = float(typ_r) if typ_r else None  # type: ignore[arg-type]
        hk = {"min_rows": cfg.baseline_min_sessions,
              "min_days": max(cfg.baseline_min_days, cfg.habit_min_days)}
        # A caller's usual *heaviest session of a day* (one row per active day): what a
        # habitual caller must be far beyond. A person whose every working day holds one
        # session of downloads, next to many small sessions on other servers, is compared
        # with those downloads, not with its median session.
        self.day_baseline_ = Baseline(_VOL, ["caller_id"], **mk).fit(_daily_max(narrow))
        # The caller's routine with each tool: the volume of its sessions whose main tool
        # it is (0 means 'not logged'). A recurring export is judged against the earlier
        # runs of that export, not against the caller's other, smaller work.
        self.routine_baseline_ = Baseline(_ROUTINE, ["caller_id", "top_tool"], **mk).fit(
            sessions.lazy().select(
                "caller_id", "top_tool", "first_t",
                *[pl.when(pl.col(c) > 0).then(pl.col(c)).alias(c) for c in _ROUTINE])
            .filter(pl.col("top_tool").is_not_null()).collect(engine="in-memory"))
        # The habits below only read callers with at least min_rows sessions (habits() and
        # daily_habits() drop the others first, by the same established_rows), and a
        # session's volume score depends on its own row only: score those sessions. When
        # they are most of the history (batch mode fits on the very sessions it then
        # scores), score them all and keep the result for score(); a live pass, whose
        # short history rarely holds an established caller, mostly skips the scoring.
        n_known = established_count(sessions, ["caller_id"], hk["min_rows"])
        self._volume_cache = None
        if 2 * n_known >= sessions.height:
            volume = self._score_volume(sessions, self.session_baseline_, self.day_baseline_)
            self._volume_cache = (history.sessions, volume)
        elif n_known:
            volume = self._score_volume(
                established_rows(sessions, ["caller_id"], hk["min_rows"]),
                self.session_baseline_, self.day_baseline_)
        else:
            volume = None
        # Habitual per session (the nightly export: every session is the export) or per
        # active day (its typical day holds a session near alert level, however many small
        # sessions surround it).
        if volume is None:
            self.habit_ = pl.DataFrame(schema={"caller_id": sessions.schema["caller_id"],
                                               "habit_score": pl.Float64})
        else:
            self.habit_ = pl.concat([
                habits(volume, "_raw", ["caller_id"], **hk),
                daily_habits(volume, "_raw", ["caller_id"], **hk).with_columns(
                    pl.col("habit_score") + self.settings.habit_margin),
            ], how="vertical_relaxed").group_by("caller_id").agg(pl.col("habit_score").max())
        # A routine: the caller's typical session with a main tool already scores at alert
        # level (the recurring export), over baseline_min_days days. Only then is a
        # session compared with that routine: a person whose usual searches are small
        # and who suddenly pulls 50x as much with the same tool has no such routine.
        rk = {"min_rows": cfg.baseline_min_sessions, "min_days": cfg.baseline_min_days}
        self.routine_habit_ = (
            habits(volume.filter(pl.col("top_tool").is_not_null()), "_raw",
                   ["caller_id", "top_tool"], **rk) if volume is not None else None)
        # Summary-only sessions a caller or client address writes all day (a sync service
        # its server marks SESSION_ANOMALY every run): their totals are its workload, and
        # only a session far beyond them alerts (summary_routines). Scored on their own:
        # the multi-day habits above never see a one-day batch's service. Heavy by the
        # seed's own measure: the typical one returns named_min_bytes (1 MB) or more (its
        # score varies with figures a summary barely has: only some of them alert).
        summ = sessions.filter(pl.col("basis") == "summary")
        summ_v = (self._score_volume(summ, self.session_baseline_, self.day_baseline_)
                  if summ.height and cfg.summary_routine_sessions else None)
        self.summary_routine_ = {
            key: summary_routines(
                summ_v, "_raw", "total_bytes", [key],
                min_rows=cfg.summary_routine_sessions, min_hours=cfg.summary_routine_hours,
                min_mad=cfg.baseline_min_mad, threshold=0.0,
                value_min=float(self.settings.named_min_bytes),
                max_spread=cfg.summary_routine_spread)
            for key in ("caller_id", "client_ip")} if summ_v is not None else {}
        self.entity_routine_: dict[str, pl.DataFrame] = {}
        self.entity_baselines_: dict[str, Baseline] = {}
        self.entity_habits_: dict[str, pl.DataFrame] = {}
        self._windows_cache = None
        if self.settings.entity and history.sessions.height:
            # Windows sum the sessions' volume as the sessions count it (_inputs): beyond
            # their largest responses, without a routinely heavy tool's unnamed reads.
            win, ee = _entity_windows(sessions, cfg)
            # A live backlog pass (and analyze without history) fits on the very sessions
            # it then scores: score() reuses these windows when no session is set aside.
            self._windows_cache = (history.sessions, win, ee)
            for code, (etype, _) in enumerate(ENTITY_TYPES):
                part = win.filter(pl.col("et") == code)
                bl = Baseline(_VOL, ["et", "eh"], **mk).fit(_for_baseline(part))
                self.entity_baselines_[etype] = bl
                # As above: only entities with min_rows windows can have a habit.
                known = (established_rows(part, ["et", "eh"], hk["min_rows"])
                         if established_count(part, ["et", "eh"], hk["min_rows"]) else None)
                empty = pl.DataFrame(schema={"et": part.schema["et"], "eh": part.schema["eh"],
                                             "habit_score": pl.Float64})
                scored_w = (self._score_volume(known, bl)
                            if known is not None and known.height else None)
                self.entity_habits_[etype] = (
                    habits(scored_w, "_raw", ["et", "eh"], **hk) if scored_w is not None
                    else empty)
                self.entity_routine_[etype] = (
                    habits(scored_w, "_raw", ["et", "eh"], **rk) if scored_w is not None
                    else empty)
        self.fitted_ = True
        return self

    def _inputs(self, fs: FeatureSet) -> pl.DataFrame:
        """Session features plus the per-call figures the patterns read: volume beyond
        the largest responses, records requested, oversized responses."""
        # A model saved before the tool baselines existed has none: no oversized figures.
        typ = getattr(self, "tool_typ_", None)
        over = _oversized(fs, typ, getattr(self, "pop_call_b_", 0.0),
                          getattr(self, "pop_call_r_", 0.0), self.settings.tool_factor,
                          self.settings.tool_heavy_share)
        b = self.settings
        out = _beyond_reports(fs, b.report_every_calls).join(
            _requested(fs), on="sh", how="left").join(over, on="sh", how="left").join(
            _reads(fs, b.export_terms, b.short_page_share, typ, b.tool_heavy_share,
                   b.heavy_factor * (getattr(self, "pop_call_b_", 0.0) or 0.0),
                   b.heavy_factor * (getattr(self, "pop_call_r_", 0.0) or 0.0),
                   [t for t in self.config.tools.data_terms
                    if not any(x.lower() in t.lower() for x in b.export_terms)]),
            on="sh", how="left")
        # A pagination sweep counts the pages that came back full (see _reads): a log
        # follower's reads at growing offsets, each returning the little written since the
        # last one, are not a listing walked. (null: no per-call figures.)
        out = out.with_columns(
            pl.min_horizontal(pl.col("max_pages"), pl.col("full_pages")
                              .fill_null(pl.col("max_pages"))).alias("max_pages"))
        # Sustained volume counts only what can be extraction: never more than the volume
        # beyond the largest response of the calls that are not a tool's routine,
        # unnamed reads (null: no per-call figures, the session's own figure stands).
        return out.with_columns(
            pl.col("beyond_bytes").alias("_pulled_bytes"),
            pl.col("beyond_rows").alias("_pulled_rows"),
        ).with_columns(
            pl.min_horizontal(pl.col("beyond_bytes"),
                              pl.col("named_beyond_bytes").fill_null(pl.col("beyond_bytes")))
            .alias("beyond_bytes"),
            pl.when(pl.col("beyond_rows") > 0).then(pl.min_horizontal(
                pl.col("beyond_rows"),
                pl.col("named_beyond_rows").fill_null(pl.col("beyond_rows"))))
            .otherwise(pl.col("beyond_rows")).alias("beyond_rows"),
        ).drop("named_beyond_bytes", "named_beyond_rows")

    def _batch_inputs(self, features: FeatureSet) -> pl.DataFrame:
        """:meth:`_inputs` of ``features``: when fit() ran on ``history.union(features)``
        (a live pass), the rows of its inputs for the batch's sessions, else computed.

        Every input is a per-session figure of the session's own calls (against the tool
        baselines fit() learned, which score() uses anyway), and the batch's sessions and
        events end the union unchanged (:func:`~toolwatch.detectors.base.union_part`): the
        last rows are what computing them again gives (most of a live score()'s CPU).
        """
        entry, self._union_inputs = getattr(self, "_union_inputs", None), None
        if entry is not None and entry[0] is not None and entry[0][0] is features:
            rows = entry[1].slice(entry[0][1])
            # The inputs keep their sessions' order (left joins on the session rows);
            # checked, as it is what makes the rows the batch's.
            if rows.height == features.sessions.height \
                    and rows["sh"].equals(features.sessions["sh"]):
                return rows
        return self._inputs(features)

    def _score_volume(self, df: pl.DataFrame, bl: Baseline,
                      day_bl: Baseline | None = None) -> pl.DataFrame:
        b = self.settings
        rows_known = pl.col("beyond_rows") > 0
        z_pop = pl.max_horizontal(
            bl.z_pop("beyond_bytes"),
            pl.when(rows_known).then(bl.z_pop("beyond_rows")).otherwise(0.0),
        )
        z_single = bl.z_pop("max_bytes")
        if "discounted" not in df.columns:  # entity windows: each session's largest only
            df = df.with_columns(pl.lit(1, pl.Int64).alias("discounted"))
        df = self._with_day(df, day_bl)
        df = bl.with_own(df)
        floor = pl.max_horizontal(
            pl.col("beyond_bytes").fill_null(0) / b.min_bytes,
            pl.col("beyond_rows").fill_null(0) / b.min_rows,
        )
        # A session's sweep floor is its own volume; an entity window's is the volume of
        # its sweeping sessions only (see _entity_windows).
        sb, sr = ("sweep_bytes", "sweep_rows") if "sweep_bytes" in df.columns else (
            "total_bytes", "total_rows")
        sweep_floor = pl.max_horizontal(
            pl.col(sb).fill_null(0) / b.sweep_min_bytes,
            pl.col(sr).fill_null(0) / b.min_rows,
        )

        # With an established own baseline, population and own z-scores are two lines of
        # evidence about the same volume: combine them (Stouffer) so a session moderately
        # unusual for both counts, while the own gate below still blocks the habitual.
        z_vol_own = pl.max_horizontal(
            pl.col("own_z_beyond_bytes"), pl.when(rows_known).then(pl.col("own_z_beyond_rows"))
        )
        per_call = pl.col("beyond_bytes") / (pl.col("calls") - 1).clip(lower_bound=1)
        # Unusual for the caller itself (only once its baseline is established).
        z_own = pl.max_horizontal(
            pl.col("own_z_beyond_bytes"),
            pl.when(rows_known).then(pl.col("own_z_beyond_rows")),
            pl.col("own_z_max_bytes"),
            pl.col("own_z_max_pages"),
        )
        # In stages: the figures the patterns share (z-scores, floors) become columns first
        # and the patterns read those columns. Written as one nested expression, every use
        # copied the whole sub-tree and planning the query cost ~4 ms however few rows it
        # had; the values are the same element-wise operations either way.
        cols = df.columns
        lf = df.lazy().with_columns(
            z_pop.alias("z_pop"),
            z_vol_own.alias("_z_vol_own"),
            per_call.alias("beyond_per_call"),
            z_single.alias("z_single"),
            z_own.alias("z_own"),
            floor.alias("_floor"),
            sweep_floor.alias("_sweep_floor"),
        ).with_columns(
            pl.when(pl.col("_z_vol_own").is_not_null()).then(
                (pl.col("z_pop") + pl.col("_z_vol_own")) / math.sqrt(2.0)
            ).otherwise(pl.col("z_pop")).alias("z_combined"),
        )
        heavy = (
            gate(pl.col("beyond_per_call") / self.typical_call_bytes_, b.heavy_factor)
            if self.typical_call_bytes_ else pl.lit(1.0)
        )
        typ_r = getattr(self, "typical_call_rows_", None)
        if typ_r:
            # A session that logged records but no sizes: heavy by records per call.
            rows_per_call = pl.col("beyond_rows") / (pl.col("calls") - 1).clip(lower_bound=1)
            heavy = pl.when(pl.col("beyond_bytes").fill_null(0) > 0).then(heavy).otherwise(
                gate(rows_per_call.fill_null(0) / typ_r, b.heavy_factor))
        # Focus: a working day spreads its volume over many tools; an extraction asks one
        # resource for it (no per-call tools, e.g. a summary line or an entity window: the
        # figure is unknown and does not block).
        focus = (
            gate(pl.when(pl.col("top_tool").is_null()).then(1.0)
                 .otherwise(pl.col("top_tool_share")), b.focus_min)
            if {"top_tool_share", "top_tool"} <= set(df.columns) and b.focus_min > 0
            else pl.lit(1.0)
        )
        # Outlying volume, or volume in installments: many heavy calls (each far beyond a
        # typical call, to one resource) add up past the floor even when the total is not
        # a population outlier — the slow drip of attachments or records.
        # Sessions with per-call tools only: an entity window sums many sessions' calls,
        # and a summary line cannot show that the heavy calls went to one resource.
        # And a drip takes many different things: a person re-reading the few documents
        # they work on all day is not paying out records in installments.
        new_share = (pl.col("distinct_resources").fill_null(0)
                     / pl.col("calls").clip(lower_bound=1))
        installments = (
            pl.when(pl.col("top_tool").is_not_null()
                    & (new_share >= b.drip_new_share)).then(
                band(pl.col("calls") - pl.col("discounted"), b.drip_calls_lo, b.drip_calls_hi))
            .otherwise(0.0)
            if b.drip_calls_lo > 0 and {"top_tool", "distinct_resources"} <= set(df.columns)
            else pl.lit(0.0))
        p_volume = all_of(any_of(band(pl.col("z_combined"), b.z_lo, b.z_hi), installments),
                          gate(pl.col("_floor"), 1.0), heavy, focus)
        p_single = all_of(
            band(pl.col("z_single"), b.single_z_lo, b.single_z_hi),
            gate(pl.col("max_bytes"), b.single_min_bytes),
        )
        # Volume is records as much as bytes: one response returning as many records as a
        # request for a dump asks for (request_factor x min_rows) is a dump served.
        if b.request_factor > 0 and "max_rows" in df.columns:
            lo = b.request_factor * b.min_rows
            p_single = any_of(p_single, band(pl.col("max_rows").fill_null(0), lo, 10 * lo))
        p_sweep = all_of(band(pl.col("max_pages"), b.pages_lo, b.pages_hi),
                         gate(pl.col("_sweep_floor"), 1.0))
        # Asking for a dump: one call requesting request_factor x min_rows records or more.
        # Refused every time, it is an attempt: reported, a notch lower.
        if "req_rows" in df.columns and b.request_factor > 0:
            lo = b.request_factor * b.min_rows
            p_request = band(pl.col("req_rows").fill_null(0), lo, 10 * lo) * pl.when(
                pl.col("req_refused").fill_null(False)).then(b.refused_weight).otherwise(1.0)
        else:
            p_request = pl.lit(0.0)
        # Oversized responses: volume from calls far beyond what their tool returns.
        if "over_bytes" in df.columns and b.tool_factor > 0:
            p_over = band(pl.max_horizontal(
                pl.col("over_bytes").fill_null(0) / b.oversized_min_bytes,
                pl.col("over_rows").fill_null(0) / b.oversized_min_rows), 1.0, 10.0)
            # Focused: a share focus_min of the session's calls go to the tools that
            # returned oversized responses. A working day with a few big query results or
            # reports among documents, tickets and notes is not an extraction.
            if b.focus_min > 0:
                p_over = all_of(p_over, gate(pl.col("over_share").fill_null(0.0),
                                             b.focus_min))
        else:
            p_over = pl.lit(0.0)
        if b.tool_factor > 0 and {"basis", "total_bytes"} <= set(df.columns):
            # A session known only from its server's summary line (seed 001's
            # logSessionSummary): when its calls averaged tool_factor times the
            # population's typical call, all of its volume came from oversized responses.
            if (not self.typical_call_bytes_
                    or getattr(self, "typical_call_sessions_", 0) < b.tool_min_sessions):
                # Cold start, too few sessions for a typical call: seed 001's own absolute
                # rule (totalBytesReturned > 1,000,000), reported low.
                summary_over = (pl.col("basis") == "summary") & (
                    pl.col("total_bytes") > b.oversized_min_bytes)
                p_over = any_of(p_over, pl.when(summary_over).then(
                    pl.lit(self.threshold + 0.05)).otherwise(0.0))
            else:
                avg = pl.col("total_bytes") / pl.col("calls").clip(lower_bound=1)
                summary_over = (pl.col("basis") == "summary") & (
                    avg >= b.tool_factor * self.typical_call_bytes_)
                p_over = any_of(p_over, pl.when(summary_over).then(
                    band(pl.col("total_bytes") / b.oversized_min_bytes, 1.0, 10.0))
                    .otherwise(0.0))
        # Named reads: seed 001's rule (a session returning more than 1 MB) applied to the
        # reads of people's or a business's records, whatever their tool's baseline (a tool
        # only exports call has its exports as its typical response). Heavy, as the
        # sustained volume — the named calls average heavy_factor x the population's
        # typical call (bytes, or records) — and focused (focus_min of the calls): a
        # support agent's hundreds of small customer lookups over a day add up to megabytes
        # one record at a time, an extraction asks for thousands at once.
        pop_b = getattr(self, "pop_call_b_", 0.0) or 0.0
        pop_r = getattr(self, "pop_call_r_", 0.0) or 0.0
        if "named_bytes" in df.columns and b.named_min_bytes > 0:
            n_calls = pl.col("named_calls").fill_null(0).clip(lower_bound=1)
            per_call = [pl.lit(0.0)]
            if pop_b:
                per_call.append(pl.col("named_bytes").fill_null(0) / n_calls / pop_b)
            if pop_r:
                per_call.append(pl.col("named_rows").fill_null(0) / n_calls / pop_r)
            heavy_named = pl.max_horizontal(per_call)
            p_named = all_of(
                band(pl.max_horizontal(
                    pl.col("named_bytes").fill_null(0) / b.named_min_bytes,
                    pl.col("named_rows").fill_null(0) / b.oversized_min_rows), 1.0, 10.0),
                gate(heavy_named, b.heavy_factor),
                # Asked again: one report downloaded once is the person who downloads one
                # big report (the other patterns discount each session's largest response).
                # Pulls count, not lookups: a search whose query names customers, beside
                # that one report, is not asking again.
                gate(pl.col("named_heavy_calls").fill_null(0).cast(pl.Float64),
                     b.named_min_calls),
                gate(pl.col("named_share").fill_null(0.0), b.focus_min)
                if b.focus_min > 0 else pl.lit(1.0))
        else:
            p_named = pl.lit(0.0)
        # Attempts count: an export of named records refused again and again (and never
        # served in the session) is an attempted dump, reported low and saying so.
        if "refused_exports" in df.columns and b.refused_exports_lo > 0:
            p_refused = pl.when(pl.col("refused_exports").fill_null(0) >= b.refused_exports_lo
                                ).then(pl.lit(b.refused_export_score)).otherwise(0.0)
        else:
            p_refused = pl.lit(0.0)
        lf = lf.with_columns(
            p_named.alias("p_named"),
            p_refused.alias("p_refused"),
            p_request.alias("p_request"),
            p_over.alias("p_oversized"),
            (p_volume if bl.is_fitted else pl.lit(0.0)).alias("p_volume"),
            (p_single if bl.is_fitted else pl.lit(0.0)).alias("p_single"),
            p_sweep.alias("p_sweep"),
        )
        raw = any_of(pl.col("p_volume"), pl.col("p_single"), pl.col("p_sweep"),
                     pl.col("p_request"), pl.col("p_oversized"), pl.col("p_named"),
                     pl.col("p_refused"))
        if b.pipeline_share > 0 and "handed_share" in cols:
            # A pipeline: (nearly) every record the session read went on, whole, to another
            # tool or server (an export loaded into the warehouse). Records moved between
            # systems are a flow, and whether the destination may hold them is
            # cross_server_flow's to judge (seed 003), not records pulled out by the caller.
            raw = pl.when(pl.col("handed_share").fill_null(0.0) >= b.pipeline_share).then(
                0.0).otherwise(raw)
        return lf.with_columns(raw.alias("_raw")).select(
            *cols, "z_pop", "z_combined", "beyond_per_call", "z_single", "z_own",
            "p_volume", "p_single", "p_sweep", "p_request", "p_oversized", "p_named",
            "p_refused", "_raw",
        ).collect(engine="in-memory")

    @staticmethod
    def _with_day(df: pl.DataFrame, day_bl: Baseline | None) -> pl.DataFrame:
        """``z_own_day``: how far beyond the caller's usual heaviest session of a day this
        one is (null without an established day baseline or for entity windows)."""
        if day_bl is None or day_bl.own_ is None:
            return df.with_columns(pl.lit(None, pl.Float64).alias("z_own_day"),
                                   pl.lit(None, pl.Float64).alias("own_typical_day_beyond_bytes"),
                                   pl.lit(None, pl.Int64).alias("own_days_n"))
        own = day_bl.with_own(df.select("caller_id", *_VOL).with_row_index("_r")).sort("_r")
        rows_known = pl.col("beyond_rows") > 0
        return df.with_columns(
            pl.max_horizontal(
                own["own_z_beyond_bytes"], pl.when(rows_known).then(own["own_z_beyond_rows"]),
                own["own_z_max_bytes"], own["own_z_max_pages"],
            ).alias("z_own_day"),
            own["own_typical_beyond_bytes"].alias("own_typical_day_beyond_bytes"),
            own["own_n"].alias("own_days_n"),
        )

    def _routine(self, df: pl.DataFrame, routine: pl.DataFrame | None) -> pl.DataFrame:
        """Add ``z_routine`` (how far beyond the caller's routine with the session's main
        tool its volume is; for an entity window, beyond the entity's own windows), its
        basis ``routine_n`` and ``p_routine``: the gate a routine volume does not pass.

        The gate applies only where the routine itself pulls at alert level (``routine``:
        the typical raw score per (caller, main tool) or entity, see fit()); no gate
        without an established routine: a new caller, a tool the caller has not used this
        way on baseline_min_days days, a summary without tools."""
        rz = self.settings.routine_z
        keys = ["caller_id", "top_tool"] if "top_tool" in df.columns else ["et", "eh"]
        bl = getattr(self, "routine_baseline_", None)
        if "top_tool" not in df.columns:  # entity windows: their own windows' baseline
            z, n = pl.col("z_own"), pl.col("own_n")
        elif bl is None or bl.own_ is None:
            z, n = pl.lit(None, pl.Float64), pl.lit(None, pl.Int64)
        else:
            own = bl.with_own(df.select("caller_id", "top_tool", *_ROUTINE)
                              .with_row_index("_r")).sort("_r")
            z = pl.max_horizontal(
                own["own_z_total_bytes"],
                pl.when(pl.col("total_rows") > 0).then(own["own_z_total_rows"]))
            n = pl.when(z.is_not_null()).then(own["own_n"])
        df = df.with_columns(z.alias("z_routine"), n.cast(pl.Int64).alias("routine_n"))
        if routine is None or routine.height == 0 or rz <= 0:
            return df.with_columns(pl.lit(1.0).alias("p_routine"))
        hab = routine.select(*keys, pl.col("habit_score").alias("_routine_habit"))
        at_alert = (pl.col("_routine_habit").fill_null(0.0)
                    >= self.threshold - self.settings.habit_margin)
        return df.join(hab, on=keys, how="left", maintain_order="left").with_columns(
            pl.when(at_alert & pl.col("z_routine").is_not_null())
            .then(gate(pl.col("z_routine"), rz)).otherwise(1.0).alias("p_routine")
        ).drop("_routine_habit")

    def _gated(self, df: pl.DataFrame, habit: pl.DataFrame | None, keys: list[str],
               routine: pl.DataFrame | None = None) -> pl.DataFrame:
        # A habitual caller must be far beyond its own normal: its usual heaviest session of
        # a day where that is known (sessions), else its usual session / window.
        z = (pl.coalesce(pl.col("z_own_day"), pl.col("z_own")) if "z_own_day" in df.columns
             else pl.col("z_own"))
        df = habitual_gate(df, habit, keys, self.threshold, z, self.settings.self_z)
        if keys == ["caller_id"]:
            df = summary_routine_gate(df, getattr(self, "summary_routine_", {}),
                                      "total_bytes", self.settings.self_z)
        else:
            df = df.with_columns(pl.lit(None, pl.Float64).alias("summary_z"),
                                 pl.lit(None, pl.Float64).alias("summary_typical"),
                                 pl.lit(None, pl.Int64).alias("summary_n"))
        # And a volume the caller pulls routinely with this tool is not anomalous. Only the
        # volume patterns are gated: a request for a dump is judged by what it asked for,
        # and an oversized read by what its tool returns to everyone.
        df = self._routine(df, routine)
        # Named reads are volume too (bytes or records of a tool the caller may export
        # with every night): gated by the routine like the other volume patterns.
        routine_volume = all_of(
            any_of(pl.col("p_volume"), pl.col("p_single"), pl.col("p_sweep"),
                   pl.col("p_named")),
            pl.col("p_routine"))
        score = all_of(
            any_of(routine_volume, pl.col("p_request"), pl.col("p_oversized"),
                   pl.col("p_refused")),
            pl.col("p_own"))
        if self.settings.pipeline_share > 0 and "handed_share" in df.columns:
            # A pipeline (see _score_volume): cross_server_flow judges where records went.
            score = pl.when(pl.col("handed_share").fill_null(0.0)
                            >= self.settings.pipeline_share).then(0.0).otherwise(score)
        return df.with_columns(score.alias("_score"))

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """Session rows for every session plus entity-window rows."""
        if not self.is_fitted:
            self.fit(FeatureSet.empty(self.config))
        cached, self._volume_cache = getattr(self, "_volume_cache", None), None
        inputs, self._inputs_cache = getattr(self, "_inputs_cache", None), None
        volume = (
            cached[1] if cached is not None and cached[0] is features.sessions
            else self._score_volume(
                inputs[1] if inputs is not None and inputs[0] is features.sessions
                else self._batch_inputs(features),
                self.session_baseline_, getattr(self, "day_baseline_", None))
        )
        scored = self._gated(volume, self.habit_, ["caller_id"],
                             getattr(self, "routine_habit_", None))
        # The constant columns ride in session_frame's query (no second query to add them).
        out = session_frame(scored, pl.col("_score"), [
            *_EVIDENCE,
            pl.lit(None, pl.List(pl.String)).alias("session_ids"),
            pl.lit(1, pl.Int64).alias("n_sessions"),
        ])
        wc, self._windows_cache = getattr(self, "_windows_cache", None), None
        if not self.settings.entity or not self.entity_baselines_:
            return out
        # Sessions explained on their own — flagged, or normal only for their caller — are
        # not evidence of a distributed pattern.
        # One in-memory query over the columns _entity_windows reads (the anti join
        # copied every session feature column); the left order is kept as before.
        # The residual carries the sessions' volume as they count it (see fit()).
        residual = scored.lazy().filter(pl.col("_raw").fill_null(0.0) < self.threshold).select(
            "session_id", *_WINDOW_COLS).collect(engine="in-memory")
        if residual.height == 0:
            return out
        if wc is not None and wc[0] is features.sessions \
                and residual.height == features.sessions.height:
            # Nothing set aside: the residual is every session in order, the frame fit()
            # summed (same columns, same rows), so its windows are these.
            win, ee = wc[1], wc[2]
        else:
            win, ee = _entity_windows(residual, self.config)
        win = win.filter(pl.col("n_sessions") >= self.config.entity_min_sessions)
        parts = []
        for code, (etype, _) in enumerate(ENTITY_TYPES):
            part = win.filter(pl.col("et") == code)
            bl = self.entity_baselines_.get(etype)
            if part.height and bl is not None:
                parts.append(self._gated(self._score_volume(part, bl),
                                         self.entity_habits_.get(etype), ["et", "eh"],
                                         getattr(self, "entity_routine_", {}).get(etype)))
        if not parts:
            return out
        ent = pl.concat(parts, how="vertical_relaxed").with_columns(
            pl.lit("events").alias("basis"),
            pl.lit(None, pl.String).alias("page_tool"),
            pl.lit(None, pl.Int64).alias("req_rows"),
            pl.lit(None, pl.Boolean).alias("req_refused"),
            *[pl.lit(None, t).alias(c) for c, t in _OVER_SCHEMA.items()],
            *[pl.lit(None, t).alias(c) for c, t in _READS_SCHEMA.items()
              if c not in ("full_pages", "named_share")],
            pl.lit(0.0).alias("p_named"), pl.lit(0.0).alias("p_refused"),
            ((pl.col("last_t") - pl.col("first_t")) / 1e6).alias("span_s"),
        )
        hot = ent.filter(pl.col("_score") >= self.threshold)
        ent = finish(ent.join(sessions_of(ee, hot, features), on=KEYS, how="left"), features)
        ent = ent.select(
            "entity_type",
            "entity_id",
            pl.col("w").alias("window_start"),
            pl.col("_score").alias("score"),
            pl.lit(None, pl.String).alias("session_id"),
            "caller_id",
            "client_ip",
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
        unit = "window" if entity else "session"
        where = f" across {row['n_sessions']} sessions" if entity else ""
        rows = row.get("total_rows") or 0
        rows_txt = f", {num(rows)} rows" if rows else ""
        # Summary-only sessions carry totals but no per-call sizes: say so, not "0 B".
        largest = (
            f"largest single response {size(row.get('max_bytes'))}"
            if row.get("max_bytes")
            else "per-call sizes not logged"
        )
        reasons = [
            f"Returned {size(row['total_bytes'])}{rows_txt} in {num(row['calls'])} calls over "
            f"{duration(row.get('span_s'))}{where}; {largest}."
        ]
        pats = {k: float(row.get(k) or 0.0)
                for k in ("p_volume", "p_single", "p_sweep", "p_request", "p_oversized",
                          "p_named", "p_refused")}
        top = max(pats, key=lambda k: pats[k])
        if top == "p_oversized" or pats["p_oversized"] >= 0.5:
            recs = f", {num(row.get('over_rows'))} records" if row.get("over_rows") else ""
            reasons.append(
                f"{num(row.get('over_calls'))} call(s) returned at least "
                f"{num(self.settings.tool_factor)}× what their tool typically returns, "
                f"{size(row.get('over_bytes'))}{recs} in all: oversized reads.")
        if top == "p_request" or pats["p_request"] >= 0.5:
            refused = row.get("req_refused")
            reasons.append(
                f"A call asked for {num(row.get('req_rows'))} records at once (its limit / "
                f"page-size argument): a request for a dump"
                + (", refused by the server every time it asked for that many: an attempt."
                   if refused else ".")
            )
        if top == "p_named" or pats["p_named"] >= 0.5:
            recs = f", {num(row.get('named_rows'))} records" if row.get("named_rows") else ""
            reasons.append(
                f"{num(row.get('named_calls'))} read(s) of people's or a business's records "
                f"returned {size(row.get('named_bytes'))}{recs}, far more a call than a typical "
                f"call: records pulled in bulk.")
        if top == "p_refused" or pats["p_refused"] >= 0.5:
            reasons.append(
                f"{num(row.get('refused_exports'))} export(s) of named records were refused "
                f"and none was served: an attempted dump, refused.")
        typical = bl.pop_typical("beyond_bytes") if bl else None
        if top == "p_sweep" or pats["p_sweep"] >= 0.5:
            reasons.append(
                f"Walked {row.get('max_pages')} distinct pages/offsets/cursors of "
                f"{row.get('page_tool') or 'one tool'}: a listing paged through to extract it."
            )
        if top == "p_volume" or pats["p_volume"] >= 0.5:
            factor = (row.get("beyond_bytes") or 0) / max(typical or 1.0, 1.0)
            typ_call = self.typical_call_bytes_ or 0.0
            reasons.append(
                f"Its other calls returned {size(row.get('beyond_per_call'))} each on average, "
                f"{num((row.get('beyond_per_call') or 0) / max(typ_call, 1.0))}× a typical call "
                f"({size(typ_call)})."
            )
            k = int(row.get("discounted") or 1)
            n_inst = int(row.get("calls") or 0) - k
            if not entity and n_inst >= self.settings.drip_calls_lo > 0 \
                    and float(row.get("z_combined") or 0.0) < self.settings.z_lo:
                reasons.append(
                    f"{num(n_inst)} heavy calls, mostly to {row.get('top_tool') or 'one tool'}: "
                    f"an extraction in installments, each response far beyond a typical call.")
            beyond = "the largest response" if k <= 1 else f"its {k} largest responses"
            reasons.append(
                f"{size(row.get('beyond_bytes'))} came beyond {beyond} — "
                f"{num(factor)}× the typical {unit} ({size(typical)}), robust z-score "
                f"{num(row.get('z_pop'))}"
                + (f" (combined with the {unit}'s own baseline: {num(row.get('z_combined'))})."
                   if row.get("z_own") is not None else ".")
            )
        if top == "p_single" or pats["p_single"] >= 0.5:
            reasons.append(
                f"One response of {size(row.get('max_bytes'))} is far beyond the population's "
                f"largest ones (typical {size(bl.pop_typical('max_bytes') if bl else None)}, "
                f"z-score {num(row.get('z_single'))})."
            )
        who = "caller" if etype in ("session", "caller_id") else "address"
        if row.get("summary_n") is not None:
            reasons.append(
                f"Session summaries like this one are the routine of its caller or address "
                f"({row['summary_n']} of them, spread over hours, typically "
                f"{size(row.get('summary_typical'))}), but this one is far beyond them "
                f"(z-score {num(row.get('summary_z'))})."
            )
        elif row.get("habitual"):
            if row.get("z_own_day") is not None:
                reasons.append(
                    f"This {who} pulls large volumes on most of its days, but this {unit} is "
                    f"far beyond its usual heaviest session of a day "
                    f"({size(row.get('own_typical_day_beyond_bytes'))} beyond its largest "
                    f"response, {row.get('own_days_n')} days; z-score "
                    f"{num(row.get('z_own_day'))})."
                )
            else:
                reasons.append(
                    f"This {who} pulls large volumes habitually, but this {unit} is far beyond "
                    f"its own normal (z-score {num(row.get('z_own'))})."
                )
        if row.get("summary_n") is not None:
            pass  # judged against its summaries' routine, said above
        elif row.get("z_own") is not None:
            reasons.append(
                f"Unusual for this {who} too: its typical {unit} returns "
                f"{size(row.get('own_typical_beyond_bytes'))} beyond its largest response "
                f"and {num(row.get('own_typical_max_pages'))} pages "
                f"({row.get('own_n')} {unit}s on {row.get('own_days')} days; z-score "
                f"{num(row.get('z_own'))})."
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
                "bytes_beyond_largest": row.get("beyond_bytes"),
                "largest_responses_discounted": row.get("discounted"),
                "bytes_per_other_call": row.get("beyond_per_call"),
                "population_typical_call_bytes": self.typical_call_bytes_,
                "total_rows": rows or None,
                "max_rows_per_call": row.get("max_rows") or None,
                "distinct_pages": row.get("max_pages") or None,
                "page_tool": row.get("page_tool"),
                "duration_s": row.get("span_s"),
                "population_typical_beyond_bytes": typical,
                "z_population": row.get("z_pop"),
                "z_combined": row.get("z_combined"),
                "z_single_response": row.get("z_single"),
                "z_own_baseline": row.get("z_own"),
                "own_typical_beyond_bytes": row.get("own_typical_beyond_bytes"),
                "own_baseline_observations": row.get("own_n"),
                "own_baseline_days": row.get("own_days"),
                "z_own_heaviest_day": row.get("z_own_day"),
                "basis": row.get("basis"),
                "top_tool": row.get("top_tool"),
                "pattern_scores": clean({k: row.get(k) for k in
                                         ("p_volume", "p_single", "p_sweep", "p_own",
                                          "p_request", "p_oversized", "p_named",
                                          "p_refused")}),
                "requested_records": row.get("req_rows"),
                "request_refused": row.get("req_refused"),
                "oversized_calls": row.get("over_calls"),
                "oversized_bytes": row.get("over_bytes"),
                "oversized_rows": row.get("over_rows"),
                "named_read_bytes": row.get("named_bytes"),
                "named_read_rows": row.get("named_rows"),
                "named_read_calls": row.get("named_calls"),
                "refused_exports": row.get("refused_exports"),
            }
        )
        return reasons, evidence
