#!/usr/bin/env python3
"""Independent labelled MCP traffic generator for toolwatch (independent2).

Written from the five seed articles and docs/log-format.md only (see README.md).

    python benchmarks/independent2/generate.py --seed 11 --out /tmp/gen2 [--scale 1.0]

Writes DIR/<server>.jsonl (one NDJSON log per MCP server, each in its own dialect) and
DIR/labels.ndjson (one `session` line per session, benign ones included, plus `entity`
lines for attacks spread over several sessions). Deterministic per seed; stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from random import Random

SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CET = timezone(timedelta(hours=1))
EET = timezone(timedelta(hours=2))

# server -> dialect
SERVERS = {
    "docs": "canon",  # snake_case, ISO ms Z, status words, SESSION_END at process exit
    "crm": "camel",  # camelCase, epoch ms, HTTP status codes, isError, explicit resourceId
    "shop": "words",  # connection_id/user_id, ISO +02:00, status words + is_error, seconds
    "files": "nosession",  # no session id at all: ingest derives sessions (30 min gap)
    "analytics-plugin": "jsonrpc",  # community plugin behind a logging proxy (JSON-RPC)
    "warehouse": "otel",  # OpenTelemetry-style dotted keys, ISO +01:00
    "legacy-search": "summary",  # one SESSION_END / SESSION_ANOMALY line per session
}

STATUS_WORDS = {
    "canon": {
        "ok": "ok",
        "error": "error",
        "not_found": "not_found",
        "denied": "denied",
        "auth_failed": "unauthorized",
        "rate_limited": "throttled",
    },
    "camel": {
        "ok": "200",
        "error": "500",
        "not_found": "404",
        "denied": "403",
        "auth_failed": "401",
        "rate_limited": "429",
    },
    "words": {
        "ok": "success",
        "error": "failed",
        "not_found": "Not Found",
        "denied": "forbidden",
        "auth_failed": "invalid_api_key",
        "rate_limited": "throttled",
    },
    "nosession": {
        "ok": "ok",
        "error": "error",
        "not_found": "Not Found",
        "denied": "forbidden",
        "auth_failed": "unauthorized",
        "rate_limited": "429",
    },
    "otel": {
        "ok": "success",
        "error": "500",
        "not_found": "404",
        "denied": "forbidden",
        "auth_failed": "unauthorized",
        "rate_limited": "429",
    },
}

FIRST = [
    "alice",
    "bob",
    "carol",
    "dan",
    "erin",
    "farah",
    "gus",
    "hana",
    "ivan",
    "jade",
    "kofi",
    "lena",
    "marco",
    "nina",
    "omar",
    "priya",
    "quinn",
    "rosa",
    "sven",
    "tara",
    "umar",
    "vera",
    "wei",
    "xena",
    "yusuf",
    "zoe",
    "amir",
    "bea",
    "chen",
    "dara",
    "eli",
    "femi",
    "gita",
    "hugo",
    "ines",
    "jon",
    "kai",
    "lucia",
    "mei",
    "nils",
]
LAST = "abcdefghjklmnprstvwz"
SERVICES = [
    "github",
    "jira",
    "salesforce",
    "zendesk",
    "stripe",
    "hubspot",
    "slack",
    "notion",
    "gitlab",
    "datadog",
]
QUERIES = [
    "invoice",
    "acme",
    "renewal",
    "q4 forecast",
    "onboarding",
    "refund policy",
    "contract",
    "pricing",
    "roadmap",
    "incident",
    "sla",
    "churn",
    "shipping",
    "warranty",
    "gdpr",
    "budget",
    "hiring plan",
    "offsite",
    "security review",
]
SEGMENTS = ["emea", "na", "apac", "latam", "smb", "enterprise", "trial", "churned"]


def iso_ms(ms: int) -> str:
    dt = EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}Z"


def iso_us(ms: int) -> str:
    dt = EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}000Z"


def iso_tz(ms: int, tz: timezone) -> str:
    dt = (EPOCH + timedelta(milliseconds=ms)).astimezone(tz)
    off = dt.strftime("%z")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}{off[:3]}:{off[3:]}"


def iso_naive(ms: int) -> str:
    dt = EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + f".{ms % 1000:03d}"


@dataclass
class Call:
    server: str
    tool: str
    args: dict
    start: int
    dur: int
    status: str = "ok"
    nbytes: int | None = None
    rows: int | None = None
    err: str | None = None
    rid: str | None = None

    @property
    def t(self) -> int:
        """Event time as ingest stores it: completion for access logs, request for JSON-RPC."""
        return self.start if SERVERS[self.server] == "jsonrpc" else self.start + self.dur


@dataclass
class Session:
    sid: str | None
    caller: str
    ip: str
    label: str
    role: str
    variant: str | None
    calls: list[Call] = field(default_factory=list)
    also: list[str] = field(default_factory=list)
    summary: dict | None = None  # summary-only sessions (legacy-search)
    end_summary: bool = False  # docs: middleware writes SESSION_END at exit

    def add(
        self,
        server: str,
        tool: str,
        args: dict,
        start: int,
        dur: int,
        status: str = "ok",
        nbytes: int | None = None,
        rows: int | None = None,
        err: str | None = None,
        rid: str | None = None,
    ) -> int:
        self.calls.append(
            Call(server, tool, args, int(start), max(1, int(dur)), status, nbytes, rows, err, rid)
        )
        return int(start) + max(1, int(dur))

    def first(self) -> int:
        if self.summary is not None:
            return self.summary["end"] - self.summary["durationMs"]
        return min(c.t for c in self.calls)

    def last(self) -> int:
        if self.summary is not None:
            return self.summary["end"]
        return max(c.t for c in self.calls)

    def shift(self, delta: int) -> None:
        for c in self.calls:
            c.start += delta


class Gen:
    def __init__(self, seed: int, scale: float) -> None:
        self.seed = seed
        self.scale = scale
        self.r = Random(seed * 7919 + 17)
        day = 2 + seed % 20
        self.day0 = int((datetime(2026, 11, day, tzinfo=UTC) - EPOCH).total_seconds()) * SEC
        self.sessions: list[Session] = []
        self.entities: list[dict] = []
        r = self.r
        names = [f"{f}.{r.choice(LAST)}" for f in FIRST]
        r.shuffle(names)
        self.users = names[:34] + [
            f"{f}.{a}{b}" for f, a, b in zip(FIRST[:26], LAST, reversed(LAST), strict=False)
        ]
        self.home_ip = {u: self.internal_ip() for u in self.users}
        self.admins = r.sample(self.users, 4)
        self.managers = r.sample(self.users, 8)
        self.devops = r.sample(self.users, 18)
        self.support = r.sample(self.users, 9)
        self.analysts = r.sample(self.users, 8)
        self.own_docs: dict[str, list[int]] = {}
        self.doc_hi = 40000 + r.randrange(20000)
        self.cust_hi = 100000 + r.randrange(50000)
        self.paid_orders: list[tuple[int, str]] = []
        self.order_seq = r.randrange(200000, 400000)
        self.pfx = (
            r.choice(["s-", "sess-", "S"]),
            r.choice(["conn_", "c-", "ws:"]),
            r.choice(["ls", "LS-", "srch_"]),
        )

    # ----------------------------------------------------------------- helpers
    def n(self, base: float) -> int:
        return max(1, round(base * self.scale))

    def hex(self, k: int) -> str:
        return f"{self.r.getrandbits(4 * k):0{k}x}"

    def uuid(self) -> str:
        h = self.hex(32)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"

    def b36(self, k: int) -> str:
        return "".join(self.r.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(k))

    def internal_ip(self) -> str:
        r = self.r
        return f"10.{r.choice([4, 12, 20, 33, 41])}.{r.randrange(1, 250)}.{r.randrange(2, 254)}"

    def public_ip(self) -> str:
        r = self.r
        a = r.choice([45, 62, 77, 91, 103, 146, 178, 185, 194, 203])
        return f"{a}.{r.randrange(1, 255)}.{r.randrange(0, 255)}.{r.randrange(1, 255)}"

    def u(self, lo: float, hi: float) -> int:
        return int(self.r.uniform(lo, hi))

    def lat(self, median: float, spread: float = 0.6) -> int:
        return max(1, int(self.r.lognormvariate(0, spread) * median))

    def when(self, span: int = 0, business: float = 0.75) -> int:
        r = self.r
        h = r.uniform(7.0, 19.0) if r.random() < business else r.uniform(0.2, 23.8)
        start = self.day0 + int(h * HOUR)
        end_cap = self.day0 + 24 * HOUR + 2 * HOUR
        if start + span > end_cap:
            start = max(self.day0 + 5 * MIN, end_cap - span - r.randrange(HOUR))
        return start

    def sid(self, server: str) -> str | None:
        d = SERVERS[server]
        if d == "canon":
            return self.pfx[0] + self.hex(10)
        if d == "camel":
            return self.uuid()
        if d == "words":
            return self.pfx[1] + self.b36(12)
        if d == "jsonrpc":
            return "mcp-" + self.hex(16)
        if d == "otel":
            return f"wh-{self.hex(8)}-{self.r.randrange(1, 99)}"
        if d == "summary":
            return self.pfx[2] + self.hex(12)
        return None

    def sess(
        self,
        server: str,
        caller: str,
        ip: str,
        label: str,
        role: str,
        variant: str | None = None,
        sid: str | None = None,
    ) -> Session:
        s = Session(sid if sid is not None else self.sid(server), caller, ip, label, role, variant)
        self.sessions.append(s)
        return s

    def user(self, pool: list[str] | None = None) -> tuple[str, str]:
        u = self.r.choice(pool or self.users)
        ip = self.home_ip[u] if self.r.random() < 0.85 else self.internal_ip()
        return u, ip

    def attacker(self) -> tuple[str, str]:
        r = self.r
        x = r.random()
        if x < 0.35:
            u = r.choice(self.users)  # a user's agent gone wrong / hijacked by injection
            return u, (self.home_ip[u] if r.random() < 0.5 else self.public_ip())
        if x < 0.7:
            return f"agent-{self.hex(4)}", self.public_ip()
        if x < 0.85:
            return f"mcp#{self.hex(8)}", self.public_ip()
        return (
            f"svc-{r.choice(['reports', 'bi', 'sync', 'helpdesk'])}-{self.hex(3)}",
            self.internal_ip(),
        )

    def docs_of(self, u: str) -> list[int]:
        if u not in self.own_docs:
            base = self.r.randrange(1000, self.doc_hi - 500)
            self.own_docs[u] = sorted(
                {base + self.r.randrange(0, 400) for _ in range(self.r.randrange(8, 60))}
            )
        return self.own_docs[u]

    def sku(self) -> str:
        return f"SKU-{self.r.randrange(100, 9999)}"

    def ticket(self) -> str:
        return f"TCK-{self.r.randrange(10000, 99999)}"

    def any_doc(self) -> str:
        return f"doc-{self.r.randrange(1000, self.doc_hi)}"

    def order_id(self) -> str:
        self.order_seq += self.r.randrange(1, 9)
        return f"ord_{self.order_seq}"

    def entity(self, etype: str, value: str, label: str, sess: list[Session]) -> None:
        self.entities.append({"etype": etype, "value": value, "label": label, "sess": sess})

    # ------------------------------------------------------------ benign roles
    def b_doc_reader(self) -> None:
        u, ip = self.user()
        s = self.sess("docs", u, ip, "benign", "doc_reader")
        s.end_summary = self.r.random() < 0.5
        t = self.when(HOUR)
        docs = self.docs_of(u)
        if self.r.random() < 0.6:
            t = s.add(
                "docs",
                "listDocuments",
                {"limit": 20},
                t,
                self.lat(40),
                nbytes=self.u(2000, 9000),
                rows=min(20, len(docs)),
            )
        for _ in range(self.r.randrange(1, 14)):
            t += self.u(3 * SEC, 4 * MIN)
            d = self.r.choice(docs)
            t = s.add(
                "docs",
                "getDocument",
                {"documentId": f"doc-{d}"},
                t,
                self.lat(25),
                nbytes=self.u(1500, 60000),
                rows=1,
            )

    def b_search_pages(self) -> None:
        u, ip = self.user()
        srv = self.r.choice(["docs", "crm", "docs"])
        s = self.sess(srv, u, ip, "benign", "search_few_pages")
        t = self.when(HOUR)
        q = self.r.choice(QUERIES)
        limit = self.r.choice([10, 20, 25, 50])
        for p in range(1, self.r.randrange(2, 6)):
            t = s.add(
                srv,
                "searchItems",
                {"query": q, "page": p, "limit": limit},
                t,
                self.lat(80),
                nbytes=limit * self.u(150, 400),
                rows=limit,
            )
            t += self.u(4 * SEC, 60 * SEC)
        for _ in range(self.r.randrange(0, 4)):
            if srv == "docs":
                t = s.add(
                    srv,
                    "getDocument",
                    {"documentId": f"doc-{self.r.randrange(1000, self.doc_hi)}"},
                    t,
                    self.lat(25),
                    nbytes=self.u(2000, 40000),
                    rows=1,
                )
            else:
                c = f"cus_{self.r.randrange(1000, self.cust_hi)}"
                t = s.add(
                    srv,
                    "getCustomer",
                    {"customerId": c},
                    t,
                    self.lat(30),
                    nbytes=self.u(800, 4000),
                    rows=1,
                    rid=c,
                )
            t += self.u(5 * SEC, 90 * SEC)

    def b_incremental_sync(self) -> None:
        acct = f"svc-sync-{self.r.randrange(1, 6)}"
        s = self.sess(
            "docs", acct, f"10.20.0.{self.r.randrange(10, 20)}", "benign", "incremental_sync"
        )
        t = self.when(HOUR, business=0.3)
        since = iso_ms(t - 15 * MIN)
        pages = self.r.choice([1, 1, 2, 3, 5, 8, 12])
        cursor = None
        changed = []
        for p in range(pages):
            a = {"updatedSince": since, "limit": 50}
            if cursor:
                a["cursor"] = cursor
            rows = 50 if p < pages - 1 else self.r.randrange(0, 50)
            t = s.add(
                "docs", "listDocuments", a, t, self.lat(60), nbytes=rows * 180 + 90, rows=rows
            )
            cursor = self.b36(16)
            changed += [self.r.randrange(1000, self.doc_hi) for _ in range(min(rows, 3))]
            t += self.u(200, 1500)
        for d in changed[: self.r.randrange(0, 20)]:
            t = s.add(
                "docs",
                "getDocument",
                {"documentId": f"doc-{d}"},
                t,
                self.lat(25),
                nbytes=self.u(1500, 30000),
                rows=1,
            ) + self.u(100, 800)

    def b_admin_migration(self) -> None:
        u, ip = self.user(self.admins)
        s = self.sess(
            "crm", u, ip, "benign", "admin_migration", self.r.choice(["sequential", "batch_list"])
        )
        n = self.r.randrange(60, 420)
        t = self.when(n * 3 * SEC, business=0.4)
        t = s.add(
            "crm",
            "listCustomers",
            {"segment": self.r.choice(SEGMENTS), "limit": 500},
            t,
            self.lat(300),
            nbytes=n * 90,
            rows=n,
        ) + self.u(2 * SEC, 30 * SEC)
        c0 = self.r.randrange(1000, self.cust_hi - 1000)
        field_ = self.r.choice(["region", "tier", "billingCountry", "accountOwner"])
        for i in range(n):
            c = f"cus_{c0 + i * self.r.choice([1, 1, 1, 2, 3])}"
            t = s.add(
                "crm",
                "updateCustomer",
                {"customerId": c, "set": {field_: "migrated"}, "migration": "MIG-2026-11"},
                t,
                self.lat(70),
                nbytes=120,
                rows=1,
                rid=c,
            ) + self.u(150, 2500)

    def b_support_queue(self) -> None:
        u, ip = self.user(self.support)
        s = self.sess("crm", u, ip, "benign", "support_agent_queue")
        n = self.r.randrange(12, 60)
        t = self.when(n * 4 * MIN)
        for _ in range(n):
            tk = f"TCK-{self.r.randrange(10000, 99999)}"
            t = s.add(
                "crm",
                "getTicket",
                {"ticketId": tk},
                t,
                self.lat(40),
                nbytes=self.u(1500, 9000),
                rows=1,
                rid=tk,
            ) + self.u(20 * SEC, 3 * MIN)
            if self.r.random() < 0.6:
                c = f"cus_{self.r.randrange(1000, self.cust_hi)}"
                t = s.add(
                    "crm",
                    "getCustomer",
                    {"customerId": c},
                    t,
                    self.lat(30),
                    nbytes=self.u(800, 4000),
                    rows=1,
                    rid=c,
                ) + self.u(10 * SEC, 2 * MIN)
            t = s.add(
                "crm",
                "updateTicket",
                {
                    "ticketId": tk,
                    "status": self.r.choice(["pending", "solved", "waiting_on_customer"]),
                },
                t,
                self.lat(50),
                nbytes=200,
                rows=1,
                rid=tk,
            ) + self.u(30 * SEC, 6 * MIN)

    def b_analyst(self) -> None:
        u, ip = self.user(self.analysts)
        s = self.sess("warehouse", u, ip, "benign", "analyst_queries")
        t = self.when(2 * HOUR)
        metric = self.r.choice(["revenue", "signups", "churn", "orders", "tickets"])
        q = f"SELECT date_trunc('week', ts), sum({metric}) FROM facts GROUP BY 1"
        for _ in range(self.r.randrange(4, 40)):
            if self.r.random() < 0.3:
                q = q.replace("week", self.r.choice(["day", "month", "week"]))
            if self.r.random() < 0.2:
                q = (
                    f"SELECT region, avg({metric}) FROM facts WHERE ts > now() - interval "
                    f"'{self.r.randrange(7, 90)} days' GROUP BY region"
                )
            rows = self.r.randrange(4, 120)
            t = s.add(
                "warehouse",
                "runQuery",
                {"sql": q},
                t,
                self.lat(900, 0.9),
                nbytes=rows * 60,
                rows=rows,
            ) + self.u(20 * SEC, 8 * MIN)

    def b_nightly_export(self) -> None:
        acct = self.r.choice(["svc-export-nightly", "svc-bi-loader", "svc-finance-etl"])
        sid = "gw-" + self.uuid()
        s = self.sess("crm", acct, "10.12.0.7", "benign", "nightly_export_approved", sid=sid)
        t = self.day0 + self.u(0.8 * HOUR, 4.5 * HOUR)
        for _ in range(self.r.randrange(1, 4)):
            seg = self.r.choice(SEGMENTS)
            recs = self.r.randrange(1500, 12000)
            b = recs * self.u(280, 420)
            t = s.add(
                "crm",
                "get_customer_export",
                {"segment": seg, "format": "jsonl"},
                t,
                self.lat(4000),
                nbytes=b,
                rows=recs,
            ) + self.u(2 * SEC, 20 * SEC)
            t = s.add(
                "warehouse",
                "load_dataset",
                {"table": f"staging.customers_{seg}", "rows": recs, "source": "crm-export"},
                t,
                self.lat(6000),
                nbytes=300,
                rows=recs,
            ) + self.u(5 * SEC, 60 * SEC)

    def b_job_poller(self) -> None:
        u, ip = self.user(self.analysts + self.managers)
        s = self.sess("warehouse", u, ip, "benign", "job_poller")
        t = self.when(HOUR)
        job = "job_" + self.hex(10)
        t = (
            s.add(
                "warehouse",
                "submitReport",
                {
                    "report": self.r.choice(
                        ["monthly_close", "cohort_retention", "ar_aging", "pipeline"]
                    ),
                    "params": {"month": "2026-10"},
                },
                t,
                self.lat(200),
                nbytes=150,
            )
            + 2 * SEC
        )
        back = 2 * SEC
        for _ in range(self.r.randrange(4, 22)):
            t = (
                s.add("warehouse", "getJobStatus", {"jobId": job}, t, self.lat(20), nbytes=110)
                + back
            )
            back = min(int(back * self.r.uniform(1.5, 2.1)), 60 * SEC)
        s.add(
            "warehouse",
            "downloadResult",
            {"jobId": job},
            t,
            self.lat(1500),
            nbytes=self.u(200_000, 4_000_000),
            rows=self.r.randrange(1000, 30000),
        )

    def b_health_bot(self) -> None:
        bot = f"ci-bot-{self.r.randrange(1, 9)}"
        s = self.sess(
            "warehouse",
            bot,
            f"10.33.9.{self.r.randrange(2, 30)}",
            "benign",
            "ci_health_bot",
            self.r.choice(["30s", "60s", "15s"]),
        )
        every = {"30s": 30, "60s": 60, "15s": 15}[s.variant] * SEC
        span = self.u(1 * HOUR, 5 * HOUR)
        t = self.when(span, business=0.5)
        end = t + span
        svc = self.r.choice(["ingest", "api", "billing", "search"])
        while t < end:
            s.add("warehouse", "getStatus", {"service": svc}, t, self.lat(8), nbytes=90)
            t += every + self.u(-300, 300)

    def b_files_health(self) -> None:
        bot = f"healthcheck-{self.hex(3)}"
        s = self.sess(
            "files",
            bot,
            f"10.4.0.{self.r.randrange(2, 60)}",
            "benign",
            "ci_health_bot",
            "files_stat_all_day",
        )
        t = self.day0 + self.u(0, 20 * MIN)
        end = t + self.u(20 * HOUR, 23 * HOUR)
        every = self.r.choice([60, 120, 300]) * SEC
        while t < end:
            s.add("files", "stat", {"path": "/srv/healthz"}, t, self.lat(3), nbytes=60)
            t += every + self.u(-500, 500)

    def b_log_tailer(self) -> None:
        u, ip = self.user(self.devops)
        s = self.sess("files", u, ip, "benign", "log_tailer")
        span = self.u(15 * MIN, 90 * MIN)
        t = self.when(span)
        end = t + span
        path = self.r.choice(
            ["/var/log/app/app.log", "/var/log/nginx/error.log", "/srv/app/logs/worker.log"]
        )
        off = self.r.randrange(10**6, 10**8)
        while t < end:
            b = self.u(300, 20000)
            s.add(
                "files",
                "readFile",
                {"path": path, "offset": off, "length": 65536},
                t,
                self.lat(6),
                nbytes=b,
            )
            off += b
            t += self.u(15 * SEC, 70 * SEC)

    def b_config_edit(self) -> None:
        u, ip = self.user(self.devops if self.r.random() < 0.6 else None)
        s = self.sess("files", u, ip, "benign", "devops_config_edit")
        t = self.when(30 * MIN)
        app = self.r.choice(["billing", "api", "search", "web", "worker"])
        d = f"/srv/{app}/config"
        t = s.add("files", "listDirectory", {"path": d}, t, self.lat(5), nbytes=400) + self.u(
            3 * SEC, 40 * SEC
        )
        for f in self.r.sample(
            ["app.yaml", "features.json", "limits.toml", "logging.yaml"], self.r.randrange(1, 3)
        ):
            t = s.add(
                "files", "readFile", {"path": f"{d}/{f}"}, t, self.lat(4), nbytes=self.u(800, 9000)
            ) + self.u(20 * SEC, 5 * MIN)
            t = s.add(
                "files",
                "writeFile",
                {"path": f"{d}/{f}", "content": "<edited>"},
                t,
                self.lat(8),
                nbytes=40,
            ) + self.u(3 * SEC, 30 * SEC)
            if self.r.random() < 0.5:
                t = s.add(
                    "files",
                    "readFile",
                    {"path": f"{d}/{f}"},
                    t,
                    self.lat(4),
                    nbytes=self.u(800, 9000),
                ) + self.u(3 * SEC, 30 * SEC)

    def b_deploy_bot(self) -> None:
        bot = f"deploy-bot-{self.hex(2)}"
        s = self.sess("files", bot, f"10.41.1.{self.r.randrange(2, 40)}", "benign", "deploy_bot")
        t = self.when(10 * MIN)
        rel = f"r{self.r.randrange(1000, 9999)}"
        t = s.add(
            "files", "listDirectory", {"path": "/srv/releases"}, t, self.lat(6), nbytes=900
        ) + self.u(500, 3000)
        t = s.add(
            "files",
            "readFile",
            {"path": f"/srv/releases/{rel}/manifest.json"},
            t,
            self.lat(4),
            nbytes=self.u(500, 3000),
        ) + self.u(500, 3000)
        t = s.add(
            "files",
            "writeFile",
            {"path": "/srv/releases/CURRENT", "content": rel},
            t,
            self.lat(5),
            nbytes=20,
        ) + self.u(500, 3000)
        s.add(
            "files",
            "executeCommand",
            {"command": "systemctl reload app"},
            t,
            self.lat(1500),
            nbytes=120,
        )

    def b_backup(self) -> None:
        bot = f"backup-node-{self.hex(3)}"
        s = self.sess("files", bot, f"10.41.7.{self.r.randrange(2, 200)}", "benign", "backup_agent")
        t = self.day0 + self.u(1 * HOUR, 5 * HOUR)
        area = self.r.choice(["finance", "hr", "projects", "legal", "eng"])
        for i in range(self.r.randrange(30, 200)):
            t = s.add(
                "files",
                "readFile",
                {"path": f"/srv/data/{area}/part-{i:05d}.parquet"},
                t,
                self.lat(120),
                nbytes=self.u(10_000, 300_000),
            ) + self.u(50, 800)

    def b_file_browse(self) -> None:
        u, ip = self.user()
        s = self.sess("files", u, ip, "benign", "file_browse")
        t = self.when(30 * MIN)
        home = f"/home/{u.split('.')[0]}"
        t = s.add("files", "listDirectory", {"path": home}, t, self.lat(5), nbytes=700)
        for _ in range(self.r.randrange(1, 8)):
            t += self.u(5 * SEC, 3 * MIN)
            f = self.r.choice(["notes.md", "todo.txt", "draft.docx", "data.csv", "plan.md"])
            t = s.add(
                "files",
                "readFile",
                {"path": f"{home}/{f}"},
                t,
                self.lat(5),
                nbytes=self.u(300, 80000),
            )

    def checkout(self, s: Session, t: int, fulfil: bool) -> int:
        cart = "cart_" + self.b36(10)
        t = s.add(
            "shop", "createCart", {"customerRef": s.caller}, t, self.lat(30), nbytes=120
        ) + self.u(2 * SEC, 30 * SEC)
        total = 0
        for _ in range(self.r.randrange(1, 6)):
            price = self.r.choice([499, 1299, 2500, 4999, 8900, 15000])
            total += price
            t = s.add(
                "shop",
                "addItem",
                {"cartId": cart, "sku": self.sku(), "qty": self.r.randrange(1, 4)},
                t,
                self.lat(30),
                nbytes=200,
            ) + self.u(2 * SEC, 40 * SEC)
        order = self.order_id()
        t = s.add(
            "shop", "checkout", {"cartId": cart, "orderId": order}, t, self.lat(60), nbytes=300
        ) + self.u(1 * SEC, 10 * SEC)
        t = s.add(
            "shop",
            "chargePayment",
            {"orderId": order, "amountCents": total, "idempotencyKey": self.uuid()},
            t,
            self.lat(700),
            nbytes=260,
        ) + self.u(1 * SEC, 5 * SEC)
        if fulfil:
            t = s.add("shop", "fulfillOrder", {"orderId": order}, t, self.lat(200), nbytes=80)
        else:
            self.paid_orders.append((t, order))
        return t

    def b_cart_checkout(self) -> None:
        u, ip = self.user()
        s = self.sess("shop", u, ip, "benign", "cart_checkout")
        self.checkout(s, self.when(HOUR), fulfil=self.r.random() < 0.55)

    def b_idempotent_retry(self) -> None:
        u, ip = self.user()
        s = self.sess("shop", u, ip, "benign", "idempotent_retry")
        t = self.when(HOUR)
        order = self.order_id()
        amt = self.r.choice([1299, 4999, 12000, 30000])
        key = self.uuid()
        t = s.add(
            "shop",
            "createOrder",
            {"orderId": order, "amountCents": amt},
            t,
            self.lat(40),
            nbytes=150,
        ) + self.u(1 * SEC, 8 * SEC)
        for _ in range(self.r.randrange(1, 3)):
            t = s.add(
                "shop",
                "chargePayment",
                {"orderId": order, "amountCents": amt, "idempotencyKey": key},
                t,
                self.u(10_000, 30_000),
                status="error",
                err="gateway timeout",
                nbytes=60,
            ) + self.u(1 * SEC, 6 * SEC)
        t = s.add(
            "shop",
            "chargePayment",
            {"orderId": order, "amountCents": amt, "idempotencyKey": key},
            t,
            self.lat(600),
            nbytes=280,
        ) + self.u(1 * SEC, 5 * SEC)
        if self.r.random() < 0.4:
            t = s.add(
                "shop",
                "chargePayment",
                {"orderId": order, "amountCents": amt, "idempotencyKey": key},
                t,
                self.lat(40),
                nbytes=290,
            ) + self.u(1 * SEC, 5 * SEC)
        s.add("shop", "fulfillOrder", {"orderId": order}, t, self.lat(200), nbytes=80)

    def b_fulfiller(self) -> None:
        bot = f"svc-fulfil-{self.r.choice(['eu', 'us', 'uk'])}"
        s = self.sess("shop", bot, "10.20.5.11", "benign", "warehouse_fulfiller")
        t = self.day0 + self.u(8 * HOUR, 24 * HOUR)
        ready = [o for (tp, o) in self.paid_orders if tp < t - MIN]
        self.paid_orders = [(tp, o) for (tp, o) in self.paid_orders if tp >= t - MIN]
        for o in ready[:80]:
            t = s.add("shop", "fulfillOrder", {"orderId": o}, t, self.lat(200), nbytes=80) + self.u(
                300, 4000
            )
        if not s.calls:
            s.add(
                "shop",
                "listOrders",
                {"status": "paid", "limit": 100},
                t,
                self.lat(80),
                nbytes=90,
                rows=0,
            )

    def b_payroll(self) -> None:
        acct = self.r.choice(["svc-payroll", "svc-payroll-contractors", "svc-ap-payments"])
        s = self.sess("shop", acct, "10.12.3.4", "benign", "payroll_run")
        n = self.r.randrange(40, 260)
        t = self.day0 + self.u(5 * HOUR, 9 * HOUR)
        batch = f"PR-{self.r.randrange(2026100, 2026199)}"
        base = self.r.randrange(10000, 90000)
        for i in range(n):
            t = s.add(
                "shop",
                "sendPayout",
                {
                    "recipientId": f"emp_{base + i * 7}",
                    "amountCents": self.r.randrange(180000, 900000),
                    "batchId": batch,
                    "idempotencyKey": f"{batch}-{i:04d}",
                },
                t,
                self.lat(400),
                nbytes=210,
            ) + self.u(300, 3000)

    def b_treasury(self) -> None:
        acct = self.r.choice(["svc-treasury", "treasury.ops"])
        s = self.sess("shop", acct, "10.12.3.9", "benign", "treasury_sweep")
        t = self.day0 + self.u(6 * HOUR, 18 * HOUR)
        src = f"acct_treasury_{self.r.randrange(1, 4)}"
        for _ in range(self.r.randrange(12, 80)):
            t = s.add(
                "shop",
                "transfer_credits",
                {
                    "fromUserId": src,
                    "toUserId": f"acct_{self.hex(6)}",
                    "amount": self.r.choice([100, 250, 500]),
                },
                t,
                self.lat(300),
                nbytes=150,
            ) + self.u(500, 5000)

    def b_expense_manager(self) -> None:
        u, ip = self.user(self.managers)
        s = self.sess("shop", u, ip, "benign", "expense_manager")
        t = self.when(HOUR)
        t = s.add(
            "shop",
            "listExpenses",
            {"status": "submitted", "approver": u},
            t,
            self.lat(60),
            nbytes=3000,
            rows=20,
        ) + self.u(5 * SEC, 60 * SEC)
        for _ in range(self.r.randrange(2, 30)):
            e = f"exp_{self.r.randrange(10000, 99999)}"
            t = s.add("shop", "getExpense", {"expenseId": e}, t, self.lat(30), nbytes=900) + self.u(
                10 * SEC, 2 * MIN
            )
            t = s.add(
                "shop", "approveExpense", {"expenseId": e}, t, self.lat(120), nbytes=150
            ) + self.u(5 * SEC, 60 * SEC)

    def b_expense_pair(self) -> None:
        # two managers open the same expense at nearly the same time; one approves
        e = f"exp_{self.r.randrange(10000, 99999)}"
        a, b = self.r.sample(self.managers, 2)
        t = self.when(HOUR)
        s1 = self.sess("shop", a, self.home_ip[a], "benign", "expense_review_pair")
        s2 = self.sess("shop", b, self.home_ip[b], "benign", "expense_review_pair")
        s1.add("shop", "getExpense", {"expenseId": e}, t, self.lat(30), nbytes=900)
        s2.add(
            "shop", "getExpense", {"expenseId": e}, t + self.u(100, 3000), self.lat(30), nbytes=900
        )
        s1.add(
            "shop",
            "approveExpense",
            {"expenseId": e},
            t + self.u(20 * SEC, 90 * SEC),
            self.lat(120),
            nbytes=150,
        )
        s2.add(
            "shop",
            "addExpenseComment",
            {"expenseId": e, "text": "ok by me"},
            t + self.u(30 * SEC, 120 * SEC),
            self.lat(40),
            nbytes=90,
        )

    def b_credit_spender(self) -> None:
        u, ip = self.user()
        s = self.sess("shop", u, ip, "benign", "credit_spender")
        t = self.when(HOUR)
        for _ in range(self.r.randrange(2, 20)):
            t = s.add(
                "shop",
                "spend_credits",
                {
                    "userId": u,
                    "amount": self.r.choice([1, 2, 5, 10]),
                    "reason": self.r.choice(["ocr", "translate", "render"]),
                },
                t,
                self.lat(80),
                nbytes=90,
            ) + self.u(5 * SEC, 5 * MIN)

    def b_password_typo(self) -> None:
        u, ip = self.user()
        s = self.sess("crm", u, ip, "benign", "password_typo")
        t = self.when(HOUR)
        svc = self.r.choice(SERVICES)
        for _ in range(self.r.randrange(1, 3)):
            t = s.add(
                "crm",
                "connectExternalService",
                {"service": svc, "apiKey": self.hex(32)},
                t,
                self.u(500, 1000),
                status="auth_failed",
                err="Authentication failed",
            ) + self.u(5 * SEC, 60 * SEC)
        t = s.add(
            "crm",
            "connectExternalService",
            {"service": svc, "apiKey": self.hex(32)},
            t,
            self.lat(300),
            nbytes=60,
        ) + self.u(5 * SEC, 60 * SEC)
        s.add(
            "crm",
            "searchItems",
            {"query": self.r.choice(QUERIES), "page": 1},
            t,
            self.lat(80),
            nbytes=4000,
            rows=20,
        )

    def b_key_rotation(self) -> None:
        u, ip = self.user(self.devops + self.admins)
        s = self.sess("crm", u, ip, "benign", "key_rotation")
        t = self.when(HOUR)
        for svc in self.r.sample(SERVICES, self.r.randrange(1, 3)):
            old = self.hex(32)
            t = s.add(
                "crm",
                "connectExternalService",
                {"service": svc, "apiKey": old},
                t,
                self.u(500, 1000),
                status="auth_failed",
                err="Authentication failed: key revoked",
            ) + self.u(5 * SEC, 40 * SEC)
            t = s.add(
                "crm", "rotateApiKey", {"service": svc}, t, self.lat(400), nbytes=100
            ) + self.u(5 * SEC, 40 * SEC)
            t = s.add(
                "crm",
                "connectExternalService",
                {"service": svc, "apiKey": self.hex(32)},
                t,
                self.lat(300),
                nbytes=60,
            ) + self.u(5 * SEC, 40 * SEC)

    def b_multi_connector(self) -> None:
        u, ip = self.user()
        s = self.sess("crm", u, ip, "benign", "multi_connector")
        t = self.when(HOUR)
        for svc in self.r.sample(SERVICES, self.r.randrange(2, 5)):
            t = s.add(
                "crm",
                "connectExternalService",
                {"service": svc, "apiKey": self.hex(32)},
                t,
                self.lat(300),
                nbytes=60,
            ) + self.u(3 * SEC, 30 * SEC)

    def b_parallel_own(self) -> None:
        u, ip = self.user()
        s = self.sess("docs", u, ip, "benign", "parallel_own_docs")
        t = self.when(HOUR)
        docs = self.docs_of(u)
        for _ in range(self.r.randrange(1, 3)):
            k = min(len(docs), self.r.randrange(4, 11))
            for d in self.r.sample(docs, k):
                s.add(
                    "docs",
                    "getDocument",
                    {"documentId": f"doc-{d}"},
                    t + self.u(0, 40),
                    self.lat(120),
                    nbytes=self.u(2000, 50000),
                    rows=1,
                )
            t += self.u(20 * SEC, 5 * MIN)

    def b_batch_client(self) -> None:
        u, ip = self.user(self.analysts)
        s = self.sess("warehouse", u, ip, "benign", "batch_client_concurrent")
        t = self.when(HOUR)
        for _ in range(self.r.randrange(1, 4)):
            for k in range(self.r.randrange(4, 11)):
                s.add(
                    "warehouse",
                    "runQuery",
                    {"sql": f"SELECT count(*) FROM facts_{k} WHERE day = current_date - {k}"},
                    t + self.u(0, 100),
                    self.lat(1500),
                    nbytes=80,
                    rows=1,
                )
            t += self.u(1 * MIN, 10 * MIN)

    def b_ticket_summarizer(self) -> None:
        u, ip = self.user(self.support)
        s = self.sess("crm", u, ip, "benign", "ticket_summarizer")
        t = self.when(HOUR)
        q = self.r.choice(QUERIES)
        t = s.add(
            "crm", "search_tickets", {"query": q}, t, self.lat(90), nbytes=3000, rows=20
        ) + self.u(1 * SEC, 5 * SEC)
        for i in self.r.sample(range(10000, 99999), self.r.randrange(3, 20)):
            tk = f"TCK-{i}"
            t = s.add(
                "crm", "summarize_ticket", {"id": tk}, t, self.lat(2500), nbytes=900, rid=tk
            ) + self.u(500, 4000)
            if self.r.random() < 0.25:
                t = s.add(
                    "crm",
                    "search_tickets",
                    {"query": f"{q} related:{tk}"},
                    t,
                    self.lat(90),
                    nbytes=2000,
                    rows=8,
                ) + self.u(500, 3000)

    def b_dashboard(self) -> None:
        u, ip = self.user(self.managers + self.analysts)
        s = self.sess("warehouse", u, ip, "benign", "dashboard_refresh")
        span = self.u(1 * HOUR, 4 * HOUR)
        t = self.when(span)
        end = t + span
        a = {"dashboard": self.r.choice(["sales-daily", "ops", "support-sla"]), "range": "24h"}
        every = self.r.choice([2, 5, 10]) * MIN
        while t < end:
            s.add(
                "warehouse", "getMetrics", a, t, self.lat(300), nbytes=self.u(4000, 9000), rows=48
            )
            t += every + self.u(-2000, 2000)

    def b_report_builder(self) -> None:
        u, ip = self.user()
        s = self.sess("docs", u, ip, "benign", "report_builder")
        t = self.when(HOUR)
        conc = self.r.random() < 0.4
        for _ in range(self.r.randrange(1, 6)):
            rid = f"rpt-{self.r.randrange(2026000, 2026999)}-{self.b36(4)}"
            e = s.add(
                "docs",
                "create_report",
                {"reportId": rid, "content": "<markdown>"},
                t,
                self.lat(150),
                nbytes=70,
            )
            t = t + self.u(10, 60) if conc else e + self.u(30 * SEC, 8 * MIN)

    def b_plugin_telemetry(self) -> None:
        u, ip = self.user()
        s = self.sess("analytics-plugin", u, ip, "benign", "plugin_telemetry")
        t = self.when(HOUR)
        for _ in range(self.r.randrange(1, 8)):
            if self.r.random() < 0.6:
                t = s.add(
                    "analytics-plugin",
                    "track_event",
                    {
                        "event": self.r.choice(["page_view", "export_clicked", "search"]),
                        "count": self.r.randrange(1, 50),
                    },
                    t,
                    self.lat(60),
                ) + self.u(10 * SEC, 5 * MIN)
            else:
                t = s.add(
                    "analytics-plugin",
                    "get_chart",
                    {"chartId": f"ch_{self.hex(6)}"},
                    t,
                    self.lat(200),
                ) + self.u(10 * SEC, 5 * MIN)

    def b_aggregate_to_plugin(self) -> None:
        u, ip = self.user(self.analysts + self.managers)
        s = self.sess("warehouse", u, ip, "benign", "aggregate_to_plugin", sid="gw-" + self.uuid())
        t = self.when(HOUR)
        rows = self.r.randrange(5, 40)
        t = s.add(
            "warehouse",
            "runQuery",
            {"sql": "SELECT region, count(*) FROM customers GROUP BY region"},
            t,
            self.lat(800),
            nbytes=rows * 40,
            rows=rows,
        ) + self.u(5 * SEC, 60 * SEC)
        s.add(
            "analytics-plugin",
            "upload_dataset",
            {"datasetName": "customers_by_region", "records": rows, "data": [["emea", 1234]]},
            t,
            self.lat(400),
        )

    def b_report_share(self) -> None:
        u, ip = self.user()
        s = self.sess("docs", u, ip, "benign", "report_share_internal", sid="gw-" + self.uuid())
        t = self.when(HOUR)
        docs = self.docs_of(u)
        picked = self.r.sample(docs, min(len(docs), self.r.randrange(1, 4)))
        for d in picked:
            t = s.add(
                "docs",
                "getDocument",
                {"documentId": f"doc-{d}"},
                t,
                self.lat(25),
                nbytes=self.u(5000, 120000),
                rows=1,
            ) + self.u(5 * SEC, 60 * SEC)
        s.add(
            "warehouse",
            "publish_internal",
            {
                "channel": self.r.choice(["#finance", "#leadership", "#eng-weekly"]),
                "docs": [f"doc-{d}" for d in picked],
            },
            t,
            self.lat(300),
            nbytes=90,
        )

    def b_user_provisioning(self) -> None:
        u, ip = self.user(self.admins)
        s = self.sess("crm", u, ip, "benign", "user_provisioning")
        t = self.when(HOUR)
        for _ in range(self.r.randrange(2, 25)):
            t = s.add(
                "crm",
                "createUser",
                {
                    "email": f"new{self.hex(4)}@corp.example",
                    "role": self.r.choice(["agent", "viewer"]),
                },
                t,
                self.lat(150),
                nbytes=200,
            ) + self.u(10 * SEC, 3 * MIN)
        if self.r.random() < 0.5:
            c = f"cus_{self.r.randrange(1000, self.cust_hi)}"
            s.add(
                "crm",
                "resetUsageCounter",
                {"customerId": c, "ticket": self.ticket()},
                t,
                self.lat(100),
                nbytes=60,
                rid=c,
            )

    def b_shop_browse(self) -> None:
        u, ip = self.user()
        s = self.sess("shop", u, ip, "benign", "shop_browse")
        t = self.when(HOUR)
        q = self.r.choice(["laptop", "chair", "monitor", "usb-c hub", "headset", "desk"])
        for p in range(1, self.r.randrange(2, 5)):
            t = s.add(
                "shop",
                "searchProducts",
                {"query": q, "page": p},
                t,
                self.lat(70),
                nbytes=6000,
                rows=24,
            ) + self.u(5 * SEC, 60 * SEC)
        for _ in range(self.r.randrange(0, 5)):
            t = s.add(
                "shop",
                "getProduct",
                {"productId": f"SKU-{self.r.randrange(100, 9999)}"},
                t,
                self.lat(30),
                nbytes=2500,
            ) + self.u(5 * SEC, 90 * SEC)

    def b_summary_session(self, heavy: bool = False) -> None:
        u, ip = self.user()
        if heavy:
            u = f"svc-search-sync-{self.r.randrange(1, 4)}"
            ip = "10.20.0.30"
        s = self.sess(
            "legacy-search", u, ip, "benign", "search_sync_service" if heavy else "catalog_search"
        )
        if heavy:
            st = {
                "callCount": self.r.randrange(120, 500),
                "uniqueResourcesAccessed": self.r.randrange(0, 40),
                "totalBytesReturned": self.r.randrange(1_500_000, 6_000_000),
                "authFailures": 0,
                "durationMs": self.u(40 * MIN, 3 * HOUR),
            }
        else:
            cc = self.r.randrange(1, 50)
            st = {
                "callCount": cc,
                "uniqueResourcesAccessed": self.r.randrange(0, cc + 1),
                "totalBytesReturned": self.r.randrange(cc * 800, cc * 15000),
                "authFailures": self.r.choice([0] * 12 + [1, 2]),
                "durationMs": self.u(20 * SEC, 50 * MIN),
            }
        st["end"] = self.when(st["durationMs"]) + st["durationMs"]
        s.summary = st

    def b_power_user_day(self, u: str) -> None:
        srv = self.r.choice(["docs", "docs", "crm"])
        s = self.sess(srv, u, self.home_ip[u], "benign", "power_user_day", srv)
        t = self.day0 + self.u(6.5 * HOUR, 9.5 * HOUR)
        end = t + self.u(6 * HOUR, 10 * HOUR)
        docs = self.docs_of(u)
        while t < end:
            x = self.r.random()
            if srv == "docs":
                if x < 0.45:
                    d = (
                        self.r.choice(docs)
                        if self.r.random() < 0.7
                        else self.r.randrange(1000, self.doc_hi)
                    )
                    s.add(
                        srv,
                        "getDocument",
                        {"documentId": f"doc-{d}"},
                        t,
                        self.lat(25),
                        nbytes=self.u(2000, 120000),
                        rows=1,
                    )
                elif x < 0.7:
                    q = self.r.choice(QUERIES)
                    for p in range(1, self.r.randrange(2, 5)):
                        t = s.add(
                            srv,
                            "searchItems",
                            {"query": q, "page": p, "limit": 20},
                            t,
                            self.lat(80),
                            nbytes=20 * self.u(150, 400),
                            rows=20,
                        ) + self.u(3 * SEC, 40 * SEC)
                elif x < 0.8:
                    s.add(
                        srv,
                        "listDocuments",
                        {"limit": 50},
                        t,
                        self.lat(40),
                        nbytes=self.u(4000, 12000),
                        rows=50,
                    )
                elif x < 0.9:
                    s.add(
                        srv,
                        "create_report",
                        {"reportId": f"rpt-{self.b36(8)}", "content": "<md>"},
                        t,
                        self.lat(150),
                        nbytes=70,
                    )
                else:
                    for d in self.r.sample(docs, min(len(docs), self.r.randrange(3, 9))):
                        s.add(
                            srv,
                            "getDocument",
                            {"documentId": f"doc-{d}"},
                            t + self.u(0, 50),
                            self.lat(120),
                            nbytes=self.u(2000, 50000),
                            rows=1,
                        )
            else:
                if x < 0.4:
                    c = f"cus_{self.r.randrange(1000, self.cust_hi)}"
                    s.add(
                        srv,
                        "getCustomer",
                        {"customerId": c},
                        t,
                        self.lat(30),
                        nbytes=self.u(800, 4000),
                        rows=1,
                        rid=c,
                    )
                elif x < 0.65:
                    q = self.r.choice(QUERIES)
                    for p in range(1, self.r.randrange(2, 5)):
                        t = s.add(
                            srv,
                            "searchItems",
                            {"query": q, "page": p},
                            t,
                            self.lat(80),
                            nbytes=self.u(3000, 8000),
                            rows=20,
                        ) + self.u(3 * SEC, 40 * SEC)
                elif x < 0.85:
                    tk = f"TCK-{self.r.randrange(10000, 99999)}"
                    s.add(
                        srv,
                        "getTicket",
                        {"ticketId": tk},
                        t,
                        self.lat(40),
                        nbytes=self.u(1500, 9000),
                        rows=1,
                        rid=tk,
                    )
                else:
                    segm = self.r.choice(SEGMENTS)
                    s.add(
                        srv,
                        "listCustomers",
                        {"segment": segm, "limit": 100},
                        t,
                        self.lat(200),
                        nbytes=self.u(8000, 30000),
                        rows=100,
                    )
            t += self.u(5 * SEC, 4 * MIN) if self.r.random() < 0.93 else self.u(10 * MIN, 28 * MIN)

    # ----------------------------------------------------------------- attacks
    def a_enumeration(self, v: str) -> None:
        c, ip = self.attacker()
        if v == "files_home_walk":
            s = self.sess("files", c, ip, "enumeration", "enumeration", v)
            t = self.when(HOUR)
            for i in range(self.r.randrange(105, 260)):
                who = f"{self.r.choice(FIRST)}{i}"
                t = s.add(
                    "files",
                    "readFile",
                    {"path": f"/home/{who}/.ssh/id_rsa"},
                    t,
                    self.lat(4),
                    status=self.r.choice(["not_found", "denied", "ok"]),
                    nbytes=1700,
                ) + self.u(80, 900)
            return
        if v == "summary":
            s = self.sess("legacy-search", c, ip, "enumeration", "enumeration", v)
            cc = self.r.randrange(110, 2000)
            st = {
                "callCount": cc,
                "uniqueResourcesAccessed": int(cc * self.r.uniform(0.8, 1)),
                "totalBytesReturned": cc * self.r.randrange(300, 700),
                "authFailures": 0,
                "durationMs": self.u(10 * MIN, 2 * HOUR),
            }
            st["end"] = self.when(st["durationMs"]) + st["durationMs"]
            s.summary = st
            return
        if v == "split_sessions":
            k = self.r.randrange(4, 8)
            t = self.when(k * 20 * MIN)
            base = self.r.randrange(1000, self.doc_hi - 400)
            ss = []
            for _j in range(k):
                s = self.sess("docs", c, ip, "enumeration", "enumeration", v)
                ss.append(s)
                for _i in range(self.r.randrange(30, 60)):
                    t = s.add(
                        "docs",
                        "getDocument",
                        {"documentId": f"doc-{base}"},
                        t,
                        self.lat(15),
                        status=self.r.choice(["not_found"] * 3 + ["ok"]),
                        nbytes=self.u(60, 9000),
                    ) + self.u(200, 1500)
                    base += 1
                t += self.u(1 * MIN, 15 * MIN)
            self.entity("client_ip", ip, "enumeration", ss)
            return
        srv, tool, key, fmt = "docs", "getDocument", "documentId", "doc-{}"
        if v == "getUser_crm":
            srv, tool, key, fmt = "crm", "getUser", "userId", "usr_{}"
        elif v == "random_guess":
            srv, tool, key, fmt = "docs", "getAuditReport", "reportId", "AR-{}"
        s = self.sess(srv, c, ip, "enumeration", "enumeration", v)
        n = {
            "sequential_fast": self.r.randrange(150, 600),
            "slow": self.r.randrange(105, 170),
            "just_above_100": self.r.randrange(101, 116),
            "refused_all": self.r.randrange(120, 300),
        }.get(v, self.r.randrange(120, 400))
        gap = self.u(1 * MIN, 4 * MIN) if v == "slow" else 0
        t = self.when(n * (gap or 600))
        base = self.r.randrange(1000, self.doc_hi - 1000)
        for i in range(n):
            val = base + i if v != "random_guess" else self.r.randrange(10**5, 10**6)
            rv = fmt.format(val)
            if v == "refused_all":
                st = "not_found"
            else:
                st = self.r.choice(["ok", "not_found", "not_found", "denied"])
            t = s.add(
                srv,
                tool,
                {key: rv},
                t,
                self.lat(15),
                status=st,
                nbytes=self.u(1500, 15000) if st == "ok" else 60,
                rows=1 if st == "ok" else 0,
                err=None if st == "ok" else "Document not found",
                rid=rv if srv == "crm" else None,
            )
            t += self.u(gap * 0.5, gap * 1.5) if gap else self.u(40, 700)

    def a_bulk(self, v: str) -> None:
        c, ip = self.attacker()
        if v == "summary":
            s = self.sess("legacy-search", c, ip, "bulk_extraction", "bulk_extraction", v)
            cc = self.r.randrange(5, 49)
            st = {
                "callCount": cc,
                "uniqueResourcesAccessed": self.r.randrange(1, cc + 1),
                "totalBytesReturned": self.r.randrange(3_000_000, 90_000_000),
                "authFailures": 0,
                "durationMs": self.u(2 * MIN, 40 * MIN),
            }
            st["end"] = self.when(st["durationMs"]) + st["durationMs"]
            s.summary = st
            return
        if v == "slow_drip_files":
            s = self.sess("files", c, ip, "bulk_extraction", "bulk_extraction", v)
            t = self.when(2 * HOUR)
            for i in range(self.r.randrange(8, 25)):
                t = s.add(
                    "files",
                    "readFile",
                    {"path": f"/srv/exports/crm_dump_{i:03d}.csv"},
                    t,
                    self.lat(400),
                    nbytes=self.u(300_000, 900_000),
                ) + self.u(2 * MIN, 9 * MIN)
            return
        srv = self.r.choice(["crm", "docs"]) if v != "export_calls" else "crm"
        s = self.sess(srv, c, ip, "bulk_extraction", "bulk_extraction", v)
        t = self.when(HOUR)
        if v in ("big_calls", "export_calls", "refused"):
            for _ in range(self.r.randrange(2, 6)):
                b = self.u(400_000, 1_500_000)
                if srv == "crm":
                    a = {"segment": self.r.choice(SEGMENTS), "format": "json"}
                    tool = "get_customer_export"
                else:
                    a = {"folderId": f"fld-{self.r.randrange(10, 99)}", "includeBodies": True}
                    tool = "exportFolder"
                if v == "refused":
                    t = s.add(
                        srv,
                        tool,
                        a,
                        t,
                        self.lat(40),
                        status="denied",
                        nbytes=50,
                        err="permission denied",
                    ) + self.u(2 * SEC, 20 * SEC)
                else:
                    t = s.add(srv, tool, a, t, self.lat(3000), nbytes=b, rows=b // 330) + self.u(
                        3 * SEC, 60 * SEC
                    )
        elif v == "just_above_1mb":
            k = self.r.randrange(4, 10)
            total = self.u(1_010_000, 1_200_000)
            for _ in range(k):
                b = total // k + self.u(-3000, 3000)
                tool, a = (
                    ("listCustomers", {"segment": self.r.choice(SEGMENTS), "limit": 1000})
                    if srv == "crm"
                    else ("listDocuments", {"limit": 1000, "includeBodies": True})
                )
                t = s.add(srv, tool, a, t, self.lat(600), nbytes=b, rows=b // 300) + self.u(
                    2 * SEC, 30 * SEC
                )
        else:  # page_walk_bulk
            pages = self.r.randrange(10, 90)
            for p in range(1, pages + 1):
                t = s.add(
                    srv,
                    "searchItems",
                    {"query": "*", "page": p, "limit": 500},
                    t,
                    self.lat(300),
                    nbytes=self.u(120_000, 220_000),
                    rows=500,
                ) + self.u(200, 3000)
            if pages > 50:
                s.also.append("scraping_loop")

    def a_cred(self, v: str) -> None:
        c, ip = self.attacker()
        if v == "summary":
            s = self.sess("legacy-search", c, ip, "credential_stuffing", "credential_stuffing", v)
            af = self.r.randrange(3, 60)
            st = {
                "callCount": af + self.r.randrange(0, 3),
                "uniqueResourcesAccessed": 0,
                "totalBytesReturned": af * 40,
                "authFailures": af,
                "durationMs": self.u(1 * MIN, 30 * MIN),
            }
            st["end"] = self.when(st["durationMs"]) + st["durationMs"]
            s.summary = st
            return
        if v == "distributed":
            ip = self.public_ip()
            ss = []
            t = self.when(3 * HOUR)
            for _ in range(self.r.randrange(8, 20)):
                s = self.sess(
                    "crm", f"mcp#{self.hex(8)}", ip, "credential_stuffing", "credential_stuffing", v
                )
                ss.append(s)
                svc = self.r.choice(SERVICES)
                for _ in range(2):
                    t = s.add(
                        "crm",
                        "connectExternalService",
                        {"service": svc, "apiKey": self.hex(32)},
                        t,
                        self.u(500, 1000),
                        status="auth_failed",
                        err="Authentication failed",
                    ) + self.u(1 * SEC, 5 * SEC)
                t += self.u(20 * SEC, 8 * MIN)
            self.entity("client_ip", ip, "credential_stuffing", ss)
            return
        s = self.sess(
            "crm" if v != "login_pairs" else "shop",
            c,
            ip,
            "credential_stuffing",
            "credential_stuffing",
            v,
        )
        n = {
            "fast": self.r.randrange(20, 200),
            "locked": self.r.randrange(10, 60),
            "slow": self.r.randrange(6, 30),
            "login_pairs": self.r.randrange(15, 120),
            "with_success": self.r.randrange(8, 80),
            "just_above_2": self.r.randrange(3, 5),
        }[v]
        t = self.when(n * 3 * MIN if v == "slow" else HOUR)
        svc = self.r.choice(SERVICES)
        for i in range(n):
            if v == "login_pairs":
                a = {
                    "username": f"{self.r.choice(FIRST)}{self.r.randrange(1, 999)}@mail.example",
                    "password": self.b36(10),
                }
                tool, srv = "authenticate", "shop"
            else:
                a = {
                    "service": svc,
                    "apiKey": ("sk_live_" if self.r.random() < 0.5 else "") + self.hex(32),
                }
                tool, srv = "connectExternalService", "crm"
            st, err = "auth_failed", "Authentication failed"
            if v == "locked" and i >= 3:
                st, err = "error", "Authentication attempts exceeded. Session locked."
            if v == "with_success" and i == n - 1:
                st, err = "ok", None
            t = s.add(srv, tool, a, t, self.u(500, 1000), status=st, err=err, nbytes=60) + (
                self.u(1 * MIN, 5 * MIN) if v == "slow" else self.u(20, 800)
            )
        if v == "with_success":
            s.add(
                "crm",
                "searchItems",
                {"query": "*", "page": 1, "limit": 100},
                t,
                self.lat(100),
                nbytes=30000,
                rows=100,
            )

    def a_scrape(self, v: str) -> None:
        c, ip = self.attacker()
        if v == "summary":
            s = self.sess("legacy-search", c, ip, "scraping_loop", "scraping_loop", v)
            cc = self.r.randrange(51, 900)
            st = {
                "callCount": cc,
                "uniqueResourcesAccessed": self.r.randrange(0, 30),
                "totalBytesReturned": cc * self.r.randrange(1500, 4000),
                "authFailures": 0,
                "durationMs": self.u(5 * MIN, 2 * HOUR),
            }
            if st["totalBytesReturned"] > 1_000_000:
                s.also.append("bulk_extraction")
            st["end"] = self.when(st["durationMs"]) + st["durationMs"]
            s.summary = st
            return
        if v == "reconnect_evasion":
            t = self.when(3 * HOUR)
            ss = []
            q = self.r.choice(QUERIES)
            page = 1
            srv = self.r.choice(["docs", "crm"])
            for _ in range(self.r.randrange(4, 9)):
                s = self.sess(srv, c, ip, "scraping_loop", "scraping_loop", v)
                ss.append(s)
                for _ in range(20):
                    t = s.add(
                        srv,
                        "searchItems",
                        {"query": q, "page": page, "limit": 50},
                        t,
                        self.lat(80),
                        nbytes=50 * self.u(150, 300),
                        rows=50,
                    ) + self.u(300, 3000)
                    page += 1
                t = s.add(
                    srv,
                    "searchItems",
                    {"query": q, "page": page, "limit": 50},
                    t,
                    self.lat(10),
                    status="error",
                    err="Session search limit reached. Start a new session to continue.",
                ) + self.u(2 * SEC, 20 * SEC)
            self.entity("caller_id", c, "scraping_loop", ss)
            return
        srv = self.r.choice(["docs", "crm", "shop"])
        s = self.sess(srv, c, ip, "scraping_loop", "scraping_loop", v)
        tool = "searchProducts" if srv == "shop" else "searchItems"
        n = {
            "page_walk": self.r.randrange(55, 400),
            "slow_page_walk": self.r.randrange(55, 120),
            "just_above_50": self.r.randrange(51, 59),
            "cursor_walk": self.r.randrange(55, 250),
            "query_sweep": 0,
            "budget_refused": self.r.randrange(50, 150),
        }[v]
        gap = self.u(20 * SEC, 90 * SEC) if v == "slow_page_walk" else 0
        t = self.when(n * (gap or 1500))
        q = self.r.choice([*QUERIES, "*", ""])
        limit = self.r.choice([50, 100])
        total = 0
        if v == "query_sweep":
            for a in "abcdefghijklmnopqrstuvwxyz":
                for p in range(1, self.r.randrange(2, 5)):
                    b = limit * self.u(150, 350)
                    total += b
                    t = s.add(
                        srv,
                        tool,
                        {"query": a, "page": p, "limit": limit},
                        t,
                        self.lat(80),
                        nbytes=b,
                        rows=limit,
                    ) + self.u(200, 2500)
        else:
            cursor = None
            for p in range(1, n + 1):
                st, err, b = "ok", None, limit * self.u(150, 350)
                if v == "budget_refused" and p > 20:
                    st, err, b = "error", "Session search limit reached.", 70
                if v == "cursor_walk":
                    tool = "listDocuments"
                    a = {"limit": limit} | ({"cursor": cursor} if cursor else {})
                    cursor = self.b36(20)
                else:
                    a = {"query": q, "page": p, "limit": limit}
                total += b
                t = s.add(
                    srv,
                    tool,
                    a,
                    t,
                    self.lat(80),
                    status=st,
                    err=err,
                    nbytes=b,
                    rows=limit if st == "ok" else 0,
                )
                t += self.u(gap * 0.6, gap * 1.4) if gap else self.u(100, 3000)
        if total > 1_000_000:
            s.also.append("bulk_extraction")

    def a_loop(self, v: str) -> None:
        c, ip = self.attacker()
        srv = self.r.choice(["crm", "docs"])
        s = self.sess(srv, c, ip, "tool_loop", "tool_loop", v)
        q = self.r.choice(QUERIES)
        tk = f"TCK-{self.r.randrange(10000, 99999)}"
        n = {
            "exact_repeat": self.r.randrange(30, 250),
            "ab_cycle": self.r.randrange(20, 120),
            "abc_cycle": self.r.randrange(15, 60),
            "slow_loop": self.r.randrange(25, 70),
            "errored_retry": self.r.randrange(20, 120),
            "just_above_50": self.r.randrange(26, 30),
            "stuck_page": self.r.randrange(30, 150),
        }[v]
        gap = self.u(1 * MIN, 3 * MIN) if v == "slow_loop" else 0
        t = self.when(n * (gap or 2000))
        steps: list[tuple[str, dict]]
        if v in ("exact_repeat", "errored_retry"):
            steps = [("search_tickets", {"query": q})]
        elif v == "stuck_page":
            steps = [("searchItems", {"query": q, "page": 3, "limit": 20})]
        elif v == "abc_cycle":
            steps = [
                ("search_tickets", {"query": q}),
                ("summarize_ticket", {"id": tk}),
                ("getTicket", {"ticketId": tk}),
            ]
        else:
            steps = [("search_tickets", {"query": q}), ("summarize_ticket", {"id": tk})]
        for _ in range(n):
            for tool, a in steps:
                if v == "errored_retry":
                    t = s.add(
                        srv,
                        tool,
                        a,
                        t,
                        self.lat(30),
                        status="error",
                        err="upstream index unavailable",
                    )
                else:
                    t = s.add(
                        srv,
                        tool,
                        a,
                        t,
                        self.lat(300),
                        nbytes=self.u(800, 3000),
                        rows=10 if "search" in tool else 1,
                        rid=tk if tool != "search_tickets" and srv == "crm" else None,
                    )
                t += self.u(gap * 0.7, gap * 1.3) if gap else self.u(50, 2500)

    def a_priv(self, v: str) -> None:
        c, ip = self.attacker()
        if v == "crm_role_escalation":
            s = self.sess("crm", c, ip, "privilege_chain", "privilege_chain", v)
            t = self.when(HOUR)
            me = f"usr_{self.r.randrange(1000, 99999)}"
            t = s.add(
                "crm", "listUsers", {"role": "admin"}, t, self.lat(60), nbytes=3000, rows=12
            ) + self.u(2 * SEC, 20 * SEC)
            t = s.add(
                "crm", "getUserProfile", {"profileId": me}, t, self.lat(30), nbytes=900, rid=me
            ) + self.u(2 * SEC, 20 * SEC)
            t = s.add(
                "crm",
                "updateUserRole",
                {"profileId": me, "role": "admin"},
                t,
                self.lat(90),
                nbytes=120,
                rid=me,
            ) + self.u(2 * SEC, 20 * SEC)
            s.add(
                "crm",
                "get_customer_export",
                {"segment": "enterprise"},
                t,
                self.lat(3000),
                nbytes=self.u(300_000, 900_000),
                rows=2000,
            )
            return
        if v == "quota_reset":
            s = self.sess("crm", c, ip, "privilege_chain", "privilege_chain", v)
            t = self.when(HOUR)
            cus = f"cus_{self.r.randrange(1000, self.cust_hi)}"
            for _round in range(self.r.randrange(1, 4)):
                for i in range(self.r.randrange(5, 12)):
                    st = "ok" if i < 4 else "rate_limited"
                    t = s.add(
                        "crm",
                        "enrichCompany",
                        {"domain": f"{self.b36(6)}.example"},
                        t,
                        self.lat(400),
                        status=st,
                        nbytes=900 if st == "ok" else 50,
                        err=None if st == "ok" else "quota exceeded",
                    ) + self.u(300, 3000)
                t = s.add(
                    "crm",
                    "resetUsageCounter",
                    {"customerId": cus},
                    t,
                    self.lat(100),
                    nbytes=60,
                    rid=cus,
                ) + self.u(300, 3000)
            return
        s = self.sess("files", c, ip, "privilege_chain", "privilege_chain", v)
        t = self.when(HOUR)
        target = {
            "passwd": "/etc/passwd",
            "sudoers": "/etc/sudoers",
            "authorized_keys": "/root/.ssh/authorized_keys",
        }.get(v, "/etc/passwd")
        d = target.rsplit("/", 1)[0]
        rd = wr = "ok"
        if v == "write_denied":
            wr = "denied"
        if v == "all_denied":
            rd = wr = "denied"
        t = s.add(
            "files",
            "listDirectory",
            {"path": d},
            t,
            self.lat(5),
            status=rd,
            nbytes=300 if rd == "ok" else 40,
        ) + self.u(500, 20 * SEC)
        t = s.add(
            "files",
            "readFile",
            {"path": target},
            t,
            self.lat(5),
            status=rd,
            nbytes=self.u(1200, 4000) if rd == "ok" else 40,
        ) + self.u(1 * SEC, 40 * SEC)
        if v == "verify_loop":
            for f in self.r.sample(
                [
                    "/etc/passwd",
                    "/etc/sudoers",
                    "/etc/crontab",
                    "/etc/ssh/sshd_config",
                    "/root/.bashrc",
                ],
                4,
            ):
                t = s.add(
                    "files",
                    "writeFile",
                    {"path": f, "content": "<modified>"},
                    t,
                    self.lat(8),
                    nbytes=30,
                ) + self.u(500, 5000)
                t = s.add("files", "readFile", {"path": f}, t, self.lat(5), nbytes=1500) + self.u(
                    500, 5000
                )
            return
        t = s.add(
            "files",
            "writeFile",
            {"path": target, "content": "<modified from read>"},
            t,
            self.lat(8),
            status=wr,
            nbytes=30,
            err=None if wr == "ok" else "permission denied",
        ) + self.u(1 * SEC, 20 * SEC)
        if v == "admin_twice":
            for cmd in ["id", "sudo -l", "cat /etc/shadow"][: self.r.randrange(2, 4)]:
                t = s.add(
                    "files", "executeCommand", {"command": cmd}, t, self.lat(300), nbytes=300
                ) + self.u(1 * SEC, 20 * SEC)

    def a_step(self, v: str) -> None:
        c, ip = self.attacker()
        s = self.sess("shop", c, ip, "step_skip", "step_skip", v)
        t = self.when(HOUR)
        if v in ("fulfill_only_ok", "fulfill_refused"):
            for _ in range(self.r.randrange(1, 6)):
                o = self.order_id()
                if v == "fulfill_refused":
                    t = s.add(
                        "shop",
                        "fulfillOrder",
                        {"orderId": o},
                        t,
                        self.lat(40),
                        status="error",
                        err="Cannot fulfill order: payment status is pending",
                    )
                else:
                    t = s.add("shop", "fulfillOrder", {"orderId": o}, t, self.lat(200), nbytes=80)
                t += self.u(2 * SEC, 60 * SEC)
            return
        if v == "pay_unapproved_expense":
            for _ in range(self.r.randrange(1, 4)):
                e = f"exp_{self.r.randrange(10000, 99999)}"
                t = s.add(
                    "shop",
                    "submitExpense",
                    {"expenseId": e, "amountCents": self.r.randrange(5000, 90000)},
                    t,
                    self.lat(60),
                    nbytes=100,
                ) + self.u(2 * SEC, 30 * SEC)
                t = s.add(
                    "shop", "payExpense", {"expenseId": e}, t, self.lat(300), nbytes=120
                ) + self.u(2 * SEC, 30 * SEC)
            return
        cart = "cart_" + self.b36(10)
        t = s.add("shop", "createCart", {"customerRef": c}, t, self.lat(30), nbytes=120) + self.u(
            2 * SEC, 20 * SEC
        )
        t = s.add(
            "shop",
            "addItem",
            {
                "cartId": cart,
                "sku": f"SKU-{self.r.randrange(100, 9999)}",
                "qty": self.r.randrange(1, 5),
            },
            t,
            self.lat(30),
            nbytes=200,
        ) + self.u(2 * SEC, 20 * SEC)
        o = self.order_id()
        if v == "add_after_lock":
            t = s.add(
                "shop", "checkout", {"cartId": cart, "orderId": o}, t, self.lat(60), nbytes=300
            ) + self.u(1 * SEC, 10 * SEC)
            t = s.add(
                "shop",
                "chargePayment",
                {"orderId": o, "amountCents": 1299, "idempotencyKey": self.uuid()},
                t,
                self.lat(700),
                nbytes=260,
            ) + self.u(1 * SEC, 10 * SEC)
            for _ in range(self.r.randrange(1, 5)):
                t = s.add(
                    "shop",
                    "addItem",
                    {"cartId": cart, "sku": self.sku(), "qty": self.r.randrange(1, 9)},
                    t,
                    self.lat(30),
                    nbytes=200,
                ) + self.u(1 * SEC, 10 * SEC)
            s.add("shop", "fulfillOrder", {"orderId": o}, t, self.lat(200), nbytes=80)
            return
        t = s.add(
            "shop", "checkout", {"cartId": cart, "orderId": o}, t, self.lat(60), nbytes=300
        ) + self.u(1 * SEC, 10 * SEC)
        if v == "refused_after_cart":
            s.add(
                "shop",
                "fulfillOrder",
                {"orderId": o},
                t,
                self.lat(40),
                status="error",
                err="Cannot fulfill order: payment status is pending",
            )
        else:  # fulfill_without_charge
            s.add("shop", "fulfillOrder", {"orderId": o}, t, self.lat(200), nbytes=80)

    def a_dup(self, v: str) -> None:
        c, ip = self.attacker()
        s = self.sess("shop", c, ip, "duplicate_execution", "duplicate_execution", v)
        t = self.when(HOUR)
        o = self.order_id()
        amt = self.r.choice([1299, 4999, 9900, 25000, 100000])
        if v == "discount_reapply":
            cart = "cart_" + self.b36(10)
            t = s.add("shop", "createCart", {"customerRef": c}, t, self.lat(30), nbytes=120)
            code = self.r.choice(["WELCOME10", "BF2026", "VIP25"])
            for _ in range(self.r.randrange(3, 9)):
                t = s.add(
                    "shop",
                    "applyDiscount",
                    {"cartId": cart, "code": code},
                    t + 300,
                    self.lat(40),
                    nbytes=100,
                )
                t = s.add(
                    "shop",
                    "checkout",
                    {"cartId": cart, "orderId": o},
                    t + 300,
                    self.lat(60),
                    status=self.r.choice(["ok", "error"]),
                    nbytes=200,
                )
            return
        if v == "approve_twice":
            e = f"exp_{self.r.randrange(10000, 99999)}"
            for _ in range(self.r.randrange(2, 4)):
                t = s.add(
                    "shop", "approveExpense", {"expenseId": e}, t, self.lat(120), nbytes=150
                ) + self.u(1 * SEC, 60 * SEC)
            return
        if v == "payout_dup":
            rcp = f"acct_{self.hex(6)}"
            for _ in range(self.r.randrange(2, 5)):
                t = s.add(
                    "shop",
                    "sendPayout",
                    {"recipientId": rcp, "amountCents": amt},
                    t,
                    self.lat(400),
                    nbytes=210,
                ) + self.u(2 * SEC, 40 * SEC)
            return
        k = {
            "retry_no_key": self.r.randrange(2, 4),
            "new_key_each_retry": self.r.randrange(2, 5),
            "second_refused": 2,
            "charge_loop": self.r.randrange(5, 20),
        }[v]
        for i in range(k):
            a = {"orderId": o, "amountCents": amt}
            if v != "retry_no_key":
                a["idempotencyKey"] = self.uuid()
            st, err = "ok", None
            if v == "second_refused" and i > 0:
                st, err = (
                    "error",
                    "chargePayment has been called 2 times this session; "
                    "use idempotencyKey to retry",
                )
            t = s.add(
                "shop", "chargePayment", a, t, self.lat(700), status=st, err=err, nbytes=260
            ) + self.u(1 * SEC, 30 * SEC)

    def a_cross(self, v: str) -> None:
        c, ip = self.attacker()
        shared = v != "export_upload_linked"
        sid = "gw-" + self.uuid() if shared else None
        first_srv = {"files_to_plugin": "files", "docs_to_plugin": "docs"}.get(v, "crm")
        if first_srv == "files":
            c = f"agent-{self.hex(5)}"  # never moved by fix_derived: keeps the chain's timing
            s1 = self.sess("files", c, ip, "cross_server_flow", "cross_server_flow", v)
            s2 = self.sess("analytics-plugin", c, ip, "cross_server_flow", "cross_server_flow", v)
        elif shared:
            s1 = s2 = self.sess(
                first_srv, c, ip, "cross_server_flow", "cross_server_flow", v, sid=sid
            )
        else:
            s1 = self.sess("crm", c, ip, "cross_server_flow", "cross_server_flow", v)
            s2 = self.sess("analytics-plugin", c, ip, "cross_server_flow", "cross_server_flow", v)
        t = self.when(2 * HOUR)
        recs = self.r.randrange(2000, 4000)
        b = self.u(900_000, 999_000)
        if v == "large_3mb":
            recs, b = self.r.randrange(8000, 12000), self.u(2_800_000, 3_600_000)
        if first_srv == "crm":
            chunks = self.r.randrange(2, 5) if v == "chunked" else 1
            for _ in range(chunks):
                t = s1.add(
                    "crm",
                    "get_customer_export",
                    {"segment": self.r.choice(SEGMENTS)} if self.r.random() < 0.5 else {},
                    t,
                    self.lat(3000),
                    nbytes=b,
                    rows=recs,
                ) + self.u(3 * SEC, 60 * SEC)
                if v == "slow":
                    t += self.u(20 * MIN, 50 * MIN)
                up = "failed" if v == "upload_refused" else "ok"
                t = s2.add(
                    "analytics-plugin",
                    "upload_dataset",
                    {
                        "datasetName": f"customers_{self.b36(5)}",
                        "records": recs,
                        "sizeBytes": b,
                        "data": '[{"id":"cus_1","email":"..."}, ...]',
                    },
                    t,
                    self.lat(1500),
                    status="error" if up == "failed" else "ok",
                    err="upload rejected: dataset too large" if up == "failed" else None,
                ) + self.u(3 * SEC, 30 * SEC)
        elif first_srv == "files":
            t = s1.add(
                "files",
                "readFile",
                {"path": "/srv/exports/customers_full.csv"},
                t,
                self.lat(500),
                nbytes=b,
            ) + self.u(5 * SEC, 90 * SEC)
            s2.add(
                "analytics-plugin",
                "upload_dataset",
                {"datasetName": "crm_customers", "records": recs, "sizeBytes": b},
                t,
                self.lat(1500),
            )
        else:
            tot = 0
            for _ in range(self.r.randrange(3, 12)):
                d = self.r.randrange(1000, self.doc_hi)
                nb = self.u(40_000, 200_000)
                tot += nb
                t = s1.add(
                    "docs",
                    "getDocument",
                    {"documentId": f"doc-{d}"},
                    t,
                    self.lat(25),
                    nbytes=nb,
                    rows=1,
                ) + self.u(1 * SEC, 20 * SEC)
            s2.add(
                "analytics-plugin",
                "upload_dataset",
                {"datasetName": "contracts", "records": 12, "sizeBytes": tot},
                t,
                self.lat(1500),
            )
        if s1 is not s2:
            self.entity("caller_id", c, "cross_server_flow", [s1, s2])

    def a_conc(self, v: str) -> None:
        c, ip = self.attacker()
        if v == "multi_session":
            t = self.when(HOUR)
            ss = []
            for _ in range(self.r.randrange(4, 7)):
                s = self.sess("docs", c, ip, "concurrency_abuse", "concurrency_abuse", v)
                ss.append(s)
                for _ in range(8):
                    s.add(
                        "docs",
                        "getDocument",
                        {"documentId": self.any_doc()},
                        t + self.u(0, 200),
                        self.u(800, 3000),
                        status=self.r.choice(["ok", "not_found"]),
                        nbytes=self.u(100, 9000),
                    )
            self.entity("caller_id", c, "concurrency_abuse", ss)
            return
        srv = self.r.choice(["docs", "warehouse"]) if v != "increment_usage" else "crm"
        s = self.sess(srv, c, ip, "concurrency_abuse", "concurrency_abuse", v)
        t = self.when(HOUR)
        waves = self.r.randrange(3, 7) if v == "just_above_10" else 1
        for _w in range(waves):
            n = {
                "burst": self.r.randrange(50, 300),
                "just_above_10": self.r.randrange(11, 15),
                "ratelimit_race": self.r.randrange(20, 60),
                "increment_usage": self.r.randrange(15, 50),
                "limited": self.r.randrange(30, 120),
                "all_throttled": self.r.randrange(20, 80),
            }[v]
            for i in range(n):
                st, err = "ok", None
                if v == "limited" and i >= 10:
                    st, err = (
                        "rate_limited",
                        "Concurrency limit reached: max 10 concurrent requests",
                    )
                if v == "all_throttled":
                    st, err = "rate_limited", "Rate limit exceeded: max 10 requests per 60s"
                spread = 30 if v == "ratelimit_race" else 400
                if v == "increment_usage":
                    s.add(
                        srv,
                        "increment_usage",
                        {"amount": 1},
                        t + self.u(0, spread),
                        self.u(150, 900),
                        status=st,
                        nbytes=30,
                    )
                elif srv == "docs":
                    s.add(
                        srv,
                        "getDocument",
                        {"documentId": self.any_doc()},
                        t + self.u(0, spread),
                        self.u(800, 4000) if st == "ok" else self.u(2, 20),
                        status=st,
                        err=err,
                        nbytes=self.u(1500, 30000) if st == "ok" else 60,
                    )
                else:
                    s.add(
                        srv,
                        "runQuery",
                        {
                            "sql": "SELECT * FROM orders WHERE id = "
                            + str(self.r.randrange(1, 10**6))
                        },
                        t + self.u(0, spread),
                        self.u(800, 4000) if st == "ok" else self.u(2, 20),
                        status=st,
                        err=err,
                        nbytes=400 if st == "ok" else 60,
                        rows=1,
                    )
            t += self.u(5 * SEC, 60 * SEC)

    def a_race(self, v: str) -> None:
        c, ip = self.attacker()
        t = self.when(HOUR)
        if v == "approve_two_sessions":
            e = f"exp_{self.r.randrange(10000, 99999)}"
            ss = []
            for _ in range(2):
                s = self.sess("shop", c, ip, "race_condition", "race_condition", v)
                ss.append(s)
                s.add(
                    "shop",
                    "approveExpense",
                    {"expenseId": e},
                    t + self.u(0, 15),
                    self.u(100, 400),
                    nbytes=150,
                )
            self.entity("caller_id", c, "race_condition", ss)
            return
        if v == "delete_vs_transfer":
            s = self.sess("docs", c, ip, "race_condition", "race_condition", v)
            f = f"file_{self.hex(8)}"
            s.add(
                "docs",
                "transfer_ownership",
                {"fileId": f, "newOwner": self.r.choice(self.users)},
                t,
                self.u(100, 300),
                nbytes=80,
            )
            s.add(
                "docs", "delete_file", {"fileId": f}, t + self.u(0, 20), self.u(100, 300), nbytes=40
            )
            return
        if v == "create_report_same_id":
            s = self.sess("docs", c, ip, "race_condition", "race_condition", v)
            rid = f"rpt-{self.r.randrange(2026000, 2026999)}"
            for i in range(self.r.randrange(2, 6)):
                s.add(
                    "docs",
                    "create_report",
                    {"reportId": rid, "content": f"<v{i}>"},
                    t + self.u(0, 20),
                    self.u(50, 200),
                    status="ok" if i < 2 else "error",
                    err=None if i < 2 else "Report already exists",
                    nbytes=70,
                )
            return
        s = self.sess("shop", c, ip, "race_condition", "race_condition", v)
        k = self.r.randrange(2, 6)
        src = f"usr_{self.r.randrange(1000, 99999)}"
        o = self.order_id()
        for i in range(k):
            st, err = "ok", None
            if v == "transfer_double_spend":
                tool, a = (
                    "transfer_credits",
                    {
                        "fromUserId": src,
                        "toUserId": f"usr_{self.r.randrange(1000, 99999)}",
                        "amount": 100,
                    },
                )
            elif v == "cas_refused":
                tool, a = (
                    "transfer_credits",
                    {"fromUserId": src, "toUserId": "usr_77", "amount": 100},
                )
                if i > 0:
                    st, err = (
                        "error",
                        "Transfer failed: balance changed concurrently. Please retry.",
                    )
            elif v == "spend_credits_race":
                tool, a = "spend_credits", {"userId": src, "amount": 50, "reason": "render"}
            elif v == "process_order_lock":
                tool, a = (
                    "process_order",
                    {"orderId": o, "userId": src, "paymentMethodId": f"pm_{self.hex(8)}"},
                )
                if i > 0:
                    st, err = "error", "Order is currently being processed. Please wait and retry."
            else:  # all_refused
                tool, a = (
                    "transfer_credits",
                    {"fromUserId": src, "toUserId": "usr_5", "amount": 100},
                )
                st, err = "error", "Insufficient credits"
            s.add(
                "shop", tool, a, t + self.u(0, 25), self.u(120, 600), status=st, err=err, nbytes=100
            )
        if v in ("transfer_double_spend", "spend_credits_race"):
            s.also.append("duplicate_execution")

    # --------------------------------------------------------------- assembly
    def build(self) -> None:
        r = self.r
        benign = [
            (self.b_doc_reader, 620),
            (self.b_search_pages, 420),
            (self.b_incremental_sync, 150),
            (self.b_admin_migration, 25),
            (self.b_support_queue, 110),
            (self.b_analyst, 180),
            (self.b_nightly_export, 14),
            (self.b_job_poller, 140),
            (self.b_health_bot, 24),
            (self.b_files_health, 3),
            (self.b_log_tailer, 40),
            (self.b_config_edit, 110),
            (self.b_deploy_bot, 50),
            (self.b_backup, 8),
            (self.b_file_browse, 190),
            (self.b_cart_checkout, 480),
            (self.b_idempotent_retry, 110),
            (self.b_payroll, 5),
            (self.b_treasury, 7),
            (self.b_expense_manager, 140),
            (self.b_expense_pair, 25),
            (self.b_credit_spender, 100),
            (self.b_password_typo, 80),
            (self.b_key_rotation, 35),
            (self.b_multi_connector, 80),
            (self.b_parallel_own, 190),
            (self.b_batch_client, 55),
            (self.b_ticket_summarizer, 140),
            (self.b_dashboard, 40),
            (self.b_report_builder, 80),
            (self.b_plugin_telemetry, 190),
            (self.b_aggregate_to_plugin, 55),
            (self.b_report_share, 55),
            (self.b_user_provisioning, 30),
            (self.b_shop_browse, 280),
            (self.b_summary_session, 560),
            (lambda: self.b_summary_session(True), 20),
        ]
        attacks = [
            (
                self.a_enumeration,
                [
                    "sequential_fast",
                    "slow",
                    "just_above_100",
                    "getUser_crm",
                    "random_guess",
                    "split_sessions",
                    "refused_all",
                    "files_home_walk",
                    "summary",
                ],
            ),
            (
                self.a_bulk,
                [
                    "big_calls",
                    "export_calls",
                    "just_above_1mb",
                    "page_walk_bulk",
                    "slow_drip_files",
                    "summary",
                    "refused",
                ],
            ),
            (
                self.a_cred,
                [
                    "fast",
                    "locked",
                    "slow",
                    "distributed",
                    "login_pairs",
                    "with_success",
                    "just_above_2",
                    "summary",
                ],
            ),
            (
                self.a_scrape,
                [
                    "page_walk",
                    "slow_page_walk",
                    "just_above_50",
                    "cursor_walk",
                    "query_sweep",
                    "budget_refused",
                    "reconnect_evasion",
                    "summary",
                ],
            ),
            (
                self.a_loop,
                [
                    "exact_repeat",
                    "ab_cycle",
                    "abc_cycle",
                    "slow_loop",
                    "errored_retry",
                    "just_above_50",
                    "stuck_page",
                ],
            ),
            (
                self.a_priv,
                [
                    "passwd",
                    "sudoers",
                    "authorized_keys",
                    "write_denied",
                    "all_denied",
                    "admin_twice",
                    "verify_loop",
                    "crm_role_escalation",
                    "quota_reset",
                ],
            ),
            (
                self.a_step,
                [
                    "fulfill_without_charge",
                    "fulfill_only_ok",
                    "fulfill_refused",
                    "refused_after_cart",
                    "add_after_lock",
                    "pay_unapproved_expense",
                ],
            ),
            (
                self.a_dup,
                [
                    "retry_no_key",
                    "new_key_each_retry",
                    "second_refused",
                    "charge_loop",
                    "discount_reapply",
                    "approve_twice",
                    "payout_dup",
                ],
            ),
            (
                self.a_cross,
                [
                    "export_upload_shared",
                    "export_upload_linked",
                    "just_under_1mb",
                    "large_3mb",
                    "files_to_plugin",
                    "docs_to_plugin",
                    "upload_refused",
                    "slow",
                    "chunked",
                ],
            ),
            (
                self.a_conc,
                [
                    "burst",
                    "just_above_10",
                    "ratelimit_race",
                    "increment_usage",
                    "limited",
                    "all_throttled",
                    "multi_session",
                ],
            ),
            (
                self.a_race,
                [
                    "transfer_double_spend",
                    "cas_refused",
                    "spend_credits_race",
                    "process_order_lock",
                    "all_refused",
                    "approve_two_sessions",
                    "delete_vs_transfer",
                    "create_report_same_id",
                ],
            ),
        ]
        jobs: list = []
        for fn, k in benign:
            jobs += [fn] * self.n(k * r.uniform(0.85, 1.15))
        for fn, variants in attacks:
            per = max(1, round(28 * self.scale / len(variants) + 0.49))
            for v in variants:
                jobs += [(fn, v)] * max(1, per + r.choice([-1, 0, 0, 1]))
        r.shuffle(jobs)
        # fulfillers last, so that the orders paid (not fulfilled) by checkouts exist
        jobs += [self.b_fulfiller] * self.n(30)
        for j in jobs:
            if isinstance(j, tuple):
                j[0](j[1])
            else:
                j()
        heavy = r.sample(self.users, 5)
        for i in range(self.n(15)):
            self.b_power_user_day(heavy[i % len(heavy)])
        self.fix_derived()

    def fix_derived(self) -> None:
        """Keep each caller's `files` sessions >30 min apart so ingest derives them as labelled.

        Attack sessions are placed first and never moved; a benign session that would merge
        with another session of its caller is moved to a free slot of the day.
        """
        files = [s for s in self.sessions if s.calls and s.calls[0].server == "files"]
        files.sort(key=lambda s: (s.label == "benign", s.first()))
        placed: dict[str, list[tuple[int, int]]] = {}
        gap = 31 * MIN

        def free(caller: str, a: int, b: int) -> bool:
            return all(b + gap < x or a > y + gap for x, y in placed.get(caller, []))

        for s in files:
            a, b = s.first(), s.last()
            if not free(s.caller, a, b):
                span = b - a
                for _ in range(200):
                    na = self.when(span)
                    if free(s.caller, na, na + span):
                        break
                else:
                    na = max(y for _, y in placed[s.caller]) + self.u(35 * MIN, 90 * MIN)
                s.shift(na - a)
            placed.setdefault(s.caller, []).append((s.first(), s.last()))
        for s in files:
            s.sid = f"derived:caller:{s.caller}@{iso_us(s.first())}"

    # ------------------------------------------------------------------ output
    def render(self, s: Session, c: Call, seq: int) -> list[tuple[int, str]]:
        d = SERVERS[c.server]
        r = self.r
        st = c.status
        if d == "canon":
            o = {
                "ts": iso_ms(c.t),
                "session_id": s.sid,
                "caller_id": s.caller,
                "client_ip": s.ip,
                "server": c.server,
                "tool": c.tool,
                "args": c.args,
                "status": STATUS_WORDS[d][st],
            }
            if c.nbytes is not None:
                o["bytes"] = c.nbytes
            if c.rows is not None:
                o["rows"] = c.rows
            o["duration_ms"] = round(c.dur + r.random(), 1)
            o["request_id"] = seq
            if c.err:
                o["error"] = c.err
        elif d == "camel":
            o = {
                "timestamp": c.t,
                "sessionId": s.sid,
                "callerId": s.caller,
                "clientIp": s.ip,
                "serverName": c.server,
                "toolName": c.tool,
                "arguments": c.args,
            }
            if c.rid:
                o["resourceId"] = c.rid
            o["outcome"] = STATUS_WORDS[d][st]
            o["isError"] = st != "ok"
            if c.nbytes is not None:
                o["bytesReturned"] = c.nbytes
            if c.rows is not None:
                o["rowsReturned"] = c.rows
            o["latencyMs"] = c.dur
            if c.err:
                o["message"] = c.err
        elif d == "words":
            o = {
                "time": iso_tz(c.t, EET),
                "level": "info" if st == "ok" else "warn",
                "connection_id": s.sid,
                "user_id": s.caller,
                "ip": s.ip,
                "server_name": c.server,
                "tool_name": c.tool,
                "params": c.args,
                "status": STATUS_WORDS[d][st],
                "is_error": st != "ok",
            }
            if c.nbytes is not None:
                o["response_bytes"] = str(c.nbytes)
            o["durationSeconds"] = round(c.dur / 1000, 3)
            if c.err:
                o["reason"] = c.err
        elif d == "nosession":
            o = {
                "@timestamp": iso_naive(c.t),
                "principal": s.caller,
                "remote_addr": s.ip,
                "server": c.server,
                "tool": c.tool,
                "input": c.args,
                "status": STATUS_WORDS[d][st],
            }
            if c.nbytes is not None:
                o["bytes_returned"] = c.nbytes
            o["elapsed_ms"] = c.dur
        elif d == "otel":
            o = {
                "@timestamp": iso_tz(c.t, CET),
                "mcp.session.id": s.sid,
                "principal": s.caller,
                "ip": s.ip,
                "server": c.server,
                "gen_ai.tool.name": c.tool,
                "input": c.args,
                "outcome": STATUS_WORDS[d][st],
            }
            if c.nbytes is not None:
                o["bytes"] = c.nbytes
            if c.rows is not None:
                o["rows"] = c.rows
            o["latency_ms"] = c.dur
        else:  # jsonrpc: ids count per connection, as a client numbers its requests
            seq = s.calls.index(c) + 1
            req = {
                "ts": iso_ms(c.start),
                "session_id": s.sid,
                "caller_id": s.caller,
                "client_ip": s.ip,
                "server": c.server,
                "direction": "request",
                "message": {
                    "jsonrpc": "2.0",
                    "id": seq,
                    "method": "tools/call",
                    "params": {"name": c.tool, "arguments": c.args},
                },
            }
            if st == "ok":
                msg = {
                    "jsonrpc": "2.0",
                    "id": seq,
                    "result": {
                        "content": [
                            {"type": "text", "text": json.dumps({"ok": True, "id": self.hex(8)})}
                        ]
                    },
                }
            elif st == "denied":
                msg = {
                    "jsonrpc": "2.0",
                    "id": seq,
                    "result": {
                        "isError": True,
                        "content": [{"type": "text", "text": "permission denied"}],
                    },
                }
            else:
                msg = {
                    "jsonrpc": "2.0",
                    "id": seq,
                    "error": {"code": -32000, "message": c.err or "error"},
                }
            resp = {
                "ts": iso_ms(c.start + c.dur),
                "session_id": s.sid,
                "direction": "response",
                "message": msg,
            }
            return [(c.start, dumps(req)), (c.start + c.dur, dumps(resp))]
        return [(c.t, dumps(o))]

    def write(self, out: str) -> dict:
        os.makedirs(out, exist_ok=True)
        lines: dict[str, list[tuple[int, int, str]]] = {k: [] for k in SERVERS}
        seq = 0
        for s in self.sessions:
            if s.summary is not None:
                st = s.summary
                anomalous = (
                    st["uniqueResourcesAccessed"] > 100
                    or st["totalBytesReturned"] > 1_000_000
                    or st["authFailures"] > 2
                    or st["callCount"] > 50
                )
                o = {
                    "event": "SESSION_ANOMALY" if anomalous else "SESSION_END",
                    "sessionId": s.sid,
                    "callerId": s.caller,
                    "clientIp": s.ip,
                    "server": "legacy-search",
                }
                o |= {
                    k: st[k]
                    for k in (
                        "callCount",
                        "uniqueResourcesAccessed",
                        "totalBytesReturned",
                        "authFailures",
                        "durationMs",
                    )
                }
                o["ts"] = iso_ms(st["end"])
                lines["legacy-search"].append((st["end"], seq, dumps(o)))
                seq += 1
                continue
            for c in s.calls:
                seq += 1
                for t, line in self.render(s, c, seq):
                    lines[c.server].append((t, seq, line))
            if s.end_summary:
                dc = [c for c in s.calls if c.server == "docs"]
                end = max(c.t for c in dc)
                o = {
                    "event": "SESSION_END",
                    "session_id": s.sid,
                    "caller_id": s.caller,
                    "server": "docs",
                    "callCount": len(dc),
                    "uniqueResourcesAccessed": len({json.dumps(c.args) for c in dc}),
                    "totalBytesReturned": sum(c.nbytes or 0 for c in dc),
                    "authFailures": sum(c.status == "auth_failed" for c in dc),
                    "durationMs": end - min(c.t for c in dc),
                    "ts": iso_ms(end),
                }
                lines["docs"].append((end, seq + 1, dumps(o)))
        counts = {}
        for srv, ls in lines.items():
            ls.sort()
            with open(os.path.join(out, f"{srv}.jsonl"), "w", encoding="utf-8") as f:
                for _t, _q, line in ls:
                    f.write(line + "\n")
            counts[srv] = len(ls)
        with open(os.path.join(out, "labels.ndjson"), "w", encoding="utf-8") as f:
            for s in self.sessions:
                if s.summary is None and not s.calls:
                    continue
                attempt = (
                    s.label != "benign"
                    and s.summary is None
                    and all(c.status != "ok" for c in s.calls)
                )
                rec = {
                    "kind": "session",
                    "session_id": s.sid,
                    "caller_id": s.caller,
                    "client_ip": s.ip,
                    "server": "legacy-search"
                    if s.summary is not None
                    else min(s.calls, key=lambda c: c.t).server,
                    "label": s.label,
                    "role": s.role,
                    "variant": s.variant,
                    "first_seen": iso_ms(s.first()),
                    "last_seen": iso_ms(s.last()),
                    "n_calls": s.summary["callCount"] if s.summary is not None else len(s.calls),
                }
                if attempt:
                    rec["attempt"] = True
                if s.also:
                    rec["also"] = sorted(set(s.also))
                f.write(dumps(rec) + "\n")
            for e in self.entities:
                ss = e["sess"]
                f.write(
                    dumps(
                        {
                            "kind": "entity",
                            "entity_type": e["etype"],
                            "entity": e["value"],
                            "label": e["label"],
                            "session_ids": [s.sid for s in ss],
                            "first_seen": iso_ms(min(s.first() for s in ss)),
                            "last_seen": iso_ms(max(s.last() for s in ss)),
                        }
                    )
                    + "\n"
                )
        return counts


def dumps(o: dict) -> str:
    return json.dumps(o, separators=(",", ":"), ensure_ascii=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    a = ap.parse_args()
    g = Gen(a.seed, a.scale)
    g.build()
    counts = g.write(a.out)
    by: dict[str, int] = {}
    for s in g.sessions:
        by[s.label] = by.get(s.label, 0) + 1
    print(json.dumps({"lines": counts, "sessions": by, "entities": len(g.entities)}))


if __name__ == "__main__":
    main()
