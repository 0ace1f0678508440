"""Bulk extraction judged by routine, by what a read returns, and by records (issue 26).

On traffic written independently of the detectors, a service account's nightly exports
and a data team's aggregate queries were flagged as bulk again and again, while a slow
drip of attachments and a one-call table dump were missed. Each case below has the
attack beside the hard negative, and the setting that turns the new rule off.
"""

from __future__ import annotations

from datetime import timedelta

import orjson
import polars as pl
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors


def _bulk(res: detectors.DetectResult, sid: str) -> pl.DataFrame:
    return res.alerts.filter((pl.col("session_id") == sid)
                             & (pl.col("category") == "bulk_extraction"))


def _run(tr: Traffic, **bulk: object) -> detectors.DetectResult:
    cfg = DetectorsConfig.from_dict({"bulk_extraction": bulk} if bulk else {})
    return detectors.detect(tr.events(), tr.summaries(), cfg, detectors=["bulk_rules"])


def _export(tr: Traffic, sid: str, start: timedelta, caller: str, mb: int) -> None:
    """An export run: four tables of ``mb`` MB each, a minute apart."""
    for k in range(4):
        tr.call(sid, T0 + start + timedelta(minutes=k), "export_table", caller=caller,
                ip="10.9.0.21", server="internal", args={"table": f"t{k}", "format": "parquet"},
                nbytes=mb * 1_000_000 + k * 7_000_000, rows=mb * 15_000)


def _routine_traffic() -> tuple[Traffic, list[str]]:
    tr = Traffic(seed=261)
    tr.background(days=2, users=30, per_day=2)
    sids = []
    # The service account: exports every night (two nights: too little history for the
    # three-day habit, enough for its routine with the tool), and small polling sessions.
    for night in range(2):
        for run in range(3):
            sid = f"nightly-{night}-{run}"
            _export(tr, sid, timedelta(days=night, hours=1 + run), "svc-export", 40 + 20 * run)
            sids.append(sid)
        for k in range(4):
            tr.normal_session(f"svc-poll-{night}-{k}", T0 + timedelta(days=night, hours=9 + k),
                              caller="svc-export", ip="10.9.0.21", calls=6)
    # A data team exporting a table now and then: the tool's own typical response is
    # megabytes, so a 60 MB table is not oversized for it.
    for k in range(24):
        tr.call(f"team-{k}", T0 + timedelta(days=k % 2, hours=10, minutes=5 * k),
                "export_table", caller=f"analyst-{k % 8}", server="internal",
                args={"table": "sandbox", "format": "csv"}, nbytes=8_000_000, rows=120_000)
    # A caller that never exports doing the same once.
    _export(tr, "newcomer", timedelta(days=1, hours=14), "mallory", 60)
    return tr, sids


def test_a_service_accounts_recurring_export_is_quiet_a_newcomers_is_not() -> None:
    tr, sids = _routine_traffic()
    res = _run(tr)
    assert not any(_bulk(res, sid).height for sid in sids)
    assert _bulk(res, "newcomer").height == 1
    # Without the routine with the tool, the exports are bulk (the habit needs 3 days).
    off = _run(tr, routine_z=0.0)
    assert any(_bulk(off, sid).height for sid in sids)


def _query_traffic(big_sql: str) -> Traffic:
    """A query tool whose large results are routine (analysts, dashboards, exports),
    and one session pulling 8 results of 2 MB with ``big_sql``."""
    tr = Traffic(seed=262)
    tr.background(days=2, users=30, per_day=2)
    for u in range(30):
        for d in range(2):
            sid = f"an-{u}-{d}"
            for k in range(4):
                big = (u + k) % 3 == 0
                tr.call(sid, T0 + timedelta(days=d, hours=10, minutes=u, seconds=20 * k),
                        "run_query", caller=f"analyst-{u}", server="internal",
                        args={"sql": f"SELECT region, sum(x) FROM mrr_{k} GROUP BY 1"},
                        nbytes=900_000 if big else 20_000, rows=15_000 if big else 300)
    for k in range(8):
        tr.call("pull", T0 + timedelta(days=1, hours=15, seconds=30 * k), "run_query",
                caller="someone", ip="10.0.0.99", server="internal",
                args={"sql": big_sql.format(k=k)}, nbytes=2_000_000, rows=9_000)
    return tr


def test_unnamed_reads_of_a_routinely_heavy_tool_do_not_add_up_named_records_do() -> None:
    tr = _query_traffic("SELECT week, count(*) FROM analytics.funnel_{k} GROUP BY 1")
    assert _bulk(_run(tr), "pull").height == 0
    # Were no tool's large responses routine, the same session would be bulk.
    assert _bulk(_run(tr, tool_heavy_share=1.01), "pull").height == 1
    loud = _run(_query_traffic("SELECT * FROM customers OFFSET {k}0000 LIMIT 10000"))
    assert _bulk(loud, "pull").height == 1


