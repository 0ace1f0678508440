"""Sources: nouns named after what they read.

Each yields :class:`toolwatch.ingest.records.RawBatch`.
"""

from toolwatch.ingest.sources.file import FileSource, expand_paths
from toolwatch.ingest.sources.stdin import StdinSource

__all__ = ["FileSource", "StdinSource", "expand_paths"]
