"""Field aliases of the log contract (docs/log-format.md). First match wins."""

from __future__ import annotations

#: canonical field -> source names, in priority order. Dotted names are literal keys
#: (OpenTelemetry-style flattened attributes such as ``mcp.session.id``).
ALIASES: dict[str, list[str]] = {
    "ts": ["ts", "timestamp", "time", "@timestamp"],
    "session_id": [
        "session_id",
        "sessionId",
        "session",
        "mcp.session.id",
        # JSON-RPC logging proxies key transcripts by connection.
        "connection_id",
        "connectionId",
    ],
    "caller_id": ["caller_id", "callerId", "user_id", "userId", "authenticatedUserId", "principal"],
    # Whether the writer vouches for caller_id (a verified token, not a self-declared name).
    "caller_authenticated": ["caller_authenticated", "callerAuthenticated"],
    "client_ip": ["client_ip", "clientIp", "ip", "remote_addr"],
    "server": ["server", "server_name", "serverName"],
    "tool": ["tool", "toolName", "tool_name", "name", "gen_ai.tool.name"],
    "args": ["args", "arguments", "params", "input"],
    "resource_id": ["resource_id", "resourceId"],
    "status": ["status", "outcome"],
    "is_error": ["isError", "is_error"],
    "bytes": ["bytes", "bytes_returned", "bytesReturned", "response_bytes"],
    "rows": ["rows", "rows_returned", "rowsReturned"],
    "duration_ms": [
        "duration_ms", "durationMs", "latency_ms", "latencyMs", "elapsed_ms", "elapsedMs",
    ],
    # When each call was in flight (ingest/intervals.py). A bare "duration" is not an alias:
    # its unit is anyone's guess; map it in the config to duration_ms or duration_s.
    "duration_s": ["duration_s", "durationSeconds", "elapsed_s", "latency_s"],
    "start_ts": ["start_ts", "startTs", "start_time", "startTime", "started_at", "startedAt"],
    "end_ts": ["end_ts", "endTs", "end_time", "endTime", "ended_at", "endedAt",
               "finished_at", "finishedAt", "completed_at", "completedAt"],
    # Session summaries (SESSION_END / SESSION_ANOMALY).
    "event": ["event"],
    "call_count": ["callCount", "call_count"],
    "unique_resources": ["uniqueResourcesAccessed", "unique_resources_accessed", "uniqueResources"],
    "total_bytes": ["totalBytesReturned", "total_bytes_returned", "totalBytes"],
    "auth_failures": ["authFailures", "auth_failures"],
    # MCP JSON-RPC: the message itself, or wrapped by a logging proxy.
    "jsonrpc": ["jsonrpc"],
    "rpc_wrapped": ["message", "payload", "msg"],
}

#: Argument keys that name *who* or *which request*, never the resource acted on.
NON_RESOURCE_KEYS = (
    "session_id",
    "sessionId",
    "request_id",
    "requestId",
    "trace_id",
    "traceId",
    "user_id",
    "userId",
    "caller_id",
    "callerId",
    "client_id",
    "clientId",
    "correlation_id",
    "correlationId",
    "span_id",
    "spanId",
    "tenant_id",
    "tenantId",
)


def json_path(name: str) -> str:
    """JSON path for a source field name: literal key, or ``a/b`` for nesting."""
    parts = name.split("/")
    quoted = ['"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in parts]
    return "$." + ".".join(quoted)


def merged_aliases(extra: dict[str, list[str]]) -> dict[str, list[str]]:
    """Built-in aliases followed by the config's extra names for each field."""
    unknown = set(extra) - set(ALIASES)
    if unknown:
        from toolwatch.errors import ConfigError

        raise ConfigError(
            f"unknown canonical field(s) {sorted(unknown)}; known: {sorted(ALIASES)}",
            key="ingest.field_aliases",
        )
    return {k: v + [n for n in extra.get(k, []) if n not in v] for k, v in ALIASES.items()}
