"""The byte scans of ``Parser._prepare``: RE2 compiled once over the batch buffer must
find the same lines (secret candidates, BOM, deep nesting, escapes) and the same rare
field groups as Arrow's per-line ``match_substring_regex`` -- for file lines (ending in
``\\n``) and for Kafka messages (no newline) alike. A line the buffer scan missed would
reach DuckDB and the store unredacted."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest import arrays
from toolwatch.ingest.parse import Parser, _BufferScan

from toolwatch.config import IngestConfig
from toolwatch.secrets import SecretHasher

FRAGMENTS = [
    b'{"ts":1,"tool":"x","args":{"q":"a"}}', b'"password":"hunter2"', b"apiKey=abc",
    b"Bearer abcdefghijklmnop", b"https://u:p@h/x", b"\\u0041", b"\\ud800", b"\xef\xbb\xbf",
    b"[" * 40, b"{" * 35, b'"jsonrpc":"2.0"', b'"event":"SESSION_END"', b'"duration_s":3',
    b'"start_ts":1', b"\r", b"\xff\xfe", b"\xc3\xa9", b"AUTH", b"token",
    b"sk-abcdefghijklmnopqrstu",
    b"eyJhbGciOi.eyJzdWIi.sig", b" ", b":", b"=", b'"', b"\\", b"pass", b"%5F", b"\x00",
]


@pytest.fixture(scope="module")
def parser() -> Parser:
    hasher = SecretHasher(b"k" * 32, [], [])
    p = Parser(IngestConfig(), hasher, threads=1)
    assert p._scan is not None, "google-re2 is a dependency: the buffer scan must be on"
    yield p
    p.close()


def _lines(frags: list[list[int]], newline: bool) -> pa.LargeBinaryArray:
    out = [b"".join(FRAGMENTS[i] for i in f) + (b"\n" if newline else b"") for f in frags]
    return arrays.strings(out, pa.large_binary())


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    frags=st.lists(st.lists(st.integers(0, len(FRAGMENTS) - 1), max_size=8), min_size=1,
                   max_size=20),
    newline=st.booleans(),
)
def test_buffer_scan_finds_what_arrow_finds(parser: Parser, frags, newline) -> None:
    lines = _lines(frags, newline)
    # File lines are scanned without their newline (what redaction sees); strip it for
    # the reference too, so both look at the same text.
    ref = arrays.strings([b.rstrip(b"\n") for b in lines.to_pylist()], pa.large_binary())
    parser._skip_pruning = 0
    want = parser._scan_arrow(ref, len(ref))
    want_groups = parser._groups
    parser._skip_pruning = 0  # the Arrow scan may have set it: both start alike
    seg = _BufferScan.segments(lines)
    assert seg is not None
    got, groups = parser._scan_hits(*seg)
    assert got == want
    if len(want) * 8 <= len(lines):  # else Arrow's path reads every group, by design
        assert groups == want_groups


def test_inner_newline_falls_back_to_arrow() -> None:
    """A Kafka message holding a newline cannot be a buffer segment: Arrow scans it."""
    lines = arrays.strings([b'{"a":1}', b'{"pass\nword":"x"}'], pa.large_binary())
    assert _BufferScan.segments(lines) is None
