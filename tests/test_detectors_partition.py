"""Caller partitioning in memory (:mod:`toolwatch.detectors.partition`)."""

from __future__ import annotations

import polars as pl
from toolwatch.detectors.partition import caller_partition, detect_in_parts


def _events() -> pl.DataFrame:
    callers = ["a", "a", "b", None, "c", "b", None]
    sessions = ["s1", "s2", "s3", "s4", "s5", "s3", "s4"]
    return pl.DataFrame({"caller_id": callers, "session_id": sessions, "i": range(7)})


def test_each_caller_and_session_is_whole_in_one_pass() -> None:
    ev = _events()
    su = pl.DataFrame({"session_id": ["s1", "s4", "gone"]})
    seen: list[tuple[pl.DataFrame, pl.DataFrame]] = []

    def detect(e: pl.DataFrame, s: pl.DataFrame) -> pl.DataFrame | None:
        seen.append((e, s))
        return None

    assert detect_in_parts(ev, su, 3, detect) is None
    assert sum(e.height for e, _ in seen) == ev.height  # every event in exactly one pass
    for key in ("caller_id", "session_id"):
        owners = [set(e[key].drop_nulls()) for e, _ in seen]
        for x in set(ev[key].drop_nulls()):
            assert sum(x in o for o in owners) == 1, (key, x)
    # every summary once; the one of a session without events here goes with pass 0
    assert sorted(s for _, sui in seen for s in sui["session_id"]) == ["gone", "s1", "s4"]


def test_an_alert_scored_by_two_passes_keeps_its_highest_score() -> None:
    ev = _events()
    no_summaries = pl.DataFrame({"session_id": []}, schema={"session_id": pl.Utf8})

    def detect(e: pl.DataFrame, s: pl.DataFrame) -> pl.DataFrame:
        # the same alert id from every pass, scored by the pass's size; a second alert
        # only from the pass holding caller "a"
        ids = ["x", "only-a"] if "a" in set(e["caller_id"].drop_nulls()) else ["x"]
        return pl.DataFrame({"alert_id": ids, "score": [float(e.height)] * len(ids)})

    got = detect_in_parts(ev, no_summaries, 4, detect)
    sizes = caller_partition(ev, 4).value_counts()["count"]
    assert got is not None
    assert sorted(got["alert_id"]) == ["only-a", "x"]
    assert got.filter(pl.col("alert_id") == "x")["score"][0] == float(sizes.max())
