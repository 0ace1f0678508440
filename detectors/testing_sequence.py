"""Sequence-abuse scenarios for tests: each class's attack and its named hard negatives.

Small, readable builders over :class:`toolwatch.detectors.testing.Traffic` (one session each unless
said), used by ``tests/test_detectors_sequence.py`` and the contract test.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from toolwatch.detectors.testing import Traffic


def _s(k: float) -> timedelta:
    return timedelta(seconds=k)


# ------------------------------------------------------------------------- tool_loop
def tool_loop(tr: Traffic, sid: str, t: datetime, *, n: int = 40, cycle: int = 1,
              caller: str = "looper") -> None:
    """The same call (``cycle`` = 1) or a cycle of calls repeated with identical results."""
    tools = [("getDocument", "doc-4242"), ("getComments", "doc-4242"),
             ("getDocument", "doc-4243"), ("listVersions", "doc-4242")][:cycle]
    for k in range(n):
        tool, doc = tools[k % cycle]
        tr.call(sid, t + _s(3 * k), tool, caller=caller, resource_key="documentId",
                resource_id=doc, nbytes=4_100)


def polling_with_backoff(tr: Traffic, sid: str, t: datetime, *, polls: int = 7) -> None:
    """Start a job, poll its status with exponential back-off until it completes."""
    tr.call(sid, t, "startExport", caller="poller", resource_key="reportId", resource_id="r-7")
    gap, at = 1.0, t + _s(1)
    for k in range(polls):
        done = k == polls - 1
        tr.call(sid, at, "getJobStatus", caller="poller", resource_key="jobId",
                resource_id="job-77", nbytes=900 if done else 120)
        at += _s(gap)
        gap *= 2
    tr.call(sid, at, "downloadReport", caller="poller", resource_key="reportId",
            resource_id="r-7", nbytes=80_000)


def retries_of_failed_call(tr: Traffic, sid: str, t: datetime, *, attempts: int = 4) -> None:
    """A client retrying a failing call a few times, then succeeding."""
    for k in range(attempts):
        tr.call(sid, t + _s(2**k), "getDocument", caller="retrier", resource_key="documentId",
                resource_id="doc-1", status="ok" if k == attempts - 1 else "rate_limited")


# ------------------------------------------------------------------- privilege_chain
def privilege_chain(tr: Traffic, sid: str, t: datetime, *, caller: str = "climber") -> None:
    """List, read credentials and /etc files, then grant a role and execute."""
    srv = "files-server"
    tr.call(sid, t, "listFiles", caller=caller, server=srv, args={"path": "/srv/app"})
    tr.call(sid, t + _s(4), "readFile", caller=caller, server=srv, resource_key="path",
            resource_id="/srv/app/.env")
    tr.call(sid, t + _s(9), "readFile", caller=caller, server=srv, resource_key="path",
            resource_id="/etc/shadow")
    tr.call(sid, t + _s(15), "getCredentials", caller=caller, server=srv,
            resource_key="serviceId", resource_id="svc-db")
    tr.call(sid, t + _s(22), "grantRole", caller=caller, server=srv,
            args={"user": caller, "role": "admin"})
    tr.call(sid, t + _s(30), "execCommand", caller=caller, server=srv,
            args={"command": "tar czf /tmp/x.tgz /srv"})


def editor_own_docs(tr: Traffic, sid: str, t: datetime, *, caller: str = "editor") -> None:
    """An editor's list → get → update of their own documents."""
    tr.call(sid, t, "listDocuments", caller=caller, args={"folderId": "fld-editor"})
    for k, d in enumerate(("doc-501", "doc-502", "doc-503")):
        tr.call(sid, t + _s(10 + 30 * k), "getDocument", caller=caller,
                resource_key="documentId", resource_id=d)
        tr.call(sid, t + _s(25 + 30 * k), "updateDocument", caller=caller,
                resource_key="documentId", resource_id=d, args={"title": "v2"})


