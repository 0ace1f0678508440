"""Spool first (``toolwatch run``): nothing a wrapped server writes is lost or stored twice.

Real wrappers (``toolwatch run``), real servers (tests/fake_mcp_server.py), real signals:
``kill -9`` of the wrapper at random moments, the official MCP SDK's stop sequence
(close stdin, 2 s, SIGTERM to the process group, 2 s, SIGKILL) with several wrappers at
once on a store, and orphan recovery by the next process that writes to the store.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

try:
    from tests.test_live_support import stored_events, wait_for
except ImportError:  # tests/ itself on sys.path
    from test_live_support import stored_events, wait_for  # type: ignore[no-redef]

from toolwatch.ingest.sources.spool import pending_spools

pytestmark = pytest.mark.timeout(120)

FAKE = str(Path(__file__).with_name("fake_mcp_server.py"))
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


def rpc(i: int, method: str, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()


def calls(n: int, session: str) -> bytes:
    return b"".join(
        rpc(100 + i, "tools/call", name="getDocument",
            arguments={"documentId": f"{session}-doc-{i}"}) + b"\n"
        for i in range(n)
    )


def wrapper(data: Path, env: dict, session: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [TOOLWATCH, "run", "-d", str(data), "--", sys.executable, FAKE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**env, "FAKE_SESSION": session}, **kw,  # type: ignore[arg-type]
    )


def per_session(data: Path) -> dict[str, int]:
    ev = stored_events(data)
    if ev.height == 0:
        return {}
    assert ev["event_id"].n_unique() == ev.height, "an event was stored twice"
    return dict(ev.group_by("session_id").len().iter_rows())


def collect_once(data: Path, env: dict) -> None:
    subprocess.run([TOOLWATCH, "collect", "--once", "--no-stdout", "-d", str(data)],
                   env=env, check=True, timeout=60, capture_output=True)


@pytest.mark.slow  # starts a process
def test_kill_9_of_the_wrapper_at_random_moments_loses_nothing(
    tmp_path: Path, tw_env: dict
) -> None:
    """Wrappers SIGKILLed while their servers write: every line stored exactly once."""
    data = tmp_path / "store"
    rnd = random.Random(1234)
    expected: dict[str, int] = {}
    for trial in range(4):
        sess = f"k{trial}"
        n = rnd.randint(5, 60)
        p = wrapper(data, tw_env, sess)
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(calls(n, sess))
        p.stdin.flush()
        for _ in range(n):  # every answered call was logged before its answer
            assert p.stdout.readline()
        time.sleep(rnd.uniform(0.0, 1.5))  # before, during or after the first commit
        p.kill()
        p.wait(timeout=10)
        expected[sess] = n
    # The servers died with their wrappers (parent-death signal); the spools stay.
    wait_for(lambda: all(s["orphaned"] for s in pending_spools(data)), timeout=20)
    status = subprocess.run([TOOLWATCH, "status", "--json", "-d", str(data)], env=tw_env,
                            capture_output=True, check=True, timeout=60)
    listed = [r for r in orjson.loads(status.stdout) if r["kind"] == "spool"]
    assert len(listed) == len(pending_spools(data))
    # The next writer of the store (here: an ingest of an unrelated empty file) ingests them.
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    subprocess.run([TOOLWATCH, "ingest", "-d", str(data), str(empty)], env=tw_env,
                   check=True, timeout=60, capture_output=True)
    assert per_session(data) == expected
    assert pending_spools(data) == []
    collect_once(data, tw_env)  # nothing left: nothing stored twice
    assert per_session(data) == expected


def _sdk_stop(p: subprocess.Popen[bytes]) -> None:
    """The MCP Python SDK's stdio stop: close stdin, 2 s, SIGTERM group, 2 s, SIGKILL."""
    assert p.stdin is not None
    p.stdin.close()
    try:
        p.wait(timeout=2.0)
        return
    except subprocess.TimeoutExpired:
        pass
    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


