"""The detection engine over a stream (detectors/stream.py): parity with batch, news only.

:class:`StreamDetector` is what every live command runs (toolwatch.live.detection calls
its steps); these tests feed it directly, in micro-batches, and compare with what batch
``analyze`` raises on the same events.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.stream import (
    AlertTracker,
    DetectionWindow,
    StreamDetector,
    engine_detector,
)

from toolwatch.analyze import analyze_paths, load_events
from toolwatch.config import load_config
from toolwatch.store import Store

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "sample_logs" / "demo"
#: Columns that say which alert it is: equal ids must mean equal categories and entities.
WHO = ["alert_id", "category", "entity_type", "entity_id", "first_seen", "last_seen"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, DetectorsConfig, Path]:
    """The demo logs through batch ``analyze``: its alerts, and the events it stored."""
    cfg = load_config(DEMO / "toolwatch.toml")
    cfg.store.data_dir = str(tmp_path_factory.mktemp("demo") / "store")
    alerts = analyze_paths(cfg, sorted(str(p) for p in DEMO.glob("*.jsonl*")),
                           progress=False).alerts
    ev, su = load_events(Store(cfg.data_dir), None)
    return ev, su, alerts, DetectorsConfig.from_dict(cfg.detectors), cfg.data_dir


def _stream(ev: pl.DataFrame, su: pl.DataFrame, engine: StreamDetector, n: int,
            history: pl.DataFrame | None) -> pl.DataFrame:
    """Every alert version the engine emits over ``ev`` fed ``n`` events at a time (in
    log-time order), each micro-batch with the summaries of its time span."""
    out = []
    for i in range(0, ev.height, n):
        part = ev.slice(i, n)
        span = pl.col("ts") >= part["ts"].min()
        if i + n < ev.height:
            span = span & (pl.col("ts") <= part["ts"].max())
        out.append(engine.update(part, su.filter(span), history=history))
    return pl.concat(out)


@pytest.mark.slow  # the demo analyzed, then streamed twice, ~25 s
@pytest.mark.parametrize("baselines", ["all events", "window only"])
def test_stream_raises_every_batch_alert(demo: tuple, baselines: str) -> None:
    """The demo through batch ``analyze`` and through the streaming engine in micro-batches
    of 2,000 events: the stream raises every batch alert, and its latest version of each
    is the same alert (category, entity, window). With the baselines batch had (all the
    events as history, as ``live.history_events`` over a store gives) the stream raises
    beyond batch only on sessions; with the window's events alone it may alert earlier
    (a caller seen before its baseline exists) but misses none."""
    ev, su, batch, dcfg, data_dir = demo
    assert batch.height >= 50 and batch["alert_id"].is_unique().all()
    engine = StreamDetector(engine_detector(dcfg, data_dir=data_dir),
                            DetectionWindow(1e7, 1e7, 0.0, 10**7), AlertTracker())
    emitted = _stream(ev, su, engine, 2_000, ev if baselines == "all events" else None)
    latest = emitted.unique("alert_id", keep="last", maintain_order=True)
    got = batch.select(WHO).join(latest.select(WHO), on="alert_id", how="left",
                                 suffix="_stream")
    for c in WHO[1:]:
        assert (got[c] == got[f"{c}_stream"]).fill_null(False).all(), c  # missing: fails
    extra = latest.filter(~pl.col("alert_id").is_in(batch["alert_id"].implode()))
    if baselines == "all events":
        assert set(extra["entity_type"]) <= {"session"}
    # Nothing is emitted twice unchanged: each version differs from the one before it.
    assert emitted.select(WHO[0], "score", "evidence").is_unique().all()


def _rules(events: pl.DataFrame, summaries: pl.DataFrame | None,
           history: pl.DataFrame | None = None) -> pl.DataFrame:
    """A toy detector: one alert per caller with 3+ events, one per client address."""
    from toolwatch.detectors.alerts import alert_id

    rows = []
    for etype, col in (("caller_id", "caller_id"), ("client_ip", "client_ip")):
        g = events.group_by(col).agg(pl.len().alias("n"), pl.col("ts").min().alias("a"),
                                     pl.col("ts").max().alias("b"))
        for r in g.filter(pl.col("n") >= 3).iter_rows(named=True):
            rows.append({"alert_id": alert_id(etype, r[col], "enumeration", None),
                         "category": "enumeration", "entity_type": etype,
                         "entity_id": r[col], "score": float(r["n"]), "severity": "high",
                         "first_seen": r["a"], "last_seen": r["b"], "evidence": "{}",
                         "reasons": [f"{r['n']} calls"]})
    return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"alert_id": pl.String})


def _events(caller: str, ip: str, t0: datetime, n: int) -> pl.DataFrame:
    return pl.DataFrame({
        "event_id": [f"{caller}-{t0:%H%M}-{k}" for k in range(n)],
        "ts": [t0 + timedelta(seconds=k) for k in range(n)],
        "session_id": [f"s-{caller}"] * n, "caller_id": [caller] * n, "client_ip": [ip] * n,
    }, schema={"event_id": pl.String, "ts": pl.Datetime("us", "UTC"),
               "session_id": pl.String, "caller_id": pl.String, "client_ip": pl.String})


def test_update_emits_news_of_touched_entities_only() -> None:
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    engine = StreamDetector(_rules, DetectionWindow(60, 30, 0.0, 1000,
                                                    columns=_events("a", "x", t0, 1).columns),
                            AlertTracker())
    first = engine.update(_events("alice", "10.0.0.1", t0, 3))
    assert sorted(first["entity_id"]) == ["10.0.0.1", "alice"]
    # bob shares alice's address: the address alert changes (more events, later
    # last_seen), bob's is new, alice's (untouched, unchanged) is not emitted again.
    again = engine.update(_events("bob", "10.0.0.1", t0 + timedelta(minutes=1), 3))
    assert sorted(again["entity_id"]) == ["10.0.0.1", "bob"]
    assert again.filter(pl.col("entity_id") == "10.0.0.1")["score"].to_list() == [6.0]
    # Below every threshold: nothing.
    assert engine.update(_events("dave", "10.0.0.9", t0 + timedelta(minutes=2), 2)
                         ).height == 0
    touched = engine.add(_events("carol", "10.0.0.2", t0 + timedelta(minutes=2), 3),
                         pl.DataFrame())
    assert touched is not None
    news = engine.news(_rules(*engine.window.select(touched)), touched)
    assert news[1:] == (2, 0, 0)  # new, updated, repeats
    assert engine.news(_rules(*engine.window.select(touched)), touched)[1:] == (0, 0, 2)
    # An entity the micro-batch did not touch was read in part (the touched caller's
    # share of an address): its alert is left out, whatever it says.
    zed = engine.news(_rules(_events("zed", "10.0.0.1", t0, 5), None),
                      {"caller_id": pl.Series(["zed"])})
    assert zed[0]["entity_id"].to_list() == ["zed"]


def test_score_in_passes_keeps_every_caller_whole() -> None:
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    ev = pl.concat([_events(f"u{k}", f"10.0.0.{k}", t0 + timedelta(minutes=k), 4)
                    for k in range(8)])
    engine = StreamDetector(_rules, DetectionWindow(60, 30, 0.0, 1000, columns=ev.columns),
                            AlertTracker())
    whole = engine.score(ev, ev.clear())
    parts = engine.score(ev, ev.clear(), passes=3)
    assert whole is not None and parts is not None
    assert sorted(parts.rows()) == sorted(whole.rows())
    # update() splits the same way once a pass would hold more than pass_cap events.
    assert engine.update(ev, pass_cap=10).sort("alert_id").rows() == whole.sort(
        "alert_id").rows()
