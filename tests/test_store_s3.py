"""The store on S3-compatible object storage (moto's server on loopback, the S3 protocol).

Written and read by toolwatch's own commands with ``-d s3://bucket/prefix``, and read by
delta-rs alone as an outside tool would; exactly-once replays, compaction and vacuum
work there as on disk.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.store_rows import store_events as _events
from tests.s3_server import S3Server, s3_server  # noqa: F401
from toolwatch.query import query
from toolwatch.store import Checkpoint, Store

pytestmark = pytest.mark.slow  # a server process

ROOT = Path(__file__).resolve().parents[1]
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
           tmp_path: Path) -> S3Server:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return s3_server


def _remote_store(tmp_path: Path, uri: str) -> Store:
    from toolwatch.config import Config, locate_store

    cfg = Config()
    cfg.store.data_dir = uri
    cfg.store.state_dir = str(tmp_path / "state")
    return Store(locate_store(cfg).store.data_dir, compact_min_files=2)


def test_replays_compaction_and_vacuum_on_object_storage(s3_env: S3Server, tmp_path: Path):
    s3_env.create_bucket("unit")
    st = _remote_store(tmp_path, "s3://unit/a/store")
    assert st.location.remote and st.root == tmp_path / "state"
    for k in range(4):
        st.write_batch({"events": _events(k * 10, 10)}, [Checkpoint("fp", "f", k * 10 + 10)])
    # A replay cut at other boundaries adds nothing twice.
    st.write_batch({"events": _events(5, 30)}, [Checkpoint("fp", "f", 35)])
    again = _remote_store(tmp_path, "s3://unit/a/store")
    assert again.checkpoints() == {"fp": 40}
    n, distinct = query(again,
        "SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM events").to_pylist()[0].values()
    assert n == distinct == 40
    files = again.files("events")
    assert len(files) == 4 and all(f.startswith("s3://unit/a/store/events/") for f in files)
    assert again.compact("events") == 1 and len(again.files("events")) == 1
    assert again.vacuum("events", 0) == 4
    assert query(again, "SELECT count(*) AS n FROM events").to_pylist() == [{"n": 40}]

    from deltalake import DeltaTable  # an outside reader: delta-rs alone

    dt = DeltaTable("s3://unit/a/store/events", storage_options={
        "AWS_ENDPOINT_URL": s3_env.endpoint, "AWS_ALLOW_HTTP": "true"})
    assert dt.transaction_version("fp") == 40
    got = dt.to_pyarrow_dataset().to_table(columns=["event_id"])
    assert sorted(got["event_id"].to_pylist()) == sorted(f"fp:{o}" for o in range(40))


def test_commands_on_an_s3_store(s3_server: S3Server, tmp_path: Path):  # noqa: F811
    """``analyze``, ``query`` and ``alerts`` with ``-d s3://…``; endpoint from the config
    file, credentials from the environment only."""
    s3_server.create_bucket("cmds")
    cfg = tmp_path / "toolwatch.toml"
    cfg.write_text(f'[store]\nendpoint_url = "{s3_server.endpoint}"\nallow_http = true\n'
                   f'state_dir = "{tmp_path / "state"}"\n')
    env = {**os.environ, **s3_server.env(), "HOME": str(tmp_path / "home")}
    del env["AWS_ENDPOINT_URL"]  # the config file's endpoint_url is what is used
    logs = sorted(str(p) for p in (ROOT / "sample_logs" / "demo").glob("*.jsonl"))[:3]
    uri = "s3://cmds/prod/store"

    def run(*args: str) -> str:
        res = subprocess.run([TOOLWATCH, *args, "-d", uri, "-c", str(cfg)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        return res.stdout

    run("analyze", *logs, "--alerts-out", str(tmp_path / "alerts.jsonl"))
    out = run("query", "SELECT count(*) AS n FROM events", "-f", "json")
    import json

    n = json.loads(out)["n"]
    total = sum(len(Path(p).read_bytes().splitlines()) for p in logs)
    assert 0 < n <= total
    stored = run("query", "SELECT count(*) AS n FROM alerts", "-f", "json")
    alerts = (tmp_path / "alerts.jsonl").read_text().splitlines()
    assert json.loads(stored)["n"] == len(alerts) > 0
    # The store commands work on object storage too: info counts what query counts,
    # compact merges, vacuum deletes the replaced files, and no row moves.
    info = {t["table"]: t for t in json.loads(run("store", "info", "-f", "json"))["tables"]}
    assert info["events"]["rows"] == n and info["alerts"]["rows"] == len(alerts)
    assert info["events"]["files"] == len(logs)  # a file per log
    run("store", "compact", "--min-files", "2")
    vac = run("store", "vacuum", "--hours", "0")
    assert f"events: {len(logs)} files deleted" in vac, vac
    info = {t["table"]: t for t in json.loads(run("store", "info", "-f", "json"))["tables"]}
    assert info["events"]["rows"] == n and info["events"]["files"] == 1
    assert json.loads(run("query", "SELECT count(*) AS n FROM events", "-f", "json"))["n"] == n
    # Nothing of the tables on local disk: only this machine's state.
    assert not (tmp_path / "state" / "events").exists()
    assert (tmp_path / "state" / "_state" / "tables.json").is_file()
    assert "testing" not in (tmp_path / "state" / "_state" / "tables.json").read_text()


_RACER = r'''
import os
import sys
import time
from tests.fixtures.store_rows import store_events
from toolwatch.config import Config, locate_store
from toolwatch.store import Checkpoint, Store

uri, state, fp, n, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
cfg = Config()
cfg.store.data_dir = uri
cfg.store.state_dir = state
st = Store(locate_store(cfg).store.data_dir)
st.files("events")  # past the imports and the first listing
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
for k in range(n):
    st.write_batch({"events": store_events(k * 5, 5, fp)}, [Checkpoint(fp, fp, k * 5 + 5)])
'''


def test_writers_racing_for_the_next_version_lose_no_commit(s3_env: S3Server,
                                                            tmp_path: Path) -> None:
    """Three processes commit to one table at once: the endpoint's put-if-absent makes
    each version one writer's, and the losers commit again on top."""
    s3_env.create_bucket("race")
    uri, n, go = "s3://race/store", 25, tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, uri, str(tmp_path / f"st{i}"),
                               f"w{i}", str(n), str(go)], cwd=ROOT, env=os.environ.copy(),
                              stdout=subprocess.PIPE, text=True)
             for i in range(3)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]

    from deltalake import DeltaTable

    dt = DeltaTable(f"{uri}/events", storage_options={
        "AWS_ENDPOINT_URL": s3_env.endpoint, "AWS_ALLOW_HTTP": "true"})
    ids = dt.to_pyarrow_dataset().to_table(columns=["event_id"])["event_id"].to_pylist()
    assert sorted(ids) == sorted(f"w{i}:{o}" for i in range(3) for o in range(5 * n))
    assert [dt.transaction_version(f"w{i}") for i in range(3)] == [5 * n] * 3
    # One version per commit: 75 appends (+ the creation, which a racer may have won).
    commits = [h for h in dt.history() if h.get("operation") == "WRITE"]
    assert len(commits) == 3 * n
    # The writers took turns (they did race), in one contiguous run of versions.
    order = [h["writer"] for h in sorted(commits, key=lambda h: h["version"])]
    assert sum(a != b for a, b in itertools.pairwise(order)) >= 3, order
