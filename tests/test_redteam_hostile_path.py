"""Red team round 4: generated hostile lines carrying one secret, across the whole path.

Each line hides the same secret ``S`` in a shape ingest hashes (a secret key, a list
naming it, ``name=S``, prose, ``Bearer``, URL credentials, XML, JSON text inside a
string, URL-encoding), written with hostile encodings (characters of the name or of
``S`` as ``\\u`` escapes, look-alike letters) amid hostile noise (deep nesting, numbers
beyond float64, NaN/Infinity, duplicate keys, NUL, CR without LF, lone surrogates,
invalid UTF-8, keys shaped like SQL and HTML), sometimes cut short after the secret.

Fast: the redaction of every line (and the structure-free scrub of its cut form) never
keeps ``S``, escaped or not. Slow: the real CLI (``analyze``: ingest, detection, alerts),
``query`` of every view, and the dashboard's data functions never show ``S``; a
read-only query changes no file of the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import SecretHasher

from tests.conftest import TOOLWATCH
from tests.test_redteam_secrets_round3 import disguised_names

KEY = "cd" * 32
HASHER = SecretHasher(bytes.fromhex(KEY))
TS = "2026-11-02T10:00:00Z"

_ESC_RE = re.compile(r"\\+u([0-9a-fA-F]{4})")


def _decoded(text: str) -> str:
    """``text`` with ``\\uXXXX`` escapes (at any escaping depth) and percent-escapes
    decoded: a secret stored escaped is still in clear."""
    out = _ESC_RE.sub(lambda m: chr(int(m.group(1), 16)), text)
    out = out.replace("\\", "")
    return urllib.parse.unquote_plus(out, errors="replace")


def leaks(blob: bytes | str, secret: str) -> bool:
    text = blob.decode("utf-8", "replace") if isinstance(blob, bytes) else blob
    return secret in text or secret in _decoded(text)


def _esc(s: str, rnd: random.Random, p: float) -> str:
    """JSON text of ``s`` (no quotes) with some characters as ``\\u`` escapes."""
    out = []
    for c in s:
        if rnd.random() < p:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(json.dumps(c, ensure_ascii=False)[1:-1])
    return "".join(out)


SHAPES = (
    'KEYVAL', 'LIST', '"{n}={S}"', '"the {n} is {S}"', '"Bearer {S}"',
    '"https://bob:{S}@db.example/x"', '"<{n}>{S}</{n}>"', 'JSONTEXT', 'URLENC',
    '"mysql -u root -p{S} shop"', '"{n}\\uff1a{S}"', 'ARGV',
)
NOISE = (
    '"n":1e999', '"m":NaN', '"i":-Infinity', '"big":123456789012345678901234567890',
    '"SELECT * FROM events; --":1', '"<script>alert(1)</script>":"<img src=x onerror=1>"',
    '"nul":"a\\u0000b"', '"cr":"a\\rb"', '"sur":"\\ud800"', '"deep":' + "[" * 40 + "]" * 40,
    '"dup":1,"dup":2', '"\\u0000":"x"', '"html":"</textarea><b>x"', '"q":"\'; DROP TABLE x;--"',
)


@st.composite
def secret_line(draw) -> tuple[bytes, str, bool]:
    """One hostile line holding the secret; returns (line, secret, cut)."""
    secret = "Q9" + draw(st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghjkmnpqrstuvwxyz23456789",
                                 min_size=8, max_size=24)) + "z7"
    name = draw(st.one_of(st.sampled_from(["password", "api_key", "client_secret", "token",
                                           "Authorization", "passwd", "secret"]),
                          disguised_names()))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    p_name, p_val = draw(st.sampled_from([0.0, 0.3, 1.0])), draw(st.sampled_from([0.0, 0.3, 1.0]))
    n, s = _esc(name, rnd, p_name), _esc(secret, rnd, p_val)
    shape = draw(st.sampled_from(SHAPES))
    if shape == "KEYVAL":
        val = f'{{"{n}":"{s}"}}'
    elif shape == "LIST":
        val = f'["{n}","{s}"]'
    elif shape == "JSONTEXT":
        inner = json.dumps({name: secret}, ensure_ascii=draw(st.booleans()))
        for _ in range(draw(st.integers(1, 3))):
            inner = json.dumps(inner)
        val = inner
    elif shape == "URLENC":
        val = json.dumps(urllib.parse.quote(f"?{name}={secret}&page=2", safe=""))
    elif shape == "ARGV":
        val = f'["-u","root","-p","{s}"]'
    else:
        val = shape.replace("{n}", n).replace("{S}", s)
    fields = [f'"ts":"{TS}"', '"session_id":"s-1"', '"tool":"t"']
    args = f'{{"a":{val}}}'
    for _ in range(draw(st.integers(0, 3))):
        args = f'{{"x":{args}}}' if draw(st.booleans()) else f"[{args}]"
    noise = draw(st.lists(st.sampled_from(NOISE), max_size=3))
    body = ",".join([*fields, *noise, f'"args":{args}'])
    line = ("{" + body + "}").encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        line = b"\xff\xfe" + line if draw(st.booleans()) else line + b"\r"
    cut = draw(st.booleans())
    if cut:  # cut somewhere after the secret: a truncated line (quarantined)
        end = line.find(s.encode("utf-8", "surrogatepass")) + len(s.encode())
        line = line[: draw(st.integers(end, len(line)))] if end >= len(s) else line
    return line, secret, cut


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(item=secret_line())
def test_generated_hostile_lines_never_keep_the_secret(item) -> None:
    line, secret, _ = item
    red, _ = HASHER.redact_line(line)
    assert not leaks(red, secret), (line, red)
    assert not leaks(HASHER.scrub_text(line), secret), line


def _store_bytes_digest(store: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(items=st.lists(secret_line(), min_size=20, max_size=40))
def test_hostile_lines_through_cli_views_and_dashboard(tmp_path_factory, items) -> None:
    from toolwatch.dashboard import data

    from toolwatch.query import query
    from toolwatch.store import Store

    tmp = tmp_path_factory.mktemp("hostile-path")
    src = tmp / "in.jsonl"
    src.write_bytes(b"\n".join(x[0] for x in items) + b"\n")
    secrets = {x[1] for x in items}
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp / "cfg"), TOOLWATCH_HMAC_KEY=KEY,
               COLUMNS="200")
    store = tmp / "st"
    res = subprocess.run([TOOLWATCH, "analyze", str(src), "-d", str(store), "--no-progress",
                          "--alerts-out", str(tmp / "alerts.jsonl")],
                         env=env, capture_output=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    outputs = [res.stdout, res.stderr]
    before = _store_bytes_digest(store)
    for view in ("events", "quarantine", "sessions", "alerts"):
        q = subprocess.run([TOOLWATCH, "query", "-d", str(store), "--format", "json",
                            f"SELECT * FROM {view}"], env=env, capture_output=True, timeout=300)
        assert q.returncode == 0, q.stderr[-2000:]
        outputs += [q.stdout, q.stderr]
    assert _store_bytes_digest(store) == before  # a read-only query wrote nothing
    st_ = Store(store)
    shown: list[object] = [data.quarantine_by_reason(st_), data.list_alerts(st_),
                           data.alert_filter_options(st_),
                           data.top_values(st_, "tool") if hasattr(data, "top_values") else None]
    for sid in query(st_, "SELECT DISTINCT session_id FROM events").column(0).to_pylist()[:5]:
        if sid is not None:
            shown += [data.session_events(st_, sid), data.session_summary(st_, sid)]
    for eid in query(st_, "SELECT event_id FROM events LIMIT 20").column(0).to_pylist():
        shown.append(data.event_raw(st_, eid))
    blobs = [*outputs, *(str(x).encode() for x in shown)]
    blobs += [p.read_bytes() for p in store.rglob("*") if p.is_file()]
    if (tmp / "alerts.jsonl").exists():
        blobs.append((tmp / "alerts.jsonl").read_bytes())
    for b in blobs:
        for s in secrets:
            assert not leaks(b, s), (s, b[:2000])
