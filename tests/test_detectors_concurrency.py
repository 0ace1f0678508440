"""Concurrency abuse and race conditions: positives, each named hard negative, the sweep
against brute force, hostile durations at ingest, and live micro-batches."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig, FeatureSet
from toolwatch.detectors.concurrency import (
    ConcurrencyAbuseDetector,
    RaceConditionDetector,
    race_clusters,
    sweep_peaks,
)
from toolwatch.ingest.intervals import MAX_DURATION_MS, MAX_STORED_DURATION_MS

from tests.fixtures import traffic_concurrency as tc
from tests.fixtures.traffic import T0, Traffic


def _scores(tr: Traffic, det_cls: type) -> pl.DataFrame:
    cfg = DetectorsConfig()
    fs = FeatureSet.build(tr.events(), tr.summaries(), cfg)
    det = det_cls(cfg).fit(fs)
    return det.score(fs)


def _flagged(tr: Traffic, det_cls: type) -> set[str]:
    sc = _scores(tr, det_cls)
    th = det_cls(DetectorsConfig()).threshold
    hot = sc.filter(pl.col("score") >= th)
    return set(hot["entity_id"].to_list())


@pytest.fixture(scope="module")
def background() -> Traffic:
    tr = Traffic(seed=3)
    tr.background(days=3, users=40, per_day=2)
    return tr


def _with(background: Traffic) -> Traffic:
    tr = Traffic(seed=5)
    tr.rows = list(background.rows)
    return tr


# ---------------------------------------------------------------- concurrency_abuse
def test_burst_is_flagged_with_its_numbers(background: Traffic) -> None:
    tr = _with(background)
    tc.burst(tr, "burst-1", T0 + timedelta(hours=2), n=40)
    det = ConcurrencyAbuseDetector(DetectorsConfig())
    fs = FeatureSet.build(tr.events(), None, DetectorsConfig())
    det.fit(fs)
    hot = det.decide(det.score(fs))
    assert hot["entity_id"].to_list() == ["burst-1"]
    reasons, ev = det.explain(hot.row(0, named=True))
    assert ev["peak_in_flight"] == 40 and ev["peak_basis"] == "intervals"
    assert ev["tools"] == ["searchItems ×40"]
    assert ev["in_flight_from"] < ev["in_flight_to"] and "window_start" not in ev
    assert "40 calls in flight" in reasons[0]


def test_burst_without_durations_falls_back_to_call_rate(background: Traffic) -> None:
    tr = _with(background)
    tc.burst(tr, "burst-nodur", T0 + timedelta(hours=2), n=30)
    for r in tr.rows:
        if r["session_id"] == "burst-nodur":
            # A log without durations stamps the call when it is made.
            r["ts"] -= timedelta(milliseconds=r["duration_ms"])
            r["duration_ms"] = None
    det = ConcurrencyAbuseDetector(DetectorsConfig())
    fs = FeatureSet.build(tr.events(), None, DetectorsConfig())
    hot = det.fit(fs).decide(det.score(fs))
    assert hot["entity_id"].to_list() == ["burst-nodur"]
    reasons, ev = det.explain(hot.row(0, named=True))
    assert ev["peak_basis"] == "call_rate" and ev["peak_in_flight"] == 30
    assert "no durations" in reasons[0]


def test_modest_parallelism_stays_quiet(background: Traffic) -> None:
    tr = _with(background)
    tc.modest_parallel(tr, "agent-1", T0 + timedelta(hours=2), rounds=10, width=5)
    assert _flagged(tr, ConcurrencyAbuseDetector) == set()


def test_batch_job_with_its_own_parallel_history_stays_quiet(background: Traffic) -> None:
    tr = _with(background)
    for d in range(3):
        tc.batch_job(tr, f"batch-{d}", T0 + timedelta(days=d, hours=1), width=30)
    assert _flagged(tr, ConcurrencyAbuseDetector) == set()
    # ...while the same job's first night alone (no history yet) is unusual.
    tr2 = _with(background)
    tc.batch_job(tr2, "batch-0", T0 + timedelta(hours=1), width=30)
    assert _flagged(tr2, ConcurrencyAbuseDetector) == {"batch-0"}


def test_read_fan_out_is_ordinary_but_parallel_sends_are_not(background: Traffic) -> None:
    """A dashboard loading a dozen panels at once (reads) is ordinary; a dozen sends fired
    together race a rate limiter (seed 004) and count from peak_lo."""
    tr = _with(background)
    at = T0 + timedelta(hours=3)
    for k in range(14):
        tc._call(tr, "dash", at + timedelta(milliseconds=tr.rng.uniform(0, 40)),
                 tr.rng.uniform(800, 1500), "run_query", caller="analyst",
                 args={"panel": k})
        tc._call(tr, "mailer", at + timedelta(milliseconds=tr.rng.uniform(0, 40)),
                 tr.rng.uniform(800, 1500), "sendEmail", caller="agent-m",
                 args={"to": f"u{k}@example.com"})
    assert _flagged(tr, ConcurrencyAbuseDetector) == {"mailer"}


def test_batch_job_far_beyond_its_own_peak_is_flagged(background: Traffic) -> None:
    tr = _with(background)
    for d in range(3):
        tc.batch_job(tr, f"batch-{d}", T0 + timedelta(days=d, hours=1), width=14)
    tc.burst(tr, "batch-burst", T0 + timedelta(days=2, hours=5), n=45, caller="svc-batch")
    assert _flagged(tr, ConcurrencyAbuseDetector) == {"batch-burst"}


def test_parallelism_spread_over_sessions_is_a_caller_alert(background: Traffic) -> None:
    tr = _with(background)
    ids = tc.spread_burst(tr, "sw", T0 + timedelta(hours=2), sessions=10, width=3)
    cfg = DetectorsConfig()
    fs = FeatureSet.build(tr.events(), None, cfg)
    det = ConcurrencyAbuseDetector(cfg).fit(fs)
    hot = det.decide(det.score(fs))
    # No session is busy on its own (3 in flight each): only the caller-wide peak speaks.
    assert hot.select("entity_type", "entity_id").rows() == [("caller_id", "swarm")]
    row = hot.row(0, named=True)
    assert row["window_start"] is not None and row["session_id"] is None
    reasons, ev = det.explain(row)
    assert ev["peak_in_flight"] == 30 and ev["scope"] == "caller"
    assert ev["sessions_in_flight"] == 10 and ev["largest_session_in_flight"] == 3
    assert sorted(row["session_ids"]) == sorted(ids)
    assert ev["in_flight_from"] < ev["in_flight_to"] and "window_start" not in ev
    assert "across 10 sessions" in reasons[0]


def test_caller_workers_in_their_own_history_stay_quiet(background: Traffic) -> None:
    tr = _with(background)
    tc.parallel_workers(tr, "idx", T0 + timedelta(hours=1), nights=4, sessions=6, width=3)
    assert _flagged(tr, ConcurrencyAbuseDetector) == set()
    # ...and the same service far beyond its usual width is flagged.
    tc.spread_burst(tr, "idx-big", T0 + timedelta(days=2, hours=6), sessions=16, width=4,
                    caller="svc-indexer")
    assert _flagged(tr, ConcurrencyAbuseDetector) == {"svc-indexer"}


def test_one_busy_session_is_not_also_a_caller_alert(background: Traffic) -> None:
    """A burst in one session beside the caller's ordinary sessions: the session alert."""
    tr = _with(background)
    tc.burst(tr, "solo", T0 + timedelta(hours=2), n=40, caller="swarm")
    tc.spread_burst(tr, "side", T0 + timedelta(hours=2), sessions=2, width=2, caller="swarm")
    assert _flagged(tr, ConcurrencyAbuseDetector) == {"solo"}


