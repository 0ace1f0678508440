"""The log contract: every alias and format, through the real CLI into the real store."""

from __future__ import annotations

import gzip
import json

import pytest
from toolwatch.ingest.aliases import ALIASES

from tests.conftest import CLI

BASE = {
    "ts": "2026-11-02T10:00:00Z",
    "session_id": "s-1",
    "caller_id": "alice",
    "client_ip": "10.1.2.3",
    "server": "docs",
    "tool": "getDocument",
    "args": {"documentId": "doc-1001"},
    "status": "ok",
    "bytes": 100,
    "rows": 2,
    "duration_ms": 5.5,
}
CANON_VALUE = {
    "ts": "2026-11-02T10:00:00Z",
    "session_id": "s-alias",
    "caller_id": "bob",
    "client_ip": "192.0.2.9",
    "server": "crm",
    "tool": "searchItems",
    "args": {"query": "x", "customerId": "c-77"},
    "resource_id": "res-9",
    "status": "not_found",
    "bytes": 4321,
    "rows": 17,
    "duration_ms": 12.25,
}
# Fields whose aliases are exercised as a per-call event.
CALL_FIELDS = [
    "ts",
    "session_id",
    "caller_id",
    "client_ip",
    "server",
    "tool",
    "args",
    "resource_id",
    "status",
    "bytes",
    "rows",
    "duration_ms",
]
CASES = [(f, a) for f in CALL_FIELDS for a in ALIASES[f]]
COLUMN = {"args": "args", "ts": "ts"}


TIMESTAMP_FORMS = [
    ("2026-11-02T10:00:00.250Z", "2026-11-02T10:00:00.250"),
    ("2026-11-02T11:00:00+01:00", "2026-11-02T10:00:00"),
    ("2026-11-02 10:00:00", "2026-11-02T10:00:00"),
    (1793613600, "2026-11-02T10:00:00"),
    (1793613600.5, "2026-11-02T10:00:00.500"),
    (1793613600123, "2026-11-02T10:00:00.123"),
    ("1793613600", "2026-11-02T10:00:00"),
]
OUTCOMES = [
    ({"status": "success"}, "ok"),
    ({"status": "404"}, "not_found"),
    ({"status": 404}, "not_found"),
    ({"outcome": "Not Found"}, "not_found"),
    ({"status": "forbidden"}, "denied"),
    ({"status": 403}, "denied"),
    ({"status": "unauthorized"}, "auth_failed"),
    ({"status": "invalid_api_key"}, "auth_failed"),
    ({"status": 429}, "rate_limited"),
    ({"outcome": "throttled"}, "rate_limited"),
    ({"status": 500}, "error"),
    ({"isError": True}, "error"),
    ({"is_error": False}, "ok"),
    ({"status": "not_found", "isError": True}, "not_found"),
    ({}, "unknown"),
]


def _alias_event(field: str, alias: str) -> dict:
    event = {k: v for k, v in BASE.items() if k != field}
    event[alias] = CANON_VALUE[field]
    return event


RESOURCE_FROM_ARGS = [
    ({**BASE, "args": {"sessionId": "x", "bookingId": "bk-1"}}, ("bookingId", "bk-1")),
    ({**BASE, "args": {"path": "/etc/hosts"}}, ("path", "/etc/hosts")),
    ({**BASE, "args": {"uri": "https://a.example/b"}}, ("uri", "https://a.example/b")),
    ({**BASE, "args": {"id": 42}}, ("id", "42")),
    ({**BASE, "args": {"query": "no resource here"}}, (None, None)),
    ({**BASE, "resource_id": "explicit", "args": {"documentId": "doc-1"}}, (None, "explicit")),
]
# getUser(userId) reads a user profile (seed 001's IDOR walk over users); listOrders
# (userId) lists orders on behalf of a user; another id key always wins.
WHO_KEY = [
    ({**BASE, "tool": "getUser", "args": {"userId": "usr-20001"}}, ("userId", "usr-20001")),
    ({**BASE, "tool": "get_user_profile", "args": {"user_id": "usr-7"}}, ("user_id", "usr-7")),
    ({**BASE, "tool": "listOrders", "args": {"userId": "usr-20001"}}, (None, None)),
    ({**BASE, "tool": "getUser", "args": {"userId": "u1", "documentId": "doc-1"}},
     ("documentId", "doc-1")),
    ({**BASE, "tool": "getTenant", "args": {"sessionId": "s", "tenantId": "t-9"}},
     ("tenantId", "t-9")),
]

