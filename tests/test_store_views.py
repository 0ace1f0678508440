"""The store's views stay queryable whatever values the logs carried."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

from toolwatch import schema
from toolwatch.query import query
from toolwatch.store import Store

T0 = datetime(2026, 11, 2, tzinfo=UTC)
MAX_STORED = 2**53 - 1  # ingest keeps every bytes/rows value below 2^53


def _fat_events(n: int) -> pa.Table:
    rows = [
        {
            "event_id": f"fp:{i}",
            "ts": T0 + timedelta(seconds=i),
            "session_id": "fat",
            "caller_id": "c",
            "tool": "export",
            "status": "ok",
            "bytes": MAX_STORED,
            "rows": MAX_STORED,
            "source": "test",
            "source_fp": "fp",
            "offset": i,
            "line_no": i + 1,
            "raw": "{}",
            "ingested_at": T0,
        }
        for i in range(n)
    ]
    return pa.Table.from_pylist(rows, schema=schema.EVENTS)


def test_session_sums_beyond_int64_saturate_instead_of_failing_the_view(tmp_path: Path) -> None:
    # 2048 events at the largest stored value sum to ~1.8e19 > 2^63: the sessions view
    # once failed with an overflow error for every query (issue 15).
    st = Store(tmp_path / "store")
    st.write_batch({"events": _fat_events(2048)})
    st.close()
    got = query(st, "SELECT session_id, total_bytes, total_rows, calls FROM sessions").to_pylist()
    assert got == [
        {
            "session_id": "fat",
            "total_bytes": 2**63 - 1,
            "total_rows": 2**63 - 1,
            "calls": 2048,
        }
    ]
