"""``SecretHasher.redact`` against a plain recursive reference walk, on arbitrary JSON.

``redact`` walks iteratively and returns containers without secrets as they are (no
copy); that shortcut must hash exactly what a full copying walk hashes, in the same
order (the first hash becomes the event's ``credential_hash``), and must never modify
its input.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolwatch.secrets import HASH_PREFIX, SecretHasher

HASHER = SecretHasher(b"k" * 32, ["apikey", "token", "password", "authorization"])

keys = st.sampled_from(["id", "apiKey", "TOKEN", "q", "nested", "Authorization", "x_token"])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
    st.just(HASH_PREFIX + "already"),
    st.sampled_from(["https://u:pw-1234567@h/x", "Bearer abcdefgh", "a?token=xyz&b=1"]),
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4),
    max_leaves=20,
)


def reference(obj: Any, found: list[str]) -> Any:
    """The specification: copy everything; a non-null value under a secret key is hashed
    whole (whatever its type); every other string, key or value, is scrubbed of secret
    shapes."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if HASHER.is_secret_key(k):
                if v is None or (isinstance(v, str) and v.startswith(HASH_PREFIX)):
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
        return [reference(v, found) for v in obj]
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
