"""Sources: nouns named after what they read.

All follow one contract (:mod:`toolwatch.ingest.sources.base`): batch sources yield
:class:`toolwatch.ingest.records.RawBatch` until exhausted, live sources poll with a timeout
and take acknowledgements. They are looked up by name in
:mod:`toolwatch.ingest.sources.registry`.
"""

from toolwatch.ingest.sources.base import BatchSource, LiveSource
from toolwatch.ingest.sources.file import FileSource, expand_paths
from toolwatch.ingest.sources.stdin import StdinSource

__all__ = ["BatchSource", "FileSource", "LiveSource", "StdinSource", "expand_paths"]
