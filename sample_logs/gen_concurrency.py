"""Concurrency classes for the demo generator: bursts of parallel calls, check-then-act
races, and the hard negatives each must not flag.

Called once from :meth:`toolwatch.sample_logs.generate._Demo.build` (``add_concurrency(self)``); all
randomness comes from the demo's generator, so a seed still gives byte-identical files.
Calls are placed by their start (``Call.t``) with a duration; the renderer writes the
completion time (``ts = start + duration``, as access logs do), and the kb-server's
JSON-RPC transcript writes request and response times.

Attacks (``label``):

* ``concurrency_abuse`` — after a few ordinary calls, 20–45 calls fired within a second,
  each in flight 0.6–3 s (role ``concurrency_burst``; variants ``docs``, ``travel`` and
  ``jsonrpc`` on the kb-server's transcript).
  Variant ``multi_session``: one caller opening 4–5 sessions at once, each with only
  5–8 calls in flight (modest per session, 20–40 across the caller; each session
  labelled, plus the caller as an entity).
* ``race_condition`` — 2–5 ``applyCoupon`` / ``redeemVoucher`` / ``chargePayment`` calls
  on one booking sent within 30 ms (role ``race``, variant ``session``), or one call each
  from 2–3 sessions of the same caller opened at once (variant ``multi_session``, labelled
  as a caller entity).

Hard negatives (benign roles): ``parallel_agent`` (2–5 parallel calls per step),
``sequential_writer`` (writes to one booking, each after the previous response),
``parallel_reader`` (parallel reads of one booking), ``parallel_writes_distinct``
(parallel writes to different bookings), ``batch_sync`` (a service that runs ~20 calls at
once every night: its parallelism is its own history), ``parallel_workers`` (a service
whose 5–7 worker sessions each keep 2–4 calls in flight every night: its caller-wide
parallelism is its own history).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolwatch.sample_logs.generate import Session, _Demo

#: Attack labels added by this module.
LABELS = ("concurrency_abuse", "race_condition")
#: Benign roles added by this module.
ROLES = ("parallel_agent", "sequential_writer", "parallel_reader", "parallel_writes_distinct",
         "batch_sync", "parallel_workers")

_RACE_TOOLS = ("applyCoupon", "redeemVoucher", "chargePayment")


def _call(demo: _Demo, t: float, tool: str, args: dict[str, Any], resource: str | None,
          dur_ms: float, *, status: str = "ok", nbytes: int | None = None) -> Any:
    from toolwatch.sample_logs.generate import Call

    r = demo.rng
    return Call(t, tool, args, status, nbytes if nbytes is not None else r.randrange(300, 3000),
                1, max(1, int(dur_ms)), resource)


def _booking(demo: _Demo) -> tuple[str, dict[str, Any]]:
    b = demo.rng.randrange(100000, 999999)
    return f"bk-{b}", {"bookingId": f"bk-{b}"}


def _prefix(demo: _Demo, s: Session, server: str, t: float, n: int) -> float:
    """A few ordinary sequential calls (the session looks like any other at first)."""
    u = demo.pick_user()
    from toolwatch.sample_logs.generate import _CATALOG

    tools, w = _CATALOG[server]
    for _ in range(n):
        c = demo.call(server, demo.rng.choices(tools, w)[0], u, t)
        s.calls.append(c)
        t = demo.after(c, demo.gap_agent())
    return t


def burst(demo: _Demo, server: str, t: float, variant: str) -> Session:
    """Dozens of calls in flight at once (per-call limits dodged by parallelism)."""
    r = demo.rng
    u = demo.pick_user() if r.random() < 0.5 else None
    s = demo.session(server, u, "concurrency_abuse", "concurrency_burst", variant,
                     caller=None if u else "agent-" + demo.hex(6),
                     ip=None if u else demo.hosting_ip())
    t = _prefix(demo, s, server, t, r.randrange(1, 4))
    n = r.randrange(20, 46)
    spread = r.uniform(0.2, 1.0)
    for k in range(n):
        at = t + r.uniform(0, spread)
        if server == "travel-server":
            ref, args = _booking(demo)
            c = _call(demo, at, "getBooking", args, ref, r.uniform(600, 3000))
        elif r.random() < 0.5:
            q = r.choice(("pricing", "roadmap", "contract", "invoice", "policy", "q3"))
            c = _call(demo, at, "searchItems", {"query": f"{q} {k}", "page": 1, "page_size": 20},
                      None, r.uniform(600, 3000))
        else:
            d = r.randrange(1000, 9000)
            c = _call(demo, at, "getDocument", {"documentId": f"doc-{d}"}, f"doc-{d}",
                      r.uniform(600, 3000))
        s.calls.append(c)
    s.calls.sort(key=lambda c: c.t)
    return s


def _doc_fetches(demo: _Demo, s: Session, t: float, width: int, dur: tuple[float, float],
                 ) -> None:
    """``width`` document fetches sent together at ``t`` (each in flight ``dur`` ms)."""
    r = demo.rng
    for _ in range(width):
        d = r.randrange(1000, 9000)
        s.calls.append(_call(demo, t + r.uniform(0, 0.05), "getDocument",
                             {"documentId": f"doc-{d}"}, f"doc-{d}", r.uniform(*dur)))


def burst_spread(demo: _Demo, t: float) -> None:
    """One caller's parallelism spread over 4–5 sessions opened at once."""
    from toolwatch.sample_logs.generate import _iso_z

    r = demo.rng
    u = demo.pick_user() if r.random() < 0.5 else None
    caller = u.caller_id if u else "agent-" + demo.hex(6)
    ip = None if u else demo.hosting_ip()
    sessions = []
    for _ in range(r.randrange(4, 6)):
        s = demo.session("docs-server", u, "concurrency_abuse", "concurrency_burst",
                         "multi_session", caller=caller, ip=ip)
        _doc_fetches(demo, s, t + r.uniform(0, 0.5), r.randrange(5, 9), (1500, 4000))
        s.calls.sort(key=lambda c: c.t)
        demo.add(s)
        sessions.append(s)
    demo.entities.append(
        {
            "kind": "entity", "entity_type": "caller_id", "entity_id": caller,
            "label": "concurrency_abuse", "role": "concurrency_burst",
            "variant": "multi_session",
            "first_seen": _iso_z(min(x.first for x in sessions)),
            "last_seen": _iso_z(max(x.last for x in sessions)),
            "server": "docs-server", "n_sessions": len(sessions),
        }
    )


