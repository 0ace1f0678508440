"""Red team: alerts leaving toolwatch carry attacker strings; none may act on a terminal or chat.

An alert names its entity (a session or caller id the agent chose) and quotes tool names in
its reasons. ``toolwatch tail``/``kafka`` print alerts as JSON lines on stdout, the file sink
appends them to a file people ``cat``/``tail -f``, and the Slack sink posts them as mrkdwn.
JSON escapes C0 controls but not DEL, C1 controls (``\\x9b`` is a CSI on many terminals),
bidi overrides (``\\u202e`` shows ``evil`` as ``live``), zero-width characters or line
separators; Slack turns a bare URL into a link and a backtick ends a code span.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TOOLWATCH
from toolwatch.live.sinks import alert_json, slack_payload
from toolwatch.output import is_unsafe_char

HOSTILE = "ev\u202eil\x9b31m\x7f\u200b\u2028\x1b]0;t\x07`*b* https://evil.example/x <!here>"


def _unsafe(text: str) -> list[str]:
    return [c for c in text if is_unsafe_char(c)]


def _row(entity: str, reason: str) -> dict:
    return {"alert_id": "a1", "severity": "high", "category": "enumeration",
            "entity_type": "caller_id", "entity_id": entity, "score": 0.9,
            "reasons": [reason], "evidence": {"tool": reason}}


@settings(max_examples=200, deadline=None)
@given(entity=st.text(max_size=60), reason=st.text(max_size=60))
def test_alert_json_line_is_terminal_safe_and_exact(entity: str, reason: str) -> None:
    """Stdout and file sinks: one line, nothing unsafe, the same values once decoded."""
    raw = alert_json(_row(entity, reason))
    text = raw.decode()
    assert text.endswith("\n") and "\n" not in text[:-1]
    assert not _unsafe(text[:-1]), _unsafe(text)
    assert json.loads(text) == _row(entity, reason)


@settings(max_examples=200, deadline=None)
@given(entity=st.text(max_size=60), reason=st.text(max_size=60))
def test_slack_text_shows_log_values_inert(entity: str, reason: str) -> None:
    """Slack: no unsafe character, no Slack control sequence, no link, and the log values
    stay inside code spans (a backtick in them cannot end one)."""
    text = slack_payload(_row(entity, reason))["text"]
    assert not _unsafe(text.replace("\n", " "))  # the one newline is the message's own
    assert text.count("\n") == 1
    assert "<" not in text and ">" not in text
    head = text.partition("=`")[0]
    # header, then exactly one code span per log value
    assert head.startswith("*toolwatch HIGH*") and text.count("`") == 4, text


def test_slack_hostile_entity() -> None:
    text = slack_payload(_row(HOSTILE, "calls to https://evil.example/login"))["text"]
    assert "\u202e" not in text and "\x9b" not in text and "\\u202e" in text
    # URLs only ever appear inside code spans, where Slack does not link them
    outside = text.split("`")[0::2]
    assert not any("https://" in part for part in outside), text


def _enumeration_log(path: Path, session: str, caller: str, tool: str) -> None:
    base = dt.datetime(2026, 11, 2, 10, 0, tzinfo=dt.UTC)
    with open(path, "w") as fh:
        for i in range(200):
            fh.write(json.dumps({
                "ts": (base + dt.timedelta(seconds=2 * i)).isoformat(),
                "session_id": session, "caller_id": caller, "client_ip": "10.0.0.1",
                "server": "docs", "tool": tool, "args": {"documentId": f"doc-{1000 + i}"},
                "status": "not_found" if i % 2 else "ok", "bytes": 100,
            }) + "\n")


def _run_on_hostile_log(
    tmp_path: Path, command: str, *extra: str
) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    """``toolwatch COMMAND`` over an enumeration log whose ids carry HOSTILE, with
    ``--alerts-out``; the finished process and the alerts file."""
    log = tmp_path / "a.jsonl"
    _enumeration_log(log, "s" + HOSTILE, "c" + HOSTILE, "get" + HOSTILE)
    out = tmp_path / "alerts.jsonl"
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    res = subprocess.run(
        [TOOLWATCH, command, str(log), "-d", str(tmp_path / "st"), "--alerts-out", str(out),
         *extra],
        env=env, capture_output=True, timeout=180,
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    return res, out


@pytest.mark.slow  # starts a process
def test_tail_stdout_and_file_alerts_are_terminal_safe(tmp_path: Path) -> None:
    """The real ``toolwatch tail``: its stdout and ``--alerts-out`` lines."""
    res, out = _run_on_hostile_log(tmp_path, "tail", "--exit-when-idle", "2")
    for name, data in (("stdout", res.stdout), ("file", out.read_bytes())):
        lines = data.decode().splitlines()
        assert lines, name
        for line in lines:
            assert not _unsafe(line), (name, _unsafe(line))
            alert = json.loads(line)
            assert HOSTILE in alert["entity_id"]  # the exact value, once decoded


@pytest.mark.slow  # starts a process
def test_analyze_alerts_out_is_terminal_safe(tmp_path: Path) -> None:
    """``toolwatch analyze --alerts-out``: the same lines as the live file sink."""
    _, out = _run_on_hostile_log(tmp_path, "analyze", "--quiet", "--no-progress")
    lines = out.read_text().splitlines()
    assert lines
    for line in lines:
        assert not _unsafe(line), _unsafe(line)
        assert HOSTILE in json.loads(line)["entity_id"]


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.text(max_size=30), min_size=1, max_size=5))
def test_dashboard_downloads_are_inert(values: list[str]) -> None:
    """The dashboard's CSV and JSON downloads: no formula, nothing unsafe, JSON exact."""
    import polars as pl
    from toolwatch.dashboard import data

    df = pl.DataFrame({"caller_id": values, "tools": [[v] for v in values]})
    csv_text = data.csv_bytes(df).decode()
    body = pl.read_csv(csv_text.encode(), infer_schema=False) if csv_text.strip() else None
    assert body is not None
    for cell in body["caller_id"].to_list() + body["tools"].to_list():
        cell = cell or ""
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
        assert not _unsafe(cell), cell
    js = data.json_safe_rows(df).decode()
    assert not _unsafe(js.replace("\n", " "))
    assert [r["caller_id"] for r in json.loads(js)] == values


@pytest.mark.slow  # starts a process
def test_analyze_table_cuts_a_huge_entity(tmp_path: Path) -> None:
    """A 300 kB session id made ``analyze``'s alert table thousands of lines (1 MB of
    output) where ``toolwatch alerts`` shows a cut cell: the same cut in both."""
    log = tmp_path / "a.jsonl"
    big = "S" * 300_000 + "\u202e"
    _enumeration_log(log, big, "c", "get")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    res = subprocess.run(
        [TOOLWATCH, "analyze", str(log), "-d", str(tmp_path / "st"), "--no-progress"],
        env=env, capture_output=True, timeout=180,
    )
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    out = res.stdout.decode()
    assert "enumeration" in out and "S" * 40 in out
    assert len(out) < 20_000 and "\u202e" not in out
