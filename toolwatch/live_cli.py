"""The loops behind the live-mode commands (:mod:`toolwatch.live_commands`).

:func:`tail_files`, :func:`follow_stdin`, :func:`collect_spools` (behind
:func:`run_wrapped`) and :func:`consume_kafka` each build one live source
(:mod:`toolwatch.ingest.sources.base`) and run it with the one driver loop
(:mod:`toolwatch.live.driver`); tests and benchmarks call them directly.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolwatch.allocator import fix_mmap_threshold
from toolwatch.config import Config
from toolwatch.errors import ToolwatchError
from toolwatch.ingest.sources.base import LiveSource, display_name
from toolwatch.live import (
    DetectFn,
    FlushResult,
    LiveConfig,
    LivePipeline,
    SinkConfig,
    StatusPublisher,
    StopFlag,
)
from toolwatch.live.driver import Driver
from toolwatch.store import Store

log = logging.getLogger("toolwatch.live")

def sinks_for(
    lc: LiveConfig,
    *,
    stdout_default: bool,
    alerts_out: Path | None = None,
    webhook: str | None = None,
    slack: bool = False,
    no_stdout: bool = False,
    kafka_topic: str | None = None,
    default_bootstrap: str = "",
    allow_stdout: bool = True,
) -> Any:
    from toolwatch.live.sinks import build_sinks

    confs = list(lc.sinks)
    if not confs and stdout_default and not no_stdout:
        confs.append(SinkConfig(type="stdout"))
    if no_stdout:
        confs = [c for c in confs if c.type != "stdout"]
    if alerts_out is not None:
        confs.append(SinkConfig(type="file", path=str(alerts_out)))
    if webhook:
        confs.append(SinkConfig(type="webhook", url=webhook, slack=slack))
    if kafka_topic:
        # the option says alerts: every version, as documented (a [[live.sinks]] kafka
        # table sends incident messages unless it says notify = "alerts")
        confs.append(SinkConfig(type="kafka", topic=kafka_topic, notify="alerts"))
    return build_sinks(confs, allow_stdout=allow_stdout, default_bootstrap=default_bootstrap)


class _LentSinks:
    """Sinks lent to a recovery pass: its alerts go to them; closing stays the owner's."""

    def __init__(self, sinks: Any):
        self._sinks = sinks

    def emit(self, alerts: Any) -> None:
        """Hand alerts to the owner's sinks."""
        self._sinks.emit(alerts)

    def counters(self) -> dict[str, dict[str, int]]:
        """The owner's sink counters."""
        return self._sinks.counters()

    def close(self) -> None:
        """Nothing: the process that owns the sinks closes them when it ends."""


class _Runner:
    """Shared plumbing of every live loop: store, pipeline, status publishing."""

    def __init__(
        self,
        config: Config,
        *,
        kind: str,
        name: str,
        sinks: Any,
        detector: DetectFn | None,
        live: LiveConfig | None,
        verbose: bool = False,
    ):
        self.config = config
        self.live = live or LiveConfig.from_config(config)
        if self.live.detect:
            # A detection pass frees multi-MiB buffers: with a fixed mmap threshold their
            # pages go back at once instead of waiting for the next trim (-40 MiB at p95).
            fix_mmap_threshold()
        if kind in ("tail", "kafka", "follow"):
            # Spools of wrappers that died are ingested by the next writer of the store.
            # Their alerts go to this process's sinks too (lent: still open afterwards).
            recover_spools(config, detector=detector, live=self.live,
                           sinks=None if sinks is None else _LentSinks(sinks))
        self.store = Store(config.data_dir, compact_min_files=config.store.compact_min_files,
                  vacuum_hours=config.store.vacuum_hours)
        self.lp = LivePipeline(
            config, self.store, kind=kind, name=name, sinks=sinks, detector=detector,
            live=self.live,
        )
        self.pub = StatusPublisher(
            self.lp.status, config.data_dir, self.live.metrics_port, self.live.metrics_host
        )
        self.verbose = verbose
        if verbose:
            self.lp.on_commit.append(self._log_flush)

    def _log_flush(self, res: FlushResult) -> None:
        st = self.lp.status
        log.info(
            "flush: %d lines, %d events, %d alert(s) in %.0f ms | %.0f events/s, "
            "stored %d, quarantined %d, active sessions %d, lag %s",
            res.lines, res.events, 0 if res.alerts is None else res.alerts.height,
            res.seconds * 1000, st.events_per_s, st.events_stored, st.quarantined_total,
            st.active_sessions, st.lag,
        )

    def drive(self, source: LiveSource, *, stop: StopFlag | None = None,
              idle_exit_s: float | None = None, max_seconds: float | None = None,
              on_iteration: Callable[[], None] | None = None) -> Driver:
        """Run ``source`` with the one driver loop, then close it and the pipeline.

        The source is closed before the pipeline: a source that commits on close (Kafka
        offsets, its rebalance listener) still finds the pipeline open.
        """
        d = Driver(source, self.lp, stop=stop, publish=self.pub.write,
                   idle_exit_s=idle_exit_s, max_seconds=max_seconds,
                   on_iteration=on_iteration)
        try:
            d.run()
        finally:
            try:
                source.close()
            finally:
                d.apply_status()
                self.close()
        return d

    def close(self) -> None:
        try:
            self.lp.close()
        finally:
            self.pub.close(remove=False)
            self.store.close()


