"""A caller's own job is not enumeration or scraping (issue 26, second author's traffic).

Enumeration is a walk of lookups over *other people's* resources; scraping is the
extraction of a listing at machine pace. Hand-written scenarios: the job beside the attack
it resembles.
"""

from __future__ import annotations

from datetime import timedelta

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

