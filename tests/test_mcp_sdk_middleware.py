"""ToolwatchMiddleware inside a real SDK server (``mcp.Client`` in process, no subprocess).

How the SDK reports a tool's failure to middleware decides the logged ``status``: a
``ToolError``'s text reaches the ``isError`` result, but any other exception's text is
withheld ("Error executing tool <name>") and only the SDK's own log record holds it. Both
must come out as ``not_found`` / ``denied`` so enumeration detection works for SDK servers.
"""

from __future__ import annotations

import io
import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# The SDK is in the dev extra: without it these tests fail to import rather than skip.
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from toolwatch.mcp_middleware import ToolwatchMiddleware, _status_of_exception


@pytest.fixture(autouse=True)
def _key_home(tmp_path, monkeypatch) -> None:
    """The middleware creates toolwatch's key file on first use: never in the real home."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))


def _server(buf: io.StringIO) -> MCPServer:
    mcp = MCPServer("t", middleware=[ToolwatchMiddleware("t", stream=buf, session_id="s1")])

    @mcp.tool()
    def crash_missing(x: str) -> str:
        raise ValueError(f"record {x} not found")

    @mcp.tool()
    def tool_missing(x: str) -> str:
        raise ToolError(f"record {x} does not exist")

    @mcp.tool()
    def key_missing(x: str) -> str:
        return {"a": "b"}[x]

    @mcp.tool()
    def no_file(x: str) -> str:
        return open(f"/nonexistent-dir/{x}").read()

    @mcp.tool()
    def perm(x: str) -> str:
        raise PermissionError("read-only")

    @mcp.tool()
    def refused(x: str) -> str:
        raise ToolError("access denied for this user")

    @mcp.tool()
    def boom(x: str) -> str:
        raise RuntimeError("disk on fire")

    @mcp.tool()
    def fine(x: str, password: str = "") -> dict[str, Any]:
        return {"rows": 3, "x": x}

    return mcp


def _run(calls: list[tuple[str, dict]]) -> list[dict]:
    buf = io.StringIO()
    mcp = _server(buf)

    async def main() -> None:
        async with Client(mcp) as cl:
            for name, args in calls:
                await cl.call_tool(name, args)

    anyio.run(main)
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_status_of_every_failure_shape() -> None:
    calls = [("crash_missing", {"x": "1"}), ("tool_missing", {"x": "2"}),
             ("key_missing", {"x": "zz"}), ("no_file", {"x": "f"}), ("perm", {"x": "p"}),
             ("refused", {"x": "r"}), ("boom", {"x": "b"}), ("nosuchtool", {"x": "n"}),
             ("fine", {"x": "ok", "password": "hunter2"})]
    recs = _run(calls)
    assert [r["tool"] for r in recs] == [c[0] for c in calls]  # one line per call, in order
    assert [r["status"] for r in recs] == [
        "not_found", "not_found", "not_found", "not_found", "denied", "denied", "error",
        "not_found", "ok"]
    assert [r["isError"] for r in recs] == [True] * 8 + [False]
    assert recs[-1]["rows"] == 3
    assert "hunter2" not in json.dumps(recs)
    assert recs[-1]["args"]["password"].startswith("hmac:")  # keyed: see below
    assert {r["session_id"] for r in recs} == {"s1"}
    assert [r["request_id"] for r in recs] == sorted({r["request_id"] for r in recs})


def test_concurrent_calls_do_not_mix_exceptions() -> None:
    """Each call gets the exception of its own handler (a context variable per call)."""
    buf = io.StringIO()
    mcp = _server(buf)

    async def main() -> None:
        async with Client(mcp) as cl, anyio.create_task_group() as tg:
            for i in range(30):
                name = ("crash_missing", "perm", "boom")[i % 3]
                tg.start_soon(cl.call_tool, name, {"x": str(i)})

    anyio.run(main)
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    want = {"crash_missing": "not_found", "perm": "denied", "boom": "error"}
    assert len(recs) == 30
    assert all(r["status"] == want[r["tool"]] for r in recs), recs


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_status_of_arbitrary_exception_text(text: str) -> None:
    """Any message is classified without raising, into one of the three statuses."""
    exc = RuntimeError(text)
    try:
        raise ValueError("wrapper") from exc
    except ValueError as outer:
        assert _status_of_exception(outer) in {"not_found", "denied", "error"}
    cyc = RuntimeError(text)
    cyc.__context__ = cyc  # a cycle must not loop
    assert _status_of_exception(cyc) in {"not_found", "denied", "error"}


def _password_digest() -> str:
    return _run([("fine", {"x": "ok", "password": "hunter2"})])[-1]["args"]["password"]


@pytest.mark.slow  # starts a process
def test_secrets_are_keyed_with_toolwatchs_own_key(tmp_path, monkeypatch) -> None:
    import hashlib
    import hmac
    import stat

    # No environment key: the key file toolwatch itself uses, created on first use.
    monkeypatch.delenv("TOOLWATCH_HMAC_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    digest = _password_digest()
    key_file = tmp_path / "toolwatch" / "hmac.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = bytes.fromhex(key_file.read_text().strip())
    assert digest == "hmac:" + hmac.new(key, b"hunter2", hashlib.sha256).hexdigest()[:32]
    assert _password_digest() == digest  # the same secret hashes the same across sessions

    # $TOOLWATCH_HMAC_KEY (hex) wins, read the way ingest reads it.
    env_key = "ab" * 16
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", env_key)
    want = hmac.new(bytes.fromhex(env_key), b"hunter2", hashlib.sha256).hexdigest()[:32]
    assert _password_digest() == "hmac:" + want


@pytest.mark.slow  # starts a process
def test_no_usable_key_falls_back_to_sha256_with_a_warning(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", "not hex")
    digest = _password_digest()
    assert digest.startswith("sha256:") and "hunter2" not in digest
    assert "TOOLWATCH_HMAC_KEY" in capsys.readouterr().err
