"""Issue 27 (item 8): an enumeration reason counts the stored calls' values of the walked
key, not a summary line's ``uniqueResourcesAccessed`` ("151 distinct documentId values"
when 150 are stored)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import CLI

T0 = 1762084800.0  # 2025-11-02T12:00:00Z


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{round(t % 1 * 1000):03d}Z"


def _walk_with_summary(path: Path, summary_unique: int) -> None:
    """A search, then 150 getDocument lookups of missing ids, then the session's
    SESSION_END line as the SDK middleware writes it (it counts every call's first
    argument, the search query too: 151)."""
    base = {"session_id": "s-walk", "caller_id": "u_walker", "client_ip": "45.155.1.2",
            "server": "docs-server"}
    rows = [{**base, "ts": _ts(T0), "tool": "searchItems", "args": {"query": "plans"},
             "status": "ok", "bytes": 900}]
    rows += [{**base, "ts": _ts(T0 + 1 + i / 2), "tool": "getDocument",
              "args": {"documentId": f"doc-{1000 + i}"}, "status": "not_found", "bytes": 80}
             for i in range(150)]
    rows.append({"event": "SESSION_END", "ts": _ts(T0 + 80), "session_id": "s-walk",
                 "caller_id": "u_walker", "server": "docs-server", "callCount": 151,
                 "uniqueResourcesAccessed": summary_unique, "totalBytesReturned": 13_000,
                 "durationMs": 80_000})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _enumeration(tw_env: dict[str, str], tmp_path: Path, summary_unique: int) -> dict:
    log = tmp_path / f"walk-{summary_unique}.jsonl"
    _walk_with_summary(log, summary_unique)
    cli = CLI(data_dir=tmp_path / f"store-{summary_unique}", env=tw_env)
    out = tmp_path / f"alerts-{summary_unique}.jsonl"
    cli("analyze", str(log), "-d", str(cli.data_dir), "--alerts-out", str(out))
    alerts = [json.loads(x) for x in out.read_text().splitlines()]
    enum = [a for a in alerts if a["category"] == "enumeration"]
    assert len(enum) == 1, alerts
    a = enum[0]
    if isinstance(a["evidence"], str):
        a["evidence"] = json.loads(a["evidence"])
    return a


def test_reason_counts_stored_values_not_the_summary(tw_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    a = _enumeration(tw_env, tmp_path, 151)
    assert a["reasons"][0].startswith("150 distinct documentId values"), a["reasons"]
    assert "151 distinct documentId" not in " ".join(a["reasons"])
    # the summary's own figure is still told, as what it is
    assert any("summary line counts 151" in r for r in a["reasons"]), a["reasons"]
    assert a["evidence"]["distinct_resources"] == 150
    assert a["evidence"]["summary_distinct_resources"] == 151


def test_reason_unchanged_when_the_summary_agrees(tw_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    a = _enumeration(tw_env, tmp_path, 150)
    assert a["reasons"][0].startswith("150 distinct documentId values"), a["reasons"]
    assert not any("summary line" in r for r in a["reasons"]), a["reasons"]
    assert "summary_distinct_resources" not in a["evidence"]
