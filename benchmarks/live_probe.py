"""Run ``toolwatch tail ...`` in this process with a sampler that attributes its memory.

Used as ``benchmarks/bench_live.py rss --launcher "python benchmarks/live_probe.py"``: every
2 s one JSON line to ``$PROBE_OUT`` (default ``/tmp/live_probe.jsonl``) with RSS and its
anonymous part (``/proc/self/smaps_rollup``), glibc malloc in use / free but kept
(``mallinfo2``), Arrow's pool, DuckDB's ``duckdb_memory()`` of the parse connections, the
window's size and the commit queue; at ``$PROBE_SMAPS_AT`` seconds (60) the 25 largest
mappings to ``$PROBE_OUT.smaps``. ``PROBE_DUCK="SET+x=1|SET+y=2"`` runs those statements
on every DuckDB connection; ``PROBE_LEAN=1`` samples nothing. Not a test.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import threading
import time
from typing import Any

from toolwatch.spool import tune_memory

sys.argv = ["toolwatch", *sys.argv[1:]]
tune_memory(sys.argv[1:])  # before polars/pyarrow load, as the console entry point does
OUT = os.environ.get("PROBE_OUT", "/tmp/live_probe.jsonl")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


def _rollup() -> dict[str, float]:
    out = {}
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            k, _, v = line.partition(":")
            if k in ("Rss", "Anonymous"):
                out[k] = int(v.split()[0]) / 1024
    return out


def _sample(t0: float) -> dict[str, Any]:
    d: dict[str, Any] = {"t": round(time.monotonic() - t0, 1), **_rollup()}
    mi = _LIBC.mallinfo2()
    d["glibc_used"] = (mi.uordblks + mi.hblkhd) / 2**20
    d["glibc_free"] = mi.fordblks / 2**20
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        d["arrow"] = pa.total_allocated_bytes() / 2**20
    duck: list[Any] = []
    for o in gc.get_objects():
        name = type(o).__name__
        if name == "Parser" and hasattr(o, "_con"):
            try:  # a cursor is another connection to the same database: not busy
                cur = o._con.cursor()
                r = cur.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
                cur.close()
                duck.append((r[0] or 0) / 2**20)
            except Exception as exc:  # a probe reports, never stops
                duck.append(str(exc)[:40])
        elif name == "LivePipeline" and hasattr(o, "window"):
            w = o.window
            d["win_mib"] = (w.events.estimated_size() if w.events is not None else 0) / 2**20
            d["win_n"] = w.size
            d["queued"] = o._queued_events
            d["pending"] = o._pending_lines
    d["duck_parse"] = duck
    d["modules"] = len(sys.modules)
    d["sklearn"] = "sklearn" in sys.modules
    return d


def _sampler() -> None:
    t0 = time.monotonic()
    with open(OUT, "w") as fh:
        while True:
            time.sleep(2)
            try:
                fh.write(json.dumps(_sample(t0)) + "\n")
            except Exception as exc:
                fh.write(json.dumps({"err": repr(exc)}) + "\n")
            fh.flush()


def _smaps_dump() -> None:
    time.sleep(float(os.environ.get("PROBE_SMAPS_AT", "60")))
    agg: dict[str, dict[str, int]] = {}
    cur: dict[str, int] | None = None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
                cur = agg.setdefault(parts[5] if len(parts) >= 6 else "[anon]",
                                     {"Rss": 0, "Anonymous": 0})
            elif parts and parts[0] in ("Rss:", "Anonymous:") and cur is not None:
                cur[parts[0][:-1]] += int(parts[1])
    with open(OUT + ".smaps", "w") as fh:
        for n, d in sorted(agg.items(), key=lambda kv: -kv[1]["Rss"])[:25]:
            fh.write(f"{d['Rss'] / 1024:8.1f} {d['Anonymous'] / 1024:8.1f} {n}\n")


def _duck_settings(sql: str) -> None:
    import duckdb

    orig = duckdb.connect

    def connect(*a: Any, **k: Any) -> Any:
        con = orig(*a, **k)
        for stmt in sql.replace("+", " ").split("|"):
            if stmt.strip():
                con.execute(stmt)
        return con

    duckdb.connect = connect  # type: ignore[assignment]


def main() -> None:
    """Start the samplers, then the CLI with this process's arguments."""
    if os.environ.get("PROBE_DUCK"):
        _duck_settings(os.environ["PROBE_DUCK"])
    if os.environ.get("PROBE_LEAN") != "1":
        threading.Thread(target=_sampler, daemon=True).start()
        threading.Thread(target=_smaps_dump, daemon=True).start()
    from toolwatch.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
