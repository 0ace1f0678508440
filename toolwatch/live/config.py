"""Settings of live mode: the ``[live]`` table and its ``[[live.sinks]]``."""

from __future__ import annotations

from dataclasses import dataclass

from toolwatch.config import Config, check_tuning, doc, from_dict
from toolwatch.detectors.config import SEVERITY_RANK  # one definition; light import


@dataclass
class SinkConfig:
    """One alert destination (``[[live.sinks]]``)."""

    type: str = doc("Sink kind: stdout, file, kafka or webhook (toolwatch.live.sinks.SINKS).",
                    "stdout")
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
        "Only alerts at or above this severity: low, medium, high, critical. With "
        "notify = incidents: only incidents whose severity (from their risk) reaches it.",
        "low",
    )
    notify: str = doc(
        "What the sink sends: 'incidents' (one message per incident, grouped and "
        "rate-limited like Alertmanager: group_wait_s, group_interval_s, "
        "repeat_interval_s; toolwatch/live/notify.py) or 'alerts' (every new or updated "
        "alert version). Empty: incidents for webhook and kafka, alerts for stdout and "
        "file (a local record of every version).",
        "",
    )
    group_wait_s: float = doc(
        "notify = incidents: a new incident's first message waits this long, so the "
        "alerts that come with it (the next stages of one attack) go out in one message.",
        30.0,
    )
    group_interval_s: float = doc(
        "notify = incidents: after a message, changes to the incident (new alerts, "
        "categories, stages, a higher risk) are gathered and sent as one update at most "
        "this often.",
        300.0,
    )
    repeat_interval_s: float = doc(
        "notify = incidents: an incident still active but unchanged is sent again this "
        "long after its last message (0: never).",
        14_400.0,
    )
    dashboard_url: str = doc(
        "notify = incidents: base URL of the dashboard (e.g. http://toolwatch:8501); each "
        "message links to <dashboard_url>/incident?incident=<id>. A URL containing "
        "{incident_id} is used as given with the id filled in. Empty: no link.",
        "",
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
        10_000,
    )
    poll_interval_s: float = doc(
        "tail: how often files and globs are checked for new data when idle.", 0.1
    )
    read_bytes: int = doc(
        "tail: bytes read from one file per read call (a backlog is read in such steps).",
        4_194_304,
        tuning=True,
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
    follow_symlinks: bool = doc(
        "tail: read a followed path that is a symlink (off: it is reported and set aside, "
        "never read; a log directory writable by a monitored server could otherwise "
        "point a log name at any readable file).",
        False,
    )
    signal_drain_s: float = doc(
        "run/collect: after SIGTERM/SIGINT, how long the final pass over spools may keep "
        "reading before the process ends (a flood or a planted huge file must not make a "
        "stop hang); what is left is resumed by the next collector from its checkpoint. "
        "A second signal ends the pass at once.",
        10.0,
    )
    writer_grace_s: float = doc(
        "run/collect: after a wrapped server exits, a final pass keeps reading its spool "
        "this long while a child it forked still writes there; the rest is left to the "
        "next collector.",
        5.0,
    )
    detect: bool = doc("Run the detectors incrementally (off: store events only).", True)
    backlog_detect_interval_s: float = doc(
        "Under a backlog (size-triggered flushes) with overlap_detection, micro-batches "
        "wait up to this long to be detected together (detection costs about the window, "
        "not the new events). Interval-triggered flushes never wait.",
        5.0,
        tuning=True,
    )
    backlog_detect_events: int = doc(
        "Under a backlog (size-triggered flushes) with overlap_detection, micro-batches "
        "are stored as they come but detection waits until this many new events have "
        "gathered, then runs once over every entity they touched (a pass costs about "
        "the same whatever the number of new events, so catching up is several times "
        "faster; memory is unchanged: the window and max_detect_events bound it). A "
        "crash in between loses the alerts of those events (not the events). Caught up, "
        "every flush is detected at once. 0: max_detect_events x detect_passes.",
        0,
        tuning=True,
    )
    max_queued_events: int = doc(
        "Transformed events (parsed micro-batches, ~0.7 KB each with their raw lines) "
        "waiting for the commit thread, at most; past it the reader waits (back-pressure: "
        "the file, the spool or Kafka keeps the lines), so a host too busy to keep up "
        "holds this many in memory, not more. Under a backlog the commit thread also "
        "waits for this many (or the window's size, if smaller) before committing them as "
        "one batch. A larger queue catches up a little faster for more memory at the "
        "peak (docs/performance.md); raise it with flush_events. 0: 4 x flush_events.",
        10_000,
        tuning=True,
    )
    overlap_detection: bool = doc(
        "tail/run/follow: detect and commit a micro-batch on a second thread while the "
        "next one is read and parsed, and commit it on a third while the next one is "
        "detected (same order and atomicity; a backlog's waiting micro-batches are "
        "detected together). Off: one flush at a time.",
        True,
        tuning=True,
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
        "held event (the detectors' columns only), so 150,000 events ≈ 25 MiB — about 4 h "
        "of traffic at 10 events/s, 15 s at 10,000 events/s.",
        150_000,
        tuning=True,
    )
    max_detect_events: int = doc(
        "Most events one detection pass reads. Detection needs roughly 2 KB of working "
        "memory per event it reads, so this bounds live mode's peak memory. A flush whose "
        "touched entities hold more events over the window is detected in several passes, "
        "split by caller (each session and caller whole in one pass; see detect_passes). "
        "memory_high_mib can halve it while the RSS is high. 0: one pass over everything "
        "touched.",
        40_000,
        tuning=True,
    )
    detect_passes: int = doc(
        "Most passes of max_detect_events one flush detects in. Under dense traffic "
        "every micro-batch touches nearly every entity; past max_detect_events x "
        "detect_passes touched events, the newest are read (detect_capped counter). "
        "Bounds a flush's detection CPU; memory is bounded by max_detect_events.",
        2,
        tuning=True,
    )
    backlog_detect_passes: int = doc(
        "Passes a detection a backlog deferred (see backlog_detect_events) runs in, over "
        "the same at most max_detect_events x detect_passes touched events. Each pass has a "
        "fixed cost whatever its size (fitting the baselines), so fewer passes catch up "
        "faster, with the same alerts, for a higher peak during that detection "
        "(memory_high_mib can halve it when memory is high). Caught up, flushes keep "
        "detect_passes. 0: detect_passes.",
        1,
        tuning=True,
    )
    memory_high_mib: int = doc(
        "When the process's RSS is at or above this many MiB as a detection starts, its "
        "passes read half as many events each (twice as many passes over the same "
        "events: more CPU, less working memory at once, so the peak stays lower while "
        "the next micro-batch is parsed beside it). Never below max_detect_events / 2. "
        "0 (default): off. The passes' own rise is not what makes the peak (parse, window "
        "expiry and store write beside it are) and halved passes cost alert latency, so "
        "it is a knob for hosts that value memory over latency (docs/performance.md).",
        0,
        tuning=True,
    )
    memory_gate_mib: int = doc(
        "The memory gate: while the process's RSS is at or above this many MiB, the heavy "
        "phases (the reader's parse of a backlog-sized micro-batch, over 1.5 x "
        "flush_events lines; the commit thread's detection and compaction) take turns "
        "instead of running at once, and the one that ends returns freed memory to the OS "
        "before the next starts (toolwatch.live.memgate). Below it they overlap (catch-up "
        "speed). The RSS peaks of a live process are two of these phases at once; taking "
        "turns costs some catch-up speed (docs/performance.md, Live memory). 0: off (no "
        "releases either).",
        460,
        tuning=True,
    )
    drop_code_pages: bool = doc(
        "While the process's RSS is at or above memory_gate_mib as a heavy phase starts, "
        "unmap the resident pages of the shared libraries' code (clean, file-backed; the "
        "page cache keeps them and the next use maps them back without I/O), so RSS "
        "counts the code in use rather than every page of polars, DuckDB and Arrow "
        "touched since start; that matters on kernels that map page-cache folios whole "
        "(Linux 6.16+ on ext4). Never below the gate: mapping the code back in at every "
        "real-time flush costs alert latency. The store's library (delta-rs), which only "
        "commits run, is unmapped after every commit, below the gate too. Linux only "
        "(toolwatch/codepages.py; docs/performance.md, Live memory).",
        True,
        tuning=True,
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
        20_000,
        tuning=True,
    )
    history_dir: str = doc(
        "Store whose recent events seed the baselines at start-up (default: this store). "
        "Point it at a store holding past traffic to replay logs with the baselines batch "
        "analyze had.",
        "",
    )
    max_tracked_alerts: int = doc(
        "Alert ids remembered to tell new/changed alerts from repeats (LRU).",
        200_000,
        tuning=True,
    )
    compact_interval_s: float = doc(
        "Seconds from the end of one compaction round of the store's small files to the "
        "start of the next (0: never). While a backlog is read a round waits, up to 4 "
        "times this since the last one ended: catching up comes first, and every file "
        "is merged once either way.",
        300.0,
        tuning=True,
    )
    compact_budget_s: float = doc(
        "Seconds of compaction one commit may do (at least one merge of up to 4 MiB of "
        "small files); what is left goes on at the next commits, so the commit thread, "
        "and with it alerts, never stops for a whole compaction (a backlog's hundreds of "
        "files take minutes to merge). 0: one merge per commit.",
        0.25,
        tuning=True,
    )
    status_interval_s: float = doc(
        "How often the status file read by `toolwatch status` is rewritten.", 1.0
    )
    kafka_lag_warn_s: float = doc(
        "kafka: warn (log, `toolwatch status`, metrics) when the consumer lag has been "
        "growing, never back down to where it started, for longer than this (0: never).",
        60.0,
    )
    entity_pass_s: float = doc(
        "kafka: seconds between passes over the shared table that score client "
        "addresses across every partition, run by the one group member that owns "
        "partition 0 of the first topic; members then leave address alerts to it "
        "(docs/store.md). 0: each member scores addresses on its own partitions only.",
        10.0,
    )
    entity_pass_events: int = doc(
        "kafka: at most this many of the newest events per entity pass (~2 KB each).",
        500_000,
        tuning=True,
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
        # [tuning.live] keys were merged into config.live (toolwatch.config.merge_tuning)
        check_tuning(cls, (config.tuning or {}).get("live"), "live")
        lc = from_dict(cls, dict(config.live or {}), prefix="live")
        lc.validate()
        return lc

    def validate(self) -> None:
        """Check values.

        Raises
        ------
        toolwatch.errors.ConfigError
            On a non-positive interval, a negative queue bound or an unknown sink type.
        """
        from toolwatch.errors import ConfigError

        if self.flush_interval_s <= 0 or self.flush_events <= 0:
            raise ConfigError("must be positive", key="live.flush_interval_s")
        if self.backlog_detect_passes < 0:
            raise ConfigError("must be 0 (detect_passes) or positive",
                              key="live.backlog_detect_passes")
        if self.memory_gate_mib < 0:
            raise ConfigError("must be 0 (off) or positive", key="live.memory_gate_mib")
        if self.compact_budget_s < 0:
            raise ConfigError("must be 0 or positive", key="live.compact_budget_s")
        if self.memory_high_mib < 0:
            raise ConfigError("must be 0 (off) or positive", key="live.memory_high_mib")
        if self.max_queued_events < 0:
            raise ConfigError("must be 0 (4 x flush_events) or positive",
                              key="live.max_queued_events")
        # The sinks registry (toolwatch.live.sinks.SINKS) says which types exist and what
        # each needs: adding a sink never touches this file.
        from toolwatch.live.sinks import SINKS

        for i, s in enumerate(self.sinks):
            cls = SINKS.get(s.type)
            if cls is None:
                raise ConfigError(
                    f"unknown sink type {s.type!r}: {', '.join(SINKS)}",
                    key=f"live.sinks[{i}].type",
                )
            for req in cls.requires:
                if not getattr(s, req):
                    raise ConfigError(f"{s.type} sink needs a {req}",
                                      key=f"live.sinks[{i}].{req}")
            if s.notify not in ("", "incidents", "alerts"):
                raise ConfigError("must be 'incidents', 'alerts' or empty (by sink type)",
                                  key=f"live.sinks[{i}].notify")
            for name in ("group_wait_s", "group_interval_s", "repeat_interval_s"):
                if getattr(s, name) < 0:
                    raise ConfigError("must be 0 or positive", key=f"live.sinks[{i}].{name}")
            if s.min_severity not in SEVERITY_RANK:
                raise ConfigError(
                    f"must be one of {', '.join(SEVERITY_RANK)}",
                    key=f"live.sinks[{i}].min_severity",
                )


