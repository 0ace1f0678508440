"""Hostile input: no line can stop ingestion, and what is stored never breaks a view.

Every line an agent can shape — numbers at and beyond every type's range, nesting, bad
encodings, wrong types under every alias, hostile JSON-RPC ids — must end as an event, a
summary, a merged JSON-RPC response or a quarantine row; the command exits 0, the
checkpoint moves, and ``events``/``sessions``/``summaries``/``quarantine`` all query.

Most tests run the real ``toolwatch`` CLI in-process (``typer.testing.CliRunner`` over
the real app, real files, real store); ``tail`` and ``run`` run as real subprocesses.
Per-class regression tests are named after the class of input they pin down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.conftest import TOOLWATCH
from toolwatch.cli import app
from toolwatch.query import query
from toolwatch.store import Store

pytestmark = pytest.mark.slow  # starts a process

TS = "2026-11-02T10:00:00Z"
KEY = "ab" * 32
VIEWS = ("events", "sessions", "summaries", "quarantine")


def _env(tmp: Path) -> dict[str, str]:
    return {"XDG_CONFIG_HOME": str(tmp / "cfg"), "TOOLWATCH_HMAC_KEY": KEY, "COLUMNS": "200"}


def ingest_cli(tmp: Path, data: bytes, *, cmd: str = "ingest", name: str = "in.jsonl") -> dict:
    """Write ``data`` to a file and run ``toolwatch <cmd> FILE --json`` in-process."""
    path = tmp / name
    path.write_bytes(data)
    store = tmp / "store"
    args = [cmd, str(path), "-d", str(store), "--no-progress"]
    args += ["--json"] if cmd == "ingest" else ["--quiet"]
    res = CliRunner().invoke(app, args, env=_env(tmp), catch_exceptions=True)
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        f"{cmd} raised {res.exception!r}\n{res.output[-3000:]}"
    )
    assert res.exit_code == 0, f"{cmd} exited {res.exit_code}\n{res.output[-3000:]}"
    if cmd == "ingest":
        return json.loads(res.stdout.strip().splitlines()[-1])
    return {}


def accounted(summary: dict, lines: int) -> None:
    """Every line in is exactly one of: event, summary, merged response, quarantined."""
    assert summary["lines_read"] == lines
    total = (
        summary["events_stored"]
        + summary["summaries_stored"]
        + summary["rpc_responses_merged"]
        + summary["quarantined_total"]
    )
    assert total == lines, summary


def views_query(store: Path) -> dict[str, int]:
    """Every view answers a full scan; returns row counts."""
    s = Store(store)
    out = {}
    for v in VIEWS:
        out[v] = query(s, f"SELECT * FROM {v}").num_rows
    # Aggregates the detectors and dashboard lean on.
    query(s, "SELECT sum(bytes), sum(rows), avg(duration_ms), min(ts), max(ts) FROM events")
    query(s, "SELECT max(first_seen), max(last_seen), max(total_bytes) FROM sessions")
    return out


def line(**fields: object) -> bytes:
    return json.dumps({"ts": TS, "session_id": "s", "tool": "t", **fields}).encode()


def rows(store: Path, sql: str) -> list[dict]:
    return query(Store(store), sql).to_pylist()


# --------------------------------------------------------------------- regression classes
def test_before_stop_hook_lines(tmp_path: Path) -> None:
    data = (
        b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t","bytes":1e300}\n'
        b'{"ts":"nan","session_id":"s","tool":"t"}\n'
        b'{"ts":"2026-11-02T10:00:01Z","session_id":"s","tool":"t","args":{"q":"ok"}}\n'
    )
    res = ingest_cli(tmp_path, data)
    accounted(res, 3)
    assert res["events_stored"] == 2
    assert res["quarantined"] == {"bad_timestamp": 1}
    views_query(tmp_path / "store")


@pytest.mark.parametrize(
    "field,value",
    [
        ("bytes", "1e300"),
        ("bytes", "1e309"),
        ("bytes", "-1e309"),
        ("bytes", "1180591620717411303424"),  # 2^70
        ("bytes", "18446744073709551616"),  # 2^64
        ("bytes", "9223372036854775808"),  # 2^63
        ("bytes", '"Infinity"'),
        ("bytes", '"NaN"'),
        ("bytes", '"-inf"'),
        ("bytes", "-5"),
        ("rows", "1180591620717411303424"),
        ("rows", '"1e400"'),
        ("duration_ms", "1e300"),
        ("duration_ms", '"NaN"'),
    ],
)
def test_number_beyond_column_range_is_nulled_and_flagged(
    tmp_path: Path, field: str, value: str
) -> None:
    data = (
        f'{{"ts":"{TS}","session_id":"s","tool":"t","{field}":{value}}}\n'.encode()
        + line(bytes=5, rows=2)
        + b"\n"
    )
    res = ingest_cli(tmp_path, data)
    accounted(res, 2)
    assert res["events_stored"] == 2
    got = rows(tmp_path / "store", f"SELECT {field}, flags FROM events ORDER BY line_no")
    assert got[0][field] is None
    assert got[0]["flags"] and f"out_of_range:{field}" in got[0]["flags"]
    assert got[1]["flags"] is None
    views_query(tmp_path / "store")


def test_number_at_column_range_edges_is_kept(tmp_path: Path) -> None:
    data = b"\n".join(
        [
            line(bytes=2**53 - 1, rows=0),
            line(bytes=-0.0, rows=4.9e-324),
            line(bytes="1e-400", rows="12"),
        ]
    ) + b"\n"
    res = ingest_cli(tmp_path, data)
    accounted(res, 3)
    got = rows(tmp_path / "store", "SELECT bytes, rows, flags FROM events ORDER BY line_no")
    assert got[0] == {"bytes": 2**53 - 1, "rows": 0, "flags": None}
    assert got[1]["bytes"] == 0 and got[1]["flags"] is None
    assert got[2] == {"bytes": 0, "rows": 12, "flags": None}


def test_number_beyond_float64_is_quarantined_never_fatal_in_a_large_file(tmp_path: Path) -> None:
    # The case: 100,001 lines, one poison number; every other line is stored.
    good = line(bytes=10) + b"\n"
    data = good * 50_000 + line(rows=2**70, bytes=float("1e300")) + b"\n" + good * 50_000
    res = ingest_cli(tmp_path, data)
    accounted(res, 100_001)
    assert res["events_stored"] == 100_001
    # The checkpoint moved: a re-run stores nothing new.
    again = ingest_cli(tmp_path, data)
    assert again["lines_read"] == 0


def test_summary_with_huge_duration_keeps_views_working(tmp_path: Path) -> None:
    data = (
        b'{"event":"SESSION_END","sessionId":"s9","ts":"2026-11-02T12:00:00Z",'
        b'"durationMs":1e300,"callCount":1e300,"totalBytesReturned":"Infinity",'
        b'"uniqueResourcesAccessed":-3,"authFailures":1180591620717411303424}\n'
    )
    res = ingest_cli(tmp_path, data)
    accounted(res, 1)
    assert res["summaries_stored"] == 1
    got = rows(tmp_path / "store", "SELECT * FROM summaries")[0]
    for c in ("duration_ms", "call_count", "total_bytes", "unique_resources", "auth_failures"):
        assert got[c] is None, c
        assert f"out_of_range:{c}" in got["flags"]
    views_query(tmp_path / "store")
    sess = rows(tmp_path / "store", "SELECT * FROM sessions")
    assert sess[0]["session_id"] == "s9"


def test_session_longer_than_a_day_keeps_its_duration(tmp_path: Path) -> None:
    # A SESSION_END's duration is a session's length (days are plausible); only a call's
    # in-flight interval is bounded by a day (a 2-day "call" gets no start/end).
    data = (
        b'{"event":"SESSION_END","sessionId":"long","ts":"2026-11-05T12:00:00Z",'
        b'"durationMs":259200000,"callCount":3}\n'
        b'{"ts":"2026-11-05T12:00:00Z","session_id":"c1","tool":"t","duration_ms":172800000}\n'
    )
    res = ingest_cli(tmp_path, data)
    accounted(res, 2)
    su = rows(tmp_path / "store", "SELECT duration_ms, flags FROM summaries")[0]
    assert su == {"duration_ms": 259200000.0, "flags": None}
    ev = rows(tmp_path / "store", "SELECT duration_ms, start_ts, end_ts FROM events")[0]
    assert ev == {"duration_ms": 172800000.0, "start_ts": None, "end_ts": None}
    first = rows(tmp_path / "store", "SELECT first_seen FROM sessions WHERE session_id='long'")
    assert str(first[0]["first_seen"]).startswith("2026-11-02")


@pytest.mark.parametrize(
    "ts", ['"nan"', '"NaN"', "1e30", "-1e30", '"1e30"', '"Infinity"', "1e308", "1e309",
           '"-inf"', "-1", "[1]", '{"a":1}', "true"]
)
def test_timestamp_out_of_range_is_bad_timestamp(tmp_path: Path, ts: str) -> None:
    data = f'{{"ts":{ts},"session_id":"s","tool":"t"}}\n'.encode() + line() + b"\n"
    res = ingest_cli(tmp_path, data)
    accounted(res, 2)
    assert res["events_stored"] == 1
    assert res["quarantined"] == {"bad_timestamp": 1}


@pytest.mark.parametrize("off", ["+25:00", "-25:00", "+14:01", "+99:99", "+2500", "+15"])
def test_timestamp_offset_beyond_14h_is_bad_timestamp(tmp_path: Path, off: str) -> None:
    data = line(ts=f"2026-11-02T10:00:00{off}") + b"\n"
    res = ingest_cli(tmp_path, data)
    assert res["quarantined"] == {"bad_timestamp": 1}


@pytest.mark.parametrize("off", ["+14:00", "-12:00", "+05:30", "-0930", "Z", "+00:00"])
def test_timestamp_offset_within_14h_is_kept(tmp_path: Path, off: str) -> None:
    data = line(ts=f"2026-11-02T10:00:00{off}") + b"\n"
    res = ingest_cli(tmp_path, data)
    assert res["events_stored"] == 1, res


def test_bom_first_line(tmp_path: Path) -> None:
    data = b"\xef\xbb\xbf" + line(tool="first") + b"\n" + line(tool="second") + b"\n"
    res = ingest_cli(tmp_path, data)
    accounted(res, 2)
    assert res["events_stored"] == 2
    got = rows(tmp_path / "store", "SELECT tool, line_no FROM events ORDER BY line_no")
    assert [r["tool"] for r in got] == ["first", "second"]


def test_bom_mid_file_line_is_stored(tmp_path: Path) -> None:
    # Concatenated files: a BOM at the start of a later line.
    data = line(tool="a") + b"\n\xef\xbb\xbf" + line(tool="b") + b"\n"
    res = ingest_cli(tmp_path, data)
    accounted(res, 2)
    assert res["events_stored"] == 2


@pytest.mark.parametrize("depth", [33, 300, 1000, 5000])
@pytest.mark.parametrize("key", ["q", "password"])
def test_arguments_nested_deeper_than_limit_are_truncated_with_flag(
    tmp_path: Path, depth: int, key: str
) -> None:
    deep = "[" * depth + "1" + "]" * depth
    data = (
        f'{{"ts":"{TS}","session_id":"s","tool":"t","args":{{"{key}":{deep}}}}}\n'.encode()
        + line(args={"a": [[[1]]]})
        + b"\n"
    )
    res = ingest_cli(tmp_path, data)
    accounted(res, 2)
    assert res["events_stored"] == 2
    got = rows(tmp_path / "store", "SELECT args, flags FROM events ORDER BY line_no")
    assert got[0]["flags"] == "too_deep"
    stored = json.loads(got[0]["args"])
    assert set(stored) == {"_truncated"} and len(stored["_truncated"]) <= 1024
    assert got[1] == {"args": '{"a":[[[1]]]}', "flags": None}
    views_query(tmp_path / "store")


def test_arguments_nested_at_the_limit_are_kept(tmp_path: Path) -> None:
    inner = "[" * 30 + "1" + "]" * 30  # args object + 30 lists = 31 levels, line = 32
    data = f'{{"ts":"{TS}","session_id":"s","tool":"t","args":{{"q":{inner}}}}}\n'.encode()
    ingest_cli(tmp_path, data)
    got = rows(tmp_path / "store", "SELECT args, flags FROM events")
    assert got[0]["flags"] is None and json.loads(got[0]["args"])["q"]


def test_lone_surrogate_escape_is_repaired_not_fatal(tmp_path: Path) -> None:
    data = b"\n".join(
        [
            line(tool="a") ,
            b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t\\ud800","x":"\\udc00"}',
            line(tool="c"),
        ]
    ) + b"\n"
    res = ingest_cli(tmp_path, data)
    accounted(res, 3)
    assert res["events_stored"] == 3
    got = rows(tmp_path / "store", "SELECT tool FROM events ORDER BY line_no")
    assert got[1]["tool"] == "t\ufffd"


def test_wrong_types_under_every_alias_are_coerced_or_nulled(tmp_path: Path) -> None:
    from toolwatch.ingest.aliases import merged_aliases

    hostile_values = [{"a": {"b": 1}}, [1, [2]], True, None, 1e308, -1, "", "x" * 300]
    lines = []
    for canon, names in merged_aliases({}).items():
        for n in names:
            if "/" in n:
                continue
            for v in hostile_values:
                lines.append(json.dumps({"ts": TS, "tool": "t", n: v}).encode())
    res = ingest_cli(tmp_path, b"\n".join(lines) + b"\n")
    accounted(res, len(lines))
    views_query(tmp_path / "store")


def test_jsonrpc_with_hostile_ids_is_accounted(tmp_path: Path) -> None:
    ids = [1e300, 2**70, -0.0, None, {"a": 1}, [1, 2], "x" * 5000, True, "\u0000", 1e-400]
    out = []
    for i, rid in enumerate(ids):
        req = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
               "params": {"name": "getDocument", "arguments": {"documentId": f"d{i}"}}}
        resp = {"jsonrpc": "2.0", "id": rid, "result": {"content": [], "isError": False}}
        out.append(json.dumps({"ts": TS, "session_id": "c", "message": req}).encode())
        out.append(json.dumps({"ts": TS, "session_id": "c", "message": resp}).encode())
    out[-1] = out[-1].replace(b"-0.0", b"1e-400")
    res = ingest_cli(tmp_path, b"\n".join(out) + b"\n")
    accounted(res, len(out))
    views_query(tmp_path / "store")


# --------------------------------------------------------------------- every command
HOSTILE_FILE = b"".join(
    x + b"\n"
    for x in [
        b"\xef\xbb\xbf" + line(tool="bom"),
        line(bytes=1e300),
        b'{"ts":"nan","session_id":"s","tool":"t"}',
        b'{"ts":1e30,"session_id":"s","tool":"t"}',
        line(rows=2**70),
        line(ts="2026-11-02T10:00:00+25:00"),
        b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t\\ud800"}',
        b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t","args":{"password":'
        + b"[" * 800 + b"1" + b"]" * 800 + b"}}",
        b'{"event":"SESSION_END","sessionId":"s","ts":"2026-11-02T12:00:00Z","durationMs":1e300}',
        b"\xff\xfe garbage \x00",
        line(tool="last", args={"q": "ok"}),
    ]
)
HOSTILE_LINES = HOSTILE_FILE.count(b"\n")


def test_hostile_file_through_ingest(tmp_path: Path) -> None:
    res = ingest_cli(tmp_path, HOSTILE_FILE)
    accounted(res, HOSTILE_LINES)
    assert views_query(tmp_path / "store")["events"] == res["events_stored"]


def test_hostile_file_through_analyze(tmp_path: Path) -> None:
    ingest_cli(tmp_path, HOSTILE_FILE, cmd="analyze")
    counts = views_query(tmp_path / "store")
    assert counts["events"] + counts["summaries"] + counts["quarantine"] == HOSTILE_LINES


def _wait_for(pred, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


def _stored(store: Path) -> int:
    try:
        c = views_query(store)
    except Exception:
        return -1
    return c["events"] + c["summaries"] + c["quarantine"]


def test_hostile_file_through_tail(tmp_path: Path) -> None:
    path = tmp_path / "tail.jsonl"
    path.write_bytes(HOSTILE_FILE)
    store = tmp_path / "store"
    env = {**os.environ, **_env(tmp_path)}
    proc = subprocess.run(
        [TOOLWATCH, "tail", str(path), "-d", str(store), "--exit-when-idle", "2"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _stored(store) == HOSTILE_LINES


def test_hostile_lines_through_run(tmp_path: Path) -> None:
    # A wrapped "server" that writes the hostile lines to stderr, then exits.
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(HOSTILE_FILE)
    store = tmp_path / "store"
    env = {**os.environ, **_env(tmp_path)}
    server = [sys.executable, "-c",
              f"import sys; sys.stderr.buffer.write(open({str(path)!r},'rb').read())"]
    proc = subprocess.run(
        [TOOLWATCH, "run", "-d", str(store), "--", *server],
        capture_output=True, env=env, timeout=120,  # its stderr echoes the hostile bytes
    )
    assert proc.returncode == 0, proc.stderr[-3000:].decode("utf-8", "replace")
    # Non-JSON stderr text is kept as server_text; every line ends somewhere.
    assert _stored(store) == HOSTILE_LINES


# --------------------------------------------------------------------- property-based
_INT_EDGES = [0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1,
              2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**70, 10**30, -(10**400)]
_NUM_TEXT = ["1e308", "-1e308", "1e309", "-1e309", "-0", "-0.0", "4.9e-324",
             "2.2250738585072014e-308", "1e-400", "1e99999", "123456789012345678901234567890.5",
             "0.1e-99999",
             "NaN", "Infinity", "-Infinity", "1E400", "0e0", "-0e-0", "9" * 400]


def _number_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([str(i) for i in _INT_EDGES] + _NUM_TEXT),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.integers().map(str),
    )


_KNOWN = ["ts", "timestamp", "time", "@timestamp", "session_id", "sessionId", "mcp.session.id",
          "caller_id", "callerId", "client_ip", "ip", "server", "serverName", "tool", "toolName",
          "name", "args", "arguments", "params", "input", "resource_id", "status", "outcome",
          "isError", "is_error", "bytes", "bytesReturned", "rows", "rowsReturned",
          "duration_ms", "durationMs", "latency_ms", "event", "callCount", "call_count",
          "uniqueResourcesAccessed", "totalBytesReturned", "authFailures", "jsonrpc", "id",
          "method", "result", "error", "message", "payload", "start_ts", "end_ts", "duration_s"]


def _nested(depth: int, leaf: str) -> str:
    opens = "".join("[" if i % 2 else '{"k":' for i in range(depth))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    return opens + leaf + closes


def _value_text() -> st.SearchStrategy[str]:
    """JSON text of a hostile value (numbers as text so they can exceed Python's floats)."""
    scalar = st.one_of(
        _number_text(),
        _number_text().map(lambda t: json.dumps(t)),  # numbers as strings
        st.text(max_size=40).map(json.dumps),
        st.sampled_from(["true", "false", "null", '""', '"\\u0000"', '"\\ud800"',
                         '"\\udfff\\ud800"', '"\\u202e"', '"\\x"', '"2026-11-02T10:00:00+25:00"',
                         '"9999-12-31"', '"nan"', '"0001-01-01T00:00:00Z"']),
        st.integers(min_value=1, max_value=3000).map(lambda d: _nested(d, "1")),
        st.integers(min_value=0, max_value=60_000).map(lambda n: json.dumps("A" * n)),
    )
    return st.recursive(
        scalar,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
            st.lists(st.tuples(st.sampled_from([*_KNOWN, "password", "x"]), inner), max_size=4)
            .map(lambda kv: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in kv) + "}"),
        ),
        max_leaves=8,
    )


