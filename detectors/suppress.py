"""Suppression: the analysts' rules that drop matching alerts, read by every engine.

Config allowlists are applied by the detectors themselves; this module holds the other
half, the rules an analyst makes by marking a false positive (in the dashboard or with
``toolwatch suppress add``). They live in ``<data_dir>/_triage/suppressions.json``; the
file format and the matching rules are described in :mod:`toolwatch.dashboard.triage`.
Batch ``analyze`` and the live engine both call :func:`apply_triage_suppressions`, and the
dashboard reads and writes the rules through the functions here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import polars as pl

#: Entity kinds a suppression rule can name.
RULE_ENTITY_TYPES = ("session", "caller_id", "client_ip")
_ENTITY_FIELD = {"session": "session_id", "caller_id": "caller_id", "client_ip": "client_ip"}


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


# ---------------------------------------------------------------- suppressions
#: Scope fields of a rule (version 2): each null (any) or an exact value; all must match.
SCOPE_FIELDS = ("caller_id", "client_ip", "server", "tool", "category")
#: Evidence fields naming the tool an alert is about (first non-null wins per field; a
#: rule's ``tool`` matches any of them, or an entry of the evidence's ``tools`` list).
TOOL_EVIDENCE_FIELDS = ("tool", "top_tool", "loop_tool", "page_tool", "outbound_tool")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class SuppressionRule:
    """One rule of ``suppressions.json`` (see the module docstring).

    ``entity_type``/``entity_id`` are the version-1 scope (kept for old files and for
    rules made by marking an alert a false positive); ``caller_id``, ``client_ip``,
    ``server``, ``tool`` and ``category`` are the version-2 scope.
    """

    id: str
    entity_type: str | None = None
    entity_id: str | None = None
    category: str | None = None
    server: str | None = None
    created_at: str = ""
    created_by: str = ""
    note: str = ""
    alert_id: str | None = None
    expires_at: str | None = None
    caller_id: str | None = None
    client_ip: str | None = None
    tool: str | None = None
    incident_id: str | None = None

    def expired(self, now: datetime | None = None) -> bool:
        """Whether ``expires_at`` has passed."""
        return bool(self.expires_at) and _parse_iso(str(self.expires_at)) <= (now or _now())

    def scope_text(self) -> str:
        """The scope as ``caller_id=x, category=y`` (for lists and messages)."""
        parts = []
        if self.entity_type and self.entity_id:
            parts.append(f"{self.entity_type}={self.entity_id}")
        parts += [f"{f}={getattr(self, f)}" for f in SCOPE_FIELDS if getattr(self, f)]
        return ", ".join(parts) or "(everything)"


def parse_expiry(text: str | None, now: datetime | None = None) -> datetime | None:
    """``7d`` / ``12h`` / ``30m`` / ``45s`` / ``2w`` from now, or an ISO time; ``None``,
    ``""``, ``never`` for no expiry.

    Raises
    ------
    ValueError
        For anything else, or a time that is not in the future.
    """
    if text is None or not str(text).strip() or str(text).strip().lower() == "never":
        return None
    now = now or _now()
    m = _DURATION.match(str(text))
    if m:
        when = now + timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
    else:
        try:
            when = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"expiry {text!r}: use a duration like 30m, 12h, 7d, 2w or an ISO time"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    if when <= now:
        raise ValueError(f"expiry {text!r} is not in the future")
    return when


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


#: Parsed files by path, keyed on (mtime, size, inode): ``tail`` asks at every flush, and
#: a rule written since (atomic rename: a new inode) is seen at the next one.
_CACHE: dict[str, tuple[tuple[int, int, int], list[SuppressionRule]]] = {}


def load_suppressions(data_dir: str | Path) -> list[SuppressionRule]:
    """Every rule in the store's suppression file (``[]`` if there is none).

    Version-1 and version-2 files alike; keys this version does not know are ignored.
    Re-read only when the file changed (its mtime, size or inode).
    """
    path = Path(data_dir) / "_triage" / "suppressions.json"
    try:
        st_ = path.stat()
    except FileNotFoundError:
        return []
    key = (st_.st_mtime_ns, st_.st_size, st_.st_ino)
    hit = _CACHE.get(str(path))
    if hit is not None and hit[0] == key:
        return list(hit[1])
    doc = orjson.loads(path.read_bytes())
    fields = set(SuppressionRule.__dataclass_fields__)
    rules = [
        SuppressionRule(**{k: v for k, v in r.items() if k in fields})
        for r in doc.get("rules", [])
        if isinstance(r, dict) and r.get("id")
    ]
    _CACHE[str(path)] = (key, rules)
    return list(rules)


def _write_rules(data_dir: str | Path, rules: list[SuppressionRule]) -> None:
    path = suppressions_path(data_dir)
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    # Version 1 while every rule has the version-1 shape, so an older toolwatch reading
    # the same store keeps working; version 2 once a rule uses caller/address/tool scope.
    v2 = any(r.caller_id or r.client_ip or r.tool or not r.entity_type for r in rules)
    v1_keys = (
        "id",
        "entity_type",
        "entity_id",
        "category",
        "server",
        "created_at",
        "created_by",
        "note",
        "alert_id",
        "expires_at",
    )
    docs = [asdict(r) if v2 else {k: getattr(r, k) for k in v1_keys} for r in rules]
    doc = {"version": 2 if v2 else 1, "rules": docs}
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def add_suppression(
    data_dir: str | Path,
    *,
    created_by: str,
    entity_type: str | None = None,
    entity_id: str | None = None,
    category: str | None = None,
    server: str | None = None,
    caller_id: str | None = None,
    client_ip: str | None = None,
    tool: str | None = None,
    note: str = "",
    alert_id: str | None = None,
    incident_id: str | None = None,
    expires_at: datetime | None = None,
) -> SuppressionRule:
    """Append a suppression rule; an identical active rule is reused, not duplicated.

    Parameters
    ----------
    entity_type, entity_id
        Version-1 scope: an alert's entity (``session`` / ``caller_id`` / ``client_ip``).
    caller_id, client_ip, server, tool, category
        Version-2 scope: each ``None`` (any) or the exact value; all given must match.
    expires_at
        When the rule stops applying (``None``: never).

    Raises
    ------
    ValueError
        For an unknown entity type, an entity type without id, no scope at all, or an
        expiry in the past.
    """
    scope = {
        "caller_id": caller_id,
        "client_ip": client_ip,
        "server": server,
        "tool": tool,
        "category": category,
    }
    scope = {k: (str(v).strip() or None) if v is not None else None for k, v in scope.items()}
    if entity_type is not None or entity_id is not None:
        if entity_type not in RULE_ENTITY_TYPES:
            raise ValueError(f"unknown entity type {entity_type!r}: use {RULE_ENTITY_TYPES}")
        if not entity_id:
            raise ValueError("entity id is required")
    elif not any(scope.values()):
        raise ValueError("a rule needs a scope: caller, address, server, tool or category")
    if expires_at is not None and expires_at <= _now():
        raise ValueError("the expiry is not in the future")
    with _suppressions_lock(data_dir):
        rules = load_suppressions(data_dir)
        for r in rules:
            same = (r.entity_type, r.entity_id, *(getattr(r, f) for f in SCOPE_FIELDS)) == (
                entity_type,
                entity_id,
                *(scope[f] for f in SCOPE_FIELDS),
            )
            if same and r.expires_at is None and expires_at is None:
                return r
        rule = SuppressionRule(
            id=f"sup-{uuid.uuid4().hex[:12]}",
            entity_type=entity_type,
            entity_id=entity_id,
            created_at=_iso(_now()),
            created_by=created_by,
            note=note,
            alert_id=alert_id,
            incident_id=incident_id,
            expires_at=_iso(expires_at) if expires_at else None,
            **scope,
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


def alert_tools(alert: Mapping[str, Any]) -> set[str]:
    """Tools an alert is about, from its evidence (:data:`TOOL_EVIDENCE_FIELDS`, ``tools``)."""
    ev = alert.get("evidence")
    if isinstance(ev, str | bytes):
        try:
            ev = orjson.loads(ev)
        except orjson.JSONDecodeError:
            return set()
    if not isinstance(ev, dict):
        return set()
    found = {str(ev[f]) for f in TOOL_EVIDENCE_FIELDS if isinstance(ev.get(f), str)}
    tools = ev.get("tools")
    if isinstance(tools, list):
        found |= {t for t in tools if isinstance(t, str)}
    elif isinstance(tools, dict):
        found |= {str(t) for t in tools}
    return found


def _caller_vouched(alert: Mapping[str, Any]) -> bool:
    # A caller rule silences a caller the log's writer vouched for; a self-declared name
    # (caller_authenticated false) could be anyone's (issue 28). Unknown: as before.
    return alert.get("caller_authenticated") is not False


def matches(rule: SuppressionRule, alert: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether ``rule`` suppresses ``alert`` (a mapping with the alert schema's columns).

    Every scope field the rule sets must match: ``caller_id`` / ``client_ip`` the alert's
    column of that name or its entity of that type; ``server`` and ``category`` the
    column; ``tool`` one of :func:`alert_tools`. A version-1 entity matches as before.
    """
    if rule.expired(now):
        return False
    if rule.category is not None and alert.get("category") != rule.category:
        return False
    if rule.server is not None and alert.get("server") != rule.server:
        return False
    for field in ("caller_id", "client_ip"):
        want = getattr(rule, field)
        if want is None:
            continue
        own = alert.get(field) == want or (
            alert.get("entity_type") == field and alert.get("entity_id") == want
        )
        if not own or (field == "caller_id" and not _caller_vouched(alert)):
            return False
    if rule.tool is not None and rule.tool not in alert_tools(alert):
        return False
    if rule.entity_type is None:
        return True
    if rule.entity_type == "caller_id" and not _caller_vouched(alert):
        return False
    if alert.get("entity_type") == rule.entity_type and alert.get("entity_id") == rule.entity_id:
        return True
    return alert.get(_ENTITY_FIELD[rule.entity_type]) == rule.entity_id


