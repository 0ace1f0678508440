"""Forensic queries cannot write, read outside the views, or run unbounded (issue 15 §1).

Every attack from the issue is a named regression test; a hypothesis test mixes allowed
and forbidden SQL fragments and checks that either the guard refuses or nothing on disk
changed. All against a real store, real DuckDB and the real CLI.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TOOLWATCH
from toolwatch import schema
from toolwatch.config import QueryConfig
from toolwatch.errors import QueryError, QueryRefusedError
from toolwatch.query import VIEWS, query, query_connection, run_query
from toolwatch.query_guard import check_query
from toolwatch.store import Store

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def _events(n: int, start: int = 0) -> pa.Table:
    rows = [
        {
            "event_id": f"fp:{i}",
            "ts": T0 + timedelta(seconds=i),
            "session_id": f"s{i % 7}",
            "caller_id": f"c{i % 3}",
            "tool": ("read", "list", "write")[i % 3],
            "status": "ok",
            "bytes": i * 10,
            "source": "test",
            "source_fp": "fp",
            "offset": i,
            "line_no": i + 1,
            "raw": "{}",
            "ingested_at": T0,
        }
        for i in range(start, start + n)
    ]
    return pa.Table.from_pylist(rows, schema=schema.EVENTS)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    st_ = Store(tmp_path / "store")
    st_.write_batch({"events": _events(50)})
    st_.write_batch({"events": _events(50, start=50)})
    st_.close()
    (st_.root / "_triage").mkdir()
    (st_.root / "_triage" / "suppressions.json").write_text("[]")
    return st_


def snapshot(*roots: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``roots`` -> (mtime_ns, sha256): any write shows."""
    out: dict[str, tuple[int, str]] = {}
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                p = Path(dirpath) / f
                out[str(p)] = (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def n_events(st_: Store) -> int:
    return query(st_, "SELECT count(*) AS n FROM events").to_pylist()[0]["n"]


# ------------------------------------------------------------------ attacks by name
def test_explain_analyze_copy_is_refused_and_writes_nothing(store: Store, tmp_path: Path):
    target = store.root / "events" / "date=2026-11-02" / "part-1-000.parquet"
    before = snapshot(store.root)
    for sql in (
        f"EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{target}' (FORMAT parquet)",
        f"EXPLAIN COPY (SELECT 1 AS x) TO '{tmp_path}/x.csv'",
        "EXPLAIN SELECT * FROM events",
    ):
        with pytest.raises(QueryRefusedError, match="EXPLAIN"):
            run_query(store, sql)
    assert snapshot(store.root) == before and not target.exists()
    assert not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "WITH c AS (COPY (SELECT 1) TO '{out}') SELECT * FROM c",
        "SELECT * FROM (COPY (SELECT 1) TO '{out}')",
        "SELECT (COPY (SELECT 1) TO '{out}')",
        "COPY (SELECT * FROM events) TO '{out}'",
        "COPY events TO '{out}'",
    ],
    ids=["copy_in_cte", "copy_in_subquery", "copy_in_scalar", "copy_select", "copy_table"],
)
def test_copy_in_any_position_is_refused(store: Store, tmp_path: Path, sql: str):
    out = tmp_path / "out.csv"
    with pytest.raises(QueryRefusedError):
        run_query(store, sql.format(out=out))
    assert not out.exists()


def test_writing_suppressions_json_is_refused(store: Store):
    sup = store.root / "_triage" / "suppressions.json"
    for sql in (
        f"COPY (SELECT '[{{\"rule\": \"*\"}}]' AS j) TO '{sup}' (FORMAT csv, HEADER false)",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{sup}' (FORMAT json)",
    ):
        with pytest.raises(QueryRefusedError):
            run_query(store, sql)
    assert sup.read_text() == "[]"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_blob('/etc/hostname')",
        "SELECT * FROM read_json_auto('/etc/hostname')",
        "SELECT * FROM read_parquet('{events}/*/*.parquet')",
        "SELECT * FROM parquet_metadata('{events}/*/*.parquet')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM '{events}/date=2026-11-02/x.parquet'",
        "SELECT * FROM query_table('events')",
        "SELECT * FROM query('SELECT 1')",
        "SELECT * FROM duckdb_settings()",
        "SELECT * FROM duckdb_extensions()",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM main.events",
        "SELECT * FROM system.main.duckdb_settings",
        "SELECT * FROM _empty_summaries",
        "SELECT current_setting('allowed_paths')",
        "SELECT getvariable('x')",
        "SELECT json_serialize_plan('SELECT * FROM read_csv(''/etc/passwd'')')",
        "SELECT sleep_ms(100000)",
        "SELECT finalize(NULL)",
        "SELECT no_such_function(1)",
        "SELECT main.lower('x')",
        "SELECT * FROM events AT (VERSION => 1)",
    ],
)
def test_file_access_and_catalog_reads_are_refused(store: Store, sql: str):
    with pytest.raises(QueryRefusedError, match="refused"):
        run_query(store, sql.format(events=store.root / "events"))


