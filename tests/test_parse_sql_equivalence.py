"""Parse output is pinned by a golden file; its fast paths give the rows of the paths
they stand in for.

* Golden: a fixed corpus of hostile lines (every alias spelling, empty and wrong-typed
  values, numeric and ISO times with odd zones, huge numbers, secrets, deep nesting,
  BOMs, invalid UTF-8, NUL bytes, JSON-RPC and summaries, over-long lines) parses to
  ``tests/golden/parse_rows.jsonl``. A change to what ingest stores shows up as a diff of
  that file: regenerate it with ``TOOLWATCH_UPDATE_GOLDEN=1`` and review the diff.
* Scan: the compile-once RE2 buffer scan (re-testing hit lines in one small buffer)
  against Arrow's per-line scan (``BUFFER_SCAN_MAX_LINES = 0`` forces it), over whole
  ``Parser.parse`` outputs: same redaction, same flags, same rows.
* Fetch: DuckDB's direct Arrow runner against the public ``to_arrow_table`` path.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest import arrays
from toolwatch.ingest import parse as parse_mod
from toolwatch.ingest.aliases import merged_aliases
from toolwatch.ingest.parse import Parser
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.secrets import SecretHasher

from toolwatch.config import IngestConfig

GOLDEN = Path(__file__).parent / "golden" / "parse_rows.jsonl"
_ALIASES = merged_aliases({})
_NAMES = sorted({n for names in _ALIASES.values() for n in names if "/" not in n})

_VALUES = [
    '""', '"x"', "null", "true", "0", "-1", "1e400", "123456789012345678901234567890",
    "9007199254740992", "1.5", '"12"', "{}", "[]", '{"a":1}', '"2026-11-02T00:00:00Z"',
    '"2026-11-02T00:00:00+25:00"', '"2026-11-02T00:00:00-09:30"', '"2026-11-02 00:00:00"',
    "1793577600085", "1793577600", "1793577600085000", "1793577600085000000", "1e20",
    '"NaN"', '"inf"', '"SESSION_END"', '"session_anomaly"', '"2.0"', '"tools/call"',
    '"ok"', '"PERMISSION_DENIED"', '"\\u0000"', '"\\ud800"', '"pa\\u0073s"',
]
_GOOD_TS = [
    '"2026-11-02T00:00:00.034000+00:00"', '"2026-11-02T00:00:00.061Z"', "1793577600085",
    '"1793577600"', '"2026-11-02T00:00:00+05:30"', '"2026-11-02T00:00:00+14:01"',
    "1793577600085000", '"1999-12-31T23:59:59Z"', '""',
]
_ARGS = [
    '{"path":"/a"}', '{"userId":"u1","q":"x"}', '{"id":1,"id":2}', '{"uri":{"x":1}}',
    '{"password":"hunter2","path":"/p"}', '{"apiKey":"sk-abcdefghijklmnopqrstu"}',
    '"{\\"path\\":\\"/s\\"}"', '{"pa\\u0074h":"/e"}', '[1,2]', '{"page":3}',
    '{"q":' + "[" * 40 + "]" * 40 + "}", '{"Authorization":"Bearer abcdefghijklmnop"}',
]
_RAW = [
    b"", b"not json", b"[1,2]", b"null", b'{"ts":', b"\xef\xbb\xbf", b"\xff\xfe", b"\x00",
    b'{"a":"\xc3\xa9"}', b"{" * 40,
    b'{"jsonrpc":"2.0","id":1,"method":"tools/call","ts":1793577600,'
    b'"params":{"name":"t","arguments":{"path":"/x"}}}',
    b'{"event":"SESSION_END","session_id":"s-1","ts":"2026-11-02T00:00:00Z",'
    b'"call_count":3,"total_bytes":1e30,"duration_s":5}',
    b'{"ts":1793577600,"tool":"t","start_ts":"2026-11-02T00:00:00Z",'
    b'"end_ts":"2026-11-02T00:00:01Z","duration_s":"2"}',
    b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"text":"hi"}],"isError":true}}',
    b'{"jsonrpc":"2.0","id":2,"error":{"code":-1,"message":"denied"}}',
    b'{"message":"{\\"jsonrpc\\":\\"2.0\\",\\"method\\":\\"ping\\"}"}',
    b"token=abcdefghijklmnopqrstuvwxyz https://u:p@h/x",
]


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        tail = draw(st.binary(max_size=8)) if draw(st.booleans()) else b""
        return draw(st.sampled_from(_RAW)) + tail
    keys = draw(st.lists(st.sampled_from([*_NAMES, "args", "arguments", "x"]), max_size=9))
    parts = []
    if draw(st.integers(0, 3)):  # mostly a plausible call: a time, a tool, arguments
        for canon, good in (("ts", _GOOD_TS), ("tool", ['"readFile"']),
                            ("args", _ARGS), ("session_id", ['"s-1"', '""']),
                            ("bytes", ["12", '"7"', "-3", "1e300"])):
            name = draw(st.sampled_from([n for n in _ALIASES[canon] if "/" not in n]))
            parts.append(f'"{name}":{draw(st.sampled_from(good))}')
    for k in keys:
        v = draw(st.sampled_from(_ARGS)) if k in ("args", "arguments", "params", "input") \
            else draw(st.sampled_from(_VALUES))
        parts.append(f'"{k}":{v}')
    body = ("{" + ",".join(parts) + "}").encode()
    prefix = draw(st.sampled_from([b"", b"", b" ", b"\xef\xbb\xbf"]))
    return prefix + body


def _batch(lines: list[bytes], newline: bool) -> RawBatch:
    raw = [b + b"\n" if newline else b for b in lines]
    offs, pos = [], 0
    for b in raw:
        offs.append(pos)
        pos += len(b)
    return RawBatch(
        source="t", source_fp="fp", lines=arrays.strings(raw, pa.large_binary()),
        offsets=offs, line_nos=list(range(1, len(raw) + 1)) if newline else None,
        end_offset=pos,
    )


def _config() -> IngestConfig:
    cfg = IngestConfig()
    cfg.max_line_bytes = 2000  # some generated lines are over-long
    return cfg


@pytest.fixture(scope="module")
def parsers():
    new = Parser(_config(), SecretHasher(b"k" * 32, [], []), threads=1)
    yield new, None
    new.close()


def _same(a: pa.Table, b: pa.Table) -> None:
    assert a.schema == b.schema
    for name in a.column_names:
        # ChunkedArray.equals: values, not chunk layout (to_pylist cannot hold the
        # infinite timestamps a hostile "inf" time parses to).
        assert a.column(name).equals(b.column(name)), name


def _fixed_line(rnd: random.Random) -> bytes:
    """One line of the golden corpus: the shapes of :func:`_line`, drawn from ``rnd``."""
    if rnd.randrange(10) == 0:
        return rnd.choice(_RAW) + (rnd.randbytes(rnd.randrange(9)) if rnd.random() < 0.5
                                   else b"")
    parts = []
    if rnd.randrange(4):
        for canon, good in (("ts", _GOOD_TS), ("tool", ['"readFile"']),
                            ("args", _ARGS), ("session_id", ['"s-1"', '""']),
                            ("bytes", ["12", '"7"', "-3", "1e300"])):
            name = rnd.choice([n for n in _ALIASES[canon] if "/" not in n])
            parts.append(f'"{name}":{rnd.choice(good)}')
    for k in rnd.choices([*_NAMES, "args", "arguments", "x"], k=rnd.randrange(10)):
        v = rnd.choice(_ARGS) if k in ("args", "arguments", "params", "input") \
            else rnd.choice(_VALUES)
        parts.append(f'"{k}":{v}')
    return rnd.choice([b"", b"", b" ", b"\xef\xbb\xbf"]) + ("{" + ",".join(parts) + "}").encode()


def _golden_rows(parser: Parser) -> list[str]:
    """The corpus parsed in batches of 30 (with and without line ends), one JSON text
    per output row; times as epoch µs and floats as ``repr`` so ±inf and NaN survive."""
    rnd = random.Random(20261129)
    lines = [*_RAW, *(_fixed_line(rnd) for _ in range(600)),
             b'{"ts":1793577600,"tool":"t","args":{"q":"' + b"a" * 3000 + b'"}}']
    out: list[str] = []
    for i in range(0, len(lines), 30):
        t = parser.parse(_batch(lines[i:i + 30], newline=(i // 30) % 2 == 0))
        cols = {}
        for name, col in zip(t.column_names, t.columns, strict=True):
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.int64())
            vals = col.to_pylist()
            if pa.types.is_floating(col.type):
                vals = [None if v is None else repr(v) for v in vals]
            cols[name] = vals
        out.extend(orjson.dumps({k: v[r] for k, v in cols.items()}).decode()
                   for r in range(t.num_rows))
    return out


def test_parse_output_equals_the_golden_file(parsers) -> None:
    got = _golden_rows(parsers[0])
    if os.environ.get("TOOLWATCH_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(got) + "\n")
    want = GOLDEN.read_text().splitlines()
    kinds = {orjson.loads(r)["kind"] for r in want}
    assert {"call", "quarantine", "rpc_req", "rpc_resp", "summary"} <= kinds  # not vacuous
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        assert g == w, f"row {i} differs from {GOLDEN.name} (see the module docstring)"
    assert len(got) == len(want)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(_line(), min_size=1, max_size=30), newline=st.booleans())
def test_buffer_scan_parse_equals_arrow_scan_parse(parsers, lines, newline, monkeypatch_module
                                                   ) -> None:
    new, _ = parsers
    batch = _batch(lines, newline)
    new._skip_pruning = 0
    got = new.parse(batch)
    monkeypatch_module.setattr(parse_mod, "BUFFER_SCAN_MAX_LINES", 0)
    try:
        new._skip_pruning = 0
        want = new.parse(batch)
    finally:
        monkeypatch_module.undo()
    _same(got, want)


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.slow  # searches the strategy for every kind, ~10 s
def test_generated_lines_reach_every_kind(parsers) -> None:
    """The strategy is not vacuous: its lines come out as calls, summaries, JSON-RPC
    halves and quarantine (checked on a fixed sample)."""
    from hypothesis import find

    new, _ = parsers
    kinds: set[str] = set()

    def covers(lines: list[bytes]) -> bool:
        kinds.update(new.parse(_batch(lines, True)).column("kind").to_pylist())
        return {"call", "quarantine", "rpc_req", "rpc_resp", "summary"} <= kinds

    try:
        find(st.lists(_line(), min_size=20, max_size=40), covers,
             settings=settings(max_examples=500, database=None, deadline=None))
    finally:
        print(sorted(kinds))


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(
        st.tuples(st.text(max_size=12), st.sampled_from(["", "\n", "\r\n", "\r", "\n\r\n", "x"])),
        max_size=12,
    ),
    cut=st.integers(0, 3),
    chunks=st.integers(1, 3),
)
def test_strip_line_ends_equals_utf8_rtrim(texts, cut, chunks) -> None:
    """The raw column skips the copy when no line ends in a newline (Kafka messages):
    same values as ``utf8_rtrim`` either way, sliced and chunked arrays included."""
    import pyarrow.compute as pc

    values = [a + b for a, b in texts]
    arr = arrays.strings(values, pa.large_string()).slice(min(cut, len(values)))
    step = max(1, len(arr) // chunks)
    parts = [arr.slice(i, step) for i in range(0, len(arr), step)] or [arr]
    col = pa.chunked_array(parts, pa.large_string())
    got = parse_mod.strip_line_ends(col)
    assert got.equals(pc.utf8_rtrim(col, characters="\r\n"))
    if not any(v.endswith(("\r", "\n")) for v in arr.to_pylist()):
        assert got is col  # no copy


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(_line(), min_size=1, max_size=30), newline=st.booleans())
def test_direct_arrow_result_equals_the_public_path(parsers, lines, newline,
                                                    monkeypatch_module) -> None:
    """The parse statement's rows fetched by DuckDB's runner (``_execute_arrow``) are
    those of ``con.sql(...).to_arrow_table()``."""
    assert parse_mod._submit_works(parsers[0]._con)
    new, _ = parsers
    batch = _batch(lines, newline)
    got = new.parse(batch)
    monkeypatch_module.setattr(parse_mod, "_SUBMIT_OK", False)
    try:
        want = new.parse(batch)
    finally:
        monkeypatch_module.undo()
    _same(got, want)
