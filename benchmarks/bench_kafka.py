"""Where the time of `toolwatch kafka` goes, measured in one run against one broker.

Prints figures; not a test. One Tansu broker on loopback, one topic (``--partitions``,
``--events`` messages of the generator's bench file, key = caller id), then the same
topic is read, each time by a fresh consumer group, by:

    a   a bare kafka-python consumer loop that only counts bytes
    a-fast  (a) with toolwatch's record-batch decoder (install_fast_records(chunks=True):
            one RecordChunk per record batch, no object per message)
    b   a-fast plus toolwatch's parse/normalize (Pipeline.transform on the same Arrow batches
        `toolwatch kafka` builds, flush_events lines at a time; no store, no detection)
    c   `toolwatch kafka` (consume_kafka) without detection
    d   `toolwatch kafka` with detection
    c-ahead, d-ahead  c, d with the transform on a thread of its own while the next polls
        are decoded (``KafkaSource.transform_ahead``, off by default)
    c-t2, d-t2  c, d with the parsers' DuckDB connections at 2 threads (one statement
        split over both cores; the default is 1 per parser): not a setting, measured here
    tail    `toolwatch tail` (with detection) of the same events written to a file
    tail-nd `toolwatch tail` without detection

toolwatch's modes (c, d and their variants, tail, tail-nd) each run in a child process,
as a consumer would, and print its peak RSS; ``--inproc`` runs them in this process.
Rates count from the first message received (the ~2 s group join is excluded and
printed apart) to the store commit that covers the last message (a/b: the last
message read). Usage::

    python benchmarks/bench_kafka.py                      # 200k events, 4 partitions
    python benchmarks/bench_kafka.py --events 500000 --partitions 8 --modes a,c,d,tail
    python benchmarks/bench_kafka.py --compression lz4     # producer compression
    python benchmarks/bench_kafka.py scale --events 200000  # 1/2/4 processes, 4/8 parts
    python benchmarks/bench_kafka.py rss --rate 10000 --seconds 900  # sustained, real time
    git worktree add /tmp/base HEAD~1
    python benchmarks/bench_kafka.py --modes c,d,tail --old /tmp/base --repeat 2

``--old TREE`` also runs modes c, d, tail and tail-nd with another checkout's code (shown
as ``d@old`` ...), interleaved with this tree's on the same broker and topic; both trees'
runs are then child processes, so an A/B is measured in one run under the same conditions.

The ``scale`` part runs N separate ``toolwatch kafka`` processes (one group, one store)
and checks that every message is stored exactly once, also when a member joins
mid-load and one is killed with -9.

The ``rss`` part is the consumer beside a production fleet: a producer thread sends
``--rate`` messages per second of wall time for ``--seconds`` (lines at that rate of log
time, keyed by their caller id), while one real ``toolwatch kafka`` process, started
through the console entry point with detection and the default settings, consumes them.
It prints the consumer's RSS (1 s samples, kernel high-water mark), its lag and that
every message was stored once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# --old's child imports the other checkout's toolwatch (PYTHONPATH overlay): this tree's
# folder goes last there, or its toolwatch/ would shadow the overlay's.
sys.path.insert(len(sys.path) if "--child" in sys.argv else 0, str(ROOT))
sys.path.insert(1, str(ROOT / "benchmarks"))
os.environ.setdefault("TOOLWATCH_HMAC_KEY", "00" * 32)

if "--child" in sys.argv:
    # A toolwatch mode's process gets the allocator settings the console entry point
    # gives `toolwatch kafka` / `tail` (before polars and pyarrow load), so its RSS is a
    # consumer's.
    try:
        from toolwatch.allocator import tune_memory
    except ImportError:  # an --old tree from before the settings
        pass
    else:
        tune_memory(["kafka"])

from toolwatch.config import Config  # noqa: E402

GROUP_OPTS = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500,
              "max_poll_interval_ms": 120_000}


#: ``--live KEY=VALUE`` settings, applied to every toolwatch mode (children included).
LIVE_OVERRIDES: dict[str, Any] = {}
#: ``--consumer KEY=VALUE`` kafka-python settings for `toolwatch kafka` (c, d and variants).
CONSUMER_OVERRIDES: dict[str, Any] = {}


def _config(data_dir: Path, **live: Any) -> Config:
    cfg = Config()
    cfg.store.data_dir = str(data_dir)
    cfg.live = {"compact_interval_s": 0, **live, **LIVE_OVERRIDES}
    return cfg


def bench_lines(work: Path, events: int) -> tuple[Path, list[bytes]]:
    """The generator's bench file (cached) and its lines without newlines."""
    path = work / f"bench-{events}.jsonl"
    if not path.exists():
        from toolwatch.sample_logs.generate import generate_bench

        t = time.perf_counter()
        generate_bench(events, path)
        print(f"  generated {events:,} lines in {time.perf_counter() - t:.1f}s -> {path}")
    return path, path.read_bytes().splitlines()


