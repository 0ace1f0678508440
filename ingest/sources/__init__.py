"""Sources: nouns named after what they read.

All follow one contract (:mod:`toolwatch.ingest.sources.base`): batch sources yield
:class:`toolwatch.ingest.records.RawBatch` until exhausted, live sources poll with a timeout
and take acknowledgements. They are looked up by name in
:mod:`toolwatch.ingest.sources.registry`.
"""

from __future__ import annotations

# Loaded on first use, not with the package: the console entry imports
# toolwatch.ingest.sources.wrapper on a wrapped server's cold start, which must not pay for
# numpy and pyarrow (~0.18 s) that these sources import, nor for typing.
_LAZY = {
    "BatchSource": "toolwatch.ingest.sources.base",
    "LiveSource": "toolwatch.ingest.sources.base",
    "FileSource": "toolwatch.ingest.sources.file",
    "expand_paths": "toolwatch.ingest.sources.file",
    "StdinSource": "toolwatch.ingest.sources.stdin",
}

__all__ = ["BatchSource", "FileSource", "LiveSource", "StdinSource", "expand_paths"]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
