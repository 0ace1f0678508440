"""Suppression rules: the version-2 scope (caller, address, server, tool, category), expiry,
version-1 files, and ``toolwatch suppress add/list/rm`` as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from toolwatch.detectors import suppress

from tests.conftest import TOOLWATCH

NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)


def _alert(**kw: object) -> dict:
    base = {"alert_id": "a1", "category": "bulk_extraction", "entity_type": "session",
            "entity_id": "s1", "session_id": "s1", "caller_id": "svc-export",
            "client_ip": "10.0.0.5", "server": "docs-server",
            "evidence": json.dumps({"top_tool": "exportAll"})}
    return {**base, **kw}


def test_version_one_file_still_applies(tmp_path: Path) -> None:
    """A file written by an older toolwatch (version 1, no new keys) loads and matches."""
    (tmp_path / "_triage").mkdir()
    (tmp_path / "_triage" / "suppressions.json").write_text(json.dumps({
        "version": 1,
        "rules": [{"id": "sup-old", "entity_type": "caller_id", "entity_id": "svc-export",
                   "category": "bulk_extraction", "server": None,
                   "created_at": "2026-11-04T09:12:00Z", "created_by": "alice",
                   "note": "CHG-1234", "alert_id": None, "expires_at": None}],
    }))
    rules = suppress.load_suppressions(tmp_path)
    assert [r.id for r in rules] == ["sup-old"]
    assert suppress.is_suppressed(_alert(), rules, NOW) is not None
    assert suppress.is_suppressed(_alert(category="enumeration"), rules, NOW) is None
    # adding a v1-shaped rule keeps the file at version 1 (older readers keep working)
    suppress.add_suppression(tmp_path, entity_type="client_ip", entity_id="1.2.3.4",
                           created_by="bob")
    doc = json.loads((tmp_path / "_triage" / "suppressions.json").read_text())
    assert doc["version"] == 1 and set(doc["rules"][1]) == set(doc["rules"][0])
    # a version-2 scope upgrades it; the old rule is kept unchanged
    suppress.add_suppression(tmp_path, caller_id="svc-export", tool="exportAll",
                           created_by="carol")
    doc = json.loads((tmp_path / "_triage" / "suppressions.json").read_text())
    assert doc["version"] == 2 and doc["rules"][0]["entity_id"] == "svc-export"
    assert len(suppress.load_suppressions(tmp_path)) == 3


@pytest.mark.parametrize(
    ("scope", "hit", "miss"),
    [
        ({"caller_id": "svc-export"}, {}, {"caller_id": "other"}),
        # an entity-level alert about the caller (no caller column) matches too
        ({"caller_id": "svc-export"},
         {"caller_id": None, "entity_type": "caller_id", "entity_id": "svc-export"},
         {"caller_id": None}),
        ({"client_ip": "10.0.0.5"}, {}, {"client_ip": "10.0.0.6"}),
        ({"server": "docs-server"}, {}, {"server": "crm-server"}),
        ({"tool": "exportAll"}, {}, {"evidence": json.dumps({"top_tool": "getDocument"})}),
        ({"tool": "exportAll"}, {"evidence": json.dumps({"tools": ["a", "exportAll"]})},
         {"evidence": "{}"}),
        ({"category": "bulk_extraction"}, {}, {"category": "enumeration"}),
        ({"caller_id": "svc-export", "server": "docs-server", "category": "bulk_extraction"},
         {}, {"server": "crm-server"}),
    ],
)
def test_every_scope_field(tmp_path: Path, scope: dict, hit: dict, miss: dict) -> None:
    rule = suppress.add_suppression(tmp_path, created_by="t", **scope)
    assert suppress.matches(rule, _alert(**hit), NOW)
    assert not suppress.matches(rule, _alert(**miss), NOW)


def test_self_declared_caller_is_not_silenced(tmp_path: Path) -> None:
    rule = suppress.add_suppression(tmp_path, caller_id="svc-export", created_by="t")
    assert suppress.matches(rule, _alert(caller_authenticated=True), NOW)
    assert not suppress.matches(rule, _alert(caller_authenticated=False), NOW)


def test_expiry_and_suppressed_by(tmp_path: Path) -> None:
    rule = suppress.add_suppression(tmp_path, caller_id="svc-export", created_by="t",
                                  expires_at=datetime.now(UTC) + timedelta(hours=1))
    alerts = pl.DataFrame([_alert(), _alert(alert_id="a2", caller_id="x")])
    assert suppress.suppressed_by(alerts, [rule]).to_list() == [rule.id, None]
    later = datetime.now(UTC) + timedelta(hours=2)
    assert suppress.suppressed_by(alerts, [rule], later).to_list() == [None, None]
    assert suppress.rules_frame([rule], later)["state"].to_list() == ["expired"]
    with pytest.raises(ValueError, match="scope"):
        suppress.add_suppression(tmp_path, created_by="t")
    with pytest.raises(ValueError, match="future"):
        suppress.add_suppression(tmp_path, caller_id="x", created_by="t",
                               expires_at=datetime.now(UTC) - timedelta(seconds=1))


def test_parse_expiry() -> None:
    assert suppress.parse_expiry("7d", NOW) == NOW + timedelta(days=7)
    assert suppress.parse_expiry("90s", NOW) == NOW + timedelta(seconds=90)
    assert suppress.parse_expiry("never", NOW) is None and suppress.parse_expiry("", NOW) is None
    assert suppress.parse_expiry("2026-12-01T00:00:00Z", NOW) == datetime(2026, 12, 1, tzinfo=UTC)
    for bad in ("soon", "7x", "2020-01-01"):
        with pytest.raises(ValueError):
            suppress.parse_expiry(bad, NOW)


def test_rules_file_reread_only_when_changed(tmp_path: Path) -> None:
    """``tail`` asks at every flush: the parsed file is reused until it changes, and a
    rule written by another process (atomic rename) is seen at once."""
    suppress.add_suppression(tmp_path, caller_id="a", created_by="t")
    first = suppress.load_suppressions(tmp_path)
    assert suppress.load_suppressions(tmp_path) == first
    suppress.add_suppression(tmp_path, caller_id="b", created_by="t")
    assert [r.caller_id for r in suppress.load_suppressions(tmp_path)] == ["a", "b"]


def _tw(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([TOOLWATCH, *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.slow  # starts a process
def test_cli_add_list_rm(tmp_path: Path, tw_env: dict) -> None:
    store = tmp_path / "store"
    (store / "_state").mkdir(parents=True)
    env = {**tw_env, "TOOLWATCH_ANALYST": "oncall-dan"}
    r = _tw("suppress", "add", "-d", str(store), "--caller", "svc-nightly-export",
            "--category", "bulk_extraction", "--expires", "7d", "--note", "CHG-1234",
            "-f", "json", env=env)
    assert r.returncode == 0, r.stderr
    rule = json.loads(r.stdout)
    assert rule["caller_id"] == "svc-nightly-export" and rule["category"] == "bulk_extraction"
    assert rule["created_by"] == "oncall-dan" and rule["note"] == "CHG-1234"
    until = datetime.fromisoformat(rule["expires_at"].replace("Z", "+00:00"))
    assert timedelta(days=6, hours=23) < until - datetime.now(UTC) <= timedelta(days=7)
    short = json.loads(_tw("suppress", "add", "-d", str(store), "--address", "10.1.1.1",
                           "--expires", "2s", "-f", "json", env=env).stdout)
    listed = _tw("suppress", "list", "-d", str(store), "-f", "json", env=env)
    assert {x["id"] for x in json.loads(listed.stdout)} == {rule["id"], short["id"]}
    time.sleep(2.2)
    listed = json.loads(_tw("suppress", "list", "-d", str(store), "-f", "json", env=env).stdout)
    assert [x["id"] for x in listed] == [rule["id"]], "expired rules are not in force"
    every = json.loads(_tw("suppress", "list", "-d", str(store), "--all", "-f", "json",
                           env=env).stdout)
    assert [x["expired"] for x in every] == [False, True]
    text = _tw("suppress", "list", "-d", str(store), env=env).stdout
    assert "caller_id=svc-nightly-export, category=bulk_extraction" in text
    # mistakes exit 2 (usage) and write nothing; an unknown id exits 1
    for bad in (["--category", "nope", "--caller", "x"], [], ["--caller", "x", "--expires",
                                                                "yesterday"]):
        assert _tw("suppress", "add", "-d", str(store), *bad, env=env).returncode == 2, bad
    assert _tw("suppress", "rm", "-d", str(store), "sup-nope", env=env).returncode == 1
    assert _tw("suppress", "rm", "-d", str(store), rule["id"], env=env).returncode == 0
    assert [r.id for r in suppress.load_suppressions(store)] == [short["id"]]
    assert _tw("suppress", "list", "-d", str(tmp_path / "nostore"), env=env).returncode == 1
    assert not os.path.exists(tmp_path / "nostore")
