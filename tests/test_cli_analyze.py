"""The README's main job through the real CLI: analyze the demo, list, evaluate, train."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT

DEMO = sorted(str(p) for p in (ROOT / "sample_logs" / "demo").glob("*.jsonl*"))
SCHEMA = json.loads((ROOT / "docs" / "alert.schema.json").read_text())


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One analyze run of the bundled demo logs (shared: it is the slow part)."""
    import os
    import subprocess

    from tests.conftest import CLI

    tmp = tmp_path_factory.mktemp("analyze")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "cfg")
    cli = CLI(data_dir=tmp / "store", env=env)
    alerts = tmp / "alerts.jsonl"
    proc = cli("analyze", *DEMO, "-d", str(cli.data_dir), "--alerts-out", str(alerts))
    assert isinstance(proc, subprocess.CompletedProcess)
    return {"cli": cli, "stdout": proc.stdout, "alerts": alerts, "tmp": tmp}


@pytest.mark.slow  # starts a process
def test_analyze_prints_summary_and_flagged_sessions(analyzed: dict) -> None:
    out = analyzed["stdout"]
    assert "events stored" in out and "quarantined" in out
    assert "flagged sessions and entities" in out
    for category in ("enumeration", "bulk_extraction", "credential_stuffing", "scraping_loop"):
        assert category in out


@pytest.mark.slow  # starts a process
def test_alerts_file_matches_the_documented_schema(analyzed: dict) -> None:
    rows = [json.loads(x) for x in analyzed["alerts"].read_text().splitlines()]
    assert rows, "the demo holds attacks: analyze must flag some"
    for row in rows:
        jsonschema.validate(row, SCHEMA)
    assert len({r["alert_id"] for r in rows}) == len(rows)
    entity = [r for r in rows if r["entity_type"] != "session"]
    assert entity and all(r["session_id"] is None for r in entity)


@pytest.mark.slow  # starts a process
def test_alerts_are_stored_and_filterable(analyzed: dict) -> None:
    cli = analyzed["cli"]
    d = str(cli.data_dir)
    every = json.loads("[" + ",".join(
        cli("alerts", "-d", d, "-f", "json").stdout.splitlines()) + "]")
    assert len(every) == len(analyzed["alerts"].read_text().splitlines())
    crit = cli("alerts", "-d", d, "--severity", "critical", "-f", "json").stdout.splitlines()
    assert crit and all(json.loads(x)["severity"] == "critical" for x in crit)
    cred = cli("alerts", "-d", d, "--category", "credential_stuffing", "-f", "json").stdout
    rows = [json.loads(x) for x in cred.splitlines()]
    assert rows and {r["category"] for r in rows} == {"credential_stuffing"}
    ip = next(r["entity_id"] for r in rows if r["entity_type"] == "client_ip")
    only = cli("alerts", "-d", d, "--entity", ip, "-f", "json").stdout.splitlines()
    assert only and all(ip in x for x in only)
    none = cli("alerts", "-d", d, "--until", "2000-01-01", "-f", "json").stdout
    assert none.strip() == ""
    bad = cli("alerts", "-d", d, "--severity", "urgent", check=False)
    assert bad.returncode == 2
    # The terminal table (piped here): triage columns, one line per alert, every alert id.
    table = cli("alerts", "-d", d, "--severity", "critical").stdout
    assert "first reason" in table and "window (UTC)" in table and "detected_at" not in table
    ids = [json.loads(x)["alert_id"] for x in crit]
    assert all(sum(i in ln for ln in table.splitlines()) == 1 for i in ids), table


@pytest.mark.slow  # starts a process
def test_reanalyze_gives_the_same_alert_ids(analyzed: dict) -> None:
    cli = analyzed["cli"]
    again = analyzed["tmp"] / "again.jsonl"
    cli("analyze", *DEMO, "-d", str(cli.data_dir), "--alerts-out", str(again), "-q")
    ids = lambda p: sorted(json.loads(x)["alert_id"] for x in p.read_text().splitlines())  # noqa: E731
    assert ids(again) == ids(analyzed["alerts"])
    (n,) = cli.query("SELECT count(*) AS n FROM alerts")
    assert n["n"] == len(ids(again))  # updated, not duplicated


@pytest.mark.slow  # starts a process
def test_evaluate_reports_per_category_and_role(analyzed: dict) -> None:
    cli = analyzed["cli"]
    labels = ROOT / "sample_logs" / "demo" / "labels.ndjson"
    text = cli("evaluate", str(labels), str(analyzed["alerts"])).stdout
    assert "precision" in text and "power_user" in text and "nightly_export" in text
    res = json.loads(cli("evaluate", str(labels), str(analyzed["alerts"]), "--json").stdout)
    by_cat = {r["category"]: r for r in res["categories"]}
    for cat in ("enumeration", "bulk_extraction", "credential_stuffing", "scraping_loop"):
        assert by_cat[cat]["recall"] >= 0.9, by_cat[cat]
    fps = {r["role"]: r["flagged"] for r in res["benign_roles"]}
    for hard in ("power_user", "nightly_export", "typo_user", "retry_client",
                 "booking_customer"):
        assert fps[hard] == 0, (hard, res["false_positives"])
    # The two files swapped: a clear error naming the order, no traceback.
    bad = cli("evaluate", str(analyzed["alerts"]), str(labels), check=False)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "labels come first" in " ".join(bad.stderr.split())


@pytest.mark.slow  # starts a process
def test_train_then_analyze_uses_the_model(analyzed: dict) -> None:
    cli = analyzed["cli"]
    out = cli("train", "-d", str(cli.data_dir)).stdout
    model = Path(cli.data_dir) / "models" / "forest.skops"
    assert model.exists() and "trained on" in out
    with open(model, "rb") as fh:
        assert fh.read(2) == b"PK"  # a skops zip archive, not a pickle
    # The noise preview: what the settings would raise on this history, before going live.
    import re

    m = re.search(r"would raise\s+([\d,]+) alert", out)
    assert m, out
    n_all = int(m.group(1).replace(",", ""))
    assert n_all > 0
    for part in ("alerts by category", "top callers", "top tools", "credential_stuffing",
                 "chargePayment"):
        assert part in out, out
    crit = cli("train", "-d", str(cli.data_dir), "--min-severity", "critical").stdout
    n_crit = int(re.search(r"would raise\s+([\d,]+) alert", crit).group(1).replace(",", ""))
    assert 0 < n_crit < n_all
    bad = cli("train", "-d", str(cli.data_dir), "--min-severity", "severe", check=False)
    assert bad.returncode == 2 and "--min-severity" in bad.stderr


def test_read_commands_refuse_a_missing_store(tw, tmp_path: Path) -> None:
    """`query`/`alerts -d <typo>` used to create an empty store there and print 0 rows
    with exit 0; they now fail naming the path and leave nothing behind."""
    missing = tmp_path / "no-such-store"
    for args in (("query", "SELECT count(*) AS n FROM events"), ("alerts",)):
        proc = tw(*args, "-d", str(missing), check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "no toolwatch store at" in proc.stderr and str(missing) in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not missing.exists()
    # A store that exists but holds nothing yet still answers.
    log = tmp_path / "one.jsonl"
    log.write_text('{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t"}\n')
    tw.ingest(log)
    assert tw.query("SELECT count(*) AS n FROM events") == [{"n": 1}]
    assert tw("alerts", "-d", str(tw.data_dir), "-f", "json").stdout == ""