@pytest.mark.parametrize(
    "sql",
    [
        "ATTACH '{tmp}/x.db' AS x",
        "ATTACH ':memory:' AS m",
        "DETACH memory",
        "PRAGMA version",
        "PRAGMA enable_profiling",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "RESET memory_limit",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CALL duckdb_settings()",
        "CREATE TABLE t AS SELECT 1",
        "CREATE MACRO m() AS 1",
        "INSERT INTO events SELECT * FROM events",
        "DELETE FROM events",
        "DROP VIEW events",
        "EXPORT DATABASE '{tmp}/exp'",
        "DESCRIBE events",
        "SUMMARIZE events",
        "PIVOT events ON tool USING count(*)",
        "SELECT 1; SELECT 2",
        "SELECT 1; COPY (SELECT 1) TO '{tmp}/x.csv'",
        "",
        "   ",
        "-- nothing",
        "SELECT",
    ],
)
def test_non_select_statements_are_refused(store: Store, tmp_path: Path, sql: str):
    with pytest.raises(QueryRefusedError):
        run_query(store, sql.format(tmp=tmp_path))
    assert list(tmp_path.glob("x*")) == [] and not (tmp_path / "exp").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS n FROM events",
        "WITH a AS (SELECT * FROM events), b AS (SELECT * FROM a WHERE bytes > 10) "
        "SELECT count(*) AS n FROM b",
        "SELECT e.tool, count(*) AS n FROM events e JOIN sessions s USING (session_id) "
        "GROUP BY ALL ORDER BY ALL",
        "SELECT tool, row_number() OVER (PARTITION BY tool ORDER BY ts) AS r FROM events "
        "QUALIFY r = 1",
        "SELECT tool FROM events UNION SELECT 'x' EXCEPT SELECT 'write'",
        "SELECT * FROM events WHERE session_id IN (SELECT session_id FROM sessions)",
        "SELECT * FROM range(3) r, generate_series(1, 2) g, unnest([1, 2]) u",
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 5) "
        "SELECT * FROM t",
        "SELECT * EXCLUDE (raw) FROM events USING SAMPLE 10 ROWS",
        "SELECT list(tool ORDER BY ts)[1:2], struct_pack(a := 1), {'k': 1} FROM events",
        "SELECT * FROM alerts, alerts_raw, summaries, quarantine",
        "FROM events SELECT tool LIMIT 1",
        "SELECT * FROM (VALUES (1, 'a')) v(x, y)",
    ],
)
def test_plain_selects_run(store: Store, sql: str):
    res = run_query(store, sql)
    assert isinstance(res.table, pa.Table) and not res.truncated


def test_params_are_bound(store: Store):
    res = run_query(store, "SELECT count(*) AS n FROM events WHERE tool = $t", {"t": "read"})
    assert res.table.to_pylist() == [{"n": 34}]


def test_cte_names_are_scoped(store: Store):
    # `c` is a CTE of the subquery only: outside it, the name would fall back to
    # DuckDB's replacement scans (files, Python variables) — refused.
    with pytest.raises(QueryRefusedError, match="unknown table"):
        check_query("SELECT * FROM (WITH c AS (SELECT 1) SELECT * FROM c), c", VIEWS)
    check_query("WITH c AS (SELECT 1) SELECT * FROM (SELECT * FROM c)", VIEWS)


def test_unknown_parse_tree_objects_fail_closed(monkeypatch):
    from toolwatch import query_guard

    monkeypatch.setitem(
        query_guard._EXPRESSIONS,
        "CONSTANT",
        query_guard._EXPRESSIONS["CONSTANT"] - {"literal"},
    )
    with pytest.raises(QueryRefusedError, match="unknown field"):
        check_query("SELECT 1", VIEWS)


