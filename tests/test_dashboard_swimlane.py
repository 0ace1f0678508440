"""Session detail's swimlane: calls as intervals in lanes, racing calls highlighted.

A real store: a small log with a double charge sent in parallel (the two calls overlap)
is analysed by the real CLI, then the Streamlit page runs headless (AppTest) on it. The
lane assignment is checked against brute force (hypothesis), hover text against hostile
tool names, and the session query against a store written before the interval columns.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import orjson
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from streamlit.testing.v1 import AppTest
from toolwatch.dashboard.swimlane import figure, swimlane

from tests.shop_session import HOSTILE_TOOL, T0, analyse, session_page
from tests.shop_session import shop_line as _line


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("dash-swim")
    lines = []
    for k in range(12):  # ordinary shoppers: sequential calls
        t = T0 + timedelta(minutes=7 * k)
        o = {"orderId": f"ord-{k}"}
        lines += [_line(t, f"ok-{k}", "createOrder", 120, caller=f"c{k}", args=o),
                  _line(t + timedelta(seconds=4), f"ok-{k}", "chargePayment", 300,
                        caller=f"c{k}", args={**o, "amount": 10}),
                  _line(t + timedelta(seconds=9), f"ok-{k}", "getOrder", 80, caller=f"c{k}",
                        args=o)]
    t = T0 + timedelta(hours=2)
    o = {"orderId": "ord-race"}
    # Two reads in parallel, then the same charge twice at once (800 ms calls, sent 50 ms
    # apart: they overlap by 750 ms), then a sequential read.
    lines += [_line(t, "race", "getOrder", 400, args=o),
              _line(t + timedelta(milliseconds=100), "race", "getCart", 450, args=o),
              _line(t + timedelta(seconds=3), "race", HOSTILE_TOOL, 800,
                    args={**o, "amount": 99}),
              _line(t + timedelta(seconds=3, milliseconds=50), "race", HOSTILE_TOOL, 800,
                    args={**o, "amount": 99}),
              _line(t + timedelta(seconds=6), "race", "getOrder", 90, args=o)]
    return analyse(tmp, lines)


def _chart(at: AppTest, key: str) -> dict:
    charts = [c for c in at.get("plotly_chart") if c.key == key]
    assert charts, [c.key for c in at.get("plotly_chart")]
    return json.loads(charts[0].proto.spec)


@pytest.mark.slow  # runs the app (AppTest)
def test_race_alert_highlights_the_racing_calls_in_lanes(analysed: dict) -> None:
    race = [a for a in analysed["alerts"] if a["category"] == "race_condition"]
    assert len(race) == 1 and race[0]["session_id"] == "race"
    at = session_page(analysed["store"], alert=race[0]["alert_id"])
    assert "Calls in flight (swimlane)" in [s.value for s in at.subheader]
    text = "\n".join(t.value for t in at.text)
    assert "Up to 2 call(s) in flight at once. 2 racing call(s) of the alert highlighted." \
        in text
    spec = _chart(at, "sd_swimlane")
    traces = {tr["name"]: tr for tr in spec["data"]}
    assert set(traces) == {"racing", "other"}
    racing = traces["racing"]
    # The two charges sit in two lanes, each drawn 800 ms long.
    assert sorted(racing["y"]) == [0, 1] and racing["x"] == [800.0, 800.0]
    # Three other calls: the parallel reads stacked (lanes 0 and 1), the last in lane 0.
    assert sorted(traces["other"]["y"]) == [0, 0, 1]
    # Hover text carries the hostile name escaped, never as a tag.
    assert racing["customdata"][0][0] == "chargePayment&lt;img src=x onerror=alert(1)&gt;"
    assert "<img" not in json.dumps([tr["customdata"] for tr in spec["data"]])
    assert "<img" not in json.dumps([tr.get("hovertemplate") for tr in spec["data"]])


@pytest.mark.slow  # runs the app (AppTest)
def test_session_without_alert_draws_lanes_unmarked(analysed: dict) -> None:
    at = session_page(analysed["store"], session="ok-3")
    spec = _chart(at, "sd_swimlane")
    assert [tr["name"] for tr in spec["data"]] == ["other"]
    assert spec["data"][0]["y"] == [0, 0, 0]  # sequential calls share one lane


def test_store_without_interval_columns_falls_back_to_duration(
    analysed: dict, tmp_path: Path
) -> None:
    """Parquet written before start_ts/end_ts existed: start = ts - duration_ms."""
    import shutil

    from toolwatch.dashboard import data

    from toolwatch.query import query, view_columns
    from toolwatch.store import Store

    old = tmp_path / "old"
    shutil.copytree(analysed["store"], old)
    for f in old.rglob("*.parquet"):
        t = pq.read_table(f)
        if "start_ts" in t.column_names:
            pq.write_table(t.drop(["start_ts", "end_ts"]), f)
    s = Store(old)
    try:
        # The view may list the columns (null: the store fills columns its files lack)
        # or not (older stores); either way no file holds them.
        stored = query(s, "SELECT count(start_ts) AS n FROM events") if "start_ts" in (
            pl.from_arrow(view_columns(s)).filter(pl.col("view") == "events")["column"]
            .to_list()) else None
        assert stored is None or stored.column("n")[0].as_py() == 0
        ev = data.session_events(s, "race")
    finally:
        s.close()
    assert ev.height == 5
    got = ev.select((pl.col("end_ts") - pl.col("start_ts")).dt.total_milliseconds())
    assert got.to_series().to_list() == [400, 450, 800, 800, 90]
    assert (ev["end_ts"] == ev["ts"]).all()


# ---------------------------------------------------------------- lanes vs brute force
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 400)), min_size=1,
                max_size=80))
def test_lanes_never_overlap_and_use_the_peak_count(rows: list[tuple[int, int]]) -> None:
    base = T0
    ev = pl.DataFrame({
        "start_ts": [base + timedelta(milliseconds=s) for s, _ in rows],
        "end_ts": [base + timedelta(milliseconds=s + d) for s, d in rows],
        "tool": ["t"] * len(rows), "resource_id": [None] * len(rows),
        "status": ["ok"] * len(rows), "event_id": [str(i) for i in range(len(rows))],
    }, schema_overrides={"start_ts": pl.Datetime("us", "UTC"),
                         "end_ts": pl.Datetime("us", "UTC"), "resource_id": pl.String})
    lanes, no_iv = swimlane(ev, "s")
    assert no_iv == 0 and lanes.height == len(rows)
    ivs = [(int(s), int(s + max(w, 0.001) * 1000), lane) for s, w, lane in zip(
        lanes["start"].dt.epoch("us"), lanes["span_ms"], lanes["lane"], strict=True)]
    for i, (a, b, la) in enumerate(ivs):
        for c, d, lb in ivs[i + 1:]:
            if la == lb:
                assert b <= c or d <= a  # half-open: touching is fine
    # Greedy in start order is optimal: lanes = most calls in flight at one start.
    peak = max(sum(1 for c, d, _ in ivs if c <= a < d) for a, _, _ in ivs)
    assert int(lanes["lane"].max()) + 1 == peak


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40), st.text(max_size=40))
def test_hostile_names_are_escaped_in_hover(tool: str, resource: str) -> None:
    ev = pl.DataFrame({
        "start_ts": [T0, T0 + timedelta(milliseconds=10)],
        "end_ts": [T0 + timedelta(milliseconds=500)] * 2,
        "tool": [tool, tool], "resource_id": [resource, resource], "status": ["ok", "<b>x"],
        "event_id": ["a", "b"],
    }, schema_overrides={"start_ts": pl.Datetime("us", "UTC"),
                         "end_ts": pl.Datetime("us", "UTC")})
    evidence = {"overlapping_calls": [{"tool": tool, "start": T0.isoformat().replace("+00:00", "Z"),
                           "session_id": "s"}]}
    lanes, _ = swimlane(ev, "s", orjson.dumps(evidence).decode(), "race_condition")
    assert lanes["part"].to_list() == ["racing", "other"]
    fig = figure(lanes, "UTC")
    for tr in fig.data:
        for cd in tr.customdata:
            for cell in cd:
                assert "<" not in cell and ">" not in cell
        # The template is fixed text: log strings only ever arrive via customdata.
        assert tr.hovertemplate.startswith("%{customdata[0]}<br>resource: %{customdata[1]}")


def test_concurrency_alert_marks_the_calls_in_flight_at_its_peak() -> None:
    starts = [0, 100, 150, 170, 2000]
    ev = pl.DataFrame({
        "start_ts": [T0 + timedelta(milliseconds=s) for s in starts],
        "end_ts": [T0 + timedelta(milliseconds=s + 300) for s in starts],
        "tool": ["searchItems"] * 5, "resource_id": [None] * 5, "status": ["ok"] * 5,
        "event_id": list("abcde"),
    }, schema_overrides={"start_ts": pl.Datetime("us", "UTC"),
                         "end_ts": pl.Datetime("us", "UTC"), "resource_id": pl.String})
    peak = (T0 + timedelta(milliseconds=170)).isoformat(timespec="milliseconds")
    lanes, _ = swimlane(ev, "s", {"peak_at": peak.replace("+00:00", "Z")},
                        "concurrency_abuse")
    assert lanes["part"].to_list() == ["at peak"] * 4 + ["other"]
    assert lanes["lane"].to_list() == [0, 1, 2, 3, 0]
