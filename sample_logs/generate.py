"""Seeded, realistic MCP tool-call traffic generator with ground-truth labels.

Two modes:

* **demo** (``--out-dir DIR``): simulates a few days of traffic against several
  MCP servers (each logging in its own style), injects benign hard negatives and
  labelled attacks, and writes per-server log files plus ``labels.ndjson`` and
  ``manifest.json``.
* **bench** (``--bench-events N --bench-out FILE``): streams *N* mixed-style
  per-call events (one JSON object per line) to *FILE* for parser benchmarks.

Both modes are fully deterministic for a given seed (byte-identical output).

Examples
--------
::

    python sample_logs/generate.py --out-dir sample_logs/demo --seed 7 --scale 1.0
    python sample_logs/generate.py --bench-events 5000000 --bench-out /tmp/bench.jsonl
"""

from __future__ import annotations

import argparse
import base64
import calendar
import gzip
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

try:  # package import (tests) or script run (python sample_logs/generate.py)
    from toolwatch.sample_logs import gen_concurrency, gen_sequence
except ImportError:  # pragma: no cover
    import gen_concurrency  # type: ignore[no-redef]
    import gen_sequence  # type: ignore[no-redef]

__all__ = [
    "ALIASES",
    "ATTACK_LABELS",
    "BENIGN_ROLES",
    "START_EPOCH",
    "generate",
    "generate_bench",
    "main",
]

#: 2026-11-02T00:00:00Z
START_EPOCH: int = calendar.timegm((2026, 11, 2, 0, 0, 0))
#: Number of simulated days in the demo set.
DAYS: int = 4

#: Field aliases the toolwatch parser accepts (first match wins on its side).
ALIASES: dict[str, tuple[str, ...]] = {
    "time": ("ts", "timestamp", "time", "@timestamp"),
    "session": ("session_id", "sessionId", "session", "mcp.session.id"),
    "caller": ("caller_id", "callerId", "user_id", "userId", "authenticatedUserId", "principal"),
    "client_ip": ("client_ip", "clientIp", "ip", "remote_addr"),
    "server": ("server", "server_name", "serverName"),
    "tool": ("tool", "toolName", "tool_name", "name", "gen_ai.tool.name"),
    "args": ("args", "arguments", "params", "input"),
    "resource": ("resource_id", "resourceId"),
    "status": ("status", "outcome"),
    "is_error": ("isError", "is_error"),
    "bytes": ("bytes", "bytes_returned", "bytesReturned", "response_bytes"),
    "rows": ("rows", "rows_returned", "rowsReturned"),
    "duration": ("duration_ms", "durationMs", "latency_ms"),
}

#: Attack categories used as ``label`` values (besides ``benign``).
ATTACK_LABELS: tuple[str, ...] = (
    "enumeration",
    "bulk_extraction",
    "credential_stuffing",
    "scraping_loop",
    *gen_sequence.LABELS,
    *gen_concurrency.LABELS,
)

#: Benign roles that are always present in the demo set.
BENIGN_ROLES: tuple[str, ...] = (
    "normal_user",
    "power_user",
    "nightly_export",
    "typo_user",
    "retry_client",
    "booking_customer",
    "ci_bot",
    *gen_concurrency.ROLES,
)

# --------------------------------------------------------------------------- #
# Static vocabulary
# --------------------------------------------------------------------------- #

# server -> (log style, session-id style)
_SERVERS: dict[str, str] = {
    "docs-server": "docs",
    "crm-server": "crm",
    "travel-server": "travel",
    "integrations-server": "integrations",
    "kb-server": "kb",  # logged by a JSON-RPC proxy (transcript)
    "wiki-server": "wiki",  # new MCP revision: no session id at all
    "billing-server": "billing",  # session summaries only
}

_CATALOG: dict[str, tuple[tuple[str, ...], tuple[float, ...]]] = {
    "docs-server": (
        (
            "searchItems",
            "getDocument",
            "listDocuments",
            "readFile",
            "summarizeDocument",
            "exportReport",
        ),
        (0.30, 0.34, 0.10, 0.10, 0.11, 0.05),
    ),
    "crm-server": (
        (
            "searchItems",
            "getContact",
            "getAccount",
            "listOpportunities",
            "logActivity",
            "exportReport",
        ),
        (0.30, 0.30, 0.14, 0.11, 0.10, 0.05),
    ),
    "travel-server": (
        ("searchItems", "listBookings", "getBooking", "getItinerary", "cancelBooking"),
        (0.38, 0.20, 0.25, 0.14, 0.03),
    ),
    "integrations-server": (
        ("listConnections", "fetchUrl", "syncData", "getConnection", "connectExternalService"),
        (0.28, 0.32, 0.18, 0.17, 0.05),
    ),
    "kb-server": (("searchItems", "getDocument", "readFile", "fetchUrl"), (0.40, 0.38, 0.14, 0.08)),
    "wiki-server": (("searchItems", "getPage", "listRecentChanges"), (0.36, 0.46, 0.18)),
}

_QUERIES: tuple[str, ...] = (
    "q3 planning",
    "onboarding checklist",
    "incident postmortem",
    "pricing tiers",
    "renewal contract",
    "security review",
    "okr draft",
    "vendor assessment",
    "release notes 4.2",
    "customer escalation",
    "travel policy",
    "expense report",
    "roadmap h1",
    "api rate limits",
    "data retention",
    "soc2 evidence",
    "board deck",
    "hiring plan",
    "churn analysis",
    "design doc auth",
    "migration runbook",
    "oncall handbook",
    "benchmark results",
    "privacy notice",
    "acme renewal",
    "globex pilot",
    "initech invoice",
    "umbrella contract",
    "sla breach",
    "quarterly forecast",
    "partner list",
    "competitor notes",
)
_ROUTES: tuple[str, ...] = (
    "SFO-JFK",
    "LHR-CDG",
    "BER-MUC",
    "AMS-LIS",
    "ORD-SEA",
    "FRA-SIN",
    "MAD-BCN",
    "BOS-LAX",
    "ZRH-VIE",
    "NRT-HND",
    "DXB-BOM",
    "YYZ-YVR",
)
_SERVICES: tuple[str, ...] = (
    "salesforce",
    "hubspot",
    "jira",
    "slack",
    "github",
    "zendesk",
    "snowflake",
)
_URLS: tuple[str, ...] = (
    "https://status.vendor.example/api/v2/summary.json",
    "https://intranet.acme.example/wiki/Onboarding",
    "https://api.tracker.example/v1/issues?state=open",
    "https://news.example.com/markets/today",
    "https://docs.partner.example/reference/rest",
    "https://calendar.acme.example/feeds/team.ics",
    "https://weather.example.org/forecast?city=berlin",
)
_TEAMS: tuple[str, ...] = ("eng", "sales", "finance", "legal", "ops", "marketing", "support", "hr")
_UAS: tuple[str, ...] = (
    "claude-desktop/0.14.2",
    "cursor/1.6.3",
    "mcp-python-sdk/1.12.0",
    "vscode-copilot/1.301",
    "langchain-mcp-adapters/0.1.9",
    "openai-agents/0.3.1",
    "mcp-typescript-sdk/1.17.4",
)
_UA_WEIGHTS: tuple[float, ...] = (0.30, 0.20, 0.12, 0.15, 0.08, 0.08, 0.07)
_ATTACK_UAS: tuple[str, ...] = (
    "python-httpx/0.27.2",
    "mcp-python-sdk/1.12.0",
    "Go-http-client/2.0",
    "claude-desktop/0.14.2",
)
_CORP_NATS: tuple[str, ...] = ("198.51.100.23", "198.51.100.24", "203.0.113.77")
_HOME_PREFIXES: tuple[int, ...] = (24, 73, 81, 86, 92, 109, 151, 176, 188, 212)
_HOSTING_PREFIXES: tuple[str, ...] = ("45.155", "185.220", "5.188", "104.244", "193.32", "91.219")
_TITLES: tuple[str, ...] = (
    "Q3 planning notes",
    "Onboarding checklist",
    "Incident 2291 postmortem",
    "Pricing FAQ",
    "Security review: SSO",
    "Vendor assessment",
    "Design doc: token refresh",
    "Runbook: failover",
)

# canonical outcome -> per-style vocabulary
_STATUS: dict[str, dict[str, str]] = {
    "docs": {
        "ok": "ok",
        "not_found": "not_found",
        "denied": "denied",
        "auth_failed": "auth_failed",
        "rate_limited": "rate_limited",
        "error": "error",
    },
    "crm": {
        "ok": "success",
        "not_found": "not_found",
        "denied": "forbidden",
        "auth_failed": "unauthorized",
        "rate_limited": "rate_limited",
        "error": "error",
    },
    "travel": {
        "ok": "ok",
        "not_found": "404",
        "denied": "403",
        "auth_failed": "401",
        "rate_limited": "429",
        "error": "error",
    },
    "integrations": {
        "ok": "success",
        "not_found": "not_found",
        "denied": "denied",
        "auth_failed": "auth_failed",
        "rate_limited": "rate_limited",
        "error": "error",
    },
    "wiki": {
        "ok": "ok",
        "not_found": "not_found",
        "denied": "forbidden",
        "auth_failed": "401",
        "rate_limited": "429",
        "error": "error",
    },
}
_LEVEL: dict[str, str] = {
    "ok": "info",
    "not_found": "warn",
    "denied": "warn",
    "auth_failed": "error",
    "rate_limited": "warn",
    "error": "error",
}

# tool -> (median bytes, sigma, rows mode, median duration ms)
_SIZES: dict[str, tuple[float, float, str, float]] = {
    "searchItems": (9000, 0.6, "list", 180),
    "getDocument": (6000, 0.9, "one", 45),
    "summarizeDocument": (1500, 0.4, "one", 2400),
    "listDocuments": (7000, 0.5, "list", 90),
    "readFile": (4000, 1.0, "one", 35),
    "exportReport": (450000, 0.9, "export", 4500),
    "getContact": (1800, 0.4, "one", 40),
    "getAccount": (2500, 0.4, "one", 45),
    "listOpportunities": (6000, 0.6, "list", 120),
    "logActivity": (300, 0.2, "zero", 60),
    "listBookings": (3500, 0.5, "list", 110),
    "getBooking": (1600, 0.3, "one", 40),
    "getItinerary": (4200, 0.4, "one", 70),
    "cancelBooking": (400, 0.2, "one", 300),
    "listConnections": (1200, 0.3, "list", 35),
    "getConnection": (700, 0.2, "one", 25),
    "syncData": (2500, 0.8, "list", 3500),
    "fetchUrl": (22000, 1.1, "zero", 600),
    "connectExternalService": (180, 0.1, "zero", 420),
    "getPage": (5500, 0.8, "one", 50),
    "listRecentChanges": (4000, 0.3, "list", 80),
}

_SESSIONLESS_MARGIN = 50 * 60.0  # keep sessionless sessions of one key > 30 min apart
_MAX_SESSIONLESS_GAP = 25 * 60.0


# --------------------------------------------------------------------------- #
# Data model
# --------------------------------------------------------------------------- #


