"""Benchmark: a long fuzz run of hostile lines through ``toolwatch ingest`` and ``analyze``.

Generates ``--lines`` (default 1,000,000) hostile log lines with a seeded random
generator (fast; not hypothesis) mixing every hostile class the ingest path must survive:
numbers at and beyond every type's range, timestamps that are no time, zone offsets past
±14:00, byte order marks, nesting thousands deep, invalid UTF-8 / overlong encodings /
NUL / control bytes, huge strings and over-long lines, wrong types under every alias,
duplicate keys, JSON-RPC with hostile ids, session summaries with absurd figures, cut
lines — interleaved with plain calls. It runs the real ``toolwatch ingest`` (subprocess)
over them and checks the invariant: exit 0, and every line is an event, a summary, a
merged JSON-RPC response or a quarantine row, in the counters *and* in the store's views.
``toolwatch analyze`` runs over a subset the same way.

Prints: lines generated, stored (events/summaries/merged), quarantined by reason,
crashes (must be 0), unaccounted (must be 0), throughput.

Usage::

    python benchmarks/bench_fuzz.py [--lines 1000000] [--seed 15] [--analyze-lines 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
TOOLWATCH = str(Path(PY).with_name("toolwatch"))
TS = "2026-11-02T10:00:00.000Z"

INT_EDGES = [0, -1, 2**31 - 1, 2**31, 2**32, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1, 2**63,
             -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**70, 10**30, 10**400]
NUM_TEXT = ["1e308", "-1e308", "1e309", "-1e309", "-0", "-0.0", "4.9e-324", "1e-400",
            "2.2250738585072014e-308", "1e99999", '"NaN"', '"Infinity"', '"-Infinity"',
            '"1e400"', '"nan"', '"lots"', "true", "null", "[1]", '{"a":1}', '""']
TS_BAD = ['"nan"', "1e30", "-1e30", '"1e30"', '"Infinity"', "1e309", "-1", "[1]", "{}",
          '"2026-11-02T10:00:00+25:00"', '"2026-11-02T10:00:00-99:99"', '"0001-01-01"',
          '"9999-12-31T23:59:59Z"', '"2026-13-45T99:99:99Z"', "true", '""', '"\\ud800"']
FIELDS = ["ts", "timestamp", "time", "@timestamp", "session_id", "sessionId", "mcp.session.id",
          "caller_id", "callerId", "client_ip", "ip", "server", "serverName", "tool",
          "toolName", "name", "args", "arguments", "params", "input", "resource_id",
          "status", "outcome", "isError", "is_error", "bytes", "bytesReturned", "rows",
          "rowsReturned", "duration_ms", "durationMs", "latency_ms", "event", "callCount",
          "uniqueResourcesAccessed", "totalBytesReturned", "authFailures", "jsonrpc",
          "start_ts", "end_ts", "duration_s"]
RAW_BYTES = [b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff\xfe",
             b"\x00", b"\x1b[31m", b"\x7f", b"\xef\xbb\xbf", b"\r", b"\x85", b"\xe2\x80\xae"]


def _num(r: random.Random) -> str:
    if r.random() < 0.5:
        return str(r.choice(INT_EDGES) * r.choice([1, -1]))
    return r.choice(NUM_TEXT)


def _nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def _value(r: random.Random, depth: int = 0) -> str:
    k = r.random()
    if k < 0.35:
        return _num(r)
    if k < 0.55:
        return json.dumps(r.choice(["x", "", "\u0000", "\u202e", "é", "\U0001f600", "a" * 200]))
    if k < 0.6:
        return _nested(r.choice([33, 100, 1000, 3000]))
    if k < 0.62:  # long strings; now and then a very long one
        n = 300_000 if r.random() < 0.005 else r.choice([2_000] * 20 + [50_000])
        return json.dumps("B" * n)
    if k < 0.7:
        return r.choice(['"\\ud800"', '"\\udc00\\ud800"', '"\\u0000"', '"\\\\ud800"'])
    if depth < 3 and k < 0.85:
        return "[" + ",".join(_value(r, depth + 1) for _ in range(r.randint(0, 3))) + "]"
    if depth < 3:
        kv = [(r.choice([*FIELDS, "password", "token", "x"]), _value(r, depth + 1))
              for _ in range(r.randint(0, 3))]
        return "{" + ",".join(f"{json.dumps(a)}:{b}" for a, b in kv) + "}"
    return "null"


def _call(r: random.Random, i: int, **extra: str) -> str:
    pairs = {"ts": json.dumps(TS), "session_id": json.dumps(f"s{i % 997}"),
             "tool": json.dumps(r.choice(["getDocument", "search", "readFile"])),
             "args": json.dumps({"documentId": f"d{i}"}), "bytes": str(r.randint(0, 10**6))}
    pairs.update(extra)
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs.items()) + "}"


def hostile_line(r: random.Random, i: int) -> bytes:
    """One line of a randomly chosen hostile class (plain calls ~30%)."""
    c = r.randrange(16)
    if c < 4:
        return _call(r, i).encode()
    if c == 4:  # numbers at/beyond range in number fields
        return _call(r, i, **{r.choice(["bytes", "rows", "duration_ms", "bytesReturned",
                                          "rowsReturned", "durationMs"]): _num(r)}).encode()
    if c == 5:  # no time
        return _call(r, i, ts=r.choice(TS_BAD)).encode()
    if c == 6:  # wrong types under every known field and alias; duplicate keys
        extra = {r.choice(FIELDS): _value(r) for _ in range(r.randint(1, 4))}
        line = _call(r, i, **extra)
        if r.random() < 0.5:
            line = line[:-1] + f',"bytes":{_num(r)},"bytes":{_num(r)}}}'
        return line.encode()
    if c == 7:  # deep nesting in args
        return _call(r, i, args='{"q":' + _nested(r.choice([31, 33, 500, 3000])) + "}").encode()
    if c == 8:  # raw hostile bytes spliced into a line, or alone
        line = _call(r, i).encode()
        at = r.randrange(len(line) + 1)
        out = line[:at] + r.choice(RAW_BYTES) + line[at:]
        return out if r.random() < 0.7 else bytes(r.randrange(256) for _ in range(40))
    if c == 9:  # BOM mid-file
        return b"\xef\xbb\xbf" + _call(r, i).encode()
    if c == 10:  # JSON-RPC with hostile ids
        rid = r.choice([_num(r), _value(r), str(i)])
        if r.random() < 0.5:
            arg = r.choice(["{}", _value(r)])
            msg = ('{"jsonrpc":"2.0","id":' + rid + ',"method":"tools/call",'
                   '"params":{"name":"t","arguments":' + arg + "}}")
        else:
            err = r.choice(["false", "true", _num(r)])
            msg = '{"jsonrpc":"2.0","id":' + rid + ',"result":{"content":[],"isError":' + err + "}}"
        return (f'{{"ts":{json.dumps(TS)},"session_id":"c{i % 7}","message":{msg}}}').encode()
    if c == 11:  # summaries with absurd figures
        return (
            f'{{"event":"SESSION_END","sessionId":"s{i % 97}","ts":{json.dumps(TS)},'
            f'"durationMs":{_num(r)},"callCount":{_num(r)},"totalBytesReturned":{_num(r)},'
            f'"uniqueResourcesAccessed":{_num(r)},"authFailures":{_num(r)}}}'
        ).encode()
    if c == 12:  # cut lines
        line = _call(r, i).encode()
        return line[: r.randrange(len(line))]
    if c == 13:  # not objects, empty, whitespace
        return r.choice([b"[]", b"1e999", b'"x"', b"", b"   ", b"null", b"{}", b"{{"])
    if c == 14:  # time zones
        off = r.choice(["+14:00", "-12:00", "+14:01", "+25:00", "+99:99", "+0530", "Z", "+15"])
        return _call(r, i, ts=json.dumps("2026-11-02T10:00:00" + off)).encode()
    # huge strings; now and then over max_line_bytes
    x = r.random()
    n = 1_000 if x < 0.95 else 20_000 if x < 0.9997 else 1_100_000
    return _call(r, i, args=json.dumps({"blob": "C" * n})).encode()


def generate(path: Path, n: int, seed: int) -> None:
    r = random.Random(seed)
    with open(path, "wb") as fh:
        buf = []
        for i in range(n):
            buf.append(hostile_line(r, i).replace(b"\n", b" "))
            if len(buf) >= 10_000:
                fh.write(b"\n".join(buf) + b"\n")
                buf = []
        if buf:
            fh.write(b"\n".join(buf) + b"\n")


def store_counts(store: Path, env: dict[str, str]) -> dict[str, int]:
    """Row counts of every view, through a separate process (as an analyst would)."""
    code = (
        "import json,sys;from toolwatch.store import Store;from toolwatch.query import query;"
        "s=Store(sys.argv[1]);"
        "print(json.dumps({v: query(s, f'SELECT count(*) AS n FROM {v}').to_pylist()[0]['n'] "
        "for v in ('events','sessions','summaries','quarantine')}))"
    )
    out = subprocess.run([PY, "-c", code, str(store)], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"views failed to query:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run(cmd: list[str], env: dict[str, str]) -> tuple[int, float, str, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       errors="replace")
    return p.returncode, time.perf_counter() - t, p.stdout, p.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--analyze-lines", type=int, default=100_000)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tw-fuzz-"))
    env = {**os.environ, "XDG_CONFIG_HOME": str(work / "cfg"), "TOOLWATCH_HMAC_KEY": "cd" * 32}
    crashes = 0
    unaccounted = 0
    try:
        path = work / "hostile.jsonl"
        t = time.perf_counter()
        generate(path, args.lines, args.seed)
        gen_s = time.perf_counter() - t
        n = args.lines
        print(f"generated {n:,} hostile lines ({path.stat().st_size / 1e6:,.0f} MB) "
              f"in {gen_s:.1f} s, seed {args.seed}")

        store = work / "store"
        rc, wall, out, err = run(
            [TOOLWATCH, "ingest", str(path), "-d", str(store), "--no-progress", "--json"], env
        )
        if rc != 0:
            crashes += 1
            print(f"ingest CRASHED (exit {rc}):\n{err[-3000:]}")
            s = {"lines_read": 0}
        else:
            s = json.loads(out.strip().splitlines()[-1])
        if rc == 0:
            accounted = (s["events_stored"] + s["summaries_stored"]
                         + s["rpc_responses_merged"] + s["quarantined_total"])
            unaccounted += abs(n - accounted) + abs(n - s["lines_read"])
            views = store_counts(store, env)
            unaccounted += abs(views["events"] - s["events_stored"])
            unaccounted += abs(views["summaries"] - s["summaries_stored"])
            unaccounted += abs(views["quarantine"] - s["quarantined_total"])
            print(f"ingest: exit {rc}, {wall:.1f} s, {n / wall:,.0f} lines/s")
            print(f"  lines read        {s['lines_read']:>10,}")
            print(f"  events stored     {s['events_stored']:>10,}  (view: {views['events']:,})")
            print(f"  summaries stored  {s['summaries_stored']:>10,}  "
                  f"(view: {views['summaries']:,})")
            print(f"  rpc merged        {s['rpc_responses_merged']:>10,}")
            print(f"  quarantined       {s['quarantined_total']:>10,}  "
                  f"(view: {views['quarantine']:,})")
            for reason, k in sorted(s["quarantined"].items(), key=lambda x: -x[1]):
                print(f"    {reason:<20}{k:>10,}")
            print(f"  sessions (view)   {views['sessions']:>10,}")
            flagged = subprocess.run(
                [PY, "-c", "import sys;from toolwatch.store import Store;"
                 "from toolwatch.query import query;s=Store(sys.argv[1]);"
                 "print(query(s, \"SELECT count(*) FILTER (WHERE flags IS NOT NULL) AS n "
                 "FROM events\").to_pylist()[0]['n'])", str(store)],
                capture_output=True, text=True, env=env,
            ).stdout.strip()
            print(f"  events with flags {int(flagged or 0):>10,}")
            # A re-run finds everything stored (the checkpoint moved to the end).
            rc2, _, out2, err2 = run(
                [TOOLWATCH, "ingest", str(path), "-d", str(store), "--no-progress", "--json"],
                env,
            )
            again = json.loads(out2.strip().splitlines()[-1]) if rc2 == 0 else None
            if rc2 != 0:
                crashes += 1
                print(f"re-ingest CRASHED (exit {rc2}):\n{err2[-3000:]}")
            elif again["lines_read"] != 0:
                unaccounted += again["lines_read"]
            print(f"  re-ingest: exit {rc2}, lines read again: "
                  f"{again['lines_read'] if again else '?'}")

        sub = work / "subset.jsonl"
        with open(path, "rb") as src, open(sub, "wb") as dst:
            for k, line in enumerate(src):
                if k >= args.analyze_lines:
                    break
                dst.write(line)
        m = min(args.analyze_lines, n)
        astore = work / "astore"
        rc, wall, out, err = run(
            [TOOLWATCH, "analyze", str(sub), "-d", str(astore), "--no-progress", "--quiet",
             "--alerts-out", str(work / "alerts.jsonl")],
            env,
        )
        if rc != 0:
            crashes += 1
            print(f"analyze CRASHED (exit {rc}):\n{err[-3000:]}")
        else:
            v = store_counts(astore, env)
            # merged JSON-RPC responses are in their request's event: count from ingest.
            print(f"analyze ({m:,} lines): exit {rc}, {wall:.1f} s, {m / wall:,.0f} lines/s; "
                  f"views: {v}")
        print(f"crashes: {crashes}   unaccounted: {unaccounted}")
        print("RESULT:", "PASS" if crashes == 0 and unaccounted == 0 else "FAIL")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if crashes or unaccounted:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
