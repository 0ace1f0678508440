"""Concurrency abuse and race conditions: what shows only when calls are *intervals*.

Every call with a known duration was in flight from ``start_ts`` to ``end_ts`` (see
``ingest/intervals.py``; events without those columns fall back to ``ts - duration_ms`` …
``ts``). Both detectors work on those intervals, columnar:

* **concurrency_abuse** (``concurrency_rules``) — the *peak* number of calls in flight at
  one moment in a session, by a sweep: every interval becomes a +1 event at its start and
  a −1 event at its end, the events are sorted by (session, time, −1 before +1) and a
  running sum gives the calls in flight after each event (the sum over a session returns
  to zero, so one global cumulative sum serves every session at once). The peak must be
  large in absolute terms (``peak_lo``), far above the population's typical peak and —
  once the caller's baseline is established — far above the caller's own usual peak (a
  batch job that always runs 20 calls at once stays quiet). Sessions whose lines carry no
  durations are point calls: each counts as in flight for ``burst_window_ms`` after it
  started, i.e. the peak becomes a burst rate, and the evidence says so. Calls refused
  for a limit (``rate_limited``) are attempts: counted as point calls too, the peak with
  them scores at most ``attempt_score``. A session that rises past seed 004's cap
  (``caller_cap``, 10) in ``waves_lo`` separate waves, on new arguments, counts from
  ``caller_cap + 1`` in flight, reads included.
* **race_condition** (``race_rules``) — two or more *mutating* calls (tool roles from
  :mod:`toolwatch.detectors.tools`) on the same resource / business key, from one actor (the caller,
  else the client address, else the session), whose intervals overlap: sorted by start
  within (actor, key), a call overlaps an earlier one when it starts before the running
  maximum of the earlier ends; such calls chain into clusters (a new cluster starts where
  a call begins after every earlier one ended). A cluster within one session is a session
  alert; one spread over several sessions of a caller or address is an entity alert for
  that window. Sequential writes, overlapping reads and overlapping writes to different
  resources never form a cluster.

No per-pair Python: the work is a sort and a few cumulative expressions per batch, and
only sessions with at least ``min_calls`` calls (the only ones that can reach
``peak_lo``) and only mutating calls (for races) are swept. Most sessions never have two
calls in flight: one group-by certifies those (each call, in time order, starts after the
previous one ended: peak 1, exact) and only the rest are sorted and swept, so the
population's and callers' typical peaks stay exact. Races reuse the tool annotation of
the sequence detectors when they already computed it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Self

import polars as pl
from toolwatch.detectors.base import Detector, FeatureSet, session_frame, union_part
from toolwatch.detectors.config import DetectorsConfig
from toolwatch.detectors.features import US_PER_DAY, entity_names, window_starts
from toolwatch.detectors.scoring import all_of, band, gate
from toolwatch.detectors.text import clean, duration
from toolwatch.detectors.tools import annotate, tool_table
from toolwatch.ingest.intervals import MAX_DURATION_MS

_CACHE = "_concurrency_cache"
#: Columns only session rows fill (attempts and waves over the cap).
_SESSION_COLS: dict[str, pl.DataType] = {
    "served_peak": pl.Int64(),
    "refused": pl.UInt32(),
    "waves": pl.Int64(),
    "sustained": pl.Boolean(),
}
#: Columns only caller-wide rows fill.
_CALLER_COLS: dict[str, pl.DataType] = {
    "session_ids": pl.List(pl.String()),
    "n_sessions": pl.Int64(),
    "top_session_peak": pl.Int64(),
}


def _iso_ms(us: int | None) -> str | None:
    """ISO-8601 UTC with milliseconds (overlaps are a matter of milliseconds)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def event_intervals(ev: pl.DataFrame) -> pl.DataFrame:
    """``s`` / ``e`` (µs) of each prepared event, null when its interval is unknown.

    ``start_ts`` / ``end_ts`` when present; else, with a plausible ``duration_ms``, the
    timestamp is taken as the completion (``ts - duration`` … ``ts``). Zero-length calls
    last 1 µs, so a call is in flight at its own start.
    """
    dur = pl.col("duration_ms")
    dur_ok = dur.is_not_null() & dur.is_finite() & (dur >= 0) & (dur <= MAX_DURATION_MS)
    dur_us = pl.when(dur_ok).then((dur * 1000.0).round().cast(pl.Int64))
    s = pl.coalesce(pl.col("start_ts").dt.epoch("us"), pl.col("t") - dur_us)
    e = pl.coalesce(pl.col("end_ts").dt.epoch("us"), pl.when(dur_ok).then(pl.col("t")))
    return ev.select(
        s.alias("s"), e.alias("e")
    ).with_columns(
        ok := (pl.col("s").is_not_null() & pl.col("e").is_not_null()
               & (pl.col("e") >= pl.col("s"))).alias("has_iv"),
        pl.when(ok).then(pl.max_horizontal(pl.col("e"), pl.col("s") + 1)).alias("e"),
        pl.when(ok).then(pl.col("s")).alias("s"),
    )


