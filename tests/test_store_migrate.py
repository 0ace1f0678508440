"""``toolwatch store migrate``: a store of the layout before Delta tables, converted in place.

The old store is built by hand as the old writer left it: ``<dataset>/date=<day>/part-*.parquet``
plain Parquet files, ``_state/checkpoints.json``, a ``_staging`` folder.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import CLI, TOOLWATCH
from toolwatch import schema
from toolwatch.query import query
from toolwatch.store import Store
from toolwatch.store_migrate import legacy_layout

#: (date folder, file name, first offset, rows, without caller_authenticated)
OLD_FILES = [
    ("date=2025-03-01", "part-0001-000.parquet", 0, 4, False),
    ("date=2025-03-01", "part-0002-000.parquet", 4, 3, True),  # written before the column
    ("date=2025-03-02", "part-0003-000.parquet", 7, 5, False),
]
OLD_ROWS = sum(f[3] for f in OLD_FILES)
CHECKPOINTS = {
    "fp-a": {"source": "logs/a.jsonl", "end_offset": 1234, "updated_at": 1.7e9},
    "fp-b": {"source": "kafka:calls/0", "end_offset": 56, "updated_at": 1.7e9},
}


def _events(first: int, n: int, *, drop_auth: bool) -> pa.Table:
    cols = {}
    for f in schema.EVENTS:
        if f.name == "event_id":
            vals: list = [f"fp-a:{first + i}" for i in range(n)]
        elif f.name == "offset":
            vals = [first + i for i in range(n)]
        elif f.name == "source_fp":
            vals = ["fp-a"] * n
        elif f.name == "ts":
            vals = [1_740_787_200_000_000 + i for i in range(n)]
        elif f.name == "tool":
            vals = ["read_file"] * n
        elif f.name == "caller_authenticated":
            vals = [True] * n
        else:
            vals = [None] * n
        cols[f.name] = pa.array(vals, f.type)
    tbl = pa.table(cols, schema=schema.EVENTS)
    return tbl.drop_columns(["caller_authenticated"]) if drop_auth else tbl


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    """An old-layout store: three event files in two date folders (one lacking
    ``caller_authenticated``), one alert file, checkpoints, a junk file and a symlink."""
    root = tmp_path / "store"
    for part, name, first, n, drop in OLD_FILES:
        (root / "events" / part).mkdir(parents=True, exist_ok=True)
        pq.write_table(_events(first, n, drop_auth=drop), root / "events" / part / name)
    alert = pa.table({f.name: pa.array([None], f.type) for f in schema.ALERTS},
                     schema=schema.ALERTS).set_column(0, "alert_id", pa.array(["al-1"]))
    (root / "alerts" / "date=2025-03-01").mkdir(parents=True)
    pq.write_table(alert, root / "alerts" / "date=2025-03-01" / "part-0001-001.parquet")
    (root / "summaries").mkdir()
    (root / "quarantine").mkdir()
    data = root / "events" / "date=2025-03-02"
    (data / "part-junk-000.parquet").write_bytes(b"not parquet at all")
    # A link to readable Parquet outside the store: its rows must never be adopted.
    outside = tmp_path / "outside.parquet"
    pq.write_table(_events(1000, 9, drop_auth=False), outside)
    os.symlink(outside, data / "part-link-000.parquet")
    (root / "_state").mkdir()
    (root / "_state" / "checkpoints.json").write_text(json.dumps(CHECKPOINTS))
    (root / "_staging").mkdir()
    return root


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` (links not followed) -> (size, mtime_ns)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.slow  # starts processes
def test_migrate_keeps_rows_checkpoints_and_is_idempotent(
    old_store: Path, tw_env: dict[str, str], tmp_path: Path
) -> None:
    root = old_store
    cli = CLI(data_dir=root, env=tw_env)
    outside_before = (tmp_path / "outside.parquet").read_bytes()
    assert legacy_layout(root)

    r = cli("store", "migrate", "-d", str(root))
    assert "events" in r.stdout and "3 files" in r.stdout, r.stdout
    assert "2 checkpoints" in r.stdout, r.stdout
    assert "part-link-000.parquet" in r.stderr and "part-junk-000.parquet" in r.stderr
    assert not legacy_layout(root)

    store = Store(root)
    assert store.checkpoints() == {fp: v["end_offset"] for fp, v in CHECKPOINTS.items()}
    got = query(store,
        "SELECT count(*) AS n, count(caller_authenticated) AS auth, "
        "count(*) FILTER (WHERE caller_authenticated IS NULL) AS nulls, "
        "count(DISTINCT event_id) AS ids, max(\"offset\") AS last FROM events"
    ).to_pylist()[0]
    # Every old row, none of the linked file's (offsets 1000+), nulls where the column
    # did not exist yet.
    assert got == {"n": OLD_ROWS, "auth": OLD_ROWS - 3, "nulls": 3, "ids": OLD_ROWS,
                   "last": OLD_ROWS - 1}
    assert query(store, "SELECT alert_id FROM alerts").to_pylist() == [{"alert_id": "al-1"}]
    # The tables hold the old checkpoints as application transactions: a replay of an
    # old batch adds nothing.
    assert store.table("events").versions(["fp-a", "fp-b"]) == {"fp-a": 1234, "fp-b": 56}
    # Adopted in place: the table's files are the old ones, junk and links are not.
    names = sorted(os.path.relpath(f, root / "events") for f in store.files("events"))
    assert names == sorted(f"{p}/{n}" for p, n, *_ in OLD_FILES)
    data = root / "events" / "date=2025-03-02"
    assert not (data / "part-link-000.parquet").is_symlink()  # moved out of the table
    assert any(p.name.startswith("part-link-000") and p.is_symlink()
               for p in (root / "_state" / "rejected").iterdir())
    assert (tmp_path / "outside.parquet").read_bytes() == outside_before
    assert not (root / "_staging").exists()
    assert not (root / "_state" / "checkpoints.json").exists()

    # Idempotent: a second run says so and changes nothing at all.
    before = _tree(root)
    r2 = cli("store", "migrate", "-d", str(root))
    assert "nothing to migrate" in r2.stdout
    assert _tree(root) == before

    q = cli("query", "-d", str(root), "--format", "json", "SELECT count(*) AS n FROM events")
    assert json.loads(q.stdout.strip().splitlines()[-1]) == {"n": OLD_ROWS}


@pytest.mark.slow  # starts processes
def test_other_commands_on_an_old_store_name_the_migration(
    old_store: Path, tw_env: dict[str, str]
) -> None:
    # The message is one line; rich wraps stderr at the terminal's width (COLUMNS), and
    # the temporary path is long, so the width is set beyond the message's length here.
    cli = CLI(data_dir=old_store, env={**tw_env, "COLUMNS": "1000"})
    before = _tree(old_store)
    for args in (["query", "SELECT 1"], ["store", "info"], ["store", "compact"],
                 ["store", "vacuum"], ["schema"]):
        r = cli(*args, "-d", str(old_store), check=False)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith("error:") and "toolwatch store migrate -d" in lines[0]
        assert "Traceback" not in r.stderr
    assert _tree(old_store) == before  # refused before touching anything


@pytest.mark.slow  # starts processes
def test_migrate_refuses_what_is_no_store(tmp_path: Path, tw_env: dict[str, str]) -> None:
    cli = CLI(data_dir=tmp_path, env=tw_env)
    for target in (tmp_path / "missing", tmp_path):
        r = cli("store", "migrate", "-d", str(target), check=False)
        assert r.returncode == 1
        assert r.stderr.strip().splitlines() == [
            f"error: no toolwatch store at {target} (check -d / $TOOLWATCH_DATA_DIR)"]
    assert not (tmp_path / "missing").exists()


def test_interrupted_migration_finishes_on_the_next_run(old_store: Path) -> None:
    """A run that died after converting the datasets (before ``streams``) still counts
    as unconverted; the next run adds the checkpoints without adopting a file twice."""
    from toolwatch.store_migrate import migrate

    with pytest.MonkeyPatch.context() as mp:
        import deltalake.transaction as dtx

        real = dtx.create_table_with_add_actions

        def dies_at_streams(uri: str, *args: object, **kw: object) -> None:
            if uri.endswith("streams"):
                raise KeyboardInterrupt
            real(uri, *args, **kw)

        mp.setattr(dtx, "create_table_with_add_actions", dies_at_streams)
        with pytest.raises(KeyboardInterrupt):
            migrate(old_store)
    assert legacy_layout(old_store)
    with pytest.raises(Exception, match="toolwatch store migrate"):
        Store(old_store)
    assert migrate(old_store) == {"streams": 2}
    store = Store(old_store)
    assert store.checkpoints() == {fp: v["end_offset"] for fp, v in CHECKPOINTS.items()}
    assert query(store, "SELECT count(*) AS n FROM events").to_pylist() == [{"n": OLD_ROWS}]
    assert migrate(old_store) == {}


def test_unsafe_checkpoints_stop_the_migration(old_store: Path, tmp_path: Path) -> None:
    """Checkpoints that are a link are not read (nor silently dropped: every stream would
    be stored twice); nothing is converted."""
    from toolwatch.errors import StoreError
    from toolwatch.store_migrate import migrate

    cp = old_store / "_state" / "checkpoints.json"
    target = tmp_path / "elsewhere.json"
    os.replace(cp, target)
    os.symlink(target, cp)
    with pytest.raises(StoreError, match=r"checkpoints\.json"):
        migrate(old_store)
    assert not (old_store / "events" / "_delta_log").exists()
    assert legacy_layout(old_store)


def test_a_planted_fifo_named_like_old_checkpoints_is_no_old_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    Store(root)
    os.mkfifo(root / "_state" / "checkpoints.json")
    assert not legacy_layout(root)
    Store(root)  # opens: a new store is not mistaken for an unconverted one


@pytest.mark.slow  # starts a process
def test_command_line_entry_is_registered() -> None:
    r = subprocess.run([TOOLWATCH, "store", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    for cmd in ("migrate", "info", "compact", "vacuum"):
        assert cmd in r.stdout
