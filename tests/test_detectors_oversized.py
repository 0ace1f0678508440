"""Oversized reads: a read is judged by what it returns against what its tool returns
(issue 26).

bulk_extraction's ``p_oversized``: calls returning ``tool_factor`` x their (server, tool)'s
typical response add up to ``oversized_min_bytes`` / ``oversized_min_rows`` — a few dumps
far under the sustained-volume floor. On a tool where such responses are routine only
reads naming records count; the calls must be focused on the oversized tool.
cross_server_flow: a read far beyond its tool's typical response, then an outbound call on
another server, is a flow whatever the read's name.
"""

from __future__ import annotations

from datetime import timedelta

import orjson
import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

DAY = T0 + timedelta(days=2, hours=9)


def _cats(res: detectors.DetectResult, sid: str) -> dict[str, dict]:
    rows = res.alerts.filter(pl.col("session_id") == sid).to_dicts()
    return {r["category"]: r for r in rows}


def _docs_population(tr: Traffic, sessions: int = 150) -> None:
    """A document store whose documents are ~6 kB, read by many people (the two sessions
    with fat documents below are ~1% of its sessions, under tool_heavy_share)."""
    for s in range(sessions):
        t = T0 + timedelta(days=s % 3, hours=8 + s % 9, minutes=s)
        for k in range(5):
            tr.call(f"reader-{s}", t + timedelta(seconds=20 * k), "getDocument",
                    caller=f"user{s % 25}", ip=f"10.0.1.{s % 25}", server="docs",
                    resource_key="documentId", resource_id=f"doc-{s * 10 + k}",
                    nbytes=tr.rng.randint(4_000, 8_000))


def _query_population(tr: Traffic) -> None:
    """A query tool serving small dashboard queries and, routinely, a data team's big
    result sets: oversized responses are part of its everyday use."""
    for s in range(60):
        t = T0 + timedelta(days=s % 3, hours=8 + s % 9, minutes=2 * s)
        big = s % 5 == 0  # one session in five: the data team's exports
        for k in range(3):
            rows = 40_000 if big else 300
            tr.call(f"q-{s}", t + timedelta(seconds=30 * k), "run_query",
                    caller=f"analyst{s % 12}", ip=f"10.0.2.{s % 12}", server="warehouse",
                    args={"sql": f"SELECT * FROM analytics.cohort_{k}"},
                    nbytes=rows * 60, rows=rows)


@pytest.fixture(scope="module")
def result() -> detectors.DetectResult:
    tr = Traffic(seed=261)
    tr.background(days=3, users=30, per_day=2)
    _docs_population(tr)
    _query_population(tr)
    # Fifteen documents of ~100 kB (16x the store's documents), 1.5 MB in all: far under
    # min_bytes (2 MB beyond the largest response), oversized for this tool.
    for k in range(15):
        tr.call("fat-docs", DAY + timedelta(seconds=4 * k), "getDocument", caller="mallory",
                ip="203.0.113.5", server="docs", resource_key="documentId",
                resource_id=f"doc-{(k * 7919) % 1500}", nbytes=100_000)
    # The same query tool: a whole customer table (named records) is a dump...
    tr.call("cust-dump", DAY, "run_query", caller="eve", ip="203.0.113.6",
            server="warehouse", args={"sql": "SELECT * FROM customers"},
            nbytes=2_400_000, rows=40_000)
    # ...an analytics result set of the same size is the team's routine.
    tr.call("cohorts", DAY, "run_query", caller="analyst3", ip="10.0.2.3",
            server="warehouse", args={"sql": "SELECT * FROM analytics.cohort_9"},
            nbytes=2_400_000, rows=40_000)
    # A working session: four fat documents among sixty ordinary reads of other tools.
    t = DAY + timedelta(hours=1)
    for k in range(64):
        if k % 16 == 0:
            tr.call("workday", t, "getDocument", caller="pat", ip="10.0.1.99", server="docs",
                    resource_key="documentId", resource_id=f"doc-{k}", nbytes=400_000)
        else:
            tool = ("searchDocuments", "listDocuments", "createDocument")[k % 3]
            tr.call("workday", t, tool, caller="pat", ip="10.0.1.99", server="docs",
                    resource_key="id", resource_id=f"r-{k}", nbytes=3_000)
        t += timedelta(seconds=50)
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig())


def test_documents_far_beyond_the_stores_usual_are_bulk(result: detectors.DetectResult) -> None:
    hit = _cats(result, "fat-docs").get("bulk_extraction")
    assert hit is not None
    ev = orjson.loads(hit["evidence"])
    assert ev["pattern_scores"]["p_oversized"] >= 0.5
    assert ev["oversized_calls"] == 15
    assert any("oversized reads" in r for r in hit["reasons"]), hit["reasons"]


def test_a_dump_of_named_records_counts_on_a_routinely_heavy_tool(
        result: detectors.DetectResult) -> None:
    assert "bulk_extraction" in _cats(result, "cust-dump")


