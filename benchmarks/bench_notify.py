"""Notifications: posts per attack, old (every alert version) vs incident messages.

Runs one real ``toolwatch tail`` with two webhook sinks on a local HTTP server, one with
``notify = "alerts"`` (what every webhook did before: one post per alert version) and one
with ``notify = "incidents"``, while an MCP server log gets, a line every 0.25 s, a
15-second enumeration, then credential stuffing, then a bulk pagination sweep by the same
caller (the shapes of tests/test_notify_live.py). Prints the posts each endpoint got.

    python benchmarks/bench_notify.py [--group-wait 5] [--group-interval 30]

Also times the notifier's roll-up on many held alerts (``--rollup N`` callers with four
alerts each): the first (full) roll-up and a flush touching one caller.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_notify_live import bulk_extraction, credential_stuffing, enumeration  # noqa: E402


def _serve() -> tuple[http.server.ThreadingHTTPServer, dict[str, list[dict]]]:
    got: dict[str, list[dict]] = {}

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.setdefault(self.path, []).append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            return

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, got


def posts(args: argparse.Namespace) -> None:
    srv, got = _serve()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    exe = str(Path(sys.executable).with_name("toolwatch"))
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        log = t / "mcp.log"
        log.write_text("")
        cfg = t / "tw.toml"
        cfg.write_text(
            "[live]\nflush_interval_s = 0.5\n\n"
            f'[[live.sinks]]\ntype = "webhook"\nurl = "{base}/alerts"\nnotify = "alerts"\n\n'
            f'[[live.sinks]]\ntype = "webhook"\nurl = "{base}/incidents"\n'
            f"group_wait_s = {args.group_wait}\ngroup_interval_s = {args.group_interval}\n"
        )
        env = dict(os.environ, XDG_CONFIG_HOME=str(t / "cfg"))
        proc = subprocess.Popen([exe, "tail", str(log), "-d", str(t / "store"), "-c",
                                 str(cfg), "--no-stdout"], env=env)
        phases = {"enumeration": enumeration(), "credential stuffing": credential_stuffing(),
                  "bulk sweep": bulk_extraction()}
        try:
            for name, text in phases.items():
                before = {k: len(v) for k, v in got.items()}
                with open(log, "a") as fh:
                    for ln in text.splitlines(keepends=True):
                        fh.write(ln)
                        fh.flush()
                        time.sleep(args.line_s)
                time.sleep(2.0)
                print(f"{name}: alert-version posts "
                      f"+{len(got.get('/alerts', [])) - before.get('/alerts', 0)}, "
                      f"incident messages so far {len(got.get('/incidents', []))}")
            time.sleep(args.group_interval + 1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            srv.shutdown()
    inc = got.get("/incidents", [])
    print(f"total: {len(got.get('/alerts', []))} alert-version posts vs {len(inc)} incident "
          f"messages ({sum(not m['update'] for m in inc)} new, "
          f"{sum(m['update'] for m in inc)} updates)")


def rollup(n_callers: int) -> None:
    from tests.test_notify import Clock, alert, frame, notifier

    cats = ("enumeration", "credential_stuffing", "bulk_extraction", "scraping_loop")
    f = frame(*[alert(cat, c * 7 + k * 60, caller=f"c{c}", ip=f"10.0.{c // 250}.{c % 250}")
                for c in range(n_callers) for k, cat in enumerate(cats)])
    clk = Clock()
    n = notifier(clk)
    t0 = time.perf_counter()
    n.add(f)
    full = time.perf_counter() - t0
    clk.at(1)
    t0 = time.perf_counter()
    n.add(frame(alert("enumeration", 5, caller="c1", n=2)))
    part = time.perf_counter() - t0
    print(f"roll-up of {f.height} held alerts: full {full * 1000:.0f} ms, a flush touching "
          f"one caller {part * 1000:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group-wait", type=float, default=5.0)
    ap.add_argument("--group-interval", type=float, default=30.0)
    ap.add_argument("--line-s", type=float, default=0.25, help="seconds between log lines")
    ap.add_argument("--rollup", type=int, default=0, help="callers for the roll-up timing")
    args = ap.parse_args()
    if args.rollup:
        rollup(args.rollup)
        return
    posts(args)


if __name__ == "__main__":
    main()