def is_suppressed(
    alert: Mapping[str, Any], rules: list[SuppressionRule], now: datetime | None = None
) -> SuppressionRule | None:
    """The first active rule suppressing ``alert``, or ``None``."""
    now = now or _now()
    return next((r for r in rules if matches(r, alert, now)), None)


def suppressed_by(
    alerts: pl.DataFrame, rules: list[SuppressionRule], now: datetime | None = None
) -> pl.Series:
    """Per alert, the id of the first active rule suppressing it (null: none).

    One pass per alert over the (few) active rules; alerts, not events, so a frame of
    thousands at most.
    """
    now = now or _now()
    active = [r for r in rules if not r.expired(now)]
    if not active or alerts.height == 0:
        return pl.Series("suppressed_by", [None] * alerts.height, dtype=pl.Utf8)
    ids = [
        (r.id if (r := is_suppressed(a, active, now)) else None)
        for a in alerts.iter_rows(named=True)
    ]
    return pl.Series("suppressed_by", ids, dtype=pl.Utf8)


def rules_frame(rules: list[SuppressionRule], now: datetime | None = None) -> pl.DataFrame:
    """Rules as a frame for display: id, scope, state (active / expired), expiry, note."""
    now = now or _now()
    cols = ["id", "scope", "state", *SuppressionRule.__dataclass_fields__]
    rows = [
        {"scope": r.scope_text(), "state": "expired" if r.expired(now) else "active", **asdict(r)}
        for r in rules
    ]
    return pl.DataFrame(rows, schema={c: pl.Utf8 for c in dict.fromkeys(cols)})


