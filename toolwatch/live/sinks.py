"""Alert sinks: stdout (JSON lines), file, Kafka topic and webhook (JSON POST / Slack).

Live mode stores every alert version in the store *before* any sink sees it; sinks are
delivery, not storage. A sink that fails (endpoint down, broker gone, disk full) is
retried with exponential backoff where that makes sense and otherwise counted — it never
raises into the ingestion loop and never blocks it: network sinks deliver from a
background thread through a bounded queue (oldest alerts dropped and counted when the
queue is full).

A sink with ``notify = "alerts"`` (the default for stdout and file: a local record of
every version) receives alerts as JSON objects shaped like ``toolwatch analyze
--alerts-out`` lines (``docs/alert.schema.json``: ``evidence`` is an object, times are
ISO-8601 UTC). The same ``alert_id`` arriving again is an *update* of that alert. A sink
with ``notify = "incidents"`` (the default for webhook and Kafka) is wrapped in a
:class:`toolwatch.live.notify.IncidentSink`: it receives one message per incident, grouped and
rate-limited like Alertmanager, instead of every alert version.

Adding a sink: a :class:`Sink` subclass (``send``; ``requires`` names the
:class:`~toolwatch.live.config.SinkConfig` fields it needs; ``build`` when its
constructor needs more than the config) and one line in :data:`SINKS`. The ``type`` of a
``[[live.sinks]]`` table is validated against :data:`SINKS`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar

import orjson
import polars as pl

from toolwatch import schema
from toolwatch.detectors.config import SEVERITY_RANK
from toolwatch.live.config import SinkConfig
from toolwatch.live.notify import IncidentSink, notify_mode, slack_incident_payload
from toolwatch.output import json_safe, safe_text

if TYPE_CHECKING:
    from toolwatch.config import Config

log = logging.getLogger("toolwatch.live.sinks")

_JSON_OPTS = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC


def alert_dicts(alerts: pl.DataFrame) -> list[dict[str, Any]]:
    """Alert rows as JSON-ready dicts (``evidence`` parsed into an object)."""
    cols = [c for c in schema.ALERTS.names if c in alerts.columns]
    out = []
    for row in alerts.select(cols).iter_rows(named=True):
        ev = row.get("evidence")
        try:
            row["evidence"] = orjson.loads(ev) if ev else {}
        except orjson.JSONDecodeError:
            row["evidence"] = {"text": ev}
        out.append(row)
    return out


def alert_json(row: dict[str, Any]) -> bytes:
    """One alert as a JSON line (with trailing newline), safe on a terminal.

    Entity ids and reasons are attacker-controlled and these lines go to stdout and to
    files people ``tail -f``: JSON leaves DEL, C1 controls (``\\x9b`` is a CSI), bidi
    overrides, zero-width characters and line separators raw, so they are written as
    ``\\uXXXX`` escapes (:func:`toolwatch.output.json_safe`; the decoded values are the
    same).
    """
    text = orjson.dumps(row, option=_JSON_OPTS, default=str).decode()
    return json_safe(text).encode() + b"\n"


def slack_payload(row: dict[str, Any]) -> dict[str, Any]:
    """Slack incoming-webhook message for one alert (``{"text": ...}``, mrkdwn).

    Log-derived values are attacker-controlled: each is shown escaped
    (:func:`toolwatch.output.safe_text`: no bidi override, zero-width or control
    character), Slack's control characters ``<``, ``>`` and ``&`` are escaped so it cannot
    inject links or mentions, and it sits in a code span (a backtick in it becomes ``'``)
    so mrkdwn formatting and Slack's linking of bare URLs do not apply to it.
    """

    def esc(v: Any) -> str:
        return safe_text(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def code(v: Any) -> str:
        return "`" + esc(v).replace("`", "'") + "`"

    reasons = row.get("reasons") or []
    text = (
        f"*toolwatch {esc(row.get('severity', '?')).upper()}* {esc(row.get('category'))}: "
        f"{esc(row.get('entity_type'))}={code(row.get('entity_id'))}"
        f" (score {float(row.get('score') or 0):.2f})"
    )
    if reasons:
        text += f"\n{code(reasons[0])}"
    return {"text": text, "alert_id": row.get("alert_id")}


@dataclass
class SinkContext:
    """What a sink may need besides its config (see :meth:`Sink.build`)."""

    #: False for ``toolwatch run``: stdout carries the MCP protocol there.
    allow_stdout: bool = True
    #: Brokers of the consumer, for a Kafka sink that names none.
    default_bootstrap: str = ""


class Sink:
    """Base class: ``send`` one alert; counters of sent/failed/dropped."""

    name = "sink"
    #: SinkConfig fields this kind of sink cannot do without (checked at config load).
    requires: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def build(cls, config: SinkConfig, ctx: SinkContext) -> Sink:
        """Instantiate from a ``[[live.sinks]]`` entry (override to use ``ctx``)."""
        return cls(config)

    def __init__(self, config: SinkConfig):
        self.config = config
        self.min_rank = SEVERITY_RANK.get(config.min_severity, 0)
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.retried = 0

    def wants(self, row: dict[str, Any]) -> bool:
        """Whether the alert passes ``min_severity``."""
        return SEVERITY_RANK.get(str(row.get("severity")), 0) >= self.min_rank

    def submit(self, rows: list[dict[str, Any]]) -> None:
        """Deliver alerts (synchronous sinks write here)."""
        for r in rows:
            try:
                self.send(r)
                self.sent += 1
            except Exception as exc:
                self.failed += 1
                log.warning("%s sink failed: %s", self.name, exc)

    def send(self, row: dict[str, Any]) -> None:
        """Deliver one alert or raise."""
        raise NotImplementedError

    def counters(self) -> dict[str, int]:
        """Delivery counters."""
        return {
            "sent": self.sent,
            "failed": self.failed,
            "dropped": self.dropped,
            "retried": self.retried,
        }

    def close(self) -> None:
        """Flush and release resources."""


class StdoutSink(Sink):
    """JSON lines on standard output (never used by ``toolwatch run``)."""

    name = "stdout"

    @classmethod
    def build(cls, config: SinkConfig, ctx: SinkContext) -> Sink:
        """Refused where stdout carries the MCP protocol (``toolwatch run``)."""
        if not ctx.allow_stdout:
            raise ValueError(
                "a stdout sink is not allowed in `toolwatch run`: stdout carries the MCP "
                "protocol; use a file, webhook or kafka sink"
            )
        return cls(config)

    def __init__(self, config: SinkConfig, stream: BinaryIO | None = None):
        super().__init__(config)
        self.stream = stream

    def send(self, row: dict[str, Any]) -> None:
        out = self.stream if self.stream is not None else sys.stdout.buffer
        out.write(alert_json(row))
        out.flush()


class FileSink(Sink):
    """JSON lines appended to a file (flushed after every micro-batch)."""

    name = "file"
    requires = ("path",)

    def __init__(self, config: SinkConfig):
        super().__init__(config)
        self.path = Path(config.path)
        self._fh: BinaryIO | None = None

    def submit(self, rows: list[dict[str, Any]]) -> None:
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "ab")  # noqa: SIM115 - kept open across batches
            self._fh.write(b"".join(alert_json(r) for r in rows))
            self._fh.flush()
            self.sent += len(rows)
        except OSError as exc:
            self.failed += len(rows)
            log.warning("file sink %s failed: %s", self.path, exc)
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class _QueuedSink(Sink):
    """A sink delivering from a background thread through a bounded queue."""

    def __init__(self, config: SinkConfig):
        super().__init__(config)
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=config.queue_size)
        self._thread = threading.Thread(target=self._run, name=f"sink-{self.name}", daemon=True)
        self._closing = False
        self._thread.start()

    def submit(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            while True:
                try:
                    self._q.put_nowait(r)
                    break
                except queue.Full:
                    try:
                        self._q.get_nowait()  # drop the oldest: the store has it
                        self.dropped += 1
                    except queue.Empty:
                        pass

    def _run(self) -> None:
        while True:
            row = self._q.get()
            if row is None:
                return
            self._deliver(row)

    def _deliver(self, row: dict[str, Any]) -> None:
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                self.send(row)
                self.sent += 1
                return
            except Exception as exc:
                if attempt >= self.config.retries or self._closing:
                    self.failed += 1
                    log.warning(
                        "%s sink gave up after %d attempt(s): %s", self.name, attempt + 1, exc
                    )
                    return
                self.retried += 1
                time.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter
                delay = min(delay * 2, 60.0)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (bounded wait), then stop the thread."""
        deadline = time.monotonic() + timeout
        while not self._q.empty() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._closing = True
        with contextlib.suppress(queue.Full):
            self._q.put_nowait(None)
        self._thread.join(max(0.1, deadline - time.monotonic()))


class WebhookSink(_QueuedSink):
    """POST each alert or incident message as JSON (or a Slack message), with retries and
    backoff."""

    name = "webhook"
    requires = ("url",)

    def send(self, row: dict[str, Any]) -> None:
        if self.config.slack:
            # an incident message (notify = incidents) or an alert version (alerts)
            incident = row.get("type") == "toolwatch.incident"
            row = slack_incident_payload(row) if incident else slack_payload(row)
        body = orjson.dumps(row, option=_JSON_OPTS, default=str)
        req = urllib.request.Request(  # noqa: S310 - URL comes from the operator's config
            self.config.url,
            data=body,
            headers={"Content-Type": "application/json", "User-Agent": "toolwatch"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:  # noqa: S310
            if resp.status >= 300:
                raise urllib.error.HTTPError(
                    self.config.url, resp.status, "unexpected status", resp.headers, None
                )


class KafkaSink(_QueuedSink):
    """Produce alerts (or incident messages) to a Kafka topic.

    Key: the entity id for alerts, the incident's notification key for incident
    messages, so the versions or updates of one land on one partition in order.
    """

    name = "kafka"
    requires = ("topic",)

    @classmethod
    def build(cls, config: SinkConfig, ctx: SinkContext) -> Sink:
        """Brokers default to the consumer's."""
        return cls(config, ctx.default_bootstrap)

    def __init__(self, config: SinkConfig, default_bootstrap: str = ""):
        self._bootstrap = config.bootstrap_servers or default_bootstrap
        if not self._bootstrap:
            raise ValueError("kafka sink needs bootstrap_servers")
        self._producer: Any = None
        super().__init__(config)

    def _producer_(self) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer

            self._producer = KafkaProducer(
                bootstrap_servers=self._bootstrap.split(","),
                acks="all",
                retries=self.config.retries,
                linger_ms=5,
                client_id="toolwatch-alerts",
            )
        return self._producer

    def send(self, row: dict[str, Any]) -> None:
        if row.get("type") == "toolwatch.incident":
            # one incident's messages on one partition, in order, even if its id changed
            key = str(row.get("notification_key")).encode()
        else:
            key = f"{row.get('entity_type')}:{row.get('entity_id')}".encode()
        fut = self._producer_().send(self.config.topic, key=key, value=alert_json(row)[:-1])
        fut.get(timeout=self.config.timeout_s)

    def close(self, timeout: float = 10.0) -> None:
        super().close(timeout)
        if self._producer is not None:
            try:
                self._producer.flush(timeout=timeout)
                self._producer.close(timeout=timeout)
            except Exception as exc:
                log.warning("kafka sink close: %s", exc)
            self._producer = None


class SinkSet:
    """All configured sinks; what live mode calls after each committed micro-batch.

    Parameters
    ----------
    sinks
        The sinks.
    """

    def __init__(self, sinks: list[Sink | IncidentSink]):
        self.sinks = sinks

    def bind(self, config: Config) -> None:
        """Give incident sinks the process's ``[detectors.incidents]`` settings and store
        (the live pipeline calls it once, before any alert), so their incidents are the
        store's and the store's triage verdicts silence them."""
        notifiers = [s for s in self.sinks if isinstance(s, IncidentSink)]
        if not notifiers:
            return
        from toolwatch.config import from_dict
        from toolwatch.detectors.incidents_config import IncidentConfig

        raw = dict((config.detectors or {}).get("incidents") or {})
        ic = from_dict(IncidentConfig, raw, prefix="detectors.incidents")
        for s in notifiers:
            s.bind(ic, config.data_dir)

    def emit(self, alerts: pl.DataFrame) -> None:
        """Hand new/changed alerts to every sink (never raises, never waits on a network).

        Alert sinks get one JSON-ready row per alert version that passes their
        ``min_severity``; incident sinks get the frame (queued for their notifier).
        """
        if alerts.height == 0 or not self.sinks:
            return
        rows: list[dict[str, Any]] | None = None
        for s in self.sinks:
            try:
                if isinstance(s, IncidentSink):
                    s.submit_frame(alerts)
                    continue
                if rows is None:
                    rows = alert_dicts(alerts)
                s.submit([r for r in rows if s.wants(r)])
            except Exception as exc:
                if isinstance(s, IncidentSink):
                    s.notifier.counters.errors += 1
                else:
                    s.failed += alerts.height
                log.warning("%s sink failed: %s", s.name, exc)

    def counters(self) -> dict[str, dict[str, int]]:
        """Per-sink delivery counters (keyed ``<type>[<i>]``)."""
        return {f"{s.name}[{i}]": s.counters() for i, s in enumerate(self.sinks)}

    def close(self) -> None:
        """Flush and stop every sink."""
        for s in self.sinks:
            try:
                s.close()
            except Exception as exc:
                log.warning("%s sink close failed: %s", s.name, exc)


#: Sinks by ``[[live.sinks]] type``: adding a sink is a class above plus one line here.
SINKS: dict[str, type[Sink]] = {
    "stdout": StdoutSink,
    "file": FileSink,
    "kafka": KafkaSink,
    "webhook": WebhookSink,
}


def build_sinks(
    configs: list[SinkConfig], *, allow_stdout: bool = True, default_bootstrap: str = ""
) -> SinkSet:
    """Instantiate sinks from config.

    Parameters
    ----------
    configs
        ``live.sinks`` entries (plus any added by command-line options).
    allow_stdout
        False for ``toolwatch run``: the MCP protocol owns stdout, so a stdout sink is
        refused there.
    default_bootstrap
        Brokers for a Kafka sink that names none (the consumer's).

    Raises
    ------
    ValueError
        On a stdout sink where stdout is not allowed.
    """
    ctx = SinkContext(allow_stdout=allow_stdout, default_bootstrap=default_bootstrap)
    out: list[Sink | IncidentSink] = []
    for c in configs:
        cls = SINKS.get(c.type)
        if cls is None:  # pragma: no cover - LiveConfig.validate rejects it first
            raise ValueError(f"unknown sink type {c.type!r}")
        sink = cls.build(c, ctx)
        # notify = incidents (default for webhook/kafka): one message per incident,
        # grouped and rate-limited (toolwatch/live/notify.py) in front of the delivering sink
        out.append(IncidentSink(sink, c) if notify_mode(c) == "incidents" else sink)
    return SinkSet(out)
