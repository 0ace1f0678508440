"""Address-keyed findings across a consumer group: one member scores them from the table.

Members of one Kafka group each detect on the partitions they own. A producer that keys
by caller spreads one client address over every partition, so what an address did (a
credential-stuffing campaign from 40 callers, a fan-out across callers) is split between
members: each sees a share, and either stays under the thresholds or alerts on its half.

So address windows are scored in one place. Members drop the client-address alerts of
their own detection; the member that owns partition 0 of the first topic (exactly one
member of a live group at any time; when it dies or leaves, the rebalance hands the
partition, and the role, to another) runs :class:`EntityPass` every
``live.entity_pass_s``: it reads the recent window of the shared ``events`` table,
which every member writes, and runs the address detectors on it. Alert ids are
deterministic (entity, category, window), so a pass repeated after a failover writes new
versions of the same alerts, never second alerts; the ``alerts`` view keeps the latest.

Why not repartition by address through a second topic: that would double the traffic
through the brokers and add a topic the operator must create and size, for findings
that are minutes wide anyway; the table already holds every member's events.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import polars as pl

from toolwatch import schema
from toolwatch.config import Config
from toolwatch.query import query
from toolwatch.store import Store

log = logging.getLogger("toolwatch.live")


def drop_address_alerts(detect: Any) -> Any:
    """``detect`` without client-address alerts (a member's share of an address)."""

    def run(events: pl.DataFrame, summaries: pl.DataFrame | None,
            history: pl.DataFrame | None = None) -> pl.DataFrame:
        alerts = detect(events, summaries, history)
        if alerts is None or alerts.height == 0:
            return alerts
        return alerts.filter(pl.col("entity_type") != "client_ip")

    for attr in ("child_stats",):
        if hasattr(detect, attr):
            setattr(run, attr, getattr(detect, attr))
    return run


class EntityPass:
    """Score client-address windows over the shared table's recent events.

    Parameters
    ----------
    config
        The process's configuration (detector settings, triage suppressions).
    store
        The shared store.
    interval_s
        Seconds between passes.
    window_minutes
        How far back from the newest stored event a pass reads.
    max_events
        At most this many of the newest events per pass (memory: ~2 KB each).
    """

    def __init__(self, config: Config, store: Store, *, interval_s: float,
                 window_minutes: float, max_events: int):
        from toolwatch.detectors import DetectorsConfig
        from toolwatch.detectors.stream import AlertTracker

        self.config = config
        self.store = store
        self.interval_s = interval_s
        self.window_minutes = window_minutes
        self.max_events = max_events
        self.dcfg = DetectorsConfig.from_dict(config.detectors)
        self.tracker = AlertTracker()
        self.runs = 0
        self.failures = 0
        self._last = float("-inf")
        self._seeded = False

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    def _seed(self) -> None:
        """Remember the address alerts already stored (a new leader after a failover
        emits only what changed since the last one)."""
        self._seeded = True
        try:
            stored = query(self.store, "SELECT * FROM alerts WHERE entity_type = 'client_ip'")
            self.tracker.remember(stored.to_pylist())
        except Exception as exc:
            log.warning("entity pass: cannot read stored alerts: %s", exc)

    def run(self) -> pl.DataFrame | None:
        """One pass: new or changed address alerts (stored already), or None."""
        self._last = time.monotonic()
        if not self._seeded:
            self._seed()
        try:
            ev, su = self._window()
            if ev.height == 0:
                return None
            alerts = self._score(ev, su)
        except Exception:  # a detector bug must not stop ingestion
            self.failures += 1
            log.exception("entity pass failed")
            return None
        self.runs += 1
        if alerts is None or alerts.height == 0:
            return None
        news, _, _ = self.tracker.news(alerts)
        if news.height == 0:
            return None
        now = datetime.now(UTC)
        news = news.with_columns(pl.lit(now).dt.cast_time_unit("us").alias("detected_at"))
        self.store.write_batch(
            {"alerts": news.select(schema.ALERTS.names).to_arrow().cast(schema.ALERTS)})
        return news

    def _window(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        con = self.store.connect()
        try:
            newest = con.sql("SELECT max(ts) AS t FROM events").fetchall()
            if not newest or newest[0][0] is None:
                return pl.DataFrame(), pl.DataFrame()
            span = int(self.window_minutes * 60e6)  # an int: nothing of a user in the SQL
            since = f"(SELECT max(ts) FROM events) - to_microseconds({span})"
            ev = pl.from_arrow(con.sql(
                f"SELECT * EXCLUDE (raw) FROM events WHERE ts >= {since} "
                "ORDER BY ts DESC LIMIT ?", params=[self.max_events]).to_arrow_table())
            su = pl.from_arrow(con.sql(
                f"SELECT * FROM summaries WHERE ts >= {since}").to_arrow_table())
        finally:
            con.close()
        assert isinstance(ev, pl.DataFrame) and isinstance(su, pl.DataFrame)
        return ev.sort("ts"), su

    def _score(self, ev: pl.DataFrame, su: pl.DataFrame) -> pl.DataFrame:
        from toolwatch.detectors import registry
        from toolwatch.detectors.base import FeatureSet
        from toolwatch.detectors.partition import ADDRESS_DETECTORS
        from toolwatch.detectors.pipeline import fit_and_score
        from toolwatch.detectors.suppress import apply_triage_suppressions

        fs = FeatureSet.build(ev, su, self.dcfg)
        names = [d for d in registry.REGISTRY if d in ADDRESS_DETECTORS]
        at = ev["ts"].max()
        alerts = fit_and_score(fs, fs, self.dcfg, detectors=names,
                               detected_at=None if at is None else int(at.timestamp() * 1e6))
        alerts = alerts.filter(pl.col("entity_type") == "client_ip")
        return apply_triage_suppressions(
            alerts, self.config.data_dir, events=ev,
            unauthenticated=self.config.triage.suppress_unauthenticated_callers)

    def status(self) -> dict[str, Any]:
        return {"entity_pass_runs": self.runs, "entity_pass_failures": self.failures}
