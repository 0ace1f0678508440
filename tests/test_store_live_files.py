"""A live commit's files (small row groups, small pages) are ordinary Parquet: DuckDB,
pyarrow and compaction read back exactly what was written, with the statistics kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from toolwatch import schema
from toolwatch.query import query
from toolwatch.store import LIVE_PAGE_BYTES, LIVE_ROW_GROUP_ROWS, Store

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def _events(n: int, start: int = 0, text: str = "") -> pa.Table:
    rows = [
        {
            "event_id": f"fp:{start + i:09d}",
            "ts": T0 + timedelta(milliseconds=start + i),
            "session_id": f"s-{(start + i) % 97}",
            "caller_id": f"c-{(start + i) % 13}",
            "tool": "read",
            "args": text * ((start + i) % 5),
            "status": "ok",
            "bytes": start + i,
            "source": "test",
            "source_fp": "fp",
            "offset": start + i,
            "line_no": start + i + 1,
            "raw": f'{{"i": {start + i}, "text": "{text}"}}' + "x" * ((start + i) % 300),
            "ingested_at": T0,
        }
        for i in range(n)
    ]
    return pa.Table.from_pylist(rows, schema=schema.EVENTS)


def _live_write(store: Store, tbl: pa.Table) -> None:
    store.write_batch({"events": tbl}, row_group_rows=LIVE_ROW_GROUP_ROWS,
                      page_bytes=LIVE_PAGE_BYTES)


def test_live_files_read_back_whole_and_keep_their_statistics(tmp_path: Path) -> None:
    st_ = Store(tmp_path / "store", compact_min_files=2)
    n = LIVE_ROW_GROUP_ROWS + 3_000  # two row groups, many pages of the raw column
    _live_write(st_, _events(n))
    _live_write(st_, _events(500, start=n))
    files = st_.files("events")
    assert len(files) == 2
    meta = pq.ParquetFile(sorted(files)[0]).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [
        LIVE_ROW_GROUP_ROWS, 3_000]
    ts = schema.EVENTS.get_field_index("ts")
    for i in range(meta.num_row_groups):  # time-range pruning still has its min/max
        assert meta.row_group(i).column(ts).statistics.has_min_max
    got = query(st_, "SELECT count(*) AS n, count(DISTINCT event_id) AS d, "
                    "sum(length(raw)) AS raw_len FROM events").to_pylist()[0]
    want = pa.concat_tables([_events(n), _events(500, start=n)])
    assert got == {"n": n + 500, "d": n + 500,
                   "raw_len": sum(len(r) for r in want["raw"].to_pylist())}
    assert st_.compact("events") >= 1  # compaction reads them back into one file
    assert len(st_.files("events")) == 1
    back = pq.read_table(st_.files("events")[0]).sort_by("event_id")
    assert back.select(["event_id", "raw", "args"]).equals(
        want.sort_by("event_id").select(["event_id", "raw", "args"]))
    st_.close()


@given(st.text(max_size=200), st.integers(1, 300))
@settings(max_examples=10, deadline=None)
def test_live_files_keep_any_text(text: str, n: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        st_ = Store(Path(d) / "store")
        tbl = _events(n, text=text)
        _live_write(st_, tbl)
        back = pq.read_table(st_.files("events")[0])
        assert back.select(["raw", "args"]).equals(tbl.select(["raw", "args"]))
        st_.close()