#: Built once: a recursive strategy rebuilt for every draw was re-validated each time,
#: which cost more than the ingests it fed.
VALUE_TEXT = _value_text()


@st.composite
def hostile_line(draw: st.DrawFn) -> bytes:
    """One hostile line: a mostly-valid call with hostile values, or hostile bytes."""
    kind = draw(st.integers(0, 9))
    if kind == 0:  # raw bytes: invalid UTF-8, overlong encodings, NUL, control chars
        return draw(
            st.one_of(
                st.binary(max_size=200),
                st.sampled_from([b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                 b"\x00", b"\x1b[31m", b"\xef\xbb\xbf", b"\r", b"{}", b"[]"]),
            ).map(lambda b: b.replace(b"\n", b"\\n"))
        )
    pairs: list[tuple[str, str]] = [("ts", json.dumps(TS)), ("session_id", '"s"'), ("tool", '"t"')]
    for _ in range(draw(st.integers(0, 5))):
        pairs.append((draw(st.sampled_from(_KNOWN)), draw(VALUE_TEXT)))
    if draw(st.booleans()):  # duplicate keys
        k, _v = draw(st.sampled_from(pairs))
        pairs.append((k, draw(VALUE_TEXT)))
    if kind == 1:  # JSON-RPC shapes with hostile ids
        rid = draw(VALUE_TEXT)
        msg = draw(st.sampled_from([
            '{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"t","arguments":{}}}',
            '{"jsonrpc":"2.0","id":%s,"result":{"content":[],"isError":false}}',
            '{"jsonrpc":"2.0","id":%s,"error":{"code":1e400,"message":null}}',
            '{"jsonrpc":"2.0","id":%s,"method":"initialize"}',
        ])) % rid
        pairs.append((draw(st.sampled_from(["message", "payload", "msg"])), msg))
    draw(st.randoms()).shuffle(pairs)
    text = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"
    out = text.encode("utf-8", "surrogatepass")
    if kind == 2:  # a BOM, a control byte or a cut somewhere
        at = draw(st.integers(0, len(out)))
        out = out[:at] + draw(st.sampled_from([b"\xef\xbb\xbf", b"\x00", b"\x7f", b"\x1b", b""]))
    return out.replace(b"\n", b" ")


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(hostile_line(), min_size=1, max_size=12))
def test_hostile_lines_are_all_accounted_and_views_query(tmp_path_factory, lines) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    data = b"\n".join(lines) + b"\n"
    n = data.count(b"\n")
    res = ingest_cli(tmp, data)
    accounted(res, n)
    counts = views_query(tmp / "store")
    assert counts["quarantine"] == res["quarantined_total"]
    assert counts["summaries"] == res["summaries_stored"]


