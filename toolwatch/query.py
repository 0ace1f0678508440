"""Forensic queries: SQL over the store's views, guarded by a whitelist and bounded.

Every query runs on a locked-down connection (:func:`query_connection`) that may read
exactly the views' files: :func:`run_query` runs an analyst's SQL in a sacrificial child
(:mod:`toolwatch.query_child`: memory cap, kill at the timeout, caps on rows, bytes and
columns), :func:`query` toolwatch's own SQL on a thread of this process. The connection
also has ``incidents``: the alerts rolled up at read time by the detectors' incident
builder, so this module sits a floor above :mod:`toolwatch.detectors` (the store is on the
ground floor, below both).
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from toolwatch.config import QueryConfig, auto_count
from toolwatch.errors import QueryError, first_line
from toolwatch.query_guard import check_query
from toolwatch.store import DATASETS, READ_RETRIES, Store, log, sql_list, warn_once

__all__ = ["VIEWS", "QueryResult", "as_text", "beyond_python_dates", "query",
           "query_connection", "run_query", "schema_listing", "view_columns"]

#: Views every query connection defines; the only names a forensic query may read.
VIEWS = ("events", "summaries", "quarantine", "alerts", "alerts_raw", "sessions", "incidents")


@dataclass
class QueryResult:
    """Outcome of :func:`run_query`."""

    #: The rows (at most ``max_rows``).
    table: pa.Table
    #: True when the query had more rows than ``max_rows`` and was cut.
    truncated: bool
    #: Wall-clock seconds, connection setup included.
    seconds: float
    #: Why it was cut: ``""``, ``"rows"`` (``max_rows``) or ``"bytes"`` (``max_result_mib``).
    cut: str = ""


def run_query(
    store: Store,
    sql: str,
    params: dict[str, Any] | list[Any] | None = None,
    *,
    limits: QueryConfig | None = None,
) -> QueryResult:
    """Run an analyst's SQL: one plain SELECT over the views, in a sacrificial child.

    The SQL must pass :func:`toolwatch.query_guard.check_query` (checked by the
    parser of the very connection that then runs it). Both run in a child process
    (:mod:`toolwatch.query_child`) on the connection of :func:`query_connection`,
    with an OS memory cap (``query.memory_limit_mib``), a SIGKILL at
    ``query.timeout_seconds``, and caps on rows, result bytes and columns (the result
    says when it cut). A Ctrl-C (``KeyboardInterrupt``) in the caller kills the child
    and is re-raised.

    Raises
    ------
    QueryRefusedError
        If the SQL is not a plain SELECT over the views, or has too many columns.
    QueryError
        If it fails, runs out of memory or time (:class:`~toolwatch.query_child.
        QueryTimeoutError`, :class:`~toolwatch.query_child.QueryMemoryError`,
        :class:`~toolwatch.query_child.QueryCrashedError`).
    """
    from toolwatch import query_child  # it imports this module

    limits = limits or QueryConfig()
    started = time.monotonic()
    for attempt in range(READ_RETRIES):
        try:
            files = {name: store.files(name) for name in DATASETS}
        except OSError as exc:
            raise QueryError(f"cannot open the store: {first_line(exc)}") from exc
        try:
            res = query_child.run(
                store.root, files, sql, params, limits, incident_config=store.incident_config
            )
        except QueryError as exc:
            # A compaction replaced a listed file before the child read it: list again.
            if getattr(exc, "missing_files", False) and attempt < READ_RETRIES - 1:
                time.sleep(0.05 * (attempt + 1))
                continue
            raise
        return QueryResult(res.table, bool(res.cut), time.monotonic() - started, res.cut)
    raise QueryError("unreachable")  # pragma: no cover


def query(
    store: Store,
    sql: str,
    params: dict[str, Any] | list[Any] | None = None,
    *,
    limits: QueryConfig | None = None,
) -> pa.Table:
    """Run a read-only query over the views and return an Arrow table.

    For toolwatch's own SQL: the guard and bounds of :func:`run_query`, in this
    process (no child start-up), without a row cap unless ``limits`` sets one.

    Raises
    ------
    QueryError
        If ``sql`` is not a single plain SELECT over the views, or fails.
    """
    if limits is None:
        limits = QueryConfig(max_rows=0)
    return _run_in_process(store, sql, params, limits=limits).table


def schema_listing(store: Store, limits: QueryConfig | None = None) -> pa.Table:
    """Every view a query may read, with its columns and DuckDB types (view, column,
    type), listed in a query child through the guard (``SELECT * FROM view`` per view):
    what is listed is exactly what an analyst's query can reach."""
    from toolwatch import query_child

    limits = limits or QueryConfig()
    files = {name: store.files(name) for name in DATASETS}
    return query_child.run(
        store.root, files, "", None, limits, incident_config=store.incident_config,
        mode="schema",
    ).table


