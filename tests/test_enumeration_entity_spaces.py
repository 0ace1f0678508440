"""Entity (distributed) enumeration: one id space per walk, own objects are not lookups,
and the alert names the sessions that carry the walk's evidence (issue 26)."""

from __future__ import annotations

from datetime import timedelta

import orjson
import polars as pl
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors


def _run(tr: Traffic) -> detectors.DetectResult:
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig.from_dict({}))


def _enum_alerts(res: detectors.DetectResult, who: str) -> list[dict]:
    a = res.alerts.filter(
        (pl.col("category") == "enumeration")
        & ((pl.col("caller_id") == who) | (pl.col("entity_id") == who))
    )
    return a.to_dicts()


def _sessions(a: dict) -> set[str]:
    ev = orjson.loads(a["evidence"])
    return set(ev.get("session_ids") or []) | ({a["session_id"]} if a["session_id"] else set())


def _busy_day(tr: Traffic, who: str, ip: str) -> list[str]:
    """A shop worker's day: her own few documents re-read, carts checked out and the
    orders she created charged and fulfilled, charts and files opened. Many objects of
    many kinds; no walk."""
    t = T0 + timedelta(hours=8)
    order = 60_000
    sids = []
    for s in range(22):
        sid = f"{who}-day-{s}"
        sids.append(sid)
        for d in (0, 3, 5):
            tr.call(sid, t, "getDocument", caller=who, ip=ip, resource_key="documentId",
                    resource_id=f"doc-{27400 + (s * 7 + d) % 12}")
            t += timedelta(seconds=30)
        tr.call(sid, t, "addItem", caller=who, ip=ip, server="shop", resource_key="cartId",
                resource_id=f"cart-{9100 + s * 3}")
        t += timedelta(seconds=20)
        for _ in range(2):
            order += 1
            oid = f"ord-{order}"
            tr.call(sid, t, "checkout", caller=who, ip=ip, server="shop",
                    resource_key="orderId", resource_id=oid)
            tr.call(sid, t + timedelta(seconds=2), "chargePayment", caller=who, ip=ip,
                    server="shop", resource_key="orderId", resource_id=oid)
            tr.call(sid, t + timedelta(seconds=4), "fulfillOrder", caller=who, ip=ip,
                    server="shop", resource_key="orderId", resource_id=oid)
            t += timedelta(seconds=6)
        tr.call(sid, t + timedelta(seconds=30), "getChart", caller=who, ip=ip, server="bi",
                resource_key="chartId", resource_id=f"chart-{300 + s}")
        tr.call(sid, t + timedelta(seconds=50), "readFile", caller=who, ip=ip, server="files",
                resource_key="path", resource_id=f"/home/{who}/notes-{s}.md")
        t += timedelta(minutes=24)
    return sids


def test_own_orders_and_many_kinds_of_objects_are_not_a_walk() -> None:
    """Twenty-two sessions of one person, each touching a handful of objects of six kinds,
    her order ids consecutive (the shop numbers orders in sequence): no walk. The
    orders are her own (she checked them out and charged them in the same session); the
    documents are a dozen re-read all day."""
    tr = Traffic(seed=3)
    tr.background(days=2, users=30, per_day=2)
    _busy_day(tr, "erin", "10.9.9.9")
    hits = _enum_alerts(_run(tr), "erin")
    assert not hits, [(h["reasons"], h["entity_type"]) for h in hits]


def test_probing_sessions_beside_a_busy_day_name_only_the_probes() -> None:
    """Three short sessions probing random document ids (mostly not found) on the same day:
    the caller's window may alert on documentId, naming those three sessions only, never
    her everyday sessions nor another field."""
    tr = Traffic(seed=4)
    tr.background(days=2, users=30, per_day=2)
    ip = "10.9.9.10"
    day = _busy_day(tr, "fay", ip)
    t = T0 + timedelta(hours=11, minutes=3)
    probes = []
    rng = tr.rng
    for p in range(3):
        sid = f"fay-probe-{p}"
        probes.append(sid)
        for k in range(8):
            tr.call(sid, t, "getDocument", caller="fay", ip=ip, resource_key="documentId",
                    resource_id=f"doc-{rng.randrange(10_000, 99_999)}",
                    status="ok" if k % 4 == 0 else "not_found")
            t += timedelta(seconds=1)
        t += timedelta(minutes=3)
    res = _run(tr)
    ent = [a for a in _enum_alerts(res, "fay") if a["entity_type"] != "session"]
    assert ent, "the probes must still surface as a distributed walk"
    for a in ent:
        ev = orjson.loads(a["evidence"])
        assert ev["resource_key"] == "documentId", a["reasons"]
        assert " distinct documentId values in " in a["reasons"][0]
        assert set(ev["session_ids"]) == set(probes), ev["session_ids"]
        assert ev["n_sessions"] == len(probes)
    for a in _enum_alerts(res, "fay"):
        assert not (_sessions(a) & set(day)), a["reasons"]
