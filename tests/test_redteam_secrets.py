"""Red team: secrets hidden by URL/form encoding, quotes and scheme-relative URLs.

The attacker writes the logs, and the logs carry other people's credentials: a query string
logged URL-encoded (``?api%5Fkey%3D…``), a whole encoded URL passed as an argument, an
``Authorization`` header logged form-encoded (``Bearer+…``, ``Bearer%20…``), a quoted value
(``secret='…'``, ``password: "…"``) or a scheme-relative URL (``//user:pass@host``). None of
them may reach the store, the quarantine or an alert unhashed.

Each shape here leaked in clear before the fix (found by ``/tmp`` probes through
``toolwatch ingest``); the end-to-end test runs the real CLI in a subprocess and reads every
view of the real store back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import SecretHasher

from tests.conftest import TOOLWATCH
from toolwatch.query import query
from toolwatch.store import Store

KEY = "ab" * 32
TS = "2026-11-02T10:00:00Z"
HASHER = SecretHasher(bytes.fromhex(KEY))

#: Texts that carry secret ``{S}`` in a shape the plain rules already know.
TEMPLATES = (
    "https://api.example.com/v1/items?api_key={S}&page=2",
    "https://api.example.com/v1/items?access_token={S}",
    "https://host/x?token={S}",
    "https://user:{S}@db.example.com:5432/prod",
    "Authorization: Bearer {S}",
    "Bearer {S}",
    "password={S}&user=bob",
    "client_secret={S}",
)


def _encoders() -> st.SearchStrategy:
    """Ways a logger (or an agent) encodes a text: none, URL, form, twice."""
    return st.sampled_from(
        [
            ("plain", lambda s: s),
            ("quote", lambda s: urllib.parse.quote(s, safe="")),
            ("quote_keep_slash", lambda s: urllib.parse.quote(s, safe="/:")),
            ("quote_plus", lambda s: urllib.parse.quote_plus(s)),
            ("twice", lambda s: urllib.parse.quote(urllib.parse.quote(s, safe=""), safe="")),
        ]
    )


secret_text = st.text(
    alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789", min_size=14,
    max_size=40,
).map(lambda s: "Q9" + s)  # never all hex: a digest can never spell it


@settings(max_examples=150, deadline=None)
@given(secret=secret_text, template=st.sampled_from(TEMPLATES), enc=_encoders(),
       prefix=st.sampled_from(["", "see ", "url=", "next: "]))
def test_encoded_secret_never_survives_scrub(secret: str, template: str, enc, prefix: str) -> None:
    """Whatever the encoding, neither the secret nor an encoded spelling of it remains."""
    name, encode = enc
    text = prefix + encode(template.format(S=secret))
    found: list[str] = []
    out = HASHER.scrub_str(text, found)
    assert secret not in out, (name, text, out)
    assert found, (name, text)
    # and through the JSON-line path (the one ingest runs), under an ordinary key
    line = json.dumps({"ts": TS, "tool": "t", "args": {"q": text}}).encode()
    red, h = HASHER.redact_line(line)
    assert secret.encode() not in red, (name, red)
    assert h is not None


@pytest.mark.parametrize(
    "text",
    [
        "secret='{S}' next=1",
        'password: "{S} two words" and more',
        "//admin:{S}@internal-host/path",
        "DSN is \\/\\/admin:{S}@db",
        "Bearer+{S}",
        "Authorization%3A%20Bearer%20{S}",
        "https%3A%2F%2Fuser%3A{S}%40host%2Fx",
        "https://host/x?api%5Fkey={S}",
        "https://host/x?token%3D{S}",
    ],
)
def test_hand_made_shapes_are_hashed(text: str) -> None:
    """The worst cases found by hand, one by one (each leaked before the fix)."""
    s = "Q9xW7vK3mP8rT2yZ"
    out = HASHER.scrub_str(text.format(S=s))
    assert s not in out, out
    assert "hmac:" in out


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com/a%20b?q=hello%20world",
        "100% sure, 50%+ off",
        "a+b=c and C++",
        "path%2Fto%2Ffile",
        "user%40example.com",
        "//cdn.example.com/lib.js",
        "http://user@host/",
        "pwd= and token=''",
    ],
)
def test_ordinary_encoded_text_is_left_alone(text: str) -> None:
    """The decoded scan changes a text only when the decoded text holds a secret."""
    assert HASHER.scrub_str(text) is text


def ingest_and_check_absent(tmp_path: Path, lines: list[str], secret: str) -> tuple[dict, Store]:
    """Ingest ``lines`` with the real CLI into a fresh store; assert exit 0, every line
    stored or quarantined, and ``secret`` in no view row and no file under the store.
    Returns the ingest summary and the store."""
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY=KEY)
    store = tmp_path / "st"
    res = subprocess.run(
        [TOOLWATCH, "ingest", str(src), "-d", str(store), "--json", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["events_stored"] + summary["quarantined_total"] == len(lines)
    st_ = Store(store)
    for view in ("events", "quarantine", "sessions"):
        for row in query(st_, f"SELECT * FROM {view}").to_pylist():
            dumped = json.dumps(row, default=str)
            assert secret not in dumped, (view, dumped[:600])
    for p in store.rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p
    return summary, st_


@pytest.mark.slow  # starts a process
def test_encoded_secrets_never_reach_the_store(tmp_path: Path) -> None:
    """Real CLI, real store: events, quarantine (cut and non-JSON lines) and raw bytes."""
    s = "Q9xW7vK3mP8rT2yZ"
    texts = [t.format(S=s) for t in TEMPLATES]
    encoded = [urllib.parse.quote(t, safe="") for t in texts] + [
        urllib.parse.quote_plus(t) for t in texts
    ]
    encoded += ["secret='" + s + "'", "//admin:" + s + "@db/x", "Bearer+" + s]
    lines = [json.dumps({"ts": TS, "session_id": "s1", "tool": "fetch", "args": {"u": e}})
             for e in encoded]
    # cut lines and plain text go to quarantine, scrubbed without structure
    lines += [json.dumps({"ts": TS, "tool": "t", "args": {"u": e}})[:-3] for e in encoded[:4]]
    lines += ["server says " + e for e in encoded[4:8]]
    summary, _ = ingest_and_check_absent(tmp_path, lines, s)
    assert summary["lines_read"] == len(lines)


def test_scheme_character_run_is_scanned_once() -> None:
    """``a.a.a.…//x@`` (every ``.`` a word boundary) made the URL rule rescan the run from
    each boundary: 100 kB took ~20 s, a 1 MiB line most of an hour of one ingest. Now one
    pass (figures: ``benchmarks/bench_secrets.py``, case ``a.a.a. run``); checked here by
    the result, not by time."""
    run = "a." * 50_000
    text = run + "//x@ :/ and " + run + "b://u:Q9secretpw@h"
    out = HASHER.scrub_str(text, tail=True)
    assert "Q9secretpw" not in out and out.startswith(run + "//x@ :/")
    line = json.dumps({"ts": TS, "tool": "t", "args": {"q": text}}).encode()
    red, h = HASHER.redact_line(line)
    assert b"Q9secretpw" not in red and h is not None


PEM_BODY = [
    "MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2d5rQ9xW7vK3mP8rT2yZabcdEFGH",
    "x9K2mQ8vB7nL4pR6tY1wZ3aC5eG7iK9mO1qS3uW5yA7cE9gI1kM3oQ5sU7wY9a==",
]


def _pem_lines() -> list[str]:
    return ["server config loaded; key follows:", "-----BEGIN RSA PRIVATE KEY-----",
            *PEM_BODY, "-----END RSA PRIVATE KEY-----", "ServerStartedSuccessfully"]


@pytest.mark.slow  # starts a process
def test_pem_body_over_several_lines_is_hashed_by_ingest(tmp_path: Path) -> None:
    """A server that prints a private key over several lines: only the first names it, so
    every body line was stored in clear (quarantine ``invalid_json``)."""
    src = tmp_path / "in.log"
    src.write_text("\n".join(_pem_lines()) + "\n")
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY=KEY)
    res = subprocess.run(
        [TOOLWATCH, "ingest", str(src), "-d", str(tmp_path / "st"), "--json", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    raws = [r["raw"] for r in query(Store(tmp_path / "st"),
        "SELECT raw FROM quarantine ORDER BY line_no").to_pylist()]
    assert len(raws) == len(_pem_lines())
    assert not any(b[:30] in r for b in PEM_BODY for r in raws), raws
    assert raws[-1] == "ServerStartedSuccessfully"  # a word without digits is no key


@pytest.mark.slow  # starts a process
def test_pem_body_on_a_wrapped_servers_stderr_is_hashed(tmp_path: Path) -> None:
    """The same through ``toolwatch run`` (non-JSON stderr: quarantine ``server_text``)."""
    script = tmp_path / "srv.py"
    script.write_text("import sys\nsys.stderr.write(%r)\n" % ("\n".join(_pem_lines()) + "\n"))
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY=KEY)
    res = subprocess.run(
        [TOOLWATCH, "run", "-d", str(tmp_path / "st"), "--", sys.executable, str(script)],
        env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    raws = [r["raw"] for r in query(Store(tmp_path / "st"),
        "SELECT raw FROM quarantine").to_pylist()]
    assert len(raws) == len(_pem_lines())
    assert not any(b[:30] in r for b in PEM_BODY for r in raws), raws


@settings(max_examples=150, deadline=None)
@given(
    secret=secret_text,
    where=st.integers(0, 3),
    copies=st.integers(2, 4),
    key=st.sampled_from(["args", "password", "q", "ts"]),
)
def test_duplicate_keys_never_hide_a_secret(secret: str, where: int, copies: int, key: str) -> None:
    """``{"args":{"password":S},"args":{}}``: orjson keeps the last value, DuckDB (which
    parses the stored line) the first, so a secret in any but the last copy was stored in
    clear in ``args`` and ``raw``."""
    values = ['{"q":"x"}'] * copies
    values[where % copies] = '{"password":"S","u":"https://u:S@h"}'.replace("S", secret)
    body = ",".join(f'"{key}":{v}' for v in values)
    line = ('{"ts":"' + TS + '","tool":"t",' + body + "}").encode()
    red, h = HASHER.redact_line(line)
    assert secret.encode() not in red, red
    assert h is not None
    # the first copy keeps its name (what DuckDB reads); the others are kept renamed
    obj = json.loads(red)
    assert key in obj and all(f"{key}#{i}" in obj for i in range(2, copies + 1))


@pytest.mark.slow  # starts a process
def test_duplicate_keys_through_ingest(tmp_path: Path) -> None:
    s = "Q9xW7vK3mP8rT2yZ"
    src = tmp_path / "in.jsonl"
    src.write_text(
        ('{"ts":"TS","session_id":"s","tool":"t","args":{"password":"S"},"args":{"q":"x"}}\n'
         '{"ts":"TS","session_id":"s","tool":"t","args":{"password":"S","password":null}}\n')
        .replace("TS", TS).replace('"S"', f'"{s}"')
    )
    env = dict(os.environ, XDG_CONFIG_HOME=str(tmp_path / "cfg"), TOOLWATCH_HMAC_KEY=KEY)
    res = subprocess.run(
        [TOOLWATCH, "ingest", str(src), "-d", str(tmp_path / "st"), "--json", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows = query(Store(tmp_path / "st"), "SELECT args, raw FROM events").to_pylist()
    assert len(rows) == 2
    for r in rows:
        assert s not in r["args"] and s not in r["raw"], r
        assert json.loads(r["args"])["password"].startswith("hmac:")


@pytest.mark.parametrize(
    "obj",
    [
        {"headers": [{"name": "Authorization", "value": "Bearer-less SECRET"}]},  # HAR
        {"env": [{"name": "DB_PASSWORD", "value": "SECRET"}, {"name": "HOME", "value": "/r"}]},
        {"Tags": [{"Key": "api_key", "Value": "SECRET"}]},  # cloud tags
        {"args": {"Bearer SECRET": 1}},  # a secret in a key that is itself secret-like
        {"args": {"token=SECRET": {"x": 1}}},
    ],
)
def test_named_values_and_secret_keys_are_hashed(obj: dict) -> None:
    """A value named by a sibling (``{"name": "DB_PASSWORD", "value": …}``) was kept in
    clear, and so was a key that both looks secret and holds the secret."""
    s = "Q9xW7vK3mP8rT2yZab"
    line = json.dumps(obj).replace("SECRET", s).encode()
    red, h = HASHER.redact_line(line)
    assert s.encode() not in red, red
    assert h is not None
    if "env" in obj:
        assert json.loads(red)["env"][1] == {"name": "HOME", "value": "/r"}  # others kept
