"""The sessions view's totals: sessions without bytes never outrank a real transfer.

Issue 28 item 9: ``least(NULL, 2^63-1)`` is ``2^63-1`` in DuckDB (``least`` skips NULLs),
so every session whose events logged no ``bytes`` read ~9.2 EB and sorted above a real
500 MB exfiltration.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from toolwatch import schema
from toolwatch.query import query
from toolwatch.store import Store

T0 = datetime(2026, 11, 2, tzinfo=UTC)
EXFIL = 500 * 1024 * 1024


def _events(session: str, n: int, nbytes: int | None, start: int) -> list[dict]:
    return [
        {
            "event_id": f"{session}:{i}",
            "ts": T0 + timedelta(seconds=start + i),
            "session_id": session,
            "caller_id": session,
            "tool": "export",
            "status": "ok",
            "bytes": nbytes,
            "rows": None if nbytes is None else 1,
            "source": "test",
            "source_fp": "fp",
            "offset": start + i,
            "line_no": start + i + 1,
            "raw": "{}",
            "ingested_at": T0,
        }
        for i in range(n)
    ]


def test_byteless_sessions_rank_below_a_real_exfiltration(tmp_path: Path) -> None:
    rows = _events("exfil", 5, EXFIL // 5, 0)
    for k in range(20):  # sessions that logged no bytes at all
        rows += _events(f"quiet{k}", 3, None, 100 + 10 * k)
    rows += _events("small", 2, 10, 1000)
    st = Store(tmp_path / "store")
    st.write_batch({"events": pa.Table.from_pylist(rows, schema=schema.EVENTS)})
    st.close()
    got = query(st,
        "SELECT session_id, total_bytes, total_rows FROM sessions "
        "ORDER BY total_bytes DESC NULLS LAST, session_id"
    ).to_pylist()
    assert got[0] == {"session_id": "exfil", "total_bytes": EXFIL, "total_rows": 5}
    assert got[1] == {"session_id": "small", "total_bytes": 20, "total_rows": 2}
    quiet = got[2:]
    assert len(quiet) == 20
    for r in quiet:  # no bytes: 0 (or NULL), never the saturation value
        assert r["total_bytes"] in (0, None)
        assert r["total_rows"] is None
    top = query(st, "SELECT max(total_bytes) AS m FROM sessions").to_pylist()
    assert top == [{"m": EXFIL}]
