"""Red team round 2: secrets in shapes the first round left open.

* ``user:pass@host`` with no scheme (``"client_ip": "admin:pw@10.0.0.1"``, a DSN without
  ``scheme://``, ``ssh admin:pw@host:22`` in free text) was stored in clear;
* a credential named in prose (``"invalid token sk…"``, ``"bad api key: X"``, ``"the
  password is X"``) in an error or outcome message was stored in clear;
* a list naming its next element (``["password", S]``, ``[["Authorization", "Bearer …"]]``,
  ``["api_key", S, "page", 2]``, ``[{"k": "password"}, {"v": S}]``) kept ``S``, in
  arguments, in JSON text inside a string and in cut (quarantined) lines.

Each shape leaked before the fix; the end-to-end test runs the real CLI and reads every
view of the real store and every file it wrote back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import SecretHasher

from tests.test_redteam_secrets import ingest_and_check_absent
from toolwatch.query import query

KEY = "ab" * 32
TS = "2026-11-02T10:00:00Z"
HASHER = SecretHasher(bytes.fromhex(KEY))

#: a password: letters and digits (always both), some punctuation; never all hex
secret_text = st.text(
    alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789!$*-_.~",
    min_size=8, max_size=30,
).map(lambda s: "Q9" + s + "z7")
user_text = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12
).map(lambda s: "u" + s)
hosts = st.one_of(
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t))),
    st.sampled_from(["db.example.com", "localhost", "[::1]", "h", "10.0.0.1"]),
)
ports = st.one_of(st.just(""), st.integers(1, 65535).map(lambda p: f":{p}"))


def _leaks(secret: str, out: bytes | str) -> bool:
    data = out if isinstance(out, bytes) else out.encode()
    return secret.encode() in data


# ------------------------------------------------------------------ 1. user:pass@host
@settings(max_examples=200, deadline=None)
@given(user=user_text, pw=secret_text, host=hosts, port=ports,
       field=st.sampled_from(["client_ip", "ip", "remote_addr", "clientIp", "note"]),
       around=st.sampled_from(["{}", "connect {} now", "dsn={}", "({})", "ssh {}:/srv"]))
def test_schemeless_userinfo_is_hashed(user, pw, host, port, field, around) -> None:
    value = around.format(f"{user}:{pw}@{host}{port}")
    line = json.dumps({"ts": TS, "session_id": "s", "tool": "t", field: value,
                       "args": {"q": value}}).encode()
    red, h = HASHER.redact_line(line)
    assert not _leaks(pw, red), red
    assert h is not None
    # the user and the host stay readable (forensics: who connected where)
    assert host.encode() in red and user.encode() in red
    # the structure-free scan (quarantined, cut lines) too
    assert not _leaks(pw, HASHER.scrub_text(line[:-2]))
    assert HASHER.candidate_pattern  # (the batch prefilter is checked end to end below)


@pytest.mark.parametrize(
    "text",
    ["mailto:bob@example.com", "git@github.com:org/repo.git", "see you at 10:30@home",
     "bob@example.com", "time 10:00:00Z", "sip:alice@pbx.example.com",
     # toolwatch's own derived session ids (logged back, or forged) stay as they are
     "derived:caller:alice@2026-11-02T10:00:00.000000Z",
     "derived:ip:10.0.0.1@2026-11-02T10:00:00Z"],
)
def test_addresses_that_are_not_credentials_stay(text: str) -> None:
    assert HASHER.scrub_str(text) is text


# ------------------------------------------------------------------ 2. prose
PROSE = (
    "invalid token {S}",
    "Invalid Token: {S}",
    "bad api key: {S}",
    "invalid api key {S}",
    "auth failed for token {S}",
    "the password is {S}",
    "API key {S} was revoked",
    "unknown secret key {S}.",
    "login failed: wrong password '{S}'",
    "access key = {S}",
    "session token {S} expired",
)


@settings(max_examples=200, deadline=None)
@given(secret=secret_text, template=st.sampled_from(PROSE),
       field=st.sampled_from(["status", "outcome", "error", "message", "detail"]))
def test_credentials_named_in_prose_are_hashed(secret: str, template: str, field: str) -> None:
    msg = template.format(S=secret)
    line = json.dumps({"ts": TS, "session_id": "s", "tool": "t", field: msg,
                       "result": {"error": {"message": msg}}}).encode()
    red, h = HASHER.redact_line(line)
    assert not _leaks(secret, red), (msg, red)
    assert h is not None
    assert not _leaks(secret, HASHER.scrub_text(line[: len(line) // 2 + len(msg)]))


@pytest.mark.parametrize(
    "text",
    ["token expired", "password reset requested", "invalid token for user bob",
     "the key is 1234", "max tokens 4096", "primary key violation on orders",
     "token count exceeded", "wrong password", "Secret Santa 2026 list"],
)
def test_ordinary_prose_stays(text: str) -> None:
    assert HASHER.scrub_str(text) is text


# ------------------------------------------------------------------ 3. lists naming values
LISTS = (
    ["password", "{S}"],
    ["api_key", "{S}", "page", 2],
    [["Authorization", "Bearer-less {S}"]],
    [["Authorization", "{S}"], ["Accept", "json"]],
    [{"k": "password"}, {"v": "{S}"}],
    [{"key": "client_secret"}, "{S}"],
    ["X-Api-Key", {"value": "{S}"}],
    ["token", "{S}"],
    ["PIN", "{S}"],
)


@settings(max_examples=150, deadline=None)
@given(secret=secret_text, shape=st.sampled_from(LISTS),
       where=st.sampled_from(["args", "headers", "params"]))
def test_lists_naming_the_next_element_are_hashed(secret: str, shape, where: str) -> None:
    value = json.loads(json.dumps(shape).replace("{S}", secret))
    line = json.dumps({"ts": TS, "session_id": "s", "tool": "t", where: value}).encode()
    red, h = HASHER.redact_line(line)
    assert not _leaks(secret, red), red
    assert h is not None
    # inside JSON text in a string, and in a line cut before its end (quarantine)
    body = json.dumps({"ts": TS, "tool": "t", "args": {"body": json.dumps(value)}}).encode()
    assert not _leaks(secret, HASHER.redact_line(body)[0])
    assert not _leaks(secret, HASHER.scrub_text(line[:-3]))


def test_lists_of_names_and_ordinary_lists_stay() -> None:
    for value in (["password", "token", "api_key"], ["a", "b"], [1, 2, 3],
                  ["https://h/reset-password", "next"], {"fields": ["name", "x"]}):
        line = json.dumps({"ts": TS, "tool": "t", "args": value}).encode()
        assert HASHER.redact_line(line) == (line, None), value


# ------------------------------------------------------------------ end to end
@pytest.mark.slow  # ingest end to end
def test_new_shapes_never_reach_the_store(tmp_path: Path) -> None:
    """Real CLI (the batch prefilter, the plan and the exact path), real store."""
    s = "Q9xW7vK3mP8rT2yZ"
    lines = [
        {"ts": TS, "session_id": "s1", "tool": "db", "client_ip": f"admin:{s}@10.0.0.1"},
        {"ts": TS, "session_id": "s1", "tool": "db", "remote_addr": f"root:{s}@db.local:5432"},
        {"ts": TS, "session_id": "s1", "tool": "db", "args": {"dsn": f"ops:{s}@10.0.0.2/prod"}},
        {"ts": TS, "session_id": "s1", "tool": "login", "status": f"invalid token {s}"},
        {"ts": TS, "session_id": "s1", "tool": "login", "outcome": f"bad api key: {s}"},
        {"ts": TS, "session_id": "s1", "tool": "login", "error": f"the password is {s}"},
        {"ts": TS, "session_id": "s1", "tool": "t", "args": ["password", s]},
        {"ts": TS, "session_id": "s1", "tool": "t", "args": {"h": [["Authorization", s]]}},
        {"ts": TS, "session_id": "s1", "tool": "t", "args": {"kv": [{"k": "token"}, {"v": s}]}},
        {"ts": TS, "session_id": "s1", "tool": "t", "args": {"l": ["token", s]}},
    ]
    text = [json.dumps(x) for x in lines]
    text += [t[:-4] for t in text[:4]]  # cut lines: quarantined, scrubbed without structure
    text += [f"server: connect root:{s}@10.0.0.9 failed", f"error: invalid token {s}"]
    summary, st_ = ingest_and_check_absent(tmp_path, text, s)
    assert summary["events_stored"] == len(lines)
    ips = query(st_, "SELECT client_ip FROM events WHERE client_ip IS NOT NULL").to_pylist()
    assert {r["client_ip"].split("@")[-1] for r in ips} == {"10.0.0.1", "db.local:5432"}


# ------------------------------------------------------------------ more shapes (hunt)
@pytest.mark.parametrize(
    "obj",
    [
        {"f": [{"field": "password", "value": "SECRET"}]},  # form fields
        {"f": [{"header": "Authorization", "value": "SECRET"}]},
        {"f": [{"k": "password", "v": "SECRET"}]},
        {"f": [{"Name": "DB_PASSWORD", "Values": ["SECRET"]}]},  # AWS-style tags/params
        {"f": {"name": "api_key", "val": "SECRET"}},
        {"u": "https://hooks.slack.com/services/T00000001/B00000002/SECRETabcdef"},
        {"u": "https://discord.com/api/webhooks/123456789012345678/SECRETabcdefghijklmnopqrstuv"},
        {"u": "https://api.telegram.org/bot123456:SECRET/sendMessage"},
        {"a": "glpat-SECRETab"},
        {"a": "token xapp-1-SECRET"},
        {"a": "npm_SECRETabcdefghijklmnopqrstuv"},
        {"a": "hf_SECRETabcdefghijklmnop"},
        {"cmd": "curl -s -u admin:SECRET https://h/x"},  # logged command lines
        {"cmd": "curl --user=admin:SECRET https://h/x"},
        {"cmd": "curl -U 'proxy:SECRET' https://h/x"},
    ],
)
def test_pair_spellings_webhook_urls_and_token_formats_are_hashed(obj: dict) -> None:
    """Found by the session-4 hunt: each of these was stored in clear. (Issue 28: token
    formats are the rule set's, at their real lengths: a webhook or token shorter than
    the service issues is no longer taken for one.)"""
    s = "Q9xW7vK3mP8rT2yZab"
    line = json.dumps({"ts": TS, "tool": "t", **obj}).replace("SECRET", s).encode()
    red, h = HASHER.redact_line(line)
    assert s.encode() not in red, red
    assert h is not None
    assert s.encode() not in HASHER.scrub_text(line[: line.index(s.encode()) + 6])
    if "u" in obj:  # the host stays readable
        host = obj["u"].split("/")[2]
        assert host.encode() in red, red


def test_ordinary_pairs_and_urls_stay() -> None:
    for obj in ({"f": [{"field": "email", "value": "a@b.c"}]}, {"f": {"k": "page", "v": 2}},
                {"u": "https://hooks.slack.com/"}, {"a": "hf_model_name"}):
        line = json.dumps({"ts": TS, "tool": "t", **obj}).encode()
        assert HASHER.redact_line(line) == (line, None), obj
