"""Red team: damaged ``.gz`` logs keep every line that can be read.

A log compressed while it was still being written, a copy cut short by a full disk or a
file with bytes after its last gzip member made ``toolwatch ingest`` store *nothing* of it:
:class:`gzip.GzipFile` raises from the read that meets the damage, and the whole chunk
decompressed by that read (16 MiB) went with it. Now the lines before the damage are
stored, a cut last line is held back (the checkpoint stays before it, so the intact file,
read later, continues exactly there) and the file is reported as failed (exit 1).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.sources.file import GzipStream

from tests.conftest import TOOLWATCH
from toolwatch.query import query
from toolwatch.store import Store

N = 3000


def _lines(n: int = N) -> bytes:
    return b"".join(
        json.dumps({"ts": "2026-11-02T10:00:00Z", "session_id": f"s{i % 7}", "tool": f"t{i}",
                    "args": {"i": i, "pad": "x" * (i % 50)}}).encode() + b"\n"
        for i in range(n)
    )


DATA = _lines()
GZ = gzip.compress(DATA)


def _read(raw: bytes, n: int) -> tuple[bytes, GzipStream]:
    g = GzipStream(io.BytesIO(raw))
    out = bytearray()
    while chunk := g.read(n):
        out += chunk
    return bytes(out), g


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(2, len(GZ) - 1), n=st.sampled_from([977, 65_536, 16 << 20]))
def test_a_cut_archive_gives_a_prefix_and_says_so(cut: int, n: int) -> None:
    out, g = _read(GZ[:cut], n)
    assert DATA.startswith(out)
    assert g.cut and g.error and "truncated" in g.error


@settings(max_examples=30, deadline=None)
@given(members=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
       pad=st.integers(0, 3000), n=st.sampled_from([1000, 1 << 20]))
def test_members_and_nul_padding_read_whole(members: list[bytes], pad: int, n: int) -> None:
    raw = b"".join(gzip.compress(m) for m in members) + b"\0" * pad
    out, g = _read(raw, n)
    assert out == b"".join(members) and g.error is None and not g.cut
    out, g = _read(raw + b"garbage", n)
    assert out == b"".join(members) and not g.cut and "not gzip" in (g.error or "")


def _ingest(tmp: Path, path: Path) -> tuple[int, dict]:
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    res = subprocess.run(
        [TOOLWATCH, "ingest", str(path), "-d", str(tmp / "st"), "--json", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    return res.returncode, json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts a process
def test_truncated_gz_keeps_its_lines_and_the_intact_copy_completes_it(tmp_path: Path) -> None:
    """Real CLI: half an archive stores the complete lines in it (it stored none), exit 1
    naming the damage; the whole archive read next stores the rest, each line once."""
    cut = tmp_path / "app.log.gz"
    cut.write_bytes(GZ[: len(GZ) // 2])
    rc, summary = _ingest(tmp_path, cut)
    assert rc == 1 and "truncated" in summary["failures"][0]
    stored = summary["events_stored"]
    assert 0 < stored < N and summary["quarantined_total"] == 0  # no cut line quarantined
    whole = tmp_path / "app.log.1.gz"
    whole.write_bytes(GZ)
    rc, summary = _ingest(tmp_path, whole)
    assert rc == 0, summary
    assert summary["events_stored"] == N - stored
    rows = query(Store(tmp_path / "st"),
        "SELECT count(*) AS n, count(DISTINCT tool) AS d FROM events").to_pylist()
    assert rows == [{"n": N, "d": N}]


@pytest.mark.slow  # starts a process
def test_trailing_garbage_keeps_every_line(tmp_path: Path) -> None:
    path = tmp_path / "a.gz"
    path.write_bytes(GZ + b"this is not gzip")
    rc, summary = _ingest(tmp_path, path)
    assert rc == 1 and "not gzip" in summary["failures"][0]
    assert summary["events_stored"] == N
