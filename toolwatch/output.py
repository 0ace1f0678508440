"""Rendering of log-derived values for the terminal, CSV and JSON lines.

Everything toolwatch prints that came from a log (tool names, ids, paths, reasons that
quote them, DuckDB errors that quote a value) is attacker-controlled. The rules:

* **Terminal text** goes through :func:`safe_text`: control characters (C0, DEL, C1, so
  every ESC/CSI/OSC sequence), Unicode format characters (bidi overrides and isolates,
  zero-width characters, BOM, tag characters), line/paragraph separators, lone surrogates
  and the invisible Hangul fillers become visible ``\\x1b`` / ``\\u202e`` / ``\\U000e0041``
  escapes. Backslashes are doubled, so the escaping is reversible
  (:func:`unescape_text`) and a logged literal ``\\x1b`` cannot pose as an escaped one.
  Rich tables receive :class:`rich.text.Text`, never a markup string.
* **JSON lines** stay exact: :func:`json_safe` writes the same characters as ``\\uXXXX``
  JSON escapes, so a consumer decodes the very value that was logged while a terminal
  showing the line sees only ASCII escapes.
* **CSV** cells are :func:`safe_text`-escaped and :func:`csv_cell` neutralizes
  spreadsheet formulas (a cell starting with ``=``, ``+``, ``-``, ``@``, tab or CR gets a
  leading ``'``, OWASP's advice for CSV injection).
"""

from __future__ import annotations

import re
import sys
import unicodedata
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, TextIO

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    # Imported where used: cli_common prints every command's errors with this module,
    # and a command that fails on its config must not pay for polars and pyarrow.
    import polars as pl
    import pyarrow as pa

#: Unicode categories shown as escapes: controls, format characters (bidi, zero-width,
#: BOM, tags), line/paragraph separators, surrogates (from undecodable bytes).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
#: Letters that render as nothing (Hangul fillers), used to hide text in plain sight.
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0")
#: Candidates for escaping: anything but printable ASCII other than the backslash. Plain
#: ASCII text (almost every value) is then one regex scan with no match.
_CANDIDATE = re.compile(r"[^\x20-\x5b\x5d-\x7e]")
_CANDIDATE_KEEP_NL = re.compile(r"[^\x20-\x5b\x5d-\x7e\n]")
_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")
#: Polars (Rust regex) form of "may need escaping", for a columnar fast path.
_PL_UNSAFE = r"[\\\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{115f}\x{1160}\x{3164}\x{ffa0}]"
#: First characters a spreadsheet reads as a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def is_unsafe_char(ch: str) -> bool:
    """Whether ``ch`` is shown as an escape by :func:`safe_text` (backslash aside)."""
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES or ch in _INVISIBLE_LETTERS


