"""Column contracts of the store's datasets.

One place defines what an event, a session summary, a quarantined line and an alert look
like once normalized, so every source (files, stdin, a wrapped server, Kafka) and every
consumer (detectors, dashboard, notebook) agree. Parquet files are written with exactly
these Arrow schemas.
"""

from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

#: Normalized outcomes of a tool call. ``unknown``: the log line said nothing usable.
OUTCOMES = ("ok", "error", "not_found", "denied", "auth_failed", "rate_limited", "unknown")

EVENTS = pa.schema(
    [
        ("event_id", pa.string()),  # deterministic: "<source_fp>:<offset>"
        ("ts", TS),  # log time of the call (request time for JSON-RPC pairs)
        ("session_id", pa.string()),  # as logged, or derived (see session_derived)
        ("session_derived", pa.bool_()),  # True when sessionized by caller/ip + gap
        ("caller_id", pa.string()),
        ("client_ip", pa.string()),
        ("server", pa.string()),
        ("tool", pa.string()),
        ("args", pa.string()),  # JSON object text, secrets replaced by hmac:<hex>
        ("resource_key", pa.string()),  # argument name the resource came from, if derived
        ("resource_id", pa.string()),
        ("status", pa.string()),  # one of OUTCOMES
        ("status_raw", pa.string()),  # the value as logged (status/outcome/error code)
        ("is_error", pa.bool_()),
        ("bytes", pa.int64()),
        ("rows", pa.int64()),
        ("duration_ms", pa.float64()),
        # When the call was in flight (null when the line carries no duration): the
        # timestamp plus duration per ingest.ts_marks, explicit ends, or JSON-RPC
        # request/response times. "What was in flight at T": start_ts <= T < end_ts.
        ("start_ts", TS),
        ("end_ts", TS),
        ("credential_hash", pa.string()),  # first secret argument's keyed hash
        ("format", pa.string()),  # call | jsonrpc
        ("source", pa.string()),  # file path, "stdin", "kafka:topic/partition", ...
        ("source_fp", pa.string()),  # stable identity of the stream (first-line hash)
        ("offset", pa.int64()),  # byte offset of the line (Kafka: message offset)
        ("line_no", pa.int64()),  # 1-based line number when known
        ("raw", pa.string()),  # the whole original object, secrets hashed: nothing dropped
        ("ingested_at", TS),
        # What ingest changed, comma-separated (null for nearly every row):
        # out_of_range:<column> (value nulled), too_deep (args truncated), repaired:...
        ("flags", pa.string()),
        # Whether the log's writer vouched for caller_id (docs/log-format.md): true, false
        # (a self-declared client name), null (the log says nothing; older stores).
        ("caller_authenticated", pa.bool_()),
    ]
)

SUMMARIES = pa.schema(
    [
        ("event_id", pa.string()),
        ("ts", TS),
        ("kind", pa.string()),  # SESSION_END | SESSION_ANOMALY
        ("session_id", pa.string()),
        ("caller_id", pa.string()),
        ("client_ip", pa.string()),
        ("server", pa.string()),
        ("call_count", pa.int64()),
        ("unique_resources", pa.int64()),
        ("total_bytes", pa.int64()),
        ("auth_failures", pa.int64()),
        ("duration_ms", pa.float64()),
        ("source", pa.string()),
        ("source_fp", pa.string()),
        ("offset", pa.int64()),
        ("line_no", pa.int64()),
        ("raw", pa.string()),
        ("ingested_at", TS),
        ("flags", pa.string()),  # as in EVENTS
    ]
)

QUARANTINE = pa.schema(
    [
        ("event_id", pa.string()),  # same derivation as events, so re-ingest is idempotent
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("source", pa.string()),
        ("source_fp", pa.string()),
        ("offset", pa.int64()),
        ("line_no", pa.int64()),
        ("raw", pa.string()),  # truncated to ingest.quarantine_raw_chars; bad bytes escaped
        ("raw_bytes", pa.int64()),  # original length in bytes
        ("ingested_at", TS),
    ]
)

ALERTS = pa.schema(
    [
        ("alert_id", pa.string()),
        ("category", pa.string()),
        ("detector", pa.string()),
        ("severity", pa.string()),
        ("score", pa.float64()),
        ("entity_type", pa.string()),  # session | caller_id | client_ip
        ("entity_id", pa.string()),
        ("session_id", pa.string()),
        ("caller_id", pa.string()),
        ("client_ip", pa.string()),
        ("server", pa.string()),
        ("first_seen", TS),
        ("last_seen", TS),
        ("detected_at", TS),
        ("reasons", pa.list_(pa.string())),
        ("evidence", pa.string()),  # JSON object of figures
    ]
)

#: The store's ``streams`` table: the streams and the processes that write them (a row when
#: a writer first stores a stream, then a heartbeat); ``end_offset`` is how far the stream
#: was then (the resume point itself is the ``events`` table's application transaction).
STREAMS = pa.schema(
    [
        ("source_fp", pa.string()),
        ("source", pa.string()),
        ("end_offset", pa.int64()),
        ("committed_at", TS),
        ("writer", pa.string()),  # host:pid:nonce of the committing process
    ]
)

#: Columns whose values are (nearly) unique per row: the raw line, arguments, ids. Parquet
#: dictionary encoding and min/max statistics only cost time there (the writer builds a
#: dictionary until it overflows, then starts again without), so the store skips both.
UNIQUE_COLUMNS = frozenset(
    {"event_id", "raw", "args", "resource_id", "credential_hash", "detail", "alert_id",
     "evidence", "reasons"}
)

#: Quarantine reasons, documented in docs/log-format.md.
QUARANTINE_REASONS = {
    "invalid_utf8": "bytes that are not UTF-8",
    "line_too_long": "line longer than ingest.max_line_bytes",
    "invalid_json": "not parseable JSON (truncated, garbage, binary)",
    "not_object": "valid JSON that is not an object (array, string, number)",
    "missing_timestamp": "no time field under any alias",
    "bad_timestamp": "time field present but not a parseable/plausible time",
    "no_tool": "a JSON object that is not a tool call (no tool name, not a summary/JSON-RPC)",
    "non_tool_message": "JSON-RPC message other than tools/call (initialize, tools/list, ...)",
    "orphan_response": "JSON-RPC response whose request was never seen",
    "missing_session": "session summary without a session id",
    "server_text": "non-JSON line on a wrapped server's stderr (toolwatch run): kept, no failure",
    "untagged_record": "JSON line on a wrapped server's stderr without a valid record tag, "
    "from a server whose toolwatch middleware tags its records: never an event",
    "unprocessable": "a line that made parsing or a transform fail (detail says how); the "
    "rest of its batch is stored",
}

DATASETS = {"events": EVENTS, "summaries": SUMMARIES, "quarantine": QUARANTINE, "alerts": ALERTS}