# --------------------------------------------------------------------------- loops
def describe_watch(patterns: list[str]) -> list[str]:
    """What ``tail`` follows, one terminal-safe line per path or glob, with warnings.

    Each pattern resolved the way the tail reads it (relative to the working directory;
    a glob re-expanded at every poll, a directory's files): ``watching <abs path>``,
    ``watching glob <abs pattern> (N files now)``, or a ``warning:`` for a path that does
    not exist (followed once it appears) or a glob that matches nothing yet (a mistyped
    path used to wait in silence).
    """
    import glob as _glob
    import os

    from toolwatch.output import safe_text

    out: list[str] = []
    for pat in patterns:
        full = os.path.abspath(pat) if pat else pat
        shown = safe_text(full)
        if _glob.has_magic(pat):
            n = sum(1 for p in _glob.glob(pat, recursive=True) if os.path.isfile(p))
            out.append(f"watching glob {shown} ({n:,} file{'s' if n != 1 else ''} now)")
            if n == 0:
                out.append(f"warning: glob {shown} matches no file yet "
                           "(files are picked up when they appear)")
        elif os.path.isdir(pat):
            n = sum(1 for p in Path(pat).iterdir() if p.is_file())
            out.append(f"watching directory {shown} ({n:,} files now)")
        elif os.path.exists(pat):
            out.append(f"watching {shown}")
        else:
            out.append(f"warning: {shown} does not exist (followed once it appears)")
            if pat.startswith("~"):
                out.append("warning: '~' is not expanded (the path is read literally)")
    return out


def tail_files(
    config: Config,
    patterns: list[str],
    *,
    stop: StopFlag | None = None,
    sinks: Any = None,
    detector: DetectFn | None = None,
    live: LiveConfig | None = None,
    idle_exit_s: float | None = None,
    max_seconds: float | None = None,
    verbose: bool = False,
    on_flush: Callable[[FlushResult], None] | None = None,
) -> LivePipeline:
    """Follow files/globs into the store until stopped; returns the (closed) pipeline."""
    from toolwatch.ingest.sources.file_tail import FileTailLive

    # (a pattern may hold a non-UTF-8 file name: status and metrics need valid text)
    r = _Runner(config, kind="tail", name=display_name(" ".join(patterns)), sinks=sinks,
                detector=detector,
                live=live, verbose=verbose)
    lc = r.live
    if on_flush is not None:
        r.lp.on_commit.append(on_flush)
    src = FileTailLive(
        patterns,
        r.store.checkpoints(),
        read_bytes=lc.read_bytes,
        rotate_wait_s=lc.rotate_wait_s,
        start_at_end=lc.start_at_end,
        max_line_bytes=config.ingest.max_line_bytes,
        poll_interval_s=lc.poll_interval_s,
        follow_symlinks=lc.follow_symlinks,
    )
    r.drive(src, stop=stop, idle_exit_s=idle_exit_s, max_seconds=max_seconds)
    return r.lp


def follow_stdin(
    config: Config,
    *,
    stop: StopFlag | None = None,
    sinks: Any = None,
    detector: DetectFn | None = None,
    live: LiveConfig | None = None,
    verbose: bool = False,
) -> LivePipeline:
    """``ingest --follow -``: read a pipe continuously, flushing every interval, until EOF."""
    from toolwatch.ingest.sources.file_tail import LineAssembler
    from toolwatch.ingest.sources.process import PipeLive, stdin_reader

    r = _Runner(config, kind="follow", name="stdin", sinks=sinks, detector=detector,
                live=live, verbose=verbose)
    asm = LineAssembler("stdin", r.store.checkpoints(),
                        max_line_bytes=config.ingest.max_line_bytes)
    r.drive(PipeLive(stdin_reader(), asm), stop=stop)
    return r.lp


