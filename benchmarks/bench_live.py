"""Live-mode benchmarks: tail throughput, alert latency, RSS over a long run, Kafka 1 vs 2.

Prints figures; not a test. Each part can be run alone::

    python benchmarks/bench_live.py throughput --events 1000000          # events/s via tail
    python benchmarks/bench_live.py latency --rate 10000 --seconds 30     # p50/p99 line->alert
    python benchmarks/bench_live.py rss --events 5000000                  # RSS samples
    python benchmarks/bench_live.py rss --events 8000000 --log-rate 10000 # at 10k ev/s log time
    python benchmarks/bench_live.py kafka --events 200000                 # 1 vs 2 consumers
    python benchmarks/bench_live.py all                                   # small defaults

Throughput and RSS read a file made by ``sample_logs/generate.py --bench-events`` (mixed
log styles, 0.1% malformed lines), written once into the work directory and reused.
Everything runs on loopback / local files; the Kafka part starts its own Tansu broker.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOOLWATCH_HMAC_KEY", "00" * 32)

if len(sys.argv) > 1 and sys.argv[1] in ("throughput", "latency", "kafka"):
    # These parts run the live pipeline in this process: give it the allocator settings
    # the console entry point gives `toolwatch tail` / `kafka` (before polars loads), so
    # the figures are a user's process's. (rss starts the real entry point.)
    from toolwatch.allocator import tune_memory

    tune_memory([sys.argv[1] if sys.argv[1] == "kafka" else "tail"])

import orjson  # noqa: E402
import psutil  # noqa: E402

from toolwatch.config import Config  # noqa: E402
from toolwatch.live import LiveConfig, SinkConfig  # noqa: E402
from toolwatch.live.sinks import Sink, SinkSet  # noqa: E402
from toolwatch.live_cli import tail_files  # noqa: E402


def _config(data_dir: Path, **live: Any) -> Config:
    cfg = Config()
    cfg.store.data_dir = str(data_dir)
    cfg.live = {"compact_interval_s": 0, **live}
    return cfg


def bench_file(work: Path, events: int) -> Path:
    """The generator's bench file with ``events`` lines (cached in ``work``)."""
    path = work / f"bench-{events}.jsonl"
    if not path.exists():
        from toolwatch.sample_logs.generate import generate_bench

        t = time.perf_counter()
        generate_bench(events, path)
        print(f"  generated {events:,} lines in {time.perf_counter() - t:.1f}s -> {path}")
    return path


class _Rss:
    def __init__(self, every: float = 2.0):
        self.samples: list[tuple[float, float, int]] = []
        self.every = every
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._proc = psutil.Process()
        self.progress: Any = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            done = self.progress() if self.progress else 0
            self.samples.append(
                (time.monotonic() - self._t0, self._proc.memory_info().rss / 2**20, done)
            )

    def __enter__(self) -> _Rss:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *a: object) -> None:
        self._stop.set()


def rate_file(work: Path, events: int, log_rate: int, seed: int = 11) -> Path:
    """``events`` canonical per-call lines at ``log_rate`` events/s of *log* time (cached).

    Written as fast as possible (accelerated log time): tail reads it as a backlog, so an
    hour of traffic at 10k events/s (36M events) is replayed in minutes. Traffic: a pool of
    5,000 concurrent sessions of ~20 calls (geometric), 50,000 returning callers, 8 tools,
    2% of sessions enumerating ids (not_found), 1% paging through a listing.
    """
    import numpy as np
    import polars as pl

    path = work / f"rate-{log_rate}-{events}.jsonl"
    if path.exists():
        return path
    t = time.perf_counter()
    rng = np.random.default_rng(seed)
    tools = np.array(["getDocument", "searchDocuments", "listFiles", "readFile", "getUser",
                      "updateRecord", "sendEmail", "queryDatabase"])
    t0_us = int(datetime(2026, 11, 2, tzinfo=UTC).timestamp() * 1e6)
    pool, chunk, written, next_sid = 5000, 500_000, 0, 0
    sid = np.arange(pool, dtype=np.int64)
    left = rng.geometric(1 / 20, pool)
    kind = rng.choice(3, pool, p=[0.97, 0.02, 0.01])
    next_sid = pool
    with open(path, "wb") as fh:
        while written < events:
            m = min(chunk, events - written)
            slot = rng.integers(0, pool, m)
            # sessions end when their calls run out; a new one takes the slot (vectorized:
            # per chunk, at most one renewal per slot keeps it simple and close enough)
            counts = np.bincount(slot, minlength=pool)
            ended = counts >= left
            n_new = int(ended.sum())
            ids = sid[slot].copy()
            k = kind[slot]
            left -= np.minimum(counts, left)
            sid[ended] = np.arange(next_sid, next_sid + n_new)
            left[ended] = rng.geometric(1 / 20, n_new)
            kind[ended] = rng.choice(3, n_new, p=[0.97, 0.02, 0.01])
            next_sid += n_new
            i = np.arange(written, written + m, dtype=np.int64)
            ts = t0_us + (i * 1_000_000) // log_rate
            caller = (ids * 2654435761) % 50_000
            doc = np.where(k == 1, rng.integers(10**6, 10**7, m), rng.integers(0, 500, m))
            status = np.where(k == 1, np.where(rng.random(m) < 0.7, "not_found", "ok"),
                              np.where(rng.random(m) < 0.97, "ok", "error"))
            tool = np.where(k == 0, tools[rng.integers(0, len(tools), m)],
                            np.where(k == 1, "getDocument", "searchDocuments"))
            df = pl.DataFrame({
                "ts": pl.Series(ts).cast(pl.Datetime("us", "UTC")),
                "_sid": ids, "_caller": caller, "_doc": doc,
                "_page": np.where(k == 2, i % 100_000, 1),
                "server": "docs",
                "tool": tool,
                "status": status,
                "bytes": rng.lognormal(8.3, 1.1, m).astype(np.int64),
                "duration_ms": rng.lognormal(4.0, 0.8, m).astype(np.int64),
            }).select(
                "ts",
                pl.format("s-{}", "_sid").alias("session_id"),
                pl.format("u_{}", "_caller").alias("caller_id"),
                pl.format("10.{}.{}.7", (pl.col("_caller") % 65_000) // 256,
                          pl.col("_caller") % 256).alias("client_ip"),
                "server", "tool",
                pl.struct(documentId=pl.format("doc-{}", "_doc"), page="_page").alias("args"),
                "status", "bytes", "duration_ms",
            )
            df.write_ndjson(fh)
            written += m
    print(f"  generated {events:,} lines at {log_rate:,} events/s of log time "
          f"({events / log_rate / 3600:.2f} h) in {time.perf_counter() - t:.0f}s -> {path}")
    return path


