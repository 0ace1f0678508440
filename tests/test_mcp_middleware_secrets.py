"""ToolwatchMiddleware hashes secrets by ingest's rules, with ingest's key.

Before, the middleware hashed only values under secret-looking *keys*: a token in free
text, URL credentials, a ``Bearer`` header, a name/value pair list, a look-alike key name,
``mysql -pS`` … reached the server's stderr (and the ``toolwatch run`` spool, and any other
collector of that stderr) in clear until ingest hashed them. Now the whole logged line goes
through :class:`toolwatch.ingest.secrets.SecretHasher`: the secret must appear nowhere in the line,
the digests must be ingest's own (ingest's second pass changes nothing), and the real
``toolwatch ingest`` must store exactly those digests, with no secret in any store file.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import orjson
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import SecretHasher

from toolwatch.mcp_middleware import ToolwatchMiddleware

KEY_HEX = "5a" * 32
TOOLWATCH = str(Path(sys.executable).with_name("toolwatch"))
SERVER = str(Path(__file__).with_name("mcp_sdk_server.py"))


@pytest.fixture(autouse=True)
def _key(tmp_path, monkeypatch) -> None:
    """toolwatch's key from the environment (as ingest reads it); never the real home."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config-home"))
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", KEY_HEX)


def _hasher() -> SecretHasher:
    return SecretHasher(bytes.fromhex(KEY_HEX))


# Where a secret sits in a tools/call's arguments: every shape ingest hashes.
SHAPES: dict[str, Any] = {
    "key": lambda s: {"password": s},
    "lookalike_key": lambda s: {"p\u0430ssword": s},  # Cyrillic a
    "header_key": lambda s: {"X-Api-Key": s},
    "url_userinfo": lambda s: {"db": f"postgres://admin:{s}@db.internal:5432/app"},
    "bare_userinfo": lambda s: {"target": f"admin:{s}@10.0.0.5"},
    "bearer_header": lambda s: {"headers": {"Authorization": f"Bearer {s}"}},
    "bearer_in_text": lambda s: {"note": f"curl -H 'Authorization: Bearer {s}' https://x"},
    "name_value_objects": lambda s: {"env": [{"name": "DB_PASSWORD", "value": s}]},
    "pair_list": lambda s: {"pair": ["password", s]},
    "header_pairs": lambda s: {"headers": [["Authorization", f"Basic {s}"]]},
    "argv_flag": lambda s: {"argv": ["mysql", "-u", "root", f"-p{s}"]},
    "cli_flag": lambda s: {"cmd": f"mysql -u root -p{s} app"},
    "sshpass": lambda s: {"cmd": f"sshpass -p {s} ssh host"},
    "curl_user": lambda s: {"cmd": f"curl -u bob:{s} https://x"},
    "query_param": lambda s: {"url": f"https://api.example.com/v1?api_key={s}"},
    "name_eq_value": lambda s: {"text": f"token={s}"},
    "conn_string": lambda s: {"conn": f"Server=db;User Id=sa;Password={s};"},
    "prose": lambda s: {"msg": f"invalid token {s}"},
    "glued_to_key": lambda s: {f"secret_{s}": 1},
    "token_format": lambda s: {"gh": f"ghp_{s}{s}"[:40]},
}

# (Ingest's second pass once hashed two of these digests again: "Bearer hmac:X" ->
# "Bearer hmac:Y:X", "secret_hmac:X" -> "secret_hmac:hmac:…". Every shape is checked below.)

# A credential-looking secret: letters and digits, both cases (what a token looks like)
_ALNUM = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
# (letters and digits interleaved: a credential, never a run of letters that spells a
# vocabulary word, e.g. "CoNNECTioNSTRiNG" + "Q7x", which a glued key name may spell)
secrets_st = st.text(alphabet=_ALNUM, min_size=8, max_size=20).map(
    lambda s: "".join(c + "3579"[i % 4] for i, c in enumerate(s)) + "Q7x"
)
benign = st.one_of(st.integers(-5, 10**6), st.booleans(), st.none(),
                   st.text(alphabet="abc xyz.-/", max_size=12))


