"""Live-mode commands: ``tail``, ``run``, ``kafka``, ``status`` (and ``ingest --follow``).

Plain typer-annotated functions, registered in :mod:`toolwatch.cli`. This module is
imported by every ``toolwatch`` invocation (typer reads the signatures to build the CLI),
so it imports nothing heavy: the loops these commands drive live in
:mod:`toolwatch.live_cli` and :mod:`toolwatch.live` and are imported when a live command
actually runs, not when ``toolwatch ingest`` or ``toolwatch --help`` starts.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from toolwatch.cli_common import ConfigOpt, DataDirOpt, config_for, fail
from toolwatch.errors import ToolwatchError

AlertsOutOpt = Annotated[
    Path | None, typer.Option("--alerts-out", help="Also append alerts as JSON lines here.")
]
WebhookOpt = Annotated[
    str | None,
    typer.Option("--webhook", help="Also POST one JSON message per incident to this URL "
                 "(grouped and rate-limited: docs/live.md, Notifications)."),
]
SlackOpt = Annotated[
    bool, typer.Option("--slack", help="Send --webhook messages as Slack {\"text\"} messages.")
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
NoStdoutOpt = Annotated[
    bool, typer.Option("--no-stdout", help="Do not print alerts on stdout.")
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


def _start(
    config: Path | None,
    data_dir: Path | None,
    verbose: bool,
    *,
    metrics_port: int | None = None,
    start_at_end: bool = False,
    **sink_options: Any,
) -> tuple[Any, Any, Any, Any]:
    """A live command's logging, config, live config, sinks (``sink_options`` as
    :func:`toolwatch.live_cli.sinks_for` takes them) and stop flag; a bad config exits."""
    from toolwatch import live
    from toolwatch import live_cli as impl

    _setup_logging(verbose)
    try:
        cfg = config_for(config, data_dir)
        lc = live.LiveConfig.from_config(cfg)
        if start_at_end:
            lc.start_at_end = True
        if metrics_port is not None:
            lc.metrics_port = metrics_port
        sinks = impl.sinks_for(lc, **sink_options)
    except (ToolwatchError, ValueError) as exc:
        raise fail(exc) from None
    stop = live.StopFlag()
    live.install_stop_handlers(stop)
    return cfg, lc, sinks, stop


def tail(
    paths: Annotated[list[str], typer.Argument(help="Files and globs to follow (like tail -F).")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    alerts_out: AlertsOutOpt = None,
    webhook: WebhookOpt = None,
    slack: SlackOpt = False,
    no_stdout: NoStdoutOpt = False,
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
    from toolwatch import live_cli as impl

    cfg, lc, sinks, stop = _start(
        config, data_dir, verbose, metrics_port=metrics_port, start_at_end=from_end,
        stdout_default=True, alerts_out=alerts_out, webhook=webhook, slack=slack,
        no_stdout=no_stdout)
    for line in impl.describe_watch(paths):  # what is followed, and paths that are missing
        typer.echo(f"toolwatch tail: {line}", err=True)
    try:
        impl.tail_files(cfg, paths, stop=stop, sinks=sinks, live=lc, idle_exit_s=exit_when_idle,
                        verbose=verbose)
    except ToolwatchError as exc:
        raise fail(exc) from None


def follow(
    paths: list[str],
    config: Path | None = None,
    data_dir: Path | None = None,
    *,
    verbose: bool = False,
) -> None:
    """``ingest --follow``: ``-`` follows stdin to EOF; paths are tailed like ``tail``."""
    from toolwatch import live_cli as impl

    cfg, lc, sinks, stop = _start(config, data_dir, verbose, stdout_default=False)
    try:
        if paths == ["-"]:
            impl.follow_stdin(cfg, stop=stop, sinks=sinks, live=lc, verbose=verbose)
        elif "-" in paths:
            raise ToolwatchError("--follow takes either - or files, not both")
        else:
            impl.tail_files(cfg, paths, stop=stop, sinks=sinks, live=lc, verbose=verbose)
    except ToolwatchError as exc:
        raise fail(exc) from None


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
    argv = list(ctx.args)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise fail(ValueError("no server command: toolwatch run [OPTIONS] -- CMD ARGS..."), 2)
    from toolwatch.spool import PRESTARTED

    # Normally the console entry point (toolwatch.spool.main) started the server before
    # the CLI was imported, its stderr already spooled.
    wrapped = PRESTARTED.pop("run", None)
    if wrapped is not None and wrapped.server.argv != argv:
        raise fail(ValueError("internal error: pre-started server does not match"), 1)
    _setup_logging(verbose)
    try:
        cfg = config_for(config, data_dir)
        if wrapped is not None and (
            os.path.abspath(wrapped.data_dir) != os.path.abspath(cfg.data_dir)
        ):  # the fast path resolved the store differently from the config: a bug
            PRESTARTED["run"] = wrapped  # the entry point stops it on the way out
            raise ValueError(f"internal error: server spooled to {wrapped.data_dir}, "
                             f"config says {cfg.data_dir}")
        if wrapped is None:
            from toolwatch.ingest.sources.wrapper import start_wrapped

            try:
                wrapped = start_wrapped(cfg.data_dir, argv)
            except OSError as exc:
                raise ToolwatchError(
                    f"cannot start {argv[0]!r}: {exc.strerror or exc}"
                ) from exc
    except (ToolwatchError, ValueError) as exc:
        raise fail(exc, 127 if "cannot start" in str(exc) else 1) from None
    from toolwatch import live
    from toolwatch import live_cli as impl

    try:
        lc = live.LiveConfig.from_config(cfg)
        if metrics_port is not None:
            lc.metrics_port = metrics_port
        sinks = impl.sinks_for(lc, stdout_default=False, alerts_out=alerts_out, webhook=webhook,
                                slack=slack, allow_stdout=False)
    except (ToolwatchError, ValueError) as exc:
        # The server runs already: report, keep its stderr spooled and wait for it.
        fail(exc)
        lc, sinks = None, None
    from toolwatch.cli import _exit_now, _skip_teardown

    try:
        code = impl.run_wrapped(cfg, argv, sinks=sinks, live=lc, verbose=verbose,
                                wrapped=wrapped, on_abandon=_exit_now)
    except (ToolwatchError, ValueError) as exc:
        raise fail(exc, 1) from None
    # Committed, sinks closed, threads joined: no interpreter teardown (it resets the signal
    # handlers, so the MCP client's SIGTERM during a slow teardown killed us with -15
    # instead of the server's code).
    _skip_teardown()
    raise typer.Exit(code)


def collect(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    alerts_out: AlertsOutOpt = None,
    webhook: WebhookOpt = None,
    slack: SlackOpt = False,
    no_stdout: NoStdoutOpt = False,
    once: Annotated[
        bool, typer.Option("--once", help="One pass over the spools present, then stop.")
    ] = False,
    metrics_port: MetricsOpt = None,
    exit_when_idle: IdleExitOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Ingest and detect the spooled stderr of every `toolwatch run` on the store.

    One collector per store sees all wrapped servers together (cross-session alerts).
    Without it, the first wrapper that gets the store's collector lock collects.

    Example: toolwatch collect -d /var/lib/toolwatch --alerts-out alerts.jsonl
    """
    from toolwatch import live_cli as impl

    cfg, lc, sinks, stop = _start(
        config, data_dir, verbose, metrics_port=metrics_port, stdout_default=True,
        alerts_out=alerts_out, webhook=webhook, slack=slack, no_stdout=no_stdout)
    if once:
        stop.set()
    try:
        impl.collect_spools(cfg, stop=stop, sinks=sinks, live=lc, verbose=verbose,
                            idle_exit_s=exit_when_idle)
    except ToolwatchError as exc:
        raise fail(exc) from None


