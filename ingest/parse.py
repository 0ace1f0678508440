"""Transforms ``parse`` + ``normalize``: raw line batches to typed, classified rows.

The hot path is columnar. A batch's lines stay in one Arrow buffer; DuckDB's
``json_transform`` (yyjson) reads every alias of every field in one parse, and SQL
expressions normalize times, numbers and resources; outcomes are normalized once per
distinct value (:mod:`toolwatch.ingest.outcome`). Python touches a line only on the rare paths:
invalid UTF-8, or a line that may carry a secret (found by one regex scan over the
chunk) and must be redacted before anything else sees it. :class:`ParserPool` parses
several batches at once, one single-threaded DuckDB connection each.

Nothing is dropped: every line comes out as exactly one row whose ``kind`` says where it
goes — ``call``, ``summary``, ``rpc_req``, ``rpc_resp`` or ``quarantine`` (with a reason).
``polars.read_ndjson`` is deliberately not used: one truncated line makes it raise, and
its schema inference misses keys that first appear late in a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from toolwatch.ingest import arrays, intervals
from toolwatch.ingest.aliases import NON_RESOURCE_KEYS, json_path, merged_aliases
from toolwatch.ingest.outcome import outcome_column
from toolwatch.ingest.records import NEWLINE, RawBatch, slice_batch
from toolwatch.ingest.secrets import SecretHasher, load_or_create_key

from toolwatch.config import Config, IngestConfig, auto_count

#: Epoch numbers: magnitude decides the unit. Anything that is not a finite number below
#: 1e20 (ns for ~year 5138) is no time at all: ``to_timestamp`` raises on NaN, infinities
#: and values past year 294247, which once stopped a whole batch.
_EPOCH_SQL = r"""
CREATE OR REPLACE MACRO tw_epoch(n) AS CASE
    WHEN n IS NULL OR NOT isfinite(n) OR abs(n) >= 1e20 THEN NULL
    WHEN abs(n) >= 1e17 THEN to_timestamp(n / 1e9)
    WHEN abs(n) >= 1e14 THEN to_timestamp(n / 1e6)
    WHEN abs(n) >= 1e11 THEN to_timestamp(n / 1e3)
    ELSE to_timestamp(n) END;
CREATE OR REPLACE MACRO tw_count(d) AS
    CASE WHEN d >= 0 AND d < 9007199254740992.0 THEN CAST(d AS BIGINT) END;
CREATE OR REPLACE MACRO tw_bad(d) AS
    d IS NOT NULL AND NOT (d >= 0 AND d < 9007199254740992.0);
CREATE OR REPLACE MACRO tw_baddur(d) AS
    d IS NOT NULL AND NOT (isfinite(d) AND d >= 0 AND d <= {max_dur});
""".replace("{max_dur}", repr(float(intervals.MAX_STORED_DURATION_MS)))
#: Counts, sizes and durations are stored only inside ``[0, 2**53)`` (exact in a double,
#: so every reader agrees, and far inside BIGINT); outside it, or NaN/infinite, the value
#: is null and the row's ``flags`` say ``out_of_range:<column>``.
MAX_COUNT = 2**53

#: Timestamps whose UTC offset exceeds this are rejected (real zones span -12:00..+14:00).
MAX_TZ_OFFSET_S = 14 * 3600

#: The UTF-8 byte order mark, stripped from the start of any line.
BOM = b"\xef\xbb\xbf"

#: ``args`` of a line nested deeper than ``max_depth`` are stored as this object, holding
#: the first ``_TRUNCATED_CHARS`` characters of their JSON text (flag ``too_deep``).
TRUNCATED_KEY = "_truncated"
_TRUNCATED_CHARS = 1024

#: Default nesting limit (levels of objects/arrays in a line, the line's own object
#: included); config ``ingest.max_depth`` overrides it when present.
DEFAULT_MAX_DEPTH = 32
#: Argument keys that name a resource (a full match on a top-level key of the arguments).
RESOURCE_KEY_PATTERN = r"[A-Za-z0-9_]*(?:Id|_id|ID)|id|path|uri|url"


#: Fields that most logs never carry, by group. ``json_transform`` costs ~8 ns per row for
#: every field of its struct, present or not (the ~35 names below were ~12% of the
#: statement on the benchmark's logs): a batch's statement reads a group's top-level
#: names only when some line may hold one (see ``Parser._groups_present``).
RARE_GROUPS: dict[str, tuple[str, ...]] = {
    "intervals": ("duration_s", "start_ts", "end_ts"),
    "summary": ("event", "call_count", "unique_resources", "total_bytes", "auth_failures"),
    "rpc": ("jsonrpc", "rpc_wrapped"),
}


#: Batches up to this many lines are scanned by :class:`_BufferScan` (patterns compiled
#: once); larger ones by Arrow, whose ~9 ms of compiling per call is amortized there.
#: Single-threaded, the buffer scan is cheaper at any size (40k lines: 0.95 against
#: 1.36 us/line), but it makes one RE2 call per hit line and each call releases and
#: re-takes the GIL: with another thread busy in Python, each re-take waits up to the
#: 5 ms switch interval (a spinning thread beside it: 4 x 40k lines scanned twice took
#: 24.6 s instead of 0.3 s), and ``toolwatch kafka``'s 40-80k-line backlog batches ran at
#: 0.85x with it (bench_kafka c, eighth session). Arrow's scan is one call.
BUFFER_SCAN_MAX_LINES = 32_768

#: The interpreter's GIL switch interval while a buffer scan runs (seconds; CPython's
#: default is 0.005). Each RE2 call releases the GIL; when another thread busy in Python
#: took it meanwhile, the scanning thread gets it back only when that thread's interval
#: expires, so a scan of k hit lines could wait k times 5 ms (see :func:`_short_gil_waits`).
SCAN_SWITCH_INTERVAL_S = 2e-5
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0
_switch_set: float | None = None  # what getswitchinterval() read after our change


@contextlib.contextmanager
def _short_gil_waits() -> Iterator[None]:
    """Shorten the GIL switch interval to :data:`SCAN_SWITCH_INTERVAL_S` for the block.

    No native scan is one call per batch with its pattern compiled once (DuckDB compiles
    ``regexp_matches`` at every execution, Arrow at every call; docs/performance.md,
    "Parse scan (ninth session)"), so the buffer scan's one RE2 call per hit line stays,
    and the wait after each is cut instead. Nested and concurrent blocks (parse workers)
    share one change; the saved interval comes back when the last one leaves, unless
    someone else set another meanwhile.
    """
    global _switch_users, _switch_saved, _switch_set
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved, _switch_set = sys.getswitchinterval(), None
            if _switch_saved > SCAN_SWITCH_INTERVAL_S:
                sys.setswitchinterval(SCAN_SWITCH_INTERVAL_S)
                _switch_set = sys.getswitchinterval()
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0 and _switch_set is not None and (
                sys.getswitchinterval() == _switch_set
            ):
                sys.setswitchinterval(_switch_saved)

#: A JSON escaped backslash, a surrogate pair escape, or a lone surrogate escape.
_SURROGATE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)
#: A JSON string (quotes and escapes included); brackets inside one do not nest.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _fix_surrogates(m: re.Match[bytes]) -> bytes:
    """Keep escaped backslashes and surrogate pairs; a lone surrogate becomes U+FFFD."""
    tok = m.group(0)
    return tok if len(tok) in (2, 12) else b"\\ufffd"


def _depth(raw: bytes) -> int:
    """How deep objects/arrays nest in the JSON text ``raw`` (the outer object is 1).

    Strings are blanked first; the nesting is then a running sum of opening minus
    closing brackets (vectorized: a line nested 100,000 deep costs microseconds and no
    recursion).
    """
    a = np.frombuffer(_JSON_STRING.sub(b"", raw), dtype=np.uint8)
    if not len(a):
        return 0
    step = ((a == 123) | (a == 91)).astype(np.int32) - ((a == 125) | (a == 93))
    return int(np.cumsum(step).max())


def _sql_str(text: str) -> str:
    """SQL string literal (config-provided alias names end up in the statement)."""
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    """SQL quoted identifier (struct field access)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass
class ParseCounters:
    """What ``parse`` saw: lines in, redacted, pre-quarantined by byte checks."""

    lines: int = 0
    redacted: int = 0
    invalid_utf8: int = 0
    too_long: int = 0
    fallbacks: int = 0


