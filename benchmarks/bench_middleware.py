"""What ToolwatchMiddleware's redaction costs per ``tools/call``, and what it adds at import.

The middleware used to hash only values under secret-looking keys (a regex per key); it
now runs ingest's :class:`toolwatch.ingest.secrets.SecretHasher` over the whole line. This prints,
in one run and interleaved (best of ``--repeat`` rounds), the per-call microseconds of the
whole middleware (record, redaction, JSON line, write to memory) for the old code (the
module as of ``--old REV``, loaded from git) and the current one, over a few realistic
argument shapes, and the ratio. Then the import cost: a fresh interpreter importing the
middleware, the middleware + the scanner (what the first ``tools/call`` imports), and the
MCP SDK server module for scale, best of ``--imports`` runs.

    .venv/bin/python benchmarks/bench_middleware.py [--old 9557045^] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

LOREM = ("The quarterly report covers revenue, churn and the migration of the billing "
         "service to the new cluster; see the appendix for the raw figures. ")

SHAPES: dict[str, dict[str, Any]] = {
    "id": {"documentId": "doc-3"},
    "search": {"query": "billing migration", "limit": 20, "offset": 40,
               "filters": {"owner": "team-payments", "tags": ["q3", "report"]}},
    "secret_key": {"user": "svc-reporting", "password": "Xk7pQ2vLm9Rt4Wz8Nb3c",
                   "host": "db.internal"},
    "url_creds": {"dsn": "postgres://admin:Xk7pQ2vLm9Rt4Wz8Nb3c@db.internal:5432/app",
                  "sql": "SELECT id, total FROM invoices WHERE status = 'open' LIMIT 100"},
    "sql_1k": {"sql": ("SELECT c.id, c.name, sum(i.total) AS t FROM customers c JOIN "
                       "invoices i ON i.customer_id = c.id WHERE i.created_at >= '2026-01-01' "
                       "GROUP BY 1, 2 ORDER BY t DESC ") * 6},
    "write_4k": {"path": "/docs/report.md", "content": LOREM * 28},
    "records_50": {"rows": [{"id": i, "name": f"item {i}", "price": i * 1.5,
                             "tags": ["a", "b"]} for i in range(50)]},
    "headers": {"url": "https://api.example.com/v1/items?page=2",
                "headers": {"Accept": "application/json",
                            "Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"}},
}


def _load_old(rev: str) -> ModuleType:
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:toolwatch/mcp_middleware.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="bench-mw-")) / "old_mcp_middleware.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_mcp_middleware", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Null:
    def write(self, s: str) -> int:
        return len(s)

    def flush(self) -> None:
        pass


async def _ok(ctx: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "done"}], "isError": False}


def _per_call_us(mw: Any, args: dict[str, Any], n: int) -> float:
    """Mean microseconds of one ``tools/call`` through ``mw`` (no event loop: the
    coroutine completes on its first step, as ``call_next`` never waits)."""
    ctx = SimpleNamespace(method="tools/call", request_id=1,
                          params={"name": "tool", "arguments": args})
    t0 = time.perf_counter()
    for _ in range(n):
        coro = mw(ctx, _ok)
        try:  # noqa: SIM105 (a with-block per call would be timed too)
            coro.send(None)
        except StopIteration:
            pass
    return (time.perf_counter() - t0) / n * 1e6


def _import_s(code: str, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        best = min(best, time.perf_counter() - t0)
    return best


def log_records(repeat: int) -> None:
    """Per-record cost of the middleware's log filter (best of ``repeat`` x 500 records)."""
    import logging

    from toolwatch.mcp_middleware import ToolwatchMiddleware, _RecordScrubber

    mw = ToolwatchMiddleware("bench", stream=_Null(), session_id="s")
    mw._scanner()  # (as after the first tools/call)
    flt = _RecordScrubber(mw)

    def record(msg: str, exc: bool) -> logging.LogRecord:
        info = None
        if exc:
            try:
                raise ValueError(msg)
            except ValueError:
                info = sys.exc_info()
        return logging.LogRecord("mcp", logging.ERROR, __file__, 1, msg, None, info)

    for name, msg, exc in [
        ("plain message", "Processing request of type CallToolRequest", False),
        ("traceback, no secret", "document doc-99 not found", True),
        ("traceback, password=S", "document password=Zr8tKq2Lw5Pn9Vx3Bc6H not found", True),
    ]:
        best = float("inf")
        for _ in range(repeat):
            recs = [record(msg, exc) for _ in range(500)]
            t = time.perf_counter()
            for r in recs:
                flt.filter(r)
            best = min(best, (time.perf_counter() - t) / 500)
        print(f"{name:28s} {best * 1e6:8.1f} us/record", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="9557045^", help="git revision of the old middleware")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds (best of)")
    ap.add_argument("--calls", type=int, default=2000, help="calls per shape per round")
    ap.add_argument("--imports", type=int, default=7, help="interpreter starts (best of)")
    ap.add_argument("--log-records", action="store_true",
                    help="only time the log-record scrubber (the SDK's traceback of a "
                    "tool's exception) per record: plain, traceback, traceback with a secret")
    a = ap.parse_args()
    os.environ.setdefault("TOOLWATCH_HMAC_KEY", "5a" * 32)
    if a.log_records:
        log_records(a.repeat)
        return

    from toolwatch.mcp_middleware import ToolwatchMiddleware

    old_mod = _load_old(a.old)
    old = old_mod.ToolwatchMiddleware("bench", stream=_Null(), session_id="s")
    new = ToolwatchMiddleware("bench", stream=_Null(), session_id="s")
    t0 = time.perf_counter()
    _per_call_us(new, SHAPES["id"], 1)  # the first call imports the scanner
    first_ms = (time.perf_counter() - t0) * 1e3
    best: dict[tuple[str, str], float] = {}
    for _ in range(a.repeat):
        for name, args in SHAPES.items():
            for label, mw in (("old", old), ("new", new)):
                us = _per_call_us(mw, args, a.calls)
                best[label, name] = min(best.get((label, name), us), us)
    print(f"load average {os.getloadavg()[0]:.2f}; per tools/call, us (best of {a.repeat} "
          f"x {a.calls} calls; old = {a.old})")
    print(f"{'shape':<12}{'bytes':>7}{'old':>9}{'new':>9}{'new/old':>9}{'+us':>8}")
    for name, args in SHAPES.items():
        o, n = best["old", name], best["new", name]
        size = len(json.dumps(args))
        print(f"{name:<12}{size:>7}{o:>9.1f}{n:>9.1f}{n / o:>8.2f}x{n - o:>8.1f}")
    print(f"first call (imports toolwatch.ingest.secrets, builds the scanner): {first_ms:.0f} ms")

    base = _import_s("pass", a.imports)
    mw = _import_s("import toolwatch.mcp_middleware", a.imports)
    scan = _import_s("import toolwatch.mcp_middleware, toolwatch.ingest.secrets", a.imports)
    sdk = _import_s("import mcp.server.mcpserver", a.imports)
    print(f"import, best of {a.imports} interpreter starts (minus a bare start "
          f"{base * 1e3:.0f} ms): middleware {(mw - base) * 1e3:.0f} ms, middleware + "
          f"scanner (pyarrow, numpy, RE2) {(scan - base) * 1e3:.0f} ms, "
          f"MCP SDK server module {(sdk - base) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