@pytest.mark.slow  # starts a process
def test_sdk_stop_sequence_with_four_wrappers_under_load(tmp_path: Path, tw_env: dict) -> None:
    """4 wrappers at once, a spinning core, random session lengths: all calls stored once."""
    data = tmp_path / "store"
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rnd = random.Random(99)
    expected: dict[str, int] = {}
    codes = []
    try:
        for rnd_i in range(3):
            procs = []
            for k in range(4):
                sess = f"r{rnd_i}-{k}"
                n = rnd.choice([1, 3, 20, 150])
                p = wrapper(data, tw_env, sess, start_new_session=True)
                assert p.stdin is not None
                p.stdin.write(calls(n, sess))
                p.stdin.flush()
                procs.append((p, sess, n))
            for p, sess, n in procs:
                assert p.stdout is not None
                for _ in range(n):
                    assert p.stdout.readline()
                expected[sess] = n
            time.sleep(rnd.uniform(0, 0.5))
            for p, _, _ in procs:
                _sdk_stop(p)
                codes.append(p.returncode)
    finally:
        spin.kill()
    assert codes == [0] * len(codes)  # the server's own exit code
    stored_now = per_session(data)
    collect_once(data, tw_env)  # whatever the SIGKILLs left in spools
    assert per_session(data) == expected, f"before the collect pass: {stored_now}"


@pytest.mark.slow  # starts a process
def test_a_live_wrappers_spool_is_not_stolen(tmp_path: Path, tw_env: dict) -> None:
    """Recovery by another process skips a spool whose wrapper still runs."""
    data = tmp_path / "store"
    p = wrapper(data, tw_env, "alive")
    assert p.stdin is not None and p.stdout is not None
    try:
        p.stdin.write(calls(3, "alive"))
        p.stdin.flush()
        for _ in range(3):
            assert p.stdout.readline()
        wait_for(lambda: per_session(data).get("alive") == 3, timeout=30)
        spools = pending_spools(data)
        assert len(spools) == 1 and spools[0]["wrapper_alive"] and not spools[0]["orphaned"]
        empty = tmp_path / "empty.jsonl"
        empty.write_bytes(b"")
        subprocess.run([TOOLWATCH, "ingest", "-d", str(data), str(empty)], env=tw_env,
                       check=True, timeout=60, capture_output=True)
        assert len(pending_spools(data)) == 1  # still there, still its wrapper's
        p.stdin.write(calls(2, "alive2"))
        p.stdin.flush()
        for _ in range(2):
            assert p.stdout.readline()
        p.stdin.close()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    ev = stored_events(data)
    assert ev.height == 5 and ev["event_id"].n_unique() == 5
    assert pending_spools(data) == []  # the wrapper ingested its own spool and removed it


