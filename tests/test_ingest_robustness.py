"""Bad input loses nothing and stops nothing; re-ingest is idempotent; secrets never stored."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TOOLWATCH

GOOD = {
    "ts": "2026-11-02T10:00:00Z",
    "session_id": "s",
    "tool": "getDocument",
    "args": {"documentId": "doc-1"},
}


def good(i: int) -> bytes:
    return json.dumps({**GOOD, "session_id": f"s{i}"}).encode()


MALFORMED = {
    "invalid_json": b'{"ts": "2026-11-02T10:00:00Z", "tool": "getDoc',
    "invalid_utf8": b'{"ts": "2026-11-02T10:00:00Z", "tool": "caf\xe9\xff"}',
    "not_object": b"[1, 2, 3]",
    "missing_timestamp": b'{"session_id": "x", "tool": "getDocument"}',
    "bad_timestamp": b'{"ts": "not a time", "tool": "getDocument"}',
    "no_tool": b'{"ts": "2026-11-02T10:00:00Z", "level": "info", "msg": "server started"}',
}


def test_each_malformed_line_is_quarantined_and_neighbours_survive(tw, write_lines, tmp_path):
    lines: list[bytes] = []
    for i, bad in enumerate(MALFORMED.values()):
        lines += [good(i * 2), bad, good(i * 2 + 1)]
    binary = bytes(range(256)).replace(b"\n", b"")
    lines += [binary, good(100)]
    huge = b'{"ts": "2026-11-02T10:00:00Z", "tool": "x", "blob": "' + b"A" * 2_000_000 + b'"}'
    lines += [huge, good(101)]
    path = write_lines(*lines)
    res = tw.ingest(path)
    expected = {k: 1 for k in MALFORMED} | {"line_too_long": 1}
    expected["invalid_utf8"] += 1  # the binary garbage line
    assert res["quarantined"] == expected
    assert res["events_stored"] == 2 * len(MALFORMED) + 2
    assert res["lines_read"] == len(lines)
    assert res["lines_read"] == res["events_stored"] + res["quarantined_total"]
    rows = tw.query("SELECT reason, line_no, source, raw_bytes, length(raw) AS n FROM quarantine")
    by_reason = {}
    for r in rows:
        by_reason.setdefault(r["reason"], []).append(r)
    assert by_reason["invalid_json"][0]["line_no"] == 2
    assert by_reason["line_too_long"][0]["raw_bytes"] > 2_000_000
    assert by_reason["line_too_long"][0]["n"] <= 4096  # truncated, not dropped
    assert all(r["source"] == str(path) for r in rows)


def test_truncated_final_line_without_newline(tw, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(good(1) + b"\n" + good(2) + b"\n" + b'{"ts": "2026-11-02T1')
    res = tw.ingest(path)
    assert res["events_stored"] == 2 and res["quarantined"] == {"invalid_json": 1}


def test_lines_longer_than_a_read_chunk(tw, tmp_path):
    """A line spanning several reads is stored whole, also as the unterminated last line.

    (Such a line once made the reader spin forever on its first chunk.)
    """
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[ingest]\nchunk_bytes = 4096\n")
    long = json.dumps({**GOOD, "session_id": "long", "args": {"q": "x" * 50_000}}).encode()
    last = json.dumps({**GOOD, "session_id": "last", "args": {"q": "y" * 9_000}}).encode()
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"\n".join([good(1), long, good(2), last]))
    res = tw.ingest(path, extra=("-c", str(cfg)))
    assert res["events_stored"] == 4 and res["quarantined_total"] == 0
    rows = tw.query(
        "SELECT session_id, line_no, strlen(raw) AS n FROM events ORDER BY line_no"
    )
    assert [(r["session_id"], r["line_no"]) for r in rows] == [
        ("s1", 1), ("long", 2), ("s2", 3), ("last", 4)
    ]
    assert rows[1]["n"] >= 50_000 and rows[3]["n"] >= 9_000


def test_over_long_lines_are_cut_while_read(tw, tmp_path):
    """Lines beyond max_line_bytes that span many reads: quarantined with their real size,
    their neighbours, line numbers and offsets intact, and nothing re-read on re-ingest."""
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[ingest]\nchunk_bytes = 4096\nmax_line_bytes = 10000\n")
    huge = b'{"ts": "2026-11-02T10:00:00Z", "tool": "x", "blob": "' + b"A" * 300_000 + b'"}'
    tail = b'{"ts": "2026-11-02T10:00:00Z", "tool": "y", "blob": "' + b"B" * 50_000
    path = tmp_path / "huge.jsonl"
    path.write_bytes(b"\n".join([good(1), huge, good(2), tail]))  # tail: no newline
    res = tw.ingest(path, extra=("-c", str(cfg)))
    assert res["events_stored"] == 2 and res["quarantined"] == {"line_too_long": 2}
    rows = tw.query(
        "SELECT line_no, \"offset\", raw_bytes, length(raw) AS n FROM quarantine ORDER BY line_no"
    )
    assert [(r["line_no"], r["offset"], r["raw_bytes"]) for r in rows] == [
        (2, len(good(1)) + 1, len(huge)),
        (4, len(good(1)) + len(huge) + len(good(2)) + 3, len(tail)),
    ]
    assert all(r["n"] <= 4096 for r in rows)
    events = tw.query('SELECT session_id, line_no, "offset" FROM events ORDER BY line_no')
    assert [(e["session_id"], e["line_no"]) for e in events] == [("s1", 1), ("s2", 3)]
    assert events[1]["offset"] == len(good(1)) + len(huge) + 2
    again = tw.ingest(path, extra=("-c", str(cfg)))
    assert again["events_stored"] == 0 and again["quarantined_total"] == 0


def test_reader_keeps_only_a_prefix_of_an_endless_line():
    """A stream that never sends a newline is read to its end holding one chunk at a time."""
    import io

    from toolwatch.ingest.sources.file import StreamReader

    class Endless(io.RawIOBase):
        def __init__(self, total: int):
            self.left = total

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            n = min(len(b), self.left)
            b[:n] = b"z" * n
            self.left -= n
            return n

    stream = io.BufferedReader(Endless(64 << 20), buffer_size=1 << 16)
    (batch,) = StreamReader(stream, "endless", 1 << 16, {}, max_line_bytes=1000).batches()
    assert len(batch) == 1 and batch.final
    assert len(batch.lines[0].as_py()) == 1004  # limit + 3 bytes + newline: still over-long
    assert batch.sizes.tolist() == [(64 << 20) + 1] and batch.end_offset == (64 << 20) + 1


def test_unreadable_source_fails_the_run_but_keeps_the_rest(tw, write_lines, tmp_path):
    """Exit code 1 and the error on stderr; the readable file is stored and the summary
    is printed whole (batch commands end without the interpreter's teardown)."""
    path = write_lines(*[good(i) for i in range(3)])
    missing = tmp_path / "missing.jsonl"
    for cmd, extra in (("ingest", ["--json"]), ("analyze", ["--alerts-out", str(tmp_path / "a")])):
        data_dir = tmp_path / f"store-{cmd}"
        proc = tw(cmd, str(path), str(missing), "-d", str(data_dir), *extra, check=False)
        assert proc.returncode == 1, proc.stderr
        assert "missing.jsonl" in proc.stderr and "cannot open" in proc.stderr
        if cmd == "ingest":
            summary = json.loads(proc.stdout.strip().splitlines()[-1])
            assert summary["events_stored"] == 3 and len(summary["failures"]) == 1
        else:
            assert "events stored" in proc.stdout and (tmp_path / "a").exists()
        n = tw("query", "SELECT count(*) AS n FROM events", "-d", str(data_dir), "-f", "json")
        assert json.loads(n.stdout)["n"] == 3


def test_reingest_is_idempotent_and_appends_are_picked_up(tw, write_lines, tmp_path):
    path = write_lines(*[good(i) for i in range(50)], b"garbage{")
    first = tw.ingest(path)
    assert first["events_stored"] == 50
    again = tw.ingest(path)
    assert again["events_stored"] == 0 and again["quarantined_total"] == 0
    # the same content under another name, gzip-compressed: same stream, nothing new
    gz = tmp_path / "copy.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert tw.ingest(gz)["events_stored"] == 0
    with open(path, "ab") as fh:
        fh.write(good(50) + b"\n" + good(51) + b"\n")
    assert tw.ingest(path)["events_stored"] == 2
    (row,) = tw.query("SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM events")
    assert row == {"n": 52, "d": 52}
    (q,) = tw.query("SELECT count(*) AS n FROM quarantine")
    assert q["n"] == 1


def _all_store_text(data_dir: Path) -> str:
    """Every value of every Parquet file in the store, as text (files are compressed)."""
    con = duckdb.connect()
    chunks = []
    for f in data_dir.rglob("*.parquet"):
        tbl = con.execute("SELECT * FROM read_parquet($f)", {"f": str(f)}).fetchall()
        chunks.append(repr(tbl))
    for f in data_dir.rglob("*"):
        if f.is_file() and f.suffix != ".parquet":
            chunks.append(f.read_bytes().decode("utf-8", "replace"))
    return "\n".join(chunks)


def test_secrets_are_hashed_everywhere(tw, write_lines, tmp_path):
    secret = "sk-live-PLANTED-9f8e7d6c5b4a"
    lines = [
        {**GOOD, "tool": "connectExternalService", "args": {"service": "s", "apiKey": secret}},
        {**GOOD, "tool": "login", "arguments": {"user": "a", "password": secret + "pw"}},
        {**GOOD, "tool": "call", "args": {"headers": {"Authorization": f"Bearer {secret}"}}},
        {**GOOD, "tool": "c2", "args": {"api\u004bey": secret}},  # escaped key spelling
        {
            "ts": "2026-11-02T10:00:01Z",
            "session_id": "r",
            "message": {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "connect", "arguments": {"token": secret}},
            },
        },
    ]
    path = write_lines(*lines)
    # and a truncated line carrying it, which must be quarantined without the clear value
    with open(path, "ab") as fh:
        fh.write(
            b'{"ts": "2026-11-02T10:00:00Z", "tool": "x", "args": {"apiKey": "'
            + secret.encode()
            + b'", "more\n'
        )
        # the escaped spelling on disk, as a serializer with ensure_ascii writes it
        fh.write(
            b'{"ts": "2026-11-02T10:00:00Z", "session_id": "e", "tool": "x", '
            b'"args": {"api\\u004bey": "' + secret.encode() + b'"}}\n'
        )
    res = tw.ingest(path)
    assert res["events_stored"] == 6 and res["quarantined_total"] == 1
    assert secret not in _all_store_text(tw.data_dir)
    rows = tw.query("SELECT tool, credential_hash FROM events WHERE credential_hash IS NOT NULL")
    assert len(rows) >= 4
    hashes = {r["credential_hash"] for r in rows if r["tool"] in ("connectExternalService", "c2")}
    assert len(hashes) == 1 and hashes.pop().startswith("hmac:")  # same secret, same hash
    # the key lives outside the store
    key_file = Path(tw.env["XDG_CONFIG_HOME"]) / "toolwatch" / "hmac.key"
    assert key_file.exists() and oct(key_file.stat().st_mode)[-3:] == "600"
    assert tw.data_dir not in key_file.parents


