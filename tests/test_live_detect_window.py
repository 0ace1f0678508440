"""The detection window holds the same rows however often its strings are copied.

Expiry copies the held rows' strings into buffers of their own (so dropped rows do not
pin their parse batch's memory). Copying on every expiry cost more CPU than the
detection passes while catching up, so it runs once enough rows arrived since the last
copy; the rows held, and so every detection's input, must not change.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolwatch.live.window import DetectionWindow

T0 = datetime(2026, 11, 2, tzinfo=UTC)


class EveryExpiryCopies(DetectionWindow):
    """The reference: strings copied on every expiry (as before)."""

    def expire(self) -> None:
        self._since_copy = 1 << 60
        super().expire()


def _batch(draw_rows: list[tuple[int, int, int]], start: int) -> pl.DataFrame:
    ts = [T0 + timedelta(seconds=start + dt) for dt, _, _ in draw_rows]
    return pl.DataFrame({
        "event_id": [f"e-{start}-{i}-" + "x" * 20 for i in range(len(draw_rows))],
        "ts": pl.Series(ts, dtype=pl.Datetime("us", "UTC")),
        "session_id": [f"session-{s:04d}-long-enough" for _, s, _ in draw_rows],
        "caller_id": [f"caller-{s % 7}" for _, s, _ in draw_rows],
        "client_ip": [f"10.0.{s % 5}.{s % 3}" for _, s, _ in draw_rows],
        "args": [f'{{"id": {a}, "pad": "{"y" * (a % 40)}"}}' for _, _, a in draw_rows],
    })


rows = st.lists(st.tuples(st.integers(-30, 90), st.integers(0, 40), st.integers(0, 999)),
                min_size=0, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(rows, min_size=1, max_size=25), cap=st.integers(20, 200),
       step=st.integers(1, 120))
def test_rows_held_do_not_depend_on_when_strings_are_copied(
    batches: list[list[tuple[int, int, int]]], cap: int, step: int
) -> None:
    kw = {"window_minutes": 5.0, "session_idle_minutes": 2.0, "tolerance_s": 10.0,
          "max_events": cap, "columns": ["event_id", "ts", "session_id", "caller_id",
                                         "client_ip", "args"]}
    a, b = DetectionWindow(**kw), EveryExpiryCopies(**kw)
    empty = pl.DataFrame()
    for i, br in enumerate(batches):
        ev = _batch(br, i * step)
        for w in (a, b):
            w.add(ev, empty)
        if b.events is None:
            assert a.events is None
            continue
        assert a.events is not None
        assert a.events.equals(b.events)
        assert a.evicted == b.evicted and a.late == b.late
    for w in (a, b):
        w.expire()
    if b.events is not None:
        assert a.events is not None and a.events.equals(b.events)
