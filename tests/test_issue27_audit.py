"""Issue 27 points that had no test of their own (audit, /tmp/issue27_audit.md): the
documented ATT&CK table is the code's, ``alerts`` sorts by the evidence's time, and the
README's middleware snippet and demo description say what the code and data do."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import polars as pl
from toolwatch.detectors.alerts import ALERT_COLUMNS
from toolwatch.detectors.filters import filter_alerts
from toolwatch.detectors.incidents import CATEGORY_STAGE, TECHNIQUES

from tests.conftest import ROOT

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def test_docs_attack_table_is_the_codes() -> None:
    """docs/incidents.md's table gives every category the stage and ATT&CK ids that
    ``detectors/incidents.py`` puts on its incidents, no more and no fewer."""
    text = (ROOT / "docs" / "incidents.md").read_text()
    rows: dict[str, tuple[str, set[str]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in CATEGORY_STAGE:
            ids = set(re.findall(r"\bT\d{4}(?:\.\d{3})?\b", cells[2]))
            rows[cells[0]] = (cells[1].replace(" ", "_"), ids)
    assert set(rows) == set(CATEGORY_STAGE)
    for cat, (stage, ids) in rows.items():
        assert stage == CATEGORY_STAGE[cat], cat
        assert ids == set(TECHNIQUES[cat]), cat
    # the examples the issue names
    assert "T1110.004" in TECHNIQUES["credential_stuffing"]
    assert "T1119" in TECHNIQUES["bulk_extraction"] and "T1567" in TECHNIQUES["cross_server_flow"]


def _alert(aid: str, severity: str, last_min: float) -> dict:
    return {
        "alert_id": aid, "category": "enumeration", "detector": "enumeration_rules",
        "severity": severity, "score": 0.9, "entity_type": "session", "entity_id": f"s-{aid}",
        "session_id": f"s-{aid}", "caller_id": "c", "client_ip": "192.0.2.1",
        "server": "docs", "first_seen": T0 + timedelta(minutes=last_min - 5),
        "last_seen": T0 + timedelta(minutes=last_min),
        # one analyze run: the same detected_at for every alert
        "detected_at": T0 + timedelta(days=1), "reasons": ["r"], "evidence": "{}",
    }


def test_alerts_most_severe_then_latest_evidence_first() -> None:
    """``toolwatch alerts`` order (issue 27 item 8): after ``analyze`` every alert has the
    same ``detected_at``, so "most recent" must mean the evidence's ``last_seen``."""
    frame = pl.DataFrame([_alert("a", "high", 10), _alert("b", "critical", 5),
                          _alert("c", "high", 300), _alert("d", "low", 900),
                          _alert("e", "high", 60)], schema=ALERT_COLUMNS)
    assert filter_alerts(frame)["alert_id"].to_list() == ["b", "c", "e", "a", "d"]


def test_readme_middleware_snippet_sets_plain_logging_first() -> None:
    """The snippet as written must configure plain logging before the server is made
    (without it, 151 calls took 40 s of rich tracebacks against 0.57 s)."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "ToolwatchMiddleware" in b)
    lines = block.splitlines()
    basic = next(i for i, ln in enumerate(lines) if "logging.basicConfig(" in ln)
    made = next(i for i, ln in enumerate(lines) if "MCPServer(" in ln)
    assert basic < made and "import logging" in block


def test_readme_counts_the_demo_servers_and_the_d_c_exceptions() -> None:
    """The README's demo description names the number of servers whose calls the demo
    logs hold (the proxy transcript is a ninth; summaries.jsonl holds session summaries,
    not calls), and the commands section does not claim every command takes -d and -c."""
    servers: set[str] = set()
    for f in sorted((ROOT / "sample_logs" / "demo").glob("*.jsonl")):
        if f.name == "summaries.jsonl":
            continue
        # the demo logs hold invalid UTF-8 on purpose (quarantine examples)
        for ln in f.read_bytes().decode(errors="replace").splitlines()[:400]:
            try:
                rec = json.loads(ln)
            except ValueError:
                continue
            if isinstance(rec, dict):
                servers.update(v for k in ("server", "serverName", "server_name")
                               if isinstance(v := rec.get(k), str))
    servers.add("integrations-server")  # the one gzip file
    words = {8: "eight", 9: "nine", 10: "ten"}
    readme = (ROOT / "README.md").read_text()
    assert f"{words[len(servers)]} servers' logs" in readme, sorted(servers)
    assert "Every command takes" not in readme
    assert "`evaluate` reads two files and takes neither" in readme