def _mixed_caller(tr: Traffic, caller: str = "u-mix") -> list[str]:
    """Seed 9202's missed caller: modest parallel steps on day 0, a 43-call burst in one
    session on day 1, an ordinary session on day 2, then on day 3 a burst spread over four
    sessions (7 calls each, 28 across the caller). Returns the spread sessions."""
    tc.modest_parallel(tr, "mix-steps", T0 + timedelta(hours=10), width=4, caller=caller)
    tc.burst(tr, "mix-solo", T0 + timedelta(days=1, hours=10), n=43, caller=caller)
    tr.normal_session("mix-plain", T0 + timedelta(days=2, hours=10), caller=caller)
    return tc.spread_burst(tr, "mix-spread", T0 + timedelta(days=3, hours=15), sessions=4,
                           width=7, caller=caller)


def _flagged_with(tr: Traffic, **conc: object) -> set[str]:
    cfg = DetectorsConfig.from_dict({"concurrency_abuse": conc})
    fs = FeatureSet.build(tr.events(), tr.summaries(), cfg)
    det = ConcurrencyAbuseDetector(cfg).fit(fs)
    return set(det.decide(det.score(fs))["entity_id"].to_list())


def test_earlier_session_burst_does_not_excuse_a_spread_burst(background: Traffic) -> None:
    """The caller's own earlier single-session burst (flagged on its own) is not its usual
    caller-wide parallelism: the later burst spread over sessions is a caller alert."""
    tr = _with(background)
    _mixed_caller(tr)
    assert _flagged_with(tr) == {"mix-solo", "u-mix"}
    # Switch off: the burst window counts in the usual peak (median 16 of 4, 43, 1, 28)
    # and the spread burst (28 < 2.5 × 16) is excused, as on seed 9202.
    assert _flagged_with(tr, caller_baseline_skips_bursts=False) == {"mix-solo"}


