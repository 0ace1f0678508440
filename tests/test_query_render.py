"""Every result type renders in every output format (issue 28 §3, §10).

Types × nesting (plain, in a list, in a struct, as a map value) × formats (``toolwatch
query``'s table, csv, json, and the Forensics page's CSV/JSON downloads). Each type comes
from a real query child; rendering runs the CLI's and the dashboard's own code. A failure
would be an exception, an error exit, or a Rust panic printed on stderr (polars panics on
dates Python cannot hold, and the panic hook writes before any exception is raised).
"""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pytest
from toolwatch.dashboard import data

from toolwatch import schema
from toolwatch.cli import _write_query_rows
from toolwatch.output import write_rows
from toolwatch.query import run_query
from toolwatch.store import Store

TYPES = {
    "tinyint": "42::TINYINT",
    "ubigint": "18446744073709551615::UBIGINT",
    "hugeint": "170141183460469231731687303715884105727::HUGEINT",
    "uhugeint": "340282366920938463463374607431768211455::UHUGEINT",
    "float": "1.5::FLOAT",
    "double_nan": "'nan'::DOUBLE",
    "double_inf": "'-inf'::DOUBLE",
    "decimal": "123.4::DECIMAL(4, 1)",
    "decimal38": "1.5::DECIMAL(38, 10)",
    "varchar": "'a\x1b[31mb\u202e'",
    "blob": "'\\x00\\xff'::BLOB",
    "boolean": "true",
    "date": "DATE '2026-11-02'",
    "date_inf": "DATE 'infinity'",
    "date_neg_inf": "DATE '-infinity'",
    "time": "TIME '12:00:00'",
    "timetz": "TIMETZ '12:00:00+05'",
    "timestamp": "TIMESTAMP '2026-11-02 10:00:00'",
    "timestamp_inf": "TIMESTAMP 'infinity'",
    "timestamp_far": "TIMESTAMP '294247-01-10 04:00:54'",
    "timestamp_s": "TIMESTAMP_S '2026-11-02 10:00:00'",
    "timestamp_ms": "TIMESTAMP_MS '2026-11-02 10:00:00'",
    "timestamp_ns": "TIMESTAMP_NS '2026-11-02 10:00:00'",
    "timestamptz": "TIMESTAMPTZ '2026-11-02 10:00:00+00'",
    "timestamptz_inf": "'-infinity'::TIMESTAMPTZ",
    "interval": "INTERVAL '1 year 2 months 3 seconds'",
    "uuid": "'6e4f6a0e-0000-4000-8000-000000000001'::UUID",
    "bit": "'101'::BIT",
    "enum": "'a'::ENUM('a', 'b')",
    "union": "union_value(k := 1)",
    "json": "'{\"a\": [1, null]}'::JSON",
    "array": "[1, 2]::INT[2]",
    "null": "NULL::INT",
    "empty_list": "[]::INT[]",
}
FORMATS = ("table", "csv", "json", "dashboard")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    st_ = Store(tmp_path_factory.mktemp("render") / "store")
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    row = {"event_id": "fp:0", "ts": t0, "session_id": "s", "tool": "t", "source": "x",
           "source_fp": "fp", "offset": 0, "raw": "{}", "ingested_at": t0}
    st_.write_batch({"events": pa.Table.from_pylist([row], schema=schema.EVENTS)})
    st_.close()
    return st_


def _sql(expr: str) -> str:
    return (
        f"SELECT {expr} AS v, [{expr}, NULL] AS l, {{'k': {expr}, 'n': 1}} AS s, "
        f"MAP {{'k': {expr}}} AS m, [[{expr}]] AS ll"
    )


@pytest.fixture(scope="module")
def results(store: Store) -> dict[str, pa.Table]:
    return {name: run_query(store, _sql(expr)).table for name, expr in TYPES.items()}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", TYPES)
def test_type_renders_in_format(
    store: Store, results: dict[str, pa.Table], name: str, fmt: str,
    capfd: pytest.CaptureFixture[str],
):
    if fmt == "dashboard":
        res = data.run_forensic_sql(store, _sql(TYPES[name]))
        assert res.frame.height == 1
        rows = orjson.loads(data.json_safe_rows(res.frame))
        assert len(rows) == 1 and set(rows[0]) == {"v", "l", "s", "m", "ll"}
        assert data.csv_bytes(res.frame).count(b"\n") >= 2
    else:
        _write_query_rows(results[name], fmt, write_rows)  # raises typer.Exit on failure
    out, err = capfd.readouterr()
    assert "panicked" not in err and "Traceback" not in err, err[-2000:]
    if fmt == "json":
        row = orjson.loads(out.splitlines()[0])
        assert set(row) == {"v", "l", "s", "m", "ll"}
    elif fmt == "csv":
        assert out.splitlines()[0] == "v,l,s,m,ll" and len(out.splitlines()) >= 2
    elif fmt == "table":
        assert "1 row(s)" in out
    # Terminal output never carries a raw escape or bidi control from a value.
    assert "\x1b" not in out and "\u202e" not in out


def test_values_survive_exactly_where_they_can(results: dict[str, pa.Table], capfd):
    _write_query_rows(results["uhugeint"], "json", write_rows)
    row = orjson.loads(capfd.readouterr().out)
    assert row["v"] == "340282366920938463463374607431768211455"
    _write_query_rows(results["date"], "json", write_rows)
    assert orjson.loads(capfd.readouterr().out)["v"] == "2026-11-02"
    _write_query_rows(results["date_inf"], "csv", write_rows)
    assert "infinity" in capfd.readouterr().out
