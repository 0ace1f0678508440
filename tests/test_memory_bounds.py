"""Live mode's memory bounds: the window does not pin parsed batches, split detection passes
see what one pass sees, the allocator settings of live commands."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.detectors.stream import DetectionWindow, _own_strings, _strings_with_buffers

from toolwatch.allocator import LIVE_COMMANDS, tune_memory

try:
    from tests.test_live import Feeder, nf
    from tests.test_live_support import config_for, enum_detector, stored_count, wait_for
except ImportError:  # tests/ itself on sys.path
    from test_live import Feeder, nf  # type: ignore[no-redef]
    from test_live_support import (  # type: ignore[no-redef]
        config_for,
        enum_detector,
        stored_count,
        wait_for,
    )


def _frame(n: int) -> pl.DataFrame:
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    tbl = pa.table({
        "event_id": pa.array([f"fp:{i:012d}-padding-padding" for i in range(n)]),
        "ts": pa.array([t0 + timedelta(milliseconds=i) for i in range(n)],
                       pa.timestamp("us", "UTC")),
        "session_id": pa.array([f"session-{i % 50:06d}-padding" for i in range(n)]),
        "caller_id": pa.array([f"caller-{i % 7}-padding-padding" for i in range(n)]),
    })
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    return df


@pytest.mark.slow  # measures memory over large batches
def test_own_strings_releases_the_batch_buffers() -> None:
    """A 1% filter keeps every string byte of its source alive; _own_strings frees them."""
    gc.collect()
    base = pa.total_allocated_bytes()
    kept = _frame(200_000).filter(pl.col("ts").dt.millisecond() == 0)
    gc.collect()
    pinned = pa.total_allocated_bytes() - base
    assert pinned > 5_000_000  # polars string views still point into the Arrow buffers
    own = _own_strings(kept)
    del kept
    gc.collect()
    assert pa.total_allocated_bytes() - base < pinned / 20
    assert own.height == 200


@pytest.mark.slow  # measures memory over large batches
def test_own_strings_skips_only_columns_that_pin_nothing() -> None:
    """Strings of up to 12 bytes live in their views: such a column holds no buffer, so it
    is not copied, and a frame of them pins none of its Arrow source either."""
    gc.collect()
    base = pa.total_allocated_bytes()
    n = 200_000
    tbl = pa.table({
        "event_id": pa.array([f"fp:{i:012d}-padding-padding" for i in range(n)]),
        "status": pa.array(["ok", "error", "denied", None][i % 4] for i in range(n)),
        "tool": pa.array([f"tool-{i % 1000}" if i % 3 else "a-much-longer-tool-name"
                          for i in range(n)]),
        "k": pa.array(range(n)),
    })
    df = pl.from_arrow(tbl)
    assert isinstance(df, pl.DataFrame)
    del tbl
    kept = df.filter(pl.col("k") % 100 == 0)
    del df
    assert _strings_with_buffers(kept) == ["event_id", "tool"]
    own = _own_strings(kept)
    assert own.equals(kept)
    del kept
    gc.collect()
    assert pa.total_allocated_bytes() - base < 200_000  # the 2,000 rows' ints, not 200k rows
    assert _strings_with_buffers(own.filter(pl.col("tool").str.len_bytes() <= 12)
                                 .select("status").with_columns(pl.col("status") + "")) == []


@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=60))
@settings(max_examples=60, deadline=None)
def test_own_strings_keeps_values_and_nulls(values: list[str | None]) -> None:
    df = pl.DataFrame({"s": values, "n": list(range(len(values)))},
                      schema={"s": pl.String, "n": pl.Int64})
    assert _own_strings(df).equals(df)


@pytest.mark.slow  # live pipeline under memory gates, threads
def test_window_after_expiry_does_not_pin_evicted_rows() -> None:
    """Evicted rows' strings are released even though a few rows of each batch remain."""
    gc.collect()
    base = pa.total_allocated_bytes()
    w = DetectionWindow(window_minutes=0.0, session_idle_minutes=0.0, tolerance_s=0.0,
                        max_events=1_000, columns=["event_id", "ts", "session_id",
                                                   "caller_id"])
    empty = pl.DataFrame(schema={"session_id": pl.String, "ts": pl.Datetime("us", "UTC")})
    w.add(_frame(200_000), empty)
    assert w.size <= 1_000
    gc.collect()
    # 1,000 rows of ~100 bytes of strings, not the 200,000 rows' ~20 MB
    assert pa.total_allocated_bytes() - base < 2_000_000


