"""Status files of live processes: where a store keeps them and how to read them.

Live processes (:mod:`toolwatch.live.status`) write one JSON file each under
``<data_dir>/_state/live``; ``toolwatch status`` and the dashboard read them. Reading is
on the ground floor so the dashboard need not import the live engine.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson


def status_dir(data_dir: str | Path) -> Path:
    """Directory of live status files inside a store."""
    return Path(data_dir) / "_state" / "live"


def read_statuses(data_dir: str | Path) -> list[dict[str, Any]]:
    """Status files of live processes writing to a store, with ``alive`` set."""
    out: list[dict[str, Any]] = []
    d = status_dir(data_dir)
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            st = orjson.loads(p.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        pid = int(st.get("pid", 0))
        alive = False
        if pid > 0 and not st.get("stopped"):
            try:
                os.kill(pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True
        st["alive"] = alive
        st["age_s"] = round(time.time() - float(st.get("updated_at", 0)), 1)
        st["file"] = str(p)
        out.append(st)
    return out
