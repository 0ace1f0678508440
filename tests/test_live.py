"""LivePipeline: incremental detection, bounded state, out-of-order, restart, sinks,
metrics, and batch/live consistency with the real detectors."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import ClassVar

import numpy as np
import orjson
import pytest
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.file_tail import LineAssembler

from toolwatch.live import LiveConfig, LivePipeline, SinkConfig, StatusPublisher, prometheus_text
from toolwatch.live.sinks import build_sinks, slack_payload
from toolwatch.live_cli import tail_files
from toolwatch.store import Store

try:
    from tests.test_live_support import (
        T0,
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_count,
    )
except ImportError:  # tests/ itself on sys.path
    from test_live_support import (  # type: ignore[no-redef]
        T0,
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_count,
    )

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[1]


class Feeder:
    """Feed lines to a LivePipeline as one growing stream."""

    def __init__(self, name: str = "feed"):
        self.asm = LineAssembler(name, {})

    def batch(self, data: bytes) -> RawBatch:
        b = self.asm.feed(data)
        assert b is not None
        return b


def pipeline(tmp_path: Path, **live: object) -> tuple[LivePipeline, Path]:
    data = tmp_path / "store"
    cfg = config_for(data, detect=True, **live)
    store = Store(data)
    return LivePipeline(cfg, store, detector=enum_detector(5)), data


def nf(i: int, **kw: object) -> bytes:
    return call_line(i, resource=f"r{i}", status="not_found", **kw)  # type: ignore[arg-type]


def test_alert_raised_when_threshold_crossed_then_updated_not_duplicated(tmp_path: Path) -> None:
    lp, data = pipeline(tmp_path)
    f = Feeder()
    lp.add(f.batch(b"".join(nf(i) for i in range(4))))
    res = lp.flush()
    assert res.alerts is None  # 4 < threshold: no alert yet, evidence kept in the window
    lp.add(f.batch(nf(4)))
    res = lp.flush()
    assert res.alerts is not None and res.alerts.height == 1  # crossed at the 5th event
    aid = res.alerts["alert_id"][0]
    lp.add(f.batch(b"".join(nf(i) for i in range(5, 9))))
    res = lp.flush()
    assert res.alerts is not None and res.alerts["alert_id"].to_list() == [aid]
    assert orjson.loads(res.alerts["evidence"][0])["distinct_not_found"] == 9
    lp.add(f.batch(call_line(9, status="ok")))  # touches the session, no new evidence
    assert lp.flush().alerts is None
    assert lp.status.alerts_new == 1 and lp.status.alerts_updated == 1
    lp.close()
    assert stored_alerts(data, latest=False).height == 2  # two versions stored
    latest = stored_alerts(data)
    assert latest.height == 1 and "9 distinct" in latest["reasons"][0][0]


@pytest.mark.slow  # waits out session expiry
def test_idle_sessions_expire_and_window_stays_bounded(tmp_path: Path) -> None:
    lp, _ = pipeline(tmp_path, session_idle_minutes=1.0, window_minutes=2.0,
                     out_of_order_tolerance_s=0.0)
    f = Feeder()
    sizes = []
    for s in range(60):  # 60 sessions of 20 events, one after another (5 min apart)
        t0 = T0 + timedelta(minutes=5 * s)
        data = b"".join(
            call_line(i, session=f"s-{s}", caller=f"c-{s}", ts=t0 + timedelta(seconds=i))
            for i in range(20)
        )
        lp.add(f.batch(data))
        lp.flush()
        lp.window.expire()
        sizes.append(lp.window.size)
    assert max(sizes) <= 40  # the current session (+ at most one more), never all 1200
    assert lp.window.active_sessions() == 1
    assert len(lp.window.session_last) <= 2
    assert lp.window.evicted >= 1100
    lp.close()


def test_hard_cap_on_window_events(tmp_path: Path) -> None:
    lp, _ = pipeline(tmp_path, max_window_events=500)
    f = Feeder()
    for k in range(5):
        lp.add(f.batch(b"".join(call_line(k * 300 + i, session=f"s{k}") for i in range(300))))
        lp.flush()
    assert lp.window.size <= 500
    assert lp.status.events_stored == 1500  # the cap bounds detection state, not storage
    lp.close()


def slow_enum_detector(delay_s: float) -> object:
    """enum_detector(5) that takes ``delay_s`` per call (keeps the commit thread busy)."""
    inner = enum_detector(5)

    def run(events: object, summaries: object, history: object = None) -> object:
        time.sleep(delay_s)
        return inner(events, summaries, history=history)

    return run


def test_overlapped_commits_are_in_order_and_coalesce_under_backlog(tmp_path: Path) -> None:
    """flush(wait=False): micro-batches queued while the commit thread detects are
    committed in order, the backlog ones together (one detection), every event once,
    the checkpoint at the end, one alert version per detection."""
    data = tmp_path / "store"
    # backlog_detect_events=1: every commit detects (deferral: test_memory_bounds.py)
    cfg = config_for(data, detect=True, flush_events=10, backlog_detect_interval_s=0.3,
                     backlog_detect_events=1)
    lp = LivePipeline(cfg, Store(data), detector=slow_enum_detector(0.3))
    f = Feeder()
    commits: list[int] = []
    lp.on_commit.append(lambda r: commits.append(r.events))
    for k in range(6):  # size-triggered flushes: a backlog
        lp.add(f.batch(b"".join(nf(k * 10 + i) for i in range(10))))
        assert lp.due()
        res = lp.flush(wait=False)
        assert res.events == 10 and res.stored == 0  # queued, not yet committed
    lp.drain()
    assert sum(commits) == 60 and len(commits) < 6  # coalesced: fewer detections
    assert Store(data).checkpoints()[f.asm.fp] == f.asm.offset
    lp.close()
    assert stored_count(data) == 60
    versions = stored_alerts(data, latest=False)
    assert versions["alert_id"].n_unique() == 1 and versions.height == len(commits)
    assert orjson.loads(stored_alerts(data)["evidence"][0])["distinct_not_found"] == 60


def test_a_failed_commit_stops_everything_after_it(tmp_path: Path) -> None:
    """A commit that fails on the commit thread is re-raised on the caller's thread and
    nothing queued after it is committed: the checkpoint never skips data."""
    from toolwatch.errors import StoreError

    data = tmp_path / "store"
    cfg = config_for(data, detect=True, flush_events=10)
    store = Store(data)
    lp = LivePipeline(cfg, store, detector=slow_enum_detector(0.05))
    real = store.write_batch
    calls = [0]

    def flaky(*a: object, **kw: object) -> str:
        calls[0] += 1
        if calls[0] >= 2:
            raise StoreError("disk full")
        return real(*a, **kw)  # type: ignore[arg-type]

    store.write_batch = flaky  # type: ignore[method-assign]
    f = Feeder()
    lp.add(f.batch(b"".join(nf(i) for i in range(10))))
    lp.flush(wait=False)
    lp.drain()
    first = Store(data).checkpoints()[f.asm.fp]
    with pytest.raises(StoreError):
        for k in range(1, 20):  # the failure surfaces at a later flush, due() or drain()
            lp.add(f.batch(b"".join(nf(k * 10 + i) for i in range(10))))
            if lp.due():
                lp.flush(wait=False)
            time.sleep(0.05)
        lp.drain()
    with pytest.raises(StoreError):
        lp.drain()  # and stays raised
    lp._stop_worker()
    assert Store(data).checkpoints()[f.asm.fp] == first
    assert stored_count(data) == 10


def test_the_next_detection_runs_while_a_batch_is_stored(tmp_path: Path) -> None:
    """flush(wait=False): once a micro-batch is detected, the next one is detected while
    the first is committed (store thread); commits stay one at a time and in order, and
    a batch's alerts reach the sinks only after its own commit."""
    data = tmp_path / "store"
    cfg = config_for(data, detect=True, flush_events=10, flush_interval_s=0.05)
    store = Store(data)
    log: list[tuple[str, int, float]] = []  # (what, batch events, time)
    inner = enum_detector(5)

    def detect(events: object, summaries: object, history: object = None) -> object:
        log.append(("detect", 0, time.monotonic()))
        return inner(events, summaries, history=history)

    real = store.write_batch

    def slow_write(tables: dict, *a: object, **kw: object) -> int:
        n = tables["events"].num_rows
        log.append(("write", n, time.monotonic()))
        time.sleep(1.0)  # long enough for the next detection to start on a loaded machine
        try:
            return real(tables, *a, **kw)  # type: ignore[arg-type]
        finally:
            log.append(("written", n, time.monotonic()))

    store.write_batch = slow_write  # type: ignore[method-assign]
    lp = LivePipeline(cfg, store, detector=detect)
    emitted: list[tuple[int, float]] = []
    lp.on_commit.append(lambda r: emitted.append((r.events, time.monotonic())))
    f = Feeder()
    lp.add(f.batch(b"".join(nf(i) for i in range(10))))
    lp.flush(wait=False)
    deadline = time.monotonic() + 10
    while not any(w == "write" for w, _, _ in log) and time.monotonic() < deadline:
        time.sleep(0.01)
    lp.add(f.batch(b"".join(nf(i) for i in range(10, 17))))
    time.sleep(0.1)  # the interval elapses: due unless the commit thread is busy
    assert lp.due(), "the commit thread is free once the first batch is detected"
    lp.flush(wait=False)
    lp.drain()
    lp.close()
    when = {(w, n): t for w, n, t in log if w != "detect"}
    # The second batch's detection ran while the first batch was being written...
    assert any(when[("write", 10)] < t < when[("written", 10)]
               for w, _, t in log if w == "detect"), log
    # ...the second write only after the first, and each batch's hooks after its commit.
    assert when[("written", 10)] <= when[("write", 7)]
    assert [n for n, _ in emitted][:2] == [10, 7]
    assert emitted[0][1] >= when[("written", 10)] and emitted[1][1] >= when[("written", 7)]
    assert stored_count(data) == 17
    assert Store(data).checkpoints()[f.asm.fp] == f.asm.offset


