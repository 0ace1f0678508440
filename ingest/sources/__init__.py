"""Sources: nouns named after what they read. Each yields :class:`ingest.records.RawBatch`."""

from ingest.sources.file import FileSource, expand_paths
from ingest.sources.stdin import StdinSource

__all__ = ["FileSource", "StdinSource", "expand_paths"]