def sweep_peaks(iv: pl.DataFrame, key: str = "g", bucket_us: int = 0,
                cap: int = 0) -> pl.DataFrame:
    """Peak calls in flight per group, by a +1/−1 sweep (columnar).

    Most groups never have two calls in flight (a client waits for each answer): a group
    whose rows, in the order given, each start at or after the previous row's end is a
    chain of disjoint intervals with peak 1, reached at its first start. That certificate
    is one shift per group, no sort; only the other groups are swept. Rows in time order
    (as the store returns them) pass it whenever their calls really are sequential; rows
    in another order merely go to the sweep, so the result never depends on the order.

    Parameters
    ----------
    iv
        One row per interval: ``key``, ``s`` and ``e`` (µs, ``e > s``; half-open
        ``[s, e)``: a call ending when another starts does not overlap it).

    bucket_us
        When > 0, one row per group and time bucket of that length (aligned to the
        epoch): the peak among the calls *starting* in the bucket (each counted with every
        call still in flight then, whenever it started), in an extra column ``w`` (the
        bucket's start, µs).

    cap
        When > 0 (and no buckets), an extra column ``waves``: how many times the count
        rose past ``cap`` (a start taking it from ``cap`` to ``cap + 1``), i.e. separate
        episodes over the cap.

    Returns
    -------
    polars.DataFrame
        ``key`` (, ``w``), ``peak`` (max calls in flight at once) and ``peak_t`` (first
        moment the peak is reached).
    """
    schema = {key: iv.schema[key], "peak": pl.Int64, "peak_t": pl.Int64}
    if bucket_us > 0:
        schema = {key: iv.schema[key], "w": pl.Int64, "peak": pl.Int64, "peak_t": pl.Int64}
    waves = cap > 0 and bucket_us <= 0
    if waves:
        schema["waves"] = pl.Int64
    if iv.height == 0:
        return pl.DataFrame(schema=schema)
    iv = iv.select(key, "s", "e")
    # A row breaks the chain when it starts before the previous row of its group ended,
    # or cannot be certified at all (null bounds, an empty interval). One group-by gives
    # both the certificate and a chain's peak moment (its first start).
    # Each group's starts and ends are gathered as lists (in row order) and every row's
    # start is compared with the previous row's end by list arithmetic: a shift evaluated
    # per group inside the aggregation cost twice as much (~0.06 CPU-s on 1M events).
    bad = pl.col("s").is_null() | pl.col("e").is_null() | (pl.col("e") <= pl.col("s"))
    prev_end, start = pl.col("e").list.slice(0, pl.col("e").list.len() - 1), \
        pl.col("s").list.slice(1)
    cert = iv.group_by(key).agg(
        pl.col("s").min().alias("peak_t"), bad.any().alias("_bad"), pl.col("s"), pl.col("e")
    ).select(
        key, "peak_t",
        (pl.col("_bad") | ((prev_end - start).list.max() > 0).fill_null(False)).alias("_busy"),
    )
    busy = cert.filter("_busy").select(key)
    if bucket_us > 0:
        quiet = iv.join(busy, on=key, how="anti").group_by(
            key, ((pl.col("s") // bucket_us) * bucket_us).alias("w")
        ).agg(pl.lit(1, pl.Int64).alias("peak"), pl.col("s").min().alias("peak_t"))
    else:
        quiet = cert.filter(~pl.col("_busy")).select(
            key, pl.lit(1, pl.Int64).alias("peak"), "peak_t",
            *([pl.lit(0, pl.Int64).alias("waves")] if waves else []),
        )
    quiet = quiet.select(list(schema))
    if busy.height == 0:
        return quiet
    rest = iv.join(busy, on=key, how="semi")
    # Ends sort before starts at the same instant (half-open intervals): the tie-break is
    # folded into the time (2x + 1 for a start) so the sort has two keys, not three.
    pts = pl.concat(
        [
            rest.select(key, (pl.col("s") * 2 + 1).alias("x2"), pl.lit(1, pl.Int64).alias("d")),
            rest.select(key, (pl.col("e") * 2).alias("x2"), pl.lit(-1, pl.Int64).alias("d")),
        ]
    ).sort([key, "x2"]).with_columns((pl.col("x2") // 2).alias("x"))
    # Each group's deltas sum to zero, so a global running sum restarts at 0 per group.
    pts = pts.with_columns(pl.col("d").cum_sum().alias("f"))
    if bucket_us > 0:
        # A bucket's peak is reached at one of its starts (an end only lowers the count).
        pts = pts.filter(pl.col("d") > 0)
        swept = pts.group_by(key, ((pl.col("x") // bucket_us) * bucket_us).alias("w")).agg(
            pl.col("f").max().alias("peak"),
            pl.col("x").get(pl.col("f").arg_max()).alias("peak_t"),
        )
        return pl.concat([quiet, swept.select(list(schema))])
    swept = pts.group_by(key).agg(
        pl.col("f").max().alias("peak"),
        pl.col("x").get(pl.col("f").arg_max()).alias("peak_t"),
        *([((pl.col("d") > 0) & (pl.col("f") == cap + 1)).sum().cast(pl.Int64)
           .alias("waves")] if waves else []),
    )
    return pl.concat([quiet, swept.select(list(schema))])


def _session_sweep(features: FeatureSet) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-session peaks, the intervals swept), cached on the feature set."""
    cached = getattr(features, _CACHE, None)
    if cached is not None:
        return cached
    c = features.config.concurrency_abuse
    s = features.sessions
    cand = s.filter((pl.col("calls") >= c.min_calls) & (pl.col("basis") != "summary"))
    ev = features.events
    if cand.height == 0 or ev.height == 0:
        out = (
            pl.DataFrame(schema={"sh": pl.UInt64, "peak": pl.Int64, "peak_t": pl.Int64,
                                 "waves": pl.Int64, "served_peak": pl.Int64,
                                 "refused": pl.UInt32, "basis_iv": pl.Boolean}),
            pl.DataFrame(schema={"sh": pl.UInt64, "s": pl.Int64, "e": pl.Int64,
                                 "tlh": pl.UInt64, "refused": pl.Boolean}),
        )
        setattr(features, _CACHE, out)
        return out
    # Narrow first: filtering the full prepared frame (~40 columns) cost more than the sweep.
    sub = ev.select("sh", "t", "tlh", "status", "duration_ms", "start_ts", "end_ts").filter(
        pl.col("sh").is_in(cand["sh"].implode())
    )
    sub = pl.concat(
        [sub.select("sh", "t", "tlh", "status"), event_intervals(sub)], how="horizontal"
    )
    w = int(c.burst_window_ms * 1000)
    n_iv = int(sub["has_iv"].sum())
    if n_iv in (0, sub.height):
        # Every call carries an interval (or none does): one basis for all, no group-by.
        basis = None
        all_iv = (1.0 if n_iv else 0.0) >= c.interval_share_lo
        sub = sub.with_columns(pl.lit(all_iv).alias("basis_iv"))
    else:
        basis = sub.group_by("sh").agg(
            (pl.col("has_iv").mean() >= c.interval_share_lo).alias("basis_iv")
        )
        sub = sub.join(basis, on="sh", how="left")
    # Attempts count (seed 004's semaphore answers "Concurrency limit reached" at once): a
    # call the server refused for a limit was one more call the client wanted in flight,
    # but its logged interval is the refusal's few milliseconds. It is counted as a point
    # call (in flight for burst_window_ms from its start, as lines without durations are),
    # and the peak without it (``served_peak``) says whether the alert rests on attempts.
    refused = pl.col("status").fill_null("") == "rate_limited"
    swept = sub.filter(pl.col("has_iv") | ~pl.col("basis_iv")).select(
        "sh",
        pl.when(pl.col("basis_iv")).then(pl.col("s")).otherwise(pl.col("t")).alias("s"),
        pl.when(pl.col("basis_iv")).then(pl.col("e")).otherwise(pl.col("t") + w).alias("e"),
        "tlh", refused.alias("refused"),
    ).with_columns(
        pl.when(pl.col("refused")).then(pl.max_horizontal("e", pl.col("s") + w))
        .otherwise(pl.col("e")).alias("e")
    )
    peaks = sweep_peaks(swept, "sh", cap=c.caller_cap if c.waves_lo > 0 else 0)
    if "waves" not in peaks.columns:
        peaks = peaks.with_columns(pl.lit(0, pl.Int64).alias("waves"))
    tried = swept.filter(pl.col("refused").any().over("sh"))
    served = sweep_peaks(tried.filter(~pl.col("refused")), "sh").select(
        "sh", pl.col("peak").alias("served_peak"))
    n_ref = tried.group_by("sh").agg(pl.col("refused").sum().cast(pl.UInt32))
    peaks = peaks.join(n_ref, on="sh", how="left").join(served, on="sh", how="left").with_columns(
        pl.col("refused").fill_null(0),
        # A session of refusals only served nothing at once.
        pl.when(pl.col("refused") > 0).then(pl.col("served_peak").fill_null(0))
        .otherwise(pl.col("peak")).alias("served_peak"),
    )
    if basis is None:
        peaks = peaks.with_columns(pl.lit(all_iv).alias("basis_iv"))
    else:
        peaks = peaks.join(basis, on="sh", how="left")
    out = (peaks, swept)
    setattr(features, _CACHE, out)
    return out


def _share_sweep(whole: FeatureSet) -> None:
    """Give the batch of a live pass (``whole`` = history.union(batch)) its session sweep
    from ``whole``'s, so that scoring the batch does not sweep its calls again.

    Everything :func:`_session_sweep` computes is per session, from the session's own
    row and calls (a session's basis, its peaks, its refused calls; the all-or-none
    shortcut gives every session the value its own share would), and the batch's rows
    end ``whole`` unchanged (:func:`~toolwatch.detectors.base.union_part`): its sessions'
    rows of the peaks and, in event order, of the swept intervals are the batch's own.
    """
    found = union_part(whole)
    if found is None or getattr(found[0], _CACHE, None) is not None:
        return
    batch = found[0]
    peaks, swept = _session_sweep(whole)
    mine = batch.sessions["sh"].implode()
    setattr(batch, _CACHE, (peaks.filter(pl.col("sh").is_in(mine)),
                            swept.filter(pl.col("sh").is_in(mine))))


_CALLER_CACHE = "_concurrency_caller_cache"


def _caller_sweep(features: FeatureSet) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(peak per caller and entity window across its sessions, the intervals swept).

    Only callers that can reach ``caller_peak_lo`` are swept call by call. The bound is
    computed at session granularity: each session is an interval (its first start to its
    last end) weighted by its own peak, and a weighted sweep over a caller's sessions
    bounds the caller's calls in flight at any moment (a session contributes at most its
    peak while it lasts; the session sweep's peaks are reused, smaller sessions are swept
    here). Callers with fewer than ``entity_min_sessions`` sessions or
    ``caller_peak_lo`` calls are skipped outright. A caller's usual caller-wide peak is
    therefore the median over its *busy* windows (bound reaching ``caller_peak_lo``), as
    the session-wide one is over sessions with ``min_calls``. Cached on the feature set.
    """
    cached = getattr(features, _CALLER_CACHE, None)
    if cached is not None:
        return cached
    cfg = features.config
    c = cfg.concurrency_abuse
    empty = (
        pl.DataFrame(schema={"ceh": pl.UInt64, "w": pl.Int64, "peak": pl.Int64,
                             "peak_t": pl.Int64}),
        pl.DataFrame(schema={"ceh": pl.UInt64, "sh": pl.UInt64, "s": pl.Int64,
                             "e": pl.Int64, "tlh": pl.UInt64, "basis_iv": pl.Boolean}),
    )
    ss = features.sessions.filter(
        pl.col("ceh").is_not_null() & (pl.col("basis") != "summary")
    ).select("sh", "ceh", "calls")
    big = ss.group_by("ceh").agg(pl.len().alias("n"), pl.col("calls").sum().alias("c")).filter(
        (pl.col("n") >= max(2, cfg.entity_min_sessions)) & (pl.col("c") >= c.caller_peak_lo)
    )
    ev = features.events
    if big.height == 0 or ev.height == 0:
        setattr(features, _CALLER_CACHE, empty)
        return empty
    ss = ss.join(big.select("ceh"), on="ceh", how="semi")
    sub = ev.select("sh", "t", "tlh", "duration_ms", "start_ts", "end_ts").filter(
        pl.col("sh").is_in(ss["sh"].implode())
    )
    sub = pl.concat([sub.select("sh", "t", "tlh"), event_intervals(sub)], how="horizontal")
    # The session's caller (not each line's): the bound below attributes whole sessions.
    sub = sub.join(ss.select("sh", "ceh"), on="sh", how="left")
    w = int(c.burst_window_ms * 1000)
    n_iv = int(sub["has_iv"].sum())
    if n_iv in (0, sub.height):
        sub = sub.with_columns(pl.lit((1.0 if n_iv else 0.0) >= c.interval_share_lo)
                               .alias("basis_iv"))
    else:
        sub = sub.with_columns(
            (pl.col("has_iv").mean().over("ceh") >= c.interval_share_lo).alias("basis_iv")
        )
    swept = sub.filter(pl.col("has_iv") | ~pl.col("basis_iv")).select(
        "ceh", "sh",
        pl.when(pl.col("basis_iv")).then(pl.col("s")).otherwise(pl.col("t")).alias("s"),
        pl.when(pl.col("basis_iv")).then(pl.col("e")).otherwise(pl.col("t") + w).alias("e"),
        "tlh", "basis_iv",
    )
    # Upper bound per caller: its sessions' spans weighted by their peaks, swept. A
    # session's peak comes from the session sweep (when it was swept on the same basis),
    # else its number of calls bounds it.
    own, _ = _session_sweep(features)
    spans = swept.group_by("sh").agg(
        pl.col("ceh").first(), pl.col("s").min(), pl.col("e").max(),
        pl.col("basis_iv").first().alias("b"),
    ).join(own.select("sh", "peak", "basis_iv"), on="sh", how="left")
    known = pl.col("basis_iv").is_not_null() & (pl.col("basis_iv") == pl.col("b"))
    rest = swept.join(spans.filter(~known).select("sh"), on="sh", how="semi")
    spans = spans.join(sweep_peaks(rest, "sh").select("sh", pl.col("peak").alias("p2")),
                       on="sh", how="left").with_columns(
        pl.when(known).then(pl.col("peak")).otherwise(pl.col("p2")).alias("peak")
    )
    pts = pl.concat([
        spans.select("ceh", (pl.col("s") * 2 + 1).alias("x2"), pl.col("peak").alias("d")),
        spans.select("ceh", (pl.col("e") * 2).alias("x2"), (-pl.col("peak")).alias("d")),
    ]).sort("ceh", "x2")
    bound = pts.with_columns(pl.col("d").cum_sum().alias("f")).group_by("ceh").agg(
        pl.col("f").max().alias("bound")
    )
    busy = bound.filter(pl.col("bound") >= c.caller_peak_lo).select("ceh")
    if busy.height == 0:
        setattr(features, _CALLER_CACHE, empty)
        return empty
    swept = swept.join(busy, on="ceh", how="semi")
    peaks = sweep_peaks(swept, "ceh", cfg.hop_us)
    out = (peaks, swept)
    setattr(features, _CALLER_CACHE, out)
    return out



def _without_session_bursts(cp: pl.DataFrame, swept: pl.DataFrame,
                            history: FeatureSet) -> pl.DataFrame:
    """Caller windows minus those whose peak one session's own burst explains.

    A window whose peak is mostly one session that is a burst by itself (its own peak
    reaches ``peak_lo`` and exceeds ``caller_max_session_share`` of the window's peak) is
    that session's alert, not the caller's parallelism across sessions; in the caller's
    usual caller-wide peak it would let one earlier burst (an attack already flagged at
    session level) excuse a later burst spread over several sessions (seed 9202: a 43-call
    single-session burst lifted the usual peak to 16.5, hiding a 29-call burst over four
    sessions). Quiet windows (peak below ``peak_lo``) are kept.
    """
    c = history.config.concurrency_abuse
    if cp.height == 0:
        return cp
    own, _ = _session_sweep(history)
    burst = own.filter(pl.col("peak") >= c.peak_lo).select("sh", pl.col("peak").alias("_sp"))
    if burst.height == 0:
        return cp
    spans = (
        swept.join(burst, on="sh", how="semi")
        .group_by("sh").agg(pl.col("ceh").first(), pl.col("s").min(), pl.col("e").max())
        .join(burst, on="sh")
    )
    hit = (
        cp.join(spans, on="ceh")
        .filter((pl.col("s") <= pl.col("peak_t")) & (pl.col("e") > pl.col("peak_t"))
                & (pl.col("_sp") > c.caller_max_session_share * pl.col("peak")))
        .select("ceh", "w").unique()
    )
    return cp.join(hit, on=["ceh", "w"], how="anti")


def _usual_peaks(peaks: pl.DataFrame, time_col: str, cfg: DetectorsConfig) -> pl.DataFrame:
    """Per caller (``ceh``): the median of its peaks, for callers with an established
    history (enough sessions/windows on enough distinct days)."""
    return (
        peaks.group_by("ceh")
        .agg(
            pl.col("peak").median().alias("usual_peak"),
            pl.len().alias("own_sessions"),
            (pl.col(time_col) // US_PER_DAY).n_unique().alias("own_days"),
        )
        .filter((pl.col("own_sessions") >= cfg.baseline_min_sessions)
                & (pl.col("own_days") >= cfg.baseline_min_days))
    )

class ConcurrencyAbuseDetector(Detector):
    """Flags sessions with far more calls in flight at once than their caller and peers."""

    name = "concurrency_rules"
    category = "concurrency_abuse"
    config_key = "concurrency_abuse"
    summary = "Peak calls in flight per session vs. the population and the caller's usual peak."

    def fit(self, history: FeatureSet) -> Self:
        """Learn the population's typical peak and each caller's usual peak."""
        peaks, _ = _session_sweep(history)
        _share_sweep(history)
        s = history.sessions.lazy().select("sh", "ceh", "first_t").join(
            peaks.lazy(), on="sh", how="inner", maintain_order="left").collect(engine="in-memory")
        enough = s.height >= self.settings.pop_min_sessions
        self.pop_peak_ = float(s["peak"].median()) if enough else None  # type: ignore[arg-type]
        cfg = self.config
        self.own_ = _usual_peaks(s.filter(pl.col("ceh").is_not_null()), "first_t", cfg)
        self._fit_callers(history)
        self.fitted_ = True
        return self

    def _fit_callers(self, history: FeatureSet) -> None:
        """Each caller's usual caller-wide peak (median over its busy windows).

        The population reference stays the typical busy *session*'s peak: busy callers
        are a selected few (services running workers, the attacks themselves), so their
        median says little about what an ordinary client keeps in flight.
        """
        c, cfg = self.settings, self.config
        self.caller_own_: pl.DataFrame | None = None
        if not c.callers:
            return
        cp, swept = _caller_sweep(history)
        if c.caller_baseline_skips_bursts:
            cp = _without_session_bursts(cp, swept, history)
        self.caller_own_ = _usual_peaks(cp, "w", cfg)

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """One row per session; evidence columns for those reaching the threshold."""
        c = self.settings
        peaks, swept = _session_sweep(features)
        s = features.sessions.join(peaks, on="sh", how="left")
        own = getattr(self, "own_", None)
        if own is not None and own.height:
            s = s.join(own.select("ceh", "usual_peak", "own_sessions"), on="ceh", how="left")
        else:
            s = s.with_columns(pl.lit(None, pl.Float64).alias("usual_peak"),
                               pl.lit(None, pl.UInt32).alias("own_sessions"))
        pop = getattr(self, "pop_peak_", None)
        s = self._fresh(self._read_only(s, features), features)
        # Over the cap again and again, each time asking for new things: counts from
        # caller_cap + 1 in flight, reads included (seed 004's per-caller limit).
        sustained = (pl.col("waves").fill_null(0) >= max(c.waves_lo, 1)) & (c.waves_lo > 0) \
            & (pl.col("_fresh").fill_null(0.0) >= c.fresh_share_lo)

        def peak_score(peak: pl.Expr) -> pl.Expr:
            # A fan-out of reads (a dashboard loading its panels) counts from read_peak_lo:
            # the peak is scaled so that band() gives 0.5 there.
            eff = pl.when(pl.col("_read_only")).then(
                peak * (c.peak_lo / max(c.read_peak_lo, c.peak_lo))).otherwise(peak)
            eff = pl.when(sustained).then(
                pl.max_horizontal(eff, peak * (c.peak_lo / (c.caller_cap + 1)))).otherwise(eff)
            terms = [band(eff, c.peak_lo, c.peak_hi)]
            if pop is not None:
                terms.append(gate(peak / max(pop, 1.0), c.pop_ratio_lo))
            terms.append(
                pl.when(pl.col("usual_peak").is_not_null())
                .then(gate(peak / pl.col("usual_peak").clip(lower_bound=1.0),
                           c.self_ratio_lo))
                .otherwise(1.0)
            )
            return all_of(*terms)

        # Attempts count, below what was served: the peak with the refused calls scores at
        # most attempt_score; the served peak alone scores as ever.
        score = pl.max_horizontal(
            peak_score(pl.col("served_peak").fill_null(pl.col("peak")).fill_null(0)),
            pl.min_horizontal(peak_score(pl.col("peak").fill_null(0)), c.attempt_score),
        )
        s = s.with_columns(pl.lit(pop, pl.Float64).alias("pop_peak"),
                           sustained.alias("sustained"))
        out = session_frame(
            s, score,
            ["calls", "peak", "peak_t", "basis_iv", "usual_peak", "own_sessions", "pop_peak",
             "served_peak", "refused", "waves", "sustained"],
        )
        out = self._evidence(out, swept, features).with_columns(
            pl.lit("session").alias("scope"),
            *[pl.lit(None, dt).alias(k) for k, dt in _CALLER_COLS.items()],
        )
        if not c.callers:
            return out
        ent = self._callers(features)
        if ent.height == 0:
            return out
        return pl.concat([out, ent.select(out.columns)], how="vertical_relaxed")

    def _fresh(self, s: pl.DataFrame, features: FeatureSet) -> pl.DataFrame:
        """``_fresh``: share of the session's calls that are the first of their (tool,
        arguments), for sessions over the cap in ``waves_lo`` waves or more."""
        c = self.settings
        hot = s.filter(pl.col("waves").fill_null(0) >= max(c.waves_lo, 1)).select("sh")
        if hot.height == 0 or c.waves_lo <= 0:
            return s.with_columns(pl.lit(None, pl.Float64).alias("_fresh"))
        ev = features.events.select("sh", "tlh", pl.col("args").fill_null("")).join(
            hot, on="sh", how="semi")
        fr = ev.group_by("sh").agg(
            (pl.struct("tlh", "args").n_unique() / pl.len()).alias("_fresh"))
        return s.join(fr, on="sh", how="left")

    def _read_only(self, s: pl.DataFrame, features: FeatureSet) -> pl.DataFrame:
        """``_read_only``: the session's calls all read (for sessions reaching peak_lo)."""
        c = self.settings
        hot = s.filter(pl.col("peak").fill_null(0) > min(c.peak_lo - 1, c.caller_cap)
                       ).select("sh")
        if hot.height == 0 or c.read_peak_lo <= c.peak_lo:
            return s.with_columns(pl.lit(False).alias("_read_only"))
        ev = features.events.select("sh", "server", "tool").join(hot, on="sh", how="semi")
        ro = self._reads(ev).group_by("sh").agg(pl.col("_read").all().alias("_read_only"))
        return s.join(ro, on="sh", how="left").with_columns(
            pl.col("_read_only").fill_null(False))

    def _reads(self, calls: pl.DataFrame) -> pl.DataFrame:
        """``calls`` (with ``server``, ``tool``) plus ``_read``: the tool's role reads or
        lists/searches (null where the role is unknown: left out of an ``all``)."""
        roles = tool_table(calls.select("server", "tool").unique(), self.config).select(
            "server", "tool",
            pl.col("tool_role").is_in(["read", "list_search"]).alias("_read"))
        return calls.join(roles, on=["server", "tool"], how="left", nulls_equal=True)

    def _callers(self, features: FeatureSet) -> pl.DataFrame:
        """Entity rows: each caller's peak in flight across its sessions, per window."""
        c = self.settings
        cp, swept = _caller_sweep(features)
        if cp.height == 0:
            return pl.DataFrame()
        own = getattr(self, "caller_own_", None)
        if own is not None and own.height:
            cp = cp.join(own.select("ceh", "usual_peak", "own_sessions"), on="ceh", how="left")
        else:
            cp = cp.with_columns(pl.lit(None, pl.Float64).alias("usual_peak"),
                                 pl.lit(None, pl.UInt32).alias("own_sessions"))
        pop = getattr(self, "pop_peak_", None)
        peak = pl.col("peak")
        terms = [band(peak, c.caller_peak_lo, c.caller_peak_hi)]
        if pop is not None:
            terms.append(gate(peak / max(pop, 1.0), c.pop_ratio_lo))
        terms.append(
            pl.when(pl.col("usual_peak").is_not_null())
            .then(gate(peak / pl.col("usual_peak").clip(lower_bound=1.0), c.self_ratio_lo))
            .otherwise(1.0)
        )
        cp = cp.with_columns(all_of(*terms).alias("score"), pl.lit(pop, pl.Float64)
                             .alias("pop_peak"))
        hot = cp.filter(pl.col("score") >= self.threshold)
        if hot.height == 0:
            return pl.DataFrame()
        # Who was in flight at the peak: how many sessions, and how much the busiest held.
        names = features.sessions.select("sh", "session_id")
        tools = features.events.select("tlh", "tool").unique("tlh")
        live = (
            swept.join(hot.select("ceh", "w", "peak_t"), on="ceh", how="inner")
            .filter((pl.col("s") <= pl.col("peak_t")) & (pl.col("e") > pl.col("peak_t")))
        )
        per_s = live.group_by("ceh", "w", "sh").agg(pl.len().alias("n"))
        lim = 50
        sess = per_s.join(names, on="sh", how="left").sort("n", "session_id",
                                                             descending=[True, False])
        sess = sess.group_by("ceh", "w", maintain_order=True).agg(
            pl.len().cast(pl.Int64).alias("n_sessions"),
            pl.col("n").max().cast(pl.Int64).alias("top_session_peak"),
            pl.col("session_id").head(lim).alias("session_ids"),
        )
        per_tool = (
            live.join(tools, on="tlh", how="left").group_by("ceh", "w", "tool")
            .agg(pl.len().alias("n"))
            .sort(["ceh", "w", "n", "tool"], descending=[False, False, True, False])
            .group_by("ceh", "w", maintain_order=True)
            .agg((pl.col("tool").fill_null("?") + " ×" + pl.col("n").cast(pl.String))
                 .head(8).alias("peak_tools"))
        )
        win = live.group_by("ceh", "w").agg(
            pl.col("s").min().alias("win_start"), pl.col("e").max().alias("win_end"),
            pl.len().cast(pl.Int64).alias("calls"), pl.col("basis_iv").first(),
        )
        hot = (hot.join(sess, on=["ceh", "w"], how="left")
               .join(per_tool, on=["ceh", "w"], how="left")
               .join(win, on=["ceh", "w"], how="left"))
        share = pl.col("top_session_peak") / pl.col("peak").clip(lower_bound=1)
        # As for a session: a fan-out of reads only (dashboards opened in several tabs)
        # counts from read_peak_lo's share of peak_lo more calls than one with writes.
        read_term = pl.lit(1.0)
        if c.read_peak_lo > c.peak_lo:
            pairs = features.events.select("tlh", "server", "tool").unique("tlh")
            ro = (live.select("ceh", "w", "tlh")
                  .join(self._reads(pairs).select("tlh", "_read"), on="tlh", how="left")
                  .group_by("ceh", "w")
                  .agg(pl.col("_read").all().alias("_read_only")))
            hot = hot.join(ro, on=["ceh", "w"], how="left")
            read_term = pl.when(pl.col("_read_only").fill_null(False)).then(
                band(pl.col("peak") * (c.peak_lo / c.read_peak_lo), c.caller_peak_lo,
                     c.caller_peak_hi)).otherwise(1.0)
        hot = hot.with_columns(
            all_of(
                pl.col("score"),
                read_term,
                gate(pl.col("n_sessions"), self.config.entity_min_sessions),
                gate(c.caller_max_session_share / share, 1.0),
            ).alias("score"),
            pl.lit(0, pl.Int8).alias("et"), pl.col("ceh").alias("eh"),
        )
        named = entity_names(hot, features.sessions)
        return named.select(
            "entity_type", "entity_id", pl.col("w").alias("window_start"), "score",
            pl.lit(None, pl.String).alias("session_id"),
            pl.col("entity_id").alias("caller_id"),
            pl.lit(None, pl.String).alias("client_ip"),
            pl.lit(None, pl.String).alias("server"),
            pl.col("win_start").alias("first_t"), pl.col("win_end").alias("last_t"),
            "calls", "peak", "peak_t", "basis_iv", "usual_peak", "own_sessions", "pop_peak",
            "win_start", "win_end", "peak_tools", pl.lit("caller").alias("scope"),
            *list(_CALLER_COLS),
            *[pl.lit(None, dt).alias(k) for k, dt in _SESSION_COLS.items()],
        )

    def _evidence(
        self, out: pl.DataFrame, swept: pl.DataFrame, features: FeatureSet
    ) -> pl.DataFrame:
        """Tools and window of the calls in flight at the peak, for flagged sessions."""
        hot = out.filter(pl.col("score") >= self.threshold).select("session_id", "peak_t")
        empty = out.with_columns(
            pl.lit(None, pl.Int64).alias("win_start"),
            pl.lit(None, pl.Int64).alias("win_end"),
            pl.lit(None, pl.List(pl.String)).alias("peak_tools"),
        )
        if hot.height == 0:
            return empty
        names = features.sessions.select("sh", "session_id")
        hot = hot.join(names, on="session_id", how="left")
        tools = features.events.select("tlh", "tool").unique("tlh")
        live = (
            swept.join(hot.select("sh", "peak_t"), on="sh", how="inner")
            .filter((pl.col("s") <= pl.col("peak_t")) & (pl.col("e") > pl.col("peak_t")))
            .join(tools, on="tlh", how="left")
        )
        per_tool = (
            live.group_by("sh", "tool").agg(pl.len().alias("n"))
            .sort(["sh", "n", "tool"], descending=[False, True, False])
            .group_by("sh", maintain_order=True)
            .agg((pl.col("tool").fill_null("?") + " ×" + pl.col("n").cast(pl.String))
                 .head(8).alias("peak_tools"))
        )
        win = live.group_by("sh").agg(
            pl.col("s").min().alias("win_start"), pl.col("e").max().alias("win_end")
        )
        ev = hot.join(win, on="sh", how="left").join(per_tool, on="sh", how="left")
        return out.join(
            ev.select("session_id", "win_start", "win_end", "peak_tools"),
            on="session_id", how="left",
        )

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons with the peak, its window and tools, and the usual peaks."""
        peak = row.get("peak") or 0
        iv = bool(row.get("basis_iv"))
        span = ((row.get("win_end") or 0) - (row.get("win_start") or 0)) / 1e6
        tools = ", ".join(row.get("peak_tools") or [])
        caller = row.get("scope") == "caller"
        if caller and iv:
            reasons = [
                f"{peak} calls of caller {row.get('entity_id')} in flight at the same moment "
                f"({_iso_ms(row.get('peak_t'))}) across {row.get('n_sessions')} sessions, "
                f"none holding more than {row.get('top_session_peak')} of them, within a "
                f"{duration(span)} window: {tools}."
            ]
        elif caller:
            reasons = [
                f"{peak} calls of caller {row.get('entity_id')} started within "
                f"{self.settings.burst_window_ms:g} ms ({_iso_ms(row.get('peak_t'))}) across "
                f"{row.get('n_sessions')} sessions, none holding more than "
                f"{row.get('top_session_peak')} of them: {tools}. The log lines carry no "
                "durations, so this is the call rate in short windows, not calls in flight."
            ]
        elif iv:
            reasons = [
                f"{peak} calls in flight at the same moment ({_iso_ms(row.get('peak_t'))}), "
                f"within a {duration(span)} window of {row.get('calls')} calls: {tools}."
            ]
        else:
            reasons = [
                f"{peak} calls started within "
                f"{self.settings.burst_window_ms:g} ms ({_iso_ms(row.get('peak_t'))}): {tools}. "
                "The log lines carry no durations, so this is the call rate in short "
                "windows, not calls in flight."
            ]
        refused = row.get("refused") or 0
        if refused and not caller:
            reasons.append(
                f"{refused} of the session's calls were refused by the server for a limit "
                f"(rate_limited / concurrency limit reached); counted as attempts, the calls "
                f"actually served peaked at {row.get('served_peak') or 0} in flight."
            )
        if row.get("sustained") and not caller:
            reasons.append(
                f"The session went over {self.settings.caller_cap} calls in flight "
                f"{row.get('waves')} separate times, each time on new arguments "
                "(seed 004's per-caller limit)."
            )
        pop = row.get("pop_peak")
        usual = row.get("usual_peak")
        parts = []
        unit = "window" if caller else "session"
        if pop is not None:
            parts.append(f"a typical busy session peaks at {pop:g}")
        if usual is not None:
            parts.append(f"this caller's usual peak is {usual:g} over "
                         f"{row.get('own_sessions')} {unit}s")
        else:
            parts.append("the caller has no established history of parallel calls")
        reasons.append("For comparison, " + "; ".join(parts) + ".")
        evidence = clean(
            {
                "peak_in_flight": peak,
                # Not "basis" (events|summary in the alert schema): how the peak was counted.
                "peak_basis": "intervals" if iv else "call_rate",
                "burst_window_ms": None if iv else self.settings.burst_window_ms,
                "peak_at": _iso_ms(row.get("peak_t")),
                "refused_calls": (row.get("refused") or None) if not caller else None,
                "served_peak": row.get("served_peak") if row.get("refused") else None,
                "waves_over_cap": row.get("waves") if row.get("sustained") else None,
                # Not window_start/end: the alert schema keeps those for an entity alert's
                # window (and then requires session_ids / n_sessions beside them).
                "in_flight_from": _iso_ms(row.get("win_start")),
                "in_flight_to": _iso_ms(row.get("win_end")),
                "tools": row.get("peak_tools"),
                "calls": row.get("calls"),
                "population_typical_peak": pop,
                "caller_usual_peak": usual,
                "caller_sessions" if not caller else "caller_windows": row.get("own_sessions"),
                "scope": "caller" if caller else None,
                "sessions_in_flight": row.get("n_sessions") if caller else None,
                "largest_session_in_flight": row.get("top_session_peak") if caller else None,
            }
        )
        return reasons, evidence


# --------------------------------------------------------------------------- races
def _cached_annotation(features: FeatureSet) -> pl.DataFrame | None:
    """:func:`toolwatch.detectors.tools.annotated` of the feature set if some detector computed it.

    Annotating every event costs more than the race detector's own work on the few
    mutating calls, so it is reused when present and not computed for this alone.
    """
    done = getattr(features, "_tools_annotated", None)
    return done if done is not None and done.height == features.events.height else None


_CALL = pl.Struct(
    {"tool": pl.String, "start": pl.Int64, "end": pl.Int64, "resource": pl.String,
     "outcome": pl.String, "overlap_ms": pl.Float64, "session_id": pl.String}
)
_RACE_COLS: dict[str, pl.DataType] = {
    "race_calls": pl.Int64(),
    "races": pl.Int64(),
    "ok_calls": pl.Int64(),
    "max_overlap_ms": pl.Float64(),
    "n_sessions": pl.Int64(),
    "calls_listed": pl.List(_CALL),
    # Entity rows: every session holding one of the window's racing calls (the listed calls
    # are capped; the analyst still needs each session of a cross-session race).
    "session_ids": pl.List(pl.String()),
}


def race_clusters(
    iv: pl.DataFrame, key: str = "g", min_overlap_us: int = 0
) -> pl.DataFrame:
    """Label chains of overlapping intervals within each group (columnar).

    Rows are sorted by (``key``, ``s``); a row joins the previous cluster when it starts
    more than ``min_overlap_us`` before the running maximum of the earlier ends in its
    group. Adds ``cluster`` (global id), ``overlap_us`` (with the earlier calls; 0 for a
    cluster's first call) and ``cluster_n`` (calls in the cluster).
    """
    iv = iv.sort([key, "s"])
    prev_end = pl.col("e").cum_max().shift(1).over(key)
    iv = iv.with_columns(prev_end.alias("_pe"))
    joins = pl.col("_pe").is_not_null() & (pl.col("_pe") - pl.col("s") > min_overlap_us)
    iv = iv.with_columns(
        (~joins).cum_sum().alias("cluster"),
        pl.when(joins).then(pl.min_horizontal("_pe", "e") - pl.col("s")).otherwise(0)
        .alias("overlap_us"),
    ).drop("_pe")
    return iv.with_columns(pl.len().over("cluster").alias("cluster_n"))


class RaceConditionDetector(Detector):
    """Flags overlapping mutating calls on one resource from one actor."""

    name = "race_rules"
    category = "race_condition"
    config_key = "race_condition"
    summary = "Mutating calls on the same resource / business key whose intervals overlap."

    def _clusters(self, features: FeatureSet) -> pl.DataFrame:
        c = self.settings
        ev = features.events
        if ev.height == 0:
            return pl.DataFrame()
        cols = ["i", "sh", "ceh", "ieh", "t", "session_id", "server", "tool", "args",
                "resource_key", "resource_id", "status", "duration_ms", "start_ts", "end_ts"]
        done = _cached_annotation(features)
        if done is not None:
            # The sequence detectors annotated every event already: reuse it.
            cand = done.filter(pl.col("mutates"))
            cand = pl.concat([cand, event_intervals(cand)], how="horizontal").filter("has_iv")
        else:
            # Roles are decided per distinct (server, tool): find the pairs on their two
            # hashes (a unique over two string columns of every event cost more than the
            # rest); tool_table then dedupes the few rows found on the strings themselves.
            pair = pl.struct(pl.col("server").hash(7), "tlh")
            pairs = ev.filter(pair.is_first_distinct()).select("server", "tool")
            table = tool_table(pairs, self.config).filter(pl.col("mutates"))
            if table.height == 0:
                return pl.DataFrame()
            # The few mutating tools first (a filter on one string column), then exact roles.
            cand = ev.select(cols).filter(pl.col("tool").is_in(table["tool"].implode())).join(
                table.select("server", "tool"), on=["server", "tool"], how="semi",
                nulls_equal=True,
            )
            cand = pl.concat([cand, event_intervals(cand)], how="horizontal").filter("has_iv")
            if cand.height < c.calls_lo:
                return pl.DataFrame()
            cand = annotate(cand, self.config)
        # A mutation with no business key races on the session's own state when the same
        # tool with the same arguments is in flight twice in one session (seed 004's lost
        # update on a session's usage counter, increment_usage({amount: 1}) x N at once).
        # Across sessions nothing says two keyless calls touch one thing (two tabs each
        # creating a cart).
        cand = cand.with_columns(pl.coalesce(
            "bkh", pl.struct("sh", pl.col("tool"), pl.col("args").fill_null("")).hash(7)
        ).alias("bkh"))
        if cand.height < c.calls_lo:
            return pl.DataFrame()
        actor_t = (
            pl.when(pl.col("ceh").is_not_null()).then(0)
            .when(pl.col("ieh").is_not_null()).then(1).otherwise(2).cast(pl.Int8)
        )
        cand = cand.with_columns(
            actor_t.alias("at"),
            pl.coalesce("ceh", "ieh", "sh").alias("ah"),
        ).with_columns(pl.struct("at", "ah", "bkh").hash(7).alias("g"))
        cl = race_clusters(
            cand.select("g", "s", "e", "at", "ah", "sh", "i"),
            "g", int(c.min_overlap_ms * 1000),
        ).filter(pl.col("cluster_n") >= c.calls_lo)
        if cl.height == 0:
            return pl.DataFrame()
        info = cand.select("i", "tool", "bk", "status", "session_id")
        return cl.join(info, on="i", how="left")

    def score(self, features: FeatureSet) -> pl.DataFrame:
        """Session rows for every session plus entity-window rows for cross-session races."""
        c = self.settings
        cl = self._clusters(features)
        base = session_frame(features.sessions, pl.lit(0.0), [])
        if cl.height == 0:
            return base.with_columns(
                *[pl.lit(None, dt).alias(k) for k, dt in _RACE_COLS.items()]
            )
        per = cl.group_by("cluster").agg(
            pl.len().alias("n"),
            pl.col("sh").n_unique().alias("n_sessions"),
            (pl.col("status") == "ok").sum().alias("ok"),
            pl.col("s").min().alias("first_t"),
            pl.col("e").max().alias("last_t"),
            (pl.col("overlap_us").max() / 1000.0).alias("max_overlap_ms"),
            pl.col("at").first(), pl.col("ah").first(), pl.col("sh").first().alias("sh0"),
            pl.col("session_id").unique().alias("_sids"),
        )
        n_score = band(pl.col("n"), c.calls_lo, c.calls_hi)
        per = per.with_columns(
            pl.max_horizontal(
                n_score, pl.when(pl.col("ok") >= 2).then(c.ok_score).otherwise(0.0)
            ).alias("cscore")
        )
        # Ties on start (parallel calls logged in the same millisecond) are common: a full
        # sort key keeps the evidence's call list the same from run to run.
        calls = cl.sort("s", "e", "tool", "session_id", "status", nulls_last=True).group_by(
            "cluster", maintain_order=True
        ).agg(
            pl.struct(
                pl.col("tool"), pl.col("s").alias("start"), pl.col("e").alias("end"),
                pl.col("bk").alias("resource"), pl.col("status").alias("outcome"),
                (pl.col("overlap_us") / 1000.0).alias("overlap_ms"), pl.col("session_id"),
            ).alias("calls_listed")
        )
        per = per.join(calls, on="cluster", how="left")
        single = per.filter(pl.col("n_sessions") == 1)
        multi = per.filter((pl.col("n_sessions") > 1) & (pl.col("at") < 2))
        out = base.drop("score").join(
            self._agg(single, ["sh0"]).rename({"sh0": "sh"}).join(
                features.sessions.select("sh", "session_id"), on="sh"
            ).drop("sh"),
            on="session_id", how="left", suffix="_r",
        )
        out = out.with_columns(
            pl.lit(None, pl.List(pl.String)).alias("session_ids"),
            pl.col("score").fill_null(0.0),
            pl.coalesce("first_t_r", "first_t").alias("first_t"),
            pl.coalesce("last_t_r", "last_t").alias("last_t"),
        ).drop("first_t_r", "last_t_r").select(base.columns + list(_RACE_COLS))
        if multi.height == 0:
            return out
        ent = self._entities(multi, features)
        return pl.concat([out, ent.select(out.columns)], how="vertical_relaxed")

    def _agg(self, per: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
        lim = self.settings.max_listed_calls
        return per.sort("cscore", "n", descending=True).group_by(keys, maintain_order=True).agg(
            pl.col("cscore").max().alias("score"),
            pl.col("n").max().alias("race_calls"),
            pl.len().alias("races"),
            pl.col("ok").max().cast(pl.Int64).alias("ok_calls"),
            pl.col("max_overlap_ms").max(),
            pl.col("n_sessions").max().cast(pl.Int64),
            pl.col("first_t").min(),
            pl.col("last_t").max(),
            pl.col("calls_listed").list.explode(keep_nulls=False, empty_as_null=False).head(lim),
        ).with_columns(pl.col("race_calls").cast(pl.Int64), pl.col("races").cast(pl.Int64))

    def _entities(self, multi: pl.DataFrame, features: FeatureSet) -> pl.DataFrame:
        multi = multi.with_columns(
            window_starts(pl.col("first_t"), self.config, 0).alias("w"),
            pl.col("at").alias("et"), pl.col("ah").alias("eh"),
        )
        agg = self._agg(multi, ["et", "eh", "w"]).join(
            multi.group_by("et", "eh", "w").agg(
                pl.col("_sids").list.explode(keep_nulls=False, empty_as_null=False)
                .unique().sort().alias("session_ids")),
            on=["et", "eh", "w"], how="left")
        named = entity_names(agg, features.sessions)
        return named.select(
            "entity_type",
            "entity_id",
            pl.col("w").alias("window_start"),
            "score",
            pl.lit(None, pl.String).alias("session_id"),
            pl.when(pl.col("et") == 0).then(pl.col("entity_id")).alias("caller_id"),
            pl.when(pl.col("et") == 1).then(pl.col("entity_id")).alias("client_ip"),
            pl.lit(None, pl.String).alias("server"),
            "first_t",
            "last_t",
            *list(_RACE_COLS),
        )

    def explain(self, row: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Reasons naming the racing calls, their resource and the overlap."""
        listed = row.get("calls_listed") or []
        res = next((x["resource"] for x in listed if x.get("resource")), "?")
        tools = sorted({x["tool"] for x in listed if x.get("tool")})
        where = (
            "in one session" if row["entity_type"] == "session"
            else f"across {row.get('n_sessions')} sessions of {row['entity_type']} "
                 f"{row['entity_id']}"
        )
        reasons = [
            f"{row.get('race_calls')} mutating calls ({', '.join(tools)}) on {res} were in "
            f"flight at the same time {where}, overlapping by up to "
            f"{row.get('max_overlap_ms') or 0:.0f} ms: each could pass the same check "
            "before any of them wrote."
        ]
        if (row.get("ok_calls") or 0) >= 2:
            reasons.append(f"{row['ok_calls']} of them succeeded.")
        if (row.get("races") or 0) > 1:
            reasons.append(f"{row['races']} such races in all.")
        evidence = clean(
            {
                "racing_calls": row.get("race_calls"),
                "races": row.get("races"),
                "succeeded": row.get("ok_calls"),
                "max_overlap_ms": row.get("max_overlap_ms"),
                "sessions": row.get("n_sessions"),
                "resource": res,
                # Not "calls" (a count in the alert schema): the racing calls themselves.
                "overlapping_calls": [
                    {"tool": x["tool"], "start": _iso_ms(x["start"]), "end": _iso_ms(x["end"]),
                     "resource": x["resource"], "outcome": x["outcome"],
                     "overlap_ms": round(x["overlap_ms"] or 0.0, 1),
                     "session_id": x["session_id"]}
                    for x in listed
                ],
            }
        )
        return reasons, evidence