def view_columns(store: Store) -> pa.Table:
    """Columns and types of the views analysts may query (view, column, type)."""
    con, _ = query_connection(store, QueryConfig())
    try:
        return con.sql(
            "SELECT table_name AS view, column_name AS column, data_type AS type "
            "FROM information_schema.columns WHERE table_name IN "
            f"({', '.join(repr(v) for v in VIEWS)}) ORDER BY table_name, ordinal_position"
        ).to_arrow_table()
    finally:
        con.close()


def _run_in_process(
    store: Store,
    sql: str,
    params: dict[str, Any] | list[Any] | None = None,
    *,
    limits: QueryConfig | None = None,
) -> QueryResult:
    """toolwatch's own SQL (dashboard pages, ``alerts``): guarded and bounded as
    :func:`run_query`, but on a thread of this process, without a child's start-up.
    Analysts' SQL goes through :func:`run_query`."""
    limits = limits or QueryConfig()
    started = time.monotonic()
    for attempt in range(READ_RETRIES):
        try:
            con, snapshot = query_connection(store, limits, incidents="incidents" in sql.lower())
        except duckdb.IOException as exc:
            # A compaction deleted a listed file before the view bound it: list again.
            if attempt < READ_RETRIES - 1:
                time.sleep(0.05 * (attempt + 1))
                continue
            raise QueryError(f"cannot open the store: {first_line(exc)}") from exc
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            raise QueryError(f"cannot open the store: {first_line(exc)}") from exc
        try:
            check_query(sql, VIEWS, con=con)
            tbl, truncated = _run_bounded(con, sql, params, limits)
        except QueryError:
            raise
        except Exception as exc:  # every failure is one clear message
            # A compaction replaced a file between listing and reading: list again.
            if attempt < READ_RETRIES - 1 and any(not os.path.exists(f) for f in snapshot):
                continue
            raise QueryError(_query_failure(exc, limits)) from exc
        finally:
            con.close()
        return QueryResult(tbl, truncated, time.monotonic() - started)
    raise QueryError("unreachable")  # pragma: no cover


def query_connection(
    store: Store, limits: QueryConfig, *, incidents: bool = True
) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """A locked-down connection for analysts' SQL, and the files its views read.

    ``incidents=False`` leaves the ``incidents`` view out (it is computed from every
    alert; :func:`run_query` asks for it only when the SQL names it).

    DuckDB may open exactly the data files the views name (``allowed_paths``) and
    nothing else: ``enable_external_access`` is off with no allowed directory,
    ``temp_directory`` is empty (no spilling, so no writable directory either),
    extensions cannot be installed or autoloaded, Python replacement scans are off,
    and the configuration is locked before any analyst SQL is seen. Writing to one of
    those files would need a COPY, which the guard never lets through.

    (Views over Arrow datasets registered from Python would need no file access at
    all, but measured 5-15x slower on selective queries over 1M events — no late
    materialization, no early stop on LIMIT — so DuckDB's own reader is kept.)
    """
    con = duckdb.connect(
        config={
            "threads": auto_count(limits.threads),
            "memory_limit": f"{max(16, limits.memory_limit_mb)}MiB",
            "temp_directory": "",
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "allow_community_extensions": False,
        }
    )
    snapshot: list[str] = []
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute("SET python_enable_replacements = false")
        snapshot.extend(store.create_views(con))
        if incidents:
            _create_incidents_view(store, con)
        con.execute(f"SET allowed_paths = {sql_list(snapshot)}")
        con.execute("SET allowed_directories = []")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except Exception:
        con.close()
        raise
    return con, snapshot


