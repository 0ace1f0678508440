"""Transforms ``parse`` + ``normalize``: raw line batches to typed, classified rows.

The hot path is columnar. A batch's lines stay in one Arrow buffer; DuckDB's JSON
functions (yyjson, parse-once for a list of paths) extract every alias of every field in
one pass, and SQL expressions normalize times, outcomes, numbers and resources. Python
touches a line only on the rare paths: invalid UTF-8 in the chunk, or a line that may
carry a secret (found by one regex scan over the whole chunk) and must be redacted
before anything else sees it.

Nothing is dropped: every line comes out as exactly one row whose ``kind`` says where it
goes — ``call``, ``summary``, ``rpc_req``, ``rpc_resp`` or ``quarantine`` (with a reason).
``polars.read_ndjson`` is deliberately not used: one truncated line makes it raise, and
its schema inference misses keys that first appear late in a file.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.aliases import NON_RESOURCE_KEYS, json_path, merged_aliases
from ingest.records import RawBatch
from toolwatch.config import IngestConfig
from toolwatch.secrets import SecretHasher

_STATUS_SQL = r"""
CREATE OR REPLACE MACRO tw_status(raw) AS (
  WITH s AS (SELECT regexp_replace(lower(trim(raw)), '[\s\-]+', '_', 'g') AS s)
  SELECT CASE
    WHEN s IS NULL OR s = '' THEN NULL
    WHEN s IN ('ok','success','succeeded','successful','completed','complete','done','true')
         OR regexp_full_match(s, '2\d\d') THEN 'ok'
    WHEN s = '404' OR regexp_matches(s, 'not_?found|no_such|missing|does_not_exist') THEN 'not_found'
    WHEN s = '401' OR regexp_matches(s,
         'auth\w*_?fail|unauthori[sz]ed|unauthenticated|invalid_?(api_?)?key|invalid_?token|'
         || 'invalid_?credential|bad_?credential|authentication') THEN 'auth_failed'
    WHEN s = '403' OR regexp_matches(s, 'denied|forbidden|permission|not_?allowed|unauthori')
         THEN 'denied'
    WHEN s = '429' OR regexp_matches(s, 'rate_?limit|throttl|too_?many|quota') THEN 'rate_limited'
    WHEN regexp_full_match(s, '[45]\d\d') OR regexp_matches(s, 'err|fail|exception|timeout|invalid')
         THEN 'error'
    ELSE 'unknown' END FROM s
);
CREATE OR REPLACE MACRO tw_jn(v) AS CASE WHEN v IS NULL OR json_type(v) = 'NULL' THEN NULL ELSE v END;
CREATE OR REPLACE MACRO tw_epoch(n) AS CASE
    WHEN n IS NULL THEN NULL
    WHEN abs(n) >= 1e17 THEN to_timestamp(n / 1e9)
    WHEN abs(n) >= 1e14 THEN to_timestamp(n / 1e6)
    WHEN abs(n) >= 1e11 THEN to_timestamp(n / 1e3)
    ELSE to_timestamp(n) END;
CREATE OR REPLACE MACRO tw_time(v) AS CASE
    WHEN v IS NULL THEN NULL
    WHEN json_type(v) IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN tw_epoch(try_cast(v AS DOUBLE))
    WHEN json_type(v) = 'VARCHAR' THEN coalesce(
        try_cast(json_extract_string(v, '$') AS TIMESTAMPTZ), tw_epoch(try_cast(json_extract_string(v, '$') AS DOUBLE)))
    ELSE NULL END;