def test_workers_routine_still_excused_beside_a_session_burst(background: Traffic) -> None:
    """Hard negative: a service's nightly worker sessions (caller-wide parallelism is its
    routine) stay quiet when the same service also had one single-session burst; only
    windows a session's own burst explains leave the baseline."""
    tr = _with(background)
    tc.parallel_workers(tr, "idx", T0 + timedelta(hours=1), nights=4, sessions=6, width=3)
    tc.burst(tr, "idx-solo", T0 + timedelta(days=1, hours=12), n=45, caller="svc-indexer")
    assert _flagged_with(tr) == {"idx-solo"}


def test_caller_peaks_match_brute_force_per_window() -> None:
    """Caller-wide peaks per hop bucket vs brute force over random intervals."""
    import random

    from toolwatch.detectors.concurrency import sweep_peaks

    rng = random.Random(4)
    hop = 1000
    rows = [(rng.randrange(3), s, s + rng.randrange(1, 400))
            for s in (rng.randrange(0, 5000) for _ in range(300))]
    iv = pl.DataFrame({"g": [g for g, _, _ in rows], "s": [s for _, s, _ in rows],
                       "e": [e for _, _, e in rows]})
    got = {(r["g"], r["w"]): r for r in sweep_peaks(iv, "g", hop).iter_rows(named=True)}
    want: dict[tuple[int, int], int] = {}
    for g, s, _ in rows:
        n = sum(1 for gg, a, b in rows if gg == g and a <= s < b)
        k = (g, s // hop * hop)
        want[k] = max(want.get(k, 0), n)
    assert {k: v["peak"] for k, v in got.items()} == want
    for (g, _w), r in got.items():
        assert sum(1 for gg, a, b in rows if gg == g and a <= r["peak_t"] < b) == r["peak"]


# ---------------------------------------------------------------- race_condition
def test_race_in_one_session_is_flagged(background: Traffic) -> None:
    tr = _with(background)
    tc.race(tr, "race-1", T0 + timedelta(hours=3), n=3)
    det = RaceConditionDetector(DetectorsConfig())
    fs = FeatureSet.build(tr.events(), None, DetectorsConfig())
    hot = det.fit(fs).decide(det.score(fs))
    assert hot["entity_id"].to_list() == ["race-1"]
    reasons, ev = det.explain(hot.row(0, named=True))
    assert ev["racing_calls"] == 3 and ev["resource"] == "ord-77"
    listed = ev["overlapping_calls"]
    assert len(listed) == 3 and {c["tool"] for c in listed} == {"applyCoupon"}
    assert ev["max_overlap_ms"] > 100
    assert all(c["outcome"] == "ok" for c in listed)
    assert "ord-77" in reasons[0]


def test_race_across_sessions_of_one_caller_is_an_entity_alert(background: Traffic) -> None:
    tr = _with(background)
    tc.race(tr, "ra", T0 + timedelta(hours=3), "ord-5", n=2, caller="multi",
            sessions=["ra", "rb"])
    sc = _scores(tr, RaceConditionDetector)
    hot = sc.filter(pl.col("score") >= 0.5)
    assert hot.select("entity_type", "entity_id").rows() == [("caller_id", "multi")]
    assert hot["n_sessions"][0] == 2 and hot["window_start"][0] is not None


def test_race_reuses_the_sequence_annotation_with_the_same_result(background: Traffic) -> None:
    """With the sequence detectors' cached annotation the race scores are the same."""
    from toolwatch.detectors.tools import annotated

    tr = _with(background)
    tc.race(tr, "race-1", T0 + timedelta(hours=3), n=3)
    tc.race(tr, "ra", T0 + timedelta(hours=5), "ord-5", n=2, caller="multi",
            sessions=["ra", "rb"])
    tc.sequential_writes(tr, "seq-1", T0 + timedelta(hours=6), n=6)
    cfg = DetectorsConfig()
    plain = FeatureSet.build(tr.events(), None, cfg)
    cached = FeatureSet.build(tr.events(), None, cfg)
    annotated(cached)
    keys = ["entity_type", "entity_id", "window_start"]
    a = RaceConditionDetector(cfg).fit(plain).score(plain).sort(keys)
    b = RaceConditionDetector(cfg).fit(cached).score(cached).sort(keys)
    assert a.equals(b)
    assert a.filter(pl.col("score") >= 0.5)["entity_id"].sort().to_list() == ["multi", "race-1"]


def test_sequential_same_resource_writes_stay_quiet(background: Traffic) -> None:
    tr = _with(background)
    tc.sequential_writes(tr, "seq-1", T0 + timedelta(hours=3), n=6)
    assert _flagged(tr, RaceConditionDetector) == set()


def test_overlapping_reads_stay_quiet(background: Traffic) -> None:
    tr = _with(background)
    tc.overlapping_reads(tr, "reads-1", T0 + timedelta(hours=3), n=6)
    assert _flagged(tr, RaceConditionDetector) == set()


def test_overlapping_writes_to_different_resources_stay_quiet(background: Traffic) -> None:
    tr = _with(background)
    tc.parallel_writes_distinct(tr, "distinct-1", T0 + timedelta(hours=3), n=6)
    assert _flagged(tr, RaceConditionDetector) == set()


def test_touching_intervals_do_not_overlap() -> None:
    """A write sent the moment the previous one returned is sequential, not a race."""
    tr = Traffic(seed=1)
    t = T0
    for _ in range(3):
        tr.call("s", t + timedelta(milliseconds=300), "applyCoupon", duration_ms=300,
                args={"orderId": "o-1"}, resource_key="orderId", resource_id="o-1")
        t += timedelta(milliseconds=300)
    assert _flagged(tr, RaceConditionDetector) == set()


# ---------------------------------------------------------------- columnar vs brute force
intervals_st = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(1, 300)),
    min_size=1, max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(intervals_st, st.sampled_from(["given", "start", "end"]), st.sampled_from([1, 20]))