def test_hmac_key_inside_store_is_refused(tw, write_lines, tmp_path):
    cfg = tmp_path / "tw.toml"
    cfg.write_text(f'[secrets]\nhmac_key_file = "{tw.data_dir}/key"\n')
    proc = tw("ingest", str(write_lines(GOOD)), "-d", str(tw.data_dir), "-c", str(cfg), check=False)
    assert proc.returncode == 1 and "must not live inside the store" in proc.stderr


def test_sessionization_by_caller_and_gap(tw, write_lines, tmp_path):
    def ev(minute: int, caller: str | None = "alice", ip: str | None = None) -> dict:
        e = {"ts": f"2026-11-02T10:{minute:02d}:00Z", "tool": "t"}
        if caller:
            e["caller_id"] = caller
        if ip:
            e["client_ip"] = ip
        return e

    # alice: 0, 10, 20 (one session), 55 (gap 35 > 30 → new session); bob interleaved;
    # an ip-only actor.
    lines = [ev(0), ev(1, "bob"), ev(10), ev(20), ev(55), ev(56, "bob"), ev(5, None, "10.0.0.9")]
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[ingest]\nsession_gap_minutes = 30\nchunk_bytes = 64\n")  # batch per line
    tw("ingest", str(write_lines(*lines)), "-d", str(tw.data_dir), "-c", str(cfg))
    rows = tw.query(
        "SELECT session_id, count(*) AS n, bool_and(session_derived) AS d "
        "FROM events GROUP BY 1 ORDER BY 1"
    )
    assert all(r["d"] for r in rows)
    assert {r["session_id"]: r["n"] for r in rows} == {
        "derived:caller:alice@2026-11-02T10:00:00.000000Z": 3,
        "derived:caller:alice@2026-11-02T10:55:00.000000Z": 1,
        "derived:caller:bob@2026-11-02T10:01:00.000000Z": 1,
        "derived:caller:bob@2026-11-02T10:56:00.000000Z": 1,
        "derived:ip:10.0.0.9@2026-11-02T10:05:00.000000Z": 1,
    }


