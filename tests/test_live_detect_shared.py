"""The fused shared-layer code of a detection pass gives what the step-by-step code gave.

A live detection pass runs the baselines, habits and score shaping of every detector on
a few thousand rows, where each polars query has a fixed cost; these helpers were fused
into fewer queries (``collect_all``, lazy chains, ``replace`` instead of ``fill_nan``).
The references below are the previous, step-by-step implementations, kept here verbatim;
hypothesis generates frames with nulls, NaNs, repeated keys and several UTC days, and the
fused code must agree to the bit.
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from toolwatch.detectors.baseline import (
    Baseline,
    daily_habits,
    established_rows,
    habits,
    log1p,
)
from toolwatch.detectors.features import US_PER_DAY, group_agg
from toolwatch.detectors.scoring import band, gate, zero_nan

# ---------------------------------------------------------------- references (old code)


def _ref_fit(bl: Baseline, frame: pl.DataFrame, t_col: str = "first_t") -> Baseline:
    bl.pop_ = {}
    for c in bl.cols:
        vals = frame.filter(pl.col(c).is_not_null()).select(log1p(c).alias("v"))
        if vals.height == 0:
            continue
        med = float(vals["v"].median())  # type: ignore[arg-type]
        mad = float((vals["v"] - med).abs().median())  # type: ignore[arg-type]
        bl.pop_[c] = (med, mad, vals.height)
    if bl.keys and frame.height:
        own = established_rows(frame, bl.keys, bl.min_rows).select(
            *bl.keys,
            (pl.col(t_col) // US_PER_DAY).alias("_day"),
            *[log1p(c).alias(f"_l_{c}") for c in bl.cols],
        )
        aggs: list[pl.Expr] = [pl.len().alias("_n"), pl.col("_day").n_unique().alias("_days")]
        for c in bl.cols:
            lc = pl.col(f"_l_{c}")
            aggs.append(lc.median().alias(f"_med_{c}"))
            aggs.append(((lc.quantile(0.75) - lc.quantile(0.25)) / 2.0).alias(f"_mad_{c}"))
        own = group_agg(own, bl.keys, *aggs)
        bl.own_ = own.with_columns(
            ((pl.col("_n") >= bl.min_rows) & (pl.col("_days") >= bl.min_days))
            .alias("_established")
        )
    else:
        bl.own_ = None
    return bl


def _ref_with_own(bl: Baseline, frame: pl.DataFrame) -> pl.DataFrame:
    assert bl.own_ is not None
    out = frame.join(bl.own_, on=bl.keys, how="left", nulls_equal=False)
    exprs: list[pl.Expr] = []
    for c in bl.cols:
        scale = pl.max_horizontal(pl.col(f"_mad_{c}") * 1.4826, pl.lit(bl.min_mad))
        z = (log1p(c) - pl.col(f"_med_{c}")) / scale
        exprs.append(pl.when(pl.col("_established")).then(z).alias(f"own_z_{c}"))
        exprs.append(pl.col(f"_med_{c}").exp().sub(1.0).alias(f"own_typical_{c}"))
    exprs.append(pl.col("_n").fill_null(0).cast(pl.Int64).alias("own_n"))
    exprs.append(pl.col("_days").fill_null(0).cast(pl.Int64).alias("own_days"))
    drop = [c for c in bl.own_.columns if c not in bl.keys]
    return out.with_columns(exprs).drop(drop)


def _ref_habits(frame: pl.DataFrame, raw_col: str, keys: list[str], *, min_rows: int,
                min_days: int, t_col: str = "first_t") -> pl.DataFrame:
    own = established_rows(frame, keys, min_rows)
    return (
        group_agg(
            own, keys,
            pl.len().alias("_n"),
            (pl.col(t_col) // US_PER_DAY).n_unique().alias("_days"),
            pl.col(raw_col).median().alias("habit_score"),
        )
        .filter((pl.col("_n") >= min_rows) & (pl.col("_days") >= min_days))
        .drop("_n", "_days")
    )


def _ref_daily_habits(frame: pl.DataFrame, raw_col: str, keys: list[str], *, min_rows: int,
                      min_days: int, t_col: str = "first_t") -> pl.DataFrame:
    per_day = group_agg(
        frame.filter(pl.all_horizontal([pl.col(k).is_not_null() for k in keys])).with_columns(
            (pl.col(t_col) // US_PER_DAY).alias("_day")),
        [*keys, "_day"],
        pl.col(raw_col).fill_null(0.0).max().alias("_day_raw"),
        (pl.col("_day") * US_PER_DAY).first().alias(t_col),
    )
    own = established_rows(per_day, keys, min_rows)
    return (
        group_agg(
            own, keys,
            pl.len().alias("_n"),
            (pl.col(t_col) // US_PER_DAY).n_unique().alias("_days"),
            pl.col("_day_raw").quantile(0.5, interpolation="lower").alias("habit_score"),
        )
        .filter((pl.col("_n") >= min_rows) & (pl.col("_days") >= min_days))
        .drop("_n", "_days")
    )


# ---------------------------------------------------------------- generated frames

_VALUES = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.0, -5.0, 1e12, math.nan, math.inf]),
    st.floats(min_value=0, max_value=1e9, allow_nan=False),
)


@st.composite
def frames(draw: st.DrawFn) -> pl.DataFrame:
    """Observation rows: a few callers / entity hashes (nulls too), 1-5 UTC days, figures
    with nulls, zeros, NaN and infinities."""
    n = draw(st.integers(0, 60))
    callers = st.sampled_from([None, "alice", "bob", "carol", "dave"])
    return pl.DataFrame(
        {
            "caller_id": [draw(callers) for _ in range(n)],
            "et": [draw(st.sampled_from([0, 1])) for _ in range(n)],
            "eh": [draw(st.sampled_from([None, 11, 12, 13])) for _ in range(n)],
            "first_t": [draw(st.integers(0, 5 * US_PER_DAY)) for _ in range(n)],
            "total_bytes": [draw(_VALUES) for _ in range(n)],
            "calls": [draw(st.one_of(st.none(), st.integers(0, 500))) for _ in range(n)],
            "_raw": [draw(_VALUES) for _ in range(n)],
        },
        schema={"caller_id": pl.String, "et": pl.Int8, "eh": pl.UInt64, "first_t": pl.Int64,
                "total_bytes": pl.Float64, "calls": pl.Int64, "_raw": pl.Float64},
    )


def _sorted(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    # Group-by output order is unspecified in both versions: compare sorted by key.
    return df.sort(keys, nulls_last=True)


def _same_pop(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        for x, y in zip(a[k], b[k], strict=True):
            assert (x == y) or (math.isnan(x) and math.isnan(y)), (k, a[k], b[k])


KEYSETS = [["caller_id"], ["et", "eh"], []]


@settings(max_examples=60, deadline=None)
@given(frames(), st.sampled_from(KEYSETS), st.integers(1, 4), st.integers(1, 3))
def test_baseline_fit_matches_stepwise(df: pl.DataFrame, keys: list[str], min_rows: int,
                                       min_days: int) -> None:
    cols = ["total_bytes", "calls"]
    new = Baseline(cols, keys, min_rows=min_rows, min_days=min_days).fit(df)
    ref = _ref_fit(Baseline(cols, keys, min_rows=min_rows, min_days=min_days), df)
    _same_pop(new.pop_, ref.pop_)
    if ref.own_ is None:
        assert new.own_ is None
        return
    assert new.own_ is not None
    assert_frame_equal(_sorted(new.own_, keys), _sorted(ref.own_, keys))
    assert_frame_equal(_sorted(new.with_own(df), [*keys, "first_t"]),
                       _sorted(_ref_with_own(ref, df), [*keys, "first_t"]))


@settings(max_examples=60, deadline=None)
@given(frames(), st.sampled_from(KEYSETS[:2]), st.integers(1, 4), st.integers(1, 3))
def test_habits_match_stepwise(df: pl.DataFrame, keys: list[str], min_rows: int,
                               min_days: int) -> None:
    kw = {"min_rows": min_rows, "min_days": min_days}
    assert_frame_equal(_sorted(habits(df, "_raw", keys, **kw), keys),
                       _sorted(_ref_habits(df, "_raw", keys, **kw), keys))
    assert_frame_equal(_sorted(daily_habits(df, "_raw", keys, **kw), keys),
                       _sorted(_ref_daily_habits(df, "_raw", keys, **kw), keys))


@settings(max_examples=80, deadline=None)
@given(st.lists(_VALUES, max_size=30), st.floats(0.0, 100.0), st.floats(0.0, 200.0))
def test_zero_nan_band_gate_match_fill_nan(vals: list, lo: float, hi: float) -> None:
    df = pl.DataFrame({"x": vals}, schema={"x": pl.Float64})
    x = pl.col("x")

    def ref_band(e: pl.Expr) -> pl.Expr:
        xv = e.cast(pl.Float64).fill_null(0.0).fill_nan(0.0)
        lo_, hi_ = float(lo), max(float(hi), float(lo) + 1e-9)
        below = (xv / lo_).clip(0.0, 1.0) if lo_ > 0 else pl.lit(1.0)
        return 0.5 * below + 0.5 * ((xv - lo_) / (hi_ - lo_)).clip(0.0, 1.0)

    def ref_gate(e: pl.Expr) -> pl.Expr:
        xv = e.cast(pl.Float64).fill_null(0.0).fill_nan(0.0)
        if lo <= 0:
            return pl.lit(1.0)
        return pl.when(xv >= lo).then(1.0).otherwise((0.5 * xv / lo).clip(0.0, 0.5))

    got = df.select(zero_nan(x).alias("z"), band(x, lo, hi).alias("b"),
                    gate(x, lo).alias("g"), band(band(x, lo, hi) * 10, 1.0, 5.0).alias("bb"))
    want = df.select(x.fill_nan(0.0).alias("z"), ref_band(x).alias("b"),
                     ref_gate(x).alias("g"), _outer_ref(x, lo, hi).alias("bb"))
    assert_frame_equal(got, want)


def _outer_ref(x: pl.Expr, lo: float, hi: float) -> pl.Expr:
    """The old band of (10 x the old band of x)."""

    def b(e: pl.Expr, lo_: float, hi_: float) -> pl.Expr:
        xv = e.cast(pl.Float64).fill_null(0.0).fill_nan(0.0)
        hi_ = max(float(hi_), float(lo_) + 1e-9)
        below = (xv / lo_).clip(0.0, 1.0) if lo_ > 0 else pl.lit(1.0)
        return 0.5 * below + 0.5 * ((xv - lo_) / (hi_ - lo_)).clip(0.0, 1.0)
    return b(b(x, lo, hi) * 10, 1.0, 5.0)


@pytest.mark.parametrize("bits", [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
                                  0xFFFFFFFFFFFFFFFF])
def test_zero_nan_catches_every_nan_encoding(bits: int) -> None:
    import struct

    v = struct.unpack("<d", struct.pack("<Q", bits))[0]
    assert math.isnan(v)
    df = pl.DataFrame({"x": [v, -0.0, None, 2.0]}, schema={"x": pl.Float64})
    got = df.select(zero_nan(pl.col("x")))["x"].to_list()
    assert got[0] == 0.0 and got[2] is None and got[3] == 2.0
    assert math.copysign(1.0, got[1]) == -1.0  # -0.0 kept as it was


# ------------------------------------------------------ tool annotation stacked in union


def _seq_traffic(seed: int) -> pl.DataFrame:
    from datetime import timedelta

    from tests.fixtures import traffic_sequence as ts
    from tests.fixtures.traffic import T0, Traffic

    tr = Traffic(seed=seed)
    tr.background(days=2, users=12, per_day=2)
    for k in range(6):
        t = T0 + timedelta(hours=3 + 5 * k)
        ts.order_flow(tr, f"o{k}", t, f"ord-{seed}-{k}", caller=f"shopper{k % 3}",
                      charge=k % 2 == 0)
        ts.double_charge(tr, f"d{k}", t + timedelta(minutes=7), f"ord-{k}",
                         keys=("k1", "k1") if k % 3 else (None, None))
        ts.tool_loop(tr, f"l{k}", t + timedelta(minutes=20), n=8 + k)
    return tr.events().sort("ts")


_TOOLS_CFGS = {
    "default": {},
    # Names only some tools look for: a batch without them looks for other names, so
    # its annotation cannot be stacked with the history's (computed again instead).
    "per_tool": {"tools": {"idempotency_args": {"shop-server/chargePayment": ["amount"]},
                           "business_keys": {"fulfillOrder": "orderId"}}},
}


@pytest.mark.parametrize("cfg_name", sorted(_TOOLS_CFGS))
@pytest.mark.parametrize("seed,cut", [(1, 0.5), (2, 0.8), (3, 0.95)])
def test_union_stacks_annotation_as_annotate_would(seed: int, cut: float,
                                                   cfg_name: str) -> None:
    from toolwatch.detectors import DetectorsConfig
    from toolwatch.detectors.base import FeatureSet
    from toolwatch.detectors.pipeline import _features
    from toolwatch.detectors.tools import annotate, annotated

    cfg = DetectorsConfig.from_dict(_TOOLS_CFGS[cfg_name])
    ev = _seq_traffic(seed)
    k = int(ev.height * cut)
    # Overlapping like live: the history's tail holds some of the batch's sessions.
    hist, batch_ev = ev.head(k + 20), ev.slice(k)
    plain = FeatureSet.build(hist, None, cfg).union(FeatureSet.build(batch_ev, None, cfg))
    hist_fs = FeatureSet.build(hist, None, cfg)
    annotated(hist_fs)
    batch = _features(batch_ev, None, cfg, annotate_too=True)
    fused = hist_fs.union(batch)
    assert_frame_equal(fused.events, plain.events)
    assert_frame_equal(fused.sessions, plain.sessions)
    assert_frame_equal(annotated(fused), annotate(plain.events, cfg))
    stacked = getattr(fused, "_tools_annotated", None) is not None
    # The default config looks for the same names everywhere: always stacked.
    assert stacked or cfg_name != "default"


def test_live_detect_with_stacked_annotation_equals_plain_detect() -> None:
    from toolwatch.detectors import DetectorsConfig
    from toolwatch.detectors.pipeline import detect

    cfg = DetectorsConfig()
    ev = _seq_traffic(7)
    hist, live = ev.head(ev.height // 2), ev.tail(ev.height - ev.height // 2)
    key = pl.coalesce(pl.col("caller_id"), pl.col("session_id")).hash(seed=7) % 3
    part = live.select(key.alias("p"))["p"]
    reuse: dict = {}
    for i in range(3):
        p = live.filter(part == i)
        a = detect(p, None, cfg, history=hist, reuse=reuse).alerts  # stacked annotation
        b = detect(p, None, cfg, history=hist).alerts  # annotated from scratch
        assert a.sort("alert_id").to_dicts() == b.sort("alert_id").to_dicts()


# ------------------------------------------------------------ live baseline history


class _HistoryOnly:
    """Just what :meth:`DetectMixin._history` reads, on a real mixin method."""

    def __init__(self, base: pl.DataFrame | None, window: pl.DataFrame | None, n: int):
        from types import SimpleNamespace

        self.live = SimpleNamespace(history_events=n)
        self._history_loaded = True
        self._history_base = base
        self.window = SimpleNamespace(events=window)


def _ev_frame(ids: list[str | None], t0: int) -> pl.DataFrame:
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 11, 2, tzinfo=UTC)
    return pl.DataFrame({
        "event_id": ids,
        "ts": [start + timedelta(seconds=t0 + k) for k in range(len(ids))],
        "session_id": [f"s{(t0 + k) % 5}" for k in range(len(ids))],
        "caller_id": ["alice"] * len(ids),
    }, schema={"event_id": pl.String, "ts": pl.Datetime("us", "UTC"),
               "session_id": pl.String, "caller_id": pl.String})


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([None, *[f"e{k}" for k in range(30)]]), max_size=40),
       st.lists(st.sampled_from([None, *[f"e{k}" for k in range(30)]]), max_size=40),
       st.integers(1, 30), st.booleans())
def test_history_shortcut_equals_concat_unique(base_ids: list, win_ids: list, n: int,
                                               distinct_window: bool) -> None:
    from toolwatch.live.detection import DetectMixin

    if distinct_window:  # the common live case: the window holds each event once
        win_ids = list(dict.fromkeys(i for i in win_ids if i is not None))
    base = _ev_frame(base_ids, 0) if base_ids else None
    win = _ev_frame(win_ids, 1000) if win_ids else None
    got = DetectMixin._history(_HistoryOnly(base, win, n))  # type: ignore[arg-type]
    parts = [p for p in (base, win) if p is not None]
    if not parts:
        assert got is None
        return
    want = parts[0].tail(n) if len(parts) == 1 else (
        pl.concat([parts[0], parts[1].tail(n)], how="vertical_relaxed")
        .unique(subset="event_id", keep="last", maintain_order=True).tail(n))
    assert got is not None
    assert_frame_equal(got, want)


# ------------------------------------------------------------ alert records' reasons


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.text(max_size=12), max_size=5), max_size=20))
def test_reasons_column_equals_polars_construction(lists: list[list[str]]) -> None:
    from polars.testing import assert_series_equal
    from toolwatch.detectors.alerts import _string_lists

    assert_series_equal(_string_lists("reasons", lists),
                        pl.Series("reasons", lists, dtype=pl.List(pl.String)))


@pytest.mark.slow  # starts a process
def test_reasons_column_does_not_import_pandas() -> None:
    # A live process never loads pandas (~37 MiB); pyarrow.array() would import it.
    import subprocess
    import sys

    code = ("import sys; from toolwatch.detectors.alerts import _string_lists; "
            "_string_lists('r', [['a', 'b'], []]); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