def test_sweep_matches_brute_force(
    rows: list[tuple[int, int, int]], order: str, spread: int
) -> None:
    # Rows in time order with spread-out starts exercise the no-overlap certificate
    # (sequential groups skip the sort); any other order must give the same peaks.
    rows = [(g, s * spread, d) for g, s, d in rows]
    if order != "given":
        rows.sort(key=lambda r: r[1] + (r[2] if order == "end" else 0))
    iv = pl.DataFrame(
        {"g": [g for g, _, _ in rows], "s": [s for _, s, _ in rows],
         "e": [s + d for _, s, d in rows]},
        schema={"g": pl.Int64, "s": pl.Int64, "e": pl.Int64},
    )
    got = {r["g"]: r for r in sweep_peaks(iv, "g").iter_rows(named=True)}
    for g in {g for g, _, _ in rows}:
        mine = [(s, s + d) for gg, s, d in rows if gg == g]
        # In flight at T: s <= T < e. The peak is reached at some start time.
        counts = {t: sum(1 for a, b in mine if a <= t < b) for t, _ in mine}
        peak = max(counts.values())
        assert got[g]["peak"] == peak
        assert counts[got[g]["peak_t"]] == peak
    # Per time bucket (caller windows): the peak among the calls starting in each bucket.
    hop = 250 * spread
    by_w = {(r["g"], r["w"]): r for r in sweep_peaks(iv, "g", hop).iter_rows(named=True)}
    want: dict[tuple[int, int], int] = {}
    for g, s, _d in rows:
        n = sum(1 for gg, a, d in rows if gg == g and a <= s < a + d)
        want[(g, s // hop * hop)] = max(want.get((g, s // hop * hop), 0), n)
    assert {k: r["peak"] for k, r in by_w.items()} == want
    for (g, _w), r in by_w.items():
        assert sum(1 for gg, a, d in rows if gg == g and a <= r["peak_t"] < a + d) == r["peak"]


@settings(max_examples=150, deadline=None)
@given(intervals_st, st.integers(0, 20))
def test_race_clusters_match_brute_force(rows: list[tuple[int, int, int]], m: int) -> None:
    iv = pl.DataFrame(
        {"g": [g for g, _, _ in rows], "s": [s for _, s, _ in rows],
         "e": [s + d for _, s, d in rows], "k": list(range(len(rows)))},
        schema={"g": pl.Int64, "s": pl.Int64, "e": pl.Int64, "k": pl.Int64},
    )
    out = race_clusters(iv, "g", m)
    cluster = dict(zip(out["k"].to_list(), out["cluster"].to_list(), strict=True))
    # Brute force: union-find over pairs in a group overlapping by more than m, chained
    # in start order (a call joins when it overlaps any earlier call of the chain).
    for g in {g for g, _, _ in rows}:
        mine = sorted(((s, s + d, k) for k, (gg, s, d) in enumerate(rows) if gg == g),
                      key=lambda x: (x[0], cluster[x[2]]))
        for i, (s, _e, k) in enumerate(mine):
            earlier = mine[:i]
            joins = bool(earlier) and max(b for _, b, _ in earlier) - s > m
            if joins:
                assert cluster[k] == cluster[mine[i - 1][2]]
            elif earlier:
                assert cluster[k] != cluster[mine[i - 1][2]]


# ---------------------------------------------------------------- ingest
def _ingest(tmp_path: Path, lines: list[dict], ts_marks: str = "end") -> pl.DataFrame:
    from toolwatch.ingest.pipeline import Pipeline
    from toolwatch.ingest.sources import FileSource

    from toolwatch.config import Config

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.jsonl"
    # stdlib json: writes ints beyond 64 bits and NaN/Infinity as hostile servers do.
    path.write_bytes("".join(json.dumps(x) + "\n" for x in lines).encode())
    cfg = Config()
    cfg.store.data_dir = str(tmp_path / "store")
    cfg.secrets.hmac_key_file = str(tmp_path / "key")
    cfg.ingest.ts_marks = ts_marks
    pipe = Pipeline(cfg, None)
    parts = [pl.from_arrow(pipe.transform(b).events) for b in
             FileSource(str(path), 1 << 20, {}).batches()]
    return pl.concat(parts)  # type: ignore[arg-type]


def _us(df: pl.DataFrame, col: str) -> list[int | None]:
    return df[col].dt.epoch("us").to_list()


def test_ingest_intervals_from_each_shape(tmp_path: Path) -> None:
    base = {"ts": "2026-11-02T10:00:01.000Z", "session_id": "s", "tool": "t"}
    ev = _ingest(tmp_path, [
        {**base, "duration_ms": 200},
        {**base, "latencyMs": "250"},
        {**base, "duration_s": 1.5},
        {**base, "start_time": "2026-11-02T10:00:00.100Z", "end_time": "2026-11-02T10:00:00.400Z"},
        {**base, "startedAt": "2026-11-02T10:00:00.000Z", "elapsed_ms": 50},
        {**base},
    ])
    t = 1_793_613_601_000_000
    assert _us(ev, "end_ts") == [t, t, t, t - 600_000, t - 950_000, None]
    assert _us(ev, "start_ts") == [t - 200_000, t - 250_000, t - 1_500_000, t - 900_000,
                                   t - 1_000_000, None]
    assert ev["duration_ms"].to_list() == [200.0, 250.0, 1500.0, 300.0, 50.0, None]
    ev2 = _ingest(tmp_path / "x", [{**base, "duration_ms": 200}], ts_marks="start")
    assert _us(ev2, "start_ts") == [t] and _us(ev2, "end_ts") == [t + 200_000]


def test_jsonrpc_pairs_give_request_and_response_times(tmp_path: Path) -> None:
    req = {"ts": "2026-11-02T10:00:01.000Z", "session_id": "c", "message": {
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "getDocument", "arguments": {"documentId": "doc-5"}}}}
    resp = {"ts": "2026-11-02T10:00:01.030Z", "session_id": "c", "message": {
        "jsonrpc": "2.0", "id": 7, "result": {"content": [], "isError": False}}}
    ev = _ingest(tmp_path, [req, resp])
    t = 1_793_613_601_000_000
    assert _us(ev, "start_ts") == [t] and _us(ev, "end_ts") == [t + 30_000]


hostile = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
    st.text(max_size=12), st.none(), st.booleans(), st.lists(st.integers(), max_size=2),
)


