"""The byte scans of ``Parser._prepare``: RE2 compiled once over the batch buffer must
find the same lines (secret candidates, BOM, deep nesting, escapes) and the same rare
field groups as Arrow's per-line ``match_substring_regex`` -- for file lines (ending in
``\\n``) and for Kafka messages (no newline) alike. A line the buffer scan missed would
reach DuckDB and the store unredacted."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest import arrays
from toolwatch.ingest.parse import Parser, _BufferScan
from toolwatch.ingest.secrets import SecretHasher

from toolwatch.config import IngestConfig

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



@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    frags=st.lists(st.lists(st.integers(0, len(FRAGMENTS) - 1), max_size=8), min_size=1,
                   max_size=20),
)
def test_split_hits_buffer_refinement_finds_what_arrow_finds(parser: Parser, frags) -> None:
    # _split_hits runs the hit lines of Arrow's combined scan through the patterns
    # compiled once; the lines needing Python and the rare groups must be Arrow's own.
    # (Arrow's big batches arrive without a line's newline here: Kafka messages.)
    lines = _lines(frags, newline=False)
    hits = pc.indices_nonzero(
        pc.match_substring_regex(lines, parser._scan_all, ignore_case=True))
    picked = lines.take(hits)
    at = arrays.to_numpy(hits)
    want = parser._split_arrow(picked, at)
    assert _BufferScan.segments(picked) is not None
    got = parser._split_hits(lines, hits)
    assert got[0] == want[0]
    assert got[1] == want[1]


def test_split_hits_buffer_refinement_runs_with_short_gil_waits(parser: Parser) -> None:
    # one RE2 call per rare-named hit line, each releasing the GIL: as the buffer scan
    seen: list[float] = []
    split = parser._split_buffer

    def spy(*a):
        seen.append(sys.getswitchinterval())
        return split(*a)

    before = sys.getswitchinterval()
    parser._split_buffer = spy  # type: ignore[method-assign]
    try:
        lines = _lines([[0, 1], [10, 2], [0]], newline=False)
        hits = pc.indices_nonzero(
            pc.match_substring_regex(lines, parser._scan_all, ignore_case=True))
        parser._split_hits(lines, hits)
    finally:
        del parser._split_buffer
    assert seen and seen[0] < before
    assert sys.getswitchinterval() == before


def test_inner_newline_falls_back_to_arrow() -> None:
    """A Kafka message holding a newline cannot be a buffer segment: Arrow scans it."""
    lines = arrays.strings([b'{"a":1}', b'{"pass\nword":"x"}'], pa.large_binary())
    assert _BufferScan.segments(lines) is None


def test_scan_runs_with_short_gil_waits_and_restores_the_interval(parser: Parser) -> None:
    """The buffer scan makes one RE2 call per hit line, each releasing the GIL: it runs
    with the switch interval shortened (a busy thread gives the GIL back within 20 us,
    not 5 ms), and the interpreter's interval is back afterwards."""
    from toolwatch.ingest import parse as parse_mod
    from toolwatch.ingest.records import RawBatch

    seen: list[float] = []
    scan_hits = parser._scan_hits

    def spy(*a):
        seen.append(sys.getswitchinterval())
        return scan_hits(*a)

    before = sys.getswitchinterval()
    lines = _lines([[0], [1], [0, 3]], newline=True)
    parser._scan_hits = spy  # type: ignore[method-assign]
    try:
        parser._prepare(RawBatch("t", "fp", lines, np.arange(3), np.arange(1, 4), 0))
    finally:
        del parser._scan_hits
    assert seen and seen[0] <= parse_mod.SCAN_SWITCH_INTERVAL_S * 1.01
    assert sys.getswitchinterval() == before


def test_short_gil_waits_nested_concurrent_and_foreign_changes() -> None:
    """Overlapping blocks (two parse workers) share one change, undone by the last to
    leave; an interval someone else set meanwhile is kept; a shorter one is untouched."""
    from toolwatch.ingest.parse import SCAN_SWITCH_INTERVAL_S, _short_gil_waits

    short = SCAN_SWITCH_INTERVAL_S * 1.01
    before = sys.getswitchinterval()
    try:
        inside, release = threading.Event(), threading.Event()

        def worker() -> None:
            with _short_gil_waits():
                inside.set()
                release.wait(10)

        t = threading.Thread(target=worker)
        with _short_gil_waits():
            t.start()
            assert inside.wait(10)
            with _short_gil_waits():
                assert sys.getswitchinterval() <= short
        assert sys.getswitchinterval() <= short  # the worker is still scanning
        release.set()
        t.join()
        assert sys.getswitchinterval() == before

        with _short_gil_waits():
            sys.setswitchinterval(0.002)  # someone else's choice: kept
        assert sys.getswitchinterval() == pytest.approx(0.002)

        sys.setswitchinterval(1e-5)  # already shorter: left alone
        with _short_gil_waits():
            assert sys.getswitchinterval() == pytest.approx(1e-5)
        assert sys.getswitchinterval() == pytest.approx(1e-5)
    finally:
        sys.setswitchinterval(before)


def test_parsers_of_one_process_share_the_compiled_buffer_scan(parser: Parser) -> None:
    # compiling the candidate pattern is ~30 ms of CPU per parser: a second parser with
    # the same patterns reuses it; other secret keys make other patterns, another scan
    other = Parser(IngestConfig(), SecretHasher(b"k" * 32, [], []), threads=1)
    extra = Parser(IngestConfig(), SecretHasher(b"k" * 32, ["zzcustomname"], []), threads=1)
    try:
        assert other._scan is parser._scan
        assert extra._scan is not parser._scan
        assert extra._scan is not None and extra._scan.at("need", b'"zzcustomname":"v"\n', 0, 19)
    finally:
        other.close()
        extra.close()
