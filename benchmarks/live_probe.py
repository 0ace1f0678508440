"""Run ``toolwatch tail ...`` in this process with a sampler that attributes its memory.

Used as ``benchmarks/bench_live.py rss --launcher "python benchmarks/live_probe.py"``: every
2 s one JSON line to ``$PROBE_OUT`` (default ``/tmp/live_probe.jsonl``) with RSS and its
anonymous part (``/proc/self/smaps_rollup``), glibc malloc in use / free but kept
(``mallinfo2``), Arrow's pool, DuckDB's ``duckdb_memory()`` of the parse connections, the
window's size and the commit queue; at ``$PROBE_SMAPS_AT`` seconds (60) the 25 largest
mappings to ``$PROBE_OUT.smaps``. ``PROBE_DUCK="SET+x=1|SET+y=2"`` runs those statements
on every DuckDB connection; ``PROBE_LEAN=1`` samples nothing. ``PROBE_OFF=duck,expire``
turns levers off for A/B runs in one tree: ``duck`` = DuckDB's jemalloc left at its
defaults (no ``spool.tune_duckdb_allocator``), ``expire`` = the window expiry that copied
all strings at once (before session 4). ``PROBE_SELECT_NEWEST=N``: the window's
``select`` cuts to the newest N touched events before sorting (what the detection asks
for once it passes ``newest``; for an A/B before that hook). Not a test.

Peak attribution (``PROBE_PHASES=1``, the default): the live pipeline's phases (parse =
``_transform_pending``, detect, each detection pass with its event and history sizes,
history, window add/expire, store write, compaction merge) are wrapped to mark which are
running; a fast sampler reads RSS every 0.1 s, and at exit ``$PROBE_OUT.phases`` gets, per
phase, how often it ran and the highest RSS and rise seen while it ran, the 15 highest
samples with the phases running then, and ``/proc/self/smaps`` by mapping (file pages vs
anonymous) plus glibc/Arrow figures taken at the highest RSS seen after 20 s
(``$PROBE_PEAK_AFTER``); each top sample also carries the anonymous RSS at that moment
(``/proc/self/smaps_rollup``). ``win_select`` marks the window's selection of touched
events. The memory gate's own counters are in the live status (``memory_gate_*``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import threading
import time
from typing import Any

from toolwatch.allocator import tune_memory

sys.argv = ["toolwatch", *sys.argv[1:]]
_OFF = set(filter(None, os.environ.get("PROBE_OFF", "").split(",")))
if "duck" in _OFF:
    import toolwatch.allocator as _spool

    _spool.tune_duckdb_allocator = lambda *a, **k: False  # type: ignore[assignment]
tune_memory(sys.argv[1:])  # before polars/pyarrow load, as the console entry point does
OUT = os.environ.get("PROBE_OUT", "/tmp/live_probe.jsonl")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _MallInfo2


def _duck_je() -> Any:
    """DuckDB's own jemalloc (``duckdb_je_mallctl``), or None."""
    import glob

    try:
        import duckdb

        base = os.path.dirname(os.path.dirname(duckdb.__file__))
        lib = ctypes.CDLL(glob.glob(os.path.join(base, "_duckdb*.so"))[0])
        fn = lib.duckdb_je_mallctl
    except (ImportError, OSError, IndexError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_void_p, ctypes.c_size_t]
    return fn


def duck_je_stats() -> dict[str, float]:
    """Allocated and resident MiB of DuckDB's jemalloc (empty when unavailable)."""
    fn = _duck_je()
    if fn is None:
        return {}
    e = ctypes.c_uint64(1)
    sz = ctypes.c_size_t(8)
    fn(b"epoch", ctypes.byref(e), ctypes.byref(sz), ctypes.byref(e), 8)
    out = {}
    for k in ("allocated", "resident"):
        v = ctypes.c_size_t()
        sz = ctypes.c_size_t(ctypes.sizeof(v))
        if fn(f"stats.{k}".encode(), ctypes.byref(v), ctypes.byref(sz), None, 0) == 0:
            out["duckje_" + k] = round(v.value / 2**20, 1)
    return out


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
    d.update(duck_je_stats())
    d["py_blocks_k"] = sys.getallocatedblocks() // 1000
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