#: One small log per case. They are ingested by one ``toolwatch ingest`` run (one file
#: each, as a glob of small logs is read) instead of one process per case: the CLI's
#: start-up was most of these tests' time. Each file is a stream of its own (its first
#: line is its identity), so a case's rows are told by their ``source``.
LOG_CASES: dict[str, list[dict]] = {
    **{f"alias-{f}-{a}": [_alias_event(f, a)] for f, a in CASES},
    **{f"ts-{i}": [{**BASE, "ts": v}] for i, (v, _) in enumerate(TIMESTAMP_FORMS)},
    **{
        f"outcome-{i}": [{k: v for k, v in BASE.items() if k != "status"} | fields]
        for i, (fields, _) in enumerate(OUTCOMES)
    },
    "first-alias": [
        {**BASE, "sessionId": "second", "session_id": "first", "custom_field": {"deep": [1, 2]}}
    ],
    "numbers-as-strings": [{**BASE, "bytes": "1234", "rows": "7", "duration_ms": "3.5"}],
    "resource-from-args": [ev for ev, _ in RESOURCE_FROM_ARGS],
    "who-key": [ev for ev, _ in WHO_KEY],
}


@pytest.fixture(scope="module")
def case_rows(tmp_path_factory: pytest.TempPathFactory, tw_env_module) -> dict[str, list[dict]]:
    """Each case's stored rows in line order, keyed by case name."""
    tmp = tmp_path_factory.mktemp("contract")
    cli = CLI(data_dir=tmp / "store", env=tw_env_module)
    logs = tmp / "logs"
    logs.mkdir()
    paths = {}
    for i, (name, events) in enumerate(LOG_CASES.items()):
        paths[name] = logs / f"case-{i:03d}.jsonl"
        paths[name].write_text("".join(json.dumps(ev) + "\n" for ev in events))
    summary = cli.ingest(*paths.values())
    lines = sum(map(len, LOG_CASES.values()))
    assert summary["events_stored"] == lines and summary["sources"] == len(paths), summary
    rows = cli.query(
        "SELECT *, strftime(ts, '%Y-%m-%dT%H:%M:%S.%g') AS ts_text FROM events"
        " ORDER BY source, line_no"
    )
    assert len(rows) == lines
    by_source: dict[str, list[dict]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    return {name: by_source[str(path)] for name, path in paths.items()}


@pytest.mark.parametrize(("field", "alias"), CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_every_alias_is_read(case_rows, field: str, alias: str) -> None:
    (row,) = case_rows[f"alias-{field}-{alias}"]
    col = COLUMN.get(field, field)
    if field == "args":
        assert json.loads(row["args"]) == CANON_VALUE["args"]
        assert row["resource_key"] == "customerId" and row["resource_id"] == "c-77"
    elif field == "ts":
        assert row["ts"].startswith("2026-11-02T10:00:00")
    else:
        assert row[col] == CANON_VALUE[field]


def test_first_alias_wins_and_unknown_fields_are_kept(case_rows) -> None:
    (row,) = case_rows["first-alias"]
    assert row["session_id"] == "first"
    assert json.loads(row["raw"])["custom_field"] == {"deep": [1, 2]}


@pytest.mark.parametrize(("i", "expected"), [(i, e) for i, (_, e) in enumerate(TIMESTAMP_FORMS)],
                         ids=[repr(v) for v, _ in TIMESTAMP_FORMS])
def test_timestamp_forms(case_rows, i: int, expected: str) -> None:
    (row,) = case_rows[f"ts-{i}"]
    t = row["ts_text"]
    assert t.startswith(expected.ljust(23, "0")[:23] if "." in expected else expected)


@pytest.mark.parametrize(("i", "status"), [(i, s) for i, (_, s) in enumerate(OUTCOMES)],
                         ids=[json.dumps(f) for f, _ in OUTCOMES])
def test_outcome_normalization(case_rows, i: int, status: str) -> None:
    (row,) = case_rows[f"outcome-{i}"]
    assert row["status"] == status


def test_numbers_as_strings_are_coerced(case_rows) -> None:
    (row,) = case_rows["numbers-as-strings"]
    assert (row["bytes"], row["rows"], row["duration_ms"]) == (1234, 7, 3.5)


def test_resource_derived_from_args(case_rows) -> None:
    rows = case_rows["resource-from-args"]
    assert [(r["resource_key"], r["resource_id"]) for r in rows] == [
        want for _, want in RESOURCE_FROM_ARGS
    ]


def test_a_who_key_is_the_resource_only_of_a_tool_about_that_kind(case_rows) -> None:
    rows = case_rows["who-key"]
    assert [(r["resource_key"], r["resource_id"]) for r in rows] == [want for _, want in WHO_KEY]


def test_session_summaries_become_sessions(tw, write_lines) -> None:
    summary = {
        "event": "SESSION_ANOMALY",
        "sessionId": "sum-1",
        "callCount": 900,
        "uniqueResourcesAccessed": 850,
        "totalBytesReturned": 10_000_000,
        "authFailures": 3,
        "ts": "2026-11-02T12:00:00Z",
        "callerId": "mallory",
        "clientIp": "203.0.113.5",
    }
    res = tw.ingest(write_lines(summary, {**BASE, "session_id": "s-1"}))
    assert res["summaries_stored"] == 1 and res["events_stored"] == 1
    rows = {r["session_id"]: r for r in tw.query("SELECT * FROM sessions")}
    assert rows["sum-1"]["basis"] == "summary"
    assert rows["sum-1"]["calls"] == 900 and rows["sum-1"]["distinct_resources"] == 850
    assert rows["sum-1"]["auth_failures"] == 3 and rows["sum-1"]["caller_id"] == "mallory"
    assert rows["s-1"]["basis"] == "events"


def _rpc(ts: str, sid: str, msg: dict, wrap: bool = True) -> dict:
    return {"ts": ts, "session_id": sid, "message": msg} if wrap else {**msg}


def test_jsonrpc_transcript_pairs_requests_and_responses(tw, write_lines) -> None:
    def req(i: int, name: str, args: dict) -> dict:
        return {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": name, "arguments": args},
        }

    lines = [
        _rpc(
            "2026-11-02T10:00:00Z",
            "c1",
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}},
        ),
        _rpc("2026-11-02T10:00:00.100Z", "c1", {"jsonrpc": "2.0", "id": 0, "result": {}}),
        _rpc("2026-11-02T10:00:01Z", "c1", req(1, "getDocument", {"documentId": "doc-1"})),
        _rpc("2026-11-02T10:00:01Z", "c1", req(2, "getDocument", {"documentId": "doc-2"})),
        # responses out of order, interleaved with another connection using the same id
        _rpc("2026-11-02T10:00:01Z", "c2", req(1, "searchItems", {"query": "q"})),
        _rpc(
            "2026-11-02T10:00:01.300Z",
            "c1",
            {"jsonrpc": "2.0", "id": 2, "error": {"code": -32001, "message": "Document not found"}},
        ),
        _rpc(
            "2026-11-02T10:00:01.250Z",
            "c1",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {"content": [{"type": "text", "text": "hello"}], "isError": False},
            },
        ),
        _rpc(
            "2026-11-02T10:00:02Z",
            "c2",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "result": {
                    "content": [{"type": "text", "text": "denied: permission"}],
                    "isError": True,
                },
            },
        ),
        _rpc("2026-11-02T10:00:03Z", "c1", {"jsonrpc": "2.0", "id": 99, "result": {}}),
        # a bare (unwrapped) request whose response never comes
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "ts": "2026-11-02T10:00:04Z",
            "session_id": "c3",
            "params": {"name": "readFile", "arguments": {"path": "/x"}},
        },
    ]
    path = write_lines(*lines)
    res = tw.ingest(path)
    assert res["events_stored"] == 4, res
    assert res["rpc_responses_merged"] == 3
    # Read in many small batches, the stream's end still releases the unanswered request.
    cfg = path.parent / "small.toml"
    cfg.write_text("[ingest]\nchunk_bytes = 256\n")
    again = tw("ingest", str(path), "-d", str(path.parent / "store-small"), "-c", str(cfg),
               "--json")
    small = json.loads(again.stdout.strip().splitlines()[-1])
    assert small["batches"] > 3 and small["events_stored"] == 4, small
    assert res["quarantined"].get("non_tool_message", 0) == 2  # initialize + its response
    assert res["quarantined"].get("orphan_response", 0) == 1
    assert res["lines_read"] == len(lines)
    rows = {
        (r["session_id"], r["resource_id"] or r["tool"]): r
        for r in tw.query(
            "SELECT session_id, tool, resource_id, status, duration_ms, bytes, format FROM events"
        )
    }
    assert rows[("c1", "doc-1")]["status"] == "ok"
    assert rows[("c1", "doc-1")]["duration_ms"] == pytest.approx(250.0)
    assert rows[("c1", "doc-1")]["bytes"] > 0
    assert rows[("c1", "doc-2")]["status"] == "not_found"
    assert rows[("c2", "searchItems")]["status"] == "denied"
    assert rows[("c3", "/x")]["status"] == "unknown"
    assert {r["format"] for r in rows.values()} == {"jsonrpc"}


