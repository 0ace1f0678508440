"""Everyday business work that looks like an attack stays below medium; the attack beside it
does not (issue 26: hard negatives written independently of the detectors)."""

from __future__ import annotations

from datetime import timedelta

import orjson
import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

T = T0 + timedelta(hours=30)


def run(tr: Traffic, **cfg: object) -> detectors.DetectResult:
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig.from_dict(cfg))


def alerts_of(res: detectors.DetectResult, category: str, **match: str) -> list[dict]:
    a = res.alerts.filter(pl.col("category") == category)
    for k, v in match.items():
        a = a.filter(pl.col(k) == v)
    return a.to_dicts()


def base() -> Traffic:
    tr = Traffic(seed=3)
    tr.background(days=2, users=25, per_day=2)
    return tr


def config_change(tr: Traffic, sid: str, caller: str, ticket: bool) -> None:
    """Read nginx.conf, write it back, test and reload it — with or without a change id."""
    chg = {"changeTicket": "CHG-4711"} if ticket else {}
    t = T
    for tool, args in [
        ("readFile", {"path": "/etc/nginx/nginx.conf"}),
        ("writeFile", {"path": "/etc/nginx/nginx.conf", "content": "worker_connections 4096;",
                       **chg}),
        ("executeCommand", {"command": "nginx -t", **chg}),
        ("executeCommand", {"command": "systemctl reload nginx", **chg}),
    ]:
        tr.call(sid, t, tool, caller=caller, server="files", args=args)
        t += timedelta(seconds=20)


@pytest.mark.parametrize("ticket", [True, False])
def test_a_change_window_naming_its_ticket_is_quiet_and_without_it_high(ticket: bool) -> None:
    tr = base()
    config_change(tr, "chg", "sre-1", ticket)
    found = alerts_of(run(tr), "privilege_chain", session_id="chg")
    if ticket:
        assert not found, "an approved change window is quiet by default"
        kept = alerts_of(run(tr, privilege_chain={"approved_score": 0.55}),
                         "privilege_chain", session_id="chg")
        assert len(kept) == 1 and kept[0]["severity"] == "low"
        assert orjson.loads(kept[0]["evidence"])["approved_after"] == 3
    else:
        assert len(found) == 1
        assert found[0]["severity"] in ("high", "critical")


def test_an_approval_id_on_only_some_escalating_calls_does_not_lower_the_chain() -> None:
    tr = base()
    t = T
    for tool, args in [("readFile", {"path": "/etc/sudoers"}),
                       ("writeFile", {"path": "/etc/sudoers.d/90-agent", "changeTicket": "CHG-1"}),
                       ("executeCommand", {"command": "sudo -n id"})]:
        tr.call("esc", t, tool, caller="mallory", server="files", args=args)
        t += timedelta(seconds=5)
    found = alerts_of(run(tr), "privilege_chain", session_id="esc")
    assert found and found[0]["severity"] in ("high", "critical")
    assert alerts_of(run(tr, privilege_chain={"approval_args": []}), "privilege_chain",
                     session_id="esc")


def walk(tr: Traffic, sid: str, caller: str, write_back: bool, miss_every: int = 0) -> None:
    t = T
    for i in range(1000, 1300):
        missing = bool(miss_every) and i % miss_every == 0
        tr.call(sid, t, "getDocument", caller=caller, resource_key="documentId",
                resource_id=f"doc-{i}", nbytes=0 if missing else 3_000,
                status="not_found" if missing else "ok")
        t += timedelta(milliseconds=700)
        if write_back and not missing:
            tr.call(sid, t, "updateDocument", caller=caller, resource_key="documentId",
                    resource_id=f"doc-{i}", args={"schemaVersion": 3}, nbytes=200)
            t += timedelta(milliseconds=700)


