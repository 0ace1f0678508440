"""Secrets by structure, not by luck: every shape docs/log-format.md promises is hashed.

One log plants a distinct secret in each promised shape — every key-name style, every
value type, nesting in lists of objects and 500 levels deep, URL userinfo, query tokens,
Bearer/Basic headers, token formats (JWT, ``sk-``, ``ghp_``, ``xoxb-``, ``AKIA``, PEM),
JSON inside a string, a truncated line cut mid-secret, an over-long line, a line that does
not parse, a JSON-RPC request's params, a session summary — ingests it through the real
CLI, then reads *every byte* of the store: every value of every column of every Parquet
file, the raw (compressed) Parquet bytes (footers keep min/max statistics uncompressed)
and every other file. No secret, nor any 8-character piece of one, may appear.

A hypothesis test then plants a secret under a random secret-key spelling at a random
depth of a random JSON structure: never found in the redacted line, never a raise.
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import HASH_PREFIX, SecretHasher, key_words

T = "2026-11-02T10:{:02d}:{:02d}Z"
PIECE = 8  # no substring of a secret this long may survive


def _ts(i: int) -> str:
    return T.format(i // 60 % 60, i % 60)


def _pieces(secret: str) -> set[str]:
    return {secret[i : i + PIECE] for i in range(len(secret) - PIECE + 1)} | {secret}


def _store_haystack(data_dir: Path) -> tuple[str, bytes]:
    """Every value of every Parquet column as text, plus every file's raw bytes."""
    texts: list[str] = []
    raw: list[bytes] = []
    for f in sorted(data_dir.rglob("*")):
        if not f.is_file():
            continue
        raw.append(f.read_bytes())
        if f.suffix != ".parquet":
            continue
        tbl = pq.read_table(f)
        for col in tbl.columns:
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                texts.extend(v for v in col.to_pylist() if v is not None)
            elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
                texts.extend(
                    v.decode("utf-8", "replace") for v in col.to_pylist() if v is not None
                )
            else:  # numbers, times, nested: their text forms
                texts.extend(str(v) for v in col.to_pylist() if v is not None)
    return "\n".join(texts), b"\n".join(raw)


def _secret(tag: str) -> str:
    """A distinct secret whose every 8-char piece is unlikely anywhere else (mixed case:
    never inside a lower-case hex digest)."""
    b64 = base64.b64encode(hashlib.sha256(tag.encode()).digest()).decode()
    return "Zq" + "".join(c for c in b64 if c.isalnum())[:18]


