"""Adding a component is one module plus one registry line.

Each test writes a toy component into a temporary module (no file of the project is
touched), registers it with the one line the registry's docstring asks for
(``monkeypatch.setitem`` stands for that line), and runs it the way a user's config
would, through the real config parsing and the real pipeline.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import orjson
import pytest
from test_live import Feeder, nf
from test_live_support import config_for, enum_detector, stored_alerts, stored_count
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.registry import REGISTRY
from toolwatch.ingest.sources.registry import LIVE_SOURCES, live_source
from typer.testing import CliRunner

from toolwatch.cli import app
from toolwatch.errors import ConfigError
from toolwatch.live import LiveConfig
from toolwatch.live.driver import drive
from toolwatch.live.pipeline import LivePipeline
from toolwatch.live.sinks import SINKS, build_sinks
from toolwatch.store import Store

TOY_SINK = '''
from pathlib import Path
from toolwatch.live.sinks import Sink, alert_json


class ToySink(Sink):
    """Writes each alert's id and category, one per line."""

    name = "toy"
    requires = ("path",)

    def send(self, row):
        with open(Path(self.config.path), "a") as fh:
            fh.write(f"{row['alert_id']} {row['category']}\\n")
'''


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str):
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


def test_a_toy_sink_is_one_module_plus_one_registry_line(tmp_path, monkeypatch) -> None:
    mod = _module(tmp_path, monkeypatch, "toy_sink_mod", TOY_SINK)
    out = tmp_path / "toy.txt"
    cfg = config_for(tmp_path / "store", detect=True,
                     sinks=[{"type": "toy", "path": str(out), "notify": "alerts"}])
    with pytest.raises(ConfigError, match="toy"):  # not registered: refused at config load
        LiveConfig.from_config(cfg)
    monkeypatch.setitem(SINKS, "toy", mod.ToySink)  # the registry line
    live = LiveConfig.from_config(cfg)
    with pytest.raises(ConfigError, match="path"):  # its own `requires` is checked too
        LiveConfig.from_config(config_for(tmp_path / "s2", sinks=[{"type": "toy"}]))
    sinks = build_sinks(live.sinks)
    lp = LivePipeline(cfg, Store(tmp_path / "store"), sinks=sinks, detector=enum_detector(5))
    f = Feeder()
    lp.add(f.batch(b"".join(nf(i) for i in range(6))))
    lp.flush()
    lp.close()
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" enumeration")
    assert sinks.counters()["toy[0]"]["sent"] == 1
    assert orjson.loads(orjson.dumps(lp.status.sinks))["toy[0]"]["sent"] == 1


TOY_DETECTOR = '''
from dataclasses import dataclass

import polars as pl

from toolwatch.config import doc
from toolwatch.detectors.base import Detector, session_frame


@dataclass
class SameCallConfig:
    """A session calling one tool with the same arguments again and again."""

    enabled: bool = doc("Run the detector.", True)
    threshold: float = doc("Score from which a session is flagged.", 0.5)
    min_repeats: int = doc("Identical calls from which a session scores 1.", 20)


class SameCallDetector(Detector):
    """Flags sessions repeating one identical call (a toy: distinct_calls vs calls)."""

    name = "same_call"
    category = "tool_loop"
    config_key = "same_call"
    config_class = SameCallConfig
    summary = "One identical call repeated."

    def score(self, features):
        s = features.sessions
        repeats = pl.col("calls") - pl.col("distinct_calls") + 1
        score = (repeats / self.settings.min_repeats).clip(0.0, 1.0)
        return session_frame(s, score, [repeats.alias("repeats")])

    def explain(self, row):
        return ([f"{row['repeats']} identical calls"], {"repeats": row["repeats"]})
