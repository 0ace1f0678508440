"""``SecretHasher.redact`` against a plain recursive reference walk, on arbitrary JSON.

``redact`` walks iteratively and returns containers without secrets as they are (no
copy); that shortcut must hash exactly what a full copying walk hashes, in the same
order (the first hash becomes the event's ``credential_hash``), and must never modify
its input.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import HASH_PREFIX, SecretHasher, _is_name, is_digest

HASHER = SecretHasher(b"k" * 32, ["apikey", "token", "password", "authorization"])

keys = st.sampled_from(["id", "apiKey", "TOKEN", "q", "nested", "Authorization", "x_token"])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
    st.just(HASH_PREFIX + "already"), st.just(HASH_PREFIX + "0123456789abcdef" * 2),
    st.sampled_from(["https://u:pw-1234567@h/x", "Bearer abcdefgh", "a?token=xyz&b=1",
                     "password", "Authorization", "token", "invalid token x1y2z3w4",
                     "admin:pw9@10.0.0.1"]),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4),
    max_leaves=20,
)


def reference(obj: Any, found: list[str]) -> Any:
    """The specification: copy everything; a non-null value under a secret key is hashed
    whole (whatever its type); every other string, key or value, is scrubbed of secret
    shapes. A value that is already a digest (``hmac:`` + 32 hex) is kept and recorded;
    any other value starting with ``hmac:`` is hashed like the rest."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if HASHER.is_secret_key(k):
                if v is None:
                    out[k] = v
                elif isinstance(v, str) and is_digest(v):  # hashed before: kept, recorded
                    found.append(v)
                    out[k] = v
                else:
                    h = HASHER.digest(v)
                    found.append(h)
                    out[k] = h
                continue
            k2 = HASHER.scrub_str(k, found)
            out[k2] = reference(v, found)
        return out
    if isinstance(obj, list):
        out_list = []
        for i, v in enumerate(obj):
            if i and HASHER._names_next(obj[i - 1]) and not _is_name(v):
                # a list naming its next element (["password", S], [{"k": "token"}, S])
                if v is None:
                    out_list.append(v)
                elif isinstance(v, str) and is_digest(v):
                    found.append(v)
                    out_list.append(v)
                else:
                    h = HASHER.digest(v)
                    found.append(h)
                    out_list.append(h)
                continue
            out_list.append(reference(v, found))
        return out_list
    if isinstance(obj, str):
        return HASHER.scrub_str(obj, found)
    return obj


@settings(max_examples=300)
@given(json_values)
def test_redact_matches_reference(value: Any) -> None:
    before = copy.deepcopy(value)
    want_found: list[str] = []
    want = reference(value, want_found)
    got_found: list[str] = []
    got = HASHER.redact(value, got_found)
    assert got == want
    assert got_found == want_found
    assert value == before  # input untouched
    if not got_found:
        assert got is value  # nothing to hash: no copy


def test_redact_line_keeps_bytes_without_secrets() -> None:
    line = b'{"tool":"getDocument","args":{"id":"doc-1","tags":["a",{"b":1}]}}'
    assert HASHER.redact_line(line) == (line, None)
    red, h = HASHER.redact_line(b'{"args":{"list":[{"apiKey":"sk-1"}],"token":"t"}}')
    assert h is not None and h.startswith(HASH_PREFIX)
    assert b"sk-1" not in red and b'"t"' not in red
    # a container under a secret key is one digest of its canonical form (key order free)
    a, ha = HASHER.redact_line(b'{"token":{"a":1,"b":[2,"x"]}}')
    b, hb = HASHER.redact_line(b'{"token":{"b":[2,"x"],"a":1}}')
    assert a == b and ha == hb == HASHER.digest({"a": 1, "b": [2, "x"]})


# --------------------------------------------------------------------------- hostile input
# Sizes are ~1 MB on purpose: the scanners must stay linear (benchmarks/bench_secrets.py
# prints ns/byte), and a quadratic regression at this size hangs the suite for minutes,
# which is noticed, without any timed assertion here.
MB = 1_000_000
SECRET = "S3cr3t-Value-42"


def _no_secret(out: bytes, secret: str = SECRET) -> None:
    assert secret.encode() not in out


def test_many_password_keys_are_each_hashed() -> None:
    n = MB // 30
    line = b"[" + b",".join(b'{"password":"%s-%d"}' % (SECRET.encode(), i) for i in range(n)) + b"]"
    out, h = HASHER.redact_line(line)
    _no_secret(out)
    assert h is not None and out.count(b"hmac:") == n