CREATE OR REPLACE MACRO tw_num(v) AS try_cast(json_extract_string(v, '$') AS DOUBLE);
CREATE OR REPLACE MACRO tw_str(v) AS nullif(json_extract_string(v, '$'), '');
"""


@dataclass
class ParseCounters:
    """What ``parse`` saw: lines in, redacted, pre-quarantined by byte checks."""

    lines: int = 0
    redacted: int = 0
    invalid_utf8: int = 0
    too_long: int = 0


class Parser:
    """Parse and normalize raw batches (stateless; safe to reuse across batches).

    Parameters
    ----------
    config
        Ingest settings (aliases, limits).
    hasher
        Redacts secrets before lines reach DuckDB or the store.
    """

    def __init__(self, config: IngestConfig, hasher: SecretHasher):
        self.config = config
        self.hasher = hasher
        self.counters = ParseCounters()
        self._con = duckdb.connect(config={"threads": 2})
        self._con.execute("SET TimeZone = 'UTC'")
        self._con.execute(_STATUS_SQL)
        self._sql = self._build_sql(merged_aliases(config.field_aliases))

    # ------------------------------------------------------------------ SQL
    @staticmethod
    def _build_sql(aliases: dict[str, list[str]]) -> str:
        paths: list[str] = []
        index: dict[str, list[int]] = {}
        for canon, names in aliases.items():
            index[canon] = []
            for n in names:
                paths.append(json_path(n))
                index[canon].append(len(paths))  # DuckDB lists are 1-based

        def first(canon: str) -> str:
            items = ", ".join(f"tw_jn(x[{i}])" for i in index[canon])
            return f"coalesce({items})"

        path_list = "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
        non_res = "[" + ", ".join(f"'{k}'" for k in NON_RESOURCE_KEYS) + "]"
        wrapped = ", ".join(
            f"CASE WHEN json_extract_string(tw_jn(x[{i}]), '$.jsonrpc') IS NOT NULL THEN x[{i}] END"
            for i in index["rpc_wrapped"]
        )
        return f"""
WITH b AS (
  SELECT ord, line, pre_reason, cred, "offset", line_no, fp,
         CASE WHEN pre_reason IS NULL THEN json_valid(line) END AS valid
  FROM batch
), j AS (
  SELECT *, CASE WHEN valid THEN json_type(line) END AS jtype FROM b
), e AS (
  SELECT *, CASE WHEN jtype = 'OBJECT' THEN json_extract(line, {path_list}) END AS x FROM j
), f AS (
  SELECT ord, line, pre_reason, cred, "offset", line_no, fp, valid, jtype,
    {first("ts")} AS ts_v,
    tw_str({first("session_id")}) AS session_id,
    tw_str({first("caller_id")}) AS caller_id,
    tw_str({first("client_ip")}) AS client_ip,
    tw_str({first("server")}) AS server,
    tw_str({first("tool")}) AS tool,
    {first("args")} AS args_v,
    tw_str({first("resource_id")}) AS resource_id_v,
    tw_str({first("status")}) AS status_raw,
    {first("is_error")} AS is_error_v,
    tw_num({first("bytes")}) AS bytes_v,
    tw_num({first("rows")}) AS rows_v,
    tw_num({first("duration_ms")}) AS duration_v,
    tw_str({first("event")}) AS event_v,
    tw_num({first("call_count")}) AS call_count_v,
    tw_num({first("unique_resources")}) AS unique_resources_v,
    tw_num({first("total_bytes")}) AS total_bytes_v,
    tw_num({first("auth_failures")}) AS auth_failures_v,
    CASE WHEN {first("jsonrpc")} IS NOT NULL THEN line::JSON
         ELSE coalesce({wrapped}) END AS rpc
  FROM e
), r AS (
  SELECT *,
    json_extract_string(rpc, '$.method') AS rpc_method,
    CAST(json_extract(rpc, '$.id') AS VARCHAR) AS rpc_id,
    CASE WHEN rpc IS NOT NULL THEN coalesce(json_extract(rpc, '$.result'), json_extract(rpc, '$.error')) END AS rpc_out
  FROM f
), g AS (
  SELECT *,
    CASE
      WHEN rpc IS NULL THEN args_v
      ELSE json_extract(rpc, '$.params.arguments') END AS args_j,
    CASE WHEN rpc IS NULL THEN tool ELSE json_extract_string(rpc, '$.params.name') END AS tool_n,
    tw_time(ts_v) AS ts_parsed
  FROM r
), k AS (
  SELECT *,
    CASE
      WHEN pre_reason IS NOT NULL THEN pre_reason
      WHEN NOT valid THEN 'invalid_json'
      WHEN jtype <> 'OBJECT' THEN 'not_object'
      WHEN rpc IS NOT NULL AND rpc_method IS NOT NULL AND rpc_method <> 'tools/call'
        THEN 'non_tool_message'
      WHEN rpc IS NOT NULL AND rpc_method IS NULL AND rpc_out IS NULL THEN 'non_tool_message'
      WHEN rpc IS NOT NULL AND rpc_method IS NULL THEN NULL
      WHEN ts_v IS NULL THEN 'missing_timestamp'
      WHEN ts_parsed IS NULL OR ts_parsed < TIMESTAMPTZ '2000-01-01'
           OR ts_parsed > TIMESTAMPTZ '2100-01-01' THEN 'bad_timestamp'
      WHEN rpc IS NOT NULL THEN NULL
      WHEN upper(event_v) IN ('SESSION_END', 'SESSION_ANOMALY') AND session_id IS NULL
        THEN 'missing_session'
      WHEN upper(event_v) IN ('SESSION_END', 'SESSION_ANOMALY') THEN NULL
      WHEN tool_n IS NULL THEN 'no_tool'
      ELSE NULL END AS reason
  FROM g
), m AS (
  SELECT *,
    CASE
      WHEN reason IS NOT NULL THEN 'quarantine'
      WHEN rpc IS NOT NULL AND rpc_method = 'tools/call' THEN 'rpc_req'
      WHEN rpc IS NOT NULL THEN 'rpc_resp'
      WHEN upper(event_v) IN ('SESSION_END', 'SESSION_ANOMALY') THEN 'summary'
      ELSE 'call' END AS kind,
    CASE WHEN json_type(args_j) = 'OBJECT' THEN args_j END AS args_o
  FROM k
), res AS (
  SELECT *,
    CASE WHEN args_o IS NOT NULL AND resource_id_v IS NULL THEN
      list_position(
        list_transform(json_keys(args_o), lambda k: regexp_full_match(k, '(id|ID|.+Id|.+_id|.+ID|path|uri|url|key)')
                                               AND NOT list_contains({non_res}, k)),
        true)
    END AS res_pos
  FROM m
)
SELECT *,
  coalesce(nullif(tw_status(status_raw), 'unknown'),
           CASE WHEN is_error_b THEN 'error' WHEN NOT is_error_b THEN 'ok' END,
           'unknown') AS status
