"""Red team round 2: a log file whose *name* is not UTF-8.

File names are bytes. One that is not UTF-8 (an agent able to create files under a tailed
directory or glob names one ``bad\\xff.jsonl``) reached Python as surrogate escapes and
then the store's ``source`` column, the live status file and the metrics text: ``ingest``
of its directory failed with a traceback and stored nothing, and ``tail`` crashed. The
name is now shown with ``\\udcff`` escapes; the file is read by its real path.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from toolwatch.ingest.sources.base import display_name

from tests.conftest import TOOLWATCH
from toolwatch.query import query
from toolwatch.store import Store

LINES = (
    b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t","bytes":1e300}\n'
    b'{"ts":"nan","session_id":"s","tool":"t"}\n'
    b'{"ts":"2026-11-02T10:00:01Z","session_id":"s","tool":"t","args":{"q":"ok"}}\n'
)


def _bad_dir(tmp_path: Path) -> bytes:
    d = os.fsencode(tmp_path) + b"/logs\xff\xfe"
    os.mkdir(d)
    with open(d + b"/a\x80.jsonl", "wb") as fh:
        fh.write(LINES)
    return d


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)


def _check(store: Path) -> None:
    st_ = Store(store)
    assert query(st_, "SELECT count(*) AS n FROM events").to_pylist() == [{"n": 2}]
    q = query(st_, "SELECT source, reason FROM quarantine").to_pylist()
    assert len(q) == 1 and q[0]["reason"] == "bad_timestamp", q
    assert "\\udcff\\udcfe" in q[0]["source"] and "\\udc80" in q[0]["source"], q


def test_display_name_is_valid_text() -> None:
    assert display_name("plain/a.jsonl") == "plain/a.jsonl"
    shown = display_name(os.fsdecode(b"x\xff/\xe9t\xe9"))
    assert shown.encode("utf-8") and "\\udcff" in shown


@pytest.mark.slow  # starts a process
def test_ingest_reads_a_directory_with_a_non_utf8_name(tmp_path: Path) -> None:
    d = _bad_dir(tmp_path)
    store = tmp_path / "st"
    res = subprocess.run([os.fsencode(TOOLWATCH), b"ingest", d, b"-d", os.fsencode(store),
                          b"--no-progress"], env=_env(tmp_path), capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert b"Traceback" not in res.stderr
    _check(store)


@pytest.mark.slow  # starts a process
def test_tail_follows_a_file_with_a_non_utf8_name(tmp_path: Path) -> None:
    d = _bad_dir(tmp_path)
    store = tmp_path / "st"
    res = subprocess.run([os.fsencode(TOOLWATCH), b"tail", d + b"/*.jsonl", b"-d",
                          os.fsencode(store), b"--exit-when-idle", b"2"],
                         env=_env(tmp_path), capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert b"Traceback" not in res.stderr
    _check(store)
