"""Red team round 4: secret shapes round 3 left open, and generated hostile lines.

* **A look-alike secret name in prose**: ``the pаssword is S`` (Cyrillic а), fullwidth
  ``ｐａｓｓｗｏｒｄ is S``, ``pass\\u200bword is S`` (zero width inside): keys were folded
  (``key_skeleton``), prose was not, and the batch prefilter did not pick the line.
* **A pair whose name was cut off the line**: a line whose head is missing
  (``word": "S"}``, ``ssword=S``: a writer's interleaved or cut stderr, a tail that
  started mid-line) kept ``S``.
* **``["-p", S]`` without a command word** (an argv list whose command sits elsewhere,
  ``{"cmd": "mysql", "args": ["-u", "root", "-p", S]}``).

Each case leaked before its fix (probe: ``/tmp/h4probe.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.ingest.secrets import _CUT_HEAD_WORDS, normalize_key

from tests.test_redteam_secrets import ingest_and_check_absent

# The key, clock, hasher, fixed secret and generated secrets of round 3.
from tests.test_redteam_secrets_round3 import (
    HASHER,
    TS,
    S,
    disguised_names,
    secret_text,
)


def _picked(line: bytes) -> bool:
    """Whether ingest's batch prefilter (Latin-1, case-insensitive RE2) picks the line."""
    opts = re2.Options()
    opts.case_sensitive = False
    opts.encoding = re2.Options.Encoding.LATIN1
    return re2.compile(HASHER.candidate_pattern.encode(), opts).search(line) is not None


# ------------------------------------------------------------------ 1. look-alikes in prose
PROSE_NAMES = (
    "p\u0430ssword",  # Cyrillic а
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",  # fullwidth
    "pass\u200bword",  # zero width space
    "t\u00adoken",  # soft hyphen
    "\u017fecret",  # long s
    "api k\u0435y",  # Cyrillic е in the second word
    "\U0001d429\U0001d41a\U0001d42c\U0001d42c\U0001d430\U0001d428\U0001d42b\U0001d41d",
    "\u24df\u24d0\u24e2\u24e2word",  # circled letters
    "PASSW\u041ERD",
)
PROSE = ("the {n} is {S}", "invalid {n} {S}", "{n} was '{S}' for admin", "Bad {n} {S}.")


@pytest.mark.parametrize("name", PROSE_NAMES)
@pytest.mark.parametrize("template", PROSE)
def test_lookalike_name_in_prose_is_hashed(name: str, template: str) -> None:
    msg = template.format(n=name, S=S)
    for ascii_only in (False, True):
        line = json.dumps({"ts": TS, "tool": "t", "args": {"msg": msg}},
                          ensure_ascii=ascii_only).encode()
        red, h = HASHER.redact_line(line)
        assert S.encode() not in red, (msg, red)
        assert h is not None
        assert _picked(line), line
        assert S.encode() not in HASHER.scrub_text(line[:-3])  # cut: quarantine path
    assert S not in HASHER.scrub_str(msg)


@settings(max_examples=300, deadline=None)
@given(name=disguised_names(), secret=secret_text, ascii_only=st.booleans(),
       template=st.sampled_from(PROSE))
def test_disguised_names_in_prose_never_keep_the_value(
    name: str, secret: str, ascii_only: bool, template: str
) -> None:
    line = json.dumps({"ts": TS, "tool": "t", "args": {"m": template.format(n=name, S=secret)}},
                      ensure_ascii=ascii_only).encode()
    red, h = HASHER.redact_line(line)
    assert secret.encode() not in red, (name, red)
    assert h is not None and _picked(line)


@pytest.mark.parametrize("msg", [
    "Пароль сброшен для пользователя 42",  # Russian prose with a number
    "le café ouvre à 8h30, clé abc123",
    "パスワード is abc123",
    "the pаssword was reset",  # look-alike name, no credential-shaped value
    "tóken expired at 12:00",
])
def test_non_english_prose_stays_readable(msg: str) -> None:
    assert HASHER.scrub_str(msg) == msg