FROM (SELECT
  ord, kind, reason,
  left(md5(fp || ':' || CAST("offset" AS VARCHAR)), 24) AS event_id,
  "offset", line_no,
  CASE WHEN kind = 'quarantine' THEN
    CASE WHEN reason = 'invalid_json' THEN 'not parseable as JSON'
         WHEN reason = 'not_object' THEN 'JSON ' || jtype || ', expected an object'
         WHEN reason = 'bad_timestamp' THEN 'unparseable time ' || left(CAST(ts_v AS VARCHAR), 80)
         WHEN reason = 'non_tool_message' THEN 'JSON-RPC ' || coalesce(rpc_method, 'message')
         ELSE NULL END
  END AS detail,
  ts_parsed AS ts,
  session_id, caller_id, client_ip, server,
  tool_n AS tool,
  CAST(args_o AS VARCHAR) AS args,
  CASE WHEN resource_id_v IS NOT NULL THEN NULL
       WHEN res_pos > 0 THEN json_keys(args_o)[res_pos] END AS resource_key,
  coalesce(resource_id_v,
           CASE WHEN res_pos > 0 THEN tw_str(json_extract(args_o, '$.*')[res_pos]) END) AS resource_id,
  -- outcome: a recognised status/outcome wins; else isError; else unknown
  CASE WHEN rpc IS NULL THEN status_raw
       WHEN json_extract(rpc, '$.error') IS NOT NULL THEN
         coalesce(json_extract_string(rpc, '$.error.message'), CAST(json_extract(rpc, '$.error.code') AS VARCHAR))
       WHEN (json_extract_string(rpc, '$.result.isError')) = 'true' THEN
         left(coalesce(json_extract_string(rpc, '$.result.content[0].text'), 'error'), 200)
  END AS status_raw,
  CASE WHEN rpc IS NULL THEN try_cast(json_extract_string(is_error_v, '$') AS BOOLEAN)
       WHEN json_extract(rpc, '$.error') IS NOT NULL THEN true
       ELSE coalesce(try_cast(json_extract_string(rpc, '$.result.isError') AS BOOLEAN), false) END AS is_error_b,
  CAST(CASE WHEN rpc IS NULL THEN bytes_v
            ELSE strlen(CAST(json_extract(rpc, '$.result') AS VARCHAR)) END AS BIGINT) AS bytes,
  CAST(rows_v AS BIGINT) AS rows,
  duration_v AS duration_ms,
  cred AS credential_hash,
  CASE WHEN rpc IS NULL THEN 'call' ELSE 'jsonrpc' END AS format,
  rpc_id,
  upper(event_v) AS summary_kind,
  CAST(call_count_v AS BIGINT) AS call_count,
  CAST(unique_resources_v AS BIGINT) AS unique_resources,
  CAST(total_bytes_v AS BIGINT) AS total_bytes,
  CAST(auth_failures_v AS BIGINT) AS auth_failures,
  rtrim(line, chr(10) || chr(13)) AS raw
FROM res)
ORDER BY ord
"""

    # ------------------------------------------------------------------ bytes
    def _prepare(self, batch: RawBatch) -> pa.Table:
        """Byte-level checks and redaction; returns the table DuckDB parses."""
        lines = batch.lines
        n = len(lines)
        self.counters.lines += n
        pre_reason: list[str | None] = [None] * n
        offsets_buf = np.frombuffer(lines.buffers()[1], dtype=np.int64)[
            lines.offset : lines.offset + n + 1
        ]
        lengths = np.diff(offsets_buf)
        too_long = np.flatnonzero(lengths > self.config.max_line_bytes + 2)
        for i in too_long:
            pre_reason[int(i)] = "line_too_long"
        self.counters.too_long += len(too_long)

        try:
            text = lines.cast(pa.large_string())
        except pa.ArrowInvalid:
            # Rare path: find the offending lines one by one; the rest of the chunk is fine.
            py = lines.to_pylist()
            fixed: list[bytes] = []
            for i, b in enumerate(py):
                try:
                    b.decode("utf-8")
                    fixed.append(b)
                except UnicodeDecodeError:
                    pre_reason[i] = pre_reason[i] or "invalid_utf8"
                    self.counters.invalid_utf8 += 1
                    fixed.append(b.decode("utf-8", "backslashreplace").encode())
            text = pa.array(fixed, type=pa.large_binary()).cast(pa.large_string())
            lines = pa.array(fixed, type=pa.large_binary())

        cred: list[str | None] = [None] * n
        data = lines.buffers()[2]
        if data is not None and n:
            start = int(offsets_buf[0])
            end = int(offsets_buf[-1])
            mv = memoryview(data)[start:end]
            hits = {m.start() for m in self.hasher.prefilter.finditer(mv)}
            if hits:
                rel = offsets_buf - start
                idx = sorted({int(i) for i in np.searchsorted(rel, sorted(hits), side="right") - 1})
                mask = np.zeros(n, dtype=bool)
                repl: list[bytes] = []
                for i in idx:
                    if pre_reason[i] == "line_too_long":
                        continue
                    raw = lines[i].as_py()
                    red, h = self.hasher.redact_line(raw.rstrip(b"\r\n"))
                    if red != raw.rstrip(b"\r\n"):
                        self.counters.redacted += 1
                    mask[i] = True
                    repl.append(red)
                    cred[i] = h
                if repl:
                    text = pc.replace_with_mask(
                        text,
                        pa.array(mask),
                        pa.array(repl, type=pa.large_binary()).cast(pa.large_string()),
                    )
        # Over-long lines are never parsed: keep only a prefix for quarantine.
        if len(too_long):
            keep = self.config.quarantine_raw_chars
            mask = np.zeros(n, dtype=bool)
            mask[too_long] = True
            short = [
                self.hasher.scrub_text(lines[int(i)].as_py()[:keep]).decode(
                    "utf-8", "backslashreplace"
                )
                for i in too_long
            ]
            text = pc.replace_with_mask(text, pa.array(mask), pa.array(short, pa.large_string()))
        return pa.table(
            {
                "ord": pa.array(np.arange(n, dtype=np.int64)),
                "offset": pa.array(batch.offsets, pa.int64()),
                "line_no": pa.array(batch.line_nos, pa.int64())
                if batch.line_nos is not None
                else pa.nulls(n, pa.int64()),
                "fp": pa.array([batch.source_fp] * n, pa.string()),
                "line": text,
                "pre_reason": pa.array(pre_reason, pa.string()),
                "cred": pa.array(cred, pa.string()),
            }
        )

    def parse(self, batch: RawBatch) -> pa.Table:
        """Classify and normalize every line of ``batch``; one output row per input line."""
        tbl = self._prepare(batch)
        self._con.register("batch", tbl)
        try:
            out = self._con.sql(self._sql).to_arrow_table()
        finally:
            self._con.unregister("batch")
        return out

    def close(self) -> None:
        """Release the DuckDB connection."""
        self._con.close()
