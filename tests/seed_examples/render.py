"""Render the seeds' own examples (../shared/seeds/000-004) as MCP server log traffic.

Written from the seed articles and docs/log-format.md only, without reading the detectors:
each example is what a server's per-call log (or session summary, or JSON-RPC transcript)
would hold if the attack, chain or scenario an article describes happened against it. A few
everyday hard negatives (treasury and payroll runs, back-off polling, an admin paging through
a report, an idempotent retry ...) and a background of ordinary users sit beside them.

Stdlib only and deterministic (one fixed seed per example). Usage::

    python tests/seed_examples/render.py OUTDIR

writes ``OUTDIR/<id>.jsonl`` per example, ``OUTDIR/background.jsonl``,
``OUTDIR/all.jsonl`` (everything, time-ordered) and ``OUTDIR/manifest.json``.
"""

from __future__ import annotations

import json
import random
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

SEEDS = {
    "000": "000_caab1d069108f529.txt",
    "001": "001_b3b07658d5fcfc69.txt",
    "002": "002_ca57d422c89fcd10.txt",
    "003": "003_611f24d81470a8d6.txt",
    "004": "004_833b1ee58f0ad72f.txt",
}

#: The categories toolwatch reports (README "What it flags").
CATEGORIES = (
    "enumeration",
    "bulk_extraction",
    "credential_stuffing",
    "scraping_loop",
    "tool_loop",
    "privilege_chain",
    "step_skip",
    "duplicate_execution",
    "cross_server_flow",
    "concurrency_abuse",
    "race_condition",
    "anomaly",
)

#: Every example lives in its own 3-hour slot from here on, so no two share a time window.
BASE = datetime(2026, 10, 5, 8, 0, tzinfo=UTC)
SLOT = timedelta(hours=3)


@dataclass
class Example:
    """One seed example rendered as log lines.

    Attributes
    ----------
    id
        Stable identifier (test id).
    seed
        Seed file number (``"000"`` … ``"004"``) or ``"-"`` for the hard negatives.
    quote
        The seed text it renders (quoted or closely paraphrased).
    expected
        Acceptable categories (the first is the one the seed implies; a second is listed only
        where the seed's own words fit two of toolwatch's categories), or ``("benign",)``.
    lines
        The log objects, one per line.
    """

    id: str
    seed: str
    quote: str
    expected: tuple[str, ...]
    lines: list[dict] = field(default_factory=list)

    @property
    def benign(self) -> bool:
        """Whether this is a hard negative (no alert at medium or higher expected)."""
        return self.expected == ("benign",)

    def entities(self) -> set[str]:
        """Sessions, callers and client addresses the example's lines name."""
        out: set[str] = set()
        for line in self.lines:
            for key in _ENTITY_KEYS:
                if isinstance(line.get(key), str):
                    out.add(line[key])
        return out


# --------------------------------------------------------------------------- helpers


def iso(t: datetime) -> str:
    """ISO-8601 UTC with milliseconds, as servers write it."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


class Actor:
    """An agent on one (or more) servers: session, caller, address and a clock.

    ``call`` logs one tool call the way the SDK middleware does: ``ts`` is the completion
    time and ``duration_ms`` how long it ran (docs/log-format.md, *When a call was in flight*).
    """

    def __init__(self, rng: random.Random, caller: str, ip: str, session: str, t: datetime):
        self.rng = rng
        self.caller = caller
        self.ip = ip
        self.session = session
        self.t = t
        self.lines: list[dict] = []

    def call(
        self,
        server: str,
        tool: str,
        args: dict,
        *,
        status: str = "ok",
        nbytes: int | None = None,
        rows: int | None = None,
        dur: float | None = None,
        start: datetime | None = None,
        error: str | None = None,
        session: str | None = None,
        gap: float | None = None,
    ) -> datetime:
        """Log a call that starts at ``start`` (else after ``gap`` s, else now); returns its end."""
        rng = self.rng
        if start is None:
            self.t += timedelta(seconds=gap if gap is not None else rng.uniform(0.8, 3.5))
            start = self.t
        dur = dur if dur is not None else rng.uniform(8, 60)
        end = start + timedelta(milliseconds=dur)
        line: dict = {
            "ts": iso(end),
            "session_id": session or self.session,
            "caller_id": self.caller,
            "client_ip": self.ip,
            "server": server,
            "tool": tool,
            "args": args,
            "status": status,
            "bytes": nbytes if nbytes is not None else rng.randint(180, 2400),
            "duration_ms": round(dur, 1),
        }
        if rows is not None:
            line["rows"] = rows
        if status != "ok":
            line["isError"] = True
            if error:
                line["error"] = error
        self.lines.append(line)
        if start >= self.t:
            self.t = end
        return end


#: Keys (of the aliases docs/log-format.md lists) that name a session, caller or address.
_ENTITY_KEYS = (
    "session_id",
    "sessionId",
    "mcp.session.id",
    "caller_id",
    "callerId",
    "principal",
    "authenticatedUserId",
    "client_ip",
    "clientIp",
    "remote_addr",
)


def restyle(lines: list[dict], style: str) -> list[dict]:
    """Rewrite canonical per-call lines in another server's field names.

    Parameters
    ----------
    lines
        Lines as ``Actor.call`` writes them.
    style
        ``"camel"``: camelCase aliases, epoch-millisecond times, **no session id** (the
        2026-07-28 MCP revision), the caller as ``authenticatedUserId``;
        ``"otel"``: OpenTelemetry-style dotted keys and an ISO time with a +02:00 offset;
        ``"interval"``: explicit ``start_ts``/``end_ts`` and no duration.
    """
    out = []
    for x in lines:
        # another deployment, another agent: its caller must not be the original example's
        x = {**x, "caller_id": f"{x['caller_id']}-{style}"}
        end = datetime.strptime(x["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        if style == "camel":
            y = {
                "timestamp": int(end.timestamp() * 1000),
                "authenticatedUserId": x["caller_id"],
                "clientIp": x["client_ip"],
                "serverName": x["server"],
                "toolName": x["tool"],
                "arguments": x["args"],
                "outcome": x["status"],
                "isError": x["status"] != "ok",
                "bytesReturned": x["bytes"],
                "latencyMs": x["duration_ms"],
            }
            if "rows" in x:
                y["rowsReturned"] = x["rows"]
        elif style == "otel":
            local = end.astimezone(timezone(timedelta(hours=2)))
            y = {
                "@timestamp": local.isoformat(timespec="milliseconds"),
                "mcp.session.id": x["session_id"],
                "principal": x["caller_id"],
                "remote_addr": x["client_ip"],
                "server_name": x["server"],
                "gen_ai.tool.name": x["tool"],
                "input": x["args"],
                "status": x["status"],
                "response_bytes": x["bytes"],
                "latency_ms": x["duration_ms"],
            }
            if "rows" in x:
                y["rows_returned"] = x["rows"]
        elif style == "interval":
            start = end - timedelta(milliseconds=x["duration_ms"])
            y = {k: v for k, v in x.items() if k != "duration_ms"}
            y.update(ts=iso(start), start_ts=iso(start), end_ts=iso(end))
        else:
            raise ValueError(style)
        if "error" in x:
            y["error"] = x["error"]
        out.append(y)
    return out


def _rng(example_id: str) -> random.Random:
    return random.Random(zlib.crc32(example_id.encode()))


def _hex(rng: random.Random, n: int = 8) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _uuid(rng: random.Random) -> str:
    h = _hex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


def _actor(example_id: str, slot: int, caller: str, ip_octet: int) -> Actor:
    rng = _rng(example_id)
    start = BASE + slot * SLOT + timedelta(minutes=rng.uniform(5, 40))
    return Actor(
        rng, caller, f"10.{40 + slot // 200}.{slot % 200}.{ip_octet}", f"s-{_hex(rng, 12)}", start
    )


# --------------------------------------------------------------------------- seed 000


def s000_fulfill_without_charge(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-shop-31", 17)
    cart = f"cart-{a.rng.randint(10000, 99999)}"
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("shop", "createCart", {"customerId": "cus-4471"})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-88120", "qty": 1})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-10442", "qty": 2})
    a.call("shop", "checkout", {"cartId": cart}, nbytes=412)
    a.call("shop", "getOrder", {"orderId": order}, nbytes=980)
    # no chargePayment: the order ships unpaid (the vulnerable handler trusts the sequence)
    a.call("shop", "fulfillOrder", {"orderId": order}, nbytes=38, dur=140)
    return a.lines


def s000_fulfill_refused(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-shop-52", 18)
    cart = f"cart-{a.rng.randint(10000, 99999)}"
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("shop", "createCart", {"customerId": "cus-9012"})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-31001", "qty": 3})
    a.call("shop", "checkout", {"cartId": cart}, nbytes=398)
    # the safe handler checks the database and refuses: the attempt itself is the finding
    a.call(
        "shop",
        "fulfillOrder",
        {"orderId": order},
        status="error",
        nbytes=71,
        error="Cannot fulfill order: payment status is pending",
    )
    return a.lines


def s000_fulfill_refused_jsonrpc(eid: str, slot: int) -> list[dict]:
    """The refused step skip as a logging proxy's JSON-RPC transcript (result.isError)."""
    rng = _rng(eid)
    t = BASE + slot * SLOT + timedelta(minutes=rng.uniform(5, 40))
    conn = f"conn-{_hex(rng, 10)}"
    order = f"ord-{rng.randint(100000, 999999)}"
    lines: list[dict] = []
    calls = [
        ("createCart", {"customerId": "cus-7310"}, False, '{"cartId":"cart-55102"}'),
        ("addToCart", {"cartId": "cart-55102", "sku": "SKU-20020", "qty": 1}, False, '{"ok":true}'),
        (
            "checkout",
            {"cartId": "cart-55102"},
            False,
            f'{{"orderId":"{order}","status":"pending"}}',
        ),
        (
            "fulfillOrder",
            {"orderId": order},
            True,
            '{"error":"Cannot fulfill order: payment status is pending"}',
        ),
        (
            "fulfillOrder",
            {"orderId": order},
            True,
            '{"error":"Cannot fulfill order: order status is pending"}',
        ),
    ]
    for i, (tool, args, is_err, text) in enumerate(calls, start=1):
        t += timedelta(seconds=rng.uniform(1.0, 4.0))
        lines.append(
            {
                "ts": iso(t),
                "session_id": conn,
                "direction": "request",
                "message": {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": tool, "arguments": args},
                },
            }
        )
        t += timedelta(milliseconds=rng.uniform(20, 90))
        lines.append(
            {
                "ts": iso(t),
                "session_id": conn,
                "direction": "response",
                "message": {
                    "jsonrpc": "2.0",
                    "id": i,
                    "result": {"content": [{"type": "text", "text": text}], "isError": is_err},
                },
            }
        )
    return lines


