"""Analysts' verdicts on alerts, and suppression rules made from false positives.

Both live under ``<data_dir>/_triage/``, a directory the ingester and detectors never
write, so triage survives restarts and never contends with ingest:

``triage.sqlite``
    SQLite in WAL mode: an append-only ``verdicts`` history (alert, status, note, who,
    when). The latest row per alert is its current status; nothing is ever overwritten,
    so the history shows who changed what and why.
``suppressions.json``
    Rules the detectors apply to drop matching future alerts (format below). Written
    atomically (temp file + rename) under an advisory lock.

Suppression file format (version 2; version-1 files are read as they are)::

    {
      "version": 2,
      "rules": [
        {
          "id": "sup-3f9a1c2b7d4e",          # stable id
          "caller_id": "svc-nightly-export", # scope: each null (any) or exact value,
          "client_ip": null,                 #   all set fields must match
          "server": "docs-server",
          "tool": null,                      # matches the evidence's tool/top_tool/...
          "category": "bulk_extraction",
          "entity_type": null,               # version-1 scope: session | caller_id |
          "entity_id": null,                 #   client_ip, and its exact id
          "created_at": "2026-11-04T09:12:00.123456Z",
          "created_by": "alice",
          "note": "nightly export job, approved in CHG-1234",
          "alert_id": null,                  # the alert / incident it was made from
          "incident_id": "inc-…",
          "expires_at": "2026-11-11T09:12:00.123456Z"   # ISO time; null = never
        }
      ]
    }

A version-1 rule has only ``id``, ``entity_type``, ``entity_id``, ``category``,
``server``, ``created_at``, ``created_by``, ``note``, ``alert_id`` and ``expires_at``.
The file is written as version 1 while every rule has that shape (so an older toolwatch
on the same store keeps working), as version 2 once a rule uses the new scope.

An alert matches a rule (:func:`matches`) when the rule has not expired and every scope
field it sets matches: ``category``, ``server`` the alert's column; ``caller_id`` /
``client_ip`` the alert's column of that name or its entity of that type (a caller only
when the log vouched for it: ``caller_authenticated`` is not false); ``tool`` a tool the
alert's evidence names (:data:`TOOL_EVIDENCE_FIELDS`). A version-1 entity matches when
``alert.entity_type == rule.entity_type and alert.entity_id == rule.entity_id``, or the
alert's own column of that type (``caller_id``, ``client_ip``, ``session_id``) equals
``rule.entity_id``. Batch ``analyze`` and live ``tail``/``kafka`` apply the rules to
every alert they emit (:func:`toolwatch.detectors.suppress.apply_triage_suppressions`,
the matching code is in :mod:`toolwatch.detectors.suppress`); live re-reads
the file when it changes, so a new rule applies from the next flush without a restart.
Rules are made in the dashboard (incident and session pages) or with ``toolwatch
suppress add``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from toolwatch.detectors.suppress import (
    RULE_ENTITY_TYPES,
    SuppressionRule,
    _iso,
    _now,
    _parse_iso,
    add_suppression,
    rule_scope_for,
    triage_dir,
)

#: Verdicts an analyst can record. ``open`` re-opens an alert.
STATUSES = ("open", "acknowledged", "false_positive", "escalated")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    alert_id TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'acknowledged', 'false_positive',
                                           'escalated')),
    note TEXT NOT NULL DEFAULT '',
    actor TEXT NOT NULL,
    at TEXT NOT NULL,
    suppression_id TEXT
);
CREATE INDEX IF NOT EXISTS verdicts_alert ON verdicts (alert_id, id);
"""


@dataclass(frozen=True)
class Verdict:
    """One recorded triage decision."""

    alert_id: str
    status: str
    note: str
    actor: str
    at: datetime
    suppression_id: str | None = None