def _planted() -> tuple[list[bytes], dict[str, str]]:
    """(log lines, shape name -> secret planted in that shape)."""
    secrets: dict[str, str] = {}
    lines: list[bytes] = []

    def call(i: int, args: Any, **extra: Any) -> bytes:
        ev = {"ts": _ts(i), "session_id": "s-plant", "caller_id": "alice", "tool": "login",
              "args": args, **extra}
        return orjson.dumps(ev)

    i = 0
    # 1. each key-name style, string values
    key_styles = [
        "password", "passwd", "pwd", "pass", "passphrase", "secret", "client_secret",
        "clientSecret", "CLIENT-SECRET", "token", "access_token", "accessToken",
        "refresh_token", "id_token", "bearer", "auth", "authorization", "Authorization",
        "api_key", "apikey", "apiKey", "API_KEY", "x-api-key", "X-Api-Key", "api.key",
        "private_key", "privateKey", "credential", "credentials", "cookie", "Set-Cookie",
        "session_token", "sessionToken", "otp", "pin", "userPIN", "ssn", "card_number",
        "cardNumber", "user.password", "db-Password", "passcode", "connection_string",
    ]
    for k in key_styles:
        s = _secret("k" + "".join(c for c in k if c.isalnum())[:10])
        secrets[f"key:{k}"] = s
        lines.append(call(i, {"user": "bob", k: s}))
        i += 1
    # 2. value types under a secret key
    num = 918273645546372819
    secrets["number"] = str(num)
    lines.append(call(i, {"pin": num})); i += 1  # noqa: E702
    lst = [_secret("list1"), _secret("list2")]
    secrets["list0"], secrets["list1"] = lst
    lines.append(call(i, {"tokens": lst})); i += 1  # noqa: E702
    secrets["object"] = _secret("objval")
    lines.append(call(i, {"password": {"value": secrets["object"], "kind": "static"}})); i += 1  # noqa: E702
    secrets["credentials"] = _secret("credpass")
    lines.append(call(i, {"credentials": {"user": "bob", "pass": secrets["credentials"]}})); i += 1  # noqa: E702
    # 3. nested in lists of objects, and 500 levels deep next to a secret key
    secrets["list_of_objects"] = _secret("lobj")
    lines.append(call(i, {"items": [{"a": 1}, {"b": [{"apiKey": secrets["list_of_objects"]}]}]}))
    i += 1
    secrets["deep"] = _secret("deep500")
    deep = "[" * 500 + "]" * 500
    lines.append(
        f'{{"ts":"{_ts(i)}","session_id":"s-plant","tool":"deep","args":'
        f'{{"password":"{secrets["deep"]}","nest":{deep}}}}}'.encode()
    )
    i += 1
    secrets["deep_inner"] = _secret("deepin")
    inner = '{"a":' * 500 + f'{{"token":"{secrets["deep_inner"]}"}}' + "}" * 500
    lines.append(
        f'{{"ts":"{_ts(i)}","session_id":"s-plant","tool":"deep","args":{inner}}}'.encode()
    )
    i += 1
    # 4. shapes in ordinary strings
    shapes = {
        "url_userinfo": ("postgres://admin:{s}@db.internal:5432/app", _secret("urlpw")),
        "query_token": ("https://api.example.com/v1/x?id=3&token={s}&page=2", _secret("qtok")),
        "query_access_token": ("https://e.com/cb?access_token={s}", _secret("qacc")),
        "query_sig": ("https://bucket.s3/x.bin?X-Amz-Date=1&sig={s}", _secret("qsig")),
        "bearer": ("Authorization: Bearer {s}", _secret("bearer")),
        "basic": ("Basic {s}", "dXNlcjpaaFg5dlFtM3BMOHdUMnJT"),
        "kv_text": ("connect with password={s} now", _secret("kvtext")),
        "dsn": ("Server=db;User Id=sa;Password={s};", _secret("dsnpw")),
        "jwt": ("{s}", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJaWjl2UW0zcEw4d1Qycm1LIn0."
                       "Qm9Ya3Y5TG0zUnA4VHcyWnFYdjlMbTNScDhUdzI"),
        "sk": ("key is {s}", "sk-proj-Zq7Xv9Lm3Rp8Tw2KdF4hJ6"),
        "ghp": ("{s}", "ghp_Zq7Xv9Lm3Rp8Tw2KdF4hJ6nB1cV5xY0aE3k8"),  # 36: a real one
        "slack": ("{s}", "xoxb-1234567890-Zq7Xv9Lm3Rp8Tw2KdF"),
        "aws": ("{s}", "AKIAZQ7XV9LM3RP8TW2K"),
        "pem": ("{s}", "-----BEGIN RSA PRIVATE KEY-----\nMIIEZq7Xv9Lm3Rp8Tw2KdF4hJ6nB1"
                       "cV5xY0aE3\nQm9Ya3Y5TG0zUnA4VHcy\n-----END RSA PRIVATE KEY-----"),
    }
    for name, (fmt, s) in shapes.items():
        secrets[name] = s
        lines.append(call(i, {"note": fmt.format(s=s)}))
        i += 1
    secrets["json_in_string"] = _secret("jsonstr")
    body = json.dumps({"user": "bob", "password": secrets["json_in_string"]})
    lines.append(call(i, {"body": body})); i += 1  # noqa: E702
    secrets["token_in_key"] = "ghp_Kq7Xv9Lm3Rp8Tw2KdF4hJ6nB1cV5xY0aE9k8"
    lines.append(call(i, {secrets["token_in_key"]: 1})); i += 1  # noqa: E702
    # 5. JSON-RPC request params, and a session summary
    secrets["jsonrpc"] = _secret("rpcpw")
    rpc = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
           "params": {"name": "login", "arguments": {"user": "bob",
                                                    "password": secrets["jsonrpc"]}}}
    lines.append(orjson.dumps({"ts": _ts(i), "session_id": "conn-1", "message": rpc}))
    i += 1
    lines.append(orjson.dumps({"ts": _ts(i), "session_id": "conn-1", "message": {
        "jsonrpc": "2.0", "id": 7, "result": {"content": [], "isError": False}}}))
    i += 1
    secrets["summary"] = _secret("summ")
    lines.append(orjson.dumps({"event": "SESSION_END", "sessionId": "s-sum", "ts": _ts(i),
                               "callCount": 3, "authFailures": 1,
                               "apiKey": secrets["summary"]}))
    i += 1
    # 6. lines that do not parse: truncated mid-secret, garbage around a secret key
    secrets["truncated"] = _secret("trunc") + "TAILPART"
    lines.append(
        f'{{"ts":"{_ts(i)}","tool":"t","args":{{"password":"{secrets["truncated"]}'.encode()
    )
    i += 1
    secrets["truncated_obj"] = _secret("truncobj")
    lines.append(
        f'{{"ts":"{_ts(i)}","tool":"t","args":{{"credentials":{{"u":"b","p":"'
        f'{secrets["truncated_obj"]}'.encode()
    )
    i += 1
    secrets["truncated_url"] = _secret("truncurl")
    lines.append(
        f'{{"ts":"{_ts(i)}","args":{{"u":"https://bob:{secrets["truncated_url"]}'.encode()
    )
    i += 1
    secrets["unparseable"] = _secret("unparse")
    lines.append(
        f'{{"ts":"{_ts(i)}", "tool": oops, "apiKey": "{secrets["unparseable"]}"}}'.encode()
    )
    i += 1
    secrets["plain_text"] = _secret("plaintxt")
    lines.append(f"startup: db password: {secrets['plain_text']} ok".encode())
    # 7. a secret straddling the quarantine cut (QUARANTINE_CHARS) of a bad line, and
    # over-long lines (> MAX_LINE_BYTES) with secrets before and across the cut
    secrets["cut_key"] = _secret("cutkey") + "MOREMOREMORE"
    pad = "x" * (QUARANTINE_CHARS - 40)
    lines.append(f'{{"pad":"{pad}","password":"{secrets["cut_key"]}", bad}}'.encode())
    secrets["cut_token"] = "AKIAZQ7XV9LM3RP8CUTX"
    pad = "x" * (QUARANTINE_CHARS - 17)
    lines.append(f'{{"pad":"{pad}","n":"{secrets["cut_token"]}", bad}}'.encode())
    secrets["long_before"] = _secret("longbef")
    secrets["long_across"] = _secret("longacr") + "ACROSSACROSS"
    pad = "y" * (QUARANTINE_CHARS - 120)
    filler = "z" * (MAX_LINE_BYTES + 100)
    lines.append(
        f'{{"ts":"{_ts(i)}","tool":"t","args":{{"token":"{secrets["long_before"]}",'
        f'"pad":"{pad}","secret":"{secrets["long_across"]}","f":"{filler}"}}}}'.encode()
    )
    return lines, secrets


