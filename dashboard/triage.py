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

Suppression file format (version 1)::

    {
      "version": 1,
      "rules": [
        {
          "id": "sup-3f9a1c2b7d4e",          # stable id
          "entity_type": "caller_id",        # session | caller_id | client_ip
          "entity_id": "svc-nightly-export", # exact match
          "category": "bulk_extraction",     # exact match; null = every category
          "server": null,                    # exact match; null = every server
          "created_at": "2026-11-04T09:12:00Z",
          "created_by": "alice",
          "note": "nightly export job, approved in CHG-1234",
          "alert_id": "al-...",              # the alert it was made from (may be null)
          "expires_at": null                 # ISO time; null = never
        }
      ]
    }

An alert matches a rule (:func:`matches`) when the rule has not expired, its category
and server are null or equal to the alert's, and the alert is about the rule's entity:
``alert.entity_type == rule.entity_type and alert.entity_id == rule.entity_id``, or the
alert's own column of that type (``caller_id``, ``client_ip``, ``session_id``) equals
``rule.entity_id``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from toolwatch.triage_store import (  # noqa: F401 - incident verdicts, re-exported
    incident_history,
    incident_statuses,
    set_incident_verdict,
)

#: Verdicts an analyst can record. ``open`` re-opens an alert.
STATUSES = ("open", "acknowledged", "false_positive", "escalated")
#: Entity kinds a suppression rule can name.
RULE_ENTITY_TYPES = ("session", "caller_id", "client_ip")
_ENTITY_FIELD = {"session": "session_id", "caller_id": "caller_id", "client_ip": "client_ip"}

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


def triage_dir(data_dir: str | Path) -> Path:
    """``<data_dir>/_triage``, created if missing."""
    d = Path(data_dir) / "_triage"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


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


# ---------------------------------------------------------------- suppressions
@dataclass(frozen=True)
class SuppressionRule:
    """One rule of ``suppressions.json`` (see the module docstring)."""

    id: str
    entity_type: str
    entity_id: str
    category: str | None
    server: str | None
    created_at: str
    created_by: str
    note: str
    alert_id: str | None = None
    expires_at: str | None = None


def suppressions_path(data_dir: str | Path) -> Path:
    """``<data_dir>/_triage/suppressions.json``."""
    return triage_dir(data_dir) / "suppressions.json"


@contextlib.contextmanager
def _suppressions_lock(data_dir: str | Path) -> Iterator[None]:
    with open(triage_dir(data_dir) / "suppressions.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load_suppressions(data_dir: str | Path) -> list[SuppressionRule]:
    """Every rule in the store's suppression file (``[]`` if there is none)."""
    path = Path(data_dir) / "_triage" / "suppressions.json"
    if not path.exists():
        return []
    doc = orjson.loads(path.read_bytes())
    fields = set(SuppressionRule.__dataclass_fields__)
    return [
        SuppressionRule(**{k: v for k, v in r.items() if k in fields}) for r in doc.get("rules", [])
    ]


def _write_rules(data_dir: str | Path, rules: list[SuppressionRule]) -> None:
    path = suppressions_path(data_dir)
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    doc = {"version": 1, "rules": [asdict(r) for r in rules]}
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def add_suppression(
    data_dir: str | Path,
    *,
    entity_type: str,
    entity_id: str,
    created_by: str,
    category: str | None = None,
    server: str | None = None,
    note: str = "",
    alert_id: str | None = None,
    expires_at: datetime | None = None,
) -> SuppressionRule:
    """Append a suppression rule; an identical active rule is reused, not duplicated.

    Raises
    ------
    ValueError
        For an unknown entity type or an empty entity id.
    """
    if entity_type not in RULE_ENTITY_TYPES:
        raise ValueError(f"unknown entity type {entity_type!r}: use {RULE_ENTITY_TYPES}")
    if not entity_id:
        raise ValueError("entity id is required")
    with _suppressions_lock(data_dir):
        rules = load_suppressions(data_dir)
        for r in rules:
            if (r.entity_type, r.entity_id, r.category, r.server) == (
                entity_type,
                entity_id,
                category,
                server,
            ) and r.expires_at is None:
                return r
        rule = SuppressionRule(
            id=f"sup-{uuid.uuid4().hex[:12]}",
            entity_type=entity_type,
            entity_id=entity_id,
            category=category,
            server=server,
            created_at=_iso(_now()).replace(".000000Z", "Z"),
            created_by=created_by,
            note=note,
            alert_id=alert_id,
            expires_at=_iso(expires_at) if expires_at else None,
        )
        _write_rules(data_dir, [*rules, rule])
    return rule


def remove_suppression(data_dir: str | Path, rule_id: str) -> bool:
    """Delete a rule by id; returns whether it existed."""
    with _suppressions_lock(data_dir):
        rules = load_suppressions(data_dir)
        kept = [r for r in rules if r.id != rule_id]
        if len(kept) == len(rules):
            return False
        _write_rules(data_dir, kept)
    return True


def matches(rule: SuppressionRule, alert: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether ``rule`` suppresses ``alert`` (a mapping with the alert schema's columns)."""
    if rule.expires_at and _parse_iso(rule.expires_at) <= (now or _now()):
        return False
    if rule.category is not None and alert.get("category") != rule.category:
        return False
    if rule.server is not None and alert.get("server") != rule.server:
        return False
    if alert.get("entity_type") == rule.entity_type and alert.get("entity_id") == rule.entity_id:
        return True
    return alert.get(_ENTITY_FIELD[rule.entity_type]) == rule.entity_id


def is_suppressed(
    alert: Mapping[str, Any], rules: list[SuppressionRule], now: datetime | None = None
) -> SuppressionRule | None:
    """The first rule suppressing ``alert``, or ``None``."""
    return next((r for r in rules if matches(r, alert, now)), None)


def rules_frame(rules: list[SuppressionRule]) -> pl.DataFrame:
    """Rules as a frame for display."""
    cols = list(SuppressionRule.__dataclass_fields__)
    return pl.DataFrame([asdict(r) for r in rules], schema={c: pl.Utf8 for c in cols})


def false_positive(
    data_dir: str | Path,
    alert: Mapping[str, Any],
    actor: str,
    note: str = "",
    *,
    suppress: bool = False,
    scope: str = "entity_category",
) -> tuple[Verdict, SuppressionRule | None]:
    """Mark an alert a false positive, optionally creating a suppression rule from it.

    Parameters
    ----------
    alert
        The alert row (needs ``alert_id``, ``entity_type``, ``entity_id``, ``category``).
    scope
        ``entity_category``: this entity, this category only; ``entity``: this entity,
        every category.
    """
    rule = None
    if suppress:
        etype = str(alert.get("entity_type"))
        if etype not in RULE_ENTITY_TYPES:
            raise ValueError(f"cannot suppress entity type {etype!r}")
        rule = add_suppression(
            data_dir,
            entity_type=etype,
            entity_id=str(alert.get("entity_id")),
            category=alert.get("category") if scope == "entity_category" else None,
            created_by=actor,
            note=note,
            alert_id=alert.get("alert_id"),
        )
    v = TriageStore(data_dir).mark(
        str(alert["alert_id"]),
        "false_positive",
        actor,
        note,
        suppression_id=rule.id if rule else None,
    )
    return v, rule
