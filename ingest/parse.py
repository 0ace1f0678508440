"""Transforms ``parse`` + ``normalize``: raw line batches to typed, classified rows.

The hot path is columnar. A batch's lines stay in one Arrow buffer; DuckDB's
``json_transform`` (yyjson) reads every alias of every field in one parse, and SQL
expressions normalize times, numbers and resources; outcomes are normalized once per
distinct value (:mod:`ingest.outcome`). Python touches a line only on the rare paths:
invalid UTF-8, or a line that may carry a secret (found by one regex scan over the
chunk) and must be redacted before anything else sees it. :class:`ParserPool` parses
several batches at once, one single-threaded DuckDB connection each.

Nothing is dropped: every line comes out as exactly one row whose ``kind`` says where it
goes — ``call``, ``summary``, ``rpc_req``, ``rpc_resp`` or ``quarantine`` (with a reason).
``polars.read_ndjson`` is deliberately not used: one truncated line makes it raise, and
its schema inference misses keys that first appear late in a file.
"""

from __future__ import annotations

import dataclasses
import queue
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ingest import arrays, intervals
from ingest.aliases import NON_RESOURCE_KEYS, json_path, merged_aliases
from ingest.outcome import outcome_column
from ingest.records import RawBatch
from toolwatch.config import Config, IngestConfig
from toolwatch.secrets import SecretHasher, load_or_create_key

_EPOCH_SQL = r"""
CREATE OR REPLACE MACRO tw_epoch(n) AS CASE
    WHEN n IS NULL THEN NULL
    WHEN abs(n) >= 1e17 THEN to_timestamp(n / 1e9)
    WHEN abs(n) >= 1e14 THEN to_timestamp(n / 1e6)
    WHEN abs(n) >= 1e11 THEN to_timestamp(n / 1e3)
    ELSE to_timestamp(n) END;
"""
#: Argument keys that name a resource (a full match on a top-level key of the arguments).
RESOURCE_KEY_PATTERN = r"[A-Za-z0-9_]*(?:Id|_id|ID)|id|path|uri|url"


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


def _sparse(n: int, values: dict[int, str | None]) -> pa.Array:
    """String column that is null except at a few positions (no n-sized Python list)."""
    if not values:
        return pa.nulls(n, pa.string())
    at = np.full(n, -1, dtype=np.int64)
    at[list(values)] = np.arange(len(values))
    return arrays.masked(arrays.strings(list(values.values())), at)


