"""Shared fixtures: run the real ``toolwatch`` CLI against a temporary store.

Also the test tiers (see CONTRIBUTING.md):

* ``make test`` runs everything; ``make test-fast`` runs ``-m "not slow"`` under
  pytest-xdist with the ``dev`` Hypothesis profile.
* Tests that start a process (the real CLI through the ``tw`` fixture, the Tansu broker
  through ``kafka_broker``) are marked ``slow`` here, so a new one is out of the fast tier
  without anyone remembering to mark it. Others are marked in their files.
* Hypothesis profiles: ``ci`` keeps every property test's own example count (what the
  suite has always run); ``dev`` caps each at :data:`DEV_MAX_EXAMPLES`. Chosen by
  ``HYPOTHESIS_PROFILE``; without it, ``ci`` when ``CI`` is set and Hypothesis's
  ``default`` otherwise, so ``make test`` runs what it always ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from tests.kafka_broker import kafka_broker  # noqa: F401  (real Tansu broker fixture)

ROOT = Path(__file__).resolve().parents[1]
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))

# ------------------------------------------------------------------ hypothesis profiles
#: Most examples a property test runs under the ``dev`` profile (``make test-fast``).
DEV_MAX_EXAMPLES = 10

# ``ci`` is Hypothesis's built-in CI profile (derandomized, no deadline, no example
# database) with each test's own example count: what CI has always run. ``dev`` is the
# local default profile with fewer examples.
settings.register_profile("ci", settings.get_profile("ci"))
settings.register_profile("dev", settings.get_profile("default"),
                          max_examples=DEV_MAX_EXAMPLES)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") else "default"
)
settings.load_profile(HYPOTHESIS_PROFILE)

#: Fixtures that start another process (``tw_env`` is only the CLI's environment): a test
#: using one is ``slow``, plus the marker named here.
PROCESS_FIXTURES = {"tw": "slow", "tw_env": "slow", "tw_env_module": "slow",
                    "kafka_broker": "kafka"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark process-starting tests ``slow``; under ``dev``, cap property tests' examples."""
    for item in items:
        for fixture, marker in PROCESS_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.slow)
                item.add_marker(getattr(pytest.mark, marker))
        if HYPOTHESIS_PROFILE == "dev":
            _cap_examples(item)


def _cap_examples(item: pytest.Item) -> None:
    """Most property tests pin ``@settings(max_examples=...)``, which outranks the loaded
    profile; the dev tier lowers each to :data:`DEV_MAX_EXAMPLES` (never raises one).

    Hypothesis reads a test's settings from this attribute when the test runs; if a new
    Hypothesis renames it, the cap is simply not applied (slower, never weaker).
    """
    fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
    own = getattr(fn, "_hypothesis_internal_use_settings", None)
    if isinstance(own, settings) and own.max_examples > DEV_MAX_EXAMPLES:
        fn._hypothesis_internal_use_settings = settings(own, max_examples=DEV_MAX_EXAMPLES)


@dataclass
class CLI:
    """The installed ``toolwatch`` command, isolated to one temporary store and key."""

    data_dir: Path
    env: dict[str, str]

    def __call__(
        self, *args: str, input: bytes | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [TOOLWATCH, *args],
            input=input.decode("utf-8", "surrogateescape") if input is not None else None,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=self.env.get("PWD_OVERRIDE", str(ROOT)),
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"toolwatch {' '.join(args)} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def ingest(self, *paths: str | Path, extra: tuple[str, ...] = ()) -> dict:
        """Run ``toolwatch ingest --json`` and return the parsed summary."""
        out = self("ingest", *map(str, paths), "-d", str(self.data_dir), "--json", *extra)
        return json.loads(out.stdout.strip().splitlines()[-1])

    def query(self, sql: str) -> list[dict]:
        """Run ``toolwatch query --format json`` and return every row (no row cap)."""
        out = self("query", sql, "-d", str(self.data_dir), "--format", "json", "--max-rows", "0")
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def cli_env(tmp: Path) -> dict[str, str]:
    """Environment with the HMAC key file under a temp config home (outside the store)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "config-home")
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def tw_env(tmp_path: Path) -> dict[str, str]:
    """Environment with the HMAC key file under a temp config home (outside the store)."""
    return cli_env(tmp_path)


@pytest.fixture(scope="module")
def tw_env_module(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """:func:`tw_env` shared by a module: for a store one CLI run builds and tests only read."""
    return cli_env(tmp_path_factory.mktemp("tw-env"))


@pytest.fixture
def tw(tmp_path: Path, tw_env: dict[str, str]) -> CLI:
    """The real CLI bound to a fresh store in ``tmp_path/store``."""
    return CLI(data_dir=tmp_path / "store", env=tw_env)


@pytest.fixture
def write_lines(tmp_path: Path) -> Callable[..., Path]:
    """Write JSON-able objects (or raw bytes) as one line each to a temp file."""
    counter = iter(range(10_000))

    def _write(*items: object, name: str | None = None) -> Path:
        path = tmp_path / (name or f"log-{next(counter)}.jsonl")
        with open(path, "wb") as fh:
            for it in items:
                if isinstance(it, bytes):
                    fh.write(it if it.endswith(b"\n") else it + b"\n")
                else:
                    fh.write(json.dumps(it).encode() + b"\n")
        return path

    return _write
