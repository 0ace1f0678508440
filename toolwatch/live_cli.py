"""Live-mode commands: ``tail``, ``run``, ``kafka``, ``status`` (and ``ingest --follow``).

The command functions are plain typer-annotated functions registered in
:mod:`toolwatch.cli`; the loops they drive (:func:`tail_files`, :func:`follow_stdin`,
:func:`run_wrapped`, :func:`consume_kafka`) are importable for tests and benchmarks.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from toolwatch.config import Config, load_config
from toolwatch.errors import ToolwatchError
from toolwatch.live import (
    DetectFn,
    FlushResult,
    LiveConfig,
    LivePipeline,
    SinkConfig,
    StatusPublisher,
    StopFlag,
    install_stop_handlers,
    read_statuses,
)
from toolwatch.store import Store

err = Console(stderr=True)
log = logging.getLogger("toolwatch.live")

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML). Default: ./toolwatch.toml"),
]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", "-d", help="Store directory (overrides config).")
]
AlertsOutOpt = Annotated[
    Path | None, typer.Option("--alerts-out", help="Also append alerts as JSON lines here.")
]
WebhookOpt = Annotated[
    str | None, typer.Option("--webhook", help="Also POST each alert (JSON) to this URL.")
]
SlackOpt = Annotated[
    bool, typer.Option("--slack", help="Send --webhook alerts as Slack {\"text\"} messages.")
]
MetricsOpt = Annotated[
    int | None, typer.Option("--metrics-port", help="Serve Prometheus /metrics on this port.")
]
IdleExitOpt = Annotated[
    float | None,
    typer.Option(
        "--exit-when-idle",
        help="Stop once nothing new arrived for this many seconds (replays, scripts).",
    ),
]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Log counters to stderr after every flush.")
]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s toolwatch %(levelname)s %(message)s",
    )


def _config(config: Path | None, data_dir: Path | None) -> Config:
    cfg = load_config(config)
    if data_dir is not None:
        cfg.store.data_dir = str(data_dir)
    return cfg


def _sinks_for(
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
def tail(
    paths: Annotated[list[str], typer.Argument(help="Files and globs to follow (like tail -F).")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    alerts_out: AlertsOutOpt = None,
    webhook: WebhookOpt = None,
    slack: SlackOpt = False,
    no_stdout: Annotated[
        bool, typer.Option("--no-stdout", help="Do not print alerts on stdout.")
    ] = False,
    from_end: Annotated[
        bool, typer.Option("--from-end", help="Skip what files hold at startup (no checkpoint).")
    ] = False,
    metrics_port: MetricsOpt = None,
    exit_when_idle: IdleExitOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Follow log files: appends, rotation (rename and copy-truncate), new files of a glob.

    Alerts are printed on stdout as JSON lines (and sent to configured sinks) within
    seconds; offsets are checkpointed in the store, so a restart resumes exactly.

    Example: toolwatch tail '/var/log/mcp/*.jsonl' --alerts-out alerts.jsonl
    """
    _setup_logging(verbose)
    try:
        cfg = _config(config, data_dir)
        lc = LiveConfig.from_config(cfg)
        if from_end:
            lc.start_at_end = True
        if metrics_port is not None:
            lc.metrics_port = metrics_port
        sinks = _sinks_for(lc, stdout_default=True, alerts_out=alerts_out, webhook=webhook,
                           slack=slack, no_stdout=no_stdout)
    except (ToolwatchError, ValueError) as exc:
        raise _fail(exc) from None
    stop = StopFlag()
    install_stop_handlers(stop)
    try:
        tail_files(cfg, paths, stop=stop, sinks=sinks, live=lc, idle_exit_s=exit_when_idle,
                   verbose=verbose)
    except ToolwatchError as exc:
        raise _fail(exc) from None


def follow(
    paths: list[str],
    config: Path | None = None,
    data_dir: Path | None = None,
    *,
    verbose: bool = False,
) -> None:
    """``ingest --follow``: ``-`` follows stdin to EOF; paths are tailed like ``tail``."""
    _setup_logging(verbose)
    try:
        cfg = _config(config, data_dir)
        lc = LiveConfig.from_config(cfg)
        sinks = _sinks_for(lc, stdout_default=False)
    except (ToolwatchError, ValueError) as exc:
        raise _fail(exc) from None
    stop = StopFlag()
    install_stop_handlers(stop)
    try:
        if paths == ["-"]:
            follow_stdin(cfg, stop=stop, sinks=sinks, live=lc, verbose=verbose)
        elif "-" in paths:
            raise ToolwatchError("--follow takes either - or files, not both")
        else:
            tail_files(cfg, paths, stop=stop, sinks=sinks, live=lc, verbose=verbose)
    except ToolwatchError as exc:
        raise _fail(exc) from None