def test_out_of_order_events_within_tolerance(tmp_path: Path) -> None:
    order = np.random.default_rng(3).permutation(12)
    lp, data = pipeline(tmp_path, out_of_order_tolerance_s=60.0)
    f = Feeder()
    for chunk in np.array_split(order, 4):
        lp.add(f.batch(b"".join(nf(int(i)) for i in chunk)))
        lp.flush()
    assert lp.status.late_events == 0  # shuffled within 12 s: all on time
    al = stored_alerts(data)
    assert al.height == 1
    assert orjson.loads(al["evidence"][0])["distinct_not_found"] == 12
    # first/last seen are in log time order whatever the arrival order
    assert al["first_seen"][0] == T0 and al["last_seen"][0] == T0 + timedelta(seconds=11)
    # An event far older than the tolerance is still stored and counted as late.
    lp.add(f.batch(nf(100, ts=T0 - timedelta(hours=2), session="old")))
    lp.flush()
    assert lp.status.late_events == 1
    lp.close()
    assert stored_count(data) == 13


def test_restart_warms_up_and_does_not_reemit(tmp_path: Path) -> None:
    data = tmp_path / "store"
    log = tmp_path / "app.log"
    log.write_bytes(b"".join(nf(i) for i in range(3)))
    out = tmp_path / "alerts.jsonl"
    cfg = config_for(data, detect=True)

    def run() -> LivePipeline:
        sinks = build_sinks([SinkConfig(type="file", path=str(out))])
        return tail_files(cfg, [str(log)], sinks=sinks, detector=enum_detector(5),
                          idle_exit_s=0.5)

    run()
    assert not out.exists()  # 3 < 5
    with open(log, "ab") as fh:  # evidence continues after the restart
        fh.write(b"".join(nf(i) for i in range(3, 6)))
    lp = run()
    assert lp.window.size == 6  # 3 reloaded from the store + 3 new
    emitted = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(emitted) == 1 and emitted[0]["evidence"]["distinct_not_found"] == 6
    run()  # nothing new: the stored alert is known, not emitted again
    assert len(out.read_bytes().splitlines()) == 1
    assert stored_count(data) == 6


