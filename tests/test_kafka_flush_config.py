"""``live.flush_events`` and ``live.kafka_lag_warn_s`` reach the Kafka source (issue 29).

The source is below the live engine and no longer reads the live config itself: the
caller passes the configured values. No broker: the source class is replaced by a
recorder that stops the command once it has been built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import toolwatch.ingest.sources.kafka as kafka_source
from test_live_support import config_for

from toolwatch.live.config import LiveConfig
from toolwatch.live_cli import consume_kafka


class _Built(Exception):
    """Raised by the recorder: the command stops right after building its source."""


def test_configured_flush_events_reaches_the_source(tmp_path: Path, monkeypatch) -> None:
    seen: dict[str, Any] = {}

    def recorder(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Built

    monkeypatch.setattr(kafka_source, "KafkaSource", recorder)
    cfg = config_for(tmp_path / "store", flush_events=1234, kafka_lag_warn_s=7.5)
    with pytest.raises(_Built):
        consume_kafka(cfg, bootstrap_servers="127.0.0.1:1", topics=["t"], group_id="g")
    assert seen["flush_events"] == 1234
    assert seen["lag_warn_s"] == 7.5


def test_source_default_is_the_settings_default() -> None:
    # A source built without the argument (tests, library users) behaves like the default
    # configuration; the constant is a copy, so this pins the two together.
    assert LiveConfig().flush_events == kafka_source.DEFAULT_FLUSH_EVENTS