QUARANTINE_CHARS = 400
MAX_LINE_BYTES = 8192


def test_every_promised_shape_is_hashed_in_every_byte_of_the_store(tw, tmp_path):
    lines, secrets = _planted()
    log = tmp_path / "planted.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    raw_log = log.read_bytes()
    for name, s in secrets.items():  # the test plants what it claims to
        assert s.encode() in raw_log or json.dumps(s)[1:-1].encode() in raw_log, name
    cfg = tmp_path / "tw.toml"
    cfg.write_text(
        f"[ingest]\nmax_line_bytes = {MAX_LINE_BYTES}\n"
        f"quarantine_raw_chars = {QUARANTINE_CHARS}\n"
    )
    res = tw.ingest(log, extra=("-c", str(cfg)))
    assert res["events_stored"] >= 40, res
    assert res["quarantined_total"] >= 5, res

    text, raw = _store_haystack(tw.data_dir)
    leaks = {
        name: sorted(p for p in _pieces(s) if p in text or p.encode() in raw)[:3]
        for name, s in secrets.items()
    }
    leaks = {k: v for k, v in leaks.items() if v}
    assert not leaks, leaks

    # the hashing is keyed and stable: one credential per event that carried one, and
    # the summary's authFailures count and token counters are still readable
    rows = tw.query(
        "SELECT count(*) AS n, count(DISTINCT credential_hash) AS d FROM events "
        "WHERE tool = 'login' AND credential_hash IS NOT NULL"
    )
    assert rows[0]["n"] >= 40 and rows[0]["d"] >= 40
    assert tw.query("SELECT auth_failures FROM summaries")[0]["auth_failures"] == 1
    assert HASH_PREFIX in text


# --------------------------------------------------------------------------- hypothesis
HASHER = SecretHasher(b"h" * 32)
SECRET = "Qw7Er9Ty3Ui8Op2As"
_BASES = [
    ["password"], ["passwd"], ["pwd"], ["passphrase"], ["secret"], ["client", "secret"],
    ["access", "token"], ["refresh", "token"], ["token"], ["api", "key"], ["private", "key"],
    ["credentials"], ["cookie"], ["set", "cookie"], ["authorization"], ["auth"], ["otp"],
    ["pin"], ["session", "token"], ["bearer"], ["x", "api", "key"],
]


@st.composite
def secret_key(draw: st.DrawFn) -> str:
    """A secret name spelled in a random style: camel, Pascal, snake, kebab, dotted, upper."""
    words = draw(st.sampled_from(_BASES))
    prefix = draw(st.sampled_from([[], ["user"], ["db"], ["my", "old"]]))
    words = prefix + words
    style = draw(st.sampled_from(["camel", "pascal", "snake", "kebab", "dot", "upper", "lower"]))
    if style == "camel":
        return words[0] + "".join(w.capitalize() for w in words[1:])
    if style == "pascal":
        return "".join(w.capitalize() for w in words)
    if style == "upper":
        return "_".join(words).upper()
    sep = {"snake": "_", "kebab": "-", "dot": ".", "lower": "_"}[style]
    return sep.join(words)


