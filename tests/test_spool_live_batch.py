"""Live means the same as batch: suppressions apply in live mode; the forest is fitted once.

Real detectors, real store, real ``tail`` loop (the code path ``run``'s collector and
``kafka`` share: ``LivePipeline`` with :func:`toolwatch.live.default_detector`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

try:
    from tests.test_live_support import call_line, config_for, stored_alerts
except ImportError:  # tests/ itself on sys.path
    from test_live_support import call_line, config_for, stored_alerts  # type: ignore[no-redef]

from toolwatch.live import StopFlag
from toolwatch.live_cli import tail_files

pytestmark = pytest.mark.timeout(180)


def _log(path: Path) -> None:
    """Three callers enumerate document ids (most not found); a few benign sessions."""
    lines = []
    i = 0
    for caller in ("mallory", "eve", "bob"):
        for k in range(60):
            lines.append(call_line(i, session=f"s-{caller}", caller=caller, ip=f"10.0.{i % 3}.9",
                                   resource=f"{caller}-{k}", status="not_found",
                                   seconds=0.5))
            i += 1
    for s in range(12):
        for k in range(5):
            lines.append(call_line(i, session=f"benign-{s}", caller=f"user{s}",
                                   ip="10.1.0.1", resource=f"doc-{k}", seconds=0.5))
            i += 1
    path.write_bytes(b"".join(lines))


def _run_tail(tmp_path: Path, name: str, *, suppress_config: bool, triage: bool) -> set[str]:
    data = tmp_path / name / "store"
    data.mkdir(parents=True)
    log = tmp_path / name / "calls.jsonl"
    _log(log)
    cfg = config_for(data, detect=True, flush_interval_s=0.2)
    if suppress_config:
        cfg.detectors = {"suppress": {"callers": ["eve"]}}
    if triage:
        from toolwatch.detectors.suppress import add_suppression

        add_suppression(data, entity_type="caller_id", entity_id="mallory",
                        created_by="analyst", note="pen test")
    tail_files(cfg, [str(log)], stop=StopFlag(), idle_exit_s=1.0)
    al = stored_alerts(data)
    return set(al["caller_id"].drop_nulls().to_list()) | set(
        al.filter(al["entity_type"] == "caller_id")["entity_id"].to_list()
    )


def test_suppressions_apply_in_live_mode_as_in_batch(tmp_path: Path) -> None:
    plain = _run_tail(tmp_path, "plain", suppress_config=False, triage=False)
    assert {"mallory", "eve", "bob"} <= plain  # the control: all three alert
    suppressed = _run_tail(tmp_path, "suppressed", suppress_config=True, triage=True)
    assert "bob" in suppressed
    assert "eve" not in suppressed  # [detectors.suppress] callers
    assert "mallory" not in suppressed  # a triage suppression (dashboard)


@pytest.mark.slow  # a live process fitting the forest
def test_forest_is_fitted_once_per_live_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolwatch.detectors.forest import IsolationForestDetector

    counts = {"fit": 0, "load": 0, "fitted": 0}
    real_fit, real_load = IsolationForestDetector.fit, IsolationForestDetector.load

    def fit(self, history, **kw):  # type: ignore[no-untyped-def]
        counts["fit"] += 1
        out = real_fit(self, history, **kw)  # live: isolated=True (a child process)
        counts["fitted"] += bool(self.model_fitted)
        return out

    def load(self, path, **kw):  # type: ignore[no-untyped-def]
        counts["load"] += 1
        return real_load(self, path, **kw)

    monkeypatch.setattr(IsolationForestDetector, "fit", fit)
    monkeypatch.setattr(IsolationForestDetector, "load", load)
    from toolwatch.ingest.sources.file_tail import LineAssembler

    from toolwatch.live import LivePipeline
    from toolwatch.store import Store

    data = tmp_path / "store"
    data.mkdir()
    log = tmp_path / "calls.jsonl"
    _log(log)
    cfg = config_for(data, detect=True)
    cfg.detectors = {"anomaly": {"min_train_sessions": 5}}  # fit early
    store = Store(data)
    lp = LivePipeline(cfg, store, kind="tail", name="test")
    asm = LineAssembler("calls", None)
    lines = log.read_bytes().splitlines(keepends=True)
    flushes = 0
    for k in range(0, len(lines), 20):  # 12 micro-batches, each detected and committed
        batch = asm.feed(b"".join(lines[k : k + 20]))
        assert batch is not None
        lp.add(batch)
        res = lp.flush()
        flushes += bool(res.events)
    lp.close()
    store.close()
    assert flushes >= 10
    assert counts["load"] == 0
    # Fitted once; tried again only while too few sessions had been seen to fit it.
    assert counts["fitted"] == 1, counts
