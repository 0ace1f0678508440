"""Every registered source follows the one contract (ingest/sources/base.py).

Like tests/test_detectors_contract.py does for detectors: parametrized over the
registry, so a new source is checked as soon as it has its registry line. Real inputs
(files, pipes, spools, the Tansu Kafka broker), a real store and the real driver.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources import registry
from toolwatch.ingest.sources.base import (
    BatchSource,
    LiveSource,
    ServerText,
    StreamsEnded,
    StreamsRevoked,
    StreamsStarted,
)

from tests.test_live_support import call_line, config_for, stored_events
from toolwatch.live import LivePipeline
from toolwatch.live.driver import Driver
from toolwatch.store import Checkpoint, Store

N = 12
EVENTS = (StreamsStarted, ServerText, StreamsEnded, StreamsRevoked)


def _lines(n: int = N) -> bytes:
    return b"".join(call_line(i, caller=f"agent-{i % 3}", session=f"s-{i % 3}")
                    for i in range(n))


# --------------------------------------------------------------------------- factories
# name -> (tmp, store checkpoints, request) -> (source, lines written, server text lines)
Factory = Callable[[Path, dict[str, int], Any], tuple[LiveSource, int, int]]


def _tail(tmp: Path, cps: dict[str, int], request: Any) -> tuple[LiveSource, int, int]:
    from toolwatch.ingest.sources.file_tail import FileTailLive

    log = tmp / "app.log"
    log.write_bytes(_lines())
    return FileTailLive([str(log)], cps, rotate_wait_s=0.0, poll_interval_s=0.02), N, 0


def _pipe(tmp: Path, cps: dict[str, int], request: Any) -> tuple[LiveSource, int, int]:
    from toolwatch.ingest.sources.file_tail import LineAssembler
    from toolwatch.ingest.sources.process import PipeLive, PipeReader

    r, w = os.pipe()
    os.write(w, _lines())
    os.close(w)
    return PipeLive(PipeReader(r).start(), LineAssembler("pipe", cps)), N, 0


def _spool(tmp: Path, cps: dict[str, int], request: Any) -> tuple[LiveSource, int, int]:
    from toolwatch.ingest.sources.spool import SpoolLive
    from toolwatch.ingest.sources.wrapper import Spool

    data = tmp / "store"
    sp = Spool(data, ["server.py"])
    os.write(sp.fd, b"server starting\n" + _lines() + b"Traceback: not JSON\n")
    sp.write_meta()
    sp.release()  # the wrapper is gone: the collector finishes the spool
    return SpoolLive(data, cps, poll_interval_s=0.02), N, 2


def _kafka(tmp: Path, cps: dict[str, int], request: Any) -> tuple[LiveSource, int, int]:
    from kafka import KafkaProducer

    from tests.kafka_broker import create_topic

    broker = request.getfixturevalue("kafka_broker")
    topic = f"contract-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    for i in range(N):
        prod.send(topic, key=f"agent-{i % 3}".encode(),
                  value=call_line(i, caller=f"agent-{i % 3}").rstrip(b"\n"))
    prod.flush(timeout=30)
    prod.close(timeout=10)
    src = registry.live_source("kafka")(bootstrap_servers=broker.bootstrap, topics=[topic],
              group_id=f"g-{uuid.uuid4().hex[:8]}", store=Store(tmp / "store"),
              consumer_options={"session_timeout_ms": 3000, "heartbeat_interval_ms": 500,
                                "max_poll_interval_ms": 5000})
    return src, N, 0


FACTORIES: dict[str, Factory] = {"tail": _tail, "pipe": _pipe, "spool": _spool,
                                 "kafka": _kafka}


def test_every_registered_live_source_has_a_factory() -> None:
    """A source added to the registry must be added here too (and so be checked)."""
    assert set(registry.LIVE_SOURCES) == set(FACTORIES)


# --------------------------------------------------------------------------- live
class _Recorder:
    """Wraps a source's ack: every acknowledged checkpoint must already be stored."""

    def __init__(self, src: LiveSource, store: Store):
        self.src, self.store, self.calls, self.bad = src, store, 0, []
        self._ack = src.ack
        src.ack = self  # type: ignore[method-assign]

    def __call__(self, cps: list[Checkpoint]) -> None:
        self.calls += 1
        stored = self.store.checkpoints()
        self.bad += [c for c in cps if stored.get(c.source_fp, -1) < c.end_offset]
        self._ack(cps)


