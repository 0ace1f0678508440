"""Independent power-user days: long, diverse, legitimate MCP use, with labels.

Written from a plain description of what heavy legitimate users of MCP tools do in a working
day — *not* from the detectors' rules or thresholds, and sharing no code with
``sample_logs/generate.py`` — so that ``benchmarks/bench_quality.py`` can measure how often
such days are flagged. What a day holds:

* an agent host connected to several MCP servers at once (code hosting, a file store, a
  chat, an issue tracker, a local filesystem, an analytics job runner, a web fetcher);
  each connection is its own MCP session (one session id per server connection), and the
  host reconnects after a long break (lunch), so a day is two or three host sessions;
* bursts of agent activity (calls a second or two apart, some fanned out in parallel)
  separated by idle stretches of minutes to an hour while the person reads or meets;
* searches that look at one to a few pages, then open some of the hits;
* repeated reads of the same few documents and files all day (the docs one works from);
* writes to one's own folders and own documents, comments on issues, chat messages;
* exports of one's own data (a report, an analytics result) of a few megabytes, sometimes
  uploaded to one's own drive folder or summarised in chat afterwards;
* polling a long-running job until it finishes (fixed interval, the model's own pace,
  or back-off);
* retries after rate limiting or server errors, a mistyped path, a document not shared
  with the user.

Callers work on ``days`` of the four days the seeded generator covers (2026-11-02 to
11-05) in their own time zone, so they have an own history the way real users do.

Log contract (docs/log-format.md): per-call events, one JSON object per line; the
``ts`` is the call's completion with ``duration_ms``. Two styles: ``power-day.jsonl``
(snake_case, ISO times) and ``power-day-camel.jsonl`` (camelCase, epoch milliseconds,
outcomes as words/HTTP codes), split by server. ``labels.ndjson`` holds one
``kind: session`` label per MCP session, ``label: benign``, ``role: power_day``.

Usage::

    python benchmarks/power_day.py --out-dir /tmp/pd --seed 1 --callers 40 --days 3
"""

from __future__ import annotations

import argparse
import math
import random
import string
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

#: First day of the seeded generator's traffic (sample_logs/README.md).
T0 = datetime(2026, 11, 2, tzinfo=UTC).timestamp()
N_DAYS = 4
#: Servers written in the camelCase style; the rest in snake_case.
CAMEL_SERVERS = {"tracker", "analytics", "chat"}

_FIRST = ("ana", "ben", "chen", "dara", "eli", "fatima", "gus", "hana", "ivo", "jun", "kemal",
          "lea", "mika", "nora", "omar", "pia", "raj", "sofia", "tom", "uma", "vik", "wen",
          "yara", "zoe")
_LAST = ("k", "m", "s", "t", "b", "r", "l", "w", "n", "p")
_WORDS = ("latency", "budget", "q3 plan", "onboarding", "retry policy", "invoice export",
          "release notes", "migration", "dashboard", "incident 4411", "schema change",
          "pricing", "customer churn", "api limits", "roadmap", "postgres upgrade",
          "design review", "flaky test", "cache", "search ranking", "ssl renewal",
          "data retention", "kpi", "okr", "sprint", "hiring loop", "vendor contract")


@dataclass
class _Session:
    sid: str
    server: str
    calls: list[dict[str, Any]] = field(default_factory=list)


