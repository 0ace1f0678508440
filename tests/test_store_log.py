"""The Delta log stays short: a long-running writer's commits do not grow slower.

Every commit and refresh lists a table's whole ``_delta_log``; the log is cleaned at each
log checkpoint of entries older than ``tables.LOG_RETENTION``. These tests shorten that
retention to zero so the cleaning shows within a few dozen commits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.store_rows import store_events as _events
from toolwatch import tables
from toolwatch.store import Checkpoint, Store


def _log_entries(store_dir: Path, table: str = "events") -> list[str]:
    return sorted(p.name for p in (store_dir / table / "_delta_log").glob("*.json"))


def _retention(store_dir: Path, table: str = "events") -> str | None:
    from deltalake import DeltaTable

    return DeltaTable(str(store_dir / table)).metadata().configuration.get(
        "delta.logRetentionDuration")


def test_a_long_writer_keeps_a_short_log_and_resumes_from_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tables.TABLE_CONFIG, "delta.logRetentionDuration", "interval 0 seconds")
    st = Store(tmp_path / "s")
    for k in range(45):
        st.write_batch({"events": _events(k * 10, 10)}, [Checkpoint("fp", "f", k * 10 + 10)])
    # 45 commits (+ the table's creation): only those since the last log checkpoint stay.
    assert 1 <= len(_log_entries(tmp_path / "s")) <= 10
    # The resume point and every row survive the cleaning, for a new process too.
    again = Store(tmp_path / "s")
    assert again.checkpoints() == {"fp": 450}
    from deltalake import DeltaTable

    offsets = DeltaTable(str(tmp_path / "s" / "events")).to_pyarrow_table(
        columns=["offset"])["offset"].to_pylist()
    assert sorted(offsets) == list(range(450))
    # A replay after the cleaning is still a no-op.
    assert again.write_batch({"events": _events(440, 10)}, [Checkpoint("fp", "f", 450)]) == 0


def test_the_default_retention_keeps_minutes_not_days(tmp_path: Path) -> None:
    st = Store(tmp_path / "s")
    st.write_batch({"events": _events(0, 5)}, [Checkpoint("fp", "f", 5)])
    assert _retention(tmp_path / "s") == tables.LOG_RETENTION
    assert "day" not in tables.LOG_RETENTION


def test_a_table_made_with_the_two_day_retention_is_shortened_by_its_next_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:  # tables as the previous release made them
        m.setitem(tables.TABLE_CONFIG, "delta.logRetentionDuration", "interval 2 days")
        m.setattr(tables, "_OLD_LOG_RETENTION", "none")
        Store(tmp_path / "s").write_batch({"events": _events(0, 5)}, [Checkpoint("fp", "f", 5)])
        Store(tmp_path / "t").write_batch({"events": _events(0, 5)}, [Checkpoint("fp", "f", 5)])
    assert _retention(tmp_path / "s") == "interval 2 days"
    # A retention an operator chose is theirs.
    from deltalake import DeltaTable

    DeltaTable(str(tmp_path / "t" / "events")).alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 3 hours"})

    for name in ("s", "t"):
        st = Store(tmp_path / name)
        assert st.write_batch({"events": _events(5, 5)}, [Checkpoint("fp", "f", 10)]) == 5
        assert st.checkpoints() == {"fp": 10}
    assert _retention(tmp_path / "s") == tables.LOG_RETENTION
    assert _retention(tmp_path / "t") == "interval 3 hours"
    # Readers do not change a table.
    with monkeypatch.context() as m:
        m.setitem(tables.TABLE_CONFIG, "delta.logRetentionDuration", "interval 2 days")
        m.setattr(tables, "_OLD_LOG_RETENTION", "none")
        Store(tmp_path / "u").write_batch({"events": _events(0, 5)}, [Checkpoint("fp", "f", 5)])
    Store(tmp_path / "u").files("events")
    assert _retention(tmp_path / "u") == "interval 2 days"