def kafka(
    bootstrap_servers: Annotated[
        str, typer.Option("--bootstrap-servers", "-b", help="host:port[,host:port...]")
    ],
    topic: Annotated[list[str], typer.Option("--topic", "-t", help="Topic(s) to consume.")],
    group_id: Annotated[str, typer.Option("--group-id", "-g", help="Consumer group.")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    alerts_topic: Annotated[
        str | None,
        typer.Option("--alerts-topic", help="Also produce every alert version to this topic."),
    ] = None,
    alerts_out: AlertsOutOpt = None,
    webhook: WebhookOpt = None,
    slack: SlackOpt = False,
    no_stdout: NoStdoutOpt = False,
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
    from toolwatch import live_cli as impl

    cfg, lc, sinks, stop = _start(
        config, data_dir, verbose, metrics_port=metrics_port, stdout_default=True,
        alerts_out=alerts_out, webhook=webhook, slack=slack, no_stdout=no_stdout,
        kafka_topic=alerts_topic, default_bootstrap=bootstrap_servers)
    opts = {
        "max_poll_interval_ms": max_poll_interval_ms,
        "session_timeout_ms": session_timeout_ms,
        "heartbeat_interval_ms": heartbeat_interval_ms,
        "auto_offset_reset": auto_offset_reset,
    }
    try:
        impl.consume_kafka(cfg, bootstrap_servers=bootstrap_servers, topics=topic,
                           group_id=group_id, consumer_options=opts, stop=stop, sinks=sinks,
                           live=lc, idle_exit_s=exit_when_idle, verbose=verbose)
    except ToolwatchError as exc:
        raise fail(exc) from None
    except Exception as exc:  # kafka-python errors: broker down, auth...
        from kafka.errors import KafkaError

        if isinstance(exc, KafkaError):
            raise fail(ToolwatchError(f"kafka:{bootstrap_servers}: {exc}")) from None
        raise


def status(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Also show stopped processes.")
    ] = False,
    writers_json: Annotated[
        bool, typer.Option("--writers", help="With --json: also list the processes that "
                           "committed to the tables (kind table_writer).")
    ] = False,
) -> None:
    """Show live processes writing to the store: events/s, lag, quarantine, sessions, alerts.

    Also lists every process, on any machine, that committed to the store's tables in the
    last day (all with --all), read from the tables themselves.
    """
    from toolwatch import live

    try:
        cfg = config_for(config, data_dir)
    except ToolwatchError as exc:
        raise fail(exc) from None
    if not cfg.data_dir.is_dir():
        # A mistyped -d must not read as "nothing running" with exit 0.
        raise fail(FileNotFoundError(
            f"no toolwatch store at {cfg.data_dir} (check -d / $TOOLWATCH_DATA_DIR)"))
    from toolwatch.ingest.sources.spool import pending_spools

    rows = [s for s in live.read_statuses(cfg.data_dir) if all_ or s["alive"]]
    writers = _table_writers(cfg, all_)
    # Spools not yet ingested (kind "spool"): a wrapped server's stderr waiting for the
    # collector, or left by a wrapper that died (orphaned: the next writer ingests it).
    spools = [{"kind": "spool", "alive": s["wrapper_alive"], **s}
              for s in pending_spools(cfg.data_dir)]
    from toolwatch.output import json_dumps, safe_rich

    if json_out:
        # terminal-safe: names hold file paths and server commands
        print(json_dumps(rows + spools + (writers if writers_json else [])))
        return

    # Wide enough for the twelve columns when piped (rich falls back to 80 columns off a
    # terminal, which folded every cell to a few characters).
    console = Console(width=max(Console().width, 180))
    if spools:
        st = Table(title=safe_rich(f"spools waiting on {cfg.data_dir}"))
        for c in ("wrapper", "server", "bytes", "state"):
            st.add_column(c, overflow="fold")
        for s in spools:
            state = "wrapper running" if s["wrapper_alive"] else (
                "orphaned (ingested by the next writer)" if s["orphaned"] else "server running")
            st.add_row(safe_rich(s["wid"]), safe_rich(str(s["name"])[:40]), f"{s['bytes']:,}",
                       state)
        console.print(st)
    if writers:
        wt = Table(title="processes that committed to the store's tables (every machine), "
                         "from the streams table")
        for c in ("writer (host:pid:id)", "streams", "last commit"):
            wt.add_column(c, overflow="fold")
        for w in writers:
            wt.add_row(safe_rich(w["writer"]), f"{w['streams']:,}", str(w["last_commit"]))
        console.print(wt)
    if not rows:
        console.print(safe_rich(f"no live toolwatch process writing to {cfg.data_dir}"))
        return
    t = Table(title=safe_rich(f"live toolwatch processes on {cfg.data_dir}"))
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
            safe_rich(s.get("kind", "?")), str(s.get("pid")), state,
            f"{s.get('events_per_s', 0):,.0f}", f"{s.get('events_stored', 0):,}",
            safe_rich(lag_txt), f"{s.get('quarantined_total', 0):,}",
            f"{s.get('server_text_lines', 0):,}", f"{s.get('active_sessions', 0):,}",
            f"{s.get('alerts_new', 0)}/{s.get('alerts_updated', 0)}",
            f"{s.get('last_flush_ms', 0):.0f} ms",
            safe_rich(_short_name(s.get("name", ""), cfg.data_dir)[:60]),
        )
    console.print(t)


def _table_writers(cfg: Any, all_: bool) -> list[dict[str, Any]]:
    """Writers of the tables (every machine's, read from the table itself): those that
    committed in the last day, or all with ``--all``."""
    from datetime import UTC, datetime, timedelta

    from toolwatch.store import Store

    try:
        tbl = Store(cfg.data_dir).writers()
    except ToolwatchError:
        return []
    since = datetime.now(UTC) - timedelta(days=1)
    out = [{"kind": "table_writer", **r} for r in tbl.to_pylist()
           if all_ or (r["last_commit"] is not None and r["last_commit"] >= since)]
    return sorted(out, key=lambda r: r["last_commit"], reverse=True)


def _short_name(name: object, data_dir: Path) -> str:
    """A process's name without the store path it repeats (the table's title has it)."""
    text, base = str(name), str(data_dir).rstrip("/")
    if base and text.startswith(base + "/"):
        return text[len(base) + 1 :]
    return text.replace(base, "STORE") if base else text