def s000_approve_expense_twice(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-expenses-7", 19)
    other = f"s-{_hex(a.rng, 12)}"
    exp = f"exp-{a.rng.randint(20000, 29999)}"
    a.call("finance", "getExpense", {"expenseId": exp}, nbytes=640)
    a.call("finance", "getExpense", {"expenseId": exp}, nbytes=640, session=other)
    t0 = a.t + timedelta(seconds=2)
    # two sessions of one caller approve the same expense at the same moment
    a.call("finance", "approveExpense", {"expenseId": exp, "note": "ok"}, start=t0, dur=230)
    a.call(
        "finance",
        "approveExpense",
        {"expenseId": exp, "note": "approved"},
        start=t0 + timedelta(milliseconds=6),
        dur=245,
        session=other,
    )
    return a.lines


def s000_discount_interleaved(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-shop-77", 20)
    cart = f"cart-{a.rng.randint(10000, 99999)}"
    a.call("shop", "createCart", {"customerId": "cus-1208"})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-55012", "qty": 1})
    # the same code applied again and again, interleaved with the checkout flow
    for _ in range(4):
        a.call("shop", "applyDiscount", {"cartId": cart, "code": "WELCOME20"}, nbytes=160)
        a.call("shop", "getCartTotal", {"cartId": cart}, nbytes=220)
        a.call("shop", "checkout", {"cartId": cart}, nbytes=400)
    return a.lines


def s000_add_after_price_lock(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-shop-90", 21)
    cart = f"cart-{a.rng.randint(10000, 99999)}"
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("shop", "createCart", {"customerId": "cus-3317"})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-10001", "qty": 1})
    a.call("shop", "lockPrice", {"cartId": cart}, nbytes=300)
    # items added after the price was locked ride on the locked total
    for sku in ("SKU-77001", "SKU-77002", "SKU-77003"):
        a.call("shop", "addToCart", {"cartId": cart, "sku": sku, "qty": 5})
    a.call(
        "shop",
        "chargePayment",
        {"orderId": order, "amountCents": 1299, "idempotencyKey": _uuid(a.rng)},
    )
    a.call("shop", "fulfillOrder", {"orderId": order})
    return a.lines


def s000_quota_reset(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-reports-12", 22)
    # run the rate-limited tool to its limit, reset the counter with an admin tool, again
    for cycle in range(3):
        for i in range(10):
            a.call(
                "reports",
                "generateReport",
                {"reportType": "usage", "month": f"2026-{(i % 9) + 1:02d}"},
                nbytes=a.rng.randint(8000, 16000),
                dur=a.rng.uniform(300, 900),
            )
        for _ in range(2):
            a.call(
                "reports",
                "generateReport",
                {"reportType": "usage", "month": "2026-10"},
                status="rate_limited",
                nbytes=64,
                error="quota exceeded",
            )
        a.call(
            "admin",
            "resetUsageCounter",
            {"counter": "generateReport", "scope": "session"},
            nbytes=40,
        )
    return a.lines


def s000_retry_double_charge(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-shop-15", 23)
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("shop", "getOrder", {"orderId": order}, nbytes=870)
    # slow answer, the model retries on ambiguity without an idempotency key: charged twice
    a.call("shop", "chargePayment", {"orderId": order, "amountCents": 4999}, dur=29500, nbytes=210)
    a.call("shop", "chargePayment", {"orderId": order, "amountCents": 4999}, dur=640, nbytes=210)
    a.call("shop", "fulfillOrder", {"orderId": order})
    return a.lines


def s000_charge_loop(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-billing-4", 24)
    order = f"ord-{a.rng.randint(100000, 999999)}"
    # a prompt-injected loop repeatedly triggers the financial operation
    for _ in range(6):
        a.call(
            "billing",
            "chargePayment",
            {"orderId": order, "amountCents": 2500},
            dur=a.rng.uniform(400, 900),
            nbytes=205,
            gap=a.rng.uniform(4, 9),
        )
    return a.lines


def s000_charge_loop_refused(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-billing-9", 25)
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("billing", "chargePayment", {"orderId": order, "amountCents": 2500}, dur=700, nbytes=205)
    # the per-session limit (1 charge) refuses the rest
    for n in range(2, 8):
        a.call(
            "billing",
            "chargePayment",
            {"orderId": order, "amountCents": 2500},
            status="error",
            nbytes=96,
            gap=a.rng.uniform(3, 7),
            error=f"chargePayment has been called {n} times this session; "
            "use idempotencyKey to retry",
        )
    return a.lines


def s000_idempotency_key_reused(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-billing-21", 26)
    key = _uuid(a.rng)
    # one key for several different charges: the server returns the first result, or worse
    for order, amount in (("ord-310001", 1500), ("ord-310002", 8900), ("ord-310003", 45000)):
        a.call(
            "billing",
            "chargePayment",
            {"orderId": order, "amountCents": amount, "idempotencyKey": key},
            dur=a.rng.uniform(300, 700),
            nbytes=230,
        )
    return a.lines


def s000_reverse_order(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-shop-63", 27)
    cart = f"cart-{a.rng.randint(10000, 99999)}"
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("shop", "createCart", {"customerId": "cus-6620"})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-40404", "qty": 1})
    a.call("shop", "checkout", {"cartId": cart}, nbytes=405)
    # the flow run in reverse: fulfil first, pay afterwards
    a.call("shop", "fulfillOrder", {"orderId": order}, nbytes=38)
    a.call("shop", "chargePayment", {"orderId": order, "amountCents": 1999}, dur=650, nbytes=210)
    return a.lines


# --------------------------------------------------------------------------- seed 001


def s001_search_pagination(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-scraper-3", 30)
    for page in range(1, 121):
        a.call(
            "catalog",
            "searchItems",
            {"query": "*", "page": page, "limit": 100},
            rows=100,
            nbytes=a.rng.randint(17000, 19500),
            dur=a.rng.uniform(40, 90),
            gap=a.rng.uniform(0.9, 1.3),
        )
    return a.lines


def s001_search_budget_evasion(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-scraper-8", 31)
    page = 1
    for _ in range(6):
        # the protected server caps a session at 20 calls: open a new session, continue
        for _ in range(20):
            a.call(
                "catalog",
                "searchItems",
                {"query": "", "page": page, "limit": 50},
                rows=50,
                nbytes=a.rng.randint(8500, 9800),
                gap=a.rng.uniform(1.0, 1.6),
            )
            page += 1
        a.call(
            "catalog",
            "searchItems",
            {"query": "", "page": page, "limit": 50},
            status="error",
            nbytes=90,
            error="Session search limit reached. Start a new session to continue.",
        )
        a.session = f"s-{_hex(a.rng, 12)}"
        a.t += timedelta(seconds=a.rng.uniform(2, 5))
    return a.lines


def s001_list_cursor(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-scraper-11", 32)
    cursor = None
    for _ in range(80):
        args: dict = {"limit": 50}
        if cursor:
            args["cursor"] = cursor
        a.call(
            "docs",
            "listDocuments",
            args,
            rows=50,
            nbytes=a.rng.randint(11000, 12500),
            gap=a.rng.uniform(0.7, 1.1),
        )
        cursor = "eyJvZmZzZXQiOi" + _hex(a.rng, 10)
    return a.lines


def s001_credential_stuffing(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-integrations-5", 33)
    ok_at = {17, 31}
    for i in range(40):
        key = "ghp_" + "".join(
            a.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
            for _ in range(36)
        )
        if i in ok_at:
            a.call(
                "integrations",
                "connectExternalService",
                {"service": "github", "apiKey": key},
                nbytes=52,
                dur=a.rng.uniform(180, 400),
            )
        else:
            # the fixed 500-1000 ms delay of the lockout-free server
            a.call(
                "integrations",
                "connectExternalService",
                {"service": "github", "apiKey": key},
                status="auth_failed",
                nbytes=40,
                dur=a.rng.uniform(500, 1000),
                error="Authentication failed",
                gap=a.rng.uniform(0.2, 0.6),
            )
    return a.lines


def s001_credential_stuffing_rotating(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-integrations-6", 34)
    # the server locks a session after 3 failures: the agent opens a fresh session each time
    for n in range(15):
        a.session = f"s-{_hex(a.rng, 12)}"
        a.caller = f"mcp#{_hex(a.rng, 6)}"
        for _ in range(3):
            key = "sk_live_" + "".join(
                a.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(24)
            )
            a.call(
                "integrations",
                "connectExternalService",
                {"service": "stripe", "apiKey": key},
                status="auth_failed",
                nbytes=40,
                dur=a.rng.uniform(500, 1000),
                error="Authentication failed",
                gap=a.rng.uniform(0.3, 0.8),
            )
        a.call(
            "integrations",
            "connectExternalService",
            {"service": "stripe", "apiKey": "sk_live_" + _hex(a.rng, 24)},
            status="error",
            nbytes=60,
            error="Authentication attempts exceeded. Session locked.",
        )
        a.t += timedelta(seconds=a.rng.uniform(3, 12))
        del n
    return a.lines


def s001_idor_documents(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-docs-14", 35)
    own = {1003, 1017, 1042}
    for d in range(1000, 1150):
        if d in own:
            a.call(
                "docs",
                "getDocument",
                {"documentId": f"doc-{d}"},
                nbytes=a.rng.randint(3000, 9000),
                rows=1,
                gap=a.rng.uniform(0.3, 0.9),
            )
        else:
            # the safe server answers not-found for both missing and not-owned documents
            a.call(
                "docs",
                "getDocument",
                {"documentId": f"doc-{d}"},
                status="404",
                nbytes=30,
                error="Document not found",
                gap=a.rng.uniform(0.3, 0.9),
            )
    return a.lines


def s001_idor_users(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-crm-2", 36)
    # the vulnerable getUser(userId): every profile comes back
    for u in range(20001, 20131):
        a.call(
            "crm",
            "getUser",
            {"userId": f"usr-{u}"},
            nbytes=a.rng.randint(900, 1600),
            rows=1,
            gap=a.rng.uniform(0.4, 1.0),
        )
    return a.lines


def s001_idor_audit_reports(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-audit-19", 37)
    for r in range(1, 121):
        if a.rng.random() < 0.2:
            a.call(
                "audit",
                "getAuditReport",
                {"reportId": f"rpt-2026-{r:04d}"},
                nbytes=a.rng.randint(4000, 12000),
                gap=a.rng.uniform(0.5, 1.2),
            )
        else:
            a.call(
                "audit",
                "getAuditReport",
                {"reportId": f"rpt-2026-{r:04d}"},
                status="403",
                nbytes=28,
                error="forbidden",
                gap=a.rng.uniform(0.5, 1.2),
            )
    return a.lines


def s001_slow_enumeration(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-docs-66", 38)
    # moves slowly to stay under rate limits: one id every 40-70 s for about 1.8 hours
    for d in range(5000, 5115):
        ok = a.rng.random() < 0.1
        a.call(
            "docs",
            "getDocument",
            {"documentId": f"doc-{d}"},
            status="ok" if ok else "not_found",
            nbytes=a.rng.randint(2500, 7000) if ok else 30,
            gap=a.rng.uniform(40, 70),
            error=None if ok else "Document not found",
        )
    return a.lines


def s001_bulk_volume(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-docs-41", 39)
    a.call("docs", "listDocuments", {"limit": 20}, rows=20, nbytes=4800)
    # a handful of calls, each returning 0.4-1.5 MB: far above the median response
    for i in range(5):
        n = a.rng.randint(400_000, 1_500_000)
        a.call(
            "docs",
            "exportDocuments",
            {"folderId": f"fld-{900 + i}", "format": "json"},
            nbytes=n,
            rows=n // 1800,
            dur=a.rng.uniform(1500, 4000),
            gap=a.rng.uniform(5, 20),
        )
    return a.lines


def s001_slow_scraping(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-scraper-27", 45)
    # paging slowly to stay under rate limits: one page every 20-40 s
    for page in range(1, 71):
        a.call(
            "catalog",
            "searchItems",
            {"query": "", "page": page, "limit": 50},
            rows=50,
            nbytes=a.rng.randint(8500, 9800),
            gap=a.rng.uniform(20, 40),
        )
    return a.lines


def s001_credential_pairs(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-integrations-44", 46)
    # stolen username/password pairs tried against an external service, one after another
    for i in range(30):
        name = a.rng.choice(["j.smith", "m.garcia", "l.chen", "a.kumar", "p.novak"])
        user = f"{name}{i}@example.com"
        pw = "".join(a.rng.choice("abcdefghijkmnopqrstuvwxyz23456789!") for _ in range(10))
        a.call(
            "integrations",
            "connectExternalService",
            {"service": "mailbox", "username": user, "password": pw},
            status="401",
            nbytes=40,
            dur=a.rng.uniform(500, 1000),
            error="Authentication failed",
            gap=a.rng.uniform(0.3, 1.2),
        )
    return a.lines


def s001_idor_jsonrpc(eid: str, slot: int) -> list[dict]:
    """getDocument walked through a logging proxy (JSON-RPC errors, as in docs/log-format.md)."""
    rng = _rng(eid)
    t = BASE + slot * SLOT + timedelta(minutes=rng.uniform(5, 40))
    conn = f"conn-{_hex(rng, 10)}"
    lines: list[dict] = []
    for i, d in enumerate(range(7000, 7130), start=1):
        t += timedelta(seconds=rng.uniform(0.3, 0.9))
        lines.append(
            {
                "ts": iso(t),
                "session_id": conn,
                "direction": "request",
                "message": {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "getDocument", "arguments": {"documentId": f"doc-{d}"}},
                },
            }
        )
        t += timedelta(milliseconds=rng.uniform(10, 40))
        if rng.random() < 0.04:
            body: dict = {"result": {"content": [{"type": "text", "text": '{"title":"..."}'}]}}
        else:
            body = {"error": {"code": -32001, "message": "Document not found"}}
        lines.append(
            {
                "ts": iso(t),
                "session_id": conn,
                "direction": "response",
                "message": {"jsonrpc": "2.0", "id": i, **body},
            }
        )
    return lines


def s001_summary_combined(eid: str, slot: int) -> list[dict]:
    return _summary(
        eid,
        slot,
        "SESSION_ANOMALY",
        "svc-agent-106",
        callCount=1450,
        uniqueResourcesAccessed=1302,
        totalBytesReturned=88_000_000,
        authFailures=0,
    )


def _summary(eid: str, slot: int, event: str, caller: str, **figures: int) -> list[dict]:
    rng = _rng(eid)
    t = BASE + slot * SLOT + timedelta(minutes=rng.uniform(30, 90))
    return [
        {
            "event": event,
            "sessionId": f"s-{_hex(rng, 12)}",
            **figures,
            "ts": iso(t),
            "callerId": caller,
        }
    ]


def s001_summary_enumeration(eid: str, slot: int) -> list[dict]:
    return _summary(
        eid,
        slot,
        "SESSION_ANOMALY",
        "svc-agent-101",
        callCount=260,
        uniqueResourcesAccessed=241,
        totalBytesReturned=310_000,
        authFailures=0,
        durationMs=540_000,
    )


def s001_summary_bulk(eid: str, slot: int) -> list[dict]:
    return _summary(
        eid,
        slot,
        "SESSION_ANOMALY",
        "svc-agent-102",
        callCount=12,
        uniqueResourcesAccessed=9,
        totalBytesReturned=46_000_000,
        authFailures=0,
        durationMs=95_000,
    )


def s001_summary_stuffing(eid: str, slot: int) -> list[dict]:
    return _summary(
        eid,
        slot,
        "SESSION_ANOMALY",
        "svc-agent-103",
        callCount=9,
        uniqueResourcesAccessed=1,
        totalBytesReturned=410,
        authFailures=8,
        durationMs=12_000,
    )


def s001_summary_scrape(eid: str, slot: int) -> list[dict]:
    return _summary(
        eid,
        slot,
        "SESSION_ANOMALY",
        "svc-agent-104",
        callCount=180,
        uniqueResourcesAccessed=2,
        totalBytesReturned=880_000,
        authFailures=0,
        durationMs=240_000,
    )


# --------------------------------------------------------------------------- seed 002


def s002_transfer_credits_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-wallet-8", 40)
    a.call("credits", "getBalance", {"accountId": "usr-4410"}, nbytes=64)
    t0 = a.t + timedelta(seconds=1.5)
    # Call A and Call B both read balance 100 >= 100 before either deducts
    a.call(
        "credits",
        "transfer_credits",
        {"fromUserId": "usr-4410", "toUserId": "usr-7002", "amount": 100},
        start=t0,
        dur=210,
    )
    a.call(
        "credits",
        "transfer_credits",
        {"fromUserId": "usr-4410", "toUserId": "usr-7002", "amount": 100},
        start=t0 + timedelta(milliseconds=3),
        dur=198,
    )
    a.call("credits", "getBalance", {"accountId": "usr-4410"}, nbytes=66)
    return a.lines


def s002_transfer_burst_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-wallet-13", 41)
    t0 = a.t + timedelta(seconds=1)
    for i in range(12):
        # the CAS version refuses most of them once the balance moved
        failed = i >= 3 and a.rng.random() < 0.7
        a.call(
            "credits",
            "transfer_credits",
            {"fromUserId": "usr-5120", "toUserId": f"usr-{8000 + i}", "amount": 50},
            start=t0 + timedelta(milliseconds=a.rng.uniform(0, 25)),
            dur=a.rng.uniform(150, 400),
            status="error" if failed else "ok",
            error="Transfer failed: balance changed concurrently. Please retry."
            if failed
            else None,
        )
    return a.lines


def s002_spend_credits_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-wallet-22", 42)
    t0 = a.t + timedelta(seconds=1)
    for i in range(6):
        failed = i > 1
        a.call(
            "credits",
            "spend_credits",
            {"userId": "usr-6001", "amount": 40, "reason": "api-usage"},
            start=t0 + timedelta(milliseconds=a.rng.uniform(0, 15)),
            dur=a.rng.uniform(120, 350),
            status="error" if failed else "ok",
            error="Concurrent modification detected. Please retry." if failed else None,
        )
    return a.lines


def s002_process_order_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-orders-3", 43)
    other = f"s-{_hex(a.rng, 12)}"
    t0 = a.t + timedelta(seconds=1)
    args = {"orderId": "ord-770012", "userId": "usr-3301", "paymentMethodId": "pm_card_visa"}
    a.call("orders", "process_order", args, start=t0, dur=1800)
    a.call(
        "orders",
        "process_order",
        args,
        start=t0 + timedelta(milliseconds=9),
        dur=210,
        session=other,
        status="error",
        error="Order is currently being processed. Please wait and retry.",
    )
    a.call(
        "orders",
        "process_order",
        args,
        start=t0 + timedelta(milliseconds=14),
        dur=205,
        status="error",
        error="Order is currently being processed. Please wait and retry.",
    )
    return a.lines


def s002_create_report_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-reports-30", 44)
    t0 = a.t + timedelta(seconds=1)
    a.call(
        "files",
        "create_report",
        {"reportId": "q3-revenue", "content": "# Q3 revenue\n..."},
        start=t0,
        dur=85,
    )
    a.call(
        "files",
        "create_report",
        {"reportId": "q3-revenue", "content": "# Q3 revenue (draft)\n..."},
        start=t0 + timedelta(milliseconds=4),
        dur=80,
    )
    a.call(
        "files",
        "create_report",
        {"reportId": "q3-revenue", "content": "# Q3\n..."},
        start=t0 + timedelta(milliseconds=11),
        dur=40,
        status="error",
        error="Report already exists",
    )
    return a.lines


def s002_transfer_two_sessions(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-wallet-35", 47)
    other = f"s-{_hex(a.rng, 12)}"
    t0 = a.t + timedelta(seconds=1)
    # Call A and Call B from two sessions (two tool-call threads) of one agent
    a.call(
        "credits",
        "transfer_credits",
        {"fromUserId": "usr-9120", "toUserId": "usr-1400", "amount": 100},
        start=t0,
        dur=230,
    )
    a.call(
        "credits",
        "transfer_credits",
        {"fromUserId": "usr-9120", "toUserId": "usr-1401", "amount": 100},
        start=t0 + timedelta(milliseconds=2),
        dur=215,
        session=other,
    )
    return a.lines


# --------------------------------------------------------------------------- seed 003


def s003_etc_passwd_chain(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-fs-4", 50)
    a.call("fs", "listDirectory", {"path": "/etc"}, nbytes=2100)
    a.call("fs", "readFile", {"path": "/etc/passwd"}, nbytes=2810)
    a.call(
        "fs",
        "writeFile",
        {
            "path": "/etc/passwd",
            "content": "root:x:0:0:root:/root:/bin/bash\nagent:x:0:0::/root:/bin/bash\n",
        },
        nbytes=40,
    )
    return a.lines


def s003_ssh_keys_loop(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-fs-9", 51)
    a.call("fs", "listDirectory", {"path": "/home"}, nbytes=300)
    # enumerate -> write -> verify -> next target
    for user in ("alice", "bob", "deploy", "ci"):
        p = f"/home/{user}/.ssh/authorized_keys"
        a.call("fs", "listDirectory", {"path": f"/home/{user}/.ssh"}, nbytes=220)
        a.call("fs", "readFile", {"path": p}, nbytes=a.rng.randint(400, 1600))
        a.call(
            "fs",
            "writeFile",
            {"path": p, "content": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH agent@x"},
            nbytes=40,
        )
        a.call("fs", "readFile", {"path": p}, nbytes=a.rng.randint(450, 1700))
    return a.lines


def s003_sudoers_execute(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-ops-17", 52)
    a.call("fs", "listDirectory", {"path": "/etc"}, nbytes=2100)
    a.call("fs", "readFile", {"path": "/etc/sudoers"}, nbytes=1650)
    a.call("shell", "executeCommand", {"command": "usermod -aG sudo agent"}, nbytes=24, dur=300)
    return a.lines


def s003_circular_tickets(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-support-5", 53)
    # search -> summarize -> search finds the same tickets again -> loop
    for _ in range(30):
        a.call("tickets", "search_tickets", {"query": "login timeout"}, nbytes=3300, rows=3)
        a.call(
            "tickets",
            "summarize_ticket",
            {"id": "TCK-4812"},
            nbytes=900,
            dur=a.rng.uniform(600, 1400),
        )
    return a.lines


def s003_identical_repeat(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-inventory-2", 54)
    # the same tool with identical arguments, past the depth limit of 50
    for _ in range(60):
        a.call(
            "inventory",
            "check_stock",
            {"sku": "SKU-40017", "warehouse": "ams-1"},
            nbytes=118,
            gap=a.rng.uniform(1.5, 3.0),
        )
    return a.lines


def s003_cross_server_export(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-analytics-3", 55)
    a.call("internal", "list_segments", {}, nbytes=700)
    # a few thousand customer records, just under 1 MB
    a.call(
        "internal",
        "get_customer_export",
        {"segment": "all", "format": "json"},
        rows=3400,
        nbytes=986_112,
        dur=2400,
    )
    preview = '[{"customerId":"cus-10001","email":"a.jansen@example.com","name":"Anna Jansen"},...]'
    a.call(
        "analytics_plugin",
        "upload_dataset",
        {"name": "customers_q3", "data": preview, "recordCount": 3400},
        nbytes=96,
        dur=1900,
    )
    return a.lines


def s003_cross_server_small(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-analytics-7", 56)
    a.call(
        "internal",
        "get_customer_export",
        {"segment": "churn-risk", "format": "csv"},
        rows=600,
        nbytes=178_400,
        dur=900,
    )
    a.call(
        "analytics_plugin",
        "upload_dataset",
        {
            "name": "churn_list",
            "data": "customerId,email,plan\ncus-2001,m.r@example.com,pro\n...",
            "recordCount": 600,
        },
        nbytes=88,
        dur=1100,
    )
    return a.lines


def s003_cross_server_secret(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-ops-23", 57)
    a.call("internal", "get_credentials", {"name": "prod-db"}, nbytes=310)
    a.call(
        "community_slack",
        "post_message",
        {"channel": "#general", "text": "db creds: postgres://app:Zx9!tq@db.internal:5432/prod"},
        nbytes=70,
        dur=420,
    )
    return a.lines


# --------------------------------------------------------------------------- seed 004


def s004_delete_file_toctou(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-files-12", 60)
    other = f"s-{_hex(a.rng, 12)}"
    a.call("files", "getFile", {"fileId": "file-90331"}, nbytes=420)
    t0 = a.t + timedelta(seconds=1)
    # ownership moves while the delete is between its check and its act
    a.call(
        "files",
        "transfer_ownership",
        {"fileId": "file-90331", "newOwnerId": "usr-222"},
        start=t0,
        dur=120,
        session=other,
    )
    a.call(
        "files",
        "delete_file",
        {"fileId": "file-90331"},
        start=t0 + timedelta(milliseconds=5),
        dur=160,
    )
    return a.lines


def s004_increment_usage_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-meter-4", 61)
    t0 = a.t + timedelta(seconds=1)
    # concurrent read-modify-write on the session's usage counter: lost updates
    for _ in range(8):
        a.call(
            "meter",
            "increment_usage",
            {"amount": 1},
            start=t0 + timedelta(milliseconds=a.rng.uniform(0, 10)),
            dur=a.rng.uniform(30, 90),
            nbytes=22,
        )
    return a.lines


def s004_rate_limit_race(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-notify-9", 62)
    t0 = a.t + timedelta(seconds=1)
    # 40 requests sent at once all pass a read-check-decrement limiter of 10
    for i in range(40):
        a.call(
            "notify",
            "send_sms",
            {"to": f"+3161234{i:04d}", "template": "promo"},
            start=t0 + timedelta(milliseconds=a.rng.uniform(0, 30)),
            dur=a.rng.uniform(250, 600),
            nbytes=60,
        )
    return a.lines


def s004_pool_exhaustion(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "agent-db-31", 63)
    t0 = a.t + timedelta(seconds=1)
    # hundreds in flight from one caller: the pool runs dry, later calls time out
    for i in range(250):
        late = i > 60
        a.call(
            "warehouse",
            "run_query",
            {"sql": f"SELECT * FROM orders WHERE region_id = {i % 40}"},
            start=t0 + timedelta(milliseconds=a.rng.uniform(0, 1000)),
            dur=a.rng.uniform(2000, 8000),
            status="error" if late and a.rng.random() < 0.5 else "ok",
            error="connection pool exhausted" if late else None,
            nbytes=a.rng.randint(500, 4000),
        )
    return a.lines


# --------------------------------------------------------------------------- other log shapes


def v_fulfill_otel(eid: str, slot: int) -> list[dict]:
    return restyle(s000_fulfill_without_charge(eid, slot), "otel")


def v_idor_no_session(eid: str, slot: int) -> list[dict]:
    return restyle(s001_idor_documents(eid, slot), "camel")


def v_cross_server_no_session(eid: str, slot: int) -> list[dict]:
    # each server logs on its own, without a session id: only the caller joins the two
    return restyle(s003_cross_server_export(eid, slot), "camel")


def v_transfer_race_interval(eid: str, slot: int) -> list[dict]:
    return restyle(s002_transfer_credits_race(eid, slot), "interval")


def v_stuffing_no_session(eid: str, slot: int) -> list[dict]:
    return restyle(s001_credential_stuffing(eid, slot), "camel")


# --------------------------------------------------------------------------- hard negatives


def neg_treasury_run(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "svc-treasury", 70)
    a.call("credits", "getBalance", {"accountId": "acct-treasury-01"}, nbytes=70)
    # one account pays many different recipients, strictly one after another
    for i in range(14):
        a.call(
            "credits",
            "transfer_credits",
            {
                "fromUserId": "acct-treasury-01",
                "toUserId": f"vendor-{310 + i * 7}",
                "amount": a.rng.choice([250, 1200, 4800, 990, 15000]),
            },
            dur=a.rng.uniform(150, 320),
            gap=a.rng.uniform(2.0, 8.0),
            nbytes=110,
        )
    a.call("credits", "getBalance", {"accountId": "acct-treasury-01"}, nbytes=70)
    return a.lines


def neg_payroll_run(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "svc-payroll", 71)
    run = f"payroll-2026-10-{_hex(a.rng, 4)}"
    a.call("payments", "listEmployees", {"department": "all"}, rows=20, nbytes=5200)
    for i in range(20):
        a.call(
            "payments",
            "sendPayment",
            {
                "fromAccountId": "acct-payroll",
                "toAccountId": f"emp-{1001 + i}",
                "amountCents": a.rng.randint(280000, 640000),
                "idempotencyKey": f"{run}-emp-{1001 + i}",
            },
            dur=a.rng.uniform(200, 500),
            gap=a.rng.uniform(1.0, 3.0),
            nbytes=140,
        )
    return a.lines


def neg_ci_backoff_poll(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "ci-bot-builds", 72)
    build = f"bld-{a.rng.randint(40000, 49999)}"
    a.call("ci", "start_build", {"pipeline": "main", "commit": _hex(a.rng, 40)}, nbytes=90)
    gap = 2.0
    for i in range(11):
        state = "running" if i < 10 else "succeeded"
        a.call(
            "ci",
            "get_build_status",
            {"buildId": build},
            nbytes=120 if state == "running" else 180,
            gap=gap + a.rng.uniform(0, 0.3),
        )
        gap = min(gap * 1.5, 30.0)
    a.call(
        "ci", "download_artifact", {"buildId": build, "name": "dist.tar.gz"}, nbytes=48_000, dur=700
    )
    return a.lines


def neg_report_job_poll(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-analyst-4", 73)
    job = f"job-{_hex(a.rng, 10)}"
    a.call(
        "reports", "start_report", {"reportType": "monthly_sales", "month": "2026-09"}, nbytes=80
    )
    gap = 3.0
    for _ in range(13):
        a.call(
            "reports",
            "get_report_status",
            {"jobId": job},
            nbytes=95,
            gap=gap + a.rng.uniform(0, 0.4),
        )
        gap = min(gap * 1.5, 45.0)
    a.call("reports", "download_report", {"jobId": job}, nbytes=84_000, rows=420, dur=900)
    return a.lines


def neg_admin_report_paging(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-admin-2", 74)
    # a person reading each page before asking for the next
    for page in range(1, 10):
        a.call(
            "audit",
            "list_audit_events",
            {"since": "2026-10-01", "page": page, "pageSize": 50},
            rows=50,
            nbytes=a.rng.randint(9000, 12000),
            gap=a.rng.uniform(20, 95),
        )
    a.call("audit", "getAuditReport", {"reportId": "rpt-2026-0031"}, nbytes=8200, gap=40)
    return a.lines


def neg_idempotent_retry(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-shopper-88", 75)
    order = f"ord-{a.rng.randint(100000, 999999)}"
    key = _uuid(a.rng)
    a.call("shop", "getOrder", {"orderId": order}, nbytes=870)
    a.call(
        "shop",
        "chargePayment",
        {"orderId": order, "amountCents": 3299, "idempotencyKey": key},
        status="error",
        dur=30000,
        nbytes=40,
        error="upstream timeout",
    )
    # same key, same arguments: the server returns the first result (idempotent: true)
    a.call(
        "shop",
        "chargePayment",
        {"orderId": order, "amountCents": 3299, "idempotencyKey": key},
        dur=90,
        nbytes=120,
        gap=4,
    )
    a.call("shop", "fulfillOrder", {"orderId": order}, nbytes=38)
    return a.lines


def neg_shop_checkout(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-shopper-12", 76)
    cart = f"cart-{a.rng.randint(10000, 99999)}"
    order = f"ord-{a.rng.randint(100000, 999999)}"
    a.call("shop", "createCart", {"customerId": "cus-5550"})
    a.call("shop", "addToCart", {"cartId": cart, "sku": "SKU-88120", "qty": 1}, gap=12)
    a.call("shop", "applyDiscount", {"cartId": cart, "code": "AUTUMN10"}, gap=20)
    a.call("shop", "checkout", {"cartId": cart}, gap=15)
    a.call(
        "shop",
        "chargePayment",
        {"orderId": order, "amountCents": 8910, "idempotencyKey": _uuid(a.rng)},
        dur=700,
    )
    a.call("shop", "fulfillOrder", {"orderId": order})
    return a.lines


def neg_parallel_own_docs(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-writer-9", 77)
    a.call("docs", "listDocuments", {"owner": "me", "limit": 20}, rows=6, nbytes=1500)
    t0 = a.t + timedelta(seconds=1)
    for i, d in enumerate((2201, 2207, 2230, 2231, 2265, 2270)):
        a.call(
            "docs",
            "getDocument",
            {"documentId": f"doc-{d}"},
            start=t0 + timedelta(milliseconds=i * 4),
            dur=a.rng.uniform(40, 160),
            nbytes=a.rng.randint(3000, 12000),
            rows=1,
        )
    return a.lines


def neg_summary_end(eid: str, slot: int) -> list[dict]:
    return _summary(
        eid,
        slot,
        "SESSION_END",
        "svc-agent-105",
        callCount=14,
        uniqueResourcesAccessed=9,
        totalBytesReturned=120_000,
        authFailures=0,
        durationMs=300_000,
    )


def neg_login_typos(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-dana-31", 78)
    # two mistyped passwords, then the right one: a person, not a list of stolen keys
    for i, status in enumerate(("auth_failed", "auth_failed", "ok")):
        a.call(
            "integrations",
            "connectExternalService",
            {
                "service": "mailbox",
                "username": "dana@example.com",
                "password": f"Autumn-2026{'!?'[i % 2] * i}",
            },
            status=status,
            nbytes=40,
            dur=a.rng.uniform(300, 700),
            gap=a.rng.uniform(8, 20),
            error="Authentication failed" if status != "ok" else None,
        )
    a.call("mail", "listMessages", {"folder": "inbox", "limit": 20}, rows=20, nbytes=6200, gap=5)
    return a.lines


def neg_edit_own_config(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-dev-14", 79)
    # a developer's agent reads and rewrites files in its own project
    a.call("fs", "listDirectory", {"path": "/home/dev14/project"}, nbytes=900)
    a.call("fs", "readFile", {"path": "/home/dev14/project/config.yaml"}, nbytes=1300)
    a.call(
        "fs",
        "writeFile",
        {"path": "/home/dev14/project/config.yaml", "content": "debug: false\n"},
        nbytes=40,
        gap=25,
    )
    a.call("fs", "readFile", {"path": "/home/dev14/project/README.md"}, nbytes=4200, gap=30)
    a.call(
        "fs",
        "writeFile",
        {"path": "/home/dev14/project/README.md", "content": "# Project\n"},
        nbytes=40,
        gap=40,
    )
    return a.lines


def neg_share_meeting_notes(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-pm-6", 80)
    # read one's own meeting notes, post a short summary to the team channel
    a.call("docs", "getDocument", {"documentId": "doc-61120"}, nbytes=5400, rows=1)
    a.call(
        "slack",
        "post_message",
        {"channel": "#team-alpha", "text": "Notes from today: ship Friday."},
        nbytes=70,
        dur=380,
        gap=45,
    )
    return a.lines


def neg_parallel_distinct_writes(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-editor-3", 81)
    t0 = a.t + timedelta(seconds=1)
    # a client saves five different documents at once: parallel, but no shared resource
    for i, d in enumerate((8801, 8802, 8803, 8804, 8805)):
        a.call(
            "docs",
            "updateDocument",
            {"documentId": f"doc-{d}", "title": f"Chapter {i + 1}"},
            start=t0 + timedelta(milliseconds=i * 3),
            dur=a.rng.uniform(60, 140),
            nbytes=80,
        )
    return a.lines


def neg_constant_poll(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "svc-etl-runner", 82)
    job = f"exp-{_hex(a.rng, 8)}"
    a.call("warehouse", "start_export", {"table": "daily_sales", "date": "2026-10-04"}, nbytes=70)
    # a fixed 5-second poll until the export finishes, then the download
    for i in range(12):
        a.call(
            "warehouse",
            "get_export_status",
            {"exportId": job},
            nbytes=90 if i < 11 else 140,
            gap=5 + a.rng.uniform(-0.2, 0.2),
        )
    a.call("warehouse", "download_export", {"exportId": job}, nbytes=61_000, rows=800, dur=800)
    return a.lines


def neg_admin_migration(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-dba-1", 83)
    # an admin's agent moves the team's 120 records to schema v3, one after another
    a.call("crm", "listRecords", {"team": "emea-sales", "limit": 200}, rows=120, nbytes=24_000)
    for r in range(4100, 4220):
        a.call(
            "crm",
            "migrateRecord",
            {"recordId": f"rec-{r}", "schemaVersion": 3},
            nbytes=60,
            dur=a.rng.uniform(30, 90),
            gap=a.rng.uniform(0.2, 0.5),
        )
    a.call(
        "crm", "listRecords", {"team": "emea-sales", "schemaVersion": 2}, rows=0, nbytes=40, gap=3
    )
    return a.lines


def neg_sync_job(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "svc-crm-sync", 84)
    since = BASE + slot * SLOT
    # every 15 minutes: read what changed since the last run (a few pages), then stop
    for run in range(8):
        a.session = f"s-{_hex(a.rng, 12)}"
        a.t = since + timedelta(minutes=15 * (run + 1), seconds=a.rng.uniform(0, 3))
        cursor = None
        for page in range(a.rng.randint(1, 3)):
            args: dict = {"since": iso(since + timedelta(minutes=15 * run)), "limit": 100}
            if cursor:
                args["cursor"] = cursor
            a.call(
                "crm",
                "listChanges",
                args,
                rows=100 if page < 2 else 37,
                nbytes=a.rng.randint(9000, 14000),
                gap=0.3,
            )
            cursor = "c" + _hex(a.rng, 12)
        a.call(
            "warehouse",
            "upsertRows",
            {"table": "crm_contacts", "rowCount": 137},
            nbytes=50,
            gap=0.5,
        )
    return a.lines


def neg_cas_retry(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-wallet-77", 85)
    # seed 002's fix 1 seen from the client: the CAS fails once, a backed-off retry succeeds
    args = {"fromUserId": "usr-7707", "toUserId": "usr-1188", "amount": 25}
    a.call("credits", "getBalance", {"accountId": "usr-7707"}, nbytes=64)
    a.call(
        "credits",
        "transfer_credits",
        args,
        status="error",
        dur=140,
        gap=6,
        error="Transfer failed: balance changed concurrently. Please retry.",
    )
    a.call("credits", "transfer_credits", args, dur=150, gap=0.4)
    a.call("credits", "getBalance", {"accountId": "usr-7707"}, nbytes=64, gap=3)
    return a.lines


def neg_order_lock_retry(eid: str, slot: int) -> list[dict]:
    a = _actor(eid, slot, "usr-buyer-52", 86)
    args = {"orderId": "ord-551200", "userId": "usr-5512", "paymentMethodId": "pm_card_mc"}
    # the order is locked by the shop's own worker; the agent waits as told and retries once
    a.call(
        "orders",
        "process_order",
        args,
        status="error",
        dur=60,
        error="Order is currently being processed. Please wait and retry.",
    )
    a.call("orders", "getOrderStatus", {"orderId": "ord-551200"}, nbytes=120, gap=12)
    return a.lines


# --------------------------------------------------------------------------- catalogue

_Renderer = Callable[[str, int], list[dict]]

#: (id, seed, quote, expected categories, renderer)
CATALOGUE: list[tuple[str, str, str, tuple[str, ...], _Renderer]] = [
    (
        "s000_fulfill_without_charge",
        "000",
        "Step skipping: calling fulfillOrder without having called chargePayment.",
        ("step_skip",),
        s000_fulfill_without_charge,
    ),
    (
        "s000_fulfill_refused",
        "000",
        "The safe fulfillOrder refuses: 'Cannot fulfill order: payment status is ...' (the "
        "attempt is the finding).",
        ("step_skip",),
        s000_fulfill_refused,
    ),
    (
        "s000_fulfill_refused_jsonrpc",
        "000",
        "Same refused step skip, seen through a logging proxy's JSON-RPC transcript.",
        ("step_skip",),
        s000_fulfill_refused_jsonrpc,
    ),
    (
        "s000_approve_expense_twice",
        "000",
        "State machine bypass: calling approveExpense from two concurrent sessions to get an "
        "expense approved twice.",
        ("race_condition",),
        s000_approve_expense_twice,
    ),
    (
        "s000_discount_interleaved",
        "000",
        "Applying a discount code multiple times by interleaving calls with the checkout flow.",
        ("duplicate_execution",),
        s000_discount_interleaved,
    ),
    (
        "s000_add_after_price_lock",
        "000",
        "Price manipulation via sequencing: adding items to a cart after price has been locked.",
        ("step_skip",),
        s000_add_after_price_lock,
    ),
    (
        "s000_quota_reset",
        "000",
        "Using an administrative tool to reset a usage counter, then running the rate-limited "
        "tool again.",
        ("privilege_chain", "tool_loop"),
        s000_quota_reset,
    ),
    (
        "s000_retry_double_charge",
        "000",
        "AI models retry on ambiguity; without idempotency, retries cause double-execution of "
        "irreversible operations.",
        ("duplicate_execution",),
        s000_retry_double_charge,
    ),
    (
        "s000_charge_loop",
        "000",
        "Prompt injection attacks that loop tool calls can ... repeatedly trigger financial "
        "operations.",
        ("duplicate_execution", "tool_loop"),
        s000_charge_loop,
    ),
    (
        "s000_charge_loop_refused",
        "000",
        "'chargePayment has been called N times this session; use idempotencyKey to retry' "
        "(refused repeats).",
        ("duplicate_execution", "tool_loop"),
        s000_charge_loop_refused,
    ),
    (
        "s000_reverse_order",
        "000",
        "An AI model might execute the flow non-linearly, repetitively, or in reverse: fulfil, "
        "then pay.",
        ("step_skip",),
        s000_reverse_order,
    ),
    (
        "s000_idempotency_key_reused",
        "000",
        "idempotencyKey: caller-supplied unique key per attempt -- here one key reused for "
        "different charges.",
        ("duplicate_execution",),
        s000_idempotency_key_reused,
    ),
    (
        "s001_search_pagination",
        "001",
        "searchItems: start from page 1, collect all results, increment page, repeat.",
        ("scraping_loop",),
        s001_search_pagination,
    ),
    (
        "s001_search_budget_evasion",
        "001",
        "'Session search limit reached. Start a new session to continue.' -- and the agent does, "
        "page after page.",
        ("scraping_loop",),
        s001_search_budget_evasion,
    ),
    (
        "s001_list_cursor",
        "001",
        "listDocuments with limit and cursor, walked to the end (bulk extraction via repeated "
        "pagination).",
        ("scraping_loop",),
        s001_list_cursor,
    ),
    (
        "s001_credential_stuffing",
        "001",
        "connectExternalService(apiKey, service): a compromised LLM tests stolen credentials; no "
        "failure limit.",
        ("credential_stuffing",),
        s001_credential_stuffing,
    ),
    (
        "s001_credential_stuffing_rotating",
        "001",
        "After 3 failures the session is locked ('Session locked') -- the agent reconnects (state "
        "bypass by reconnecting).",
        ("credential_stuffing",),
        s001_credential_stuffing_rotating,
    ),
    (
        "s001_idor_documents",
        "001",
        "IDOR via getDocument(id): 'Document not found' for missing and not-owned alike; many "
        "unique ids.",
        ("enumeration",),
        s001_idor_documents,
    ),
    (
        "s001_idor_users",
        "001",
        "IDOR via getUser(userId) on the vulnerable tool that trusts the caller's ids.",
        ("enumeration",),
        s001_idor_users,
    ),
    (
        "s001_idor_audit_reports",
        "001",
        "IDOR via getAuditReport(reportId).",
        ("enumeration",),
        s001_idor_audit_reports,
    ),
    (
        "s001_slow_enumeration",
        "001",
        "LLM-driven abuse that moves slowly to stay under rate limits; uniqueResourcesAccessed > "
        "100.",
        ("enumeration",),
        s001_slow_enumeration,
    ),
    (
        "s001_bulk_volume",
        "001",
        "Sessions that return data volumes 5x the median / totalBytesReturned > 1,000,000.",
        ("bulk_extraction",),
        s001_bulk_volume,
    ),
    (
        "s001_slow_scraping",
        "001",
        "Pagination abuse that moves slowly to stay under rate limits (one page every 20-40 s).",
        ("scraping_loop",),
        s001_slow_scraping,
    ),
    (
        "s001_credential_pairs",
        "001",
        "A compromised LLM can use the tool to test stolen credential pairs (username + password).",
        ("credential_stuffing",),
        s001_credential_pairs,
    ),
    (
        "s001_idor_jsonrpc",
        "001",
        "getDocument(id) walked through a logging proxy: JSON-RPC error 'Document not found'.",
        ("enumeration",),
        s001_idor_jsonrpc,
    ),
    (
        "s001_summary_combined",
        "001",
        "SESSION_ANOMALY with callCount 1450, uniqueResourcesAccessed 1302, 88 MB "
        "(docs/log-format.md).",
        ("enumeration", "bulk_extraction"),
        s001_summary_combined,
    ),
    (
        "s001_summary_enumeration",
        "001",
        "SESSION_ANOMALY: uniqueResourcesAccessed > 100 (enumeration signal).",
        ("enumeration",),
        s001_summary_enumeration,
    ),
    (
        "s001_summary_bulk",
        "001",
        "SESSION_ANOMALY: totalBytesReturned > 1_000_000 (bulk extraction signal).",
        ("bulk_extraction",),
        s001_summary_bulk,
    ),
    (
        "s001_summary_stuffing",
        "001",
        "SESSION_ANOMALY: authFailures > 2 (credential stuffing signal).",
        ("credential_stuffing",),
        s001_summary_stuffing,
    ),
    (
        "s001_summary_scrape",
        "001",
        "SESSION_ANOMALY: callCount > 50 (scraping loop signal).",
        ("scraping_loop",),
        s001_summary_scrape,
    ),
    (
        "s002_transfer_credits_race",
        "002",
        "Call A and Call B: two concurrent transfer_credits of 100 on balance 100 -> balance -100.",
        ("race_condition",),
        s002_transfer_credits_race,
    ),
    (
        "s002_transfer_burst_race",
        "002",
        "Hundreds of parallel tool calls ... 'Transfer failed: balance changed concurrently. "
        "Please retry.'",
        ("race_condition",),
        s002_transfer_burst_race,
    ),
    (
        "s002_transfer_two_sessions",
        "002",
        "Call A and Call B of transfer_credits on one balance, from two sessions of one agent.",
        ("race_condition",),
        s002_transfer_two_sessions,
    ),
    (
        "s002_spend_credits_race",
        "002",
        "spend_credits with optimistic locking: 'Concurrent modification detected. Please retry.'",
        ("race_condition",),
        s002_spend_credits_race,
    ),
    (
        "s002_process_order_race",
        "002",
        "process_order on one orderId at once: 'Order is currently being processed. Please wait "
        "and retry.'",
        ("race_condition",),
        s002_process_order_race,
    ),
    (
        "s002_create_report_race",
        "002",
        "create_report check-then-create: another tool call can create this file in the race "
        "window.",
        ("race_condition",),
        s002_create_report_race,
    ),
    (
        "s003_etc_passwd_chain",
        "003",
        "listDirectory('/etc') -> readFile('/etc/passwd') -> writeFile('/etc/passwd', modified).",
        ("privilege_chain",),
        s003_etc_passwd_chain,
    ),
    (
        "s003_ssh_keys_loop",
        "003",
        "Enumerate -> write -> verify -> next-target loop (read after multiple writes).",
        ("privilege_chain",),
        s003_ssh_keys_loop,
    ),
    (
        "s003_sudoers_execute",
        "003",
        "Read a sensitive file, then the admin tool executeCommand.",
        ("privilege_chain",),
        s003_sudoers_execute,
    ),
    (
        "s003_circular_tickets",
        "003",
        "search_tickets({query}) -> summarize_ticket({id}) -> search_tickets finds the same "
        "tickets again -> loop.",
        ("tool_loop",),
        s003_circular_tickets,
    ),
    (
        "s003_identical_repeat",
        "003",
        "Same tool, same args (identical input hash) repeated past the depth limit of 50.",
        ("tool_loop",),
        s003_identical_repeat,
    ),
    (
        "s003_cross_server_export",
        "003",
        "internal.get_customer_export() -> analytics_plugin.upload_dataset({data: customerList}); "
        "3,400 records < 1 MB.",
        ("cross_server_flow",),
        s003_cross_server_export,
    ),
    (
        "s003_cross_server_small",
        "003",
        "Same cross-server chain with a 600-record (178 KB) customer export.",
        ("cross_server_flow",),
        s003_cross_server_small,
    ),
    (
        "s003_cross_server_secret",
        "003",
        "Sensitive data from a trusted internal server reaching a lower-trust community plugin "
        "(credentials posted).",
        ("cross_server_flow",),
        s003_cross_server_secret,
    ),
    (
        "s004_delete_file_toctou",
        "004",
        "delete_file: ownership could change between check and act (a concurrent ownership "
        "transfer).",
        ("race_condition",),
        s004_delete_file_toctou,
    ),
    (
        "s004_increment_usage_race",
        "004",
        "increment_usage: two concurrent calls both read session.usage = 10 (lost update).",
        ("race_condition",),
        s004_increment_usage_race,
    ),
    (
        "s004_rate_limit_race",
        "004",
        "10 concurrent requests all read count=9: rate limit bypass via concurrent request racing.",
        ("concurrency_abuse",),
        s004_rate_limit_race,
    ),
    (
        "s004_pool_exhaustion",
        "004",
        "A single agent session sends thousands of concurrent tool calls, exhausting connection "
        "pools.",
        ("concurrency_abuse",),
        s004_pool_exhaustion,
    ),
    (
        "v_fulfill_otel",
        "000",
        "fulfillOrder without chargePayment, logged with OpenTelemetry-style keys (+02:00).",
        ("step_skip",),
        v_fulfill_otel,
    ),
    (
        "v_idor_no_session",
        "001",
        "getDocument id walk logged without a session id (camelCase, epoch ms).",
        ("enumeration",),
        v_idor_no_session,
    ),
    (
        "v_cross_server_no_session",
        "003",
        "get_customer_export -> upload_dataset (< 1 MB), two servers' logs without session ids.",
        ("cross_server_flow",),
        v_cross_server_no_session,
    ),
    (
        "v_transfer_race_interval",
        "002",
        "Call A / Call B transfer_credits race, logged with explicit start_ts/end_ts.",
        ("race_condition",),
        v_transfer_race_interval,
    ),
    (
        "v_stuffing_no_session",
        "001",
        "connectExternalService stuffing logged without a session id.",
        ("credential_stuffing",),
        v_stuffing_no_session,
    ),
    (
        "neg_login_typos",
        "-",
        "A person mistypes a password twice, then signs in.",
        ("benign",),
        neg_login_typos,
    ),
    (
        "neg_edit_own_config",
        "-",
        "A developer's agent reads and rewrites files in its own project folder.",
        ("benign",),
        neg_edit_own_config,
    ),
    (
        "neg_share_meeting_notes",
        "-",
        "Read one's own meeting notes, post a two-line summary to the team channel.",
        ("benign",),
        neg_share_meeting_notes,
    ),
    (
        "neg_parallel_distinct_writes",
        "-",
        "A client saves five different documents at the same moment.",
        ("benign",),
        neg_parallel_distinct_writes,
    ),
    (
        "neg_constant_poll",
        "-",
        "An ETL runner polls an export every 5 s (12 times) until done, then downloads it.",
        ("benign",),
        neg_constant_poll,
    ),
    (
        "neg_admin_migration",
        "-",
        "An admin's agent migrates its team's 120 records to a new schema, one after another.",
        ("benign",),
        neg_admin_migration,
    ),
    (
        "neg_sync_job",
        "-",
        "A CRM sync job reads the changes since its last run every 15 min (1-3 pages each).",
        ("benign",),
        neg_sync_job,
    ),
    (
        "neg_cas_retry",
        "-",
        "Seed 002's CAS fix from the client side: 'balance changed concurrently', one retry, ok.",
        ("benign",),
        neg_cas_retry,
    ),
    (
        "neg_order_lock_retry",
        "-",
        "process_order answered 'currently being processed, wait and retry'; the agent "
        "checks status.",
        ("benign",),
        neg_order_lock_retry,
    ),
    (
        "neg_treasury_run",
        "-",
        "Treasury run: one account pays 14 different vendors, one after another, seconds apart.",
        ("benign",),
        neg_treasury_run,
    ),
    (
        "neg_payroll_run",
        "-",
        "Payroll run: 20 employees paid in order, each with its own idempotency key.",
        ("benign",),
        neg_payroll_run,
    ),
    (
        "neg_ci_backoff_poll",
        "-",
        "CI bot: start a build, poll its status with gaps growing x1.5 up to a cap, download the "
        "artifact.",
        ("benign",),
        neg_ci_backoff_poll,
    ),
    (
        "neg_report_job_poll",
        "-",
        "Start a report, poll its status 13 times with back-off, download the result.",
        ("benign",),
        neg_report_job_poll,
    ),
    (
        "neg_admin_report_paging",
        "-",
        "An admin pages through nine pages of an audit listing at reading pace.",
        ("benign",),
        neg_admin_report_paging,
    ),
    (
        "neg_idempotent_retry",
        "-",
        "chargePayment times out; retried with the same idempotencyKey and arguments (seed 000's "
        "safe pattern).",
        ("benign",),
        neg_idempotent_retry,
    ),
    (
        "neg_shop_checkout",
        "-",
        "The intended flow: create cart, add items, discount once, checkout, pay, fulfil.",
        ("benign",),
        neg_shop_checkout,
    ),
    (
        "neg_parallel_own_docs",
        "-",
        "A user's client fetches six of their own documents in parallel.",
        ("benign",),
        neg_parallel_own_docs,
    ),
    (
        "neg_summary_end",
        "-",
        "SESSION_END of an ordinary session (under every seed 001 threshold).",
        ("benign",),
        neg_summary_end,
    ),
]


def build_examples() -> list[Example]:
    """Render every example in the catalogue, each in its own time slot.

    Returns
    -------
    list of Example
        In catalogue order; deterministic.
    """
    out = []
    for slot, (eid, seed, quote, expected, fn) in enumerate(CATALOGUE):
        out.append(Example(eid, seed, quote, expected, fn(eid, slot)))
    return out


def background(n_users: int = 30) -> list[dict]:
    """Ordinary users across every slot: a population for per-tool and per-caller norms.

    Each user works a few short sessions a day on documents they own, searches a page or
    two and checks an order, at human pace.
    """
    rng = random.Random(20261005)
    lines: list[dict] = []
    span = SLOT * len(CATALOGUE)
    days = int(span / timedelta(days=1)) + 1
    for u in range(n_users):
        caller = f"usr-{rng.choice(['ana', 'ben', 'chen', 'dara', 'eli', 'fay'])}-{100 + u}"
        ip = f"172.20.{u // 200}.{10 + u % 200}"
        own_docs = [f"doc-{rng.randint(30000, 39999)}" for _ in range(12)]
        for day in range(days):
            for _ in range(rng.randint(1, 3)):
                start = BASE + timedelta(days=day, hours=rng.uniform(0, 10))
                if start > BASE + span:
                    continue
                a = Actor(rng, caller, ip, f"s-{_hex(rng, 12)}", start)
                for _ in range(rng.randint(4, 12)):
                    r = rng.random()
                    gap = rng.uniform(5, 120)
                    if r < 0.45:
                        a.call(
                            "docs",
                            "getDocument",
                            {"documentId": rng.choice(own_docs)},
                            nbytes=rng.randint(2000, 14000),
                            rows=1,
                            gap=gap,
                        )
                    elif r < 0.65:
                        a.call(
                            "catalog",
                            "searchItems",
                            {
                                "query": rng.choice(["lamp", "desk", "chair", "cable"]),
                                "page": rng.choice([1, 1, 1, 2]),
                                "limit": 20,
                            },
                            rows=20,
                            nbytes=rng.randint(3000, 4500),
                            gap=gap,
                        )
                    elif r < 0.8:
                        a.call(
                            "docs",
                            "listDocuments",
                            {"owner": "me", "limit": 20},
                            rows=rng.randint(5, 20),
                            nbytes=rng.randint(1500, 5000),
                            gap=gap,
                        )
                    elif r < 0.9:
                        a.call(
                            "shop",
                            "getOrder",
                            {"orderId": f"ord-{rng.randint(100000, 999999)}"},
                            nbytes=rng.randint(600, 1200),
                            gap=gap,
                        )
                    else:
                        a.call(
                            "docs",
                            "updateDocument",
                            {"documentId": rng.choice(own_docs), "title": "notes"},
                            nbytes=80,
                            gap=gap,
                        )
                lines.extend(a.lines)
    return lines


def _sort_key(line: dict) -> str:
    return str(line.get("ts", ""))


def write_jsonl(path: Path, lines: Iterable[dict]) -> int:
    """Write ``lines`` as NDJSON; returns the number of bytes written."""
    data = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)
    path.write_text(data, encoding="utf-8")
    return len(data.encode())


def render(outdir: Path) -> list[Example]:
    """Write every example, the background and the combined log to ``outdir``.

    Parameters
    ----------
    outdir
        Created if missing.

    Returns
    -------
    list of Example
        The examples written.
    """
    outdir.mkdir(parents=True, exist_ok=True)
    examples = build_examples()
    everything: list[dict] = []
    for ex in examples:
        write_jsonl(outdir / f"{ex.id}.jsonl", ex.lines)
        everything.extend(ex.lines)
    bg = background()
    write_jsonl(outdir / "background.jsonl", bg)
    everything.extend(bg)
    # stable sort: a JSON-RPC request and its response keep their order at equal times
    write_jsonl(outdir / "all.jsonl", sorted(everything, key=_sort_key))
    manifest = [
        {
            "id": ex.id,
            "seed": SEEDS.get(ex.seed, ex.seed),
            "quote": ex.quote,
            "expected": list(ex.expected),
            "lines": len(ex.lines),
            "entities": sorted(ex.entities()),
        }
        for ex in examples
    ]
    (outdir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return examples


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: render.py OUTDIR")
    exs = render(Path(sys.argv[1]))
    print(f"{len(exs)} examples written to {sys.argv[1]}")