def own_folder_writes(tr: Traffic, sid: str, t: datetime, *, caller: str = "filer") -> None:
    """A files user reading and writing in their own work folder."""
    srv = "files-server"
    tr.call(sid, t, "listFiles", caller=caller, server=srv, args={"path": f"/home/{caller}"})
    for k in range(4):
        p = f"/home/{caller}/work/notes-{k}.md"
        tr.call(sid, t + _s(8 + 20 * k), "readFile", caller=caller, server=srv,
                resource_key="path", resource_id=p)
        tr.call(sid, t + _s(15 + 20 * k), "writeFile", caller=caller, server=srv,
                resource_key="path", resource_id=p)


# ------------------------------------------------------------------------- step_skip
def order_flow(tr: Traffic, sid: str, t: datetime, order: str, *, caller: str = "shopper",
               charge: bool = True, charge_status: str = "ok") -> None:
    """createOrder → (chargePayment) → fulfillOrder for one order id."""
    srv = "shop-server"
    tr.call(sid, t, "createOrder", caller=caller, server=srv, resource_key="orderId",
            resource_id=order)
    if charge:
        tr.call(sid, t + _s(5), "chargePayment", caller=caller, server=srv,
                resource_key="orderId", resource_id=order, status=charge_status,
                args={"amount": 42})
    tr.call(sid, t + _s(12), "fulfillOrder", caller=caller, server=srv,
            resource_key="orderId", resource_id=order)


def approval_flow(tr: Traffic, sid: str, t: datetime, doc: str, *, caller: str = "approver",
                  review: bool = True) -> None:
    """reviewInvoice → approveInvoice for one invoice id."""
    if review:
        tr.call(sid, t, "reviewInvoice", caller=caller, server="erp-server",
                resource_key="invoiceId", resource_id=doc)
    tr.call(sid, t + _s(40), "approveInvoice", caller=caller, server="erp-server",
            resource_key="invoiceId", resource_id=doc)


# ------------------------------------------------------------------ duplicate_execution
def double_charge(tr: Traffic, sid: str, t: datetime, order: str, *, caller: str = "doubler",
                  keys: tuple[str | None, ...] = (None, None)) -> None:
    """chargePayment executed once per entry of ``keys`` (an idempotency key or None)."""
    for k, key in enumerate(keys):
        args = {"amount": 42}
        if key is not None:
            args["idempotencyKey"] = key
        tr.call(sid, t + _s(3 + 7 * k), "chargePayment", caller=caller, server="shop-server",
                resource_key="orderId", resource_id=order, args=args)


# ------------------------------------------------------------------- cross_server_flow
def exfil_flow(tr: Traffic, sid: str, t: datetime, *, caller: str = "deputy",
               sid_out: str | None = None) -> None:
    """Bulk reads on the CRM, then an upload through the files server (another session)."""
    for k in range(6):
        tr.call(sid, t + _s(5 * k), "exportReport", caller=caller, server="crm-server",
                resource_key="reportId", resource_id=f"rpt-{k}", nbytes=900_000)
    tr.call(sid_out or sid, t + _s(60), "uploadFile", caller=caller, server="files-server",
            resource_key="path", resource_id="https://paste.example/x")


def crm_round_trip(tr: Traffic, sid: str, t: datetime, *, caller: str = "seller") -> None:
    """Read a CRM account and write back to the same CRM."""
    for k in range(5):
        tr.call(sid, t + _s(5 * k), "getAccount", caller=caller, server="crm-server",
                resource_key="accountId", resource_id=f"acct-{k}", nbytes=400_000)
    tr.call(sid, t + _s(40), "updateAccount", caller=caller, server="crm-server",
            resource_key="accountId", resource_id="acct-1")
    tr.call(sid, t + _s(45), "sendEmail", caller=caller, server="crm-server",
            args={"to": "customer@example.com"})


def own_small_upload(tr: Traffic, sid: str, t: datetime, *, caller: str = "uploader") -> None:
    """Read a couple of own documents, upload a small own file elsewhere."""
    tr.call(sid, t, "getDocument", caller=caller, resource_key="documentId",
            resource_id="doc-9", nbytes=6_000)
    tr.call(sid, t + _s(20), "uploadFile", caller=caller, server="files-server",
            resource_key="path", resource_id=f"/home/{caller}/cv.pdf")