def _drip_traffic() -> Traffic:
    tr = Traffic(seed=263)
    tr.background(days=2, users=30, per_day=2)
    # Busy working sessions piling up megabytes over documents, queries and tickets: a
    # 3 MB session is no population outlier here (and these are not focused).
    tools = ["getDocument", "run_query", "getTicket", "searchDocuments"]
    for u in range(50):
        for k in range(40):
            tr.call(f"work-{u}", T0 + timedelta(days=u % 2, hours=9, minutes=u, seconds=9 * k),
                    tools[k % 4], caller=f"worker-{u}", server="docs-server",
                    args={"q": f"{u}-{k}"}, nbytes=60_000 + 3_000 * (u % 9))
    # Thirty attachments of ~100 kB from one tool over an hour: 3 MB in installments.
    for k in range(30):
        tr.call("drip", T0 + timedelta(days=1, hours=12, minutes=2 * k), "downloadAttachment",
                caller="mallory", ip="203.0.113.9", server="crm",
                resource_key="attachmentId", resource_id=f"att-{500 + 7 * k}",
                nbytes=90_000 + 1_000 * (k % 7))
    return tr


def test_a_slow_drip_of_attachments_is_bulk_in_installments() -> None:
    tr = _drip_traffic()
    hit = _bulk(_run(tr), "drip")
    assert hit.height == 1
    assert "installments" in " ".join(hit["reasons"][0])
    assert _bulk(_run(tr, drip_calls_lo=0), "drip").height == 0


def test_one_response_of_a_dumps_worth_of_records_is_bulk() -> None:
    tr = Traffic(seed=264)
    tr.background(days=2, users=30, per_day=2)
    tr.call("dump", T0 + timedelta(days=1, hours=12), "run_query", caller="mallory",
            ip="203.0.113.9", server="internal", args={"sql": "SELECT count(*) FROM shipments"},
            nbytes=120, rows=1)
    # A table no data_terms word names, so that only the records' count can catch it.
    tr.call("dump", T0 + timedelta(days=1, hours=12, seconds=30), "run_query",
            caller="mallory", ip="203.0.113.9", server="internal",
            args={"sql": "SELECT * FROM shipments"}, nbytes=18_000_000, rows=180_000)
    assert _bulk(_run(tr), "dump").height == 1
    assert _bulk(_run(tr, request_factor=0.0), "dump").height == 0


def _order_lookups(tr: Traffic, caller: str, missing_ids: bool) -> None:
    """Five sessions of a caller looking up five orders each over a day; beside them a
    stuck session retrying one missing order sixty times (``missing_ids`` False), or a
    sixth session probing 25 order ids that do not exist (True)."""
    for s in range(5):
        for k in range(5):
            tr.call(f"{caller}-{s}", T0 + timedelta(days=1, hours=8 + 2 * s, minutes=3 * k),
                    "getOrder", caller=caller, server="orders", resource_key="orderId",
                    resource_id=f"ord_{caller}{s}{k}x")
    for k in range(60 if not missing_ids else 25):
        rid = "ord_gone" if not missing_ids else f"ord_p{k * 37 % 101}q"
        tr.call(f"{caller}-x", T0 + timedelta(days=1, hours=9, seconds=2 * k), "getOrder",
                caller=caller, server="orders", resource_key="orderId", resource_id=rid,
                status="not_found", nbytes=80)


def test_a_window_counts_missed_ids_not_retries_of_one() -> None:
    """Enumeration's entity windows: one missing id retried sixty times is a loop, not
    sixty probes; twenty-five missing ids beside the same look-ups are probing."""
    from toolwatch.detectors import DetectorsConfig as Cfg

    for probing in (False, True):
        tr = Traffic(seed=265)
        tr.background(days=2, users=30, per_day=2)
        _order_lookups(tr, "agent-o", probing)
        res = detectors.detect(tr.events(), tr.summaries(), Cfg(),
                               detectors=["enumeration_rules"])
        hits = res.alerts.filter((pl.col("category") == "enumeration")
                                 & (pl.col("caller_id") == "agent-o"))
        assert (hits.height > 0) == probing, probing


def test_records_from_a_server_that_logs_no_sizes_are_volume() -> None:
    """Seed 001 counts data returned; a CRM that logs rows but no byte sizes still shows
    a caller pulling thousands of customer records in batches (issue 26: volume is bytes
    or records)."""
    tr = Traffic(seed=265)
    tr.background(days=2, users=30, per_day=2)
    # Support staff looking up one customer at a time on the same server: the records
    # a call typically returns.
    for k in range(40):
        for j in range(3):
            tr.call(f"support-{k}", T0 + timedelta(days=k % 2, hours=9 + k % 8, minutes=j),
                    "getCustomer", caller=f"user-{k % 30}", server="crm",
                    resource_key="customerId", resource_id=f"C-{k * 10 + j}",
                    nbytes=None, rows=1)
    for k in range(58):
        tr.call("batches", T0 + timedelta(days=1, hours=12, seconds=2 * k),
                "getCustomersBatch", caller="mallory", ip="203.0.113.9", server="crm",
                args={"ids": [f"C-{100 * k + j}" for j in range(0, 100, 33)], "count": 100},
                nbytes=None, rows=100)
    hit = _bulk(_run(tr), "batches")
    assert hit.height == 1
    # The oversized-records floor decides it: at twice the floor the batches stay under.
    assert _bulk(_run(tr, oversized_min_rows=12_000), "batches").height == 0