'''


def _line(i: int, session: str, tool: str, arg: int) -> bytes:
    return orjson.dumps({"ts": f"2026-11-02T10:{i // 60:02d}:{i % 60:02d}Z",
                         "session_id": session, "caller_id": "bot", "server": "s",
                         "tool": tool, "args": {"q": arg}, "status": "ok"}) + b"\n"


def test_a_toy_detector_is_one_module_plus_one_registry_line(tmp_path, monkeypatch) -> None:
    mod = _module(tmp_path, monkeypatch, "toy_detector_mod", TOY_DETECTOR)
    log = tmp_path / "calls.jsonl"
    # one session repeats the same call 12 times; one varies its argument every time
    log.write_bytes(b"".join(_line(i, "s-same", "lookup", 1) for i in range(12))
                    + b"".join(_line(i, "s-vary", "lookup", i) for i in range(12)))
    conf = tmp_path / "toolwatch.toml"
    conf.write_text("[detectors.same_call]\nmin_repeats = 10\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "TOOLWATCH_HMAC_KEY": "ab" * 32}

    def analyze(store: str) -> list[dict]:
        out = tmp_path / f"{store}.jsonl"
        res = CliRunner().invoke(app, ["analyze", str(log), "-d", str(tmp_path / store),
                                       "-c", str(conf), "-q", "--no-progress",
                                       "--alerts-out", str(out)], env=env)
        assert res.exit_code == 0, res.output[-2000:]
        return [orjson.loads(x) for x in out.read_bytes().splitlines()]

    with pytest.raises(ConfigError, match="same_call"):  # unknown table until registered
        DetectorsConfig.from_dict({"same_call": {"min_repeats": 10}})
    monkeypatch.setitem(REGISTRY, "same_call", mod.SameCallDetector)  # the registry line
    cfg = DetectorsConfig.from_dict({"same_call": {"min_repeats": 10}})
    assert cfg.table("same_call", mod.SameCallConfig).min_repeats == 10
    with pytest.raises(ConfigError, match=r"detectors\.same_call\.min_repeat"):  # keys checked
        DetectorsConfig.from_dict({"same_call": {"min_repeat": 10}})
    mine = [a for a in analyze("store") if a["detector"] == "same_call"]
    assert [(a["entity_id"], a["category"]) for a in mine] == [("s-same", "tool_loop")]
    assert mine[0]["reasons"] == ["12 identical calls"]
    conf.write_text("[detectors.same_call]\nenabled = false\n")  # its own switch works
    assert not [a for a in analyze("store2") if a["detector"] == "same_call"]


TOY_SOURCE = '''
from toolwatch.ingest.sources.base import LiveSource
from toolwatch.ingest.sources.file_tail import LineAssembler


class ListLive(LiveSource):
    """Lines handed over as a list, in chunks of `every`; exhausted at the end."""

    name = "list"

    def __init__(self, lines, every=3):
        super().__init__()
        self.chunks = [b"".join(lines[i:i + every]) for i in range(0, len(lines), every)]
        self.asm = LineAssembler("list:0", {})

    def poll(self, timeout):
        if self.chunks:
            batch = self.asm.feed(self.chunks.pop(0))
            if batch is not None and len(batch):
                yield from self._counted(batch)

    def exhausted(self):
        return not self.chunks
'''


def test_a_toy_live_source_is_one_module_plus_one_registry_line(tmp_path, monkeypatch) -> None:
    _module(tmp_path, monkeypatch, "toy_source_mod", TOY_SOURCE)
    with pytest.raises(ConfigError, match="list"):
        live_source("list")
    monkeypatch.setitem(LIVE_SOURCES, "list", "toy_source_mod:ListLive")  # the registry line
    source = live_source("list")([nf(i) for i in range(7)])
    data = tmp_path / "store"
    lp = LivePipeline(config_for(data, detect=True), Store(data), detector=enum_detector(5))
    drive(source, lp)
    lp.close()
    source.close()
    assert source.counters.as_dict()["processed"] == 7
    assert lp.status.alerts_new == 1  # the driver ran detection over what it polled
    assert stored_count(data) == 7 and stored_alerts(data).height == 1