def race(demo: _Demo, t: float) -> Session:
    """2–5 mutating calls on one booking sent together (check-then-act)."""
    r = demo.rng
    u = demo.pick_user()
    s = demo.session("travel-server", u, "race_condition", "race", "session")
    t = _prefix(demo, s, "travel-server", t, r.randrange(1, 4))
    ref, args = _booking(demo)
    tool = r.choice(_RACE_TOOLS)
    extra = {"coupon": "WELCOME10"} if tool != "chargePayment" else {"amount": 120}
    for _ in range(r.randrange(2, 6)):
        s.calls.append(_call(demo, t + r.uniform(0, 0.03), tool, {**args, **extra}, ref,
                             r.uniform(150, 600)))
    s.calls.sort(key=lambda c: c.t)
    return s


def race_multi(demo: _Demo, t: float) -> None:
    """One mutating call from each of 2–3 sessions of one caller, opened at once."""
    from toolwatch.sample_logs.generate import _iso_z

    r = demo.rng
    u = demo.pick_user()
    ref, args = _booking(demo)
    tool = r.choice(_RACE_TOOLS)
    sessions = []
    for _ in range(r.randrange(2, 4)):
        s = demo.session("travel-server", u, "race_condition", "race", "multi_session")
        s.calls.append(_call(demo, t + r.uniform(0, 0.03), tool, {**args, "coupon": "VIP"}, ref,
                             r.uniform(200, 700)))
        demo.add(s)
        sessions.append(s)
    demo.entities.append(
        {
            "kind": "entity", "entity_type": "caller_id", "entity_id": u.caller_id,
            "label": "race_condition", "role": "race", "variant": "multi_session",
            "first_seen": _iso_z(min(x.first for x in sessions)),
            "last_seen": _iso_z(max(x.last for x in sessions)),
            "server": "travel-server", "n_sessions": len(sessions),
        }
    )


# ------------------------------------------------------------------ hard negatives
def parallel_agent(demo: _Demo, t: float) -> Session:
    """An agent making 2–5 parallel tool calls per reasoning step."""
    r = demo.rng
    u = demo.pick_user()
    s = demo.session("docs-server", u, role="parallel_agent")
    for _ in range(r.randrange(3, 8)):
        width = r.randrange(2, 6)
        for _k in range(width):
            d = r.choice(u.docs)
            s.calls.append(_call(demo, t + r.uniform(0, 0.05), "getDocument",
                                 {"documentId": f"doc-{d}"}, f"doc-{d}", r.uniform(40, 900)))
        t += r.uniform(2, 20)
    s.calls.sort(key=lambda c: c.t)
    return s


