"""Live mode: micro-batches from followed sources, incremental detection, alert sinks.

Every live source (a tailed file, a wrapped server's stderr, a followed pipe, a Kafka
partition) hands :class:`~toolwatch.ingest.records.RawBatch` objects to a :class:`LivePipeline`.
The pipeline buffers them and *flushes* at most every ``live.flush_interval_s`` seconds
(or once ``live.flush_events`` lines are waiting). One flush:

1. runs the same transforms as ``ingest``/``analyze`` (:class:`toolwatch.pipeline.Pipeline`,
   one call per stream with that stream's buffered lines merged);
2. adds the new events to a bounded :class:`DetectionWindow` and runs the detectors on the
   events of every entity (session, caller, client address, credential) touched by this
   micro-batch, over that entity's window — so an alert is raised as soon as evidence
   crosses its threshold, not at session end;
3. keeps only alerts that are new or whose severity/score/evidence changed
   (:class:`AlertTracker`): an alert is *updated*, never duplicated (the alert id is the
   detectors' deterministic id from entity, category and window);
4. commits events, summaries, quarantined lines, those alert versions and the stream
   checkpoints in **one** atomic store batch (:meth:`toolwatch.store.Store.write_batch`);
5. only then hands the alerts to the sinks and runs the ``on_commit`` hooks (the Kafka
   consumer commits its offsets there).

A process killed at any point therefore leaves the store with a whole flush or none of
it, and a restart resumes from the checkpoints: no event lost, none stored twice.

Memory is bounded: the pipeline holds at most one flush of raw lines, the window at most
``live.max_window_events`` events (older events of finished sessions expire first, see
:class:`DetectionWindow`), and the alert tracker at most ``live.max_tracked_alerts`` ids.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pyarrow as pa

from toolwatch import schema
from toolwatch.config import Config, doc, from_dict
from toolwatch.ingest.records import RawBatch
from toolwatch.pipeline import BatchOutput, Pipeline
from toolwatch.store import Checkpoint, Store

log = logging.getLogger("toolwatch.live")

#: Alert ``entity_type`` -> event column that identifies the entity.
ENTITY_COLUMNS: dict[str, str] = {
    "session": "session_id",
    "caller_id": "caller_id",
    "client_ip": "client_ip",
    "credential_hash": "credential_hash",
}

_US = 1_000_000
#: The commit thread's queue holds at most this many times ``flush_events`` transformed
#: events (4 or 8 measured the same throughput and peak RSS; the smaller bound wins).
_QUEUE_FACTOR = 4


# --------------------------------------------------------------------------- config
@dataclass
class SinkConfig:
    """One alert destination (``[[live.sinks]]``)."""

    type: str = doc("Sink kind: stdout, file, kafka or webhook.", "stdout")
    path: str = doc("file: JSON-lines file alerts are appended to.", "")
    url: str = doc("webhook: URL alerts are POSTed to (one JSON object per alert).", "")
    slack: bool = doc(
        'webhook: send Slack-compatible {"text": ...} payloads instead of the alert object.',
        False,
    )
    retries: int = doc("webhook/kafka: attempts after the first one before giving up.", 5)
    backoff_s: float = doc(
        "webhook: first retry delay in seconds; doubles each attempt (with jitter).", 0.5
    )
    timeout_s: float = doc("webhook: HTTP timeout per attempt, seconds.", 5.0)
    queue_size: int = doc(
        "webhook/kafka: alerts waiting for delivery; past it the oldest are dropped (and "
        "counted) so a dead endpoint never blocks ingestion. The store keeps every alert.",
        10_000,
    )
    topic: str = doc("kafka: topic alerts are produced to (key = entity id).", "")
    bootstrap_servers: str = doc(
        "kafka: brokers for the alert producer; default: the consumer's brokers.", ""
    )
    min_severity: str = doc(
        "Only alerts at or above this severity: low, medium, high, critical.", "low"
    )


@dataclass
class LiveConfig:
    """The ``[live]`` table: micro-batching, windows, sinks and metrics of live mode."""

    flush_interval_s: float = doc(
        "A micro-batch is flushed (stored, detected, alerted) at most this many seconds "
        "after its first line arrived.",
        1.0,
    )
    flush_events: int = doc(
        "...or as soon as this many lines are waiting (under a backlog the micro-batch "
        "grows up to 8x this, to amortize detection, and shrinks back once caught up).",
        100_000,
    )
    poll_interval_s: float = doc(
        "tail: how often files and globs are checked for new data when idle.", 0.1
    )
    read_bytes: int = doc(
        "tail: bytes read from one file per read call (a backlog is read in such steps).",
        4_194_304,
    )
    rotate_wait_s: float = doc(
        "tail: after a file is renamed away or deleted, keep reading it until it has been "
        "idle this long (a writer may still append before reopening).",
        5.0,
    )
    start_at_end: bool = doc(
        "tail: files found at startup that have no checkpoint are read from their end, not "
        "their beginning (files created later are always read whole).",
        False,
    )
    detect: bool = doc("Run the detectors incrementally (off: store events only).", True)
    backlog_detect_interval_s: float = doc(
        "Under a backlog (size-triggered flushes) with overlap_detection, micro-batches "
        "wait up to this long to be detected together (detection costs about the window, "
        "not the new events). Interval-triggered flushes never wait.",
        5.0,
    )
    overlap_detection: bool = doc(
        "tail/run/follow: detect and commit a micro-batch on a second thread while the "
        "next one is read and parsed (same order and atomicity; a backlog's waiting "
        "micro-batches are detected together). Off: one flush at a time.",
        True,
    )
    session_idle_minutes: float = doc(
        "A session with no event for this long (log time) is finished: it stops counting as "
        "active and its events become eligible for expiry from the detection window.",
        30.0,
    )
    window_minutes: float = doc(
        "Events of finished sessions are kept this long (log time) for caller/address "
        "windows. 0: max(detectors.entity_window_minutes, detectors.max_session_hours).",
        0.0,
    )
    max_window_events: int = doc(
        "Hard cap of events held for detection; past it the oldest events expire first "
        "(counted as window_evicted). Bounds memory whatever the traffic: ~170 bytes per "
        "held event (the detectors' columns only), so 500,000 events ≈ 85 MiB — about 14 h "
        "of traffic at 10 events/s, 50 s at 10,000 events/s.",
        500_000,
    )
    max_detect_events: int = doc(
        "Most events one detection pass reads: the touched entities' events over the "
        "window, newest first. When traffic is dense every entity is touched by every "
        "micro-batch and a pass would read the whole window; detection needs roughly 2 KB "
        "of working memory per event read, so this bounds live mode's peak memory "
        "(0: no cap).",
        100_000,
    )
    out_of_order_tolerance_s: float = doc(
        "Events up to this much older than the newest event seen are on time; later ones "
        "are still stored and detected, but counted as late_events. Expiry waits this long.",
        60.0,
    )
    history_events: int = doc(
        "Baselines (population, per caller) are fitted on the micro-batch's entities plus "
        "up to this many of the most recent window events, as batch analyze fits them on "
        "everything it sees (0: the touched entities only; cheaper, noisier early on).",
        100_000,
    )
    history_dir: str = doc(
        "Store whose recent events seed the baselines at start-up (default: this store). "
        "Point it at a store holding past traffic to replay logs with the baselines batch "
        "analyze had.",
        "",
    )
    max_tracked_alerts: int = doc(
        "Alert ids remembered to tell new/changed alerts from repeats (LRU).", 200_000
    )
    compact_interval_s: float = doc(
        "How often live mode compacts the store's small files (0: never).", 300.0
    )
    status_interval_s: float = doc(
        "How often the status file read by `toolwatch status` is rewritten.", 1.0
    )
    kafka_lag_warn_s: float = doc(
        "kafka: warn (log, `toolwatch status`, metrics) when the consumer lag has been "
        "growing, never back down to where it started, for longer than this (0: never).",
        60.0,
    )
    metrics_port: int | None = doc(
        "Serve Prometheus metrics on 127.0.0.1:PORT/metrics (unset: off; 0: any free port).",
        None,
    )
    metrics_host: str = doc("Address the metrics endpoint binds to.", "127.0.0.1")
    keep_server_text: bool = doc(
        "run: keep non-JSON stderr lines in the quarantine dataset (reason server_text).", True
    )
    sinks: list[SinkConfig] = doc(
        "Alert sinks ([[live.sinks]] tables). None configured: stdout for tail/kafka, "
        "nothing but the store for run.",
        factory=list,
    )

    @classmethod
    def from_config(cls, config: Config) -> LiveConfig:
        """Parse ``config.live`` (rejects unknown keys and wrong types)."""
        lc = from_dict(cls, dict(config.live or {}), prefix="live")
        lc.validate()
        return lc

    def validate(self) -> None:
        """Check values.

        Raises
        ------
        toolwatch.errors.ConfigError
            On a non-positive interval or an unknown sink type.
        """
        from toolwatch.errors import ConfigError

        if self.flush_interval_s <= 0 or self.flush_events <= 0:
            raise ConfigError("must be positive", key="live.flush_interval_s")
        for i, s in enumerate(self.sinks):
            if s.type not in ("stdout", "file", "kafka", "webhook"):
                raise ConfigError(
                    f"unknown sink type {s.type!r}: stdout, file, kafka or webhook",
                    key=f"live.sinks[{i}].type",
                )
            if s.type == "file" and not s.path:
                raise ConfigError("file sink needs a path", key=f"live.sinks[{i}].path")
            if s.type == "webhook" and not s.url:
                raise ConfigError("webhook sink needs a url", key=f"live.sinks[{i}].url")
            if s.type == "kafka" and not s.topic:
                raise ConfigError("kafka sink needs a topic", key=f"live.sinks[{i}].topic")
            if s.min_severity not in SEVERITY_RANK:
                raise ConfigError(
                    "must be low, medium, high or critical", key=f"live.sinks[{i}].min_severity"
                )


from toolwatch.detectors.config import SEVERITY_RANK  # noqa: E402  (one definition; light import)

# --------------------------------------------------------------------------- detection
#: ``(events, summaries, history=None) -> alerts``: the detectors' ``run_batch`` contract.
DetectFn = Callable[..., pl.DataFrame]


def _empty_alerts() -> pl.DataFrame:
    df = pl.from_arrow(schema.ALERTS.empty_table())
    assert isinstance(df, pl.DataFrame)
    return df


def default_detector(config: Config) -> tuple[DetectFn | None, float]:
    """The detectors package as a live detection function, and its retention in minutes.

    Live means the same as batch: the config allowlists (``[detectors.suppress]``) are
    applied by the detectors, and the suppressions an analyst created in triage
    (``_triage/suppressions.json``) are applied to every micro-batch's alerts exactly as
    ``analyze`` applies them (read at every flush, so a suppression made in the dashboard
    applies from the next flush on). The isolation forest is
    loaded (``models/forest.skops``) or fitted once per process and reused by every
    flush (it is refitted only while there were too few sessions to fit it).

    Returns ``(None, 0)`` when the detectors package is not available.
    """
    try:
        from toolwatch import detectors
    except ImportError:
        return None, 0.0
    if not hasattr(detectors, "run_batch"):
        return None, 0.0
    from toolwatch.analyze import apply_triage_suppressions

    dcfg = detectors.DetectorsConfig.from_dict(config.detectors)
    model_path = config.trained_forest
    retention = max(
        float(getattr(dcfg, "entity_window_minutes", 60)),
        float(getattr(dcfg, "max_session_hours", 1.0)) * 60.0,
    )
    reuse: dict[str, Any] = {}

    def run(
        events: pl.DataFrame, summaries: pl.DataFrame, history: pl.DataFrame | None = None
    ) -> pl.DataFrame:
        alerts = detectors.run_batch(
            events, summaries, dcfg, history=history, model_path=model_path, reuse=reuse
        )
        return apply_triage_suppressions(alerts, config.data_dir)

    return run, retention


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
        self._since_expire = 0

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
            self.session_last = (
                pl.concat([self.session_last.lazy(), per])
                .group_by("session_id")
                .agg(pl.col("t").max())
                .collect()
            )
            slim = self.slim(events)
            self.events = (
                slim if self.events is None else pl.concat([self.events, slim], rechunk=False)
            )
            self._since_expire += events.height
        if summaries.height:
            self.summaries = (
                summaries
                if self.summaries is None
                else pl.concat([self.summaries, summaries], rechunk=False)
            )
        if self.size > self.max_events or self._since_expire > max(10_000, self.size // 4):
            self.expire()

    def select(self, touched: dict[str, pl.Series]) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Events and summaries of every touched entity, over the whole window.

        ``touched`` maps an entity column to the distinct ids the micro-batch touched.
        """

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
        keep = (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(active)
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
        self.events = ev.rechunk()
        if self.summaries is not None:
            self.summaries = self.summaries.filter(
                (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(active)
            ).rechunk()

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


def _empty_events() -> pl.DataFrame:
    df = pl.from_arrow(schema.EVENTS.empty_table())
    assert isinstance(df, pl.DataFrame)
    return df


def _empty_summaries() -> pl.DataFrame:
    df = pl.from_arrow(schema.SUMMARIES.empty_table())
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


# --------------------------------------------------------------------------- status
class RateMeter:
    """Events per second over a sliding window of recent flushes."""

    def __init__(self, horizon_s: float = 10.0):
        self.horizon_s = horizon_s
        self._samples: deque[tuple[float, int]] = deque()
        # The commit thread adds while the reading thread reports the rate.
        self._lock = threading.Lock()

    def add(self, n: int, now: float | None = None) -> None:
        """Record ``n`` events at ``now`` (monotonic seconds)."""
        with self._lock:
            self._samples.append((time.monotonic() if now is None else now, n))

    def rate(self, now: float | None = None) -> float:
        """Events per second over the horizon."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._samples and self._samples[0][0] < now - self.horizon_s:
                self._samples.popleft()
            if not self._samples:
                return 0.0
            span = max(now - self._samples[0][0], 1.0)
            return sum(n for _, n in self._samples) / span


@dataclass
class LiveStatus:
    """Counters of one live process, as shown by ``toolwatch status`` and /metrics."""

    kind: str
    name: str
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    lines_read: int = 0
    events_stored: int = 0
    summaries_stored: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    server_text_lines: int = 0
    alerts_new: int = 0
    alerts_updated: int = 0
    alerts_suppressed_repeats: int = 0
    late_events: int = 0
    window_events: int = 0
    window_evicted: int = 0
    active_sessions: int = 0
    flushes: int = 0
    last_flush_ms: float = 0.0
    last_flush_at: float = 0.0
    detect_ms: float = 0.0
    events_per_s: float = 0.0
    lag: dict[str, Any] = field(default_factory=dict)
    watermark: str | None = None
    sinks: dict[str, dict[str, int]] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False

    @property
    def quarantined_total(self) -> int:
        """All quarantined lines (server text excluded)."""
        return sum(self.quarantined.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        d = {k: v for k, v in self.__dict__.items()}
        d["quarantined_total"] = self.quarantined_total
        d["updated_at"] = time.time()
        return d


def status_dir(data_dir: str | Path) -> Path:
    """Directory of live status files inside a store."""
    return Path(data_dir) / "_state" / "live"


class StatusPublisher:
    """Writes the status file atomically and serves Prometheus metrics (optional).

    Parameters
    ----------
    status
        The live counters.
    data_dir
        Store directory; the file is ``_state/live/<kind>-<pid>.json``.
    metrics_port
        Port for ``/metrics`` (``None``: off; 0: any free port).
    metrics_host
        Bind address of the metrics endpoint.
    """

    def __init__(
        self,
        status: LiveStatus,
        data_dir: str | Path,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ):
        self.status = status
        self.dir = status_dir(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # pid plus a random tag: several pipelines may share a process (tests, benchmarks).
        self.path = self.dir / f"{status.kind}-{status.pid}-{uuid.uuid4().hex[:6]}.json"
        self._server: http.server.ThreadingHTTPServer | None = None
        self.metrics_port: int | None = None
        if metrics_port is not None:
            self._start_metrics(metrics_host, metrics_port)

    def write(self) -> None:
        """Rewrite the status file (atomic replace)."""
        tmp = self.path.with_suffix(".json.tmp")
        try:
            tmp.write_bytes(orjson.dumps(self.status.as_dict(), default=str))
            os.replace(tmp, self.path)
        except OSError as exc:  # status is best effort, never fatal
            log.warning("cannot write status file %s: %s", self.path, exc)

    def _start_metrics(self, host: str, port: int) -> None:
        publisher = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = prometheus_text(publisher.status).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.metrics_port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()

    def close(self, *, remove: bool = True) -> None:
        """Stop the endpoint; remove the status file (or mark it stopped)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.status.stopped = True
        if remove:
            self.path.unlink(missing_ok=True)
        else:
            self.write()


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def prometheus_text(st: LiveStatus) -> str:
    """Counters in the Prometheus text exposition format."""
    lab = f'kind="{_label(st.kind)}",name="{_label(st.name)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, help_: str, extra: str = "") -> None:
        lines.append(f"# HELP toolwatch_{name} {help_}")
        lines.append(f"# TYPE toolwatch_{name} {kind}")
        labels = lab + ("," + extra if extra else "")
        lines.append(f"toolwatch_{name}{{{labels}}} {value}")

    metric("lines_read_total", "counter", st.lines_read, "Log lines read.")
    metric("events_stored_total", "counter", st.events_stored, "Events committed to the store.")
    metric("quarantined_total", "counter", st.quarantined_total, "Lines quarantined.")
    metric("server_text_lines_total", "counter", st.server_text_lines, "Non-JSON stderr lines.")
    metric("alerts_new_total", "counter", st.alerts_new, "Alerts raised.")
    metric("alerts_updated_total", "counter", st.alerts_updated, "Alert updates emitted.")
    metric("late_events_total", "counter", st.late_events, "Events beyond the tolerance.")
    metric("window_events", "gauge", st.window_events, "Events held for detection.")
    metric("active_sessions", "gauge", st.active_sessions, "Sessions active in the window.")
    metric("events_per_second", "gauge", round(st.events_per_s, 3), "Recent events/s.")
    metric("last_flush_seconds", "gauge", st.last_flush_ms / 1000, "Duration of last flush.")
    for k, v in st.lag.items():
        if isinstance(v, int | float):
            metric(f"lag_{k}", "gauge", v, f"Lag ({k}).")
    parts = {p: v for p, v in (st.sources.get("lag_by_partition") or {}).items()
             if isinstance(v, int | float)}  # kafka: one family, a sample per partition
    if parts:
        lines.append("# HELP toolwatch_kafka_partition_lag Messages behind the high watermark.")
        lines.append("# TYPE toolwatch_kafka_partition_lag gauge")
        lines += [f'toolwatch_kafka_partition_lag{{{lab},partition="{_label(str(p))}"}} {v}'
                  for p, v in parts.items()]
    for sink, c in st.sinks.items():
        for k, v in c.items():
            metric(f"sink_{k}_total", "counter", v, f"Sink {k}.", f'sink="{_label(sink)}"')
    return "\n".join(lines) + "\n"


def read_statuses(data_dir: str | Path) -> list[dict[str, Any]]:
    """Status files of live processes writing to a store, with ``alive`` set."""
    out: list[dict[str, Any]] = []
    d = status_dir(data_dir)
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            st = orjson.loads(p.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        pid = int(st.get("pid", 0))
        alive = False
        if pid > 0 and not st.get("stopped"):
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True
        st["alive"] = alive
        st["age_s"] = round(time.time() - float(st.get("updated_at", 0)), 1)
        st["file"] = str(p)
        out.append(st)
    return out


# --------------------------------------------------------------------------- pipeline
@dataclass
class FlushResult:
    """What one flush stored and emitted."""

    lines: int = 0
    events: int = 0
    alerts: pl.DataFrame | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    batch_id: str | None = None
    seconds: float = 0.0


@dataclass
class _Job:
    """One transformed micro-batch waiting for detection and its commit."""

    events: pa.Table
    summaries: pa.Table
    quarantine: pa.Table
    checkpoints: list[Checkpoint]
    lines: int
    lines_read: int
    quarantined: dict[str, int]
    #: Flushed by size (lines arrive faster than micro-batches), not by the interval.
    backlog: bool = False
    created: float = field(default_factory=time.monotonic)


def merge_batches(batches: list[RawBatch]) -> RawBatch:
    """Concatenate consecutive batches of one stream into one (no line copies)."""
    if len(batches) == 1:
        return batches[0]
    first, last = batches[0], batches[-1]
    lines = pa.concat_arrays([b.lines for b in batches])
    offs = np.concatenate([b.offsets for b in batches])
    nos = (
        np.concatenate([b.line_nos for b in batches])  # type: ignore[misc]
        if all(b.line_nos is not None for b in batches)
        else None
    )
    return RawBatch(
        source=last.source,
        source_fp=first.source_fp,
        lines=lines,  # type: ignore[arg-type]
        offsets=offs,
        line_nos=nos,
        end_offset=last.end_offset,
        final=last.final,
    )


class LivePipeline:
    """Micro-batching, incremental detection and atomic commits for live sources.

    Parameters
    ----------
    config
        Full configuration (``config.live`` is parsed into :class:`LiveConfig`).
    store
        Destination store (the source of truth for checkpoints and alerts).
    kind
        ``tail``, ``run``, ``kafka`` or ``follow`` — names the status file.
    name
        Human-readable name of what is followed.
    sinks
        Alert sinks (:class:`toolwatch.sinks.SinkSet`); ``None``: store only.
    detector
        Detection function ``(events, summaries) -> alerts``; default: the detectors
        package (absent: detection off). Tests inject simple rules here.
    live
        Pre-parsed live settings (default: from ``config``).
    """

    def __init__(
        self,
        config: Config,
        store: Store,
        *,
        kind: str = "tail",
        name: str = "",
        sinks: Any = None,
        detector: DetectFn | None = None,
        live: LiveConfig | None = None,
    ):
        self.config = config
        self.live = live or LiveConfig.from_config(config)
        self.store = store
        self.pipe = Pipeline(config, store)
        self.sinks = sinks
        retention = self.live.window_minutes
        if detector is None and self.live.detect:
            detector, det_retention = default_detector(config)
            if detector is None:
                log.warning("detectors package unavailable: live detection is off")
            retention = retention or det_retention
        self.detector = detector if self.live.detect else None
        self.window = DetectionWindow(
            retention or 60.0,
            self.live.session_idle_minutes,
            self.live.out_of_order_tolerance_s,
            self.live.max_window_events,
            # Without detection the window only holds warmed-up rows: no need to import
            # the detectors (and scikit-learn) just to learn their columns.
            columns=None if self.detector is not None else _ID_COLUMNS,
        )
        self.tracker = AlertTracker(self.live.max_tracked_alerts)
        self.status = LiveStatus(kind=kind, name=name)
        self.rate = RateMeter()
        self.on_commit: list[Callable[[FlushResult], None]] = []
        self._pending: dict[str, list[RawBatch]] = {}
        self._pending_lines = 0
        self._extra_quarantine: list[pa.Table] = []
        self._first_pending_at: float | None = None
        self._last_compact = time.monotonic()
        self._warmed: set[str] = set()
        self._history_base: pl.DataFrame | None = None
        # Under a backlog (size-triggered flushes that take longer than the interval) the
        # micro-batch grows up to 8x flush_events, amortizing detection over more events;
        # it shrinks back once the pipeline keeps up. Latency is unaffected when caught up.
        self._flush_events = self.live.flush_events
        self._history_loaded = False
        # Commit thread (flush(wait=False)): transformed micro-batches queue here, in
        # order; the thread detects and commits whatever is queued when it gets free.
        self._cv = threading.Condition()
        self._queue: list[_Job] = []
        self._queued_events = 0
        self._busy = False
        self._urgent = False
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._worker_error: BaseException | None = None
        self._load_alert_memory()

    # ------------------------------------------------------------------ input
    def add(self, batch: RawBatch) -> None:
        """Buffer one batch of a stream (flushed by :meth:`flush`)."""
        if len(batch) == 0 and not batch.final and batch.end_offset <= 0:
            return
        self._pending.setdefault(batch.source_fp, []).append(batch)
        self._pending_lines += len(batch)
        if self._first_pending_at is None:
            self._first_pending_at = time.monotonic()

    def add_server_text(
        self,
        source: str,
        source_fp: str,
        lines: list[bytes],
        offsets: list[int],
        line_nos: list[int] | None,
    ) -> None:
        """Keep non-JSON stderr lines of a wrapped server (quarantine, reason ``server_text``)."""
        self.status.server_text_lines += len(lines)
        if not lines or not self.live.keep_server_text:
            return
        keep = self.config.ingest.quarantine_raw_chars
        scrub = self.pipe.hasher.scrub_text
        raws = [
            scrub(b.rstrip(b"\r\n")[: keep * 4]).decode("utf-8", "backslashreplace")[:keep]
            for b in lines
        ]
        now = datetime.now(UTC)
        n = len(lines)
        tbl = pa.table(
            {
                "event_id": [f"{source_fp}:{o}" for o in offsets],
                "reason": ["server_text"] * n,
                "detail": ["non-JSON line on the server's stderr"] * n,
                "source": [source] * n,
                "source_fp": [source_fp] * n,
                "offset": pa.array(offsets, pa.int64()),
                "line_no": pa.array(line_nos if line_nos else [None] * n, pa.int64()),
                "raw": raws,
                "raw_bytes": pa.array([len(b.rstrip(b"\r\n")) for b in lines], pa.int64()),
                "ingested_at": pa.array([now] * n, schema.TS),
            },
            schema=schema.QUARANTINE,
        )
        self._extra_quarantine.append(tbl)
        if self._first_pending_at is None:
            self._first_pending_at = time.monotonic()

    def drop_pending(self, fps: Iterable[str]) -> int:
        """Discard unflushed lines of some streams (Kafka partitions lost); returns lines."""
        n = 0
        for fp in fps:
            dropped = self._pending.pop(fp, None)
            if dropped:
                n += sum(len(b) for b in dropped)
        self._pending_lines -= n
        if not self._pending and not self._extra_quarantine:
            self._first_pending_at = None
        return n

    @property
    def pending_lines(self) -> int:
        """Lines waiting for the next flush."""
        return self._pending_lines

    def _committing(self) -> bool:
        """Whether the commit thread is detecting/committing right now.

        Not merely "something is queued": queued backlog micro-batches may be waiting for
        more, and an interval flush is what tells the commit thread to stop waiting.
        """
        return self._busy

    def caught_up(self) -> None:
        """The source has nothing more to read for now: commit what is queued at once.

        Backlog micro-batches wait to be detected together; once the backlog is read
        there is nothing left to wait for.
        """
        if self._queue:
            with self._cv:
                self._urgent = True
                self._cv.notify_all()

    def due(self, now: float | None = None) -> bool:
        """Whether a flush is due (interval elapsed since the first waiting line, or size).

        While the commit thread is busy, only size makes a flush due: lines keep
        gathering and are parsed once it is free, so the detection that follows includes
        the newest lines instead of queueing a micro-batch that would wait anyway.

        Raises
        ------
        Exception
            The failure that stopped the commit thread, if any.
        """
        # Loops poll this: a failed commit thread stops them even when no data arrives.
        self._raise_worker_error()
        if self._first_pending_at is None:
            return False
        if self._pending_lines >= self._flush_events:
            return True
        if self._committing():
            return False
        now = time.monotonic() if now is None else now
        return now - self._first_pending_at >= self.live.flush_interval_s

    def time_to_due(self) -> float:
        """Seconds until the pending data must be flushed (inf when nothing waits)."""
        if self._first_pending_at is None:
            return float("inf")
        left = max(0.0, self._first_pending_at + self.live.flush_interval_s - time.monotonic())
        # Busy commit thread: look again soon (not a busy loop) rather than at the interval.
        return max(left, 0.02) if self._committing() else left

    # ------------------------------------------------------------------ warm-up
    def _load_alert_memory(self) -> None:
        """Remember alert versions already stored so a restart does not re-emit them."""
        if not self.store.files("alerts"):
            return
        try:
            con = self.store.connect()
            try:
                rows = _pl(con.sql(
                    "SELECT * FROM alerts ORDER BY last_seen DESC LIMIT ?",
                    params=[self.live.max_tracked_alerts],
                ))
            finally:
                con.close()
        except Exception as exc:
            log.warning("cannot load stored alerts: %s", exc)
            return
        self.tracker.remember(reversed(list(rows.iter_rows(named=True))))

    def warm_up(self, fps: Iterable[str]) -> int:
        """Reload recent stored events of resumed streams into the detection window.

        A restarted live process thus keeps detecting across the restart (evidence
        before and after it adds up), and the derived-session state is reseeded so
        session-less events keep their session ids. Returns rows loaded.
        """
        fps = [f for f in fps if f not in self._warmed]
        if not fps:
            return 0
        self.drain()  # the window belongs to the commit thread while it works
        self._warmed.update(fps)
        if not self.store.files("events"):
            return 0
        span_us = max(self.window.window_us, self.window.idle_us)
        try:
            con = self.store.connect()
            try:
                newest = con.sql(
                    "SELECT max(ts) FROM events WHERE source_fp IN (SELECT unnest($fps))",
                    params={"fps": fps},
                ).fetchall()[0]
                if not newest or newest[0] is None:
                    return 0
                since = newest[0] - timedelta(microseconds=span_us)
                ev = _pl(con.sql(
                    "SELECT * FROM events WHERE source_fp IN (SELECT unnest($fps)) "
                    "AND ts >= $since ORDER BY ts DESC LIMIT $lim",
                    params={"fps": fps, "since": since, "lim": self.live.max_window_events},
                ))
                su = _pl(con.sql(
                    "SELECT * FROM summaries WHERE source_fp IN (SELECT unnest($fps)) "
                    "AND ts >= $since",
                    params={"fps": fps, "since": since},
                ))
            finally:
                con.close()
        except Exception as exc:
            log.warning("cannot warm up detection window: %s", exc)
            return 0
        if ev.height == 0 and su.height == 0:
            return 0
        ev = _conform(ev.sort("ts"), schema.EVENTS)
        su = _conform(su, schema.SUMMARIES)
        late_before = self.window.late
        self.window.add(ev, su)
        self.window.late = late_before
        self._seed_sessionizer(ev)
        return ev.height

    def forget_stream(self, fp: str) -> None:
        """Warm the stream up again if it comes back (a Kafka partition re-assigned)."""
        self._warmed.discard(fp)

    def _seed_sessionizer(self, ev: pl.DataFrame) -> None:
        """Restore derived-session state (actor -> last/start time) from stored events."""
        from toolwatch.ingest.sessionize import DERIVED_PREFIX, parse_derived

        d = ev.filter(
            pl.col("session_derived") & pl.col("session_id").str.starts_with(DERIVED_PREFIX)
        )
        if d.height == 0:
            return
        per = d.group_by("session_id").agg(pl.col("ts").max().alias("last_ts"))
        rows = []
        for sid, last in per.iter_rows():  # one row per derived session, not per event
            parsed = parse_derived(sid)
            if parsed is None:
                continue
            rows.append({"actor": parsed[0], "last_ts": last, "start_ts": parsed[1]})
        if not rows:
            return
        sz = self.pipe.sessionizer
        seeded = pl.DataFrame(rows, schema=sz.state.schema)
        seeded = seeded.sort("last_ts").unique(subset="actor", keep="last")
        sz.state = pl.concat([sz.state.join(seeded, on="actor", how="anti"), seeded])

    # ------------------------------------------------------------------ flush
    def finalize_streams(self, fps: Iterable[str] | None = None) -> None:
        """Mark streams ended: JSON-RPC requests still waiting are emitted unanswered."""
        for fp in list(self.pipe.pairers if fps is None else fps):
            if fp not in self.pipe.pairers:
                continue
            pend = self._pending.get(fp)
            if pend:
                pend[-1].final = True
            else:
                self.add(
                    RawBatch(
                        source=fp,
                        source_fp=fp,
                        lines=pa.array([], pa.large_binary()),  # type: ignore[arg-type]
                        offsets=np.zeros(0, np.int64),
                        line_nos=None,
                        end_offset=-1,
                        final=True,
                    )
                )

    def flush(self, *, wait: bool = True) -> FlushResult:
        """Transform the waiting lines, then detect, commit atomically, emit, run hooks.

        Parameters
        ----------
        wait
            True: everything happens before this returns (the result carries the batch
            id and the alerts). False, with ``live.overlap_detection`` on: the transformed
            micro-batch is queued for the commit thread, which detects and commits it
            while the caller reads and parses the next one; the result then only says
            what was transformed. Queued micro-batches are committed in order, and all
            that wait when the commit thread becomes free are detected together and
            committed as one atomic batch (under a backlog detection runs less often, as
            its cost follows the window, not the new events). Call :meth:`drain` to wait.

        Raises
        ------
        Exception
            Whatever stopped the commit thread (re-raised here; nothing after the failed
            batch is committed, so the checkpoints never skip data).
        """
        t0 = time.monotonic()
        # A flush forced by size, not by the interval, means lines arrive faster than
        # micro-batches: a backlog (or a very high rate).
        by_size = self._pending_lines >= self._flush_events
        job = self._transform_pending()
        if not wait and self.live.overlap_detection:
            self._raise_worker_error()
            res = FlushResult()
            if job is not None:
                job.backlog = by_size
                res.lines, res.events, res.checkpoints = job.lines, job.events.num_rows, \
                    job.checkpoints
                self._enqueue(job)
            res.seconds = time.monotonic() - t0
            return res
        self.drain()
        if job is None:
            return FlushResult()
        return self._commit([job], t0)

    def _transform_pending(self) -> _Job | None:
        """Run the transforms over every waiting stream (caller's thread; parser state)."""
        if not self._pending and not self._extra_quarantine:
            self._first_pending_at = None
            return None
        pending, self._pending = self._pending, {}
        extra_q, self._extra_quarantine = self._extra_quarantine, []
        lines = self._pending_lines
        self._pending_lines = 0
        self._first_pending_at = None

        checkpoints: list[Checkpoint] = []
        outs: list[BatchOutput] = []
        for fp, bl in pending.items():
            merged = merge_batches(bl)
            if len(merged) == 0 and not (merged.final and fp in self.pipe.pairers):
                # Nothing to parse (e.g. only server text): just advance the checkpoint.
                if merged.end_offset >= 0:
                    checkpoints.append(
                        Checkpoint(merged.source_fp, merged.source, merged.end_offset)
                    )
                continue
            try:
                outs.append(self.pipe.transform(merged))
            except ValueError:
                if len(merged):
                    raise
                # An empty final batch only flushes waiting JSON-RPC requests; a parser
                # that cannot take an empty batch must not stop the flush.
                log.warning("could not flush pending requests of %s", merged.source)
        c = self.pipe.counters
        return _Job(
            events=_concat([o.events for o in outs], schema.EVENTS),
            summaries=_concat([o.summaries for o in outs], schema.SUMMARIES),
            quarantine=_concat([o.quarantine for o in outs] + extra_q, schema.QUARANTINE),
            checkpoints=checkpoints
            + [o.checkpoint for o in outs if o.checkpoint.end_offset >= 0],
            lines=lines,
            # Snapshot on this thread: the parser keeps counting while the commit runs.
            lines_read=c.lines_read,
            quarantined=dict(c.quarantined),
        )

    # ------------------------------------------------------------------ commit thread
    def _enqueue(self, job: _Job) -> None:
        """Hand a transformed micro-batch to the commit thread (blocks while it is full)."""
        cap = self.live.flush_events * _QUEUE_FACTOR
        with self._cv:
            # Back-pressure: transformed rows waiting for the commit thread are bounded.
            while self._queued_events >= cap and self._worker_error is None:
                self._cv.wait()
            self._raise_worker_error()
            self._queue.append(job)
            self._queued_events += max(1, job.events.num_rows)
            if not job.backlog:
                self._urgent = True
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="toolwatch-commit", daemon=True
                )
                self._worker.start()
            self._cv.notify_all()

    def _ready(self) -> float:
        """0 when the queue should be committed now, else how long to wait at most.

        Detection costs about the window of the touched entities, whatever the number of
        new events, so under a backlog the commit thread waits until as many events as
        the window holds (at least ``flush_events``, at most the queue bound) have queued
        up, or ``backlog_detect_interval_s`` has passed since the first was queued (the
        window's size measured 8% more throughput than a quarter of it). Lines that
        waited for the flush interval (normal rates), a caught-up source, a drain and a
        stop are committed at once, so the latency at normal rates does not change.
        """
        if not self._queue:
            return float("inf")
        if self._urgent or self._stopping:
            return 0.0
        base = self.live.flush_events
        target = min(base * _QUEUE_FACTOR, max(base, self.window.size))
        if self._queued_events >= target:
            return 0.0
        age = time.monotonic() - self._queue[0].created
        return max(0.0, self.live.backlog_detect_interval_s - age)

    def _work(self) -> None:
        while True:
            with self._cv:
                while True:
                    wait = self._ready()
                    if wait == 0.0 or (self._stopping and not self._queue):
                        break
                    self._cv.wait(None if wait == float("inf") else wait)
                if not self._queue:
                    return
                jobs = list(self._queue)
                self._queue.clear()
                self._queued_events = 0
                self._urgent = False
                self._busy = True
                self._cv.notify_all()
            try:
                self._commit(jobs)
            except BaseException as exc:  # handed to the caller's thread
                log.debug("commit thread stopped", exc_info=True)
                with self._cv:
                    self._worker_error = exc
                    self._queue.clear()  # never commit past a failed batch
                    self._busy = False
                    self._cv.notify_all()
                return
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def _raise_worker_error(self) -> None:
        if self._worker_error is not None:
            raise self._worker_error

    def drain(self) -> None:
        """Wait until every queued micro-batch is committed (re-raises its failure)."""
        if self._worker is None:
            return
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            while (self._queue or self._busy) and self._worker_error is None:
                self._cv.wait()
        self._raise_worker_error()

    def _stop_worker(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        self._stopping = False

    def _commit(self, jobs: list[_Job], t0: float | None = None) -> FlushResult:
        """Detect over transformed micro-batches, commit them as one batch, then emit.

        ``t0``: when the flush started (synchronous flushes count their transform too).
        """
        t0 = time.monotonic() if t0 is None else t0
        res = FlushResult()
        if len(jobs) == 1:
            events, summaries, quarantine = jobs[0].events, jobs[0].summaries, jobs[0].quarantine
        else:
            events = _concat([j.events for j in jobs], schema.EVENTS)
            summaries = _concat([j.summaries for j in jobs], schema.SUMMARIES)
            quarantine = _concat([j.quarantine for j in jobs], schema.QUARANTINE)
        # One checkpoint per stream: the last one (micro-batches are in stream order).
        last: dict[str, Checkpoint] = {}
        for j in jobs:
            for cp in j.checkpoints:
                last.pop(cp.source_fp, None)
                last[cp.source_fp] = cp
        res.checkpoints = list(last.values())
        res.lines = sum(j.lines for j in jobs)

        alerts_tbl = None
        new_alerts = None
        td = time.monotonic()
        if self.detector is not None:
            new_alerts = self._detect(events, summaries)
            if new_alerts is not None and new_alerts.height:
                alerts_tbl = new_alerts.select(schema.ALERTS.names).to_arrow().cast(
                    schema.ALERTS
                )
        self.status.detect_ms = round((time.monotonic() - td) * 1000, 1)

        tables = {"events": events, "summaries": summaries, "quarantine": quarantine}
        if alerts_tbl is not None:
            tables["alerts"] = alerts_tbl
        if (
            events.num_rows
            or summaries.num_rows
            or quarantine.num_rows
            or res.checkpoints
            or (alerts_tbl is not None)
        ):
            res.batch_id = self.store.write_batch(tables, res.checkpoints)
        res.events = events.num_rows
        res.alerts = new_alerts

        c = self.pipe.counters
        c.batches += 1
        c.events_stored += events.num_rows
        c.summaries_stored += summaries.num_rows
        st = self.status
        st.lines_read = jobs[-1].lines_read
        st.events_stored = c.events_stored
        st.summaries_stored = c.summaries_stored
        st.quarantined = jobs[-1].quarantined
        st.flushes += 1
        self.rate.add(events.num_rows)
        st.events_per_s = round(self.rate.rate(), 1)
        st.window_events = self.window.size
        st.window_evicted = self.window.evicted
        st.late_events = self.window.late
        st.active_sessions = self.window.active_sessions()
        if self.window.newest_us is not None:
            st.watermark = datetime.fromtimestamp(self.window.newest_us / _US, UTC).isoformat()
            st.lag["log_time_s"] = round(time.time() - self.window.newest_us / _US, 3)

        if new_alerts is not None and new_alerts.height and self.sinks is not None:
            self.sinks.emit(new_alerts)
        res.seconds = time.monotonic() - t0
        for hook in self.on_commit:
            hook(res)
        if self.sinks is not None:
            st.sinks = self.sinks.counters()
        res.seconds = time.monotonic() - t0
        st.last_flush_ms = round(res.seconds * 1000, 1)
        st.last_flush_at = time.time()
        if len(jobs) == 1 and not self.live.overlap_detection:
            # Synchronous mode: under a backlog (size-triggered flushes that take longer
            # than the interval) the micro-batch grows up to 8x flush_events, amortizing
            # detection over more events; it shrinks back once the pipeline keeps up.
            base = self.live.flush_events
            if res.lines >= self._flush_events and res.seconds > self.live.flush_interval_s:
                self._flush_events = min(self._flush_events * 2, base * 8)
            elif res.lines < self._flush_events // 2:
                self._flush_events = max(base, self._flush_events // 2)
        self._maybe_compact()
        return res

    def _detect(self, events_tbl: pa.Table, summaries_tbl: pa.Table) -> pl.DataFrame | None:
        if self.detector is None:
            return None
        # Only the window's columns cross into polars: converting raw lines and the
        # other store-only strings would copy them for nothing.
        cols = [c for c in self.window.columns if c in events_tbl.column_names]
        events = pl.from_arrow(events_tbl.select(cols))
        summaries = pl.from_arrow(summaries_tbl)
        assert isinstance(events, pl.DataFrame) and isinstance(summaries, pl.DataFrame)
        self.window.add(events, summaries)
        if events.height == 0 and summaries.height == 0:
            return None
        touched: dict[str, pl.Series] = {}
        for col in ENTITY_COLUMNS.values():
            parts = [
                df.get_column(col).drop_nulls()
                for df in (events, summaries)
                if df.height and col in df.columns
            ]
            touched[col] = (
                pl.concat(parts).unique() if parts else pl.Series(col, [], dtype=pl.String)
            )
        ev, su = self.window.select(touched)
        if ev.height == 0 and su.height == 0:
            return None
        cap = self.live.max_detect_events
        if cap > 0 and ev.height > cap:
            # Dense traffic touches every entity: read the newest events only (sorted by
            # ts), so a pass's memory follows the cap, not the window.
            ev = ev.tail(cap)
            self.status.extra["detect_capped"] = self.status.extra.get("detect_capped", 0) + 1
        hist = self._history()
        try:
            alerts = self.detector(ev, su, history=hist)
        except Exception:  # a detector bug must not stop ingestion
            log.exception("detectors failed on a micro-batch; events are stored anyway")
            self.status.extra["detector_errors"] = self.status.extra.get("detector_errors", 0) + 1
            return None
        if alerts is None or alerts.height == 0:
            return None
        # Only entities this micro-batch touched: others were seen partially.
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
        self.status.alerts_new += n_new
        self.status.alerts_updated += n_upd
        self.status.alerts_suppressed_repeats += alerts.height - news.height
        if news.height == 0:
            return None
        now = datetime.now(UTC)
        return news.with_columns(pl.lit(now).dt.cast_time_unit("us").alias("detected_at"))

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
        return (
            pl.concat([parts[0], parts[1].tail(n)], how="vertical_relaxed")
            .unique(subset="event_id", keep="last", maintain_order=True)
            .tail(n)
        )

    def _maybe_compact(self) -> None:
        iv = self.live.compact_interval_s
        if iv <= 0 or time.monotonic() - self._last_compact < iv:
            return
        self._last_compact = time.monotonic()
        for ds in ("events", "quarantine", "summaries", "alerts"):
            try:
                self.store.compact(ds)
            except Exception as exc:
                log.warning("compaction of %s failed: %s", ds, exc)

    def close(self) -> None:
        """Flush what is pending and release resources (store writer lock, parser)."""
        try:
            self.finalize_streams()
            self.flush()
        finally:
            self._stop_worker()
            self.pipe.close()
            if self.sinks is not None:
                self.sinks.close()
                self.status.sinks = self.sinks.counters()


def _pl(result: Any) -> pl.DataFrame:
    """A DuckDB result as a polars frame."""
    df = pl.from_arrow(result.to_arrow_table())
    assert isinstance(df, pl.DataFrame)
    return df


def _conform(df: pl.DataFrame, sch: pa.Schema) -> pl.DataFrame:
    out = pl.from_arrow(df.select(sch.names).to_arrow().cast(sch))
    assert isinstance(out, pl.DataFrame)
    return out


def _concat(tables: list[pa.Table], sch: pa.Schema) -> pa.Table:
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return sch.empty_table()
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables([t.cast(sch) for t in tables])


# --------------------------------------------------------------------------- loop helpers
class StopFlag:
    """Set by signal handlers (SIGINT/SIGTERM) to end a live loop cleanly."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None

    def set(self, signum: int | None = None) -> None:
        """Request a stop."""
        self.signum = signum
        self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()


def install_stop_handlers(flag: StopFlag) -> None:
    """SIGINT/SIGTERM/SIGHUP set ``flag`` (the loop then flushes and exits)."""
    import signal

    def handler(signum: int, _frame: Any) -> None:
        flag.set(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, handler)


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (for tests and the metrics endpoint)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
