"""The store read by outside tools (deltalake, polars) and ``toolwatch store`` end to end.

Any Delta reader must see exactly what ``toolwatch query`` sees: same rows, same ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CLI, ROOT

pytestmark = pytest.mark.slow  # every test here starts toolwatch processes

#: A subset of the demo logs (Makefile's analyze-demo): several files, summaries, alerts.
DEMO = ROOT / "sample_logs" / "demo"
LOGS = [DEMO / n for n in ("shop-server.jsonl", "files-server.jsonl", "finance-server.jsonl",
                           "summaries.jsonl")]
#: Table -> its id column.
IDS = {"events": "event_id", "summaries": "event_id", "alerts": "alert_id",
       "streams": "source_fp"}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, tw_env_module: dict[str, str]) -> CLI:
    data = tmp_path_factory.mktemp("readers") / "store"
    cli = CLI(data_dir=data, env=tw_env_module)
    cli("analyze", *map(str, LOGS), "-c", str(DEMO / "toolwatch.toml"), "-d", str(data), "-q")
    return cli


def _query(cli: CLI, sql: str) -> list[dict]:
    out = cli("query", sql, "-d", str(cli.data_dir), "--format", "json", "--max-rows", "0")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _info(cli: CLI) -> dict:
    out = cli("store", "info", "-d", str(cli.data_dir), "--format", "json")
    return json.loads(out.stdout)


def test_deltalake_and_polars_read_what_toolwatch_query_reads(demo: CLI) -> None:
    import polars as pl
    from deltalake import DeltaTable

    for view in ("events", "summaries"):
        ids = sorted(r["id"] for r in _query(demo, f"SELECT event_id AS id FROM {view}"))
        assert len(ids) > 50, view
        path = str(demo.data_dir / view)
        dl = DeltaTable(path).to_pyarrow_table(columns=["event_id"])
        assert sorted(dl["event_id"].to_pylist()) == ids, view
        assert sorted(pl.read_delta(path)["event_id"].to_list()) == ids, view
        lazy = pl.scan_delta(path).select(pl.col("event_id")).collect()
        assert sorted(lazy["event_id"].to_list()) == ids, view
        assert pl.scan_delta(path).select(pl.len()).collect().item() == len(ids)

    # alerts: the table keeps every version; the query's alerts_raw view is all of them.
    raw = sorted(r["id"] for r in _query(demo, "SELECT alert_id AS id FROM alerts_raw"))
    assert raw
    path = str(demo.data_dir / "alerts")
    assert sorted(pl.read_delta(path)["alert_id"].to_list()) == raw
    assert sorted(DeltaTable(path).to_pyarrow_table()["alert_id"].to_pylist()) == raw

    # The full event rows agree column by column too (a sample of typed columns).
    cols = ["event_id", "ts", "tool", "bytes", "caller_authenticated"]
    mine = {r["event_id"]: r for r in _query(
        demo, f"SELECT {', '.join(cols)} FROM events")}
    theirs = pl.read_delta(str(demo.data_dir / "events")).select(cols)
    assert theirs.height == len(mine)
    for row in theirs.head(200).iter_rows(named=True):
        ours = mine[row["event_id"]]
        assert row["tool"] == ours["tool"] and row["bytes"] == ours["bytes"]
        assert row["caller_authenticated"] == ours["caller_authenticated"]


def test_store_info_counts_match_the_readers(demo: CLI) -> None:
    import polars as pl

    info = _info(demo)
    tables = {t["table"]: t for t in info["tables"]}
    assert set(tables) == {"events", "summaries", "quarantine", "alerts", "streams"}
    for name in ("events", "summaries", "alerts"):
        t = tables[name]
        assert t["version"] is not None and t["files"] >= 1 and t["bytes"] > 0
        assert t["rows"] == pl.read_delta(str(demo.data_dir / name)).height, name
    n_events = _query(demo, "SELECT count(*) AS n FROM events")[0]["n"]
    assert tables["events"]["rows"] == n_events
    # One process (the analyze run) committed every stream.
    assert len(info["writers"]) == 1
    assert info["writers"][0]["streams"] == len(LOGS)
    table_out = demo("store", "info", "-d", str(demo.data_dir)).stdout
    assert "events" in table_out and f"{n_events:,}" in table_out


def test_compact_then_vacuum_drops_files_and_keeps_rows(
    tmp_path: Path, tw_env: dict[str, str]
) -> None:
    import polars as pl

    data = tmp_path / "store"
    cli = CLI(data_dir=data, env=tw_env)
    # One ingest per file: each commits its own small files, so tables have several.
    for log in LOGS:
        cli("ingest", str(log), "-d", str(data))
    before = {t["table"]: t for t in _info(cli)["tables"]}
    assert before["events"]["files"] == len(LOGS) - 1  # summaries.jsonl has no events
    ids = sorted(r["id"] for r in _query(cli, "SELECT event_id AS id FROM events"))
    on_disk = len(list((data / "events").glob("*.parquet")))

    out = cli("store", "compact", "-d", str(data)).stdout
    assert "events: 1 merge" in out
    mid = {t["table"]: t for t in _info(cli)["tables"]}
    assert mid["events"]["files"] == 1
    assert mid["streams"]["files"] == 1  # one streams row file per ingest, merged too
    # Replaced files stay on disk until vacuum (readers that listed them still read).
    assert len(list((data / "events").glob("*.parquet"))) == on_disk + 1
    kept = cli("store", "vacuum", "-d", str(data)).stdout  # default: store.vacuum_hours = 1
    assert "total: 0 files deleted" in kept

    out = cli("store", "vacuum", "-d", str(data), "--hours", "0").stdout
    assert f"events: {on_disk} files deleted" in out
    assert len(list((data / "events").glob("*.parquet"))) == 1
    after = {t["table"]: t for t in _info(cli)["tables"]}
    for name in ("events", "summaries", "alerts", "streams"):
        assert after[name]["rows"] == before[name]["rows"], name
    assert sorted(r["id"] for r in _query(cli, "SELECT event_id AS id FROM events")) == ids
    assert sorted(pl.read_delta(str(data / "events"))["event_id"].to_list()) == ids
    assert cli("store", "compact", "-d", str(data)).stdout.endswith("total: 0 merges\n")
