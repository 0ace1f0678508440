"""Synthetic traffic for detector tests: small, readable scenarios with known answers.

Not a realistic generator (that is ``sample_logs/generate.py``); each method writes one
scenario — an attack or a hard negative — as rows following ``schema.EVENTS`` /
``schema.SUMMARIES``, so tests read like the issue's list of must-catch and must-not-flag
cases. Deterministic for a given seed.
"""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import polars as pl
from toolwatch.detectors.features import EVENT_COLUMNS, SUMMARY_COLUMNS

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


def _h(text: str) -> str:
    return "hmac:" + hashlib.sha256(text.encode()).hexdigest()[:32]


class Traffic:
    """Accumulates calls and session summaries.

    Parameters
    ----------
    seed
        Seed of the jitter applied to gaps and sizes.
    """

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)  # noqa: S311 - test data, not crypto
        self.rows: list[dict[str, Any]] = []
        self.summary_rows: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ primitives
    def call(
        self,
        session: str | None,
        ts: datetime,
        tool: str,
        *,
        caller: str | None = "alice",
        ip: str | None = "10.0.0.1",
        server: str = "docs-server",
        args: dict[str, Any] | None = None,
        resource_key: str | None = None,
        resource_id: str | None = None,
        status: str = "ok",
        nbytes: int | None = 2_000,
        rows: int | None = None,
        cred: str | None = None,
        duration_ms: float = 40.0,
    ) -> None:
        """Add one normalized call."""
        a = dict(args or {})
        if resource_key and resource_id is not None:
            a.setdefault(resource_key, resource_id)
        if cred is not None:
            a["apiKey"] = _h(cred)
        self.rows.append(
            {
                "ts": ts,
                "session_id": session,
                "caller_id": caller,
                "client_ip": ip,
                "server": server,
                "tool": tool,
                "args": orjson.dumps(a).decode(),
                "resource_key": resource_key,
                "resource_id": resource_id,
                "status": status,
                "is_error": status != "ok",
                "bytes": nbytes,
                "rows": rows,
                "duration_ms": duration_ms,
                "credential_hash": _h(cred) if cred is not None else None,
            }
        )

    def summary(
        self,
        session: str,
        ts: datetime,
        *,
        kind: str = "SESSION_END",
        caller: str | None = "bob",
        ip: str | None = "10.0.0.9",
        calls: int = 10,
        unique_resources: int = 5,
        total_bytes: int = 20_000,
        auth_failures: int = 0,
        duration_s: float = 600.0,
        server: str = "billing-server",
    ) -> None:
        """Add one SESSION_END / SESSION_ANOMALY summary."""
        self.summary_rows.append(
            {
                "ts": ts,
                "kind": kind,
                "session_id": session,
                "caller_id": caller,
                "client_ip": ip,
                "server": server,
                "call_count": calls,
                "unique_resources": unique_resources,
                "total_bytes": total_bytes,
                "auth_failures": auth_failures,
                "duration_ms": duration_s * 1000,
            }
        )

    def gap(self, mean_s: float, cv: float = 1.0) -> timedelta:
        """A think-time gap: exponential-ish for cv≈1, near-constant for small cv."""
        if cv >= 0.99:
            g = self.rng.expovariate(1.0 / mean_s)
        else:
            g = max(0.05, self.rng.gauss(mean_s, cv * mean_s))
        return timedelta(seconds=g)

    # ------------------------------------------------------------------ benign scenarios
    def normal_session(
        self, sid: str, start: datetime, *, caller: str = "alice", ip: str = "10.0.0.1",
        calls: int = 12, server: str = "docs-server",
    ) -> None:
        """A person's agent: searches, reads a few documents, irregular think time."""
        t = start
        docs = self.rng.sample(range(1000, 9000), k=max(1, calls // 2))
        for i in range(calls):
            if i % 3 == 0:
                self.call(sid, t, "searchItems", caller=caller, ip=ip, server=server,
                          args={"query": f"q{self.rng.randint(0, 99)}"}, nbytes=4_000)
            else:
                d = docs[i % len(docs)]
                self.call(sid, t, "getDocument", caller=caller, ip=ip, server=server,
                          resource_key="documentId", resource_id=f"doc-{d}",
                          nbytes=self.rng.randint(2_000, 20_000))
            t += self.gap(40)

    def power_user(
        self, sid: str, start: datetime, *, caller: str = "pat", ip: str = "10.0.0.2",
        calls: int = 160,
    ) -> None:
        """A long, diverse session: many tools, many documents, irregular gaps, some misses."""
        tools = ["searchItems", "getDocument", "listDocuments", "readFile", "summarizeDocument",
                 "getContact", "logActivity"]
        t = start
        for _ in range(calls):
            tool = self.rng.choice(tools)
            if tool in ("getDocument", "summarizeDocument", "readFile"):
                d = self.rng.randint(1000, 99999)
                status = "not_found" if self.rng.random() < 0.04 else "ok"
                self.call(sid, t, tool, caller=caller, ip=ip, resource_key="documentId",
                          resource_id=f"doc-{d}", status=status,
                          nbytes=self.rng.randint(1_000, 40_000))
            elif tool == "listDocuments":
                self.call(sid, t, tool, caller=caller, ip=ip,
                          args={"page": self.rng.randint(1, 3)}, nbytes=8_000)
            else:
                self.call(sid, t, tool, caller=caller, ip=ip,
                          args={"q": self.rng.randint(0, 10**6)}, nbytes=3_000)
            t += self.gap(25)

    def nightly_export(
        self, sid: str, day: int, *, caller: str = "svc-export", ip: str = "10.1.0.5",
        pages: int = 80,
    ) -> None:
        """A service account paging through a large export at 02:00 every night."""
        t = T0.replace(hour=2) + timedelta(days=day)
        for p in range(1, pages + 1):
            self.call(sid, t, "exportReport", caller=caller, ip=ip, args={"page": p,
                      "pageSize": 1000}, nbytes=self.rng.randint(900_000, 1_100_000),
                      rows=1000, duration_ms=900.0)
            t += self.gap(2.0, cv=0.4)

    def typo_user(self, sid: str, start: datetime, *, caller: str = "tom",
                  ip: str = "10.0.0.3") -> None:
        """Mistypes the API key twice, then works normally."""
        t = start
        for wrong in ("k-tom-typo1", "k-tom-typo2"):
            self.call(sid, t, "searchItems", caller=caller, ip=ip, status="auth_failed",
                      cred=wrong, nbytes=100)
            t += self.gap(20)
        for _ in range(10):
            self.call(sid, t, "searchItems", caller=caller, ip=ip, cred="k-tom-good",
                      args={"q": self.rng.randint(0, 99)})
            t += self.gap(30)

    def retry_client(self, sid: str, start: datetime, *, caller: str = "rita",
                     ip: str = "10.0.0.4") -> None:
        """Rate-limited and errors, retried with identical arguments a few times."""
        t = start
        for i in range(8):
            for attempt in range(3):
                status = "rate_limited" if attempt < 2 else "ok"
                self.call(sid, t, "getDocument", caller=caller, ip=ip, resource_key="documentId",
                          resource_id=f"doc-{5000 + i * 37}", status=status)
                t += timedelta(seconds=1 + attempt)
            t += self.gap(30)

    def booking_customer(self, sid: str, start: datetime, *, caller: str = "cust-1",
                         ip: str = "10.2.0.1") -> None:
        """Looks up several of their own bookings (ids close together), one mistyped."""
        t = start
        self.call(sid, t, "listBookings", caller=caller, ip=ip, server="travel-server")
        t += self.gap(20)
        for b, st in ((40211, "ok"), (40212, "ok"), (40213, "ok"), (40241, "not_found"),
                      (40214, "ok")):
            self.call(sid, t, "getBooking", caller=caller, ip=ip, server="travel-server",
                      resource_key="bookingId", resource_id=f"BK-{b}", status=st)
            t += self.gap(30)

    def ci_bot(self, sid: str, start: datetime, *, caller: str = "ci-probe",
               ip: str = "10.3.0.1", calls: int = 20) -> None:
        """A synthetic health probe: the same cheap call on a strict schedule."""
        t = start
        for _ in range(calls):
            self.call(sid, t, "searchItems", caller=caller, ip=ip, args={"query": "health"},
                      nbytes=300)
            t += timedelta(seconds=60)

    # ------------------------------------------------------------------ attacks
    def enumeration(
        self, sid: str, start: datetime, *, n: int = 143, gap_s: float = 1.5,
        miss_share: float = 0.9, caller: str = "mallory", ip: str = "203.0.113.7",
        first: int = 1001,
    ) -> None:
        """Walks documentId from ``first`` upward; most ids do not exist or are denied."""
        t = start
        for i in range(n):
            st = "ok" if self.rng.random() >= miss_share else self.rng.choice(
                ["not_found", "not_found", "denied"])
            self.call(sid, t, "getDocument", caller=caller, ip=ip, resource_key="documentId",
                      resource_id=f"doc-{first + i}", status=st,
                      nbytes=200 if st != "ok" else 5_000)
            t += self.gap(gap_s, cv=0.6)

    def bulk_extraction(self, sid: str, start: datetime, *, caller: str = "eve",
                        ip: str = "198.51.100.4", calls: int = 25) -> None:
        """Large exports in a short session from an account that normally reads little."""
        t = start
        for p in range(calls):
            self.call(sid, t, "exportReport", caller=caller, ip=ip,
                      args={"limit": 50000, "offset": p * 50000},
                      nbytes=self.rng.randint(4_000_000, 6_000_000), rows=50_000)
            t += self.gap(8)

    def stuffing_session(self, sid: str, start: datetime, *, caller: str | None = "victim",
                         ip: str = "192.0.2.66", tries: int = 40) -> None:
        """Tries many different keys in one session."""
        t = start
        for i in range(tries):
            self.call(sid, t, "searchItems", caller=caller, ip=ip, status="auth_failed",
                      cred=f"leaked-{sid}-{i}", nbytes=90)
            t += self.gap(2)

    def distributed_stuffing(
        self, prefix: str, start: datetime, *, ip: str = "192.0.2.77", sessions: int = 30,
        per_session: int = 2, callers: list[str] | None = None, spacing_s: float = 240,
    ) -> list[str]:
        """Many short sessions from one address, each failing at most ``per_session`` times."""
        t = start
        sids = []
        for s in range(sessions):
            sid = f"{prefix}-{s}"
            sids.append(sid)
            caller = (callers or [f"user{s:03d}"])[s % len(callers or [f"user{s:03d}"])]
            u = t
            for i in range(per_session):
                self.call(sid, u, "searchItems", caller=caller, ip=ip, status="auth_failed",
                          cred=f"combo-{prefix}-{s}-{i}", nbytes=90)
                u += timedelta(seconds=1.5)
            t += self.gap(spacing_s)
        return sids

    def scraping(self, sid: str, start: datetime, *, caller: str = "crawler",
                 ip: str = "203.0.113.50", pages: int = 200, gap_s: float = 3.0) -> None:
        """A mechanical pagination sweep of one listing tool at a steady cadence."""
        t = start
        for p in range(1, pages + 1):
            self.call(sid, t, "listDocuments", caller=caller, ip=ip, args={"page": p},
                      nbytes=self.rng.randint(7_000, 9_000))
            t += self.gap(gap_s, cv=0.1)

    def stuck_loop(self, sid: str, start: datetime, *, caller: str = "loopy",
                   ip: str = "203.0.113.60", calls: int = 150) -> None:
        """An agent repeating the same two calls forever."""
        t = start
        for i in range(calls):
            self.call(sid, t, "searchItems", caller=caller, ip=ip,
                      args={"query": "quarterly report" if i % 2 else "Q3 report"})
            t += self.gap(4, cv=0.2)

    def oddball(self, sid: str, start: datetime, *, caller: str = "odd",
                ip: str = "198.51.100.200", calls: int = 30) -> None:
        """Unlike anything else, yet below every rule: distinct heavy lookups with a few
        auth failures and misses (for the isolation forest)."""
        t = start
        for i in range(calls):
            st = "auth_failed" if i % 5 == 0 else ("not_found" if i % 4 == 0 else "ok")
            self.call(sid, t, "getContact", caller=caller, ip=ip, resource_key="contactId",
                      resource_id=f"ct-{(i * 7919) % 100000}", nbytes=30_000 + i, rows=30,
                      status=st, cred=f"k{i % 3}" if st == "auth_failed" else None)
            t += self.gap(4)

    # ------------------------------------------------------------------ output
    def events(self) -> pl.DataFrame:
        """The calls as a frame with the ``schema.EVENTS`` columns detectors read."""
        extra = {"event_id": pl.String(), "session_derived": pl.Boolean(), "format": pl.String(),
                 "source": pl.String()}
        if not self.rows:
            return pl.DataFrame(schema={**EVENT_COLUMNS, **extra})
        df = pl.DataFrame(self.rows, schema=EVENT_COLUMNS)
        return df.with_columns(
            pl.concat_str(
                [pl.col("session_id").fill_null("-"), pl.int_range(pl.len()).cast(pl.String)],
                separator=":",
            ).alias("event_id"),
            pl.lit(False).alias("session_derived"),
            pl.lit("call").alias("format"),
            pl.lit("test").alias("source"),
        ).sort("ts", maintain_order=True)

    def summaries(self) -> pl.DataFrame:
        """The session summaries as a frame with the ``schema.SUMMARIES`` columns read."""
        if not self.summary_rows:
            return pl.DataFrame(schema=SUMMARY_COLUMNS)
        return pl.DataFrame(self.summary_rows, schema=SUMMARY_COLUMNS).sort("ts")

    def background(self, days: int = 3, users: int = 30, per_day: int = 2) -> None:
        """Ordinary traffic of ``users`` people over ``days`` days (the population)."""
        for d in range(days):
            for u in range(users):
                for k in range(per_day):
                    start = T0 + timedelta(days=d, hours=self.rng.uniform(0, 10), minutes=k)
                    self.normal_session(
                        f"bg-{d}-{u}-{k}", start, caller=f"user-{u}",
                        ip=f"10.9.{u // 200}.{u % 200}",
                        calls=self.rng.randint(4, 30),
                    )