@dataclass
class Call:
    """One tool call in canonical form (rendered per server style later)."""

    t: float
    tool: str
    args: dict[str, Any]
    status: str = "ok"
    nbytes: int = 0
    rows: int = 0
    duration_ms: int = 0
    resource: str | None = None
    mangle: str | None = None


@dataclass
class Session:
    """A labelled session (or a summary-only session when ``summary`` is set)."""

    server: str
    session_id: str | None
    caller_id: str | None
    client_ip: str
    user_agent: str
    label: str
    role: str
    variant: str | None = None
    calls: list[Call] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    str_ids: bool = False
    #: Name of the multi-stage actor (``_Demo._campaigns``) this session belongs to.
    campaign: str | None = None

    @property
    def first(self) -> float:
        """Start time (epoch seconds)."""
        if self.summary is not None:
            return self.summary["end"] - self.summary["durationMs"] / 1000.0
        return self.calls[0].t

    @property
    def last(self) -> float:
        """Time of the last call (epoch seconds)."""
        if self.summary is not None:
            return self.summary["end"]
        return self.calls[-1].t


@dataclass
class _User:
    caller_id: str
    ip: str
    ua: str
    team: str
    docs: list[int]
    bookings: list[int]
    contacts: list[int]
    accounts: list[int]
    api_key: str
    conns: list[str]
    power: bool = False


# --------------------------------------------------------------------------- #
# Time formatting helpers
# --------------------------------------------------------------------------- #


def _iso_z(t: float) -> str:
    ms = round(t * 1000)
    sec, rem = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{rem:03d}Z"


def _iso_plus(t: float) -> str:
    us = round(t * 1_000_000)
    sec, rem = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{rem:06d}+00:00"


def _diurnal_weight(hour: float) -> float:
    return 0.07 + 0.93 * math.exp(-(((hour - 14.5) / 4.2) ** 2))


# --------------------------------------------------------------------------- #
# Demo generator
# --------------------------------------------------------------------------- #


