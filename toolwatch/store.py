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
import logging
import os
import re
import shutil
import threading
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
from toolwatch.config import QueryConfig, auto_count
from toolwatch.errors import QueryError, StoreError
from toolwatch.query_guard import check_query
from toolwatch.safe_open import UnsafeFile, open_regular, read_regular, set_aside, store_owners

log = logging.getLogger(__name__)

DATASETS = ("events", "summaries", "quarantine", "alerts")
#: Views every reader connection defines; the only names a forensic query may read.
VIEWS = ("events", "summaries", "quarantine", "alerts", "alerts_raw", "sessions", "incidents")
#: Data file names: the writer's ``part-<batch id>-<n>.parquet`` (no dots, no slashes).
_DATA_FILE = re.compile(r"part-[A-Za-z0-9_-]+\.parquet")
#: Date partition directories (``date=YYYY-MM-DD`` or ``date=unknown``).
_PARTITION_DIR = re.compile(r"date=[0-9A-Za-z+-]+")
#: (path, size, mtime, inode) -> whether the file is a readable data file of its dataset.
#: Committed files are immutable (compaction writes new names), so one footer read each.
_VALID_CACHE: dict[tuple[str, int, int, int], bool] = {}
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


class _UnsafeCommitError(Exception):
    """A staging batch's COMMIT.json names something outside the store (never applied)."""