def run(
    ctx: typer.Context,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    alerts_out: AlertsOutOpt = None,
    webhook: WebhookOpt = None,
    slack: SlackOpt = False,
    metrics_port: MetricsOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Start an MCP stdio server and watch it: toolwatch run [OPTIONS] -- CMD ARGS...

    stdin/stdout pass straight between the client and the server (toolwatch never writes
    to stdout); the server's stderr is echoed and parsed (JSON lines become events). Exits
    with the server's exit code.

    Example: toolwatch run --alerts-out alerts.jsonl -- python my_server.py
    """
    # stdout belongs to the MCP protocol: nothing of ours may ever reach it.
    sys.stdout = sys.stderr
    _setup_logging(verbose)
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise _fail(ValueError("no server command: toolwatch run [OPTIONS] -- CMD ARGS..."), 2)
    try:
        cfg = _config(config, data_dir)
        lc = LiveConfig.from_config(cfg)
        if metrics_port is not None:
            lc.metrics_port = metrics_port
        sinks = _sinks_for(lc, stdout_default=False, alerts_out=alerts_out, webhook=webhook,
                           slack=slack, allow_stdout=False)
        code = run_wrapped(cfg, argv, sinks=sinks, live=lc, verbose=verbose)
    except (ToolwatchError, ValueError) as exc:
        raise _fail(exc, 127 if "cannot start" in str(exc) else 1) from None
    raise typer.Exit(code)


def kafka(
    bootstrap_servers: Annotated[
        str, typer.Option("--bootstrap-servers", "-b", help="host:port[,host:port...]")
    ],
    topic: Annotated[list[str], typer.Option("--topic", "-t", help="Topic(s) to consume.")],
    group_id: Annotated[str, typer.Option("--group-id", "-g", help="Consumer group.")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    alerts_topic: Annotated[
        str | None, typer.Option("--alerts-topic", help="Also produce alerts to this topic.")
    ] = None,
    alerts_out: AlertsOutOpt = None,
    webhook: WebhookOpt = None,
    slack: SlackOpt = False,
    no_stdout: Annotated[
        bool, typer.Option("--no-stdout", help="Do not print alerts on stdout.")
    ] = False,
    max_poll_interval_ms: Annotated[
        int, typer.Option(help="Longest gap between polls before the group evicts us.")
    ] = 300_000,
    session_timeout_ms: Annotated[int, typer.Option(help="Group session timeout.")] = 10_000,
    heartbeat_interval_ms: Annotated[int, typer.Option(help="Heartbeat interval.")] = 3_000,
    auto_offset_reset: Annotated[
        str, typer.Option(help="earliest | latest: where a partition with no checkpoint starts.")
    ] = "earliest",
    metrics_port: MetricsOpt = None,
    exit_when_idle: IdleExitOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Consume MCP logs from Kafka as a consumer-group member (several instances share).

    Offsets are committed only after the batch's events and alerts are stored; the store
    is the source of truth, so restarts and rebalances never store a message twice.
    Recommended producer key: the caller id (keeps a caller on one consumer).

    Example: toolwatch kafka -b kafka:9092 -t mcp-logs -g toolwatch --alerts-topic mcp-alerts
    """
    _setup_logging(verbose)
    try:
        cfg = _config(config, data_dir)
        lc = LiveConfig.from_config(cfg)
        if metrics_port is not None:
            lc.metrics_port = metrics_port
        sinks = _sinks_for(lc, stdout_default=True, alerts_out=alerts_out, webhook=webhook,
                           slack=slack, no_stdout=no_stdout, kafka_topic=alerts_topic,
                           default_bootstrap=bootstrap_servers)
    except (ToolwatchError, ValueError) as exc:
        raise _fail(exc) from None
    stop = StopFlag()
    install_stop_handlers(stop)
    opts = {
        "max_poll_interval_ms": max_poll_interval_ms,
        "session_timeout_ms": session_timeout_ms,
        "heartbeat_interval_ms": heartbeat_interval_ms,
        "auto_offset_reset": auto_offset_reset,
    }
    try:
        consume_kafka(cfg, bootstrap_servers=bootstrap_servers, topics=topic, group_id=group_id,
                      consumer_options=opts, stop=stop, sinks=sinks, live=lc,
                      idle_exit_s=exit_when_idle, verbose=verbose)
    except ToolwatchError as exc:
        raise _fail(exc) from None
    except Exception as exc:  # kafka-python errors: broker down, auth...
        from kafka.errors import KafkaError

        if isinstance(exc, KafkaError):
            raise _fail(ToolwatchError(f"kafka:{bootstrap_servers}: {exc}")) from None
        raise


def status(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Also show stopped processes.")
    ] = False,
) -> None:
    """Show live processes writing to the store: events/s, lag, quarantine, sessions, alerts."""
    try:
        cfg = _config(config, data_dir)
    except ToolwatchError as exc:
        raise _fail(exc) from None
    rows = [s for s in read_statuses(cfg.data_dir) if all_ or s["alive"]]
    if json_out:
        print(orjson.dumps(rows, default=str).decode())
        return
    if not rows:
        Console().print(f"no live toolwatch process writing to {cfg.data_dir}")
        return
    t = Table(title=f"live toolwatch processes on {cfg.data_dir}")
    for c in ("kind", "pid", "state", "events/s", "events", "lag", "quarantined",
              "server text", "active sessions", "alerts new/upd", "last flush", "name"):
        t.add_column(c, overflow="fold")
    for s in rows:
        lag = s.get("lag") or {}
        lag_txt = ", ".join(
            f"{k}={v:,}" if isinstance(v, int) else f"{k}={v}" for k, v in lag.items()
        )
        state = "running" if s["alive"] else "stopped"
        if s["alive"] and s["age_s"] > 10:
            state = f"stale ({s['age_s']:.0f}s)"
        t.add_row(
            s.get("kind", "?"), str(s.get("pid")), state, f"{s.get('events_per_s', 0):,.0f}",
            f"{s.get('events_stored', 0):,}", lag_txt, f"{s.get('quarantined_total', 0):,}",
            f"{s.get('server_text_lines', 0):,}", f"{s.get('active_sessions', 0):,}",
            f"{s.get('alerts_new', 0)}/{s.get('alerts_updated', 0)}",
            f"{s.get('last_flush_ms', 0):.0f} ms", str(s.get("name", ""))[:60],
        )
    Console().print(t)


def _fail(exc: Exception, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
    return typer.Exit(code)


__all__ = [
    "consume_kafka",
    "follow",
    "follow_stdin",
    "kafka",
    "run",
    "run_wrapped",
    "status",
    "tail",
    "tail_files",
]

