"""Who the caller is, without a ``principal=`` hook (issue 27 item 6, issue 28 item 2).

* Official-SDK e2e: two default clients (both ``clientInfo.name == "mcp"``) through the
  middleware under ``toolwatch run`` are two callers, stored with
  ``caller_authenticated = false``; a client naming itself after a trusted caller does not
  become that caller.
* The SDK's auth context (a verified access token) gives the caller, authenticated.
* Control characters in any value never break the middleware's line.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

# The SDK is in the dev extra: without it these tests fail to import rather than skip.
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from toolwatch.mcp_middleware import ToolwatchMiddleware
from toolwatch.query import query
from toolwatch.store import Store

pytestmark = [pytest.mark.timeout(300)]

SERVER = str(Path(__file__).with_name("mcp_sdk_server.py"))
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


async def _client(data: Path, env: dict, name: str | None) -> None:
    from mcp.types import Implementation

    params = StdioServerParameters(
        command=TOOLWATCH, args=["run", "-d", str(data), "--", sys.executable, SERVER],
        env=env)
    info = Implementation(name=name, version="1.0") if name else None
    with open("/dev/null", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), \
                ClientSession(r, w, client_info=info) as s:
            await s.initialize()
            for i in range(3):
                await s.call_tool("getDocument", {"documentId": f"doc-{i}"})


async def _both(data: Path, env: dict, names: list[str | None]) -> None:
    async with anyio.create_task_group() as tg:
        for n in names:
            tg.start_soon(_client, data, env, n)


@pytest.mark.slow  # starts a process
def test_two_default_clients_are_two_callers(tmp_path: Path, tw_env: dict) -> None:
    data = tmp_path / "store"
    anyio.run(_both, data, tw_env, [None, None, "svc-nightly-export"])
    subprocess.run([TOOLWATCH, "collect", "--once", "--no-stdout", "-d", str(data)],
                   env=tw_env, check=True, timeout=120, capture_output=True)
    rows = query(Store(data),
        "SELECT caller_id, session_id, count(*) AS n, bool_or(caller_authenticated) AS auth "
        "FROM events GROUP BY ALL ORDER BY caller_id").to_pylist()
    assert len(rows) == 3, rows
    assert all(r["n"] == 3 and r["auth"] is False for r in rows), rows
    callers = [r["caller_id"] for r in rows]
    # the SDK's default client name, joined to each client's own session
    defaults = [c for c in callers if c.startswith("mcp#")]
    assert len(set(defaults)) == 2, callers
    assert {c.split("#", 1)[1] for c in defaults} == {
        r["session_id"] for r in rows if r["caller_id"] in defaults}
    # a self-declared name is not the trusted caller of that name
    assert "svc-nightly-export" not in callers
    assert any(c.startswith("svc-nightly-export#") for c in callers)


def _ctx(args: dict) -> SimpleNamespace:
    info = SimpleNamespace(name="mcp", version="0.1")
    return SimpleNamespace(method="tools/call", params={"name": "getDocument",
                                                        "arguments": args},
                           request_id=7,
                           session=SimpleNamespace(client_params=SimpleNamespace(
                               client_info=info)))


async def _ok(ctx: object) -> dict:
    return {"content": [{"type": "text", "text": "fine"}]}


def _call(mw: ToolwatchMiddleware, args: dict) -> dict:
    asyncio.run(mw(_ctx(args), _ok))
    line = mw.stream.getvalue().splitlines()[-1]  # type: ignore[union-attr]
    return json.loads(line)


def test_token_of_the_sdk_auth_context_is_the_authenticated_caller() -> None:
    from mcp.server.auth.middleware.auth_context import auth_context_var
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    mw = ToolwatchMiddleware("docs", stream=io.StringIO(), session_id="sess-1")
    rec = _call(mw, {"documentId": "d"})
    assert rec["caller_id"] == "mcp#sess-1" and rec["caller_authenticated"] is False
    for subject, expected in (("user-42", "user-42"), (None, "client-a")):
        tok = AccessToken(token="t", client_id="client-a", scopes=[], subject=subject)
        reset = auth_context_var.set(AuthenticatedUser(tok))
        try:
            rec = _call(mw, {"documentId": "d"})
        finally:
            auth_context_var.reset(reset)
        assert rec["caller_id"] == expected and rec["caller_authenticated"] is True
    hooked = ToolwatchMiddleware("docs", stream=io.StringIO(), principal=lambda c: "alice")
    rec = _call(hooked, {"documentId": "d"})
    assert rec["caller_id"] == "alice" and rec["caller_authenticated"] is True


def test_control_characters_never_break_the_line() -> None:
    mw = ToolwatchMiddleware("docs", stream=io.StringIO(), session_id="s")
    nasty = "a\nb\rc\x00d\x1be\x85f\u2028g\u2029h\x7fi\x9f"
    _call(mw, {"documentId": nasty, "t\u2028k": 1})
    out = mw.stream.getvalue()  # type: ignore[attr-defined]
    line = out.splitlines()[-1]
    assert out.endswith("\n") and out.count("\n") == 1
    for ch in "\r\x00\x1b\x85\u2028\u2029\x7f\x9f":
        assert ch not in line
    assert len(line.splitlines()) == 1
    assert json.loads(line)["args"]["documentId"] == nasty  # escaped, not lost


def test_caller_suppression_needs_an_authenticated_caller(tmp_path: Path) -> None:
    """Issue 28 item 2: logging in under a suppressed caller's name hides nothing."""
    import polars as pl
    from toolwatch.detectors.suppress import add_suppression, apply_triage_suppressions

    add_suppression(tmp_path, entity_type="caller_id", entity_id="svc-export",
                    created_by="t", category="scraping_loop")
    alerts = pl.DataFrame({"alert_id": ["a1", "a2"], "category": ["scraping_loop"] * 2,
                           "entity_type": ["session"] * 2, "entity_id": ["s1", "s2"],
                           "session_id": ["s1", "s2"], "caller_id": ["svc-export"] * 2,
                           "server": ["docs"] * 2})
    events = pl.DataFrame({"caller_id": ["svc-export"], "session_id": ["s1"],
                           "caller_authenticated": [True]})
    # the real caller: authenticated, silenced
    assert apply_triage_suppressions(alerts, tmp_path, events=events).height == 0
    # an impostor with the same self-declared name: kept
    forged = events.with_columns(pl.lit(False).alias("caller_authenticated"))
    assert apply_triage_suppressions(alerts, tmp_path, events=forged).height == 2
    # one authenticated event does not vouch for an impostor's unauthenticated ones
    mixed = pl.concat([events, forged])
    assert apply_triage_suppressions(alerts, tmp_path, events=mixed).height == 2
    # unknown (no events given; a log that says nothing; an older store): as before
    assert apply_triage_suppressions(alerts, tmp_path).height == 0
    silent = events.with_columns(pl.lit(None, pl.Boolean).alias("caller_authenticated"))
    assert apply_triage_suppressions(alerts, tmp_path, events=silent).height == 0
    # one event saying "not vouched" is enough to keep the alert
    assert apply_triage_suppressions(alerts, tmp_path,
                                     events=pl.concat([silent, forged])).height == 2


