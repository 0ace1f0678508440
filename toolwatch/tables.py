"""The store's Delta Lake tables: exactly-once appends keyed by stream, bounded compaction.

Each dataset (``events``, ``summaries``, ``quarantine``, ``alerts``) is one Delta table in
``<store>/<dataset>/``, plus ``streams``: which streams exist and which process stores
them (a row when a writer first stores a stream, then a heartbeat; ``toolwatch status``
reads the writers from it). Delta's log (``_delta_log/``) is the only thing that makes a
file part of a table: a file a crashed writer left behind, or one planted in the folder,
is never read, and every reader that speaks Delta (delta-rs, polars, Spark, Trino, DuckDB over
:meth:`Table.files`) sees the same committed snapshot.

Exactly once, per table, across processes and machines. A batch that stores stream
``fp`` up to byte/message offset ``end`` commits with the Delta application transaction
``(fp, end)``. Before writing, the writer reads the table's transaction version for
``fp`` (how far this table already holds that stream) and keeps only rows at or beyond it,
so a batch replayed after a crash (re-read from an older checkpoint, maybe cut at other
boundaries) adds nothing twice. Two writers racing on one stream collide in Delta's
conflict check (same application id) and the loser filters again. A batch commits to
``events`` last (with the transactions alone when it has no event), so the ``events``
table's transaction versions are the resume points and never run ahead of another table.

The Parquet files themselves are written by :func:`toolwatch.store.write_parquet` (the
store's tuned encodings and live page sizes) and added to the table by
``create_write_transaction``; compaction merges small files in bounded groups and commits
the merged file and the removals in one transaction (``optimize`` has no per-step memory
or time bound, and a live process compacts a few merges per commit).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from toolwatch.errors import StoreError, first_line

log = logging.getLogger(__name__)

#: How long a commit's log entry is kept once a log checkpoint covers it. Every commit
#: and every refresh of a table lists its whole ``_delta_log`` folder (delta-rs on local
#: disk stats each entry), so the cost of a commit grows with the entries kept: measured
#: 4 ms per commit with a handful of entries, 16 ms at 1,000 and 84 ms at 6,600. Live mode
#: commits about once a second per table, so a retention of days made a day-old tail
#: commit for seconds. Application transactions (the resume points) live in the
#: checkpoints, so nothing toolwatch reads needs older entries; what is lost is Delta time
#: travel further back, and a Spark stream reading the table must keep up within it.
LOG_RETENTION = "interval 5 minutes"
#: Table properties of every table toolwatch creates: the log is checkpointed (and
#: cleaned, see :data:`LOG_RETENTION`) every 10 commits.
TABLE_CONFIG = {
    "delta.logRetentionDuration": LOG_RETENTION,
    "delta.checkpointInterval": "10",
}
#: The log retention of tables created before :data:`LOG_RETENTION` existed: a writer
#: sets such a table to :data:`LOG_RETENTION` (any other value is the operator's choice).
_OLD_LOG_RETENTION = "interval 2 days"
#: Writes one Parquet data file: (rows, path in the file system, pyarrow file system).
WriteFile = Callable[[pa.Table, str, Any], None]
#: Times a commit is retried after a conflict with a concurrent writer of the same stream.
_CONFLICT_RETRIES = 20


@dataclass
class Checkpoint:
    """How far a stream has been durably stored."""

    source_fp: str
    source: str
    end_offset: int


@dataclass
class Location:
    """Where the tables live: a local folder, or a prefix on S3-compatible storage.

    Parameters
    ----------
    uri
        An absolute local path, or ``s3://bucket/prefix``.
    endpoint_url, region, allow_http
        Object storage only: the S3 endpoint (empty: AWS, or ``$AWS_ENDPOINT_URL``), its
        region, and whether plain HTTP is allowed (a local test endpoint). Credentials
        come from the environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or a
        profile), never from a file of the store.
    """

    uri: str
    endpoint_url: str = ""
    region: str = ""
    allow_http: bool = False

    @property
    def remote(self) -> bool:
        return "://" in self.uri

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's options (credentials it reads from the environment itself)."""
        if not self.remote:
            return None
        opts = {
            # put-if-absent by ETag: concurrent writers on plain S3 need no lock service.
            "conditional_put": "etag",
        }
        endpoint = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL", "")
        if endpoint:
            opts["AWS_ENDPOINT_URL"] = endpoint
        if self.region or os.environ.get("AWS_REGION"):
            opts["AWS_REGION"] = self.region or os.environ["AWS_REGION"]
        if self.allow_http or endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
        return opts

    def filesystem(self) -> Any:
        """pyarrow's file system for the data files (local, or S3 with these options)."""
        import pyarrow.fs as pafs

        if not self.remote:
            return pafs.LocalFileSystem()
        endpoint = self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL", "")
        kwargs: dict[str, Any] = {}
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs["endpoint_override"] = host or scheme
            kwargs["scheme"] = scheme if host else ("http" if self.allow_http else "https")
        region = self.region or os.environ.get("AWS_REGION", "")
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs)

    def fs_path(self, uri: str) -> str:
        """A table file's URI as a path of :meth:`filesystem`."""
        return uri.split("://", 1)[1] if "://" in uri else uri


