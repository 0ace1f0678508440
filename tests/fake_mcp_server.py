"""A tiny MCP stdio server for ``toolwatch run`` tests.

Reads JSON-RPC requests line by line on stdin and answers on stdout (``initialize``,
``tools/list``, ``tools/call`` — the result echoes the arguments). For every
``tools/call`` it logs one JSON line to stderr in the per-call format toolwatch parses;
it also writes non-JSON text to stderr (a banner, and a line per ``notifications/*``).

Behaviour switches (environment):

* ``FAKE_EXIT_CODE`` — exit with this code at stdin EOF (default 0).
* ``FAKE_SIGNAL_SELF`` — at stdin EOF kill itself with this signal number.
* ``FAKE_TRAP_TERM`` — on SIGTERM write ``got SIGTERM`` to stderr and exit 42.
* ``FAKE_SESSION`` — session id logged with every call (default ``fake-session``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import UTC, datetime


def log(obj: object) -> None:
    sys.stderr.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stderr.flush()


def main() -> int:
    if os.environ.get("FAKE_TRAP_TERM"):

        def on_term(signum: int, _frame: object) -> None:
            if os.environ.get("FAKE_SIGLOG"):
                with open(os.environ["FAKE_SIGLOG"], "a") as fh:
                    fh.write(f"{time.time()} {signum}\n")
            log("got SIGTERM")
            sys.exit(42)

        signal.signal(signal.SIGTERM, on_term)
    session = os.environ.get("FAKE_SESSION", "fake-session")
    log("fake-mcp-server 1.0 starting (this banner is not JSON)")
    out = sys.stdout.buffer
    for raw in sys.stdin.buffer:
        try:
            msg = json.loads(raw)
        except ValueError:
            log("ignoring a non-JSON request line")
            continue
        method = msg.get("method", "")
        mid = msg.get("id")
        if method.startswith("notifications/"):
            log(f"notification {method}")
            continue
        if method == "initialize":
            result: object = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                              "serverInfo": {"name": "fake", "version": "1.0"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "getDocument", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            params = msg.get("params") or {}
            args = params.get("arguments") or {}
            missing = str(args.get("documentId", "")).startswith("missing-")
            result = {"content": [{"type": "text", "text": json.dumps(args)}],
                      "isError": missing}
            log({
                "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "session_id": session,
                "caller_id": args.get("caller", "agent-1"),
                "client_ip": "127.0.0.1",
                "server": "fake",
                "tool": params.get("name"),
                "args": args,
                "status": "not_found" if missing else "ok",
                "bytes": len(json.dumps(args)),
            })
        else:
            out.write(json.dumps({"jsonrpc": "2.0", "id": mid, "error": {
                "code": -32601, "message": "method not found"}}).encode() + b"\n")
            out.flush()
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}).encode() + b"\n")
        out.flush()
    sig = os.environ.get("FAKE_SIGNAL_SELF")
    if sig:
        time.sleep(0.05)
        os.kill(os.getpid(), int(sig))
        time.sleep(5)
    return int(os.environ.get("FAKE_EXIT_CODE", "0"))


if __name__ == "__main__":
    sys.exit(main())
