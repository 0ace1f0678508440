"""The detection engine's streaming state: the window, the alert tracker, the engine.

:class:`StreamDetector` is what every live command runs: a micro-batch goes into the
bounded :class:`DetectionWindow`, the events of every entity it touched are read back
from the window and scored by the detector function (``run_batch``, the engine batch
``analyze`` runs, in caller partitions when there are many: :mod:`.partition`), and the
:class:`AlertTracker` lets through only alerts that are new or changed. Alert ids are
functions of (entity, category, window) only, so they are the batch ids.

Pure state: no threads, no store, no clock. The live package decides when to detect and
with which caps (``toolwatch.live.detection``) and passes them in as plain arguments.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from toolwatch import schema

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
    # Imported here: a live process without detection builds a window of ids only and
    # never loads the feature code.
    from toolwatch.detectors.features import EVENT_COLUMNS

    wanted = set(EVENT_COLUMNS) | set(ID_COLUMNS)
    return [n for n in schema.EVENTS.names if n in wanted]


#: Columns every window keeps: identity, time, stream, and the entity keys.
ID_COLUMNS = [
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

        ev = self.slim(_empty(schema.EVENTS)) if self.events is None else self.events.clear()
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
        su = _empty(schema.SUMMARIES)
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


def _empty(sch: pa.Schema) -> pl.DataFrame:
    """A frame of ``sch`` with no rows (not ``empty_table``: that imports pandas)."""
    df = pl.from_arrow(pa.Table.from_batches([], schema=sch))
    assert isinstance(df, pl.DataFrame)
    return df


class AlertTracker:
    """Remembers the last stored version of each alert to emit only news.

    Parameters
    ----------
    max_alerts
        LRU bound on remembered alert ids.
    """

    def __init__(self, max_alerts: int = 200_000):
        self.max_alerts = max_alerts
        self._seen: OrderedDict[str, tuple[Any, ...]] = OrderedDict()

    @staticmethod
    def _sig(row: dict[str, Any]) -> tuple[Any, ...]:
        return (
            row.get("severity"),
            round(float(row.get("score") or 0.0), 6),
            row.get("evidence"),
            tuple(row.get("reasons") or ()),
            row.get("first_seen"),
            row.get("last_seen"),
        )

    def remember(self, rows: Iterable[dict[str, Any]]) -> None:
        """Record versions already stored (e.g. loaded from the store on startup)."""
        for r in rows:
            self._put(r["alert_id"], self._sig(r))

    def _put(self, aid: str, sig: tuple[Any, ...]) -> None:
        self._seen[aid] = sig
        self._seen.move_to_end(aid)
        while len(self._seen) > self.max_alerts:
            self._seen.popitem(last=False)

    def news(self, alerts: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
        """Alerts that are new or changed; returns ``(rows, n_new, n_updated)``.

        A version with *older* evidence than the remembered one (its last_seen earlier,
        e.g. computed after part of a window expired) is never emitted.
        """
        if alerts.height == 0:
            return alerts, 0, 0
        keep: list[int] = []
        n_new = n_upd = 0
        for i, r in enumerate(alerts.iter_rows(named=True)):
            aid = r["alert_id"]
            sig = self._sig(r)
            prev = self._seen.get(aid)
            if prev is None:
                n_new += 1
            elif prev == sig:
                self._seen.move_to_end(aid)
                continue
            else:
                prev_last = prev[5]
                if prev_last is not None and sig[5] is not None and sig[5] < prev_last:
                    continue
                n_upd += 1
            self._put(aid, sig)
            keep.append(i)
        return alerts[keep], n_new, n_upd

    def __len__(self) -> int:
        return len(self._seen)



#: ``(events, summaries, history=None) -> alerts``: the detectors' ``run_batch`` contract.
DetectFn = Callable[..., pl.DataFrame | None]


def retention_minutes(config: Any) -> float:
    """How long (log time) the window must hold events for the detectors to see whole
    entity windows and sessions: max(entity window, longest session)."""
    return max(float(config.entity_window_minutes), float(config.max_session_hours) * 60.0)


def engine_detector(
    config: Any, *, model_path: Path | None = None, data_dir: Path | None = None,
    suppress_unauthenticated: bool = False, isolated: bool = True,
) -> DetectFn:
    """The engine's detector function: :func:`~toolwatch.detectors.pipeline.run_batch`,
    then the analyst's suppressions, exactly as batch ``analyze`` applies them.

    Parameters
    ----------
    config
        :class:`~toolwatch.detectors.config.DetectorsConfig`.
    model_path
        A forest saved by ``train``; loaded (or fitted) once and reused by every call.
    data_dir
        The store whose ``_triage/suppressions.json`` is applied (read at every call, so
        a suppression made in the dashboard applies from the next call on); None: none.
    suppress_unauthenticated
        ``triage.suppress_unauthenticated_callers``.
    isolated
        Fit or load the forest in a short-lived child (a live process never imports
        scikit-learn).
    """
    from toolwatch.detectors.pipeline import run_batch
    from toolwatch.detectors.suppress import apply_triage_suppressions

    reuse: dict[str, Any] = {"live": isolated}

    def run(
        events: pl.DataFrame, summaries: pl.DataFrame | None,
        history: pl.DataFrame | None = None,
    ) -> pl.DataFrame:
        alerts = run_batch(events, summaries, config, history=history,
                           model_path=model_path, reuse=reuse)
        if data_dir is None:
            return alerts
        return apply_triage_suppressions(alerts, data_dir, events=events,
                                         unauthenticated=suppress_unauthenticated)

    return run


class StreamDetector:
    """The detection engine over a stream: detector function, window and tracker.

    A micro-batch goes through :meth:`add` (into the window; the entities it touched),
    ``window.select`` (those entities' events over the whole window), :meth:`score` (the
    detector function, in caller partitions when asked) and :meth:`news` (alerts of the
    touched entities that are new or changed). :meth:`update` runs the four in a row;
    the live engine runs them one by one, deciding between them when to detect and how
    much to read (``toolwatch.live.detection``).

    Parameters
    ----------
    detect
        ``(events, summaries, history=None) -> alerts`` (:func:`engine_detector`, or a
        test's rules); None: detection off (the window still holds rows).
    window
        The bounded window of recent events.
    tracker
        What was emitted already.
    """

    def __init__(self, detect: DetectFn | None, window: DetectionWindow,
                 tracker: AlertTracker):
        self.detect = detect
        self.window = window
        self.tracker = tracker

    @classmethod
    def from_config(
        cls, config: Any, *, model_path: Path | None = None, max_events: int = 1_000_000,
        max_alerts: int = 200_000,
    ) -> StreamDetector:
        """An engine over :func:`engine_detector`, holding :func:`retention_minutes`.

        Parameters
        ----------
        config
            :class:`~toolwatch.detectors.config.DetectorsConfig`.
        model_path
            A forest saved by ``train`` (else fitted on the first detection's data).
        max_events
            Cap on the window's events.
        max_alerts
            Alert ids the tracker remembers.
        """
        minutes = retention_minutes(config)
        return cls(engine_detector(config, model_path=model_path),
                   DetectionWindow(minutes, minutes, 0.0, max_events), AlertTracker(max_alerts))

    def add(
        self, events: pl.DataFrame, summaries: pl.DataFrame,
        waiting: dict[str, pl.Series] | None = None,
    ) -> dict[str, pl.Series] | None:
        """Add a micro-batch to the window; the distinct ids it touched per entity column.

        ``waiting``: ids touched by earlier micro-batches whose detection was put off,
        merged in. None when nothing was touched and nothing waits.
        """
        self.window.add(events, summaries)
        if events.height == 0 and summaries.height == 0 and waiting is None:
            return None
        touched: dict[str, pl.Series] = {}
        for col in ENTITY_COLUMNS.values():
            parts = [
                df.get_column(col).drop_nulls()
                for df in (events, summaries)
                if df.height and col in df.columns
            ]
            if waiting is not None and col in waiting:
                parts.append(waiting[col])
            touched[col] = (
                pl.concat(parts).unique() if parts else pl.Series(col, [], dtype=pl.String)
            )
        return touched

    def score(
        self, ev: pl.DataFrame, su: pl.DataFrame, history: pl.DataFrame | None = None,
        passes: int = 1,
    ) -> pl.DataFrame | None:
        """Alerts of the selected events, in ``passes`` caller partitions (None: none).

        A pass needs ~2 KB of working memory per event it reads; split by caller, every
        session and every caller's window is whole in one pass, each gets the same
        baseline ``history`` (:func:`toolwatch.detectors.partition.detect_in_parts`).
        """
        assert self.detect is not None, "detection is off"
        detect = self.detect
        if passes > 1:
            from toolwatch.detectors.partition import detect_in_parts

            return detect_in_parts(ev, su, passes,
                                   lambda e, s: detect(e, s, history=history))
        return detect(ev, su, history=history)

    def news(
        self, alerts: pl.DataFrame | None, touched: dict[str, pl.Series]
    ) -> tuple[pl.DataFrame, int, int, int]:
        """Alerts of the touched entities that are new or changed since last emitted.

        Alerts on other entities are dropped: their events were read only in part (the
        share the touched sessions and callers hold), so their scores are partial.

        Returns
        -------
        tuple
            ``(alerts, n_new, n_updated, n_repeats)``: the repeats are touched entities'
            alerts left out as unchanged (or older) versions.
        """
        if alerts is None or alerts.height == 0:
            return _empty(schema.ALERTS), 0, 0, 0
        mask = pl.lit(False)
        for etype, col in ENTITY_COLUMNS.items():
            ids = touched.get(col)
            if ids is not None and len(ids):
                mask = mask | (
                    (pl.col("entity_type") == etype) & pl.col("entity_id").is_in(ids.implode())
                )
        mask = mask | ~pl.col("entity_type").is_in(list(ENTITY_COLUMNS))
        alerts = alerts.filter(mask)
        news, n_new, n_upd = self.tracker.news(alerts)
        return news, n_new, n_upd, alerts.height - news.height

    def update(
        self, events: pl.DataFrame, summaries: pl.DataFrame | None = None, *,
        history: pl.DataFrame | None = None, newest: int | None = None, pass_cap: int = 0,
    ) -> pl.DataFrame:
        """Add a micro-batch and detect at once; the alerts that are new or changed.

        Parameters
        ----------
        history
            Baseline history (default: the window's events).
        newest
            Read at most this many touched events (the newest).
        pass_cap
            Events per detection pass (0: one pass).
        """
        if summaries is None:
            summaries = _empty(schema.SUMMARIES)
        cols = [c for c in self.window.columns if c in events.columns]
        touched = self.add(events.select(cols), summaries)
        if touched is None or self.detect is None:
            return _empty(schema.ALERTS)
        ev, su = self.window.select(touched, newest)
        if ev.height == 0 and su.height == 0:
            return _empty(schema.ALERTS)
        hist = self.window.events if history is None else history
        passes = -(-ev.height // pass_cap) if 0 < pass_cap < ev.height else 1
        return self.news(self.score(ev, su, hist, passes), touched)[0]
