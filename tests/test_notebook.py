"""Execute notebooks/forensics.ipynb with nbclient so the walkthrough never rots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.fixtures.dashboard_store import build_store

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "forensics.ipynb"
EVIDENCE = (
    "sessions.csv",
    "resources.csv",
    "calls_around_alert.csv",
    "related_alerts.csv",
    "evidence.json",
)


def _execute(monkeypatch, data_dir: Path | None, out_dir: Path) -> nbformat.NotebookNode:
    if data_dir is None:
        monkeypatch.delenv("TOOLWATCH_NOTEBOOK_DATA_DIR", raising=False)
    else:
        monkeypatch.setenv("TOOLWATCH_NOTEBOOK_DATA_DIR", str(data_dir))
    monkeypatch.setenv("TOOLWATCH_NOTEBOOK_OUT", str(out_dir))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute(env=dict(os.environ))
    return nb


def _check_evidence(out_dir: Path) -> dict:
    for name in EVIDENCE:
        path = out_dir / name
        assert path.exists() and path.stat().st_size > 0, name
    bundle = json.loads((out_dir / "evidence.json").read_text())
    assert bundle["alert"]["alert_id"]
    assert bundle["sessions"], "the pivot entity has sessions"
    return bundle


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_forensics", NOTEBOOK.parent / "build_forensics.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    build = mod.build

    assert [c.source for c in build().cells] == [c.source for c in nb.cells], (
        "notebooks/forensics.ipynb is stale: run python notebooks/build_forensics.py"
    )


@pytest.mark.slow  # starts a process
def test_notebook_on_fixture_store(tmp_path, monkeypatch):
    """Fast and independent of the detectors' exact output."""
    store = tmp_path / "store"
    build_store(store)
    out = tmp_path / "evidence"
    _execute(monkeypatch, store, out)
    bundle = _check_evidence(out)
    assert bundle["alert"]["alert_id"] == "al-bulk-0002"  # the fixture's top alert
    assert bundle["pivot"] == {"column": "caller_id", "value": "svc-export"}


@pytest.mark.slow  # starts a process
def test_notebook_relative_paths_mean_the_repository_root(tmp_path, monkeypatch):
    """`TOOLWATCH_NOTEBOOK_DATA_DIR=.toolwatch/demo/store` typed at the repository root
    names that store, although the kernel runs in notebooks/ (it used to open an empty
    store under notebooks/ and analyze the sample logs into it)."""
    store = tmp_path / "store"
    build_store(store)
    out = tmp_path / "evidence"
    rel_store = Path(os.path.relpath(store, ROOT))
    rel_out = Path(os.path.relpath(out, ROOT))
    assert not rel_store.is_absolute()
    _execute(monkeypatch, rel_store, rel_out)
    bundle = _check_evidence(out)
    # The fixture's top alert: the given store was used, not a fresh analysis.
    assert bundle["alert"]["alert_id"] == "al-bulk-0002"


@pytest.mark.slow
def test_notebook_on_sample_logs(tmp_path, monkeypatch):
    """The real walkthrough: analyze sample_logs/demo/ into a temp store, then investigate."""
    # The demo logs are committed: their absence is a failure, not a reason to skip.
    assert any((ROOT / "sample_logs" / "demo").glob("*.jsonl*")), "sample_logs/demo/ is empty"
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out = tmp_path / "evidence"
    _execute(monkeypatch, None, out)
    _check_evidence(out)
