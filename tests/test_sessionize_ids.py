"""Derived session ids: one format, written by sessionize, read back by live and evaluate."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.sessionize import (
    DERIVED_PREFIX,
    LOGGED_PREFIX,
    Sessionizer,
    escape_logged,
    parse_derived,
)


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


# A logged session id is log data: it must never name a derived session (H5's repro:
# mallory logs alice's derived id and her call is counted as alice's).
_prefixed = st.sampled_from(["derived:", "logged:", "logged:derived:", "logged:logged:", ""])
_logged_id = st.builds(lambda p, t: p + t, _prefixed, st.text(max_size=20))


@settings(max_examples=80, deadline=None)
@given(ids=st.lists(st.one_of(st.none(), _logged_id), min_size=1, max_size=12))
def test_escape_logged_is_one_to_one_and_never_derived(ids: list[str | None]) -> None:
    for typ in (pa.string(), pa.large_string()):
        arr = pa.array(ids, typ)
        out = escape_logged(arr).to_pylist()
        # nulls stay null; ids are kept unless they start with a reserved prefix
        for before, after in zip(ids, out, strict=True):
            if before is None:
                assert after is None
            elif before.startswith((DERIVED_PREFIX, LOGGED_PREFIX)):
                assert after == LOGGED_PREFIX + before
            else:
                assert after == before
        kept = [x for x in out if x is not None]
        assert not any(x.startswith(DERIVED_PREFIX) for x in kept)
        assert len(set(kept)) == len({x for x in ids if x is not None})


def test_a_logged_id_cannot_join_a_derived_session(tw, tmp_path: Path) -> None:
    """End to end through the CLI: calls and SESSION_END summaries that log alice's derived
    id are stored under an escaped id; alice's derived session keeps only her call."""
    derived = "derived:caller:alice@2026-11-02T10:00:00.000000Z"
    lines = [
        {"ts": "2026-11-02T10:00:00Z", "caller_id": "alice", "tool": "read"},
        {"ts": "2026-11-02T10:00:05Z", "session_id": derived, "caller_id": "mallory",
         "tool": "deleteAll"},
        {"event": "SESSION_END", "ts": "2026-11-02T10:00:08Z", "sessionId": derived,
         "callCount": 3000, "callerId": "mallory"},
        {"ts": "2026-11-02T10:00:09Z", "session_id": "s1", "caller_id": "bob", "tool": "x"},
    ]
    log = tmp_path / "l.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = tw.ingest(log)
    assert res["events_stored"] == 3 and res["summaries_stored"] == 1
    rows = tw.query("SELECT session_id, caller_id, calls, basis FROM sessions ORDER BY 1")
    assert rows == [
        {"session_id": derived, "caller_id": "alice", "calls": 1, "basis": "events"},
        # the summary's own call count, as for any session with a summary
        {"session_id": "logged:" + derived, "caller_id": "mallory", "calls": 3000,
         "basis": "both"},
        {"session_id": "s1", "caller_id": "bob", "calls": 1, "basis": "events"},
    ]