def produce(bootstrap: str, topic: str, lines: list[bytes], compression: str | None,
            callers: int = 997) -> float:
    """Send every line keyed by a caller id; returns seconds."""
    from kafka import KafkaProducer

    t = time.perf_counter()
    prod = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20,
                         compression_type=compression, max_request_size=8 << 20)
    keys = [f"caller-{i}".encode() for i in range(callers)]
    for i, line in enumerate(lines):
        prod.send(topic, key=keys[i % callers], value=line)
    prod.flush(timeout=600)
    prod.close()
    return time.perf_counter() - t


# --------------------------------------------------------------------------- a, b
def bare(bootstrap: str, topic: str, total: int, *, transform: bool,
         fast: bool = False) -> dict[str, Any]:
    """(a) count bytes only; (b) also build the Arrow batches and run the transform.

    ``fast``: with toolwatch's lean record decoder installed (a-fast).
    """
    from kafka import KafkaConsumer
    from toolwatch.ingest.pipeline import Pipeline
    from toolwatch.ingest.sources.kafka import (
        consumer_settings,
        message_batch,
        message_count,
    )
    from toolwatch.ingest.sources.kafka_records import install_fast_records

    from toolwatch.live import LiveConfig, merge_batches

    group = f"bare-{'t' if transform else 'n'}-{time.time_ns()}"
    opts = consumer_settings(bootstrap, group)
    opts.update(GROUP_OPTS)
    c = KafkaConsumer(**opts)
    if fast:
        assert install_fast_records(c, chunks=True)
    c.subscribe([topic])
    cfg = _config(Path(tempfile.gettempdir()) / "unused")
    pipe = Pipeline(cfg, None) if transform else None
    flush_events = LiveConfig().flush_events
    pending: dict[Any, list[Any]] = {}
    pend_n = 0
    n = nbytes = events = 0
    t_sub = time.perf_counter()
    t_first: float | None = None

    def run_transform() -> int:
        assert pipe is not None
        out = 0
        for _tp, bl in pending.items():
            out += pipe.transform(merge_batches(bl)).events.num_rows
        pending.clear()
        return out

    try:
        while n < total:
            recs = c.poll(timeout_ms=500)
            if recs and t_first is None:
                t_first = time.perf_counter()
            for tp, msgs in recs.items():
                got = message_count(msgs)
                n += got
                if pipe is None and fast:
                    nbytes += sum(len(m.value.data) for m in msgs)  # RecordChunks
                elif pipe is None:
                    nbytes += sum(len(m.value) for m in msgs)
                else:
                    b = message_batch(tp, msgs, 0)
                    nbytes += b.lines.nbytes
                    pending.setdefault(tp, []).append(b)
                    pend_n += got
            if pipe is not None and (pend_n >= flush_events or n >= total):
                events += run_transform()
                pend_n = 0
            if time.perf_counter() - t_sub > 900:
                raise TimeoutError(f"read {n} of {total}")
        t_end = time.perf_counter()
    finally:
        c.close()
    assert t_first is not None
    return {"messages": n, "events": events if transform else n, "bytes": nbytes,
            "seconds": t_end - t_first, "join_s": t_first - t_sub}