@pytest.mark.slow
# Bigger files, fewer runs: an ingest run costs ~1.3 s whether it reads 4 lines or 240,
# so 100 runs of 15-60 lines (~30 on average, ~3,000 hostile lines) replace 400 runs of
# 1-60 (Hypothesis averages ~6 per list: ~2,600 lines). Small files are the test above.
@pytest.mark.timeout(1800)
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(hostile_line(), min_size=15, max_size=60))
def test_hostile_lines_are_all_accounted_slow(tmp_path_factory, lines) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    data = b"\n".join(lines) + b"\n"
    res = ingest_cli(tmp, data)
    accounted(res, data.count(b"\n"))
    views_query(tmp / "store")


def test_hostile_messages_through_the_kafka_path(tmp_path: Path, monkeypatch) -> None:
    """``kafka`` builds its batches with ``message_batch`` and hands them to the same
    LivePipeline/Pipeline as ``tail``/``run``: hostile messages (tombstones included) are
    all accounted for and the partition's checkpoint moves past them."""
    from collections import namedtuple

    from kafka import TopicPartition
    from toolwatch.ingest.sources.kafka import message_batch

    from toolwatch.cli_common import config_for
    from toolwatch.live import LivePipeline

    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", KEY)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    Rec = namedtuple("Rec", "offset value")
    msgs = [Rec(i, v) for i, v in enumerate([*HOSTILE_FILE.splitlines(), None, b"\n\n"])]
    data = tmp_path / "store"
    cfg = config_for(None, str(data))
    cfg.live = {"detect": False}
    lp = LivePipeline(cfg, Store(data), kind="kafka")
    try:
        lp.add(message_batch(TopicPartition("logs", 0), msgs, 0))
        lp.flush()
    finally:
        lp.close()
    c = views_query(data)
    assert c["events"] + c["summaries"] + c["quarantine"] == len(msgs)
    assert Store(data).checkpoints()["kafka:logs:0"] == len(msgs)