@st.composite
def arguments(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    """A shape, a secret and arguments carrying it in that shape, nested in ordinary
    containers."""
    secret = draw(secrets_st)
    shape = draw(st.sampled_from(sorted(SHAPES)))
    value: Any = SHAPES[shape](secret)
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            value = {draw(st.sampled_from(["filter", "body", "opts", "q"])): value,
                     "page": draw(benign)}
        else:
            value = [draw(benign), value]
    if not isinstance(value, dict):
        value = {"input": value}
    value.setdefault("limit", draw(benign))
    return shape, secret, value


async def _ok(ctx: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "done"}], "isError": False}


def _log_calls(calls: list[dict[str, Any]], **kw: Any) -> list[str]:
    """Run ``calls`` (tool arguments) through the middleware; its lines."""
    buf = io.StringIO()
    mw = ToolwatchMiddleware("srv", stream=buf, session_id="s1", **kw)

    async def main() -> None:
        for i, args in enumerate(calls):
            ctx = SimpleNamespace(method="tools/call", request_id=i,
                                  params={"name": "query", "arguments": args})
            await mw(ctx, _ok)

    anyio.run(main)
    mw.session_end()
    return buf.getvalue().splitlines()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments())
def test_no_secret_shape_reaches_the_line(case: tuple[str, str, dict[str, Any]]) -> None:
    _shape, secret, args = case
    line = _log_calls([args])[0]
    assert secret not in line
    rec = json.loads(line)
    assert secret not in json.dumps(rec)  # nor JSON-escaped
    assert rec["tool"] == "query" and rec["status"] == "ok"
    # ingest's pass over the middleware's line changes nothing: the digests are its own
    raw = line.encode()
    assert _hasher().redact_line(raw)[0] == raw
    # and they are the digests ingest gives the clear line, however it was serialized
    clear = orjson.dumps({"tool": "query", "args": args})
    assert json.loads(_hasher().redact_line(clear)[0])["args"] == rec["args"]


_WORDS = ["token", "Bearer", "password", "pass", "pin", "-p", "mysql", "://", "@", "=", ":",
          "api_key", "?sig=", "sk-", "ghp_", "%3D", "\u0430", "\u00e9", "AKIA", "secret_", " "]
texts = st.lists(st.one_of(st.sampled_from(_WORDS),
                           st.text(alphabet="abcXYZ019:/@=-_ .%\"'", max_size=8)),
                 max_size=8).map("".join)
