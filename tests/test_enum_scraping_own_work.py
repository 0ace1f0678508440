"""A caller's own job is not enumeration or scraping (issue 26, second author's traffic).

Enumeration is a walk of lookups over *other people's* resources; scraping is the
extraction of a listing at machine pace. Hand-written scenarios: the job beside the attack
it resembles.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.fixtures.traffic import Traffic
from tests.test_detectors_everyday_work import T, alerts_of, run


def base() -> Traffic:
    tr = Traffic(seed=5)
    tr.background(days=2, users=25, per_day=2)
    return tr


# ----------------------------------------------------------------- enumeration: acting
def payouts(tr: Traffic, sid: str, *, read_first: bool, miss_every: int = 0) -> None:
    """A batch paying employees emp_40010, emp_40013, … one after another."""
    t = T
    for k in range(80):
        emp = f"emp_{40010 + 3 * k}"
        missing = bool(miss_every) and k % miss_every == 0
        if read_first:
            tr.call(sid, t, "getEmployee", caller="svc-payroll", server="pay",
                    resource_key="recipientId", resource_id=emp, nbytes=1_500)
            t += timedelta(milliseconds=500)
        tr.call(sid, t, "sendPayout", caller="svc-payroll", server="pay",
                resource_key="recipientId", resource_id=emp,
                args={"amountCents": 400_000 + 17 * k, "batchId": "PR-77"}, nbytes=210,
                status="denied" if missing else "ok")
        t += timedelta(seconds=1.5)


def test_a_payroll_run_paying_a_batch_is_not_enumeration() -> None:
    """Ids that are destinations of the caller's own payments, none read back: quiet."""
    tr = base()
    payouts(tr, "payroll", read_first=False)
    assert not alerts_of(run(tr), "enumeration", session_id="payroll")


def test_an_id_read_and_sent_out_is_still_a_lookup() -> None:
    """Reading each record and sending it on is a walk of lookups (exfiltration-shaped)."""
    tr = base()
    payouts(tr, "readsend", read_first=True)
    found = alerts_of(run(tr), "enumeration", session_id="readsend")
    assert len(found) == 1 and found[0]["severity"] in ("high", "critical")


def test_a_send_walk_refused_again_and_again_stays_visible() -> None:
    """Denied on a third of the ids: probing, not the caller's own batch (low, not quiet)."""
    tr = base()
    payouts(tr, "refused", read_first=False, miss_every=3)
    assert alerts_of(run(tr), "enumeration", session_id="refused")


# --------------------------------------------------------------- enumeration: content
def tree_backup(tr: Traffic, sid: str, *, nbytes: int, miss_every: int = 0) -> None:
    t = T
    for k in range(120):
        missing = bool(miss_every) and k % miss_every == 0
        tr.call(sid, t, "readFile", caller="backup-7", server="files", resource_key="path",
                resource_id=f"/srv/data/sales/chunk-{k:05d}.avro",
                nbytes=90 if missing else nbytes + 997 * (k % 13),
                status="not_found" if missing else "ok")
        t += timedelta(milliseconds=600)


def test_a_backup_reading_every_large_file_of_its_tree_is_not_enumeration() -> None:
    tr = base()
    tree_backup(tr, "backup", nbytes=150_000)
    assert not alerts_of(run(tr), "enumeration", session_id="backup")
    # Without the rule, the same walk is a critical sequential run.
    found = alerts_of(run(tr, enumeration={"harvest_bytes_factor": 0.0}), "enumeration",
                      session_id="backup")
    assert len(found) == 1 and found[0]["severity"] == "critical"


@pytest.mark.parametrize(("nbytes", "miss_every"), [(3_000, 0), (150_000, 4)])
def test_a_walk_of_ordinary_documents_or_with_misses_is_still_enumeration(
        nbytes: int, miss_every: int) -> None:
    """Harvesting documents of ordinary size, or a large-file walk that misses ids."""
    tr = base()
    tree_backup(tr, "walk", nbytes=nbytes, miss_every=miss_every)
    found = alerts_of(run(tr), "enumeration", session_id="walk")
    assert len(found) == 1 and found[0]["severity"] in ("high", "critical")


