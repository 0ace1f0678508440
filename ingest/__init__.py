"""Ingestion: sources that read raw log lines, transforms that make them events.

Sources (nouns, :mod:`ingest.sources`) yield :class:`~ingest.records.RawBatch` objects;
transforms (verbs: :mod:`ingest.parse`, :mod:`ingest.pair`, :mod:`ingest.sessionize`)
turn them into the normalized tables of :mod:`toolwatch.schema`. The same code serves
batch files and live streams; only the batch size differs.
"""