def collect_spools(
    config: Config,
    *,
    stop: StopFlag | None = None,
    sinks: Any = None,
    detector: DetectFn | None = None,
    live: LiveConfig | None = None,
    verbose: bool = False,
    orphans_only: bool = False,
    idle_exit_s: float | None = None,
    lock: Any = None,
    kind: str = "collect",
    name: str = "",
) -> LivePipeline | None:
    """Ingest and detect every spool of the store (see :mod:`toolwatch.ingest.sources.wrapper`).

    One collector per store (the spool collector lock), so the sessions of every wrapped
    server on the store are detected together: a caller or address spreading its calls
    over many short sessions and servers is one entity in one window.

    Parameters
    ----------
    stop
        Once set, one last pass reads what the spools hold (finishing those whose wrapper
        is gone), commits, and returns.
    orphans_only
        Only spools whose wrapper is gone, then return (recovery by any writing command).
    idle_exit_s
        Return once no spool is left and nothing arrived for this long.
    lock
        The collector lock, already held (released on return). ``None``: wait for it.

    Returns
    -------
    LivePipeline or None
        The closed pipeline (``None`` when stopped before getting the lock).
    """
    from toolwatch.ingest.sources.spool import SpoolLive
    from toolwatch.ingest.sources.wrapper import try_collector_lock

    stop = stop if stop is not None else StopFlag()
    while lock is None:
        lock = try_collector_lock(config.data_dir)
        if lock is None:
            if stop:
                return None
            stop.event.wait(0.5)
    try:
        r = _Runner(config, kind=kind, name=name or f"spools of {config.data_dir}",
                    sinks=sinks, detector=detector, live=live, verbose=verbose)
        lc = r.live
        src = SpoolLive(config.data_dir, r.store.checkpoints(), orphans_only=orphans_only,
                        read_bytes=lc.read_bytes, max_line_bytes=config.ingest.max_line_bytes,
                        poll_interval_s=lc.poll_interval_s,
                        writer_grace_s=lc.writer_grace_s)
        r.drive(src, stop=stop, idle_exit_s=idle_exit_s)
        return r.lp
    finally:
        lock.close()


def recover_spools(config: Config, **kwargs: Any) -> int:
    """Ingest spools left by wrappers that died, unless a collector runs (it will).

    Cheap when there is nothing to do (a directory listing). Called by every command that
    writes to the store. Returns the number of orphaned spools found.
    """
    from toolwatch.ingest.sources.spool import has_orphans, pending_spools
    from toolwatch.ingest.sources.wrapper import try_collector_lock

    if not has_orphans(config.data_dir):
        return 0
    lock = try_collector_lock(config.data_dir)
    if lock is None:
        return 0  # a live collector ingests them
    n = sum(1 for s in pending_spools(config.data_dir) if s["orphaned"])
    collect_spools(config, orphans_only=True, lock=lock, kind="recover",
                   name="orphaned spools", **kwargs)
    return n


def run_wrapped(
    config: Config,
    argv: list[str],
    *,
    sinks: Any = None,
    detector: DetectFn | None = None,
    live: LiveConfig | None = None,
    verbose: bool = False,
    wrapped: Any = None,
    on_abandon: Callable[[int], None] | None = None,
) -> int:
    """``toolwatch run -- CMD``: start the server, spool its stderr, return its exit code.

    The server's stderr is a spool file under the store from its first byte (see
    :mod:`toolwatch.ingest.sources.wrapper`). This wrapper collects (parses, stores and detects) the
    spools of the store when it holds the collector lock, or tries to get it every
    0.5 s; otherwise it only echoes its spool. When the server has exited it waits for
    its collection to commit, unless a stop signal (SIGTERM/SIGINT/SIGHUP, as an MCP
    client sends 2 s after closing stdin) comes first: then ``on_abandon(code)`` is called
    within ~100 ms (the CLI exits there); the spool stays and the next toolwatch process
    on the store ingests it.
    """
    from toolwatch.ingest.sources.wrapper import start_wrapped, try_collector_lock

    if wrapped is None:
        try:
            wrapped = start_wrapped(config.data_dir, argv)
        except OSError as exc:
            raise ToolwatchError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
    server = wrapped.server
    if on_abandon is not None:  # the CLI's exit (flushes logging) instead of the bare one
        server.abandon = on_abandon
    server_done = StopFlag()
    box: dict[str, Any] = {}
    name = " ".join(argv)[:200]

    def collect_once(orphans_only: bool = False) -> bool:
        lock = try_collector_lock(config.data_dir)
        if lock is not None:
            box["collected"] = True
            collect_spools(config, stop=server_done, sinks=sinks, detector=detector,
                           live=live, verbose=verbose, lock=lock, kind="run", name=name,
                           orphans_only=orphans_only)
        return lock is not None

    def collect() -> None:
        try:
            while not server_done:
                if collect_once():
                    return
                server_done.event.wait(0.5)
            # The server is gone and another process collected meanwhile: if it is gone
            # too, ingest what is left (our spool included) before leaving.
            collect_once(orphans_only=True)
        except BaseException as exc:  # reported after the server exits
            box["error"] = exc
            log.error("toolwatch monitoring failed (%s); the server (pid %d) keeps running, "
                      "its stderr stays spooled", exc, server.pid)

    worker = threading.Thread(target=collect, name="run-collector", daemon=True)
    worker.start()
    code: int | None = None
    try:
        while True:
            try:
                assert server.proc is not None
                server.proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
        code = server.exit_code()
        wrapped.finish()  # echo the rest; the spool's lock is released to the collector
        server_done.set()
        while worker.is_alive():
            worker.join(0.02)
            if server.stop_after_exit.is_set():
                worker.join(0.08)
                if worker.is_alive() and on_abandon is not None:
                    on_abandon(code)
                break
    finally:
        # Once the server's code is known, a late SIGTERM (the client's, while we shut
        # down) exits with that code at once instead of killing us with -15.
        done_code = code
        server.restore_signals(
            None if on_abandon is None or done_code is None
            else (lambda _s, _f: on_abandon(done_code))  # type: ignore[misc]
        )
    if "error" in box:
        raise box["error"]
    if not box.get("collected") and sinks is not None:
        sinks.close()
    return code


