"""The forensic store: Delta Lake tables of Parquet files, read through DuckDB views.

:class:`Store` writes, checkpoints, compacts and vacuums the tables and defines views over
their validated files (:meth:`Store.connect`). Guarded, bounded SQL over the views is
:mod:`toolwatch.query`; converting a store of the layout before Delta tables,
:mod:`toolwatch.store_migrate`.

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
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from toolwatch import schema
from toolwatch.errors import StoreError, first_line
from toolwatch.tables import Checkpoint, Location, Table, writer_name

__all__ = ["Checkpoint", "Store"]

log = logging.getLogger(__name__)

DATASETS = ("events", "summaries", "quarantine", "alerts")
#: (path, size, mtime, inode) -> whether the file is a readable data file of its dataset.
#: Committed files are immutable (compaction writes new names), so one footer read each.
_VALID_CACHE: dict[tuple[str, int, int, int], bool] = {}
#: Attempts a reader makes when a file it listed was removed by a compaction's vacuum.
READ_RETRIES = 5


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
    #: ``[detectors.incidents]`` settings of the query connections' ``incidents`` view
    #: (:mod:`toolwatch.query`; None: the defaults). A command that loaded a config sets it.
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
        from toolwatch.store_migrate import legacy_layout  # it imports this module

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
            write_parquet(tbl, path, row_group_rows or ROW_GROUP_ROWS, page_bytes, fs)

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
            if not table.replace(group, merged, lambda t, path, fs: write_parquet(
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
                warn_once(path, "outside the table's folder")
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue  # vacuumed meanwhile
            if not is_regular(st.st_mode):
                warn_once(path, "not a plain file")
                continue
            key = (path, st.st_size, st.st_mtime_ns, st.st_ino)
            ok = _VALID_CACHE.get(key)
            if ok is None:
                ok = readable_as(path, schema.DATASETS[dataset])
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
        own SQL (analyze, live). Analysts' SQL goes through :mod:`toolwatch.query`.
        """
        # Creating a view binds its file list; a compaction can delete a listed file
        # between listing and binding. Listing again is enough: the merged file is in place.
        for attempt in range(READ_RETRIES):
            con = duckdb.connect(config={"threads": 2})
            try:
                con.execute("SET TimeZone = 'UTC'")
                self.create_views(con)
                return con
            except duckdb.IOException:
                con.close()
                if attempt == READ_RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def create_views(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Create every view of :meth:`connect` on ``con``; returns the data files they read."""
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
                    f"SELECT * FROM read_parquet({sql_list(files)}, "
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


def readable_as(path: str, want: pa.Schema) -> bool:
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
        warn_once(path, f"not readable as this dataset's Parquet ({first_line(exc)})")
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


def warn_once(path: str, why: str) -> None:
    """Log once per path that it is skipped (a planted file would otherwise warn on
    every read)."""
    if path not in _WARNED and len(_WARNED) < 10_000:
        _WARNED.add(path)
        log.warning("store: skipping %s: %s", path, why)



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


def sql_list(items: list[str]) -> str:
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


def write_parquet(tbl: pa.Table, path: str | Path, row_group_rows: int = ROW_GROUP_ROWS,
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


def is_regular(mode: int) -> bool:
    """Whether an ``lstat`` mode is a plain file (not a link, FIFO or device)."""
    import stat

    return stat.S_ISREG(mode)
