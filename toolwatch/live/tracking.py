"""Alert tracking: emit an alert when it is new or changed, never a repeat."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import polars as pl


class AlertTracker:
    """Remembers the last stored version of each alert to emit only news.

    Parameters
    ----------
    max_alerts
        LRU bound on remembered alert ids.
    """

    def __init__(self, max_alerts: int = 200_000):
        self.max_alerts = max_alerts
        self._seen: OrderedDict[str, tuple[Any, ...]] = OrderedDict()

    @staticmethod
    def _sig(row: dict[str, Any]) -> tuple[Any, ...]:
        return (
            row.get("severity"),
            round(float(row.get("score") or 0.0), 6),
            row.get("evidence"),
            tuple(row.get("reasons") or ()),
            row.get("first_seen"),
            row.get("last_seen"),
        )

    def remember(self, rows: Iterable[dict[str, Any]]) -> None:
        """Record versions already stored (e.g. loaded from the store on startup)."""
        for r in rows:
            self._put(r["alert_id"], self._sig(r))

    def _put(self, aid: str, sig: tuple[Any, ...]) -> None:
        self._seen[aid] = sig
        self._seen.move_to_end(aid)
        while len(self._seen) > self.max_alerts:
            self._seen.popitem(last=False)

    def news(self, alerts: pl.DataFrame) -> tuple[pl.DataFrame, int, int]:
        """Alerts that are new or changed; returns ``(rows, n_new, n_updated)``.

        A version with *older* evidence than the remembered one (its last_seen earlier,
        e.g. computed after part of a window expired) is never emitted.
        """
        if alerts.height == 0:
            return alerts, 0, 0
        keep: list[int] = []
        n_new = n_upd = 0
        for i, r in enumerate(alerts.iter_rows(named=True)):
            aid = r["alert_id"]
            sig = self._sig(r)
            prev = self._seen.get(aid)
            if prev is None:
                n_new += 1
            elif prev == sig:
                self._seen.move_to_end(aid)
                continue
            else:
                prev_last = prev[5]
                if prev_last is not None and sig[5] is not None and sig[5] < prev_last:
                    continue
                n_upd += 1
            self._put(aid, sig)
            keep.append(i)
        return alerts[keep], n_new, n_upd

    def __len__(self) -> int:
        return len(self._seen)

