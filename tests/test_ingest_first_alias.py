"""The parser reads each field from the first of its aliases that is present and not empty.

``Parser._build_sql`` decides with a ``coalesce`` of the plain fields and falls back to a
per-alias ``nullif`` chain only where that found an empty string: these tests pin the
semantics of the fallback (an empty first alias never hides a later one) on the real
DuckDB statement, with generated values.
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.aliases import ALIASES
from toolwatch.ingest.parse import RARE_GROUPS, Parser
from toolwatch.ingest.records import RawBatch, split_lines
from toolwatch.ingest.secrets import SecretHasher

from toolwatch.config import IngestConfig

_PARSER = Parser(IngestConfig(), SecretHasher(b"k" * 32), threads=1)
_TS = ALIASES["ts"]  # ts, timestamp, time, @timestamp
_SERVER = ALIASES["server"]


def _parse(objs: list[dict]) -> list[dict]:
    buf = b"".join(orjson.dumps(o) + b"\n" for o in objs)
    lines, offsets, _ = split_lines(buf)
    batch = RawBatch("t", "fp", lines, offsets, np.arange(1, len(objs) + 1), len(buf), True)
    return _PARSER.parse(batch).select(["ts", "server", "reason"]).to_pylist()


def _expected(obj: dict, names: list[str]) -> str | None:
    for n in names:
        v = obj.get(n)
        if v is not None and v != "":
            return v
    return None


_server_values = st.one_of(st.none(), st.just(""), st.sampled_from(["a", "b", " ", "x-y"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={n: _server_values for n in _SERVER}),
                min_size=1, max_size=20))
def test_first_present_non_empty_alias_wins(servers: list[dict]) -> None:
    objs = [{"ts": "2026-11-02T00:00:00Z", "tool": "t", **s} for s in servers]
    rows = _parse(objs)
    assert [r["server"] for r in rows] == [_expected(o, _SERVER) for o in objs]


def test_empty_first_time_alias_falls_through_to_the_next() -> None:
    objs = [
        {"ts": "", "timestamp": "2026-11-02T00:00:01Z", "tool": "t"},
        {"ts": "", "timestamp": "", "@timestamp": "2026-11-02T00:00:02Z", "tool": "t"},
        {"ts": "", "tool": "t"},
        {"timestamp": "2026-11-02T00:00:03Z", "ts": None, "tool": "t"},
    ]
    rows = _parse(objs)
    assert [r["ts"].second if r["ts"] else None for r in rows] == [1, 2, None, 3]
    assert rows[2]["reason"] == "missing_timestamp"


# ---------------------------------------------------------------- rare field groups
_RARE = [n for g in RARE_GROUPS.values() for c in g for n in ALIASES[c]]


def _both(lines: list[bytes]) -> tuple[pa.Table, pa.Table, frozenset[str]]:
    """Parse ``lines`` as the pruning parser does, then with every field read."""
    buf = b"".join(x + b"\n" for x in lines)
    arr, offsets, _ = split_lines(buf)
    batch = RawBatch("t", "fp", arr, offsets, np.arange(1, len(lines) + 1), len(buf), True)
    _PARSER._skip_pruning = 0
    pruned = _PARSER.parse(batch)
    groups = _PARSER._groups
    _PARSER._skip_pruning = 10**9
    full = _PARSER.parse(batch)
    _PARSER._skip_pruning = 0
    return pruned, full, groups


_PLAIN = b'{"ts":"2026-11-02T00:00:00Z","tool":"t","server":"s","duration_ms":5}'


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(_RARE), st.sampled_from(["1793577600.5", "", "x", "7"])),
             max_size=4),
    st.integers(0, 40),
    st.booleans(),
)
def test_reading_only_the_rare_fields_present_changes_nothing(
    rare: list[tuple[str, str]], at: int, escaped: bool
) -> None:
    obj = orjson.loads(_PLAIN)
    for k, v in rare:
        obj[k] = v
    line = orjson.dumps(obj)
    if escaped and rare:  # the first rare name spelled with a \u escape
        name = rare[0][0].encode()
        spelled = name[:1] + b"\\u%04x" % name[1] + name[2:]
        line = line.replace(b'"' + name + b'"', b'"' + spelled + b'"', 1)
    lines = [_PLAIN] * 40
    lines.insert(at, line)
    pruned, full, _ = _both(lines)
    assert pruned.equals(full)


def test_rare_names_in_few_lines_are_read_and_absent_groups_skipped() -> None:
    row = (b'{"ts":"2026-11-02T00:00:01Z","tool":"t","startTs":"2026-11-02T00:00:00Z",'
           b'"endTs":"2026-11-02T00:00:01Z"}')
    pruned, full, groups = _both([_PLAIN] * 30 + [row])
    assert pruned.equals(full)
    assert groups == frozenset({"intervals"})
    assert pruned.column("start_ts")[30].as_py().second == 0
    pruned, full, groups = _both([_PLAIN] * 30)
    assert groups == frozenset() and pruned.equals(full)
    esc = (b'{"ts":"2026-11-02T00:00:01Z","tool":"t","start\\u0054s":"2026-11-02T00:00:00Z",'
           b'"endTs":"2026-11-02T00:00:01Z"}')
    pruned, full, groups = _both([_PLAIN] * 30 + [esc])
    assert groups == frozenset(RARE_GROUPS)
    assert pruned.column("start_ts")[30].as_py().second == 0