class _Day:
    """One caller's working day: a clock, the open connections and the calls made."""

    def __init__(self, rng: random.Random, user: dict[str, Any], start: float, end: float):
        self.r = rng
        self.u = user
        self.t = start
        self.end = end
        self.sessions: list[_Session] = []
        self.open: dict[str, _Session] = {}

    # -- plumbing ---------------------------------------------------------------------------
    def _sid(self) -> str:
        return "".join(self.r.choices(string.hexdigits.lower()[:16], k=32))

    def reconnect(self) -> None:
        """The agent host restarts: every server connection gets a new session id."""
        self.open = {}

    def _session(self, server: str) -> _Session:
        s = self.open.get(server)
        if s is None:
            s = _Session(self._sid(), server)
            self.open[server] = s
            self.sessions.append(s)
        return s

    def _dur(self, median_ms: float, spread: float = 0.6) -> float:
        return min(60_000.0, self.r.lognormvariate(math.log(median_ms), spread))

    def call(self, server: str, tool: str, args: dict[str, Any], *, status: str = "ok",
             nbytes: int | None = None, rows: int | None = None, median_ms: float = 250,
             at: float | None = None) -> float:
        """Record one call starting at ``at`` (default: now); returns its end time."""
        start = self.t if at is None else at
        dur = self._dur(median_ms)
        if nbytes is None:
            nbytes = int(self.r.lognormvariate(math.log(6000), 0.8))
        if status != "ok":
            nbytes = int(self.r.uniform(80, 400))
            rows = 0
        self._session(server).calls.append({
            "start": start, "dur": dur, "server": server, "tool": tool, "args": args,
            "status": status, "bytes": nbytes, "rows": rows,
        })
        return start + dur / 1000

    def step(self, server: str, tool: str, args: dict[str, Any], **kw: Any) -> None:
        """A sequential agent step: call, wait for the answer, think a little."""
        end = self.call(server, tool, args, **kw)
        self.t = end + self.r.lognormvariate(math.log(1.2), 0.7)

    def fan_out(self, specs: list[tuple[str, str, dict[str, Any], dict[str, Any]]]) -> None:
        """Parallel tool calls of one model turn (all sent together, awaited together)."""
        ends = [self.call(s, t, a, at=self.t + self.r.uniform(0, 0.05), **kw)
                for s, t, a, kw in specs]
        self.t = max(ends) + self.r.lognormvariate(math.log(1.5), 0.6)

    def robust_step(self, server: str, tool: str, args: dict[str, Any], **kw: Any) -> None:
        """A step that may be rate limited or fail and is retried with back-off."""
        r = self.r
        tries = 0
        while tries < 4:
            x = r.random()
            if x < 0.02:
                self.step(server, tool, args, status="rate_limited")
            elif x < 0.03:
                self.step(server, tool, args, status="error")
            else:
                self.step(server, tool, args, **kw)
                return
            tries += 1
            self.t += (2 ** tries) * r.uniform(0.5, 1.5)
        self.step(server, tool, args, **kw)

    # -- what people do ---------------------------------------------------------------------
    def research(self) -> None:
        """Search one place, look at a page or a few, open some hits, re-read a favourite."""
        r, u = self.r, self.u
        q = r.choice(_WORDS)
        where = r.choice(("code", "drive", "chat", "tracker", "web"))
        pages = 1
        while pages < 5 and r.random() < 0.4:
            pages += 1
        hits: list[tuple[str, str, dict[str, Any]]] = []
        for p in range(1, pages + 1):
            if where == "code":
                self.robust_step("github", "search_code", {"q": f"{q} repo:{u['repo']}",
                                 "page": p, "per_page": 30},
                                 nbytes=int(r.uniform(8e3, 40e3)), rows=30, median_ms=600)
                hits += [("github", "get_file_contents",
                          {"owner": u["org"], "repo": u["repo"], "path": r.choice(u["files"])})
                         for _ in range(r.randint(1, 4))]
            elif where == "drive":
                args: dict[str, Any] = {"query": q, "pageSize": 25}
                if p > 1:
                    args["pageToken"] = "".join(r.choices(string.ascii_letters, k=24))
                self.robust_step("drive", "search_files", args,
                                 nbytes=int(r.uniform(4e3, 15e3)), rows=25, median_ms=400)
                hits += [("drive", "read_file", {"fileId": r.choice(u["docs"])})
                         for _ in range(r.randint(1, 3))]
            elif where == "chat":
                self.robust_step("chat", "search_messages", {"query": q, "page": p, "count": 20},
                                 nbytes=int(r.uniform(5e3, 20e3)), rows=20, median_ms=500)
                if r.random() < 0.5:
                    thread = f"{1793600000 + r.randint(0, 400000)}.{r.randint(100000, 999999)}"
                    hits.append(("chat", "get_thread_replies",
                                 {"channel": r.choice(u["channels"]), "thread_ts": thread}))
            elif where == "tracker":
                self.robust_step("tracker", "search_issues",
                                 {"jql": f'project = {u["project"]} AND text ~ "{q}"',
                                  "startAt": (p - 1) * 50, "maxResults": 50},
                                 nbytes=int(r.uniform(10e3, 60e3)), rows=50, median_ms=700)
                hits += [("tracker", "get_issue", {"issue_id": self._issue()})
                         for _ in range(r.randint(1, 4))]
            else:
                self.robust_step("web", "web_search", {"query": q, "offset": (p - 1) * 10},
                                 nbytes=int(r.uniform(3e3, 9e3)), rows=10, median_ms=900)
                sites = ("docs.python.org", "developer.mozilla.org", "stackoverflow.com",
                         "learn.microsoft.com", "kubernetes.io")
                hits += [("web", "fetch",
                          {"url": f"https://{r.choice(sites)}/{r.randint(1, 99999)}"})
                         for _ in range(r.randint(1, 3))]
        # Open hits, often several at once (parallel tool calls of one turn).
        r.shuffle(hits)
        while hits:
            k = min(len(hits), r.choice((1, 1, 2, 3, 4)))
            batch, hits = hits[:k], hits[k:]
            self.fan_out([(s, t, a, {"median_ms": 300}) for s, t, a in batch])
        if r.random() < 0.6:
            self.favourite()

    def _issue(self) -> str:
        u = self.u
        # Active issues cluster near the project's head, with a long tail of older ones.
        back = int(self.r.expovariate(1 / 60))
        return f"{u['project']}-{u['head'] - back}"

    def favourite(self) -> None:
        """Re-read the docs and files one works from (the same ones all day)."""
        r, u = self.r, self.u
        for _ in range(r.choice((1, 1, 2, 3))):
            if r.random() < 0.5:
                self.robust_step("drive", "read_file", {"fileId": r.choice(u["fav_docs"])},
                                 nbytes=int(r.uniform(20e3, 120e3)), median_ms=350)
            else:
                self.robust_step("fs", "read_file", {"path": r.choice(u["fav_files"])},
                                 nbytes=int(r.uniform(2e3, 30e3)), median_ms=40)

    def code_work(self) -> None:
        """Edit one's own project: list, read files (in parallel), write, read back."""
        r, u = self.r, self.u
        self.step("fs", "list_directory", {"path": r.choice(u["dirs"])},
                  nbytes=int(r.uniform(500, 4000)), median_ms=20)
        paths = r.sample(u["files_local"], r.randint(2, 6))
        if r.random() < 0.1:  # a mistyped path first
            self.step("fs", "read_file", {"path": paths[0] + "x"}, status="not_found",
                      median_ms=10)
        self.fan_out([("fs", "read_file", {"path": p}, {"median_ms": 30,
                       "nbytes": int(r.uniform(1e3, 40e3))}) for p in paths[:4]])
        for p in r.sample(paths, r.randint(1, min(3, len(paths)))):
            self.step("fs", "write_file", {"path": p, "content": "…"}, nbytes=120,
                      median_ms=25)
            if r.random() < 0.5:
                self.step("fs", "read_file", {"path": p}, nbytes=int(r.uniform(1e3, 40e3)),
                          median_ms=30)
        if r.random() < 0.3:
            note = f"/home/{u['login']}/notes/{datetime.fromtimestamp(self.t, UTC):%Y-%m-%d}.md"
            self.step("fs", "write_file", {"path": note, "content": "…"}, nbytes=100)
        if r.random() < 0.4:
            self.step("github", "create_pull_request",
                      {"owner": u["org"], "repo": u["repo"], "title": r.choice(_WORDS),
                       "head": f"{u['login']}/{r.randint(100, 999)}", "base": "main"},
                      median_ms=900)

    def triage(self) -> None:
        """Go through tracker issues: list, open several, comment or update a few."""
        r, u = self.r, self.u
        for p in range(r.choice((1, 1, 1, 2))):
            self.robust_step("tracker", "search_issues",
                             {"jql": f"project = {u['project']} AND assignee = currentUser()",
                              "startAt": p * 50, "maxResults": 50},
                             nbytes=int(r.uniform(10e3, 60e3)), rows=50, median_ms=700)
        issues = [self._issue() for _ in range(r.randint(3, 9))]
        if r.random() < 0.05:
            self.step("tracker", "get_issue", {"issue_id": f"SEC-{r.randint(10, 400)}"},
                      status="denied")
        for i in issues:
            self.robust_step("tracker", "get_issue", {"issue_id": i},
                             nbytes=int(r.uniform(3e3, 25e3)), median_ms=300)
            x = r.random()
            if x < 0.25:
                self.step("tracker", "add_comment", {"issue_id": i, "body": "…"}, median_ms=400)
            elif x < 0.35:
                self.step("tracker", "update_issue",
                          {"issue_id": i, "fields": {"status": r.choice(("In Progress",
                                                                         "Review", "Done"))}},
                          median_ms=500)

    def chat(self) -> None:
        """Catch up on channels (a cursor page or two) and post a message."""
        r, u = self.r, self.u
        for ch in r.sample(u["channels"], r.randint(1, 3)):
            cursor = None
            for _ in range(r.choice((1, 1, 2, 3))):
                args: dict[str, Any] = {"channel": ch, "limit": 50}
                if cursor:
                    args["cursor"] = cursor
                self.robust_step("chat", "get_channel_history", args,
                                 nbytes=int(r.uniform(8e3, 40e3)), rows=50, median_ms=350)
                cursor = "".join(r.choices(string.ascii_letters + string.digits, k=20))
        if r.random() < 0.5:
            self.step("chat", "post_message", {"channel": r.choice(u["channels"]),
                                               "text": "…"}, median_ms=300)

    def export(self) -> None:
        """Export one's own data: a drive document, or an analytics job polled to the end."""
        r, u = self.r, self.u
        if r.random() < 0.5:
            fid = r.choice(u["docs"])
            self.robust_step("drive", "export_file",
                             {"fileId": fid, "mimeType": r.choice(
                                 ("application/pdf", "text/csv",
                                  "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"))},
                             nbytes=int(r.lognormvariate(math.log(1.5e6), 0.8)),
                             median_ms=2500)
            size = 0
        else:
            self.step("analytics", "run_query",
                      {"sql": f"select * from {u['login']}_workspace."
                              f"{r.choice(('events', 'orders', 'usage', 'tickets'))} "
                              "where day >= current_date - 30"},
                      nbytes=200, median_ms=400)
            job = "job_" + "".join(r.choices(string.ascii_lowercase + string.digits, k=12))
            runtime = min(400.0, r.lognormvariate(math.log(45), 0.8))
            started = self.t
            style = r.choice(("fixed", "model", "backoff"))
            wait = 2.0
            while True:
                done = self.t - started >= runtime
                self.step("analytics", "get_job_status", {"jobId": job},
                          nbytes=160 if not done else 240, median_ms=80)
                if done:
                    break
                if style == "fixed":
                    self.t += 5.0
                elif style == "model":
                    self.t += r.uniform(2, 12)
                else:
                    self.t += wait
                    wait = min(30.0, wait * 2)
            size = int(r.lognormvariate(math.log(3e6), 0.9))
            self.robust_step("analytics", "download_result", {"jobId": job, "format": "csv"},
                             nbytes=size, rows=size // 120, median_ms=3000)
        x = r.random()
        if x < 0.3:  # keep a copy in one's own folder
            self.step("drive", "upload_file",
                      {"parentFolderId": u["folder"], "name": f"export-{r.randint(1, 999)}.csv"},
                      nbytes=300, median_ms=1500)
        elif x < 0.5:
            self.step("chat", "post_message", {"channel": r.choice(u["channels"]),
                                               "text": f"numbers are in ({size} bytes)"},
                      median_ms=300)

    def browse(self) -> None:
        """Read some pages of documentation on the web."""
        r = self.r
        site = r.choice(("docs.python.org/3/library", "docs.pola.rs/api", "duckdb.org/docs",
                         "kubernetes.io/docs/concepts"))
        for _ in range(r.randint(1, 5)):
            page = r.choice(_WORDS).replace(" ", "-")
            self.robust_step("web", "fetch", {"url": f"https://{site}/{page}"},
                             nbytes=int(r.uniform(10e3, 90e3)), median_ms=800)

    def work(self) -> None:
        """The day: tasks in bursts, idle stretches between, a reconnect after lunch."""
        r = self.r
        tasks = (self.research, self.code_work, self.triage, self.chat, self.export,
                 self.favourite, self.browse)
        weights = (5, 4, 3, 3, 1, 2, 1)
        lunch = self.t + r.uniform(3.0, 4.5) * 3600
        had_lunch = False
        while self.t < self.end:
            r.choices(tasks, weights)[0]()
            x = r.random()
            if x < 0.55:
                self.t += r.uniform(5, 90)
            elif x < 0.9:
                self.t += r.uniform(90, 900)
            else:
                self.t += r.uniform(900, 2700)
            if not had_lunch and self.t >= lunch:
                had_lunch = True
                self.t += r.uniform(40, 75) * 60
                self.reconnect()
            elif r.random() < 0.01:  # the person restarts the client
                self.reconnect()


def _user(r: random.Random, i: int) -> dict[str, Any]:
    login = f"{r.choice(_FIRST)}.{r.choice(_LAST)}{i}"
    repo = r.choice(("billing-api", "web-app", "etl", "infra", "ml-platform", "mobile"))
    files = [f"{d}/{n}" for d in ("src", "src/api", "src/core", "tests", "docs")
             for n in r.sample(("main.py", "util.py", "models.py", "routes.py", "db.py",
                                "config.yaml", "README.md", "handlers.py", "cli.py",
                                "schema.sql", "test_api.py", "conftest.py"), 5)]
    local = [f"/home/{login}/work/{repo}/{f}" for f in files]
    docs = ["1" + "".join(r.choices(string.ascii_letters + string.digits + "-_", k=32))
            for _ in range(r.randint(20, 60))]
    return {
        "login": login,
        "caller": f"{login}@acme.example",
        "ip": r.choice((f"10.20.{r.randint(0, 3)}.{r.randint(2, 250)}",
                        ".".join(map(str, (r.choice((73, 98, 174, 24)), r.randint(1, 254),
                                           r.randint(1, 254), r.randint(1, 254)))))),
        "tz": r.choice((-8, -5, -5, 0, 1, 1, 2, 5.5)),
        "org": "acme", "repo": repo, "files": files, "files_local": local,
        "fav_files": r.sample(local, 3),
        "dirs": sorted({p.rsplit("/", 1)[0] for p in local}),
        "docs": docs, "fav_docs": r.sample(docs, r.randint(3, 6)),
        "folder": "0B" + "".join(r.choices(string.ascii_letters, k=20)),
        "channels": r.sample(("#eng", "#data", "#incidents", "#release", "#team-" + repo,
                              "#random", "#support-escalations", "#design"), 4),
        "project": r.choice(("PLAT", "DATA", "WEB", "OPS", "ML")),
        "head": r.randint(1500, 9000),
    }


def _style(call: dict[str, Any], sid: str, u: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    end = call["start"] + call["dur"] / 1000
    if call["server"] in CAMEL_SERVERS:
        outcome = {"ok": "success", "rate_limited": "429", "error": "500",
                   "not_found": "404", "denied": "forbidden"}[call["status"]]
        rec = {"timestamp": round(end * 1000), "sessionId": sid, "callerId": u["caller"],
               "clientIp": u["ip"], "serverName": call["server"], "toolName": call["tool"],
               "arguments": call["args"], "outcome": outcome,
               "isError": call["status"] != "ok", "bytesReturned": call["bytes"],
               "durationMs": round(call["dur"], 1)}
        if call["rows"] is not None:
            rec["rowsReturned"] = call["rows"]
        return True, rec
    ts = datetime.fromtimestamp(end, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    rec = {"ts": ts, "session_id": sid, "caller_id": u["caller"], "client_ip": u["ip"],
           "server": call["server"], "tool": call["tool"], "args": call["args"],
           "status": call["status"], "bytes": call["bytes"], "duration_ms": round(call["dur"], 1)}
    if call["rows"] is not None:
        rec["rows"] = call["rows"]
    return False, rec


def write(out_dir: str | Path, seed: int = 1, callers: int = 40, days: int = 3) -> dict[str, int]:
    """Write the power-user days and their labels into ``out_dir``.

    Parameters
    ----------
    out_dir
        Directory (created); gets ``power-day.jsonl``, ``power-day-camel.jsonl`` and
        ``labels.ndjson``.
    seed
        Random seed (deterministic output).
    callers
        Number of power users.
    days
        Working days per user, among the generator's four (2026-11-02 to 11-05).

    Returns
    -------
    dict
        ``sessions``, ``calls`` and ``callers`` written.
    """
    r = random.Random(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    snake: list[tuple[float, bytes]] = []
    camel: list[tuple[float, bytes]] = []
    labels: list[tuple[float, bytes]] = []
    n_calls = 0
    for i in range(callers):
        u = _user(r, i)
        for d in sorted(r.sample(range(N_DAYS), min(days, N_DAYS))):
            local_start = r.uniform(7.5, 10.0) * 3600
            length = r.uniform(6.5, 10.0) * 3600
            start = T0 + d * 86400 + local_start - u["tz"] * 3600
            day = _Day(r, u, start, start + length)
            day.work()
            for s in day.sessions:
                if not s.calls:
                    continue
                s.calls.sort(key=lambda c: c["start"])
                ends = []
                for c in s.calls:
                    is_camel, rec = _style(c, s.sid, u)
                    end = c["start"] + c["dur"] / 1000
                    ends.append(end)
                    (camel if is_camel else snake).append((end, orjson.dumps(rec)))
                n_calls += len(s.calls)
                first = min(c["start"] for c in s.calls)

                def iso(x: float) -> str:
                    return datetime.fromtimestamp(x, UTC).isoformat(
                        timespec="milliseconds").replace("+00:00", "Z")

                labels.append((first, orjson.dumps({
                    "kind": "session", "session_id": s.sid, "caller_id": u["caller"],
                    "client_ip": u["ip"], "server": s.server, "label": "benign",
                    "role": "power_day", "variant": None, "first_seen": iso(first),
                    "last_seen": iso(max(ends)), "n_calls": len(s.calls),
                })))
    for name, rows in (("power-day.jsonl", snake), ("power-day-camel.jsonl", camel),
                       ("labels.ndjson", labels)):
        rows.sort(key=lambda x: x[0])
        (out / name).write_bytes(b"".join(b + b"\n" for _, b in rows))
    return {"sessions": len(labels), "calls": n_calls, "callers": callers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--callers", type=int, default=40)
    ap.add_argument("--days", type=int, default=3)
    a = ap.parse_args()
    print(orjson.dumps(write(a.out_dir, a.seed, a.callers, a.days)).decode())


if __name__ == "__main__":
    main()