def throughput(work: Path, events: int, detect: bool,
               live: dict[str, Any] | None = None) -> dict[str, Any]:
    """Events/s of ``tail`` over a file already on disk (backlog), store commits included.

    ``live``: ``[live]`` overrides (e.g. the old defaults, to compare in one run).
    """
    src = bench_file(work, events)
    data = work / f"store-tp-{int(detect)}"
    shutil.rmtree(data, ignore_errors=True)
    cfg = _config(data, detect=detect, **(live or {}))
    with _commit_thread_cpu() as cpu:
        t = time.perf_counter()
        lp = tail_files(cfg, [str(src)], idle_exit_s=0.5)
        secs = time.perf_counter() - t - 0.5
    st = lp.status
    res = {
        "events": st.events_stored,
        "lines": st.lines_read,
        "seconds": round(secs, 2),
        "events_per_s": int(st.events_stored / secs),
        "flushes": st.flushes,
        "detect": detect,
        "alerts_new": st.alerts_new,
        "alerts_updated": st.alerts_updated,
        "detect_split_passes": st.extra.get("detect_split_passes", 0),
        "detect_capped": st.extra.get("detect_capped", 0),
        "live": live or {},
        "commit_thread_cpu_s": {k: round(v, 2) for k, v in cpu.items()},
    }
    print(f"  tail throughput (detect={detect}): {res['events_per_s']:,} events/s "
          f"({st.events_stored:,} events in {secs:.1f}s, {st.flushes} flushes, "
          f"{st.alerts_new} alerts)")
    print("  commit thread CPU-s: " + ", ".join(
        f"{k} {v:.2f}" for k, v in res["commit_thread_cpu_s"].items()))
    return res


_COMMIT_THREADS = ("toolwatch-commit", "toolwatch-store")


@contextlib.contextmanager
def _commit_thread_cpu() -> Iterator[dict[str, float]]:
    """CPU seconds of the commit thread (``toolwatch-commit``), whole and by phase.

    Wraps the phases' methods for the duration (thread CPU time, so work polars hands to
    its own pool is not counted): ``total``, ``detect`` (the detection call, window
    included), ``window_add`` (expiry included), ``window_expire``, ``store_write``.
    """
    from toolwatch.detectors import stream as window_mod

    from toolwatch import store as store_mod
    from toolwatch.live import commit as commit_mod
    from toolwatch.live import detection as detection_mod

    acc: dict[str, float] = {"total": 0.0}
    saved: list[tuple[type, str, Any]] = []

    def wrap(cls: type, name: str, key: str) -> None:
        orig = getattr(cls, name)
        acc[key] = 0.0

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                # store_write runs on the store thread, beside the next detection.
                if threading.current_thread().name.startswith(_COMMIT_THREADS):
                    acc[key] += time.thread_time() - t0

        saved.append((cls, name, orig))
        setattr(cls, name, timed)

    wrap(detection_mod.DetectMixin, "_detect", "detect")
    wrap(window_mod.DetectionWindow, "add", "window_add")
    wrap(window_mod.DetectionWindow, "expire", "window_expire")
    wrap(store_mod.Store, "write_batch", "store_write")
    work = commit_mod.CommitMixin._work

    def counted(self: Any) -> None:
        try:
            work(self)
        finally:
            acc["total"] += time.thread_time()

    saved.append((commit_mod.CommitMixin, "_work", work))
    commit_mod.CommitMixin._work = counted  # type: ignore[method-assign]
    try:
        yield acc
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)


