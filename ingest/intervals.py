"""When each call was in flight: start and end times from what a log line carries.

A per-call line may carry both ends (``start_ts`` / ``end_ts`` and their aliases), or one
timestamp plus a duration (``duration_ms`` and aliases in milliseconds, ``duration_s`` and
aliases in seconds). By default the single timestamp marks the call's **completion** (as
access logs do), so the start is ``ts - duration``; ``ingest.ts_marks = "start"`` declares
the opposite. JSON-RPC transcripts give both ends directly (:mod:`toolwatch.ingest.pair`).

The parser's one SQL statement uses the macros below (DuckDB inlines them), so intervals
cost a few expressions per row and no extra pass. Hostile values never crash and never
produce an interval that runs backwards: a duration that is not a finite number in
``[0, MAX_DURATION_MS]`` is null, as is a start/end pair whose end precedes its start or
lies more than that apart; times outside 2000–2100 are ignored.
"""

from __future__ import annotations

#: Longest plausible call (1 day). Beyond it a duration is taken as garbage, not a call
#: that really ran for weeks (which would put it "in flight" at every moment of a replay).
MAX_DURATION_MS = 86_400_000.0

#: Longest duration *stored* in ``duration_ms`` (~31.7 years, the bound the ``sessions``
#: view also uses). A ``SESSION_END`` summary's duration is a session's length, which may
#: well exceed a day; only the call interval (``start_ts``/``end_ts``) keeps the 1-day bound.
MAX_STORED_DURATION_MS = 1e12

#: Values of ``ingest.ts_marks``.
TS_MARKS = ("end", "start")

MACROS_SQL = f"""
CREATE OR REPLACE MACRO tw_okdur(d) AS
    CASE WHEN isfinite(d) AND d >= 0 AND d <= {MAX_DURATION_MS} THEN d END;
CREATE OR REPLACE MACRO tw_okdur_stored(d) AS
    CASE WHEN isfinite(d) AND d >= 0 AND d <= {MAX_STORED_DURATION_MS} THEN d END;
CREATE OR REPLACE MACRO tw_plausible(x) AS
    CASE WHEN x >= TIMESTAMPTZ '2000-01-01' AND x <= TIMESTAMPTZ '2100-01-01' THEN x END;
CREATE OR REPLACE MACRO tw_time(s) AS CASE WHEN s IS NOT NULL THEN
    tw_plausible(coalesce(tw_epoch(try_cast(s AS DOUBLE)), try_cast(s AS TIMESTAMPTZ))) END;
CREATE OR REPLACE MACRO tw_us(d) AS CAST(round(d * 1000.0) AS BIGINT);
CREATE OR REPLACE MACRO tw_shift(t, us) AS coalesce(make_timestamptz(epoch_us(t) + us), t);
CREATE OR REPLACE MACRO tw_pair_ok(st, en) AS
    st IS NOT NULL AND en IS NOT NULL AND en >= st
    AND epoch_us(en) - epoch_us(st) <= {MAX_DURATION_MS * 1000:.0f};
CREATE OR REPLACE MACRO tw_iv_start(ts, st, en, d, mark_end) AS CASE
    WHEN tw_pair_ok(st, en) THEN st
    WHEN d IS NULL THEN NULL
    WHEN st IS NOT NULL THEN st
    WHEN en IS NOT NULL THEN tw_shift(en, -tw_us(d))
    WHEN mark_end THEN tw_shift(ts, -tw_us(d))
    ELSE ts END;
CREATE OR REPLACE MACRO tw_iv_end(ts, st, en, d, mark_end) AS CASE
    WHEN tw_pair_ok(st, en) THEN en
    WHEN d IS NULL THEN NULL
    WHEN st IS NOT NULL THEN tw_shift(st, tw_us(d))
    WHEN en IS NOT NULL THEN en
    WHEN mark_end THEN ts
    ELSE tw_shift(ts, tw_us(d)) END;
"""
#: Times are shifted as microseconds since the epoch (``tw_shift``), not with
#: ``TIMESTAMPTZ -/+ INTERVAL``: that arithmetic is ICU's and depends on the session's
#: time zone, so DuckDB 2.0 binds and optimizes a prepared statement using it again at
#: every execution (~20 ms per parse call). The same instants come out (the parser's
#: session is UTC, where an interval of microseconds is a plain offset); an infinite time
#: stays itself, as ICU keeps it. Only a time within a day of the TIMESTAMPTZ range's ends
#: differs: both raise, with another message (the line is quarantined either way).


def input_columns(first: object) -> str:
    """Select-list items of the parser's field CTE: the raw interval fields as text.

    ``first`` is the parser's ``first(canonical) -> SQL`` helper (first alias present).
    """
    return (
        f"{first('start_ts')} AS iv_start_s, {first('end_ts')} AS iv_end_s, "  # type: ignore[operator]
        f"{first('duration_s')} AS iv_dur_sec_s,"  # type: ignore[operator]
    )


def derived_columns() -> str:
    """Select-list items computed once per row from :func:`input_columns`' fields.

    ``iv_st`` / ``iv_en``: the start/end times (plausible ones only); ``iv_draw``: the
    duration in milliseconds as logged (``duration_ms``, else ``duration_s`` x 1000), not
    yet bounded. :func:`output_columns` refers to these names several times each: DuckDB
    inlines macros, so passing the expressions instead parsed each text up to 8 times.
    Expects ``duration_d`` (the millisecond field as a double) in scope.
    """
    return (
        "tw_time(iv_start_s) AS iv_st, tw_time(iv_end_s) AS iv_en, "
        "coalesce(duration_d, try_cast(iv_dur_sec_s AS DOUBLE) * 1000.0) AS iv_draw"
    )


def output_columns(ts_marks: str) -> str:
    """Final select-list items: ``duration_ms``, ``start_ts``, ``end_ts``.

    Expects ``ts_parsed`` and the columns of :func:`derived_columns` in scope.
    """
    if ts_marks not in TS_MARKS:
        from toolwatch.errors import ConfigError

        raise ConfigError(f"must be one of {TS_MARKS}, not {ts_marks!r}", key="ingest.ts_marks")
    mark_end = "true" if ts_marks == "end" else "false"
    args = f"ts_parsed, iv_st, iv_en, tw_okdur(iv_draw), {mark_end}"
    return (
        "coalesce(tw_okdur_stored(iv_draw), CASE WHEN tw_pair_ok(iv_st, iv_en) THEN "
        "epoch_us(iv_en) / 1000.0 - epoch_us(iv_st) / 1000.0 END)"
        " AS duration_ms,\n"
        f"  tw_iv_start({args}) AS start_ts,\n"
        f"  tw_iv_end({args}) AS end_ts,"
    )