plain_keys = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=6).filter(
    lambda k: not HASHER.is_secret_key(k)
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
    st.text(alphabet=string.ascii_letters + " :/=-_", max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(plain_keys, kids, max_size=4),
    max_leaves=15,
)
secret_values = st.one_of(
    st.just(SECRET),
    st.builds(lambda v: [SECRET, v], scalars),
    st.builds(lambda v: {"value": SECRET, "x": v}, scalars),
    st.builds(lambda v: [[{"k": SECRET}], v], scalars),
)


def _plant(value: Any, key: str, secret: Any, path: list[int]) -> Any:
    """``value`` with ``{key: secret}`` planted at the container chosen by ``path``."""
    if isinstance(value, dict) and path:
        keys = list(value)
        if keys and path[0] % 2:
            k = keys[path[0] % len(keys)]
            return {**value, k: _plant(value[k], key, secret, path[1:])}
        return {**value, key: secret}
    if isinstance(value, list) and value and path:
        i = path[0] % len(value)
        return [*value[:i], _plant(value[i], key, secret, path[1:]), *value[i + 1 :]]
    return {"wrap": value, key: secret}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values, secret_key(), secret_values, st.lists(st.integers(0, 7), max_size=6),
       st.integers(0, 400))
def test_random_structure_secret_never_survives(
    value: Any, key: str, secret: Any, path: list[int], depth: int
) -> None:
    assert HASHER.is_secret_key(key), (key, key_words(key))
    planted = _plant(value, key, secret, path)
    for _ in range(depth):  # nested deeper than orjson writes (255) beyond ~depth 250
        planted = [planted]
    line = json.dumps({"ts": "2026-11-02T10:00:00Z", "tool": "t", "args": planted}).encode()
    red, cred = HASHER.redact_line(line)
    assert SECRET.encode() not in red
    assert cred is not None and cred.startswith(HASH_PREFIX)
    # the batch prefilter (RE2, as ingest runs it) takes the line
    hit = pc.match_substring_regex(
        pa.array([line], pa.large_binary()), HASHER.candidate_pattern, ignore_case=True
    )
    assert hit[0].as_py()
    # cut anywhere after the key, the text scanner leaves no 8-char piece either
    at = line.find(SECRET.encode())
    for cut in (at + 3, at + 9, at + len(SECRET) - 1):
        scrubbed = HASHER.scrub_text(line[:cut])
        assert not any(p.encode() in scrubbed for p in _pieces(SECRET[: cut - at]))


@pytest.mark.parametrize("depth", [300, 1000, 5000])
def test_deep_nesting_beside_a_secret_never_raises(depth: int) -> None:
    """Regression: 300+ levels beside a secret key made orjson.dumps raise (ingest exit 1)."""
    for line in (
        b'{"args":{"password":"' + SECRET.encode() + b'","a":' + b"[" * depth + b"]" * depth
        + b"}}",
        b'{"args":' + b'{"a":' * depth + b'{"token":"' + SECRET.encode() + b'"}' + b"}" * depth
        + b"}",
        b'{"args":{"password":' + b"[" * depth + b'"' + SECRET.encode() + b'"',  # cut
    ):
        red, _ = HASHER.redact_line(line)
        assert SECRET.encode() not in red
        assert SECRET.encode() not in HASHER.scrub_text(line)


def test_key_vocabulary_and_exceptions() -> None:
    yes = ["privateKey", "pwd", "passphrase", "credentials", "X-API-KEY", "set-cookie",
           "userPIN", "pin_code", "otpCode", "client.secret", "Authorization", "ssn"]
    no = ["authenticatedUserId", "authFailures", "auth_failures", "max_tokens", "author",
          "mapping", "spinner", "passage", "session_id", "tokenizer", "keyboard", "path"]
    assert [k for k in yes if not HASHER.is_secret_key(k)] == []
    assert [k for k in no if HASHER.is_secret_key(k)] == []
    # ("salt" is a key word of the rule set since issue 28: a made-up word is extra)
    custom = SecretHasher(b"h" * 32, ["tenant-pepper"], ["user_password_hint"])
    assert custom.is_secret_key("tenantPepper") and not HASHER.is_secret_key("tenantPepper")
    assert not custom.is_secret_key("userPasswordHint") and HASHER.is_secret_key(
        "userPasswordHint"
    )


def test_no_log_field_alias_is_a_secret_key() -> None:
    """Hashing a canonical field (session id, auth failure count) would break ingest."""
    from toolwatch.ingest.aliases import ALIASES, NON_RESOURCE_KEYS

    names = [n for names in ALIASES.values() for n in names] + list(NON_RESOURCE_KEYS)
    assert [n for n in names if HASHER.is_secret_key(n)] == []
