"""Bulk extraction judges a read by what it returns and counts attempts (issue 26).

On traffic written independently of the detectors:

* a log follower — ``readFile`` of one log at growing byte offsets, ``length`` 64 kB,
  each read returning the few kB written since the last one, every 20-60 s — was a
  "pagination sweep", per session and, summed over a busy person's day, per caller. A
  sweep walks a listing whose pages come back full until the last one; a follower's
  every page comes back short: it is reading the end of what there is.
* two to five exports of 0.4-1.5 MB of customer records (``get_customer_export``), or a
  megabyte of customer listings in a few calls of 1,000, were missed: their tool's own
  baseline is the exports themselves. Seed 001 alerts on a session returning more than
  1 MB; a read of named records is sensitive by what it returns.
* exports refused by the server, asked again and again, were not reported: attempts count.

Each case has its look-alike beside it.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

DAY = T0 + timedelta(days=2, hours=9)


def _bulk(res: detectors.DetectResult, sid: str) -> pl.DataFrame:
    return res.alerts.filter((pl.col("session_id") == sid)
                             & (pl.col("category") == "bulk_extraction"))


def _caller_bulk(res: detectors.DetectResult, caller: str) -> pl.DataFrame:
    return res.alerts.filter((pl.col("caller_id") == caller)
                             & (pl.col("category") == "bulk_extraction"))


def _traffic() -> Traffic:
    tr = Traffic(seed=261)
    tr.background(days=3, users=30, per_day=2)
    # The follower: four sessions of an hour each, 110 reads of a growing log at the
    # offset where the last read ended, 64 kB asked for, 4-18 kB returned.
    offset = 5_000_000
    for s in range(4):
        t = DAY + timedelta(hours=2 * s)
        for k in range(110):
            got = 4_000 + (k * 7_919) % 14_000
            tr.call(f"tail-{s}", t, "readFile", caller="ops", ip="10.0.0.8", server="files",
                    args={"path": "/var/log/app/worker.log", "offset": offset,
                          "length": 65_536}, nbytes=got)
            offset += got
            t += timedelta(seconds=20 + (k * 13) % 40)
    # The sweep: the same file read from its start in full 64 kB chunks.
    t = DAY + timedelta(hours=1)
    for k in range(60):
        tr.call("sweep", t, "readFile", caller="mallory", ip="203.0.113.9", server="files",
                args={"path": "/var/log/app/worker.log", "offset": k * 65_536,
                      "length": 65_536}, nbytes=65_536)
        t += timedelta(seconds=2)
    # The export tool's own population: 25 single exports of one segment, 400 kB each
    # (its typical response: an export is never "oversized" for its own tool).
    for k in range(25):
        tr.call(f"seg-{k}", DAY + timedelta(hours=k % 9, minutes=7 * k), "get_customer_export",
                caller=f"user-{k}", ip=f"10.9.0.{k}", server="crm",
                args={"segment": f"s{k}", "format": "json"}, nbytes=400_000, rows=1_300)
    # Exports of customer records: three of 0.5 MB in one session.
    for k, seg in enumerate(["emea", "apac", "na"]):
        tr.call("export", DAY + timedelta(minutes=k), "get_customer_export", caller="eve",
                ip="203.0.113.10", server="crm", args={"segment": seg, "format": "json"},
                nbytes=500_000, rows=1_600)
    # One customer report downloaded once (1.2 MB of records) next to a listing: the
    # person who downloads one big report.
    tr.call("oneshot", DAY + timedelta(hours=6), "listReports", caller="olga", ip="10.0.0.11",
            server="crm", args={"folder": "sales"}, nbytes=4_000, rows=9)
    tr.call("oneshot", DAY + timedelta(hours=6, seconds=20), "get_customer_export",
            caller="olga", ip="10.0.0.11", server="crm",
            args={"segment": "emea", "format": "csv"}, nbytes=1_200_000, rows=5_600)
    # The support agent: 300 customer look-ups of 4 kB over a day (1.2 MB in all).
    for k in range(300):
        tr.call("support", DAY + timedelta(minutes=2 * k), "getCustomer", caller="sam",
                ip="10.0.0.9", server="crm", resource_key="customerId",
                resource_id=f"c-{k}", nbytes=4_000, rows=1)
    # Refused exports: asked three times, denied each time.
    for k, seg in enumerate(["emea", "apac", "na"]):
        tr.call("refused", DAY + timedelta(hours=3, seconds=10 * k), "get_customer_export",
                caller="trudy", ip="203.0.113.11", server="crm",
                args={"segment": seg, "format": "json"}, status="denied", nbytes=50)
    # One refusal: a permission mistake, not an attempt.
    tr.call("mistake", DAY + timedelta(hours=4), "get_customer_export", caller="pat",
            ip="10.0.0.10", server="crm", args={"segment": "emea", "format": "json"},
            status="denied", nbytes=50)
    # A query tool whose large responses are routine: analysts' results of 100 kB, a few
    # of 1.5 MB. A data team's two reads of 900 kB of orders (8x its typical result) are
    # that tool's everyday work, judged against what it returns (oversized), not as named
    # reads of records whatever the tool.
    for k in range(40):
        t = DAY + timedelta(hours=k % 8, minutes=k)
        for j in range(3):
            tr.call(f"an-{k}", t + timedelta(seconds=30 * j), "run_query",
                    caller=f"analyst-{k % 10}", ip=f"10.1.0.{k % 10}", server="warehouse",
                    args={"sql": f"SELECT region, count(*) FROM analytics.usage_{j} GROUP BY 1"},
                    nbytes=1_500_000 if (k % 13 == 0 and j == 0) else 100_000, rows=500)
    for j in range(2):
        tr.call("datateam", DAY + timedelta(hours=5, seconds=40 * j), "run_query",
                caller="dana", ip="10.1.0.50", server="warehouse",
                args={"sql": f"SELECT * FROM orders WHERE day = '2024-01-0{j + 1}'"},
                nbytes=900_000, rows=4_000)
    # Two report exports as PDF, 1.3 MB in all: documents, not whose records an export or
    # dump names (the word "export" says how much, not what). The report tool's own
    # population exports one report of 300-900 kB now and then.
    for k in range(20):
        tr.call(f"rep-{k}", DAY + timedelta(hours=k % 8, minutes=11 * k), "exportReport",
                caller=f"user-{k}", ip=f"10.9.1.{k}", server="docs",
                args={"reportId": f"rpt-{k}", "format": "pdf"},
                nbytes=300_000 + 30_000 * k, rows=2_000 + 150 * k)
    for j, (rid, size) in enumerate([("rpt-566", 420_000), ("rpt-212", 920_000)]):
        tr.call("reports", DAY + timedelta(hours=7, seconds=30 * j), "exportReport",
                caller="ravi", ip="10.0.0.12", server="docs",
                args={"reportId": rid, "format": "pdf"}, nbytes=size, rows=size // 160)
    # The same volume as two exports of customer records: named reads, asked again.
    for j, (seg, size) in enumerate([("churned", 900_000), ("latam", 560_000)]):
        tr.call("two-segments", DAY + timedelta(hours=7, minutes=5, seconds=30 * j),
                "get_customer_export", caller="ivan", ip="203.0.113.12", server="crm",
                args={"segment": seg, "format": "json"}, nbytes=size, rows=size // 330)
    # One customer export, plus a small search whose query names customers: one pull
    # and a lookup, not asking again.
    tr.call("one-and-search", DAY + timedelta(hours=7, minutes=9), "searchItems",
            caller="lena", ip="10.0.0.13", server="docs",
            args={"query": "customer escalation", "page": 1}, nbytes=5_200, rows=11)
    tr.call("one-and-search", DAY + timedelta(hours=7, minutes=10), "get_customer_export",
            caller="lena", ip="10.0.0.13", server="crm",
            args={"segment": "emea", "format": "csv"}, nbytes=1_600_000, rows=7_400)
    # A listing tool whose name names the records, with large responses routine for its
    # population (one session in six lists a whole segment): its reads count as named
    # whatever its population pulls. Nine segments of 115 kB in one session: 1.03 MB.
    for k in range(30):
        tr.call(f"lc-{k}", DAY + timedelta(hours=k % 8, minutes=13 * k), "listCustomers",
                caller=f"rep-{k % 12}", ip=f"10.9.2.{k % 12}", server="crm",
                args={"segment": "smb", "limit": 100},
                nbytes=260_000 if k % 6 == 0 else 19_000, rows=800 if k % 6 == 0 else 60)
    for k, seg in enumerate(["enterprise", "na", "apac", "latam", "smb", "emea", "trial",
                             "churned", "partner"]):
        tr.call("segments", DAY + timedelta(hours=7, minutes=20, seconds=15 * k),
                "listCustomers", caller="zoe", ip="10.4.95.195", server="crm",
                args={"segment": seg, "limit": 1000}, nbytes=114_500, rows=380)
    # A pipeline: each export loaded, whole, into the warehouse (the load reports the
    # same number of records), 3 MB in all.
    t = DAY + timedelta(hours=1, minutes=30)
    for j, (seg, n) in enumerate([("emea", 4_811), ("apac", 4_907)]):
        tr.call("pipeline", t, "get_customer_export", caller="svc-etl", ip="10.2.0.5",
                server="crm", args={"segment": seg, "format": "jsonl"}, nbytes=1_500_000,
                rows=n)
        tr.call("pipeline", t + timedelta(seconds=10), "load_dataset", caller="svc-etl",
                ip="10.2.0.5", server="warehouse",
                args={"table": f"staging.customers_{seg}", "rows": n}, nbytes=300, rows=n)
        t += timedelta(minutes=1)
    return tr


@pytest.fixture(scope="module")
def result() -> detectors.DetectResult:
    tr = _traffic()
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig())


def test_log_follower_is_not_a_sweep(result: detectors.DetectResult) -> None:
    for s in range(4):
        assert _bulk(result, f"tail-{s}").height == 0
    assert _caller_bulk(result, "ops").height == 0


def test_full_pages_are_a_sweep(result: detectors.DetectResult) -> None:
    assert _bulk(result, "sweep").height == 1


def test_exports_of_named_records_over_1mb_alert(result: detectors.DetectResult) -> None:
    alert = _bulk(result, "export")
    assert alert.height == 1
    assert "records" in " ".join(alert["reasons"][0])


def test_many_small_lookups_of_records_are_not_bulk(result: detectors.DetectResult) -> None:
    assert _bulk(result, "support").height == 0


def test_refused_exports_are_an_attempt(result: detectors.DetectResult) -> None:
    alert = _bulk(result, "refused")
    assert alert.height == 1
    assert alert["severity"][0] == "low"
    assert "refused" in " ".join(alert["reasons"][0])
    assert _bulk(result, "mistake").height == 0


def test_named_reads_on_a_routinely_heavy_tool_are_judged_by_the_tool(
        result: detectors.DetectResult) -> None:
    assert _bulk(result, "datateam").height == 0


def test_records_handed_on_whole_are_a_flow_not_a_pull(
        result: detectors.DetectResult) -> None:
    """A session that loads every record it exported into the warehouse is a pipeline
    (pipeline_share): where the records went is cross_server_flow's to judge."""
    assert _bulk(result, "pipeline").height == 0
    tr = _traffic()
    off = detectors.detect(tr.events(), tr.summaries(), DetectorsConfig.from_dict(
        {"bulk_extraction": {"pipeline_share": 0.0}}))
    assert _bulk(off, "pipeline").height == 1


