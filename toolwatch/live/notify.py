"""Incident notifications: one message per incident, grouped and rate-limited.

Live mode hands every new or changed alert *version* to its sinks; posting each one gave
16 Slack posts for one 15-second enumeration. A sink with ``notify = "incidents"`` (the
default for webhook and Kafka sinks) sends :class:`IncidentNotifier` messages instead,
with Prometheus Alertmanager's timing:

* a new incident's first message goes out ``group_wait_s`` after its first alert, so the
  alerts arriving with it (the next stages of one attack) are in it;
* changes after that (new alerts, categories or stages, a higher risk) are gathered and
  sent as one **update** (``"update": true`` and what changed) at most every
  ``group_interval_s``;
* an incident still active but unchanged is sent again (``"repeat": true``) every
  ``repeat_interval_s`` (0: never).

Incidents are :func:`toolwatch.detectors.incidents.build_incidents` over the alerts this
process has seen (latest version of each), the same function the store's ``incidents``
view runs, so a message's ``incident_id`` is the one the dashboard shows. An incident whose
id changes (an alert with an earlier start joins it) keeps its notification group: its
messages name the earlier ids in ``previous_incident_ids``.

:class:`IncidentSink` runs the notifier on a background thread fed through a bounded queue
(ingestion never waits for it) and hands the messages to the wrapped sink, which delivers
them with its own queue and retries. At shutdown, every incident with unsent changes is
sent at once. See docs/live.md, "Notifications".
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from toolwatch import schema
from toolwatch.detectors.config import SEVERITY_RANK
from toolwatch.live.config import SinkConfig
from toolwatch.output import safe_text

if TYPE_CHECKING:
    from toolwatch.detectors.incidents_config import IncidentConfig
    from toolwatch.live.sinks import Sink

log = logging.getLogger("toolwatch.live.notify")

#: Alerts held to roll incidents up from, at most (oldest dropped first). Incidents
#: whose last alert is more than ``gap_hours`` (log time) behind the newest are closed
#: and dropped before this cap matters.
MAX_HELD_ALERTS = 20_000
#: Alert frames waiting for the notifier thread, at most (oldest dropped and counted).
FRAME_QUEUE = 1_000
#: Seconds between roll-ups of every held alert (closing ended incidents, decaying risk);
#: in between, only the incidents of the actors a flush's alerts touch are rolled up.
FULL_EVERY_S = 60.0
#: Seconds between reads of the store's triage verdicts (``_triage/triage.sqlite``).
TRIAGE_EVERY_S = 10.0
#: Verdicts that silence an incident's messages (``acknowledged`` only stops repeats).
SILENCED = ("false_positive",)


def notify_mode(config: SinkConfig) -> str:
    """``incidents`` or ``alerts``: the sink's ``notify``, else its type's default."""
    if config.notify:
        return config.notify
    return "incidents" if config.type in ("webhook", "kafka") else "alerts"


def incident_link(dashboard_url: str, incident_id: str) -> str | None:
    """Dashboard link of an incident (``None`` without a ``dashboard_url``).

    Parameters
    ----------
    dashboard_url
        The operator's base URL; ``{incident_id}`` in it is replaced, else
        ``/incident?incident=<id>`` (the dashboard's incident page) is appended.
    incident_id
        The incident's id (``inc-`` + hex; quoted anyway).
    """
    if not dashboard_url:
        return None
    iid = urllib.parse.quote(incident_id, safe="")
    if "{incident_id}" in dashboard_url:
        return dashboard_url.replace("{incident_id}", iid)
    return f"{dashboard_url.rstrip('/')}/incident?incident={iid}"


@dataclass
class _Group:
    """One incident's notification state."""

    key: str  # the first incident id it was known by (stable Kafka key)
    created: float  # clock when it first reached min_severity
    row: dict[str, Any]  # the incident as last computed
    ids: list[str]  # incident ids it has had, oldest first
    sent: dict[str, Any] | None = None  # the incident as last sent
    last_sent: float | None = None
    n_sent: int = 0
    dirty: bool = True  # changed since last sent (a new group: never sent)
    closed: bool = False  # no alert for gap_hours (log time): no more repeats
    status: str = "open"  # triage status (the store's verdicts), see IncidentNotifier


@dataclass
class NotifyCounters:
    """What the notifier did (published with the sink's delivery counters)."""

    incidents: int = 0
    notifications: int = 0
    updates: int = 0
    repeats: int = 0
    below_severity: int = 0
    frames_dropped: int = 0
    errors: int = 0


class IncidentNotifier:
    """Incidents from alert versions, and the messages due for them (no threads, no I/O).

    Parameters
    ----------
    config
        The sink's settings: ``group_wait_s``, ``group_interval_s``,
        ``repeat_interval_s``, ``min_severity`` (of the incident), ``dashboard_url``.
    incident_config
        ``[detectors.incidents]`` (activity window, risk); default: its defaults.
    clock
        Monotonic seconds (tests pass a fake clock).
    store_dir
        The store whose triage verdicts are honoured (re-read every
        :data:`TRIAGE_EVERY_S`): an incident marked ``false_positive`` (itself, or all of
        its alerts) gets no more messages; ``acknowledged`` gets updates but no repeats.
        ``None``: every incident is open.
    """

    def __init__(
        self,
        config: SinkConfig,
        incident_config: IncidentConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        store_dir: str | Path | None = None,
    ):
        from toolwatch.detectors.incidents_config import IncidentConfig

        self.config = config
        self.store_dir = store_dir
        self._triage: tuple[dict[str, str], dict[str, str]] = ({}, {})
        self._triage_at = -float("inf")
        self.incident_config = incident_config or IncidentConfig()
        self.clock = clock
        self.min_rank = SEVERITY_RANK.get(config.min_severity, 0)
        self.counters = NotifyCounters()
        self._alerts: pl.DataFrame | None = None
        self._groups: dict[str, _Group] = {}
        self._alert_group: dict[str, str] = {}
        self._below: set[str] = set()
        self._last_full = -float("inf")

    # ------------------------------------------------------------------ input
    def add(self, alerts: pl.DataFrame) -> None:
        """Take new alert versions and recompute the incidents they touch.

        Parameters
        ----------
        alerts
            Alert rows (``toolwatch.schema.ALERTS`` columns; ``evidence`` as JSON text).
        """
        if alerts.height == 0:
            return
        cols = [c for c in schema.ALERTS.names if c in alerts.columns]
        new = alerts.select(cols)
        held = new if self._alerts is None else pl.concat(
            [self._alerts, new], how="diagonal_relaxed"
        )
        # Latest version of each alert: versions arrive in order, the last one wins.
        held = held.unique("alert_id", keep="last", maintain_order=True)
        newest = held["last_seen"].max()
        now = self.clock()
        # (a quarter over the cap before a cut: at the cap, not every flush is a full one)
        if now - self._last_full >= FULL_EVERY_S or held.height > MAX_HELD_ALERTS * 1.25:
            # Every incident: closes and forgets the ended ones, refreshes decayed risks.
            self._last_full = now
            inc = self._build(held, newest)
            self._alerts = self._prune(held, inc, newest)
        else:
            # Only the incidents of the actors these alerts touch: the roll-up is per
            # actor, so their ids, stages and risk are the same as over everything, at a
            # fraction of the cost (10,000 held alerts: ~0.5 s per full roll-up).
            self._alerts = held
            inc = self._build(_touched(held, new), newest)
        self._update(inc, newest)

    def _build(self, alerts: pl.DataFrame, newest: Any) -> pl.DataFrame:
        from toolwatch.detectors.incidents import build_incidents

        # Risk decays to the newest log time this process saw, not the wall clock: a
        # replay of yesterday's logs is as bad as it was.
        return build_incidents(alerts, now=newest, config=self.incident_config)  # type: ignore[arg-type]

    def _prune(self, held: pl.DataFrame, inc: pl.DataFrame, newest: Any) -> pl.DataFrame:
        """Drop the alerts of closed incidents (no alert for ``gap_hours``), then the
        oldest past :data:`MAX_HELD_ALERTS`."""
        gap = pl.duration(microseconds=int(self.incident_config.gap_hours * 3.6e9))
        closed = inc.filter(pl.col("last_seen") < pl.lit(newest) - gap)
        if closed.height:
            gone = closed["alert_ids"].explode().drop_nulls()
            # a closed incident's group is forgotten once it has nothing left to send
            for gid in {self._alert_group.get(a) for a in gone.to_list()} - {None}:
                g = self._groups.get(gid)  # type: ignore[arg-type]
                if g is not None:
                    g.closed = True
            held = held.filter(~pl.col("alert_id").is_in(gone.implode()))
        if held.height > MAX_HELD_ALERTS:
            held = held.sort("last_seen").tail(MAX_HELD_ALERTS)
        return held

    def _update(self, inc: pl.DataFrame, newest: Any) -> None:
        """Fold the recomputed incidents into their notification groups."""
        now = self.clock()
        gap_us = int(self.incident_config.gap_hours * 3.6e9)
        # One Python step per *incident* (a handful per flush), not per event.
        for row in inc.to_dicts():
            gids = {self._alert_group[a] for a in row["alert_ids"] if a in self._alert_group}
            groups = sorted((self._groups[g] for g in gids if g in self._groups),
                            key=lambda g: g.created)
            if groups:
                g = groups[0]
                for other in groups[1:]:  # one incident now spans two groups: merge
                    g.ids.extend(i for i in other.ids if i not in g.ids)
                    g.n_sent = max(g.n_sent, other.n_sent)
                    if g.sent is None:
                        g.sent, g.last_sent = other.sent, other.last_sent
                    del self._groups[other.key]
            else:
                if SEVERITY_RANK.get(row["severity"], 0) < self.min_rank:
                    if row["incident_id"] not in self._below:
                        if len(self._below) > 100_000:  # bounded: a counter, not state
                            self._below.clear()
                        self._below.add(row["incident_id"])
                        self.counters.below_severity += 1
                    continue
                g = _Group(key=row["incident_id"], created=now, row=row,
                           ids=[row["incident_id"]])
                g.status = self._status(g)
                self._groups[g.key] = g
                self.counters.incidents += 1
            if row["incident_id"] not in g.ids:
                g.ids.append(row["incident_id"])
            for a in row["alert_ids"]:
                self._alert_group[a] = g.key
            g.row = row
            g.closed = (newest - row["last_seen"]).total_seconds() * 1e6 > gap_us
            if g.sent is None or _changes(g.sent, row):
                g.dirty = True
        # forget groups of closed incidents with nothing left to send
        for key in [k for k, g in self._groups.items() if g.closed and not g.dirty]:
            g = self._groups.pop(key)
            for a in g.row["alert_ids"]:
                if self._alert_group.get(a) == key:
                    del self._alert_group[a]

    # ------------------------------------------------------------------ triage
    def _refresh_triage(self) -> None:
        """Re-read the verdicts (at most every TRIAGE_EVERY_S) and each group's status."""
        if self.store_dir is None or self.clock() - self._triage_at < TRIAGE_EVERY_S:
            return
        from toolwatch.triage_store import alert_statuses, incident_statuses

        self._triage_at = self.clock()
        try:
            self._triage = (alert_statuses(self.store_dir), incident_statuses(self.store_dir))
        except Exception as exc:  # a damaged triage file must not stop notifications
            log.warning("triage verdicts unreadable: %s", exc)
            return
        for g in self._groups.values():
            g.status = self._status(g)

    def _status(self, g: _Group) -> str:
        """The incident's own verdict (under any id it had), else derived from its
        alerts' verdicts as the ``incidents`` view derives it."""
        by_alert, by_incident = self._triage
        if not by_alert and not by_incident:
            return "open"
        for iid in [g.row["incident_id"], *reversed(g.ids)]:
            if iid in by_incident:
                return by_incident[iid]
        st = [by_alert.get(a, "open") for a in g.row["alert_ids"]]
        if "escalated" in st:
            return "escalated"
        if st and all(s == "false_positive" for s in st):
            return "false_positive"
        if st and all(s in ("acknowledged", "false_positive") for s in st):
            return "acknowledged"
        return "open"

    # ----------------------------------------------------------------- output
    def _due_at(self, g: _Group) -> float | None:
        c = self.config
        if g.status in SILENCED:
            return None
        if g.last_sent is None:
            return g.created + c.group_wait_s
        if g.dirty:
            return g.last_sent + c.group_interval_s
        if c.repeat_interval_s > 0 and not g.closed and g.status != "acknowledged":
            return g.last_sent + c.repeat_interval_s
        return None

    def next_due(self) -> float | None:
        """Clock time of the next message due (``None``: nothing scheduled)."""
        self._refresh_triage()
        times = [t for g in self._groups.values() if (t := self._due_at(g)) is not None]
        return min(times) if times else None

    def due(self) -> list[dict[str, Any]]:
        """Messages due now (marked sent)."""
        self._refresh_triage()
        now = self.clock()
        out = []
        for g in list(self._groups.values()):
            t = self._due_at(g)
            if t is not None and t <= now:
                out.append(self._message(g, now))
        return out

    def flush(self) -> list[dict[str, Any]]:
        """Messages for every incident with unsent changes, whatever their timers
        (shutdown: nothing pending is lost)."""
        self._triage_at = -float("inf")  # the latest verdicts, whatever the timer
        self._refresh_triage()
        now = self.clock()
        return [self._message(g, now) for g in list(self._groups.values())
                if g.dirty and g.status not in SILENCED]

    def _message(self, g: _Group, now: float) -> dict[str, Any]:
        row, sent = g.row, g.sent
        update = sent is not None
        repeat = update and not g.dirty
        msg: dict[str, Any] = {
            "type": "toolwatch.incident",
            "update": update,
            "repeat": repeat,
            "incident_id": row["incident_id"],
            "previous_incident_ids": [i for i in g.ids if i != row["incident_id"]],
            "notification_key": g.key,
            "sequence": g.n_sent + 1,
            "actor_type": row["actor_type"],
            "actor_id": row["actor_id"],
            "caller_ids": row["caller_ids"],
            "client_ips": row["client_ips"],
            "servers": row["servers"],
            "stages": row["stages"],
            "categories": row["categories"],
            "techniques": row["techniques"],
            "summary": row["summary"],
            "risk": row["risk"],
            "peak_risk": row.get("peak_risk"),
            "severity": row["severity"],
            "status": g.status,
            "n_alerts": row["n_alerts"],
            "alert_ids": row["alert_ids"],
            "first_seen": row["first_seen"],
            "last_seen": row["last_seen"],
            "recommended_actions": row["recommended_actions"],
            "linked_incident_ids": row.get("linked_incident_ids") or [],
            "dashboard_url": incident_link(self.config.dashboard_url, row["incident_id"]),
            "sent_at": datetime.now(UTC),
        }
        if update:
            assert sent is not None
            msg["changes"] = _changes(sent, row) or {}
        g.sent, g.last_sent, g.dirty = row, now, False
        g.n_sent += 1
        self.counters.notifications += 1
        if repeat:
            self.counters.repeats += 1
        elif update:
            self.counters.updates += 1
        return msg

    def pending(self) -> int:
        """Incidents with changes not sent yet."""
        return sum(g.dirty for g in self._groups.values())


def _touched(held: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """The held alerts of the actors ``new`` touches: same caller, address, session or
    entity, and, one step further, the callers and addresses those alerts name (so an
    address incident lists the callers behind it as a full roll-up does)."""

    def near(ref: pl.DataFrame) -> pl.Expr:
        return pl.any_horizontal(
            pl.col(c).is_in(ref[c].drop_nulls().unique().implode()).fill_null(False)
            for c in ("caller_id", "client_ip", "session_id", "entity_id")
        )

    first = held.filter(near(new))
    return held.filter(near(first))


def _changes(sent: dict[str, Any], row: dict[str, Any]) -> dict[str, Any] | None:
    """What changed since ``sent`` (``None``: nothing worth a message).

    New alerts, categories or stages, a higher severity or a higher peak risk are
    changes; the risk decaying or an alert's evidence growing without raising its
    severity are not (that was the flood: every alert version was a post).
    """
    new_alerts = [a for a in row["alert_ids"] if a not in set(sent["alert_ids"])]
    new_cats = [c for c in row["categories"] if c not in sent["categories"]]
    new_stages = [s for s in row["stages"] if s not in sent["stages"]]
    up = SEVERITY_RANK.get(row["severity"], 0) > SEVERITY_RANK.get(sent["severity"], 0)
    peak = (row.get("peak_risk") or 0.0) - (sent.get("peak_risk") or 0.0)
    if not (new_alerts or new_cats or new_stages or up or peak >= 0.1):
        return None
    return {
        "new_alerts": len(new_alerts),
        "new_categories": new_cats,
        "new_stages": new_stages,
        "risk_from": sent["risk"],
        "risk_delta": round(float(row["risk"]) - float(sent["risk"]), 1),
        "severity_from": sent["severity"],
    }


# --------------------------------------------------------------------- formats
def _esc(v: Any) -> str:
    """Slack mrkdwn: terminal-safe, and ``&``, ``<``, ``>`` escaped (no links, mentions)."""
    return safe_text(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code(v: Any) -> str:
    """A log-derived value in a code span (no formatting, no auto-linked URLs)."""
    return "`" + _esc(v).replace("`", "'") + "`"


def slack_incident_payload(msg: dict[str, Any]) -> dict[str, Any]:
    """Slack incoming-webhook message for one incident notification (mrkdwn).

    Every log-derived value (caller, address, server, summary, actions) is escaped and
    sits in a code span, as in :func:`toolwatch.live.sinks.slack_payload`; only our own words,
    the stage names and the operator's dashboard link are outside.
    """
    sev = _esc(msg.get("severity", "?")).upper()
    if msg.get("repeat"):
        kind = "still active"
    elif msg.get("update"):
        kind = "update"
    else:
        kind = "new incident"
    who = _code(msg.get("actor_id"))
    callers = msg.get("caller_ids") or []
    ips = msg.get("client_ips") or []
    actor = {"caller_id": "caller", "client_ip": "address"}.get(
        str(msg.get("actor_type")), "session")
    lines = [f"*toolwatch {sev}* {kind}: {actor} {who}"]
    detail = []
    if callers and (msg.get("actor_type") != "caller_id" or len(callers) > 1):
        detail.append("callers " + ", ".join(_code(c) for c in callers[:5]))
    if ips:
        detail.append("from " + ", ".join(_code(i) for i in ips[:5]))
    if msg.get("servers"):
        detail.append("on " + ", ".join(_code(s) for s in msg["servers"][:5]))
    if detail:
        lines.append(" ".join(detail))
    stages = " → ".join(_esc(s).replace("_", " ") for s in msg.get("stages") or [])
    cats = ", ".join(_esc(c) for c in msg.get("categories") or [])
    lines.append(f"*Stages:* {stages} ({cats})")
    risk = f"*Risk:* {float(msg.get('risk') or 0):.1f}/100"
    ch = msg.get("changes") or {}
    if ch:
        risk += f" ({ch.get('risk_delta', 0):+.1f})"
    lines.append(f"{risk}, {int(msg.get('n_alerts') or 0)} alert(s)")
    if ch:
        what = []
        if ch.get("new_stages"):
            what.append("new stages " + ", ".join(_esc(s).replace("_", " ")
                                                  for s in ch["new_stages"]))
        if ch.get("new_categories"):
            what.append("new categories " + ", ".join(_esc(c) for c in ch["new_categories"]))
        if ch.get("new_alerts"):
            what.append(f"{int(ch['new_alerts'])} new alert(s)")
        if ch.get("severity_from") != msg.get("severity"):
            what.append(f"severity was {_esc(ch.get('severity_from'))}")
        if what:
            lines.append("*Changed:* " + "; ".join(what))
    lines.append(f"*Summary:* {_code(msg.get('summary'))}")
    for a in (msg.get("recommended_actions") or [])[:3]:
        lines.append(f"*Action:* {_code(a)}")
    link = msg.get("dashboard_url")
    if link:
        # the operator's URL and our hex id; escaped as Slack asks for link targets
        lines.append(f"<{_esc(link)}|Open incident {_esc(msg.get('incident_id'))}>")
    else:
        lines.append(f"Incident {_code(msg.get('incident_id'))}")
    return {"text": "\n".join(lines), "incident_id": msg.get("incident_id"),
            "update": bool(msg.get("update"))}


# ----------------------------------------------------------------- the sink
class IncidentSink:
    """A sink sending incident messages through another sink (webhook, Kafka, ...).

    ``submit_frame`` only puts the alert frame on a bounded queue; a background thread
    rolls alerts up, keeps the timers and hands due messages to ``inner.submit`` (which
    queues them for its own delivery thread with retries). Counters are the inner
    sink's (messages sent, failed, dropped, retried) plus the notifier's.

    Parameters
    ----------
    inner
        The delivering sink; it receives message dicts instead of alert rows.
    config
        The sink's settings.
    incident_config
        ``[detectors.incidents]``; may be set later with :meth:`bind` (before alerts).
    clock
        Monotonic seconds.
    """

    def __init__(
        self,
        inner: Sink,
        config: SinkConfig,
        incident_config: IncidentConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.inner = inner
        self.name = inner.name
        self.config = config
        self.notifier = IncidentNotifier(config, incident_config, clock)
        self._q: queue.Queue[pl.DataFrame | None] = queue.Queue(maxsize=FRAME_QUEUE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"notify-{self.name}",
                                        daemon=True)
        self._thread.start()

    def bind(self, incident_config: IncidentConfig, store_dir: str | Path | None = None) -> None:
        """Use the process's ``[detectors.incidents]`` and its store's triage verdicts
        (called before any alert)."""
        self.notifier.incident_config = incident_config
        if store_dir is not None:
            self.notifier.store_dir = store_dir

    def submit_frame(self, alerts: pl.DataFrame) -> None:
        """Queue new/changed alert versions (never blocks; oldest frame dropped if full)."""
        while True:
            try:
                self._q.put_nowait(alerts)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._q.get_nowait()
                    self.notifier.counters.frames_dropped += 1

    def _run(self) -> None:
        n = self.notifier
        while True:
            nxt = n.next_due()
            wait = 1.0 if nxt is None else min(1.0, max(0.0, nxt - n.clock()))
            try:
                item = self._q.get(timeout=wait) if wait > 0 else self._q.get_nowait()
            except queue.Empty:
                item = None
                if self._stop.is_set():
                    break
            else:
                if item is None:  # close(): what is queued, then everything pending
                    self._drain()
                    self._deliver(n.flush)
                    return
            if item is not None:
                # every frame waiting now in one roll-up (a backlog's flushes come fast)
                frames, stop = self._take([item])
                self._add(frames)
                if stop:
                    self._deliver(n.flush)
                    return
            self._deliver(n.due)

    def _take(self, frames: list[pl.DataFrame]) -> tuple[list[pl.DataFrame], bool]:
        """``frames`` plus every frame queued now; True if close() asked to stop."""
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return frames, False
            if item is None:
                return frames, True
            frames.append(item)

    def _drain(self) -> None:
        frames, _ = self._take([])
        if frames:
            self._add(frames)

    def _add(self, frames: list[pl.DataFrame]) -> None:
        try:
            self.notifier.add(frames[0] if len(frames) == 1
                              else pl.concat(frames, how="diagonal_relaxed"))
        except Exception as exc:  # a bad frame must not stop notifications
            self.notifier.counters.errors += 1
            log.warning("%s notifier: %s", self.name, exc)

    def _deliver(self, produce: Callable[[], list[dict[str, Any]]]) -> None:
        try:
            msgs = produce()
        except Exception as exc:
            self.notifier.counters.errors += 1
            log.warning("%s notifier: %s", self.name, exc)
            return
        if msgs:
            self.inner.submit(msgs)

    # Sink interface used by SinkSet
    def wants(self, row: dict[str, Any]) -> bool:  # pragma: no cover - frames, not rows
        """Rows are not filtered here: ``min_severity`` applies to the incident."""
        return True

    def counters(self) -> dict[str, int]:
        """The inner sink's delivery counters plus the notifier's."""
        mine = dict(vars(self.notifier.counters))
        mine["notify_errors"] = mine.pop("errors")
        return {**self.inner.counters(), **mine}

    def close(self, timeout: float = 10.0) -> None:
        """Roll up what is queued, send every pending change now, then close the inner
        sink (which delivers what it holds, bounded by its own wait)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._q.put(None, timeout=0.1)
                break
            except queue.Full:
                if time.monotonic() > deadline:
                    self._stop.set()
                    break
        self._thread.join(max(0.1, deadline - time.monotonic()))
        self.inner.close()