@pytest.mark.slow  # starts a process
def test_store_from_before_the_column_reads_null(tmp_path: Path, tw_env: dict) -> None:
    """Events files written before ``caller_authenticated`` existed: the view has the
    column (null), analyze runs, compaction keeps the rows."""
    import pyarrow.parquet as pq

    log = tmp_path / "a.jsonl"
    log.write_text("".join(
        json.dumps({"ts": f"2026-11-02T10:00:{i:02d}Z", "session_id": "s", "caller_id": "c",
                    "tool": "t", "args": {"id": i}}) + "\n" for i in range(5)))
    data = tmp_path / "store"
    subprocess.run([TOOLWATCH, "ingest", "-d", str(data), str(log)], env=tw_env, check=True,
                   timeout=120, capture_output=True)
    st_ = Store(data)
    files = st_.files("events")
    assert files
    for f in files:  # as an older toolwatch wrote them
        t = pq.read_table(f)
        pq.write_table(t.drop_columns(["caller_authenticated"]), f)
    rows = query(Store(data), "SELECT caller_authenticated, count(*) AS n FROM events "
                             "GROUP BY 1").to_pylist()
    assert rows == [{"caller_authenticated": None, "n": 5}]
    r = subprocess.run([TOOLWATCH, "analyze", "-d", str(data), str(log)], env=tw_env, timeout=300,
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert "Binder Error" not in r.stderr