def test_a_clean_migration_writing_back_every_document_is_quiet() -> None:
    """Read and write back every id, none refused or missing: maintenance, no alert;
    without the clean-walk rule it is the low alert of a write-back walk."""
    tr = base()
    walk(tr, "walk", "svc-migrate", True)
    assert not alerts_of(run(tr), "enumeration", session_id="walk")
    found = alerts_of(run(tr, enumeration={"rewrite_clean_miss": 0.0}), "enumeration",
                      session_id="walk")
    assert len(found) == 1 and found[0]["severity"] == "low"


@pytest.mark.parametrize("write_back", [True, False])
def test_a_migration_hitting_missing_ids_is_low_a_read_walk_is_not(
        write_back: bool) -> None:
    tr = base()
    # One id in ten missing: a write-back walk probing past what exists stays visible.
    walk(tr, "walk", "svc-migrate" if write_back else "prober", write_back, miss_every=10)
    found = alerts_of(run(tr), "enumeration", session_id="walk")
    assert len(found) == 1
    if write_back:
        assert found[0]["severity"] == "low"
        assert not alerts_of(run(tr, enumeration={"rewrite_share_lo": 0.0}), "enumeration",
                             session_id="walk", severity="low")
    else:
        assert found[0]["severity"] in ("high", "critical")


def test_an_upload_carries_its_own_sessions_reads_not_the_callers_other_work() -> None:
    tr = base()
    # The analyst's morning: 3 MB of queries in one session on the internal server...
    for k in range(30):
        tr.call("queries", T + timedelta(minutes=k), "run_query", caller="ana",
                server="internal", args={"sql": f"SELECT {k}"}, nbytes=100_000, rows=2_000)
    # ...then, in the agent host's session, public figures read and charted on a plugin.
    t = T + timedelta(minutes=40)
    tr.call("chart", t, "get_public_metrics", caller="ana", server="internal", nbytes=3_000,
            rows=40)
    tr.call("chart", t + timedelta(seconds=5), "upload_dataset", caller="ana",
            server="community-plugin", args={"datasetName": "weekly_kpis"})
    # An upload-only session (each server its own session id) after a big read elsewhere.
    for k in range(30):
        tr.call("dump", T + timedelta(minutes=k), "run_query", caller="insider",
                server="internal", args={"sql": f"SELECT * FROM t{k}"}, nbytes=100_000,
                rows=2_000)
    tr.call("up", T + timedelta(minutes=35), "upload_dataset", caller="insider",
            server="community-plugin", args={"datasetName": "crm_dump"})
    res = run(tr)
    assert not alerts_of(res, "cross_server_flow", caller_id="ana")
    assert alerts_of(res, "cross_server_flow", session_id="up")
    off = run(tr, cross_server_flow={"own_session_first": False})
    assert alerts_of(off, "cross_server_flow", session_id="chart")


def test_a_cross_session_race_names_every_session_it_spans() -> None:
    tr = base()
    t = T + timedelta(hours=2)
    for sid in ("tab-1", "tab-2"):
        tr.call(sid, t, "approveExpense", caller="nsilva", server="billing",
                resource_key="expenseId", resource_id="EXP-69332", duration_ms=250.0)
        t += timedelta(milliseconds=30)
    found = alerts_of(run(tr), "race_condition", entity_type="caller_id", entity_id="nsilva")
    assert len(found) == 1
    ev = orjson.loads(found[0]["evidence"])
    assert ev["session_ids"] == ["tab-1", "tab-2"]
    assert ev["session_ids_truncated"] is False


