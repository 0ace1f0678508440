"""``toolwatch run`` benchmarks: loss under the SDK's stop, overhead, alert latency, cold start.

Prints figures; not a test. Parts (each can run alone; ``all`` runs every part)::

    python benchmarks/bench_run.py loss --trials 20        # lines lost under the SDK's stop
    python benchmarks/bench_run.py overhead --calls 300    # tools/call latency, RSS
    python benchmarks/bench_run.py latency --seconds 30    # attack -> alert, 4 wrappers
    python benchmarks/bench_run.py coldstart --runs 20     # exec -> first spooled byte
    python benchmarks/bench_run.py echo --lines 200000     # cost of echoing the spool
    python benchmarks/bench_run.py all [--quick]           # everything (~4 min; --quick ~1)

* **loss** — per trial 4 wrappers at once (``toolwatch run -- tests/fake_mcp_server.py``)
  with a CPU-spinning process beside them; random session lengths (1–150 calls), a random
  pause, then the official MCP SDK's stdio stop for all 4 together (close stdin, 2 s,
  SIGTERM to the process group, 2 s, SIGKILL). Afterwards one ``toolwatch collect --once``
  (the next writer of the store) ingests what the SIGKILLs left. Lost = calls answered to
  the client minus calls stored; also counted: calls stored twice.
* **overhead** — the SDK's stdio client (``ClientSession``) against tests/mcp_sdk_server.py
  (``MCPServer`` + ToolwatchMiddleware): per-call latency seen by the client, direct vs
  wrapped (the wrapper collecting itself; and with a separate ``toolwatch collect``),
  interleaved rounds; peak RSS of the wrapper and of the collector (psutil, sampled).
* **latency** — a ``toolwatch collect --alerts-out`` and 4 lanes each running wrapped
  sessions one after another (an enumerating agent: ids that do not exist, 25 calls/s, plus
  benign sessions). Latency of an alert version = when it appears in the alerts file minus
  its ``last_seen`` (the log time, i.e. the write time, of the newest call in its evidence;
  for a first version, the call that decided it).
* **coldstart** — ``toolwatch run -d D -- sh -c 'date +%s%N >&2; sleep 5'``: the server
  stamps the wall clock into the spool as its first byte; cold start = that stamp minus
  the moment the bench exec'ed the wrapper. Floor in the same run: ``python -c pass``
  (exec to exit) and a ``sh`` stamp without any wrapper.
* **echo** — a Python server writing N lines to stderr: directly (stderr a file) vs wrapped
  (stderr = spool file, echoed by the wrapper to its own stderr, a file); the bench holds
  the store's collector lock so the wrapper only spools and echoes. Server write time,
  time until the echo is complete, wrapper CPU (rusage of the wrapper minus the direct
  server's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import psutil  # noqa: E402

PY = sys.executable
TOOLWATCH = str(Path(PY).with_name("toolwatch"))
FAKE = str(ROOT / "tests" / "fake_mcp_server.py")
SDK_SERVER = str(ROOT / "tests" / "mcp_sdk_server.py")


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWATCH_")}
    env["XDG_CONFIG_HOME"] = str(work / "config-home")
    env["PYTHONPATH"] = str(ROOT)
    # As installed (pip writes .pyc files): bytecode cached, in the work directory rather
    # than the source tree. With PYTHONDONTWRITEBYTECODE every run compiled toolwatch's
    # modules again (spool.py alone: ~7 ms).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return env


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


def _ms(x: float) -> float:
    return round(x * 1000, 1)


def _rpc(i: int, method: str, **params: object) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()


def _stored(data: Path) -> tuple[dict[str, int], int]:
    """Calls stored per session, and how many (session, call) rows are duplicates."""
    from test_live_support import stored_events

    ev = stored_events(data)
    if ev.height == 0:
        return {}, 0
    return dict(ev.group_by("session_id").len().iter_rows()), ev.height - ev["event_id"].n_unique()


def _collect_once(data: Path, env: dict[str, str]) -> None:
    subprocess.run([TOOLWATCH, "collect", "--once", "--no-stdout", "-d", str(data)], env=env,
                   check=True, timeout=300, capture_output=True)


def sdk_stop(p: subprocess.Popen[bytes]) -> None:
    """The MCP Python SDK's stdio stop: close stdin, 2 s, SIGTERM group, 2 s, SIGKILL."""
    assert p.stdin is not None
    with contextlib.suppress(OSError):
        p.stdin.close()
    try:
        p.wait(timeout=2.0)
        return
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


