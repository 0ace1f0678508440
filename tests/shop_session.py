"""A small shop-server log analysed by the real CLI, and the session page run on it.

Shared by the dashboard session-detail tests (call sequence, swimlane): each writes its own
lines, then checks the page the analyst sees.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import orjson
from streamlit.testing.v1 import AppTest

from tests.conftest import CLI

APP = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOSTILE_TOOL = "chargePayment<img src=x onerror=alert(1)>"


def shop_line(t: datetime, sid: str, tool: str, dur: float | None = None, **kw: object) -> bytes:
    """One call of the shop server at ``t``; ``dur`` ms when given (the call *completed*
    at ``t``: the default ``ts_marks = end``). ``caller`` and ``args`` are keywords."""
    rec = {"ts": t.isoformat().replace("+00:00", "Z"), "session_id": sid,
           "caller_id": kw.pop("caller", "shopper"), "client_ip": "198.51.100.7",
           "server": "shop-server", "tool": tool, "args": kw.pop("args", {}),
           "status": "ok", "bytes": 800}
    if dur is not None:
        rec["duration_ms"] = dur
    return orjson.dumps({**rec, **kw}) + b"\n"


def analyse(tmp: Path, lines: list[bytes]) -> dict:
    """Analyse ``lines`` with the real CLI into ``tmp/store``: the store and its alerts."""
    log = tmp / "shop.jsonl"
    log.write_bytes(b"".join(lines))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "cfg")
    cli = CLI(data_dir=tmp / "store", env=env)
    alerts = tmp / "alerts.jsonl"
    cli("analyze", str(log), "-d", str(cli.data_dir), "--alerts-out", str(alerts))
    rows = [json.loads(x) for x in alerts.read_text().splitlines() if x.strip()]
    return {"store": cli.data_dir, "alerts": rows}


def session_page(store: Path, **query: str) -> AppTest:
    """The session detail page on ``store``, headless, with ``query`` parameters."""
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.session_state["toolwatch_data_dir"] = str(store)
    at.context["timezone"] = "UTC"
    at = at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.query_params.update(query)
    at.switch_page("views/session.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at
