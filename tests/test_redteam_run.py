"""Red team round 2: hostile lines on a wrapped server's stderr (``toolwatch run``).

``run`` splits a server's stderr into log records and server text (plain output, kept as
quarantine ``server_text`` and never detected on). A record behind a UTF-8 byte order mark
(``\\ufeff{"ts":…}``) was classed as server text, while ``ingest`` strips the BOM and stores
the call: an agent able to put a BOM in front of its calls' lines hid them from every
detector in ``run`` mode. Now both read the line the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.process import split_server_text

from tests.conftest import TOOLWATCH
from toolwatch.query import query
from toolwatch.store import Store

BOM = b"\xef\xbb\xbf"


def _is_record(line: bytes) -> bool:
    """The parser's reading: one leading BOM stripped, then ASCII blanks, then ``{``."""
    if line.startswith(BOM):
        line = line[len(BOM):]
    return line.lstrip(b" \t\n\r\x0b\x0c").startswith(b"{")


pieces = st.sampled_from([BOM, b" ", b"\t", b"\r", b"\x0b", b"{", b"}", b"x", b"\xef", b"\xbb",
                          b"\x00", b'"ts"', b"\n"])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.lists(pieces, max_size=6).map(b"".join), min_size=1, max_size=20))
def test_split_reads_records_as_the_parser_does(lines: list[bytes]) -> None:
    n = len(lines)
    batch = RawBatch(
        source="t", source_fp="fp", lines=pa.array(lines, pa.large_binary()),
        offsets=np.arange(n, dtype=np.int64), line_nos=np.arange(1, n + 1, dtype=np.int64),
        end_offset=n, final=False, sizes=None,
    )
    keep, text, _, _ = split_server_text(batch)
    assert keep.lines.to_pylist() == [x for x in lines if _is_record(x)]
    assert text == [x for x in lines if not _is_record(x)]


@pytest.mark.slow  # starts a process
def test_a_record_behind_a_bom_is_detected_on_in_run(tmp_path: Path) -> None:
    lines = [
        b'\xef\xbb\xbf{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"hidden"}',
        b'{"ts":"2026-11-02T10:00:00Z","session_id":"s","tool":"t","bytes":1e300}',
        b'{"ts":"nan","session_id":"s","tool":"t"}',
        b'{"ts":"2026-11-02T10:00:01Z","session_id":"s","tool":"t","args":{"q":"ok"}}',
        b"plain server output",
    ]
    log = tmp_path / "stderr.bin"
    log.write_bytes(b"\n".join(lines) + b"\n")
    server = tmp_path / "srv.py"
    server.write_text(
        "import sys\nsys.stderr.buffer.write(open(sys.argv[1], 'rb').read())\n"
        "sys.stderr.flush()\n"
    )
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY="ab" * 32)
    store = tmp_path / "st"
    res = subprocess.run(
        [TOOLWATCH, "run", "-d", str(store), "--", sys.executable, str(server), str(log)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    st_ = Store(store)
    tools = sorted(r["tool"] for r in query(st_, "SELECT tool FROM events").to_pylist())
    assert tools == ["hidden", "t", "t"], tools
    reasons = sorted(r["reason"] for r in query(st_, "SELECT reason FROM quarantine").to_pylist())
    assert reasons == ["bad_timestamp", "server_text"], reasons
    flags = query(st_, "SELECT flags FROM events WHERE flags IS NOT NULL").to_pylist()
    assert flags == [{"flags": "out_of_range:bytes"}], json.dumps(flags)
