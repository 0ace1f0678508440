"""A suppression for a caller made in the dashboard (AppTest on the incident page, the
real page code) silences that caller in a re-run ``analyze`` and in a running
``toolwatch tail`` (new lines from it raise no alert, from another caller they do), and
stops applying when it expires."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from streamlit.testing.v1 import AppTest
from toolwatch.dashboard import data
from toolwatch.detectors.suppress import load_suppressions

from tests.conftest import TOOLWATCH
from toolwatch.store import Store

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # starts a process

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
WHO = {"mallory": "203.0.113.7", "eve": "198.51.100.9"}


def enumeration(caller: str, sid: str, t0: float, first_id: int) -> str:
    """60 sequential document ids in 30 s, 90% not found: one enumeration alert. The
    server vouches for the caller (``caller_authenticated``), as an authenticated MCP
    server's log does; a self-declared caller is never silenced by a caller rule."""
    return "".join(
        json.dumps({
            "ts": (BASE + timedelta(seconds=t0 + i * 0.5)).isoformat().replace("+00:00", "Z"),
            "session_id": sid, "caller_id": caller, "client_ip": WHO[caller],
            "caller_authenticated": True, "server": "docs-server", "tool": "getDocument",
            "args": {"documentId": f"doc-{first_id + i}"},
            "status": "ok" if i % 10 == 0 else "not_found",
            "bytes": 900 if i % 10 == 0 else 120, "duration_ms": 40,
        }) + "\n"
        for i in range(60))


def suppress_caller_in_ui(store: Path, caller: str, expires: str) -> str:
    """Open the caller's incident in the dashboard, keep the prefilled caller, set the
    expiry, press "Create suppression rule"; the rule's id."""
    inc = data.list_incidents(Store(store))
    iid = inc.filter(pl.col("actor_id") == caller)["incident_id"][0]
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["toolwatch_data_dir"] = str(store)
    at.run()
    at.query_params["incident"] = iid
    at.switch_page("views/incident.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.text_input(key="ic_s_caller").value == caller, "the caller is prefilled"
    assert at.text_input(key="ic_s_ip").value == ""
    at.text_input(key="ic_s_exp").set_value(expires)
    at.text_input(key="ic_s_note").set_value("pen test, CHG-77")
    next(b for b in at.button if b.label == "Create suppression rule").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Rule created" in s.value for s in at.success), [e.value for e in at.error]
    rule = next(r for r in load_suppressions(store) if r.caller_id == caller)
    assert rule.incident_id == iid and rule.expires_at and rule.note == "pen test, CHG-77"
    # the actor, not the session id (which never recurs)
    assert rule.client_ip is None and rule.entity_type is None and rule.entity_id is None
    return rule.id


def _analyze(log: Path, store: Path, out: Path, env: dict) -> set[str]:
    r = subprocess.run([TOOLWATCH, "analyze", str(log), "-d", str(store), "--alerts-out",
                        str(out), "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return {json.loads(ln)["caller_id"] for ln in out.read_text().splitlines()}


def test_ui_rule_silences_caller_in_analyze_until_it_expires(tmp_path: Path,
                                                            tw_env: dict) -> None:
    log, store = tmp_path / "mcp.log", tmp_path / "store"
    log.write_text(enumeration("mallory", "s-m1", 0, 2000) + enumeration("eve", "s-e1", 5, 5000))
    assert _analyze(log, store, tmp_path / "a1.jsonl", tw_env) == {"mallory", "eve"}
    rule_id = suppress_caller_in_ui(store, "mallory", "25s")
    made = time.monotonic()
    assert _analyze(log, store, tmp_path / "a2.jsonl", tw_env) == {"eve"}
    time.sleep(max(0.0, 26 - (time.monotonic() - made)))
    assert [r.id for r in load_suppressions(store) if r.expired()] == [rule_id]
    assert _analyze(log, store, tmp_path / "a3.jsonl", tw_env) == {"mallory", "eve"}


def _sink_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _wait_for(pred: Any, timeout: float, what: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            raise AssertionError(f"tail exited ({proc.returncode}) waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_ui_rule_silences_caller_in_running_tail_until_it_expires(tmp_path: Path,
                                                                 tw_env: dict) -> None:
    log, store, sink = tmp_path / "mcp.log", tmp_path / "store", tmp_path / "alerts.jsonl"
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[live]\nflush_interval_s = 0.2\n\n"
                   f'[[live.sinks]]\ntype = "file"\npath = "{sink}"\n')
    log.write_text(enumeration("mallory", "s-m1", 0, 2000))
    proc = subprocess.Popen(
        [TOOLWATCH, "tail", str(log), "-d", str(store), "-c", str(cfg), "--no-stdout"],
        env=tw_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )

    def sessions(caller: str) -> set[str]:
        return {r.get("session_id") for r in _sink_rows(sink) if r.get("caller_id") == caller}

    try:
        _wait_for(lambda: "s-m1" in sessions("mallory"), 90, "mallory's first alert", proc)
        # the rule is made while tail runs; tail is not restarted
        suppress_caller_in_ui(store, "mallory", "40s")
        made = time.monotonic()
        _append(log, enumeration("mallory", "s-m2", 60, 3000)
                + enumeration("eve", "s-e2", 62, 6000))
        # eve's alert proves the new lines were read and detected ...
        _wait_for(lambda: "s-e2" in sessions("eve"), 90, "eve's alert", proc)
        time.sleep(2.0)  # ... a few more flushes: mallory's new session stays silent
        assert "s-m2" not in sessions("mallory")
        assert time.monotonic() - made < 40, "the rule expired before the check: too slow"
        time.sleep(max(0.0, 41 - (time.monotonic() - made)))
        _append(log, enumeration("mallory", "s-m3", 120, 4000))
        _wait_for(lambda: "s-m3" in sessions("mallory"), 90,
                  "mallory's alert after the rule expired", proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
