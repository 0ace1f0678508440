"""Issue 28 item 8: one caller (one client address) with millions of events.

Partitioned analyze spread a caller above ``[analyze] max_events_per_caller`` over
partitions, but its client address stayed one key: the address pass then held every event
of that address at once (3M events: 5.1 GiB, the run's peak). Addresses above the cap are
spread the same way. Peak RSS figures come from ``benchmarks/bench_distinct.py
--caller-events``; these tests check the partitioning itself, on a real DuckDB table and a
real ``analyze`` run.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest


def _keys(con: object) -> None:
    # One caller at one address: 60 sessions of 50 events (3,000); 30 small callers, each
    # at its own address, of 20 events.
    con.execute(  # type: ignore[attr-defined]
        "CREATE TEMP TABLE tw_keys AS "
        "SELECT hash('big-' || s) AS sk, hash('big') AS ck, hash('10.9.9.9') AS ik, 50 AS n "
        "FROM range(60) t(s) UNION ALL "
        "SELECT hash('c' || s), hash('c' || s), hash('10.0.0.' || s), 20 FROM range(30) t(s)"
        " UNION ALL SELECT hash('x' || s), hash('x' || s), NULL, 20 FROM range(5) t(s)"
    )


def test_an_address_above_the_cap_is_spread_over_partitions() -> None:
    import duckdb

    from toolwatch.analyze import _split_big_keys
    from toolwatch.config import Config

    con = duckdb.connect()
    _keys(con)
    cfg = Config()
    cfg.analyze.max_events_per_caller = 400
    parts = 8

    def sizes(key: str) -> list[int]:
        rows = con.execute(
            f"SELECT {key} % {parts} AS p, sum(n) FROM tw_keys WHERE {key} IS NOT NULL "
            "GROUP BY p ORDER BY 2 DESC"
        ).fetchall()
        return [int(r[1]) for r in rows]

    assert max(sizes("ik")) >= 3000  # before: the busy address is one partition
    assert _split_big_keys(con, cfg, parts, "ck") == (1, 400)
    assert max(sizes("ik")) >= 3000  # splitting callers leaves addresses whole
    assert _split_big_keys(con, cfg, parts, "ik") == (1, 400)
    after = sizes("ik")
    assert sum(after) == 3000 + 600  # every addressed session in exactly one partition
    assert max(after) < 1500
    # The slices are marked: a slice of one caller is never part of the population sample.
    assert con.execute("SELECT count(*) FROM tw_keys WHERE split_ik").fetchone()[0] == 60
    # They go round the partitions: 8 slices of ~375 events, one per partition.
    assert len(after) == parts
    # Sessions without an address stay without one (they are in no address partition).
    assert con.execute("SELECT count(*) FROM tw_keys WHERE ik IS NULL").fetchone()[0] == 5
    # Small addresses keep their key.
    assert con.execute(
        "SELECT count(*) FROM tw_keys WHERE ik IN (SELECT hash('10.0.0.' || s) "
        "FROM range(30) t(s))"
    ).fetchone()[0] == 30


@pytest.mark.slow  # analyze end to end
def test_analyze_spreads_a_busy_address(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from toolwatch.analyze import analyze_paths
    from toolwatch.config import Config

    log = tmp_path / "one-address.jsonl"
    lines = []
    for i in range(600):
        lines.append(orjson.dumps({
            "ts": f"2026-11-02T00:{i // 60:02d}:{i % 60:02d}Z",
            "session_id": f"s-{i // 40}",
            "caller_id": "solo",
            "client_ip": "10.9.9.9",
            "server": "docs-server",
            "tool": "getDocument",
            "args": {"documentId": f"doc-{i % 37}"},
            "status": "ok",
            "duration_ms": 150,
        }))
    log.write_bytes(b"\n".join(lines) + b"\n")
    cfg = Config()
    cfg.store.data_dir = str(tmp_path / "store")
    cfg.analyze.partitions = 4
    cfg.analyze.max_events_per_caller = 100
    with caplog.at_level("WARNING", logger="toolwatch.analyze"):
        res = analyze_paths(cfg, [str(log)], alerts_out=tmp_path / "a.jsonl", progress=False)
    msgs = [r.getMessage() for r in caplog.records if "max_events_per_caller" in r.getMessage()]
    assert any(m.startswith("analyze: 1 caller(s) with more than 100 events") for m in msgs)
    assert any(m.startswith("analyze: 1 client address(es) with more than 100 events")
               for m in msgs)
    assert res is not None
