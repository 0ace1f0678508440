"""Machine-shaped defaults: ``0`` resolves to the CPUs this process may run on."""

from __future__ import annotations

import os

import pytest
from toolwatch.ingest.parse import ParserPool

from toolwatch.config import Config, IngestConfig, QueryConfig, auto_count, available_cpus
from toolwatch.store import Store


def test_available_cpus_follow_the_affinity_mask() -> None:
    assert available_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("value", "cap", "want"), [(3, None, 3), (7, 4, 7), (0, None, None),
                                                    (0, 1, 1)])
def test_auto_count(value: int, cap: int | None, want: int | None) -> None:
    expected = want if want is not None else available_cpus()
    assert auto_count(value, cap) == expected


def test_defaults_are_auto_and_resolve_per_machine(tmp_path, monkeypatch) -> None:
    assert IngestConfig().parse_workers == 0 and QueryConfig().threads == 0
    # a process pinned to one CPU parses with one worker and queries with one thread
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", "00" * 32)
    cfg = Config()
    cfg.store.data_dir = str(tmp_path)
    assert ParserPool.from_config(cfg).workers == 1
    con, _ = Store(tmp_path / "store")._query_connection(QueryConfig())
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    # explicit values win
    cfg.ingest.parse_workers = 3
    assert ParserPool.from_config(cfg).workers == 3
    con, _ = Store(tmp_path / "store")._query_connection(QueryConfig(threads=2))
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 2
