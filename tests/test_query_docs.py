"""Discoverable forensics (issue 27 §7): ``toolwatch schema`` lists what the guard lets a
query read; docs/query.md lists the same columns (checked here, so it cannot drift); its
example queries run and reach sessions known only from ``SESSION_END`` lines; DuckDB's
hints survive in error messages.

Real store (ingested by the real CLI), real DuckDB, real query children.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.conftest import TOOLWATCH
from toolwatch.errors import QueryError
from toolwatch.query import VIEWS, run_query
from toolwatch.store import Store

pytestmark = pytest.mark.slow  # starts a process

DOC = Path(__file__).resolve().parents[1] / "docs" / "query.md"

LOG = b"\n".join(
    [
        b'{"ts":"2026-11-02T10:00:00Z","session_id":"s-calls","caller_id":"alice",'
        b'"server":"docs","tool":"getDocument","args":{"documentId":"doc-1"},"status":"ok",'
        b'"bytes":100}',
        b'{"ts":"2026-11-02T10:00:01Z","session_id":"s-calls","caller_id":"alice",'
        b'"server":"docs","tool":"getDocument","args":{"documentId":"doc-2"},"status":"401",'
        b'"bytes":10}',
        # Two sessions known only from their one summary line.
        b'{"event":"SESSION_END","sessionId":"s-sum-1","ts":"2026-11-02T12:00:00Z",'
        b'"callerId":"svc-7","callCount":1450,"uniqueResourcesAccessed":1302,'
        b'"totalBytesReturned":88000000,"authFailures":9,"durationMs":60000}',
        b'{"event":"SESSION_ANOMALY","sessionId":"s-sum-2","ts":"2026-11-02T13:00:00Z",'
        b'"callerId":"svc-8","callCount":20,"totalBytesReturned":5000,"authFailures":0}',
    ]
) + b"\n"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("docs")
    (tmp / "in.jsonl").write_bytes(LOG)
    p = subprocess.run(
        [TOOLWATCH, "ingest", str(tmp / "in.jsonl"), "-d", str(tmp / "store"), "--no-progress"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return tmp / "store"


def _schema_cli(store_dir: Path) -> list[dict[str, str]]:
    p = subprocess.run(
        [TOOLWATCH, "schema", "-d", str(store_dir), "-f", "json"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return [orjson.loads(line) for line in p.stdout.splitlines()]


def _documented() -> dict[str, set[tuple[str, str]]]:
    """(column, type) pairs per view from docs/query.md: the rows ``| `col` | TYPE | …``
    under a heading naming the view in backticks (a heading may name several)."""
    out: dict[str, set[tuple[str, str]]] = {}
    views: list[str] = []
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            views = [v for v in re.findall(r"`([a-z_]+)`", line) if v in VIEWS]
            continue
        m = re.match(r"\|\s*(`[^|]+`)\s*\|\s*([^|]+?)\s*\|", line)
        if m and views:
            for col in re.findall(r"`([^`]+)`", m.group(1)):
                for v in views:
                    out.setdefault(v, set()).add((col, m.group(2)))
    return out


def test_schema_lists_every_view_through_the_guard(store_dir: Path):
    rows = _schema_cli(store_dir)
    assert {r["view"] for r in rows} == set(VIEWS)
    live = {(r["view"], r["column"]): r["type"] for r in rows}
    assert live[("sessions", "basis")] == "VARCHAR"
    assert live[("events", "ts")] == "TIMESTAMP WITH TIME ZONE"
    # Nothing beyond the views: no catalog view, no setting, no file path.
    text = orjson.dumps(rows).decode()
    assert str(store_dir) not in text and "pg_settings" not in text


def test_docs_list_every_view_and_column(store_dir: Path):
    rows = _schema_cli(store_dir)
    documented = _documented()
    for view in VIEWS:
        live = {(r["column"], r["type"]) for r in rows if r["view"] == view}
        assert documented.get(view) == live, (
            f"docs/query.md is out of step with `toolwatch schema` for {view}: "
            f"missing {sorted(live - documented.get(view, set()))}, "
            f"stale {sorted(documented.get(view, set()) - live)}"
        )


def _examples() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


def test_docs_examples_run_and_reach_summary_only_sessions(store_dir: Path):
    store = Store(store_dir)
    examples = _examples()
    assert len(examples) >= 5
    reached: set[str] = set()
    for sql in examples:
        res = run_query(store, sql)  # raises with the SQL's problem if an example is broken
        for col in ("session_id", "caller_id"):
            if col in res.table.column_names:
                reached |= {v for v in res.table[col].to_pylist() if v}
    # The summary-only sessions (and their callers) show up in what the docs suggest.
    assert {"s-sum-1", "s-sum-2"} <= reached, reached
    sessions = run_query(store,
        "SELECT session_id, basis, calls, total_bytes FROM sessions ORDER BY session_id"
    ).table.to_pylist()
    assert {r["session_id"]: r["basis"] for r in sessions} == {
        "s-calls": "events", "s-sum-1": "summary", "s-sum-2": "summary",
    }


def test_errors_keep_duckdbs_hints(store_dir: Path):
    store = Store(store_dir)
    with pytest.raises(QueryError) as ei:
        run_query(store, "SELECT caler_id FROM sessions")
    msg = str(ei.value)
    assert "Candidate bindings" in msg and '"caller_id"' in msg
    with pytest.raises(QueryError) as ei:
        run_query(store, "SELECT * FROM sesions")
    assert "sessions" in str(ei.value)  # the guard names the views
    with pytest.raises(QueryError, match=r"(?s)not a built-in.*Did you mean .*count\(\)"):
        run_query(store, "SELECT cont(*) FROM sessions")
    p = subprocess.run(
        [TOOLWATCH, "query", "-d", str(store_dir), "SELECT caler_id FROM sessions"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "Candidate bindings" in p.stderr and "caller_id" in p.stderr