_PAGE = os.sysconf("SC_PAGE_SIZE")
_ACTIVE: dict[str, int] = {}
_LOCK = threading.Lock()
_PHASES: dict[str, dict[str, float]] = {}
_TOP: list[tuple[float, float, str]] = []
_PEAK: dict[str, Any] = {"rss": 0.0}


#: Seconds after start before the attribution at the highest RSS is taken (imports and
#: the first fill of the window come first).
_PEAK_AFTER = float(os.environ.get("PROBE_PEAK_AFTER", "20"))


def _anon_now() -> float:
    """Anonymous MiB of this process now (``/proc/self/smaps_rollup``)."""
    with open("/proc/self/smaps_rollup") as fh:
        for line in fh:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rss_now() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE / 2**20


def _smaps_by_kind() -> dict[str, Any]:
    """RSS at this moment by mapping: anonymous vs file-backed, and the largest files."""
    files: dict[str, float] = {}
    anon = 0.0
    name = "[anon]"
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
                name = parts[5] if len(parts) >= 6 else "[anon]"
            elif parts and parts[0] == "Rss:":
                kb = int(parts[1]) / 1024
                if name.startswith("/"):
                    files[name] = files.get(name, 0.0) + kb
                else:
                    anon += kb
    mi = _LIBC.mallinfo2()
    pa = sys.modules.get("pyarrow")
    return {
        "anon_mib": round(anon, 1),
        "file_mib": round(sum(files.values()), 1),
        "top_files": [(os.path.basename(k), round(v, 1))
                      for k, v in sorted(files.items(), key=lambda kv: -kv[1])[:8]],
        "glibc_used": round((mi.uordblks + mi.hblkhd) / 2**20, 1),
        "glibc_free": round(mi.fordblks / 2**20, 1),
        "arrow": None if pa is None else round(pa.total_allocated_bytes() / 2**20, 1),
        **duck_je_stats(),
    }


_RUNNING: dict[tuple[str, int], list[float]] = {}  # (label, thread) -> [start, max] RSS


def _phase(name: str, fn: Any, size: Any = None) -> Any:
    """``fn`` wrapped to mark phase ``name`` running (and its RSS rise) while it runs."""

    def wrapped(*a: Any, **k: Any) -> Any:
        label = name
        if size is not None:
            with contextlib.suppress(Exception):
                label = f"{name}:{size(a, k)}"
        key = (label, threading.get_ident())
        start = _rss_now()
        with _LOCK:
            _ACTIVE[label] = _ACTIVE.get(label, 0) + 1
            _RUNNING[key] = [start, start]
        t = time.monotonic()
        try:
            return fn(*a, **k)
        finally:
            end = _rss_now()
            with _LOCK:
                _ACTIVE[label] -= 1
                if not _ACTIVE[label]:
                    del _ACTIVE[label]
                st = _PHASES.setdefault(
                    label, {"n": 0, "max_rss": 0.0, "max_rise": 0.0, "s": 0.0})
                lo, hi = _RUNNING.pop(key, [start, start])
                hi = max(hi, end)
                st["n"] += 1
                st["s"] += time.monotonic() - t
                st["max_rss"] = max(st["max_rss"], hi)
                st["max_rise"] = max(st["max_rise"], hi - lo)

    return wrapped


def _fast_sampler() -> None:
    t0 = time.monotonic()
    while True:
        time.sleep(0.1)
        rss = _rss_now()
        with _LOCK:
            act = ",".join(sorted(_ACTIVE))
            for v in _RUNNING.values():
                v[1] = max(v[1], rss)
        t = time.monotonic() - t0
        anon = _anon_now() if rss > _PEAK.get("top_floor", 0.0) else 0.0
        _TOP.append((rss, round(t, 1), f"anon={anon:.0f} {act}"))
        if len(_TOP) > 400:
            _TOP.sort(reverse=True)
            del _TOP[30:]
            _PEAK["top_floor"] = _TOP[-1][0]
        if t > _PEAK_AFTER and rss > _PEAK["rss"] + 2:
            with contextlib.suppress(Exception):
                _PEAK.update(rss=rss, t=round(t, 1), active=act, **_smaps_by_kind())


