"""Red team: the line assembler behind ``tail``, ``run`` and ``ingest --follow``.

The attacker writes the bytes; how they arrive (split across reads, without a newline,
one line of many megabytes) must not change what is stored. The batch reader of
``toolwatch ingest`` is the oracle: the same bytes, fed to the live assembler in arbitrary
pieces, must give the same lines at the same offsets and line numbers.

An over-long line used to be cut into one quarantine row per read while it grew (a 64 MiB
line: dozens of ``line_too_long`` rows, and every later line numbered wrong); worse, each
cut-off piece was parsed as a line of its own, so a piece that happened to be a JSON object
(an agent's argument array of objects, cut at the right byte) was stored as an event the
server never logged.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.sources.file import StreamReader
from toolwatch.ingest.sources.file_tail import LineAssembler

from tests.conftest import TOOLWATCH
from toolwatch.query import query
from toolwatch.store import Store

TS = "2026-11-02T10:00:00Z"
MAX = 64  # a small max_line_bytes so generated lines cross it often


def ev(i: int, **kw: object) -> bytes:
    d: dict[str, object] = {"ts": TS, "session_id": "s", "tool": f"t{i}"}
    d.update(kw)
    return json.dumps(d).encode()


def batch_lines(data: bytes, max_line: int) -> list[tuple[int, int, bytes]]:
    """(offset, line number, line prefix) per line, by the batch reader."""
    r = StreamReader(io.BytesIO(data), "x", 37, {}, max_line)
    out = []
    for b in r.batches():
        for off, no, line in zip(b.offsets, b.line_nos, b.lines.to_pylist(), strict=True):
            out.append((int(off), int(no), line[: max_line + 1]))
    return out


def live_lines(data: bytes, cuts: list[int], max_line: int) -> list[tuple[int, int, bytes]]:
    """The same, by the live assembler fed ``data`` in pieces (as tail/run/stdin feed it)."""
    asm = LineAssembler("x", {}, max_line_bytes=max_line)
    out = []
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    got = []
    for i, p in enumerate(pieces):
        got.append(asm.feed(p, final=i == len(pieces) - 1))
        got.append(asm.cut_long_line())
    if not pieces:
        got.append(asm.feed(b"", final=True))
    for b in got:
        if b is None:
            continue
        for off, no, line in zip(b.offsets, b.line_nos, b.lines.to_pylist(), strict=True):
            out.append((int(off), int(no), line[: max_line + 1]))
    return out


piece = st.one_of(
    st.sampled_from(
        [ev(1), ev(2, args={"x": "y" * 80}), b"\r", b"\r\n", b"\x00", b"\xef\xbb\xbf",
         b"\xff\xfe", b"{", b"}", b"\n", b"\n\n", b"x" * 200, b'{"a":[{"ts":1}]}']
    ),
    st.binary(max_size=40),
)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(piece, max_size=25), cuts=st.lists(st.integers(0, 10_000), max_size=30))
def test_live_assembler_splits_like_the_batch_reader(parts: list[bytes], cuts: list[int]) -> None:
    """Same lines, offsets and line numbers, however the bytes were split."""
    data = b"".join(parts)
    assert live_lines(data, cuts, MAX) == batch_lines(data, MAX)


def test_an_endless_line_is_one_row_and_later_lines_keep_their_numbers() -> None:
    """A 5 MiB line fed a few KiB at a time: one cut line, then the next line intact."""
    asm = LineAssembler("x", None, max_line_bytes=1 << 20)
    first = ev(0) + b"\n"
    assert asm.feed(first) is not None
    out = []
    big = b'{"ts":"' + b"z" * (5 << 20) + b'"}\n'
    for i in range(0, len(big), 65_536):
        for b in (asm.feed(big[i : i + 65_536]), asm.cut_long_line()):
            if b is not None and len(b):
                out.append(b)
        assert len(asm.buf) <= (1 << 20) + 65_536 + 2  # memory stays bounded
    b = asm.feed(ev(2) + b"\n")
    assert b is not None
    out.append(b)
    rows = [(int(o), int(n)) for x in out for o, n in zip(x.offsets, x.line_nos, strict=True)]
    assert rows == [(len(first), 2), (len(first) + len(big), 3)]
    assert out[-1].lines.to_pylist() == [ev(2) + b"\n"]


@pytest.mark.slow  # starts a process
def test_a_cut_piece_that_is_a_json_object_is_never_stored(tmp_path: Path) -> None:
    """Through the real ``toolwatch tail``: an over-long line whose bytes after the cut
    form valid event objects (an argument array of objects) stores no forged event."""
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    log = tmp_path / "a.jsonl"
    forged = json.dumps({"ts": TS, "session_id": "forged", "tool": "forged"}).encode()
    # pieces of the over-long line that start and end on object boundaries, newline-free
    big = b'{"ts":"' + TS.encode() + b'","session_id":"s","tool":"big","args":{"x":['
    big += b",".join([forged] * 60_000) + b"]}}\n"
    log.write_bytes(ev(0) + b"\n")
    p = subprocess.Popen(
        [TOOLWATCH, "tail", str(log), "-d", str(tmp_path / "st"), "--no-stdout",
         "--exit-when-idle", "3"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.5)
        with open(log, "ab", buffering=0) as w:
            # in pieces of one forged object each: whatever the read size, some cut
            # lands between two objects
            step = len(forged) + 1
            for i in range(0, len(big), step * 997):
                w.write(big[i : i + step * 997])
            w.write(ev(1) + b"\n")
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err.decode()[-2000:]
    s = Store(tmp_path / "st")
    tools = sorted(r["tool"] for r in query(s, "SELECT tool FROM events").to_pylist())
    assert tools == ["t0", "t1"]
    q = query(s, "SELECT reason, line_no FROM quarantine").to_pylist()
    assert q == [{"reason": "line_too_long", "line_no": 2}]
    ln = query(s, "SELECT line_no FROM events WHERE tool = 't1'").to_pylist()
    assert ln == [{"line_no": 3}]


def test_a_piece_after_the_cut_is_not_a_line() -> None:
    """The bytes after a cut that happen to form an event object are never a line.

    (Before: a read boundary at an object boundary made the piece ``{"ts":…,"tool":
    "forged"…}`` a line of its own, parsed and stored as an event.)"""
    asm = LineAssembler("x", None, max_line_bytes=MAX)
    assert asm.feed(ev(0) + b"\n") is not None
    head = b'{"ts":"' + TS.encode() + b'","tool":"big","args":[' + b"1," * MAX
    assert asm.feed(head) is None
    cut = asm.cut_long_line()
    assert cut is not None and int(cut.line_nos[0]) == 2
    forged = ev(9, session_id="forged", pad="p" * MAX)
    emitted = [asm.feed(forged), asm.cut_long_line(), asm.feed(b"," + forged + b"]}\n")]
    emitted.append(asm.feed(ev(1) + b"\n"))
    lines = [x for b in emitted if b is not None for x in b.lines.to_pylist()]
    assert lines == [ev(1) + b"\n"]
    assert int(emitted[-1].line_nos[0]) == 3
