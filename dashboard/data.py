"""Every query the dashboard runs, as plain functions returning polars frames.

Nothing here imports Streamlit, so each function is unit-tested on its own. Rules:

* Every value that comes from the logs or from a user's filter is **bound** as a DuckDB
  parameter (``$name``); it is never formatted into SQL text. The only identifiers that
  vary are column names chosen from fixed allow-lists (:data:`TOP_COLUMNS`,
  :data:`ENTITY_COLUMNS`).
* Queries go through :func:`toolwatch.query.query` or, for analysts' own SQL,
  :func:`run_forensic_sql`, both of which apply the whitelist guard
  (:mod:`toolwatch.query_guard`: one plain SELECT over the views) and run on a fresh,
  locked-down in-memory DuckDB with no file access at all (see docs/query.md).
  Nothing here can lock the ingester.
* Times are returned in UTC; :func:`to_timezone` converts for display.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
import polars as pl
from toolwatch.detectors.config import CATEGORIES as _CATEGORIES
from toolwatch.detectors.config import SEVERITIES as _SEVERITIES

from toolwatch import query as runner
from toolwatch.config import QueryConfig
from toolwatch.errors import QueryError
from toolwatch.store import Store

# One definition (detectors/config.py, a light import): every filter and chart lists
# these; the dashboard shows severities most severe first.
SEVERITIES = tuple(reversed(_SEVERITIES))
CATEGORIES = _CATEGORIES
#: Categories whose alerts carry an ordered chain of calls (evidence.chain).
SEQUENCE_CATEGORIES = ("tool_loop", "privilege_chain", "step_skip", "duplicate_execution",
                       "cross_server_flow")
#: Columns of ``events`` the overview may rank by (identifiers, never user input).
TOP_COLUMNS = ("caller_id", "client_ip", "tool", "server", "resource_id")
#: Entity kinds the entity page pivots on, mapped to their ``events`` column.
ENTITY_COLUMNS = {"caller_id": "caller_id", "client_ip": "client_ip"}
#: Bucket widths for time series, by name.
BUCKETS = {"minute": "1 minute", "hour": "1 hour", "day": "1 day"}

_SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def _frame(store: Store, sql: str, params: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """Run one parameterized read-only query and return a polars frame."""
    with warnings.catch_warnings():
        # duckdb 2 warns that DB-API Arrow output copies; harmless at dashboard sizes.
        warnings.simplefilter("ignore", UserWarning)
        tbl = runner.query(store, sql, dict(params or {}))
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    return fix_decimals(df)


def fix_decimals(df: pl.DataFrame) -> pl.DataFrame:
    """DuckDB's ``sum`` of integers is a DECIMAL: make it Int64 (scale 0) or Float64."""
    exprs = [
        pl.col(c).cast(pl.Int64 if (t.scale or 0) == 0 else pl.Float64)  # type: ignore[union-attr]
        for c, t in df.schema.items()
        if isinstance(t, pl.Decimal)
    ]
    return df.with_columns(exprs) if exprs else df


