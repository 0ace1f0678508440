"""Consumer lag watch (``toolwatch status`` / metrics of ``toolwatch kafka``), no broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from toolwatch.ingest.sources.kafka import LagWatch

from toolwatch.live import LiveStatus, prometheus_text


def test_growing_lag_warns_once_per_episode() -> None:
    w = LagWatch()
    out, newly = w.update({"t/0": 5, "t/1": 0}, 60, now=0.0)
    assert out == {"messages": 5, "growing_s": 0.0, "by_partition": "t/0=5 t/1=0"}
    assert not newly
    out, newly = w.update({"t/0": 50, "t/1": 10}, 60, now=30.0)
    assert out["growing_s"] == 30.0 and "warning" not in out and not newly
    out, newly = w.update({"t/0": 80, "t/1": 10}, 60, now=61.0)
    assert newly and out["warning"] == "lag growing for 61s (> 60s)"
    out, newly = w.update({"t/0": 90, "t/1": 10}, 60, now=70.0)
    assert not newly and "warning" in out  # still warning, logged once
    # Catching up below where the episode began starts a new one at the lower value.
    out, newly = w.update({"t/0": 3, "t/1": 0}, 60, now=71.0)
    assert out["growing_s"] == 0.0 and "warning" not in out
    out, newly = w.update({"t/0": 0, "t/1": 0}, 60, now=200.0)
    assert out["growing_s"] == 0.0 and w.episode is None
    out, newly = w.update({"t/0": 4}, 60, now=300.0)
    out, newly = w.update({"t/0": 4}, 60, now=361.0)  # a steady lag never caught up
    assert newly


def test_zero_limit_never_warns() -> None:
    w = LagWatch()
    w.update({"t/0": 1}, 0, now=0.0)
    out, newly = w.update({"t/0": 10**9}, 0, now=10**6)
    assert not newly and "warning" not in out


@given(st.lists(st.tuples(st.floats(0, 1e4), st.dictionaries(
    st.text(min_size=1, max_size=8), st.integers(0, 10**12), max_size=6)), max_size=40))
def test_lag_watch_consistent_on_any_samples(samples: list) -> None:
    w = LagWatch()
    now = 0.0
    for dt, per in samples:
        now += dt
        out, newly = w.update(per, 30, now=now)
        assert out["messages"] == sum(per.values())
        assert out["growing_s"] >= 0
        if out["messages"] == 0:
            assert out["growing_s"] == 0 and "warning" not in out
        assert not newly or "warning" in out


def test_partition_lag_in_prometheus_with_safe_labels() -> None:
    s = LiveStatus(kind="kafka", name="g:t")
    s.lag = {"messages": 7, "growing_s": 1.5, "by_partition": 't"x/0=7'}
    s.sources = {"partitions": ['t"x/0'], "lag_by_partition": {'t"x/0': 7, "t/1": 0}}
    text = prometheus_text(s)
    assert 'toolwatch_kafka_partition_lag{kind="kafka",name="g:t",partition="t\\"x/0"} 7' in text
    assert 'partition="t/1"} 0' in text
    assert "toolwatch_lag_messages{" in text and "toolwatch_lag_growing_s{" in text
    assert "by_partition" not in text  # text entries are for `toolwatch status` only


def test_dashboard_health_lists_live_kafka_lag(tmp_path) -> None:
    from toolwatch.dashboard.data import live_processes

    from toolwatch.live import StatusPublisher
    from toolwatch.store import Store

    store = Store(tmp_path / "store")
    assert live_processes(store).height == 0
    s = LiveStatus(kind="kafka", name="g:t")
    s.events_stored = 1234
    s.lag, _ = LagWatch().update({"t/0": 70, "t/1": 5}, 0, now=0.0)
    s.lag["warning"] = "lag growing for 75s (> 60s)"
    pub = StatusPublisher(s, store.root, None, "127.0.0.1")
    try:
        pub.write()
        df = live_processes(store)
    finally:
        pub.close()
    assert df.height == 1
    row = df.row(0, named=True)
    assert row["kind"] == "kafka" and row["lag"] == 75 and row["events_stored"] == 1234
    assert row["partitions"] == "t/0=70 t/1=5"
    assert row["warning"] == "lag growing for 75s (> 60s)"
