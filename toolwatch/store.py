"""The forensic store: Delta Lake tables of Parquet files, read through DuckDB views.

Layout under ``data_dir``::

    events/        Delta table: normalized tool calls
    summaries/     Delta table: SESSION_END / SESSION_ANOMALY lines
    quarantine/    Delta table: lines that could not be events
    alerts/        Delta table: alert versions (the ``alerts`` view keeps the latest)
    streams/       Delta table: how far each stream is stored, and by which process
    _state/        this machine's files: live status, triage, rejected planted files

Why no DuckDB database file: DuckDB allows one writer process per database file, and
readers of a file being written block or fail. Here writers only add immutable Parquet
files through Delta commits (:mod:`toolwatch.tables`: atomic, optimistic, many writers),
and every reader opens its own in-memory DuckDB with views over one committed snapshot's
files. So ``ingest``/``tail``/``kafka`` write while ``query`` and the dashboard read, and
none locks another; any Delta reader (polars, Spark, delta-rs) sees the same snapshots.

Event ids are deterministic (stream fingerprint + offset), and each table's commit carries
the streams' offsets as Delta application transactions, so a replayed batch adds nothing
twice (:mod:`toolwatch.tables`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from toolwatch import schema
from toolwatch.config import QueryConfig, auto_count
from toolwatch.errors import QueryError, StoreError
from toolwatch.query_guard import check_query
from toolwatch.tables import Checkpoint, Location, Table, writer_name

__all__ = ["Checkpoint", "QueryResult", "Store"]

log = logging.getLogger(__name__)

DATASETS = ("events", "summaries", "quarantine", "alerts")
#: Views every reader connection defines; the only names a forensic query may read.
VIEWS = ("events", "summaries", "quarantine", "alerts", "alerts_raw", "sessions", "incidents")
#: (path, size, mtime, inode) -> whether the file is a readable data file of its dataset.
#: Committed files are immutable (compaction writes new names), so one footer read each.
_VALID_CACHE: dict[tuple[str, int, int, int], bool] = {}
#: Attempts a reader makes when a file it listed was removed by a compaction's vacuum.
_RETRIES = 5


class Store:
    """The store's tables: atomic, exactly-once batch appends; DuckDB views to read.

    Parameters
    ----------
    data_dir
        Root directory; created if missing.
    compact_min_files
        Tables with at least this many small files are compacted by :meth:`compact`.
    vacuum_hours
        Files a compaction replaced are deleted this many hours later (readers that
        listed them before the compaction can still read them meanwhile).
    """

    #: Files smaller than this are merged by :meth:`compact`.
    SMALL_FILE_BYTES = 1024 * 1024
    #: Upper bound of input bytes one merge reads (bounds compaction memory: a merge
    #: holds ~10x its Parquet bytes decompressed).
    COMPACT_MAX_BYTES = 4 * 1024 * 1024
    #: Rows per row group of a compaction's output (a merge of COMPACT_MAX_BYTES holds
    #: ~100k events): the Parquet writer buffers one row group encoded at a time.
    COMPACT_ROW_GROUP_ROWS = 32_768
    #: ``[detectors.incidents]`` settings of the ``incidents`` view (None: the defaults).
    #: A command that loaded a config sets it on its store.
    incident_config: Any = None

    def __init__(self, data_dir: str | Path, *, compact_min_files: int = 16,
                 vacuum_hours: float = 1.0):
        self.root = Path(data_dir)
        self.compact_min_files = compact_min_files
        self.vacuum_hours = vacuum_hours
        self.writer = writer_name()
        try:
            (self.root / "_state").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store at {self.root}: {exc}") from exc
        self.location = _location(self.root)
        if not self.location.remote and legacy_layout(self.root):
            raise StoreError(
                f"the store at {self.root} is in the layout before Delta tables; convert it "
                f"once with: toolwatch store migrate -d {self.root}"
            )
        self._registered: set[str] = set()
        self._streams_at = float("-inf")
        self._tables = {
            name: Table(self.location, name, sch, self.root / "_state")
            for name, sch in (*schema.DATASETS.items(), ("streams", schema.STREAMS))
        }

    def table(self, name: str) -> Table:
        """The Delta table of a dataset (or ``streams``)."""
        return self._tables[name]

    # ------------------------------------------------------------ writer side
    #: Seconds between a writer's ``streams`` rows for streams it registered already (its
    #: heartbeat in ``toolwatch status``); a stream new to this writer is registered at once.
    STREAMS_EVERY_S = 30.0
    #: Order of a batch's commits: ``events`` last, so its application transactions are
    #: the resume points (a stream is never resumed past rows of another table).
    _COMMIT_ORDER = ("summaries", "quarantine", "alerts", "events")

    def write_batch(
        self,
        tables: dict[str, pa.Table],
        checkpoints: list[Checkpoint] | None = None,
        *,
        row_group_rows: int | None = None,
        page_bytes: int | None = None,
    ) -> int:
        """Add rows to datasets and advance stream checkpoints, exactly once.

        Each dataset's rows are one Delta commit carrying the checkpoints as application
        transactions; rows of a checkpointed stream that a table already holds (a replay)
        are dropped. ``events`` commits last, with the transactions even when the batch
        has no event: its transaction versions are where each stream resumes.

        Parameters
        ----------
        tables
            Dataset name -> rows with exactly that dataset's schema. Empty tables are skipped.
        checkpoints
            Streams whose offsets this batch completes.
        row_group_rows
            Rows per Parquet row group (default :data:`ROW_GROUP_ROWS`). The writer holds
            a row group's encoded columns until it is complete, so a live commit's small
            files (merged later by compaction) use :data:`LIVE_ROW_GROUP_ROWS`.
        page_bytes
            Data page size of the files (default: pyarrow's, 1 MiB); live commits use
            :data:`LIVE_PAGE_BYTES` (less memory while writing, see there).

        Returns
        -------
        int
            Rows committed (a replay commits 0).
        """
        cps = list(checkpoints or [])
        for name in tables:
            if name not in DATASETS:
                raise StoreError(f"unknown dataset {name!r}")

        def write(tbl: pa.Table, path: str, fs: Any) -> None:
            _write_parquet(tbl, path, row_group_rows or ROW_GROUP_ROWS, page_bytes, fs)

        stored = 0
        try:
            for name in self._COMMIT_ORDER:
                tbl = tables.get(name)
                sch = schema.DATASETS[name]
                if tbl is None or tbl.num_rows == 0:
                    if not (name == "events" and cps):
                        continue
                    tbl = pa.Table.from_batches([], schema=sch)  # the transactions alone
                tbl = tbl.select(sch.names).cast(sch)
                stored += self._tables[name].append(
                    tbl, cps, write, writer=self.writer, filter_replayed=name != "alerts")
            if cps:
                self._register(cps, write)
        except OSError as exc:
            raise StoreError(f"cannot write batch to {self.root}: {exc}") from exc
        return stored

    def _register(self, cps: list[Checkpoint], write: Any) -> None:
        """``streams`` rows for streams new to this writer, or the periodic heartbeat."""
        now = time.monotonic()
        new = [c for c in cps if c.source_fp not in self._registered]
        if not new and now - self._streams_at < self.STREAMS_EVERY_S:
            return
        self._tables["streams"].append(_streams_rows(cps, self.writer), [], write,
                                       writer=self.writer, filter_replayed=False)
        self._registered.update(c.source_fp for c in cps)
        self._streams_at = now

    def checkpoints(self) -> dict[str, int]:
        """Stream fingerprint -> offset from which to resume (the ``events`` table's
        application transaction of every stream the ``streams`` table lists)."""
        tbl = self._tables["streams"].read()
        if tbl.num_rows == 0:
            return {}
        fps = pc.unique(tbl["source_fp"]).drop_null().to_pylist()
        return self._tables["events"].versions(fps)

    def writers(self) -> pa.Table:
        """Every process that committed to the store: writer, streams, rows' last commit."""
        tbl = self._tables["streams"].read()
        return tbl.group_by("writer").aggregate(
            [("source_fp", "count_distinct"), ("committed_at", "max")]
        ).rename_columns(["writer", "streams", "last_commit"])

    def close(self) -> None:
        """Nothing to release: every commit is complete when :meth:`write_batch` returns."""

    # ------------------------------------------------------------ compaction
    def compact(self, dataset: str = "events") -> int:
        """Merge small files of a table; returns the number of merges done.

        Only files under :attr:`SMALL_FILE_BYTES` take part (live mode writes one small
        file per flush; batch ingest already writes large ones), in merges of at most
        :attr:`COMPACT_MAX_BYTES` of them each, so memory stays bounded whatever the
        table's size. Replaced files are deleted by :meth:`vacuum`.
        """
        return self.compact_within(dataset, None)[0]

    def compact_within(self, dataset: str, budget_s: float | None) -> tuple[int, bool]:
        """:meth:`compact`, starting no merge once ``budget_s`` seconds have passed.

        The first merge always runs, so repeated calls always progress. Returns the
        number of merges done and whether mergeable groups were left for a later call.
        A live process compacts this way, a few merges per commit: one call over a
        backlog's hundreds of files held its commit thread (and so its alerts) for
        ~100 s. Two processes compacting at once conflict in Delta's commit check; the
        loser's merge is dropped, never doubled.
        """
        deadline = None if budget_s is None else time.monotonic() + budget_s
        table = self._tables[dataset]
        small = [(p, n) for p, n in table.sizes() if n < self.SMALL_FILE_BYTES]
        if len(small) < self.compact_min_files:
            return 0, False
        # Groups of at most COMPACT_MAX_BYTES, each merged on its own: a merge holds its
        # rows decompressed (~10x the Parquet bytes), so the group size is the memory.
        groups: list[list[tuple[str, int]]] = [[]]
        total = 0
        for f in sorted(small):
            if groups[-1] and total + f[1] > self.COMPACT_MAX_BYTES:
                groups.append([])
                total = 0
            groups[-1].append(f)
            total += f[1]
        done = 0
        want = table.schema
        for group in groups:
            if len(group) < 2:
                continue
            if done and deadline is not None and time.monotonic() >= deadline:
                return done, True
            merged = pa.concat_tables([
                _conform(table.read_file(table.file_path(p)), want)
                for p, _ in group
            ])
            # Row groups of COMPACT_ROW_GROUP_ROWS: the writer then holds one such group's
            # encoded columns at a time beside the merged rows, not the whole merge's.
            if not table.replace(group, merged, lambda t, path, fs: _write_parquet(
                    t, path, self.COMPACT_ROW_GROUP_ROWS, None, fs), writer=self.writer):
                return done, False  # another process is compacting this table
            done += 1
        return done, False

    def vacuum(self, dataset: str, hours: float | None = None) -> int:
        """Delete a table's files that compaction replaced more than ``hours`` ago (default
        :attr:`vacuum_hours`, rounded up to whole hours).

        Files of writes that never committed (a writer killed between writing a file and
        its commit) are not touched: delta-rs's full vacuum would find them, but it lists
        the folder and follows links planted there.
        """
        return self._tables[dataset].vacuum(self.vacuum_hours if hours is None else hours)

    # ------------------------------------------------------------ reader side
    def files(self, dataset: str) -> list[str]:
        """Current data files of a dataset: its Delta snapshot, checked.

        Only plain files inside the table's folder whose footer reads as the dataset's
        Parquet (read once per process: committed files are immutable). A log entry
        naming anything else (a planted commit pointing at ``/etc/passwd``, a symlink,
        a FIFO) is skipped with a logged warning instead of being read by every view.
        """
        table = self._tables[dataset]
        if self.location.remote:
            # Object keys cannot be links or FIFOs; a key outside the table is refused.
            return sorted(u for u in table.files() if u.startswith(table.uri + "/"))
        base = os.path.realpath(table.path)
        out: list[str] = []
        for path in table.files():
            if os.path.dirname(os.path.realpath(path)) != base and not os.path.realpath(
                    path).startswith(base + os.sep):
                _warn_once(path, "outside the table's folder")
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue  # vacuumed meanwhile
            if not _is_regular(st.st_mode):
                _warn_once(path, "not a plain file")
                continue
            key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
            ok = _VALID_CACHE.get(key)
            if ok is None:
                ok = _readable_as(path, schema.DATASETS[dataset])
                if len(_VALID_CACHE) > 200_000:
                    _VALID_CACHE.clear()
                _VALID_CACHE[key] = ok
            if ok:
                out.append(path)
        return sorted(out)

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A fresh in-memory DuckDB connection with views over the store (trusted code).

        Views: ``events``, ``summaries``, ``quarantine``, ``alerts`` (latest version of
        each alert), ``alerts_raw`` (every version), ``sessions`` (per-session figures
        from events, plus sessions known only from summaries). Open one per query or per
        dashboard rerun: views list the files that exist when the connection is made.

        This connection reads files itself and is not locked down: it is for toolwatch's
        own SQL (analyze, live). Analysts' SQL goes through :meth:`run_query`.
        """
        # Creating a view binds its file list; a compaction can delete a listed file
        # between listing and binding. Listing again is enough: the merged file is in place.
        for attempt in range(_RETRIES):
            con = duckdb.connect(config={"threads": 2})
            try:
                con.execute("SET TimeZone = 'UTC'")
                self._create_views(con)
                return con
            except duckdb.IOException:
                con.close()
                if attempt == _RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _create_views(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Create every view on ``con``; returns the data files the views read."""
        read: list[str] = []
        for name in DATASETS:
            files = self.files(name)
            read.extend(files)
            if files and self.location.remote:
                # DuckDB's own S3 reader is an extension this install cannot fetch: the
                # files are read through pyarrow's S3 file system as an Arrow dataset.
                import pyarrow.dataset as ds

                table = self._tables[name]
                con.register(f"_ds_{name}", ds.dataset(
                    [self.location.fs_path(f) for f in files], filesystem=table.fs,
                    format="parquet", schema=schema.DATASETS[name]))
                src = f"SELECT * FROM _ds_{name}"
            elif files:
                src = (
                    f"SELECT * FROM read_parquet({_sql_list(files)}, "
                    "hive_partitioning=false, union_by_name=true)"
                )
                if not _has_columns(files[-1], schema.DATASETS[name]):
                    # A store written before a column was added (events.caller_authenticated):
                    # the view still has every column of the dataset, null where not stored.
                    con.register(f"_full_{name}",
                                 pa.Table.from_batches([], schema=schema.DATASETS[name]))
                    src = f"SELECT * FROM ({src}) UNION ALL BY NAME SELECT * FROM _full_{name}"
            else:
                # Table.from_batches, not Schema.empty_table(): pyarrow imports pandas
                # for the latter (~37 MiB and ~0.3 s in a live process).
                con.register(f"_empty_{name}",
                             pa.Table.from_batches([], schema=schema.DATASETS[name]))
                src = f"SELECT * FROM _empty_{name}"
            _create_view(con, name, src)
        _create_derived_views(con)
        return read

    def _query_connection(
        self, limits: QueryConfig, *, incidents: bool = True
    ) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
        """A locked-down connection for analysts' SQL, and the files its views read.

        ``incidents=False`` leaves the ``incidents`` view out (it is computed from every
        alert; :meth:`run_query` asks for it only when the SQL names it).

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
            snapshot.extend(self._create_views(con))
            if incidents:
                self._create_incidents_view(con)
            con.execute(f"SET allowed_paths = {_sql_list(snapshot)}")
            con.execute("SET allowed_directories = []")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
        except Exception:
            con.close()
            raise
        return con, snapshot

    def _create_incidents_view(self, con: duckdb.DuckDBPyConnection) -> None:
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
            by_alert, by_incident = alert_statuses(self.root), incident_statuses(self.root)
        except sqlite3.Error as exc:  # a damaged triage file must not hide the incidents
            _warn_once(str(self.root / "_triage"), f"triage statuses unreadable ({exc})")
            by_alert, by_incident = {}, {}
        inc = build_incidents(
            alerts, config=self.incident_config, alert_status=by_alert,
            incident_status=by_incident,
        )
        # Copied into an in-memory DuckDB table, so the analyst's query (on the worker
        # thread of _run_bounded) scans DuckDB's own data, not a Python object.
        con.register("_incidents_arrow", inc.to_arrow())
        con.execute("CREATE TEMP TABLE _incidents AS SELECT * FROM _incidents_arrow")
        con.unregister("_incidents_arrow")
        con.execute("CREATE VIEW incidents AS SELECT * FROM _incidents")

    def view_columns(self) -> pa.Table:
        """Columns and types of the views analysts may query (view, column, type)."""
        con, _ = self._query_connection(QueryConfig())
        try:
            return con.sql(
                "SELECT table_name AS view, column_name AS column, data_type AS type "
                "FROM information_schema.columns WHERE table_name IN "
                f"({', '.join(repr(v) for v in VIEWS)}) ORDER BY table_name, ordinal_position"
            ).to_arrow_table()
        finally:
            con.close()

    def run_query(
        self,
        sql: str,
        params: dict[str, Any] | list[Any] | None = None,
        *,
        limits: QueryConfig | None = None,
    ) -> QueryResult:
        """Run an analyst's SQL: one plain SELECT over the views, in a sacrificial child.

        The SQL must pass :func:`toolwatch.query_guard.check_query` (checked by the
        parser of the very connection that then runs it). Both run in a child process
        (:mod:`toolwatch.query_child`) on the connection of :meth:`_query_connection`,
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
        from toolwatch import query_child

        limits = limits or QueryConfig()
        started = time.monotonic()
        for attempt in range(_RETRIES):
            try:
                files = {name: self.files(name) for name in DATASETS}
            except OSError as exc:
                raise QueryError(f"cannot open the store: {_first_line(exc)}") from exc
            try:
                res = query_child.run(
                    self.root, files, sql, params, limits, incident_config=self.incident_config
                )
            except QueryError as exc:
                # A compaction replaced a listed file before the child read it: list again.
                if getattr(exc, "missing_files", False) and attempt < _RETRIES - 1:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise
            return QueryResult(res.table, bool(res.cut), time.monotonic() - started, res.cut)
        raise QueryError("unreachable")  # pragma: no cover

    def schema_listing(self, limits: QueryConfig | None = None) -> pa.Table:
        """Every view a query may read, with its columns and DuckDB types (view, column,
        type), listed in a query child through the guard (``SELECT * FROM view`` per view):
        what is listed is exactly what an analyst's query can reach."""
        from toolwatch import query_child

        limits = limits or QueryConfig()
        files = {name: self.files(name) for name in DATASETS}
        return query_child.run(
            self.root, files, "", None, limits, incident_config=self.incident_config,
            mode="schema",
        ).table

    def _run_in_process(
        self,
        sql: str,
        params: dict[str, Any] | list[Any] | None = None,
        *,
        limits: QueryConfig | None = None,
    ) -> QueryResult:
        """toolwatch's own SQL (dashboard pages, ``alerts``): guarded and bounded as
        :meth:`run_query`, but on a thread of this process, without a child's start-up.
        Analysts' SQL goes through :meth:`run_query`."""
        limits = limits or QueryConfig()
        started = time.monotonic()
        for attempt in range(_RETRIES):
            try:
                con, snapshot = self._query_connection(
                    limits, incidents="incidents" in sql.lower()
                )
            except duckdb.IOException as exc:
                # A compaction deleted a listed file before the view bound it: list again.
                if attempt < _RETRIES - 1:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise QueryError(f"cannot open the store: {_first_line(exc)}") from exc
            except (duckdb.Error, pa.ArrowException, OSError) as exc:
                raise QueryError(f"cannot open the store: {_first_line(exc)}") from exc
            try:
                check_query(sql, VIEWS, con=con)
                tbl, truncated = _run_bounded(con, sql, params, limits)
            except QueryError:
                raise
            except Exception as exc:  # every failure is one clear message
                # A compaction replaced a file between listing and reading: list again.
                if attempt < _RETRIES - 1 and any(not os.path.exists(f) for f in snapshot):
                    continue
                raise QueryError(_query_failure(exc, limits)) from exc
            finally:
                con.close()
            return QueryResult(tbl, truncated, time.monotonic() - started)
        raise QueryError("unreachable")  # pragma: no cover

    def query(
        self,
        sql: str,
        params: dict[str, Any] | list[Any] | None = None,
        *,
        limits: QueryConfig | None = None,
    ) -> pa.Table:
        """Run a read-only query over the views and return an Arrow table.

        For toolwatch's own SQL: the guard and bounds of :meth:`run_query`, in this
        process (no child start-up), without a row cap unless ``limits`` sets one.

        Raises
        ------
        QueryError
            If ``sql`` is not a single plain SELECT over the views, or fails.
        """
        if limits is None:
            limits = QueryConfig(max_rows=0)
        return self._run_in_process(sql, params, limits=limits).table


@dataclass
class QueryResult:
    """Outcome of :meth:`Store.run_query`."""

    #: The rows (at most ``max_rows``).
    table: pa.Table
    #: True when the query had more rows than ``max_rows`` and was cut.
    truncated: bool
    #: Wall-clock seconds, connection setup included.
    seconds: float
    #: Why it was cut: ``""``, ``"rows"`` (``max_rows``) or ``"bytes"`` (``max_result_mib``).
    cut: str = ""


def _create_view(con: duckdb.DuckDBPyConnection, name: str, src: str) -> None:
    raw = f"{name}_raw" if name == "alerts" else name
    con.execute(f"CREATE VIEW {raw} AS {src}")


def _create_derived_views(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE VIEW alerts AS SELECT * FROM alerts_raw "
        "QUALIFY row_number() OVER (PARTITION BY alert_id ORDER BY detected_at DESC) = 1"
    )
    con.execute(_SESSIONS_VIEW)


def _has_columns(path: str, want: pa.Schema) -> bool:
    """Whether the Parquet file ``path`` holds every column of ``want`` (one footer read)."""
    try:
        got = set(pq.read_schema(path).names)
    except Exception:  # unreadable: the view's own checks report it
        return True
    return all(n in got for n in want.names)


def _readable_as(path: str, want: pa.Schema) -> bool:
    """Whether ``path`` is Parquet whose shared columns cast to the dataset's types."""
    try:
        got = pq.read_schema(path)
        common = [n for n in got.names if n in want.names]
        if not common:
            raise ValueError("no column of the dataset")
        for n in common:
            src, dst = got.field(n).type, want.field(n).type
            if src != dst and not _same_family(src, dst):
                raise ValueError(f"column {n} is {src}, not {dst}")
    except Exception as exc:  # whatever is wrong, the file is not data
        _warn_once(path, f"not readable as this dataset's Parquet ({_first_line(exc)})")
        return False
    return True


def _same_family(a: pa.DataType, b: pa.DataType) -> bool:
    """Types DuckDB's union_by_name widens without changing a column's kind."""
    t = pa.types
    return any(
        f(a) and f(b)
        for f in (t.is_integer, t.is_floating, t.is_timestamp, t.is_string, t.is_large_string)
    ) or ((t.is_string(a) or t.is_large_string(a)) and (t.is_string(b) or t.is_large_string(b)))


_WARNED: set[str] = set()


def _warn_once(path: str, why: str) -> None:
    if path not in _WARNED and len(_WARNED) < 10_000:
        _WARNED.add(path)
        log.warning("store: skipping %s: %s", path, why)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _query_failure(exc: BaseException, limits: QueryConfig) -> str:
    """One line saying why a query failed (no traceback, limits named)."""
    if isinstance(exc, duckdb.OutOfMemoryException):
        return (
            f"query ran out of memory (query.memory_limit_mb = {limits.memory_limit_mb}): "
            f"{_first_line(exc)}"
        )
    if isinstance(exc, MemoryError):
        return "query ran out of memory while collecting its result (lower query.max_rows)"
    return _first_line(exc)


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
            rel = _renderable(rel)
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


def _renderable(rel: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
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


_SESSIONS_VIEW = """
CREATE VIEW sessions AS
WITH e AS (
  SELECT session_id,
         bool_or(session_derived) AS session_derived,
         min(ts) AS first_seen, max(ts) AS last_seen,
         count(*) AS calls,
         count(DISTINCT tool) AS distinct_tools,
         count(DISTINCT resource_id) AS distinct_resources,
         -- Each stored value is < 2^53, but a session's sum can pass 2^63: saturate
         -- instead of failing every query on the view with an overflow. Not least():
         -- DuckDB's least() skips NULLs, so a session that logged no bytes (sum NULL)
         -- would read 2^63-1 and outrank every real exfiltration.
         CAST(CASE WHEN sum(bytes) > 9223372036854775807 THEN 9223372036854775807
                   ELSE sum(bytes) END AS BIGINT) AS total_bytes,
         CAST(CASE WHEN sum(rows) > 9223372036854775807 THEN 9223372036854775807
                   ELSE sum(rows) END AS BIGINT) AS total_rows,
         count(*) FILTER (WHERE status = 'auth_failed') AS auth_failures,
         count(*) FILTER (WHERE status = 'not_found') AS not_found,
         count(*) FILTER (WHERE status = 'denied') AS denied,
         count(*) FILTER (WHERE is_error) AS errors,
         mode(caller_id) AS caller_id,
         mode(client_ip) AS client_ip,
         mode(server) AS server
  FROM events GROUP BY session_id
), s AS (
  SELECT session_id,
         arg_max(kind, ts) AS summary_kind,
         min(ts) AS s_ts, max(ts) AS s_last,
         max(call_count) AS s_calls, max(unique_resources) AS s_resources,
         max(total_bytes) AS s_bytes, max(auth_failures) AS s_auth_failures,
         any_value(caller_id) AS s_caller, any_value(client_ip) AS s_ip,
         any_value(server) AS s_server, max(duration_ms) AS s_duration_ms
  FROM summaries GROUP BY session_id
)
SELECT
  coalesce(e.session_id, s.session_id) AS session_id,
  CASE WHEN e.session_id IS NULL THEN 'summary'
       WHEN s.session_id IS NULL THEN 'events' ELSE 'both' END AS basis,
  coalesce(e.session_derived, false) AS session_derived,
  coalesce(e.caller_id, s.s_caller) AS caller_id,
  coalesce(e.client_ip, s.s_ip) AS client_ip,
  coalesce(e.server, s.s_server) AS server,
  -- A summary's duration is logged data: one absurd value (1e300 ms) must give a NULL
  -- start for that session, not an overflow error for every query on the view.
  coalesce(e.first_seen,
           s.s_ts - to_microseconds(CASE WHEN s.s_duration_ms BETWEEN 0 AND 1e12
                                         THEN CAST(s.s_duration_ms * 1000 AS BIGINT) END),
           s.s_ts)
    AS first_seen,
  coalesce(e.last_seen, s.s_last) AS last_seen,
  greatest(coalesce(e.calls, 0), coalesce(s.s_calls, 0)) AS calls,
  e.distinct_tools,
  greatest(coalesce(e.distinct_resources, 0), coalesce(s.s_resources, 0)) AS distinct_resources,
  greatest(coalesce(e.total_bytes, 0), coalesce(s.s_bytes, 0)) AS total_bytes,
  e.total_rows,
  greatest(coalesce(e.auth_failures, 0), coalesce(s.s_auth_failures, 0)) AS auth_failures,
  e.not_found, e.denied, e.errors,
  s.summary_kind
FROM e FULL OUTER JOIN s ON e.session_id = s.session_id
"""


def _sql_list(items: list[str]) -> str:
    """SQL list literal of store-owned file paths (quotes escaped; never log data)."""
    return "[" + ", ".join("'" + i.replace("'", "''") + "'" for i in items) + "]"


#: Rows per Parquet row group of the store's files (batch ingest, compaction).
ROW_GROUP_ROWS = 256_000

#: Rows per row group of a live commit's files (with :data:`LIVE_PAGE_BYTES`). What
#: pyarrow's writer holds while it writes is pages, not row groups: with its 1 MiB data
#: pages a 10k-event commit rose the RSS 8.3 MiB in groups of 4,096 rows; in pages of
#: 256 KiB one group of up to 16,384 rows rises it 5.2 MiB (15k events: 7.0 -> 5.7 MiB;
#: 30k: 6.6 -> 9.4), and a group's fixed cost per column is paid once per commit instead
#: of 3-4 times: 10k events 27.4 -> 22.3 CPU-ms, 15k 35.6 -> 31.2, files 1-2% smaller.
#: Compaction rewrites these files with :data:`ROW_GROUP_ROWS` and 1 MiB pages anyway.
LIVE_ROW_GROUP_ROWS = 16_384

#: Data page size of a live commit's files (pyarrow's default: 1 MiB); see above.
LIVE_PAGE_BYTES = 256 * 1024


def _write_parquet(tbl: pa.Table, path: str | Path, row_group_rows: int = ROW_GROUP_ROWS,
                   page_bytes: int | None = None, filesystem: Any = None) -> None:
    """One data file: zstd; dictionaries on repeating strings; no statistics on free text.

    Times and sizes are near-unique per row too, so they keep plain encoding; they keep
    their statistics (time-range pruning). ``page_bytes``: data page size (None:
    pyarrow's default, 1 MiB).
    """
    repeat = [f.name for f in tbl.schema if f.name not in schema.UNIQUE_COLUMNS]
    strings = [n for n in repeat if pa.types.is_string(tbl.schema.field(n).type)]
    stats = [*repeat, "event_id"] if "event_id" in tbl.schema.names else repeat
    pq.write_table(
        tbl,
        path,
        compression="zstd",
        row_group_size=row_group_rows,
        use_dictionary=strings,
        write_statistics=stats,
        data_page_size=page_bytes,
        filesystem=filesystem,
    )


def _streams_rows(cps: list[Checkpoint], writer: str) -> pa.Table:
    """The ``streams`` rows of a commit (built by polars: ``pa.array`` on Python lists
    imports pandas, ~0.2 s of a short command's first batch)."""
    import polars as pl

    return pl.DataFrame({
        "source_fp": [c.source_fp for c in cps],
        "source": [c.source for c in cps],
        "end_offset": [c.end_offset for c in cps],
        "committed_at": [time.time_ns() // 1000] * len(cps),
        "writer": [writer] * len(cps),
    }, schema={"source_fp": pl.String, "source": pl.String, "end_offset": pl.Int64,
               "committed_at": pl.Int64, "writer": pl.String}).to_arrow().cast(schema.STREAMS)


def _location(root: Path) -> Location:
    """Where the store's tables are: ``root`` itself, or what ``_state/tables.json``
    names (an ``s3://`` store; see :func:`toolwatch.config.locate_store`)."""
    import orjson

    pointer = root / "_state" / "tables.json"
    if pointer.is_file() and not pointer.is_symlink():
        try:
            spec = orjson.loads(pointer.read_bytes())
            return Location(str(spec["uri"]), str(spec.get("endpoint_url") or ""),
                            str(spec.get("region") or ""), bool(spec.get("allow_http")))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise StoreError(f"unreadable {pointer}: {exc}") from exc
    return Location(os.path.abspath(root))


def _conform(tbl: pa.Table, want: pa.Schema) -> pa.Table:
    """``tbl`` with exactly ``want``'s columns: ones a file predates are null."""
    for f in want:
        if f.name not in tbl.column_names:
            tbl = tbl.append_column(f.name, pa.nulls(tbl.num_rows, f.type))
    return tbl.select(want.names).cast(want)


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


#: Names the layout before Delta tables used (the old reader read exactly these):
#: ``<dataset>/date=<day>/part-<batch>-<n>.parquet``.
_OLD_PARTITION_DIR = re.compile(r"date=[0-9A-Za-z+-]+")
_OLD_DATA_FILE = re.compile(r"part-[A-Za-z0-9_-]+\.parquet")


def legacy_layout(root: str | Path) -> bool:
    """Whether ``root`` holds a store in the layout before Delta tables, or one whose
    :func:`migrate` did not finish.

    That is: a dataset folder with ``date=`` folders and no ``_delta_log``, or ``date=``
    folders and the old ``_state/checkpoints.json`` while the ``streams`` table (which
    :func:`migrate` creates last) does not exist yet.
    """
    root = Path(root)
    old_dirs = False
    for name in DATASETS:
        d = root / name
        try:
            with os.scandir(d) as it:
                has_dates = any(_OLD_PARTITION_DIR.fullmatch(e.name) for e in it)
        except OSError:
            continue
        if has_dates and not (d / "_delta_log").exists():
            return True
        old_dirs = old_dirs or has_dates
    # Every table converted but not ``streams``: an interrupted migration (the old
    # checkpoints are renamed only at its end). A FIFO or link planted under the old name
    # in a store that never had the old layout (no ``date=`` folders) counts for nothing.
    try:
        cp_regular = _is_regular(os.lstat(root / "_state" / "checkpoints.json").st_mode)
    except OSError:
        cp_regular = False
    return old_dirs and cp_regular and not (root / "streams" / "_delta_log").exists()


def migrate(root: str | Path, progress: Any = None, warn: Any = None) -> dict[str, int]:
    """Convert a store of the layout before Delta tables in place.

    Each dataset's Parquet files become version 0 of its Delta table, in one commit that
    also holds the old checkpoints as application transactions (the files stay where they
    are: no copy). Then the ``streams`` table gets one row per old checkpoint, so
    :meth:`Store.checkpoints` resumes where the old store did. ``streams`` is created
    last: until it exists the store still counts as unconverted
    (:func:`legacy_layout`), and running again finishes an interrupted migration —
    each table's creation is atomic, so no file is ever adopted twice.

    Only what the old reader read is adopted: ``date=*/part-*.parquet`` plain files whose
    footer reads as the dataset's Parquet. Nothing is followed: a symlink in a data
    folder (a file or a ``date=`` folder) is moved to ``_state/rejected`` (a Delta
    vacuum that lists the folder must never reach through it), other files are left in
    place, never read. Old staging batches that committed but were never applied are
    kept under ``_state/rejected`` (their streams resume from the old checkpoint, so
    reading the sources again stores them); other staging leftovers are deleted.

    Parameters
    ----------
    root
        The store's directory (local only: the old layout never was on object storage).
    progress
        Called as ``progress(table, n)`` after each table: files adopted (``streams``:
        checkpoints carried over).
    warn
        Called with one line per thing left out or set aside (default: logged).

    Returns
    -------
    dict[str, int]
        Table -> files adopted (``streams``: checkpoints carried over), for the tables
        this call created; empty when the store was already converted.

    Raises
    ------
    StoreError
        When the old checkpoints cannot be read safely (a link, a FIFO, not the old
        format): nothing is converted then, since without them every stream would be
        stored again from its start.
    """
    from deltalake import CommitProperties, Schema, Transaction
    from deltalake.transaction import AddAction, create_table_with_add_actions

    from toolwatch.tables import TABLE_CONFIG

    root = Path(root)
    if not legacy_layout(root):
        return {}

    def note(msg: str) -> None:
        if warn is not None:
            warn(msg)
        else:
            log.warning("store %s: %s", root, msg)

    rejected = root / "_state" / "rejected"
    cps = _old_checkpoints(root)
    txns = [Transaction(fp, end) for fp, (_src, end) in cps.items()] or None

    def create(name: str, sch: pa.Schema, adds: list[Any]) -> bool:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        try:
            create_table_with_add_actions(
                str(d), Schema.from_arrow(sch), adds, mode="error",
                configuration=TABLE_CONFIG,
                commit_properties=CommitProperties(
                    app_transactions=txns, custom_metadata={"toolwatch": "migrate"}),
            )
        except Exception as exc:
            if (d / "_delta_log").is_dir():  # a concurrent migrate created it first
                return False
            raise StoreError(f"cannot create table {d}: {_first_line(exc)}") from exc
        return True

    out: dict[str, int] = {}
    for name in DATASETS:
        d = root / name
        if (d / "_delta_log").exists():
            continue  # created by an earlier run: its one commit holds every file
        sch = schema.DATASETS[name]
        adds = []
        for part, f in _old_data_files(d, rejected, note):
            try:
                st = os.stat(f, follow_symlinks=False)
                if not _is_regular(st.st_mode) or not _readable_as(f, sch):
                    raise ValueError("not this dataset's Parquet")
                rows = pq.read_metadata(f).num_rows
            except (OSError, ValueError, pa.ArrowException) as exc:
                note(f"{name}: left out {part}/{os.path.basename(f)} ({_first_line(exc)})")
                continue
            adds.append(AddAction(f"{part}/{os.path.basename(f)}", st.st_size, {},
                                  st.st_mtime_ns // 1_000_000, True,
                                  f'{{"numRecords":{rows}}}'))
        if create(name, sch, adds):
            out[name] = len(adds)
            if progress:
                progress(name, len(adds))

    d = root / "streams"
    if not (d / "_delta_log").exists():
        adds = []
        if cps:
            d.mkdir(parents=True, exist_ok=True)
            now_ms = int(time.time() * 1000)
            rows = pa.table({
                "source_fp": pa.array(list(cps), pa.string()),
                "source": pa.array([src for src, _ in cps.values()], pa.string()),
                "end_offset": pa.array([end for _, end in cps.values()], pa.int64()),
                "committed_at": pa.array([now_ms * 1000] * len(cps), schema.TS),
                "writer": pa.array(["migrate"] * len(cps), pa.string()),
            }, schema=schema.STREAMS)
            f = d / "part-migrated-checkpoints.parquet"
            _write_parquet(rows, f)
            adds.append(AddAction(f.name, f.stat().st_size, {}, now_ms, True,
                                  f'{{"numRecords":{rows.num_rows}}}'))
        if create("streams", schema.STREAMS, adds):
            out["streams"] = len(cps)
            if progress:
                progress("streams", len(cps))

    _retire_staging(root, rejected, note)
    cp_path = root / "_state" / "checkpoints.json"
    if cp_path.exists() and not cp_path.is_symlink():
        os.replace(cp_path, cp_path.with_name("checkpoints.json.migrated"))
    return out


def _old_checkpoints(root: Path) -> dict[str, tuple[str, int]]:
    """The old ``_state/checkpoints.json``: source_fp -> (source, end_offset)."""
    import orjson

    from toolwatch.safe_open import read_regular, store_owners

    path = root / "_state" / "checkpoints.json"
    if not path.exists() and not path.is_symlink():
        return {}
    hint = ("move it away to convert without checkpoints (every stream is then stored "
            "again from its start)")
    try:
        data = orjson.loads(read_regular(path, 1 << 30, owners=store_owners(root)))
    except (OSError, orjson.JSONDecodeError) as exc:  # UnsafeFile is an OSError
        raise StoreError(f"cannot read {path}: {_first_line(exc)}; {hint}") from exc
    if not isinstance(data, dict):
        raise StoreError(f"{path} is not the old checkpoints format; {hint}")
    out: dict[str, tuple[str, int]] = {}
    for fp, v in data.items():
        end = v.get("end_offset") if isinstance(v, dict) else None
        src = v.get("source", "") if isinstance(v, dict) else None
        if type(end) is not int or end < 0 or not isinstance(src, str):
            raise StoreError(f"{path}: malformed entry for stream {fp!r}; {hint}")
        out[fp] = (src, end)
    return out


def _old_data_files(d: Path, rejected: Path, note: Any) -> list[tuple[str, str]]:
    """(``date=`` folder name, file path) of every old data file name under ``d``, links
    never followed: a link found is moved to ``rejected`` instead."""
    out: list[tuple[str, str]] = []

    def entries(where: Path | str) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(where) as it:
                return sorted(it, key=lambda e: e.name)
        except OSError:
            return []

    for part in entries(d):
        if part.is_symlink():
            dest = _set_aside_link(part.path, rejected)
            note(f"{d.name}: moved the link {part.name} to {dest} (links are never followed)")
            continue
        if not (_OLD_PARTITION_DIR.fullmatch(part.name) and part.is_dir(follow_symlinks=False)):
            continue
        for e in entries(part.path):
            if e.is_symlink():
                dest = _set_aside_link(e.path, rejected)
                note(f"{d.name}: moved the link {part.name}/{e.name} to {dest} "
                     "(links are never followed)")
            elif _OLD_DATA_FILE.fullmatch(e.name):
                out.append((part.name, e.path))
            elif not e.name.startswith("."):
                note(f"{d.name}: left out {part.name}/{e.name} (not a data file name)")
    return out


def _set_aside_link(path: str, rejected: Path) -> str:
    """Move the link ``path`` itself (never its target) into ``rejected``."""
    from toolwatch.safe_open import set_aside

    dest = set_aside(path, rejected)
    if dest is None:  # cannot move it: at least it must not stay in a table's folder
        os.unlink(path)
        return "(deleted)"
    return dest


def _retire_staging(root: Path, rejected: Path, note: Any) -> None:
    """Remove the old ``_staging`` folder; keep it (in ``rejected``) if it holds batches
    that committed but were never applied."""
    import shutil

    staging = root / "_staging"
    if staging.is_symlink():
        os.unlink(staging)
        return
    if not staging.is_dir():
        return
    committed = [b.name for b in staging.iterdir()
                 if b.is_dir() and not b.is_symlink() and (b / "COMMIT.json").is_file()]
    if committed:
        rejected.mkdir(parents=True, exist_ok=True)
        dest = rejected / f"_staging.{time.time_ns()}"
        os.replace(staging, dest)
        note(f"kept {len(committed)} old staged batch(es) that were never applied in {dest}; "
             "their streams resume from the old checkpoints, so reading the sources again "
             "stores them")
    else:
        shutil.rmtree(staging)
