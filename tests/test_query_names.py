"""The guard resolves names as DuckDB does (issue 28 §5): a hypothesis search over CTE and
table names built from catalog names and look-alike characters (Kelvin sign, long s,
dotless i, full-width letters, combining marks, upper case).

Property: whatever the guard accepts, DuckDB runs as the guard read it: the query's rows
come from the CTE or the ``events`` view, never from a catalog view such as
``pg_settings`` (whose rows list store paths and $HOME).
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolwatch.errors import QueryRefusedError
from toolwatch.query_guard import check_query, fold

BASES = ["pg_settings", "xk", "events", "duckdb_settings", "pg_views", "sqlite_master"]
LOOKALIKES = {
    "k": ["k", "K", "\u212a"],
    "s": ["s", "S", "\u017f", "\uff53"],
    "i": ["i", "I", "\u0131", "\u0130"],
    "e": ["e", "E", "\uff45", "e\u0301"],
    "t": ["t", "T"],
    "g": ["g", "G"],
}


@st.composite
def confusable(draw: st.DrawFn) -> str:
    base = draw(st.sampled_from(BASES))
    return "".join(draw(st.sampled_from(LOOKALIKES.get(ch, [ch])) ) for ch in base)


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect(config={"autoload_known_extensions": False})
    c.execute("CREATE VIEW events AS SELECT 'from-events' AS marker")
    return c


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cte=confusable(), ref=confusable(), body_ref=confusable())
def test_accepted_names_mean_what_the_guard_read(con, cte: str, ref: str, body_ref: str):
    sql = (f"WITH {_q(cte)} AS (SELECT 'from-cte' AS marker FROM {_q(body_ref)}) "
           f"SELECT marker FROM {_q(ref)}")
    try:
        check_query(sql, ["events"], con=con)
    except QueryRefusedError:
        return
    # Accepted: the body reads events (not the CTE itself: it is not recursive), and the
    # outer reference is the CTE or events, as DuckDB folds names.
    assert fold(body_ref) == "events"
    assert fold(ref) in (fold(cte), "events")
    rows = con.execute(sql).fetchall()
    assert rows and {r[0] for r in rows} <= {"from-cte", "from-events"}


def test_the_reported_escapes_are_among_the_refused(con):
    for sql in (
        "WITH pg_settings AS (SELECT * FROM pg_settings) SELECT * FROM pg_settings",
        'WITH "x\u212a" AS (SELECT 1) SELECT * FROM xk',
        "SELECT pg_get_viewdef(1)",
    ):
        with pytest.raises(QueryRefusedError):
            check_query(sql, ["events"], con=con)