# --------------------------------------------------------------------- fallbacks
# The SQL and transforms are written not to raise on any input; these tests inject a
# failure for one marked line (as an unknown future bug would) into the real components
# and check that only that line is lost to quarantine, the rest stored, the run exits 0.
def _marked_file(n: int, marker: str, at: int) -> bytes:
    out = [line(tool=f"t{i}", args={"i": i}) for i in range(n)]
    out[at] = line(tool=marker)
    return b"\n".join(out) + b"\n"


def _check_one_unprocessable(tmp: Path, res: dict, n: int, marker: str) -> None:
    accounted(res, n)
    assert res["events_stored"] == n - 1
    assert res["quarantined"] == {"unprocessable": 1}
    q = rows(tmp / "store", "SELECT detail, raw, line_no FROM quarantine")
    assert marker in q[0]["raw"] and "boom" in q[0]["detail"]
    again = ingest_cli(tmp, (tmp / "in.jsonl").read_bytes())
    assert again["lines_read"] == 0  # the checkpoint moved past the whole file


def test_sql_failure_on_one_line_quarantines_only_that_line(tmp_path: Path, monkeypatch) -> None:
    import duckdb
    import pyarrow.compute as pc
    from toolwatch.ingest.parse import Parser

    real = Parser._run_sql

    def failing(self, tbl):
        # As a JSON function would: a line already quarantined is never parsed.
        parsed = tbl.filter(pc.is_null(tbl.column("pre_reason")))
        if pc_contains(parsed.column("line"), "boom-sql"):
            raise duckdb.ConversionException("boom: injected")
        return real(self, tbl)

    monkeypatch.setattr(Parser, "_run_sql", failing)
    res = ingest_cli(tmp_path, _marked_file(500, "boom-sql", 321))
    _check_one_unprocessable(tmp_path, res, 500, "boom-sql")