@pytest.mark.slow  # full detection per example / micro-batch
@settings(max_examples=40, deadline=None)
@given(dur=hostile, start=hostile, end=hostile)
@example(dur=86_400_001, start=None, end=None)  # stored, but too long to place as a call
@example(dur=2**70, start=None, end=None)
def test_hostile_durations_and_times_never_crash_or_run_backwards(
    tmp_path_factory: pytest.TempPathFactory, dur: object, start: object, end: object
) -> None:
    line = {"ts": "2026-11-02T10:00:01.000Z", "session_id": "s", "tool": "t",
            "duration_ms": dur, "start_ts": start, "end_ts": end}
    ev = _ingest(tmp_path_factory.mktemp("h"), [line])
    if ev.height == 0:  # NaN / Infinity literals are not JSON: quarantined, fine
        return
    d = ev["duration_ms"][0]
    # duration_ms keeps up to MAX_STORED_DURATION_MS (a SESSION_END's session length may
    # exceed a day); only a call's start/end interval keeps the 1-day bound.
    assert d is None or 0 <= d <= MAX_STORED_DURATION_MS
    s, e = ev["start_ts"][0], ev["end_ts"][0]
    assert (s is None) == (e is None)
    if s is not None:
        assert s <= e and (e - s) <= timedelta(milliseconds=MAX_DURATION_MS)
    if d is not None and d > MAX_DURATION_MS and start is None and end is None:
        assert s is None  # too long to be a call: not placed in time


