"""The forensic notebook never writes a verdict into the store it is pointed at (issue 27):
its "record the verdict" cell writes to a temporary copy of the triage directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from toolwatch.dashboard.triage import TriageStore

from tests.fixtures.dashboard_store import build_store
from tests.test_notebook import _check_evidence, _execute


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.slow  # executes the notebook
def test_notebook_leaves_the_stores_triage_alone(tmp_path: Path, monkeypatch) -> None:
    store = tmp_path / "store"
    build_store(store)
    TriageStore(store).mark("al-bulk-0002", "acknowledged", "alice", "known export job")
    before = _digest(store / "_triage")
    out = tmp_path / "evidence"
    nb = _execute(monkeypatch, store, out)
    _check_evidence(out)
    assert _digest(store / "_triage") == before, "the notebook wrote into the store's triage"
    assert TriageStore(store).current("al-bulk-0002").status == "acknowledged"
    shown = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []))
    assert "draft verdict written to" in shown
