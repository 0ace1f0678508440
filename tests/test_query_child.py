"""Forensic queries in a sacrificial process, and the guard's name resolution (issue 28
§4, §5, §10).

Every query goes through the path the dashboard's Forensics page uses
(``dashboard.data.run_forensic_sql`` -> ``toolwatch.query.run_query`` -> a query child) or the real
CLI. The runaway queries of the red-team round are refused or killed without touching the
calling process; the catalog escapes are refused; the reported crashes are clean answers.
Figures (elapsed seconds, the caller's RSS) are printed: run with ``-s`` to see them.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from toolwatch.dashboard import data

from tests.conftest import TOOLWATCH
from toolwatch import schema
from toolwatch.config import QueryConfig
from toolwatch.errors import QueryError, QueryRefusedError
from toolwatch.query import VIEWS, run_query
from toolwatch.query_child import QueryMemoryError, QueryTimeoutError
from toolwatch.query_guard import check_query
from toolwatch.store import Store

T0 = datetime(2026, 11, 2, tzinfo=UTC)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    rows = [
        {
            "event_id": f"fp:{i}", "ts": T0 + timedelta(seconds=i), "session_id": f"s{i % 5}",
            "caller_id": f"c{i % 3}", "tool": "read", "status": "ok", "bytes": i,
            "source": "test", "source_fp": "fp", "offset": i, "line_no": i + 1, "raw": "{}",
            "ingested_at": T0,
        }
        for i in range(40)
    ]
    st_ = Store(tmp_path_factory.mktemp("child") / "store")
    st_.write_batch({"events": pa.Table.from_pylist(rows, schema=schema.EVENTS)})
    st_.close()
    return st_


def _status(field: str, pid: int | str = "self") -> int:
    """A /proc/<pid>/status figure in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


# ------------------------------------------------------------------ memory and time
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT len(range(250000000)) AS n",
        "SELECT length(repeat('x', 3000000000)) AS n",
        "SELECT len(list_sort(range(200000000))) AS n",
        "SELECT length(to_json(range(200000000))) AS n",
    ],
    ids=["range", "repeat", "list_sort", "to_json"],
)
def test_runaway_memory_costs_a_child_not_the_dashboard(store: Store, sql: str):
    before = _status("VmRSS")
    started = time.monotonic()
    with pytest.raises(QueryError) as ei:
        data.run_forensic_sql(store, sql, timeout_s=60, limits=QueryConfig())
    elapsed = time.monotonic() - started
    rss, hwm = _status("VmRSS"), _status("VmHWM")
    print(f"\n{sql}: {type(ei.value).__name__} in {elapsed:.2f} s; caller RSS "
          f"{before // 1024} -> {rss // 1024} MiB, VmHWM {hwm // 1024} MiB: {ei.value}")
    assert isinstance(ei.value, QueryMemoryError | QueryTimeoutError), ei.value
    assert "memory cap" in str(ei.value) or "killed" in str(ei.value)
    # The caller never held the values: far under the 1.5 GB bar.
    assert hwm < 1_500 * 1024
    assert rss - before < 200 * 1024


def test_uninterruptible_query_is_killed_at_the_timeout(store: Store):
    started = time.monotonic()
    with pytest.raises(QueryTimeoutError, match=r"killed at the 3 s timeout"):
        run_query(store,
            "SELECT length(lpad('', 2000000000, 'y')) AS n",
            limits=QueryConfig(timeout_seconds=3, memory_limit_mib=4096),
        )
    elapsed = time.monotonic() - started
    print(f"\nlpad('', 2e9, 'y') with a 3 s timeout returned after {elapsed:.2f} s")
    assert elapsed < 3 + 10  # generous: the bar is timeout + 2 s