# ---------------------------------------------------------------- live
@pytest.mark.slow  # full detection per example / micro-batch
def test_live_intervals_straddling_micro_batches(tmp_path: Path) -> None:
    """A race whose calls arrive in different micro-batches, a burst spread over three,
    and one caller's parallelism spread over six sessions are caught live as in batch."""
    try:
        from tests.test_live_support import config_for, stored_alerts
    except ImportError:
        from test_live_support import config_for, stored_alerts  # type: ignore[no-redef]
    from toolwatch.ingest.sources.file_tail import LineAssembler

    from toolwatch.live import LivePipeline
    from toolwatch.store import Store

    def line(start_ms: float, dur: float, tool: str, session: str, caller: str,
             args: dict) -> bytes:
        t = T0 + timedelta(milliseconds=start_ms + dur)
        return orjson.dumps({
            "ts": t.isoformat().replace("+00:00", "Z"), "session_id": session,
            "caller_id": caller, "server": "shop-server", "tool": tool, "args": args,
            "status": "ok", "duration_ms": dur}) + b"\n"

    data = tmp_path / "store"
    lp = LivePipeline(config_for(data, detect=True), Store(data))
    asm = LineAssembler("feed", {})
    # Race: the first coupon call completes (and is logged) in batch 1, the overlapping
    # second one only in batch 2.
    lp.add(asm.feed(line(0, 400, "applyCoupon", "r-1", "mallory", {"orderId": "o-9"})))
    lp.flush()
    lp.add(asm.feed(line(15, 420, "applyCoupon", "r-1", "mallory", {"orderId": "o-9"})))
    lp.flush()
    # Burst: 36 searches in flight together, logged over three micro-batches.
    burst = [line(5000 + k * 10, 2000, "searchItems", "b-1", "greedy", {"query": f"q{k}"})
             for k in range(36)]
    for part in (burst[:12], burst[12:24], burst[24:]):
        lp.add(asm.feed(b"".join(part)))
        lp.flush()
    # Caller-wide: 6 sessions of one caller with 4 calls in flight each, over two batches.
    spread = [line(9000 + k * 7, 2500, "getDocument", f"sw-{k % 6}", "swarm",
                   {"documentId": f"d-{k}"}) for k in range(24)]
    for part in (spread[::2], spread[1::2]):
        lp.add(asm.feed(b"".join(part)))
        lp.flush()
    lp.close()
    alerts = stored_alerts(data)
    got = {(r["category"], r["session_id"]) for r in alerts.iter_rows(named=True)}
    assert ("race_condition", "r-1") in got
    assert ("concurrency_abuse", "b-1") in got
    race = alerts.filter(pl.col("category") == "race_condition")
    assert orjson.loads(race["evidence"][0])["racing_calls"] == 2
    conc = alerts.filter((pl.col("category") == "concurrency_abuse")
                         & (pl.col("session_id") == "b-1"))
    assert orjson.loads(conc["evidence"][0])["peak_in_flight"] == 36
    wide = alerts.filter((pl.col("category") == "concurrency_abuse")
                         & (pl.col("entity_type") == "caller_id"))
    assert wide["entity_id"].to_list() == ["swarm"]
    ev = orjson.loads(wide["evidence"][0])
    assert ev["peak_in_flight"] == 24 and ev["sessions_in_flight"] == 6
    assert sorted(ev["session_ids"]) == [f"sw-{k}" for k in range(6)]