class _Hook(http.server.BaseHTTPRequestHandler):
    fail_first = 2
    received: ClassVar[list[dict]] = []
    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls <= type(self).fail_first:
            self.send_response(503)
            self.end_headers()
            return
        type(self).received.append(orjson.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        return


def test_webhook_retries_with_backoff_and_failing_sinks_never_stop_ingestion(
    tmp_path: Path,
) -> None:
    _Hook.received, _Hook.calls, _Hook.fail_first = [], 0, 2
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    try:
        data = tmp_path / "store"
        cfg = config_for(data, detect=True)
        (tmp_path / "no").write_text("a file where a directory is needed")
        sinks = build_sinks([
            # notify="alerts": every alert version (incident messages: tests/test_notify*.py)
            SinkConfig(type="webhook", url=url, slack=True, retries=3, backoff_s=0.05,
                       notify="alerts"),
            SinkConfig(type="webhook", url="http://127.0.0.1:9/dead", retries=1,
                       backoff_s=0.01, timeout_s=0.5, notify="alerts"),  # nothing listens
            SinkConfig(type="file", path=str(tmp_path / "no" / "such" / "dir" / "x.jsonl")),
        ])
        lp = LivePipeline(cfg, Store(data), sinks=sinks, detector=enum_detector(5))
        f = Feeder()
        lp.add(f.batch(b"".join(nf(i) for i in range(6))))
        lp.flush()
        lp.add(f.batch(b"".join(nf(i) for i in range(6, 8))))
        lp.flush()
        lp.close()
    finally:
        srv.shutdown()
    assert _Hook.calls == 4  # 2 failures retried, then both versions delivered
    assert len(_Hook.received) == 2
    assert all(set(m) == {"text", "alert_id"} for m in _Hook.received)
    assert "enumeration" in _Hook.received[0]["text"]
    c = sinks.counters()
    assert c["webhook[0]"]["sent"] == 2 and c["webhook[0]"]["retried"] == 2
    assert c["webhook[1]"]["failed"] == 2
    assert c["file[2]"]["failed"] == 2
    assert stored_count(data) == 8 and stored_alerts(data).height == 1  # the store has it


def test_slack_payload_escapes_log_values() -> None:
    msg = slack_payload({"severity": "high", "category": "enumeration",
                         "entity_type": "caller_id", "entity_id": "<!channel> & <x|y>",
                         "score": 0.9, "reasons": ["a <b>"]})
    assert "<!channel>" not in msg["text"] and "&lt;!channel&gt; &amp;" in msg["text"]


def test_status_file_and_prometheus_metrics(tmp_path: Path) -> None:
    lp, data = pipeline(tmp_path)
    pub = StatusPublisher(lp.status, data, metrics_port=0)
    try:
        f = Feeder()
        lp.add(f.batch(b"".join(nf(i) for i in range(6)) + b"not json\n"))
        lp.flush()
        pub.write()
        body = urllib.request.urlopen(
            f"http://127.0.0.1:{pub.metrics_port}/metrics", timeout=5
        ).read().decode()
    finally:
        pub.close()
        lp.close()
    assert 'toolwatch_events_stored_total{kind="tail",name=""} 6' in body
    assert 'toolwatch_quarantined_total{kind="tail",name=""} 1' in body
    assert 'toolwatch_alerts_new_total{kind="tail",name=""} 1' in body
    assert "toolwatch_active_sessions" in body
    assert prometheus_text(lp.status).count("# TYPE") >= 10


def test_live_config_rejects_unknown_keys_and_bad_sinks(tmp_path: Path) -> None:
    from toolwatch.errors import ConfigError

    cfg = config_for(tmp_path / "s")
    cfg.live["flush_intervall_s"] = 1
    with pytest.raises(ConfigError, match="flush_intervall_s"):
        LiveConfig.from_config(cfg)
    cfg = config_for(tmp_path / "s", sinks=[{"type": "pager"}])
    with pytest.raises(ConfigError, match="unknown sink type"):
        LiveConfig.from_config(cfg)
    cfg = config_for(tmp_path / "s", sinks=[{"type": "webhook", "url": "http://x", "slack": True}])
    assert LiveConfig.from_config(cfg).sinks[0].slack is True


@pytest.mark.slow  # batch vs live over generated traffic, ~13 s
def test_batch_and_live_raise_the_same_alerts(tmp_path: Path) -> None:
    """The demo logs through ``analyze`` and through ``tail`` in small micro-batches give
    the same (entity, category) alerts, once live has the baselines batch had. Without
    them live may alert *earlier* (a caller's first nightly export, before it has a
    baseline) but never misses a batch alert."""
    from toolwatch.analyze import analyze_paths

    demo = ROOT / "sample_logs" / "demo"
    files = [str(demo / n) for n in ("crm-server.jsonl", "docs-server.jsonl",
                                     "proxy-transcript.jsonl", "summaries.jsonl")]
    cfg_b = config_for(tmp_path / "batch")
    batch = analyze_paths(cfg_b, files, progress=False).alerts
    assert batch.height >= 5
    want = set(batch.select("entity_type", "entity_id", "category").iter_rows())

    def live(name: str, **extra: object) -> set[tuple]:
        cfg = config_for(tmp_path / name, detect=True, flush_events=300, read_bytes=32_768,
                         **extra)
        out = tmp_path / f"{name}.jsonl"
        sinks = build_sinks([SinkConfig(type="file", path=str(out))])
        lp = tail_files(cfg, files, sinks=sinks, idle_exit_s=0.5)
        assert lp.status.flushes >= 5  # really incremental (micro-batches grow under backlog)
        rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        assert len({r["alert_id"] for r in rows}) == len(
            {(r["entity_type"], r["entity_id"], r["category"]) for r in rows})
        return {(r["entity_type"], r["entity_id"], r["category"]) for r in rows}

    assert live("live-hist", history_dir=str(tmp_path / "batch")) == want
    assert want <= live("live-cold")
