"""Ingestion: sources that read raw log lines, transforms that make them events.

Sources (nouns, :mod:`toolwatch.ingest.sources`) yield
:class:`~toolwatch.ingest.records.RawBatch` objects; transforms (verbs:
:mod:`toolwatch.ingest.parse`, :mod:`toolwatch.ingest.pair`,
:mod:`toolwatch.ingest.sessionize`) turn them into the normalized tables of
:mod:`toolwatch.schema`. The same code serves batch files and live streams; only the batch
size differs.
"""
