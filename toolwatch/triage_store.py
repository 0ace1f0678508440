"""Triage statuses the CLI and the store read, and incident-level verdicts.

The verdict history lives in ``<data_dir>/_triage/triage.sqlite`` (see
``dashboard/triage.py``, which writes alert verdicts into its ``verdicts`` table). This
module needs no dashboard import, so ``toolwatch alerts`` / ``toolwatch incidents`` and
the store's ``incidents`` view can read statuses without loading Streamlit code:

``incident_verdicts`` table
    Append-only, like ``verdicts``: (incident id, status, note, who, when). The latest row
    per incident is its status; it wins over the status derived from its alerts.

Readers never create anything: a store that was never triaged has no statuses.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

#: Verdicts an analyst can record (same as dashboard/triage.py STATUSES).
STATUSES = ("open", "acknowledged", "false_positive", "escalated")

_INCIDENT_SCHEMA = """
CREATE TABLE IF NOT EXISTS incident_verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'acknowledged', 'false_positive',
                                           'escalated')),
    note TEXT NOT NULL DEFAULT '',
    actor TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incident_verdicts_incident ON incident_verdicts (incident_id, id);
"""


def triage_db(store_dir: str | Path) -> Path:
    """``<store_dir>/_triage/triage.sqlite`` (not created)."""
    return Path(store_dir) / "_triage" / "triage.sqlite"


@contextlib.contextmanager
def _connect(path: Path) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(path, timeout=10.0, isolation_level=None)
    try:
        con.execute("PRAGMA busy_timeout=10000")
        yield con
    finally:
        con.close()


def _latest(store_dir: str | Path, table: str, key: str) -> dict[str, str]:
    path = triage_db(store_dir)
    if not path.is_file():
        return {}
    with _connect(path) as con:
        known = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if table not in known:
            return {}
        # Table and key are this module's constants, never user text.
        rows = con.execute(
            f"SELECT t.{key}, t.status FROM {table} t JOIN (SELECT {key}, max(id) AS id "
            f"FROM {table} GROUP BY {key}) m ON t.id = m.id"
        ).fetchall()
    return {str(k): str(s) for k, s in rows}


def alert_statuses(store_dir: str | Path) -> dict[str, str]:
    """Latest verdict per alert id (alerts never triaged are absent: they are open)."""
    return _latest(store_dir, "verdicts", "alert_id")


def incident_statuses(store_dir: str | Path) -> dict[str, str]:
    """Latest incident-level verdict per incident id (absent: derived from its alerts)."""
    return _latest(store_dir, "incident_verdicts", "incident_id")


def set_incident_verdict(
    store_dir: str | Path,
    incident_id: str,
    status: str,
    note: str = "",
    who: str = "",
) -> dict[str, str]:
    """Record a verdict on a whole incident (appended; the history is kept).

    Parameters
    ----------
    store_dir
        The toolwatch store directory (``_triage/`` is created if missing).
    incident_id
        The incident's ``incident_id`` (``inc-…``).
    status
        One of :data:`STATUSES`; ``open`` re-opens it (its own verdict then says open,
        whatever its alerts say).
    note, who
        Why, and who decided (required).

    Returns
    -------
    dict
        The recorded row: incident_id, status, note, actor, at.

    Raises
    ------
    ValueError
        For an unknown status, an empty incident id or an empty ``who``.
    """
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}: use one of {', '.join(STATUSES)}")
    if not incident_id:
        raise ValueError("incident id is required")
    who = (who or "").strip()
    if not who:
        raise ValueError("who is triaging is required")
    path = triage_db(store_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with _connect(path) as con:
        con.execute("PRAGMA journal_mode=WAL")
        con.executescript(_INCIDENT_SCHEMA)
        con.execute(
            "INSERT INTO incident_verdicts (incident_id, status, note, actor, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (incident_id, status, note or "", who, at),
        )
    return {"incident_id": incident_id, "status": status, "note": note or "", "actor": who,
            "at": at}


def incident_history(store_dir: str | Path, incident_id: str) -> list[dict[str, str]]:
    """Every verdict on one incident, oldest first."""
    path = triage_db(store_dir)
    if not path.is_file():
        return []
    with _connect(path) as con:
        known = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "incident_verdicts" not in known:
            return []
        rows = con.execute(
            "SELECT incident_id, status, note, actor, at FROM incident_verdicts "
            "WHERE incident_id = ? ORDER BY id",
            (incident_id,),
        ).fetchall()
    cols = ("incident_id", "status", "note", "actor", "at")
    return [dict(zip(cols, r, strict=True)) for r in rows]
