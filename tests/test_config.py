"""The ground config: machine-shaped defaults (``0`` = the CPUs this process may run on)
and the ``[tuning]`` table of performance knobs."""

from __future__ import annotations

import os

import pytest
from toolwatch.ingest.parse import ParserPool

from toolwatch.config import (
    Config,
    IngestConfig,
    QueryConfig,
    auto_count,
    available_cpus,
    load_config,
)
from toolwatch.errors import ConfigError
from toolwatch.live import LiveConfig
from toolwatch.query import query_connection
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
    con, _ = query_connection(Store(tmp_path / "store"), QueryConfig())
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    # explicit values win
    cfg.ingest.parse_workers = 3
    assert ParserPool.from_config(cfg).workers == 3
    con, _ = query_connection(Store(tmp_path / "store"), QueryConfig(threads=2))
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 2


def _load(tmp_path, text: str) -> Config:
    path = tmp_path / "toolwatch.toml"
    path.write_text(text)
    return load_config(path)


def test_tuning_table_sets_knobs_of_each_section(tmp_path) -> None:
    cfg = _load(tmp_path, "[tuning.live]\nmax_detect_events = 1234\n"
                          "[tuning.ingest]\nparse_workers = 3\n[live]\nflush_events = 50\n")
    assert cfg.ingest.parse_workers == 3
    live = LiveConfig.from_config(cfg)
    assert (live.max_detect_events, live.flush_events) == (1234, 50)
    # still accepted in its own section, as before
    assert LiveConfig.from_config(_load(tmp_path, "[live]\nmax_detect_events = 99\n")
                                  ).max_detect_events == 99


@pytest.mark.parametrize(("text", "key"), [
    ("[tuning.live]\nflush_events = 5\n", "tuning.live.flush_events"),  # a setting, no knob
    ("[tuning.ingest]\nmax_depth = 5\n", "tuning.ingest.max_depth"),
    ("[tuning.live]\nmax_detect_events = 5\n[live]\nmax_detect_events = 6\n",
     "tuning.live.max_detect_events"),  # set twice
    ("[tuning.detectors]\nx = 1\n", "tuning.detectors"),  # no such tuning section
    ("tuning = 3\n", "tuning"),
])
def test_tuning_table_refuses_what_is_not_a_knob(tmp_path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        LiveConfig.from_config(_load(tmp_path, text))
    assert err.value.key == key