def test_a_summary_only_crawl_is_scraping_a_status_poll_is_not() -> None:
    tr = base()
    # Seed 001's signal, callCount > 50, on a session known only from its summary line.
    tr.summary("crawl", T, kind="SESSION_ANOMALY", caller="svc-agent-104", calls=180,
               unique_resources=2, total_bytes=880_000, duration_s=240)
    # A CI bot polling a build status: as many calls, a few hundred bytes each.
    tr.summary("poll", T, kind="SESSION_ANOMALY", caller="ci-buildkite", calls=160,
               unique_resources=2, total_bytes=160 * 400, duration_s=260)
    # The same crawl at a slow pace (70 calls in 20 minutes): seed 001's count is the
    # signal, not the rate.
    tr.summary("slow-crawl", T, kind="SESSION_ANOMALY", caller="agent-77", calls=70,
               unique_resources=4, total_bytes=70 * 3_000, duration_s=1200)
    res = run(tr)
    found = alerts_of(res, "scraping_loop", session_id="crawl")
    assert found and "summary" in found[0]["reasons"][0]
    assert alerts_of(res, "scraping_loop", session_id="slow-crawl")
    assert not res.alerts.filter(pl.col("session_id") == "poll").height



def test_summaries_a_caller_writes_all_day_are_its_routine_not_a_crawl() -> None:
    """A sync service known only from its summary lines (which the server marks
    SESSION_ANOMALY every run) makes a few hundred calls per run, all day: that count is
    its workload, whether one account runs it or one host under several accounts. A
    one-off session with the same count, a burst of such sessions in one sitting, and the
    service's own run far beyond its usual count still alert."""
    tr = base()
    calls = [250, 400, 310]
    for i, n in enumerate(calls):
        tr.summary(f"sync-{i}", T + timedelta(hours=4 * i), kind="SESSION_ANOMALY",
                   caller="svc-search-sync", ip="10.20.0.40", calls=n,
                   unique_resources=5 + 4 * i,
                   total_bytes=n * 12_000, duration_s=3600 + 600 * i)
    # One sync host running the job under a service account per tenant: two runs each.
    for i in range(6):
        tr.summary(f"tenant-{i}", T + timedelta(hours=2 * i), kind="SESSION_ANOMALY",
                   caller=f"svc-tenant-{i % 3}", ip="10.20.0.30", calls=calls[i % 3],
                   unique_resources=12, total_bytes=calls[i % 3] * 12_000, duration_s=4000)
    tr.summary("sync-huge", T + timedelta(hours=13), kind="SESSION_ANOMALY",
               caller="svc-search-sync", ip="10.20.0.40", calls=9_000, unique_resources=30,
               total_bytes=9_000 * 12_000, duration_s=5400)
    tr.summary("one-off", T + timedelta(hours=3), kind="SESSION_ANOMALY", caller="agent-5",
               ip="203.0.113.5", calls=300, unique_resources=20, total_bytes=300 * 12_000,
               duration_s=3600)
    for i in range(6):
        tr.summary(f"burst-{i}", T + timedelta(minutes=5 * i), kind="SESSION_ANOMALY",
                   caller="agent-burst", ip="198.51.100.7", calls=300, unique_resources=10,
                   total_bytes=300 * 12_000, duration_s=240)
    res = run(tr)
    for i in range(len(calls)):
        assert not alerts_of(res, "scraping_loop", session_id=f"sync-{i}"), i
    for i in range(6):
        assert not alerts_of(res, "scraping_loop", session_id=f"tenant-{i}"), i
    huge = alerts_of(res, "scraping_loop", session_id="sync-huge")
    assert huge and "routine, but not on this scale" in " ".join(huge[0]["reasons"])
    assert alerts_of(res, "scraping_loop", session_id="one-off")
    for i in range(6):
        assert alerts_of(res, "scraping_loop", session_id=f"burst-{i}"), i
    # Off: every run of the service alerts again.
    res = run(tr, summary_routine_sessions=0)
    assert all(alerts_of(res, "scraping_loop", session_id=f"sync-{i}")
               for i in range(len(calls)))
    assert all(alerts_of(res, "scraping_loop", session_id=f"tenant-{i}") for i in range(6))

