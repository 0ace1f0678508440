"""The ``raw`` column's newline trim (``ingest.parse._rtrim_newlines``) is Arrow's trim.

It skips ``pc.utf8_rtrim`` (a copy of every line) when no line ends in ``\\r`` or ``\\n``,
the usual Kafka batch; generated lines, sliced and chunked arrays, nulls and empty lines
must give exactly what the trim gives.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.parse import _rtrim_newlines

line_st = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="ab\r\n \u00e9\u2028", max_size=8),
    st.builds(lambda t, e: t + e, st.text(max_size=8),
              st.sampled_from(["\n", "\r\n", "\r", "\n\r\n"])),
)


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.lists(st.one_of(line_st, st.none()), max_size=12), min_size=1,
                    max_size=3),
    cut=st.integers(0, 3),
)
def test_trim_is_arrows_trim(chunks: list[list[str | None]], cut: int) -> None:
    arrs = [pa.array(c, pa.large_string()) for c in chunks]
    arrs = [a.slice(min(cut, len(a))) for a in arrs]  # offsets not starting at 0
    col = pa.chunked_array(arrs, pa.large_string())
    got = _rtrim_newlines(col)
    want = pc.utf8_rtrim(col, characters="\r\n")
    assert got.type == want.type
    assert got.to_pylist() == want.to_pylist()


def test_untouched_lines_are_not_copied() -> None:
    col = pa.chunked_array([pa.array(["a", "", "b\u00e9"], pa.large_string())])
    assert _rtrim_newlines(col) is col
    assert _rtrim_newlines(pa.chunked_array([pa.array(["a\n"], pa.large_string())])) \
        .to_pylist() == ["a"]