class TriageStore:
    """The verdict history in ``<data_dir>/_triage/triage.sqlite``.

    Parameters
    ----------
    data_dir
        The toolwatch store directory.
    """

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        self.path = triage_dir(data_dir) / "triage.sqlite"
        with self._connect() as con:
            con.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA busy_timeout=10000")
            con.execute("PRAGMA synchronous=NORMAL")
            yield con
        finally:
            con.close()

    def mark(
        self,
        alert_id: str,
        status: str,
        actor: str,
        note: str = "",
        *,
        suppression_id: str | None = None,
        at: datetime | None = None,
    ) -> Verdict:
        """Record a verdict (appended; earlier verdicts stay in the history).

        Raises
        ------
        ValueError
            For an unknown status, an empty alert id or an empty actor.
        """
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}: use one of {STATUSES}")
        if not alert_id:
            raise ValueError("alert id is required")
        actor = (actor or "").strip()
        if not actor:
            raise ValueError("who is triaging is required")
        v = Verdict(alert_id, status, note or "", actor, at or _now(), suppression_id)
        with self._connect() as con:
            con.execute(
                "INSERT INTO verdicts (alert_id, status, note, actor, at, suppression_id) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (v.alert_id, v.status, v.note, v.actor, _iso(v.at), v.suppression_id),
            )
        return v

    def history(self, alert_id: str) -> list[Verdict]:
        """Every verdict on one alert, oldest first."""
        with self._connect() as con:
            rows = con.execute(
                "SELECT alert_id, status, note, actor, at, suppression_id FROM verdicts "
                "WHERE alert_id = ? ORDER BY id",
                (alert_id,),
            ).fetchall()
        return [Verdict(r[0], r[1], r[2], r[3], _parse_iso(r[4]), r[5]) for r in rows]

    def current(self, alert_id: str) -> Verdict | None:
        """The latest verdict on an alert, or ``None`` if never triaged."""
        h = self.history(alert_id)
        return h[-1] if h else None

    def current_frame(self) -> pl.DataFrame:
        """Latest verdict per alert (columns ``alert_id``, ``status``, ``note``, ``actor``,
        ``at`` (UTC), ``suppression_id``)."""
        with self._connect() as con:
            rows = con.execute(
                "SELECT v.alert_id, v.status, v.note, v.actor, v.at, v.suppression_id "
                "FROM verdicts v JOIN (SELECT alert_id, max(id) AS id FROM verdicts "
                "GROUP BY alert_id) m ON v.id = m.id"
            ).fetchall()
        schema = {
            "alert_id": pl.Utf8,
            "status": pl.Utf8,
            "note": pl.Utf8,
            "actor": pl.Utf8,
            "at": pl.Utf8,
            "suppression_id": pl.Utf8,
        }
        df = pl.DataFrame(rows, schema=schema, orient="row")
        return df.with_columns(
            pl.col("at").str.to_datetime("%Y-%m-%dT%H:%M:%S%.fZ", time_zone="UTC", time_unit="us")
        )

    def counts(self) -> dict[str, int]:
        """Alerts per current status (alerts never triaged are not counted)."""
        df = self.current_frame()
        return dict(df.group_by("status").len().iter_rows()) if df.height else {}


def false_positive(
    data_dir: str | Path,
    alert: Mapping[str, Any],
    actor: str,
    note: str = "",
    *,
    suppress: bool = False,
    scope: str = "entity_category",
    expires_at: datetime | None = None,
) -> tuple[Verdict, SuppressionRule | None]:
    """Mark an alert a false positive, optionally creating a suppression rule from it.

    Parameters
    ----------
    alert
        The alert row (needs ``alert_id``, ``entity_type``, ``entity_id``, ``category``).
    scope
        ``entity_category``: this actor, this category only; ``entity``: this actor,
        every category. The actor is the alert's caller, else its client address, else
        (neither logged) its session (:func:`rule_scope_for`).
    expires_at
        When the rule stops applying (``None``: never).
    """
    rule = None
    if suppress:
        # The actor (caller, else address) rather than a session id that never recurs;
        # written in the version-1 entity shape so older readers understand it.
        who = rule_scope_for(alert)
        if who["caller_id"]:
            etype, eid = "caller_id", str(who["caller_id"])
        elif who["client_ip"]:
            etype, eid = "client_ip", str(who["client_ip"])
        else:
            etype, eid = str(alert.get("entity_type")), str(alert.get("entity_id"))
        if etype not in RULE_ENTITY_TYPES:
            raise ValueError(f"cannot suppress entity type {etype!r}")
        rule = add_suppression(
            data_dir,
            entity_type=etype,
            entity_id=eid,
            category=alert.get("category") if scope == "entity_category" else None,
            created_by=actor,
            note=note,
            alert_id=alert.get("alert_id"),
            expires_at=expires_at,
        )
    v = TriageStore(data_dir).mark(
        str(alert["alert_id"]),
        "false_positive",
        actor,
        note,
        suppression_id=rule.id if rule else None,
    )
    return v, rule