def writer_name() -> str:
    """``host:pid:nonce``: which process wrote a commit (``toolwatch status`` lists them)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Table:
    """One Delta table of the store, opened lazily and kept current.

    Parameters
    ----------
    location
        Where the store's tables are.
    name
        The table's folder under it.
    schema
        Its Arrow schema; the table is created with it on the first write.
    state_dir
        This machine's state folder (planted log entries are set aside there).
    """

    def __init__(self, location: Location, name: str, schema: pa.Schema, state_dir: Path):
        self.location = location
        self.uri = f"{location.uri.rstrip('/')}/{name}"
        #: The folder (local tables) or the file-system path of the prefix (object storage).
        self.path = Path(self.uri) if not location.remote else Path(location.fs_path(self.uri))
        self.schema = schema
        self.state_dir = state_dir
        self._fs: Any = None
        self._dt: Any = None
        # delta-rs table handles are not shared across threads (a live process commits on
        # one thread while its detector lists files on another).
        self._lock = threading.Lock()

    # ------------------------------------------------------------ opening
    def _open(self, create: bool) -> Any:
        try:
            return self._open_once(create)
        except StoreError:
            raise
        except Exception as exc:
            # A log entry no writer makes (a link, a FIFO, a file that is not JSON
            # lines) breaks every reader of the table: set such entries aside, once.
            if not self._set_aside_planted():
                raise StoreError(f"cannot read table {self.uri}: {first_line(exc)}") from exc
            self._dt = None
            try:
                return self._open_once(create)
            except Exception as exc2:
                raise StoreError(
                    f"cannot read table {self.uri}: {first_line(exc2)}") from exc2

    def _open_once(self, create: bool) -> Any:
        from deltalake import DeltaTable

        self._guard_checkpoint()
        if self._dt is not None:
            self._dt.update_incremental()
            return self._dt
        opts = self.location.storage_options()
        if not self.exists():
            if not create:
                return None
            for attempt in range(2):
                try:
                    DeltaTable.create(self.uri, schema=self.schema, mode="ignore",
                                      configuration=TABLE_CONFIG, storage_options=opts)
                    break
                except Exception as exc:  # another process created it first?
                    if DeltaTable.is_deltatable(self.uri, storage_options=opts):
                        break
                    # ...or a planted entry holds the first commit's name.
                    if attempt or not self._set_aside_planted(parse=False):
                        raise StoreError(f"cannot create table {self.uri}: {exc}") from exc
        self._dt = DeltaTable(self.uri, storage_options=opts)
        if create:
            self._shorten_log_retention(self._dt)
        return self._dt

    def _shorten_log_retention(self, dt: Any) -> None:
        """Set a table made with the old two-day log retention to :data:`LOG_RETENTION`.

        Once per handle a writer opens. A failure (another writer changed the metadata
        first) is left for the next writer: the table works either way, only slower.
        """
        key = "delta.logRetentionDuration"
        try:
            if dt.metadata().configuration.get(key) != _OLD_LOG_RETENTION:
                return
            dt.alter.set_table_properties({key: LOG_RETENTION})
            dt.update_incremental()
        except Exception as exc:
            log.debug("store: log retention of %s not changed: %s", self.uri, exc)

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = self.location.filesystem()
        return self._fs

    def file_path(self, name: str) -> str:
        """Where a data file of this table is, as a path of :attr:`fs`."""
        return f"{self.path}/{name}"

    def _new_file(self, rows: pa.Table, write_file: WriteFile) -> tuple[str, int, int]:
        """Write ``rows`` as a new data file; its name, size and mtime (ms)."""
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.parquet"
        where = self.file_path(name)
        # A local path goes to pyarrow as a path (its own file, no file-system stream).
        write_file(rows, where, self.fs if self.location.remote else None)
        info = self.fs.get_file_info(where)
        mtime = info.mtime_ns // 1_000_000 if info.mtime_ns else int(time.time() * 1000)
        return name, info.size, mtime

    def _drop_file(self, name: str) -> None:
        import contextlib

        with contextlib.suppress(OSError):
            self.fs.delete_file(self.file_path(name))

    def _guard_checkpoint(self) -> None:
        """Set aside a ``_last_checkpoint`` (and the checkpoint file it names) that is not
        a regular file, before delta-rs opens it.

        delta-rs opens ``_last_checkpoint`` on every load without checking its type: a FIFO
        planted there blocks the open forever, in a runtime thread no signal interrupts
        (every command on the store hung, collect and tail ignoring SIGTERM). Two
        ``lstat`` calls per open; version files are checked when an open fails
        (:meth:`_set_aside_planted`), since listings skip what is not a regular file.
        """
        if self.location.remote:
            return
        import orjson

        from toolwatch.safe_open import UnsafeFile, read_regular, set_aside

        log_dir = self.path / "_delta_log"
        last = log_dir / "_last_checkpoint"
        names = [last]
        try:
            info = orjson.loads(read_regular(last, 1 << 16))
            if isinstance(info, dict) and isinstance(info.get("version"), int):
                names.append(log_dir / f"{info['version']:020d}.checkpoint.parquet")
        except (OSError, UnsafeFile, orjson.JSONDecodeError):
            pass
        for path in names:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                log.error("store: setting aside %s: not a file a Delta writer makes", path)
                set_aside(path, self.state_dir / "rejected")

    def _set_aside_planted(self, parse: bool = True) -> int:
        """Move log entries that no Delta writer makes to ``_state/rejected``; how many.

        Commits are written whole (put-if-absent of a complete file), so a commit file
        that is a link, not a regular file, or not JSON lines was planted by whoever can
        write the store, never written by a writer that died. ``parse=False`` checks file
        types only (cheap: after a failed commit, whose version may be a planted FIFO that
        listings skip).
        """
        import orjson

        from toolwatch.safe_open import UnsafeFile, read_regular, set_aside

        moved = 0
        if self.location.remote:
            return 0  # an object store has no links or FIFOs; junk commits show as errors
        log_dir = self.path / "_delta_log"
        try:
            entries = list(os.scandir(log_dir))
        except OSError:
            return 0
        for e in entries:
            bad = e.is_symlink() or not e.is_file(follow_symlinks=False)
            if not bad and parse and e.name.endswith(".json"):
                try:
                    for line in read_regular(e.path, 1 << 30).splitlines():
                        if line.strip():
                            orjson.loads(line)
                except (OSError, UnsafeFile, orjson.JSONDecodeError):
                    bad = True
            if bad:
                log.error("store: setting aside %s: not a log entry a writer makes", e.path)
                if set_aside(e.path, self.state_dir / "rejected"):
                    moved += 1
        return moved

    def exists(self) -> bool:
        """Whether the table has a log (a ``_delta_log`` folder without one is not)."""
        if not self.location.remote and not (self.path / "_delta_log").is_dir():
            return False
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.uri, storage_options=self.location.storage_options())

    # ------------------------------------------------------------ reading
    def files(self) -> list[str]:
        """The table's current data files (its latest snapshot): absolute paths of a
        local table, URIs on object storage."""
        with self._lock:
            dt = self._open(create=False)
            return [] if dt is None else [_local(u) for u in dt.file_uris()]

    def versions(self, fps: Iterable[str]) -> dict[str, int]:
        """Stream id -> how far this table holds it (absent: nothing stored yet)."""
        with self._lock:
            dt = self._open(create=False)
            if dt is None:
                return {}
            out = {}
            for fp in fps:
                v = dt.transaction_version(fp)
                if v is not None:
                    out[fp] = v
            return out

    def read(self) -> pa.Table:
        """Every current row (small tables only: ``streams``)."""

        files = self.files()
        if not files:
            return pa.Table.from_batches([], schema=self.schema)
        return pa.concat_tables(
            [self.read_file(self.location.fs_path(f)).select(self.schema.names)
             .cast(self.schema) for f in files]
        )

    def read_file(self, path: str) -> pa.Table:
        """One data file's rows (``path`` in :attr:`fs`). Not ``pq.read_table``: its
        dataset layer imports pandas (~0.2 s of a short command)."""
        import pyarrow.parquet as pq

        with self.fs.open_input_file(path) as fh:
            return pq.ParquetFile(fh).read()

    def actions(self) -> tuple[int | None, pa.Table | None]:
        """The snapshot's version and its add actions (path, size_bytes, num_records, ...);
        ``(None, None)`` when the table does not exist yet."""
        with self._lock:
            dt = self._open(create=False)
            if dt is None:
                return None, None
            # Through the Arrow stream interface: pa.table() would import pandas.
            acts = pa.RecordBatchReader.from_stream(dt.get_add_actions(flatten=True)).read_all()
            return dt.version(), acts

    def sizes(self) -> list[tuple[str, int]]:
        """(path relative to the table, bytes) of every current data file."""
        _, acts = self.actions()
        if acts is None:
            return []
        return list(zip(acts["path"].to_pylist(), acts["size_bytes"].to_pylist(), strict=True))

    # ------------------------------------------------------------ writing
    def append(
        self,
        tbl: pa.Table,
        checkpoints: list[Checkpoint],
        write_file: WriteFile,
        *,
        writer: str,
        filter_replayed: bool,
    ) -> int:
        """Add ``tbl``'s rows in one commit that also records ``checkpoints``.

        With ``filter_replayed``, rows of a checkpointed stream below the offset this table
        already holds for it are dropped first (``source_fp``/``offset`` columns). Returns
        the number of rows committed.
        """
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        txns = [Transaction(c.source_fp, c.end_offset) for c in checkpoints]
        meta = {"writer": writer}
        for attempt in range(_CONFLICT_RETRIES):
            with self._lock:
                dt = self._open(create=True)
                done = {c.source_fp: dt.transaction_version(c.source_fp) for c in checkpoints}
            rows = _unstored(tbl, done) if filter_replayed else tbl
            # A stream every table already holds this far: nothing to commit, not even the
            # transaction (a no-op replay must not move anything).
            if rows.num_rows == 0 and all(
                (done.get(c.source_fp) or -1) >= c.end_offset for c in checkpoints
            ):
                return 0
            actions = []
            name = ""
            if rows.num_rows:
                name, size, mtime = self._new_file(rows, write_file)
                actions.append(AddAction(name, size, {}, mtime, True,
                                         f'{{"numRecords":{rows.num_rows}}}'))
            try:
                # No refresh here: the snapshot read above (which includes this handle's
                # own last commit) is the commit's read version, and Delta's conflict
                # check rejects a commit of the same stream by anyone since then.
                with self._lock:
                    dt.create_write_transaction(
                        actions, "append", self.schema,
                        commit_properties=CommitProperties(
                            app_transactions=txns or None, custom_metadata=meta,
                        ),
                    )
                return rows.num_rows
            except CommitFailedError as exc:
                # Another writer committed the same stream meanwhile: read again, filter again.
                self._set_aside_planted(parse=False)
                if name:
                    self._drop_file(name)
                if attempt == _CONFLICT_RETRIES - 1:
                    raise StoreError(f"cannot commit to {self.uri}: {exc}") from exc
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def replace(self, old: list[tuple[str, int]], merged: pa.Table,
                write_file: WriteFile, *, writer: str) -> bool:
        """Swap the files ``old`` (relative path, size) for one file of ``merged``.

        One commit adds the merged file and removes the others (``dataChange = false``:
        readers see the same rows). Returns False, leaving the table as it was, when a
        concurrent compaction removed one of the files first.
        """
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, RemoveAction

        name, size, now = self._new_file(merged, write_file)
        actions: list[Any] = [AddAction(name, size, {}, now, False,
                                        f'{{"numRecords":{merged.num_rows}}}')]
        actions += [RemoveAction(p, False, now, size) for p, size in old]
        try:
            with self._lock:
                dt = self._open(create=True)
                dt.create_write_transaction(
                    actions, "append", self.schema,
                    commit_properties=CommitProperties(
                        custom_metadata={"writer": writer, "toolwatch": "compact"}),
                )
        except CommitFailedError:
            self._set_aside_planted(parse=False)
            self._drop_file(name)
            return False
        return True

    def vacuum(self, retention_hours: float) -> int:
        """Delete files no snapshot younger than ``retention_hours`` reads; returns how many."""
        with self._lock:
            dt = self._open(create=False)
            if dt is None:
                return 0
            # delta-rs takes whole hours: rounded up, so a file is never deleted early.
            gone = dt.vacuum(retention_hours=max(0, math.ceil(retention_hours)), dry_run=False,
                             enforce_retention_duration=False)
        return len(gone)


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _unstored(tbl: pa.Table, done: dict[str, int | None]) -> pa.Table:
    """Rows of ``tbl`` not yet in the table: per stream, offset >= what the table holds.

    Copies only when a row is dropped: a filter copies every column (the raw lines most
    of all), and in the usual case (no replay) nothing is below what the table holds.
    """
    held = {fp: v for fp, v in done.items() if v is not None}
    if not held or tbl.num_rows == 0:
        return tbl
    # A data row at offset o belongs to a batch ending after o; a streams row is the end.
    col, keep_if = ("offset", pc.greater_equal) if "offset" in tbl.column_names else (
        "end_offset", pc.greater)
    low = pc.min(tbl[col]).as_py()
    top = max(held.values())
    if low is not None and (low > top or (low == top and col == "offset")):
        return tbl  # every row is beyond every stream's stored offset
    drop = None
    for fp, v in held.items():
        cond = pc.and_(pc.equal(tbl["source_fp"], fp), pc.invert(keep_if(tbl[col], v)))
        drop = cond if drop is None else pc.or_(drop, cond)
    drop = pc.fill_null(drop, False)
    if not pc.any(drop).as_py():
        return tbl
    return tbl.filter(pc.invert(drop))