def _create_incidents_view(store: Store, con: duckdb.DuckDBPyConnection) -> None:
    """The ``incidents`` view: :func:`toolwatch.detectors.incidents.build_incidents`
    over this connection's ``alerts`` view, with the triage statuses.

    Computed at read time rather than stored: an incident is a function of the latest
    alert versions (a new alert can merge two activity windows into one, an update can
    raise a risk), so reading it from the ``alerts`` view is right for batch
    ``analyze`` and live ``tail`` stores alike with no state to keep in step. Rolling
    up a few thousand alerts takes milliseconds.
    """
    import sqlite3

    import polars as pl

    from toolwatch.detectors.incidents import build_incidents
    from toolwatch.triage_store import alert_statuses, incident_statuses

    alerts = pl.from_arrow(con.sql("SELECT * FROM alerts").to_arrow_table())
    assert isinstance(alerts, pl.DataFrame)
    try:
        by_alert, by_incident = alert_statuses(store.root), incident_statuses(store.root)
    except sqlite3.Error as exc:  # a damaged triage file must not hide the incidents
        warn_once(str(store.root / "_triage"), f"triage statuses unreadable ({exc})")
        by_alert, by_incident = {}, {}
    inc = build_incidents(
        alerts, config=store.incident_config, alert_status=by_alert,
        incident_status=by_incident,
    )
    # Copied into an in-memory DuckDB table, so the analyst's query (on the worker
    # thread of _run_bounded) scans DuckDB's own data, not a Python object.
    con.register("_incidents_arrow", inc.to_arrow())
    con.execute("CREATE TEMP TABLE _incidents AS SELECT * FROM _incidents_arrow")
    con.unregister("_incidents_arrow")
    con.execute("CREATE VIEW incidents AS SELECT * FROM _incidents")


def _query_failure(exc: BaseException, limits: QueryConfig) -> str:
    """One line saying why a query failed (no traceback, limits named)."""
    if isinstance(exc, duckdb.OutOfMemoryException):
        return (
            f"query ran out of memory (query.memory_limit_mb = {limits.memory_limit_mb}): "
            f"{first_line(exc)}"
        )
    if isinstance(exc, MemoryError):
        return "query ran out of memory while collecting its result (lower query.max_rows)"
    return first_line(exc)