def test_the_legacy_call_flag_must_be_a_bool(monkeypatch):
    """DuckDB 2.0.1 added ``is_legacy_function_call`` to FUNCTION/WINDOW; only a bool passes."""
    from toolwatch import query_guard

    check_query("SELECT lower('A'), count(*) OVER () FROM events", VIEWS)
    real_parse = query_guard.parse

    def forged(sql, con=None):
        tree = real_parse(sql, con)
        stack = [tree]
        while stack:
            obj = stack.pop()
            if isinstance(obj, dict):
                if obj.get("class") == "FUNCTION":
                    obj["is_legacy_function_call"] = "lower"
                stack.extend(obj.values())
            elif isinstance(obj, list):
                stack.extend(obj)
        return tree

    monkeypatch.setattr(query_guard, "parse", forged)
    with pytest.raises(QueryRefusedError, match="malformed function call"):
        check_query("SELECT lower('A') FROM events", VIEWS)


# ------------------------------------------------------------------ the connection itself
def test_query_connection_has_no_file_access_even_without_the_guard(store: Store, tmp_path):
    con, files = query_connection(store, QueryConfig())
    try:
        settings_ = dict(
            con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE name IN ("
                "'enable_external_access', 'allowed_directories', 'temp_directory', "
                "'lock_configuration', 'autoload_known_extensions', "
                "'autoinstall_known_extensions')"
            ).fetchall()
        )
        assert settings_ == {
            "enable_external_access": "false",
            "allowed_directories": "[]",
            "temp_directory": "",
            "lock_configuration": "true",
            "autoload_known_extensions": "false",
            "autoinstall_known_extensions": "false",
        }
        # Defence in depth: the raw connection (guard bypassed) can neither read nor write
        # outside the views' own files, nor unlock itself.
        for sql in (
            "SELECT * FROM read_csv('/etc/passwd')",
            f"COPY (SELECT 1) TO '{tmp_path}/x.csv'",
            f"COPY (SELECT 1) TO '{store.root}/events/x.parquet' (FORMAT parquet)",
            "SET enable_external_access = true",
            "SET lock_configuration = false",
            f"ATTACH '{tmp_path}/x.db'",
        ):
            with pytest.raises(duckdb.Error):
                con.execute(sql)
        assert len(files) == 2
    finally:
        con.close()
    assert not list(tmp_path.glob("x.*"))


# ------------------------------------------------------------------ bounds
def test_timeout_interrupts_a_runaway_query(store: Store):
    with pytest.raises(QueryError, match=r"killed at the 0\.5 s timeout"):
        run_query(store,
            "SELECT count(*) FROM range(1000000000000) a, range(1000) b",
            limits=QueryConfig(timeout_seconds=0.5),
        )


def test_row_limit_cuts_and_says_so(store: Store):
    res = run_query(store, "SELECT * FROM events", limits=QueryConfig(max_rows=7))
    assert res.table.num_rows == 7 and res.truncated
    res = run_query(store, "SELECT * FROM events", limits=QueryConfig(max_rows=100))
    assert res.table.num_rows == 100 and not res.truncated


def test_memory_limit_gives_a_clean_error(store: Store):
    with pytest.raises(QueryError, match=r"(?i)out of memory") as ei:
        run_query(store,
            "SELECT list(repeat('x', 1000) || r::VARCHAR) FROM range(2000000) t(r)",
            limits=QueryConfig(memory_limit_mb=32),
        )
    assert "\n" not in str(ei.value)