def _one(store: Store, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    df = _frame(store, sql, params)
    return df.row(0, named=True) if df.height else {}


# ---------------------------------------------------------------- time helpers
def to_timezone(df: pl.DataFrame, tz: str, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """Convert timestamp columns to wall-clock time in ``tz`` for display.

    The result is timezone-naive (the zone is stated once in the page caption) so tables
    and charts show the analyst's local time rather than an offset suffix.

    Parameters
    ----------
    df
        Frame whose datetime columns are timezone-aware (UTC from the store).
    tz
        IANA zone name, e.g. ``"Europe/Berlin"``.
    columns
        Columns to convert; default: every datetime column.
    """
    cols = (
        list(columns)
        if columns is not None
        else [c for c, t in df.schema.items() if isinstance(t, pl.Datetime)]
    )
    exprs = []
    for c in cols:
        if c not in df.columns or not isinstance(df.schema[c], pl.Datetime):
            continue
        col = pl.col(c)
        if df.schema[c].time_zone is None:  # type: ignore[union-attr]
            col = col.dt.replace_time_zone("UTC")
        exprs.append(col.dt.convert_time_zone(tz).dt.replace_time_zone(None).alias(c))
    return df.with_columns(exprs) if exprs else df


def pick_bucket(start: datetime | None, end: datetime | None) -> str:
    """A bucket name giving a readable number of bars for the span ``start``..``end``."""
    if start is None or end is None:
        return "hour"
    span = end - start
    if span <= timedelta(hours=3):
        return "minute"
    if span <= timedelta(days=10):
        return "hour"
    return "day"


# ---------------------------------------------------------------- overview
def health_counters(store: Store) -> dict[str, Any]:
    """Figures for the overview's health row.

    Returns
    -------
    dict
        ``events``, ``sessions``, ``callers``, ``client_ips``, ``alerts``, ``summaries``,
        ``quarantined``, ``first_event``, ``last_event``, ``last_ingested``,
        ``last_alert``, ``streams``.
    """
    row = _one(
        store,
        """
        SELECT
          (SELECT count(*) FROM events) AS events,
          (SELECT count(DISTINCT session_id) FROM events) AS sessions,
          (SELECT count(DISTINCT caller_id) FROM events) AS callers,
          (SELECT count(DISTINCT client_ip) FROM events) AS client_ips,
          (SELECT count(*) FROM alerts) AS alerts,
          (SELECT count(*) FROM summaries) AS summaries,
          (SELECT count(*) FROM quarantine) AS quarantined,
          (SELECT min(ts) FROM events) AS first_event,
          (SELECT max(ts) FROM events) AS last_event,
          (SELECT max(ingested_at) FROM events) AS last_ingested,
          (SELECT max(detected_at) FROM alerts) AS last_alert
        """,
    )
    row["streams"] = len(store.checkpoints())
    return row


def live_processes(store: Store) -> pl.DataFrame:
    """Live processes writing to the store (``toolwatch status``), one row each.

    Columns: ``kind``, ``pid``, ``events_per_s``, ``events_stored``, ``lag`` (messages
    for kafka, bytes for tail), ``lag_growing_s``, ``warning`` (e.g. the kafka lag warning,
    empty when none), ``partitions`` (kafka lag per partition, ``topic/p=n ...``), ``name``.
    Only processes still running; empty when none.
    """
    from toolwatch.status_files import read_statuses

    rows = []
    for s in read_statuses(store.root):
        if not s.get("alive"):
            continue
        lag = s.get("lag") or {}
        amount = lag.get("messages", lag.get("bytes"))
        rows.append({
            "kind": str(s.get("kind", "")),
            "pid": int(s.get("pid") or 0),
            "events_per_s": float(s.get("events_per_s") or 0.0),
            "events_stored": int(s.get("events_stored") or 0),
            "lag": int(amount) if isinstance(amount, int | float) else None,
            "lag_growing_s": float(lag.get("growing_s") or 0.0),
            "warning": str(lag.get("warning") or ""),
            "partitions": str(lag.get("by_partition") or ""),
            "name": str(s.get("name", "")),
        })
    schema = {"kind": pl.String, "pid": pl.Int64, "events_per_s": pl.Float64,
              "events_stored": pl.Int64, "lag": pl.Int64, "lag_growing_s": pl.Float64,
              "warning": pl.String, "partitions": pl.String, "name": pl.String}
    return pl.DataFrame(rows, schema=schema)


def time_bounds(store: Store) -> tuple[datetime | None, datetime | None]:
    """Earliest and latest time of any event or alert (UTC), for default time ranges."""
    row = _one(
        store,
        "SELECT least((SELECT min(ts) FROM events), (SELECT min(first_seen) FROM alerts)) AS lo,"
        " greatest((SELECT max(ts) FROM events), (SELECT max(last_seen) FROM alerts)) AS hi",
    )
    return row.get("lo"), row.get("hi")


def _bucket_width(bucket: str) -> str:
    """The interval of a named time bucket (``hour``, ``day`` …)."""
    width = BUCKETS.get(bucket)
    if width is None:
        raise ValueError(f"unknown bucket {bucket!r}: use one of {sorted(BUCKETS)}")
    return width


def alerts_over_time(
    store: Store,
    bucket: str = "hour",
    start: datetime | None = None,
    end: datetime | None = None,
) -> pl.DataFrame:
    """Alert counts per time bucket (by ``first_seen``), category and severity.

    Returns
    -------
    polars.DataFrame
        Columns ``bucket`` (UTC), ``category``, ``severity``, ``alerts``.
    """
    width = _bucket_width(bucket)
    return _frame(
        store,
        """
        SELECT time_bucket(CAST($width AS INTERVAL), first_seen) AS bucket,
               category, severity, count(*) AS alerts
        FROM alerts
        WHERE ($start::TIMESTAMPTZ IS NULL OR last_seen >= $start::TIMESTAMPTZ)
          AND ($end::TIMESTAMPTZ IS NULL OR first_seen <= $end::TIMESTAMPTZ)
        GROUP BY ALL ORDER BY bucket, category, severity
        """,
        {"width": width, "start": start, "end": end},
    )


def events_over_time(
    store: Store,
    bucket: str = "hour",
    start: datetime | None = None,
    end: datetime | None = None,
) -> pl.DataFrame:
    """Event counts and bytes per time bucket and outcome.

    Returns
    -------
    polars.DataFrame
        Columns ``bucket`` (UTC), ``status``, ``events``, ``bytes``.
    """
    width = _bucket_width(bucket)
    return _frame(
        store,
        """
        SELECT time_bucket(CAST($width AS INTERVAL), ts) AS bucket, status,
               count(*) AS events, coalesce(sum(bytes), 0) AS bytes
        FROM events
        WHERE ($start::TIMESTAMPTZ IS NULL OR ts >= $start::TIMESTAMPTZ)
          AND ($end::TIMESTAMPTZ IS NULL OR ts <= $end::TIMESTAMPTZ)
        GROUP BY ALL ORDER BY bucket, status
        """,
        {"width": width, "start": start, "end": end},
    )


def top_values(
    store: Store,
    column: str,
    limit: int = 10,
    start: datetime | None = None,
    end: datetime | None = None,
) -> pl.DataFrame:
    """The busiest values of one events column.

    Parameters
    ----------
    column
        One of :data:`TOP_COLUMNS`.

    Returns
    -------
    polars.DataFrame
        Columns ``value``, ``calls``, ``sessions``, ``errors``, ``bytes``, ``alerts``
        (alerts naming the value as caller, client address or entity; 0 for tools).
    """
    if column not in TOP_COLUMNS:
        raise ValueError(f"cannot rank by {column!r}: use one of {TOP_COLUMNS}")
    alert_match = {
        "caller_id": "a.caller_id = t.value OR a.entity_id = t.value",
        "client_ip": "a.client_ip = t.value OR a.entity_id = t.value",
        "server": "a.server = t.value",
    }.get(column, "false")
    return _frame(
        store,
        f"""
        WITH t AS (
          SELECT {column} AS value, count(*) AS calls, count(DISTINCT session_id) AS sessions,
                 count(*) FILTER (WHERE is_error) AS errors, coalesce(sum(bytes), 0) AS bytes
          FROM events
          WHERE {column} IS NOT NULL
            AND ($start::TIMESTAMPTZ IS NULL OR ts >= $start::TIMESTAMPTZ)
            AND ($end::TIMESTAMPTZ IS NULL OR ts <= $end::TIMESTAMPTZ)
          GROUP BY 1 ORDER BY calls DESC, value LIMIT $limit
        )
        SELECT t.*, (SELECT count(*) FROM alerts a WHERE {alert_match}) AS alerts
        FROM t ORDER BY calls DESC, value
        """,
        {"limit": int(limit), "start": start, "end": end},
    )


def quarantine_by_reason(store: Store) -> pl.DataFrame:
    """Quarantined lines per reason, most first (columns ``reason``, ``lines``, ``last``)."""
    return _frame(
        store,
        "SELECT reason, count(*) AS lines, max(ingested_at) AS last FROM quarantine "
        "GROUP BY 1 ORDER BY 2 DESC, 1",
    )


# ---------------------------------------------------------------- alerts
@dataclass(frozen=True)
class AlertFilter:
    """Filters of the flagged-sessions list. Empty tuples and ``None`` mean "any".

    Attributes
    ----------
    start, end
        Keep alerts whose window ``first_seen``..``last_seen`` overlaps this range (UTC).
    categories, severities, servers
        Allowed values.
    caller
        Exact caller id (alerts whose caller or entity is this caller).
    search
        Case-insensitive substring searched in ids, caller, address, server, category,
        detector and reasons.
    statuses
        Triage statuses to keep (``open`` for alerts nobody triaged yet).
    """

    start: datetime | None = None
    end: datetime | None = None
    categories: tuple[str, ...] = ()
    severities: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    caller: str | None = None
    search: str | None = None
    statuses: tuple[str, ...] = field(default=())


# Who first (caller, address), then what and how bad; ids last (issue 27).
_ALERT_COLUMNS = """
    caller_id, client_ip, severity, category, coalesce(reasons[1], '') AS first_reason,
    score, server, first_seen, last_seen, detected_at, detector, entity_type, entity_id,
    session_id, alert_id, len(coalesce(reasons, [])) AS n_reasons
"""


def list_alerts(
    store: Store, flt: AlertFilter | None = None, triage: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Alerts matching ``flt``, most severe and highest score first.

    Parameters
    ----------
    store
        The store.
    flt
        Filters; default none.
    triage
        Current triage state (:meth:`toolwatch.dashboard.triage.TriageStore.current_frame`), joined
        as ``status``/``triaged_by``/``triaged_at``; alerts without a verdict are ``open``.

    Returns
    -------
    polars.DataFrame
        One row per alert with ``first_reason`` and ``status``.
    """
    flt = flt or AlertFilter()
    search = (flt.search or "").strip() or None
    df = _frame(
        store,
        f"""
        SELECT {_ALERT_COLUMNS}
        FROM alerts
        WHERE ($start::TIMESTAMPTZ IS NULL OR last_seen >= $start::TIMESTAMPTZ)
          AND ($end::TIMESTAMPTZ IS NULL OR first_seen <= $end::TIMESTAMPTZ)
          AND (len(CAST($cats AS VARCHAR[])) = 0
               OR list_contains(CAST($cats AS VARCHAR[]), category))
          AND (len(CAST($sevs AS VARCHAR[])) = 0
               OR list_contains(CAST($sevs AS VARCHAR[]), severity))
          AND (len(CAST($servers AS VARCHAR[])) = 0
               OR list_contains(CAST($servers AS VARCHAR[]), server))
          AND ($caller::VARCHAR IS NULL OR caller_id = $caller::VARCHAR
               OR (entity_type = 'caller_id' AND entity_id = $caller::VARCHAR))
          AND ($q::VARCHAR IS NULL OR contains(lower(concat_ws(' ', alert_id, entity_id,
               session_id, caller_id, client_ip, server, category, detector,
               array_to_string(coalesce(reasons, []), ' '))), lower($q::VARCHAR)))
        """,
        {
            "start": flt.start,
            "end": flt.end,
            "cats": list(flt.categories),
            "sevs": list(flt.severities),
            "servers": list(flt.servers),
            "caller": flt.caller or None,
            "q": search,
        },
    )
    df = attach_triage(df, triage)
    if flt.statuses:
        df = df.filter(pl.col("status").is_in(list(flt.statuses)))
    return sort_alerts(df)


def sort_alerts(df: pl.DataFrame) -> pl.DataFrame:
    """Most severe first, then highest score, then latest."""
    if df.height == 0:
        return df
    return (
        df.with_columns(
            pl.col("severity")
            .replace_strict(_SEV_RANK, default=len(SEVERITIES), return_dtype=pl.Int32)
            .alias("_rank")
        )
        .sort(["_rank", "score", "last_seen"], descending=[False, True, True], nulls_last=True)
        .drop("_rank")
    )


def attach_triage(alerts: pl.DataFrame, triage: pl.DataFrame | None) -> pl.DataFrame:
    """Join the current triage verdicts onto alerts (``open`` where there is none)."""
    cols = {
        "status": pl.Utf8,
        "triaged_by": pl.Utf8,
        "triaged_at": pl.Datetime("us", "UTC"),
        "note": pl.Utf8,
    }
    if triage is None or triage.height == 0:
        return alerts.with_columns(
            pl.lit("open").alias("status"),
            *(pl.lit(None, dtype=t).alias(c) for c, t in cols.items() if c != "status"),
        )
    t = triage.select(
        "alert_id",
        pl.col("status"),
        pl.col("actor").alias("triaged_by"),
        pl.col("at").alias("triaged_at"),
        pl.col("note"),
    )
    return alerts.join(t, on="alert_id", how="left").with_columns(
        pl.col("status").fill_null("open")
    )


def alert_filter_options(store: Store) -> dict[str, list[str]]:
    """Distinct values present in alerts, for filter widgets.

    Returns
    -------
    dict
        ``categories``, ``severities`` (in severity order), ``servers``, ``callers``.
    """
    df = _frame(
        store,
        """
        SELECT 'categories' AS k, category AS v FROM alerts WHERE category IS NOT NULL
        UNION SELECT 'severities', severity FROM alerts WHERE severity IS NOT NULL
        UNION SELECT 'servers', server FROM alerts WHERE server IS NOT NULL
        UNION SELECT 'callers', caller_id FROM alerts WHERE caller_id IS NOT NULL
        UNION SELECT 'callers', entity_id FROM alerts WHERE entity_type = 'caller_id'
        """,
    )
    out: dict[str, list[str]] = {"categories": [], "severities": [], "servers": [], "callers": []}
    for k, v in df.iter_rows():
        out[k].append(v)
    for k in out:
        out[k] = sorted(set(out[k]))
    out["severities"].sort(key=lambda s: _SEV_RANK.get(s, 99))
    # Categories in the one list's order (unknown ones, e.g. from an older store, last).
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    out["categories"].sort(key=lambda c: (rank.get(c, len(rank)), c))
    return out


def get_alert(store: Store, alert_id: str) -> dict[str, Any] | None:
    """The latest version of one alert as a dict (``reasons`` a list), or ``None``."""
    row = _one(store, "SELECT * FROM alerts WHERE alert_id = $id", {"id": alert_id})
    return row or None


def alerts_for_session(store: Store, session_id: str) -> pl.DataFrame:
    """Alerts about this session (as its own entity or naming it as the session)."""
    return sort_alerts(
        _frame(
            store,
            f"SELECT {_ALERT_COLUMNS} FROM alerts WHERE session_id = $s "
            "OR (entity_type = 'session' AND entity_id = $s)",
            {"s": session_id},
        )
    )


def sessions_for_alert(store: Store, alert: Mapping[str, Any]) -> pl.DataFrame:
    """Sessions an alert is about: its session, else the entity's sessions in its window.

    Returns
    -------
    polars.DataFrame
        Rows of the ``sessions`` view, earliest first.
    """
    if alert.get("entity_type") == "session" or (
        alert.get("session_id") and alert.get("entity_type") not in ENTITY_COLUMNS
    ):
        sid = alert.get("session_id") or alert.get("entity_id")
        return _frame(store, "SELECT * FROM sessions WHERE session_id = $s", {"s": sid})
    col = ENTITY_COLUMNS.get(str(alert.get("entity_type")))
    if col is None:
        return _frame(store, "SELECT * FROM sessions WHERE false")
    return _frame(
        store,
        f"""
        SELECT * FROM sessions WHERE session_id IN (
          SELECT DISTINCT session_id FROM events
          WHERE {col} = $v
            AND ($lo::TIMESTAMPTZ IS NULL OR ts >= $lo::TIMESTAMPTZ)
            AND ($hi::TIMESTAMPTZ IS NULL OR ts <= $hi::TIMESTAMPTZ))
        ORDER BY first_seen
        """,
        {"v": alert.get("entity_id"), "lo": alert.get("first_seen"), "hi": alert.get("last_seen")},
    )


# ---------------------------------------------------------------- incidents
#: Short stage names for the queue (kill-chain order is detectors.incidents.STAGES).
STAGE_LABELS = {"discovery": "discovery", "credential_access": "cred access",
                "collection": "collection", "exfiltration": "exfil", "impact": "impact",
                "unclassified": "anomaly"}


def list_incidents(
    store: Store,
    alert_status: tuple[tuple[str, str], ...] = (),
    incident_status: tuple[tuple[str, str], ...] = (),
) -> pl.DataFrame:
    """Incidents of the store (:func:`toolwatch.detectors.incidents.build_incidents` over
    the ``alerts`` view), riskiest first.

    Parameters
    ----------
    alert_status, incident_status
        Current verdicts as ``(id, status)`` pairs. Passed in (read fresh from the triage
        file by the caller) rather than read here, so a cached result is keyed on them and
        a verdict shows at once.
    """
    from toolwatch.detectors.incidents import build_incidents, empty_incidents

    alerts = _frame(store, "SELECT * FROM alerts")
    if alerts.height == 0:
        return empty_incidents()
    return build_incidents(
        alerts,
        config=getattr(store, "incident_config", None),
        alert_status=dict(alert_status),
        incident_status=dict(incident_status),
    )


def _first_of(col: str, n: int) -> pl.Expr:
    """A list column as ``a, b (+3)``: the first ``n`` values and how many more."""
    lst = pl.col(col).fill_null(pl.lit([], dtype=pl.List(pl.String)))
    more = lst.list.len().cast(pl.Int64) - n
    head = lst.list.head(n).list.join(", ")
    return pl.when(more > 0).then(pl.format("{} (+{})", head, more)).otherwise(head)


def incident_queue(inc: pl.DataFrame) -> pl.DataFrame:
    """The incident queue as shown: who first (caller, address), then stages, risk,
    severity, since when, status and the first recommended action; ids last."""
    stages = pl.col("stages").list.eval(
        pl.element().replace_strict(STAGE_LABELS, default=pl.element())
    ).list.join(" → ")
    return inc.select(
        _first_of("caller_ids", 1).alias("caller"),
        _first_of("client_ips", 1).alias("address"),
        stages.alias("stages"),
        pl.col("risk"),
        pl.col("severity"),
        pl.col("first_seen").alias("since"),
        pl.col("status"),
        pl.col("recommended_actions").list.first().fill_null("").alias("do first"),
        pl.col("n_alerts").alias("alerts"),
        pl.col("last_seen"),
        _first_of("servers", 2).alias("servers"),
        pl.col("incident_id"),
    )


def caller_vouched(store: Store, caller_id: str) -> bool | None:
    """Whether every stored event of this caller says its log's writer vouched for it
    (``caller_authenticated``): a caller suppression silences only such callers. ``None``
    when the store has no events of it or predates the column."""
    try:
        row = _one(store, "SELECT bool_and(coalesce(caller_authenticated, false)) AS ok, "
                   "count(caller_authenticated) AS known FROM events WHERE caller_id = $c",
                   {"c": caller_id})
    except QueryError:  # a store written before the column existed
        return None
    if not row or not row.get("known"):
        return None
    return bool(row["ok"])


def incident_alerts(store: Store, alert_ids: Iterable[str]) -> pl.DataFrame:
    """An incident's alerts in kill-chain stage order (then by time): its timeline."""
    from toolwatch.detectors.incidents import CATEGORY_STAGE, STAGES

    ids = list(alert_ids)
    df = _frame(
        store,
        f"SELECT {_ALERT_COLUMNS} FROM alerts "
        "WHERE list_contains(CAST($ids AS VARCHAR[]), alert_id)",
        {"ids": ids},
    )
    rank = {s: i for i, s in enumerate(STAGES)}
    return (
        df.with_columns(
            pl.col("category").replace_strict(CATEGORY_STAGE, default="unclassified")
            .alias("stage")
        )
        .with_columns(
            pl.col("stage").replace_strict(rank, return_dtype=pl.Int32).alias("_rank")
        )
        .sort(["_rank", "first_seen", "alert_id"], nulls_last=True)
        .drop("_rank")
    )


# ---------------------------------------------------------------- sessions
def session_summary(store: Store, session_id: str) -> dict[str, Any] | None:
    """The ``sessions`` view row of one session, or ``None`` if unknown."""
    row = _one(store, "SELECT * FROM sessions WHERE session_id = $s", {"s": session_id})
    return row or None


#: When a call was in flight: the stored ends, else (stores written before the interval
#: columns) the timestamp as its completion and ``ts - duration_ms`` as its start.
_IV_FALLBACK = (
    "CASE WHEN isfinite(duration_ms) AND duration_ms >= 0 AND duration_ms <= 86400000 "
    "THEN {end} - to_microseconds(CAST(round(duration_ms * 1000) AS BIGINT)) END",
    "CASE WHEN isfinite(duration_ms) AND duration_ms >= 0 AND duration_ms <= 86400000 "
    "THEN {end} END",
)
_SESSION_EVENTS = """
    SELECT ts, tool, status, resource_id, bytes, rows, duration_ms, {start} AS start_ts,
           {end} AS end_ts, args, caller_id, client_ip, server, status_raw, credential_hash,
           source, line_no, event_id
    FROM events WHERE session_id = $s ORDER BY ts, "offset" LIMIT $limit
"""


def session_events(store: Store, session_id: str, limit: int = 5000) -> pl.DataFrame:
    """A session's calls in time order (at most ``limit``), without the bulky ``raw``.

    ``start_ts`` / ``end_ts`` say when each call was in flight (null for a call without a
    duration); stores without those columns get them from ``ts`` and ``duration_ms``.
    """
    params = {"s": session_id, "limit": int(limit)}
    fb_start, fb_end = (f.format(end="ts") for f in _IV_FALLBACK)
    try:
        return _frame(store, _SESSION_EVENTS.format(
            start=f"coalesce(start_ts, {fb_start})", end=f"coalesce(end_ts, {fb_end})"
        ), params)
    except QueryError:
        # An older store: its events view has no interval columns at all.
        return _frame(store, _SESSION_EVENTS.format(start=fb_start, end=fb_end), params)


def event_raw(store: Store, event_id: str) -> str | None:
    """The original log line (secrets hashed) of one event."""
    row = _one(store, "SELECT raw FROM events WHERE event_id = $e", {"e": event_id})
    return row.get("raw")


def session_tools(events: pl.DataFrame) -> pl.DataFrame:
    """Per tool: calls, errors and bytes, from :func:`session_events` output."""
    if events.height == 0:
        return pl.DataFrame(
            schema={"tool": pl.Utf8, "calls": pl.UInt32, "errors": pl.UInt32, "bytes": pl.Int64}
        )
    return (
        events.group_by("tool")
        .agg(
            pl.len().alias("calls"),
            (pl.col("status") != "ok").sum().cast(pl.UInt32).alias("errors"),
            pl.col("bytes").fill_null(0).sum().alias("bytes"),
        )
        .sort(["calls", "tool"], descending=[True, False])
    )


def session_resources(events: pl.DataFrame) -> pl.DataFrame:
    """Per resource touched: calls, outcomes, bytes and first/last time."""
    df = events.filter(pl.col("resource_id").is_not_null())
    if df.height == 0:
        return pl.DataFrame(
            schema={
                "resource_id": pl.Utf8,
                "calls": pl.UInt32,
                "statuses": pl.Utf8,
                "bytes": pl.Int64,
                "first": events.schema.get("ts", pl.Datetime("us", "UTC")),
                "last": events.schema.get("ts", pl.Datetime("us", "UTC")),
            }
        )
    return (
        df.group_by("resource_id")
        .agg(
            pl.len().alias("calls"),
            pl.col("status").unique().sort().str.join(", ").alias("statuses"),
            pl.col("bytes").fill_null(0).sum().alias("bytes"),
            pl.col("ts").min().alias("first"),
            pl.col("ts").max().alias("last"),
        )
        .sort(["first", "resource_id"])
    )


def bytes_over_time(events: pl.DataFrame) -> pl.DataFrame:
    """Cumulative bytes returned over the session (columns ``ts``, ``bytes``, ``cumulative``)."""
    if events.height == 0:
        return pl.DataFrame(
            schema={"ts": pl.Datetime("us", "UTC"), "bytes": pl.Int64, "cumulative": pl.Int64}
        )
    return events.sort("ts").select(
        "ts",
        pl.col("bytes").fill_null(0).alias("bytes"),
        pl.col("bytes").fill_null(0).cum_sum().alias("cumulative"),
    )


# ---------------------------------------------------------------- evidence
def parse_evidence(evidence: str | None) -> dict[str, Any]:
    """The alert's evidence JSON as a dict (``{}`` if missing or not an object)."""
    if not evidence:
        return {}
    try:
        val = orjson.loads(evidence)
    except orjson.JSONDecodeError:
        return {"unparsed": evidence}
    return val if isinstance(val, dict) else {"value": val}


def alert_action(alert: Mapping[str, Any]) -> str | None:
    """The recommended action for one alert row (a dict of the ``alerts`` view's columns),
    from its category and evidence: the text its incident lists for it."""
    from toolwatch.detectors.alerts import ALERT_COLUMNS
    from toolwatch.detectors.incidents import alert_actions

    row = {c: alert.get(c) for c in ALERT_COLUMNS}
    try:
        frame = pl.DataFrame([row], schema=ALERT_COLUMNS)
    except (pl.exceptions.PolarsError, TypeError, ValueError):
        return None  # a hand-made row of other types: the page still shows the alert
    return alert_actions(frame)["action"][0]


_CONTRIB_KEYS = (
    "driving_features",
    "feature_contributions",
    "contributions",
    "top_features",
    "features_contrib",
)
_CONTRIB_VALUE_KEYS = ("score_drop", "contribution", "score", "value")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def feature_contributions(evidence: str | Mapping[str, Any] | None) -> pl.DataFrame:
    """Isolation-forest feature contributions from an alert's evidence.

    Accepts the shapes detectors emit, under one of the keys ``driving_features`` (the
    toolwatch forest: ``{feature: {"value", "typical", "score_drop"}}``),
    ``feature_contributions``, ``contributions`` or ``top_features``: a mapping
    ``{feature: number}`` or ``{feature: {...}}``, a list of ``{"feature": ...,
    "contribution"|"score_drop"|"score"|"value": ...}`` objects, or ``[feature, number]``
    pairs.

    Returns
    -------
    polars.DataFrame
        Columns ``feature``, ``contribution`` (how much the feature pushed the score, e.g.
        the score drop when it is reset to its median), ``value`` and ``typical`` (raw
        feature value and its median, when given); largest contribution first. Empty if
        the evidence has none.
    """
    ev = parse_evidence(evidence) if not isinstance(evidence, Mapping) else dict(evidence)
    raw = next((ev[k] for k in _CONTRIB_KEYS if k in ev), None)
    rows: list[tuple[str, Any, Any, Any]] = []

    def from_obj(name: Any, obj: Mapping[str, Any]) -> None:
        contrib = next((obj[k] for k in _CONTRIB_VALUE_KEYS if k in obj), None)
        value = obj.get("value") if "score_drop" in obj or "contribution" in obj else None
        rows.append((str(name), contrib, value, obj.get("typical")))

    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if isinstance(v, Mapping):
                from_obj(k, v)
            else:
                rows.append((str(k), v, None, None))
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, Mapping):
                from_obj(item.get("feature", item.get("name")), item)
            elif isinstance(item, list | tuple) and len(item) >= 2:
                rows.append((str(item[0]), item[1], None, None))
    clean = [
        (name, c, _num(v), _num(t))
        for name, contrib, v, t in rows
        if (c := _num(contrib)) is not None
    ]
    df = pl.DataFrame(
        clean,
        schema={
            "feature": pl.Utf8,
            "contribution": pl.Float64,
            "value": pl.Float64,
            "typical": pl.Float64,
        },
        orient="row",
    )
    return df.sort(pl.col("contribution").abs(), descending=True)


# ---------------------------------------------------------------- entities
def _entity_col(entity_type: str) -> str:
    col = ENTITY_COLUMNS.get(entity_type)
    if col is None:
        raise ValueError(f"unknown entity type {entity_type!r}: use {sorted(ENTITY_COLUMNS)}")
    return col


def entity_summary(store: Store, entity_type: str, entity_id: str) -> dict[str, Any]:
    """Totals for one caller or client address across all its events and alerts."""
    col = _entity_col(entity_type)
    other = "client_ip" if col == "caller_id" else "caller_id"
    return _one(
        store,
        f"""
        SELECT count(*) AS calls, count(DISTINCT session_id) AS sessions,
               count(DISTINCT tool) AS tools, count(DISTINCT resource_id) AS resources,
               count(DISTINCT {other}) AS others, count(*) FILTER (WHERE is_error) AS errors,
               coalesce(sum(bytes), 0) AS bytes, min(ts) AS first_seen, max(ts) AS last_seen,
               (SELECT count(*) FROM alerts WHERE {col} = $v
                  OR (entity_type = $t AND entity_id = $v)) AS alerts
        FROM events WHERE {col} = $v
        """,
        {"v": entity_id, "t": entity_type},
    )


def entity_sessions(store: Store, entity_type: str, entity_id: str) -> pl.DataFrame:
    """Every session of a caller or client address, with its alert count, latest first."""
    col = _entity_col(entity_type)
    return _frame(
        store,
        f"""
        SELECT s.session_id, s.first_seen, s.last_seen, s.calls, s.distinct_tools,
               s.distinct_resources, s.total_bytes, s.errors, s.auth_failures,
               s.caller_id, s.client_ip, s.server,
               (SELECT count(*) FROM alerts a WHERE a.session_id = s.session_id
                  OR (a.entity_type = 'session' AND a.entity_id = s.session_id)) AS alerts
        FROM sessions s
        WHERE s.session_id IN (SELECT DISTINCT session_id FROM events WHERE {col} = $v)
           OR s.{col} = $v
        ORDER BY s.first_seen DESC
        """,
        {"v": entity_id},
    )


def entity_alerts(store: Store, entity_type: str, entity_id: str) -> pl.DataFrame:
    """Alerts naming this caller or address (as entity or as a field)."""
    col = _entity_col(entity_type)
    return sort_alerts(
        _frame(
            store,
            f"SELECT {_ALERT_COLUMNS} FROM alerts WHERE {col} = $v "
            "OR (entity_type = $t AND entity_id = $v)",
            {"v": entity_id, "t": entity_type},
        )
    )


def entity_activity(
    store: Store, entity_type: str, entity_id: str, bucket: str = "hour"
) -> pl.DataFrame:
    """Calls per time bucket and outcome for one caller or address."""
    col = _entity_col(entity_type)
    width = BUCKETS.get(bucket)
    if width is None:
        raise ValueError(f"unknown bucket {bucket!r}")
    return _frame(
        store,
        f"""
        SELECT time_bucket(CAST($width AS INTERVAL), ts) AS bucket, status, count(*) AS calls,
               coalesce(sum(bytes), 0) AS bytes
        FROM events WHERE {col} = $v GROUP BY ALL ORDER BY bucket, status
        """,
        {"v": entity_id, "width": width},
    )


def entity_breakdown(store: Store, entity_type: str, entity_id: str, by: str) -> pl.DataFrame:
    """A caller's or address's calls broken down by one column of :data:`TOP_COLUMNS`.

    E.g. ``by="client_ip"`` for a caller lists every address it came from.
    """
    col = _entity_col(entity_type)
    if by not in TOP_COLUMNS:
        raise ValueError(f"cannot break down by {by!r}")
    return _frame(
        store,
        f"""
        SELECT {by} AS value, count(*) AS calls, count(DISTINCT session_id) AS sessions,
               count(*) FILTER (WHERE is_error) AS errors, coalesce(sum(bytes), 0) AS bytes,
               min(ts) AS first_seen, max(ts) AS last_seen
        FROM events WHERE {col} = $v AND {by} IS NOT NULL
        GROUP BY 1 ORDER BY calls DESC, value LIMIT 500
        """,
        {"v": entity_id},
    )


def known_entities(store: Store, entity_type: str, limit: int = 500) -> list[str]:
    """Callers or addresses ordered by alerts then calls, for a picker."""
    col = _entity_col(entity_type)
    df = _frame(
        store,
        f"""
        WITH c AS (SELECT {col} AS v, count(*) AS calls FROM events
                   WHERE {col} IS NOT NULL GROUP BY 1),
             a AS (SELECT v, count(*) AS alerts FROM (
                     SELECT {col} AS v FROM alerts WHERE {col} IS NOT NULL
                     UNION ALL SELECT entity_id FROM alerts WHERE entity_type = $t) GROUP BY 1)
        SELECT coalesce(c.v, a.v) AS v FROM c FULL JOIN a ON c.v = a.v
        ORDER BY coalesce(a.alerts, 0) DESC, coalesce(c.calls, 0) DESC, 1 LIMIT $limit
        """,
        {"t": entity_type, "limit": int(limit)},
    )
    return df["v"].to_list()


# ---------------------------------------------------------------- forensics
@dataclass(frozen=True)
class QueryParam:
    """One input of a saved query, bound as ``$name``.

    Attributes
    ----------
    name
        Parameter name in the SQL.
    label
        Widget label (plain text).
    kind
        ``text``, ``int`` or ``timestamp`` (ISO 8601; a bare time is taken as UTC).
    default
        Default value as text.
    """

    name: str
    label: str
    kind: str = "text"
    default: str = ""


@dataclass(frozen=True)
class SavedQuery:
    """A named, parameterized forensic query."""

    name: str
    description: str
    sql: str
    params: tuple[QueryParam, ...] = ()


SAVED_QUERIES: tuple[SavedQuery, ...] = (
    SavedQuery(
        "Sessions that touched a resource",
        "Every session that called any tool on resource X, with its caller and outcome mix.",
        """SELECT session_id, any_value(caller_id) AS caller_id, any_value(client_ip) AS client_ip,
       min(ts) AS first_touch, max(ts) AS last_touch, count(*) AS calls,
       list(DISTINCT tool) AS tools, list(DISTINCT status) AS statuses
FROM events
WHERE resource_id = $resource
GROUP BY session_id
ORDER BY first_touch""",
        (QueryParam("resource", "Resource id"),),
    ),
    SavedQuery(
        "Caller's hour before an alert",
        "What a caller did in the hour before (and during) an alert's window.",
        """WITH a AS (SELECT first_seen, last_seen FROM alerts WHERE alert_id = $alert_id)
SELECT e.ts, e.session_id, e.tool, e.resource_id, e.status, e.bytes, e.client_ip, e.args
FROM events e, a
WHERE e.caller_id = $caller
  AND e.ts BETWEEN a.first_seen - INTERVAL 1 HOUR AND a.last_seen
ORDER BY e.ts""",
        (QueryParam("caller", "Caller id"), QueryParam("alert_id", "Alert id")),
    ),
    SavedQuery(
        "Everything from a client address",
        "Callers, sessions and outcomes seen from one client IP.",
        """SELECT caller_id, session_id, min(ts) AS first_seen, max(ts) AS last_seen,
       count(*) AS calls, count(*) FILTER (WHERE status = 'auth_failed') AS auth_failed
FROM events WHERE client_ip = $ip
GROUP BY ALL ORDER BY first_seen""",
        (QueryParam("ip", "Client address"),),
    ),
    SavedQuery(
        "Credential reuse across callers",
        "Hashed credentials tried by more than one caller or address.",
        """SELECT credential_hash, count(DISTINCT caller_id) AS callers,
       count(DISTINCT client_ip) AS addresses, count(*) AS attempts,
       count(*) FILTER (WHERE status = 'auth_failed') AS failed
FROM events WHERE credential_hash IS NOT NULL
GROUP BY 1 HAVING count(DISTINCT caller_id) > 1 OR count(DISTINCT client_ip) > 1
ORDER BY attempts DESC LIMIT 200""",
    ),
    SavedQuery(
        "Biggest responses",
        "The calls that returned the most bytes.",
        """SELECT ts, session_id, caller_id, tool, resource_id, bytes, rows
FROM events WHERE bytes IS NOT NULL ORDER BY bytes DESC LIMIT 100""",
    ),
    SavedQuery(
        "Alerts by category and severity",
        "How many alerts of each kind, with their first and last time.",
        """SELECT category, severity, count(*) AS alerts, min(first_seen) AS first,
       max(last_seen) AS last
FROM alerts GROUP BY ALL ORDER BY alerts DESC""",
    ),
    SavedQuery(
        "Quarantined lines",
        "Lines that could not be parsed, newest first.",
        """SELECT ingested_at, reason, source, line_no, detail, raw
FROM quarantine ORDER BY ingested_at DESC LIMIT 500""",
    ),
)


def coerce_params(query: SavedQuery, values: Mapping[str, str]) -> dict[str, Any]:
    """Turn a saved query's text inputs into typed bound parameters.

    Raises
    ------
    ValueError
        If a value is missing or does not parse as its kind.
    """
    out: dict[str, Any] = {}
    for p in query.params:
        text = (values.get(p.name) or "").strip()
        if not text:
            raise ValueError(f"{p.label} is required")
        if p.kind == "int":
            out[p.name] = int(text)
        elif p.kind == "timestamp":
            ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
            out[p.name] = ts if ts.tzinfo else ts.replace(tzinfo=datetime.now().astimezone().tzinfo)
        else:
            out[p.name] = text
    return out


@dataclass
class SqlResult:
    """Outcome of :func:`run_forensic_sql`."""

    frame: pl.DataFrame
    truncated: bool
    seconds: float


def run_forensic_sql(
    store: Store,
    sql: str,
    params: Mapping[str, Any] | None = None,
    *,
    max_rows: int = 10_000,
    timeout_s: float = 30.0,
    limits: QueryConfig | None = None,
) -> SqlResult:
    """Run an analyst's read-only SQL over the store's views.

    Uses :func:`toolwatch.query.run_query`: the whitelist guard (one plain SELECT
    over the views; no EXPLAIN, COPY, table functions reading files, PRAGMA, SET, ATTACH)
    and a locked-down connection with no file access, bounded memory and threads.
    Results are cut at ``max_rows``; a query running longer than ``timeout_s`` is
    interrupted. ``limits`` (the ``[query]`` config) supplies memory and threads.

    Raises
    ------
    toolwatch.errors.QueryError
        If the SQL is refused, fails or times out.
    """
    import dataclasses

    # replace(), not a new QueryConfig: every other [query] bound (the child's memory
    # cap, result bytes, columns) comes from the configuration too.
    bounded = dataclasses.replace(
        limits or QueryConfig(), timeout_seconds=timeout_s, max_rows=max_rows
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = runner.run_query(store, sql, dict(params) if params else None, limits=bounded)
    # A date Python cannot hold (a nested 'infinity'::TIMESTAMP) makes polars panic when
    # the downloads turn rows into Python values: such results are DuckDB's text.
    tbl = runner.as_text(res.table) if runner.beyond_python_dates(res.table) else res.table
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    try:
        frame = fix_decimals(df)
    except pl.exceptions.InvalidOperationError:  # a HUGEINT beyond Int64: keep it as text
        frame = pl.from_arrow(runner.as_text(tbl))
        assert isinstance(frame, pl.DataFrame)
    return SqlResult(frame=frame, truncated=res.truncated, seconds=res.seconds)


def view_columns(store: Store) -> pl.DataFrame:
    """Columns and types of the queryable views (for the Forensics page's reference)."""
    df = pl.from_arrow(runner.view_columns(store))
    assert isinstance(df, pl.DataFrame)
    return df


def json_safe_rows(df: pl.DataFrame) -> bytes:
    """Rows as a JSON array (times ISO 8601 UTC), for downloads; characters that act on
    a terminal or hide text (controls, bidi, zero-width) as ``\\uXXXX`` escapes."""
    from toolwatch.output import json_safe

    text = orjson.dumps(
        df.to_dicts(),
        option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC | orjson.OPT_INDENT_2,
        default=str,
    ).decode()
    # Raw newlines are the indentation's own (orjson escapes those inside strings).
    return "\n".join(json_safe(part) for part in text.split("\n")).encode()


def csv_bytes(df: pl.DataFrame) -> bytes:
    """Rows as CSV for a download, as ``toolwatch query --format csv`` writes them
    (:func:`toolwatch.output.safe_csv`): log values are attacker-controlled, and a cell
    such as ``=HYPERLINK(…)`` runs as a formula in the spreadsheet the file is opened in."""
    from toolwatch.output import safe_csv

    return safe_csv(df).encode()