def test_query_is_read_only(tw, write_lines, tmp_path):
    tw.ingest(write_lines(GOOD))
    for sql in [
        "COPY events TO '/tmp/tw-exfil.csv'",
        "ATTACH '/tmp/x.db' AS x",
        "CREATE TABLE t AS SELECT 1",
        "INSERT INTO events SELECT * FROM events",
        "SELECT 1; SELECT 2",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SET enable_external_access = true",
        "PRAGMA database_list",
    ]:
        proc = tw("query", sql, "-d", str(tw.data_dir), check=False)
        assert proc.returncode == 2, sql  # refused by the guard (docs/query.md)
        assert "error" in proc.stderr.lower(), sql
    assert not Path("/tmp/tw-exfil.csv").exists()
    assert tw.query("SELECT count(*) AS n FROM events") == [{"n": 1}]


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_query_formats(tw, write_lines, fmt):
    tw.ingest(write_lines(GOOD, {**GOOD, "session_id": "s2"}))
    out = tw(
        "query", "SELECT session_id FROM events ORDER BY 1", "-d", str(tw.data_dir), "-f", fmt
    ).stdout
    assert "s2" in out
    if fmt == "csv":
        assert out.splitlines()[0] == "session_id"
    if fmt == "json":
        assert [json.loads(x)["session_id"] for x in out.splitlines()] == ["s", "s2"]