# --------------------------------------------------------------------------- loss
def loss(work: Path, trials: int, wrappers: int = 4) -> dict[str, Any]:
    """Calls lost under the SDK's stop sequence, ``wrappers`` at once, a core spinning."""
    data = work / "store-loss"
    shutil.rmtree(data, ignore_errors=True)
    env = _env(work)
    rnd = random.Random(20261124)
    expected: dict[str, int] = {}
    codes: list[int] = []
    stop_s: list[float] = []
    spin = subprocess.Popen([PY, "-c", "while True: pass"])
    t0 = time.perf_counter()
    try:
        for t in range(trials):
            procs = []
            for k in range(wrappers):
                sess = f"t{t}-w{k}"
                n = rnd.choice([1, 2, 3, 6, 20, 60, 150])
                p = subprocess.Popen(
                    [TOOLWATCH, "run", "-d", str(data), "--", PY, FAKE],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    env={**env, "FAKE_SESSION": sess}, start_new_session=True,
                )
                assert p.stdin is not None
                p.stdin.write(_rpc(1, "initialize") + b"\n" + b"".join(
                    _rpc(100 + i, "tools/call", name="getDocument",
                         arguments={"documentId": f"{sess}-doc-{i}"}) + b"\n"
                    for i in range(n)))
                p.stdin.flush()
                procs.append((p, sess, n))
            for p, sess, n in procs:
                assert p.stdout is not None
                for _ in range(n + 1):  # every answered call was logged before its answer
                    if not p.stdout.readline():
                        raise RuntimeError(f"{sess}: the server stopped answering")
                expected[sess] = n
            time.sleep(rnd.uniform(0.0, 0.5))
            ts = time.perf_counter()
            stoppers = [threading.Thread(target=sdk_stop, args=(p,)) for p, _, _ in procs]
            for th in stoppers:
                th.start()
            for th in stoppers:
                th.join()
            stop_s.append(time.perf_counter() - ts)
            codes += [p.returncode for p, _, _ in procs]
    finally:
        spin.kill()
        spin.wait()
    before, _ = _stored(data)
    _collect_once(data, env)
    after, dups = _stored(data)
    lost = sum(max(0, n - after.get(s, 0)) for s, n in expected.items())
    res = {
        "trials": trials,
        "wrappers_at_once": wrappers,
        "calls_answered": sum(expected.values()),
        "stored_by_wrappers": sum(before.values()),
        "stored_after_next_writer": sum(after.values()),
        "lost": lost,
        "stored_twice": dups,
        "exit_codes": sorted(set(codes)),
        "stop_seconds_p50": round(statistics.median(stop_s), 2),
        "stop_seconds_max": round(max(stop_s), 2),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(f"  loss: {res['calls_answered']} calls answered over {trials} trials x {wrappers} "
          f"wrappers (core spinning); stored by the wrappers {res['stored_by_wrappers']}, "
          f"after the next writer {res['stored_after_next_writer']}: LOST {lost}, "
          f"stored twice {dups}; exit codes {res['exit_codes']}; SDK stop took "
          f"p50 {res['stop_seconds_p50']} s, max {res['stop_seconds_max']} s")
    return res


# --------------------------------------------------------------------------- overhead
class _PeakRss:
    """Peak RSS of descendant processes whose command line matches, sampled every 50 ms."""

    def __init__(self, match: dict[str, Any]):
        self.match = match  # label -> predicate(cmdline list)
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.05):
            for ch in me.children(recursive=True):
                try:
                    cmd = ch.cmdline()
                    rss = ch.memory_info().rss / 2**20
                except psutil.Error:
                    continue
                for label, pred in self.match.items():
                    if pred(cmd):
                        self.peak[label] = max(self.peak.get(label, 0.0), rss)

    def __enter__(self) -> _PeakRss:
        self._t.start()
        return self

    def __exit__(self, *a: object) -> None:
        self._stop.set()
        self._t.join()


def _is_wrapper(cmd: list[str]) -> bool:
    return len(cmd) > 2 and cmd[1].endswith("toolwatch") and "run" in cmd[2:3]


def _is_collector(cmd: list[str]) -> bool:
    return len(cmd) > 2 and cmd[1].endswith("toolwatch") and "collect" in cmd[2:3]