@pytest.mark.slow  # starts a process
def test_server_starts_before_heavy_imports(tmp_path: Path, tw_env: dict) -> None:
    """The server runs (stderr spooled) before the wrapper has loaded polars/duckdb/typer."""
    data = tmp_path / "store"
    script = (
        "import os, sys\n"
        "maps = open(f'/proc/{os.getppid()}/maps').read()\n"
        "heavy = [m for m in ('polars', 'duckdb', 'sklearn', 'pyarrow', 'typer') if m in maps]\n"
        "sys.stderr.write(f'heavy-loaded={heavy}\\n')\n"
    )
    res = subprocess.run(
        [TOOLWATCH, "run", "-d", str(data), "--", sys.executable, "-c", script],
        env=tw_env, capture_output=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert b"heavy-loaded=[]" in res.stderr  # echoed from the spool
    assert pending_spools(data) == []


@pytest.mark.slow  # starts a process
def test_fast_path_store_dir_matches_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run``'s stdlib-only store resolution agrees with load_config (env, file, default)."""
    from toolwatch.config import StoreConfig, load_config
    from toolwatch.spool import DEFAULT_DATA_DIR, _configured_data_dir

    assert StoreConfig().data_dir == DEFAULT_DATA_DIR
    monkeypatch.chdir(tmp_path)
    for k in ("TOOLWATCH_DATA_DIR", "TOOLWATCH_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    cfgfile = tmp_path / "other.toml"
    cfgfile.write_text('[store]\ndata_dir = "/srv/tw-from-file"\n')
    cases = []
    for env_dir in (None, "/srv/tw-from-env"):
        for explicit in (None, str(cfgfile)):
            for local in (None, '[store]\ndata_dir = "local-store"\n', "[ingest]\n"):
                cases.append((env_dir, explicit, local))
    for env_dir, explicit, local in cases:
        if env_dir:
            monkeypatch.setenv("TOOLWATCH_DATA_DIR", env_dir)
        else:
            monkeypatch.delenv("TOOLWATCH_DATA_DIR", raising=False)
        local_file = tmp_path / "toolwatch.toml"
        local_file.unlink(missing_ok=True)
        if local is not None:
            local_file.write_text(local)
        want = str(load_config(explicit).data_dir)
        got = _configured_data_dir(explicit)
        assert got is not None and str(Path(got)) == want, (env_dir, explicit, local)
    # an unreadable / invalid config: no pre-start (the CLI reports the error)
    bad = tmp_path / "bad.toml"
    bad.write_text("[store\n")
    assert _configured_data_dir(str(bad)) is None
    assert _configured_data_dir(str(tmp_path / "missing.toml")) is None


def test_recovered_spools_alerts_reach_the_recovering_tails_sinks(tmp_path: Path) -> None:
    """A dead wrapper's spool ingested by ``tail``: its alerts go to tail's sinks too."""
    from datetime import UTC, datetime, timedelta

    from toolwatch.live import SinkConfig, StopFlag
    from toolwatch.live.sinks import Sink, SinkSet
    from toolwatch.live_cli import tail_files

    try:
        from tests.test_live_support import config_for, stored_alerts
    except ImportError:
        from test_live_support import config_for, stored_alerts  # type: ignore[no-redef]

    class Collect(Sink):
        name = "collect"

        def __init__(self) -> None:
            super().__init__(SinkConfig(type="stdout"))
            self.rows: list[dict] = []
            self.closed = 0

        def submit(self, rows: list[dict]) -> None:
            self.rows += rows

        def close(self) -> None:
            self.closed += 1

    data = tmp_path / "store"
    cfg = config_for(data, detect=True)
    # The state a SIGKILLed wrapper leaves: log + meta, nobody holding the lock, server gone.
    sp = data / "spool"
    sp.mkdir(parents=True)
    t0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
    lines = [json.dumps({
        "ts": (t0 + timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
        "session_id": "enum-dead", "caller_id": "prober", "client_ip": "203.0.113.7",
        "server": "docs", "tool": "getDocument", "args": {"documentId": f"doc-{5000 + i}"},
        "status": "not_found" if i % 8 else "ok", "bytes": 90,
    }) for i in range(80)]
    (sp / "999-deadbeef.log").write_text("\n".join(lines) + "\n")
    (sp / "999-deadbeef.meta").write_text(json.dumps(
        {"wid": "999-deadbeef", "name": "server.py", "child_pid": 2**22 + 12345}))
    (sp / "999-deadbeef.lock").touch()
    assert [s["orphaned"] for s in pending_spools(data)] == [True]
    empty = tmp_path / "other.jsonl"
    empty.write_bytes(b"")
    sink = Collect()
    stop = StopFlag()
    stop.set()  # one pass over the (empty) file: the recovery runs before it
    tail_files(cfg, [str(empty)], stop=stop, sinks=SinkSet([sink]))
    assert pending_spools(data) == []
    stored = stored_alerts(data)
    assert "enumeration" in set(stored.filter(stored["session_id"] == "enum-dead")["category"])
    sent = {(r.get("session_id"), r.get("category")) for r in sink.rows}
    assert ("enum-dead", "enumeration") in sent
    assert sink.closed == 1  # closed once, by tail itself, not by the recovery pass