def test_a_refused_retry_after_success_is_an_attempt_a_retry_of_a_failure_is_not() -> None:
    tr = base()
    t = T
    charge = {"orderId": "ord-7", "amountCents": 2500}
    tr.call("replay", t, "chargePayment", caller="agent-9", server="billing", args=charge)
    for k in range(3):   # the per-session limit refuses the rest
        tr.call("replay", t + timedelta(seconds=5 * (k + 1)), "chargePayment",
                caller="agent-9", server="billing", args=charge, status="error")
    # A client retrying an upstream timeout under its idempotency key, then succeeding.
    keyed = {"orderId": "ord-8", "amountCents": 900, "idempotencyKey": "k-1"}
    tr.call("retry", t, "chargePayment", caller="cust-8", server="billing", args=keyed,
            status="error", duration_ms=30_000)
    tr.call("retry", t + timedelta(seconds=40), "chargePayment", caller="cust-8",
            server="billing", args=keyed)
    res = run(tr)
    found = alerts_of(res, "duplicate_execution", session_id="replay")
    assert found and found[0]["severity"] == "low"
    assert orjson.loads(found[0]["evidence"])["refused_retries_after_success"] == 3
    assert not alerts_of(res, "duplicate_execution", session_id="retry")
    off = run(tr, duplicate_execution={"attempts_lo": 0})
    assert not alerts_of(off, "duplicate_execution", session_id="replay")


def test_lifting_a_limit_the_session_was_refused_by_is_a_privilege_chain() -> None:
    tr = base()
    t = T
    for cycle in range(2):
        for k in range(4):
            tr.call("quota", t, "generateReport", caller="agent-12", server="reports")
            t += timedelta(seconds=2)
        tr.call("quota", t, "generateReport", caller="agent-12", server="reports",
                status="rate_limited")
        t += timedelta(seconds=2)
        tr.call("quota", t, "resetUsageCounter", caller="agent-12", server="admin",
                args={"counter": "generateReport"})
        t += timedelta(seconds=2)
    # An admin raising a customer's quota it was never refused by is routine.
    tr.call("ops", t, "raiseQuota", caller="ops-admin", server="admin",
            args={"customerId": "cus-1", "quota": 500})
    res = run(tr)
    found = alerts_of(res, "privilege_chain", session_id="quota")
    assert found and found[0]["severity"] == "high"
    assert found[0]["reasons"][0].startswith("After being refused for a rate limit")
    assert orjson.loads(found[0]["evidence"])["limit_resets"] == 2
    assert not alerts_of(res, "privilege_chain", session_id="ops")


@pytest.mark.parametrize("late", ["addItem", "fulfillOrder"])
def test_changing_a_locked_cart_or_sending_a_refunded_order_is_a_step_skip(late: str) -> None:
    tr = base()
    t = T
    key = {"addItem": ("cartId", "cart-1"), "fulfillOrder": ("orderId", "ord-1")}[late]
    first = {"addItem": "lockPrice", "fulfillOrder": "refundPayment"}[late]
    # The same steps in the everyday order: add, then lock; charge, fulfil, then refund.
    ok_flow = {"addItem": ["addItem", "lockPrice"],
               "fulfillOrder": ["chargePayment", "fulfillOrder", "refundPayment"]}[late]
    for tool in ok_flow:
        tr.call("shopper", t, tool, caller="cust-1", server="shop", resource_key=key[0],
                resource_id=key[1] + "-ok")
        t += timedelta(seconds=3)
    for tool in (["chargePayment"] if late == "fulfillOrder" else []) + [first, late]:
        tr.call("late", t, tool, caller="cust-2", server="shop", resource_key=key[0],
                resource_id=key[1])
        t += timedelta(seconds=3)
    res = run(tr)
    found = alerts_of(res, "step_skip", session_id="late")
    assert found and found[0]["severity"] in ("high", "critical")
    assert f"after {first[:-5] if first == 'lockPrice' else 'refund'}" in found[0]["reasons"][0]
    assert not alerts_of(res, "step_skip", session_id="shopper")