def test_a_routine_result_set_on_that_tool_is_quiet(result: detectors.DetectResult) -> None:
    assert "bulk_extraction" not in _cats(result, "cohorts")


def test_a_few_fat_responses_in_a_working_session_are_quiet(
        result: detectors.DetectResult) -> None:
    assert "bulk_extraction" not in _cats(result, "workday")


def test_tool_factor_zero_disables_the_pattern() -> None:
    """The oversized pattern is what catches the fat documents (the test above can fail)."""
    tr = Traffic(seed=261)
    tr.background(days=3, users=30, per_day=2)
    _docs_population(tr)
    for k in range(15):
        tr.call("fat-docs", DAY + timedelta(seconds=4 * k), "getDocument", caller="mallory",
                ip="203.0.113.5", server="docs", resource_key="documentId",
                resource_id=f"doc-{(k * 7919) % 1500}", nbytes=100_000)
    cfg = DetectorsConfig.from_dict({"bulk_extraction": {"tool_factor": 0.0}})
    res = detectors.detect(tr.events(), tr.summaries(), cfg)
    assert "bulk_extraction" not in _cats(res, "fat-docs")


def _file_server(tr: Traffic) -> None:
    """A file server whose reads return a few kB."""
    for s in range(30):
        t = T0 + timedelta(days=s % 3, hours=9 + s % 8, minutes=s)
        for k in range(4):
            tr.call(f"f-{s}", t + timedelta(seconds=15 * k), "readFile",
                    caller=f"dev{s % 10}", ip=f"10.0.3.{s % 10}", server="files",
                    args={"path": f"/home/dev{s % 10}/notes_{k}.md"},
                    nbytes=tr.rng.randint(2_000, 6_000))


def _share_after_read(tr: Traffic, sid: str, nbytes: int) -> None:
    tr.call(sid, DAY, "readFile", caller=f"c-{sid}", ip="10.0.4.1", server="files",
            args={"path": "/srv/legal/contracts_index.json"}, nbytes=nbytes)
    tr.call(sid, DAY + timedelta(seconds=20), "share_file", caller=f"c-{sid}",
            ip="10.0.4.1", server="community-plugin",
            args={"filename": "contracts_index.json", "visibility": "public"}, nbytes=200)


def test_an_oversized_read_then_a_share_elsewhere_is_a_flow() -> None:
    """A 600 kB file from a server whose reads are a few kB, shared through a plugin: under
    min_bytes, no sensitive name, but far beyond what that tool returns."""
    tr = Traffic(seed=262)
    tr.background(days=3, users=20, per_day=2)
    _file_server(tr)
    _share_after_read(tr, "big", 600_000)
    _share_after_read(tr, "usual", 5_000)  # a file of the usual size: a user's own share
    res = detectors.detect(tr.events(), tr.summaries(), DetectorsConfig())
    assert "cross_server_flow" in _cats(res, "big")
    assert "cross_server_flow" not in _cats(res, "usual")
    off = DetectorsConfig.from_dict({"cross_server_flow": {"oversized_factor": 0.0}})
    res = detectors.detect(tr.events(), tr.summaries(), off)
    assert "cross_server_flow" not in _cats(res, "big")


def test_record_score_reports_a_single_record_sent_out_when_set() -> None:
    """Off by default (a support agent emailing a customer is the job); set, one customer
    record uploaded to a plugin is reported at low severity."""
    tr = Traffic(seed=263)
    tr.background(days=3, users=20, per_day=2)
    tr.call("pii", DAY, "get_customer", caller="agent-3", server="internal",
            args={"customerId": "C-17"}, nbytes=1_800, rows=1)
    tr.call("pii", DAY + timedelta(seconds=10), "upload_dataset", caller="agent-3",
            server="community-plugin", args={"datasetName": "one"}, nbytes=200)
    res = detectors.detect(tr.events(), tr.summaries(), DetectorsConfig())
    assert "cross_server_flow" not in _cats(res, "pii")
    cfg = DetectorsConfig.from_dict({"cross_server_flow": {"record_score": 0.6}})
    flow = _cats(detectors.detect(tr.events(), tr.summaries(), cfg), "pii").get(
        "cross_server_flow")
    assert flow is not None and flow["severity"] == "low"
    assert any("too few to be a collection" in r for r in flow["reasons"]), flow["reasons"]


def test_a_burst_and_volume_on_one_session_are_two_findings() -> None:
    """Firing calls at once and pulling volume are kept apart like a sweep and volume:
    neither category is folded into the other, whatever their scores; a third category
    far below still is."""
    from toolwatch.detectors.alerts import _fold

    def row(cat: str, score: float) -> dict:
        return {"window_start": None, "session_id": "s1", "category": cat, "score": score,
                "_evidence": {}, "_reasons": [f"{cat} reason"]}

    rows = [row("bulk_extraction", 1.0), row("concurrency_abuse", 0.55),
            row("tool_loop", 0.5)]
    kept, dropped = _fold(rows, DetectorsConfig())
    assert {r["category"] for r in kept} == {"bulk_extraction", "concurrency_abuse"}
    assert dropped == 1
