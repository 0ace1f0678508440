"""``SecretHasher.plan`` with its patterns compiled once (``_plan_buffer``, session 6)
gives every line the same bits as Arrow's ``match_substring_regex`` per pattern (the
code it replaced), on generated hostile lines and on the demo logs."""

from __future__ import annotations

import gzip
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import _PLAN_PATTERNS, SecretHasher, _plan_buffer

HASHER = SecretHasher(b"k" * 32)
DEMO = Path(__file__).resolve().parents[1] / "sample_logs" / "demo"


def arrow_plan(lines: pa.Array) -> list[int]:
    """The reference: one Arrow RE2 call per pattern (binary input: Latin-1)."""
    mask = [0] * len(lines)
    for bit, pattern in enumerate(_PLAN_PATTERNS):
        for i, hit in enumerate(pc.match_substring_regex(lines, pattern).to_pylist()):
            mask[i] |= bool(hit) << bit
    return mask


_FRAGMENTS = [
    '{"a":"', '"}', "password", "Bearer ", "basic ", "=", ":", "://", "//", "%2F", "\\u0041",
    "\\", "sk-", "ghp_", "AKIA", "xoxb-", "eyJ", "glpat-", "hf_", "npm_", "AIza",
    "user:pw@host", "mysql -pS", '["-p", "x"]', "<password>S</password>", "pаssword is S1",
    "ｐａｓｓ：S", "token：x", "\u200b", "é", "\u4e2d", "\ufeff", " ", "\t", "\r", "\f", "x", "7",
    "-----BEGIN RSA PRIVATE KEY", "hooks.slack.com/", "?token=", "sshpass -p S",
]
line_text = st.lists(
    st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=8)), max_size=14
).map("".join)
line_bytes = st.one_of(
    line_text.map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(line_bytes, min_size=1, max_size=12))
def test_plan_buffer_equals_arrow(lines: list[bytes]) -> None:
    for typ in (pa.binary(), pa.large_binary()):
        arr = pa.array(lines, typ)
        assert _plan_buffer(arr) == arrow_plan(arr)
        assert HASHER.plan(arr) == arrow_plan(arr)


def test_plan_buffer_on_the_demo_logs() -> None:
    for f in sorted(DEMO.iterdir()):
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rb") as fh:
            lines = [ln.rstrip(b"\n") for ln in fh]
        arr = pa.array(lines, pa.binary())
        assert _plan_buffer(arr) == arrow_plan(arr), f.name


def test_lines_it_cannot_take_go_to_arrow() -> None:
    with_newline = pa.array([b'{"a":"x\ny=1"}', b"z"], pa.binary())
    assert _plan_buffer(with_newline) is None
    assert HASHER.plan(with_newline) == arrow_plan(with_newline)
    assert _plan_buffer(pa.array(["password=x"], pa.string())) is None
    assert _plan_buffer(pa.array([b"x", None], pa.binary())) is None


def test_first_use_from_parse_worker_threads() -> None:
    """Parse workers (threads) may call plan first at the same time: none may run with
    some of the patterns compiled (a missing bit would skip a redaction pass)."""
    import toolwatch.ingest.secrets as secrets

    lines = pa.array([b'{"u":"https://a:b@h/x","k":"sk-' + b"x" * 30 + b'"}'] * 50, pa.binary())
    want = arrow_plan(lines)
    for _ in range(5):
        secrets._PLAN_RX = ()
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: _plan_buffer(lines), range(8)))
        assert all(g == want for g in got)