def test_lockouts_rotated_over_fresh_sessions_raise_the_address() -> None:
    tr = base()
    t = T
    # Seed 001: the server locks a session after 3 failures; the agent opens a new one
    # under a new client name each time, from one address.
    for n in range(12):
        for k in range(3):
            tr.call(f"rot-{n}", t, "connectExternalService", caller=f"mcp#{n:04x}",
                    ip="198.51.100.23", server="integrations", status="auth_failed",
                    cred=f"sk_live_{n}_{k}", nbytes=40)
            t += timedelta(seconds=1)
        t += timedelta(seconds=5)
    # An office address where a few people mistype once, then get in.
    for n in range(6):
        tr.call(f"office-{n}", t, "connectExternalService", caller=f"emp-{n}",
                ip="203.0.113.5", server="integrations", status="auth_failed",
                cred=f"typo-{n}", nbytes=40)
        tr.call(f"office-{n}", t + timedelta(seconds=20), "connectExternalService",
                caller=f"emp-{n}", ip="203.0.113.5", server="integrations", cred=f"good-{n}")
        t += timedelta(minutes=3)
    res = run(tr)
    found = alerts_of(res, "credential_stuffing", entity_type="client_ip",
                      entity_id="198.51.100.23")
    assert found and found[0]["severity"] in ("high", "critical")
    assert not alerts_of(res, "credential_stuffing", client_ip="203.0.113.5")


def test_a_summary_only_session_that_never_got_in_is_a_stuffing_attempt() -> None:
    """Seed 001's summary line alone: authFailures > 2 and no resource reached is the
    attempt; a client whose key failed once and then read its resources is not."""
    tr = base()
    tr.summary("stuff", T, kind="SESSION_ANOMALY", caller="agent-x", calls=9,
               unique_resources=0, total_bytes=800, auth_failures=5, duration_s=17)
    tr.summary("typo", T, caller="svc-1", calls=10, unique_resources=4,
               total_bytes=20_000, auth_failures=1, duration_s=30)
    tr.summary("got-in", T, caller="svc-2", calls=12, unique_resources=6,
               total_bytes=30_000, auth_failures=4, duration_s=30)
    res = run(tr)
    found = alerts_of(res, "credential_stuffing", session_id="stuff")
    assert len(found) == 1 and found[0]["severity"] == "low"
    assert not alerts_of(res, "credential_stuffing", session_id="typo")
    assert not alerts_of(res, "credential_stuffing", session_id="got-in")
    assert not alerts_of(run(tr, credential_stuffing={"attempt_creds": 0}),
                         "credential_stuffing", session_id="stuff")


def test_a_cycle_in_order_is_a_loop_a_few_queries_in_no_order_are_not() -> None:
    """Issue 26: an analyst re-running three saved queries, picked in no fixed order, a
    dozen times; beside it an agent going search → summarize → search → summarize over
    two tickets, round and round (seed 003's circular chain)."""
    import random

    tr = base()
    rng = random.Random(7)
    queries = [f"SELECT region, sum(amount) FROM {t} GROUP BY 1"
               for t in ("orders", "mrr", "usage")]
    order = [*queries, *[rng.choice(queries) for _ in range(14)]]
    assert any(order[i] == order[i + 1] for i in range(len(order) - 1))  # not a cycle
    for k, q in enumerate(order):
        tr.call("analyst", T + timedelta(seconds=10 * k), "run_query", caller="dlopez",
                server="internal", args={"sql": q}, rows=rng.randint(10, 5000))
    t = T
    for k in range(20):
        tr.call("circle", t, "search_tickets", caller="agent-5", server="tickets",
                args={"query": "printer offline"})
        tr.call("circle", t + timedelta(seconds=1), "summarize_ticket", caller="agent-5",
                server="tickets", args={"id": ("T-1", "T-2")[k % 2]})
        t += timedelta(seconds=2)
    res = run(tr)
    assert alerts_of(res, "tool_loop", session_id="circle")
    assert not alerts_of(res, "tool_loop", session_id="analyst")
    # With the order requirement off, the analyst's repeats are a loop again.
    assert alerts_of(run(tr, tool_loop={"periodic_lo": 0.0}), "tool_loop", session_id="analyst")
