"""Bulk extraction is focused; a person's working day is not (issue 26).

On traffic written independently of the detectors, power users' working days (6-10 h,
hundreds of calls over documents, queries, tickets and reports, one after another) piled
up tens of MB and were flagged as bulk extraction at medium or higher in 10 of 15 days.
An extraction asks one resource for a lot: the volume pattern now requires that a share
``focus_min`` of the session's calls go to one tool. Each case has the attack it must
still catch beside the hard negative, with the same volume.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

#: Heavy calls of both sessions: the same count and size, so only the focus differs.
HEAVY, HEAVY_BYTES = 40, 300_000
DAY = T0 + timedelta(days=2, hours=9)


def _bulk(res: detectors.DetectResult, sid: str) -> pl.DataFrame:
    return res.alerts.filter((pl.col("session_id") == sid)
                             & (pl.col("category") == "bulk_extraction"))


@pytest.fixture(scope="module")
def result() -> detectors.DetectResult:
    tr = Traffic(seed=26)
    tr.background(days=3, users=30, per_day=2)
    # The attack: one tool, forty records of 300 kB each, at an agent's pace.
    for k in range(HEAVY):
        tr.call("drip", DAY + timedelta(seconds=3 * k), "downloadAttachment", caller="mallory",
                ip="203.0.113.9", server="crm", resource_key="attachmentId",
                resource_id=f"att-{1000 + k}", nbytes=HEAVY_BYTES)
    # The working day: the same forty heavy query results, spread over eight hours among
    # documents, searches, customer look-ups, notes and tickets (six tools).
    t, other = DAY, ["getDocument", "searchDocuments", "getCustomer", "writeFile",
                     "createDocument", "getTicket"]
    for k in range(HEAVY):
        tr.call("day", t, "run_query", caller="poweruser", ip="10.0.0.7", server="internal",
                args={"sql": "SELECT * FROM analytics.usage"}, nbytes=HEAVY_BYTES, rows=2_000)
        for j in range(2):
            t += timedelta(seconds=45)
            tr.call("day", t, other[(k + j) % len(other)], caller="poweruser", ip="10.0.0.7",
                    server="docs-server", resource_key="id", resource_id=f"r-{k}-{j}",
                    nbytes=3_000)
        t += timedelta(seconds=540)
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig())


def test_focused_extraction_alerts(result: detectors.DetectResult) -> None:
    assert _bulk(result, "drip").height == 1


def test_working_day_with_the_same_volume_is_quiet(result: detectors.DetectResult) -> None:
    assert _bulk(result, "day").height == 0


def test_focus_min_zero_restores_the_volume_pattern() -> None:
    """The gate is what keeps the working day quiet (the test above can fail)."""
    tr = Traffic(seed=26)
    tr.background(days=3, users=30, per_day=2)
    t, other = DAY, ["getDocument", "searchDocuments", "getCustomer", "writeFile",
                     "createDocument", "getTicket"]
    for k in range(HEAVY):
        tr.call("day", t, "run_query", caller="poweruser", ip="10.0.0.7", server="internal",
                args={"sql": "SELECT * FROM analytics.usage"}, nbytes=HEAVY_BYTES, rows=2_000)
        for j in range(2):
            t += timedelta(seconds=45)
            tr.call("day", t, other[(k + j) % len(other)], caller="poweruser", ip="10.0.0.7",
                    server="docs-server", resource_key="id", resource_id=f"r-{k}-{j}",
                    nbytes=3_000)
        t += timedelta(seconds=540)
    cfg = DetectorsConfig.from_dict({"bulk_extraction": {"focus_min": 0.0}})
    res = detectors.detect(tr.events(), tr.summaries(), cfg)
    assert _bulk(res, "day").height == 1


@pytest.fixture(scope="module")
def requests() -> detectors.DetectResult:
    """Refused requests for a dump beside ordinary page sizes and a served 5,000-row read."""
    tr = Traffic(seed=27)
    tr.background(days=3, users=30, per_day=2)
    for k in range(8):
        tr.call("capped", DAY + timedelta(seconds=5 * k), "run_query", caller="mallory",
                ip="203.0.113.9", server="internal", status="denied", nbytes=60,
                args={"sql": "SELECT * FROM customers", "limit": 1_000_000})
    for k in range(8):
        tr.call("pages", DAY + timedelta(seconds=20 * k), "searchItems", caller="carol",
                ip="10.0.0.8", server="crm", nbytes=6_000,
                args={"query": "renewals", "page": k + 1, "limit": 100})
    tr.call("report", DAY, "run_query", caller="dave", ip="10.0.0.9", server="internal",
            args={"sql": "SELECT * FROM analytics.mrr", "limit": 5000}, rows=5000,
            nbytes=300_000)
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig())


def test_refused_requests_for_a_dump_alert_as_an_attempt(requests: detectors.DetectResult
                                                         ) -> None:
    a = _bulk(requests, "capped")
    assert a.height == 1
    assert "refused" in " ".join(a["reasons"].to_list()[0])


def test_ordinary_page_sizes_and_a_served_report_are_quiet(requests: detectors.DetectResult
                                                           ) -> None:
    assert _bulk(requests, "pages").height == 0
    assert _bulk(requests, "report").height == 0
