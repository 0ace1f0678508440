"""Live status: counters, the status file read by ``toolwatch status``, Prometheus text."""

from __future__ import annotations

import http.server
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from toolwatch.status_files import read_statuses, status_dir  # noqa: F401 - re-exported

log = logging.getLogger("toolwatch.live")


class RateMeter:
    """Events per second over a sliding window of recent flushes."""

    def __init__(self, horizon_s: float = 10.0):
        self.horizon_s = horizon_s
        self._samples: deque[tuple[float, int]] = deque()
        # The commit thread adds while the reading thread reports the rate.
        self._lock = threading.Lock()

    def add(self, n: int, now: float | None = None) -> None:
        """Record ``n`` events at ``now`` (monotonic seconds)."""
        with self._lock:
            self._samples.append((time.monotonic() if now is None else now, n))

    def rate(self, now: float | None = None) -> float:
        """Events per second over the horizon."""
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._samples and self._samples[0][0] < now - self.horizon_s:
                self._samples.popleft()
            if not self._samples:
                return 0.0
            span = max(now - self._samples[0][0], 1.0)
            return sum(n for _, n in self._samples) / span


@dataclass
class LiveStatus:
    """Counters of one live process, as shown by ``toolwatch status`` and /metrics."""

    kind: str
    name: str
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    lines_read: int = 0
    events_stored: int = 0
    summaries_stored: int = 0
    quarantined: dict[str, int] = field(default_factory=dict)
    server_text_lines: int = 0
    alerts_new: int = 0
    alerts_updated: int = 0
    alerts_suppressed_repeats: int = 0
    late_events: int = 0
    window_events: int = 0
    window_evicted: int = 0
    active_sessions: int = 0
    flushes: int = 0
    last_flush_ms: float = 0.0
    last_flush_at: float = 0.0
    detect_ms: float = 0.0
    events_per_s: float = 0.0
    lag: dict[str, Any] = field(default_factory=dict)
    watermark: str | None = None
    sinks: dict[str, dict[str, int]] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False

    @property
    def quarantined_total(self) -> int:
        """All quarantined lines (server text excluded)."""
        return sum(self.quarantined.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready mapping."""
        d = {k: v for k, v in self.__dict__.items()}
        d["quarantined_total"] = self.quarantined_total
        d["updated_at"] = time.time()
        return d


class StatusPublisher:
    """Writes the status file atomically and serves Prometheus metrics (optional).

    Parameters
    ----------
    status
        The live counters.
    data_dir
        Store directory; the file is ``_state/live/<kind>-<pid>.json``.
    metrics_port
        Port for ``/metrics`` (``None``: off; 0: any free port).
    metrics_host
        Bind address of the metrics endpoint.
    """

    def __init__(
        self,
        status: LiveStatus,
        data_dir: str | Path,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ):
        self.status = status
        self.dir = status_dir(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        # pid plus a random tag: several pipelines may share a process (tests, benchmarks).
        self.path = self.dir / f"{status.kind}-{status.pid}-{uuid.uuid4().hex[:6]}.json"
        self._server: http.server.ThreadingHTTPServer | None = None
        self.metrics_port: int | None = None
        if metrics_port is not None:
            self._start_metrics(metrics_host, metrics_port)

    def write(self) -> None:
        """Rewrite the status file (atomic replace)."""
        tmp = self.path.with_suffix(".json.tmp")
        status = self.status.as_dict()
        try:
            try:
                data = orjson.dumps(status, default=str)
            except orjson.JSONEncodeError:
                # A name from the logs or the file system with a lone surrogate (an
                # undecodable byte) is not UTF-8: write it escaped rather than go stale.
                data = orjson.dumps(_utf8_safe(status), default=str)
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        except (OSError, orjson.JSONEncodeError) as exc:  # best effort, never fatal
            log.warning("cannot write status file %s: %s", self.path, exc)

    def _start_metrics(self, host: str, port: int) -> None:
        publisher = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = prometheus_text(publisher.status).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.metrics_port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()

    def close(self, *, remove: bool = True) -> None:
        """Stop the endpoint; remove the status file (or mark it stopped)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.status.stopped = True
        if remove:
            self.path.unlink(missing_ok=True)
        else:
            self.write()


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def prometheus_text(st: LiveStatus) -> str:
    """Counters in the Prometheus text exposition format."""
    lab = f'kind="{_label(st.kind)}",name="{_label(st.name)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, value: float, help_: str, extra: str = "") -> None:
        lines.append(f"# HELP toolwatch_{name} {help_}")
        lines.append(f"# TYPE toolwatch_{name} {kind}")
        labels = lab + ("," + extra if extra else "")
        lines.append(f"toolwatch_{name}{{{labels}}} {value}")

    metric("lines_read_total", "counter", st.lines_read, "Log lines read.")
    metric("events_stored_total", "counter", st.events_stored, "Events committed to the store.")
    metric("quarantined_total", "counter", st.quarantined_total, "Lines quarantined.")
    metric("server_text_lines_total", "counter", st.server_text_lines, "Non-JSON stderr lines.")
    metric("alerts_new_total", "counter", st.alerts_new, "Alerts raised.")
    metric("alerts_updated_total", "counter", st.alerts_updated, "Alert updates emitted.")
    metric("late_events_total", "counter", st.late_events, "Events beyond the tolerance.")
    metric("window_events", "gauge", st.window_events, "Events held for detection.")
    metric("active_sessions", "gauge", st.active_sessions, "Sessions active in the window.")
    metric("events_per_second", "gauge", round(st.events_per_s, 3), "Recent events/s.")
    metric("last_flush_seconds", "gauge", st.last_flush_ms / 1000, "Duration of last flush.")
    for k, v in st.lag.items():
        if isinstance(v, int | float):
            metric(f"lag_{k}", "gauge", v, f"Lag ({k}).")
    parts = {p: v for p, v in (st.sources.get("lag_by_partition") or {}).items()
             if isinstance(v, int | float)}  # kafka: one family, a sample per partition
    if parts:
        lines.append("# HELP toolwatch_kafka_partition_lag Messages behind the high watermark.")
        lines.append("# TYPE toolwatch_kafka_partition_lag gauge")
        lines += [f'toolwatch_kafka_partition_lag{{{lab},partition="{_label(str(p))}"}} {v}'
                  for p, v in parts.items()]
    for sink, c in st.sinks.items():
        for k, v in c.items():
            metric(f"sink_{k}_total", "counter", v, f"Sink {k}.", f'sink="{_label(sink)}"')
    return "\n".join(lines) + "\n"


def _utf8_safe(obj: Any) -> Any:
    """``obj`` with every string's lone surrogates written as ``\\udcXX`` escapes."""
    if isinstance(obj, str):
        return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_utf8_safe(v) for v in obj]
    return obj
