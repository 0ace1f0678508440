"""``toolwatch store``: inspect and maintain the store's Delta tables, convert old stores.

Registered in :mod:`toolwatch.cli` as a sub-app. See docs/store.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from toolwatch.cli_common import ConfigOpt, DataDirOpt, config_for, err, fail
from toolwatch.errors import StoreError, ToolwatchError
from toolwatch.output import safe_text

if TYPE_CHECKING:
    from toolwatch.store import Store

store_app = typer.Typer(
    no_args_is_help=True,
    help="Inspect and maintain the store's Delta tables; convert a store of the old layout.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: Every Delta table of a store, in the order commands report them.
TABLES = ("events", "summaries", "quarantine", "alerts", "streams")


def _open(data_dir: str | Path, **kwargs: Any) -> Store:
    """The existing store at ``data_dir``; :class:`StoreError` when there is none (a
    mistyped ``-d`` must not leave an empty store behind)."""
    from toolwatch.store import Store

    root = Path(data_dir)
    if not (root / "_state").is_dir():
        raise StoreError(f"no toolwatch store at {root} (check -d / $TOOLWATCH_DATA_DIR)")
    return Store(root, **kwargs)


@store_app.command("migrate")
def migrate_cmd(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Convert a store of the layout before Delta tables, in place (no data copied).

    Stop every toolwatch process writing to the store first. Running it again on a
    converted store changes nothing; on an interrupted conversion it finishes it.

    Example: toolwatch store migrate -d .toolwatch/data
    """
    from toolwatch.store_migrate import legacy_layout, migrate

    try:
        cfg = config_for(config, data_dir)
        root = Path(cfg.data_dir)
        if not legacy_layout(root):
            if (root / "_state").is_dir() or any(
                    (root / t / "_delta_log").is_dir() for t in TABLES):
                print(f"{safe_text(str(root))}: already in the Delta table layout; "
                      "nothing to migrate")
                return
            raise StoreError(f"no toolwatch store at {root} (check -d / $TOOLWATCH_DATA_DIR)")
        done = migrate(root, warn=lambda msg: err.print(
            Text("note: " + safe_text(msg)), highlight=False, soft_wrap=True))
    except (ToolwatchError, OSError) as exc:
        raise fail(exc) from None
    t = RichTable(title=Text(f"migrated {safe_text(str(root))}"))
    t.add_column("table")
    t.add_column("adopted", justify="right")
    for name in TABLES:
        if name in done:
            what = (f"{done[name]:,} checkpoints" if name == "streams"
                    else f"{done[name]:,} files")
            t.add_row(name, what)
    Console().print(t)


def _table_info(store: Store, name: str) -> dict[str, Any]:
    """Version, data files, rows (from the snapshot's statistics) and bytes of a table."""
    import pyarrow.compute as pc

    version, acts = store.table(name).actions()
    if acts is None or acts.num_rows == 0:
        return {"table": name, "version": version, "files": 0, "rows": 0, "bytes": 0}
    return {"table": name, "version": version, "files": acts.num_rows,
            "rows": pc.sum(acts["num_records"]).as_py() or 0,
            "bytes": pc.sum(acts["size_bytes"]).as_py() or 0}


@store_app.command("info")
def info_cmd(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table | json")] = "table",
) -> None:
    """Per table: Delta version, data files, rows, bytes; and which processes wrote.

    Example: toolwatch store info -d .toolwatch/demo/store
    """
    from toolwatch.output import json_dumps

    if fmt not in ("table", "json"):
        raise fail(ValueError(f"unknown format {fmt!r}: use table or json"), 2)
    try:
        cfg = config_for(config, data_dir)
        store = _open(cfg.data_dir)
        tables = [_table_info(store, name) for name in TABLES]
        writers = store.writers().sort_by([("last_commit", "descending")]).to_pylist()
    except (ToolwatchError, OSError) as exc:
        raise fail(exc) from None
    for w in writers:
        w["last_commit"] = w["last_commit"].isoformat() if w["last_commit"] else None
    if fmt == "json":
        print(json_dumps({"store": str(cfg.data_dir), "tables": tables, "writers": writers}))
        return
    console = Console()
    t = RichTable(title=Text(f"store {safe_text(str(cfg.data_dir))}"))
    for col in ("table", "version", "files", "rows", "bytes"):
        t.add_column(col, justify="left" if col == "table" else "right")
    for r in tables:
        t.add_row(r["table"], "-" if r["version"] is None else str(r["version"]),
                  f"{r['files']:,}", f"{r['rows']:,}", f"{r['bytes']:,}")
    console.print(t)
    w = RichTable(title="writers (from the streams table)")
    for col in ("writer", "streams", "last commit (UTC)"):
        w.add_column(col)
    for r in writers:
        # Writer names are host:pid:nonce written by whoever could write the store: text.
        w.add_row(Text(safe_text(r["writer"] or "")), str(r["streams"]),
                  r["last_commit"] or "")
    console.print(w)


@store_app.command("compact")
def compact_cmd(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    min_files: Annotated[
        int,
        typer.Option("--min-files", min=2,
                     help="Merge a table's small files when it has at least this many."),
    ] = 2,
) -> None:
    """Merge the small files of every table now (replaced files stay until `vacuum`).

    Example: toolwatch store compact -d .toolwatch/data
    """
    try:
        cfg = config_for(config, data_dir)
        store = _open(cfg.data_dir, compact_min_files=min_files,
                      vacuum_hours=cfg.store.vacuum_hours)
        merges = {name: store.compact(name) for name in TABLES}
    except (ToolwatchError, OSError) as exc:
        raise fail(exc) from None
    for name, n in merges.items():
        print(f"{name}: {n} merge{'s' if n != 1 else ''}")
    print(f"total: {sum(merges.values())} merges")


@store_app.command("vacuum")
def vacuum_cmd(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    hours: Annotated[
        float | None,
        typer.Option("--hours", min=0,
                     help="Delete files replaced more than this many hours ago "
                     "(default: store.vacuum_hours)."),
    ] = None,
) -> None:
    """Delete data files that compaction replaced more than --hours ago.

    A reader that listed a table before the compaction (a long query, Spark) reads the
    replaced files until then; --hours 0 deletes them now.

    Example: toolwatch store vacuum -d .toolwatch/data --hours 0
    """
    try:
        cfg = config_for(config, data_dir)
        store = _open(cfg.data_dir, compact_min_files=cfg.store.compact_min_files,
                      vacuum_hours=cfg.store.vacuum_hours)
        gone = {name: store.vacuum(name, hours) for name in TABLES}
    except (ToolwatchError, OSError) as exc:
        raise fail(exc) from None
    for name, n in gone.items():
        print(f"{name}: {n} file{'s' if n != 1 else ''} deleted")
    print(f"total: {sum(gone.values())} files deleted")