@pytest.mark.slow  # starts a process
def test_tune_memory_only_for_live_commands() -> None:
    assert {"tail", "collect", "kafka", "run"} <= LIVE_COMMANDS
    env = dict(os.environ)
    try:
        os.environ["TOOLWATCH_MEMORY_TUNING"] = "0"
        assert not tune_memory(["tail", "x.log"])
        del os.environ["TOOLWATCH_MEMORY_TUNING"]
        assert not tune_memory(["analyze"])
        assert not tune_memory(["ingest", "x.log"])
    finally:
        os.environ.clear()
        os.environ.update(env)


@pytest.mark.slow  # starts a process
def test_tune_memory_sets_jemalloc_before_polars_and_keeps_user_settings() -> None:
    """In a fresh interpreter (polars not yet loaded): defaults set, a user's value wins."""
    code = (
        "import os, sys\n"
        "from toolwatch.allocator import tune_memory, JEMALLOC_CONF\n"
        "assert 'polars' not in sys.modules\n"
        "assert tune_memory(['ingest', '--follow', '-'])\n"
        "print(os.environ['_RJEM_MALLOC_CONF'] == JEMALLOC_CONF)\n"
        "import polars\n"
        "print(polars.DataFrame({'a': [1]}).height)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    env.pop("TOOLWATCH_MEMORY_TUNING", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.split() == ["True", "1"]
    assert "jemalloc" not in out.stderr  # the option string is valid for polars' jemalloc
    env["_RJEM_MALLOC_CONF"] = "dirty_decay_ms:5000"
    code2 = (
        "import os\nfrom toolwatch.allocator import tune_memory\n"
        "tune_memory(['tail', 'x'])\nprint(os.environ['_RJEM_MALLOC_CONF'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == "dirty_decay_ms:5000"


@pytest.mark.slow  # starts a process
def test_tune_memory_is_not_switched_off_by_a_parent_that_imported_polars() -> None:
    """``import polars`` writes its own default into ``_RJEM_MALLOC_CONF``; a live process
    started by such a parent (a Python supervisor, a benchmark harness) inherits it. That
    is not a user's setting: the live tuning still applies (it did not, and the
    benchmarks' live processes ran with polars' allocator defaults: ~100 MiB more)."""
    import polars  # noqa: F401  (sets the variable in this process, as in any such parent)

    from toolwatch.allocator import JEMALLOC_CONF, POLARS_JEMALLOC_DEFAULT

    inherited = os.environ.get("_RJEM_MALLOC_CONF", "")
    assert POLARS_JEMALLOC_DEFAULT in inherited
    code = (
        "import os\nfrom toolwatch.allocator import tune_memory\n"
        "tune_memory(['kafka'])\nprint(os.environ['_RJEM_MALLOC_CONF'])\n"
        "import polars\nprint(os.environ['_RJEM_MALLOC_CONF'])\n"
    )
    for value in (inherited, f"{POLARS_JEMALLOC_DEFAULT},{POLARS_JEMALLOC_DEFAULT}"):
        env = dict(os.environ, _RJEM_MALLOC_CONF=value)
        env.pop("TOOLWATCH_MEMORY_TUNING", None)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True).stdout.split()
        assert out[0] == JEMALLOC_CONF
        # polars prepends its default; ours come after it, so they are the ones in force
        assert out[1].endswith(JEMALLOC_CONF)
    # a user's own option beside polars' default is still the user's
    env = dict(os.environ, _RJEM_MALLOC_CONF=f"{POLARS_JEMALLOC_DEFAULT},narenas:4")
    env.pop("TOOLWATCH_MEMORY_TUNING", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out[0] == f"{POLARS_JEMALLOC_DEFAULT},narenas:4"


@pytest.mark.slow
def test_split_detection_passes_see_what_one_pass_sees(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The demo logs through tail with one unbounded pass per flush and with passes of a
    few hundred events split by caller: the same session and caller alerts (addresses and
    credentials spread over callers may be scored per pass, so they are not compared).
    Both runs fit on the default history (the window's recent events), as live does: with
    ``history_events = 0`` each pass fits on its own callers, so population baselines
    (per-tool typical responses) differ by pass by design."""
    from pathlib import Path

    import orjson

    from toolwatch.live import SinkConfig
    from toolwatch.live.sinks import build_sinks
    from toolwatch.live_cli import tail_files

    try:
        from tests.test_live_support import config_for
    except ImportError:  # tests/ itself on sys.path
        from test_live_support import config_for  # type: ignore[no-redef]

    demo = Path(__file__).resolve().parents[1] / "sample_logs" / "demo"
    files = [str(demo / n) for n in ("crm-server.jsonl", "docs-server.jsonl",
                                     "proxy-transcript.jsonl", "summaries.jsonl")]

    def live(name: str, **extra: object) -> tuple[set[tuple], dict]:
        # backlog_detect_events=1: every commit detects in both runs (the split is what
        # is compared; deferring a backlog's detection is tested below)
        cfg = config_for(tmp_path / name, detect=True, flush_events=2_000, read_bytes=262_144,
                         history_events=20_000, backlog_detect_events=1, **extra)
        out = tmp_path / f"{name}.jsonl"
        lp = tail_files(cfg, files, sinks=build_sinks([SinkConfig(type="file",
                                                                  path=str(out))]),
                        idle_exit_s=0.5)
        rows = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        got = {(r["entity_type"], r["entity_id"], r["category"]) for r in rows
               if r["entity_type"] in ("session", "caller")}
        return got, lp.status.extra

    whole, _ = live("whole", max_detect_events=0)
    split, extra = live("split", max_detect_events=300, detect_passes=1_000)
    assert extra.get("detect_split_passes", 0) > 0
    assert not extra.get("detect_capped")
    assert whole and split == whole
    # A cap below what a flush touches: the window hands over only the newest events
    # (select(newest=)), the cut is counted, and detection still runs on them.
    capped, extra = live("capped", max_detect_events=300, detect_passes=1)
    assert extra.get("detect_capped", 0) > 0
    assert capped  # alerts still come from the newest events


@pytest.mark.slow  # starts a process
def test_fitting_the_forest_does_not_import_pandas() -> None:
    """A live process pays for scikit-learn when it fits or loads the forest, not for
    pandas (~37 MiB): sklearn imports it only because it is installed."""
    code = (
        "import sys\n"
        "import numpy as np, polars as pl\n"
        "from toolwatch.detectors.forest import sklearn_version, _import_sklearn\n"
        "_import_sklearn()\n"
        "from sklearn.ensemble import IsolationForest\n"
        "m = IsolationForest(n_estimators=10, random_state=0).fit(np.random.rand(200, 3))\n"
        "print(len(m.score_samples(np.random.rand(5, 3))), 'pandas' in sys.modules)\n"
        "import pandas\n"
        "print(pandas.DataFrame({'a': [1]}).shape[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["5", "False", "1"]


@pytest.mark.slow  # starts a process
def test_a_live_process_never_imports_pandas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tail with detection, forest fitted: pandas stays unimported (pyarrow's
    Schema.empty_table and scikit-learn would each pull it in: ~37 MiB RSS), whether the
    forest is fitted in this process or in a child."""
    import orjson

    log = tmp_path / "calls.jsonl"
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    with open(log, "wb") as fh:
        for i in range(12_000):  # 600 sessions of 20 calls: enough to fit the forest
            fh.write(orjson.dumps({
                "ts": (t0 + timedelta(milliseconds=50 * i)).isoformat(),
                "session_id": f"s-{i % 600}", "caller_id": f"u-{i % 600 % 97}",
                "client_ip": f"10.0.{i % 7}.1", "server": "docs",
                "tool": ("getDocument", "search", "listFiles")[i % 3],
                "args": {"documentId": f"doc-{i % 41}"}, "status": "ok",
                "bytes": 100 + i % 900,
            }) + b"\n")
    code = (
        "import sys\n"
        "from toolwatch.config import Config\n"
        "from toolwatch.live_cli import tail_files\n"
        "cfg = Config()\n"
        f"cfg.store.data_dir = {str(tmp_path / 'store')!r}\n"
        "cfg.live = {'compact_interval_s': 0}\n"
        f"tail_files(cfg, [{str(log)!r}], idle_exit_s=0.3)\n"
        "print('sklearn' in sys.modules, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "TOOLWATCH_HMAC_KEY": "00" * 32})
    # scikit-learn: in this process, or (H3's isolated forest) only in a short-lived child;
    # pandas in neither case (tests/test_forest* check the child's side).
    assert out.stdout.split()[-2] in ("True", "False")
    assert out.stdout.split()[-1] == "False"


@pytest.mark.slow  # live pipeline under memory gates, threads
def test_backlog_stores_at_once_and_detects_every_backlog_detect_events(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Backlog micro-batches (size-triggered) are committed as they come, but detection
    runs once per ``backlog_detect_events`` new events, over every entity they touched;
    a caught-up source gets the waiting detection at once (not at close), and the alert
    sees every event, as one detection per commit would."""
    import threading

    import orjson

    from toolwatch.live import LivePipeline
    from toolwatch.store import Store

    try:
        from tests.test_live import Feeder, nf
        from tests.test_live_support import (
            config_for,
            enum_detector,
            stored_alerts,
            stored_count,
            wait_for,
        )
    except ImportError:  # tests/ itself on sys.path
        from test_live import Feeder, nf  # type: ignore[no-redef]
        from test_live_support import (  # type: ignore[no-redef]
            config_for,
            enum_detector,
            stored_alerts,
            stored_count,
            wait_for,
        )

    inner = enum_detector(5)
    calls: list[int] = []
    gate = threading.Event()

    def detector(events, summaries, history=None):  # type: ignore[no-untyped-def]
        calls.append(events.height)
        return inner(events, summaries, history=history)

    data = tmp_path / "store"
    cfg = config_for(data, detect=True, flush_events=10, backlog_detect_interval_s=0.0,
                     backlog_detect_events=40)
    lp = LivePipeline(cfg, Store(data), detector=detector)
    f = Feeder()
    commits: list[int] = []
    lp.on_commit.append(lambda r: (commits.append(r.events), gate.set()))
    for k in range(6):  # size-triggered flushes, one at a time: a backlog
        lp.add(f.batch(b"".join(nf(k * 10 + i) for i in range(10))))
        assert lp.due()
        gate.clear()
        lp.flush(wait=False)
        assert gate.wait(10)
    wait_for(lambda: sum(commits) == 60)
    assert stored_count(data) == 60  # stored as they came
    assert len(calls) == 1  # 40 new events (another 10 would pass 40): one detection; 20 wait
    assert lp.status.extra["detect_deferred"] == 5  # commits of 10, 20, 30; 10, 20
    lp.caught_up()  # nothing more to read: the waiting detection runs now
    wait_for(lambda: len(calls) == 2)
    lp.drain()
    assert orjson.loads(stored_alerts(data)["evidence"][0])["distinct_not_found"] == 60
    lp.close()
    assert len(calls) == 2  # close found nothing left to detect
    assert stored_count(data) == 60


def test_max_queued_events_bounds_the_commit_queue(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """While the commit thread is busy, transformed micro-batches queue up to
    ``live.max_queued_events``; the next flush waits (back-pressure) instead of holding
    more in memory, and nothing is lost once the commit thread frees up."""
    import threading

    from toolwatch.config import Config
    from toolwatch.errors import ConfigError
    from toolwatch.live import LiveConfig, LivePipeline
    from toolwatch.live.commit import queue_bound
    from toolwatch.store import Store

    assert queue_bound(LiveConfig()) == 10_000
    assert queue_bound(LiveConfig(max_queued_events=0)) == 4 * LiveConfig().flush_events
    assert queue_bound(LiveConfig(max_queued_events=123)) == 123
    bad = Config()
    bad.live = {"max_queued_events": -1}
    with pytest.raises(ConfigError):
        LiveConfig.from_config(bad)

    inner = enum_detector(5)
    gate = threading.Event()
    entered = threading.Event()

    def detector(events, summaries, history=None):  # type: ignore[no-untyped-def]
        entered.set()
        assert gate.wait(30)
        return inner(events, summaries, history=history)

    data = tmp_path / "store"
    # Interval-style flushes (10 lines, flush_events 1000): detected at once, never deferred.
    cfg = config_for(data, detect=True, flush_events=1000, max_queued_events=20)
    lp = LivePipeline(cfg, Store(data), detector=detector)
    f = Feeder()
    seen: list[int] = []

    def flush(k: int) -> None:
        lp.add(f.batch(b"".join(nf(k * 10 + i) for i in range(10))))
        lp.flush(wait=False)
        with lp._cv:
            seen.append(lp._queued_events)

    flush(0)
    assert entered.wait(30)  # the commit thread is inside detection, holding batch 0
    flush(1)
    flush(2)  # 20 events queued: the bound
    blocked = threading.Thread(target=flush, args=(3,), daemon=True)
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive()  # waits for room; it did not queue a third batch
    assert max(seen) <= 20
    gate.set()
    blocked.join(30)
    assert not blocked.is_alive()
    lp.drain()
    wait_for(lambda: stored_count(data) == 40)
    lp.close()
    assert stored_count(data) == 40


def test_compaction_merges_in_bounded_groups(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Small files are merged in groups of at most COMPACT_MAX_BYTES (a merge holds its
    rows decompressed: one 64 MiB merge took a live process to 1.26 GiB), every group of
    the table in one call, rows kept once each (replayed rows were never stored twice)."""
    import duckdb

    from toolwatch import schema
    from toolwatch.store import Checkpoint, Store

    class SmallMerges(Store):
        COMPACT_MAX_BYTES = 0  # set below from a file's size: ~3 files per merge

    t0 = datetime(2026, 11, 2, tzinfo=UTC)

    def batch(k: int, n: int = 200) -> pa.Table:
        cols = {f.name: pa.nulls(n, f.type) for f in schema.EVENTS}
        # batch k repeats batch k-1's last 10 lines (a replay): stored once
        offsets = [k * (n - 10) + i for i in range(n)]
        cols["event_id"] = pa.array([f"fp:{o:09d}" for o in offsets], pa.string())
        cols["source_fp"] = pa.array(["fp"] * n, pa.string())
        cols["offset"] = pa.array(offsets, pa.int64())
        cols["ts"] = pa.array([t0 + timedelta(seconds=k)] * n, schema.EVENTS.field("ts").type)
        cols["ingested_at"] = pa.array([t0] * n, schema.EVENTS.field("ingested_at").type)
        return pa.table(cols, schema=schema.EVENTS)

    store = SmallMerges(tmp_path / "store", compact_min_files=4)
    for k in range(12):
        store.write_batch({"events": batch(k)}, [Checkpoint("fp", "f", (k + 1) * 190 + 10)])
    files = store.files("events")
    assert len(files) == 12
    SmallMerges.COMPACT_MAX_BYTES = 3 * max(os.path.getsize(f) for f in files)
    merges = store.compact("events")
    after = store.files("events")
    assert merges == 4 and len(after) == 4  # 12 files in groups of 3, all in one call
    con = duckdb.connect()
    n, distinct = con.execute(
        "SELECT count(*), count(DISTINCT event_id) FROM read_parquet($f)", {"f": after}
    ).fetchone()  # type: ignore[misc]
    assert n == distinct == 12 * 190 + 10  # nothing lost, nothing twice


@pytest.mark.slow  # live pipeline under memory gates, threads
def test_a_deferred_backlog_detection_runs_in_backlog_detect_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A detection a backlog gathered runs in ``backlog_detect_passes`` passes (default
    one: a pass's cost is mostly fixed), not in ``detect_passes`` passes of
    ``max_detect_events``; 0 keeps ``detect_passes``. Same events, same alerts."""
    import threading

    from toolwatch.errors import ConfigError
    from toolwatch.live import LiveConfig, LivePipeline
    from toolwatch.store import Store

    try:
        from tests.test_live import Feeder, nf
        from tests.test_live_support import config_for, recording_detector, wait_for
    except ImportError:  # tests/ itself on sys.path
        from test_live import Feeder, nf  # type: ignore[no-redef]
        from test_live_support import (  # type: ignore[no-redef]
            config_for,
            recording_detector,
            wait_for,
        )

    def run(name: str, backlog_passes: int) -> tuple[list[int], set[str]]:
        detector, calls, ids = recording_detector(5)

        data = tmp_path / name
        cfg = config_for(data, detect=True, flush_events=10, backlog_detect_interval_s=0.0,
                         backlog_detect_events=40, max_detect_events=10, detect_passes=4,
                         backlog_detect_passes=backlog_passes, history_events=0)
        lp = LivePipeline(cfg, Store(data), detector=detector)
        f = Feeder()
        gate = threading.Event()
        lp.on_commit.append(lambda r: gate.set())
        for k in range(4):  # four size-triggered flushes of 10 callers' events: a backlog
            lines = b"".join(nf(k * 10 + i, caller=f"c{i}", session=f"s{i}")
                             for i in range(10))
            lp.add(f.batch(lines))
            assert lp.due()
            gate.clear()
            lp.flush(wait=False)
            assert gate.wait(10)
        wait_for(lambda: bool(calls))
        lp.drain()
        lp.close()
        return calls, ids

    one, ids_one = run("one", 1)
    four, ids_four = run("four", 0)
    assert one == [40]  # the 40 gathered events in one pass
    assert len(four) > 1 and sum(four) == 40 and max(four) < 40  # split by caller
    assert ids_one == ids_four
    with pytest.raises(ConfigError):
        LiveConfig(backlog_detect_passes=-1).validate()


def _window_frame(rows: list[tuple[int, str | None, str | None]]) -> pl.DataFrame:
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    return pl.DataFrame(
        {
            "event_id": [f"fp:{i}" for i in range(len(rows))],
            "ts": [t0 + timedelta(seconds=s) for s, _, _ in rows],
            "session_id": [sid for _, sid, _ in rows],
            "caller_id": [c for _, _, c in rows],
        },
        schema={"event_id": pl.String, "ts": pl.Datetime("us", "UTC"),
                "session_id": pl.String, "caller_id": pl.String},
    )


@given(st.lists(st.tuples(st.integers(0, 3_600), st.one_of(st.none(), st.text(max_size=30)),
                          st.one_of(st.none(), st.text(max_size=30))), max_size=80),
       st.integers(1, 60))
@settings(max_examples=60, deadline=None)
def test_window_expiry_keeps_the_rows_and_values_it_should(
    rows: list[tuple[int, str | None, str | None]], cap: int
) -> None:
    """Expiry (strings copied column by column) keeps exactly the newest ``cap`` rows of
    the window, values and nulls unchanged, whatever the strings."""
    w = DetectionWindow(window_minutes=1e6, session_idle_minutes=1e6, tolerance_s=0.0,
                        max_events=cap, columns=["event_id", "ts", "session_id", "caller_id"])
    df = _window_frame(rows)
    w.add(df, pl.DataFrame(schema={"session_id": pl.String, "ts": pl.Datetime("us", "UTC")}))
    w.expire()
    got = w.events if w.events is not None else df.clear()
    assert got.height == min(cap, df.height)
    # every kept row is an input row, unchanged (ids are unique)
    joined = got.join(df, on="event_id", how="left", suffix="_in", nulls_equal=True)
    for c in ("ts", "session_id", "caller_id"):
        assert joined[c].equals(joined[f"{c}_in"].alias(c))
    if got.height and got.height < df.height:  # the oldest went first
        assert got["ts"].min() >= df["ts"].sort(descending=True)[cap - 1]


@pytest.mark.slow  # starts a process
def test_window_expiry_copies_one_column_of_strings_at_a_time() -> None:
    """The peak of an expiry is the window plus about one string column, not two windows.

    Measured in a fresh process (polars' jemalloc returning freed pages at once, as in a
    live command) with the kernel's high-water mark reset before each expiry; the
    all-at-once copy of before (``_own_strings`` of the whole frame) is the reference.
    """
    code = r"""
import os
from datetime import UTC, datetime, timedelta
import polars as pl
from toolwatch.detectors.stream import DetectionWindow, _own_strings

def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM'):
            return int(line.split()[1]) / 1024

def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20

n = 150_000
t0 = datetime(2026, 11, 2, tzinfo=UTC)
cols = {f"s{k}": pl.format("value-{}-of-column-{}-padding", pl.col("i"), pl.lit(k))
        for k in range(8)}
def frame(a, b):
    return (pl.DataFrame({"i": range(a, b)})
            .with_columns(ts=pl.lit(t0) + pl.duration(milliseconds=pl.col("i")),
                          session_id=pl.format("s-{}", pl.col("i")), **cols)
            .with_columns(pl.col("ts").dt.cast_time_unit("us")).drop("i"))
out = []
for mode in ("all_at_once", "by_column"):
    w = DetectionWindow(1e6, 1e6, 0.0, n, columns=frame(0, 1).columns)
    w.events = _own_strings(frame(0, n)).rechunk()
    w.newest_us = None
    w.add(frame(n, n + n // 4), pl.DataFrame())
    w.events = pl.concat([w.events, frame(n + n // 4, n + n // 2)], rechunk=False)
    if mode == "all_at_once":  # the copy of before: every string column at once
        w.expire = lambda w=w: setattr(w, "events", _own_strings(
            w.events.filter(pl.col("ts") >= w.events["ts"].top_k(n).min())).rechunk())
    base = rss()
    open(f"/proc/{os.getpid()}/clear_refs", "w").write("5")
    w.expire()
    out.append(hwm() - base)
    assert w.size == n
    del w
print(out[0], out[1])
"""
    env = {**os.environ, "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0,narenas:1"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    all_at_once, by_column = (float(x) for x in res.stdout.strip().splitlines()[-1].split())
    assert all_at_once > 20  # the reference copies 8 string columns of 150k rows at once
    assert by_column < 0.7 * all_at_once


@pytest.mark.slow  # starts a process
def test_duckdb_allocator_returns_freed_pages() -> None:
    """A live process sets DuckDB's bundled jemalloc to decay 0: after a large query its
    resident memory falls back (the default, 1000 ms without a background thread, kept it)."""
    code = r"""
import ctypes
import duckdb
from toolwatch.allocator import _duckdb_mallctl, tune_duckdb_allocator

fn = _duckdb_mallctl()
if fn is None:
    print("none")
    raise SystemExit
def stat(name):
    e = ctypes.c_uint64(1); sz = ctypes.c_size_t(8)
    fn(b"epoch", ctypes.byref(e), ctypes.byref(sz), ctypes.byref(e), 8)
    v = ctypes.c_size_t(); sz = ctypes.c_size_t(8)
    assert fn(name.encode(), ctypes.byref(v), ctypes.byref(sz), None, 0) == 0
    return v.value / 2**20
def decay():
    v = ctypes.c_ssize_t(); sz = ctypes.c_size_t(8)
    assert fn(b"arenas.dirty_decay_ms", ctypes.byref(v), ctypes.byref(sz), None, 0) == 0
    return v.value
con = duckdb.connect()
q = "SELECT s, count(*) FROM (SELECT 'x' || (i % 200000) s FROM range(2000000) r(i)) GROUP BY s"
con.sql(q).fetchall()
before = stat("stats.resident") - stat("stats.allocated")
d0 = decay()
assert tune_duckdb_allocator()
con.sql(q).fetchall()
after = stat("stats.resident") - stat("stats.allocated")
print(d0, decay(), round(before, 1), round(after, 1))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    last = res.stdout.strip().splitlines()[-1]
    if last == "none":
        pytest.skip("this DuckDB build has no bundled jemalloc")
    d0, d1, before, after = (float(x) for x in last.split())
    assert d0 > 0 and d1 == 0
    assert before > 4 and after < before / 2  # freed but resident: gone with decay 0


@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["a", "b", "c", None]),
                          st.sampled_from(["u1", "u2", None])), max_size=80),
       st.integers(1, 40))
@settings(max_examples=80, deadline=None)
def test_select_newest_is_the_newest_touched_events(
    rows: list[tuple[int, str | None, str | None]], n: int
) -> None:
    """``select(touched, newest=n)`` returns the rows of ``select(touched)`` with the n
    newest log times (ties at the cut: the later arrivals), sorted, and says it cut."""
    w = DetectionWindow(window_minutes=1e6, session_idle_minutes=1e6, tolerance_s=0.0,
                        max_events=10_000, columns=["event_id", "ts", "session_id",
                                                    "caller_id"])
    df = _window_frame(rows)
    w.add(df, pl.DataFrame(schema={"session_id": pl.String, "ts": pl.Datetime("us", "UTC")}))
    touched = {"session_id": pl.Series(["a", "b"]), "caller_id": pl.Series(["u1"])}
    full, _ = w.select(touched)
    assert not w.select_capped
    cut, _ = w.select(touched, newest=n)
    assert w.select_capped == (full.height > n)
    assert cut.height == min(n, full.height)
    assert cut["ts"].is_sorted()
    if full.height:
        ts_sorted = full["ts"].sort(descending=True)
        kth = ts_sorted[min(n, full.height) - 1]
        # every event strictly newer than the cut is in, none older
        assert set(full.filter(pl.col("ts") > kth)["event_id"]) <= set(cut["event_id"])
        assert cut["ts"].min() == kth or cut.height == full.height
        # among the events at the cut, the later arrivals are kept
        at = full.filter(pl.col("ts") == kth)["event_id"].to_list()
        kept_at = [e for e in at if e in set(cut["event_id"])]
        order = {e: int(e.split(":")[1]) for e in at}
        assert sorted(kept_at, key=order.get) == sorted(at, key=order.get)[len(at) - len(kept_at):]


# ---------------------------------------------------------------- the memory gate
def _gate(high: float, rss: float, released: list[int] | None = None):  # type: ignore[no-untyped-def]
    from toolwatch.live.memgate import MemoryGate

    rel = None if released is None else (lambda: released.append(1))
    return MemoryGate(high, rss=lambda: rss, release=rel)


@given(st.lists(st.tuples(st.sampled_from(["parse", "detect", "write", "compact"]),
                          st.booleans()), min_size=4, max_size=40),
       st.integers(2, 5))
@settings(max_examples=25, deadline=None)
def test_gate_never_lets_two_heavy_phases_overlap_while_memory_is_high(
        plan: list[tuple[str, bool]], threads: int) -> None:
    """RSS at the threshold: whatever the phases, threads and nesting, one phase at a time."""
    import threading

    gate = _gate(500, 500.0)
    inside: list[int] = [0]
    most: list[int] = [0]
    lock = threading.Lock()

    def body() -> None:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        for _ in range(200):  # give the other threads every chance to get in beside
            pass
        with lock:
            inside[0] -= 1

    def worker(k: int) -> None:
        for i, (phase, nested) in enumerate(plan):
            if i % threads != k:
                continue
            with gate.hold(phase):
                body()
                if nested:  # compaction's merge writes through the store: same thread
                    with gate.hold("write"):
                        pass

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
        assert not t.is_alive()  # nesting on one thread never deadlocks
    assert most[0] == 1
    assert gate.stats.max_running == 1
    assert gate.stats.overlapped == 0
    assert gate.stats.entered == len(plan)
    assert gate.running() == []


def test_gate_lets_phases_overlap_while_memory_is_low_and_when_off() -> None:
    """Below the threshold (or with the gate off) the reader and the commit thread overlap."""
    import threading

    for gate in (_gate(500, 400.0), _gate(0, 10_000.0)):
        both = threading.Barrier(2, timeout=30)

        def phase(name: str, gate=gate, both=both) -> None:  # type: ignore[no-untyped-def]
            with gate.hold(name):
                both.wait()  # returns only when the other phase is inside too

        t = threading.Thread(target=phase, args=("parse",))
        t.start()
        phase("detect")
        t.join(30)
        assert gate.stats.overlapped == 1
        assert gate.stats.max_running == 2


def test_gate_serves_waiting_phases_in_arrival_order_and_releases_between_them() -> None:
    """A phase that waits goes before one that came later (no thread starves), and the
    phase that ends hands freed memory back before the next starts."""
    import threading
    import time

    released: list[int] = []
    gate = _gate(100, 200.0, released)
    order: list[str] = []
    hold_first = threading.Event()
    first_in = threading.Event()

    def first() -> None:
        with gate.hold("detect"):
            first_in.set()
            assert hold_first.wait(30)
            order.append("detect")

    def later(name: str) -> None:
        with gate._cv:  # know when this thread is in the queue
            n = len(gate._waiting)
        th = threading.Thread(target=_enter_and_log, args=(gate, name, order))
        th.start()
        while True:
            with gate._cv:
                if len(gate._waiting) > n:
                    break
            time.sleep(0.001)
        threads.append(th)

    threads: list[threading.Thread] = []
    t0 = threading.Thread(target=first)
    t0.start()
    assert first_in.wait(30)
    for name in ("parse", "write", "compact"):
        later(name)
    assert gate.stats.waited == 3
    hold_first.set()
    t0.join(30)
    for th in threads:
        th.join(30)
    assert order == ["detect", "parse", "write", "compact"]
    assert gate.stats.max_running == 1
    assert len(released) == 4  # after each phase: none ran beside it
    assert set(gate.stats.wait_s_by_phase) == {"parse", "write", "compact"}


def _enter_and_log(gate, name: str, order: list[str]) -> None:  # type: ignore[no-untyped-def]
    with gate.hold(name):
        order.append(name)


@pytest.mark.slow  # live pipeline under memory gates, threads
def test_live_pipeline_parse_waits_for_detection_while_memory_is_high(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With the gate closed (threshold 1 MiB: always high), the reader's parse of a
    backlog-sized micro-batch (> 1.5 x flush_events lines) does not start while the
    commit thread detects; with the gate off, or for a real-time-sized micro-batch, it
    does (the gate never delays a source that keeps up). Every event is stored once."""
    import threading

    from toolwatch.config import Config
    from toolwatch.errors import ConfigError
    from toolwatch.live import LiveConfig, LivePipeline
    from toolwatch.store import Store

    bad = Config()
    bad.live = {"memory_gate_mib": -1}
    with pytest.raises(ConfigError):
        LiveConfig.from_config(bad)

    for case, (high, flush_events) in enumerate(((1, 6), (0, 6), (1, 1000))):
        gated = high and flush_events == 6
        inner = enum_detector(5)
        go = threading.Event()
        entered = threading.Event()
        during: list[list[str]] = []

        def detector(events, summaries, history=None, go=go, entered=entered,  # type: ignore[no-untyped-def]
                     inner=inner):
            entered.set()
            assert go.wait(30)
            return inner(events, summaries, history=history)

        data = tmp_path / f"store-{case}"
        cfg = config_for(data, detect=True, flush_events=flush_events, memory_gate_mib=high)
        lp = LivePipeline(cfg, Store(data), detector=detector)
        f = Feeder()
        orig = lp._transform_taken_gated

        def transform(*a, lp=lp, orig=orig):  # type: ignore[no-untyped-def]
            during.append(lp.memory_gate.running())
            return orig(*a)

        lp._transform_taken_gated = transform  # type: ignore[method-assign]

        def flush(k: int, lp=lp, f=f) -> None:  # type: ignore[no-untyped-def]
            lp.add(f.batch(b"".join(nf(k * 10 + i) for i in range(10))))
            lp.flush(wait=False, behind=False)  # detected at once, never deferred

        flush(0)
        assert entered.wait(30)  # the commit thread is inside detection of batch 0
        second = threading.Thread(target=flush, args=(1,), daemon=True)
        second.start()
        second.join(0.5)
        if gated:
            assert second.is_alive()  # its parse waits at the gate
            assert len(during) == 1
        else:
            assert not second.is_alive()  # parsed beside the detection
            assert sorted(during[1]) == (["detect"] if high else ["detect", "parse"])
        go.set()
        second.join(30)
        assert not second.is_alive()
        lp.drain()
        wait_for(lambda data=data: stored_count(data) == 20)
        gate = lp.memory_gate
        lp.close()
        assert stored_count(data) == 20
        if gated:
            # Parse always ran alone: the commit thread was never inside a phase then.
            assert all(r == ["parse"] for r in during)
            assert gate.stats.max_running == 1 and gate.stats.waited >= 1
        elif high:  # real-time-sized parses are not gated: not even tracked
            assert during[1] == ["detect"]
            assert gate.stats.waited == 0
        else:
            assert gate.stats.max_running == 2
