"""Tests for the seeded MCP traffic generator (``sample_logs/generate.py``)."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from toolwatch.sample_logs.generate import generate, generate_bench

DEMO = Path(__file__).resolve().parents[1] / "sample_logs" / "demo"

# alias lists as specified for the toolwatch parser (kept independent of the generator)
TIME = ("ts", "timestamp", "time", "@timestamp")
SESSION = ("session_id", "sessionId", "session", "mcp.session.id")
CALLER = ("caller_id", "callerId", "user_id", "userId", "authenticatedUserId", "principal")
IP = ("client_ip", "clientIp", "ip", "remote_addr")
SERVER = ("server", "server_name", "serverName")
TOOL = ("tool", "toolName", "tool_name", "name", "gen_ai.tool.name")
ARGS = ("args", "arguments", "params", "input")
RESOURCE = ("resource_id", "resourceId")
STATUS = ("status", "outcome")
IS_ERROR = ("isError", "is_error")
BYTES = ("bytes", "bytes_returned", "bytesReturned", "response_bytes")
ROWS = ("rows", "rows_returned", "rowsReturned")
DURATION = ("duration_ms", "durationMs", "latency_ms")
EXTRAS = ("level", "request_id", "requestId", "user_agent", "userAgent", "trace_id", "transport")
KNOWN_STATUS = {
    "ok",
    "success",
    "error",
    "not_found",
    "404",
    "denied",
    "forbidden",
    "403",
    "auth_failed",
    "unauthorized",
    "401",
    "rate_limited",
    "429",
}
AUTH_FAIL = {"auth_failed", "unauthorized", "401"}
PER_CALL_FILES = (
    "docs-server.jsonl",
    "crm-server.jsonl",
    "travel-server.jsonl",
    "integrations-server.jsonl.gz",
    "wiki-server.jsonl",
    "files-server.jsonl",
    "finance-server.jsonl",
    "shop-server.jsonl",
)
ATTACK_VARIANTS = {
    ("enumeration", "fast"),
    ("enumeration", "low_and_slow"),
    ("enumeration", "summary_only"),
    ("bulk_extraction", None),
    ("bulk_extraction", "relative"),
    ("bulk_extraction", "summary_only"),
    ("credential_stuffing", "fast"),
    ("credential_stuffing", "distributed"),
    ("credential_stuffing", "summary_only"),
    ("scraping_loop", None),
    ("tool_loop", "same_call"),
    ("tool_loop", "cycle"),
    ("privilege_chain", None),
    ("step_skip", "fulfill_without_charge"),
    ("step_skip", "approve_without_review"),
    ("step_skip", "transfer_without_verify"),
    ("duplicate_execution", "no_key"),
    ("duplicate_execution", "different_keys"),
    ("duplicate_execution", "coupon_twice"),
    ("duplicate_execution", "double_refund"),
    ("cross_server_flow", "bulk_then_upload"),
    ("cross_server_flow", "sensitive_then_send"),
    ("concurrency_abuse", "docs"),
    ("concurrency_abuse", "travel"),
    ("concurrency_abuse", "jsonrpc"),
    ("concurrency_abuse", "multi_session"),
    ("race_condition", "session"),
    ("race_condition", "multi_session"),
}
#: Classes whose examples are spread over several variants: >= 3 per class, not per variant.
SPREAD_CATEGORIES = {"step_skip", "duplicate_execution"}
BENIGN_ROLES = {
    "normal_user",
    "power_user",
    "nightly_export",
    "typo_user",
    "retry_client",
    "booking_customer",
    "ci_bot",
    # hard negatives of the sequence classes (issue 11) and the concurrency ones (issue 12)
    "job_poller",
    "doc_editor",
    "files_user",
    "shop_customer",
    "safe_replay_client",
    "crm_round_trip",
    "own_file_uploader",
    "finance_clerk",
    "parallel_agent",
    "sequential_writer",
    "parallel_reader",
    "parallel_writes_distinct",
    "batch_sync",
    "parallel_workers",
}


def _read_lines(path: Path) -> list[bytes]:
    data = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    return data.split(b"\n")[:-1]


def _first(d: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in d:
            return d[k]
    return None


def _epoch(v: Any) -> float:
    if isinstance(v, (int, float)):
        return v / 1000.0 if v > 1e11 else float(v)
    return datetime.fromisoformat(v).timestamp()


def _events(
    demo: Path, files: tuple[str, ...] = PER_CALL_FILES
) -> Iterator[tuple[str, dict[str, Any]]]:
    for fname in files:
        for raw in _read_lines(demo / fname):
            try:
                d = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(d, dict) and _first(d, TIME) is not None:
                yield fname, d


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo set as the generator makes it now (seed 7, scale 1): the committed copy is
    checked against it by test_committed_demo_is_reproducible, so the content tests below
    hold for the committed demo once it is regenerated, and do not lag behind it."""
    out = tmp_path_factory.mktemp("demo")
    generate(out, seed=7, scale=1.0)
    return out


