"""When and how much live detects: deferral, pass caps, baseline history.

The detection itself is the engine's (:class:`toolwatch.detectors.stream.StreamDetector`:
window, scoring, alert tracking); this mixin decides, on the commit thread, when a
micro-batch is detected, how many events a detection reads and in how many passes, and
which stored history the baselines get, and counts it all in the live status.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from toolwatch import schema
from toolwatch.config import Config
from toolwatch.detectors.stream import (
    AlertTracker,
    DetectFn,
    DetectionWindow,
    StreamDetector,
    engine_detector,
    retention_minutes,
)
from toolwatch.store import Store

log = logging.getLogger("toolwatch.live")


def default_detector(config: Config) -> tuple[DetectFn | None, float]:
    """The detection engine's detector function for live, and its retention in minutes.

    Live means the same as batch (:func:`toolwatch.detectors.stream.engine_detector`):
    the config allowlists (``[detectors.suppress]``) are applied by the detectors, and
    the suppressions an analyst created in triage (``_triage/suppressions.json``) are
    applied to every micro-batch's alerts exactly as ``analyze`` applies them (read at
    every flush, so a suppression made in the dashboard applies from the next flush on).
    The isolation forest is loaded (``models/forest.skops``) or fitted once per process,
    in a child process, and reused by every flush (it is refitted only while there were
    too few sessions to fit it).

    Returns ``(None, 0)`` when the detectors package is not available.
    """
    try:
        from toolwatch import detectors
        from toolwatch.detectors.forest import child_stats
    except ImportError:
        return None, 0.0
    dcfg = detectors.DetectorsConfig.from_dict(config.detectors)
    run = engine_detector(
        dcfg, model_path=config.trained_forest, data_dir=config.data_dir,
        suppress_unauthenticated=config.triage.suppress_unauthenticated_callers)
    # The forest child's counters (runs, failures, last error) for the live status.
    run.child_stats = child_stats  # type: ignore[attr-defined]
    return run, retention_minutes(dcfg)


class DetectMixin:
    """Detection of a :class:`~toolwatch.live.pipeline.LivePipeline` (runs on its commit thread)."""

    #: The detection engine, and its detector function (None: detection off), window and
    #: alert tracker (the same objects: :class:`~toolwatch.live.pipeline.LivePipeline`).
    engine: StreamDetector
    detector: DetectFn | None
    window: DetectionWindow
    tracker: AlertTracker
    #: Entities touched by stored micro-batches whose detection waits (backlog), per
    #: entity column, and how many new events they brought (see ``backlog_detect_events``).
    _deferred_touched: dict[str, pl.Series] | None = None
    _deferred_events: int = 0

    def _backlog_detect_target(self) -> int:
        """New events a backlog gathers before one detection runs over all they touched."""
        n = self.live.backlog_detect_events
        if n > 0:
            return n
        cap = self.live.max_detect_events
        return cap * max(1, self.live.detect_passes) if cap > 0 else self.live.flush_events

    def _detect(
        self, events_tbl: pa.Table, summaries_tbl: pa.Table, *, defer: bool = False,
        backlog: bool = False,
    ) -> pl.DataFrame | None:
        """New alerts for a micro-batch (None: none), after adding it to the window.

        ``defer``: the micro-batch was read from a backlog; while fewer than
        :meth:`_backlog_detect_target` new events have gathered, only remember what it
        touched (detection then runs once over all of it: its cost follows the passes,
        not the new events, and the entities' events are in the window anyway).
        ``backlog``: a size-triggered micro-batch detected at once (synchronous flushes,
        e.g. Kafka's); like a deferred detection it runs in ``backlog_detect_passes``.
        """
        if self.detector is None:
            return None
        # Only the window's columns cross into polars: converting raw lines and the
        # other store-only strings would copy them for nothing.
        cols = [c for c in self.window.columns if c in events_tbl.column_names]
        events = pl.from_arrow(events_tbl.select(cols))
        summaries = pl.from_arrow(summaries_tbl)
        assert isinstance(events, pl.DataFrame) and isinstance(summaries, pl.DataFrame)
        waiting = self._deferred_touched
        touched = self.engine.add(events, summaries, waiting)
        if touched is None:
            return None
        gathered = self._deferred_events + events.height
        # Detect once the next micro-batch of this size would pass the target: a
        # detection reads at most max_detect_events x detect_passes touched events, so
        # gathering past it (large micro-batches: 35k + 35k + 35k > 80k) left the oldest
        # new events out of every detection.
        if defer and gathered + events.height <= self._backlog_detect_target():
            self._deferred_touched, self._deferred_events = touched, gathered
            self.status.extra["detect_deferred"] = self.status.extra.get("detect_deferred", 0) + 1
            return None
        self._deferred_touched, self._deferred_events = None, 0
        cap = self.live.max_detect_events
        passes = max(1, self.live.detect_passes)
        # Dense traffic touches every entity: read the newest events only (sorted by ts),
        # so a flush's memory and CPU follow the caps, not the window. The window cuts on
        # ts before it copies, so no sorted copy of every touched event outlives the cut.
        ev, su = self.window.select(touched, newest=cap * passes if cap > 0 else None)
        if ev.height == 0 and su.height == 0:
            return None
        # What detection read (its cost follows these): comparing configurations by speed
        # alone hides how much of a backlog each one left undetected.
        extra = self.status.extra
        extra["detect_runs"] = extra.get("detect_runs", 0) + 1
        extra["detect_events"] = extra.get("detect_events", 0) + ev.height
        if self.window.select_capped:
            self.status.extra["detect_capped"] = self.status.extra.get("detect_capped", 0) + 1
        # A detection a backlog gathered (or a size-triggered one, or the one that runs
        # what a backlog left waiting) runs in fewer, larger passes: a pass's cost is
        # mostly fixed, and catching up is when throughput matters most.
        pass_cap = cap
        if (defer or backlog or waiting is not None) and cap > 0 \
                and self.live.backlog_detect_passes > 0:
            pass_cap = -(-cap * passes // self.live.backlog_detect_passes)
        pass_cap = self._memory_pass_cap(pass_cap, ev.height)
        hist = self._history()
        # A detection pass needs ~2 KB of working memory per event it reads: one pass
        # over every touched event would make the window's size the peak memory.
        n_passes = -(-ev.height // pass_cap) if pass_cap > 0 and ev.height > pass_cap else 1
        try:
            alerts = self.engine.score(ev, su, hist, n_passes)
        except Exception:  # a detector bug must not stop ingestion
            log.exception("detectors failed on a micro-batch; events are stored anyway")
            self.status.extra["detector_errors"] = self.status.extra.get("detector_errors", 0) + 1
            return None
        finally:
            stats = getattr(self.detector, "child_stats", None)
            if stats is not None:
                self.status.extra.update(
                    {k: v for k, v in stats().items() if k.startswith("forest_child")})
        if n_passes > 1:
            extra["detect_split_passes"] = extra.get("detect_split_passes", 0) + n_passes
        if alerts is None or alerts.height == 0:
            return None
        news, n_new, n_upd, repeats = self.engine.news(alerts, touched)
        self.status.alerts_new += n_new
        self.status.alerts_updated += n_upd
        self.status.alerts_suppressed_repeats += repeats
        if news.height == 0:
            return None
        now = datetime.now(UTC)
        return news.with_columns(pl.lit(now).dt.cast_time_unit("us").alias("detected_at"))

    def _memory_pass_cap(self, pass_cap: int, n: int) -> int:
        """``pass_cap`` halved while the process's RSS is at ``live.memory_high_mib``.

        A pass's working memory follows its events (~2 KB each) and comes on top of
        whatever else runs at that moment (the next micro-batch's parse, the store
        write, the window's expiry), so a detection that starts with the RSS already
        high reads the same events in twice as many passes of half the size: more
        fixed cost per pass (CPU), less memory at once. Halved at most once, and never
        below ``max_detect_events // 2``; low RSS keeps the configured passes (and
        their speed).
        """
        high = self.live.memory_high_mib
        if high <= 0 or n <= 0:
            return pass_cap
        floor = max(1, self.live.max_detect_events // 2)
        size = pass_cap if 0 < pass_cap < n else n
        if size <= floor:
            return pass_cap
        rss = rss_mib()
        if rss is None or rss < high:
            return pass_cap
        self.status.extra["detect_memory_halved"] = (
            self.status.extra.get("detect_memory_halved", 0) + 1)
        return max(floor, -(-size // 2))

    def _load_history_base(self) -> None:
        """Most recent events already stored when this process started (baselines)."""
        self._history_loaded = True
        n = self.live.history_events
        if n <= 0:
            return
        st = Store(self.live.history_dir) if self.live.history_dir else self.store
        if not st.files("events"):
            return
        cols = ", ".join(f'"{c}"' for c in self.window.columns)
        try:
            con = st.connect()
            try:
                df = _pl(con.sql(f"SELECT {cols} FROM events ORDER BY ts DESC LIMIT ?",
                                 params=[n]))
            finally:
                con.close()
        except Exception as exc:  # baselines then come from the window only
            log.warning("cannot load baseline history: %s", exc)
            return
        if df.height:
            sch = pa.schema([schema.EVENTS.field(c) for c in self.window.columns])
            self._history_base = _conform(df.sort("ts"), sch)

    def _history(self) -> pl.DataFrame | None:
        """Baseline history for the detectors: stored past + the window (bounded)."""
        n = self.live.history_events
        if n <= 0:
            return None
        if not self._history_loaded:
            self._load_history_base()
        parts = [p for p in (self._history_base, self.window.events) if p is not None]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0].tail(n)
        newest = parts[1].tail(n)
        if newest.height == n and newest["event_id"].n_unique() == n \
                and newest["event_id"].null_count() == 0:
            # The window alone fills the history with distinct events: the stored past
            # would all be cut by the tail below (its duplicates of window events are
            # dropped, the window's rows come last). Same rows, without concatenating
            # and de-duplicating 2 x history_events rows on every detection.
            return newest
        return (
            pl.concat([parts[0], parts[1].tail(n)], how="vertical_relaxed")
            .unique(subset="event_id", keep="last", maintain_order=True)
            .tail(n)
        )



_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mib() -> float | None:
    """This process's resident set size in MiB (Linux ``/proc/self/statm``; else None).

    One small read (~10 us): cheap enough for every detection.
    """
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _pl(result: Any) -> pl.DataFrame:
    """A DuckDB result as a polars frame."""
    df = pl.from_arrow(result.to_arrow_table())
    assert isinstance(df, pl.DataFrame)
    return df


def _conform(df: pl.DataFrame, sch: pa.Schema) -> pl.DataFrame:
    out = pl.from_arrow(df.select(sch.names).to_arrow().cast(sch))
    assert isinstance(out, pl.DataFrame)
    return out