def consume_kafka(
    config: Config,
    *,
    bootstrap_servers: str,
    topics: list[str],
    group_id: str,
    consumer_options: dict[str, Any] | None = None,
    stop: StopFlag | None = None,
    sinks: Any = None,
    detector: DetectFn | None = None,
    live: LiveConfig | None = None,
    idle_exit_s: float | None = None,
    max_seconds: float | None = None,
    verbose: bool = False,
    on_flush: Callable[[FlushResult], None] | None = None,
    on_start: Callable[[Any], None] | None = None,
) -> LivePipeline:
    """Consume topics as a member of ``group_id`` until stopped.

    ``on_flush`` runs after each store commit; ``on_start`` gets the
    :class:`~toolwatch.ingest.sources.kafka.KafkaSource` once it exists (benchmarks, tests).
    """
    from toolwatch.ingest.sources.kafka import KafkaSource, tune_fetch_malloc
    from toolwatch.live.entities import EntityPass, drop_address_alerts

    stop = stop if stop is not None else StopFlag()
    live = live or LiveConfig.from_config(config)
    group_entities = live.detect and live.entity_pass_s > 0
    if group_entities:
        if detector is None:
            from toolwatch.live.detection import default_detector

            detector, minutes = default_detector(config)
            if not live.window_minutes and minutes:
                live = dataclasses.replace(live, window_minutes=minutes)
        if detector is not None:
            # Address windows cross partitions: the group's entity pass scores them.
            detector = drop_address_alerts(detector)
    r = _Runner(config, kind="kafka", name=f"{group_id}:{','.join(topics)}", sinks=sinks,
                detector=detector, live=live, verbose=verbose)
    if r.live.detect:
        # The fetch answers' buffers get pages of their own, returned when freed: with
        # detection the consumer peaked ~30 MiB lower (docs/kafka-notes.md, "Throughput", Memory).
        # Without, it stays ~170 MiB below the bound and the page faults (~3% of its
        # CPU) buy nothing.
        tune_fetch_malloc()
    if on_flush is not None:
        r.lp.on_commit.append(on_flush)
    try:
        # The configured flush size reaches the source (its backlog test compares the lag
        # with it); before, the source always used the default (issue 29).
        src = KafkaSource(bootstrap_servers=bootstrap_servers, topics=topics,
                         group_id=group_id, store=r.store, consumer_options=consumer_options,
                         flush_events=r.live.flush_events,
                         lag_warn_s=r.live.kafka_lag_warn_s)
    except BaseException:
        r.close()
        raise
    if on_start is not None:
        on_start(src)
    tick = None
    if group_entities and r.lp.detector is not None:
        ep = EntityPass(config, r.store, interval_s=live.entity_pass_s,
                        window_minutes=live.window_minutes or 60.0,
                        max_events=live.entity_pass_events)

        def tick() -> None:
            if not (src.leads_entities() and ep.due()):
                return
            news = ep.run()
            r.lp.status.extra.update(ep.status())
            if news is not None and news.height:
                r.lp.status.alerts_new += news.height
                if r.lp.sinks is not None:
                    r.lp.sinks.emit(news)

    r.drive(src, stop=stop, idle_exit_s=idle_exit_s, max_seconds=max_seconds,
            on_iteration=tick)
    return r.lp


__all__ = [
    "collect_spools",
    "consume_kafka",
    "follow_stdin",
    "recover_spools",
    "run_wrapped",
    "sinks_for",
    "tail_files",
]
