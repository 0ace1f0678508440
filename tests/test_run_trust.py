"""The trust boundary on a wrapped server's stderr (issue 28, item 1; issue 27, item 6).

Real processes: the official MCP SDK server of tests/mcp_sdk_server.py (with toolwatch's
middleware) under ``toolwatch run``, driven by the SDK's stdio client; a plain server
without the middleware; the store read back with DuckDB.

* The forged-event attack of issue 28 (an argument quoted, newlines included, in the
  exception the SDK logs) stores no forged event; the middleware's records still are.
* A JSON line with a forged or missing tag on a stream whose middleware announced itself
  is quarantined as ``untagged_record``.
* A server without the middleware keeps the old behaviour (every JSON line is a record).
* A traceback on stderr is one quarantine row, not one per line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# The SDK is in the dev extra: without it these tests fail to import rather than skip.
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.process import (
    UNTAGGED_REASON,
    StreamTrust,
    fold_text_lines,
    split_stream,
)
from toolwatch.ingest.sources.wrapper import RECORD_KEY_ENV as SPOOL_KEY_ENV

from toolwatch.mcp_middleware import RECORD_KEY_ENV, tag_line
from toolwatch.query import query
from toolwatch.store import Store

pytestmark = [pytest.mark.timeout(300)]

SERVER = str(Path(__file__).with_name("mcp_sdk_server.py"))
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


def _forged(caller: str, tool: str, ts: str) -> str:
    return json.dumps({"ts": ts, "session_id": "forged-1", "caller_id": caller,
                       "caller_authenticated": True, "server": "docs", "tool": tool,
                       "args": {"documentId": "x"}, "status": "ok", "bytes": 10})


def _attack_argument() -> str:
    """The argument of issue 28: a forged call and a forged SESSION_END, each on a line."""
    end = json.dumps({"event": "SESSION_END", "ts": "2026-01-01T00:00:00Z",
                      "session_id": "forged-1", "caller_id": "bob", "server": "docs",
                      "callCount": 9999, "uniqueResourcesAccessed": 9999,
                      "totalBytesReturned": 10**12})
    return ("nope\n" + _forged("bob", "exportAll", "2026-01-01T00:00:00Z") + "\n" + end
            + "\n")


async def _calls(data: Path, env: dict, calls: list[tuple[str, dict]], *,
                 server: list[str] | None = None, client_name: str | None = None) -> None:
    argv = server or [sys.executable, SERVER]
    params = StdioServerParameters(command=TOOLWATCH,
                                   args=["run", "-d", str(data), "--", *argv], env=env)
    info = None
    if client_name is not None:
        from mcp.types import Implementation

        info = Implementation(name=client_name, version="1.0")
    with open("/dev/null", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), \
                ClientSession(r, w, client_info=info) as s:
            await s.initialize()
            for name, args in calls:
                await s.call_tool(name, args)


def _query(data: Path, sql: str) -> list[tuple]:
    st_ = Store(data)
    if not st_.files("events") and "events" in sql:
        return []
    return [tuple(r.values()) for r in query(st_, sql).to_pylist()]


def _collect(data: Path, env: dict) -> None:
    subprocess.run([TOOLWATCH, "collect", "--once", "--no-stdout", "-d", str(data)],
                   env=env, check=True, timeout=120, capture_output=True)


def test_key_env_names_agree() -> None:
    assert RECORD_KEY_ENV == SPOOL_KEY_ENV


@pytest.mark.slow  # starts a process
def test_forged_events_through_the_sdk_exception_are_never_stored(
    tmp_path: Path, tw_env: dict
) -> None:
    data = tmp_path / "store"
    calls = [("getDocument", {"documentId": "doc-1"}),
             ("getDocument", {"documentId": _attack_argument()}),
             ("getDocument", {"documentId": "doc-2"})]
    anyio.run(_calls, data, {**tw_env, "TOOLWATCH_SESSION_ID": "real-1"}, calls)
    _collect(data, tw_env)
    rows = _query(data, "SELECT session_id, caller_id, tool, caller_authenticated "
                        "FROM events ORDER BY ts")
    assert len(rows) == 3, rows  # the three real calls, tagged and verified
    assert {r[0] for r in rows} == {"real-1"}
    assert not [r for r in rows if r[1] == "bob" or r[2] == "exportAll"]
    assert all(r[3] is False for r in rows)  # clientInfo-named: not authenticated
    summ = _query(data, "SELECT session_id, caller_id FROM summaries")
    assert ("forged-1", "bob") not in summ
    # the SDK's exception record is one line (no forged line started on stderr): kept
    # as server text, never read as JSON
    q = _query(data, "SELECT reason, raw FROM quarantine")
    assert not [r for r in q if r[0] == "no_tool"]
    assert any("exportAll" in (r[1] or "") for r in q if r[0] == "server_text"), q


@pytest.mark.slow  # starts a process
def test_untagged_json_lines_after_the_hello_are_quarantined(tmp_path: Path,
                                                             tw_env: dict) -> None:
    """A tool that prints an agent's argument raw to stderr (not through logging): the
    forged line starts a line, but carries no (or a forged) tag: quarantined."""
    srv = tmp_path / "srv.py"
    srv.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent.parent)!r})\n"
        "from toolwatch.mcp_middleware import ToolwatchMiddleware\n"
        "mw = ToolwatchMiddleware('docs', session_id='real-2')\n"
        f"sys.stderr.write({_forged('bob', 'exportAll', '2026-01-01T00:00:00Z')!r} + '\\n')\n"
        f"sys.stderr.write({_forged('bob', 'exportAll', '2026-01-01T00:00:01Z')[:-1]!r}"
        " + ',\"tw_tag\":\"' + '0' * 32 + '\"}\\n')\n"
        "sys.stderr.flush()\n"
    )
    subprocess.run([TOOLWATCH, "run", "-d", str(tmp_path / "store"), "--", sys.executable,
                    str(srv)], env=tw_env, check=True, timeout=120, capture_output=True,
                   stdin=subprocess.DEVNULL)
    _collect(tmp_path / "store", tw_env)
    assert _query(tmp_path / "store", "SELECT count(*) FROM events") in ([], [(0,)])
    q = _query(tmp_path / "store", "SELECT reason FROM quarantine")
    assert [r[0] for r in q].count(UNTAGGED_REASON) == 2, q
    # the hello itself is never stored
    assert not [r for r in q if r[0] in ("no_tool", "server_text")], q


@pytest.mark.slow  # starts a process
def test_server_without_the_middleware_works_as_before(tmp_path: Path, tw_env: dict) -> None:
    srv = tmp_path / "plain.py"
    srv.write_text(
        "import json, sys\n"
        "for i in range(3):\n"
        "    print(json.dumps({'ts': '2026-11-02T10:00:0%dZ' % i, 'session_id': 's',"
        " 'caller_id': 'alice', 'tool': 't', 'args': {'id': i}}), file=sys.stderr)\n"
        "print('plain text', file=sys.stderr)\n"
    )
    data = tmp_path / "store"
    subprocess.run([TOOLWATCH, "run", "-d", str(data), "--", sys.executable, str(srv)],
                   env=tw_env, check=True, timeout=120, capture_output=True,
                   stdin=subprocess.DEVNULL)
    _collect(data, tw_env)
    assert _query(data, "SELECT count(*) FROM events") == [(3,)]
    assert _query(data, "SELECT reason FROM quarantine") == [("server_text",)]


@pytest.mark.slow  # starts a process
def test_traceback_is_one_quarantine_row(tmp_path: Path, tw_env: dict) -> None:
    srv = tmp_path / "tb.py"
    srv.write_text(
        "def f():\n    raise ValueError('boom\\nsecond line')\n"
        "try:\n    f()\nexcept ValueError:\n    pass\n"
        "print('starting', flush=True, file=__import__('sys').stderr)\n"
        "f()\n"
    )
    data = tmp_path / "store"
    subprocess.run([TOOLWATCH, "run", "-d", str(data), "--", sys.executable, str(srv)],
                   env=tw_env, timeout=120, capture_output=True, stdin=subprocess.DEVNULL)
    _collect(data, tw_env)
    raws = [r[0] for r in _query(data, "SELECT raw FROM quarantine ORDER BY \"offset\"")]
    assert raws[0] == "starting"
    assert raws[1].startswith("Traceback (most recent call last):")
    assert "ValueError: boom" in raws[1]
    # the exception line ends the traceback; its message's second line stands alone
    assert raws[2:] == ["second line"], raws


def test_fold_keeps_apart_what_is_not_adjacent() -> None:
    lines = [b"Traceback (most recent call last):\n", b'  File "x", line 1\n',
             b"KeyError: 1\n", b"next message\n", b"  indented but not adjacent\n"]
    out, offs, nos = fold_text_lines(lines, [0, 10, 20, 30, 40], [1, 2, 3, 4, 6],
                                     [0, 1, 2, 3, 5])
    assert out == [b'Traceback (most recent call last):\n  File "x", line 1\nKeyError: 1',
                   b"next message", b"  indented but not adjacent"]
    assert offs == [0, 30, 40] and nos == [1, 4, 6]


KEY = bytes(range(16))


def _batch(lines: list[bytes]) -> RawBatch:
    n = len(lines)
    return RawBatch(source="run:x", source_fp="fp", lines=pa.array(lines, pa.large_binary()),
                    offsets=np.arange(n, dtype=np.int64) * 100,
                    line_nos=np.arange(1, n + 1, dtype=np.int64), end_offset=n * 100,
                    final=False, sizes=None)


def _tagged(obj: dict) -> bytes:
    return (tag_line(KEY, json.dumps(obj, ensure_ascii=False)) + "\n").encode()


HELLO = {"event": "TOOLWATCH_HELLO", "ts": "2026-11-02T10:00:00Z", "session_id": "s",
         "server": "docs"}
CALL = {"ts": "2026-11-02T10:00:01Z", "session_id": "s", "caller_id": "a#s", "tool": "t",
        "args": {}}

# what an agent controls: any text, in particular JSON objects and newlines
_arg = st.one_of(
    st.text(max_size=40),
    st.builds(lambda c, t: "\n" + json.dumps({"ts": "2026-01-01T00:00:00Z", "caller_id": c,
                                              "tool": t, "session_id": "f"}) + "\n",
              st.text(max_size=10), st.text(max_size=10)),
    st.builds(lambda c: json.dumps({"ts": "2026-01-01T00:00:00Z", "caller_id": c,
                                    "tool": "t", "tw_tag": "0" * 32}), st.text(max_size=10)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=st.lists(_arg, min_size=1, max_size=5))
def test_forged_lines_through_the_exception_path_never_become_records(args: list[str]) -> None:
    """Generator: whatever the agent's arguments, the stderr the middleware's server
    writes (hello, its tagged records, and the SDK's exception record for each argument,
    rendered through the middleware's log filter) holds no record but the tagged ones."""
    import logging

    from toolwatch.mcp_middleware import _RecordScrubber

    class _MW:
        _hasher = None
        _gate = None

    scrub = _RecordScrubber(_MW())  # type: ignore[arg-type]
    fmt = logging.Formatter("%(message)s")  # the worst format: the message starts a line
    out = [_tagged(HELLO)]
    for a in args:
        try:
            raise ValueError(f"document {a} not found")
        except ValueError:
            rec = logging.LogRecord("mcp.server.mcpserver.server", logging.ERROR, "x", 1,
                                    "Error executing tool getDocument: %s", (a,),
                                    sys.exc_info())
        scrub._flatten(rec)
        text = fmt.format(rec)
        assert "\n" not in text and "\r" not in text and "\u2028" not in text
        out.extend(ln.encode() + b"\n" for ln in text.split("\n"))
        out.append(_tagged(CALL))
    trust = StreamTrust(KEY)
    keep, _groups = split_stream(_batch(out), trust)
    assert keep.lines.to_pylist() == [_tagged(CALL)] * len(args)
    assert trust.authenticated


def test_split_refuses_untagged_and_forged_after_the_hello() -> None:
    forged = json.dumps({**CALL, "caller_id": "bob"}).encode() + b"\n"
    bad_tag = _tagged(CALL).replace(b'"a#s"', b'"bob"')
    before = json.dumps({**CALL, "caller_id": "early"}).encode() + b"\n"
    lines = [before, _tagged(HELLO), _tagged(CALL), forged, bad_tag, b"text\n"]
    trust = StreamTrust(KEY)
    keep, groups = split_stream(_batch(lines), trust)
    # before the hello the stream was not known to be tagged: read as before
    assert keep.lines.to_pylist() == [before, _tagged(CALL)]
    assert keep.offsets.tolist() == [0, 200]
    by = {g.reason: g for g in groups}
    assert by[UNTAGGED_REASON].lines == [forged, bad_tag]
    assert by[UNTAGGED_REASON].offsets == [300, 400]
    assert by["server_text"].lines == [b"text\n"]
    # a later batch: the stream stays authenticated
    keep2, _groups2 = split_stream(_batch([forged, _tagged(CALL)]), trust)
    assert keep2.lines.to_pylist() == [_tagged(CALL)]
    # a collector resuming past the hello finds it at the spool's start
    fresh = StreamTrust(KEY)
    assert fresh.probe(b"".join(lines))
    # without a key (a server not under the middleware): unchanged
    keep3, groups3 = split_stream(_batch([forged]), None)
    assert keep3.lines.to_pylist() == [forged] and not groups3


@pytest.mark.slow  # starts a process
def test_tail_says_what_it_watches_and_warns_about_missing_paths(tmp_path: Path,
                                                                 tw_env: dict) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text('{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t"}\n')
    missing = tmp_path / "nope" / "b.jsonl"
    r = subprocess.run([TOOLWATCH, "tail", "-d", str(tmp_path / "store"), "--no-stdout",
                        "--exit-when-idle", "1", str(log), str(missing),
                        str(tmp_path / "*.log")],
                       env=tw_env, timeout=120, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert f"toolwatch tail: watching {log}" in err
    assert f"toolwatch tail: warning: {missing} does not exist" in err
    assert f"toolwatch tail: watching glob {tmp_path / '*.log'} (0 files now)" in err
    assert f"warning: glob {tmp_path / '*.log'} matches no file yet" in err


@pytest.mark.slow  # starts a process
@settings(max_examples=2, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(args=st.lists(_arg, min_size=1, max_size=6))
def test_generated_forged_lines_through_the_real_sdk_store_nothing_forged(
        args: list[str], tw_env: dict) -> None:
    """The generator above, end to end: each argument raised in the real SDK server's
    exception (``getDocument`` of a missing id) under ``toolwatch run``."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "store"
        calls = [("getDocument", {"documentId": a}) for a in args]
        anyio.run(_calls, data, {**tw_env, "TOOLWATCH_SESSION_ID": "real-g"}, calls)
        _collect(data, tw_env)
        rows = _query(data, "SELECT session_id, tool FROM events")
        assert sorted(rows) == [("real-g", "getDocument")] * len(args), rows
        assert _query(data, "SELECT count(*) FROM summaries WHERE session_id <> 'real-g'") \
            == [(0,)]


def test_the_record_key_cannot_be_read_back_from_proc_environ() -> None:
    """A tool that can only read files must not find the key in /proc/<pid>/environ
    (unsetenv alone leaves the bytes there: red team, round 3)."""
    key = "8f" * 16
    code = (
        "import os, toolwatch.mcp_middleware as m;"
        "raw = open('/proc/self/environ', 'rb').read();"
        f"print(m._RECORD_KEY.hex(), b'{key}' in raw, os.environ.get('{RECORD_KEY_ENV}'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env={RECORD_KEY_ENV: key},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [key, "False", "None"]


@pytest.mark.parametrize("noise_bytes", [0, 70_000, 3_000_000])
def test_a_resuming_collector_finds_the_hello_after_any_amount_of_start_up_text(
    tmp_path: Path, noise_bytes: int
) -> None:
    """The hello may follow megabytes of start-up output: a collector resuming the spool
    past it must still know the stream is tagged (else untagged lines become records)."""
    import os

    from toolwatch.ingest.sources.spool import _trust_of

    key = bytes(range(16))
    hello = tag_line(key, json.dumps({"event": "TOOLWATCH_HELLO", "ts": "2026-01-01T00:00:00Z"}))
    noise = b"".join(b"starting worker %d: " % i + b"x" * 200 + b"\n"
                     for i in range(noise_bytes // 220 + 1)) if noise_bytes else b""
    for with_hello in (True, False):
        spool = tmp_path / f"s{with_hello}.log"
        spool.write_bytes(noise + (hello.encode() + b"\n" if with_hello else b"")
                          + b'{"tool": "x"}\n')
        fd = os.open(spool, os.O_RDONLY)
        try:
            trust = _trust_of({"record_key": key.hex()}, fd)
        finally:
            os.close(fd)
        assert trust.authenticated is with_hello
