"""Red team round 2: JSON-RPC ids reused by the agent.

JSON-RPC only forbids two outstanding requests with one id; once answered, an id may be
used again, and the agent picks the ids. Every request with a reused id was paired with
the *first* response with that id: an agent that enumerates or guesses passwords with
``"id": 1`` on every call had all its calls stored with the first call's outcome (the
failures as ``ok``, invisible to the enumeration and credential detectors) and negative
durations. Now the k-th request with an id pairs with the k-th response with it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TOOLWATCH
from toolwatch.query import query
from toolwatch.store import Store

pytestmark = pytest.mark.slow  # starts a process


def _run(tmp_path: Path, lines: list[dict]) -> list[dict]:
    src = tmp_path / "rpc.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    store = tmp_path / "st"
    res = subprocess.run([TOOLWATCH, "ingest", str(src), "-d", str(store), "--no-progress"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return query(Store(store),
        "SELECT tool, status, duration_ms FROM events ORDER BY tool"
    ).to_pylist()


@settings(max_examples=6, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from([1, 2, "1"]), st.booleans()),
                      min_size=2, max_size=12))
def test_reused_ids_pair_each_call_with_its_own_response(tmp_path_factory, calls) -> None:
    """Calls answered in turn (request, then its response), ids drawn from a tiny set."""
    lines: list[dict] = []
    for i, (rid, failed) in enumerate(calls):
        t = f"2026-11-02T10:{i // 30:02d}:{(2 * i) % 60:02d}.000Z"
        t2 = f"2026-11-02T10:{i // 30:02d}:{(2 * i) % 60:02d}.250Z"
        lines.append({"ts": t, "session_id": "c", "jsonrpc": "2.0", "id": rid,
                      "method": "tools/call", "params": {"name": f"t{i:02d}"}})
        lines.append({"ts": t2, "session_id": "c", "jsonrpc": "2.0", "id": rid,
                      "error": {"code": -32001, "message": "Document not found"}} if failed
                     else {"ts": t2, "session_id": "c", "jsonrpc": "2.0", "id": rid,
                           "result": {"content": [{"type": "text", "text": "x"}]}})
    rows = _run(tmp_path_factory.mktemp("rpc"), lines)
    assert [r["tool"] for r in rows] == [f"t{i:02d}" for i in range(len(calls))]
    for r, (_, failed) in zip(rows, calls, strict=True):
        assert (r["status"] == "not_found") == failed, (r, calls)
        assert r["duration_ms"] == 250.0, (r, calls)
