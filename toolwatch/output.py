"""Rendering of Arrow results for the terminal, CSV and JSON lines."""

from __future__ import annotations

import sys
from datetime import timedelta
from decimal import Decimal
from typing import TextIO

import orjson
import polars as pl
import pyarrow as pa
from rich.console import Console
from rich.table import Table
from rich.text import Text


def _jsonable(df: pl.DataFrame) -> pl.DataFrame:
    """Nested and temporal columns as strings, for CSV."""
    out = []
    for name, dt in df.schema.items():
        col = pl.col(name)
        if isinstance(dt, pl.List | pl.Struct | pl.Array):
            out.append(
                col.map_elements(
                    lambda v: orjson.dumps(v.to_list() if hasattr(v, "to_list") else v).decode(),
                    return_dtype=pl.String,
                ).alias(name)
            )
        else:
            out.append(col)
    return df.select(out)


def write_rows(tbl: pa.Table, fmt: str, out: TextIO | None = None, *, max_rows: int = 200) -> None:
    """Print a result as ``table`` (rich), ``csv`` or ``json`` (one object per line).

    Values from logs are attacker-controlled: the table renders them as plain
    :class:`rich.text.Text`, so markup like ``[bold]`` or escape sequences are not interpreted.
    """
    out = out or sys.stdout
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    if fmt == "csv":
        out.write(_jsonable(df).write_csv())
    elif fmt == "json":
        for row in df.iter_rows(named=True):
            out.write(
                orjson.dumps(
                    row, default=_default, option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z
                ).decode()
                + "\n"
            )
    else:
        console = Console(file=out, soft_wrap=False, width=max(120, Console().width))
        t = Table(show_lines=False)
        for name in df.columns:
            t.add_column(name, overflow="fold")
        for row in df.head(max_rows).iter_rows():
            t.add_row(*[Text(_fmt(v)) for v in row])
        console.print(t)
        if df.height > max_rows:
            console.print(Text(f"… {df.height - max_rows} more rows (use --format csv/json)"))
        console.print(Text(f"{df.height} row(s)"))


def _default(v: object) -> object:
    """JSON for values orjson does not know (DECIMAL sums, timedeltas, bytes)."""
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    return str(v)


def _fmt(v: object) -> str:
    if v is None:
        return ""
    s = str(v)
    # Strip control characters so a log value cannot drive the terminal.
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in s)[:300]
