"""Session detail shows the call sequence with a sequence alert's chain highlighted.

A real store: a small log with a double charge is analysed by the real CLI, then the
Streamlit page is run headless (AppTest) on it.
"""

from __future__ import annotations

import json
from datetime import timedelta

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from toolwatch.dashboard.chain import call_sequence, chain_records
from toolwatch.detectors.config import CATEGORIES

from tests.shop_session import HOSTILE_TOOL, T0, analyse, session_page
from tests.shop_session import shop_line as _line


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("dash-seq")
    lines = []
    for k in range(12):  # ordinary shoppers: create, charge once, fulfil
        t = T0 + timedelta(minutes=7 * k)
        o = {"orderId": f"ord-{k}"}
        lines += [_line(t, f"ok-{k}", "createOrder", caller=f"c{k}", args=o),
                  _line(t + timedelta(seconds=4), f"ok-{k}", "chargePayment", caller=f"c{k}",
                        args={**o, "amount": 10}),
                  _line(t + timedelta(seconds=9), f"ok-{k}", "fulfillOrder", caller=f"c{k}",
                        args=o)]
    t = T0 + timedelta(hours=2)
    o = {"orderId": "ord-dup"}
    lines += [_line(t, "dup", "createOrder", args=o),
              _line(t + timedelta(seconds=2), "dup", "getOrder", args=o),
              _line(t + timedelta(seconds=5), "dup", "chargePayment", args={**o, "amount": 99}),
              _line(t + timedelta(seconds=8), "dup", "listOrders", args={"page": 1}),
              _line(t + timedelta(seconds=11), "dup", "chargePayment", args={**o, "amount": 99})]
    return analyse(tmp, lines)


def test_session_detail_highlights_the_chain(analysed: dict) -> None:
    dup = [a for a in analysed["alerts"] if a["category"] == "duplicate_execution"]
    assert len(dup) == 1 and dup[0]["session_id"] == "dup"
    at = session_page(analysed["store"], alert=dup[0]["alert_id"])
    assert "Call sequence" in [s.value for s in at.subheader]
    text = "\n".join(t.value for t in at.text)
    assert "2 of the session's 5 calls make the chain of this duplicate_execution alert" in text
    table = next(d.value for d in at.dataframe if {"step", "chain"} <= set(d.value.columns))
    marked = dict(zip(table["step"], table["chain"], strict=True))
    assert marked == {1: "", 2: "", 3: "◆ 1", 4: "", 5: "◆ 2"}
    assert list(table.loc[table["chain"] != "", "tool"]) == ["chargePayment"] * 2


def test_session_without_alert_shows_the_sequence_unmarked(analysed: dict) -> None:
    at = session_page(analysed["store"], session="ok-3")
    table = next(d.value for d in at.dataframe if {"step", "chain"} <= set(d.value.columns))
    assert list(table["step"]) == [1, 2, 3] and set(table["chain"]) == {""}


def test_flagged_filter_lists_categories_in_the_one_order(analysed: dict) -> None:
    from toolwatch.dashboard import data

    from toolwatch.store import Store

    assert data.CATEGORIES == CATEGORIES
    st_ = Store(analysed["store"])
    try:
        cats = data.alert_filter_options(st_)["categories"]
    finally:
        st_.close()
    assert "duplicate_execution" in cats
    assert cats == sorted(cats, key=CATEGORIES.index)


@settings(max_examples=60, deadline=None)
@example({"chain": [{"chain": None, "time": [None, False, 0]}]})  # time not a string (CI found)
@example({"chain": [{"time": [], "server": 1, "tool": {"x": 1}}]})
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["chain", "time", "tool", "server", "x"]), inner,
                      max_size=4),
    max_leaves=20,
))
def test_hostile_evidence_never_breaks_the_sequence(evidence: object) -> None:
    """Evidence is log-derived: any shape (or broken JSON text) gives the plain sequence."""
    ev = pl.DataFrame({"ts": [T0, T0 + timedelta(seconds=1)], "server": ["s", "s"],
                       "tool": [HOSTILE_TOOL, "x"], "resource_id": [None, "r"],
                       "status": ["ok", "ok"], "bytes": [1, 2]})
    for form in (evidence, json.dumps(evidence) if evidence is not None else None,
                 "{not json"):
        out = call_sequence(ev, form)
        assert out["step"].to_list() == [1, 2]
        assert isinstance(chain_records(form), list)
