"""The bounded detection window: recent events per active entity."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import polars as pl
import pyarrow as pa

from toolwatch import schema

log = logging.getLogger("toolwatch.live")

#: Alert ``entity_type`` -> event column that identifies the entity.
ENTITY_COLUMNS: dict[str, str] = {
    "session": "session_id",
    "caller_id": "caller_id",
    "client_ip": "client_ip",
    "credential_hash": "credential_hash",
}

_US = 1_000_000


def window_columns() -> list[str]:
    """Event columns the detection window keeps: what the detectors read, plus ids.

    The detectors declare the columns they read (``detectors.features.EVENT_COLUMNS``);
    everything else of an event (``raw``, ``source``, ``status_raw``, offsets, …) is only
    needed in the store, and holding it for up to ``max_window_events`` rows would
    dominate live mode's memory and the cost of every window copy. ``event_id`` is kept
    to de-duplicate baseline history, ``source_fp`` to drop a revoked Kafka partition.
    """
    try:
        from toolwatch.detectors.features import EVENT_COLUMNS

        wanted = set(EVENT_COLUMNS)
    except ImportError:  # no detectors: keep everything (detection is off anyway)
        wanted = set(schema.EVENTS.names)
    wanted |= set(_ID_COLUMNS)
    return [n for n in schema.EVENTS.names if n in wanted]


#: Columns every window keeps: identity, time, stream, and the entity keys.
_ID_COLUMNS = [
    n for n in schema.EVENTS.names
    if n in {"event_id", "ts", "source_fp", *ENTITY_COLUMNS.values()}
]


class DetectionWindow:
    """Recent events (and session summaries) per active entity, bounded.

    Rows are kept while their session is active (an event within
    ``session_idle_minutes`` of the watermark) or while they are younger than
    ``window_minutes``; the watermark is the newest event time seen minus the
    out-of-order tolerance. ``max_events`` caps the total whatever happens (oldest first).
    Only the columns the detectors read are held (:func:`window_columns`).

    Parameters
    ----------
    window_minutes
        Retention of events of finished sessions (log time).
    session_idle_minutes
        Inactivity after which a session is finished.
    tolerance_s
        Out-of-order tolerance: expiry and lateness are judged against the newest event
        time minus this.
    max_events
        Hard cap on held events.
    columns
        Event columns held (default: :func:`window_columns`).
    """

    def __init__(
        self,
        window_minutes: float,
        session_idle_minutes: float,
        tolerance_s: float,
        max_events: int,
        columns: list[str] | None = None,
    ):
        self.window_us = int(window_minutes * 60 * _US)
        self.idle_us = int(session_idle_minutes * 60 * _US)
        self.tolerance_us = int(tolerance_s * _US)
        self.max_events = max_events
        self.columns = window_columns() if columns is None else columns
        self.events: pl.DataFrame | None = None
        self.summaries: pl.DataFrame | None = None
        self.newest_us: int | None = None
        #: Last event time (µs) per session, one row per session: a frame, not a dict, so
        #: updating it for a 100k-event micro-batch is one join, not 100k Python steps.
        self.session_last = pl.DataFrame(schema={"session_id": pl.String, "t": pl.Int64})
        self.evicted = 0
        self.late = 0
        #: Whether the last :meth:`select` left touched events out (``newest``).
        self.select_capped = False
        self._since_expire = 0
        #: Rows added since expiry last copied the held strings (see :meth:`expire`).
        self._since_copy = 0

    @property
    def size(self) -> int:
        """Events held."""
        return 0 if self.events is None else self.events.height

    @property
    def watermark_us(self) -> int | None:
        """Newest event time minus the out-of-order tolerance (µs since epoch)."""
        return None if self.newest_us is None else self.newest_us - self.tolerance_us

    def active_sessions(self) -> int:
        """Sessions with an event within ``session_idle_minutes`` of the newest event."""
        if self.newest_us is None:
            return 0
        cut = self.newest_us - self.idle_us
        return int((self.session_last["t"] >= cut).sum())

    def slim(self, events: pl.DataFrame) -> pl.DataFrame:
        """The window's view of event rows (its columns only)."""
        return events.select([c for c in self.columns if c in events.columns])

    def add(self, events: pl.DataFrame, summaries: pl.DataFrame) -> None:
        """Append new rows (any order), count late ones, track session activity."""
        if events.height:
            ts = events["ts"].dt.epoch("us")
            wm = self.watermark_us
            if wm is not None:
                self.late += int((ts < wm).sum())
            mx = ts.max()
            if mx is not None:
                self.newest_us = max(self.newest_us or mx, int(mx))  # type: ignore[arg-type]
            per = (
                events.lazy()
                .filter(pl.col("session_id").is_not_null())
                .group_by("session_id")
                .agg(pl.col("ts").max().dt.epoch("us").alias("t"))
            )
            self.session_last = _own_strings(
                pl.concat([self.session_last.lazy(), per])
                .group_by("session_id")
                .agg(pl.col("t").max())
                .collect()
            )
            # The new rows' strings get buffers of their own now (~3 ms per 10k rows), so
            # the window never pins a parse batch's buffers; expiry then needs to copy the
            # held strings only now and then (see expire).
            slim = _own_strings(self.slim(events))
            self.events = (
                slim if self.events is None else pl.concat([self.events, slim], rechunk=False)
            )
            self._since_expire += events.height
            self._since_copy += events.height
        if summaries.height:
            self.summaries = (
                summaries
                if self.summaries is None
                else pl.concat([self.summaries, summaries], rechunk=False)
            )
        if self.size > self.max_events or self._since_expire > max(10_000, self.size // 4):
            self.expire()

    def select(
        self, touched: dict[str, pl.Series], newest: int | None = None
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Events and summaries of every touched entity, over the whole window.

        ``touched`` maps an entity column to the distinct ids the micro-batch touched.
        ``newest``: at most that many events, the newest by log time (sorted);
        :attr:`select_capped` tells whether more were touched. The cut is made before
        the sort on the ``ts`` column alone, so neither a sorted copy of every touched
        event nor the slice's parent outlives the selection (under dense traffic every
        micro-batch touches nearly the whole window).
        """
        self.select_capped = False

        def cond_for(df: pl.DataFrame) -> pl.Expr | None:
            cond = None
            for col, ids in touched.items():
                if not len(ids) or col not in df.columns:
                    continue
                c = pl.col(col).is_in(ids.implode())
                cond = c if cond is None else (cond | c)
            return cond

        ev = self.slim(_empty_events()) if self.events is None else self.events.clear()
        if self.events is not None:
            c = cond_for(self.events)
            if c is not None:
                if newest is not None:
                    mask = self.events.select(c.fill_null(False).alias("m"))["m"]
                    if int(mask.sum()) > newest:
                        self.select_capped = True
                        mask = _newest_mask(self.events["ts"], mask, newest)
                    ev = self.events.filter(mask).sort("ts")
                else:
                    ev = self.events.filter(c).sort("ts")
        su = _empty_summaries()
        if self.summaries is not None:
            c = cond_for(self.summaries)
            if ev.height:
                sess = pl.col("session_id").is_in(ev["session_id"].unique().implode())
                c = sess if c is None else (c | sess)
            if c is not None:
                su = self.summaries.filter(c)
        return ev, su

    def expire(self) -> None:
        """Drop rows of finished sessions older than the window, then enforce the cap."""
        self._since_expire = 0
        if self.events is None or self.newest_us is None:
            return
        wm = self.newest_us - self.tolerance_us
        idle_cut = wm - self.idle_us
        old_cut = wm - self.window_us
        # Finished sessions leave the activity index (bounded by active sessions).
        self.session_last = self.session_last.filter(pl.col("t") >= idle_cut)
        active = self.session_last["session_id"].implode()
        before = self.events.height
        ts = self.events["ts"]
        oldest = ts.dt.epoch("us").min()
        if ts.null_count() == 0 and oldest is not None and int(oldest) >= old_cut:  # type: ignore[arg-type]
            # Every held row is younger than the window (a window full by max_events, as
            # under a backlog): the filter would keep them all, so the session lookup
            # over every row (~3.5 ms for 150k) is skipped.
            ev = self.events
        else:
            keep = (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(
                active)
            ev = self.events.filter(keep)
        if ev.height > self.max_events:
            # Oldest first, without sorting the whole window: find the log time of the
            # max_events-th newest row on the ts column alone, keep rows from it on (ties
            # at that instant may keep a few more), and trim the rest in arrival order.
            cut = ev["ts"].top_k(self.max_events).min()
            ev = ev.filter(pl.col("ts") >= cut)
            if ev.height > self.max_events:
                ev = ev.tail(self.max_events)
        self.evicted += before - ev.height
        # Let go of the old frame before the strings are copied, then copy them one
        # column at a time: each column's old buffers are freed as soon as its copy is
        # made, so the copy costs one column, not a second window (measured: peak over the
        # window's RSS 77 -> see tests/test_memory_bounds.py).
        self.events = ev.rechunk()
        del ev
        # Copying every held string costs ~40 ms for 150k rows, and a full window expires
        # on every micro-batch: while catching up that was more CPU than the detection
        # passes (5 vs 3.5 CPU-s per 1M events). The rows added since the last copy own
        # their buffers (add), so what dropped rows can pin until the next copy is those
        # rows' strings plus the last copy's buffer: copy once max_events / 2 rows came.
        # The rows held are the same either way (tests/test_live_detect_window.py).
        if self._since_copy >= max(10_000, self.max_events // 2):
            self._since_copy = 0
            for name in _strings_with_buffers(self.events):
                self.events = self.events.with_columns(pl.col(name) + pl.lit(""))
        if self.summaries is not None:
            self.summaries = _own_strings(self.summaries.filter(
                (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(active)
            )).rechunk()

    def drop_streams(self, fps: Iterable[str]) -> int:
        """Forget rows read from the given streams (Kafka partitions revoked)."""
        fps = list(fps)
        if self.events is None or not fps:
            return 0
        before = self.events.height
        self.events = self.events.filter(~pl.col("source_fp").is_in(pl.Series(fps).implode()))
        if self.summaries is not None:
            self.summaries = self.summaries.filter(
                ~pl.col("source_fp").is_in(pl.Series(fps).implode())
            )
        return before - self.events.height


def _newest_mask(ts: pl.Series, mask: pl.Series, n: int) -> pl.Series:
    """``mask`` narrowed to its ``n`` rows with the newest ``ts`` (ties at the cut: the
    later rows), worked out on the ``ts`` column alone so no frame is copied twice.

    The same rows as ``df.filter(mask).sort("ts").tail(n)`` when the times are distinct.
    """
    sel = ts.filter(mask)
    cut = sel.top_k(n).min()
    if cut is None:  # no times to cut on (events always have one): keep the selection
        return mask
    keep = (mask & (ts > cut)).fill_null(False)
    need = n - int(keep.sum())
    if need > 0:
        at = (mask & (ts == cut)).fill_null(False).arg_true()
        keep = keep.scatter(at.tail(need), True)
    return keep


def _own_strings(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with its string columns copied into buffers of their own.

    A polars string column is a list of views into shared data buffers: filtering or
    grouping copies the views and keeps the buffers of *every* row they came from alive.
    The window keeps a few rows of each parsed micro-batch (long sessions, the newest
    events), so without this each of them pins its whole batch's strings (Arrow buffers
    exported by DuckDB or Arrow's pool): measured 0.5-0.8 KB of RSS per window event
    instead of its ~170 B; a 1% filter of a frame kept 100% of its string bytes.
    Concatenating an empty string writes new strings (``cast``/``shrink_to_fit``/
    ``rechunk``/``str.slice`` keep the views; tests/test_memory_bounds.py checks it still
    frees). A round trip through Arrow (``pl.Series(name, s.to_arrow())``) copied 2x
    faster alone, but the 1M-event backlog in-process ran slower with it, at +17-21 MiB
    peak RSS (session 8, two interleaved pairs): not used.
    """
    if df.height == 0:
        return df
    strs = _strings_with_buffers(df)
    if not strs:
        return df
    return df.with_columns(pl.col(strs) + pl.lit(""))


def _strings_with_buffers(df: pl.DataFrame) -> list[str]:
    """String columns of ``df`` that hold data buffers (the only ones a copy can free).

    A string of up to 12 bytes lives inside its 16-byte view; a column whose views
    point into no buffer (ids, statuses, short names) pins nothing, and copying it
    (~4 ms per 150k rows) frees nothing. Polars exports the views as Arrow
    ``string_view`` without copying (~0.05 ms a column), buffers listed.
    """
    out = []
    for name, dtype in df.schema.items():
        if dtype != pl.String:
            continue
        arr = df[name].to_arrow(compat_level=pl.CompatLevel.newest())
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        # buffers(): validity, views, then the data buffers (string_view only; a
        # large_string export would list offsets and data: copy to be safe)
        if any(not pa.types.is_string_view(c.type) or len(c.buffers()) > 2
               for c in chunks):
            out.append(name)
    return out


def _empty_events() -> pl.DataFrame:
    df = pl.from_arrow(pa.Table.from_batches([], schema=schema.EVENTS))  # not empty_table: pandas
    assert isinstance(df, pl.DataFrame)
    return df


def _empty_summaries() -> pl.DataFrame:
    df = pl.from_arrow(pa.Table.from_batches([], schema=schema.SUMMARIES))
    assert isinstance(df, pl.DataFrame)
    return df