def test_unknown_config_key_names_file_and_key(tw, write_lines, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[ingest]\nmax_line_byte = 10\n")
    proc = tw("ingest", str(write_lines(GOOD)), "-c", str(cfg), "-d", str(tw.data_dir), check=False)
    assert proc.returncode == 1
    assert "max_line_byte" in proc.stderr and str(cfg) in proc.stderr


@pytest.mark.slow  # starts a process
def test_reader_runs_while_writer_writes(tw, tmp_path):
    """query keeps answering, with a growing count, while an ingest commits batches.

    The writer reads a pipe that the test fills in two halves, so a partial state exists
    for as long as the test needs to see it, however fast ingestion is.
    """
    lines = [
        json.dumps({**GOOD, "session_id": f"s{i % 500}", "args": {"documentId": f"doc-{i}"}})
        .encode()
        + b"\n"
        for i in range(120_000)
    ]
    cfg = tmp_path / "tw.toml"
    cfg.write_text("[ingest]\nchunk_bytes = 262144\n")  # many small commits
    writer = subprocess.Popen(
        [TOOLWATCH, "ingest", "-", "-d", str(tw.data_dir), "-c", str(cfg), "--json"],
        env=tw.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    counts = []

    def count() -> int:
        proc = tw(
            "query", "SELECT count(*) AS n FROM events", "-d", str(tw.data_dir), "-f", "json",
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        counts.append(json.loads(proc.stdout)["n"])
        return counts[-1]

    try:
        assert writer.stdin is not None
        writer.stdin.write(b"".join(lines[:60_000]))
        writer.stdin.flush()
        deadline = time.monotonic() + 120
        while count() == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert 0 < counts[-1] <= 60_000, counts  # readers see committed batches mid-run
        assert writer.poll() is None  # ... while the writer is still running
        writer.stdin.write(b"".join(lines[60_000:]))
        writer.stdin.close()
        while writer.poll() is None:
            count()
        writer.wait(timeout=240)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0, writer.stderr.read() if writer.stderr else ""
    assert counts == sorted(counts), "a reader saw events disappear"
    assert tw.query("SELECT count(*) AS n FROM events") == [{"n": 120_000}]


def test_a_file_without_its_commit_is_never_read_and_a_replay_adds_nothing(
    tw, write_lines, tmp_path
):
    """A writer killed between writing a data file and committing it leaves a file no
    commit names: never read. One killed before its checkpoint reached ``streams`` makes
    the next ingest read the log again: the tables' transactions drop every row."""
    path = write_lines(GOOD)
    tw.ingest(path)
    store_dir = tw.data_dir
    n = tw.query("SELECT count(*) AS n FROM events")[0]["n"]
    assert n > 0
    src = next(store_dir.glob("events/part-*.parquet"))
    shutil.copy(src, store_dir / "events" / "part-00000000000000000001-orphan.parquet")
    assert tw.query("SELECT count(*) AS n FROM events") == [{"n": n}]
    shutil.rmtree(store_dir / "streams")  # the checkpoints are lost: a full replay
    tw.ingest(path)
    assert tw.query("SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM events") == [
        {"n": n, "d": n}]


@pytest.mark.slow  # ingest of generated files per example
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.binary(min_size=0, max_size=300).map(lambda b: b.replace(b"\n", b"")),
        min_size=1,
        max_size=40,
    )
)
def test_arbitrary_bytes_never_crash_and_every_line_is_accounted_for(tmp_path_factory, lines):
    from toolwatch.ingest.pipeline import Pipeline
    from toolwatch.ingest.sources import FileSource

    from toolwatch.config import Config

    d = tmp_path_factory.mktemp("hyp")
    path = d / "in.jsonl"
    body = b"\n".join([good(0), *lines, good(1)]) + b"\n"
    path.write_bytes(body)
    cfg = Config()
    cfg.store.data_dir = str(d / "store")
    cfg.secrets.hmac_key_file = str(d / "key")
    pipe = Pipeline(cfg, None)
    totals = {"events": 0, "summaries": 0, "quarantine": 0}
    for batch in FileSource(str(path), 1 << 20, {}).batches():
        out = pipe.transform(batch)
        totals["events"] += out.events.num_rows
        totals["summaries"] += out.summaries.num_rows
        totals["quarantine"] += out.quarantine.num_rows
    n_lines = body.count(b"\n")
    merged = pipe.counters.rpc_responses_merged
    assert totals["events"] + totals["summaries"] + totals["quarantine"] + merged == n_lines
    assert totals["events"] >= 2


def test_reader_survives_a_file_replaced_between_listing_and_binding(tw, write_lines):
    """Compaction can delete a file a reader just listed: the reader lists again."""
    from toolwatch.query import query
    from toolwatch.store import Store

    tw.ingest(write_lines(GOOD))
    st = Store(tw.data_dir)
    real_files = st.files
    calls = {"n": 0}

    def stale_then_fresh(dataset: str) -> list[str]:
        calls["n"] += 1
        files = real_files(dataset)
        if dataset == "events" and calls["n"] == 1:
            return [*files, str(tw.data_dir / "events/date=2026-11-02/part-gone.parquet")]
        return files

    st.files = stale_then_fresh  # type: ignore[method-assign]
    assert query(st, "SELECT count(*) AS n FROM events").to_pylist() == [{"n": 1}]
    assert calls["n"] > len(("events", "summaries", "quarantine", "alerts"))  # it re-listed
