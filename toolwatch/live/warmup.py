"""Warm-up: a restarted live process reloads recent stored state (window, alerts, sessions)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta

import polars as pl

from toolwatch import schema
from toolwatch.live.detection import _conform, _pl

log = logging.getLogger("toolwatch.live")


class WarmUpMixin:
    """Warm-up of a :class:`~toolwatch.live.pipeline.LivePipeline`."""

    def _load_alert_memory(self) -> None:
        """Remember alert versions already stored so a restart does not re-emit them."""
        if not self.store.files("alerts"):
            return
        try:
            con = self.store.connect()
            try:
                rows = _pl(con.sql(
                    "SELECT * FROM alerts ORDER BY last_seen DESC LIMIT ?",
                    params=[self.live.max_tracked_alerts],
                ))
            finally:
                con.close()
        except Exception as exc:
            log.warning("cannot load stored alerts: %s", exc)
            return
        self.tracker.remember(reversed(list(rows.iter_rows(named=True))))

    def warm_up(self, fps: Iterable[str]) -> int:
        """Reload recent stored events of resumed streams into the detection window.

        A restarted live process thus keeps detecting across the restart (evidence
        before and after it adds up), and the derived-session state is reseeded so
        session-less events keep their session ids. Returns rows loaded.
        """
        fps = [f for f in fps if f not in self._warmed]
        if not fps:
            return 0
        self.drain()  # the window belongs to the commit thread while it works
        self._warmed.update(fps)
        if not self.store.files("events"):
            return 0
        span_us = max(self.window.window_us, self.window.idle_us)
        try:
            con = self.store.connect()
            try:
                newest = con.sql(
                    "SELECT max(ts) FROM events WHERE source_fp IN (SELECT unnest($fps))",
                    params={"fps": fps},
                ).fetchall()[0]
                if not newest or newest[0] is None:
                    return 0
                since = newest[0] - timedelta(microseconds=span_us)
                ev = _pl(con.sql(
                    "SELECT * FROM events WHERE source_fp IN (SELECT unnest($fps)) "
                    "AND ts >= $since ORDER BY ts DESC LIMIT $lim",
                    params={"fps": fps, "since": since, "lim": self.live.max_window_events},
                ))
                su = _pl(con.sql(
                    "SELECT * FROM summaries WHERE source_fp IN (SELECT unnest($fps)) "
                    "AND ts >= $since",
                    params={"fps": fps, "since": since},
                ))
            finally:
                con.close()
        except Exception as exc:
            log.warning("cannot warm up detection window: %s", exc)
            return 0
        if ev.height == 0 and su.height == 0:
            return 0
        ev = _conform(ev.sort("ts"), schema.EVENTS)
        su = _conform(su, schema.SUMMARIES)
        late_before = self.window.late
        self.window.add(ev, su)
        self.window.late = late_before
        self._seed_sessionizer(ev)
        return ev.height

    def forget_stream(self, fp: str) -> None:
        """Warm the stream up again if it comes back (a Kafka partition re-assigned)."""
        self._warmed.discard(fp)

    def forget_streams(self, fps: Iterable[str]) -> int:
        """Forget streams this process no longer owns (a Kafka partition revoked or lost).

        Their rows leave the detection window, their JSON-RPC pairing state is dropped
        and they are warmed up again if they come back. Returns window rows dropped.
        """
        fps = list(fps)
        n = self.window.drop_streams(fps)
        for fp in fps:
            self.pipe.pairers.pop(fp, None)
            self.forget_stream(fp)
        return n

    def _seed_sessionizer(self, ev: pl.DataFrame) -> None:
        """Restore derived-session state (actor -> last/start time) from stored events."""
        from toolwatch.ingest.sessionize import DERIVED_PREFIX, parse_derived

        d = ev.filter(
            pl.col("session_derived") & pl.col("session_id").str.starts_with(DERIVED_PREFIX)
        )
        if d.height == 0:
            return
        per = d.group_by("session_id").agg(pl.col("ts").max().alias("last_ts"))
        rows = []
        for sid, last in per.iter_rows():  # one row per derived session, not per event
            parsed = parse_derived(sid)
            if parsed is None:
                continue
            rows.append({"actor": parsed[0], "last_ts": last, "start_ts": parsed[1]})
        if not rows:
            return
        sz = self.pipe.sessionizer
        seeded = pl.DataFrame(rows, schema=sz.state.schema)
        seeded = seeded.sort("last_ts").unique(subset="actor", keep="last")
        sz.state = pl.concat([sz.state.join(seeded, on="actor", how="anti"), seeded])

