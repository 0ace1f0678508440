"""Derived session ids: one format, written by sessionize, read back by live and evaluate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.sessionize import DERIVED_PREFIX, Sessionizer, parse_derived


@settings(max_examples=60, deadline=None)
@given(
    actor=st.text(min_size=1, max_size=40),
    start=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31)),
)
def test_sessionize_ids_parse_back(actor: str, start: datetime) -> None:
    # Actors are log data (caller ids may hold '@', ':' or anything else).
    ts = start.replace(tzinfo=UTC)
    ev = pl.DataFrame(
        {"ts": [ts, ts + timedelta(seconds=1)], "session_id": [None, None],
         "caller_id": [actor, actor], "client_ip": [None, None], "server": ["s", "s"]},
        schema_overrides={"ts": pl.Datetime("us", "UTC"), "session_id": pl.String,
                          "client_ip": pl.String},
    )
    sid = Sessionizer().sessionize(ev)["session_id"].unique().to_list()
    assert len(sid) == 1 and sid[0].startswith(DERIVED_PREFIX)
    parsed = parse_derived(sid[0])
    assert parsed is not None
    assert parsed[0].endswith(actor) and parsed[1] == ts


@given(st.text(max_size=60))
def test_parse_derived_never_raises(sid: str) -> None:
    got = parse_derived(sid)
    assert got is None or sid.startswith(DERIVED_PREFIX)