# --------------------------------------------------------------------------- details
def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by name (Linux /proc; else {}).

    Python threads are named by ``threading`` (``toolwatch-commit``, kafka-python's IO
    thread as ``kafka-io``); native ones (DuckDB, polars, Arrow pools) by their kernel
    ``comm``, so the threads of one pool add up under one name.
    """
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:  # the thread ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid)) or f"native:{comm.rstrip('0123456789-_ ')}"
        if name.startswith("kafka-io-"):  # kafka-python's IO thread (named after the client)
            name = "kafka-io"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def live_details(lp: Any, at_end: dict[str, float] | None,
                 at_start: dict[str, float]) -> dict[str, Any]:
    """What a toolwatch mode did besides its rate: flushes, detections, gate, threads.

    ``at_start``/``at_end``: :func:`thread_cpu` before the run and at the store commit
    that covered the last message (the threads' CPU in between).
    """
    st = lp.status
    ex = st.extra
    keep = ("detect_runs", "detect_events", "memory_gate_waits", "memory_gate_wait_s",
            "memory_gate_overlaps", "memory_gate_wait_s_by_phase", "memory_gate_releases",
            "memory_gate_release_s")
    out: dict[str, Any] = {"flushes": st.flushes, "alerts_new": st.alerts_new,
                           "alerts_updated": st.alerts_updated,
                           **{k: ex[k] for k in keep if k in ex}}
    if st.flushes:
        out["events_per_flush"] = round(st.events_stored / st.flushes)
    if at_end:
        cpu = {k: v - at_start.get(k, 0.0) for k, v in at_end.items()}
        out["thread_cpu_s"] = {k: round(v, 2) for k, v in
                               sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.01}
    return out

# --------------------------------------------------------------------------- c, d
def toolwatch_kafka(bootstrap: str, topic: str, total: int, work: Path, *,
                    detect: bool, ahead: bool | None = None,
                    parse_threads: int | None = None) -> dict[str, Any]:
    """`toolwatch kafka` (the CLI's loop, in-process) until the store covers ``total``.

    ``ahead``: set ``KafkaSource.transform_ahead`` for this run (None: the default).
    ``parse_threads``: DuckDB threads of every parser's connection (None: as built).
    """
    from toolwatch.ingest.parse import ParserPool
    from toolwatch.ingest.sources.kafka import KafkaSource

    default_ahead = getattr(KafkaSource, "transform_ahead", False)
    if ahead is not None:
        KafkaSource.transform_ahead = ahead  # type: ignore[attr-defined]
    init = ParserPool.__init__
    if parse_threads is not None:
        def threaded_init(self: Any, *args: Any, **kw: Any) -> None:
            init(self, *args, **kw)
            for p in self._parsers:
                p._con.execute(f"SET threads = {int(parse_threads)}")

        ParserPool.__init__ = threaded_init  # type: ignore[method-assign]
    try:
        return _toolwatch_kafka(bootstrap, topic, total, work, detect=detect)
    finally:
        KafkaSource.transform_ahead = default_ahead  # type: ignore[attr-defined]
        ParserPool.__init__ = init  # type: ignore[method-assign]


def _toolwatch_kafka(bootstrap: str, topic: str, total: int, work: Path, *,
                     detect: bool) -> dict[str, Any]:
    from toolwatch.live import LiveConfig, StopFlag
    from toolwatch.live_cli import consume_kafka

    data = work / f"store-kafka-{'d' if detect else 'nd'}"
    shutil.rmtree(data, ignore_errors=True)
    cfg = _config(data, detect=detect)
    stop = StopFlag()
    covered: dict[str, int] = {}
    box: dict[str, Any] = {}

    def on_flush(res: Any) -> None:
        for cp in res.checkpoints:
            covered[cp.source_fp] = max(covered.get(cp.source_fp, 0), cp.end_offset)
        if sum(covered.values()) >= total and "t_end" not in box:
            box["t_end"] = time.perf_counter()
            box["threads"] = thread_cpu()
            stop.set()

    cpu0 = thread_cpu()
    t_sub = time.perf_counter()
    lp = consume_kafka(cfg, bootstrap_servers=bootstrap, topics=[topic],
                       group_id=f"tw-{time.time_ns()}",
                       consumer_options={**GROUP_OPTS, **CONSUMER_OVERRIDES},
                       stop=stop, sinks=None, live=LiveConfig.from_config(cfg),
                       max_seconds=900, on_flush=on_flush,
                       on_start=lambda src: box.__setitem__("src", src))
    src = box["src"]
    t_first = src.first_message_at_perf
    t_end = box.get("t_end", time.perf_counter())
    st = lp.status
    return {"messages": src.counters.processed, "events": st.events_stored,
            "alerts": st.alerts_new if hasattr(st, "alerts_new") else None,
            "seconds": t_end - t_first, "join_s": t_first - t_sub,
            "kafka": src.counters.as_dict(), **live_details(lp, box.get("threads"), cpu0)}


# --------------------------------------------------------------------------- tail
def tail(path: Path, work: Path, *, detect: bool) -> dict[str, Any]:
    """`toolwatch tail` of the same events in a file, until the store covers it."""
    from toolwatch.live import LiveConfig, StopFlag
    from toolwatch.live_cli import tail_files

    data = work / f"store-tail-{'d' if detect else 'nd'}"
    shutil.rmtree(data, ignore_errors=True)
    cfg = _config(data, detect=detect)
    size = path.stat().st_size
    stop = StopFlag()
    box: dict[str, Any] = {}

    def on_flush(res: Any) -> None:
        if any(cp.end_offset >= size for cp in res.checkpoints) and "t_end" not in box:
            box["t_end"] = time.perf_counter()
            box["threads"] = thread_cpu()
            stop.set()

    cpu0 = thread_cpu()
    t0 = time.perf_counter()
    lp = tail_files(cfg, [str(path)], stop=stop, live=LiveConfig.from_config(cfg),
                    max_seconds=900, on_flush=on_flush)
    t_end = box.get("t_end", time.perf_counter())
    return {"events": lp.status.events_stored, "seconds": t_end - t0, "join_s": 0.0,
            **live_details(lp, box.get("threads"), cpu0)}


# --------------------------------------------------------------------------- main
def one_run(a: argparse.Namespace) -> dict[str, Any]:
    from tests.kafka_broker import KafkaBroker, create_topic

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    path, lines = bench_lines(work, a.events)
    total = len(lines)
    modes = a.modes.split(",")
    if a.old:
        modes = [x for m in modes for x in ([m, f"{m}@old"] if m in OLD_MODES else [m])]
    res: dict[str, Any] = {"events": total, "partitions": a.partitions,
                           "compression": a.compression or "none",
                           "load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    # Detectors are imported once up front so no mode pays scikit-learn's import.
    import toolwatch.detectors.pipeline  # noqa: F401

    runs: dict[str, list[dict[str, Any]]] = {}

    with KafkaBroker() as broker:
        topic = f"bench-{time.time_ns()}"
        create_topic(broker.bootstrap, topic, partitions=a.partitions)
        secs = produce(broker.bootstrap, topic, lines, a.compression)
        res["produce_msgs_per_s"] = int(total / secs)
        print(f"  produced {total:,} messages ({path.stat().st_size / 2**20:.0f} MiB) to "
              f"{a.partitions} partitions in {secs:.1f}s ({total / secs:,.0f} msg/s)")
        import psutil

        bproc = psutil.Process(broker.pid)
        for m in [m for _ in range(a.repeat) for m in modes]:
            t = time.perf_counter()
            cpu0 = time.process_time()
            bcpu0 = sum(bproc.cpu_times()[:2])
            child_cpu = None
            if m.endswith("@old") or (m in CHILD_MODES and (a.old or not a.inproc)):
                # toolwatch's modes run in a child process of their own, as a consumer
                # does: its RSS is its own (this process holds the produced lines, ~0.3
                # KB each, which pushed the in-process runs over live.memory_gate_mib
                # and made them take turns), and --old compares both trees alike.
                r = run_old(a.old if m.endswith("@old") else None, m.removesuffix("@old"),
                            broker.bootstrap, topic, total, path, work)
                child_cpu = r.pop("cpu_s")
            elif m == "a":
                r = bare(broker.bootstrap, topic, total, transform=False)
            elif m == "a-fast":
                r = bare(broker.bootstrap, topic, total, transform=False, fast=True)
            elif m == "b":
                r = bare(broker.bootstrap, topic, total, transform=True, fast=True)
            elif m == "c":
                r = toolwatch_kafka(broker.bootstrap, topic, total, work, detect=False)
            elif m == "d":
                r = toolwatch_kafka(broker.bootstrap, topic, total, work, detect=True)
            elif m in ("c-t2", "d-t2"):
                r = toolwatch_kafka(broker.bootstrap, topic, total, work,
                                    detect=m == "d-t2", parse_threads=2)
            elif m in ("c-ahead", "d-ahead"):
                r = toolwatch_kafka(broker.bootstrap, topic, total, work,
                                    detect=m == "d-ahead", ahead=True)
            elif m == "tail":
                r = tail(path, work, detect=True)
            elif m == "tail-nd":
                r = tail(path, work, detect=False)
            else:
                raise SystemExit(f"unknown mode {m}")
            r["events_per_s"] = int(total / r["seconds"])
            r["wall_s"] = round(time.perf_counter() - t, 1)
            # CPU per message, less sensitive than wall time to a busy machine: this
            # process (all threads: poll, kafka IO, commit, DuckDB) and the broker.
            cpu = time.process_time() - cpu0 if child_cpu is None else child_cpu
            r["cpu_us_per_msg"] = round(cpu / total * 1e6, 1)
            r["broker_cpu_us_per_msg"] = round(
                (sum(bproc.cpu_times()[:2]) - bcpu0) / total * 1e6, 1)
            rss = f"  peak RSS {r['max_rss_mib']:.0f} MiB" if r.get("max_rss_mib") else ""
            print(f"  {m:12s} {total / r['seconds']:>10,.0f} msg/s   {r['seconds']:6.2f}s "
                  f"(+join {r['join_s']:.1f}s)  cpu {r['cpu_us_per_msg']} us/msg, broker "
                  f"{r['broker_cpu_us_per_msg']} us/msg  stored {r.get('events')}{rss}",
                  flush=True)
            if "flushes" in r:
                print("               " + details_line(r, total), flush=True)
            runs.setdefault(m, []).append(r)
        for m in modes:  # best of the rounds (the machine is shared)
            res[m] = max(runs[m], key=lambda r: r["events_per_s"])
            res[m]["rounds_events_per_s"] = [r["events_per_s"] for r in runs[m]]
    labels: dict[str, str] = {"a": "bare kafka-python loop (count bytes)",
              "a-fast": "(a) with toolwatch's record-batch decoder",
              "b": "a-fast + parse/normalize (Pipeline.transform)",
              "c": "toolwatch kafka, no detection",
              "d": "toolwatch kafka, detection",
              "c-ahead": "toolwatch kafka, no detection, transform ahead",
              "c-t2": "toolwatch kafka, no detection, DuckDB 2 threads",
              "d-t2": "toolwatch kafka, detection, DuckDB 2 threads",
              "d-ahead": "toolwatch kafka, detection, transform ahead",
              "tail": "toolwatch tail (file), detection",
              "tail-nd": "toolwatch tail (file), no detection"}
    for m in modes:
        if m.endswith("@old"):
            labels[m] = labels[m[:-4]] + " [--old]"
    base = res.get("a", {}).get("events_per_s")
    print(f"\n  {total:,} messages, {a.partitions} partitions, compression "
          f"{res['compression']}, load avg {res['load_avg'][0]:.1f} on {res['cpus']} CPUs")
    print(f"  {'mode':46s} {'msg/s':>9s} {'x (a)':>6s} {'x tail':>6s} {'cpu us/msg':>10s} "
          f"{'broker us/msg':>13s}")
    tail_r = res.get("tail", {}).get("events_per_s")
    for m in modes:
        r = res[m]
        ra = f"{r['events_per_s'] / base:.2f}" if base else "-"
        tr = res.get("tail@old" if m.endswith("@old") else "tail", {}).get("events_per_s")
        rt = f"{r['events_per_s'] / tr:.2f}" if tr else "-"
        print(f"  {labels[m]:54s} {r['events_per_s']:>9,} {ra:>6s} {rt:>6s} "
              f"{r['cpu_us_per_msg']:>10} {r['broker_cpu_us_per_msg']:>13}")
    if tail_r and a.old:
        print("  (x tail of an [--old] row: against the old tree's tail of the same run)")
    return res


def details_line(r: dict[str, Any], total: int) -> str:
    """One line of a toolwatch mode's details (see :func:`live_details`)."""
    thr = " ".join(f"{k.removeprefix('toolwatch-')}={v / total * 1e6:.1f}"
                   for k, v in (r.get("thread_cpu_s") or {}).items()
                   if v / total * 1e6 >= 0.1)
    return (f"flushes {r['flushes']} (~{r.get('events_per_flush', 0):,}/flush), detect "
            f"{r.get('detect_runs', 0)} runs / {r.get('detect_events', 0):,} ev, alerts "
            f"{r['alerts_new']} new / {r['alerts_updated']} upd, gate waits "
            f"{r.get('memory_gate_waits', 0)} ({r.get('memory_gate_wait_s', 0)} s "
            f"{r.get('memory_gate_wait_s_by_phase', {})}), overlaps "
            f"{r.get('memory_gate_overlaps', 0)}; thread CPU us/msg: {thr}")


#: Modes that ``--old`` also runs with the other checkout's code.
OLD_MODES = ("c", "d", "tail", "tail-nd")
#: Modes run in a child process (unless ``--inproc``).
CHILD_MODES = ("c", "d", "c-t2", "d-t2", "c-ahead", "d-ahead", "tail", "tail-nd")


def run_old(tree: str | None, mode: str, bootstrap: str, topic: str, total: int,
            path: Path, work: Path) -> dict[str, Any]:
    """Run ``mode`` with ``tree``'s code (None: this tree's) in a child process."""
    from bench_parse import overlay  # type: ignore[import-not-found]

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(overlay(Path(tree), work / f"overlay-{abs(hash(tree))}"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--bootstrap",
           bootstrap, "--topic", topic, "--total", str(total), "--file", str(path),
           "--work", str(work / ("old" if tree else "new"))]
    for flag, pairs in (("--live", LIVE_OVERRIDES), ("--consumer", CONSUMER_OVERRIDES)):
        cmd += [x for k, v in pairs.items() for x in (flag, f"{k}={json.dumps(v)}")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                         timeout=1000)
    if out.returncode != 0:
        raise SystemExit(f"--old {mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _vm_hwm_mib() -> float | None:
    """This process's peak RSS (``VmHWM``) in MiB; None where /proc has none."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def child(a: argparse.Namespace) -> int:
    """One mode in this process (``--old``'s child); prints its result as JSON."""
    import toolwatch

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    import toolwatch.detectors.pipeline  # as the parent: imports not timed

    cpu0 = time.process_time()
    m = a.child
    if m.startswith("tail"):
        r = tail(Path(a.file), work, detect=m == "tail")
    else:
        r = toolwatch_kafka(a.bootstrap, a.topic, a.total, work, detect=m.startswith("d"),
                            ahead=True if m.endswith("-ahead") else None,
                            parse_threads=2 if m.endswith("-t2") else None)
    r["cpu_s"] = time.process_time() - cpu0
    # The child's kernel high-water mark (VmHWM): what the consumer needed. Not
    # getrusage's ru_maxrss, which Linux keeps across execve (the harness's own RSS at
    # the fork would show through).
    r["max_rss_mib"] = _vm_hwm_mib()
    r["tree"] = str(Path(toolwatch.__file__).resolve().parents[1])
    print(json.dumps(r, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("part", nargs="?", default="ratios", choices=["ratios", "scale", "rss"])
    p.add_argument("--rate", type=int, default=10_000,
                   help="rss: messages per second of wall time")
    p.add_argument("--seconds", type=float, default=600.0, help="rss: how long to produce")
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--procs", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 4],
                   help="scale: numbers of `toolwatch kafka` processes, e.g. 1,2,3")
    p.add_argument("--modes", default="a,a-fast,b,c,d,tail")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds over all modes, interleaved; the best of each is shown")
    p.add_argument("--compression", default=None,
                   choices=[None, "gzip", "snappy", "lz4", "zstd"])
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "toolwatch-bench-kafka"))
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--old", default=None,
                   help="another checkout: modes c, d, tail, tail-nd also run with its code")
    p.add_argument("--live", action="append", default=[], metavar="KEY=VALUE",
                   help="a [live] setting (KEY=JSON) for every toolwatch mode, e.g. "
                        "memory_gate_mib=0")
    p.add_argument("--consumer", action="append", default=[], metavar="KEY=VALUE",
                   help="a kafka-python setting for toolwatch kafka, e.g. fetch_max_bytes=8388608")
    p.add_argument("--inproc", action="store_true",
                   help="run toolwatch's modes in this process (default: a child each)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)
    p.add_argument("--topic", default=None, help=argparse.SUPPRESS)
    p.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--file", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    from bench_live import _overrides  # type: ignore[import-not-found]  # KEY=JSON pairs

    LIVE_OVERRIDES.update(_overrides(a.live))
    CONSUMER_OVERRIDES.update(_overrides(a.consumer))
    if a.child:
        return child(a)
    res = {"scale": scale, "rss": sustained_rss}.get(a.part, one_run)(a)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


def _covered(data: Path, topic: str) -> int:
    from toolwatch.store import Store

    try:
        cps = Store(data).checkpoints()
    except Exception:  # the store may not exist yet
        return 0
    return sum(v for k, v in cps.items() if k.startswith(f"kafka:{topic}:"))


def _unique_events(data: Path) -> tuple[int, int]:
    from toolwatch.query import query
    from toolwatch.store import Store

    row = query(Store(data), "SELECT count(*) AS n, count(DISTINCT event_id) AS u FROM events")
    return int(row.column("n")[0].as_py()), int(row.column("u")[0].as_py())


def scale(a: argparse.Namespace) -> dict[str, Any]:
    """N separate `toolwatch kafka` processes (one group, one store); then a rebalance run.

    Rate = messages stored after the first lines were read (status files) / time from
    then to the store commit covering the last one (start-up and join printed apart).
    The rebalance run starts 2 members, adds a third at ~30% and kills one with -9 at
    ~60%, then checks that every message is stored exactly once.
    """
    from tests.kafka_broker import KafkaBroker, create_topic
    from toolwatch.live import read_statuses

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    _, lines = bench_lines(work, a.events)
    total = len(lines)
    tw = str(Path(sys.executable).with_name("toolwatch"))
    env = dict(os.environ)
    cfgf = work / "scale.toml"
    cfgf.write_text("[live]\ncompact_interval_s = 0\nstatus_interval_s = 0.25\n")
    out: dict[str, Any] = {"events": total, "load_avg": os.getloadavg(), "cpus": os.cpu_count()}

    def members(topic: str, data: Path, group: str, n: int) -> list[subprocess.Popen[bytes]]:
        cmd = [tw, "kafka", "-b", broker.bootstrap, "-t", topic, "-g", group, "-d", str(data),
               "-c", str(cfgf), "--no-stdout", "--session-timeout-ms", "3000",
               "--heartbeat-interval-ms", "500", "--max-poll-interval-ms", "120000"]
        return [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for _ in range(n)]

    def wait_all(topic: str, data: Path, procs: list[Any], t0: float,
                 events: dict[float, Any] | None = None) -> tuple[float, float, float]:
        first = None
        covered = 0
        while covered < total:
            if time.perf_counter() - t0 > 1800:
                raise TimeoutError(f"{covered} of {total}")
            time.sleep(0.25)
            covered = _covered(data, topic)
            now = time.perf_counter()
            if first is None:
                # The first lines read (status files, rewritten every status interval)
                # mark the end of start-up and group join.
                read = sum(st.get("extra", {}).get("kafka", {}).get("processed", 0)
                           for st in read_statuses(data))
                if read:
                    first = (now, read)
            for frac in sorted(events or {}):
                if covered >= frac * total:
                    events.pop(frac)(procs)  # type: ignore[union-attr]
        assert first is not None
        end = time.perf_counter()
        return end - t0, first[0] - t0, (total - first[1]) / max(1e-9, end - first[0])

    with KafkaBroker() as broker:
        for parts in (4, 8):
            topic = f"scale-{parts}-{time.time_ns()}"
            create_topic(broker.bootstrap, topic, partitions=parts)
            produce(broker.bootstrap, topic, lines, a.compression)
            for n in a.procs:
                data = work / f"store-scale-{parts}-{n}"
                shutil.rmtree(data, ignore_errors=True)
                t0 = time.perf_counter()
                procs = members(topic, data, f"g-{time.time_ns()}", n)
                wall, startup, rate = wait_all(topic, data, procs, t0)
                for p in procs:
                    p.send_signal(signal.SIGTERM)
                for p in procs:
                    p.wait(60)
                rows, uniq = _unique_events(data)
                out[f"{parts}p_{n}proc"] = {"wall_s": round(wall, 1),
                                            "startup_join_s": round(startup, 1),
                                            "events_per_s": int(rate), "rows": rows,
                                            "unique": uniq}
                print(f"  {parts} partitions, {n} process(es): {rate:>9,.0f} msg/s after the "
                      f"first read ({startup:.1f}s start+join, {wall:.1f}s wall); stored "
                      f"{rows:,} rows, {uniq:,} unique", flush=True)
        # Rebalance under load: 2 members, a 3rd joins at 30%, one killed -9 at 60%.
        topic = f"rebal-{time.time_ns()}"
        create_topic(broker.bootstrap, topic, partitions=4)
        produce(broker.bootstrap, topic, lines, a.compression)
        data = work / "store-scale-rebalance"
        shutil.rmtree(data, ignore_errors=True)
        group = f"g-{time.time_ns()}"
        t0 = time.perf_counter()
        procs = members(topic, data, group, 2)

        def join(ps: list[Any]) -> None:
            ps.extend(members(topic, data, group, 1))

        def kill(ps: list[Any]) -> None:
            ps[0].send_signal(signal.SIGKILL)
            ps[0].wait(10)

        wall, startup, rate = wait_all(topic, data, procs, t0, {0.3: join, 0.6: kill})
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
        rows, uniq = _unique_events(data)
        out["rebalance"] = {"wall_s": round(wall, 1), "events_per_s": int(rate),
                            "rows": rows, "unique": uniq}
        print(f"  rebalance run (2 members, +1 at 30%, kill -9 at 60%): {rate:,.0f} msg/s, "
              f"{rows:,} rows stored, {uniq:,} unique ({'OK' if rows == uniq else 'DUPLICATES'})")
    return out


def _paced_producer(bootstrap: str, topic: str, src: Path, rate: int, total: int,
                    sent: list[int], stop: threading.Event) -> threading.Thread:
    """Send ``total`` lines of ``src`` at ``rate`` per second of wall time (10 sends/s).

    Each line is keyed by its own ``caller_id`` (the recommended producer key); ``sent``
    holds how many were handed to the producer so far.
    """
    import orjson
    from kafka import KafkaProducer

    def run() -> None:
        prod = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20,
                             max_request_size=8 << 20)
        step = max(1, rate // 10)
        t0 = time.monotonic()
        with open(src, "rb") as fh:
            while sent[0] < total and not stop.is_set():
                for line in (fh.readline() for _ in range(min(step, total - sent[0]))):
                    if not line:
                        break
                    key = str(orjson.loads(line).get("caller_id", "")).encode()
                    prod.send(topic, key=key, value=line.rstrip(b"\n"))
                    sent[0] += 1
                ahead = t0 + sent[0] / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        prod.flush(timeout=120)
        prod.close()

    th = threading.Thread(target=run, name="paced-producer", daemon=True)
    th.start()
    return th


def sustained_rss(a: argparse.Namespace) -> dict[str, Any]:
    """RSS and lag of one real ``toolwatch kafka`` process at ``--rate`` msg/s, real time."""
    import psutil
    from bench_live import _print_samples, _steady, _vm_hwm, rate_file  # type: ignore[import-not-found]

    from tests.kafka_broker import KafkaBroker, create_topic
    from toolwatch.live import read_statuses

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    total = int(a.rate * a.seconds)
    src = rate_file(work, total, a.rate)
    data = work / "store-rss"
    shutil.rmtree(data, ignore_errors=True)
    cfgf = work / "rss.toml"
    cfgf.write_text("[live]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                          for k, v in LIVE_OVERRIDES.items()))
    tw = str(Path(sys.executable).with_name("toolwatch"))
    samples: list[tuple[float, float, int]] = []
    lags: list[int] = []
    loads: list[float] = []
    hwm = 0.0
    with KafkaBroker() as broker:
        topic = f"rss-{time.time_ns()}"
        create_topic(broker.bootstrap, topic, partitions=a.partitions)
        cmd = [tw, "kafka", "-b", broker.bootstrap, "-t", topic, "-g", "rss", "-d",
               str(data), "-c", str(cfgf), "--no-stdout"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        ps = psutil.Process(proc.pid)
        sent = [0]
        stop = threading.Event()
        t0 = time.perf_counter()
        producer = _paced_producer(broker.bootstrap, topic, src, a.rate, total, sent, stop)
        stored = 0
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                stored = _covered(data, topic)
                mb = ps.memory_info().rss / 2**20
                hwm = max(hwm, _vm_hwm(proc.pid))
                loads.append(os.getloadavg()[0])
                samples.append((time.perf_counter() - t0, mb, stored))
                lags.append(max(0, sent[0] - stored))
                if not producer.is_alive() and stored >= total:
                    break
                if time.perf_counter() - t0 > a.seconds + 600:
                    raise TimeoutError(f"stored {stored:,} of {total:,}")
        finally:
            stop.set()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
        status = next(iter(read_statuses(data)), {})
        rows, uniq = _unique_events(data)
    secs = time.perf_counter() - t0
    res = {"rate": a.rate, "seconds": round(secs, 1), "sent": sent[0], "stored_rows": rows,
           "unique": uniq, "exit_code": rc, "partitions": a.partitions,
           "alerts_new": status.get("alerts_new"), "live": LIVE_OVERRIDES,
           **_steady(samples, total), "rss_hwm_mib": round(hwm, 1),
           # stored lags sent by up to a flush interval plus a commit: the median of the
           # second half (start-up and group join long past) shows whether the consumer
           # keeps up, the max its worst moment there.
           "lag_median": int(statistics.median(lags[len(lags) // 2:])) if lags else None,
           "lag_max": max(lags[len(lags) // 2:]) if lags else None,
           "load_avg_min_median_max": [round(min(loads), 1), round(statistics.median(loads), 1),
                                       round(max(loads), 1)] if loads else None}
    print(f"  toolwatch kafka (exit {rc}) at {a.rate:,} msg/s for {a.seconds:.0f}s: sent "
          f"{sent[0]:,}, stored {rows:,} rows ({uniq:,} unique), alerts "
          f"{res['alerts_new']} new; lag (second half) median {res['lag_median']:,}, max "
          f"{res['lag_max']:,} messages")
    _print_samples(samples)
    print(f"  RSS peak {res['rss_peak_mib']} MiB; steady (second half) median "
          f"{res['rss_steady_median_mib']}, p95 {res['rss_steady_p95_mib']}; trend "
          f"{res['rss_steady_trend_mib_per_m_events']} MiB per million events; VmHWM "
          f"{res['rss_hwm_mib']} MiB; load average (1 min, min/median/max) "
          f"{res['load_avg_min_median_max']}")
    return res


if __name__ == "__main__":
    raise SystemExit(main())
