"""A small, deterministic store with alerts, for the dashboard's tests and demos.

It does not depend on the detectors: events, summaries, quarantined lines and alerts
are written directly with the store's schemas. It includes a hostile session whose tool
name, arguments, caller id and reasons carry HTML/script payloads, so tests can check
that the dashboard renders them as literal text.

Examples
--------
>>> from dashboard.testdata import build_store
>>> info = build_store("/tmp/tw-fixture")  # doctest: +SKIP
>>> info.xss_tool
'<img src=x onerror=alert(1)>'
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from toolwatch import schema
from toolwatch.store import Store

#: Start of the fixture's log time.
BASE = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)

XSS_TOOL = "<img src=x onerror=alert(1)>"
XSS_ARG = "<script>window.__xss=1</script>"
XSS_CALLER = "mallory<script>window.__xss=1</script>"


@dataclass
class FixtureInfo:
    """What :func:`build_store` wrote, for assertions.

    Attributes
    ----------
    data_dir
        The store directory.
    alerts
        Alert id -> alert row as written.
    sessions
        Session id -> caller id.
    """

    data_dir: Path
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: dict[str, str | None] = field(default_factory=dict)
    xss_tool: str = XSS_TOOL
    xss_arg: str = XSS_ARG
    xss_caller: str = XSS_CALLER
    xss_session: str = "sess-anomaly-7"
    enum_session: str = "sess-enum-1"
    enum_caller: str = "agent-harvester"
    enum_tool: str = "crm.getContact"
    stuffing_ip: str = "198.51.100.23"


def _eid(*parts: object) -> str:
    return hashlib.md5(":".join(map(str, parts)).encode()).hexdigest()[:24]  # noqa: S324


class _Events:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.offset = 0

    def add(
        self,
        ts: datetime,
        session: str,
        caller: str | None,
        ip: str,
        server: str,
        tool: str,
        args: dict[str, Any],
        *,
        status: str = "ok",
        nbytes: int = 800,
        rows: int | None = 1,
        resource: str | None = None,
        credential_hash: str | None = None,
    ) -> None:
        self.offset += 200
        raw = {
            "timestamp": ts.isoformat(),
            "sessionId": session,
            "callerId": caller,
            "clientIp": ip,
            "server": server,
            "tool": tool,
            "arguments": args,
            "outcome": status,
            "bytes": nbytes,
        }
        self.rows.append(
            {
                "event_id": _eid("fixture", self.offset),
                "ts": ts,
                "session_id": session,
                "session_derived": False,
                "caller_id": caller,
                "client_ip": ip,
                "server": server,
                "tool": tool,
                "args": orjson.dumps(args).decode(),
                "resource_key": "id" if resource else None,
                "resource_id": resource,
                "status": status,
                "status_raw": status,
                "is_error": status not in ("ok",),
                "bytes": nbytes,
                "rows": rows,
                "duration_ms": 20.0 + (self.offset % 97),
                "credential_hash": credential_hash,
                "format": "call",
                "source": f"fixture/{server}.jsonl",
                "source_fp": hashlib.md5(server.encode()).hexdigest()[:16],  # noqa: S324
                "offset": self.offset,
                "line_no": self.offset // 200,
                "raw": orjson.dumps(raw).decode(),
                "ingested_at": ts + timedelta(seconds=5),
            }
        )


def _alert(
    alert_id: str,
    category: str,
    detector: str,
    severity: str,
    score: float,
    entity_type: str,
    entity_id: str,
    *,
    session_id: str | None,
    caller_id: str | None,
    client_ip: str | None,
    server: str | None,
    first_seen: datetime,
    last_seen: datetime,
    reasons: list[str],
    evidence: dict[str, Any],
) -> dict[str, Any]:
    return {
        "alert_id": alert_id,
        "category": category,
        "detector": detector,
        "severity": severity,
        "score": score,
        "entity_type": entity_type,
        "entity_id": entity_id,
        "session_id": session_id,
        "caller_id": caller_id,
        "client_ip": client_ip,
        "server": server,
        "first_seen": first_seen,
        "last_seen": last_seen,
        "detected_at": last_seen + timedelta(minutes=1),
        "reasons": reasons,
        "evidence": orjson.dumps(evidence).decode(),
    }


def build_store(data_dir: str | Path, *, seed: int = 7) -> FixtureInfo:
    """Write a deterministic fixture store into ``data_dir``.

    Parameters
    ----------
    data_dir
        Directory of the store; created if missing. Should be empty.
    seed
        Seed of the benign traffic's randomness.

    Returns
    -------
    FixtureInfo
        Ids and hostile strings the tests look for.
    """
    rnd = random.Random(seed)  # noqa: S311 - test data, not crypto
    info = FixtureInfo(data_dir=Path(data_dir))
    ev = _Events()

    # Benign assistants spread over two days.
    benign_tools = {
        "docs-server": ["docs.search", "docs.read", "docs.list"],
        "crm-server": ["crm.getContact", "crm.searchContacts", "crm.updateNote"],
        "travel-server": ["travel.searchFlights", "travel.book"],
    }
    callers = ["alice-assistant", "bob-copilot", "ci-bot", "support-agent"]
    for n in range(24):
        caller = callers[n % len(callers)]
        server = list(benign_tools)[n % 3]
        sid = f"sess-benign-{n:02d}"
        info.sessions[sid] = caller
        t = BASE + timedelta(hours=2 * n, minutes=rnd.randint(0, 50))
        ip = f"10.0.{n % 4}.{10 + n % 7}"
        for _ in range(rnd.randint(4, 14)):
            tool = rnd.choice(benign_tools[server])
            res = f"{server.split('-')[0]}/{rnd.randint(1, 40)}"
            status = "ok" if rnd.random() > 0.08 else "not_found"
            ev.add(
                t,
                sid,
                caller,
                ip,
                server,
                tool,
                {"id": res},
                status=status,
                nbytes=rnd.randint(300, 9000),
                resource=res,
            )
            t += timedelta(seconds=rnd.randint(5, 300))

    # Enumeration: sequential contact ids, many misses.
    s = info.enum_session
    info.sessions[s] = info.enum_caller
    t0 = BASE + timedelta(hours=20, minutes=3)
    t = t0
    for i in range(150):
        rid = f"contact/{1000 + i}"
        ev.add(
            t,
            s,
            info.enum_caller,
            "203.0.113.7",
            "crm-server",
            info.enum_tool,
            {"id": rid},
            status="not_found" if i % 3 else "ok",
            nbytes=120 if i % 3 else 2400,
            resource=rid,
        )
        t += timedelta(seconds=2)
    enum_last = t
    # The same caller earlier, from another address: the entity page should show both.
    s2 = "sess-enum-0"
    info.sessions[s2] = info.enum_caller
    t = t0 - timedelta(hours=1)
    for i in range(12):
        ev.add(
            t,
            s2,
            info.enum_caller,
            "203.0.113.8",
            "crm-server",
            "crm.searchContacts",
            {"q": f"a{i}"},
            nbytes=1500,
            resource=None,
        )
        t += timedelta(seconds=40)

    # Bulk extraction: few calls, huge responses.
    s = "sess-bulk-1"
    info.sessions[s] = "svc-export"
    t_bulk = BASE + timedelta(hours=30)
    t = t_bulk
    for i in range(18):
        ev.add(
            t,
            s,
            "svc-export",
            "10.9.8.7",
            "docs-server",
            "docs.export",
            {"folder": f"finance/{i}", "format": "csv"},
            nbytes=30_000_000 + i * 1_000_000,
            rows=100_000,
            resource=f"folder/finance/{i}",
        )
        t += timedelta(minutes=3)
    bulk_last = t

    # Credential stuffing from one address across many sessions.
    t_cred = BASE + timedelta(hours=26)
    for k in range(6):
        sid = f"sess-cred-{k}"
        info.sessions[sid] = f"user{k}"
        t = t_cred + timedelta(minutes=4 * k)
        for j in range(8):
            ev.add(
                t,
                sid,
                f"user{k}",
                info.stuffing_ip,
                "crm-server",
                "auth.login",
                {"username": f"user{k}", "password": f"hmac:{_eid(k, j)}"},
                status="auth_failed",
                nbytes=90,
                rows=None,
                credential_hash=f"hmac:{_eid(k, j)}",
            )
            t += timedelta(seconds=3)
    cred_last = t

    # The hostile session: HTML/script in tool, args and caller id.
    s = info.xss_session
    info.sessions[s] = XSS_CALLER
    t_x = BASE + timedelta(hours=36)
    t = t_x
    for i in range(9):
        tool = XSS_TOOL if i % 2 == 0 else "docs.read"
        ev.add(
            t,
            s,
            XSS_CALLER,
            "192.0.2.66",
            "docs-server",
            tool,
            {"path": XSS_ARG, "n": i},
            status="error" if i % 3 == 0 else "ok",
            nbytes=4000 + 700 * i,
            resource=f"doc/{XSS_ARG}",
        )
        t += timedelta(seconds=25)
    xss_last = t

    # Scraping loop: the same search over and over, by a caller.
    s = "sess-loop-1"
    info.sessions[s] = "crawler-9"
    t_loop = BASE + timedelta(hours=40)
    t = t_loop
    for _ in range(60):
        ev.add(
            t,
            s,
            "crawler-9",
            "198.18.0.4",
            "wiki-server",
            "wiki.search",
            {"q": "salary"},
            nbytes=5000,
            resource="wiki/search",
        )
        t += timedelta(seconds=10)
    loop_last = t

    events = pa.Table.from_pylist(ev.rows, schema=schema.EVENTS)

    alerts = [
        _alert(
            "al-enum-0001",
            "enumeration",
            "rules.enumeration",
            "high",
            0.91,
            "session",
            info.enum_session,
            session_id=info.enum_session,
            caller_id=info.enum_caller,
            client_ip="203.0.113.7",
            server="crm-server",
            first_seen=t0,
            last_seen=enum_last,
            reasons=[
                "150 calls of crm.getContact over sequential ids contact/1000..1149",
                "100 of 150 calls returned not_found (67%)",
            ],
            evidence={"sequential_run": 150, "not_found_ratio": 0.67},
        ),
        _alert(
            "al-bulk-0002",
            "bulk_extraction",
            "rules.bulk_extraction",
            "critical",
            0.98,
            "session",
            "sess-bulk-1",
            session_id="sess-bulk-1",
            caller_id="svc-export",
            client_ip="10.9.8.7",
            server="docs-server",
            first_seen=t_bulk,
            last_seen=bulk_last,
            reasons=["693 MB returned in 54 minutes, 40x this caller's daily median"],
            evidence={"total_bytes": 693_000_000, "baseline_bytes": 17_000_000},
        ),
        _alert(
            "al-cred-0003",
            "credential_stuffing",
            "rules.credential_stuffing",
            "high",
            0.88,
            "client_ip",
            info.stuffing_ip,
            session_id=None,
            caller_id=None,
            client_ip=info.stuffing_ip,
            server="crm-server",
            first_seen=t_cred,
            last_seen=cred_last,
            reasons=["48 auth_failed logins for 6 distinct usernames from one address"],
            evidence={"auth_failures": 48, "distinct_credentials": 48},
        ),
        _alert(
            "al-anom-0004",
            "anomaly",
            "isolation_forest",
            "medium",
            0.71,
            "session",
            info.xss_session,
            session_id=info.xss_session,
            caller_id=XSS_CALLER,
            client_ip="192.0.2.66",
            server="docs-server",
            first_seen=t_x,
            last_seen=xss_last,
            reasons=[
                f"unusual tool {XSS_TOOL} called 5 times",
                f"argument path={XSS_ARG} never seen before",
            ],
            # the shape of detectors/forest.py's evidence
            evidence={
                "driving_features": {
                    "rare_tool_ratio": {"value": 0.56, "typical": 0.0, "score_drop": 0.44},
                    "error_ratio": {"value": 0.33, "typical": 0.05, "score_drop": 0.31},
                    "distinct_tools": {"value": 2, "typical": 3, "score_drop": 0.12},
                    "bytes_per_call": {"value": 6800, "typical": 4100, "score_drop": -0.05},
                },
                "features": {"calls": 9, "error_ratio": 0.33},
                "threshold": 0.6,
                "n_train": 1200,
                "top_tool": XSS_TOOL,
            },
        ),
        _alert(
            "al-loop-0005",
            "scraping_loop",
            "rules.scraping_loop",
            "medium",
            0.64,
            "caller_id",
            "crawler-9",
            session_id="sess-loop-1",
            caller_id="crawler-9",
            client_ip="198.18.0.4",
            server="wiki-server",
            first_seen=t_loop,
            last_seen=loop_last,
            reasons=["60 identical wiki.search calls at a 10 s period"],
            evidence={"period_s": 10.0, "repeats": 60},
        ),
        _alert(
            "al-anom-0006",
            "anomaly",
            "isolation_forest",
            "low",
            0.52,
            "session",
            "sess-benign-05",
            session_id="sess-benign-05",
            caller_id="bob-copilot",
            client_ip="10.0.1.15",
            server="travel-server",
            first_seen=BASE + timedelta(hours=10),
            last_seen=BASE + timedelta(hours=11),
            reasons=["session slightly longer than usual"],
            evidence={
                "contributions": [
                    {"feature": "duration_s", "contribution": 0.2},
                    {"feature": "calls", "contribution": 0.1},
                ]
            },
        ),
    ]
    # An older version of the enumeration alert: the alerts view keeps the latest only.
    old = dict(
        alerts[0],
        severity="medium",
        detected_at=alerts[0]["detected_at"] - timedelta(minutes=30),
        reasons=["early version"],
    )
    alerts_tbl = pa.Table.from_pylist([old, *alerts], schema=schema.ALERTS)
    info.alerts = {a["alert_id"]: a for a in alerts}

    q_rows = [
        {
            "event_id": _eid("q", i),
            "reason": reason,
            "detail": "fixture",
            "source": "fixture/crm-server.jsonl",
            "source_fp": "q",
            "offset": i,
            "line_no": i,
            "raw": raw,
            "raw_bytes": len(raw),
            "ingested_at": BASE + timedelta(hours=i),
        }
        for i, (reason, raw) in enumerate(
            [
                ("invalid_json", '{"tool": "x"'),
                ("invalid_json", "garbage"),
                ("not_object", "[1,2]"),
                ("missing_timestamp", '{"tool":"<b>bold</b>"}'),
            ]
        )
    ]
    summaries = [
        {
            "event_id": _eid("s", 1),
            "ts": bulk_last,
            "kind": "SESSION_END",
            "session_id": "sess-bulk-1",
            "caller_id": "svc-export",
            "client_ip": "10.9.8.7",
            "server": "docs-server",
            "call_count": 18,
            "unique_resources": 18,
            "total_bytes": 693_000_000,
            "auth_failures": 0,
            "duration_ms": 3_240_000.0,
            "source": "fixture/summaries.jsonl",
            "source_fp": "s",
            "offset": 0,
            "line_no": 1,
            "raw": "{}",
            "ingested_at": bulk_last,
        },
    ]
    store = Store(data_dir)
    try:
        store.write_batch(
            {
                "events": events,
                "alerts": alerts_tbl,
                "quarantine": pa.Table.from_pylist(q_rows, schema=schema.QUARANTINE),
                "summaries": pa.Table.from_pylist(summaries, schema=schema.SUMMARIES),
            }
        )
    finally:
        store.close()
    return info