def test_lost_update_on_session_state_is_a_race(background: Traffic) -> None:
    """Seed 004: increment_usage({amount: 1}) x 8 in flight at once in one session race on
    the session's counter (no business key names it); two tabs of one customer each
    creating a cart at the same moment are two carts."""
    tr = _with(background)
    at = T0 + timedelta(hours=4)
    for k in range(8):
        tc._call(tr, "usage", at + timedelta(milliseconds=3 * k), 120.0, "increment_usage",
                 caller="agent-u", server="billing", args={"amount": 1})
    for sid in ("tab-1", "tab-2"):
        tc._call(tr, sid, at, 90.0, "createCart", caller="shopper", server="shop", args={})
    flagged = _flagged(tr, RaceConditionDetector)
    assert "usage" in flagged and not {"tab-1", "tab-2"} & flagged


def test_a_read_fan_out_over_sessions_counts_from_the_read_threshold(
        background: Traffic) -> None:
    """Issue 26: dashboards opened in four tabs at once put 40 reads in flight across the
    caller; the same spread of writes races quotas (seed 004). As for one session, reads
    count from read_peak_lo's share more: the reads are a low alert, the writes higher."""
    scores = {}
    for tool in ("getDocument", "updateDocument"):
        tr = _with(background)
        t0 = T0 + timedelta(hours=2)
        for k in range(4):
            for j in range(10):
                tr.call(f"tab-{k}", t0 + timedelta(milliseconds=40 * k + j), tool,
                        caller="maria", duration_ms=2_000.0, resource_key="documentId",
                        resource_id=f"doc-{k * 10 + j}")
        sc = _scores(tr, ConcurrencyAbuseDetector).filter(
            (pl.col("entity_type") == "caller_id") & (pl.col("entity_id") == "maria"))
        scores[tool] = sc["score"].max()
    th = ConcurrencyAbuseDetector(DetectorsConfig()).threshold
    assert scores["getDocument"] >= th  # still reported: the shape of a spread read burst
    assert scores["getDocument"] < DetectorsConfig().severity_medium
    assert scores["updateDocument"] > scores["getDocument"]


