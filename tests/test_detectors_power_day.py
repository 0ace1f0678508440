"""A caller's long, diverse, legitimate day is not an attack (issue 11, quality).

Found with ``benchmarks/bench_quality.py``: independent power-user days (reads from many
servers all day, then a chat post or an upload to their own folder) were flagged as
cross_server_flow on ~60% of their sessions. Each case here has the attack it must still
catch beside the hard negative.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.baseline import daily_habits

from tests.fixtures.traffic import T0, Traffic
from toolwatch import detectors

DAYS = 4


def _s(k: float) -> timedelta:
    return timedelta(seconds=k)


def routine_day(tr: Traffic, caller: str, day: int, *, export_bytes: int = 2_500_000,
                sensitive: bool = False) -> dict[str, str]:
    """One working hour of a power user: an export of own data on the analytics server,
    small reads on two other servers (other connections, other sessions), then a summary
    posted to chat. Returns the session ids by server."""
    t = T0 + timedelta(days=day, hours=9)
    sid = {srv: f"{caller}-{srv}-{day}" for srv in ("analytics", "drive", "fs", "chat")}
    for k in range(12):
        tr.call(sid["drive"], t + _s(40 * k), "read_file", caller=caller, server="drive",
                resource_key="fileId", resource_id=f"{caller}-doc-{k % 5}", nbytes=30_000)
        tr.call(sid["fs"], t + _s(40 * k + 7), "read_file", caller=caller, server="fs",
                resource_key="path", resource_id=f"/home/{caller}/work/f{k}.py", nbytes=8_000)
    if sensitive:
        tr.call(sid["fs"], t + _s(500), "read_file", caller=caller, server="fs",
                resource_key="path", resource_id="/srv/app/.env", nbytes=900)
    tr.call(sid["analytics"], t + _s(600), "download_result", caller=caller,
            server="analytics", args={"jobId": f"job-{day}"}, nbytes=export_bytes)
    tr.call(sid["chat"], t + _s(700), "post_message", caller=caller, server="chat",
            args={"channel": "#data", "text": "numbers are in"})
    return sid


def flagged(res: detectors.DetectResult, sessions: dict[str, str]) -> set[str]:
    a = res.alerts.filter(pl.col("session_id").is_in(list(sessions.values()))
                          & (pl.col("category") == "cross_server_flow"))
    return set(a["session_id"].to_list())


@pytest.fixture(scope="module")
def days() -> tuple[detectors.DetectResult, dict[str, dict[str, str]]]:
    tr = Traffic(seed=3)
    tr.background(days=DAYS, users=30, per_day=2)
    s: dict[str, dict[str, str]] = {}
    for d in range(DAYS - 1):
        s[f"analyst-{d}"] = routine_day(tr, "analyst", d)
    # Same caller, last day: thirty times its usual export, then out through chat.
    s["analyst-big"] = routine_day(tr, "analyst", DAYS - 1, export_bytes=75_000_000)
    # Same routine, but with a sensitive read before the post: never excused.
    for d in range(DAYS - 1):
        s[f"dev-{d}"] = routine_day(tr, "dev", d, sensitive=d == DAYS - 2)
    # A caller who never did this before: the first such flow alerts.
    s["first"] = routine_day(tr, "newcomer", DAYS - 1)
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig()), s


def test_routine_daily_flow_is_quiet(days: tuple[detectors.DetectResult, dict]) -> None:
    res, s = days
    for d in range(DAYS - 1):
        assert not flagged(res, s[f"analyst-{d}"]), d


def test_far_larger_flow_of_a_routine_caller_alerts(days: tuple[detectors.DetectResult, dict]
                                                     ) -> None:
    res, s = days
    hit = flagged(res, s["analyst-big"])
    assert s["analyst-big"]["chat"] in hit
    a = res.alerts.filter((pl.col("session_id") == s["analyst-big"]["chat"])
                          & (pl.col("category") == "cross_server_flow")).to_dicts()[0]
    assert "usual day" in " ".join(a["reasons"])


def test_first_flow_of_a_caller_alerts(days: tuple[detectors.DetectResult, dict]) -> None:
    res, s = days
    assert s["first"]["chat"] in flagged(res, s["first"])


def test_sensitive_flow_of_a_routine_caller_still_alerts(
        days: tuple[detectors.DetectResult, dict]) -> None:
    res, s = days
    assert s[f"dev-{DAYS - 2}"]["chat"] in flagged(res, s[f"dev-{DAYS - 2}"])
    assert not flagged(res, s["dev-0"])


def test_only_sessions_that_supplied_the_data_are_named(
        days: tuple[detectors.DetectResult, dict]) -> None:
    """The newcomer's 2.5 MB came from analytics; its drive and fs connections read a few
    hundred kB in the hour and are not where the data came from."""
    res, s = days
    hit = flagged(res, s["first"])
    assert hit == {s["first"]["chat"], s["first"]["analytics"]}


def test_source_share_zero_names_every_session_read_in() -> None:
    tr = Traffic(seed=4)
    tr.background(days=2, users=20, per_day=2)
    s = routine_day(tr, "newcomer", 1)
    cfg = DetectorsConfig.from_dict({"cross_server_flow": {"source_share_lo": 0.0}})
    res = detectors.detect(tr.events(), tr.summaries(), cfg)
    assert flagged(res, s) == set(s.values())


def test_daily_habits_take_each_days_highest_score() -> None:
    day = 86_400_000_000
    t = [datetime(2026, 1, 1).timestamp() * 1e6 + k * day / 4 for k in range(16)]
    frame = pl.DataFrame({
        "caller_id": ["a"] * 16 + ["b"] * 2,
        "first_t": [int(x) for x in t] + [int(t[0]), int(t[1])],
        # "a": one session at alert level per day among three quiet ones.
        "_raw": [0.9 if k % 4 == 0 else 0.0 for k in range(16)] + [0.9, 0.9],
    })
    h = daily_habits(frame, "_raw", ["caller_id"], min_rows=3, min_days=2)
    assert h.to_dicts() == [{"caller_id": "a", "habit_score": 0.9}]  # "b": one day only


def test_without_the_habit_gate_the_routine_is_flagged() -> None:
    """What keeps the routine quiet is the caller's own history, not a changed threshold."""
    tr = Traffic(seed=3)
    tr.background(days=DAYS, users=30, per_day=2)
    s = [routine_day(tr, "analyst", d) for d in range(DAYS - 1)]
    cfg = DetectorsConfig.from_dict({"cross_server_flow": {"self_z": 0.0}})
    res = detectors.detect(tr.events(), tr.summaries(), cfg)
    assert all(x["chat"] in flagged(res, x) for x in s)


