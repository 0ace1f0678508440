"""Shared fixtures: run the real ``toolwatch`` CLI against a temporary store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kafka_broker import kafka_broker  # noqa: F401  (real Tansu broker fixture)

ROOT = Path(__file__).resolve().parents[1]
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


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


@pytest.fixture
def tw_env(tmp_path: Path) -> dict[str, str]:
    """Environment with the HMAC key file under a temp config home (outside the store)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config-home")
    env["COLUMNS"] = "200"
    return env


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