def _escape_char(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    if not is_unsafe_char(ch):
        return ch
    cp = ord(ch)
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if cp < 0x10000:
        return f"\\u{cp:04x}"
    return f"\\U{cp:08x}"


def _sub(m: re.Match[str]) -> str:
    return _escape_char(m.group())


#: :func:`safe_text`'s escapes of the Latin-1 range, as ``str.translate`` tables.
_LATIN1 = {cp: _escape_char(chr(cp)) for cp in range(0x100) if _escape_char(chr(cp)) != chr(cp)}
_LATIN1_KEEP_NL = {cp: e for cp, e in _LATIN1.items() if cp != 0x0A}
#: Characters beyond Latin-1 (candidates for the per-character check).
_WIDE = re.compile(r"[^\x00-\xff]")


def safe_text(value: object, *, keep_newlines: bool = False) -> str:
    """A log-derived value as terminal-safe text.

    Parameters
    ----------
    value
        Anything; ``None`` gives ``""``, other non-strings their ``str()``.
    keep_newlines
        Keep ``\\n`` as a line break (multi-line reports); every other control
        character is still escaped.

    Returns
    -------
    str
        The text with every control/format character and backslash escaped
        (``\\x1b``, ``\\u202e``, ``\\\\``); :func:`unescape_text` inverts it.
    """
    if value is None:
        return ""
    s = value if isinstance(value, str) else str(value)
    pat = _CANDIDATE_KEEP_NL if keep_newlines else _CANDIDATE
    if pat.search(s) is None:
        return s
    # Latin-1 escapes by one C-level translate; only what is left beyond U+00FF goes
    # through the per-match callback (a callback per control character of a 30 MB value
    # took minutes and GBs).
    s = s.translate(_LATIN1_KEEP_NL if keep_newlines else _LATIN1)
    return s if _WIDE.search(s) is None else _WIDE.sub(_sub, s)


def unescape_text(text: str) -> str:
    """Invert :func:`safe_text` (for tests and for analysts copying a value back)."""

    def back(m: re.Match[str]) -> str:
        body = m.group(1)
        return "\\" if body == "\\" else chr(int(body[1:], 16))

    return _ESCAPE.sub(back, text)


def safe_rich(value: object, style: str = "") -> Text:
    """:func:`safe_text` as a rich :class:`~rich.text.Text` (markup never interpreted)."""
    return Text(safe_text(value), style=style)


def error_text(message: object, prefix: str = "error:") -> Text:
    """An error line for a rich console: a bold red prefix, then the escaped message.

    Exception texts quote logged values (paths, tool names, DuckDB errors quoting a
    cell); printing them inside a markup string would let ``[link=…]`` or ``[/]`` in a
    value restyle the terminal output.
    """
    return Text.assemble((prefix, "bold red"), " ", safe_text(message, keep_newlines=True))


def csv_cell(value: str) -> str:
    """A :func:`safe_text`-escaped string that a spreadsheet will not run as a formula."""
    s = safe_text(value)
    return "'" + s if s.startswith(_FORMULA_START) else s


def json_safe(line: str) -> str:
    """A JSON text with every unsafe character written as a ``\\uXXXX`` escape.

    JSON only allows these characters inside strings, so replacing them keeps the text
    valid and decoding it gives back exactly the same values (astral characters become
    surrogate pairs, as JSON requires).
    """

    def esc(m: re.Match[str]) -> str:
        ch = m.group()
        if not is_unsafe_char(ch):
            return ch
        cp = ord(ch)
        if cp < 0x10000:
            return f"\\u{cp:04x}"
        cp -= 0x10000
        return f"\\u{0xD800 + (cp >> 10):04x}\\u{0xDC00 + (cp & 0x3FF):04x}"

    # Backslashes are already JSON escapes here: only non-ASCII/controls are candidates.
    return _JSON_CANDIDATE.sub(esc, line)


_JSON_CANDIDATE = re.compile(r"[^\x20-\x7e]")


def safe_column(s: pl.Series) -> pl.Series:
    """:func:`safe_text` over a string column, in Python only for the rows that need it."""
    import polars as pl

    if s.dtype != pl.String or s.len() == 0:
        return s
    needs = s.str.contains(_PL_UNSAFE).fill_null(False)
    if not needs.any():
        return s
    fixed = s.filter(needs).map_elements(safe_text, return_dtype=pl.String)
    return s.scatter(needs.arg_true(), fixed)


def _csv_frame(df: pl.DataFrame) -> pl.DataFrame:
    """The frame as CSV will print it: nested values as JSON text, every string cell
    escaped and formula-neutralized, headers too (a PIVOT makes column names from values).
    """
    import polars as pl

    cols: list[pl.Series] = []
    for name, dt in df.schema.items():
        c = df[name]
        if isinstance(dt, pl.List | pl.Struct | pl.Array | getattr(pl, "Map", pl.List)):
            # default=str and non-string keys: decimals, times and MAP {1: …} nested in
            # a value are JSON text too (the dashboard's CSV download has no fallback).
            c = c.map_elements(
                lambda v: orjson.dumps(
                    v.to_list() if hasattr(v, "to_list") else v,
                    default=str,
                    option=orjson.OPT_NON_STR_KEYS,
                ).decode(),
                return_dtype=pl.String,
            )
        elif isinstance(dt, pl.Categorical | pl.Enum):
            c = c.cast(pl.String)
        elif dt == pl.Binary:  # as DuckDB prints a BLOB: printable ASCII, else \xHH
            c = c.map_elements(_blob_text, return_dtype=pl.String)
        if c.dtype == pl.String:
            c = safe_column(c)
            formula = c.str.contains(r"^[=+\-@\t\r]").fill_null(False)
            if formula.any():
                c = c.scatter(formula.arg_true(), "'" + c.filter(formula))
        cols.append(c.alias(csv_cell(name)))
    return pl.DataFrame(cols)


def _blob_text(b: bytes) -> str:
    return "".join(chr(x) if 0x20 <= x < 0x7F and x != 0x5C else f"\\x{x:02X}" for x in b)


def safe_csv(df: pl.DataFrame) -> str:
    """``df`` as CSV text for a file a person opens: every string cell and header escaped
    (:func:`safe_text`) and formula-neutralized (a leading ``=``, ``+``, ``-``, ``@``, tab
    or CR gets a ``'``), nested values as JSON text. What ``--format csv`` prints and the
    dashboard's downloads hold."""
    return _csv_frame(df).write_csv()


def write_rows(
    tbl: pa.Table,
    fmt: str,
    out: TextIO | None = None,
    *,
    max_rows: int = 200,
    piped_width: int = 120,
) -> None:
    """Print a result as ``table`` (rich), ``csv`` or ``json`` (one object per line).

    Values from logs are attacker-controlled: see the module docstring for what each
    format does with them. This is the one function ``query`` and ``alerts`` print with.
    ``piped_width`` is the table's width when ``out`` is not a terminal (a terminal's own
    width is used when it is wider).
    """
    import polars as pl

    out = out or sys.stdout
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    if fmt == "csv":
        out.write(safe_csv(df))
    elif fmt == "json":
        for row in df.iter_rows(named=True):
            out.write(json_dumps(row) + "\n")
    else:
        tty = getattr(out, "isatty", lambda: False)()
        console = Console(file=out, soft_wrap=False,
                          width=max(120 if tty else piped_width, Console().width))
        t = Table(show_lines=False)
        for name in df.columns:
            t.add_column(safe_rich(name), overflow="fold")
        for row in df.head(max_rows).iter_rows():
            t.add_row(*[Text(_fmt(v)) for v in row])
        console.print(t)
        if df.height > max_rows:
            console.print(Text(f"… {df.height - max_rows} more rows (use --format csv/json)"))
        console.print(Text(f"{df.height} row(s)"))


def json_dumps(obj: object) -> str:
    """``obj`` as one line of JSON that is safe on a terminal (see :func:`json_safe`)."""
    return json_safe(
        orjson.dumps(obj, default=_default, option=orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z).decode()
    )


def _default(v: object) -> object:
    """JSON for values orjson does not know (DECIMAL sums, timedeltas, bytes)."""
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")
    return str(v)


def _fmt_datetime(v: datetime) -> str:
    """A timestamp cell: ``2026-11-04 12:50:22.344Z`` rather than ``str()``'s
    ``2026-11-04 12:50:22.344000+00:00`` (a third narrower, so tables of alerts fit a
    terminal); microseconds only when the value has them, so nothing is rounded away."""
    spec = "milliseconds" if v.microsecond % 1000 == 0 else "microseconds"
    off = v.utcoffset()
    if off is not None and off == timedelta(0):
        return v.replace(tzinfo=None).isoformat(sep=" ", timespec=spec) + "Z"
    return v.isoformat(sep=" ", timespec=spec)


def table_cell(value: object) -> str:
    """A log-derived value as one terminal table cell: escaped, at most 300 characters."""
    return _fmt(value)


def _fmt(v: object) -> str:
    """A table cell: escaped, and cut so one huge value cannot flood the terminal."""
    if v is None:
        return ""
    if isinstance(v, datetime):
        return _fmt_datetime(v)
    # Nested values as JSON (escaped by json_dumps) rather than Python's repr. Cut before
    # escaping too: escaping a 30 MB cell to show 300 characters of it cost minutes and GBs.
    if isinstance(v, list | tuple) and len(v) > 300:
        v = list(v[:300])
    elif not isinstance(v, list | dict | tuple):
        v = v if isinstance(v, str) else str(v)
        v = v[:300]
    s = json_dumps(v) if isinstance(v, list | dict | tuple) else safe_text(v)
    return s if len(s) <= 300 else s[:299] + "…"