# ------------------------------------------- attempts, waves over the cap (issue 26)
def _wave_reads(tr: Traffic, sid: str, start: datetime, *, waves: int, width: int,
                fresh: bool, caller: str = "reader-w") -> None:
    """``waves`` rounds of ``width`` parallel reads (1-2 s each), a minute apart; with
    ``fresh`` every call asks for a new order id, else each round re-runs the same panels."""
    for w in range(waves):
        t = start + timedelta(minutes=w)
        for k in range(width):
            what = f"order-{w * width + k}" if fresh else f"panel-{k}"
            dur = tr.rng.uniform(1000, 2000)
            tr.call(sid, t + timedelta(milliseconds=tr.rng.uniform(0, 200) + dur), "runQuery",
                    caller=caller, args={"sql": f"SELECT * FROM {what}"}, duration_ms=dur)


def test_waves_over_the_seed_cap_on_new_arguments_are_flagged(background: Traffic) -> None:
    """Seed 004's cap is 10 in flight per caller: a client going over it again and again,
    each wave on new ids, is flagged although it reads and never reaches peak_lo; a
    dashboard re-running the same 12 panels as often, or one load of 12, stays quiet."""
    tr = _with(background)
    at = T0 + timedelta(hours=3)
    _wave_reads(tr, "waves-new", at, waves=4, width=11, fresh=True)
    _wave_reads(tr, "dash-refresh", at + timedelta(hours=1), waves=4, width=12, fresh=False,
                caller="dash")
    _wave_reads(tr, "dash-once", at + timedelta(hours=2), waves=1, width=13, fresh=True,
                caller="dash2")
    assert _flagged(tr, ConcurrencyAbuseDetector) == {"waves-new"}
    det = ConcurrencyAbuseDetector(DetectorsConfig())
    fs = FeatureSet.build(tr.events(), None, DetectorsConfig())
    hot = det.fit(fs).decide(det.score(fs))
    reasons, ev = det.explain(hot.row(0, named=True))
    assert ev["waves_over_cap"] == 4 and "4 separate times" in " ".join(reasons)


def test_refused_burst_is_reported_as_a_lower_severity_attempt(background: Traffic) -> None:
    """Attempts count: 30 calls fired at once and refused by the semaphore (each refusal a
    few ms long) are an attempt, below the same burst served; the reason says so."""
    tr = _with(background)
    at = T0 + timedelta(hours=2)
    for k in range(30):
        tr.call("refused-all", at + timedelta(milliseconds=tr.rng.uniform(0, 300) + 5),
                "searchItems", caller="greedy", args={"query": f"q{k}"},
                status="rate_limited", duration_ms=5)
    tc.burst(tr, "served", at + timedelta(hours=1), n=30, caller="greedy2")
    det = ConcurrencyAbuseDetector(DetectorsConfig())
    fs = FeatureSet.build(tr.events(), None, DetectorsConfig())
    sc = det.fit(fs).score(fs)
    hot = det.decide(sc)
    assert set(hot["entity_id"].to_list()) == {"refused-all", "served"}
    by = {r["entity_id"]: r for r in hot.iter_rows(named=True)}
    assert by["refused-all"]["score"] < by["served"]["score"]
    assert by["refused-all"]["score"] <= det.settings.attempt_score
    reasons, ev = det.explain(by["refused-all"])
    assert ev["refused_calls"] == 30 and ev["served_peak"] == 0
    assert "refused" in " ".join(reasons)


def test_lost_update_burst_is_both_a_race_and_a_concurrency_finding(
        background: Traffic) -> None:
    """Seed 004 §2: a session firing 16 increment_usage({amount: 1}) at once races on its
    own usage counter (race_condition) *and* keeps 16 writes in flight (concurrency_abuse,
    where the seed files it): the race's higher score must not fold the other away."""
    from toolwatch import detectors

    tr = _with(background)
    at = T0 + timedelta(hours=2)
    for _ in range(16):
        dur = tr.rng.uniform(400, 800)
        tr.call("usage-race", at + timedelta(milliseconds=tr.rng.uniform(0, 60) + dur),
                "increment_usage", caller="counter", args={"amount": 1}, duration_ms=dur)
    res = detectors.detect(tr.events(), None, DetectorsConfig())
    cats = set(res.alerts.filter(pl.col("session_id") == "usage-race")["category"].to_list())
    assert {"race_condition", "concurrency_abuse"} <= cats