class _Demo:
    """Builds the labelled demo traffic; all randomness comes from ``self.rng``."""

    def __init__(self, seed: int, scale: float) -> None:
        self.rng = random.Random(seed)
        self.scale = scale
        self.t0 = float(START_EPOCH)
        self.span = DAYS * 86400.0
        self.sessions: list[Session] = []
        self.entities: list[dict[str, Any]] = []
        self._sl_busy: dict[str, list[tuple[float, float]]] = {}
        self._sids: set[str] = set()
        #: Second categories campaign sessions earn (by ``id(session)``, as
        #: gen_sequence.mark_also): reads that feed the campaign's exfiltration.
        self.campaign_also: dict[int, list[str]] = {}
        self._build_world()

    # ------------------------------------------------------------ helpers --
    def n(self, base: int, minimum: int = 1) -> int:
        return max(minimum, round(base * self.scale))

    def hex(self, k: int) -> str:
        return f"{self.rng.getrandbits(4 * k):0{k}x}"

    def uuid(self) -> str:
        h = self.hex(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"

    def new_sid(self, server: str) -> str:
        style = _SERVERS[server]
        while True:
            if style == "docs":
                sid = "sess_" + self.hex(16)
            elif style in ("crm", "integrations"):
                sid = self.uuid()
            elif style == "travel":
                sid = "trv-" + self.hex(12)
            elif style == "kb":
                sid = self.hex(32)
            else:
                sid = "bl-" + self.hex(12)
            if sid not in self._sids:
                self._sids.add(sid)
                return sid

    def home_ip(self) -> str:
        r = self.rng
        if r.random() < 0.06:
            a, b, c = (
                r.randrange(0x1000, 0xFFFF),
                r.randrange(0x1000, 0xFFFF),
                r.randrange(1, 0xFFF),
            )
            return f"2a02:8108:{a:x}:{b:x}::{c:x}"
        a, b, c = r.randrange(1, 255), r.randrange(0, 255), r.randrange(1, 255)
        return f"{r.choice(_HOME_PREFIXES)}.{a}.{b}.{c}"

    def hosting_ip(self) -> str:
        r = self.rng
        return f"{r.choice(_HOSTING_PREFIXES)}.{r.randrange(0, 255)}.{r.randrange(1, 255)}"

    def secret(self, kind: str = "sk") -> str:
        # deliberately fake-looking formats (no real provider prefixes)
        if kind == "tok":
            return "tok_demo_" + self.hex(28)
        if kind == "pw":
            words = (
                "Summer",
                "Winter",
                "Welcome",
                "Passw0rd",
                "Acme",
                "Qwerty",
                "Dragon",
                "Monkey",
            )
            return (
                f"{self.rng.choice(words)}{self.rng.randrange(1, 2027)}{self.rng.choice('!#$%.')}"
            )
        return "sk-demo-" + self.hex(32)

    def diurnal_start(self, lo: float = 0.0, hi: float | None = None) -> float:
        hi = self.span - 3600.0 if hi is None else hi
        while True:
            off = self.rng.uniform(lo, hi)
            if self.rng.random() < _diurnal_weight((off % 86400.0) / 3600.0):
                return self.t0 + off

    def gap_human(self) -> float:
        return min(900.0, max(2.0, self.rng.lognormvariate(math.log(24.0), 0.95)))

    def gap_agent(self) -> float:
        return min(20.0, max(0.04, self.rng.lognormvariate(math.log(0.9), 0.75)))

    def lognorm_int(self, median: float, sigma: float) -> int:
        return max(1, int(self.rng.lognormvariate(math.log(median), sigma)))

    # -------------------------------------------------------------- world --
    def _build_world(self) -> None:
        r = self.rng
        n_users = self.n(240, 60)
        self.doc_owner: dict[int, str] = {}
        self.doc_public: dict[int, bool] = {}
        self.booking_owner: dict[int, str] = {}
        self.users: list[_User] = []
        for _ in range(n_users):
            cid = "u_" + self.hex(8)
            ip = r.choice(_CORP_NATS) if r.random() < 0.33 else self.home_ip()
            ua = r.choices(_UAS, _UA_WEIGHTS)[0]
            docs = r.sample(range(1000, 10000), r.randrange(6, 28))
            books = r.sample(range(1000, 10000), r.randrange(4, 13))
            contacts = r.sample(range(10000, 60000), r.randrange(15, 60))
            accounts = r.sample(range(100, 1000), r.randrange(2, 7))
            conns = [f"conn-{self.hex(6)}" for _ in range(r.randrange(1, 4))]
            u = _User(
                cid, ip, ua, r.choice(_TEAMS), docs, books, contacts, accounts, self.secret(), conns
            )
            self.users.append(u)
            for d in docs:
                if d not in self.doc_owner:
                    self.doc_owner[d] = cid
                    self.doc_public[d] = r.random() < 0.08
            for b in books:
                self.booking_owner.setdefault(b, cid)
        # power users get large, team-wide document sets
        self.power_users = self.users[: self.n(12, 3)]
        for u in self.power_users:
            u.power = True
            extra = r.sample(sorted(self.doc_owner), 90)
            u.docs = u.docs + extra
        self.wiki_missing = set(r.sample(range(1000, 5000), 300))
        self.wiki_restricted = set(r.sample(range(1000, 5000), 350))
        self._users_pool = self.users[len(self.power_users) :]

    def pick_user(self) -> _User:
        return self.rng.choice(self._users_pool)

    # --------------------------------------------------------- call maker --
    def _noise(self) -> str:
        x = self.rng.random()
        if x < 0.010:
            return "not_found"
        if x < 0.017:
            return "error"
        if x < 0.021:
            return "rate_limited"
        if x < 0.024:
            return "denied"
        return "ok"

    def doc_status(self, d: int, caller: str, idor: bool = False) -> str:
        owner = self.doc_owner.get(d)
        if owner is None:
            return "not_found"
        if owner == caller or self.doc_public.get(d, False):
            return "ok"
        return "ok" if idor and self.rng.random() < 0.6 else "denied"

    def _default_args(
        self, server: str, tool: str, u: _User
    ) -> tuple[dict[str, Any], str | None, str]:
        r = self.rng
        q = r.choice(_QUERIES)
        if tool == "searchItems":
            if server == "docs-server":
                return (
                    {
                        "query": q,
                        "page": r.choices((1, 2, 3), (0.82, 0.13, 0.05))[0],
                        "page_size": 20,
                    },
                    None,
                    "ok",
                )
            if server == "crm-server":
                a: dict[str, Any] = {"query": q, "limit": 25}
                if r.random() < 0.15:
                    a["cursor"] = base64.b64encode(
                        f"offset={25 * r.randrange(1, 4)}".encode()
                    ).decode()
                return a, None, "ok"
            if server == "travel-server":
                day = r.randrange(5, 60)
                return (
                    {
                        "query": r.choice(_ROUTES),
                        "date": _iso_z(self.t0 + day * 86400)[:10],
                        "page": 1,
                    },
                    None,
                    "ok",
                )
            return {"query": q, "page": 1} if server == "wiki-server" else {"query": q}, None, "ok"
        if tool in ("getDocument", "summarizeDocument"):
            d = r.choice(u.docs)
            a = {"documentId": f"doc-{d}"}
            if tool == "summarizeDocument":
                a["maxWords"] = r.choice((100, 200, 300))
            st = (
                "ok"
                if self.doc_owner.get(d) == u.caller_id or u.power
                else self.doc_status(d, u.caller_id)
            )
            if st == "denied" and r.random() < 0.8:
                st = "ok"  # shared with the user
            return a, f"doc-{d}", st
        if tool == "listDocuments":
            return {"folderId": f"fld-{u.team}-{r.randrange(1, 9)}", "limit": 50}, None, "ok"
        if tool == "readFile":
            stem = r.choice(("notes", "plan", "budget", "minutes", "spec"))
            p = f"/shared/{u.team}/{stem}-{r.randrange(1, 40)}.md"
            return {"path": p}, p, "ok"
        if tool == "exportReport":
            if server == "crm-server":
                return (
                    {
                        "reportType": r.choice(("pipeline", "activities", "forecast")),
                        "from": "2026-10-01",
                        "to": "2026-10-31",
                        "format": "csv",
                    },
                    None,
                    "ok",
                )
            return (
                {"reportId": f"rpt-{r.randrange(100, 999)}", "format": r.choice(("pdf", "csv"))},
                None,
                "ok",
            )
        if tool == "getContact":
            c = r.choice(u.contacts)
            return {"contactId": f"ct-{c}"}, f"ct-{c}", "ok"
        if tool in ("getAccount", "listOpportunities"):
            acc = r.choice(u.accounts)
            a = {"accountId": f"acct-{acc}"}
            if tool == "listOpportunities":
                a["stage"] = r.choice(("open", "won", "all"))
            return a, f"acct-{acc}", "ok"
        if tool == "logActivity":
            c = r.choice(u.contacts)
            return (
                {
                    "contactId": f"ct-{c}",
                    "type": r.choice(("call", "email", "meeting")),
                    "note": "follow up next week",
                },
                f"ct-{c}",
                "ok",
            )
        if tool == "listBookings":
            return {"page": 1, "status": r.choice(("upcoming", "all"))}, None, "ok"
        if tool in ("getBooking", "getItinerary", "cancelBooking"):
            b = r.choice(u.bookings)
            a = {"bookingId": f"bk-{b}"}
            if tool == "cancelBooking":
                a["reason"] = "schedule change"
            return a, f"bk-{b}", "ok"
        if tool == "listConnections":
            return {}, None, "ok"
        if tool in ("getConnection", "syncData"):
            cn = r.choice(u.conns)
            a = {"connectionId": cn}
            if tool == "syncData":
                a["mode"] = r.choice(("incremental", "incremental", "full"))
            return a, cn, "ok"
        if tool == "fetchUrl":
            return {"uri": r.choice(_URLS)}, None, "ok"
        if tool == "connectExternalService":
            key = "api_key" if server == "crm-server" else "apiKey"
            return {"service": r.choice(_SERVICES), key: u.api_key}, None, "ok"
        if tool == "getPage":
            p = r.randrange(1000, 5000)
            st = (
                "not_found"
                if p in self.wiki_missing
                else ("denied" if p in self.wiki_restricted else "ok")
            )
            return {"pageId": f"pg-{p}"}, f"pg-{p}", st
        if tool == "listRecentChanges":
            return {"space": u.team.upper(), "limit": 20}, None, "ok"
        raise ValueError(tool)

    def call(
        self,
        server: str,
        tool: str,
        u: _User | None,
        t: float,
        *,
        args: dict[str, Any] | None = None,
        resource: str | None = None,
        status: str | None = None,
        noise: bool = True,
        nbytes: int | None = None,
        rows: int | None = None,
        dur: int | None = None,
    ) -> Call:
        r = self.rng
        if args is None:
            assert u is not None
            args, resource, base = self._default_args(server, tool, u)
            status = status or base
        status = status or "ok"
        if noise and status == "ok":
            status = self._noise()
        med_b, sig, rows_mode, med_d = _SIZES[tool]
        if status == "ok":
            b = int(r.lognormvariate(math.log(med_b), sig))
            if rows_mode == "list":
                rw = max(0, int(b / r.uniform(300, 500)))
            elif rows_mode == "export":
                rw = int(b / r.uniform(150, 220))
            elif rows_mode == "one":
                rw = 1
            else:
                rw = 0
            d = int(r.lognormvariate(math.log(med_d), 0.5))
        else:
            b, rw = r.randrange(60, 240), 0
            d = int(r.lognormvariate(math.log(min(med_d, 60.0)), 0.5)) + (
                400 if status == "auth_failed" else 0
            )
        return Call(
            t,
            tool,
            args,
            status,
            b if nbytes is None else nbytes,
            rw if rows is None else rows,
            max(1, d if dur is None else dur),
            resource,
        )

    @staticmethod
    def after(c: Call, gap: float) -> float:
        return c.t + c.duration_ms / 1000.0 + gap

    def add(self, s: Session) -> Session:
        self.sessions.append(s)
        return s

    def session(
        self,
        server: str,
        u: _User | None,
        label: str = "benign",
        role: str = "normal_user",
        variant: str | None = None,
        *,
        caller: str | None = None,
        ip: str | None = None,
        ua: str | None = None,
        sessionless: bool = False,
    ) -> Session:
        sid = None if sessionless else self.new_sid(server)
        s = Session(
            server,
            sid,
            caller if caller is not None else (u.caller_id if u else None),
            ip or (u.ip if u else self.home_ip()),
            ua or (u.ua if u else self.rng.choice(_UAS)),
            label,
            role,
            variant,
        )
        s.str_ids = self.rng.random() < 0.2
        return s

    # ------------------------------------------------------ benign roles --
    def normal(
        self,
        u: _User | None,
        server: str,
        t: float,
        *,
        n: int | None = None,
        sessionless: bool = False,
        anonymous: bool = False,
        role: str = "normal_user",
    ) -> Session:
        r = self.rng
        if u is None:
            u = self.pick_user()
        s = self.session(
            server,
            u,
            role=role,
            sessionless=sessionless,
            caller="" if anonymous else None,
            ip=self.home_ip() if anonymous else None,
        )
        if anonymous:
            s.caller_id = None
        n = n or min(30, self.lognorm_int(5.0, 0.75))
        agentic = r.random() < 0.5
        tools, w = _CATALOG[server]
        for _ in range(n):
            c = self.call(server, r.choices(tools, w)[0], u, t)
            s.calls.append(c)
            if server == "kb-server" and r.random() < 0.15:
                gap = r.uniform(0.002, 0.03)  # parallel tool calls -> interleaved responses
            elif agentic and r.random() < 0.6:
                gap = self.gap_agent()
            else:
                gap = self.gap_human()
            t = self.after(c, gap)
        return s

    def power(self, u: _User, server: str, t: float) -> Session:
        r = self.rng
        s = self.session(server, u, role="power_user")
        n = r.randrange(100, 221)
        tools, w = _CATALOG[server]
        # flatter tool mix than a normal user (diverse), but exports stay occasional
        w = tuple(
            0.025 if tl == "exportReport" else math.sqrt(x) for tl, x in zip(tools, w, strict=True)
        )
        burst = 0
        for _ in range(n):
            tool = r.choices(tools, w)[0]
            kw: dict[str, Any] = {}
            if tool == "exportReport":
                kw["nbytes"] = int(r.lognormvariate(math.log(800_000), 0.6))
                kw["rows"] = kw["nbytes"] // 190
            c = self.call(server, tool, u, t, **kw)
            s.calls.append(c)
            if burst <= 0:
                burst = r.randrange(3, 15)
                gap = min(1200.0, r.lognormvariate(math.log(150.0), 0.8))
            else:
                burst -= 1
                gap = self.gap_agent()
            t = self.after(c, gap)
        return s

    def nightly_export(self, night: int, server: str) -> Session:
        r = self.rng
        if server == "crm-server":
            caller, ip, ua, hour = "svc-nightly-export", "10.40.2.15", "airflow-mcp/2.9.1", 2.0
        else:
            caller, ip, ua, hour = "svc-dwh-sync", "10.40.2.31", "dagster-mcp-io/1.8.4", 3.0
        t = self.t0 + night * 86400 + hour * 3600 + r.uniform(0, 240)
        s = self.session(server, None, role="nightly_export", caller=caller, ip=ip, ua=ua)
        if server == "crm-server":
            for rt in ("pipeline", "contacts", "activities", "accounts"):
                nb = int(r.lognormvariate(math.log(24_000_000), 0.12))
                c = self.call(
                    server,
                    "exportReport",
                    None,
                    t,
                    noise=False,
                    args={
                        "reportType": rt,
                        "from": "2026-01-01",
                        "to": "2026-12-31",
                        "format": "parquet",
                    },
                    nbytes=nb,
                    rows=nb // 210,
                    dur=int(r.uniform(18_000, 55_000)),
                )
                s.calls.append(c)
                t = self.after(c, r.uniform(0.4, 1.5))
            total = 35_000 + night * 140 + r.randrange(0, 60)
            pages = -(-total // 500)
            for p in range(pages):
                args: dict[str, Any] = {"query": "*", "limit": 500}
                if p:
                    args["cursor"] = base64.b64encode(f"offset={500 * p}".encode()).decode()
                rows = min(500, total - 500 * p)
                c = self.call(
                    server,
                    "searchItems",
                    None,
                    t,
                    noise=False,
                    args=args,
                    nbytes=rows * r.randrange(480, 540),
                    rows=rows,
                    dur=int(r.uniform(600, 1600)),
                )
                s.calls.append(c)
                t = self.after(c, r.uniform(0.2, 0.9))
        else:
            total = 9_000 + night * 60 + r.randrange(0, 30)
            pages = -(-total // 200)
            for p in range(1, pages + 1):
                rows = min(200, total - 200 * (p - 1))
                c = self.call(
                    server,
                    "listBookings",
                    None,
                    t,
                    noise=False,
                    args={
                        "page": p,
                        "page_size": 200,
                        "status": "all",
                        "updatedSince": "2026-01-01",
                    },
                    nbytes=rows * r.randrange(340, 380),
                    rows=rows,
                    dur=int(r.uniform(300, 900)),
                )
                s.calls.append(c)
                t = self.after(c, r.uniform(0.1, 0.5))
        return s

    def typo(self, u: _User, t: float) -> Session:
        r = self.rng
        server = "integrations-server" if r.random() < 0.7 else "crm-server"
        key_name = "api_key" if server == "crm-server" else r.choice(("apiKey", "apiKey", "token"))
        s = self.session(server, u, role="typo_user")
        svc = r.choice(_SERVICES)
        if server == "integrations-server" and r.random() < 0.7:
            c = self.call(server, "listConnections", u, t)
            s.calls.append(c)
            t = self.after(c, self.gap_human())
        good = u.api_key
        typos = []
        for _ in range(2):
            k = list(good)
            i = r.randrange(8, len(k) - 1)
            op = r.randrange(3)
            if op == 0:
                k[i], k[i + 1] = k[i + 1], k[i]
            elif op == 1:
                del k[i]
            else:
                k[i] = r.choice("0123456789abcdef".replace(k[i], ""))
            typos.append("".join(k))
        for key, st in ((typos[0], "auth_failed"), (typos[1], "auth_failed"), (good, "ok")):
            c = self.call(
                server,
                "connectExternalService",
                u,
                t,
                args={"service": svc, key_name: key},
                status=st,
                noise=False,
            )
            s.calls.append(c)
            t = self.after(c, r.uniform(6.0, 45.0))
        for _ in range(r.randrange(1, 5)):
            tool = (
                r.choice(("syncData", "getConnection", "listConnections"))
                if server == "integrations-server"
                else r.choice(("searchItems", "getContact"))
            )
            c = self.call(server, tool, u, t)
            s.calls.append(c)
            t = self.after(c, self.gap_human())
        return s

    def retry(self, u: _User, server: str, t: float) -> Session:
        r = self.rng
        s = self.session(server, u, role="retry_client")
        tools, w = _CATALOG[server]
        n = r.randrange(5, 13)
        retry_at = set(r.sample(range(n), r.randrange(1, 4)))
        for i in range(n):
            tool = r.choices(tools, w)[0]
            args, res, _ = self._default_args(server, tool, u)
            if i in retry_at:
                fail = r.choice(("rate_limited", "rate_limited", "error"))
                attempts = r.randrange(2, 5)
                backoff = r.uniform(0.8, 1.5)
                for a in range(attempts):
                    last = a == attempts - 1
                    st = ("ok" if r.random() < 0.85 else fail) if last else fail
                    c = self.call(
                        server, tool, None, t, args=dict(args), resource=res, status=st, noise=False
                    )
                    s.calls.append(c)
                    t = self.after(c, backoff * r.uniform(0.9, 1.25))
                    backoff *= 2
            else:
                c = self.call(server, tool, None, t, args=args, resource=res)
                s.calls.append(c)
                t = self.after(c, self.gap_agent() if r.random() < 0.5 else self.gap_human())
        return s

    def booking(self, u: _User, t: float) -> Session:
        r = self.rng
        server = "travel-server"
        s = self.session(server, u, role="booking_customer")
        c = self.call(server, "listBookings", u, t, args={"page": 1, "status": "all"}, noise=False)
        s.calls.append(c)
        t = self.after(c, r.uniform(1.0, 8.0))
        k = min(len(u.bookings), r.randrange(3, 9))
        for b in r.sample(u.bookings, k):
            c = self.call(
                server, "getBooking", None, t, args={"bookingId": f"bk-{b}"}, resource=f"bk-{b}"
            )
            s.calls.append(c)
            t = self.after(c, self.gap_agent() if r.random() < 0.6 else self.gap_human())
            if r.random() < 0.25:
                c = self.call(
                    server,
                    "getItinerary",
                    None,
                    t,
                    args={"bookingId": f"bk-{b}"},
                    resource=f"bk-{b}",
                )
                s.calls.append(c)
                t = self.after(c, self.gap_human())
        if r.random() < 0.3:
            s.calls.append(self.call(server, "searchItems", u, t))
        return s

    def ci_bot(
        self,
        server: str,
        t: float,
        caller: str,
        ip: str,
        tool: str,
        args: dict[str, Any],
        interval: float,
    ) -> Session:
        r = self.rng
        s = self.session(
            server, None, role="ci_bot", caller=caller, ip=ip, ua="synthetics-probe/1.2.0"
        )
        for _ in range(r.randrange(3, 6)):
            c = self.call(
                server,
                tool,
                None,
                t,
                args=dict(args),
                noise=r.random() < 0.5,
                nbytes=r.randrange(180, 260),
                rows=1,
            )
            s.calls.append(c)
            t += interval + r.gauss(0.0, 0.04)
        return s

    def summary(
        self,
        role: str,
        label: str = "benign",
        variant: str | None = None,
        *,
        event: str = "SESSION_END",
        t: float | None = None,
        calls: int | None = None,
        unique: int | None = None,
        nbytes: int | None = None,
        auth_failures: int = 0,
        duration_s: float | None = None,
        caller: str | None = None,
        ip: str | None = None,
    ) -> Session:
        r = self.rng
        u = self.pick_user()
        calls = calls if calls is not None else min(120, self.lognorm_int(8.0, 0.8))
        unique = unique if unique is not None else max(1, int(calls * r.uniform(0.3, 0.8)))
        nbytes = (
            nbytes if nbytes is not None else int(calls * r.lognormvariate(math.log(4000), 0.7))
        )
        duration_s = duration_s if duration_s is not None else calls * r.uniform(8, 60)
        t = t if t is not None else self.diurnal_start()
        s = self.session("billing-server", u, label, role, variant, caller=caller, ip=ip)
        s.summary = {
            "event": event,
            "callCount": calls,
            "uniqueResourcesAccessed": unique,
            "totalBytesReturned": nbytes,
            "authFailures": auth_failures,
            "durationMs": int(duration_s * 1000),
            "end": t + duration_s,
        }
        return s

    # ------------------------------------------------------ sessionless --
    def place_sessionless(
        self, key: str, build: Callable[[float], Session], start: Callable[[], float]
    ) -> Session:
        busy = self._sl_busy.setdefault(key, [])
        for _ in range(500):
            s = build(start())
            a, b = s.first, s.last
            gaps = [y.t - x.t for x, y in itertools.pairwise(s.calls)]
            if gaps and max(gaps) >= _MAX_SESSIONLESS_GAP:
                continue
            if all(b + _SESSIONLESS_MARGIN < x or a > y + _SESSIONLESS_MARGIN for x, y in busy):
                busy.append((a, b))
                return s
        raise RuntimeError(f"could not place sessionless session for {key}")

    # ----------------------------------------------------------- attacks --
    def enum_fast(self, server: str, t: float) -> Session:
        r = self.rng
        if server == "travel-server":
            u = self.pick_user()  # a real customer abusing an IDOR
            s = self.session(
                server, u, "enumeration", "enumeration", "fast", ua="python-httpx/0.27.2"
            )
            ids, prefix, key = range(5500, 5751), "bk-", "bookingId"
            tool = "getBooking"
        elif server == "kb-server":
            u = self.pick_user()  # compromised account, new address
            s = self.session(
                server,
                u,
                "enumeration",
                "enumeration",
                "fast",
                ip=self.hosting_ip(),
                ua="mcp-python-sdk/1.12.0",
            )
            ids, prefix, key, tool = range(2000, 2201), "doc-", "documentId", "getDocument"
        else:
            u = None
            s = self.session(
                server,
                None,
                "enumeration",
                "enumeration",
                "fast",
                caller="u_" + self.hex(8),
                ip=self.hosting_ip(),
                ua=r.choice(_ATTACK_UAS),
            )
            ids, prefix, key, tool = range(1000, 1301), "doc-", "documentId", "getDocument"
        warm = self.call(server, "searchItems", self.pick_user(), t)
        s.calls.append(warm)
        t = self.after(warm, r.uniform(2, 10))
        limited_at = r.randrange(90, 160) if server == "travel-server" else -1
        for i, rid in enumerate(ids):
            if r.random() < 0.04:
                continue  # the walker skips a few ids
            if i == limited_at:
                for _ in range(r.randrange(3, 7)):
                    c = self.call(
                        server,
                        tool,
                        None,
                        t,
                        args={key: f"{prefix}{rid}"},
                        resource=f"{prefix}{rid}",
                        status="rate_limited",
                        noise=False,
                    )
                    s.calls.append(c)
                    t = self.after(c, r.uniform(1.5, 4.0))
            if prefix == "bk-":
                owner = self.booking_owner.get(rid)
                st = (
                    "not_found"
                    if owner is None
                    else ("ok" if owner == s.caller_id or r.random() < 0.55 else "denied")
                )
            else:
                st = self.doc_status(rid, s.caller_id or "")
            c = self.call(
                server,
                tool,
                None,
                t,
                args={key: f"{prefix}{rid}"},
                resource=f"{prefix}{rid}",
                status=st,
                noise=False,
            )
            s.calls.append(c)
            t = self.after(c, min(3.0, max(0.05, r.lognormvariate(math.log(0.35), 0.5))))
        return s

    def enum_slow(
        self, server: str, t: float, sessionless: bool = False, u: _User | None = None
    ) -> Session:
        r = self.rng
        u = u or self.pick_user()
        s = self.session(
            server, u, "enumeration", "enumeration", "low_and_slow", sessionless=sessionless
        )
        if server == "crm-server":
            start, prefix, key, tool = r.randrange(20000, 50000), "ct-", "contactId", "getContact"
        elif server == "wiki-server":
            start, prefix, key, tool = r.randrange(3000, 4500), "pg-", "pageId", "getPage"
        else:
            start, prefix, key, tool = r.randrange(3000, 9000), "doc-", "documentId", "getDocument"
        n_probe = r.randrange(28, 34)
        step = 3 * 3600.0 / n_probe
        tools, w = _CATALOG[server]
        for i in range(n_probe):
            rid = start + i
            if prefix == "doc-":
                st = self.doc_status(rid, u.caller_id)
            elif prefix == "pg-":
                st = (
                    "not_found"
                    if rid in self.wiki_missing
                    else ("denied" if rid in self.wiki_restricted else "ok")
                )
            else:
                st = "ok" if r.random() < 0.25 else r.choice(("denied", "denied", "not_found"))
            s.calls.append(
                self.call(
                    server,
                    tool,
                    None,
                    t,
                    args={key: f"{prefix}{rid}"},
                    resource=f"{prefix}{rid}",
                    status=st,
                    noise=False,
                )
            )
            if r.random() < 0.3:  # blend in with an ordinary call
                c = self.call(server, r.choices(tools, w)[0], u, t + r.uniform(20, 120))
                s.calls.append(c)
            t += step * r.uniform(0.55, 1.45)
        return s

    def bulk(self, server: str, t: float) -> Session:
        r = self.rng
        u = self.pick_user()
        s = self.session(
            server,
            u,
            "bulk_extraction",
            "bulk_extraction",
            None,
            ip=self.hosting_ip() if r.random() < 0.5 else None,
            ua=r.choice(_ATTACK_UAS),
        )
        c = self.call(server, "searchItems", u, t)
        s.calls.append(c)
        t = self.after(c, r.uniform(3, 20))
        if server == "docs-server":
            total, size = r.randrange(11_000, 15_000), 100
        elif server == "crm-server":
            total, size = r.randrange(30_000, 36_000), 250
        else:
            total, size = r.randrange(8_500, 9_500), 100
        pages = -(-total // size)
        for p in range(pages):
            rows = min(size, total - p * size)
            if server == "docs-server":
                tool, args = "searchItems", {"query": "", "page": p + 1, "page_size": size}
            elif server == "crm-server":
                tool, args = "searchItems", {"query": "*", "limit": size}
                if p:
                    args["cursor"] = base64.b64encode(f"offset={size * p}".encode()).decode()
            else:
                tool, args = "listBookings", {"page": p + 1, "page_size": size, "status": "all"}
            st = "rate_limited" if r.random() < 0.03 else "ok"
            c = self.call(
                server,
                tool,
                None,
                t,
                args=args,
                status=st,
                noise=False,
                nbytes=rows * r.randrange(420, 520) if st == "ok" else 120,
                rows=rows if st == "ok" else 0,
                dur=int(r.uniform(150, 700)),
            )
            s.calls.append(c)
            t = self.after(c, r.uniform(0.1, 0.8) if st == "ok" else r.uniform(2, 6))
        return s

    def bulk_relative(self, u: _User, server: str, t: float) -> Session:
        r = self.rng
        s = self.session(server, u, "bulk_extraction", "bulk_extraction", "relative")
        for p in range(1, r.randrange(12, 20)):
            c = self.call(
                server,
                "searchItems",
                None,
                t,
                noise=False,
                args={"query": r.choice(_QUERIES), "page": p, "page_size": 100}
                if server == "docs-server"
                else {"query": r.choice(_QUERIES), "limit": 100},
                nbytes=100 * r.randrange(420, 520),
                rows=100,
            )
            s.calls.append(c)
            t = self.after(c, self.gap_agent())
        for _ in range(r.randrange(3, 5)):
            nb = int(r.lognormvariate(math.log(1_400_000), 0.3))
            c = self.call(server, "exportReport", u, t, noise=False, nbytes=nb, rows=nb // 190)
            s.calls.append(c)
            t = self.after(c, self.gap_agent() + r.uniform(0, 20))
        for _ in range(r.randrange(2, 6)):
            c = self.call(server, r.choice(_CATALOG[server][0][:3]), u, t)
            s.calls.append(c)
            t = self.after(c, self.gap_human())
        return s

    def cred_fast(self, server: str, t: float) -> Session:
        r = self.rng
        u = self.pick_user()
        s = self.session(
            server,
            u,
            "credential_stuffing",
            "credential_stuffing",
            "fast",
            ip=self.hosting_ip(),
            ua=r.choice(_ATTACK_UAS),
        )
        key_name = (
            r.choice(("api_key", "password"))
            if server == "crm-server"
            else r.choice(("apiKey", "token"))
        )
        svc = r.choice(_SERVICES)
        if r.random() < 0.7:
            c = self.call(
                server,
                "listConnections" if server == "integrations-server" else "searchItems",
                u,
                t,
            )
            s.calls.append(c)
            t = self.after(c, r.uniform(1, 5))
        n = r.randrange(40, 110)
        for i in range(n):
            args: dict[str, Any] = {"service": svc}
            if key_name == "password":
                args["username"] = f"admin{r.choice(('', '1', '@acme.example'))}"
            args[key_name] = self.secret(
                "pw" if key_name == "password" else ("tok" if key_name == "token" else "sk")
            )
            st = (
                "ok"
                if (i == n - 1 and r.random() < 0.5)
                else ("rate_limited" if r.random() < 0.05 else "auth_failed")
            )
            c = self.call(
                server, "connectExternalService", None, t, args=args, status=st, noise=False
            )
            s.calls.append(c)
            t = self.after(c, r.uniform(0.3, 2.5) if st != "rate_limited" else r.uniform(5, 15))
        return s

    def cred_distributed(self, server: str, by: str, t_start: float) -> None:
        r = self.rng
        n_sess = r.randrange(20, 29)
        ip = self.hosting_ip()
        victim = self.pick_user()
        key_name = "api_key" if server == "crm-server" else "apiKey"
        svc = r.choice(_SERVICES)
        first = last = None
        t_span = r.uniform(8, 20) * 3600
        starts = sorted(t_start + r.uniform(0, t_span) for _ in range(n_sess))
        entity = ip if by == "client_ip" else victim.caller_id
        for t in starts:
            if by == "client_ip":
                s = self.session(
                    server,
                    None,
                    "credential_stuffing",
                    "credential_stuffing",
                    "distributed",
                    caller="u_" + self.hex(8),
                    ip=ip,
                    ua=r.choice(_UAS),
                )
            else:
                s = self.session(
                    server,
                    victim,
                    "credential_stuffing",
                    "credential_stuffing",
                    "distributed",
                    ip=f"{r.choice(_HOME_PREFIXES)}.{r.randrange(1, 255)}.{r.randrange(0, 255)}."
                    f"{r.randrange(1, 255)}",
                    ua=victim.ua,
                )
            if r.random() < 0.6:
                c = self.call(
                    server,
                    "listConnections" if server == "integrations-server" else "searchItems",
                    victim,
                    t,
                )
                s.calls.append(c)
                t = self.after(c, self.gap_human())
            for _ in range(r.choice((1, 2, 2))):
                c = self.call(
                    server,
                    "connectExternalService",
                    None,
                    t,
                    status="auth_failed",
                    noise=False,
                    args={"service": svc, key_name: self.secret()},
                )
                s.calls.append(c)
                t = self.after(c, r.uniform(4, 40))
            if r.random() < 0.3:
                c = self.call(
                    server,
                    "getConnection" if server == "integrations-server" else "getContact",
                    victim,
                    t,
                )
                s.calls.append(c)
            self.add(s)
            first = s.first if first is None else min(first, s.first)
            last = s.last if last is None else max(last, s.last)
        assert first is not None and last is not None
        self.entities.append(
            {
                "kind": "entity",
                "entity_type": by,
                "entity_id": entity,
                "label": "credential_stuffing",
                "role": "credential_stuffing",
                "variant": "distributed",
                "first_seen": _iso_z(first),
                "last_seen": _iso_z(last),
                "server": server,
                "n_sessions": n_sess,
            }
        )

    def scraping(
        self, server: str, t: float, sessionless: bool = False, u: _User | None = None
    ) -> Session:
        r = self.rng
        u = u or self.pick_user()
        s = self.session(
            server,
            u,
            "scraping_loop",
            "scraping_loop",
            None,
            sessionless=sessionless,
            ip=self.hosting_ip() if r.random() < 0.5 else None,
            ua=r.choice(_ATTACK_UAS),
        )
        # Walking a listing page by page (or by cursor): progressing, machine-regular.
        if server == "travel-server":
            tool, args, interval, n, pk = (
                "searchItems",
                {"query": "SFO-JFK", "date": "2026-12-20", "page": 1},
                30.0,
                150,
                "page",
            )
        elif server == "docs-server":
            tool, args, interval, n, pk = (
                "listDocuments", {"folderId": "fld-public", "page": 1}, 10.0, 200, "page")
        else:
            tool, args, interval, n, pk = (
                "listRecentChanges", {"space": "ENG", "limit": 50}, 60.0, 140, "cursor")
        n = r.randrange(int(n * 0.8), int(n * 1.2))
        for k in range(n):
            a = dict(args)
            a[pk] = k + 1 if pk == "page" else base64.b64encode(f"seq={50 * k}".encode()).decode()
            c = self.call(
                server,
                tool,
                u,
                t,
                args=a,
                nbytes=r.randrange(3800, 4400),
                dur=int(r.uniform(30, 90)),
            )
            s.calls.append(c)
            t += interval * (1 + r.gauss(0, 0.02))
        return s

    # ------------------------------------------------------------- build --
    def build(self) -> None:
        r = self.rng
        day = 86400.0
        # --- bulk_extraction "relative" callers need a history first
        rel_users = [self.pick_user() for _ in range(self.n(3, 3))]
        rel_servers = ["docs-server", "crm-server", "docs-server"]
        for i, u in enumerate(rel_users):
            srv = rel_servers[i % 3]
            for _ in range(r.randrange(5, 8)):
                self.add(self.normal(u, srv, self.diurnal_start(0, 3 * day - 3600)))

        # --- benign
        per_server = {
            "docs-server": 185,
            "crm-server": 105,
            "travel-server": 55,
            "integrations-server": 55,
            "kb-server": 75,
        }
        for srv, k in per_server.items():
            for _ in range(self.n(k)):
                self.add(self.normal(None, srv, self.diurnal_start()))
        for i, u in enumerate(self.power_users):
            srv = ("docs-server", "crm-server", "kb-server", "docs-server")[i % 4]
            self.add(self.power(u, srv, self.diurnal_start(0, self.span - 4 * 3600)))
        for night in range(DAYS):
            self.add(self.nightly_export(night, "crm-server"))
            self.add(self.nightly_export(night, "travel-server"))
            self.add(
                self.summary(
                    "nightly_export",
                    caller="svc-billing-reconcile",
                    ip="10.40.2.18",
                    t=self.t0 + night * day + 1.5 * 3600 + r.uniform(0, 120),
                    calls=1800 + night * 9 + r.randrange(0, 8),
                    unique=1700 + night * 9,
                    nbytes=int(r.uniform(88e6, 92e6)),
                    duration_s=r.uniform(1500, 1700),
                )
            )
        for _ in range(self.n(10)):
            self.add(self.typo(self.pick_user(), self.diurnal_start()))
        for _ in range(self.n(24)):
            self.add(
                self.retry(
                    self.pick_user(),
                    r.choice(("docs-server", "crm-server", "travel-server", "integrations-server")),
                    self.diurnal_start(),
                )
            )
        customers = r.sample(self._users_pool, min(len(self._users_pool), self.n(60)))
        for u in customers:
            self.add(self.booking(u, self.diurnal_start()))
        for k in range(int(self.span // 7200)):
            t = self.t0 + k * 7200 + 300 + r.uniform(0, 2)
            self.add(
                self.ci_bot(
                    "integrations-server",
                    t,
                    "svc-ci-health",
                    "10.40.7.3",
                    "listConnections",
                    {},
                    30.0,
                )
            )
        for k in range(int(self.span // 10800)):
            t = self.t0 + k * 10800 + 1200 + r.uniform(0, 2)
            self.add(
                self.ci_bot(
                    "docs-server",
                    t,
                    "svc-synthetics",
                    "10.40.7.4",
                    "searchItems",
                    {"query": "healthcheck", "page": 1, "page_size": 1},
                    20.0,
                )
            )
        for _ in range(self.n(55)):
            self.add(self.summary("normal_user"))
        self.add(
            self.summary(
                "power_user",
                event="SESSION_ANOMALY",
                calls=264,
                unique=141,
                nbytes=3_900_000,
                duration_s=7400,
            )
        )
        self.add(
            self.summary(
                "typo_user",
                event="SESSION_ANOMALY",
                calls=9,
                unique=3,
                nbytes=4200,
                auth_failures=2,
                duration_s=310,
            )
        )
        # sessionless (wiki-server): by caller, and a few anonymous (by client ip)
        wiki_users = r.sample(self._users_pool, min(len(self._users_pool), 60))
        for i in range(self.n(90)):
            u = wiki_users[i % len(wiki_users)]
            self.add(
                self.place_sessionless(
                    u.caller_id,
                    lambda t, u=u: self.normal(u, "wiki-server", t, sessionless=True),
                    self.diurnal_start,
                )
            )
        for _ in range(self.n(14)):
            s = self.normal(
                None, "wiki-server", self.diurnal_start(), sessionless=True, anonymous=True
            )
            self._sl_busy.setdefault("ip:" + s.client_ip, []).append((s.first, s.last))
            self.add(s)
        gen_sequence.build(self)

        # --- attacks (>= 3 examples of each variant); `slot` keeps the ones that
        # _campaigns() later gives to one actor
        slot: dict[str, Session] = {}
        k_att = self.n(3, 3)
        for i in range(k_att):
            srv = ("docs-server", "travel-server", "kb-server")[i % 3]
            slot[f"enum_fast/{i}"] = self.add(
                self.enum_fast(
                    srv, self.diurnal_start() if i % 2 else self.t0 + r.uniform(0, self.span - 7200)
                )
            )
        for i in range(k_att):
            srv = ("docs-server", "crm-server", "wiki-server")[i % 3]
            if srv == "wiki-server":
                u = self.pick_user()
                self.add(
                    self.place_sessionless(
                        u.caller_id,
                        lambda t, u=u: self.enum_slow("wiki-server", t, True, u),
                        lambda: self.diurnal_start(0, self.span - 4 * 3600),
                    )
                )
            else:
                slot[f"enum_slow/{i}"] = self.add(
                    self.enum_slow(srv, self.diurnal_start(0, self.span - 4 * 3600))
                )
        for i in range(k_att):
            srv = ("docs-server", "crm-server", "travel-server")[i % 3]
            # one of them at night, close to the nightly export window
            t = self.t0 + (i + 1) * day + 2.6 * 3600 if i == 1 else self.diurnal_start()
            slot[f"bulk/{i}"] = self.add(self.bulk(srv, t))
        for i, u in enumerate(rel_users):
            srv = rel_servers[i % 3]
            self.add(self.bulk_relative(u, srv, self.t0 + 3 * day + r.uniform(17, 22) * 3600))
        for i in range(k_att):
            srv = ("integrations-server", "crm-server", "integrations-server")[i % 3]
            slot[f"cred_fast/{i}"] = self.add(self.cred_fast(srv, self.diurnal_start()))
        for i in range(k_att):
            srv, by = (
                ("integrations-server", "client_ip"),
                ("integrations-server", "caller_id"),
                ("crm-server", "client_ip"),
            )[i % 3]
            self.cred_distributed(srv, by, self.t0 + r.uniform(0.1, self.span / day - 1.2) * day)
        for i in range(k_att):
            srv = ("travel-server", "docs-server", "wiki-server")[i % 3]
            if srv == "wiki-server":
                u = self.pick_user()
                self.add(
                    self.place_sessionless(
                        u.caller_id,
                        lambda t, u=u: self.scraping("wiki-server", t, True, u),
                        lambda: self.diurnal_start(0, self.span - 4 * 3600),
                    )
                )
            else:
                slot[f"scraping/{i}"] = self.add(
                    self.scraping(srv, self.diurnal_start(0, self.span - 3 * 3600))
                )
        summ_att = [
            ("bulk_extraction", "SESSION_ANOMALY", 5230, 4870, 312_000_000, 0, 2900),
            ("enumeration", "SESSION_ANOMALY", 2410, 2388, 9_100_000, 14, 1500),
            ("credential_stuffing", "SESSION_END", 912, 3, 210_000, 887, 2100),
        ]
        for i in range(k_att):
            lab, ev, calls, uniq, nb, af, dur = summ_att[i % 3]
            slot[f"summary/{lab}"] = self.add(
                self.summary(
                    lab,
                    lab,
                    "summary_only",
                    event=ev,
                    calls=calls + i,
                    unique=uniq,
                    nbytes=nb,
                    auth_failures=af,
                    duration_s=dur,
                    ip=self.hosting_ip(),
                )
            )
        gen_concurrency.add_concurrency(self)  # parallel bursts, races, hard negatives
        self._campaigns(slot)
        self._mark_mangles()

    # ---------------------------------------------------------- campaigns --
    def _built(
        self,
        label: str,
        variant: str | None = None,
        server: str | None = None,
        nth: int = 0,
    ) -> list[Session]:
        """The ``nth`` attack of ``label`` built by gen_sequence / gen_concurrency (its two
        sessions for a cross-server flow, which gen_sequence adds read half first)."""
        found = [
            k
            for k, s in enumerate(self.sessions)
            if s.label == label
            and (variant is None or s.variant == variant)
            and (server is None or s.server == server)
        ]
        if label == "cross_server_flow":
            k = found[2 * nth]
            return self.sessions[k : k + 2]
        return [self.sessions[found[nth]]]

    def _campaigns(self, slot: dict[str, Session]) -> None:
        """Give some attack sessions already built to one actor each, in kill-chain order.

        Real attackers run several stages from one account or address (the seeds: recon,
        then credential stuffing, then bulk reads, then data sent out elsewhere), and that
        is what incidents roll up. Each campaign takes existing sessions (so every variant
        keeps its examples and the attack share does not grow), gives them the identity
        of its first session and lays them end to end, a few minutes to ~40 min apart —
        inside one activity window. The anchor session keeps its time (a bulk read at
        night stays at night), the others move around it; the full four-stage story
        runs on the last afternoon, where the incident queue (risk decays) opens on it.
        Benign users keep their own identities: an actor is an attacker's own (or a
        stolen) account; a fraud or exfiltration ring gets an account of its own, a swarm
        an anonymous agent id on a hosting address. Sessionless (wiki) and
        entity-labelled sessions are left alone: their labels pin their identity and time.

        A campaign session read from within the hour before the campaign's outbound call
        on another server is part of that cross-server flow too (``also``).
        """
        r = self.rng
        b = self._built
        plans: list[tuple[str, list[list[Session]], int]] = [
            # enumerate documents, credential-stuff a connector, bulk-read with
            # searchItems, then export the CRM and upload it to a paste site
            ("harvest", [[slot["enum_fast/0"]], [slot["cred_fast/0"]], [slot["bulk/0"]],
                         b("cross_server_flow", "bulk_then_upload")], 0),
            # a customer walking other customers' bookings, then scraping and paging out
            # every booking
            ("travel_idor", [[slot["enum_fast/1"]], [slot["scraping/0"]], [slot["bulk/2"]]], 0),
            # scrape the public folder, then skip payment and stack a coupon
            ("skipper", [[slot["scraping/1"]], b("step_skip", "fulfill_without_charge"),
                         b("duplicate_execution", "coupon_twice")], 0),
            # stuffed CRM credentials, then secrets read on the files server and sent out
            ("escalate", [[slot["cred_fast/1"]], b("privilege_chain"),
                          b("cross_server_flow", "sensitive_then_send")], 0),
            # slow contact walk, a looping agent, then the night-time CRM dump
            ("crm_night", [[slot["enum_slow/1"]], b("tool_loop", server="crm-server"),
                           [slot["bulk/1"]]], 2),
            # billing-server (summaries only): stuffing, enumeration, bulk read
            ("billing", [[slot["summary/credential_stuffing"]], [slot["summary/enumeration"]],
                         [slot["summary/bulk_extraction"]]], 0),
            # a slow document walk, then stuffing an integration's API keys
            ("slow_recon", [[slot["enum_slow/0"]], [slot["cred_fast/2"]]], 0),
            # payment fraud (two rings): double charges, a double refund, approvals,
            # transfers and fulfilment without their checks
            ("fraud", [b("duplicate_execution", "no_key"),
                       b("duplicate_execution", "double_refund"),
                       b("step_skip", "approve_without_review"),
                       b("step_skip", "transfer_without_verify")], 0),
            ("fraud_2", [b("duplicate_execution", "different_keys"),
                         b("step_skip", "fulfill_without_charge", nth=1),
                         b("duplicate_execution", "no_key", nth=1)], 0),
            # secrets read, then data sent out (four actors)
            ("exfil", [b("privilege_chain", nth=1),
                       b("cross_server_flow", "sensitive_then_send", nth=1)], 0),
            ("exfil_crm", [b("privilege_chain", nth=2),
                           b("cross_server_flow", "bulk_then_upload", nth=1)], 1),
            ("exfil_2", [b("privilege_chain", nth=3),
                         b("cross_server_flow", "sensitive_then_send", nth=2)], 0),
            ("exfil_crm_2", [b("privilege_chain", nth=4),
                             b("cross_server_flow", "bulk_then_upload", nth=2)], 1),
            # agent swarms: one operator fires parallel bursts at three servers in turn
            *(
                (f"swarm_{k}", [b("concurrency_abuse", "docs", nth=k),
                                b("concurrency_abuse", "travel", nth=k),
                                b("concurrency_abuse", "jsonrpc", nth=k)], 0)
                for k in range(3)
            ),
        ]
        for name, groups, anchor in plans:
            lead = groups[0][0]
            who = (lead.caller_id, lead.client_ip, lead.user_agent)
            if name.startswith("swarm_"):
                who = ("agent-" + self.hex(6), self.hosting_ip(), r.choice(_ATTACK_UAS))
            elif name.startswith(("fraud", "exfil")):
                # gen_sequence's attacks borrow ordinary users' accounts, which their
                # other attacks may borrow too: a ring of its own keeps its story apart
                who = ("u_" + self.hex(8), who[1], who[2])
            # lay the groups end to end (relative times), then move the whole campaign so
            # the anchor keeps its start, kept inside the simulated days
            starts: list[float] = []
            t = 0.0
            for g in groups:
                starts.append(t)
                t += max(x.last for x in g) - min(x.first for x in g) + r.uniform(240, 2400)
            length = t
            origin = min(x.first for x in groups[anchor]) - starts[anchor]
            if name == "harvest":
                # the full story runs on the last afternoon, so the queue opens on it
                origin = self.t0 + (DAYS - 1) * 86400.0 + r.uniform(12, 14) * 3600.0
            origin = min(max(origin, self.t0 + 600.0), self.t0 + self.span - 600.0 - length)
            for g, start in zip(groups, starts, strict=True):
                dt = origin + start - min(x.first for x in g)
                for s in g:
                    assert s.campaign is None and s.session_id is not None, (name, s.campaign)
                    s.caller_id, s.client_ip, s.user_agent = who
                    s.campaign = name
                    for c in s.calls:
                        c.t += dt
                    if s.summary is not None:
                        s.summary["end"] += dt
            members = [s for g in groups for s in g]
            outbound = [
                (x.server, x.calls[0].t)
                for g in groups
                if g[0].label == "cross_server_flow"
                for x in g[1:]
            ]
            for s in members:
                if s.label != "cross_server_flow" and any(
                    srv != s.server and any(t_out - 3600.0 <= c.t <= t_out for c in s.calls)
                    for srv, t_out in outbound
                ):
                    self.campaign_also[id(s)] = ["cross_server_flow"]

    def _mark_mangles(self) -> None:
        """Choose benign events that will be written malformed / oddly typed."""
        r = self.rng
        plan = {
            "docs-server": ("truncate", "latin1", "drop_ts", "bytes_str", "bytes_str"),
            "crm-server": ("truncate", "bytes_str", "rows_str"),
            "travel-server": ("garbage_bytes", "bytes_str", "rows_str"),
            "integrations-server": ("truncate", "bytes_str"),
            "wiki-server": ("bytes_str", "rows_str"),
        }
        for srv, kinds in plan.items():
            cands = [
                c
                for s in self.sessions
                if s.server == srv and s.role == "normal_user" and s.label == "benign"
                for c in s.calls
                if c.status == "ok"
            ]
            for kind, c in zip(kinds, r.sample(cands, len(kinds)), strict=True):
                c.mangle = kind
                if kind == "latin1":
                    c.tool = "searchItems"
                    c.args = {"query": "café münchen offsite", "page": 1, "page_size": 20}
                    c.resource = None


# --------------------------------------------------------------------------- #
# Rendering
# --------------------------------------------------------------------------- #


class _Renderer:
    """Turns canonical sessions into per-server log lines (bytes)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.malformed: list[dict[str, Any]] = []

    def _hex(self, k: int) -> str:
        return f"{self.rng.getrandbits(4 * k):0{k}x}"

    def event(self, s: Session, c: Call) -> dict[str, Any]:
        style = _SERVERS[s.server]
        st = _STATUS[style][c.status]
        # Access-log convention: a per-call line is written when the call completes, so
        # its time is the end (start = time - duration; ingest.ts_marks = "end").
        te = c.t + c.duration_ms / 1000.0
        if style == "docs":
            d: dict[str, Any] = {
                "ts": _iso_z(te),
                "level": _LEVEL[c.status],
                "session_id": s.session_id,
                "caller_id": s.caller_id,
                "client_ip": s.client_ip,
                "server": s.server,
                "tool": c.tool,
                "args": c.args,
            }
            if c.resource:
                d["resource_id"] = c.resource
            d.update(
                {
                    "status": st,
                    "bytes": c.nbytes,
                    "rows": c.rows,
                    "duration_ms": c.duration_ms,
                    "user_agent": s.user_agent,
                }
            )
        elif style == "crm":
            d = {
                "timestamp": _iso_plus(te),
                "sessionId": s.session_id,
                "callerId": s.caller_id,
                "clientIp": s.client_ip,
                "serverName": s.server,
                "toolName": c.tool,
                "arguments": c.args,
            }
            if c.resource and self.rng.random() < 0.5:
                d["resourceId"] = c.resource
            d.update(
                {
                    "outcome": st,
                    "isError": c.status != "ok",
                    "bytesReturned": c.nbytes,
                    "rowsReturned": c.rows,
                    "durationMs": c.duration_ms,
                    "userAgent": s.user_agent,
                }
            )
        elif style == "travel":
            d = {
                "time": round(te * 1000),
                "session": s.session_id,
                "user_id": s.caller_id,
                "remote_addr": s.client_ip,
                "server_name": s.server,
                "tool_name": c.tool,
                "params": c.args,
                "status": st,
                "response_bytes": c.nbytes,
                "rows_returned": c.rows,
                "latency_ms": c.duration_ms,
            }
        elif style == "integrations":
            caller_key = (
                "principal" if (s.caller_id or "").startswith("svc-") else "authenticatedUserId"
            )
            d = {
                "@timestamp": _iso_z(te),
                "mcp.session.id": s.session_id,
                caller_key: s.caller_id,
                "ip": s.client_ip,
                "server": s.server,
                "gen_ai.tool.name": c.tool,
                "input": c.args,
                "outcome": st,
                "is_error": c.status != "ok",
                "bytes_returned": c.nbytes,
                "latency_ms": c.duration_ms,
                "trace_id": self._hex(32),
            }
        elif style == "wiki":
            d = {"timestamp": round(te, 3)}
            if s.caller_id:
                d["userId"] = s.caller_id
            d.update(
                {
                    "client_ip": s.client_ip,
                    "server": s.server,
                    "name": c.tool,
                    "args": c.args,
                    "status": st,
                    "bytes": c.nbytes,
                    "rows": c.rows,
                    "latency_ms": c.duration_ms,
                    "transport": "streamable-http-stateless",
                }
            )
        else:
            raise ValueError(style)
        return d

    def encode(self, s: Session, c: Call, d: dict[str, Any]) -> bytes:
        style = _SERVERS[s.server]
        kind = c.mangle
        if kind == "bytes_str":
            for k in ALIASES["bytes"]:
                if k in d:
                    d[k] = str(d[k])
        elif kind == "rows_str":
            for k in ALIASES["rows"]:
                if k in d:
                    d[k] = str(d[k])
        elif kind == "drop_ts":
            for k in ALIASES["time"]:
                d.pop(k, None)
        # docs/wiki loggers use Python's json (spaces), the others are compact
        if style in ("docs", "wiki"):
            line = json.dumps(d, ensure_ascii=kind != "latin1").encode("utf-8")
        else:
            line = orjson.dumps(d)
        if kind == "latin1":
            line = line.decode("utf-8").encode("latin-1")
        elif kind == "truncate":
            line = line[: int(len(line) * self.rng.uniform(0.4, 0.8))]
        elif kind == "garbage_bytes":
            line = line[:40] + b"\x00\xff\xfe\x9c\xc3(" + line[40:]
        return line

    def transcript(self, s: Session) -> list[tuple[float, bytes]]:
        r = self.rng
        out: list[tuple[float, bytes]] = []
        sid = s.session_id

        def req(t: float, msg: dict[str, Any]) -> None:
            out.append(
                (
                    t,
                    orjson.dumps(
                        {
                            "ts": _iso_plus(t),
                            "session_id": sid,
                            "direction": "request",
                            "server": s.server,
                            "caller_id": s.caller_id,
                            "client_ip": s.client_ip,
                            "message": msg,
                        }
                    ),
                )
            )

        def resp(t: float, msg: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
            d = {"ts": _iso_plus(t), "session_id": sid, "direction": "response", "server": s.server}
            if extra:
                d.update(extra)
            d["message"] = msg
            out.append((t, orjson.dumps(d)))

        t0 = s.calls[0].t - r.uniform(0.8, 3.0)
        name, _, ver = s.user_agent.partition("/")
        req(
            t0,
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": name, "version": ver},
                },
            },
        )
        resp(
            t0 + 0.021,
            {
                "jsonrpc": "2.0",
                "id": 0,
                "result": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": s.server, "version": "1.8.2"},
                },
            },
        )
        req(t0 + 0.05, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        req(t0 + 0.09, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        resp(
            t0 + 0.105,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {"tools": [{"name": n} for n in _CATALOG["kb-server"][0]]},
            },
        )
        ping_at = r.randrange(len(s.calls)) if r.random() < 0.1 else -1
        next_id = 2
        for i, c in enumerate(s.calls):
            rid: int | str = f"req-{next_id}" if s.str_ids else next_id
            next_id += 1
            req(
                c.t,
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "method": "tools/call",
                    "params": {"name": c.tool, "arguments": c.args},
                },
            )
            tr = c.t + c.duration_ms / 1000.0
            extra = {"duration_ms": c.duration_ms, "bytes": c.nbytes}
            if c.status == "ok":
                if c.tool == "searchItems":
                    hits = ", ".join(
                        f"doc-{r.randrange(1000, 10000)}" for _ in range(min(5, max(1, c.rows)))
                    )
                    text = f"Found {max(c.rows, 1)} results: {hits}"
                elif c.tool == "fetchUrl":
                    title = r.choice(_TITLES)
                    text = f"HTTP 200 ({c.nbytes} bytes) <html><head><title>{title}</title>..."
                else:
                    title, team, day = r.choice(_TITLES), r.choice(_TEAMS), r.randrange(1, 31)
                    text = f"# {title}\nOwner: {team} team. Last edited 2026-10-{day:02d}."
                msg: dict[str, Any] = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {"content": [{"type": "text", "text": text}], "isError": False},
                }
            elif c.status == "not_found":
                msg = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32001, "message": "not found"},
                }
            elif c.status == "denied":
                msg = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32003, "message": "forbidden"},
                }
            elif c.status == "rate_limited":
                msg = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32029, "message": "rate limited"},
                }
            elif c.status == "auth_failed":
                msg = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "content": [{"type": "text", "text": "unauthorized: invalid credentials"}],
                        "isError": True,
                    },
                }
            else:
                msg = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {
                        "content": [{"type": "text", "text": "Internal error: upstream timeout"}],
                        "isError": True,
                    },
                }
            resp(tr, msg, extra)
            if i == ping_at:
                pid: int | str = f"req-{next_id}" if s.str_ids else next_id
                next_id += 1
                req(tr + 0.5, {"jsonrpc": "2.0", "id": pid, "method": "ping"})
                resp(tr + 0.502, {"jsonrpc": "2.0", "id": pid, "result": {}})
        return out

    def summary(self, s: Session) -> bytes:
        sm = s.summary
        assert sm is not None
        return orjson.dumps(
            {
                "event": sm["event"],
                "sessionId": s.session_id,
                "callCount": sm["callCount"],
                "uniqueResourcesAccessed": sm["uniqueResourcesAccessed"],
                "totalBytesReturned": sm["totalBytesReturned"],
                "authFailures": sm["authFailures"],
                "ts": _iso_z(sm["end"]),
                "callerId": s.caller_id,
                "clientIp": s.client_ip,
                "durationMs": sm["durationMs"],
                "serverName": s.server,
            }
        )


_FILES: dict[str, str] = {
    "docs-server": "docs-server.jsonl",
    "crm-server": "crm-server.jsonl",
    "travel-server": "travel-server.jsonl",
    "integrations-server": "integrations-server.jsonl.gz",
    "kb-server": "proxy-transcript.jsonl",
    "wiki-server": "wiki-server.jsonl",
    "billing-server": "summaries.jsonl",
}
_SERVERS.update(gen_sequence.SERVERS)
_FILES.update(gen_sequence.FILES)
_SIZES.update(gen_sequence.SIZES)


def _write_bytes_file(path: Path, data: bytes) -> None:
    if path.name.endswith(".gz"):
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        ):
            gz.write(data)
    else:
        path.write_bytes(data)


def _label_row(s: Session) -> dict[str, Any]:
    n_calls = s.summary["callCount"] if s.summary is not None else len(s.calls)
    return {
        "kind": "session",
        "session_id": s.session_id,
        "caller_id": s.caller_id,
        "client_ip": s.client_ip,
        "server": s.server,
        "label": s.label,
        "role": s.role,
        "variant": s.variant,
        "first_seen": _iso_z(s.first),
        "last_seen": _iso_z(s.last),
        "n_calls": n_calls,
        **({"campaign": s.campaign} if s.campaign else {}),
    }


def generate(out_dir: str | Path, seed: int = 7, scale: float = 1.0) -> dict[str, Any]:
    """Generate the labelled demo traffic into ``out_dir``.

    Parameters
    ----------
    out_dir : str or Path
        Output directory (created if missing). Existing generated files are overwritten.
    seed : int, default 7
        Random seed; the same seed and scale give byte-identical files.
    scale : float, default 1.0
        Multiplier for the amount of benign traffic (every attack variant keeps at least
        3 examples).

    Returns
    -------
    dict
        Statistics: files with line counts and sizes, per-role session / event counts, and the
        list of deliberately malformed lines (also written to ``manifest.json``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    demo = _Demo(seed, scale)
    demo.build()
    ren = _Renderer(demo.rng)

    per_file: dict[str, list[tuple[float, int, bytes, str | None]]] = {
        f: [] for f in _FILES.values()
    }
    seq = 0
    role_stats: dict[str, dict[str, int]] = {}
    for s in demo.sessions:
        fname = _FILES[s.server]
        key = s.role if s.label == "benign" else f"{s.role}/{s.variant or 'default'}"
        rs = role_stats.setdefault(key, {"sessions": 0, "tool_calls": 0, "lines": 0})
        rs["sessions"] += 1
        if s.summary is not None:
            per_file[fname].append((s.summary["end"], seq, ren.summary(s), None))
            seq += 1
            rs["tool_calls"] += s.summary["callCount"]
            rs["lines"] += 1
            continue
        rs["tool_calls"] += len(s.calls)
        if s.server == "kb-server":
            lines = ren.transcript(s)
            for t, b in lines:
                per_file[fname].append((t, seq, b, None))
                seq += 1
            rs["lines"] += len(lines)
            continue
        for c in s.calls:
            d = ren.event(s, c)
            per_file[fname].append(
                (c.t + c.duration_ms / 1000.0, seq, ren.encode(s, c, d), c.mangle)
            )
            seq += 1
            rs["lines"] += 1
    # garbage lines that are not events at all
    extras = {
        "docs-server.jsonl": ["json_array", "json_array"],
        "travel-server.jsonl": ["json_array"],
        "crm-server.jsonl": ["empty"],
    }
    for fname, kinds in extras.items():
        rows = per_file[fname]
        for kind in kinds:
            base = rows[demo.rng.randrange(len(rows))]
            if kind == "json_array":
                line = orjson.dumps([_iso_z(base[0]), "getDocument", "ok", 200])
            else:
                line = b"   "
            per_file[fname].append((base[0] + 0.0005, seq, line, kind))
            seq += 1

    malformed: list[dict[str, Any]] = []
    files: dict[str, dict[str, int]] = {}
    for fname, rows in per_file.items():
        rows.sort(key=lambda x: (x[0], x[1]))
        for i, row in enumerate(rows, 1):
            if row[3] is not None:
                malformed.append({"file": fname, "line": i, "kind": row[3]})
        data = b"\n".join(r[2] for r in rows) + b"\n"
        _write_bytes_file(out / fname, data)
        files[fname] = {"lines": len(rows), "bytes": (out / fname).stat().st_size}

    also = gen_sequence.mark_also(demo.sessions)
    for k, cats in demo.campaign_also.items():
        also[k] = also.get(k, []) + [c for c in cats if c not in also.get(k, [])]
    labels = [
        {**_label_row(s), **({"also": also[id(s)]} if id(s) in also else {})}
        for s in demo.sessions
    ] + list(demo.entities)
    labels.sort(
        key=lambda x: (
            x["first_seen"],
            x["kind"],
            x.get("session_id") or "",
            x.get("caller_id") or "",
            x.get("entity_id") or "",
        )
    )
    (out / "labels.ndjson").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in labels))
    files["labels.ndjson"] = {"lines": len(labels), "bytes": (out / "labels.ndjson").stat().st_size}

    n_sess = len(demo.sessions)
    n_att = sum(1 for s in demo.sessions if s.label != "benign")
    manifest = {
        "generator": "sample_logs/generate.py",
        "seed": seed,
        "scale": scale,
        "start": _iso_z(demo.t0),
        "days": DAYS,
        "sessions": n_sess,
        "attack_sessions": n_att,
        "attack_fraction": round(n_att / n_sess, 4),
        "files": files,
        "roles": dict(sorted(role_stats.items())),
        "malformed": malformed,
    }
    (out / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
    return manifest


# --------------------------------------------------------------------------- #
# Bench mode
# --------------------------------------------------------------------------- #

_B_TOOLS: tuple[tuple[str, str, str], ...] = (
    ("getDocument", "documentId", "doc-"),
    ("searchItems", "query", ""),
    ("getBooking", "bookingId", "bk-"),
    ("readFile", "path", "/shared/eng/notes-"),
    ("getContact", "contactId", "ct-"),
    ("fetchUrl", "uri", "https://news.example.com/a/"),
    ("listBookings", "page", ""),
)
_B_STATUS_CANON: tuple[str, ...] = (
    "ok",
    "not_found",
    "denied",
    "auth_failed",
    "rate_limited",
    "error",
)
_B_STYLES: tuple[str, ...] = ("docs", "crm", "travel", "integrations", "wiki")
_B_SERVER: dict[str, str] = {
    "docs": "docs-server",
    "crm": "crm-server",
    "travel": "travel-server",
    "integrations": "integrations-server",
    "wiki": "wiki-server",
}


def generate_bench(n_events: int, out_path: str | Path, seed: int = 7) -> dict[str, Any]:
    """Stream ``n_events`` mixed-style per-call events to ``out_path`` (one JSON line each).

    Styles (snake_case, camelCase, epoch-ms, dotted keys, epoch-seconds) are mixed per session;
    about 5% of sessions carry no session id and about 0.1% of lines are malformed (truncated,
    invalid UTF-8, JSON array, missing timestamp, number-as-string). Lines are produced in
    batches of 65,536, so memory use is bounded; output is deterministic for a seed.

    Parameters
    ----------
    n_events : int
        Exact number of lines to write.
    out_path : str or Path
        Destination file (overwritten).
    seed : int, default 7
        Random seed.

    Returns
    -------
    dict
        ``{"lines": n, "seconds": s, "lines_per_second": r, "malformed": m, "sessions": k}``.
    """
    t_start = time.perf_counter()
    chunk = 65536
    prng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    pool_size = 2048
    dumps = orjson.dumps
    status_vocab = [tuple(_STATUS[st][c] for c in _B_STATUS_CANON) for st in _B_STYLES]
    n_tools = len(_B_TOOLS)
    n_queries = len(_QUERIES)
    n_sessions = 0

    def new_session() -> list[Any]:
        nonlocal n_sessions
        n_sessions += 1
        style = prng.choices(range(5), (0.30, 0.25, 0.21, 0.20, 0.04))[0]
        x = prng.random()
        kind = 0 if x < 0.90 else (1 if x < 0.93 else (2 if x < 0.96 else (3 if x < 0.98 else 4)))
        sessionless = style == 4 or prng.random() < 0.01
        sid = None if sessionless else f"s-{prng.getrandbits(64):016x}"
        caller = f"u_{prng.getrandbits(32):08x}"
        a, b, c = prng.randrange(256), prng.randrange(256), prng.randrange(1, 255)
        ip = f"{prng.choice(_HOME_PREFIXES)}.{a}.{b}.{c}"
        remaining = 1 + int(prng.expovariate(1 / 19.0))
        if kind == 1:
            remaining += 100
        counter = prng.randrange(1000, 9000)
        const_tool = _B_TOOLS[prng.randrange(n_tools)]
        return [style, sid, caller, ip, remaining, kind, counter, const_tool]

    pool = [new_session() for _ in range(pool_size)]
    t_ms = START_EPOCH * 1000
    last_sec = -1
    base = ""
    written = 0
    n_bad = 0
    with open(out_path, "wb", buffering=1 << 20) as fh:
        while written < n_events:
            m = min(chunk, n_events - written)
            slots = nrng.integers(0, pool_size, m).tolist()
            steps = np.cumsum(nrng.integers(0, 40, m)).tolist()
            res = nrng.integers(1000, 10000, m).tolist()
            picks = nrng.integers(0, 1 << 30, m).tolist()
            nbytes = nrng.lognormal(8.3, 1.1, m).astype(np.int64).tolist()
            durs = nrng.lognormal(4.0, 0.8, m).astype(np.int64).tolist()
            us = nrng.random(m).tolist()
            bad = (nrng.random(m) < 0.001).tolist()
            lines: list[bytes] = []
            append = lines.append
            for i in range(m):
                s = pool[slots[i]]
                tm = t_ms + steps[i]
                sec = tm // 1000
                if sec != last_sec:
                    last_sec = sec
                    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
                frac = tm % 1000
                style, sid, caller, ip, _rem, kind, counter, const_tool = s
                pk = picks[i]
                u = us[i]
                r = res[i]
                if kind == 0:
                    tool, key, prefix = _B_TOOLS[pk % n_tools]
                    if key == "query":
                        args: dict[str, Any] = {"query": _QUERIES[pk % n_queries], "page": 1}
                    elif key == "page":
                        args = {"page": 1 + pk % 3}
                    else:
                        args = {key: f"{prefix}{r}"}
                    st = 0 if u < 0.95 else (1 if u < 0.97 else (5 if u < 0.985 else 4))
                elif kind == 1:
                    tool = "getDocument"
                    args = {"documentId": f"doc-{counter}"}
                    st = 1 if u < 0.5 else (2 if u < 0.9 else 0)
                    s[6] = counter + 1
                elif kind == 2:
                    tool = "searchItems"
                    args = {"query": "*", "page": counter - 999, "page_size": 100}
                    st = 0
                    s[6] = counter + 1
                elif kind == 3:
                    tool = "connectExternalService"
                    args = {"service": "salesforce", "apiKey": f"sk-demo-{pk:08x}{r:04x}"}
                    st = 3 if u < 0.95 else 4
                else:
                    tool, key, prefix = const_tool
                    args = {key: f"{prefix}{counter}"}
                    st = 0
                status = status_vocab[style][st]
                b = nbytes[i] if st == 0 else 120
                rows = (b // 400) if st == 0 else 0
                if style == 0:
                    d: dict[str, Any] = {
                        "ts": f"{base}.{frac:03d}Z",
                        "session_id": sid,
                        "caller_id": caller,
                        "client_ip": ip,
                        "server": "docs-server",
                        "tool": tool,
                        "args": args,
                        "status": status,
                        "bytes": b,
                        "rows": rows,
                        "duration_ms": durs[i],
                    }
                    if sid is None:
                        del d["session_id"]
                elif style == 1:
                    d = {
                        "timestamp": f"{base}.{frac:03d}000+00:00",
                        "sessionId": sid,
                        "callerId": caller,
                        "clientIp": ip,
                        "serverName": "crm-server",
                        "toolName": tool,
                        "arguments": args,
                        "outcome": status,
                        "isError": st != 0,
                        "bytesReturned": b,
                        "rowsReturned": rows,
                        "durationMs": durs[i],
                    }
                    if sid is None:
                        del d["sessionId"]
                elif style == 2:
                    d = {
                        "time": tm,
                        "session": sid,
                        "user_id": caller,
                        "remote_addr": ip,
                        "server_name": "travel-server",
                        "tool_name": tool,
                        "params": args,
                        "status": status,
                        "response_bytes": b,
                        "rows_returned": rows,
                        "latency_ms": durs[i],
                    }
                    if sid is None:
                        del d["session"]
                elif style == 3:
                    d = {
                        "@timestamp": f"{base}.{frac:03d}Z",
                        "mcp.session.id": sid,
                        "authenticatedUserId": caller,
                        "ip": ip,
                        "server": "integrations-server",
                        "gen_ai.tool.name": tool,
                        "input": args,
                        "outcome": status,
                        "is_error": st != 0,
                        "bytes_returned": b,
                        "latency_ms": durs[i],
                    }
                    if sid is None:
                        del d["mcp.session.id"]
                else:
                    d = {
                        "timestamp": tm / 1000,
                        "userId": caller,
                        "client_ip": ip,
                        "server": "wiki-server",
                        "name": tool,
                        "args": args,
                        "status": status,
                        "bytes": b,
                        "rows": rows,
                        "latency_ms": durs[i],
                    }
                if bad[i]:
                    n_bad += 1
                    which = n_bad % 5
                    if which == 0:
                        line = dumps(d)
                        line = line[: len(line) // 2]
                    elif which == 1:
                        line = dumps(d)[:30] + b"\xff\xfe\xc3(" + dumps(d)[30:]
                    elif which == 2:
                        line = dumps([tm, tool, status])
                    elif which == 3:
                        for k in ("ts", "timestamp", "time", "@timestamp"):
                            d.pop(k, None)
                        line = dumps(d)
                    else:
                        for k in ("bytes", "bytesReturned", "response_bytes", "bytes_returned"):
                            if k in d:
                                d[k] = str(d[k])
                        line = dumps(d)
                    append(line)
                else:
                    append(dumps(d))
                s[4] -= 1
                if s[4] <= 0:
                    pool[slots[i]] = new_session()
                if len(lines) >= 2048:
                    # orjson's bytes keep a ~4 KiB buffer each: flush small batches
                    fh.write(b"\n".join(lines) + b"\n")
                    lines.clear()
            t_ms += steps[-1]
            if lines:
                fh.write(b"\n".join(lines) + b"\n")
            written += m
    secs = time.perf_counter() - t_start
    return {
        "lines": written,
        "seconds": round(secs, 3),
        "lines_per_second": int(written / secs) if secs else 0,
        "malformed": n_bad,
        "sessions": n_sessions,
    }


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (defaults to ``sys.argv[1:]``).

    Returns
    -------
    int
        Process exit code.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", help="write the labelled demo set into this directory")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--scale", type=float, default=1.0, help="multiplier for the amount of benign traffic"
    )
    p.add_argument("--bench-events", type=int, help="bench mode: number of lines to write")
    p.add_argument("--bench-out", help="bench mode: output file")
    a = p.parse_args(argv)
    if a.bench_events is None and a.out_dir is None:
        p.error("give --out-dir and/or --bench-events N --bench-out FILE")
    if a.bench_events is not None:
        if not a.bench_out:
            p.error("--bench-events needs --bench-out")
        print(json.dumps(generate_bench(a.bench_events, a.bench_out, seed=a.seed)))
    if a.out_dir is not None:
        m = generate(a.out_dir, seed=a.seed, scale=a.scale)
        print(
            json.dumps(
                {k: m[k] for k in ("sessions", "attack_sessions", "attack_fraction", "files")},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
