"""The loops behind the live-mode commands (:mod:`toolwatch.live_commands`).

:func:`tail_files`, :func:`follow_stdin`, :func:`run_wrapped` and :func:`consume_kafka`
each run one live source until stopped; tests and benchmarks call them directly.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolwatch.config import Config
from toolwatch.errors import ToolwatchError
from toolwatch.live import (
    DetectFn,
    FlushResult,
    LiveConfig,
    LivePipeline,
    SinkConfig,
    StatusPublisher,
    StopFlag,
)
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
    from toolwatch.sinks import build_sinks

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
        confs.append(SinkConfig(type="kafka", topic=kafka_topic))
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
        if kind in ("tail", "kafka", "follow"):
            # Spools of wrappers that died are ingested by the next writer of the store.
            # Their alerts go to this process's sinks too (lent: still open afterwards).
            recover_spools(config, detector=detector, live=self.live,
                           sinks=None if sinks is None else _LentSinks(sinks))
        self.store = Store(config.data_dir, compact_min_files=config.store.compact_min_files)
        self.store.recover()
        self.lp = LivePipeline(
            config, self.store, kind=kind, name=name, sinks=sinks, detector=detector,
            live=self.live,
        )
        self.pub = StatusPublisher(
            self.lp.status, config.data_dir, self.live.metrics_port, self.live.metrics_host
        )
        self.verbose = verbose
        self._last_status = 0.0
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

    def tick(self, extra: Callable[[], None] | None = None, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_status >= self.live.status_interval_s:
            self._last_status = now
            st = self.lp.status
            st.events_per_s = round(self.lp.rate.rate(), 1)
            if extra is not None:
                extra()
            self.pub.write()

    def close(self) -> None:
        try:
            self.lp.close()
        finally:
            self.pub.close(remove=False)
            self.store.close()


# --------------------------------------------------------------------------- loops
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
    from toolwatch.ingest.sources.file_tail import TailSource

    stop = stop if stop is not None else StopFlag()
    r = _Runner(config, kind="tail", name=" ".join(patterns), sinks=sinks, detector=detector,
                live=live, verbose=verbose)
    lc = r.live
    if on_flush is not None:
        r.lp.on_commit.append(on_flush)
    src = TailSource(
        patterns,
        r.store.checkpoints(),
        read_bytes=lc.read_bytes,
        rotate_wait_s=lc.rotate_wait_s,
        start_at_end=lc.start_at_end,
        max_line_bytes=config.ingest.max_line_bytes,
    )

    def status_extra() -> None:
        st = r.lp.status
        st.lag["bytes"] = src.lag_bytes()
        st.sources = src.streams()
        st.extra["tail"] = dict(src.counters.__dict__)

    started = last_data = time.monotonic()
    # flush(wait=False): this thread reads and parses; detection and the store commit run
    # on the pipeline's commit thread meanwhile (in order, atomically per batch).
    try:
        while not stop:
            got = 0
            for batch in src.poll():
                if src.new_fingerprints:
                    r.lp.warm_up(src.new_fingerprints)
                    src.new_fingerprints.clear()
                r.lp.add(batch)
                got += len(batch)
                if r.lp.due():
                    r.lp.flush(wait=False)
                if stop:
                    break
            if src.new_fingerprints:
                r.lp.warm_up(src.new_fingerprints)
                src.new_fingerprints.clear()
            if r.lp.due():
                r.lp.flush(wait=False)
            r.tick(status_extra)
            now = time.monotonic()
            if got:
                last_data = now
            if max_seconds is not None and now - started >= max_seconds:
                break
            if (
                idle_exit_s is not None
                and now - last_data >= idle_exit_s
                and r.lp.pending_lines == 0
            ):
                break
            if not got:
                r.lp.caught_up()
                stop.event.wait(min(lc.poll_interval_s, r.lp.time_to_due()))
    finally:
        src.close()
        status_extra()
        r.close()
    return r.lp


def _follow_pipe(
    r: _Runner,
    reader: Any,
    asm: Any,
    *,
    split_text: bool,
    stop: StopFlag | None,
    child: Any = None,
) -> None:
    """Feed a :class:`~toolwatch.ingest.sources.process.PipeReader` into the pipeline until EOF."""
    from toolwatch.ingest.sources.process import split_server_text

    lp = r.lp
    eof = False
    warmed = False
    while not eof:
        if stop is not None and stop:
            break
        timeout = min(0.2, lp.time_to_due())
        got = False
        for chunk in reader.chunks(timeout):
            got = True
            batch = asm.feed(b"", final=True) if chunk is None else asm.feed(chunk)
            if chunk is None:
                eof = True
            if batch is None or (len(batch) == 0 and not batch.final):
                continue
            if not warmed and asm.fp is not None and not split_text:
                lp.warm_up([asm.fp])
                warmed = True
            if split_text:
                batch, text, offs, nos = split_server_text(batch)
                if text:
                    lp.add_server_text(batch.source, batch.source_fp, text, offs, nos)
            lp.add(batch)
            if lp.due():
                lp.flush(wait=False)
        if not got:
            lp.caught_up()
        cut = asm.cut_long_line()
        if cut is not None:
            lp.add(cut)
        if lp.due():
            lp.flush(wait=False)
        r.tick(lambda: r.lp.status.lag.__setitem__("pipe_bytes_read", reader.bytes_read))
    if asm.fp is not None:
        lp.finalize_streams([asm.fp])


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
    from toolwatch.ingest.sources.process import stdin_reader

    r = _Runner(config, kind="follow", name="stdin", sinks=sinks, detector=detector,
                live=live, verbose=verbose)
    try:
        asm = LineAssembler("stdin", r.store.checkpoints(),
                            max_line_bytes=config.ingest.max_line_bytes)
        _follow_pipe(r, stdin_reader(), asm, split_text=False, stop=stop)
    finally:
        r.close()
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
    """Ingest and detect every spool of the store (see :mod:`toolwatch.spool`).

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
    from toolwatch.ingest.sources.process import split_server_text
    from toolwatch.spool import SpoolSource, try_collector_lock

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
        src = SpoolSource(config.data_dir, r.store.checkpoints(), orphans_only=orphans_only,
                          read_bytes=lc.read_bytes, max_line_bytes=config.ingest.max_line_bytes)

        def status_extra() -> None:
            r.lp.status.lag["bytes"] = src.lag_bytes()
            r.lp.status.sources = {"spools": sorted(src.entries), "spool_bytes_read":
                                   src.bytes_read}

        last_data = time.monotonic()
        try:
            while True:
                last = bool(stop)
                got = 0
                for batch in src.poll():
                    if src.new_fingerprints:
                        r.lp.warm_up(src.new_fingerprints)
                        src.new_fingerprints.clear()
                    batch, text, offs, nos = split_server_text(batch)
                    if text:
                        r.lp.add_server_text(batch.source, batch.source_fp, text, offs, nos)
                    r.lp.add(batch)
                    got += len(batch) + len(text)
                    if r.lp.due():
                        r.lp.flush(wait=False)
                fin = src.finished()
                if fin:
                    fps = [e.asm.fp for w in fin if (e := src.entries.get(w)) and e.asm.fp]
                    r.lp.finalize_streams(fps)
                    r.lp.flush()  # the spools' last lines are committed before removal
                    src.remove(fin)
                elif r.lp.due():
                    r.lp.flush(wait=False)
                r.tick(status_extra)
                now = time.monotonic()
                if got:
                    last_data = now
                if last or (orphans_only and not src.entries):
                    break
                if (idle_exit_s is not None and not src.entries
                        and now - last_data >= idle_exit_s and r.lp.pending_lines == 0):
                    break
                if not got:
                    r.lp.caught_up()
                    stop.event.wait(min(lc.poll_interval_s, max(r.lp.time_to_due(), 0.01)))
        finally:
            src.close()
            status_extra()
            r.close()
        return r.lp
    finally:
        lock.close()