async def _sdk_calls(params: Any, n: int) -> list[float]:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    lat = []
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            for i in range(n):
                t = time.perf_counter()
                await s.call_tool("getDocument", {"documentId": f"doc-{i % 40}"})
                lat.append(time.perf_counter() - t)
    return lat


def overhead(work: Path, calls: int, rounds: int = 2) -> dict[str, Any]:
    """Client-observed tools/call latency with/without ``toolwatch run``; RSS."""
    import anyio
    from mcp.client.stdio import StdioServerParameters

    env = _env(work)
    data = work / "store-overhead"
    shutil.rmtree(data, ignore_errors=True)
    direct = StdioServerParameters(command=PY, args=[SDK_SERVER], env=env)
    wrapped = StdioServerParameters(
        command=TOOLWATCH, args=["run", "-d", str(data), "--", PY, SDK_SERVER], env=env)
    lat: dict[str, list[float]] = {"direct": [], "wrapped": [], "wrapped+collector": []}
    peaks: dict[str, float] = {}
    for _ in range(rounds):  # interleaved: the host's load hits every variant alike
        lat["direct"] += anyio.run(_sdk_calls, direct, calls)
        with _PeakRss({"wrapper (collecting)": _is_wrapper}) as m:
            lat["wrapped"] += anyio.run(_sdk_calls, wrapped, calls)
        for k, v in m.peak.items():
            peaks[k] = max(peaks.get(k, 0.0), v)
        col = subprocess.Popen([TOOLWATCH, "collect", "--no-stdout", "-d", str(data)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(4.0)  # the collector holds the lock before the wrapper starts
            with _PeakRss({"wrapper (spool+echo only)": _is_wrapper,
                           "collector": _is_collector}) as m:
                lat["wrapped+collector"] += anyio.run(_sdk_calls, wrapped, calls)
                time.sleep(1.5)  # the collector stores the session
        finally:
            col.send_signal(signal.SIGTERM)
            col.wait(timeout=60)
        for k, v in m.peak.items():
            peaks[k] = max(peaks.get(k, 0.0), v)
    res: dict[str, Any] = {"calls_per_variant": calls * rounds}
    for k, xs in lat.items():
        res[k] = {"p50_ms": _ms(statistics.median(xs)), "p99_ms": _ms(_pct(xs, 0.99))}
    res["peak_rss_mib"] = {k: round(v, 1) for k, v in peaks.items()}
    print(f"  tools/call latency seen by the SDK client ({calls * rounds} calls each):")
    for k in lat:
        print(f"    {k:<18} p50 {res[k]['p50_ms']:6.1f} ms   p99 {res[k]['p99_ms']:6.1f} ms")
    print("  peak RSS: " + ", ".join(f"{k} {v} MiB" for k, v in res["peak_rss_mib"].items()))
    return res


# --------------------------------------------------------------------------- latency
def alert_latency(work: Path, seconds: float, lanes: int = 4) -> dict[str, Any]:
    """Attack call written -> alert in the collector's alerts file, ``lanes`` wrappers."""
    env = _env(work)
    data = work / "store-latency"
    shutil.rmtree(data, ignore_errors=True)
    out = work / "alerts-latency.jsonl"
    out.unlink(missing_ok=True)
    col = subprocess.Popen(
        [TOOLWATCH, "collect", "--no-stdout", "-d", str(data), "--alerts-out", str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[tuple[float, dict[str, Any]]] = []
    stop = threading.Event()

    def watch() -> None:  # arrival time of every alert line
        pos = 0
        buf = b""
        while not stop.is_set():
            with contextlib.suppress(OSError), open(out, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos += len(chunk)
                now = time.time()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                seen.extend((now, json.loads(ln)) for ln in lines if ln.strip())
            time.sleep(0.01)

    sessions = [0]
    attacks: set[str] = set()

    def lane(k: int) -> None:
        rnd = random.Random(k)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            attack = rnd.random() < 0.5
            sess = f"lane{k}-{sessions[0]}-{'atk' if attack else 'ok'}"
            sessions[0] += 1
            if attack:
                attacks.add(sess)
            p = subprocess.Popen([TOOLWATCH, "run", "-d", str(data), "--", PY, FAKE],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, start_new_session=True,
                                 env={**env, "FAKE_SESSION": sess})
            assert p.stdin is not None and p.stdout is not None
            n = 60 if attack else rnd.randint(3, 12)
            for i in range(n):
                doc = f"missing-{k}-{rnd.randrange(10**6)}" if attack and i % 5 else f"doc-{i}"
                p.stdin.write(_rpc(100 + i, "tools/call", name="getDocument",
                                   arguments={"documentId": doc, "caller": sess}) + b"\n")
                p.stdin.flush()
                p.stdout.readline()
                time.sleep(0.04 if attack else rnd.uniform(0.2, 1.0))
            sdk_stop(p)

    t0 = time.time()
    w = threading.Thread(target=watch, daemon=True)
    w.start()
    try:
        time.sleep(4.0)  # the collector is up (imports, store) before traffic starts
        ths = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        time.sleep(3.0)
    finally:
        col.send_signal(signal.SIGTERM)
        col.wait(timeout=60)
        stop.set()
        w.join()
    from datetime import datetime

    def ts(s: str) -> float:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    all_lat, first_lat, firsts = [], [], set()
    cats: dict[str, int] = {}
    enum_sessions = {a.get("session_id") for _, a in seen if a.get("category") == "enumeration"}
    for arrived, a in seen:
        if not a.get("last_seen") or ts(a["last_seen"]) < t0:
            continue
        d = arrived - ts(a["last_seen"])
        all_lat.append(d)
        key = a.get("alert_id") or (a.get("entity_id"), a.get("category"))
        if key not in firsts:
            firsts.add(key)
            first_lat.append(d)
            cats[a.get("category", "?")] = cats.get(a.get("category", "?"), 0) + 1
    res = {
        "lanes": lanes,
        "sessions": sessions[0],
        "alert_versions": len(all_lat),
        "alerts": len(first_lat),
        "categories": cats,
        "attack_sessions": len(attacks),
        "attack_sessions_alerted_enumeration": len(attacks & enum_sessions),
        "benign_sessions_alerted": len({a.get("session_id") for _, a in seen}
                                       - attacks - {None}),
        "first_version_p50_s": round(statistics.median(first_lat), 3) if first_lat else None,
        "first_version_p99_s": round(_pct(first_lat, 0.99), 3) if first_lat else None,
        "all_versions_p50_s": round(statistics.median(all_lat), 3) if all_lat else None,
        "all_versions_p99_s": round(_pct(all_lat, 0.99), 3) if all_lat else None,
        "max_s": round(max(all_lat), 3) if all_lat else None,
    }
    print(f"  alert latency, {lanes} wrappers at once + collector ({sessions[0]} sessions, "
          f"{len(attacks)} attacks, {res['attack_sessions_alerted_enumeration']} alerted as "
          f"enumeration, {res['benign_sessions_alerted']} benign sessions alerted; "
          f"{len(first_lat)} alerts {cats}): first version p50 {res['first_version_p50_s']} s, "
          f"p99 {res['first_version_p99_s']} s; all {len(all_lat)} versions p50 "
          f"{res['all_versions_p50_s']} s, p99 {res['all_versions_p99_s']} s, "
          f"max {res['max_s']} s")
    return res


# --------------------------------------------------------------------------- cold start
def _stamp_run(cmd: list[str], env: dict[str, str]) -> float:
    """Seconds from exec to the server's first byte (it writes its clock to stderr)."""
    t = time.time_ns()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)
    assert p.stderr is not None
    line = p.stderr.readline()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    p.stderr.close()
    return (int(line.split()[0]) - t) / 1e9


def coldstart(work: Path, runs: int) -> dict[str, Any]:
    """Exec of ``toolwatch run`` -> first byte in the spool; floors in the same run."""
    env = _env(work)
    data = work / "store-cold"
    shutil.rmtree(data, ignore_errors=True)
    script = "date +%s%N >&2; sleep 5"
    wrapped, bare, pypass = [], [], []
    _stamp_run([TOOLWATCH, "run", "-d", str(data), "--", "sh", "-c", script], env)  # .pyc
    for _ in range(runs):  # interleaved
        wrapped.append(_stamp_run([TOOLWATCH, "run", "-d", str(data), "--", "sh", "-c", script],
                                  env))
        bare.append(_stamp_run(["sh", "-c", script], env))
        t = time.perf_counter()
        subprocess.run([PY, "-c", "pass"], check=True, env=env)
        pypass.append(time.perf_counter() - t)
    res = {
        "runs": runs,
        "wrapped_first_byte_p50_ms": _ms(statistics.median(wrapped)),
        "wrapped_first_byte_max_ms": _ms(max(wrapped)),
        "sh_alone_first_byte_p50_ms": _ms(statistics.median(bare)),
        "python_c_pass_p50_ms": _ms(statistics.median(pypass)),
        "python_c_pass_max_ms": _ms(max(pypass)),
    }
    print(f"  cold start, exec -> first spooled byte ({runs} runs): p50 "
          f"{res['wrapped_first_byte_p50_ms']} ms, max {res['wrapped_first_byte_max_ms']} ms; "
          f"floors: python -c pass p50 {res['python_c_pass_p50_ms']} ms (max "
          f"{res['python_c_pass_max_ms']}), the same server without wrapper "
          f"{res['sh_alone_first_byte_p50_ms']} ms")
    shutil.rmtree(data, ignore_errors=True)  # its spools are orphans of killed wrappers
    return res


# --------------------------------------------------------------------------- echo
def echo(work: Path, lines: int, rounds: int = 2) -> dict[str, Any]:
    """A server writing ``lines`` lines to stderr directly vs through the wrapper's spool."""
    from toolwatch.ingest.sources.wrapper import try_collector_lock

    env = _env(work)
    data = work / "store-echo"
    shutil.rmtree(data, ignore_errors=True)
    lock = try_collector_lock(data)  # the wrapper spools and echoes; nobody collects
    server = [PY, "-c", (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "w = sys.stderr.write\n"
        f"for i in range({lines}):\n"
        "    w('{\"ts\": \"2026-11-24T00:00:00Z\", \"session_id\": \"s\", \"tool\": \"t\", "
        "\"n\": %d}\\n' % i)\n"
        "sys.stderr.flush()\n"
        "print(time.perf_counter() - t)\n")]

    def one(cmd: list[str]) -> tuple[float, float, float]:
        errf = work / "echo-stderr.txt"
        with open(errf, "wb") as err:
            t = time.perf_counter()
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=err, env=env)
            assert p.stdout is not None
            wrote = float(p.stdout.read().split()[0])
            _, _status, ru = os.wait4(p.pid, 0)
            wall = time.perf_counter() - t
        got = errf.read_bytes().count(b"\n")
        if got < lines:
            raise RuntimeError(f"echo incomplete: {got} of {lines} lines")
        return wrote, wall, ru.ru_utime + ru.ru_stime

    res: dict[str, Any] = {"lines": lines}
    d: list[tuple[float, float, float]] = []
    w: list[tuple[float, float, float]] = []
    try:
        for _ in range(rounds):
            d.append(one(server))
            w.append(one([TOOLWATCH, "run", "-d", str(data), "--", *server]))
    finally:
        lock.close()
    for name, xs in (("direct", d), ("wrapped", w)):
        wrote = min(x[0] for x in xs)
        res[name] = {"server_lines_per_s": int(lines / wrote),
                     "wall_to_all_echoed_s": round(min(x[1] for x in xs), 2),
                     "cpu_s": round(min(x[2] for x in xs), 2)}
    res["wrapper_cpu_s"] = round(res["wrapped"]["cpu_s"] - res["direct"]["cpu_s"], 2)
    print(f"  echo, {lines:,} lines: server writes {res['direct']['server_lines_per_s']:,} "
          f"lines/s direct vs {res['wrapped']['server_lines_per_s']:,} wrapped; all lines on "
          f"the terminal after {res['direct']['wall_to_all_echoed_s']} s vs "
          f"{res['wrapped']['wall_to_all_echoed_s']} s; wrapper CPU {res['wrapper_cpu_s']} s "
          f"(start-up included)")
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the chosen part(s) and print a JSON summary at the end."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["loss", "overhead", "latency", "coldstart", "echo", "all"])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--work", type=Path, default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.trials, a.calls, a.seconds, a.runs, a.lines = 4, 100, 12.0, 8, 50_000
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-run-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {}
    if a.part in ("coldstart", "all"):
        res["coldstart"] = coldstart(work, a.runs)
    if a.part in ("loss", "all"):
        res["loss"] = loss(work, a.trials)
    if a.part in ("overhead", "all"):
        res["overhead"] = overhead(work, a.calls)
    if a.part in ("latency", "all"):
        res["latency"] = alert_latency(work, a.seconds)
    if a.part in ("echo", "all"):
        res["echo"] = echo(work, a.lines)
    print(json.dumps(res, indent=1, default=str))
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