# ------------------------------------------------------------------ 2. name cut off the head
CUT_HEADS = (
    'word": "{S}"}}',
    'ssword": "{S}", "user": "bob"}}}}',
    "ssword={S}",
    "sword={S}&page=2",
    "_token={S}",
    'oken": "{S}"',
    'et": "{S}"}}',  # client_secret cut to "et"? too short to tell: see the rule
    'i_key": "{S}"',
    "cret: {S}",
    "rization: Bearer {S}",
)


@pytest.mark.parametrize("head", [h for h in CUT_HEADS if not h.startswith("et")])
def test_pair_whose_name_was_cut_off_is_hashed(head: str) -> None:
    text = head.format(S=S)
    out = HASHER.scrub_text(text.encode())
    assert S.encode() not in out, out
    red, h = HASHER.redact_line(text.encode())  # not JSON: the same scrub
    assert S.encode() not in red and h is not None
    assert _picked(text.encode())


@pytest.mark.parametrize("text", [
    "code=200 ok", "string: hello", "number=42", "ret=0", "word count: 12",
    "ode: x", 'ey": "v1"}', "phrase: hello world",
])
def test_cut_heads_that_are_no_name_stay(text: str) -> None:
    assert HASHER.scrub_text(text.encode()) == text.encode()


@settings(max_examples=200, deadline=None)
@given(secret=secret_text,
       key=st.sampled_from(["password", "client_secret", "api_key", "access_token",
                            "passwd", "Authorization", "db_password"]),
       cut=st.integers(1, 12), form=st.sampled_from(['"{k}": "{s}", "a": 1}}', "{k}={s}&x=1"]))
def test_cut_heads_generated(secret: str, key: str, cut: int, form: str) -> None:
    text = form.format(k=key, s=secret)
    if len(normalize_key(key[cut:])) < 4:  # fewer than 4 letters of the name left:
        return  # unknowable ("_key": api_key or sort_key?)
    cut_text = text[cut + ('"' in form):] if '"' in form else text[cut:]
    if normalize_key(key[cut:]) in _CUT_HEAD_WORDS:  # "ization": an ordinary ending
        return
    out = HASHER.scrub_text(cut_text.encode())
    assert secret.encode() not in out, (cut_text, out)


# ------------------------------------------------------------------ 3. ["-p", S] alone
@settings(max_examples=100, deadline=None)
@given(secret=secret_text,
       argv=st.sampled_from([["-p", "{S}"], ["-u", "root", "-p", "{S}"], ["-P", "{S}"],
                             ["--password", "{S}"], ["-h", "db", "-p", "{S}", "shop"],
                             ["-p{S}"], ["-u", "root", "-p{S}", "shop"]]),
       key=st.sampled_from(["args", "argv", "arguments", "flags"]))
def test_password_flag_in_argv_without_command(secret: str, argv: list[str], key: str) -> None:
    a = [x.replace("{S}", secret) for x in argv]
    line = json.dumps({"ts": TS, "tool": "exec", "args": {"cmd": "mysql", key: a}}).encode()
    red, h = HASHER.redact_line(line)
    assert secret.encode() not in red, red
    assert h is not None and _picked(line)


@pytest.mark.parametrize("argv", [
    ["-p", "8080:80"], ["-p", "127.0.0.1:8080:80/tcp"], ["-p", "22"], ["-p", "8000-8010:80"],
    ["-p", "/tmp/x"], ["-p", "./build"], ["-p", "~/.cache"], ["mkdir", "-p", "out/dir"],
    ["-it", "-p", "[::1]:53:53/udp"], ["-p"], ["-pthread"], ["-P", "3306"],
])
def test_port_and_path_flags_stay(argv: list[str]) -> None:
    line = json.dumps({"ts": TS, "tool": "exec", "args": {"argv": argv}}).encode()
    red, h = HASHER.redact_line(line)
    assert h is None and json.loads(red)["args"]["argv"] == argv


