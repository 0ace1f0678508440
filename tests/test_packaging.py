"""Packaging: toolwatch installs its folders under its own name, never as global imports.

The repository keeps ``ingest/``, ``detectors/``, ``dashboard/`` and ``sample_logs/`` at the
top (the project's layout), but they install as ``toolwatch.ingest`` and so on, so installing
toolwatch cannot shadow or be shadowed by another distribution's ``ingest`` or ``dashboard``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("ingest", "detectors", "dashboard", "sample_logs")
TOP_LEVEL_IMPORT = re.compile(rf"^\s*(from|import)\s+({'|'.join(MAPPED)})(\.|\s|$)", re.M)


def _sources() -> list[Path]:
    dirs = ("toolwatch", *MAPPED, "tests", "benchmarks", "notebooks")
    return [p for d in dirs for p in (ROOT / d).rglob("*.py")]


def test_no_source_imports_the_folders_as_top_level_packages():
    offenders = [
        f"{p.relative_to(ROOT)}:{t[: m.start()].count(chr(10)) + 1}"
        for p in _sources()
        for t in [p.read_text(encoding="utf-8")]
        for m in TOP_LEVEL_IMPORT.finditer(t)
    ]
    assert offenders == []


@pytest.mark.slow  # starts a process
def test_installed_names_outside_the_checkout(tmp_path):
    # From a directory that is not the checkout: only toolwatch.* is importable.
    code = (
        "import importlib.util as u\n"
        "import toolwatch.ingest.sources.kafka, toolwatch.detectors.pipeline\n"
        "import toolwatch.dashboard.launch, toolwatch.sample_logs.generate\n"
        f"print([n for n in {MAPPED!r} if u.find_spec(n) is not None])\n"
        "import sys\n"
        f"print([n for n in {MAPPED!r} if n in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "[]"]


@pytest.mark.slow
def test_wheel_holds_the_folders_under_toolwatch(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("toolwatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"toolwatch"}
    for need in (
        "toolwatch/ingest/parse.py",
        "toolwatch/ingest/sources/kafka.py",
        "toolwatch/detectors/pipeline.py",
        "toolwatch/dashboard/app.py",
        "toolwatch/dashboard/views/session.py",
        "toolwatch/dashboard/icon.png",
        "toolwatch/sample_logs/generate.py",
        "toolwatch/sample_logs/demo/labels.ndjson",
    ):
        assert need in names, need


def test_module_names_in_strings_are_namespaced():
    # import_module / -m / lazy tables name modules in strings, which the import check misses.
    names = "|".join(MAPPED)
    pattern = re.compile(rf"""(import_module\(|["']-m["'],\s*|-m\s)["']?({names})[."']""")
    offenders = [
        f"{p.relative_to(ROOT)}:{t[: m.start()].count(chr(10)) + 1}"
        for p in _sources()
        for t in [p.read_text(encoding="utf-8")]
        for m in pattern.finditer(t)
    ]
    assert offenders == []


@pytest.mark.slow  # starts a process
def test_analyze_warms_the_namespaced_detectors_without_pandas():
    # Run from the checkout, where a top-level `detectors` folder *is* importable: the
    # warm-up must still load toolwatch.detectors (one copy) and scikit-learn without pandas.
    code = (
        "import sys\n"
        "from toolwatch.analyze import _warm_imports\n"
        "_warm_imports()\n"
        "print(sorted(n for n in ('detectors', 'pandas', 'sklearn.ensemble',\n"
        "    'toolwatch.detectors.pipeline') if sys.modules.get(n) is not None))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['sklearn.ensemble', 'toolwatch.detectors.pipeline']"
