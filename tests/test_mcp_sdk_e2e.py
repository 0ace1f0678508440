"""End to end with the real MCP Python SDK: SDK server + toolwatch middleware, wrapped by
``toolwatch run``, driven by the SDK's stdio client (which stops the server its own way:
close stdin, 2 s, SIGTERM to the group, 2 s, SIGKILL).

Asserts: the client's tool results are identical with and without the wrapper; every call
is stored exactly once (counted per session and JSON-RPC id), including under the SDK's
stop with 4 sessions at once; the attacks (a 150-call scraping loop, an enumeration of
document ids) are alerted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

# The SDK is in the dev extra: without it these tests fail to import rather than skip.
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

try:
    from tests.test_live_support import stored_alerts, stored_events
except ImportError:  # tests/ itself on sys.path
    from test_live_support import stored_alerts, stored_events  # type: ignore[no-redef]

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SERVER = str(Path(__file__).with_name("mcp_sdk_server.py"))
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))


def _scenario(kind: str) -> list[tuple[str, dict]]:
    if kind == "scrape":  # a 150-call scraping loop: walking the listing page by page
        return [("listDocuments", {"page": i}) for i in range(150)]
    if kind == "enumerate":  # guessing ids: most do not exist
        return [("getDocument", {"documentId": f"doc-{i}"}) for i in range(30, 110)]
    return [("searchDocuments", {"query": "lorem"}), ("getDocument", {"documentId": "doc-3"}),
            ("getDocument", {"documentId": "doc-7", "api_key": "s3cret"})]


async def _session(params: StdioServerParameters, calls: list[tuple[str, dict]]) -> list[str]:
    out = []
    with open("/dev/null", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            for name, args in calls:
                res = await s.call_tool(name, args)
                out.append(res.model_dump_json(exclude={"meta"}))
    return out


def _params(data: Path | None, env: dict, session: str) -> StdioServerParameters:
    env = {**env, "TOOLWATCH_SESSION_ID": session}
    if data is None:
        return StdioServerParameters(command=sys.executable, args=[SERVER], env=env)
    return StdioServerParameters(command=TOOLWATCH,
                                 args=["run", "-d", str(data), "--", sys.executable, SERVER],
                                 env=env)


async def _many(data: Path | None, env: dict, sessions: dict[str, str]) -> dict[str, list[str]]:
    results: dict[str, list[str]] = {}

    async def one(sid: str, kind: str) -> None:
        results[sid] = await _session(_params(data, env, sid), _scenario(kind))

    async with anyio.create_task_group() as tg:
        for sid, kind in sessions.items():
            tg.start_soon(one, sid, kind)
    return results


def test_sdk_sessions_wrapped_stored_once_and_attacks_alerted(
    tmp_path: Path, tw_env: dict
) -> None:
    data = tmp_path / "store"
    sessions = {"benign-1": "benign", "scrape-1": "scrape", "enum-1": "enumerate",
                "benign-2": "benign"}
    direct = anyio.run(_many, None, tw_env, sessions)
    wrapped = anyio.run(_many, data, tw_env, sessions)
    assert wrapped == direct  # the client sees exactly what it sees without toolwatch
    before = stored_events(data).height
    # whatever the SDK's SIGTERM/SIGKILL left in spools goes to the next writer
    subprocess.run([TOOLWATCH, "collect", "--once", "--no-stdout", "-d", str(data)],
                   env=tw_env, check=True, timeout=120, capture_output=True)
    ev = stored_events(data)
    assert ev.height >= before
    per = dict(ev.group_by("session_id").len().iter_rows())
    assert per == {sid: len(_scenario(kind)) for sid, kind in sessions.items()}
    # the JSON-RPC id is logged by the middleware; no (session, call) twice
    assert ev["event_id"].n_unique() == ev.height
    enum_status = ev.filter(ev["session_id"] == "enum-1")["status"].to_list()
    assert enum_status.count("not_found") == 70  # 70 of the 80 guessed ids missing
    al = stored_alerts(data)
    cats: dict[str, set[str]] = {}
    for sid, cat in al.select("session_id", "category").drop_nulls().iter_rows():
        cats.setdefault(sid, set()).add(cat)
    shown = al.select("entity_type", "entity_id", "category", "severity").to_dicts()
    assert "scraping_loop" in cats.get("scrape-1", set()), shown
    assert "enumeration" in cats.get("enum-1", set()), shown
    assert not {"benign-1", "benign-2"} & set(cats), shown
    # what an analyst sees: the CLI's alert listing names both attacks
    out = subprocess.run([TOOLWATCH, "alerts", "-d", str(data), "-f", "json"], env=tw_env,
                         check=True, timeout=120, capture_output=True, text=True).stdout
    listed = {(a.get("session_id"), a.get("category"))
              for a in map(json.loads, out.splitlines())}  # one JSON object a line
    assert {("scrape-1", "scraping_loop"), ("enum-1", "enumeration")} <= listed, out[:2000]