def test_escaped_password_keys_inside_a_string_are_each_hashed() -> None:
    inner = b'\\"password\\":\\"' + SECRET.encode() + b'\\",'
    line = b'{"a":"' + inner * (MB // len(inner)) + b'"}'
    out, h = HASHER.redact_line(line)
    _no_secret(out)
    assert h is not None


def test_many_urls_without_userinfo_then_one_with() -> None:
    line = b'{"a":"' + b"http://x" * (MB // 8) + b' https://u:' + SECRET.encode() + b'@h/p"}'
    out, h = HASHER.redact_line(line)
    _no_secret(out)
    assert h is not None and out.count(b"http://x") == MB // 8


def test_long_runs_of_token_prefixes_then_a_real_token() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
    line = b'{"a":"' + b"eyJ" * (MB // 3) + b' ' + jwt.encode() + b' ' + b"sk-" * (MB // 3) + b'"}'
    out, h = HASHER.redact_line(line)
    _no_secret(out, jwt)
    assert h is not None


@pytest.mark.parametrize("filler", [b"ab", b"\\\\", b'a\\"', b"q=1&", b"x: y ", b'","', b"{["])
def test_unterminated_secret_value_is_hashed_to_the_end(filler: bytes) -> None:
    line = b'{"id":1,"password":"' + SECRET.encode() + filler * (MB // len(filler))
    out, h = HASHER.redact_line(line)  # not JSON: the text scanner, no closing quote
    _no_secret(out)
    assert h is not None
    if b'"' not in filler:  # (a quote ends the value early: the rest is other strings)
        assert filler * 4 not in out  # the whole cut value went into one digest


def test_backslash_run_then_a_secret_key() -> None:
    line = b'{"a":"' + b"\\\\" * (MB // 2) + b'","token":"' + SECRET.encode() + b'"}'
    out, h = HASHER.redact_line(line)
    _no_secret(out)
    assert h is not None and out.startswith(b'{"a":"' + b"\\\\" * 100)


def test_many_ordinary_pairs_then_a_secret_pair() -> None:
    text = b"q=1&" * (MB // 4) + b"api_key=" + SECRET.encode()
    out, h = HASHER.redact_line(b'{"u":"https://h/?' + text + b'"}')
    _no_secret(out)
    assert h is not None and out.count(b"q=1&") == MB // 4
    # the same text cut (no closing quote): scrub_text path
    _no_secret(HASHER.scrub_text(b'{"u":"https://h/?' + text))


def test_long_name_run_before_a_secret_name() -> None:
    # the pair's name is the last 64 characters of a long run, as a bounded pattern saw it
    for run in (b"x" * 100, b"9" * 100 + b"x", b"a.b-c_" * 50):
        out, h = HASHER.redact_line(b'{"m":"' + run + b"password=" + SECRET.encode() + b' ok"}')
        _no_secret(out)
        assert h is not None and out.endswith(b' ok"}')


@pytest.mark.parametrize(
    "line",
    [b'{"a":"\\u"}', b'{"x":"\\u12"}', b'{"api\\u004', b'{"password":"\\u12', b'"\\u',
     b'{"token":"a\\ud800\\u', b'{"a":"\\u12\\"password\\":\\"' + SECRET.encode()],
)
def test_cut_unicode_escapes_never_raise(line: bytes) -> None:
    out, h = HASHER.redact_line(line)
    assert isinstance(out, bytes)
    _no_secret(out)
    if b"password" in line or b"token" in line:
        assert h is not None or b"hmac:" in out


FRAGMENTS = [
    '"', "\\", "\\u", "\\u12", "\\ud800", "\\\\", "{", "}", "[", "]", ":", ",", "=", "&", "?",
    "://", "@", " ", "\n", "password", "apiKey", "token", "Bearer ", "Basic ", "eyJ", "sk-",
    "AKIA", "-----BEGIN RSA PRIVATE KEY-----", "x", "1", "null", "\udcff", "é", "\x00",
]


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    st.binary(max_size=300),
    st.lists(st.sampled_from(FRAGMENTS), max_size=60).map(
        lambda xs: "".join(xs).encode("utf-8", "surrogateescape")
    ),
))
def test_redaction_never_raises_on_any_bytes(line: bytes) -> None:
    out, h = HASHER.redact_line(line)
    assert isinstance(out, bytes)
    assert h is None or h.startswith(HASH_PREFIX)
    assert isinstance(HASHER.scrub_text(line), bytes)


@settings(max_examples=300, deadline=None)
@given(st.lists(
    st.lists(st.sampled_from([*FRAGMENTS, '"a":', ":b", "x :", "ghp_", "xoxb-", "AIza"]),
             max_size=40).map(lambda xs: "".join(xs).encode("utf-8", "surrogateescape")),
    max_size=8,
))
def test_batch_plan_gives_the_same_redaction(lines: list[bytes]) -> None:
    # plan() decides with RE2 over the batch what redact_line otherwise tests per line
    plans = HASHER.plan(pa.array(lines, pa.binary()))
    assert [HASHER.redact_line(x, p) for x, p in zip(lines, plans, strict=True)] == [
        HASHER.redact_line(x) for x in lines
    ]


def test_short_secret_words_pick_names_not_prose() -> None:
    rx = re.compile(HASHER.candidate_pattern, re.I)
    assert not rx.search('{"tool":"search","args":{"query":"design doc auth","page":1}}')
    for line in ['{"auth":"x"}', '{"userPin" : 1}', '{"a":"{\\"otp\\":1}"}', "pw=1",
                 '{"auth\\"x":1}', 'x PIN: 1', '{"a":{"Auth-Token":"t"}}']:
        assert rx.search(line), line
