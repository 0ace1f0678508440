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
    from ingest.sources.file_tail import TailSource

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
    """Feed a :class:`~ingest.sources.process.PipeReader` into the pipeline until EOF."""
    from ingest.sources.process import split_server_text

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
    from ingest.sources.file_tail import LineAssembler
    from ingest.sources.process import stdin_reader

    r = _Runner(config, kind="follow", name="stdin", sinks=sinks, detector=detector,
                live=live, verbose=verbose)
    try:
        asm = LineAssembler("stdin", r.store.checkpoints(),
                            max_line_bytes=config.ingest.max_line_bytes)
        _follow_pipe(r, stdin_reader(), asm, split_text=False, stop=stop)
    finally:
        r.close()
    return r.lp


def run_wrapped(
    config: Config,
    argv: list[str],
    *,
    sinks: Any = None,
    detector: DetectFn | None = None,
    live: LiveConfig | None = None,
    verbose: bool = False,
) -> int:
    """``toolwatch run -- CMD``: start the server, watch its stderr, return its exit code."""
    from ingest.sources.file_tail import LineAssembler
    from ingest.sources.process import WrappedServer

    name = Path(argv[0]).name if argv else "server"
    # The server starts first: the MCP client must not wait for toolwatch's own start-up
    # (store recovery, detector imports). Its stderr is echoed at once and buffered for
    # the pipeline meanwhile; signals are forwarded from here on.
    server = WrappedServer(argv)
    try:
        server.start()
    except OSError as exc:
        raise ToolwatchError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
    # The main thread only supervises (forwards signals at once, waits for the child);
    # parsing and detection run on a worker so a long flush never delays a signal.
    box: dict[str, Any] = {}
    drained = StopFlag()  # set when the child is gone and its stderr had time to drain

    def work() -> None:
        r: _Runner | None = None
        try:
            r = _Runner(config, kind="run", name=" ".join(argv)[:200], sinks=sinks,
                        detector=detector, live=live, verbose=verbose)
            assert server.reader is not None
            asm = LineAssembler(f"run:{name}", None, salt=server.salt(),
                                max_line_bytes=config.ingest.max_line_bytes)
            r.lp.status.extra["child_pid"] = server.pid
            _follow_pipe(r, server.reader, asm, split_text=True, stop=drained, child=server)
        except BaseException as exc:  # reported after the server exits
            box["error"] = exc
            if server.reader is not None:
                # Keep draining (and echoing) stderr so the server never blocks on it.
                server.reader.q = _Discard()  # type: ignore[assignment]
            log.error("toolwatch monitoring failed; the server (pid %d) keeps running",
                      server.pid)
        finally:
            box["runner"] = r

    worker = threading.Thread(target=work, name="run-pipeline", daemon=True)
    worker.start()
    try:
        while True:
            try:
                assert server.proc is not None
                server.proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
        code = server.exit_code()
        worker.join(10.0)  # stderr EOF follows the exit (unless a grandchild holds it)
        drained.set()
        worker.join(10.0)
    finally:
        server.restore_signals()
        r = box.get("runner")
        if r is not None:
            r.lp.status.extra["child_exit_code"] = server.poll()
            r.close()
    if "error" in box:
        raise box["error"]
    return code


class _Discard:
    """Queue stand-in that drops chunks (the server's stderr is still echoed)."""

    def put(self, item: object) -> None:
        return None


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
) -> LivePipeline:
    """Consume topics as a member of ``group_id`` until stopped."""
    from ingest.sources.kafka import KafkaLiveSource

    stop = stop if stop is not None else StopFlag()
    r = _Runner(config, kind="kafka", name=f"{group_id}:{','.join(topics)}", sinks=sinks,
                detector=detector, live=live, verbose=verbose)
    src: KafkaLiveSource | None = None
    try:
        src = KafkaLiveSource(
            r.lp, r.store, bootstrap_servers=bootstrap_servers, topics=topics,
            group_id=group_id, consumer_options=consumer_options,
        )

        def status_extra() -> None:
            assert src is not None
            lag = src.lag()
            r.lp.status.lag["messages"] = sum(lag.values())
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
    "consume_kafka",
    "follow_stdin",
    "run_wrapped",
    "sinks_for",
    "tail_files",
]