# ------------------------------------------------------------------ bulk_extraction
def analyst_day(tr: Traffic, caller: str, day: int, *, downloads: tuple[int, ...] = (
        3_000_000, 2_500_000, 3_500_000)) -> str:
    """A working day: small sessions on three servers, and one analytics session that
    polls jobs and downloads a few results of the caller's own data."""
    t = T0 + timedelta(days=day, hours=9)
    for srv in ("drive", "fs", "chat"):
        sid = f"{caller}-{srv}-{day}"
        for k in range(15):
            tr.call(sid, t + _s(60 * k), "read_file", caller=caller, server=srv,
                    resource_key="path", resource_id=f"/{caller}/{srv}/{k}", nbytes=6_000)
    sid = f"{caller}-analytics-{day}"
    for j, size in enumerate(downloads):
        t0 = t + timedelta(minutes=40 * j)
        for p in range(6):
            tr.call(sid, t0 + _s(5 * p), "get_job_status", caller=caller, server="analytics",
                    args={"jobId": f"j{day}-{j}"}, nbytes=200)
        tr.call(sid, t0 + _s(40), "download_result", caller=caller, server="analytics",
                args={"jobId": f"j{day}-{j}"}, nbytes=size, rows=size // 120)
    return sid


@pytest.fixture(scope="module")
def analysts() -> tuple[detectors.DetectResult, dict[str, str]]:
    tr = Traffic(seed=5)
    tr.background(days=DAYS, users=40, per_day=2)
    s = {f"routine-{d}": analyst_day(tr, "analyst", d) for d in range(DAYS - 1)}
    # The same person, last day: twenty times its usual downloads.
    s["huge"] = analyst_day(tr, "analyst", DAYS - 1, downloads=(60_000_000,) * 3)
    # A light user (small sessions on three days) suddenly downloading like the analyst.
    for d in range(DAYS - 1):
        tr.normal_session(f"light-{d}", T0 + timedelta(days=d, hours=11), caller="light")
    s["light"] = analyst_day(tr, "light", DAYS - 1)
    return detectors.detect(tr.events(), tr.summaries(), DetectorsConfig()), s


def _bulk(res: detectors.DetectResult, sid: str) -> list[dict]:
    return res.alerts.filter((pl.col("session_id") == sid)
                             & (pl.col("category") == "bulk_extraction")).to_dicts()


def test_daily_downloads_of_a_power_user_are_quiet(analysts: tuple) -> None:
    res, s = analysts
    for d in range(DAYS - 1):
        assert not _bulk(res, s[f"routine-{d}"]), d


def test_far_beyond_the_usual_heaviest_day_alerts(analysts: tuple) -> None:
    res, s = analysts
    hit = _bulk(res, s["huge"])
    assert hit
    assert "usual heaviest session of a day" in " ".join(hit[0]["reasons"])


def test_light_user_pulling_like_a_power_user_alerts(analysts: tuple) -> None:
    res, s = analysts
    assert _bulk(res, s["light"])


@pytest.mark.parametrize("routine_z", [0.0, 2.0])
def test_without_the_daily_habit_the_routine_is_bulk(routine_z: float) -> None:
    """What keeps the routine quiet is the daily habit (margin below the threshold); the
    routine with a main tool (routine_z) reads the same margin, so without it neither
    applies and the routine is bulk."""
    tr = Traffic(seed=5)
    tr.background(days=DAYS, users=40, per_day=2)
    sids = [analyst_day(tr, "analyst", d) for d in range(DAYS - 1)]
    cfg = DetectorsConfig.from_dict({"bulk_extraction": {"habit_margin": -1.0,
                                                         "routine_z": routine_z}})
    res = detectors.detect(tr.events(), tr.summaries(), cfg)
    assert any(_bulk(res, sid) for sid in sids)


def long_session(tr: Traffic, sid: str, caller: str, *, calls: int, call_bytes: tuple[int, int],
                 exports: int = 0, export_bytes: int = 900_000) -> None:
    """A long working session: ``calls`` reads of documents, ``exports`` reports among them."""
    t = T0 + timedelta(days=1, hours=10)
    every = calls // max(exports, 1)
    for k in range(calls):
        if exports and k % every == every // 2 and k // every < exports:
            tr.call(sid, t, "exportReport", caller=caller, args={"reportId": f"r{k}"},
                    nbytes=export_bytes, rows=export_bytes // 190)
        else:
            tr.call(sid, t, "getDocument", caller=caller, resource_key="documentId",
                    resource_id=f"doc-{tr.rng.randint(1000, 99999)}",
                    nbytes=tr.rng.randint(*call_bytes))
        t += _s(tr.rng.uniform(2, 40))


@pytest.fixture(scope="module")
def long_sessions() -> Traffic:
    tr = Traffic(seed=6)
    tr.background(days=3, users=40, per_day=2)
    # A power user's long session with a few reports (no history: judged on its own).
    long_session(tr, "busy", "pat", calls=180, call_bytes=(1_000, 20_000), exports=4,
                 export_bytes=5_000_000)
    # Every call heavy: 150 documents of 150-250 kB (20x a typical call), 30 MB in all.
    long_session(tr, "hoover", "mallory", calls=150, call_bytes=(150_000, 250_000))
    return tr


def test_long_session_with_a_few_reports_is_not_bulk(long_sessions: Traffic) -> None:
    res = detectors.detect(long_sessions.events(), long_sessions.summaries(), DetectorsConfig())
    assert not _bulk(res, "busy")
    hit = _bulk(res, "hoover")
    assert hit and "its 4 largest responses" in " ".join(hit[0]["reasons"])


def test_without_the_report_discount_the_long_session_is_bulk(long_sessions: Traffic) -> None:
    cfg = DetectorsConfig.from_dict({"bulk_extraction": {"report_every_calls": 0}})
    res = detectors.detect(long_sessions.events(), long_sessions.summaries(), cfg)
    assert _bulk(res, "busy")


def test_daily_habits_need_most_days_not_half() -> None:
    """Found on seed 31337: an account with two attack days beside two quiet ones was
    habitual (the median of four days averages the middle two), so its 312 MB summary-only
    extraction was excused. Most days means the lower median."""
    day = 86_400_000_000
    t0 = int(datetime(2026, 1, 1).timestamp() * 1e6)
    frame = pl.DataFrame({
        "caller_id": ["atk"] * 4 + ["job"] * 4,
        "first_t": [t0 + k * day for k in range(4)] * 2,
        "_raw": [1.0, 0.02, 0.006, 0.83, 0.9, 0.8, 0.95, 0.01],  # atk, then job
    })
    h = daily_habits(frame, "_raw", ["caller_id"], min_rows=3, min_days=2)
    got = {r["caller_id"]: r["habit_score"] for r in h.to_dicts()}
    assert got["atk"] < 0.5 <= got["job"]
