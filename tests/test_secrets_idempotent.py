"""Redaction is idempotent: a line redacted once (by ingest, or by the SDK middleware with
the same key) comes out of a second redaction byte for byte, with a credential hash.

Why it matters: the middleware writes ``hmac:`` digests that ingest reads again. A rule
that hashed its own output (``Bearer hmac:X`` -> ``Bearer hmac:Y:X``) stored digests that
no longer matched the same secret logged in clear, and a digest no rule recorded left the
event without ``credential_hash`` (credential-stuffing detection lost its signal).
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import SecretHasher, is_digest

KEY = bytes(range(32))

SHAPES = [
    lambda s: {"password": s},
    lambda s: {"p\u0430ssword": s},
    lambda s: {"X-Api-Key": s},
    lambda s: {"db": f"postgres://admin:{s}@db.internal:5432/app"},
    lambda s: {"target": f"admin:{s}@10.0.0.5"},
    lambda s: {"headers": {"Authorization": f"Bearer {s}"}},
    lambda s: {"note": f"curl -H 'Authorization: Bearer {s}' https://x"},
    lambda s: {"env": [{"name": "DB_PASSWORD", "value": s}]},
    lambda s: {"pair": ["password", s]},
    lambda s: {"argv": ["mysql", "-u", "root", f"-p{s}"]},
    lambda s: {"cmd": f"mysql -u root -p{s} app"},
    lambda s: {"cmd": f"sshpass -p {s} ssh host"},
    lambda s: {"cmd": f"curl -u bob:{s} https://x"},
    lambda s: {"url": f"https://api.example.com/v1?api_key={s}&page=2"},
    lambda s: {"text": f"token={s} and more"},
    lambda s: {"conn": f"Server=db;User Id=sa;Password={s};"},
    lambda s: {"msg": f"invalid token {s}"},
    lambda s: {f"secret_{s}": 1},
    lambda s: {"gh": f"ghp_{s}{s}"[:40]},
]

_ALNUM = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
# (letters and digits interleaved: a credential, never a vocabulary word such as
# "connectionstring" that a glued key name is allowed to spell)
secrets_st = st.text(alphabet=_ALNUM, min_size=8, max_size=20).map(
    lambda s: "".join(c + "3579"[i % 4] for i, c in enumerate(s)) + "Q7x"
)
plain = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40),
    st.text(max_size=20), st.sampled_from(["hmac:", "hmac:zz", "Bearer", "secret_", "-p"]),
)


@st.composite
def lines(draw: st.DrawFn) -> tuple[bytes, str]:
    secret = draw(secrets_st)
    parts: dict[str, Any] = {}
    for shape in draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3)):
        parts.update(shape(secret))
    extra = draw(st.dictionaries(st.text(max_size=8), plain, max_size=3))
    order = draw(st.booleans())
    obj = {**extra, **parts} if order else {**parts, **extra}
    return orjson.dumps({"tool": "t", "args": obj}), secret


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines())
def test_second_redaction_changes_nothing(case: tuple[bytes, str]) -> None:
    line, secret = case
    h = SecretHasher(KEY)
    once, cred = h.redact_line(line)
    assert secret.encode() not in once
    assert cred is not None and is_digest(cred)
    twice, cred2 = h.redact_line(once)
    assert twice == once
    assert cred2 is not None and is_digest(cred2)
    # the batch gate (run by ingest over whole batches) sends the redacted line to the
    # exact path too, else ingest would store it with no credential hash
    hit = pc.match_substring_regex(pa.array([once], pa.binary()), h.candidate_pattern,
                                   ignore_case=True)
    assert hit[0].as_py()


@given(secrets_st)
def test_key_held_secret_keeps_its_credential_hash(secret: str) -> None:
    """The login case: the same credential hash from the clear line and the redacted one."""
    h = SecretHasher(KEY)
    once, cred = h.redact_line(orjson.dumps({"user": "bob", "password": secret}))
    assert h.redact_line(once) == (once, cred) and cred == h.digest(secret)


def test_a_value_that_merely_starts_with_the_prefix_is_hashed() -> None:
    """``hmac:hunter2`` is no digest: it was once kept in clear under a secret key."""
    h = SecretHasher(KEY)
    for obj in ({"password": "hmac:hunter2"}, {"u": "https://bob:hmac:hunter2@h/x"},
                {"m": "token=hmac:hunter2 x"}):
        out, cred = h.redact_line(orjson.dumps(obj))
        assert b"hunter2" not in out and cred is not None and is_digest(cred)