def _write_phases() -> None:
    with contextlib.suppress(Exception), open(OUT + ".phases", "w") as fh:
        fh.write(f"HWM {_hwm()} MiB\n")
        fh.write(json.dumps({k: v for k, v in _PEAK.items()}) + "\n")
        for label, st in sorted(_PHASES.items(), key=lambda kv: -kv[1]["max_rss"]):
            fh.write(f"{label:28s} n={int(st['n']):6d} s={st['s']:8.1f} "
                     f"max_rss={st['max_rss']:7.1f} max_rise={st['max_rise']:7.1f}\n")
        for rss, t, act in sorted(_TOP, reverse=True)[:15]:
            fh.write(f"top {rss:7.1f} t={t:7.1f} {act}\n")


def _hwm() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _install_phases() -> None:
    import atexit

    from toolwatch.detectors import stream as window

    from toolwatch.live import detection, pipeline
    from toolwatch.store import Store

    LP = pipeline.LivePipeline
    LP._transform_pending = _phase("parse", LP._transform_pending)
    LP._detect = _phase("detect", LP._detect,
                        lambda a, k: "defer" if k.get("defer") else
                        ("backlog" if k.get("backlog") else "rt"))
    LP._history = _phase("history", LP._history)
    window.DetectionWindow.add = _phase("win_add", window.DetectionWindow.add)
    window.DetectionWindow.expire = _phase("win_expire", window.DetectionWindow.expire)
    Store.write_batch = _phase("write", Store.write_batch)
    window.DetectionWindow.select = _phase("win_select", window.DetectionWindow.select)
    Store._merge = _phase("compact", Store._merge)
    orig_dd = detection.default_detector

    def default_detector(config: Any) -> Any:
        fn, ret = orig_dd(config)
        if fn is None:
            return fn, ret

        def bucket(a: Any, k: Any) -> str:
            h = k.get("history")
            return f"{a[0].height // 10_000 * 10}k+h{0 if h is None else h.height // 1000}k"

        w = _phase("pass", fn, bucket)
        w.child_stats = fn.child_stats  # type: ignore[attr-defined]
        return w, ret

    detection.default_detector = default_detector
    pipeline.default_detector = default_detector
    atexit.register(_write_phases)


def _old_expire(self: Any) -> None:
    """``DetectionWindow.expire`` before session 4: all strings copied at once."""
    import polars as pl
    from toolwatch.detectors.stream import _own_strings

    self._since_expire = 0
    if self.events is None or self.newest_us is None:
        return
    wm = self.newest_us - self.tolerance_us
    idle_cut = wm - self.idle_us
    old_cut = wm - self.window_us
    self.session_last = self.session_last.filter(pl.col("t") >= idle_cut)
    active = self.session_last["session_id"].implode()
    before = self.events.height
    keep = (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(active)
    ev = self.events.filter(keep)
    if ev.height > self.max_events:
        cut = ev["ts"].top_k(self.max_events).min()
        ev = ev.filter(pl.col("ts") >= cut)
        if ev.height > self.max_events:
            ev = ev.tail(self.max_events)
    self.evicted += before - ev.height
    self.events = _own_strings(ev).rechunk()
    if self.summaries is not None:
        self.summaries = _own_strings(self.summaries.filter(
            (pl.col("ts").dt.epoch("us") >= old_cut) | pl.col("session_id").is_in(active)
        )).rechunk()


def main() -> None:
    """Start the samplers, then the CLI with this process's arguments."""
    from toolwatch.detectors.stream import DetectionWindow

    if "expire" in _OFF:
        DetectionWindow.expire = _old_expire  # type: ignore[method-assign]
    if os.environ.get("PROBE_SELECT_NEWEST"):
        newest = int(os.environ["PROBE_SELECT_NEWEST"])
        select = DetectionWindow.select

        def select_newest(self: Any, touched: Any, newest_: Any = None) -> Any:
            return select(self, touched, newest_ if newest_ is not None else newest)

        DetectionWindow.select = select_newest  # type: ignore[method-assign]
    if os.environ.get("PROBE_PHASES", "1") == "1":
        _install_phases()
        threading.Thread(target=_fast_sampler, daemon=True).start()
    if os.environ.get("PROBE_DUCK"):
        _duck_settings(os.environ["PROBE_DUCK"])
    if os.environ.get("PROBE_LEAN") != "1":
        threading.Thread(target=_sampler, daemon=True).start()
        threading.Thread(target=_smaps_dump, daemon=True).start()
    from toolwatch.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
