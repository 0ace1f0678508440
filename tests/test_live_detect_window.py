"""The detection window holds the same rows however often its strings are copied.

Expiry copies the held rows' strings into buffers of their own (so dropped rows do not
pin their parse batch's memory). Copying on every expiry cost more CPU than the
detection passes while catching up, so it runs once enough rows arrived since the last
copy; the rows held, and so every detection's input, must not change. Nor may the
eighth session's expiry (the time/session filter skipped when every held row is inside
the window; strings copied through Arrow): the reference is the expiry from before it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.detectors.stream import DetectionWindow

T0 = datetime(2026, 11, 2, tzinfo=UTC)


class EveryExpiryCopies(DetectionWindow):
    """The reference: strings copied on every expiry (as before)."""

    def expire(self) -> None:
        self._since_copy = 1 << 60
        super().expire()


class BeforeSession8(DetectionWindow):
    """The reference: expiry as it was before the eighth session (the time/session filter
    over every held row on every expiry; strings copied by appending an empty string)."""

    def expire(self) -> None:
        self._since_expire = 0
        if self.events is None or self.newest_us is None:
            return
        wm = self.newest_us - self.tolerance_us
        idle_cut = wm - self.idle_us
        old_cut = wm - self.window_us
        self.session_last = self.session_last.filter(pl.col("t") >= idle_cut)
        active = self.session_last["session_id"].implode()
        before = self.events.height
        keep = (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(active)
        ev = self.events.filter(keep)
        if ev.height > self.max_events:
            cut = ev["ts"].top_k(self.max_events).min()
            ev = ev.filter(pl.col("ts") >= cut)
            if ev.height > self.max_events:
                ev = ev.tail(self.max_events)
        self.evicted += before - ev.height
        self.events = ev.rechunk()
        for name in [n for n, t in self.events.schema.items() if t == pl.String]:
            self.events = self.events.with_columns(pl.col(name) + pl.lit(""))


def _batch(draw_rows: list[tuple[int, int, int]], start: int) -> pl.DataFrame:
    ts = [T0 + timedelta(seconds=start + dt) for dt, _, _ in draw_rows]
    return pl.DataFrame({
        "event_id": [f"e-{start}-{i}-" + "x" * 20 for i in range(len(draw_rows))],
        "ts": pl.Series(ts, dtype=pl.Datetime("us", "UTC")),
        "session_id": [f"session-{s:04d}-long-enough" for _, s, _ in draw_rows],
        "caller_id": [f"caller-{s % 7}" for _, s, _ in draw_rows],
        "client_ip": [f"10.0.{s % 5}.{s % 3}" for _, s, _ in draw_rows],
        "args": pl.Series([None if a % 11 == 0 else f'{{"id": {a}, "pad": "{"y" * (a % 40)}"}}'
                           for _, _, a in draw_rows], dtype=pl.String),
    })


rows = st.lists(st.tuples(st.integers(-30, 90), st.integers(0, 40), st.integers(0, 999)),
                min_size=0, max_size=60)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(rows, min_size=1, max_size=25), cap=st.integers(20, 200),
       step=st.integers(1, 120))
def test_rows_held_do_not_depend_on_when_strings_are_copied(
    batches: list[list[tuple[int, int, int]]], cap: int, step: int
) -> None:
    kw = {"window_minutes": 5.0, "session_idle_minutes": 2.0, "tolerance_s": 10.0,
          "max_events": cap, "columns": ["event_id", "ts", "session_id", "caller_id",
                                         "client_ip", "args"]}
    a, b, c = DetectionWindow(**kw), EveryExpiryCopies(**kw), BeforeSession8(**kw)
    empty = pl.DataFrame()
    for i, br in enumerate(batches):
        ev = _batch(br, i * step)
        for w in (a, b, c):
            w.add(ev, empty)
        for ref in (b, c):
            if ref.events is None:
                assert a.events is None
                continue
            assert a.events is not None
            assert a.events.equals(ref.events)
            assert a.evicted == ref.evicted and a.late == ref.late
            assert a.session_last.sort("session_id").equals(ref.session_last.sort("session_id"))
    for w in (a, b, c):
        w.expire()
    for ref in (b, c):
        if ref.events is not None:
            assert a.events is not None and a.events.equals(ref.events)


@settings(max_examples=60, deadline=None)
@given(offsets=st.lists(st.integers(-3, 3), min_size=1, max_size=8),
       active=st.booleans())
def test_expiry_at_the_edge_of_the_window(offsets: list[int], active: bool) -> None:
    """Rows a microsecond either side of the window's edge: expiry keeps what the
    filter over every row (the reference) keeps, whether or not that filter is skipped."""
    kw = {"window_minutes": 5.0, "session_idle_minutes": 2.0, "tolerance_s": 10.0,
          "max_events": 1_000, "columns": ["event_id", "ts", "session_id"]}
    newest = T0 + timedelta(hours=1)
    edge = newest - timedelta(seconds=10) - timedelta(minutes=5)  # watermark - window
    ts = [edge + timedelta(microseconds=o) for o in offsets]
    sessions = [f"old-session-{i}-long-enough" for i in range(len(ts))]
    if active:  # the old rows' first session is still active (an event at the newest)
        ts.append(newest)
        sessions.append(sessions[0])
    else:
        ts.append(newest)
        sessions.append("new-session-long-enough")
    df = pl.DataFrame({
        "event_id": [f"e-{i}-" + "x" * 20 for i in range(len(ts))],
        "ts": pl.Series(ts, dtype=pl.Datetime("us", "UTC")),
        "session_id": sessions,
    })
    a, c = DetectionWindow(**kw), BeforeSession8(**kw)
    for w in (a, c):
        w.add(df, pl.DataFrame())
        w.expire()
    assert a.events is not None and c.events is not None
    assert a.events.equals(c.events)
    # Rows from the edge on stay; older ones only while their session is active.
    kept_old = a.events.filter(pl.col("ts") < newest).height
    assert kept_old == sum(o >= 0 for o in offsets) + (active and offsets[0] < 0)