@pytest.mark.slow  # starts a process
def test_cli_timeout_and_memory_exit_codes(store: Store):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    started = time.monotonic()
    p = subprocess.run(
        [TOOLWATCH, "query", "-d", str(store.root), "--timeout", "3",
         "SELECT length(lpad('', 2000000000, 'y'))"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    elapsed = time.monotonic() - started
    print(f"\ntoolwatch query --timeout 3 (lpad) returned after {elapsed:.2f} s, exit "
          f"{p.returncode}")
    assert p.returncode in (3, 4), p.stderr  # killed, or refused its memory first
    assert "Traceback" not in p.stderr and elapsed < 3 + 15
    p = subprocess.run(
        [TOOLWATCH, "query", "-d", str(store.root), "SELECT len(range(250000000))"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert p.returncode == 4 and "memory cap" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow  # large queries in the guarded runner
def test_hundred_thousand_term_or_is_a_clean_answer(store: Store):
    sql = "SELECT count(*) AS n FROM events WHERE " + " OR ".join(
        f"event_id = 'x{i}'" for i in range(100_000)
    )
    started = time.monotonic()
    try:
        res = run_query(store, sql, limits=QueryConfig(timeout_seconds=5))
    except QueryError as exc:
        outcome = f"{type(exc).__name__}: {str(exc)[:120]}"
    else:
        outcome = f"{res.table.to_pylist()}"
    elapsed = time.monotonic() - started
    print(f"\n100,000-term OR: {outcome} after {elapsed:.2f} s")
    assert elapsed < 5 + 10


@pytest.mark.slow  # starts a process
def test_a_killed_parent_takes_its_query_child_along(store: Store, tmp_path: Path):
    """A caller SIGKILLed mid-query cannot abandon a runaway: the child's watchdog ends it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    proc = subprocess.Popen(
        [TOOLWATCH, "query", "-d", str(store.root), "--timeout", "3600",
         "SELECT count(*) FROM range(1000000000000) a, range(1000) b"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    from tests.test_query_guard import _descendants, _threads

    try:
        kids: list[int] = []
        for _ in range(600):
            kids = [k for k in _descendants(proc.pid) if _threads(k) >= 2]
            if kids:
                break
            time.sleep(0.1)
        assert kids, "the query child never started"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{k}").exists() for k in kids):
        for k in kids:  # reap if it is ours (it is not: the fork server's)
            try:
                state = Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state == "Z":
                kids = [x for x in kids if x != k]
        time.sleep(0.2)
    assert not any(Path(f"/proc/{k}").exists() for k in kids)


# ------------------------------------------------------------------ catalog escapes
ESCAPES = {
    "cte_shadows_pg_settings": "WITH pg_settings AS (SELECT * FROM pg_settings) "
    "SELECT * FROM pg_settings",
    "cte_shadows_upper": 'WITH "PG_Settings" AS (SELECT 1 AS x) SELECT * FROM events',
    "cte_shadows_duckdb_tables": "WITH duckdb_tables AS (SELECT * FROM events) "
    "SELECT * FROM duckdb_tables",
    "cte_shadows_table_function": "WITH read_csv AS (SELECT 1 AS x) SELECT * FROM read_csv",
    "kelvin_cte": 'WITH "pg_settings\u212a" AS (SELECT 1 AS x) SELECT * FROM pg_settings',
    "kelvin_ref": 'WITH xk AS (SELECT 1 AS x) SELECT * FROM "x\u212a"',
    "kelvin_view": 'WITH "x\u212a" AS (SELECT 1 AS x) SELECT * FROM xk',
    "fullwidth": 'SELECT * FROM "\uff45vents"',
    "later_cte": "WITH a AS (SELECT * FROM pg_settings), pg_settings2 AS (SELECT 1) "
    "SELECT * FROM a",
    "self_reference": "WITH sessions AS (SELECT * FROM sessions) SELECT * FROM pg_views",
    "pg_get_viewdef": "SELECT pg_get_viewdef(oid) FROM (SELECT 1 AS oid)",
    "pg_get_viewdef_upper": "SELECT PG_GET_VIEWDEF(1)",
    "pg_get_constraintdef": "SELECT pg_get_constraintdef(1)",
    "current_setting": "SELECT current_setting('home_directory')",
    "current_database": "SELECT current_database()",
    "format_type": "SELECT format_type(1, 1)",
    "duckdb_settings": "SELECT * FROM duckdb_settings()",
    "get_block_size": "SELECT get_block_size('memory')",
}


@pytest.mark.parametrize("sql", ESCAPES.values(), ids=ESCAPES.keys())
def test_catalog_escapes_are_refused(store: Store, sql: str):
    with pytest.raises(QueryRefusedError):
        check_query(sql, VIEWS)
    with pytest.raises(QueryError) as ei:  # and through the real path, in a child
        run_query(store, sql)
    assert str(store.root) not in str(ei.value) and os.environ.get("HOME", "/nonexistent") \
        not in str(ei.value)


@pytest.mark.parametrize(
    "sql",
    [
        "WITH a AS (SELECT * FROM events), b AS (SELECT * FROM a) SELECT count(*) FROM b",
        "WITH RECURSIVE r AS (SELECT 1 AS i UNION ALL SELECT i + 1 FROM r WHERE i < 3) "
        "SELECT * FROM r",
        "WITH Events AS (SELECT 1 AS x) SELECT * FROM EVENTS",
        'SELECT count(*) FROM "Events"',
        'WITH "caf\u00e9" AS (SELECT 1 AS x) SELECT * FROM "caf\u00e9"',
        "SELECT pg_typeof(1), pg_size_pretty(1024), list_sum([1, 2]), nullif(1, 2)",
    ],
)
def test_ordinary_names_still_work(store: Store, sql: str):
    assert run_query(store, sql).table.num_rows >= 1


# ------------------------------------------------------------------ reported crashes
@pytest.mark.slow  # large queries in the guarded runner
def test_reported_crashes_are_clean_answers(store: Store):
    res = run_query(store, "SELECT ts::DATE AS day, count(*) AS n FROM events GROUP BY 1")
    assert res.table.to_pylist() == [{"day": T0.date(), "n": 40}]
    res = run_query(store, "SELECT [['infinity'::TIMESTAMP]] AS x, {'d': '-infinity'::DATE} AS y")
    assert res.table.num_rows == 1
    wide = "SELECT " + ", ".join(f"{i} AS c{i}" for i in range(70_000))
    with pytest.raises(QueryRefusedError, match=r"70,000 columns; at most 1,000"):
        run_query(store, wide, limits=QueryConfig(timeout_seconds=60))
    ok = "SELECT " + ", ".join(f"{i} AS c{i}" for i in range(1000))
    assert run_query(store, ok).table.num_columns == 1000


def test_result_bytes_are_capped(store: Store):
    res = run_query(store,
        "SELECT repeat('x', 100000) AS big FROM range(100)",
        limits=QueryConfig(max_result_mib=1),
    )
    assert res.truncated and res.cut == "bytes"
    assert 0 < res.table.num_rows < 100
    assert res.table.nbytes <= 1 << 20


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_both_start_methods_answer_and_bound(store: Store, method: str):
    """The CLI forks itself (one thread); the dashboard (Streamlit's threads) forks the
    fork server. Both answer, and both keep the memory cap."""
    from toolwatch import query_child
    from toolwatch.store import DATASETS

    files = {n: store.files(n) for n in DATASETS}
    res = query_child.run(store.root, files, "SELECT count(*) AS n FROM events", None,
                          QueryConfig(), start_method=method)
    assert res.table.to_pylist() == [{"n": 40}]
    with pytest.raises(QueryMemoryError):
        query_child.run(store.root, files, "SELECT len(range(250000000))", None,
                        QueryConfig(), start_method=method)


def test_a_threaded_caller_uses_the_fork_server():
    import threading

    from toolwatch import query_child

    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert not query_child._fork_is_safe()
    finally:
        stop.set()
        t.join()
