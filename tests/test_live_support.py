"""Helpers shared by the live-mode tests (tail, run, kafka, live pipeline).

Not tests themselves: log-line builders, a small deterministic detector for exercising the
incremental machinery independently of the real detectors, bounded waits, and a thread
runner for the in-process tail loop.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwatch import schema
from toolwatch.config import Config
from toolwatch.live import LiveConfig, StopFlag
from toolwatch.query import query
from toolwatch.store import Store

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


def config_for(data_dir: Path, **live: Any) -> Config:
    """A config writing to ``data_dir`` with fast live settings."""
    os.environ.setdefault("TOOLWATCH_HMAC_KEY", KEY)
    cfg = Config()
    cfg.store.data_dir = str(data_dir)
    cfg.secrets.hmac_key_file = str(data_dir.parent / "hmac.key")
    cfg.live = {"flush_interval_s": 0.2, "poll_interval_s": 0.05, "rotate_wait_s": 0.5,
                "status_interval_s": 0.2, "compact_interval_s": 0, "detect": False,
                **live}
    return cfg


def fast_live(cfg: Config) -> LiveConfig:
    """Parsed live settings of ``cfg``."""
    return LiveConfig.from_config(cfg)


def call_line(
    i: int,
    *,
    session: str | None = "s-1",
    caller: str = "alice",
    ip: str = "10.0.0.1",
    tool: str = "getDocument",
    resource: str | None = None,
    status: str = "ok",
    ts: datetime | None = None,
    seconds: float = 1.0,
) -> bytes:
    """One per-call log line (``toolwatch`` canonical field names)."""
    t = ts or (T0 + timedelta(seconds=i * seconds))
    d: dict[str, Any] = {
        "ts": t.isoformat().replace("+00:00", "Z"),
        "caller_id": caller,
        "client_ip": ip,
        "server": "docs-server",
        "tool": tool,
        "args": {"documentId": resource or f"doc-{i}"},
        "status": status,
        "bytes": 100 + i,
        "seq": i,
    }
    if session is not None:
        d["session_id"] = session
    return orjson.dumps(d) + b"\n"


def write(path: Path, data: bytes, mode: str = "ab") -> None:
    """Append (default) bytes to a file and flush them to the OS."""
    with open(path, mode) as fh:
        fh.write(data)
        fh.flush()


def wait_for(pred: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll ``pred`` until truthy or ``timeout`` (then raise AssertionError)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value {last!r})")


def stored_events(data_dir: Path) -> pl.DataFrame:
    """Every stored event row (duplicates included)."""
    st = Store(data_dir)
    if not st.files("events"):
        return pl.from_arrow(schema.EVENTS.empty_table())  # type: ignore[return-value]
    return pl.from_arrow(query(st, "SELECT * FROM events"))  # type: ignore[return-value]


def stored_count(data_dir: Path) -> int:
    """Number of stored event rows."""
    return stored_events(data_dir).height


def stored_alerts(data_dir: Path, latest: bool = True) -> pl.DataFrame:
    """Stored alerts (latest version per id, or every version)."""
    st = Store(data_dir)
    if not st.files("alerts"):
        return pl.from_arrow(schema.ALERTS.empty_table())  # type: ignore[return-value]
    view = "alerts" if latest else "alerts_raw"
    return pl.from_arrow(query(st, f"SELECT * FROM {view}"))  # type: ignore[return-value]


def recording_detector(
    threshold: int = 5,
) -> tuple[Callable[..., pl.DataFrame], list[int], set[str]]:
    """:func:`enum_detector` that records each call's event count and the alerted
    entities: ``(detector, calls, ids)``, the two collections filled as it runs."""
    inner = enum_detector(threshold)
    calls: list[int] = []
    ids: set[str] = set()

    def detector(events, summaries, history=None):  # type: ignore[no-untyped-def]
        calls.append(events.height)
        out = inner(events, summaries, history=history)
        ids.update(out["entity_id"].to_list())
        return out

    return detector, calls, ids


def enum_detector(threshold: int = 5) -> Callable[[pl.DataFrame, pl.DataFrame], pl.DataFrame]:
    """A tiny rule with the detectors' contract: a session reading >= ``threshold``
    distinct not-found resources is an ``enumeration`` alert whose score grows with the
    count. Deterministic alert id from (entity, category)."""

    def run(
        events: pl.DataFrame, summaries: pl.DataFrame, history: pl.DataFrame | None = None
    ) -> pl.DataFrame:
        nf = events.filter(pl.col("status") == "not_found")
        if nf.height == 0:
            return pl.from_arrow(schema.ALERTS.empty_table())  # type: ignore[return-value]
        g = nf.group_by("session_id").agg(
            pl.col("resource_id").n_unique().alias("n"),
            pl.col("ts").min().alias("first_seen"),
            pl.col("ts").max().alias("last_seen"),
            pl.col("caller_id").first(),
            pl.col("client_ip").first(),
            pl.col("server").first(),
        ).filter(pl.col("n") >= threshold)
        rows = []
        for r in g.iter_rows(named=True):
            sid = r["session_id"]
            score = min(1.0, 0.5 + 0.05 * (r["n"] - threshold))
            rows.append({
                "alert_id": hashlib.md5(f"session:{sid}:enumeration".encode()).hexdigest()[:24],
                "category": "enumeration",
                "detector": "test-enum",
                "severity": "high" if score >= 0.85 else "medium",
                "score": score,
                "entity_type": "session",
                "entity_id": sid,
                "session_id": sid,
                "caller_id": r["caller_id"],
                "client_ip": r["client_ip"],
                "server": r["server"],
                "first_seen": r["first_seen"],
                "last_seen": r["last_seen"],
                "detected_at": datetime.now(UTC),
                "reasons": [f"{r['n']} distinct missing documents"],
                "evidence": orjson.dumps({"distinct_not_found": r["n"]}).decode(),
            })
        if not rows:
            return pl.from_arrow(schema.ALERTS.empty_table())  # type: ignore[return-value]
        tbl = pl.DataFrame(rows).to_arrow().select(schema.ALERTS.names)
        return pl.from_arrow(tbl.cast(schema.ALERTS))  # type: ignore[return-value]

    return run


class LiveThread:
    """Run a live loop (e.g. :func:`toolwatch.live_cli.tail_files`) in a thread."""

    def __init__(self, target: Callable[..., Any], *args: Any, **kwargs: Any):
        self.stop = StopFlag()
        kwargs.setdefault("stop", self.stop)
        self.result: Any = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.result = target(*args, **kwargs)
            except BaseException as exc:  # surfaced by join()
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)

    def __enter__(self) -> LiveThread:
        self.thread.start()
        return self

    def join(self, timeout: float = 30.0) -> Any:
        """Stop the loop and wait for it (bounded)."""
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "live loop did not stop"
        if self.error is not None:
            raise self.error
        return self.result

    def __exit__(self, *exc: object) -> None:
        self.join()


@settings(max_examples=30, deadline=None)
@given(name=st.text(st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF) | st.characters(),
                    min_size=1, max_size=12))
def test_status_file_is_written_whatever_the_names(tmp_path_factory, name: str) -> None:
    """A file name with an undecodable byte (a lone surrogate in Python) used to make the
    status write raise TypeError (orjson refuses non-UTF-8 text); the status then went
    stale or the live process stopped. It is written, the name escaped."""
    from toolwatch.live.status import LiveStatus, StatusPublisher

    data = tmp_path_factory.mktemp("st")
    status = LiveStatus(kind="tail", name=name)
    status.sources[name] = {"offset": 3, name: [name]}
    pub = StatusPublisher(status, data)
    pub.write()
    got = orjson.loads(pub.path.read_bytes())
    assert got["sources"] and got["kind"] == "tail"
    want = name.encode("utf-8", "backslashreplace").decode("utf-8")
    assert got["name"] == want and want in got["sources"]