def recover_spools(config: Config, **kwargs: Any) -> int:
    """Ingest spools left by wrappers that died, unless a collector runs (it will).

    Cheap when there is nothing to do (a directory listing). Called by every command that
    writes to the store. Returns the number of orphaned spools found.
    """
    from toolwatch.spool import has_orphans, pending_spools, try_collector_lock

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
    :mod:`toolwatch.spool`). This wrapper collects (parses, stores and detects) the
    spools of the store when it holds the collector lock, or tries to get it every
    0.5 s; otherwise it only echoes its spool. When the server has exited it waits for
    its collection to commit, unless a stop signal (SIGTERM/SIGINT/SIGHUP, as an MCP
    client sends 2 s after closing stdin) comes first: then ``on_abandon(code)`` is called
    within ~100 ms (the CLI exits there); the spool stays and the next toolwatch process
    on the store ingests it.
    """
    from toolwatch.spool import start_wrapped, try_collector_lock

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

    def collect() -> None:
        try:
            while not server_done:
                lock = try_collector_lock(config.data_dir)
                if lock is not None:
                    box["collected"] = True
                    collect_spools(config, stop=server_done, sinks=sinks, detector=detector,
                                   live=live, verbose=verbose, lock=lock, kind="run",
                                   name=name)
                    return
                server_done.event.wait(0.5)
            # The server is gone and another process collected meanwhile: if it is gone
            # too, ingest what is left (our spool included) before leaving.
            lock = try_collector_lock(config.data_dir)
            if lock is not None:
                box["collected"] = True
                collect_spools(config, stop=server_done, sinks=sinks, detector=detector,
                               live=live, verbose=verbose, lock=lock, kind="run", name=name,
                               orphans_only=True)
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
    :class:`~toolwatch.ingest.sources.kafka.KafkaLiveSource` once it exists (benchmarks, tests).
    """
    from toolwatch.ingest.sources.kafka import KafkaLiveSource

    stop = stop if stop is not None else StopFlag()
    r = _Runner(config, kind="kafka", name=f"{group_id}:{','.join(topics)}", sinks=sinks,
                detector=detector, live=live, verbose=verbose)
    src: KafkaLiveSource | None = None
    try:
        src = KafkaLiveSource(
            r.lp, r.store, bootstrap_servers=bootstrap_servers, topics=topics,
            group_id=group_id, consumer_options=consumer_options,
        )
        if on_flush is not None:
            r.lp.on_commit.append(on_flush)
        if on_start is not None:
            on_start(src)

        def status_extra() -> None:
            assert src is not None
            lag = src.lag()
            r.lp.status.lag = src.watch_lag(lag, r.live.kafka_lag_warn_s)
            r.lp.status.sources = {
                "partitions": sorted(f"{tp.topic}/{tp.partition}" for tp in src.assigned),
                "lag_by_partition": lag,
            }
            r.lp.status.extra["kafka"] = dict(src.counters)

        src.on_poll = lambda: r.tick(status_extra)
        src.run(stop, idle_exit_s=idle_exit_s, max_seconds=max_seconds)
        r.tick(status_extra, force=True)
    finally:
        if src is not None:
            src.close()
        r.close()
    return r.lp


# --------------------------------------------------------------------------- commands


__all__ = [
    "collect_spools",
    "consume_kafka",
    "follow_stdin",
    "recover_spools",
    "run_wrapped",
    "sinks_for",
    "tail_files",
]