def rule_scope_for(alert: Mapping[str, Any]) -> dict[str, str | None]:
    """The actor scope to suggest for a rule made from an alert or an incident.

    A session id never recurs, so the caller (else the client address) is suggested: the
    alert's own columns first, then its entity. Only a session-only alert falls back to
    its session.
    """
    etype, eid = alert.get("entity_type"), alert.get("entity_id")
    caller = alert.get("caller_id") or (eid if etype == "caller_id" else None)
    ip = alert.get("client_ip") or (eid if etype == "client_ip" else None)
    if caller:
        return {"caller_id": caller, "client_ip": None}
    if ip:
        return {"caller_id": None, "client_ip": ip}
    return {"caller_id": None, "client_ip": None}


def _caller_auth(events: pl.LazyFrame) -> pl.LazyFrame:
    """Per caller: false when any event says not authenticated, null when none says
    anything, else true (``caller_id``, ``caller_authenticated``)."""
    import polars as pl

    return (
        events.filter(pl.col("caller_id").is_not_null())
        .group_by("caller_id")
        .agg(
            pl.when(pl.col("caller_authenticated").not_().any())
            .then(pl.lit(False))
            .when(pl.col("caller_authenticated").is_null().all())
            .then(pl.lit(None, pl.Boolean))
            .otherwise(pl.lit(True))
            .alias("caller_authenticated")
        )
    )


def has_caller_rules(data_dir: Path) -> bool:
    """Whether some triage rule is scoped by caller (only those need authentication)."""
    return any(
        r.entity_type == "caller_id" or getattr(r, "caller_id", None) is not None
        for r in load_suppressions(data_dir)
    )


def apply_triage_suppressions(
    alerts: pl.DataFrame,
    data_dir: Path,
    events: pl.DataFrame | None = None,
    *,
    unauthenticated: bool = False,
    auth: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Drop alerts matched by rules an analyst created by marking a false positive.

    The rules live in ``<data_dir>/_triage/suppressions.json`` (written by the dashboard;
    see docs/dashboard.md). Config allowlists are applied by the detectors themselves.
    With ``events`` (the detected rows), each alert's caller is marked not authenticated
    when any of its events says ``caller_authenticated = false`` (a self-declared name),
    authenticated when they all say true, unknown when none says anything: a caller rule
    never silences a caller marked not authenticated
    (:func:`matches`), unless ``unauthenticated`` (``[triage]
    suppress_unauthenticated_callers``) says a claimed name is enough. ``auth`` gives
    that marking directly (``caller_id``, ``caller_authenticated``), for partitioned
    analysis, which never holds every event.
    """
    rules = load_suppressions(data_dir)
    if not rules or alerts.height == 0:
        return alerts
    rows = alerts
    if unauthenticated or "caller_id" not in alerts.columns:
        # Configured to trust the claimed name: the alert carries no marking, and
        # triage.matches treats an unknown caller as vouched for.
        auth = None
    elif auth is None and (
        events is not None
        and "caller_authenticated" in events.columns
        and has_caller_rules(data_dir)
    ):
        auth = _caller_auth(events.lazy()).collect()
    if auth is not None:
        rows = alerts.join(
            auth.select("caller_id", "caller_authenticated"),
            on="caller_id",
            how="left",
            maintain_order="left",
        )
    keep = [is_suppressed(row, rules) is None for row in rows.iter_rows(named=True)]
    return alerts.filter(pl.Series(keep, dtype=pl.Boolean))
