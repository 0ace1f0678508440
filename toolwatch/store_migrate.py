"""The one-off conversion of a store in the layout before Delta tables (``toolwatch store
migrate``): :func:`legacy_layout` tells such a store (a :class:`~toolwatch.store.Store`
refuses to open one), :func:`migrate` converts it in place.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from toolwatch import schema
from toolwatch.errors import StoreError, first_line
from toolwatch.store import DATASETS, is_regular, log, readable_as, write_parquet

__all__ = ["legacy_layout", "migrate"]

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
        cp_regular = is_regular(os.lstat(root / "_state" / "checkpoints.json").st_mode)
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
            raise StoreError(f"cannot create table {d}: {first_line(exc)}") from exc
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
                if not is_regular(st.st_mode) or not readable_as(f, sch):
                    raise ValueError("not this dataset's Parquet")
                rows = pq.read_metadata(f).num_rows
            except (OSError, ValueError, pa.ArrowException) as exc:
                note(f"{name}: left out {part}/{os.path.basename(f)} ({first_line(exc)})")
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
            write_parquet(rows, f)
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
        raise StoreError(f"cannot read {path}: {first_line(exc)}; {hint}") from exc
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