def sequential_writer(demo: _Demo, t: float) -> Session:
    """Writes to one booking, each sent after the previous response arrived."""
    r = demo.rng
    u = demo.pick_user()
    s = demo.session("travel-server", u, role="sequential_writer")
    ref, args = _booking(demo)
    for k in range(r.randrange(3, 8)):
        # Edits (each different), not the same irreversible action again.
        c = _call(demo, t, "updateBooking", {**args, "seat": f"{12 + k}{'ABCDEF'[k % 6]}"},
                  ref, r.uniform(100, 500))
        s.calls.append(c)
        t = demo.after(c, r.uniform(0.05, 5))
    return s


def parallel_reader(demo: _Demo, t: float) -> Session:
    """Parallel reads of one booking (itinerary, booking, price: harmless)."""
    r = demo.rng
    u = demo.pick_user()
    s = demo.session("travel-server", u, role="parallel_reader")
    ref, args = _booking(demo)
    for _ in range(r.randrange(3, 7)):
        s.calls.append(_call(demo, t + r.uniform(0, 0.03), r.choice(("getBooking",
                                                                     "getItinerary")),
                             dict(args), ref, r.uniform(40, 400)))
    s.calls.sort(key=lambda c: c.t)
    return s


def parallel_writes_distinct(demo: _Demo, t: float) -> Session:
    """Parallel writes, each to a different booking."""
    r = demo.rng
    u = demo.pick_user()
    s = demo.session("travel-server", u, role="parallel_writes_distinct")
    for _ in range(r.randrange(3, 7)):
        ref, args = _booking(demo)
        s.calls.append(_call(demo, t + r.uniform(0, 0.03), "updateBooking",
                             {**args, "note": "group"}, ref, r.uniform(100, 500)))
    s.calls.sort(key=lambda c: c.t)
    return s


def batch_sync(demo: _Demo, night: int) -> Session:
    """A nightly sync that always runs ~20 document fetches at once."""
    r = demo.rng
    s = demo.session("docs-server", None, role="batch_sync", caller="svc-docsync",
                     ip="10.40.3.9")
    t = demo.t0 + night * 86400.0 + 3.2 * 3600 + r.uniform(0, 300)
    width = r.randrange(18, 23)
    for _ in range(2):
        for _k in range(width):
            d = r.randrange(1000, 9000)
            s.calls.append(_call(demo, t + r.uniform(0, 0.08), "getDocument",
                                 {"documentId": f"doc-{d}"}, f"doc-{d}", r.uniform(500, 1500)))
        t += r.uniform(4, 8)
    s.calls.sort(key=lambda c: c.t)
    return s


def parallel_workers(demo: _Demo, night: int) -> list[Session]:
    """A nightly indexer: 5–7 worker sessions at once, each with 2–4 calls in flight."""
    r = demo.rng
    t = demo.t0 + night * 86400.0 + 2.5 * 3600 + r.uniform(0, 300)
    out = []
    for _ in range(r.randrange(5, 8)):
        s = demo.session("docs-server", None, role="parallel_workers", caller="svc-indexer",
                         ip="10.40.3.12")
        at = t + r.uniform(0, 2)
        for _wave in range(2):
            _doc_fetches(demo, s, at, r.randrange(2, 5), (800, 2500))
            at += r.uniform(3, 6)
        s.calls.sort(key=lambda c: c.t)
        out.append(s)
    return out


def add_concurrency(demo: _Demo) -> None:
    """Add both classes (≥ 3 examples of each variant) and their hard negatives."""
    from toolwatch.sample_logs.generate import DAYS

    r = demo.rng
    k = demo.n(3, 3)
    for _ in range(k):
        demo.add(burst(demo, "docs-server", demo.diurnal_start(), "docs"))
        demo.add(burst(demo, "travel-server", demo.diurnal_start(), "travel"))
        demo.add(burst(demo, "kb-server", demo.diurnal_start(), "jsonrpc"))
        demo.add(race(demo, demo.diurnal_start()))
        race_multi(demo, demo.diurnal_start())
        burst_spread(demo, demo.diurnal_start())
    for _ in range(demo.n(30)):
        demo.add(parallel_agent(demo, demo.diurnal_start()))
    for _ in range(demo.n(15)):
        demo.add(sequential_writer(demo, demo.diurnal_start()))
        demo.add(parallel_reader(demo, demo.diurnal_start()))
        demo.add(parallel_writes_distinct(demo, demo.diurnal_start()))
    for night in range(DAYS):
        demo.add(batch_sync(demo, night))
        for s in parallel_workers(demo, night):
            demo.add(s)
    r.random()  # keep later draws independent of how many variants ran