def _run_bounded(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: dict[str, Any] | list[Any] | None,
    limits: QueryConfig,
) -> tuple[pa.Table, bool]:
    """Execute on a worker thread; interrupt it on timeout or Ctrl-C; cap the rows.

    The calling thread only waits, in short slices: that is what lets a SIGINT reach
    Python (a thread blocked inside DuckDB never runs signal handlers) and what makes the
    timeout fire on time. ``con.interrupt()`` is repeated until DuckDB gives up, since
    an interrupt sent before execution started is not kept.
    """
    max_rows = limits.max_rows if limits.max_rows > 0 else None
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            rel = con.sql(sql, params=params) if params is not None else con.sql(sql)
            rel = renderable(rel)
            batch = 65_536 if max_rows is None else max(1, min(max_rows + 1, 65_536))
            reader = rel.to_arrow_reader(batch)
            batches: list[pa.RecordBatch] = []
            n = 0
            for b in reader:
                batches.append(b)
                n += b.num_rows
                if max_rows is not None and n > max_rows:
                    break
            tbl = pa.Table.from_batches(batches, schema=reader.schema)
            box["result"] = (
                (tbl.slice(0, max_rows), True)
                if max_rows is not None and tbl.num_rows > max_rows
                else (tbl, False)
            )
        except BaseException as exc:  # handed to the caller
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="toolwatch-query", daemon=True)
    deadline = time.monotonic() + limits.timeout_seconds
    worker.start()
    why = ""
    try:
        while not done.wait(max(0.0, min(0.1, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                why = "timeout"
                _stop(con, done)
                break
    except KeyboardInterrupt:
        _stop(con, done)
        raise
    if done.is_set():
        # The worker sets ``done`` before its locals go: the DuckDB reader of a result cut
        # at max_rows is torn down after that. Closing the connection or exiting while it
        # was aborted the process now and then ("terminate called without an active
        # exception", seen on cut `incidents` queries).
        worker.join(timeout=5.0)
    if why == "timeout":
        raise QueryError(
            f"query interrupted: it ran longer than {limits.timeout_seconds:g} s "
            "(query.timeout_seconds)"
        )
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, duckdb.InterruptException):
            raise QueryError("query interrupted") from exc
        raise exc
    return box["result"]


#: DuckDB types that Arrow/polars/Python cannot carry faithfully, shown as DuckDB's text:
#: INTERVAL has no polars type, UHUGEINT comes out of DECIMAL(38) wrong (HUGEINT, the type
#: of every sum(), is kept), UNION/UUID/BIT/TIMETZ/VARIANT have no polars or JSON form.
_TEXT_TYPES = re.compile(r"\b(INTERVAL|UHUGEINT|UUID|BIT|UNION|VARIANT|TIME WITH TIME ZONE)\b")


def renderable(rel: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """``rel`` with columns of :data:`_TEXT_TYPES` cast to VARCHAR (by expression objects:
    column names are the analyst's, never pasted into SQL)."""
    types = [str(t) for t in rel.dtypes]
    if not any(_TEXT_TYPES.search(t) for t in types):
        return rel
    try:
        exprs = [
            duckdb.ColumnExpression(c).cast(duckdb.sqltype("VARCHAR")).alias(c)
            if _TEXT_TYPES.search(t)
            else duckdb.ColumnExpression(c)
            for c, t in zip(rel.columns, types, strict=True)
        ]
        return rel.select(*exprs)
    except duckdb.Error:
        return rel  # e.g. duplicate column names: leave the types as they are


def beyond_python_dates(tbl: pa.Table) -> bool:
    """Whether a date/timestamp value, at any nesting depth (lists, structs, maps), lies
    outside years 1-9999: Python cannot hold it, and polars panics (printing a Rust
    backtrace) instead of raising when it is turned into one."""
    return any(_beyond_dates(col) for col in tbl.columns)


def _beyond_dates(arr: pa.ChunkedArray | pa.Array) -> bool:
    lo_days, hi_days = -719_162, 2_932_896  # 0001-01-01 and 9999-12-31 from 1970-01-01
    per_day = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}
    t = arr.type
    if pa.types.is_dictionary(t):
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        return any(_beyond_dates(c.dictionary) for c in chunks)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _beyond_dates(pc.list_flatten(arr))
    if pa.types.is_map(t):
        chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
        return any(_beyond_dates(c.keys) or _beyond_dates(c.items) for c in chunks)
    if pa.types.is_struct(t):
        return any(
            _beyond_dates(pc.struct_field(arr, [i])) for i in range(t.num_fields)
        )
    if pa.types.is_timestamp(t):
        scale, as_int = per_day[t.unit], pa.int64()
    elif pa.types.is_date32(t):
        scale, as_int = 1, pa.int32()
    elif pa.types.is_date64(t):
        scale, as_int = per_day["ms"], pa.int64()
    else:
        return False
    if arr.null_count == len(arr):
        return False
    mm = pc.min_max(arr.cast(as_int))
    return mm["min"].as_py() < lo_days * scale or mm["max"].as_py() > hi_days * scale


def as_text(tbl: pa.Table) -> pa.Table:
    """``tbl`` with every column that is not a plain number, boolean or string as DuckDB's
    text for it: the fallback when a value has no Python/polars form (a timestamp in the
    year 294247, a blob in CSV)."""
    con = duckdb.connect(config={"enable_external_access": False})
    try:
        rel = con.from_arrow(tbl)
        keep = re.compile(
            r"^(BOOLEAN|TINYINT|SMALLINT|INTEGER|BIGINT|U?TINYINT|USMALLINT|"
            r"UINTEGER|UBIGINT|FLOAT|DOUBLE|VARCHAR)$"
        )
        exprs = [
            duckdb.ColumnExpression(c)
            if keep.match(str(t))
            else duckdb.ColumnExpression(c).cast(duckdb.sqltype("VARCHAR")).alias(c)
            for c, t in zip(rel.columns, rel.dtypes, strict=True)
        ]
        return rel.select(*exprs).to_arrow_table()
    finally:
        con.close()


def _stop(con: duckdb.DuckDBPyConnection, done: threading.Event) -> None:
    """Interrupt the running query until its worker has finished (bounded wait)."""
    for _ in range(200):  # ~20 s: DuckDB checks for interrupts between vectors
        con.interrupt()
        if done.wait(0.1):
            return
    log.error("query did not stop after interrupt; abandoning its thread")
