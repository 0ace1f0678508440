"""The floors of the house (issue 29): import-linter contracts in pyproject.toml.

The repository keeps ``ingest/``, ``detectors/`` and ``dashboard/`` at its top, but they
install as ``toolwatch.ingest``, ``toolwatch.detectors`` and ``toolwatch.dashboard``
(``[tool.setuptools.package-dir]``). import-linter finds a package's modules by walking
its directory, so each run lays the installed layout out in a temporary tree of symlinks
and runs ``lint-imports`` there in a subprocess (its own ``sys.path``, with that tree
first). ``make lint`` runs this file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import importlinter  # noqa: F401 - the dev extra pins it; no skip: the floors must be checked
import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"
#: Top folders that install as subpackages of toolwatch.
SUBPACKAGES = ("ingest", "detectors", "dashboard")


def _lay_out(root: Path, copy: tuple[str, ...] = ()) -> Path:
    """``root/toolwatch`` as installed: symlinks to the repository's files, except the
    entries named in ``copy`` (paths under the installed package), which are real copies a
    test may edit."""
    pkg = root / "toolwatch"
    pkg.mkdir()
    for entry in (REPO / "toolwatch").iterdir():
        if entry.name in SUBPACKAGES or entry.name == "__pycache__":
            continue  # a developer's own symlink of a subpackage is replaced below
        (pkg / entry.name).symlink_to(entry)
    for name in SUBPACKAGES:
        (pkg / name).symlink_to(REPO / name, target_is_directory=True)
    for rel in copy:
        target = pkg / rel
        top = pkg / Path(rel).parts[0]
        if top.is_symlink() and top != target:  # copy the whole subpackage, then edit in it
            src = top.resolve()
            top.unlink()
            shutil.copytree(src, top, ignore=shutil.ignore_patterns("__pycache__"))
        if target.is_symlink():
            src = target.resolve()
            target.unlink()
            shutil.copy(src, target)
    return root


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
    return subprocess.run(
        [sys.executable, "-c", code, "--config", str(PYPROJECT), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_are_declared() -> None:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    assert {c["id"] for c in contracts} >= {"floors", "ground", "dashboard", "detectors", "engines"}
    floors = next(c for c in contracts if c["id"] == "floors")
    # bottom to top: ground, ingest, detectors, query, live | dashboard, commands
    assert floors["layers"][2] == "toolwatch.query : toolwatch.query_child"
    assert floors["layers"][3] == "toolwatch.detectors"
    assert floors["layers"][4] == "toolwatch.ingest"
    # No exceptions: the store's incidents view left with the query runner (issue 29).
    assert all(c.get("ignore_imports", []) == [] for c in contracts)
    assert "toolwatch.live | toolwatch.dashboard" in floors["layers"]


def test_the_house_keeps_its_floors(tmp_path: Path) -> None:
    got = _lint(_lay_out(tmp_path))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "0 broken" in got.stdout
    # The subpackages were walked: a layout error would lint only toolwatch/ and pass.
    analyzed = int(re.search(r"Analyzed (\d+) files", got.stdout).group(1))
    on_disk = sum(1 for name in ("toolwatch", *SUBPACKAGES) for _ in (REPO / name).rglob("*.py"))
    assert analyzed >= on_disk


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # ground importing a floor above it
        ("errors.py", "import toolwatch.analyze", "Ground imports nothing above it"),
        # the store calling the query runner, even from inside a function
        ("store.py", "def _planted():\n    import toolwatch.query", "Ground imports nothing"),
        # detectors importing the live engine
        ("detectors/alerts.py", "import toolwatch.live.config", "Detectors and ingest"),
        # the dashboard importing the live engine
        ("dashboard/swimlane.py", "import toolwatch.live", "The dashboard does not import"),
        # batch analyze reading suppression from the dashboard again
        ("analyze.py", "import toolwatch.dashboard.triage", "Batch analyze and the live"),
    ],
)
def test_an_upward_import_is_caught(tmp_path: Path, module: str, planted: str, broken: str) -> None:
    root = _lay_out(tmp_path, copy=(module,))
    path = root / "toolwatch" / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by tests/test_layers.py\n")
    got = _lint(root)
    assert got.returncode != 0
    assert f"{broken}" in got.stdout
    assert "BROKEN" in got.stdout