json_like = st.recursive(
    st.one_of(texts, st.integers(-10, 10**9), st.booleans(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(texts, json_like, max_size=5), st.one_of(st.none(), texts))
def test_line_is_exactly_ingests_redaction(args: dict[str, Any], caller: str | None) -> None:
    """Whatever the arguments (and caller), the middleware writes exactly what ingest's
    scanner makes of the clear line: its RE2 line filter (ingest's) skips only lines the
    scanner leaves alone."""
    mw = ToolwatchMiddleware("srv", stream=io.StringIO(), session_id="s1")
    rec = {"ts": "2026-01-01T00:00:00.000Z", "session_id": "s1", "caller_id": caller,
           "server": "srv", "tool": "query", "args": args, "status": "ok"}
    line, _ = mw._line(rec)
    clear = json.dumps(rec, ensure_ascii=False).encode("utf-8", "surrogatepass")
    try:
        clear.decode("utf-8")
    except UnicodeDecodeError:  # a lone surrogate: the middleware escapes it first
        clear = json.dumps(rec).encode()
    want = _hasher().redact_line(clear)[0].decode("utf-8", "replace") + "\n"
    assert line == want


def test_every_shape_and_the_old_key_regex_misses() -> None:
    """Each shape is hashed (not merely the secret-keyed ones); the digest is ingest's."""
    secret = "Xk7pQ2vLm9Rt4Wz8Nb3c"
    lines = _log_calls([make(secret) for make in SHAPES.values()])
    assert len(lines) == len(SHAPES) + 1  # + SESSION_END
    digest = _hasher().digest(secret)
    whole = {"bearer_header", "header_pairs", "token_format"}  # hashed with its scheme/prefix
    for name, line in zip(SHAPES, lines, strict=False):
        assert secret not in line, name
        # a secret hashed by itself has exactly ingest's digest of it
        assert (digest in line) == (name not in whole), name
        if name in whole:
            assert "hmac:" in line, name


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_ingest_leaves_every_middleware_digest_and_records_it(shape: str) -> None:
    """Ingest's pass over a middleware line changes nothing and records the same
    credential hash as ingest of the clear call (once, two shapes were hashed again)."""
    secret = "Xk7pQ2vLm9Rt4Wz8Nb3c"
    line = _log_calls([SHAPES[shape](secret)])[0].encode()
    out, cred = _hasher().redact_line(line)
    assert out == line
    clear_cred = _hasher().redact_line(orjson.dumps({"args": SHAPES[shape](secret)}))[1]
    assert cred is not None and cred == clear_cred


def test_secret_in_caller_and_tool_name_too() -> None:
    """The whole line is scanned: a ``principal`` hook returning a token, or a tool name
    carrying one, is hashed like ingest would."""
    secret = "ghp_" + "Ab3" * 12
    lines = _log_calls([{"x": 1}], principal=lambda ctx: secret)
    assert all(secret not in line for line in lines)
    assert json.loads(lines[-1])["event"] == "SESSION_END"


@pytest.mark.slow  # starts a process
def test_no_key_falls_back_to_unkeyed_digests(monkeypatch, capsys) -> None:
    """Without a usable key the rules are the same, the digests unkeyed and saying so
    (``sha256:``, never ingest's ``hmac:``: ingest hashes them again with its key)."""
    monkeypatch.setenv("TOOLWATCH_HMAC_KEY", "not hex")
    secret = "Xk7pQ2vLm9Rt4Wz8Nb3c"
    lines = _log_calls([make(secret) for make in SHAPES.values()])
    assert "TOOLWATCH_HMAC_KEY" in capsys.readouterr().err
    for line in lines[:-1]:
        assert secret not in line and "sha256:" in line and "hmac:" not in line


@pytest.mark.slow  # starts a process
def test_scanner_is_imported_on_the_first_call_only() -> None:
    """Starting a server with the middleware must not import pyarrow/numpy."""
    code = (
        "import sys\n"
        "from toolwatch.mcp_middleware import ToolwatchMiddleware\n"
        "mw = ToolwatchMiddleware('s')\n"
        "assert 'toolwatch.ingest.secrets' not in sys.modules and 'pyarrow' not in sys.modules\n"
        "mw.session_end()\n"  # no call: the summary needs no scanner either
        "assert 'pyarrow' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _store_text(store: Path) -> str:
    """Everything in a store as text: parquet files decoded (compressed pages would hide a
    secret from a byte search), any other file as bytes."""
    parts = []
    for f in sorted(store.rglob("*")):
        if not f.is_file():
            continue
        if f.suffix == ".parquet":
            parts.append(json.dumps(pq.read_table(f).to_pylist(), default=str))
        parts.append(f.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def _ingest(path: Path, store: Path) -> list[dict[str, Any]]:
    env = os.environ.copy()
    run = subprocess.run([TOOLWATCH, "ingest", str(path), "-d", str(store), "--json",
                          "--no-progress"], capture_output=True, text=True, timeout=120,
                         env=env, cwd=store.parent)
    assert run.returncode == 0, run.stderr
    q = subprocess.run([TOOLWATCH, "query", "-d", str(store), "--format", "json",
                        "SELECT args, credential_hash FROM events ORDER BY line_no"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=store.parent)
    assert q.returncode == 0, q.stderr
    return [json.loads(x) for x in q.stdout.splitlines()]


@pytest.mark.slow  # starts a process
@pytest.mark.timeout(300)
def test_real_server_stderr_and_ingest_store_the_same_digests(tmp_path) -> None:
    """The real SDK server (subprocess, stdio) logs through the middleware; its stderr holds
    no secret; ``toolwatch ingest`` of that stderr stores the middleware's digests as they
    are, which are the digests ingest stores for the same calls logged in clear."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    secret = "Zr8tKq2Lw5Pn9Vx3Bc6H"
    names = list(SHAPES)
    queries = [SHAPES[n](secret) for n in names]
    queries = [json.dumps(q) for q in queries]  # the tool takes a string: any shape in text
    err = tmp_path / "stderr.log"
    params = StdioServerParameters(command=sys.executable, args=[SERVER],
                                   env={**os.environ, "TOOLWATCH_SESSION_ID": "e2e"})

    async def main() -> None:
        with err.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                for q in queries:
                    await s.call_tool("searchDocuments", {"query": q})
                await s.call_tool("getDocument", {"documentId": "doc-1", "api_key": secret})
                # (no failing call with the secret in its argument: the SDK's own traceback
                # of a tool's exception prints its message, which the middleware never sees)

    anyio.run(main)
    text = err.read_text()
    logged = [json.loads(x) for x in text.splitlines() if x.startswith('{"ts"')]
    assert len(logged) == len(queries) + 1
    assert secret not in text  # the middleware's lines and the server's own log

    # the same calls, logged in clear (a server without the middleware): ingest's digests
    clear = tmp_path / "clear.jsonl"
    with clear.open("w") as fh:
        for rec, args in zip(logged, [{"query": q} for q in queries], strict=False):
            fh.write(json.dumps({**rec, "args": args}) + "\n")
        rec = logged[-1]
        fh.write(json.dumps({**rec, "args": {"documentId": "doc-1", "api_key": secret}}) + "\n")

    via_mw = _ingest(err, tmp_path / "store-mw")
    via_clear = _ingest(clear, tmp_path / "store-clear")
    assert len(via_mw) == len(via_clear) == len(logged)
    for name, rec, mw_row, clear_row in zip([*names, "api_key"], logged, via_mw, via_clear,
                                            strict=True):
        mw_args = json.loads(mw_row["args"])
        assert mw_args == json.loads(clear_row["args"])  # the same digests
        assert mw_args == rec["args"]  # stored as the middleware logged them
    for store in ("store-mw", "store-clear"):
        assert secret not in _store_text(tmp_path / store)


@pytest.mark.slow  # starts a process
def test_ingest_keeps_the_credential_hash_of_a_middleware_line(tmp_path) -> None:
    line = _log_calls([{"user": "bob", "password": "Xk7pQ2vLm9Rt4Wz8Nb3c"}])[0]
    path = tmp_path / "mw.jsonl"
    path.write_text(line + "\n")
    (row,) = _ingest(path, tmp_path / "store")
    assert row["credential_hash"] == _hasher().digest("Xk7pQ2vLm9Rt4Wz8Nb3c")


@pytest.mark.slow  # starts a process
def test_sdk_traceback_of_a_tool_exception_is_scrubbed(tmp_path) -> None:
    """A tool raising with its argument in the message (``ValueError(f"document {id} not
    found")``): the SDK's own ``logger.exception`` prints it with the traceback on stderr,
    which the middleware's line never covered, so the spool of ``toolwatch run`` held the
    secret until ingest. The middleware's filter scrubs that record (message and
    traceback) line by line with ingest's ``scrub_text``: the same bytes ingest would keep."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    secret = "Zr8tKq2Lw5Pn9Vx3Bc6H"
    err = tmp_path / "stderr.log"
    params = StdioServerParameters(command=sys.executable, args=[SERVER],
                                   env={**os.environ, "TOOLWATCH_SESSION_ID": "tb"})
    ids = [f"password={secret}", f"Bearer {secret}", f"https://bob:{secret}@db/x"]

    async def main() -> None:
        with err.open("w") as errlog:
            async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                for i in ids:
                    res = await s.call_tool("getDocument", {"documentId": i})
                    assert res.is_error

    anyio.run(main)
    text = err.read_text()
    assert "Traceback" in text and "ValueError" in text  # the server's own log is there
    assert secret not in text, text[-3000:]
    # each scrubbed line is what ingest's scrub_text makes of it (idempotent)
    hasher = _hasher()
    for ln in text.splitlines():
        if "hmac:" in ln and not ln.startswith("{"):
            assert hasher.scrub_text(ln.encode()) == ln.encode()