def _live_param(name: str) -> Any:
    """The Kafka case starts a real broker: out of ``make test-fast``."""
    marks = [pytest.mark.kafka, pytest.mark.slow] if name == "kafka" else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", [_live_param(n) for n in sorted(registry.LIVE_SOURCES)])
def test_live_source_contract(name: str, tmp_path: Path, request: Any) -> None:
    cls = registry.live_source(name)
    assert issubclass(cls, LiveSource) and cls.name == name
    # No access to the live pipeline's internals: the class never names them, and its
    # constructor takes no pipeline.
    code = inspect.getsource(cls)
    for forbidden in ("LivePipeline", "lp.", "on_commit", "pairers", ".window",
                      "finalize_streams", "warm_up("):
        assert forbidden not in code, f"{name} source touches {forbidden!r}"
    assert not {"lp", "pipeline"} & set(inspect.signature(cls).parameters)

    data = tmp_path / "store"
    cfg = config_for(data)
    store = Store(data)
    src, n_lines, n_text = FACTORIES[name](tmp_path, store.checkpoints(), request)
    assert isinstance(src, cls)
    lp = LivePipeline(cfg, store, kind=name)
    rec = _Recorder(src, store)
    seen: list[Any] = []
    orig_poll = src.poll

    def poll(timeout: float) -> Any:
        for item in orig_poll(timeout):
            seen.append(item)
            yield item

    src.poll = poll  # type: ignore[method-assign]
    d = Driver(src, lp, idle_exit_s=1.5 if name != "kafka" else 4.0, max_seconds=60)
    try:
        d.run()
        src.close()
        src.close()  # idempotent
    finally:
        lp.close()
        store.close()

    assert seen and all(isinstance(i, (RawBatch, *EVENTS)) for i in seen)
    assert stored_events(data).height == n_lines  # every line stored once
    c = src.counters.as_dict()
    assert {"processed", "rejected", "dropped"} <= set(c)
    assert all(isinstance(v, int) and v >= 0 for v in c.values())
    assert c["processed"] == sum(len(i) for i in seen if isinstance(i, RawBatch)) == n_lines
    assert c["rejected"] == n_text
    assert rec.calls >= 1 and not rec.bad  # acknowledged, only after the commit
    st = src.status()
    assert isinstance(st, dict) and set(st) <= {"lag", "sources", "extra"}
    assert lp.status.extra[name]["processed"] == n_lines  # published by the driver


def test_spool_is_deleted_only_after_its_acknowledgement(tmp_path: Path) -> None:
    """The spool collector deletes a finished spool on the ack after its last commit."""
    from toolwatch.ingest.sources.wrapper import spool_dir

    data = tmp_path / "store"
    store = Store(data)
    src, _, _ = _spool(tmp_path, store.checkpoints(), None)
    logs = lambda: sorted(p.name for p in spool_dir(data).glob("*.log"))  # noqa: E731
    assert logs()
    items = list(src.poll(0))
    ended = [i for i in items if isinstance(i, StreamsEnded)]
    assert len(ended) == 1 and ended[0].sync
    assert logs()  # not before the acknowledgement
    src.ack([])
    assert logs() == []
    src.close()
    store.close()


# --------------------------------------------------------------------------- batch
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       name=st.sampled_from(sorted(registry.BATCH_SOURCES)))
def test_batch_sources_yield_raw_batches_until_exhausted(
    tmp_path: Path, body: list[bytes], name: str
) -> None:
    """Any bytes: RawBatch objects covering every line, in order, until exhausted."""
    import io

    payload = b"".join(b + b"\n" for b in body)
    cls = registry.batch_source(name)
    if name == "file":
        p = tmp_path / f"{uuid.uuid4().hex}.log"
        p.write_bytes(payload)
        src = cls(str(p), 1 << 10, {})
    else:
        src = cls(1 << 10, {}, stream=io.BytesIO(payload))
    assert isinstance(src, BatchSource)
    got = list(src.batches())
    assert all(isinstance(b, RawBatch) for b in got)
    lines = [x for b in got for x in b.lines.to_pylist()]
    assert lines == [b + b"\n" for b in body]
    assert src.progress() >= 0