def test_gzip_glob_and_stdin(tw, write_lines, tmp_path) -> None:
    plain = write_lines({**BASE, "session_id": "a"}, name="a.jsonl")
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(json.dumps({**BASE, "session_id": "b"}).encode() + b"\n"))
    res = tw.ingest(str(tmp_path / "*.jsonl*"))
    assert res["events_stored"] == 2
    out = tw(
        "ingest",
        "-",
        "-d",
        str(tw.data_dir),
        "--json",
        input=json.dumps({**BASE, "session_id": "c"}).encode() + b"\n",
    )
    assert json.loads(out.stdout)["events_stored"] == 1
    assert sorted(r["session_id"] for r in tw.query("SELECT session_id FROM events")) == [
        "a",
        "b",
        "c",
    ]
    assert plain.exists()


def test_missing_file_is_a_clear_failure_but_others_still_ingest(tw, write_lines, tmp_path) -> None:
    good = write_lines(BASE)
    proc = tw(
        "ingest",
        str(good),
        str(tmp_path / "nope.jsonl"),
        "-d",
        str(tw.data_dir),
        "--json",
        check=False,
    )
    assert proc.returncode == 1
    assert "nope.jsonl" in proc.stderr
    assert json.loads(proc.stdout)["events_stored"] == 1