@pytest.fixture(scope="module")
def labels(demo: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (demo / "labels.ndjson").read_text().splitlines()]


def test_deterministic_for_seed(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate(a, seed=11, scale=0.4)
    generate(b, seed=11, scale=0.4)
    generate(c, seed=12, scale=0.4)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    assert (a / "labels.ndjson").read_bytes() != (c / "labels.ndjson").read_bytes()


def test_committed_demo_is_reproducible(tmp_path: Path) -> None:
    generate(tmp_path, seed=7, scale=1.0)
    for p in sorted(DEMO.iterdir()):
        if p.suffix in (".jsonl", ".gz", ".json"):
            assert _read_lines(p) == _read_lines(tmp_path / p.name), p.name


def test_demo_size_and_mix(demo: Path, labels: list[dict[str, Any]]) -> None:
    total = sum(p.stat().st_size for p in demo.iterdir())
    # 3.5 MB with the four core classes; the five sequence classes, the two concurrency
    # classes, their hard negatives and three more servers add ~1.2 MB (4.7 MB).
    assert total <= 5.2e6
    sessions = [x for x in labels if x["kind"] == "session"]
    assert len(sessions) >= 150
    attacks = [x for x in sessions if x["label"] != "benign"]
    # 11 attack classes with >= 3 examples each (a multi-session race counts each session).
    assert 0 < len(attacks) / len(sessions) <= 0.13
    per_variant: dict[tuple[str, str | None], int] = defaultdict(int)
    for x in sessions:
        if x["label"] != "benign" and x["variant"] != "distributed":
            per_variant[(x["label"], x["variant"])] += 1
    for x in labels:
        if x["kind"] == "entity":
            per_variant[(x["label"], x["variant"])] += 1
    assert set(per_variant) == ATTACK_VARIANTS
    # >= 3 examples of every attack variant (of every class, for the spread ones);
    # summary-only attacks: one per category
    assert min(v for (c, var), v in per_variant.items()
               if var != "summary_only" and c not in SPREAD_CATEGORIES) >= 3, per_variant
    for c in SPREAD_CATEGORIES:
        assert sum(v for (cc, _), v in per_variant.items() if cc == c) >= 3, per_variant
    assert sum(v for (_, var), v in per_variant.items() if var == "summary_only") >= 3


def test_labels_cover_categories_and_roles(labels: list[dict[str, Any]]) -> None:
    from toolwatch.detectors.config import CATEGORIES

    assert {x["label"] for x in labels} == {"benign", *CATEGORIES} - {"anomaly"}
    assert {x["role"] for x in labels if x["label"] == "benign"} >= BENIGN_ROLES
    for x in labels:
        assert x["kind"] in ("session", "entity")
        if x["kind"] == "session":
            for k in ("session_id", "caller_id", "client_ip", "label", "role", "variant"):
                assert k in x
            if x["session_id"] is None:
                assert x["first_seen"] and x["last_seen"]
            # second categories a session legitimately earns (honoured by evaluate)
            assert set(x.get("also") or []) <= set(CATEGORIES) - {x["label"]}
        else:
            assert x["entity_type"] in ("client_ip", "caller_id")
            assert (x["label"], x["variant"]) in {
                ("credential_stuffing", "distributed"), ("race_condition", "multi_session"),
                ("concurrency_abuse", "multi_session")}
            assert x["first_seen"] <= x["last_seen"]
    assert any(x["session_id"] is None for x in labels)


def test_per_call_lines_use_known_aliases(demo: Path) -> None:
    allowed = set(
        TIME
        + SESSION
        + CALLER
        + IP
        + SERVER
        + TOOL
        + ARGS
        + RESOURCE
        + STATUS
        + IS_ERROR
        + BYTES
        + ROWS
        + DURATION
        + EXTRAS
    )
    seen: set[str] = set()
    n = 0
    for fname in PER_CALL_FILES:
        for raw in _read_lines(demo / fname):
            try:
                d = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                continue
            if not isinstance(d, dict):
                continue
            n += 1
            assert set(d) <= allowed, (fname, set(d) - allowed)
            seen |= set(d)
            for group in (SERVER, TOOL, ARGS, STATUS, BYTES, DURATION):
                assert sum(k in d for k in group) == 1, (fname, group, d)
            assert sum(k in d for k in TIME) <= 1
            assert sum(k in d for k in SESSION) <= 1
            assert _first(d, CALLER) is not None or _first(d, IP) is not None
            assert isinstance(_first(d, ARGS), dict)
            assert str(_first(d, STATUS)) in KNOWN_STATUS
    assert n > 5000
    # every alias style is exercised somewhere
    for group in (TIME, SESSION, CALLER, IP, SERVER, TOOL, ARGS, BYTES, ROWS, DURATION):
        assert set(group) <= seen, set(group) - seen


def test_malformed_lines_present(demo: Path) -> None:
    kinds: set[str] = set()
    for fname in PER_CALL_FILES:
        for raw in _read_lines(demo / fname):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                kinds.add("non_utf8")
                continue
            try:
                d = json.loads(text)
            except ValueError:
                kinds.add("empty" if not text.strip() else "truncated")
                continue
            if isinstance(d, list):
                kinds.add("json_array")
            elif _first(d, TIME) is None:
                kinds.add("missing_ts")
            elif isinstance(_first(d, BYTES), str) or isinstance(_first(d, ROWS), str):
                kinds.add("number_as_string")
    assert {"non_utf8", "truncated", "json_array", "missing_ts", "number_as_string"} <= kinds
    manifest = json.loads((demo / "manifest.json").read_text())
    assert len(manifest["malformed"]) >= 10


def test_sessions_match_labels(demo: Path, labels: list[dict[str, Any]]) -> None:
    by_sid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    sessionless: dict[str, list[float]] = defaultdict(list)
    for _fname, d in _events(demo):
        sid = _first(d, SESSION)
        if sid is None:
            key = _first(d, CALLER) or "ip:" + _first(d, IP)
            sessionless[key].append(_epoch(_first(d, TIME)))
        else:
            by_sid[sid].append(d)
    # sessions with ids: every label row (per-call servers) has its events
    for x in labels:
        if (
            x["kind"] != "session"
            or x["session_id"] is None
            or x["server"] in ("kb-server", "billing-server")
        ):
            continue
        ev = by_sid.pop(x["session_id"])
        assert x["n_calls"] - 1 <= len(ev) <= x["n_calls"]
        assert {_first(e, CALLER) for e in ev} == {x["caller_id"]}
    assert not by_sid
    # sessionless: caller (else ip) + 30 min inactivity gap reproduces the labelled sessions.
    # Lines carry each call's completion time (ingest's default ts_marks=end) while labels
    # span the calls' start times: a line may come up to one call's duration later.
    got: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, ts in sessionless.items():
        ts.sort()
        start = ts[0]
        for a, b in itertools.pairwise(ts):
            if b - a > 1800:
                got[key].append((start, a))
                start = b
        got[key].append((start, ts[-1]))
    want: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for x in labels:
        if x["kind"] == "session" and x["session_id"] is None:
            want[x["caller_id"] or "ip:" + x["client_ip"]].append(
                (_epoch(x["first_seen"]), _epoch(x["last_seen"])))
    assert set(got) == set(want)
    max_duration = 120.0
    for key, spans in want.items():
        assert len(got[key]) == len(spans), key
        for (g0, g1), (w0, w1) in zip(sorted(got[key]), sorted(spans), strict=True):
            assert 0 <= g0 - w0 + 0.01 <= max_duration and 0 <= g1 - w1 + 0.01 <= max_duration


def test_attack_shapes(demo: Path, labels: list[dict[str, Any]]) -> None:
    by_sid: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _fname, d in _events(demo):
        by_sid[_first(d, SESSION)].append(d)
    rows = [x for x in labels if x["kind"] == "session"]
    for x in rows:
        if x["variant"] == "distributed":
            fails = sum(str(_first(e, STATUS)) in AUTH_FAIL for e in by_sid[x["session_id"]])
            assert 1 <= fails <= 2
        if x["variant"] == "low_and_slow":
            assert x["n_calls"] < 50
            span = _epoch(x["last_seen"]) - _epoch(x["first_seen"])
            assert 2.5 * 3600 < span < 4 * 3600
        if x["role"] == "typo_user" and x["server"] != "billing-server":
            fails = sum(str(_first(e, STATUS)) in AUTH_FAIL for e in by_sid[x["session_id"]])
            assert fails == 2
        if x["role"] == "power_user" and x["server"] != "billing-server":
            assert x["n_calls"] >= 100
    for ent in (x for x in labels if x["kind"] == "entity" and x["variant"] == "distributed"):
        key = "client_ip" if ent["entity_type"] == "client_ip" else "caller_id"
        members = [x for x in rows if x["variant"] == "distributed" and x[key] == ent["entity_id"]]
        assert 20 <= len(members) <= 40


def test_campaigns_are_one_actor_in_stage_order(labels: list[dict[str, Any]]) -> None:
    """Issue 27: some actors run several stages (recon, credential stuffing, bulk reads,
    data sent out), so incidents have stories to roll up. Each campaign is one identity,
    its sessions inside one activity window (no gap over 6 h, the incidents' default),
    and every session still carries its own attack label."""
    from toolwatch.detectors.incidents import CATEGORY_STAGE, STAGES

    camps: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for x in labels:
        if x.get("campaign"):
            assert x["kind"] == "session" and x["label"] != "benign", x
            camps[x["campaign"]].append(x)
    assert len(camps) >= 5, sorted(camps)
    for name, rows in camps.items():
        assert len(rows) >= 2, name
        assert len({(x["caller_id"], x["client_ip"]) for x in rows}) == 1, name
        rows.sort(key=lambda x: x["first_seen"])
        end = _epoch(rows[0]["last_seen"])
        for x in rows[1:]:
            assert _epoch(x["first_seen"]) - end < 6 * 3600, (name, x)
            end = max(end, _epoch(x["last_seen"]))
    # the seeds' full story: enumerate documents, stuff connectExternalService, bulk-read
    # with searchItems, send the data out through another server, in that order
    story = {name: [CATEGORY_STAGE[x["label"]] for x in sorted(rows, key=lambda x: x[
        "first_seen"])] for name, rows in camps.items()}
    full = [s for s in story.values() if {"discovery", "credential_access", "collection",
                                          "exfiltration"} <= set(s)]
    assert full, story
    ranks = [STAGES.index(s) for s in dict.fromkeys(full[0])]
    assert ranks == sorted(ranks), full[0]
    # different campaigns are different actors
    callers = [rows[0]["caller_id"] for rows in camps.values()]
    assert len(set(callers)) == len(callers)


def test_transcript_requests_have_responses(demo: Path) -> None:
    pending: dict[tuple[str, Any], str] = {}
    calls = 0
    for raw in _read_lines(demo / "proxy-transcript.jsonl"):
        d = json.loads(raw)
        msg = d["message"]
        assert msg["jsonrpc"] == "2.0"
        if d["direction"] == "request" and "id" in msg:
            pending[(d["session_id"], msg["id"])] = msg["method"]
            calls += msg["method"] == "tools/call"
        elif d["direction"] == "response":
            assert ("result" in msg) != ("error" in msg)
            pending.pop((d["session_id"], msg["id"]))
    assert not pending
    assert calls > 500


def test_bench_mode_exact_lines(tmp_path: Path) -> None:
    n = 20_000
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    stats = generate_bench(n, a, seed=3)
    generate_bench(n, b, seed=3)
    assert stats["lines"] == n
    data = a.read_bytes()
    assert data == b.read_bytes()
    lines = data.split(b"\n")
    assert lines[-1] == b"" and len(lines) == n + 1
    bad = no_sid = 0
    for raw in lines[:-1]:
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            bad += 1
            continue
        if not isinstance(d, dict) or _first(d, TIME) is None:
            bad += 1
            continue
        no_sid += _first(d, SESSION) is None
    assert 1 <= bad <= 60
    assert 0.02 < no_sid / n < 0.10
