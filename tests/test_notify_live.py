"""A real ``toolwatch tail`` process with a webhook sink on a local HTTP server: one actor
walking documents, then stuffing credentials, then paging a search to its end, gives one
incident message plus a few updates (bounded by group_interval_s), not one post per alert
version; each message says who, what, how bad, what to do, and links to the incident the
store's ``incidents`` view shows."""

from __future__ import annotations

import http.server
import json
import math
import signal
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import TOOLWATCH

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # starts a process

CALLER, IP = "mallory", "203.0.113.7"
BASE = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


def _line(t: float, sid: str, tool: str, args: dict[str, Any], status: str, nbytes: int,
          rows: int | None = None) -> str:
    """One call as an MCP server's JSON log line (shapes of sample_logs/generate.py)."""
    d: dict[str, Any] = {
        "ts": (BASE + timedelta(seconds=t)).isoformat().replace("+00:00", "Z"),
        "session_id": sid, "caller_id": CALLER, "client_ip": IP, "server": "docs-server",
        "tool": tool, "args": args, "status": status, "bytes": nbytes, "duration_ms": 40,
    }
    if rows is not None:
        d["rows"] = rows
    return json.dumps(d) + "\n"


def enumeration() -> str:
    """60 sequential document ids in 30 s, 90% not found (docs/detectors.md: a run of 6
    mostly-missing ids is enough)."""
    return "".join(
        _line(i * 0.5, "s-enum", "getDocument", {"documentId": f"doc-{2000 + i}"},
              "ok" if i % 10 == 0 else "not_found", 900 if i % 10 == 0 else 120)
        for i in range(60))


def credential_stuffing() -> str:
    """30 distinct API keys failing (threshold: 5 distinct failing credentials)."""
    return "".join(
        _line(60 + i * 0.8, "s-cred", "connectExternalService",
              {"service": "salesforce", "apiKey": f"sk-live-{i:04d}{'q' * 24}"},
              "auth_failed", 90)
        for i in range(30))


def bulk_extraction() -> str:
    """60 pages of a search, 100 rows / 48 kB each (a sweep: 25 pages, >= 1 MB)."""
    return "".join(
        _line(120 + i * 0.4, "s-bulk", "searchItems",
              {"query": "", "page": i + 1, "page_size": 100}, "ok", 48_000, rows=100)
        for i in range(60))


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[float, dict]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((time.monotonic(), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: object) -> None:
        return


def _append(path: Path, text: str) -> None:
    """Append as a server would: a line at a time, over about a second."""
    with open(path, "a") as fh:
        for ln in text.splitlines(keepends=True):
            fh.write(ln)
            fh.flush()
            time.sleep(0.01)


def _wait(pred: Any, timeout: float, what: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; got {[m for _, m in _Hook.received]}")


def test_tail_webhook_one_message_per_incident(tmp_path: Path, tw_env: dict) -> None:
    _Hook.received = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    interval = 2.0
    data, log, versions = tmp_path / "store", tmp_path / "mcp.log", tmp_path / "versions.jsonl"
    log.write_text("")
    cfg = tmp_path / "tw.toml"
    cfg.write_text(
        "[live]\nflush_interval_s = 0.2\n\n"
        f'[[live.sinks]]\ntype = "webhook"\nurl = "{url}"\ngroup_wait_s = 1.0\n'
        f"group_interval_s = {interval}\nrepeat_interval_s = 0\n"
        'dashboard_url = "http://dashboard.example:8501"\n\n'
        f'[[live.sinks]]\ntype = "file"\npath = "{versions}"\n'
    )
    proc = subprocess.Popen(
        [TOOLWATCH, "tail", str(log), "-d", str(data), "-c", str(cfg), "--no-stdout"],
        env=tw_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        _append(log, enumeration())
        _wait(lambda: _Hook.received, 90, "the first incident message", proc)
        _append(log, credential_stuffing())
        _append(log, bulk_extraction())
        _wait(lambda: any("collection" in m["stages"] for _, m in _Hook.received), 90,
              "an update with the collection stage", proc)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        srv.shutdown()
    assert proc.returncode == 0, err.decode()[-3000:]
    msgs = [m for _, m in _Hook.received]
    first_at = _Hook.received[0][0]

    # One incident: one first message, the rest updates of it.
    assert [m["update"] for m in msgs].count(False) == 1 and msgs[0]["update"] is False
    assert len({m["notification_key"] for m in msgs}) == 1
    # At most one update per group_interval since the first message, plus the flush of
    # what was pending at shutdown -- not one post per alert version.
    n_versions = len(versions.read_text().splitlines())
    allowed = math.floor((stopped - first_at) / interval) + 1
    assert 1 <= len(msgs) - 1 <= allowed, (len(msgs), allowed)
    assert len(msgs) < n_versions, (len(msgs), n_versions)
    for m in msgs[1:]:
        assert m["update"] is True and m["repeat"] is False and m["changes"]
    # Who, what, how bad, what to do, and where to look -- in every message.
    for m in msgs:
        assert m["caller_ids"] == [CALLER] and m["client_ips"] == [IP]
        assert m["actor_type"] == "caller_id" and m["actor_id"] == CALLER
        assert m["stages"] and m["categories"] and CALLER in m["summary"]
        assert m["risk"] > 0 and m["severity"] in ("low", "medium", "high", "critical")
        assert m["recommended_actions"] and any(CALLER in a for a in m["recommended_actions"])
        assert m["dashboard_url"] == (
            f"http://dashboard.example:8501/incident?incident={m['incident_id']}")
    last = msgs[-1]
    assert last["stages"] == ["discovery", "credential_access", "collection"]
    assert {"enumeration", "credential_stuffing", "bulk_extraction"} <= set(last["categories"])
    new_stages = [s for m in msgs[1:] for s in m["changes"]["new_stages"]]
    assert sorted(new_stages) == ["collection", "credential_access"]
    # The link points at the incident the store's view computes from the same alerts.
    q = subprocess.run(
        [TOOLWATCH, "query", "SELECT incident_id, actor_id, n_alerts FROM incidents",
         "-d", str(data), "--format", "json"],
        env=tw_env, capture_output=True, text=True, timeout=120, check=True)
    rows = [json.loads(x) for x in q.stdout.splitlines() if x.strip()]
    assert [(r["incident_id"], r["actor_id"]) for r in rows] == [(last["incident_id"], CALLER)]
    assert rows[0]["n_alerts"] == last["n_alerts"]