def _cli(store: Store, *args: str, env_extra: dict[str, str] | None = None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    return subprocess.run(
        [TOOLWATCH, "query", *args, "-d", str(store.root)],
        capture_output=True,
        text=True,
        env={**env, **(env_extra or {})},
        timeout=120,
    )


@pytest.mark.slow  # starts a process
def test_cli_exit_codes_and_one_line_errors(store: Store):
    p = _cli(store, "SELECT * FROM duckdb_settings()", "-f", "csv")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "refused" in p.stderr
    p = _cli(store, f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{store.root}/x.csv'")
    assert p.returncode == 2 and not (store.root / "x.csv").exists()
    p = _cli(store, "SELECT 'a'::INT")
    assert p.returncode == 1 and "Conversion Error" in p.stderr and "Traceback" not in p.stderr
    p = _cli(store, "SELECT * FROM events", "-f", "csv", "--max-rows", "3")
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 4 and "cut at 3" in p.stderr


ODD_VALUES = (
    "SELECT '\\x00\\xff'::BLOB AS b, [1, 2] AS l, {'a': [1], 'b': {'c': 'x'}} AS s, "
    "170141183460469231731687303715884105727::HUGEINT AS h, "
    "340282366920938463463374607431768211455::UHUGEINT AS uh, 'nan'::DOUBLE AS n, "
    "'inf'::DOUBLE AS i, TIMESTAMP '294247-01-10 04:00:54' AS t, DATE '-infinity' AS d, "
    "TIMESTAMPTZ '2020-01-01 00:00:00+00' AS tz, INTERVAL 3 DAY AS iv, MAP {'k': 1} AS m, "
    "uuid() AS u, '101'::BIT AS bt, 1.5::DECIMAL(38, 10) AS dec, TIME '12:00:00' AS tm, "
    "'a'::ENUM('a', 'b') AS e, union_value(k := 1) AS un, [1, 2]::INT[2] AS arr, "
    "TIMETZ '12:00:00+05' AS ttz, NULL::INT AS nul, [INTERVAL 1 DAY] AS li"
)


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_every_value_type_renders(store: Store, fmt: str):
    p = _cli(store, ODD_VALUES, "-f", fmt)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "panicked" not in p.stderr
    if fmt == "csv":
        assert "340282366920938463463374607431768211455" in p.stdout
    if fmt == "json":
        row = orjson.loads(p.stdout)
        assert row["uh"] == "340282366920938463463374607431768211455"
        assert row["t"].startswith("294247-01-10") and row["iv"] == "3 days"


def _descendants(root: int) -> list[int]:
    """Pids of every process below ``root`` (from /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.extend(kids)
        todo.extend(kids)
    return out


def _threads(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return int(next(ln for ln in status.splitlines() if ln.startswith("Threads")).split()[1])


@pytest.mark.slow  # starts a process
def test_ctrl_c_stops_a_running_query(store: Store):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    proc = subprocess.Popen(
        [
            TOOLWATCH,
            "query",
            "SELECT count(*) FROM range(1000000000000) a, range(1000) b",
            "-d",
            str(store.root),
            "--timeout",
            "3600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # A shell's background job inherits SIGINT ignored; a terminal's Ctrl-C does not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Wait until the query runs: its child (a fork of the CLI's fork server) has
        # DuckDB's worker threads.
        for _ in range(600):
            if proc.poll() is not None or any(
                _threads(pid) >= 3 for pid in _descendants(proc.pid)
            ):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)  # ends long before the 3600 s timeout
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "cancelled (Ctrl-C)" in err and "Traceback" not in err


# ------------------------------------------------------------------ planted log entries
# Whoever can write the store can write its Delta log: a commit naming files outside a
# table, removing files outside it, or a log entry that is a link, a FIFO or junk.


def _plant_commit(table: Path, actions: list[dict], raw: bytes | None = None) -> Path:
    log_dir = table / "_delta_log"
    version = max(int(p.name.split(".")[0]) for p in log_dir.glob("*.json")) + 1
    path = log_dir / f"{version:020d}.json"
    when = int((time.time() - 3 * 86400) * 1000)
    lines = [{"commitInfo": {"timestamp": when}}, *actions]
    path.write_bytes(raw if raw is not None else b"\n".join(orjson.dumps(x) for x in lines)
                     + b"\n")
    return path


@pytest.mark.parametrize("where", ["absolute", "uri", "dotdot", "symlink"])
def test_a_planted_commit_cannot_make_readers_read_outside_a_table(
    store: Store, tmp_path: Path, where: str
):
    import pyarrow.parquet as pq

    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.parquet"
    pq.write_table(_events(5, start=5000), victim)  # reads as events: only the path is wrong
    (store.root / "events" / "link.parquet").symlink_to(victim)
    path = {"absolute": str(victim), "uri": victim.as_uri(),
            "dotdot": "../../outside/victim.parquet", "symlink": "link.parquet"}[where]
    _plant_commit(store.root / "events", [{"add": {
        "path": path, "size": victim.stat().st_size, "partitionValues": {},
        "modificationTime": 0, "dataChange": True}}])
    fresh = Store(store.root)
    assert n_events(fresh) == 100
    assert all(str(outside) not in f for f in fresh.files("events"))


def test_a_planted_removal_cannot_make_vacuum_delete_outside_a_table(
    store: Store, tmp_path: Path
):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("keep me")
    when = int((time.time() - 3 * 86400) * 1000)
    _plant_commit(store.root / "events", [
        {"remove": {"path": p, "deletionTimestamp": when, "dataChange": True}}
        for p in (str(outside / "victim.txt"), (outside / "victim.txt").as_uri(),
                  "../../outside/victim.txt")
    ])
    before = snapshot(outside)
    Store(store.root).vacuum("events", 0)
    assert snapshot(outside) == before
    assert n_events(Store(store.root)) == 100


@pytest.mark.parametrize("kind", ["fifo", "symlink", "junk"])
def test_a_planted_log_entry_is_set_aside_and_the_table_still_reads(
    store: Store, tmp_path: Path, kind: str
):
    path = _plant_commit(store.root / "events", [], raw=b"")
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # a reader opening it would wait for a writer forever
    elif kind == "symlink":
        path.symlink_to("/etc/passwd")
    else:
        path.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    fresh = Store(store.root)
    assert n_events(fresh) == 100
    fresh.write_batch({"events": _events(5, start=100)})  # and writers go on
    assert n_events(Store(store.root)) == 105
    # delta-rs lists only regular files: a FIFO is not seen until a commit needs its name
    rejected = list((store.root / "_state" / "rejected").iterdir())
    assert [p.name.split(".")[0] for p in rejected] == [path.name.split(".")[0]]


# ------------------------------------------------------------------ junk in the store
def test_junk_files_in_data_folders_do_not_break_queries(store: Store, tmp_path: Path):
    """Files in a table's folder that no commit names are never read."""
    part = store.root / "events"
    (part / "junk.parquet").write_bytes(b"not parquet")
    (part / "part-9-000.parquet").write_bytes(b"PAR1 definitely not parquet PAR1")
    (part / "part-9-001.parquet").symlink_to("/etc/hostname")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), part / "part-9-002.parquet")  # foreign schema
    pq.write_table(pa.table({"ts": ["not a time"]}), part / "part-9-003.parquet")
    (store.root / "events" / "stray.txt").write_text("x")
    assert n_events(store) == 100
    con = store.connect()  # the trusted (analyze/live) connection too
    try:
        assert con.execute("SELECT count(*) FROM events").fetchone() == (100,)
    finally:
        con.close()
    assert Store(store.root).compact("events") == 0  # and compaction skips junk too