# ------------------------------------------------------------------ scraping: following
def read_by_offset(tr: Traffic, sid: str, caller: str, *, growing: bool) -> None:
    """Byte-range reads of one file: a tailer gets back what was written since (short of
    the 64 kB asked), a reader of a big export gets full 64 kB chunks."""
    t, off = T, 7_340_000
    for k in range(110):
        got = 2_000 + 611 * (k % 9) if growing else 65_536
        tr.call(sid, t, "readFile", caller=caller, server="files", resource_key="path",
                resource_id="/var/log/app/service.log" if growing else "/exports/all.csv",
                args={"offset": off, "length": 65_536}, nbytes=got)
        off += got
        t += timedelta(seconds=25 + 7 * (k % 5)) if growing else timedelta(seconds=1)


def test_a_log_tailer_following_a_growing_file_is_not_scraping() -> None:
    tr = base()
    read_by_offset(tr, "tail", "dev-ops", growing=True)
    assert not alerts_of(run(tr), "scraping_loop", session_id="tail")
    assert alerts_of(run(tr, scraping_loop={"tail_short_share_lo": 0.0}), "scraping_loop",
                     session_id="tail")


def test_a_tailer_following_its_log_over_several_sessions_is_not_a_resumed_walk() -> None:
    """Each session starts where the file ended last time (a later offset): not a walk
    resumed after a session budget."""
    tr = base()
    t, off = T, 7_340_000
    for s in range(4):
        for k in range(45):
            got = 2_000 + 611 * (k % 9)
            tr.call(f"tail-{s}", t, "readFile", caller="dev-ops", server="files",
                    resource_key="path", resource_id="/var/log/app/service.log",
                    args={"offset": off, "length": 65_536}, nbytes=got)
            off += got
            t += timedelta(seconds=30)
        t += timedelta(minutes=50)
    res = run(tr)
    assert not alerts_of(res, "scraping_loop", caller_id="dev-ops")
    assert alerts_of(run(tr, scraping_loop={"tail_short_share_lo": 0.0}), "scraping_loop",
                     caller_id="dev-ops")


def test_reading_a_whole_file_in_full_chunks_is_still_a_sweep() -> None:
    tr = base()
    read_by_offset(tr, "chunks", "agent-9", growing=False)
    found = alerts_of(run(tr), "scraping_loop", session_id="chunks")
    assert len(found) == 1


# ------------------------------------------------------------------ scraping: queries
def query_sweep(tr: Traffic, sid: str, caller: str, *, gap_s: float) -> None:
    """Queries a … z, one to three pages each (page numbers never pass 3)."""
    t = T
    for q in "abcdefghijklmnopqrstuvwxyz":
        for page in range(1, 2 + (ord(q) % 3)):
            tr.call(sid, t, "searchCatalog", caller=caller, server="shop",
                    args={"query": q, "page": page, "limit": 100}, nbytes=25_000, rows=100)
            t += timedelta(seconds=gap_s + 0.4 * (page % 2))


def test_a_sweep_through_queries_is_scraping() -> None:
    tr = base()
    query_sweep(tr, "sweep", "agent-q", gap_s=1.2)
    found = alerts_of(run(tr), "scraping_loop", session_id="sweep")
    assert len(found) == 1
    assert "query/page combinations of searchCatalog" in " ".join(found[0]["reasons"])


def test_many_searches_at_reading_pace_are_not_a_sweep() -> None:
    """The same searches spread over an afternoon, with other work between them."""
    tr = base()
    query_sweep(tr, "reader", "ana", gap_s=240)
    t = T + timedelta(minutes=3)
    for k in range(40):
        tr.call("reader", t, "getProduct", caller="ana", server="shop",
                resource_key="productId", resource_id=f"p-{(k * 37) % 500}")
        t += timedelta(minutes=6)
    assert not alerts_of(run(tr), "scraping_loop", session_id="reader")