# ------------------------------------------------------------------ end to end
@pytest.mark.slow  # ingest end to end
def test_round4_shapes_never_reach_the_store(tmp_path: Path) -> None:
    lines = []
    for n in PROSE_NAMES:
        for t in PROSE:
            for ascii_only in (False, True):
                lines.append(json.dumps({"ts": TS, "session_id": "s1", "tool": "t",
                                         "args": {"m": t.format(n=n, S=S)}},
                                        ensure_ascii=ascii_only))
    lines += [h.format(S=S) for h in CUT_HEADS if not h.startswith("et")]
    lines.append(json.dumps({"ts": TS, "session_id": "s2", "tool": "exec",
                             "args": {"cmd": "mysql", "args": ["-u", "root", "-p", S]}}))
    ingest_and_check_absent(tmp_path, lines, S)


# ------------------------------------------------------------------ found by the hunt
@pytest.mark.parametrize("text", [
    "password\uff1a{S}",  # fullwidth colon (CJK logs write it)
    "password\uff1d{S}",  # fullwidth equals
    "token\ufe55 {S}",  # small colon
    "api_key \uff1a {S}",
    "<password>{S}</password>",  # XML element content (SOAP: wsse:Password)
    "<wsse:Password Type=\"PasswordText\">{S}</wsse:Password>",
    "<ApiKey>\n  {S}\n</ApiKey>",
    "<client_secret>{S}",  # cut before its closing tag
])
def test_hunt_separators_and_xml(text: str) -> None:
    t = text.format(S=S)
    for line in (json.dumps({"ts": TS, "tool": "t", "args": {"q": t}}, ensure_ascii=a).encode()
                 for a in (False, True)):
        red, h = HASHER.redact_line(line)
        assert S.encode() not in red, red
        assert h is not None and _picked(line)
    assert S.encode() not in HASHER.scrub_text(t.encode())


@pytest.mark.parametrize("text", [
    "<label>Password</label>", "<token-count>42</token-count>", "<b>password reset</b>",
    "密码：已重置", "<password/>", "<password></password>",
])
def test_xml_and_cjk_without_a_secret_stay(text: str) -> None:
    assert HASHER.scrub_str(text) == text


@pytest.mark.parametrize("tag", ["cr\u0435\u0501e\uff4e\uff54\uff49als\u2060",
                                 "\u03f2\u0280\u0301\u03b5\ufe0fde\u0578t\u03b9\ufeffal\u017f",
                                 "p\\u0061\\u0073\\u0073\u051d\\u200d\uff44", "wsse:P\u0430ssword"])
def test_xml_element_with_a_lookalike_name(tag: str) -> None:
    """Found by the generated end-to-end hunt: an XML tag name written with look-alike
    letters, invisible characters or JSON escapes kept its text."""
    text = f'{{"ts": "{TS}", "tool": "t", "args": {{"a": "<{tag}>{S}</{tag}>"}}}}'.encode()
    red, h = HASHER.redact_line(text)
    assert S.encode() not in red and h is not None
    assert S.encode() not in HASHER.scrub_text(b"\xff" + text)  # quarantined form
    assert _picked(text)


def test_cut_xml_with_a_lookalike_name_reaches_the_exact_path() -> None:
    """Found by the end-to-end hunt: the line cut inside the closing tag is quarantined,
    and the batch prefilter did not pick it (no closing quote after the look-alike name),
    so its raw text was stored unscrubbed."""
    tag = "\u1d00\u0441c\u03b5\u200b\u017f\uff53_\u0442\uff4fk\u200d\u03b5\u0578"
    line = f'{{"ts": "{TS}", "args": {{"a": "<{tag}>{S}</{tag[:3]}'.encode()
    assert _picked(line)
    assert S.encode() not in HASHER.scrub_text(line)


def test_long_text_with_a_lone_surrogate_never_raises() -> None:
    """Found by round 3's never-raise test: the RE2 look-alike gates on long texts were
    given ``str`` (re2 encodes it strictly) and a lone surrogate from a percent-decoded
    text raised."""
    text = "%80\udc80 " * 200 + f" the p\u0430ssword is {S} " + "\udc80"
    out = HASHER.scrub_str(text)
    assert S not in out