#: What the SQL statement reads: one row per raw line, after byte checks and redaction.
_INPUT = pa.schema(
    [
        ("ord", pa.int64()),
        ("offset", pa.int64()),
        ("line_no", pa.int64()),
        ("fp", pa.string()),
        ("line", pa.large_string()),
        ("pre_reason", pa.string()),
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
        self._sql = self._build_sql(merged_aliases(config.field_aliases), config.ts_marks)
        # Binding and optimizing the statement costs ~20 ms, more than parsing a small
        # live micro-batch: it is prepared once, over a holder that hands DuckDB whichever
        # batch is current each time the statement runs.
        self._current = _CurrentBatch()
        self._con.register("batch", self._current)
        self._prepared = False

    # ------------------------------------------------------------------ SQL
    @staticmethod
    def _build_sql(aliases: dict[str, list[str]], ts_marks: str = "end") -> str:
        """One SQL statement that classifies and normalizes a whole batch.

        Every top-level alias of every field is read by one ``json_transform`` into a
        struct of VARCHARs: DuckDB parses each line once and walks its keys once, and
        values are handled as text from there (numbers-as-strings and strings-as-numbers
        normalize the same way). Nested aliases (``a/b``, from config) and names that
        differ from another only by case (a struct cannot hold both) are fetched with
        ``json_extract_string`` instead. The ~60 built-in aliases cost the same whether
        or not a batch uses them, so no per-batch pruning pass is needed.
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

        def first(canon: str) -> str:
            items = [f"nullif({r}, '')" for r in refs[canon]]
            if not items:
                return "CAST(NULL AS VARCHAR)"
            return f"coalesce({', '.join(items)})" if len(items) > 1 else items[0]

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
        return f"""
WITH b AS (
  SELECT ord, line, pre_reason, cred, "offset", line_no, fp,
         CASE WHEN pre_reason IS NULL THEN json_valid(line) END AS valid,
         left(ltrim(line), 1) = '{{' AS is_obj
  FROM batch
), e AS (
  SELECT *, CASE WHEN valid AND is_obj THEN json_transform(line, {structure}) END AS s{nested}
  FROM b
), f AS (
  SELECT ord, line, pre_reason, cred, "offset", line_no, fp, valid, is_obj,
    {first("ts")} AS ts_s,
    {first("session_id")} AS session_id,
    {first("caller_id")} AS caller_id,
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
  FROM e
), r AS (
  SELECT *,
    CASE WHEN rpc IS NOT NULL THEN json_extract_string(rpc, ['$.method', '$.id', '$.params.name',
      '$.params.arguments', '$.result', '$.error', '$.result.isError', '$.error.message',
      '$.error.code', '$.result.content[0].text']) END AS rp,
    coalesce(tw_epoch(try_cast(ts_s AS DOUBLE)), try_cast(ts_s AS TIMESTAMPTZ)) AS ts_parsed
  FROM f
), g AS (
  SELECT *,
    CASE WHEN rpc IS NULL THEN args_s ELSE rp[4] END AS args_j,
    CASE WHEN rpc IS NULL THEN tool ELSE rp[3] END AS tool_n,
    rp[1] AS rpc_method,
    coalesce(rp[5], rp[6]) AS rpc_out
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
  SELECT *,
    list_position(ak, list_filter(ak, lambda k:
      regexp_full_match(k, {_sql_str(RESOURCE_KEY_PATTERN)})
      AND NOT list_contains({non_res}, k))[1]) AS res_i
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
    WHEN reason = 'invalid_json' THEN 'not parseable as JSON'
    WHEN reason = 'not_object' THEN 'JSON value is not an object'
    WHEN reason = 'bad_timestamp' THEN 'unparseable or implausible time ' || left(ts_s, 80)
    WHEN reason = 'non_tool_message' THEN 'JSON-RPC ' || coalesce(rpc_method, 'message')
  END AS detail,
  ts_parsed AS ts,
  session_id, caller_id, client_ip, server,
  tool_n AS tool,
  args_o AS args,
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
  CAST(CASE WHEN rpc IS NULL THEN try_cast(bytes_s AS DOUBLE) ELSE strlen(rp[5]) END AS BIGINT)
    AS bytes,
  CAST(try_cast(rows_s AS DOUBLE) AS BIGINT) AS rows,
  {intervals.output_columns(ts_marks)}
  cred AS credential_hash,
  CASE WHEN rpc IS NULL THEN 'call' ELSE 'jsonrpc' END AS format,
  rp[2] AS rpc_id,
  event_v AS summary_kind,
  CAST(try_cast(call_count_s AS DOUBLE) AS BIGINT) AS call_count,
  CAST(try_cast(unique_resources_s AS DOUBLE) AS BIGINT) AS unique_resources,
  CAST(try_cast(total_bytes_s AS DOUBLE) AS BIGINT) AS total_bytes,
  CAST(try_cast(auth_failures_s AS DOUBLE) AS BIGINT) AS auth_failures
FROM res
"""

    # ------------------------------------------------------------------ bytes
    def _prepare(self, batch: RawBatch) -> pa.Table:
        """Byte-level checks and redaction; returns the table DuckDB parses.

        Lines that must change — invalid UTF-8 (escaped), secrets (hashed), over-long
        lines (cut to a prefix) — are collected first and spliced into the batch's text
        in one copy; every other line keeps its bytes.
        """
        lines = batch.lines
        n = len(lines)
        self.counters.lines += n
        pre_reason: dict[int, str] = {}
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
            # One regex pass over the bytes finds lines that may carry a secret; only
            # those take the exact (parsing) path. A JSON key can spell a secret name with
            # \u escapes (e.g. "api\u004bey"), so lines with escapes match too, and so
            # does every repaired line (its bytes were not what the regex saw).
            maybe = pc.match_substring_regex(
                lines, self.hasher.candidate_pattern, ignore_case=True
            )
            idx = set(arrays.to_numpy(pc.indices_nonzero(maybe)).tolist())
            for i in sorted(idx.union(repl)):
                if pre_reason.get(i) == "line_too_long":
                    continue
                raw = repl.get(i, lines[i].as_py()).rstrip(b"\r\n")
                red, h = self.hasher.redact_line(raw)
                if red != raw:
                    self.counters.redacted += 1
                repl[i] = red
                cred[i] = h
        # Over-long lines are never parsed: keep only a prefix for quarantine.
        keep = self.config.quarantine_raw_chars
        for i in too_long:
            repl[i] = (
                self.hasher.scrub_text(lines[i].as_py()[:keep])
                .decode("utf-8", "backslashreplace")
                .encode()
            )
        return pa.table(
            {
                "ord": arrays.from_numpy(np.arange(n, dtype=np.int64)),
                "offset": arrays.from_numpy(np.asarray(batch.offsets, dtype=np.int64)),
                "line_no": arrays.from_numpy(np.asarray(batch.line_nos, dtype=np.int64))
                if batch.line_nos is not None
                else pa.nulls(n, pa.int64()),
                "fp": arrays.repeat(batch.source_fp, n),
                "line": _splice_text(lines, offsets_buf, repl),
                "pre_reason": _sparse(n, pre_reason),
                "cred": _sparse(n, cred),
            },
            schema=_INPUT,
        )

    def parse(self, batch: RawBatch) -> pa.Table:
        """Classify and normalize every line of ``batch``; one output row per input line."""
        tbl = self._prepare(batch)
        self._current.table = tbl
        try:
            if not self._prepared:
                self._con.execute("PREPARE tw_parse AS " + self._sql)
                self._prepared = True
            out = self._con.sql("EXECUTE tw_parse").to_arrow_table()
        finally:
            self._current.table = pa.Table.from_batches([], _INPUT)
        # The raw line is attached here rather than selected in SQL: DuckDB would copy
        # every line's text once more (~30% of the query's cost). That pairs output row i
        # with input line i, so the output is put back in input order when DuckDB did not
        # keep it (a parallel plan may not; that once stored raw lines with other events).
        out = in_input_order(out, tbl.num_rows)
        raw = pc.utf8_rtrim(tbl.column("line"), characters="\r\n")
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
        first use (see :func:`toolwatch.secrets.load_or_create_key`).
        """
        key = load_or_create_key(config.secrets.hmac_key_file, config.data_dir)
        hasher = SecretHasher(key, config.ingest.secret_keys)
        return cls(config.ingest, hasher, workers=config.ingest.parse_workers)

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