def test_a_committed_file_that_is_not_the_datasets_parquet_is_skipped(store: Store):
    """A commit naming a file of another schema inside the table: logged, never read."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ts": ["not a time"]}), store.root / "events" / "bad.parquet")
    _plant_commit(store.root / "events", [{"add": {
        "path": "bad.parquet", "size": 1, "partitionValues": {}, "modificationTime": 0,
        "dataChange": True}}])
    assert n_events(Store(store.root)) == 100


# ------------------------------------------------------------------ generated SQL
ALLOWED = [
    "SELECT count(*) FROM events",
    "SELECT tool FROM events",
    "SELECT * FROM sessions",
    "(SELECT 1)",
    "SELECT x FROM range(3) t(x)",
]
FORBIDDEN = [
    "COPY (SELECT 1) TO '{canary}/c.csv'",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{store}/events/part-1-000.parquet'",
    "SELECT * FROM read_csv('{canary}/secret.txt')",
    "SELECT * FROM read_parquet('{store}/events/*/*.parquet')",
    "ATTACH '{canary}/db.duckdb'",
    "SET enable_external_access=true",
    "PRAGMA enable_profiling",
    "INSTALL httpfs",
    "SELECT * FROM '{canary}/secret.txt'",
    "CREATE TABLE t AS SELECT 1",
]
GLUE = [" UNION ALL ", "; ", " ", ", ", " WHERE 1 IN ", " FROM ", ") ", " (", " -- ", "\n"]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parts=st.lists(st.sampled_from(ALLOWED + FORBIDDEN), min_size=1, max_size=4),
    glue=st.lists(st.sampled_from(GLUE), min_size=3, max_size=3),
    wrap=st.sampled_from(
        ["{}", "SELECT * FROM ({})", "WITH q AS ({}) SELECT * FROM q", "EXPLAIN {}", "SELECT ({})"]
    ),
)
def test_generated_sql_is_refused_or_changes_nothing(
    store: Store, tmp_path: Path, parts, glue, wrap
):
    canary = tmp_path / "canary"
    canary.mkdir(exist_ok=True)
    (canary / "secret.txt").write_text("a,b\n1,2\n")
    body = parts[0]
    for i, p in enumerate(parts[1:]):
        body += glue[i % len(glue)] + p
    sql = wrap.format(body).format(canary=canary, store=store.root)
    before = snapshot(store.root, canary)
    # Refused, failed while running (a type error) or ran: in every case nothing changed.
    with contextlib.suppress(QueryError):
        run_query(store, sql, limits=QueryConfig(timeout_seconds=20))
    assert snapshot(store.root, canary) == before