class _LatencySink(Sink):
    name = "latency"

    def __init__(self) -> None:
        super().__init__(SinkConfig(type="stdout"))
        self.latencies: list[float] = []
        self.rows = 0

    def submit(self, rows: list[dict[str, Any]]) -> None:
        now = time.time()
        for r in rows:
            last = r["last_seen"]
            if isinstance(last, datetime):
                self.latencies.append(now - last.timestamp())
            self.rows += 1


def latency(work: Path, rate: int, seconds: float,
            live: dict[str, Any] | None = None) -> dict[str, Any]:
    """Line written -> alert emitted, at ``rate`` events/s of mixed traffic with attacks.

    Lines carry the wall-clock time they are written at as their log time; for every alert
    version a sink receives, latency = receive time - the alert's ``last_seen`` (the log
    time, i.e. the write time, of the newest evidence line in it).
    """
    data = work / "store-lat"
    shutil.rmtree(data, ignore_errors=True)
    log = work / "latency.jsonl"
    log.unlink(missing_ok=True)
    log.touch()
    sink = _LatencySink()
    cfg = _config(data, **{"flush_interval_s": 0.5, "poll_interval_s": 0.05, **(live or {})})
    stop_writer = threading.Event()
    written = [0]

    def writer() -> None:
        rng = random.Random(1)
        users = [f"u_{i:05d}" for i in range(3000)]
        sessions: dict[str, str] = {}
        attackers = 0
        tick = 0.05
        per_tick = max(1, int(rate * tick))
        with open(log, "ab") as fh:
            nxt = time.monotonic()
            while not stop_writer.is_set():
                now = datetime.now(UTC)
                ts = now.isoformat().replace("+00:00", "Z")
                lines = []
                for _ in range(per_tick):
                    if rng.random() < 0.02:  # an enumerating agent
                        a = f"attacker-{attackers % 40}"
                        sid = sessions.setdefault(a, f"atk-{a}-{int(time.time())}")
                        d = {"ts": ts, "session_id": sid, "caller_id": a,
                             "client_ip": "203.0.113.9", "server": "docs", "tool": "getDocument",
                             "args": {"documentId": f"doc-{rng.randrange(10**6)}"},
                             "status": "not_found" if rng.random() < 0.7 else "denied",
                             "bytes": 90}
                        attackers += 1
                    else:
                        u = rng.choice(users)
                        sid = sessions.setdefault(u, f"s-{u}-{rng.randrange(10**9)}")
                        if rng.random() < 0.01:
                            sessions.pop(u)
                        d = {"ts": ts, "session_id": sid, "caller_id": u,
                             "client_ip": f"10.1.{rng.randrange(256)}.{rng.randrange(256)}",
                             "server": "docs", "tool": rng.choice(["search", "getDocument"]),
                             "args": {"documentId": f"doc-{rng.randrange(500)}"},
                             "status": "ok", "bytes": rng.randrange(200, 20000)}
                    lines.append(orjson.dumps(d))
                fh.write(b"\n".join(lines) + b"\n")
                fh.flush()
                written[0] += len(lines)
                nxt += tick
                time.sleep(max(0.0, nxt - time.monotonic()))

    w = threading.Thread(target=writer, daemon=True)
    w.start()
    from toolwatch.live import StopFlag

    stop = StopFlag()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    with _Rss(every=1.0) as meter:  # RSS at a sustained real-time rate, not a backlog
        lp = tail_files(cfg, [str(log)], stop=stop, sinks=SinkSet([sink]))
    stop_writer.set()
    w.join(5)
    lat = sorted(sink.latencies)
    if not lat:
        print("  latency: no alert was emitted")
        return {"alerts": 0}

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]

    res = {
        "rate_target": rate,
        "rate_written": int(written[0] / seconds),
        "events_stored": lp.status.events_stored,
        "alert_versions": len(lat),
        "p50_s": round(statistics.median(lat), 3),
        "p99_s": round(pct(0.99), 3),
        "max_s": round(lat[-1], 3),
        "mean_flush_ms": lp.status.last_flush_ms,
        "window_events": lp.status.window_events,
        "rss_max_mib": round(max(mb for _, mb, _ in meter.samples), 1),
        "rss_last_half_min_mib": round(min(mb for _, mb, _ in
                                           meter.samples[len(meter.samples) // 2:]), 1),
        "rss_last_half_max_mib": round(max(mb for _, mb, _ in
                                           meter.samples[len(meter.samples) // 2:]), 1),
    }
    print(f"  alert latency at {res['rate_written']:,} events/s: p50 {res['p50_s']}s, "
          f"p99 {res['p99_s']}s, max {res['max_s']}s over {len(lat)} alert versions")
    print(f"  RSS max {res['rss_max_mib']} MiB; second half of the run "
          f"{res['rss_last_half_min_mib']}–{res['rss_last_half_max_mib']} MiB "
          f"(window {res['window_events']:,} events)")
    return res


def _steady(samples: list[tuple[float, float, int]], events: int) -> dict[str, Any]:
    """Peak, steady-state figures and trend of ``(t, rss_mib, events_done)`` samples.

    Steady state is the second half of the run by events (the window and the allocator
    caches are long warm by then); *flat* means no upward trend there: the least-squares
    slope of RSS against events stored, in MiB per million events.
    """
    half = [mb for _, mb, n in samples if n >= events // 2]
    pts = [(n, mb) for _, mb, n in samples if n >= events // 2]
    trend = None
    if len({n for n, _ in pts}) >= 2:
        mx = statistics.fmean(n for n, _ in pts)
        my = statistics.fmean(mb for _, mb in pts)
        trend = sum((n - mx) * (mb - my) for n, mb in pts) / sum((n - mx) ** 2 for n, _ in pts)
    return {
        "rss_peak_mib": round(max(mb for _, mb, _ in samples), 1) if samples else None,
        "rss_steady_median_mib": round(statistics.median(half), 1) if half else None,
        "rss_steady_p95_mib": round(sorted(half)[int(0.95 * (len(half) - 1))], 1)
        if half else None,
        "rss_steady_max_mib": round(max(half), 1) if half else None,
        "rss_steady_trend_mib_per_m_events": None if trend is None else round(trend * 1e6, 1),
    }


def _print_samples(samples: list[tuple[float, float, int]]) -> None:
    for t_, mb, n in samples[:: max(1, len(samples) // 15)]:
        print(f"    t={t_:7.1f}s  events={n:>11,}  rss={mb:7.1f} MiB")


def _source(work: Path, events: int, log_rate: int | None) -> Path:
    return bench_file(work, events) if log_rate is None else rate_file(work, events, log_rate)


def _realtime_writer(src: Path, dst: Path, rate: int, stop: threading.Event,
                     limit: int | None = None,
                     started: list[float] | None = None) -> threading.Thread:
    """Append ``src``'s lines to ``dst`` at ``rate`` lines/s of wall time (10 writes/s).

    ``limit``: stop after that many lines (``src`` may be longer). ``started``: the wall
    clock (``time.time()``) of the first write is appended to it; line ``i`` is written
    at ``started + (i // (rate // 10)) * (rate // 10) / rate`` while the writer keeps its
    pace.
    """

    def run() -> None:
        step = max(1, rate // 10)
        t0 = time.monotonic()
        if started is not None:
            started.append(time.time())
        sent = 0
        with open(src, "rb") as fin, open(dst, "ab") as fout:
            while not stop.is_set():
                n = step if limit is None else min(step, limit - sent)
                if n <= 0:
                    break
                chunk = b"".join(line for _, line in zip(range(n), fin, strict=False))
                if not chunk:
                    break
                fout.write(chunk)
                fout.flush()
                sent += n
                ahead = t0 + sent / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    th = threading.Thread(target=run, name="realtime-writer", daemon=True)
    th.start()
    return th


def _vm_hwm(pid: int) -> float:
    """The kernel's peak RSS of a process in MiB (``VmHWM``), 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss(work: Path, events: int, log_rate: int | None = None,
        live: dict[str, Any] | None = None, env: dict[str, str] | None = None,
        every: float = 1.0, realtime: int | None = None,
        launcher: list[str] | None = None) -> dict[str, Any]:
    """RSS of a real ``toolwatch tail`` process while it works through ``events`` lines.

    The tail runs as its own process through the console entry point
    (``toolwatch.spool:main``), exactly as a user starts it, so its allocator settings
    and imports are the ones a user gets; this process samples its RSS every ``every``
    seconds and reads its progress from the live status file. The file is read as a
    backlog (accelerated log time): micro-batches are as large as live mode ever makes
    them, so this is the worst case of a sustained rate, not the easy one.

    ``log_rate``: lines at that many events/s of log time (:func:`rate_file`; an hour at
    10k events/s is ``--events 36000000``) instead of the generator's bench file (~50
    events/s of log time). ``live``: ``[live]`` overrides (written to a config file);
    ``env``: extra environment variables for the tail process.

    ``realtime``: instead, a writer appends the lines at that many events/s of *wall*
    time to a file the tail follows from the start (``--realtime 10000 --log-rate
    10000``: sustained real time; flushes are interval-triggered, as in production).

    ``launcher``: run ``launcher + [tail arguments]`` instead of the console entry point
    (e.g. ``python probe.py``, a script that samples the process's allocators from inside).
    """
    src = None
    if realtime and log_rate:
        # The writer stops after ``events`` lines: a longer cached file of the same rate
        # (e.g. the hour's) serves as well and saves writing gigabytes again.
        for f in work.glob(f"rate-{log_rate}-*.jsonl"):
            n = f.stem.rsplit("-", 1)[-1]
            if n.isdigit() and int(n) >= events and (src is None or f.stat().st_size
                                                     < src.stat().st_size):
                src = f
    src = src or _source(work, events, log_rate)
    stop_writer = threading.Event()
    writer = None
    if realtime:
        follow = work / "realtime.jsonl"
        follow.write_bytes(b"")
    data = work / "store-rss"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    cfg_path = work / "rss-config.toml"
    lines = ["[live]"] + [f"{k} = {json.dumps(v)}" for k, v in (live or {}).items()]
    cfg_path.write_text("\n".join(lines) + "\n")
    exe = Path(sys.executable).with_name("toolwatch")
    cmd = [*(launcher or [str(exe)]), "tail", str(follow if realtime else src), "-d",
           str(data), "-c", str(cfg_path), "--no-stdout", "--exit-when-idle", "2"]
    arrivals: list[tuple[float, dict[str, Any]]] = []
    started: list[float] = []
    if realtime:
        # Alert latency of the real process: when each alert version appears in its
        # alerts file, against when the newest line of its evidence was written.
        alerts_path = work / "rss-alerts.jsonl"
        alerts_path.unlink(missing_ok=True)
        cmd += ["--alerts-out", str(alerts_path)]
        watcher = threading.Thread(target=_watch_alerts, args=(alerts_path, arrivals,
                                                               stop_writer), daemon=True)
        watcher.start()
    penv = {**os.environ, **(env or {})}
    samples: list[tuple[float, float, int]] = []
    status: dict[str, Any] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=penv, stdout=subprocess.DEVNULL)
    if realtime:
        writer = _realtime_writer(src, follow, realtime, stop_writer, limit=events,
                                  started=started)
    ps = psutil.Process(proc.pid)
    sdir = data / "_state" / "live"
    hwm = 0.0
    cpu = 0.0
    loads: list[float] = []
    while proc.poll() is None:
        time.sleep(every)
        try:
            mb = ps.memory_info().rss / 2**20
        except psutil.Error:
            break
        hwm = max(hwm, _vm_hwm(proc.pid))
        with contextlib.suppress(psutil.Error):
            ct = ps.cpu_times()
            cpu = ct.user + ct.system
        loads.append(os.getloadavg()[0])
        if mb <= 0:  # the process is exiting (a zombie has no memory)
            continue
        for f in sdir.glob("*.json") if sdir.exists() else []:
            with contextlib.suppress(OSError, ValueError):
                status = json.loads(f.read_text())
        samples.append((time.perf_counter() - t0, mb, int(status.get("events_stored", 0))))
    rc = proc.wait()
    stop_writer.set()
    if writer is not None:
        writer.join()
    if realtime:
        watcher.join(10)
    secs = time.perf_counter() - t0
    for f in sdir.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            status = json.loads(f.read_text())
    stored = int(status.get("events_stored", 0))
    hours = events / log_rate / 3600 if log_rate else None
    print(f"  toolwatch tail (exit {rc}) over {stored:,} events"
          + (f" written in real time at {realtime:,} events/s" if realtime else "")
          + (f" = {hours:.2f} h of log time at {log_rate:,} events/s" if hours else "")
          + f" in {secs:.0f}s ({stored / max(secs, 1e-9):,.0f} ev/s), window "
          f"{status.get('window_events', 0):,} events, evicted "
          f"{status.get('window_evicted', 0):,}, alerts {status.get('alerts_new', 0):,} new / "
          f"{status.get('alerts_updated', 0):,} updated:")
    _print_samples(samples)
    res = {
        "events": stored,
        "log_hours": None if hours is None else round(hours, 2),
        "seconds": round(secs, 1),
        "events_per_s": int(stored / max(secs, 1e-9)),
        "exit_code": rc,
        "realtime_rate": realtime,
        "flushes": status.get("flushes"),
        "alerts_new": status.get("alerts_new"),
        "live": live or {},
        "env": env or {},
        **_steady(samples, events),
        # The kernel's high-water mark (VmHWM, last read before the exit): peaks between
        # two samples included.
        "rss_hwm_mib": round(hwm, 1),
        # CPU seconds of the tail (user + system, last read before its exit): a cost
        # that a loaded host's wall time hides.
        "cpu_s": round(cpu, 1),
        "status_extra": status.get("extra", {}),
        "load_avg_min_median_max": [round(min(loads), 1), round(statistics.median(loads), 1),
                                    round(max(loads), 1)] if loads else None,
        "samples": [(round(a, 1), round(b, 1), c) for a, b, c in samples],
    }
    print(f"  RSS peak {res['rss_peak_mib']} MiB; steady (second half) median "
          f"{res['rss_steady_median_mib']}, p95 {res['rss_steady_p95_mib']}, max "
          f"{res['rss_steady_max_mib']} MiB; trend {res['rss_steady_trend_mib_per_m_events']}"
          f" MiB per million events; VmHWM {res['rss_hwm_mib']} MiB; load average "
          f"(1 min, min/median/max) {res['load_avg_min_median_max']}")
    extra = status.get("extra", {})
    if "compact_merges" in extra:
        print(f"  compaction: {extra['compact_merges']} merges, {extra.get('compact_s')} s in "
              f"all, longest step of one commit {extra.get('compact_max_step_s')} s")
    if realtime and started and log_rate == realtime:
        lat = _alert_latencies(arrivals, started[0], realtime)
        res["alert_latency"] = lat
        if lat:
            print(f"  alert latency (alerts file, real process): p50 {lat['p50_s']}s, p99 "
                  f"{lat['p99_s']}s, max {lat['max_s']}s over {lat['versions']:,} alert "
                  f"versions; share over 2 s {lat['over_2s_share']:.2%}")
    return res


def _watch_alerts(path: Path, out: list[tuple[float, dict[str, Any]]],
                  stop: threading.Event) -> None:
    """Append ``(arrival wall time, alert)`` for each line written to ``path``."""
    buf = b""
    pos = 0
    while not stop.is_set() or buf:
        time.sleep(0.02)
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except OSError:
            if stop.is_set():
                return
            continue
        now = time.time()
        pos += len(chunk)
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                out.append((now, orjson.loads(line)))
        if stop.is_set() and not chunk:
            return


def _alert_latencies(arrivals: list[tuple[float, dict[str, Any]]], started: float,
                     rate: int) -> dict[str, Any]:
    """Latency of each alert version: arrival minus the write time of its ``last_seen``.

    The rate file's line ``i`` has log time ``T0 + i / rate`` (:func:`rate_file`) and was
    written at ``started + (i // step) * step / rate`` (:func:`_realtime_writer`).
    """
    t0 = datetime(2026, 11, 2, tzinfo=UTC).timestamp()
    step = max(1, rate // 10)
    lat = []
    for arrived, a in arrivals:
        seen = a.get("last_seen")
        if not seen:
            continue
        i = round((datetime.fromisoformat(str(seen).replace("Z", "+00:00")).timestamp() - t0)
                  * rate)
        lat.append(arrived - (started + (i // step) * step / rate))
    if not lat:
        return {}
    lat.sort()
    return {"versions": len(lat), "p50_s": round(statistics.median(lat), 3),
            "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3),
            "max_s": round(lat[-1], 3),
            "over_2s_share": sum(x > 2.0 for x in lat) / len(lat)}


#: Import stages of a live process, in the order ``toolwatch tail`` loads them.
IMPORT_STAGES: list[tuple[str, list[str]]] = [
    ("python + console entry (toolwatch.spool)", ["toolwatch.spool"]),
    ("numpy", ["numpy"]),
    ("pyarrow (+ parquet)", ["pyarrow", "pyarrow.parquet"]),
    ("polars", ["polars"]),
    ("duckdb", ["duckdb"]),
    ("cli (typer, rich)", ["toolwatch.cli"]),
    ("store, pipeline, live", ["toolwatch.store", "toolwatch.ingest.pipeline", "toolwatch.live",
                               "toolwatch.live_cli"]),
    ("detectors, analyze", ["toolwatch.detectors", "toolwatch.analyze"]),
    # as the forest imports it (without pandas when pandas is not loaded yet)
    ("scikit-learn (forest fit/load)", ["toolwatch.detectors.forest:_import_sklearn"]),
]

_IMPORT_PROBE = """
import importlib, json, sys
def mem():
    out = {}
    for line in open('/proc/self/smaps_rollup'):
        k, _, v = line.partition(':')
        if k in ('Rss', 'Private_Clean', 'Private_Dirty', 'Shared_Clean', 'Shared_Dirty'):
            out[k] = int(v.split()[0]) / 1024
    return out
stages = json.loads(sys.argv[1])
rows = [['start', mem()]]
for name, mods in stages:
    for m in mods:
        mod, _, fn = m.partition(':')
        obj = importlib.import_module(mod)
        if fn:
            getattr(obj, fn)()
    rows.append([name, mem()])
print(json.dumps(rows))
"""


def import_footprint(env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """RSS (and its private part) after each import stage, in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, json.dumps(IMPORT_STAGES)],
        capture_output=True, text=True, check=True, env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    rows = json.loads(out.stdout)
    res = []
    prev = rows[0][1]
    print("  import footprint (RSS; private = not shared with other processes):")
    for name, m in rows[1:]:
        priv = m["Private_Clean"] + m["Private_Dirty"]
        d = m["Rss"] - prev["Rss"]
        print(f"    {name:42s} +{d:6.1f} MiB -> RSS {m['Rss']:6.1f} MiB (private {priv:6.1f})")
        res.append({"stage": name, "delta_mib": round(d, 1), "rss_mib": round(m["Rss"], 1),
                    "private_mib": round(priv, 1)})
        prev = m
    return res


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _glibc() -> dict[str, float]:
    """glibc malloc: bytes in use and bytes free but kept in its arenas (MiB)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        mi = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {"glibc_used_mib": (mi.uordblks + mi.hblkhd) / 2**20,
            "glibc_free_kept_mib": mi.fordblks / 2**20}


def components(work: Path, events: int, log_rate: int | None = None,
               live: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where a live process's memory is: imports, then the live state during a tail run.

    The tail runs in this process (so its state can be inspected) on the commit thread's
    hook after every commit: the detection window's frames, the baseline history loaded
    from the store, the session activity index, the alert tracker, Arrow's memory pool
    and glibc malloc's heap. RSS minus those is mostly polars' allocator (jemalloc: the
    working memory of parsing and of the last detection pass, plus what it retains) and
    DuckDB's. Run ``rss`` for the figure a user sees.
    """
    import gc

    import pyarrow as pa

    res: dict[str, Any] = {"imports": import_footprint()}
    src = _source(work, events, log_rate)
    data = work / "store-comp"
    shutil.rmtree(data, ignore_errors=True)
    cfg = _config(data, **{"compact_interval_s": 300.0, **(live or {})})
    found: dict[str, Any] = {}
    peaks: dict[str, float] = {}
    proc = psutil.Process()

    def mib(df: Any) -> float:
        return 0.0 if df is None else float(df.estimated_size()) / 2**20

    def on_flush(_res: Any) -> None:
        lp = found.get("lp")
        if lp is None:
            lp = next((o for o in gc.get_objects()
                       if type(o).__name__ == "LivePipeline"), None)
            found["lp"] = lp
        if lp is None:
            return
        w = lp.window
        fig = {
            "rss_mib": proc.memory_info().rss / 2**20,
            "window_events_mib": mib(w.events),
            "window_summaries_mib": mib(w.summaries),
            "session_index_mib": mib(w.session_last),
            "history_base_mib": mib(getattr(lp, "_history_base", None)),
            "arrow_pool_mib": pa.total_allocated_bytes() / 2**20,
            "tracked_alerts": float(len(getattr(lp.tracker, "_seen", {}) or {})),
            **_glibc(),
        }
        for k, v in fig.items():
            peaks[k] = max(peaks.get(k, 0.0), v)

    # The detection pass: RSS sampled every 20 ms while the detectors run, against the RSS
    # just before the pass (its working memory), with the events and history it read.
    from toolwatch.live import default_detector

    inner, _ = default_detector(cfg)
    passes: list[dict[str, float]] = []
    in_pass = threading.Event()
    top = [0.0]

    def sampler() -> None:
        while True:
            time.sleep(0.02)
            if in_pass.is_set():
                top[0] = max(top[0], proc.memory_info().rss / 2**20)

    threading.Thread(target=sampler, daemon=True).start()

    def detector(events: Any, summaries: Any, history: Any = None) -> Any:
        before = proc.memory_info().rss / 2**20
        top[0] = before
        in_pass.set()
        t_ = time.perf_counter()
        try:
            assert inner is not None
            return inner(events, summaries, history=history)
        finally:
            in_pass.clear()
            passes.append({"events": events.height,
                           "history": 0 if history is None else history.height,
                           "rss_before_mib": before, "rss_peak_mib": top[0],
                           "seconds": time.perf_counter() - t_})

    t = time.perf_counter()
    lp = tail_files(cfg, [str(src)], idle_exit_s=0.5, on_flush=on_flush, detector=detector)
    secs = time.perf_counter() - t
    if passes:
        big = max(passes, key=lambda p: p["rss_peak_mib"] - p["rss_before_mib"])
        print(f"  detection: {len(passes)} passes, median "
              f"{statistics.median(p['events'] for p in passes):,.0f} events + "
              f"{statistics.median(p['history'] for p in passes):,.0f} history read, median "
              f"{statistics.median(p['seconds'] for p in passes):.2f}s; working memory (RSS "
              f"peak in the pass - before it) median "
              f"{statistics.median(p['rss_peak_mib'] - p['rss_before_mib'] for p in passes):.0f}"
              f" MiB, largest {big['rss_peak_mib'] - big['rss_before_mib']:.0f} MiB "
              f"({big['events']:,.0f} events + {big['history']:,.0f} history)")
        res["detection_passes"] = passes
    print(f"  live state over {lp.status.events_stored:,} events ({secs:.0f}s, window "
          f"{lp.status.window_events:,} events), peak after a commit:")
    for k, v in peaks.items():
        print(f"    {k:24s} {v:9.1f}")
    res["live_state_peaks"] = {k: round(v, 1) for k, v in peaks.items()}
    return res


def kafka(work: Path, events: int) -> dict[str, Any]:
    """Time for 1 and for 2 consumers (one group, 4 partitions) to store ``events``."""
    from kafka import KafkaProducer

    from tests.kafka_broker import KafkaBroker, create_topic
    from toolwatch.live import StopFlag
    from toolwatch.live_cli import consume_kafka

    src = bench_file(work, events)
    lines = src.read_bytes().splitlines()
    out: dict[str, Any] = {}
    with KafkaBroker() as broker:
        for n_cons in (1, 2):
            topic = f"bench-{n_cons}-{int(time.time())}"
            create_topic(broker.bootstrap, topic, partitions=4)
            prod = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=20,
                                 batch_size=1 << 20)
            for i, line in enumerate(lines):
                prod.send(topic, key=f"caller-{i % 997}".encode(), value=line)
            prod.flush(timeout=120)
            prod.close()
            data = work / f"store-kafka-{n_cons}"
            shutil.rmtree(data, ignore_errors=True)
            cfg = _config(data)
            opts = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500,
                    "max_poll_interval_ms": 60_000}
            stops = [StopFlag() for _ in range(n_cons)]
            done: list[Any] = []

            def member(stop: StopFlag, topic: str = topic, cfg: Config = cfg,
                       done: list[Any] = done, opts: dict[str, Any] = opts) -> None:
                done.append(consume_kafka(cfg, bootstrap_servers=broker.bootstrap,
                                          topics=[topic], group_id=f"g-{topic}",
                                          consumer_options=opts, stop=stop,
                                          live=LiveConfig.from_config(cfg)))

            t = time.perf_counter()
            threads = [threading.Thread(target=member, args=(s,)) for s in stops]
            for th in threads:
                th.start()
            from toolwatch.store import Store

            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                time.sleep(1.0)
                cps = Store(data).checkpoints()
                if sum(v for k, v in cps.items() if k.startswith(f"kafka:{topic}:")) >= len(lines):
                    break
            secs = time.perf_counter() - t
            for s in stops:
                s.set()
            for th in threads:
                th.join(60)
            stored = sum(lp.status.events_stored for lp in done)
            out[f"{n_cons}_consumer"] = {"seconds": round(secs, 1),
                                         "events_per_s": int(stored / secs), "events": stored}
            print(f"  kafka, {n_cons} consumer(s) in one group (threads of one process): "
                  f"{stored:,} events in {secs:.1f}s = {stored / secs:,.0f} events/s")
    return out


def _overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=JSON`` pairs of ``--live``."""
    return {k: json.loads(v) for k, v in (x.split("=", 1) for x in items)}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part",
                   choices=["throughput", "latency", "rss", "components", "kafka", "all"])
    p.add_argument("--events", type=int, default=None, help="events for throughput/rss/kafka")
    p.add_argument("--rate", type=int, default=10_000, help="latency: events/s written")
    p.add_argument("--seconds", type=float, default=30.0, help="latency: run length")
    p.add_argument("--log-rate", type=int, default=None,
                   help="rss: lines at this many events/s of log time (accelerated replay)")
    p.add_argument("--live", action="append", default=[], metavar="KEY=VALUE",
                   help="throughput/rss/latency: a [live] setting, e.g. --live flush_events=100000")
    p.add_argument("--realtime", type=int, default=None, metavar="EVENTS_PER_S",
                   help="rss: write the lines at this many events/s of wall time while the "
                        "tail follows the file (sustained real time, not a backlog)")
    p.add_argument("--hours", type=float, default=None,
                   help="rss/components: hours of log time at --log-rate (sets --events)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="rss: an environment variable for the tail process")
    p.add_argument("--launcher", default=None,
                   help="rss: command (split on spaces) run instead of the toolwatch "
                        "entry point, given the tail arguments, e.g. 'python probe.py'")
    p.add_argument("--no-detect", action="store_true", help="throughput without detection")
    p.add_argument("--work", default=None, help="work directory (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = p.parse_args(argv)
    if a.hours is not None:
        a.log_rate = a.log_rate or 10_000
        a.events = int(a.hours * 3600 * a.log_rate)
    work = Path(a.work or tempfile.mkdtemp(prefix="tw-bench-live-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}  (cores: {os.cpu_count()})")
    res: dict[str, Any] = {}
    if a.part in ("throughput", "all"):
        n = a.events or 1_000_000
        res["throughput"] = throughput(work, n, detect=not a.no_detect,
                                       live=_overrides(a.live))
        if a.part == "all":
            res["throughput_no_detect"] = throughput(work, n, detect=False)
    if a.part in ("latency", "all"):
        res["latency"] = latency(work, a.rate, a.seconds, _overrides(a.live))
    if a.part in ("rss", "all"):
        env = dict(x.split("=", 1) for x in a.env)
        res["rss"] = rss(work, a.events or 1_000_000, a.log_rate, _overrides(a.live), env,
                         realtime=a.realtime,
                         launcher=a.launcher.split() if a.launcher else None)
    if a.part in ("components", "all"):
        res["components"] = components(work, a.events or 1_000_000, a.log_rate,
                                       _overrides(a.live))
    if a.part in ("kafka", "all"):
        res["kafka"] = kafka(work, a.events or 200_000)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
