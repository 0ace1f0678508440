"""``toolwatch run -- CMD`` (wrapped MCP server) and ``toolwatch ingest --follow -``."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from toolwatch.live import SinkConfig
from toolwatch.live.sinks import build_sinks
from toolwatch.live_cli import run_wrapped

try:
    from tests.test_live_support import (
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_count,
        stored_events,
        wait_for,
    )
except ImportError:  # tests/ itself on sys.path
    from test_live_support import (  # type: ignore[no-redef]
        call_line,
        config_for,
        enum_detector,
        stored_alerts,
        stored_count,
        stored_events,
        wait_for,
    )

pytestmark = [pytest.mark.timeout(60), pytest.mark.slow]  # starts a process

FAKE = str(Path(__file__).with_name("fake_mcp_server.py"))
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


def rpc(i: int, method: str, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()


def session_input(n_calls: int) -> bytes:
    msgs = [rpc(0, "initialize"), b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            rpc(1, "tools/list")]
    for i in range(n_calls):
        doc = f"missing-{i}" if i % 3 == 0 else f"doc-{i}"
        msgs.append(rpc(10 + i, "tools/call", name="getDocument",
                        arguments={"documentId": doc, "note": "é ✓ \\u0000"}))
    return b"\n".join(msgs) + b"\n"


def test_stdout_is_byte_identical_and_stderr_is_watched(tmp_path: Path, tw_env: dict) -> None:
    data = tmp_path / "store"
    inp = session_input(25)
    direct = subprocess.run([sys.executable, FAKE], input=inp, capture_output=True, timeout=30,
                            env=tw_env)
    wrapped = subprocess.run(
        [TOOLWATCH, "run", "-d", str(data), "--", sys.executable, FAKE],
        input=inp, capture_output=True, timeout=60, env=tw_env,
    )
    assert wrapped.returncode == 0, wrapped.stderr.decode()
    assert wrapped.stdout == direct.stdout  # the MCP protocol passes through untouched
    assert len(direct.stdout.splitlines()) == 27
    # Every stderr line of the server is echoed on toolwatch's stderr.
    for line in direct.stderr.splitlines():
        if b'"ts"' not in line:
            assert line in wrapped.stderr
    assert wrapped.stderr.count(b'"tool": "getDocument"') == 25
    ev = stored_events(data)
    assert ev.height == 25
    assert ev.filter(ev["status"] == "not_found").height == 9
    assert set(ev["session_id"].to_list()) == {"fake-session"}
    # Non-JSON stderr (banner + notification) is kept as server text, not as failures.
    q = orjson.loads(subprocess.run(
        [TOOLWATCH, "query", "-d", str(data), "--format", "json",
         "SELECT reason, count(*) AS n FROM quarantine GROUP BY 1"],
        capture_output=True, timeout=30, env=tw_env, check=True).stdout.splitlines()[0])
    assert q == {"reason": "server_text", "n": 2}


def test_responses_stream_without_waiting_for_eof(tmp_path: Path, tw_env: dict) -> None:
    """A request gets its answer while the session stays open (nothing buffers stdout)."""
    proc = subprocess.Popen(
        [TOOLWATCH, "run", "-d", str(tmp_path / "store"), "--", sys.executable, FAKE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=tw_env,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        for i in range(3):
            t0 = time.monotonic()
            proc.stdin.write(rpc(i, "tools/call", name="getDocument",
                                 arguments={"documentId": f"d{i}"}) + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 10)
            assert ready, "no response while the session is open"
            resp = json.loads(proc.stdout.readline())
            assert resp["id"] == i and time.monotonic() - t0 < 5
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(("env", "expected"), [
    ({"FAKE_EXIT_CODE": "3"}, 3),
    ({"FAKE_SIGNAL_SELF": str(int(signal.SIGTERM))}, 128 + int(signal.SIGTERM)),
])
def test_exit_code_and_death_by_signal_pass_through(
    tmp_path: Path, tw_env: dict, env: dict, expected: int
) -> None:
    res = subprocess.run(
        [TOOLWATCH, "run", "-d", str(tmp_path / "store"), "--", sys.executable, FAKE],
        input=session_input(2), capture_output=True, timeout=60, env={**tw_env, **env},
    )
    assert res.returncode == expected, res.stderr.decode()
    assert stored_count(tmp_path / "store") == 2


def test_sigterm_is_forwarded_to_the_server(tmp_path: Path, tw_env: dict) -> None:
    proc = subprocess.Popen(
        [TOOLWATCH, "run", "-d", str(tmp_path / "store"), "--", sys.executable, FAKE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**tw_env, "FAKE_TRAP_TERM": "1"},
    )
    try:
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(session_input(1))
        proc.stdin.flush()
        wait_for(lambda: stored_count(tmp_path / "store") == 1, timeout=20)
        proc.send_signal(signal.SIGTERM)  # stdin stays open: only the signal can end it
        proc.wait(timeout=30)
        errb = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    # the server's own exit code after handling SIGTERM
    assert proc.returncode == 42, errb.decode()[-2000:]
    assert b"got SIGTERM" in errb


def test_unknown_command_fails_cleanly(tmp_path: Path, tw_env: dict) -> None:
    res = subprocess.run(
        [TOOLWATCH, "run", "-d", str(tmp_path / "store"), "--", "/nonexistent/server"],
        capture_output=True, timeout=60, env=tw_env,
    )
    assert res.returncode == 127 and b"cannot start" in res.stderr and res.stdout == b""


def test_run_raises_and_updates_alerts_in_flight(tmp_path: Path) -> None:
    """An alert is raised while the server still runs, then updated, never duplicated."""
    data = tmp_path / "store"
    cfg = config_for(data, flush_interval_s=0.1, detect=True)
    lines = [call_line(i, resource=f"r{i}", status="not_found") for i in range(12)]
    script = (
        "import sys,time\n"
        f"lines={lines!r}\n"
        "for i,l in enumerate(lines):\n"
        "    sys.stderr.buffer.write(l); sys.stderr.flush()\n"
        "    time.sleep(0.3 if i in (5, 9) else 0.01)\n"
        "print('plain text on stderr', file=sys.stderr)\n"
    )
    out = tmp_path / "alerts.jsonl"
    sinks = build_sinks([SinkConfig(type="file", path=str(out))], allow_stdout=False)
    code = run_wrapped(cfg, [sys.executable, "-c", script], sinks=sinks,
                       detector=enum_detector(5))
    assert code == 0
    emitted = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(emitted) >= 2, "raised early and updated as evidence grew"
    assert len({e["alert_id"] for e in emitted}) == 1
    assert emitted[0]["evidence"]["distinct_not_found"] < 12
    assert emitted[-1]["evidence"]["distinct_not_found"] == 12
    latest = stored_alerts(data)
    assert latest.height == 1 and "12 distinct" in latest["reasons"][0][0]
    with pytest.raises(ValueError, match="stdout"):
        build_sinks([SinkConfig(type="stdout")], allow_stdout=False)


def test_ingest_follow_stdin_flushes_before_eof_and_resumes(tmp_path: Path, tw_env: dict) -> None:
    data = tmp_path / "store"
    cfg_file = tmp_path / "tw.toml"
    cfg_file.write_text("[live]\nflush_interval_s = 0.2\n")
    first = b"".join(call_line(i) for i in range(10))
    proc = subprocess.Popen(
        [TOOLWATCH, "ingest", "--follow", "-", "-d", str(data), "-c", str(cfg_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=tw_env,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(first)
        proc.stdin.flush()
        wait_for(lambda: stored_count(data) == 10, timeout=20)  # pipe still open
        proc.stdin.write(call_line(10)[:-1])  # last line without newline: kept at EOF
        proc.stdin.close()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        errb = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, errb.decode()
    assert stored_count(data) == 11
    # The same stream piped again is recognised (first-line fingerprint): nothing new.
    again = subprocess.run(
        [TOOLWATCH, "ingest", "--follow", "-", "-d", str(data), "-c", str(cfg_file)],
        input=first + call_line(10) + call_line(11), capture_output=True, timeout=60,
        env=tw_env,
    )
    assert again.returncode == 0
    ev = stored_events(data)
    assert ev.height == 12 and ev["event_id"].n_unique() == 12
