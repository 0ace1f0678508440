"""The pandas-free Arrow constructors of ``ingest.arrays``, and that ingest stays pandas-free.

The helpers must build exactly what ``pa.array`` would (values, nulls, types); the CLI test
checks the reason they exist: a ``toolwatch ingest`` process never imports pandas.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest import arrays

ROOT = Path(__file__).resolve().parents[1]


@settings(deadline=None)  # the first pa.array call (the reference) imports pandas
@given(st.lists(st.one_of(st.none(), st.text()), max_size=50))
def test_strings_match_pa_array(values: list[str | None]) -> None:
    for typ in (pa.string(), pa.large_string()):
        got = arrays.strings(values, typ)
        got.validate(full=True)
        assert got.type == typ
        assert got.equals(pa.array(values, typ))


def test_strings_binary_and_bytes() -> None:
    got = arrays.strings([b"\xff\x00", None, "é"], pa.large_binary())
    assert got.to_pylist() == [b"\xff\x00", None, "é".encode()]


@pytest.mark.parametrize(
    ("values", "typ"),
    [
        (np.arange(5, dtype=np.int64), None),
        (np.array([1.5, -2.0]), None),
        (np.array([3, 4], dtype=np.int32), None),
        (np.array([0, 1_700_000_000_000_000], dtype=np.int64), pa.timestamp("us", tz="UTC")),
        (np.arange(10, dtype=np.int64)[::3], None),  # non-contiguous view
    ],
)
def test_from_numpy_matches_pa_array(values: np.ndarray, typ: pa.DataType | None) -> None:
    got = arrays.from_numpy(values, typ)
    want = pa.array(values) if typ is None else pa.array(values).cast(typ)
    assert got.equals(want)


def test_from_numpy_rejects_what_it_cannot_read() -> None:
    with pytest.raises(TypeError):
        arrays.from_numpy(np.array(["a"]))
    with pytest.raises(TypeError):
        arrays.from_numpy(np.array([1], dtype=np.int32), pa.int64())


def test_repeat_masked_scalar_empty() -> None:
    assert arrays.repeat("src", 3).to_pylist() == ["src"] * 3
    assert arrays.repeat("src", 0).to_pylist() == []
    vals = arrays.strings(["a", "b"])
    assert arrays.masked(vals, np.array([1, -1, 0, -1])).to_pylist() == ["b", None, "a", None]
    assert arrays.scalar("x").equals(pa.scalar("x"))
    sch = pa.schema([("a", pa.int64())])
    assert arrays.empty(sch).schema == sch and arrays.empty(sch).num_rows == 0


def test_to_numpy() -> None:
    chunked = pa.chunked_array([pa.array([1, 2, 3]).slice(1), pa.array([], pa.int64()),
                                pa.array([9])])
    assert arrays.to_numpy(chunked).tolist() == [2, 3, 9]
    assert arrays.to_numpy(pa.array([7, 8], pa.uint64())).tolist() == [7, 8]
    assert arrays.to_numpy(pa.chunked_array([], pa.int64())).tolist() == []
    with pytest.raises(ValueError):
        arrays.to_numpy(pa.array([1, None]))


@pytest.mark.slow  # starts a process
def test_ingest_process_never_imports_pandas(tmp_path: Path) -> None:
    """pandas costs ~0.18 s per process and nothing on the ingest path needs it.

    Every kind of line goes through: calls, a secret, JSON-RPC, a summary, bad lines,
    two days (so the store splits partitions). ``-X importtime`` lists every module the
    real CLI process imported.
    """
    log = tmp_path / "mixed.jsonl"
    log.write_bytes(
        b'{"ts":"2026-11-02T10:00:00Z","session_id":"s1","tool":"getDocument",'
        b'"args":{"id":"doc-1","apiKey":"sk-live-123"},"status":"ok","bytes":10}\n'
        b'{"ts":"2026-11-03T10:00:00Z","callerId":"u1","toolName":"searchItems",'
        b'"arguments":{"query":"x"},"outcome":"PERMISSION_DENIED"}\n'
        b'{"ts":"2026-11-02T10:00:01Z","session_id":"s2","message":{"jsonrpc":"2.0","id":1,'
        b'"method":"tools/call","params":{"name":"t","arguments":{}}}}\n'
        b'{"ts":"2026-11-02T10:00:02Z","session_id":"s2","message":{"jsonrpc":"2.0","id":1,'
        b'"result":{"content":[],"isError":false}}}\n'
        b'{"event":"SESSION_END","sessionId":"s1","callCount":1,"ts":"2026-11-02T11:00:00Z"}\n'
        b'{"ts": truncated\n\xff\xfe binary\n[1, 2]\n'
    )
    # Read whole, and in small batches (many batches, then the empty one marking the end).
    small = tmp_path / "small.toml"
    small.write_text("[ingest]\nchunk_bytes = 200\n")
    for run, extra in enumerate(([], ["-c", str(small)])):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "toolwatch.cli", "ingest", str(log),
             "-d", str(tmp_path / f"store{run}"), "--no-progress", "--json", *extra],
            capture_output=True, text=True, cwd=ROOT, check=True,
        )
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "duckdb" in imported and "polars" in imported  # the listing works
        summary = json.loads(proc.stdout)
        assert (summary["events_stored"], summary["rpc_responses_merged"]) == (3, 1)
        assert (summary["summaries_stored"], summary["quarantined_total"]) == (1, 3)
        assert summary["batches"] == 1 if not extra else summary["batches"] > 3
        assert "pandas" not in imported
