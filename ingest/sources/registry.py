"""Sources by name: adding a source is one module plus one line here.

Entries are ``"module:Class"`` strings, imported on first use, so naming a source costs
nothing (the Kafka client is only imported by ``toolwatch kafka``).

* :data:`LIVE_SOURCES` — :class:`~toolwatch.ingest.sources.base.LiveSource` subclasses,
  run by :func:`toolwatch.live.driver.drive`;
* :data:`BATCH_SOURCES` — :class:`~toolwatch.ingest.sources.base.BatchSource`
  implementations read by ``ingest``/``analyze``.
"""

from __future__ import annotations

import importlib
from typing import Any

from toolwatch.errors import ConfigError

#: Live sources (name -> "module:Class").
LIVE_SOURCES: dict[str, str] = {
    "tail": "toolwatch.ingest.sources.file_tail:FileTailLive",
    "pipe": "toolwatch.ingest.sources.process:PipeLive",
    "spool": "toolwatch.ingest.sources.spool:SpoolLive",
    "kafka": "toolwatch.ingest.sources.kafka:KafkaSource",
}

#: Batch sources (name -> "module:Class").
BATCH_SOURCES: dict[str, str] = {
    "file": "toolwatch.ingest.sources.file:FileSource",
    "stdin": "toolwatch.ingest.sources.stdin:StdinSource",
}


def _load(table: dict[str, str], kind: str, name: str) -> Any:
    try:
        target = table[name]
    except KeyError:
        raise ConfigError(f"unknown {kind} source {name!r}: {', '.join(sorted(table))}",
                          key="source") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def live_source(name: str) -> type:
    """The live source class registered as ``name``.

    Raises
    ------
    toolwatch.errors.ConfigError
        Unknown name.
    """
    return _load(LIVE_SOURCES, "live", name)  # type: ignore[no-any-return]


def batch_source(name: str) -> type:
    """The batch source class registered as ``name`` (see :func:`live_source`)."""
    return _load(BATCH_SOURCES, "batch", name)  # type: ignore[no-any-return]


__all__ = ["BATCH_SOURCES", "LIVE_SOURCES", "batch_source", "live_source"]