def glob_escape(text: str) -> str:
    """``text`` with glob metacharacters made literal."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def _open_lock_file(path: Path, rejected_dir: Path) -> Any:
    """Open (creating) a lock file of the store for ``flock``, never following a link.

    ``O_NOFOLLOW | O_NONBLOCK`` and a regular-file check (:mod:`toolwatch.safe_open`): a
    FIFO planted under a lock's name made every writer hang in ``open(2)``, a symlink made
    it create or truncate the file it names. Such a file is set aside (logged) and the
    lock made afresh.
    """
    flags = os.O_WRONLY | os.O_CREAT
    try:
        fd = open_regular(path, flags, 0o644)
    except UnsafeFile as exc:
        log.error("store: setting aside %s: %s", path, exc.reason)
        set_aside(path, rejected_dir)
        fd = open_regular(path, flags, 0o644)
    fh = os.fdopen(fd, "w")
    fh.buffer.raw.name = str(path)  # type: ignore[attr-defined] # as open() names it
    return fh


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
    #: Upper bound of input bytes one merge reads (bounds compaction memory: a merge
    #: holds ~10x its Parquet bytes decompressed, plus DuckDB's sort; 64 MiB of live
    #: event files took a live process from ~530 MiB to 1.26 GiB RSS for a moment).
    COMPACT_MAX_BYTES = 4 * 1024 * 1024
    #: Rows per row group of a compaction's output (a merge of COMPACT_MAX_BYTES holds
    #: ~100k events): the Parquet writer buffers one row group encoded at a time.
    COMPACT_ROW_GROUP_ROWS = 32_768
    #: ``[detectors.incidents]`` settings of the ``incidents`` view (None: the defaults).
    #: A command that loaded a config sets it on its store.
    incident_config: Any = None

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
            fh = _open_lock_file(lock_path, self.root / "_state" / "rejected")
            fcntl.flock(fh, fcntl.LOCK_EX)
            self._writer_lock = fh
            self._writer_id = wid
            self.recover()
        return self._writer_id

    @contextlib.contextmanager
    def _state_lock(self) -> Iterator[None]:
        with _open_lock_file(self.root / "_state" / "lock",
                             self.root / "_state" / "rejected") as fh:
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
                if lock.is_symlink():
                    # Writers create plain files; a link here was planted. Opening it would
                    # create or touch whatever it points at.
                    log.error("store %s: removing symlinked lock file %s", self.root, lock.name)
                    lock.unlink(missing_ok=True)
                    continue
                try:
                    fd = open_regular(lock, os.O_WRONLY | os.O_APPEND)
                except UnsafeFile as exc:  # a FIFO hung every writer here
                    log.error("store %s: removing planted lock file %s: %s", self.root,
                              lock.name, exc.reason)
                    lock.unlink(missing_ok=True)
                    continue
                except OSError:
                    continue  # gone meanwhile
                with os.fdopen(fd, "a") as fh:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # that writer is alive
                    for bdir in sorted(staging.glob(f"{glob_escape(wid)}_*")):
                        if bdir.is_symlink() or not bdir.is_dir():
                            self._reject_batch(bdir, "not a plain directory")
                        elif (bdir / "COMMIT.json").exists():
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
        row_group_rows: int | None = None,
        page_bytes: int | None = None,
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
        row_group_rows
            Rows per Parquet row group (default :data:`ROW_GROUP_ROWS`). The writer holds
            a row group's encoded columns until it is complete, so a live commit's small
            files (merged later by compaction) use :data:`LIVE_ROW_GROUP_ROWS`.
        page_bytes
            Data page size of the files (default: pyarrow's, 1 MiB); live commits use
            :data:`LIVE_PAGE_BYTES` (less memory while writing, see there).

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
                    _write_parquet(part, bdir / fname, row_group_rows or ROW_GROUP_ROWS,
                                   page_bytes)
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
        """Apply a committed staging dir: move files in, update checkpoints, clean up.

        Everything the ``COMMIT.json`` names is checked before anything moves: sources must
        be plain files directly in ``bdir``, destinations and replaced files must lie in a
        dataset's date partition inside this store (symlinks resolved, no ``..``, no
        absolute paths). Staging is writable by whoever can write the store, so a forged
        batch must not be able to move or delete files elsewhere. A batch that fails the
        checks is set aside under ``_state/rejected/`` with a logged error, never applied.
        """
        try:
            # (a FIFO or link planted as COMMIT.json is refused: UnsafeFile is an OSError)
            commit = orjson.loads(read_regular(bdir / "COMMIT.json",
                                               owners=store_owners(self.root)))
            moves, replaces, checkpoints = self._validate_commit(bdir, commit)
        except (OSError, orjson.JSONDecodeError, _UnsafeCommitError) as exc:
            self._reject_batch(bdir, str(exc))
            return
        for src, dest in moves:
            if src.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)
                _fsync_dir(dest.parent)
        if checkpoints:
            state = self._read_checkpoints()
            for c in checkpoints:
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
        for path in replaces:
            path.unlink(missing_ok=True)
        shutil.rmtree(bdir, ignore_errors=True)

    def _validate_commit(
        self, bdir: Path, commit: Any
    ) -> tuple[list[tuple[Path, Path]], list[Path], list[dict[str, Any]]]:
        """The moves, deletions and checkpoints of a commit, or :class:`_UnsafeCommitError`."""
        if not isinstance(commit, dict):
            raise _UnsafeCommitError("COMMIT.json is not an object")
        files = commit.get("files", [])
        replaces = commit.get("replaces", []) or []
        checkpoints = commit.get("checkpoints", []) or []
        if not (isinstance(files, list) and isinstance(replaces, list)):
            raise _UnsafeCommitError("COMMIT.json files/replaces are not lists")
        if not isinstance(checkpoints, list):
            raise _UnsafeCommitError("COMMIT.json checkpoints is not a list")
        real_bdir = bdir.resolve()
        moves: list[tuple[Path, Path]] = []
        for f in files:
            if not isinstance(f, dict) or not isinstance(f.get("tmp"), str):
                raise _UnsafeCommitError("COMMIT.json file entry without a tmp name")
            tmp = f["tmp"]
            if not tmp or "/" in tmp or "\x00" in tmp or tmp in (".", "..", "COMMIT.json"):
                raise _UnsafeCommitError(f"staged file name {tmp!r} is not a plain file name")
            src = bdir / tmp
            if src.is_symlink() or src.resolve().parent != real_bdir:
                raise _UnsafeCommitError(f"staged file {tmp!r} is a link or outside the batch")
            moves.append((src, self._data_path(f.get("dest"))))
        good_cps = []
        for c in checkpoints:
            if not (
                isinstance(c, dict)
                and isinstance(c.get("source_fp"), str)
                and isinstance(c.get("source"), str)
                and type(c.get("end_offset")) is int
                and c["end_offset"] >= 0
            ):
                raise _UnsafeCommitError("COMMIT.json checkpoint entry is malformed")
            good_cps.append(c)
        return moves, [self._data_path(r) for r in replaces], good_cps

    def _data_path(self, rel: Any) -> Path:
        """``<dataset>/date=<day>/<part file>`` inside this store, resolved; else refuse."""
        if not isinstance(rel, str) or not rel or "\x00" in rel:
            raise _UnsafeCommitError(f"path {rel!r} is not a store path")
        parts = rel.split("/")
        if (
            os.path.isabs(rel)
            or len(parts) != 3
            or parts[0] not in DATASETS
            or not _PARTITION_DIR.fullmatch(parts[1])
            or not _DATA_FILE.fullmatch(parts[2])
        ):
            raise _UnsafeCommitError(f"path {rel!r} is outside the store's data folders")
        path = self.root / rel
        base = (self.root / parts[0]).resolve()
        # The partition dir may not exist yet: resolve what exists (a planted symlink
        # anywhere on the way shows here) and require the result under the dataset dir.
        real = path.parent.resolve() / parts[2]
        if real.parent.parent != base or path.parent.is_symlink() or path.is_symlink():
            raise _UnsafeCommitError(f"path {rel!r} resolves outside the store ({real})")
        return path

    def _reject_batch(self, bdir: Path, reason: str) -> None:
        """Set a staging batch aside (never applied, never followed) and log why."""
        dest_dir = self.root / "_state" / "rejected"
        log.error("store %s: refusing staging batch %s: %s", self.root, bdir.name, reason)
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
            os.replace(bdir, dest_dir / f"{bdir.name}.{time.time_ns()}")
        except OSError as exc:
            log.error("store %s: cannot set aside batch %s: %s", self.root, bdir.name, exc)

    def _read_checkpoints(self) -> dict[str, dict[str, Any]]:
        path = self.root / "_state" / "checkpoints.json"
        if not path.exists() and not path.is_symlink():
            return {}
        try:
            return orjson.loads(read_regular(path, 1 << 30, owners=store_owners(self.root)))
        except UnsafeFile as exc:
            # Planted (a FIFO hung every writer, a link named another file): set aside
            # and logged; the streams are then read again from their start.
            log.error("store %s: setting aside checkpoints: %s", self.root, exc.reason)
            set_aside(path, self.root / "_state" / "rejected")
            return {}

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
        file per flush; batch ingest already writes large ones), in merges of at most
        :attr:`COMPACT_MAX_BYTES` of them each, so memory stays bounded whatever the
        partition's size. Returns the number of merges done.
        """
        return self.compact_within(dataset, None)[0]

    def compact_within(self, dataset: str, budget_s: float | None) -> tuple[int, bool]:
        """:meth:`compact`, starting no merge once ``budget_s`` seconds have passed.

        The first merge always runs, so repeated calls always progress. Returns the
        number of merges done and whether mergeable groups were left for a later call.
        A live process compacts this way, a few merges per commit: one call over a
        backlog's hundreds of files held its commit thread (and so its alerts) for
        ~100 s.
        """
        deadline = None if budget_s is None else time.monotonic() + budget_s
        # One compactor per store at a time: two merging the same files would each write
        # a copy of the rows. Another process compacting means this one has nothing to do.
        with _open_lock_file(self.root / "_state" / "compact.lock",
                             self.root / "_state" / "rejected") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0, False
            return self._compact_locked(dataset, deadline)

    def _compact_locked(self, dataset: str, deadline: float | None) -> tuple[int, bool]:
        key = "alert_id" if dataset == "alerts" else "event_id"
        order = "detected_at" if dataset == "alerts" else "ingested_at"
        # Alerts keep every version (the view picks the latest); events keep one row per id.
        part_key = f"{key}, detected_at" if dataset == "alerts" else key
        done = 0
        by_dir: dict[Path, list[Path]] = {}
        for f in self.files(dataset):  # valid data files only: junk must not stop compaction
            by_dir.setdefault(Path(f).parent, []).append(Path(f))
        for _part_dir, part_files in sorted(by_dir.items()):
            small = [f for f in part_files if f.stat().st_size < self.SMALL_FILE_BYTES]
            if len(small) < self.compact_min_files:
                continue
            # Groups of at most COMPACT_MAX_BYTES, each merged on its own: a merge holds
            # its rows decompressed (~10x the Parquet bytes, plus DuckDB's sort), so the
            # group size, not the partition's, is compaction's memory.
            groups: list[list[Path]] = [[]]
            total = 0
            for f in small:
                size = f.stat().st_size
                if groups[-1] and total + size > self.COMPACT_MAX_BYTES:
                    groups.append([])
                    total = 0
                groups[-1].append(f)
                total += size
            for group in groups:
                if len(group) < 2:
                    continue
                if done and deadline is not None and time.monotonic() >= deadline:
                    return done, True
                self._merge(dataset, group, part_key, order)
                done += 1
        return done, False

    def _merge(self, dataset: str, group: list[Path], part_key: str, order: str) -> None:
        """Replace ``group`` by one file of its rows, de-duplicated on ``part_key``."""
        con = duckdb.connect()
        try:
            tbl = con.sql(
                "SELECT * FROM read_parquet($files, union_by_name=true) "
                f"QUALIFY row_number() OVER (PARTITION BY {part_key} ORDER BY {order}) = 1",
                params={"files": [str(f) for f in group]},
            ).to_arrow_table()
        finally:
            con.close()
        want = schema.DATASETS[dataset]
        for f in want:  # files from before a column was added: null there
            if f.name not in tbl.column_names:
                tbl = tbl.append_column(f.name, pa.nulls(tbl.num_rows, f.type))
        tbl = tbl.select(want.names).cast(want)
        # Row groups of COMPACT_ROW_GROUP_ROWS: the writer then holds one such group's
        # encoded columns at a time beside the merged rows, not the whole merge's.
        self.write_batch({dataset: tbl}, replaces=[str(f.relative_to(self.root)) for f in group],
                         row_group_rows=self.COMPACT_ROW_GROUP_ROWS)

    # ------------------------------------------------------------ reader side
    def files(self, dataset: str) -> list[str]:
        """Current data files of a dataset: only files that can be read as its Parquet.

        Only names the writer produces (``date=*/part-<batch>-<n>.parquet``), no symlinks,
        and each file's footer read once per process (files are immutable once committed)
        to check it is Parquet with the dataset's column types. A junk or foreign file
        dropped into a data folder is skipped with a logged warning instead of breaking
        every view.
        """
        base = self.root / dataset
        out: list[str] = []
        try:
            parts = [e for e in os.scandir(base) if _PARTITION_DIR.fullmatch(e.name)]
        except OSError:
            return []
        for part in parts:
            if not part.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(part.path))
            except OSError:
                continue
            for e in entries:
                if not _DATA_FILE.fullmatch(e.name) or not e.is_file(follow_symlinks=False):
                    if not e.name.startswith("."):
                        _warn_once(e.path, "not a data file name or not a plain file")
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # replaced by a compaction meanwhile
                key = (e.path, st.st_size, st.st_mtime_ns, st.st_ino)
                ok = _VALID_CACHE.get(key)
                if ok is None:
                    ok = _readable_as(e.path, schema.DATASETS[dataset])
                    if len(_VALID_CACHE) > 200_000:
                        _VALID_CACHE.clear()
                    _VALID_CACHE[key] = ok
                if ok:
                    out.append(e.path)
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
            if files:
                src = (
                    f"SELECT * EXCLUDE (date) FROM read_parquet({_sql_list(files)}, "
                    "hive_partitioning=true, union_by_name=true)"
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


def _write_parquet(tbl: pa.Table, path: Path, row_group_rows: int = ROW_GROUP_ROWS,
                   page_bytes: int | None = None) -> None:
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