def test_a_summary_line_whose_calls_averaged_far_beyond_a_typical_call_is_bulk() -> None:
    """Known only from its server's summary (seed 001's logSessionSummary): 13.5 MB in 35
    calls is ~386 kB a call, two orders of magnitude beyond a typical call; a summary of
    35 ordinary calls is quiet."""
    tr = Traffic(seed=266)
    tr.background(days=2, users=30, per_day=2)
    at = T0 + timedelta(days=1, hours=12)
    tr.summary("big", at, kind="SESSION_ANOMALY", caller="agent-80d2", calls=35,
               unique_resources=25, total_bytes=13_500_000, duration_s=74.0)
    tr.summary("small", at, kind="SESSION_END", caller="carol", calls=35,
               unique_resources=25, total_bytes=70_000, duration_s=600.0)
    res = _run(tr)
    assert _bulk(res, "big").height == 1
    assert _bulk(res, "small").height == 0

    def oversized(r: detectors.DetectResult) -> float:
        ev = orjson.loads(_bulk(r, "big")["evidence"][0])
        return ev["pattern_scores"].get("p_oversized", 0.0)

    assert oversized(res) == 1.0  # 13.5 MB: ten times oversized_min_bytes
    assert oversized(_run(tr, tool_factor=0.0)) == 0.0


def test_a_sync_hosts_summaries_all_day_are_its_workload_a_far_heavier_one_is_not() -> None:
    """A search sync service known only from its summary lines moves 10-16 MB per run,
    all day, from one host under three service accounts: those totals are its workload
    (seed 001's 1 MB rule fires on every one). A run ten times its usual size, and a
    one-off summary of the same size from elsewhere, still alert."""
    tr = Traffic(seed=267)
    tr.background(days=2, users=30, per_day=2)
    at = T0 + timedelta(days=1, hours=2)
    sizes = [13_600_000, 10_700_000, 12_400_000, 15_900_000, 11_100_000, 14_200_000]
    for i, nbytes in enumerate(sizes):
        tr.summary(f"sync-{i}", at + timedelta(hours=2 * i), kind="SESSION_ANOMALY",
                   caller=f"svc-search-sync-{i % 3}", ip="10.20.0.30", calls=30 + 2 * i,
                   unique_resources=20, total_bytes=nbytes, duration_s=900.0)
    tr.summary("sync-huge", at + timedelta(hours=13), kind="SESSION_ANOMALY",
               caller="svc-search-sync-1", ip="10.20.0.30", calls=35,
               unique_resources=25, total_bytes=150_000_000, duration_s=900.0)
    tr.summary("one-off", at + timedelta(hours=5), kind="SESSION_ANOMALY",
               caller="agent-7c1", ip="203.0.113.9", calls=35, unique_resources=25,
               total_bytes=13_500_000, duration_s=74.0)
    res = _run(tr)
    assert _bulk(res, "one-off").height == 1
    huge = _bulk(res, "sync-huge")
    reasons = " ".join(huge["reasons"][0])
    assert "routine of its caller or address" in reasons and "no established" not in reasons
    off = detectors.detect(tr.events(), tr.summaries(),
                           DetectorsConfig.from_dict({"summary_routine_sessions": 0}),
                           detectors=["bulk_rules"])
    flagged = [f"sync-{i}" for i in range(len(sizes)) if _bulk(res, f"sync-{i}").height]
    assert flagged == []
    # Without the routine, every run alerts.
    assert all(_bulk(off, f"sync-{i}").height for i in range(len(sizes)))


def test_an_escalating_series_of_summaries_is_not_a_routine() -> None:
    """A caller's summaries grow run after run (57 kB, 210 kB, 9.1 MB, 312 MB) over a day
    and a half: enough sessions, spread over hours, and a typical one over 1 MB, but not
    alike. A routine repeats; the 312 MB run still alerts (summary_routine_spread)."""
    tr = Traffic(seed=268)
    tr.background(days=2, users=30, per_day=2)
    at = T0 + timedelta(days=1, hours=1)
    for k, (hours, calls, nbytes) in enumerate(
            [(0, 7, 57_000), (21, 914, 210_000), (21.5, 2_411, 9_100_000),
             (22.6, 800, 312_000_000)]):
        tr.summary(f"esc-{k}", at + timedelta(hours=hours), kind="SESSION_ANOMALY",
                   caller="u_47de91fc", ip="91.219.156.174", calls=calls,
                   unique_resources=20, total_bytes=nbytes, duration_s=1800.0)
    res = _run(tr)
    assert _bulk(res, "esc-3").height == 1
    loose = detectors.detect(tr.events(), tr.summaries(),
                             DetectorsConfig.from_dict({"summary_routine_spread": 10.0}),
                             detectors=["bulk_rules"])
    assert _bulk(loose, "esc-3").height == 0  # taken for a routine without the rule
