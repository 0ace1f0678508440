"""Synthetic concurrency scenarios for tests (bursts of parallel calls, races, and the
hard negatives each must not flag), written into a :class:`toolwatch.detectors.testing.Traffic`.

Calls are placed by their *start* here; :meth:`Traffic.call` takes the completion time
(``ts``, as access logs write it) plus ``duration_ms``, so each helper passes
``start + duration``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from toolwatch.detectors.testing import Traffic


def _call(tr: Traffic, sid: str, start: datetime, dur_ms: float, tool: str, **kw: object) -> None:
    tr.call(sid, start + timedelta(milliseconds=dur_ms), tool, duration_ms=dur_ms, **kw)  # type: ignore[arg-type]


def burst(tr: Traffic, sid: str, start: datetime, *, n: int = 40, caller: str = "burst",
          tool: str = "searchItems") -> None:
    """``n`` calls fired within half a second, each in flight 1–3 s (a limit-dodging burst)."""
    for k in range(n):
        at = start + timedelta(milliseconds=tr.rng.uniform(0, 500))
        _call(tr, sid, at, tr.rng.uniform(1000, 3000), tool, caller=caller,
              args={"query": f"q{k}", "page": 1})


def modest_parallel(tr: Traffic, sid: str, start: datetime, *, rounds: int = 6,
                    width: int = 4, caller: str = "agent") -> None:
    """An agent issuing ``width`` parallel tool calls per step, steps a few seconds apart."""
    t = start
    for r in range(rounds):
        for k in range(width):
            _call(tr, sid, t + timedelta(milliseconds=tr.rng.uniform(0, 30)),
                  tr.rng.uniform(200, 900), "getDocument", caller=caller,
                  resource_key="documentId", resource_id=f"doc-{100 + r * width + k}")
        t += timedelta(seconds=tr.rng.uniform(3, 8))


def batch_job(tr: Traffic, sid: str, start: datetime, *, width: int = 20, caller: str = "svc-batch",
              waves: int = 3) -> None:
    """A sync job that always runs ``width`` calls at once (its own normal)."""
    t = start
    for w in range(waves):
        for k in range(width):
            _call(tr, sid, t + timedelta(milliseconds=tr.rng.uniform(0, 50)),
                  tr.rng.uniform(800, 1500), "getDocument", caller=caller, ip="10.9.0.5",
                  resource_key="documentId", resource_id=f"doc-{w * width + k}")
        t += timedelta(seconds=5)


def race(tr: Traffic, sid: str, start: datetime, resource: str = "ord-77", *, n: int = 3,
         caller: str = "racer", tool: str = "applyCoupon", sessions: list[str] | None = None,
         status: str = "ok") -> None:
    """``n`` mutating calls on one business key sent within 20 ms, each 300–500 ms long."""
    for k in range(n):
        s = sessions[k % len(sessions)] if sessions else sid
        _call(tr, s, start + timedelta(milliseconds=tr.rng.uniform(0, 20)),
              tr.rng.uniform(300, 500), tool, caller=caller, status=status,
              args={"orderId": resource, "coupon": "WELCOME10"},
              resource_key="orderId", resource_id=resource)


def sequential_writes(tr: Traffic, sid: str, start: datetime, resource: str = "ord-88", *,
                      n: int = 4, caller: str = "careful") -> None:
    """Writes to one resource, each sent after the previous one's response."""
    t = start
    for _ in range(n):
        d = tr.rng.uniform(200, 400)
        _call(tr, sid, t, d, "updateOrder", caller=caller,
              args={"orderId": resource, "note": "x"}, resource_key="orderId",
              resource_id=resource)
        t += timedelta(milliseconds=d + tr.rng.uniform(5, 500))


def overlapping_reads(tr: Traffic, sid: str, start: datetime, resource: str = "ord-99", *,
                      n: int = 5, caller: str = "reader") -> None:
    """Parallel reads of one resource (harmless)."""
    for _ in range(n):
        _call(tr, sid, start + timedelta(milliseconds=tr.rng.uniform(0, 20)),
              tr.rng.uniform(300, 500), "getOrder", caller=caller,
              args={"orderId": resource}, resource_key="orderId", resource_id=resource)


def parallel_writes_distinct(tr: Traffic, sid: str, start: datetime, *, n: int = 5,
                             caller: str = "bulk-editor") -> None:
    """Parallel writes, each to a different resource (no shared check to race on)."""
    for k in range(n):
        r = f"ord-{500 + k}"
        _call(tr, sid, start + timedelta(milliseconds=tr.rng.uniform(0, 20)),
              tr.rng.uniform(300, 500), "updateOrder", caller=caller,
              args={"orderId": r, "note": "y"}, resource_key="orderId", resource_id=r)


def spread_burst(tr: Traffic, prefix: str, start: datetime, *, sessions: int = 10,
                 width: int = 3, caller: str = "swarm") -> list[str]:
    """One caller opening ``sessions`` sessions at once, each with ``width`` calls in flight:
    modest per session, ``sessions * width`` across the caller. Returns the session ids."""
    ids = [f"{prefix}-{k}" for k in range(sessions)]
    for k, sid in enumerate(ids):
        t = start + timedelta(milliseconds=tr.rng.uniform(0, 200))
        for j in range(width):
            _call(tr, sid, t + timedelta(milliseconds=tr.rng.uniform(0, 30)),
                  tr.rng.uniform(1500, 3000), "getDocument", caller=caller,
                  resource_key="documentId", resource_id=f"doc-{k * width + j}")
    return ids


def parallel_workers(tr: Traffic, prefix: str, start: datetime, *, nights: int = 4,
                     sessions: int = 6, width: int = 3, caller: str = "svc-indexer") -> None:
    """A service running ``sessions`` worker sessions at once every night, each with
    ``width`` calls in flight: its caller-wide parallelism is its own history."""
    for n in range(nights):
        spread_burst(tr, f"{prefix}-n{n}", start + timedelta(days=n), sessions=sessions,
                     width=width, caller=caller)