def test_parse_failure_on_one_line_quarantines_only_that_line(tmp_path: Path, monkeypatch) -> None:
    from toolwatch.ingest.parse import Parser

    real = Parser._prepare

    def failing(self, batch):
        tbl = real(self, batch)
        if pc_contains(tbl.column("line"), "boom-prep"):
            raise RuntimeError("boom: injected in the byte checks")
        return tbl

    monkeypatch.setattr(Parser, "_prepare", failing)
    res = ingest_cli(tmp_path, _marked_file(300, "boom-prep", 0))
    _check_one_unprocessable(tmp_path, res, 300, "boom-prep")


def test_transform_failure_on_one_line_quarantines_only_that_line(
    tmp_path: Path, monkeypatch
) -> None:
    from toolwatch.ingest.pipeline import Pipeline

    real = Pipeline._events

    def failing(self, calls, paired, batch, now):
        if pc_contains(calls.column("tool"), "boom-tx"):
            raise ValueError("boom: injected in a transform")
        return real(self, calls, paired, batch, now)

    monkeypatch.setattr(Pipeline, "_events", failing)
    data = _marked_file(400, "boom-tx", 399)
    res = ingest_cli(tmp_path, data)
    _check_one_unprocessable(tmp_path, res, 400, "boom-tx")
    # The derived sessions were not double counted by the failed attempt.
    assert views_query(tmp_path / "store")["events"] == 399


def pc_contains(col, needle: str) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(pc.match_substring(col.cast("large_string"), needle)).as_py())


@pytest.mark.parametrize(
    "bad", [rb'"\u"', rb'"\u12"', rb'"\u00zz"', rb'"\ud800\u"', rb'"x\\\u"', rb'"\uDFFF"']
)
def test_incomplete_unicode_escape_never_stops_ingest(tmp_path: Path, bad: bytes) -> None:
    # Under a plain key and under a secret-like one (which takes the redaction path).
    data = b"\n".join(
        [
            b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t","args":{"q":' + bad + b"}}",
            b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t","args":{"password":'
            + bad + b"}}",
            line(tool="after"),
        ]
    ) + b"\n"
    res = ingest_cli(tmp_path, data)
    accounted(res, 3)
    assert res["events_stored"] >= 1
    views_query(tmp_path / "store")
