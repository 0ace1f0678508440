"""The ``toolwatch`` command line."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

# numpy's OpenBLAS starts one thread per core that polls for work. toolwatch does no large
# linear algebra (the forest is trees; the rest is DuckDB, Arrow and polars), and on a
# two-core machine those threads took ~4% of the CPU from an ingest run. Set before numpy
# is first imported; an explicit setting in the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from toolwatch import __version__
from toolwatch.cli_common import ConfigOpt, DataDirOpt, config_for, err, fail
from toolwatch.config import describe, load_config, markdown_table
from toolwatch.detectors.config import SEVERITIES
from toolwatch.errors import ToolwatchError
from toolwatch.gc_pause import gc_paused
from toolwatch.output import error_text, json_dumps, safe_text
from toolwatch.spool import recover_orphans

if TYPE_CHECKING:
    from toolwatch.store import Store

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Catch abusive AI agents in MCP server tool-call logs.",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        print(__version__)
        raise typer.Exit(0)


@app.callback()
def _main_options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print the version and exit."),
    ] = False,
) -> None:
    """Catch abusive AI agents in MCP server tool-call logs."""





def _print_summary(counters: dict, *, title: str) -> None:
    from rich.text import Text

    # Plain Text, never markup: the title names a path and reasons may quote a source.
    t = Table(title=Text(safe_text(title)), show_header=False)
    t.add_column("what")
    t.add_column("count", justify="right")
    t.add_row("lines read", f"{counters['lines_read']:,}")
    t.add_row("events stored", f"{counters['events_stored']:,}")
    t.add_row("session summaries stored", f"{counters['summaries_stored']:,}")
    t.add_row("JSON-RPC responses merged", f"{counters['rpc_responses_merged']:,}")
    t.add_row("quarantined", f"{counters['quarantined_total']:,}")
    for reason, n in sorted(counters["quarantined"].items()):
        t.add_row(Text(f"  {safe_text(reason)}"), f"{n:,}")
    t.add_row("secrets hashed", f"{counters['secrets_redacted']:,}")
    if counters["already_stored_bytes_skipped"]:
        t.add_row("bytes already stored (skipped)", f"{counters['already_stored_bytes_skipped']:,}")
    Console(width=max(Console().width, 100)).print(t)


@app.command()
def ingest(
    paths: Annotated[
        list[str], typer.Argument(help="Files, globs, .gz, directories, or - for stdin.")
    ],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    json_summary: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON.")
    ] = False,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Keep reading: - follows a pipe to EOF, files are tailed (see toolwatch tail).",
        ),
    ] = False,
) -> None:
    """Read MCP logs into the store. Bad lines are quarantined, never fatal.

    Example: toolwatch ingest 'logs/*.jsonl.gz' -
    """
    if follow:
        from toolwatch.live_commands import follow as follow_paths

        follow_paths(paths, config, data_dir)
        return

    with gc_paused():  # from the big imports on (see toolwatch.gc_pause)
        from toolwatch.ingest.runner import ingest_paths

        try:
            cfg = config_for(config, data_dir)
            recover_orphans(cfg)  # spools of `toolwatch run` wrappers that died
            res = ingest_paths(cfg, paths, progress=progress)
        except ToolwatchError as exc:
            raise fail(exc) from None
    _skip_teardown()  # every batch is committed and every thread joined
    summary = res.counters.as_dict()
    if json_summary:
        print(json_dumps({**summary, "failures": res.failures}))
    else:
        _print_summary(summary, title=f"ingested into {cfg.data_dir}")
    for f in res.failures:
        err.print(error_text(f), highlight=False)
    if res.failures:
        raise typer.Exit(1)


@app.command()
def query(
    sql: Annotated[
        str,
        typer.Argument(
            help="One plain SELECT over events, sessions, alerts, alerts_raw, incidents, "
            "quarantine, summaries (see docs/query.md)."
        ),
    ],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json")] = "table",
    max_rows: Annotated[
        int | None,
        typer.Option("--max-rows", help="Row cap (default: query.max_rows; 0 = none)."),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            help="Seconds before the query is interrupted (default: query.timeout_seconds).",
        ),
    ] = None,
) -> None:
    """Forensic SQL over the store (read-only, bounded; Ctrl-C stops it).

    The query runs in a child process with a memory cap (query.memory_limit_mib) and is
    killed at the timeout. `toolwatch schema` lists the views and their columns.

    Exit codes: 0 ok, 1 the query failed (an error), 2 refused or bad option, 3 killed at
    the timeout, 4 over the memory cap (or its process died), 130 interrupted with Ctrl-C.

    Example: toolwatch query "SELECT tool, count(*) FROM events GROUP BY 1 ORDER BY 2 DESC"
    """
    import dataclasses

    from toolwatch import query as runner
    from toolwatch.errors import QueryRefusedError
    from toolwatch.output import write_rows
    from toolwatch.query_child import QueryCrashedError, QueryMemoryError, QueryTimeoutError

    if fmt not in ("table", "csv", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use table, csv or json"), 2)
    if (max_rows is not None and max_rows < 0) or (timeout is not None and timeout <= 0):
        raise fail(ValueError("--max-rows must be >= 0 and --timeout > 0"), 2)
    try:
        cfg = config_for(config, data_dir)
        limits = dataclasses.replace(
            cfg.query,
            **({"max_rows": max_rows} if max_rows is not None else {}),
            **({"timeout_seconds": timeout} if timeout is not None else {}),
        )
        # A plain fork of this single-threaded process runs the query (no fork server).
        res = runner.run_query(_existing_store(cfg.data_dir), sql, limits=limits)
    except QueryRefusedError as exc:
        raise fail(exc, 2) from None
    except QueryTimeoutError as exc:
        raise fail(exc, 3) from None
    except (QueryMemoryError, QueryCrashedError) as exc:
        raise fail(exc, 4) from None
    except ToolwatchError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        raise fail(RuntimeError("query cancelled (Ctrl-C)"), 130) from None
    try:
        _write_query_rows(res.table, fmt, write_rows)
    except KeyboardInterrupt:
        raise fail(RuntimeError("output cancelled (Ctrl-C)"), 130) from None
    except BrokenPipeError:
        raise typer.Exit(0) from None
    if res.truncated:
        why = (
            f"{limits.max_result_mib:,} MiB (query.max_result_mib)"
            if res.cut == "bytes"
            else f"{limits.max_rows:,} rows (--max-rows / query.max_rows)"
        )
        err.print(f"note: result cut at {why}", highlight=False, markup=False)


@app.command("schema")
def schema_cmd(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json")] = "table",
) -> None:
    """List the views `toolwatch query` can read, with every column and its type.

    Computed through the query guard, in a query child: each view is read as an
    analyst's `SELECT * FROM view` would be, so what is listed is what a query reaches.

    Example: toolwatch schema -d .toolwatch/demo/store -f csv
    """
    from toolwatch.output import write_rows
    from toolwatch.query import schema_listing

    if fmt not in ("table", "csv", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use table, csv or json"), 2)
    try:
        cfg = config_for(config, data_dir)
        tbl = schema_listing(_existing_store(cfg.data_dir), cfg.query)
    except ToolwatchError as exc:
        raise fail(exc) from None
    try:
        write_rows(tbl, fmt, sys.stdout, max_rows=100_000)
    except BrokenPipeError:
        raise typer.Exit(0) from None


def _existing_store(data_dir: str | Path) -> Store:
    """The store a read-only command reads; :class:`StoreError` when there is none.

    ``Store()`` creates its folders, so a mistyped ``-d`` used to leave an empty store
    behind and answer with 0 rows and exit 0: a silent wrong answer in an investigation.
    """
    from toolwatch.errors import StoreError
    from toolwatch.store import Store

    root = Path(data_dir)
    if not (root / "_state").is_dir():
        raise StoreError(
            f"no toolwatch store at {root} (check -d / $TOOLWATCH_DATA_DIR; "
            "ingest, analyze, tail, run or kafka create one)"
        )
    return Store(root)


def _write_query_rows(tbl: object, fmt: str, write_rows: object) -> None:
    """Render a result; a value the renderer cannot show makes the columns text, then an
    error line — never a traceback (polars panics derive from BaseException)."""
    import io

    from toolwatch.query import as_text, beyond_python_dates

    # A date Python cannot hold makes polars panic (and print a Rust backtrace): go
    # straight to text for those.
    first_try = None if beyond_python_dates(tbl) else tbl  # type: ignore[arg-type]
    for attempt in (first_try, None):
        buf = io.StringIO()
        try:
            table = attempt if attempt is not None else as_text(tbl)  # type: ignore[arg-type]
            write_rows(table, fmt, buf)  # type: ignore[operator]
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # includes pyo3's PanicException
            if attempt is None:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise fail(RuntimeError(f"cannot render the result: {first}")) from None
            continue
        sys.stdout.write(buf.getvalue())
        return


@app.command()
def analyze(
    paths: Annotated[list[str], typer.Argument(help="Log files/globs/- to ingest and analyze.")],
    alerts_out: Annotated[
        Path | None, typer.Option("--alerts-out", help="Write alerts as JSON lines here.")
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary tables.")] = False,
) -> None:
    """Ingest logs and run every detector on them (forensic replay: log time, not wall clock).

    Example: toolwatch analyze sample_logs/demo/*.jsonl* --alerts-out alerts.jsonl
    """
    with gc_paused():  # from the big imports on (see toolwatch.gc_pause)
        from toolwatch.analyze import analyze_paths, print_alerts

        try:
            cfg = config_for(config, data_dir)
            recover_orphans(cfg)  # spools of `toolwatch run` wrappers that died
            res = analyze_paths(cfg, paths, alerts_out=alerts_out, progress=progress)
        except ToolwatchError as exc:
            raise fail(exc) from None
    _skip_teardown()  # the store, alerts and their file are written; threads joined
    if not quiet:
        _print_summary(res.ingest.counters.as_dict(), title=f"ingested into {cfg.data_dir}")
        print_alerts(res.alerts, data_dir=cfg.data_dir)
    for f in res.ingest.failures:
        err.print(error_text(f), highlight=False)
    if res.ingest.failures:
        raise typer.Exit(1)


@app.command()
def train(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", help="Output path (default <data_dir>/models/forest.skops)."),
    ] = None,
    preview: Annotated[
        bool,
        typer.Option("--preview/--no-preview",
                     help="Then run every detector, as configured, over the same history "
                          "(nothing stored) and print what it would alert on: alerts per "
                          "day by category, the top callers and tools."),
    ] = True,
    min_severity: Annotated[
        str, typer.Option("--min-severity", help="Count only alerts from this severity.")
    ] = "low",
) -> None:
    """Fit the isolation forest on the store's history (skops, not pickle), then preview the
    alerts the current settings would raise on that history.

    Example: toolwatch train -d /var/lib/toolwatch
    """
    from toolwatch import detectors
    from toolwatch.analyze import load_events, run_detectors
    from toolwatch.store import Store

    if min_severity not in SEVERITIES:
        err.print(f"--min-severity must be one of {', '.join(SEVERITIES)}", highlight=False)
        raise typer.Exit(2)
    try:
        cfg = config_for(config, data_dir)
        events, summaries = load_events(Store(cfg.data_dir), None)
        path = model or cfg.forest_path
        info = detectors.train(
            events, summaries, detectors.DetectorsConfig.from_dict(cfg.detectors), path
        )
    except ToolwatchError as exc:
        raise fail(exc) from None
    out = Console()
    out.print(
        f"trained on {info['n_train']:,} sessions (scikit-learn {info['sklearn_version']}); "
        f"saved to {info['path']}; {info['workflow_rules']} learned workflow rule(s) saved "
        f"to {info['workflows_path']} (see toolwatch workflows)",
        highlight=False,
        soft_wrap=True,
    )
    if preview:
        from toolwatch.noise import preview as noise_preview

        alerts = run_detectors(cfg, events, summaries, model_path=Path(info["path"]))
        _print_noise(out, noise_preview(alerts, events, min_severity=min_severity))


def _print_noise(out: Console, p: object) -> None:
    """The noise preview of ``toolwatch train`` as three terminal tables."""
    from rich.text import Text

    from toolwatch.noise import NoisePreview
    from toolwatch.output import table_cell

    assert isinstance(p, NoisePreview)
    out.print(f"\nwith the current settings this history ({p.n_days} day(s)) would raise "
              f"{p.n_alerts:,} alert(s), {p.n_alerts / max(p.n_days, 1):,.1f} a day "
              "(nothing stored; review before enabling live alerts):", highlight=False)
    if p.n_alerts == 0:
        return
    for title, frame in (("alerts by category", p.per_day),
                         ("top callers", p.top_callers), ("top tools", p.top_tools)):
        t = Table(title=title)
        for c in frame.columns:
            t.add_column(c, overflow="fold")
        for row in frame.iter_rows():
            # Callers, tools and categories are logged values: escaped cells.
            t.add_row(*(Text(table_cell(v)) for v in row))
        out.print(t)


@app.command()
def workflows(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Show workflow rules: declared (config table detectors.step_skip) and learned by train.

    Example: toolwatch workflows -d /var/lib/toolwatch
    """
    from toolwatch import detectors
    from toolwatch.detectors.sequence import WORKFLOWS_FILE, load_workflows
    from toolwatch.output import safe_text

    try:
        cfg = config_for(config, data_dir)
        dcfg = detectors.DetectorsConfig.from_dict(cfg.detectors)
    except ToolwatchError as exc:
        raise fail(exc) from None
    out = Console()
    out.print(f"declared (score {dcfg.step_skip.declared_score:.2f}):", highlight=False)
    for r in dcfg.step_skip.workflows:
        out.print(safe_text(f"  {r.step} requires {' or '.join(r.requires)}"
                            + (f" (key {r.key})" if r.key else "")), highlight=False)
    path = cfg.data_dir / "models" / WORKFLOWS_FILE
    learned = load_workflows(path)
    if learned is None:
        out.print(safe_text(f"learned: none saved at {path} (run toolwatch train)"),
                  highlight=False)
        return
    out.print(safe_text(f"learned (score {dcfg.step_skip.learned_score:.2f}, {path}):"),
              highlight=False)
    for r in learned:
        on = f" on {r['server']}" if r.get("server") else ""
        out.print(safe_text(f"  {r['step']}{on} requires {' or '.join(r['requires'])} "
                            f"(support {r['support']}, confidence {r['confidence']:.2f})"),
                  highlight=False)


# One definition (detectors/config.py); importing it is cheap: detectors/__init__ is lazy.
_SEVERITIES = list(SEVERITIES)


def _check_statuses(status: list[str] | None, known: tuple[str, ...]) -> None:
    """Exit 2 on a mistyped ``--status`` (as on a mistyped --severity / --category)."""
    bad = sorted(set(status or []) - set(known))
    if bad:
        raise fail(ValueError(f"unknown --status {', '.join(bad)}: use one of "
                              f"{', '.join(known)}"), 2)


@app.command()
def alerts(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    category: Annotated[list[str] | None, typer.Option("--category", help="Repeatable.")] = None,
    severity: Annotated[
        str | None, typer.Option(help="Minimum severity: low|medium|high|critical.")
    ] = None,
    entity: Annotated[
        str | None, typer.Option(help="Session, caller or client address (exact).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Alerts whose window ends at/after this ISO time.")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Alerts whose window starts at/before this ISO time.")
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(help="Triage status: open|acknowledged|false_positive|escalated. "
                     "Repeatable."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Most rows shown.")] = 200,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | csv | json")] = "table",
) -> None:
    """List stored alerts, most severe first, then most recent (by last evidence) first.

    Example: toolwatch alerts --category credential_stuffing --severity high --since 2026-11-02
    """
    from toolwatch.detectors.config import CATEGORIES
    from toolwatch.output import write_rows
    from toolwatch.triage_store import STATUSES, alert_statuses

    if severity is not None and severity not in _SEVERITIES:
        raise fail(ValueError(f"--severity must be one of {', '.join(_SEVERITIES)}"), 2)
    cats = [c.strip() for v in category or [] for c in v.split(",") if c.strip()]
    bad = sorted(set(cats) - set(CATEGORIES))
    if bad:
        raise fail(ValueError(f"unknown --category {', '.join(bad)}: use one of "
                              f"{', '.join(CATEGORIES)}"), 2)
    _check_statuses(status, STATUSES)
    if fmt not in ("table", "csv", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use table, csv or json"), 2)
    import polars as pl

    from toolwatch import query as runner
    from toolwatch.detectors.filters import filter_alerts

    try:
        cfg = config_for(config, data_dir)
        stored = pl.from_arrow(runner.query(_existing_store(cfg.data_dir), "SELECT * FROM alerts"))
        assert isinstance(stored, pl.DataFrame)
        picked = filter_alerts(
            stored,
            category=cats or None,
            severity=severity,
            entity=entity,
            since=since,
            until=until,
        ).with_columns(
            pl.col("alert_id").replace_strict(alert_statuses(cfg.data_dir), default="open",
                                              return_dtype=pl.String).alias("status")
        )
    except ToolwatchError as exc:
        raise fail(exc) from None
    if status:
        picked = picked.filter(pl.col("status").is_in(status))
    if fmt == "table":
        # A terminal table holds what triage reads first (one line per alert at ~160
        # columns); csv and json keep every column below.
        window = pl.concat_str(
            pl.col("first_seen").dt.strftime("%m-%d %H:%M"), pl.lit(" → "),
            pl.col("last_seen").dt.strftime("%m-%d %H:%M"),
        )  # fmt: skip
        compact = picked.head(limit).select(
            "severity",
            "status",
            "category",
            # Who before ids: most alerts are about a session, whose id says nothing.
            pl.concat_str(pl.col("caller_id").fill_null("?"), pl.lit(" @ "),
                          pl.col("client_ip").fill_null("?")).alias("caller @ address"),
            pl.concat_str("entity_type", pl.lit("="), "entity_id").alias("entity"),
            window.alias("window (UTC)"),
            pl.col("score").round(3),
            pl.col("reasons").list.first().alias("first reason"),
            "alert_id",
        )
        write_rows(compact.to_arrow(), fmt, max_rows=limit, piped_width=220)
        return
    from toolwatch.detectors.incidents import alert_actions

    tbl = (
        alert_actions(picked.head(limit))
        .select(
            "severity",
            "status",
            "category",
            "score",
            "entity_type",
            "entity_id",
            "session_id",
            "caller_id",
            "client_ip",
            "first_seen",
            "last_seen",
            "detected_at",
            pl.col("reasons").list.first().alias("reason"),
            "action",
            "alert_id",
        )
        .to_arrow()
    )
    write_rows(tbl, fmt, max_rows=limit)


#: Short stage names for the 100-column incident table.
_STAGE_SHORT = {"discovery": "discovery", "credential_access": "cred access",
                "collection": "collection", "exfiltration": "exfil", "impact": "impact",
                "unclassified": "anomaly"}


@app.command()
def incidents(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    status: Annotated[
        list[str] | None,
        typer.Option(help="Triage status: open|acknowledged|false_positive|escalated. "
                     "Repeatable."),
    ] = None,
    severity: Annotated[
        str | None, typer.Option(help="Minimum severity: low|medium|high|critical.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Most incidents shown.")] = 50,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | json")] = "table",
) -> None:
    """Incidents: each actor's alerts as one story — who, stages, risk, what to do.

    One incident per caller (else client address) and activity window, riskiest first;
    see docs/incidents.md. -f json prints one JSON list with every field.

    Example: toolwatch incidents -d .toolwatch/demo/store --status open --severity high
    """
    import polars as pl

    from toolwatch import query as runner
    from toolwatch.detectors.config import DetectorsConfig
    from toolwatch.triage_store import STATUSES

    if severity is not None and severity not in _SEVERITIES:
        raise fail(ValueError(f"--severity must be one of {', '.join(_SEVERITIES)}"), 2)
    if fmt not in ("table", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use table or json"), 2)
    if limit < 0:
        raise fail(ValueError("--limit must be >= 0"), 2)
    _check_statuses(status, STATUSES)
    try:
        cfg = config_for(config, data_dir)
        store = _existing_store(cfg.data_dir)
        store.incident_config = DetectorsConfig.from_dict(cfg.detectors).incidents
        inc = pl.from_arrow(runner.query(store, "SELECT * FROM incidents"))
        assert isinstance(inc, pl.DataFrame)
    except ToolwatchError as exc:
        raise fail(exc) from None
    total = inc.height
    if status:
        inc = inc.filter(pl.col("status").is_in(status))
    if severity:
        inc = inc.filter(pl.col("severity").is_in(_SEVERITIES[_SEVERITIES.index(severity):]))
    matched = inc.height
    inc = inc.head(limit)
    if fmt == "json":
        print(json_dumps([_incident_json(r) for r in inc.iter_rows(named=True)]))
        return
    _print_incidents(inc, total=total, matched=matched)


def _incident_json(r: dict) -> dict:
    """One incident for ``-f json``: the actor first, then how bad, then the story."""
    caller = r["actor_id"] if r["actor_type"] == "caller_id" else (
        r["caller_ids"][0] if len(r["caller_ids"]) == 1 else None)
    ip = r["actor_id"] if r["actor_type"] == "client_ip" else (
        r["client_ips"][0] if len(r["client_ips"]) == 1 else None)
    return {
        "incident_id": r["incident_id"],
        "actor": {"type": r["actor_type"], "id": r["actor_id"], "caller_id": caller,
                  "client_ip": ip},
        "risk": r["risk"],
        "peak_risk": r["peak_risk"],
        "severity": r["severity"],
        "status": r["status"],
        "stages": r["stages"],
        "categories": r["categories"],
        "techniques": r["techniques"],
        "recommended_actions": r["recommended_actions"],
        "summary": r["summary"],
        "first_seen": r["first_seen"],
        "last_seen": r["last_seen"],
        "n_alerts": r["n_alerts"],
        "alert_ids": r["alert_ids"],
        "caller_ids": r["caller_ids"],
        "client_ips": r["client_ips"],
        "servers": r["servers"],
        "linked_incident_ids": r["linked_incident_ids"],
    }


def _print_incidents(inc: object, *, total: int, matched: int) -> None:
    """The incident queue in at most 100 columns: who, what, how bad, when, what to do.

    Every value from a log (ids, addresses, tools in the actions) goes in as escaped
    :class:`~rich.text.Text` (:func:`toolwatch.output.table_cell`), never markup.
    """
    from rich import box
    from rich.text import Text

    from toolwatch.output import table_cell

    width = min(100, Console().width) if sys.stdout.isatty() else 100
    console = Console(width=width, soft_wrap=False)
    if getattr(inc, "height", 0) == 0:
        console.print(Text(f"no incidents{' match' if total else ''} ({total} in the store)"))
        return
    t = Table(box=box.SIMPLE_HEAD, show_lines=True, pad_edge=False, expand=False)
    t.add_column("who", max_width=22, overflow="fold")
    t.add_column("stages", max_width=14, overflow="fold")
    t.add_column("risk", width=8)
    t.add_column("last seen", width=11)
    t.add_column("do first", overflow="fold", ratio=1)
    for r in inc.iter_rows(named=True):  # type: ignore[attr-defined]
        kind = {"caller_id": "caller", "client_ip": "address"}.get(r["actor_type"], "session")
        who = f"{kind} {table_cell(r['actor_id'])}"
        extra = (r["client_ips"] if r["actor_type"] == "caller_id" else r["caller_ids"])
        if extra:  # the linked address (of a caller) or callers (of an address)
            who += "\n" + table_cell(extra[0]) + (f" +{len(extra) - 1}" if len(extra) > 1
                                                  else "")
        stages = " → ".join(_STAGE_SHORT.get(s, s) for s in r["stages"])
        risk = f"{r['risk']:.0f} {r['severity']}"
        if r["peak_risk"] - r["risk"] >= 1:  # decayed since: how bad it was at its peak
            risk += f"\npeak {r['peak_risk']:.0f}"
        risk += f"\n{r['n_alerts']} alert" + ("s" if r["n_alerts"] != 1 else "")
        seen = f"{r['last_seen']:%m-%d %H:%M}\n{r['status']}"
        acts = r["recommended_actions"][:2]
        action = "\n".join(f"• {table_cell(a)[:150]}" for a in acts)
        t.add_row(Text(who), Text(stages), Text(risk),
                  Text(seen), Text(action))
    console.print(t)
    shown = getattr(inc, "height", 0)
    console.print(Text(f"{shown} of {matched} incident(s) shown ({total} in the store); "
                       "-f json for every field"))


@app.command()
def evaluate(
    labels: Annotated[
        Path, typer.Argument(help="Labels (JSON lines), e.g. sample_logs/demo/labels.ndjson.")
    ],
    alerts_file: Annotated[
        Path, typer.Argument(metavar="ALERTS", help="Alerts JSON lines from analyze --alerts-out.")
    ],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Precision/recall per category and false positives per benign role.

    Example: toolwatch evaluate sample_logs/demo/labels.ndjson alerts.jsonl
    """
    import polars as pl
    import pyarrow as pa

    from toolwatch import schema
    from toolwatch.detectors.evaluate import evaluate as run_eval

    for p in (labels, alerts_file):
        if not p.is_file():
            raise fail(FileNotFoundError(f"{p}: no such file"), 1)
    try:
        rows = [orjson.loads(x) for x in alerts_file.read_bytes().splitlines() if x.strip()]
    except orjson.JSONDecodeError as exc:
        raise fail(ValueError(f"{alerts_file}: not JSON lines ({exc})"), 1) from None
    missing = sorted({"category", "detected_at"} - set(rows[0])) if rows else []
    if missing or (rows and "label" in rows[0]):
        raise fail(ValueError(
            f"{alerts_file}: not an alerts file (no {', '.join(missing) or 'alert'} fields); "
            "the labels come first: toolwatch evaluate LABELS ALERTS"), 1)
    for r in rows:  # evidence is an object in the JSON file, text in the store schema
        if isinstance(r.get("evidence"), dict):
            r["evidence"] = orjson.dumps(r["evidence"]).decode()
    empty = pl.from_arrow(pa.Table.from_batches([], schema=schema.ALERTS))
    assert isinstance(empty, pl.DataFrame)
    frame = (
        pl.DataFrame(rows, infer_schema_length=None).with_columns(
            pl.col(c).str.to_datetime(time_zone="UTC", time_unit="us")
            for c in ("first_seen", "last_seen", "detected_at")
        )
        if rows
        else empty
    )
    result = run_eval(labels, frame)
    # Categories and roles come from the labels and alerts files: escaped like any log text.
    if json_out:
        print(json_dumps(result.as_dict()))
    else:
        print(safe_text(result.to_text(), keep_newlines=True))


def config_reference(*, tuning: bool = False) -> list[tuple[str, str, str]]:
    """``(dotted key, default, meaning)`` of every configuration key, sections in file
    order, the detectors' and live tables expanded (they are parsed by their own layers,
    so the ground config holds them as plain tables). ``tuning=True``: the performance
    knobs instead, as ``tuning.<section>.<key>``."""
    from toolwatch.detectors.config import DetectorsConfig
    from toolwatch.live import LiveConfig

    if tuning:
        rows = describe(tuning=True) + describe(LiveConfig, "live", tuning=True)
        return [(f"tuning.{k}", d, t) for k, d, t in rows]
    rows = [r for r in describe(tuning=False) if r[0] not in ("detectors", "live")]
    return (rows + describe(DetectorsConfig, "detectors", tuning=False)
            + describe(LiveConfig, "live", tuning=False))


@app.command("config")
def config_cmd(
    config: ConfigOpt = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="table | markdown (docs/config.md)")
    ] = "table",
) -> None:
    """Show every configuration key with its default and documentation.

    Example: toolwatch config -f markdown > docs/config.md
    """
    if fmt not in ("table", "markdown"):
        raise fail(ValueError(f"unknown format {fmt!r}: use table or markdown"), 2)
    try:
        load_config(config)
    except ToolwatchError as exc:
        raise fail(exc) from None
    rows, knobs = config_reference(), config_reference(tuning=True)
    if fmt == "markdown":
        print(markdown_table(rows))
        print(f"\n{TUNING_HEADING}\n\n{markdown_table(knobs)}")
        return
    console = Console(width=max(Console().width, 160))
    for title, part in (("toolwatch configuration keys", rows), ("tuning (performance knobs)",
                                                                 knobs)):
        t = Table(title=title)
        for c in ("key", "default", "meaning"):
            t.add_column(c, overflow="fold")
        for key, default, text in part:
            t.add_row(key, default, text)
        console.print(t)


#: Heading of the tuning table in ``toolwatch config -f markdown`` (docs/config.md).
TUNING_HEADING = "## Tuning"


@app.command()
def version() -> None:
    """Print the version."""
    print(__version__)


# --- commands registered by other modules (one line each; keep this block last) ---
# Each module defines plain typer-annotated functions; registering them here keeps
# ``toolwatch --help`` in one place.
from toolwatch.dashboard.launch import dashboard_command  # noqa: E402
from toolwatch.dashboard.suppress_cli import suppress_app  # noqa: E402
from toolwatch.live_commands import collect, kafka, run, status, tail  # noqa: E402
from toolwatch.store_cli import store_app  # noqa: E402

app.command("dashboard")(dashboard_command)
app.command()(tail)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run)
app.command()(kafka)
app.command()(status)
app.command()(collect)
app.add_typer(suppress_app, name="suppress")
app.add_typer(store_app, name="store")
# --- end of registered commands ---


#: Whether :func:`main` may end the process without the interpreter's teardown.
_teardown = {"skip": False}


def _skip_teardown() -> None:
    """Let :func:`main` end the process without the interpreter's teardown.

    For one-shot batch commands, called once their work is in place. Tearing down the
    interpreter after ``analyze`` — a final garbage collection over every object of
    scikit-learn, scipy, polars and pyarrow, then clearing each module — took ~0.4 s on
    1M events (7% of the run) and does nothing a finished command needs: the store's
    files are written and renamed, the alerts file is closed, DuckDB connections are
    in-memory and closed.
    """
    _teardown["skip"] = True


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe
            stream.flush()
    logging.shutdown()
    os._exit(code)


def main() -> None:
    """Console entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit as exc:
        # click ends every command, successful or not, with SystemExit(code).
        if _teardown["skip"] and (exc.code is None or isinstance(exc.code, int)):
            _exit_now(exc.code or 0)
        raise


if __name__ == "__main__":
    main()
