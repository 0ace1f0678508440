"""One exception tree for toolwatch.

Every error a user can see derives from :class:`ToolwatchError`, and its message says
*which* source, file and line failed (dlt-style), so an on-call engineer can act on it
without a traceback.
"""

from __future__ import annotations


class ToolwatchError(Exception):
    """Base class of every error toolwatch raises on purpose."""


class ConfigError(ToolwatchError):
    """The configuration file or an environment override is invalid.

    Parameters
    ----------
    message
        What is wrong.
    path
        The config file (or ``"env"``) the bad value came from.
    key
        The dotted key that was rejected, e.g. ``"ingest.max_line_bytes"``.
    """

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None):
        self.path = path
        self.key = key
        where = ", ".join(p for p in (path and f"file {path}", key and f"key {key!r}") if p)
        super().__init__(f"{message} ({where})" if where else message)


class SourceError(ToolwatchError):
    """A source could not be read at all (missing file, unreadable gzip, broker down).

    Bad *lines* never raise: they are quarantined. This is for the whole source.
    """

    def __init__(self, message: str, *, source: str, line: int | None = None):
        self.source = source
        self.line = line
        at = f"{source}:{line}" if line is not None else source
        super().__init__(f"{at}: {message}")


class StoreError(ToolwatchError):
    """The store could not be written or read (disk full, permissions, corrupt file)."""


class QueryError(ToolwatchError):
    """A forensic query was rejected (not read-only) or failed."""


class QueryRefusedError(QueryError):
    """A forensic query was refused by the guard before running (not a plain SELECT)."""


class ModelError(ToolwatchError):
    """A persisted detector model is missing, untrusted or incompatible."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when empty): library errors
    carry multi-line context that would bury the one line a user-facing message needs."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
