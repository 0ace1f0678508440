"""The parser reads each field from the first of its aliases that is present and not empty.

``Parser._build_sql`` decides with a ``coalesce`` of the plain fields and falls back to a
per-alias ``nullif`` chain only where that found an empty string: these tests pin the
semantics of the fallback (an empty first alias never hides a later one) on the real
DuckDB statement, with generated values.
"""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.aliases import ALIASES
from toolwatch.ingest.parse import Parser
from toolwatch.ingest.records import RawBatch, split_lines

from toolwatch.config import IngestConfig
from toolwatch.secrets import SecretHasher

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
