"""``_rows_between`` (plain calls as slices between other rows) against a plain filter."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.pipeline import _MAX_CUTS, _rows_between

KINDS = ["call", "quarantine", "summary", "rpc_req"]


@settings(max_examples=200, deadline=None)  # first example pays the imports
@given(st.lists(st.sampled_from(KINDS), max_size=300), st.booleans())
def test_same_rows_as_a_filter(kinds: list[str], mostly_calls: bool) -> None:
    if mostly_calls:  # the common case: a few other rows among many calls
        kinds = [k if i % 7 == 0 else "call" for i, k in enumerate(kinds)]
    kind = pa.chunked_array([pa.array(kinds, pa.string())])
    n = len(kinds)
    tbl = pa.table({"i": pa.array(range(n), pa.int64()), "s": [f"r{i}" for i in range(n)]})
    got = _rows_between(tbl, kind, "call")
    want = tbl.filter(pc.equal(kind, "call"))
    assert got.schema == tbl.schema
    assert got.combine_chunks().equals(want.combine_chunks())


def test_many_other_rows_fall_back_to_one_filter() -> None:
    kinds = ["call", "quarantine"] * (_MAX_CUTS + 1)
    kind = pa.chunked_array([pa.array(kinds)])
    got = _rows_between(pa.table({"i": list(range(len(kinds)))}), kind, "call")
    assert got["i"].to_pylist() == list(range(0, len(kinds), 2))
    assert got["i"].num_chunks == 1  # filtered, not cut into pieces