#: ``CREATE OR REPLACE MACRO name(params) AS body;`` in :data:`_EPOCH_SQL` / ``MACROS_SQL``.
_MACRO_DEF = re.compile(r"CREATE OR REPLACE MACRO (\w+)\(([^)]*)\) AS\s+(.*?);", re.S)
#: SQL tokens the inliner must see whole: comments, string literals, quoted names, words.
_SQL_TOKEN = re.compile(r"--[^\n]*|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\w+")


def _call_args(sql: str, open_at: int) -> tuple[list[str], int]:
    """The arguments of the call whose ``(`` is at ``sql[open_at]``, and the index after
    its ``)``. Commas and parentheses inside literals, quoted names or nested calls do not
    count."""
    depth, start, args = 0, open_at + 1, []
    i = open_at
    while i < len(sql):
        m = _SQL_TOKEN.match(sql, i)
        if m is not None and m.group(0)[0] in "-'\"":
            i = m.end()
            continue
        c = sql[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(sql[start:i].strip())
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(sql[start:i].strip())
            start = i + 1
        i += 1
    raise ValueError("unbalanced parentheses in a macro call")


def inline_macros(sql: str, *definitions: str) -> str:
    """``sql`` with every call of the macros defined in ``definitions`` written out.

    DuckDB 2.0 binds and optimizes a prepared statement again at every ``EXECUTE`` when
    it read anything from the catalog — a macro or a registered view (~20 ms for the
    parse statement, ~2.4 us per line of a 10k-line micro-batch). Written out, with the
    batch read through a replacement scan, the statement touches no catalog entry and
    keeps its plan. The expansion is DuckDB's own: each parameter becomes its argument,
    parenthesized, and the body is parenthesized as a whole.
    """
    macros: dict[str, tuple[list[str], str]] = {}
    for text in definitions:
        for m in _MACRO_DEF.finditer(text):
            macros[m.group(1)] = ([p.strip() for p in m.group(2).split(",")], m.group(3))
    out: list[str] = []
    pos = 0
    while True:
        m = _SQL_TOKEN.search(sql, pos)
        if m is None:
            out.append(sql[pos:])
            return "".join(out)
        word = m.group(0)
        if word in macros and sql.startswith("(", m.end()):
            args, end = _call_args(sql, m.end())
            params, body = macros[word]
            if len(args) != len(params):
                raise ValueError(f"macro {word} takes {len(params)} arguments")
            # Parameters in the body: whole words outside literals and comments.
            by_name = dict(zip(params, args, strict=True))
            expanded = _SQL_TOKEN.sub(
                lambda t, by_name=by_name: (
                    f"({by_name[t.group(0)]})" if t.group(0) in by_name else t.group(0)),
                body,
            )
            # The expansion may call other macros: it is scanned again.
            sql = sql[: m.start()] + "(" + expanded + ")" + sql[end:]
            out.append(sql[pos : m.start()])
            sql = sql[m.start():]
            pos = 0
            continue
        out.append(sql[pos : m.end()])
        pos = m.end()


def _sparse(n: int, values: dict[int, str | None]) -> pa.Array:
    """String column that is null except at a few positions (no n-sized Python list)."""
    if not values:
        return pa.nulls(n, pa.string())
    at = np.full(n, -1, dtype=np.int64)
    at[list(values)] = np.arange(len(values))
    return arrays.masked(arrays.strings(list(values.values())), at)


#: What the SQL statement reads: one row per raw line, after byte checks and redaction.
#: Where the parse statement reads its input (the one ``FROM`` naming the batch).
_FROM_BATCH = "FROM batch\n), e AS ("
_INPUT = pa.schema(
    [
        ("ord", pa.int64()),
        ("offset", pa.int64()),
        ("line_no", pa.int64()),
        ("fp", pa.string()),
        ("line", pa.large_string()),
        ("pre_reason", pa.string()),
        ("pre_flags", pa.string()),
        ("cred", pa.string()),
    ]
)


def in_input_order(out: pa.Table, n: int) -> pa.Table:
    """``out`` (one row per input line, ``ord`` = input position) sorted by ``ord``.

    Raises
    ------
    AssertionError
        When rows were lost or duplicated: never expected, and fatal, because raw lines
        are paired with rows by position.
    """
    ords = arrays.to_numpy(out.column("ord"))
    expected = np.arange(n, dtype=np.int64)
    if np.array_equal(ords, expected):
        return out
    if len(ords) != n or not np.array_equal(np.sort(ords), expected):
        raise AssertionError(f"parser returned {len(ords)} rows for {n} lines")
    return out.take(arrays.from_numpy(np.argsort(ords)))


def _line_offsets(lines: pa.LargeBinaryArray) -> np.ndarray:
    """The n + 1 offsets of ``lines`` into its data buffer (a view, not a copy)."""
    return np.frombuffer(lines.buffers()[1], dtype=np.int64)[
        lines.offset : lines.offset + len(lines) + 1
    ]


def _ends_in_newline(text: pa.Array) -> bool:
    """Whether any value of the string array ``text`` ends in ``\r`` or ``\n`` (or it
    holds a null: the caller then takes the general path)."""
    if text.null_count:
        return True
    off = np.frombuffer(text.buffers()[1], dtype=np.int64)[
        text.offset : text.offset + len(text) + 1
    ]
    ends = off[1:][np.diff(off) > 0]
    if not len(ends) or text.buffers()[2] is None:
        return False
    last = np.frombuffer(text.buffers()[2], dtype=np.uint8)[ends - 1]
    return bool(((last == NEWLINE) | (last == 13)).any())


def strip_line_ends(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """``text`` without trailing ``\r``/``\n`` (``utf8_rtrim``), copied only when some
    line has one: Kafka messages carry none, and the copy cost 0.04-0.16 us per line."""
    if any(_ends_in_newline(c) for c in text.chunks):
        return pc.utf8_rtrim(text, characters="\r\n")
    return text


def _fps(batch: RawBatch, n: int) -> pa.Array:
    """Each line's stream fingerprint (several streams parsed in one go: ``batch.fps``)."""
    return batch.fps if batch.fps is not None else arrays.repeat(batch.source_fp, n)


def _non_ascii_lines(lines: pa.LargeBinaryArray, offsets: np.ndarray) -> list[int]:
    """Indices of the lines holding a byte >= 0x80 (only they can be invalid UTF-8).

    The bytes are scanned 1 MiB at a time: a mask of the whole batch would take 16 MiB of
    fresh pages from the kernel on every batch (page faults cost more than the scan).
    """
    data = np.frombuffer(lines.buffers()[2], dtype=np.uint8)
    start, end = int(offsets[0]), int(offsets[-1])
    step = 1 << 20
    high = [np.flatnonzero(data[i : min(i + step, end)] >= 0x80) + (i - start)
            for i in range(start, end, step)]
    if not high:
        return []
    found = np.concatenate(high)
    return np.unique(np.searchsorted(offsets - start, found, side="right") - 1).tolist()


try:  # google-re2 (a dependency): patterns compiled once per parser, not once per batch
    import re2 as _re2
except ImportError:  # pragma: no cover - an environment installed before it was added
    _re2 = None


class _BufferScan:
    """The byte-level scans of a batch, with RE2 patterns compiled once per parser.

    ``pyarrow.compute.match_substring_regex`` compiles its pattern on every call: ~4 ms
    for the secret-candidate pattern (~11 kB), and a cold DFA each time, which made the
    scans the largest fixed cost of a live micro-batch (a 1k-line batch spent more time
    compiling than matching). Here each pattern is compiled once (Latin-1, case
    insensitive: what Arrow does for binary input) and run over the batch's bytes as one
    buffer, one line per ``\n``-terminated segment: multi-line mode puts ``^``/``$`` at
    each segment's ends and ``never_nl`` keeps every match inside one segment, so a line
    matches exactly when its text without the newline does. The search restarts at the
    next line after a hit, so Python work is per matching line, never per line.

    Batches whose lines hold a newline other than their last byte (a Kafka message with
    one inside) are not scanned here (:meth:`segments` returns ``None``).
    """

    def __init__(self, patterns: dict[str, str]) -> None:
        if _re2 is None:
            raise ImportError("google-re2 is not installed")
        opts = _re2.Options()
        opts.encoding = _re2.Options.Encoding.LATIN1
        opts.case_sensitive = False
        opts.never_nl = True
        opts.max_mem = 64 << 20  # room for the big pattern's DFA: no NFA fallback
        opts.log_errors = False
        self._rx = {
            k: _re2.compile(f"(?m:{p})".encode(), opts)._regexp for k, p in patterns.items()
        }
        self._anchor = _re2._re2.RE2.Anchor.UNANCHORED

    @staticmethod
    def segments(lines: pa.LargeBinaryArray) -> tuple[np.ndarray, np.ndarray] | None:
        """The batch as ``(bytes, starts)``: line ``i`` is ``bytes[starts[i]:starts[i+1]]``,
        its text followed by one ``\n``; ``None`` when a line holds an inner newline.

        Lines of file sources already end in ``\n``: their buffer is used as is.
        Messages without any newline (Kafka) get one appended each (one copy).
        """
        off = _line_offsets(lines)
        base = int(off[0])
        raw = np.frombuffer(lines.buffers()[2], dtype=np.uint8)[base : int(off[-1])]
        n = len(lines)
        step = 1 << 20
        nl = sum(int(np.count_nonzero(raw[i : i + step] == NEWLINE))
                 for i in range(0, len(raw), step))
        if nl == 0:
            return np.insert(raw, off[1:] - base, NEWLINE), off - base + np.arange(n + 1)
        lengths = np.diff(off)
        if nl == n and bool((lengths > 0).all()) and bool(
            (raw[off[1:] - base - 1] == NEWLINE).all()
        ):
            return raw, off - base
        return None

    def lines(self, key: str, data: np.ndarray, starts: np.ndarray) -> list[int]:
        """Indices of the lines where pattern ``key`` matches."""
        rx, anchor = self._rx[key], self._anchor
        out: list[int] = []
        pos, end = 0, len(data)
        while pos < end:
            at = rx.Match(anchor, data, pos, end)[0][0]
            if at < 0:
                break
            k = int(np.searchsorted(starts, at, side="right")) - 1
            out.append(k)
            pos = int(starts[k + 1])
        return out

    def at(self, key: str, data: np.ndarray, start: int, end: int) -> bool:
        """Whether pattern ``key`` matches the line at ``data[start:end]``."""
        return self._rx[key].Match(self._anchor, data, start, end)[0][0] >= 0


@functools.lru_cache(maxsize=8)
def _shared_buffer_scan(patterns: tuple[tuple[str, str], ...]) -> _BufferScan:
    """One :class:`_BufferScan` per set of patterns, shared by the parsers of a process
    (each parse worker, each live stream): compiling the ~37 kB candidate pattern twice
    costs ~30 ms of CPU per parser. RE2 objects are safe to search from several threads
    at once (google-re2 releases the GIL in each call)."""
    return _BufferScan(dict(patterns))


try:  # DuckDB 2.0's statement runner under its Python relation layer (pinned < 2.0.2)
    from duckdb import _seam as _duckdb_seam

    _SUBMIT = getattr(_duckdb_seam, "submit", None)
except ImportError:  # pragma: no cover - another DuckDB build
    _SUBMIT = None


def _execute_arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    """Run ``sql`` and return its rows as one Arrow table.

    ``con.sql(sql).to_arrow_table()`` binds the text again in Python (~0.75 ms), runs it,
    holds the result, then reads it back through a second statement: ~1.5 ms more per
    call and one more copy of every row (0.3-0.4 us per line of the parse statement, at
    10k- and 40k-line batches). DuckDB's own runner returns the Arrow result directly;
    the public path stays the fallback for a DuckDB without it.
    """
    global _SUBMIT_OK
    if _SUBMIT_OK is None:
        _SUBMIT_OK = _submit_works(con)
    if _SUBMIT_OK:
        return _SUBMIT(con, sql, None, format="arrow").arrow_table()  # type: ignore[misc]
    return con.sql(sql).to_arrow_table()


#: Whether :data:`_SUBMIT` behaves as expected here (checked once, on first use).
_SUBMIT_OK: bool | None = None


def _submit_works(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether DuckDB's runner takes our call and returns an Arrow table (an internal
    API: a build where it differs falls back to the public path instead of failing
    every parse)."""
    if _SUBMIT is None:
        return False
    try:
        t = _SUBMIT(con, "SELECT 1 AS x", None, format="arrow").arrow_table()
    except Exception:
        return False
    return isinstance(t, pa.Table) and t.column_names == ["x"] and t.num_rows == 1


class _CurrentBatch:
    """Arrow stream source whose content is the batch being parsed right now.

    DuckDB binds a prepared statement to this object once and asks it for a fresh stream
    (``__arrow_c_stream__``) at every execution; between batches it is empty.
    """

    def __init__(self) -> None:
        self.table: pa.Table = pa.Table.from_batches([], _INPUT)

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.table.__arrow_c_stream__(requested_schema)


def _splice_text(
    lines: pa.LargeBinaryArray, offsets: np.ndarray, repl: dict[int, bytes]
) -> pa.LargeStringArray:
    """``lines`` as text, with line ``i`` replaced by ``repl[i]`` (one copy at most).

    The caller guarantees the result is valid UTF-8: every line that failed validation
    has a replacement. Untouched runs of lines are copied as whole slices.
    """
    n = len(lines)
    data = lines.buffers()[2]
    if not repl:
        if offsets[0] == 0:
            return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), data)
        return pa.LargeStringArray.from_buffers(
            n, pa.py_buffer(offsets - offsets[0]), data.slice(int(offsets[0]))
        )
    order = sorted(repl)
    lengths = np.diff(offsets)
    lengths[order] = [len(repl[i]) for i in order]
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_off[1:])
    # Copied into a buffer from Arrow's pool (which reuses the memory of batches already
    # written) rather than ``b"".join``: that takes the whole batch's size in fresh,
    # zero-filled pages from the kernel every time, and page faults cost more than the copy.
    out = pa.allocate_buffer(int(new_off[-1]))
    dst = memoryview(out).cast("B")
    src = memoryview(data).cast("B")
    pos, at = int(offsets[0]), 0
    for i in order:
        start = int(offsets[i])
        dst[at : at + start - pos] = src[pos:start]
        at += start - pos
        dst[at : at + len(repl[i])] = repl[i]
        at += len(repl[i])
        pos = int(offsets[i + 1])
    dst[at:] = src[pos : int(offsets[n])]
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_off), out)


class Parser:
    """Parse and normalize raw batches (stateless; safe to reuse across batches).

    Parameters
    ----------
    config
        Ingest settings (aliases, limits).
    hasher
        Redacts secrets before lines reach DuckDB or the store.
    """

    def __init__(self, config: IngestConfig, hasher: SecretHasher, *, threads: int = 2):
        self.config = config
        self.hasher = hasher
        self.counters = ParseCounters()
        self._con = duckdb.connect(config={"threads": threads})
        self._con.execute("SET TimeZone = 'UTC'")
        self._con.execute(_EPOCH_SQL)
        self._con.execute(intervals.MACROS_SQL)
        self._aliases = merged_aliases(config.field_aliases)
        self._ts_marks = config.ts_marks
        self._sql = self._build_sql(self._aliases, config.ts_marks)
        self.max_depth = int(getattr(config, "max_depth", DEFAULT_MAX_DEPTH))
        # Lines that need the Python path (see _prepare): the hasher's candidates, a
        # BOM anywhere, or more opening brackets than the nesting limit allows.
        self._scan_pattern = (
            f"{hasher.candidate_pattern}|\ufeff|(?:[^\\[{{]*[\\[{{]){{{self.max_depth + 1}}}"
        )
        # Per rare group, its top-level names as JSON strings. A key spelled with
        # escapes holds "\u" (any escape that decodes to a name character does), which
        # the candidate pattern already matches: such a batch reads every group.
        self._group_patterns = {
            g: "|".join(
                re.escape(orjson.dumps(n).decode())
                for c in canon for n in self._aliases[c] if "/" not in n
            )
            for g, canon in RARE_GROUPS.items()
        }
        rare = "|".join(p for p in self._group_patterns.values() if p)
        # One pass finds both: lines needing Python and lines naming a rare field.
        self._scan_all = f"{self._scan_pattern}|{rare}" if rare else self._scan_pattern
        self._groups: frozenset[str] = frozenset(RARE_GROUPS)  # of the batch being parsed
        self._skip_pruning = 0  # batches left to parse without looking for rare names
        self._statements: dict[frozenset[str], str] = {}
        try:
            self._scan: _BufferScan | None = _shared_buffer_scan(tuple(
                ({"all": self._scan_all, "need": self._scan_pattern, "escape": r"\\u"}
                 | {g: p for g, p in self._group_patterns.items() if p}).items()
            ))
        except Exception:  # no google-re2, or a pattern it refuses: Arrow's scans
            self._scan = None
        # Binding and optimizing the statement costs ~20 ms, more than parsing a small
        # live micro-batch: it is prepared once, over a holder that hands DuckDB whichever
        # batch is current each time the statement runs.
        self._current = _CurrentBatch()
        # The registered view and the catalog macros serve the fallback statement only
        # (see _run_sql): the main one reads the batch by a replacement scan and has its
        # macros written out, so DuckDB keeps its plan between executions.
        self._con.register("batch", self._current)
        self._prepared: dict[tuple[frozenset[str], bool], str] = {}  # by groups, inline
        self.inline = True

    # ------------------------------------------------------------------ SQL
    @staticmethod
    def _build_sql(
        aliases: dict[str, list[str]], ts_marks: str = "end"
    ) -> str:
        """One SQL statement that classifies and normalizes a whole batch.

        Every top-level alias of every field is read by one ``json_transform`` into a
        struct of VARCHARs: DuckDB parses each line once and walks its keys once, and
        values are handled as text from there (numbers-as-strings and strings-as-numbers
        normalize the same way). Nested aliases (``a/b``, from config) and names that
        differ from another only by case (a struct cannot hold both) are fetched with
        ``json_extract_string`` instead. The ~60 built-in aliases cost the same whether
        or not a batch uses them, so no per-batch pruning pass is needed.

        Each multi-alias ``coalesce`` and the timestamp's ``try_cast`` are computed once
        per row (CTE ``c``, column ``ts_num``) rather than where used. What the statement
        stores is pinned by tests/golden/parse_rows.jsonl.
        """
        struct_keys: list[str] = []
        folded: set[str] = set()
        paths: list[str] = []
        refs: dict[str, list[str]] = {}
        for canon, names in aliases.items():
            refs[canon] = []
            for n in names:
                if "/" not in n and (n in struct_keys or n.lower() not in folded):
                    if n not in struct_keys:
                        struct_keys.append(n)
                        folded.add(n.lower())
                    refs[canon].append("s." + _ident(n))
                else:
                    paths.append(json_path(n))
                    refs[canon].append(f"p[{len(paths)}]")  # DuckDB lists are 1-based

        # ``coalesce`` of each multi-alias field, computed once per row in CTE ``c`` (as
        # an expression repeated in a CASE it ran up to three times per row).
        present_cols: list[str] = []

        def first(canon: str) -> str:
            # The first alias present and not empty. Nearly always the first one present
            # is not empty: ``coalesce`` of the plain fields decides, and the per-alias
            # ``nullif`` chain runs only for rows where it found ''. (A ``nullif`` per
            # alias on every row cost ~5% of the statement: most aliases are absent.)
            r = refs[canon]
            if not r:
                return "CAST(NULL AS VARCHAR)"
            if len(r) == 1:
                return f"nullif({r[0]}, '')"
            present = f"_c{len(present_cols)}"
            present_cols.append(f"coalesce({', '.join(r)}) AS {present}")
            exact = f"coalesce({', '.join(f'nullif({x}, {chr(39) * 2})' for x in r)})"
            return f"CASE WHEN {present} = '' THEN {exact} ELSE {present} END"

        structure = _sql_str(orjson.dumps(dict.fromkeys(struct_keys, "VARCHAR")).decode())
        nested = (
            f", CASE WHEN valid AND is_obj THEN json_extract_string(line, "
            f"[{', '.join(_sql_str(p) for p in paths)}]) END AS p"
            if paths
            else ""
        )
        non_res = "[" + ", ".join(_sql_str(k) for k in NON_RESOURCE_KEYS) + "]"
        wrapped = ", ".join(
            f"CASE WHEN contains({r}, '\"jsonrpc\"') THEN {r} END" for r in refs["rpc_wrapped"]
        )
        wrapped_expr = f"coalesce({wrapped})" if wrapped else "CAST(NULL AS VARCHAR)"
        # Built before the statement: ``first`` fills ``present_cols`` for CTE ``c``.
        f_items = f"""    {first("ts")} AS ts_s,
    {first("session_id")} AS session_id,
    {first("caller_id")} AS caller_id,
    {first("caller_authenticated")} AS caller_auth_s,
    {first("client_ip")} AS client_ip,
    {first("server")} AS server,
    {first("tool")} AS tool,
    {first("args")} AS args_s,
    {first("resource_id")} AS resource_id_v,
    {first("status")} AS status_raw,
    {first("is_error")} AS is_error_s,
    {first("bytes")} AS bytes_s,
    {first("rows")} AS rows_s,
    {first("duration_ms")} AS duration_s,
    {intervals.input_columns(first)}
    upper({first("event")}) AS event_v,
    {first("call_count")} AS call_count_s,
    {first("unique_resources")} AS unique_resources_s,
    {first("total_bytes")} AS total_bytes_s,
    {first("auth_failures")} AS auth_failures_s,
    CASE WHEN {first("jsonrpc")} IS NOT NULL THEN line
         ELSE {wrapped_expr} END AS rpc
"""
        present_sql = ", ".join(present_cols) or "NULL AS _c"
        return f"""
WITH b AS (
  SELECT ord, line, pre_reason, pre_flags, cred, "offset", line_no, fp,
         CASE WHEN pre_reason IS NULL THEN json_valid(line) END AS valid,
         left(ltrim(line), 1) = '{{' AS is_obj
  FROM batch
), e AS (
  -- The guard is on the input, not around the call: a CASE around it copies the ~90
  -- field struct for the rows it selects (~5% of the statement's CPU).
  SELECT *, json_transform(CASE WHEN valid AND is_obj THEN line END, {structure}) AS s{nested}
  FROM b
), c AS (
  SELECT *, {present_sql}
  FROM e
), f AS (
  SELECT ord, line, pre_reason, pre_flags, cred, "offset", line_no, fp, valid, is_obj,
{f_items}  FROM c
), r AS (
  SELECT *,
    CASE WHEN rpc IS NOT NULL THEN json_extract_string(rpc, ['$.method', '$.id', '$.params.name',
      '$.params.arguments', '$.result', '$.error', '$.result.isError', '$.error.message',
      '$.error.code', '$.result.content[0].text']) END AS rp,
    -- Once per row: tw_epoch is written out with its argument up to six times.
    try_cast(ts_s AS DOUBLE) AS ts_num,
    try_cast(bytes_s AS DOUBLE) AS bytes_d,
    try_cast(rows_s AS DOUBLE) AS rows_d,
    try_cast(duration_s AS DOUBLE) AS duration_d,
    try_cast(call_count_s AS DOUBLE) AS call_count_d,
    try_cast(unique_resources_s AS DOUBLE) AS unique_resources_d,
    try_cast(total_bytes_s AS DOUBLE) AS total_bytes_d,
    try_cast(auth_failures_s AS DOUBLE) AS auth_failures_d
  FROM f
), g AS (
  SELECT *,
    CASE WHEN rpc IS NULL THEN args_s ELSE rp[4] END AS args_j,
    CASE WHEN rpc IS NULL THEN tool ELSE rp[3] END AS tool_n,
    coalesce(tw_epoch(ts_num), try_cast(ts_s AS TIMESTAMPTZ)) AS ts_parsed,
    rp[1] AS rpc_method,
    coalesce(rp[5], rp[6]) AS rpc_out,
    {intervals.derived_columns()}
  FROM r
), k AS (
  SELECT *,
    CASE
      WHEN pre_reason IS NOT NULL THEN pre_reason
      WHEN NOT valid THEN 'invalid_json'
      WHEN NOT is_obj THEN 'not_object'
      WHEN rpc IS NOT NULL AND rpc_method IS NOT NULL AND rpc_method <> 'tools/call'
        THEN 'non_tool_message'
      WHEN rpc IS NOT NULL AND rpc_method IS NULL AND rpc_out IS NULL THEN 'non_tool_message'
      WHEN rpc IS NOT NULL AND rpc_method IS NULL THEN NULL
      WHEN ts_s IS NULL THEN 'missing_timestamp'
      WHEN ts_parsed IS NULL OR ts_parsed < TIMESTAMPTZ '2000-01-01'
           OR ts_parsed > TIMESTAMPTZ '2100-01-01' THEN 'bad_timestamp'
      -- A zone offset beyond +-14:00 ('+25:00') parses, to a shifted time: the text's
      -- wall clock read without its offset tells how far. Only text times with a zone
      -- other than the usual UTC spellings pay for the second parse.
      WHEN NOT suffix(ts_s, 'Z') AND NOT suffix(ts_s, '+00:00')
           AND ts_num IS NULL
           AND abs(epoch(try_cast(ts_s AS TIMESTAMP)) - epoch(ts_parsed)) > {MAX_TZ_OFFSET_S}
        THEN 'bad_timestamp'
      WHEN rpc IS NOT NULL THEN NULL
      WHEN event_v IN ('SESSION_END', 'SESSION_ANOMALY') AND session_id IS NULL
        THEN 'missing_session'
      WHEN event_v IN ('SESSION_END', 'SESSION_ANOMALY') THEN NULL
      WHEN tool_n IS NULL THEN 'no_tool'
      ELSE NULL END AS reason,
    CASE WHEN left(ltrim(args_j), 1) = '{{' AND json_valid(args_j) THEN args_j END AS args_o
  FROM g
), a AS (
  -- Resource from the arguments: the first top-level key named like an id, path or uri
  -- (keys and values come back in object order, so one index picks the value).
  SELECT *, CASE WHEN reason IS NULL AND resource_id_v IS NULL THEN json_keys(args_o) END AS ak
  FROM k
), res AS (
  -- A key naming who acts (userId, tenantId …) is the resource only when no other key is
  -- and the tool is about that kind of thing: getUser(userId) reads a user profile (an
  -- IDOR walk over users), listOrders(userId) reads orders on behalf of a user.
  SELECT *,
    coalesce(
      list_position(ak, list_filter(ak, lambda k:
        regexp_full_match(k, {_sql_str(RESOURCE_KEY_PATTERN)})
        AND NOT list_contains({non_res}, k))[1]),
      list_position(ak, list_filter(ak, lambda k:
        list_contains({non_res}, k)
        AND contains(lower(tool_n), regexp_replace(lower(k), '_?id$', '')))[1])) AS res_i
  FROM a
)
SELECT
  ord,
  CASE
    WHEN reason IS NOT NULL THEN 'quarantine'
    WHEN rpc IS NOT NULL AND rpc_method = 'tools/call' THEN 'rpc_req'
    WHEN rpc IS NOT NULL THEN 'rpc_resp'
    WHEN event_v IN ('SESSION_END', 'SESSION_ANOMALY') THEN 'summary'
    ELSE 'call' END AS kind,
  reason,
  fp || ':' || CAST("offset" AS VARCHAR) AS event_id,
  "offset", line_no,
  CASE
    WHEN reason = 'unprocessable' THEN pre_flags
    WHEN reason = 'invalid_json' THEN 'not parseable as JSON'
    WHEN reason = 'not_object' THEN 'JSON value is not an object'
    WHEN reason = 'bad_timestamp' THEN 'unparseable or implausible time ' || left(ts_s, 80)
    WHEN reason = 'non_tool_message' THEN 'JSON-RPC ' || coalesce(rpc_method, 'message')
  END AS detail,
  ts_parsed AS ts,
  session_id, caller_id, client_ip, server,
  -- as the log says: true (the writer vouches for caller_id: a verified token, the
  -- server's principal hook), false (a self-declared client name), null (it says nothing)
  try_cast(caller_auth_s AS BOOLEAN) AS caller_authenticated,
  tool_n AS tool,
  CASE WHEN contains(pre_flags, 'too_deep') AND args_o IS NOT NULL
       THEN json_object('{TRUNCATED_KEY}', left(args_o, {_TRUNCATED_CHARS}))
       ELSE args_o END AS args,
  ak[res_i] AS resource_key,
  coalesce(resource_id_v,
           CASE WHEN res_i IS NOT NULL THEN json_extract_string(args_o, '$.*')[res_i] END)
    AS resource_id,
  -- outcome as logged: status/outcome, or the JSON-RPC error / isError result text
  CASE WHEN rpc IS NULL THEN status_raw
       WHEN rp[6] IS NOT NULL THEN coalesce(rp[8], rp[9])
       WHEN rp[7] = 'true' THEN left(coalesce(rp[10], 'error'), 200)
  END AS status_raw,
  CASE WHEN rpc IS NULL THEN try_cast(is_error_s AS BOOLEAN)
       WHEN rp[6] IS NOT NULL THEN true
       ELSE coalesce(try_cast(rp[7] AS BOOLEAN), false) END AS is_error_b,
  CASE WHEN rpc IS NULL THEN tw_count(bytes_d) ELSE strlen(rp[5]) END AS bytes,
  tw_count(rows_d) AS rows,
  {intervals.output_columns(ts_marks)}
  cred AS credential_hash,
  CASE WHEN rpc IS NULL THEN 'call' ELSE 'jsonrpc' END AS format,
  rp[2] AS rpc_id,
  event_v AS summary_kind,
  tw_count(call_count_d) AS call_count,
  tw_count(unique_resources_d) AS unique_resources,
  tw_count(total_bytes_d) AS total_bytes,
  tw_count(auth_failures_d) AS auth_failures,
  -- What was changed on the way in (null for nearly every row): out-of-range numbers
  -- nulled, too-deep arguments truncated, bytes repaired (from the byte checks).
  CASE WHEN pre_flags IS NOT NULL OR tw_bad(bytes_d) OR tw_bad(rows_d)
         OR tw_baddur(duration_d) OR tw_bad(call_count_d) OR tw_bad(unique_resources_d)
         OR tw_bad(total_bytes_d) OR tw_bad(auth_failures_d)
       THEN nullif(concat_ws(',', pre_flags,
         CASE WHEN tw_bad(bytes_d) AND rpc IS NULL THEN 'out_of_range:bytes' END,
         CASE WHEN tw_bad(rows_d) THEN 'out_of_range:rows' END,
         CASE WHEN tw_baddur(duration_d) THEN 'out_of_range:duration_ms' END,
         CASE WHEN tw_bad(call_count_d) THEN 'out_of_range:call_count' END,
         CASE WHEN tw_bad(unique_resources_d) THEN 'out_of_range:unique_resources' END,
         CASE WHEN tw_bad(total_bytes_d) THEN 'out_of_range:total_bytes' END,
         CASE WHEN tw_bad(auth_failures_d) THEN 'out_of_range:auth_failures' END), '')
  END AS flags
FROM res
"""

    # ------------------------------------------------------------------ bytes
    def _prepare(self, batch: RawBatch) -> pa.Table:
        """Byte-level checks and redaction; returns the table DuckDB parses.

        Lines that must change — invalid UTF-8 (escaped), secrets (hashed), over-long
        lines (cut to a prefix), a leading byte order mark (stripped), lone surrogate
        escapes (replaced) — are collected first and spliced into the batch's text in one
        copy; every other line keeps its bytes.
        """
        lines = batch.lines
        n = len(lines)
        self.counters.lines += n
        pre_reason: dict[int, str] = {}
        pre_flags: dict[int, str | None] = {}
        repl: dict[int, bytes] = {}
        offsets_buf = _line_offsets(lines)
        lengths = np.diff(offsets_buf)
        too_long = np.flatnonzero(lengths > self.config.max_line_bytes + 2).tolist()
        for i in too_long:
            pre_reason[i] = "line_too_long"
        self.counters.too_long += len(too_long)

        try:
            lines.cast(pa.large_string())  # validates UTF-8 (no copy kept)
        except pa.ArrowInvalid:
            # Only lines holding non-ASCII bytes can be invalid UTF-8: find them with
            # numpy and check just those, so one bad line costs microseconds.
            suspects = _non_ascii_lines(lines, offsets_buf)
            for i in suspects:
                b = lines[i].as_py()
                try:
                    b.decode("utf-8")
                except UnicodeDecodeError:
                    pre_reason.setdefault(i, "invalid_utf8")
                    self.counters.invalid_utf8 += 1
                    repl[i] = b.decode("utf-8", "backslashreplace").encode()

        cred: dict[int, str | None] = {}
        if n:
            # One regex pass over the bytes finds the lines that need Python: a possible
            # secret; a key spelled with \u escapes (e.g. "api\u004bey") or a lone
            # surrogate escape; at least max_depth + 1 opening brackets (maybe nested too
            # deep); a byte order mark. Every repaired line goes too (its bytes were not
            # what the regex saw). The extra alternatives cost nothing measurable: RE2
            # runs one DFA pass either way.
            seg = (self._scan.segments(lines)
                   if self._scan is not None and n <= BUFFER_SCAN_MAX_LINES else None)
            if seg is not None:
                with _short_gil_waits():
                    idx, self._groups = self._scan_hits(*seg)
            else:
                idx = self._scan_arrow(lines, n)
            todo: list[tuple[int, bytes]] = []
            for i in sorted(idx.union(repl)):
                if pre_reason.get(i) == "line_too_long":
                    continue
                raw = repl.get(i, lines[i].as_py()).rstrip(b"\r\n")
                fixed, flags = self._repair(raw)
                if flags:
                    pre_flags[i] = flags
                todo.append((i, fixed))
            # Which redaction passes each line needs: one RE2 pass over all of them.
            try:
                # arrays.strings, not pa.array: pa.array on a Python list imports pandas
                # (~0.2 s per process; tests/test_ingest_arrays.py checks it never does).
                picked = arrays.strings([f for _, f in todo], pa.binary())
                plans: list[int | None] = list(self.hasher.plan(picked))
            except Exception:  # the per-line tests decide instead
                plans = [None] * len(todo)
            for (i, fixed), plan in zip(todo, plans, strict=True):
                try:
                    red, h = self.hasher.redact_line(fixed, plan)
                except Exception as exc:  # one line must not stop a batch
                    # Never store what could not be redacted: quarantine a textual scrub.
                    pre_reason.setdefault(i, "unprocessable")
                    red, h = self._scrub_or_drop(fixed), None
                    pre_flags[i] = f"redaction failed: {type(exc).__name__}"
                self.counters.redacted += red != fixed
                repl[i] = red
                cred[i] = h
        # Over-long lines are never parsed: keep only a prefix for quarantine.
        keep = self.config.quarantine_raw_chars
        for i in too_long:
            repl[i] = self._scrub_or_drop(lines[i].as_py()[:keep])
        return pa.table(
            {
                "ord": arrays.from_numpy(np.arange(n, dtype=np.int64)),
                "offset": arrays.from_numpy(np.asarray(batch.offsets, dtype=np.int64)),
                "line_no": arrays.from_numpy(np.asarray(batch.line_nos, dtype=np.int64))
                if batch.line_nos is not None
                else pa.nulls(n, pa.int64()),
                "fp": _fps(batch, n),
                "line": _splice_text(lines, offsets_buf, repl),
                "pre_reason": _sparse(n, pre_reason),
                "pre_flags": _sparse(n, pre_flags),
                "cred": _sparse(n, cred),
            },
            schema=_INPUT,
        )

    def _scan_hits(self, data: np.ndarray, starts: np.ndarray) -> tuple[set[int], frozenset[str]]:
        """Lines that need Python and the rare groups some line may name (see
        :class:`_BufferScan`; same answer as :meth:`_scan_arrow` + :meth:`_split_hits`).

        One pass of the combined pattern finds the (few) lines that need Python or name
        a rare field; only those are tested again, pattern by pattern. Every group is
        read when a hit line holds an escape (a name may be spelled with it).
        """
        assert self._scan is not None
        scan = self._scan
        if self._scan_all is self._scan_pattern:  # no rare names to look for
            return set(scan.lines("need", data, starts)), frozenset(RARE_GROUPS)
        if self._skip_pruning:
            # A recent batch had many rare names: as in _scan_arrow, parse with every
            # field for a while (one pass of the smaller pattern instead of two).
            self._skip_pruning -= 1
            return set(scan.lines("need", data, starts)), frozenset(RARE_GROUPS)
        hits = scan.lines("all", data, starts)
        if len(hits) * 8 > len(starts) - 1:
            # Many lines name rare fields (a JSON-RPC transcript, summaries): testing
            # each hit again costs more than one more pass; parse with every field,
            # and look for rare names again 16 batches later.
            self._skip_pruning = 16
            return set(scan.lines("need", data, starts)), frozenset(RARE_GROUPS)
        if not hits:
            return set(), frozenset()
        # The hit lines, copied into one small buffer (whole segments, newline included,
        # so each is still one line to the patterns): each pattern then costs one call
        # plus one per matching line, not one call per hit line (~800 per 10k-line batch
        # of the benchmark's logs, 0.1 us/line).
        at = np.asarray(hits, dtype=np.int64)
        sub_starts = np.zeros(len(hits) + 1, dtype=np.int64)
        np.cumsum(starts[at + 1] - starts[at], out=sub_starts[1:])
        sub = np.concatenate([data[int(starts[i]) : int(starts[i + 1])] for i in hits])
        need, groups = self._split_buffer(sub, sub_starts)
        return {hits[k] for k in need}, groups

    def _split_buffer(
        self, sub: np.ndarray, sub_starts: np.ndarray
    ) -> tuple[list[int], frozenset[str]]:
        """Of the combined scan's hit lines (``sub``, segments at ``sub_starts``), those
        that need Python (indices into ``sub``) and the rare groups some line may name."""
        assert self._scan is not None
        scan = self._scan
        named = {g: scan.lines(g, sub, sub_starts) for g, p in self._group_patterns.items() if p}
        rare = set().union(*named.values())
        # The combined pattern is the need pattern or a rare name: a hit line naming no
        # rare field needs Python; only lines naming one are tested again.
        need = [
            k for k in range(len(sub_starts) - 1)
            if k not in rare
            or scan.at("need", sub, int(sub_starts[k]), int(sub_starts[k + 1]))
        ]
        if need and scan.lines("escape", sub, sub_starts):
            return need, frozenset(RARE_GROUPS)
        return need, frozenset(g for g, found in named.items() if found)

    def _scan_arrow(self, lines: pa.LargeBinaryArray, n: int) -> set[int]:
        """Lines that need Python, found with Arrow's RE2 (sets ``self._groups``).

        The path for batches :class:`_BufferScan` cannot take (a line with an inner
        newline, or no google-re2): each call compiles its pattern again.
        """
        prune = self._skip_pruning == 0
        maybe = pc.match_substring_regex(
            lines, self._scan_all if prune else self._scan_pattern, ignore_case=True
        )
        hits = pc.indices_nonzero(maybe)
        if prune and len(hits) * 8 <= n:
            idx, self._groups = self._split_hits(lines, hits)
        else:
            # Many lines name rare fields (a JSON-RPC transcript, summaries): pruning
            # saves nothing there, and each hit would be scanned twice. Parse with
            # every field, and look again 16 batches later.
            if prune:
                hits = pc.indices_nonzero(
                    pc.match_substring_regex(lines, self._scan_pattern, ignore_case=True)
                )
                self._skip_pruning = 16
            else:
                self._skip_pruning -= 1
            idx = set(arrays.to_numpy(hits).tolist())
            self._groups = frozenset(RARE_GROUPS)
        return idx

    def _split_hits(
        self, lines: pa.LargeBinaryArray, hits: pa.Array
    ) -> tuple[set[int], frozenset[str]]:
        """Lines of the combined scan's ``hits`` that need Python, and the rare groups
        some line may name.

        Only the (few) hit lines are scanned again, once per pattern. Every group is read
        when a hit line holds an escape (a name may be spelled with it).
        """
        at = arrays.to_numpy(hits)
        if self._scan_all is self._scan_pattern:  # no rare names to look for
            return set(at.tolist()), frozenset(RARE_GROUPS)
        if not len(at):
            return set(), frozenset()
        picked = lines.take(hits)
        # The hit lines (~2% of a batch) through the patterns compiled once, as
        # _scan_hits does: Arrow compiles each pattern again per call (~15 ms per batch
        # for the need pattern, more than matching the hit lines takes).
        seg = _BufferScan.segments(picked) if self._scan is not None else None
        if seg is not None:
            with _short_gil_waits():  # (a call per rare-named line: see _scan_hits)
                need_k, groups = self._split_buffer(*seg)
            return set(at[need_k].tolist()), groups
        return self._split_arrow(picked, at)

    def _split_arrow(
        self, picked: pa.LargeBinaryArray, at: np.ndarray
    ) -> tuple[set[int], frozenset[str]]:
        """:meth:`_split_hits` with Arrow's scans (a hit line holds an inner newline, or
        no google-re2): ``picked`` are the hit lines, ``at`` their indices in the batch."""

        def where(pattern: str) -> np.ndarray:
            m = pc.match_substring_regex(picked, pattern, ignore_case=True)
            return arrays.to_numpy(pc.indices_nonzero(m))

        need = where(self._scan_pattern)
        groups = {g for g, p in self._group_patterns.items() if p and len(where(p))}
        if len(need) and len(where(r"\\u")):
            groups = set(RARE_GROUPS)
        return set(at[need].tolist()), frozenset(groups)

    def _statement(self, groups: frozenset[str]) -> str:
        """The parse statement reading only the rare groups in ``groups``."""
        sql = self._statements.get(groups)
        if sql is None:
            absent = {c for g, canon in RARE_GROUPS.items() if g not in groups for c in canon}
            aliases = {
                c: [n for n in names if c not in absent or "/" in n]
                for c, names in self._aliases.items()
            }
            sql = self._statements[groups] = self._build_sql(aliases, self._ts_marks)
        return sql

    def _prepare_failed(self, batch: RawBatch, failed: BaseException) -> pa.Table:
        """The input table of lines that made parsing fail: quarantined, never parsed.

        Only the safest steps run — a prefix of each line, scrubbed of secrets as text —
        since any of the usual ones may be what failed.
        """
        n = len(batch)
        self.counters.fallbacks += n
        self._groups = frozenset(RARE_GROUPS)  # nothing is parsed: any statement does
        lines = batch.lines
        keep = self.config.quarantine_raw_chars
        text = [self._scrub_or_drop(lines[i].as_py()[:keep].rstrip(b"\r\n")) for i in range(n)]
        detail = f"{type(failed).__name__}: {(str(failed).splitlines() or [''])[0][:300]}"
        return pa.table(
            {
                "ord": arrays.from_numpy(np.arange(n, dtype=np.int64)),
                "offset": arrays.from_numpy(np.asarray(batch.offsets, dtype=np.int64)),
                "line_no": arrays.from_numpy(np.asarray(batch.line_nos, dtype=np.int64))
                if batch.line_nos is not None
                else pa.nulls(n, pa.int64()),
                "fp": _fps(batch, n),
                "line": arrays.strings(text, pa.large_string()),
                "pre_reason": arrays.repeat("unprocessable", n),
                "pre_flags": arrays.repeat(detail, n),
                "cred": pa.nulls(n, pa.string()),
            },
            schema=_INPUT,
        )

    def _scrub_or_drop(self, raw: bytes) -> bytes:
        """``raw`` scrubbed of secrets as text (valid UTF-8), or a marker if that fails."""
        try:
            return self.hasher.scrub_text(raw).decode("utf-8", "backslashreplace").encode()
        except Exception as exc:  # never keep what was not scrubbed
            return f"<not kept: scrubbing failed ({type(exc).__name__})>".encode()

    def _repair(self, raw: bytes) -> tuple[bytes, str | None]:
        """Strip a leading BOM, replace lone surrogate escapes, flag too-deep nesting.

        Returns the line to parse and its flags (comma-separated) or ``None``.
        """
        flags: list[str] = []
        if raw.startswith(BOM):
            raw = raw[len(BOM) :]
        if b"\\u" in raw:
            # DuckDB's reader rejects a lone surrogate escape ("\ud800") and fails the
            # whole batch, though json_valid accepts it: as U+FFFD the line stays a call.
            fixed = _SURROGATE.sub(_fix_surrogates, raw)
            if fixed != raw:
                raw = fixed
                flags.append("repaired:surrogate")
        if raw.count(b"{") + raw.count(b"[") > self.max_depth and (
            _depth(raw) > self.max_depth
        ):
            flags.append("too_deep")
        return raw, ",".join(flags) or None

    def _run_sql(self, tbl: pa.Table) -> pa.Table:
        """The prepared statement over ``tbl`` (one output row per input row)."""
        self._current.table = tbl
        # DuckDB's replacement scan finds this local by name while binding: the plan
        # keeps the holder and asks it for a fresh stream each execution. Were the
        # statement bound again, it would be from here, where the name is defined too.
        tw_parse_batch = self._current  # noqa: F841
        try:
            key = (self._groups, self.inline)
            name = self._prepared.get(key)
            if name is None:
                name = f"tw_parse_{len(self._prepared)}"
                sql = self._sql if self._groups == frozenset(RARE_GROUPS) else (
                    self._statement(self._groups))
                if self.inline:
                    sql = inline_macros(sql, _EPOCH_SQL, intervals.MACROS_SQL)
                    if sql.count(_FROM_BATCH) != 1:
                        raise AssertionError("the parse statement's input is not found")
                    sql = sql.replace(_FROM_BATCH, _FROM_BATCH.replace("batch", "tw_parse_batch"))
                try:
                    self._con.execute(f"PREPARE {name} AS " + sql)
                except duckdb.Error:
                    if not self.inline:
                        raise
                    # No replacement scans here (python_enable_replacements off?): the
                    # registered view and catalog macros, bound at every execution.
                    self.inline = False
                    return self._run_sql(tbl)
                self._prepared[key] = name
            return _execute_arrow(self._con, f"EXECUTE {name}")
        finally:
            self._current.table = pa.Table.from_batches([], _INPUT)

    def _run_sql_safely(self, tbl: pa.Table) -> pa.Table:
        """:meth:`_run_sql`, falling back to halves when a line makes DuckDB raise.

        The statement is written not to raise on any input, but a failure must cost
        only the offending line: the batch is split in halves until the failing line is
        alone, which is then quarantined (``unprocessable``, with DuckDB's message) and
        parsed again as such — a quarantined line reaches no JSON function. k bad lines
        in n cost O(k log n) small queries; the normal path pays nothing.
        """
        try:
            return self._run_sql(tbl)
        except (duckdb.Error, pa.ArrowException) as exc:
            if tbl.num_rows <= 1:
                if tbl.num_rows == 0:
                    raise
                self.counters.fallbacks += 1
                detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                tbl = tbl.set_column(
                    tbl.schema.get_field_index("pre_reason"), "pre_reason",
                    arrays.strings(["unprocessable"]),
                ).set_column(
                    tbl.schema.get_field_index("pre_flags"), "pre_flags",
                    arrays.strings([detail]),
                )
                return self._run_sql(tbl)
            half = tbl.num_rows // 2
            return pa.concat_tables(
                [self._run_sql_safely(tbl.slice(0, half)),
                 self._run_sql_safely(tbl.slice(half))]
            )

    def parse(self, batch: RawBatch) -> pa.Table:
        """Classify and normalize every line of ``batch``; one output row per input line.

        Never raises because of a line: should any step fail (byte checks, redaction,
        SQL, outcome normalization), the batch is parsed again in halves down to the
        failing line, which comes out quarantined as ``unprocessable``.
        """
        try:
            return self._parse(batch)
        except Exception as exc:  # narrowed to the offending line below
            if len(batch) <= 1:
                if len(batch) == 0:
                    raise
                return self._parse(batch, failed=exc)
            half = len(batch) // 2
            parts = [self.parse(slice_batch(batch, 0, half)),
                     self.parse(slice_batch(batch, half, len(batch)))]
            # Output rows carry their position in the batch they were parsed with.
            ords = parts[1].column("ord")
            parts[1] = parts[1].set_column(
                parts[1].schema.get_field_index("ord"), "ord", pc.add(ords, half)
            )
            return pa.concat_tables(parts)

    def _parse(self, batch: RawBatch, failed: BaseException | None = None) -> pa.Table:
        """:meth:`parse` without the fallback; ``failed``: quarantine the (one) line."""
        tbl = self._prepare(batch) if failed is None else self._prepare_failed(batch, failed)
        out = self._run_sql_safely(tbl)
        # The raw line is attached here rather than selected in SQL: DuckDB would copy
        # every line's text once more (~30% of the query's cost). That pairs output row i
        # with input line i, so the output is put back in input order when DuckDB did not
        # keep it (a parallel plan may not; that once stored raw lines with other events).
        out = in_input_order(out, tbl.num_rows)
        raw = strip_line_ends(tbl.column("line"))
        # Original size in bytes (an over-long line's raw is only a prefix).
        nbytes = (
            np.diff(_line_offsets(batch.lines)) if batch.sizes is None
            else np.asarray(batch.sizes, dtype=np.int64)
        )
        if batch.line_nos is not None:  # line sources keep the newline byte
            nbytes -= 1
        status = outcome_column(out.column("status_raw"), out.column("is_error_b"))
        return (
            out.append_column("status", status)
            .append_column("raw", raw)
            .append_column("raw_bytes", arrays.from_numpy(nbytes))
        )

    def close(self) -> None:
        """Release the DuckDB connection."""
        self._con.close()


class ParserPool:
    """Parsers that work on several batches at once and hand results back in order.

    Each worker owns a :class:`Parser` (its own single-threaded DuckDB connection): two
    batches parsed side by side keep both cores busy at less CPU per row than one
    multi-threaded query per batch. Used synchronously (:meth:`parse`) it is one parser.

    Parameters
    ----------
    config, hasher
        As for :class:`Parser`.
    workers
        Batches parsed at once by :meth:`parse_ahead`.
    """

    def __init__(self, config: IngestConfig, hasher: SecretHasher, *, workers: int = 2):
        self.workers = max(1, workers)
        self.hasher = hasher
        self._parsers = [Parser(config, hasher, threads=1) for _ in range(self.workers)]
        self._idle: queue.SimpleQueue[Parser] = queue.SimpleQueue()
        for p in self._parsers:
            self._idle.put(p)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="parser")

    @classmethod
    def from_config(cls, config: Config) -> ParserPool:
        """The parse workers ``config`` asks for, hashing secrets with its key.

        The key is read from ``secrets.hmac_key_file`` or the environment, and created on
        first use (see :func:`toolwatch.ingest.secrets.load_or_create_key`).
        """
        key = load_or_create_key(config.secrets.hmac_key_file, config.data_dir)
        hasher = SecretHasher(key, config.ingest.secret_keys, config.ingest.secret_key_exceptions)
        # 0 = one per available CPU, capped: each worker holds about one chunk in memory
        return cls(config.ingest, hasher, workers=auto_count(config.ingest.parse_workers, 4))

    @property
    def counters(self) -> ParseCounters:
        """Counters summed over every worker."""
        out = ParseCounters()
        for p in self._parsers:
            for f in dataclasses.fields(ParseCounters):
                setattr(out, f.name, getattr(out, f.name) + getattr(p.counters, f.name))
        return out

    def _parse_with_any(self, batch: RawBatch) -> pa.Table:
        parser = self._idle.get()
        try:
            return parser.parse(batch)
        finally:
            self._idle.put(parser)

    def parse(self, batch: RawBatch) -> pa.Table:
        """Parse one batch on the calling thread."""
        return self._parse_with_any(batch)

    def parse_ahead(
        self, batches: Iterable[RawBatch], on_wait: Callable[[], None] | None = None
    ) -> Iterator[tuple[RawBatch, pa.Table]]:
        """Yield ``(batch, parsed)`` in input order, up to ``workers + 1`` batches in flight.

        The next batch is read (file I/O, gzip) here while the workers parse. A source
        that fails mid-stream still has every batch read before the failure yielded
        first; a parse error surfaces at that batch's turn. ``on_wait`` is called once,
        when the first result is about to be waited for: setup that does not need it
        runs there while the workers parse.
        """
        inflight: deque[tuple[RawBatch, Future[pa.Table]]] = deque()
        it = iter(batches)

        def result(fut: Future[pa.Table]) -> pa.Table:
            nonlocal on_wait
            if on_wait is not None:
                call, on_wait = on_wait, None
                call()
            return fut.result()

        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except BaseException:
                while inflight:
                    done, fut = inflight.popleft()
                    yield done, result(fut)
                raise
            inflight.append((batch, self._pool.submit(self._parse_with_any, batch)))
            # One batch more than workers stays queued, so a worker that finishes while
            # the caller is busy with the previous result starts the next one at once.
            if len(inflight) > self.workers:
                done, fut = inflight.popleft()
                yield done, result(fut)
        while inflight:
            done, fut = inflight.popleft()
            yield done, result(fut)

    def close(self) -> None:
        """Stop the workers and release every DuckDB connection."""
        self._pool.shutdown(wait=True)
        for p in self._parsers:
            p.close()