def test_one_big_report_downloaded_once_is_not_bulk(result: detectors.DetectResult) -> None:
    """Named reads count from named_min_calls: the demo's users who export one 1.1 MB
    report were flagged when a single read was enough."""
    assert _bulk(result, "oneshot").height == 0


def test_exports_are_named_by_whose_records_they_hold(result: detectors.DetectResult) -> None:
    """An export or dump says how much leaves, not what: two PDF report exports of 1.3 MB
    are documents; two customer exports of the same size are records pulled in bulk."""
    assert _bulk(result, "reports").height == 0
    alert = _bulk(result, "two-segments")
    assert alert.height == 1 and "records" in " ".join(alert["reasons"][0])


def test_a_lookup_beside_one_export_is_not_asking_again(
        result: detectors.DetectResult) -> None:
    """named_min_calls counts pulls (heavy_factor x a typical call), not a 5 kB search
    whose query happens to name customers."""
    assert _bulk(result, "one-and-search").height == 0


def test_a_tool_named_for_its_records_counts_however_heavy_its_population(
        result: detectors.DetectResult) -> None:
    """listCustomers' large responses are routine for its population, but the tool's name
    says what it returns: 1.03 MB of customers over nine segments is a named pull (a
    generic query tool named only by its arguments is judged by what it returns:
    test_named_reads_on_a_routinely_heavy_tool_are_judged_by_the_tool)."""
    alert = _bulk(result, "segments")
    assert alert.height == 1 and "records" in " ".join(alert["reasons"][0])
