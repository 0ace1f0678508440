"""The forensic store: Parquet datasets, atomic batch commits, DuckDB views.

Layout under ``data_dir``::

    events/date=YYYY-MM-DD/part-<batch>-<n>.parquet      normalized tool calls
    summaries/date=.../part-...parquet                     SESSION_END / SESSION_ANOMALY
    quarantine/date=.../part-...parquet                    lines that could not be events
    alerts/date=.../part-...parquet                        alert versions (latest wins)
    _state/checkpoints.json                                per-stream resume offsets
    _staging/<batch>/                                      a batch being committed

Why no DuckDB database file: DuckDB allows one writer process per database file and
readers of a file being written block or fail. Here writers only ever add immutable
Parquet files (written to staging, then renamed into place: a reader sees a whole file or
none), and every reader opens its own in-memory DuckDB with views over the files. So
``ingest``/``tail`` write while ``query`` and the dashboard read, and none locks another.

A batch commits in three steps — data files to ``_staging/<batch>/``, then a
``COMMIT.json`` naming them and the checkpoints they advance, then renames into the
datasets and the checkpoint update. A writer killed at any point leaves either nothing
(no COMMIT: the staging dir is discarded) or a batch that the next writer rolls forward.
Event ids are deterministic (stream fingerprint + offset) and compaction de-duplicates
on them, so even a replayed batch cannot double-count.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from toolwatch import schema
from toolwatch.errors import QueryError, StoreError

DATASETS = ("events", "summaries", "quarantine", "alerts")
#: Attempts a reader makes when a file it listed was replaced by a compaction.
_RETRIES = 5
#: Column whose date partitions each dataset.
_PARTITION_COL = {
    "events": "ts",
    "summaries": "ts",
    "quarantine": "ingested_at",
    "alerts": "first_seen",
}


@dataclass
class Checkpoint:
    """How far a stream has been durably stored."""

    source_fp: str
    source: str
    end_offset: int


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Store:
    """Append-only Parquet store with atomic batch commits.

    Parameters
    ----------
    data_dir
        Root directory; created if missing.
    compact_min_files
        Partitions with at least this many files are compacted by :meth:`compact`.
    """

    #: Files smaller than this are merged by :meth:`compact`.
    SMALL_FILE_BYTES = 1024 * 1024
    #: Upper bound of input bytes one merge reads (bounds compaction memory).
    COMPACT_MAX_BYTES = 64 * 1024 * 1024

    def __init__(self, data_dir: str | Path, *, compact_min_files: int = 16):
        self.root = Path(data_dir)
        self.compact_min_files = compact_min_files
        self._writer_id: str | None = None
        self._writer_lock: Any = None
        self._seq = 0
        try:
            for d in (*DATASETS, "_state", "_staging"):
                (self.root / d).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store at {self.root}: {exc}") from exc

    # ------------------------------------------------------------ writer side
    def _ensure_writer(self) -> str:
        """Register this process as a writer (flock held for its lifetime), recover others."""
        if self._writer_id is None:
            wid = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            lock_path = self.root / "_staging" / f"{wid}.lock"
            fh = open(lock_path, "w")  # noqa: SIM115 - held open for the process lifetime
            fcntl.flock(fh, fcntl.LOCK_EX)
            self._writer_lock = fh
            self._writer_id = wid
            self.recover()
        return self._writer_id

    @contextlib.contextmanager
    def _state_lock(self) -> Iterator[None]:
        with open(self.root / "_state" / "lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def recover(self) -> int:
        """Finish or discard batches of writers that died mid-commit.

        Returns the number of staging directories handled.
        """
        staging = self.root / "_staging"
        handled = 0
        with self._state_lock():
            for lock in staging.glob("*.lock"):
                wid = lock.stem
                if wid == self._writer_id:
                    continue
                with open(lock, "a") as fh:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # that writer is alive
                    for bdir in sorted(staging.glob(f"{wid}_*")):
                        if (bdir / "COMMIT.json").exists():
                            self._roll_forward(bdir)
                        else:
                            shutil.rmtree(bdir, ignore_errors=True)
                        handled += 1
                lock.unlink(missing_ok=True)
        return handled

    def write_batch(
        self,
        tables: dict[str, pa.Table],
        checkpoints: list[Checkpoint] | None = None,
        *,
        replaces: list[str] | None = None,
    ) -> str:
        """Atomically add rows to datasets and advance stream checkpoints.

        Parameters
        ----------
        tables
            Dataset name -> rows with exactly that dataset's schema. Empty tables are skipped.
        checkpoints
            Streams whose offsets this batch completes.
        replaces
            Store-relative files this batch supersedes (compaction); deleted on commit.

        Returns
        -------
        str
            The batch id.
        """
        wid = self._ensure_writer()
        self._seq += 1
        batch_id = f"{time.time_ns():020d}{self._seq:06d}"
        bdir = self.root / "_staging" / f"{wid}_{batch_id}"
        bdir.mkdir(parents=True)
        files: list[dict[str, str]] = []
        try:
            for name, tbl in tables.items():
                if name not in DATASETS:
                    raise StoreError(f"unknown dataset {name!r}")
                if tbl is None or tbl.num_rows == 0:
                    continue
                tbl = tbl.select(schema.DATASETS[name].names).cast(schema.DATASETS[name])
                for day, part in _split_by_day(tbl, _PARTITION_COL[name]):
                    fname = f"part-{batch_id}-{len(files):03d}.parquet"
                    _write_parquet(part, bdir / fname)
                    files.append({"tmp": fname, "dest": f"{name}/date={day}/{fname}"})
            commit = {
                "batch_id": batch_id,
                "files": files,
                "checkpoints": [c.__dict__ for c in (checkpoints or [])],
                "replaces": replaces or [],
            }
            tmp = bdir / "COMMIT.json.tmp"
            with open(tmp, "wb") as fh:
                fh.write(orjson.dumps(commit))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, bdir / "COMMIT.json")
        except OSError as exc:
            shutil.rmtree(bdir, ignore_errors=True)
            raise StoreError(f"cannot write batch to {self.root}: {exc}") from exc
        with self._state_lock():
            self._roll_forward(bdir)
        return batch_id

    def _roll_forward(self, bdir: Path) -> None:
        """Apply a committed staging dir: move files in, update checkpoints, clean up."""
        commit = orjson.loads((bdir / "COMMIT.json").read_bytes())
        for f in commit["files"]:
            dest = self.root / f["dest"]
            src = bdir / f["tmp"]
            if src.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)
                _fsync_dir(dest.parent)
        if commit["checkpoints"]:
            state = self._read_checkpoints()
            for c in commit["checkpoints"]:
                prev = state.get(c["source_fp"])
                if prev is None or c["end_offset"] > prev["end_offset"]:
                    state[c["source_fp"]] = {
                        "source": c["source"],
                        "end_offset": c["end_offset"],
                        "updated_at": time.time(),
                    }
            path = self.root / "_state" / "checkpoints.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_bytes(orjson.dumps(state, option=orjson.OPT_INDENT_2))
            os.replace(tmp, path)
        for rel in commit.get("replaces", []):
            (self.root / rel).unlink(missing_ok=True)
        shutil.rmtree(bdir, ignore_errors=True)

    def _read_checkpoints(self) -> dict[str, dict[str, Any]]:
        path = self.root / "_state" / "checkpoints.json"
        if not path.exists():
            return {}
        return orjson.loads(path.read_bytes())

    def checkpoints(self) -> dict[str, int]:
        """Stream fingerprint -> offset from which to resume."""
        return {fp: v["end_offset"] for fp, v in self._read_checkpoints().items()}

    def close(self) -> None:
        """Release the writer lock (its staging dir is empty after every commit)."""
        if self._writer_lock is not None:
            lock_path = Path(self._writer_lock.name)
            self._writer_lock.close()
            lock_path.unlink(missing_ok=True)
            self._writer_lock = None
            self._writer_id = None

    # ------------------------------------------------------------ compaction
    def compact(self, dataset: str = "events") -> int:
        """Merge small files per date partition, de-duplicating on the id column.

        Only files under :attr:`SMALL_FILE_BYTES` take part (live mode writes one small
        file per flush; batch ingest already writes large ones), and one merge reads at
        most :attr:`COMPACT_MAX_BYTES` of them, so memory stays bounded whatever the
        partition's size. Returns the number of merges done.
        """
        # One compactor per store at a time: two merging the same files would each write
        # a copy of the rows. Another process compacting means this one has nothing to do.
        with open(self.root / "_state" / "compact.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            return self._compact_locked(dataset)

    def _compact_locked(self, dataset: str) -> int:
        key = "alert_id" if dataset == "alerts" else "event_id"
        order = "detected_at" if dataset == "alerts" else "ingested_at"
        # Alerts keep every version (the view picks the latest); events keep one row per id.
        part_key = f"{key}, detected_at" if dataset == "alerts" else key
        done = 0
        for part_dir in sorted((self.root / dataset).glob("date=*")):
            small = [
                f
                for f in sorted(part_dir.glob("*.parquet"))
                if f.stat().st_size < self.SMALL_FILE_BYTES
            ]
            if len(small) < self.compact_min_files:
                continue
            group: list[Path] = []
            total = 0
            for f in small:
                group.append(f)
                total += f.stat().st_size
                if total >= self.COMPACT_MAX_BYTES:
                    break
            con = duckdb.connect()
            try:
                tbl = con.sql(
                    "SELECT * FROM read_parquet($files, union_by_name=true) "
                    f"QUALIFY row_number() OVER (PARTITION BY {part_key} ORDER BY {order}) = 1",
                    params={"files": [str(f) for f in group]},
                ).to_arrow_table()
            finally:
                con.close()
            tbl = tbl.select(schema.DATASETS[dataset].names).cast(schema.DATASETS[dataset])
            self.write_batch(
                {dataset: tbl}, replaces=[str(f.relative_to(self.root)) for f in group]
            )
            done += 1
        return done

    # ------------------------------------------------------------ reader side
    def files(self, dataset: str) -> list[str]:
        """Current Parquet files of a dataset."""
        return sorted(str(p) for p in (self.root / dataset).glob("date=*/*.parquet"))

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A fresh in-memory DuckDB connection with views over the store.

        Views: ``events``, ``summaries``, ``quarantine``, ``alerts`` (latest version of
        each alert), ``sessions`` (per-session figures from events, plus sessions known
        only from summaries). Open one per query or per dashboard rerun: views list the
        files that exist when the connection is made.
        """
        # Creating a view binds its file list; a compaction can delete a listed file
        # between listing and binding. Listing again is enough: the merged file is in place.
        for attempt in range(_RETRIES):
            con = duckdb.connect(config={"threads": 2})
            try:
                self._create_views(con)
                return con
            except duckdb.IOException:
                con.close()
                if attempt == _RETRIES - 1:
                    raise
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _create_views(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute("SET TimeZone = 'UTC'")
        for name in DATASETS:
            files = self.files(name)
            raw = f"{name}_raw" if name == "alerts" else name
            if files:
                con.execute(
                    f"CREATE VIEW {raw} AS SELECT * EXCLUDE (date) FROM read_parquet("
                    f"{_sql_list(files)}, hive_partitioning=true, union_by_name=true)"
                )
            else:
                con.register(f"_empty_{name}", schema.DATASETS[name].empty_table())
                con.execute(f"CREATE VIEW {raw} AS SELECT * FROM _empty_{name}")
        con.execute(
            "CREATE VIEW alerts AS SELECT * FROM alerts_raw "
            "QUALIFY row_number() OVER (PARTITION BY alert_id ORDER BY detected_at DESC) = 1"
        )
        con.execute(_SESSIONS_VIEW)

    def query(self, sql: str, params: dict[str, Any] | list[Any] | None = None) -> pa.Table:
        """Run a read-only query over the views and return an Arrow table.

        Raises
        ------
        QueryError
            If ``sql`` is not a single read-only statement, or fails.
        """
        check_read_only(sql)
        for attempt in range(_RETRIES):
            try:
                con = self.connect()
            except duckdb.IOException as exc:
                raise QueryError(str(exc).splitlines()[0]) from exc
            try:
                lock_down(con, self.root)
                if params is not None:
                    return con.sql(sql, params=params).to_arrow_table()
                return con.sql(sql).to_arrow_table()
            except duckdb.IOException as exc:
                # A compaction replaced a file between binding and reading: list again.
                if attempt == _RETRIES - 1:
                    raise QueryError(str(exc).splitlines()[0]) from exc
            except duckdb.Error as exc:
                raise QueryError(str(exc).splitlines()[0]) from exc
            finally:
                con.close()
        raise QueryError("unreachable")  # pragma: no cover


_SESSIONS_VIEW = """
CREATE VIEW sessions AS
WITH e AS (
  SELECT session_id,
         bool_or(session_derived) AS session_derived,
         min(ts) AS first_seen, max(ts) AS last_seen,
         count(*) AS calls,
         count(DISTINCT tool) AS distinct_tools,
         count(DISTINCT resource_id) AS distinct_resources,
         CAST(sum(bytes) AS BIGINT) AS total_bytes,
         CAST(sum(rows) AS BIGINT) AS total_rows,
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
  coalesce(e.first_seen,
           s.s_ts - to_microseconds(CAST(coalesce(s.s_duration_ms, 0) * 1000 AS BIGINT)))
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


def _write_parquet(tbl: pa.Table, path: Path) -> None:
    """One data file: zstd; dictionaries on repeating strings; no statistics on free text.

    Times and sizes are near-unique per row too, so they keep plain encoding; they keep
    their statistics (time-range pruning).
    """
    repeat = [f.name for f in tbl.schema if f.name not in schema.UNIQUE_COLUMNS]
    strings = [n for n in repeat if pa.types.is_string(tbl.schema.field(n).type)]
    stats = [*repeat, "event_id"] if "event_id" in tbl.schema.names else repeat
    pq.write_table(
        tbl,
        path,
        compression="zstd",
        row_group_size=256_000,
        use_dictionary=strings,
        write_statistics=stats,
    )


def _split_by_day(tbl: pa.Table, col: str) -> Iterator[tuple[str, pa.Table]]:
    days = pc.cast(tbl[col], pa.date32())
    uniq = pc.unique(days)
    if len(uniq) == 1:
        yield (str(uniq[0]) if uniq[0].is_valid else "unknown"), tbl
        return
    for d in uniq:  # Arrow scalars: a Python date here would import pandas (pa.scalar)
        mask = pc.equal(days, d) if d.is_valid else pc.is_null(days)
        yield (str(d) if d.is_valid else "unknown"), tbl.filter(mask)


_ALLOWED_STATEMENTS = {"SELECT", "EXPLAIN"}


def check_read_only(sql: str) -> None:
    """Reject anything but one SELECT (or EXPLAIN) statement.

    Raises
    ------
    QueryError
        For writes, ATTACH, COPY, PRAGMA, SET, multiple statements, or unparseable SQL.
    """
    try:
        stmts = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"cannot parse SQL: {str(exc).splitlines()[0]}") from exc
    if len(stmts) != 1:
        raise QueryError(f"exactly one statement expected, got {len(stmts)}")
    kind = stmts[0].type.name
    if kind not in _ALLOWED_STATEMENTS:
        raise QueryError(f"only read-only SELECT queries are allowed, got {kind}")


def lock_down(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """Forbid file access outside the store and further configuration changes.

    Defence in depth behind :func:`check_read_only`: even a SELECT cannot call
    ``read_csv('/etc/passwd')`` or write with table functions.
    """
    store = str(root.resolve()).replace("'", "''")
    con.execute(f"SET allowed_directories = ['{store}/']")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
