"""Keyed hashing of secrets found in log lines, by structure and by shape.

Nothing secret is stored in clear. Three rules, applied to every line that may carry a
secret (a one-pass RE2 prefilter, :attr:`SecretHasher.candidate_pattern`, picks those out
of a batch, so lines without one cost nearly nothing):

1. **By key.** The value under a secret-like key (``apiKey``, ``password``, ``pwd``,
   ``privateKey``, ``credentials`` … see :data:`WORD_NEEDLES` / :data:`LONG_NEEDLES`; a
   key *ending* in a word of the rule set's vocabulary, :data:`LAST_WORDS`: ``STRIPE_KEY``,
   ``X-Goog-Signature``, ``sid``; never a business or idempotency key) is
   replaced *whole* — string, number, boolean, list or object — by one ``hmac:<32 hex>``
   digest of its canonical serialization, so neither the secret nor its structure is kept.
   Key names are normalized (camelCase, snake_case, kebab-case, dotted, any case) first.
2. **By shape.** In any string: URL credentials (``scheme://user:pass@``), query and
   ``name=value`` parameters (``?token=``, ``api_key=``, ``sig=``), ``Bearer``/``Basic``
   credentials, every cookie of a ``Cookie:`` header, Python-repr pairs, file formats
   (PEM and PuTTY keys, shadow/htpasswd/pgpass lines, SQL ``IDENTIFIED BY``) and the
   token formats of a maintained rule set (CredSweeper's, read by
   :mod:`toolwatch.ingest.secret_rules`: ``ya29.``, ``whsec_``, ``hvs.``, ``SG.``, ``ghp_`` …)
   are hashed in place; JSON embedded in a string is scanned too, and ANSI escapes are
   dropped first.
3. **Without structure.** A line that does not parse (truncated, over-long, nested
   beyond the JSON library's limit) is scrubbed by :meth:`SecretHasher.scrub_text`, a
   scanner that needs no closing quote or bracket: from a secret-like key everything up
   to the end of its value *or the end of the available text* is hashed.

A digest is an HMAC-SHA256 under a key kept *outside* the store: equal secrets still hash
equal, so detectors can count distinct credentials, but someone holding only the store
cannot recover or brute-force them. Redaction is iterative and never raises, whatever
the input's depth or content.
"""

from __future__ import annotations

import hmac
import json
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

try:  # google-re2: a pattern compiled once, searched in linear time (a pyproject dependency)
    import re2 as _re2
except ImportError:  # pragma: no cover - an environment installed before it was added
    _re2 = None

from toolwatch.ingest.arrays import to_numpy
from toolwatch.ingest.secret_fold import (  # look-alike folding (names before scanning)
    _LETTER_RUN_RE,
    _LOOSE_NAMES_RE,
    _LOOSE_NAMES_RE2,
    _lookalike_names_pattern,
    _lookalike_prose,
    _prose_fold,
    key_skeleton,
)
from toolwatch.ingest.secret_rules import (  # noqa: F401
    RULE_COUNTS,
    RULE_WORDS,
    TOKEN_RULES,
    tokens_gate,
    tokens_regex,
)

from toolwatch.keys import load_or_create_key  # noqa: F401  (re-exported: public API)

#: Texts up to this size are tested with :func:`tokens_gate` before the token pass.
_TOKENS_GATE_MAX_BYTES = 4096

HASH_PREFIX = "hmac:"
_DIGEST_LEN = len(HASH_PREFIX) + 32
_HEX = frozenset("0123456789abcdef")


def _starts_with_digest(text: str, found: list[str]) -> bool:
    """Whether ``text`` begins with a digest (hashed earlier in this pass, or before);
    the digest is recorded in ``found`` (a second redaction records what the first did)."""
    if text.startswith(HASH_PREFIX) and is_digest(text[:_DIGEST_LEN]):
        found.append(text[:_DIGEST_LEN])
        return True
    return False


_DIGEST_B_RE = re.compile(rb"hmac:[0-9a-f]{32}(?![0-9a-f])")


def _digest_at(text: str, start: int, found: list[str]) -> bool:
    """Whether a value found at ``start`` of ``text`` is (part of) a digest: it begins
    with one, or is the hex of one whose ``hmac:`` a name rule took for the end of the
    name (``secret_hmac:<hex>``). The digest is recorded in ``found``."""
    for s in (start, start - len(HASH_PREFIX)):
        if s >= 0 and text.startswith(HASH_PREFIX, s) and is_digest(text[s : s + _DIGEST_LEN]):
            found.append(text[s : s + _DIGEST_LEN])
            return True
    return False


def is_digest(text: str) -> bool:
    """Whether ``text`` is exactly one of toolwatch's digests (``hmac:`` + 32 hex).

    A digest already in a line (written by the SDK middleware with the same key, or a
    line redacted before) is left as it is *and* recorded like a secret hashed here, so
    redacting twice gives the same line and the same ``credential_hash``. Anything else
    that merely starts with ``hmac:`` is an ordinary value and is hashed.
    """
    return (
        len(text) == _DIGEST_LEN
        and text.startswith(HASH_PREFIX)
        and _HEX.issuperset(text[len(HASH_PREFIX):])
    )

# --------------------------------------------------------------------------- vocabulary
#: Secret words matched as a *whole word* of the normalized key (``userPin``, ``PIN``,
#: ``pin_code`` match ``pin``; ``mapping``, ``spinner`` do not). Short or ambiguous words.
WORD_NEEDLES: tuple[str, ...] = (
    "pwd", "pw", "pass", "pin", "otp", "totp", "mfa", "auth", "oauth", "ssn", "cvv", "cvc",
    "token", "tokens", "sas",
)
#: Secret names matched as a substring of the key with separators and case removed
#: (``x-api-key`` → ``xapikey`` ∋ ``apikey``; ``client_secret``, ``setCookie`` …).
LONG_NEEDLES: tuple[str, ...] = (
    "password", "passwd", "passphrase", "passcode", "pincode", "secret", "apikey",
    "privatekey", "privkey", "accesskey", "signingkey", "encryptionkey", "credential",
    "cookie", "authorization", "bearer", "accesstoken", "refreshtoken", "idtoken",
    "sessiontoken", "authtoken", "apitoken", "csrftoken", "xsrftoken", "cardnumber",
    "creditcard", "ccnumber", "connectionstring", "connstr", "sshpass", "assertion",
    "webhookurl",
)
#: Normalized key names that contain a secret word but hold none: the ``authFailures``
#: count of session summaries and LLM token counters stay readable.
DEFAULT_EXCEPTIONS: tuple[str, ...] = (
    "authfailures", "maxtokens", "maxnewtokens", "maxoutputtokens", "maxcompletiontokens",
    "prompttokens", "completiontokens", "totaltokens", "inputtokens", "outputtokens",
    "numtokens", "tokencount", "tokensused", "cachedtokens", "reasoningtokens", "tokenlimit",
)

#: Words that make a key secret when they *end* it (``STRIPE_KEY``, ``AccountKey``,
#: ``Ocp-Apim-Subscription-Key``, ``X-Goog-Signature``, ``sid``, ``salt``): the rule set's
#: keyword vocabulary (:data:`RULE_WORDS`; not ``api``, which names a service: ``api_url``)
#: and the signature words of signed URLs and cookies. Filled below, once it is read.
LAST_WORDS: frozenset[str] = frozenset()
#: A word before a last word that makes the key a reference, not a credential: business,
#: idempotency and resource keys (``idempotencyKey``, ``orderKey``, ``partitionKey``,
#: ``publicKey``) are what the detectors compare, and are never hashed.
REFERENCE_WORDS = frozenset({
    "idempotency", "idempotence", "dedup", "dedupe", "deduplication", "business", "order",
    "cache", "partition", "sort", "primary", "foreign", "routing", "object", "message",
    "public", "row", "lookup", "map", "index", "shard", "group", "request", "correlation",
    "trace", "tracking", "resource", "document", "item", "record", "entity", "hash", "next",
    "page", "cursor", "continuation", "range", "composite", "natural", "surrogate", "unique",
})
_WORD_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]+")


def key_words(key: str) -> list[str]:
    """Lower-case words of a key name: ``"userAPIKey_v2"`` → ``["user", "api", "key", "v", "2"]``.

    Splits on every non-ASCII-alphanumeric character, on lower→upper case changes and on
    letter/digit changes; an upper-case run followed by a capitalized word ends before it
    (``APIKey`` → ``api``, ``key``).
    """
    return [w.lower() for w in _WORD_RE.findall(key)]


def normalize_key(key: str) -> str:
    """A key with separators and case removed: ``"X-Api-Key"`` → ``"xapikey"``."""
    return _NON_ALNUM.sub("", key).lower()


# --------------------------------------------------------------------------- rule set
# Token formats and key words come from a maintained rule set (ingest/secret_rules.py).
LAST_WORDS = (frozenset(RULE_WORDS) - {"api"}) | {"sid", "signature", "sig"}
#: Secret names matched in prose (``invalid token X``, ``the password is X``, ``auth: X``):
#: toolwatch's and the last words of the rule set's vocabulary, each with a plural.
_PROSE_WORDS = tuple(sorted(
    {"token", "key", "password", "passwd", "passphrase", "passcode", "pwd", "pin", "otp",
     "secret", "credential", "apikey", "authorization"} | LAST_WORDS, key=lambda w: (-len(w), w)
))
_PROSE_NAMES_ALT = "(?:" + "|".join(f"{w}s?" for w in _PROSE_WORDS) + ")"


# --------------------------------------------------------------------------- structure
#: Secrets of file and statement formats (toolwatch's structural rules, on top of the
#: rule set's token formats): a PEM private key up to its END line (else to the end of the
#: JSON string or the text), and PuTTY key fields, SQL ``IDENTIFIED BY``, crypt hashes of
#: shadow / htpasswd lines and pgpass lines (group ``v`` is hashed). Possessive: linear.
_PEM_PATTERN = (
    r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----(?:[^\"\\]|\\.)*?"
    r"(?:-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|(?=\")|\Z)"
)
_CRYPT = r"\$(?:2[abxy]|[1567]|g?y|sha1|md5|argon2i?d?|scrypt|pbkdf2[\w-]*)\$[\w./=,+$-]"
_PEM_RE_B = re.compile(_PEM_PATTERN.encode(), re.S)
_STRUCT_RES = (
    re.compile(r"(?:Private-(?:Lines:\s*+\d++\s*+|MAC:\s*+)|Argon2-Salt:\s*+)"
               r"(?P<v>[A-Za-z0-9+/=]++(?:(?:\s|\\[nr])++[A-Za-z0-9+/=]{16,}+)*+)"),
    re.compile(r"(?i:\bidentified(?:\s++with\s++\S++)?\s++(?:by|as)\s++(?:password\s*+)?)"
               r"(?:'(?P<v>[^'\n]++)|\"(?P<w>[^\"\n]++)|(?P<x>[^\s'\";,)]++))"),
    re.compile(r"(?<![^\s\"'\[,{(|])[A-Za-z0-9_.@\-]{1,64}+:"
               r"(?P<v>(?:\$[0-9A-Za-z]{1,8}+\$|\{[A-Z0-9\-]{3,10}+\})[^:\s\"',]++)"),
    re.compile(rf"(?P<v>\$(?<![\w$]\$){_CRYPT[2:]}{{16,}}+)"),  # a crypt hash alone ($2b$ …)
    # a Telegram bot token as a URL's path (the rule set's needs a delimiter before it)
    re.compile(r"api\.telegram\.org/bot(?P<v>[0-9]++:[A-Za-z0-9_\-]{16,}+)"),
    # host:port:database:user:password (a host holds a letter, a dot or "*": no IPv6)
    re.compile(r"(?<![^\s\"'])(?=[^:\s\"']*[A-Za-z.*])[A-Za-z0-9_.*\-]++:(?:\d{1,5}+|\*):"
               r"[^:\s\"']++:[^:\s\"']++:(?P<v>[^\s\"':]++)(?=[\s\"']|\Z)"),
)
_STRUCT_LITERALS = ("Private-", "Argon2-Salt", "dentified", "DENTIFIED", "$", "{", ":")
#: Literals one of which a token format's cut prefix holds, for a line cut short by the
#: end of the text (4+ characters and not a lower-case word: ``local``, ``secret`` and
#: shorter ones match ordinary text).
_TAIL_LITERALS = tuple(sorted(
    {x for r in TOKEN_RULES for x in r.literals
     if len(x) >= 4 and not (x.isalpha() and x.islower())} | {"-----BEGIN"}
))
_SHAPE_TAIL_RE = re.compile(
    "(?:" + "|".join(re.escape(x) for x in _TAIL_LITERALS) + r")[A-Za-z0-9_.=+/\-]*\Z"
)
_SHAPE_LITERALS = tuple(sorted({x for r in TOKEN_RULES for x in r.literals}))
#: Characters a token format's tail may hold (see :data:`_SHAPE_TAIL_RE`).
_TAIL_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.=+/-"
#: The batch prefilter's copy of every token rule, case-sensitive inside the
#: case-insensitive candidate pattern.
_TOKENS_PREFILTER = (
    "(?-i:" + "|".join(r.prefilter for r in TOKEN_RULES) + "|-----BEGIN[ A-Z0-9]*PRIV"
    "|(?:" + "|".join(re.escape(x) for x in _TAIL_LITERALS) + r")[A-Za-z0-9_.=+/\-]*$)"
)
#: ANSI escape sequences (colours, cursor moves): dropped before scanning, so that
#: ``\x1b[33mtoken\x1b[0m=S`` reads ``token=S``.
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*+[ -/]*+[@-~]|\x1b[@-Z\\-_]")
#: Characters a cut URL (:data:`_URL_TAIL_RE`) never holds: it lies after the last one.
_URL_TAIL_STOPS = " \t\n\r\f\v\"'<>@"
#: Commands that take a password as a short flag (``mysql -pS``, ``sshpass -p S``,
#: ``redis-cli -a S``, ``ldapsearch -w S``, ``docker login -p S``, ``smbclient -U u%S``,
#: ``htpasswd -b f u S``, ``sqlcmd -P S``), then a flag (after a space or, in an argv
#: list's JSON text, a quote): the raw-line test of :data:`_CLI_CMD_RE`.
_CLI_WORDS = (
    r"mysql\w*|mariadb\w*|sshpass|redis-cli|ldap[a-z]+|smbclient|rpcclient|smbmap"
    r"|htpasswd|sqlcmd|bcp|mongo\w*|docker|podman|nerdctl|buildah|skopeo|helm|oras"
)
_CLI_LINE_PATTERN = rf"(?i:(?:{_CLI_WORDS})[^\n]*?[\s\"]-[a-z])"
#: A ``-p`` argv element followed by another (``["-p", S]``) or with a value glued to it
#: (``["-pS"]``), in JSON text (escaped or not): an argv list without its command word.
_ARGV_FLAG_PATTERN = r'\\*"-p(?:\\*"\s*,|[^"\\\s]{5,}\\*")'
#: A name written with look-alike characters in prose (``the pаssword is S``, fullwidth,
#: zero width inside): a word holding a non-ASCII character, then (``is``/``was``) a
#: word with a digit. Written with ``[^\x00-\x7f]`` only, so it means the same in UTF-8
#: and Latin-1 scans (a superset: this gate runs on lines the batch prefilter picked).
_LOOKALIKE_PROSE_PATTERN = (
    r"[^\x00-\x7f][^\s\"\\]*\s+(?:(?:is|was)\s+)?['\"]?[^\s'\"\\]*[0-9]"
)
#: A secret name in prose followed by a value (see ``_PROSE_RE``), ``x:y@`` (``user:pass@host``
#: with no scheme), a password flag, a crypt hash, a quoted name then a quoted value
#: (``define('KEY', 'S')``; double-quoted, it is escaped in a raw line: its backslash
#: picks it), in a raw line.
_PROSE_USERINFO_PATTERN = (
    rf"(?i:(?:^|[^a-z0-9]){_PROSE_NAMES_ALT}[ \t\n\r\f\v:=])"
    r"|[^ \t\n\r\f\v\"'<>@:/]:[^ \t\n\r\f\v\"'<>@/]*@"
    + "|" + _CLI_LINE_PATTERN + "|" + _LOOKALIKE_PROSE_PATTERN + "|" + _ARGV_FLAG_PATTERN
    + "|" + _CRYPT + r"{16}|'\s*(?:,|\]\s*=|=>?)\s*['\"]"
    # an XML element's text (<password>S</password>); a Latin letter next to a non-ASCII
    # character (a look-alike separator: "password：S")
    + r"|(?i:<[^<>\s\"]{1,200}(?:\s[^<>]*)?>[^<\s]|[a-z][^\x00-\x7f])"
)


#: :meth:`SecretHasher.plan`'s RE2 tests: each token format's literals (bit = its index),
#: then whether some string may hold a per-string shape: ``=``, a URL, an escape, a
#: percent-escape, Bearer/Basic, ``name:`` outside JSON syntax, the patterns above.
_PLAN_PATTERNS: tuple[str, ...] = (
    _TOKENS_PREFILTER,
    r"=|\\|:/|//|%|earer|EARER|asic|[A-Za-z_.\-'][ \t\n\r\f\v]?:|\x1b|(?i:identified)|"
    + _PROSE_USERINFO_PATTERN,
)
#: :meth:`SecretHasher.plan` bit: some token format (or a PEM key) may be in the line.
PLAN_TOKENS = 1
#: :meth:`SecretHasher.plan` bit: some string of the line may hold a per-string shape.
PLAN_STRINGS = 2
# (the second for one line, when no plan is given; RE2: one linear pass)
_STRINGS_B_RE: Any = (_re2 or re).compile(_PLAN_PATTERNS[1].encode())


#: _PLAN_PATTERNS compiled for _plan_buffer (on first use; bound whole, never filled in
#: place: a parse worker thread must never see some of them)
_PLAN_RX: tuple[Any, ...] = ()


def _plan_buffer(lines: pa.Array) -> list[int] | None:
    """:meth:`SecretHasher.plan` with the patterns compiled once, or ``None`` (no
    google-re2, not binary, a null, or a line holding a newline: use Arrow).

    ``pyarrow.compute.match_substring_regex`` compiles its pattern on every call: ~2 ms
    per batch for the eleven plan patterns, more than matching the few lines a batch
    picks. Here the lines are joined by newlines into one buffer and each pattern
    searched over it the way Arrow matches binary (Latin-1, case-sensitive): multi-line
    mode puts ``^``/``$`` at each line's ends and ``never_nl`` keeps every match inside
    one line (as ingest's batch scan does); after a hit the search restarts at the next
    line. Unlike ``RE2::Set``, a search whose DFA runs out of memory falls back to the
    NFA instead of missing.
    """
    if _re2 is None or lines.null_count or not (
        pa.types.is_binary(lines.type) or pa.types.is_large_binary(lines.type)
    ):
        return None
    items = lines.to_pylist()
    if any(b"\n" in x for x in items):
        return None
    global _PLAN_RX
    compiled = _PLAN_RX
    if len(compiled) != len(_PLAN_PATTERNS):
        opts = _re2.Options()
        opts.encoding = _re2.Options.Encoding.LATIN1
        opts.never_nl = True
        opts.max_mem = 64 << 20
        opts.log_errors = False
        compiled = _PLAN_RX = tuple(
            _re2.compile(f"(?m:{p})".encode(), opts)._regexp for p in _PLAN_PATTERNS
        )
    data = b"\n".join(items) + b"\n"
    starts = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(x) + 1 for x in items], out=starts[1:])
    mask = [0] * len(items)
    anchor = _re2._re2.RE2.Anchor.UNANCHORED
    end = len(data)
    for bit, rx in enumerate(compiled):
        pos = 0
        while pos < end:
            at = rx.Match(anchor, data, pos, end)[0][0]
            if at < 0:
                break
            k = int(np.searchsorted(starts, at, side="right")) - 1
            mask[k] |= 1 << bit
            pos = int(starts[k + 1])
    return mask


#: ``Bearer <token>`` / ``Basic <base64>`` (group 1 is hashed). Basic needs a character
#: that prose lacks (digit, upper case after the first letter, ``+/=``).
_SCHEME_RE = re.compile(
    # (a digest written by the middleware or an earlier pass is taken whole, so it is
    # kept and recorded instead of its "hmac" being hashed again)
    r"\b(?:[Bb]earer|BEARER)\s+(hmac:[0-9a-f]{32}(?![A-Za-z0-9._~+/=\-])|[A-Za-z0-9._~+/=\-]{4,})"
    r"|\b[Bb]asic\s+((?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{6,}={0,2}"
    r"|[A-Za-z0-9+/]*[A-Z][A-Za-z0-9+/]*[a-z0-9+/][A-Za-z0-9+/]{4,}={0,2})"
)
#: ``scheme://userinfo@`` (or scheme-relative ``//userinfo@``): group 2 is the userinfo,
#: up to the last ``@`` before a path.
#: The scheme is a whole run of scheme characters, taken possessively (a superset of
#: schemes: ``x-https://`` counts): tried from every word boundary of ``a.a.a.…`` a
#: scheme cost O(run) per position (a 20 kB string took seconds, a 1 MiB line most of an
#: hour).
_URL_RE = re.compile(
    r"(?i)((?:(?<![a-z0-9+.\-])[a-z0-9+.\-]*+:)?(?:\\?/){2})([^\s/\"'<>]*)@"
)
#: ``scheme://user:pass`` cut by the end of the text before its ``@``: the tail after the
#: colon may be a password.
_URL_TAIL_RE = re.compile(
    r"(?i)((?<![a-z0-9+.\-])[a-z0-9+.\-]*+:(?:\\?/){2}[^\s/\"'<>@:]*+:)([^\s/\"'<>@]+)\Z"
)
#: ``user:pass@host`` with no scheme (a DSN, ``client_ip: "admin:pw@10.0.0.1"``,
#: ``ssh admin:pw@host:22``): group 1 the user, group 2 every ``…@`` segment (the
#: password ends at the last ``@`` before the host). It starts only after a delimiter,
#: and neither part runs past one, so each character is scanned from one start: linear.
_USERINFO_DELIMS = "\\s\"'<>()\\[\\]{},;=|`"
_USERINFO_RE = re.compile(
    rf"(?<![^{_USERINFO_DELIMS}])([A-Za-z0-9._~%!$&*+\-]++):"
    # (not before a time: toolwatch's own derived session ids read
    # ``derived:caller:alice@2026-11-02T10:00:00.000000Z``)
    rf"((?:[^{_USERINFO_DELIMS}/@]*+@)++)(?=[A-Za-z0-9\[])(?!\d{{4}}-\d\d-\d\dT)"
)
#: ``curl -u user:pass`` / ``--user=user:pass`` / ``--proxy-user`` in a logged command
#: line (group 2 is the password). Each part is a possessive run: linear.
_CLI_USER_RE = re.compile(
    r"(?<!\S)(?:-u|-U|--user|--proxy-user)(?:\s++|=)['\"]?([^\s:'\"]++):([^\s'\"]++)"
)
#: A command word of :data:`_CLI_WORDS` as a word of a command line (after a delimiter,
#: possibly behind a path: ``/usr/bin/mysql``). Its flags run to the next command
#: separator or the next command word (each byte is scanned for flags once: linear).
_CLI_CMD_RE = re.compile(rf"(?<![\w.\-])(?:{_CLI_WORDS})(?![\w\-])", re.I)
_CLI_SEP_RE = re.compile(r"[;|&\n]")
#: A flag starts after a space, a quote, ``[`` or ``,`` (argv lists as JSON text); a
#: separated value after spaces, commas and quotes (``-p S``, ``"-p", "S"``); a value
#: runs to a space, quote, comma or bracket (``\\x`` escapes inside, not ``\\"``). Group
#: ``pw`` is the password. Every part is a possessive run: linear.
_F = r"(?<![^\s\"'\[,])"
_Q = r"(?:\\?['\"])?"
_SEP = r"[\s,\"'\\]++"
_V = r"(?P<pw>(?:[^\s'\",\]\\\-]|\\[^\s\"'])(?:[^\s'\",\]\\]|\\[^\s\"'])*+)"
#: Per command family (the first letters of the command word): its password flags.
_CLI_FLAG_RES: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...] = (
    (("mysql", "mariadb"), re.compile(_F + r"-p" + _Q + _V)),  # attached: -p alone prompts
    (("sshpass",), re.compile(_F + r"-p(?:" + _SEP + r")?" + _V)),
    (("redis-cli",), re.compile(_F + r"-a" + _SEP + _V)),
    (("ldap",), re.compile(_F + r"-w" + _SEP + _V)),
    (("sqlcmd", "bcp"), re.compile(_F + r"-P(?:" + _SEP + r")?" + _V)),
    (("mongo", "docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras"),
     re.compile(_F + r"-p" + _SEP + _V)),
    (("smbclient", "rpcclient", "smbmap"),
     re.compile(_F + r"(?:-U|--user(?:name)?)(?:" + _SEP + r"|=)[^\s%'\",\]\\]*+%" + _V)),
    # htpasswd -b[other letters] [-flags] passwordfile username password
    (("htpasswd",),
     re.compile(_F + r"-[A-Za-z]*b[A-Za-z]*+" + _SEP + r"(?:-[A-Za-z]++" + _SEP + r")*+"
                r"[^\s\-'\",\\][^\s'\",\\]*+" + _SEP + r"[^\s'\",\\]++" + _SEP + _V)),
)


#: Commands whose ``-p`` is a password only in their ``login`` subcommand.
#: ``"-p", "V"`` in JSON text (escaped quotes too): an argv list's password flag and its
#: value, for text that does not parse (the structured rule needs the list).
_ARGV_FLAG_TEXT_RE = re.compile(
    r'\\*"-[pP]\\*"\s*+,\s*+\\*"((?:[^"\\]|\\u[0-9a-fA-F]{4}|\\[^"\\u])++)'
)
#: A ``-p`` value that is a port mapping (``80``, ``8080:80``, ``127.0.0.1:8080:80``,
#: ``127.0.0.1::80``, ``[::1]:53:53/udp``, ``8000-8010:80-90``), not a password.
_PORT_SPEC_RE = re.compile(
    r"(?:(?:\[[0-9A-Fa-f:.]+\]|\d{1,3}(?:\.\d{1,3}){3}):)?(?:\d{1,5}(?:-\d{1,5})?)?:?"
    r"\d{1,5}(?:-\d{1,5})?(?:/(?:tcp|udp|sctp))?"
)
#: A ``-p`` value that is a path (``mkdir -p``-style flags of other tools) or a variable.
_PATH_STARTS = ("/", "./", "../", "~", "$")
_LOGIN_CMDS = frozenset({"docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras"})


#: Literals one of which (lower-cased) a text must hold for :data:`_CLI_CMD_RE` to match:
#: plain substring tests, far cheaper than the case-insensitive alternation at every byte.
_CLI_LITERALS = (
    "mysql", "mariadb", "sshpass", "redis-cli", "ldap", "smb", "rpcclient", "htpasswd",
    "sqlcmd", "bcp", "mongo", "docker", "podman", "nerdctl", "buildah", "skopeo", "helm",
    "oras",
)


def _cli_spans(text: str) -> list[tuple[int, int]]:
    """Spans of passwords given as short flags in the command lines of ``text``
    (``mysql -pS``, ``sshpass -p S`` … see :data:`_CLI_FLAG_RES`)."""
    spans: list[tuple[int, int]] = []
    low = text.lower()
    for x in _CLI_LITERALS:  # (a plain loop: faster than any())
        if x in low:
            break
    else:
        return spans
    cmds = list(_CLI_CMD_RE.finditer(text))
    for i, m in enumerate(cmds):
        end = cmds[i + 1].start() if i + 1 < len(cmds) else len(text)
        sep = _CLI_SEP_RE.search(text, m.end(), end)
        if sep is not None:
            end = sep.start()
        word = m.group(0).lower()
        if word in _LOGIN_CMDS and "login" not in text[m.end() : end]:
            continue  # "docker run -p 8080:80" publishes a port
        for prefixes, rx in _CLI_FLAG_RES:
            if word.startswith(prefixes):
                for f in rx.finditer(text, m.end(), end):
                    spans.append(f.span("pw"))  # (a digest is kept by _hash_match)
                break
    return spans


#: User parts of ``scheme:x@y`` forms that are addresses, not credentials.
_NOT_USERS = frozenset({"mailto", "sip", "sips", "tel", "xmpp", "im", "pres", "news", "urn"})
#: A secret named in prose: ``invalid token X``, ``bad api key: X``, ``password is X``
#: (error and outcome messages). Group 1 is the name's last word (the word before it
#: may complete it: ``api key``), group 2 the separator, group 3 the value. Each part is
#: a possessive run, and the search resumes after the name word: linear.
_PROSE_VALUE = r"[^\s'\"`,;<>()\[\]{}]"
_PROSE_RE = re.compile(
    rf"(?i)(?<![a-z0-9])({_PROSE_NAMES_ALT})(?![a-z0-9])"
    # after ":" / "=": any value; after a space: 6+ characters holding a digit and a
    # letter (tested here, so ordinary prose yields no match to look at in Python)
    rf"(?:(\s*+:\s*+|\s*+=\s*+)['\"]?({_PROSE_VALUE}++)"
    rf"|\s++(?:(?:is|was)(?::?\s++|\s*+:\s*+))?['\"]?(?:(?={_PROSE_VALUE}{{6}})"
    rf"(?=(?:(?!\d){_PROSE_VALUE})*+\d)(?=(?:(?![a-z]){_PROSE_VALUE})*+[a-z])"
    # or, with no digit (a JSON-RPC error's "invalid key xQzVbNmKpLwR"): 12+ characters
    # with 3+ capitals and 3+ small letters
    rf"|(?={_PROSE_VALUE}{{12}})(?-i:(?=(?:(?:(?![A-Z]){_PROSE_VALUE})*+[A-Z]){{3}})"
    rf"(?=(?:(?:(?![a-z]){_PROSE_VALUE})*+[a-z]){{3}})))"
    rf"({_PROSE_VALUE}++))"
)
#: Literals one of which (lower-cased) a text must hold for :data:`_PROSE_RE` to match.
_PROSE_LITERALS = (*_PROSE_WORDS, "pass")
_PREV_WORD_RE = re.compile(r"([A-Za-z]{1,32})[ _\-]\Z")
#: Names that are vocabulary, not values: ``["password", "token"]`` is a list of field
#: names, not a name and its value.
_NAME_WORDS = frozenset(WORD_NEEDLES) | frozenset(LONG_NEEDLES)


def _may_name_in_prose(text: str) -> bool:
    """Cheap test that :data:`_PROSE_RE` may match: a name word, and a space, ``:`` or
    ``=`` after it. Keys like ``passwordHint`` hold a name word but no separator."""
    if text.isalnum():  # one word, no separator (most keys)
        return False
    if text.isascii():
        for c in " :=\t\n\r\f\v":
            if c in text:
                break
        else:
            return False
    low = text.lower()
    for x in _PROSE_LITERALS:  # noqa: SIM110 - a plain loop is faster than any()
        if x in low:
            return True
    return False


#: After a list element that names a secret: the comma to the next element, or (``{"k":
#: "password"}, {"v": S}``) the end of its object, a comma and the next object's key.
_LIST_NEXT_RE = re.compile(
    r'\s*+(?:,|\}\s*+,\s*+(?:\{\s*+"[^"\\]*+(?:\\.[^"\\]*+)*+"\s*+:)?)\s*+'
)


#: A list element that can name the next one: a header, variable or field name.
#: (Leading dashes: a command line's flag, ``["tool", "--password", S]``.)
_NAME_SHAPE_RE = re.compile(r"-{0,2}[A-Za-z][A-Za-z0-9_.\-]{0,63}\Z")


#: Parts of a key name between separators (see :meth:`SecretHasher._scrub_key_name`).
#: Only parts holding a digit or 20+ characters long can hold a credential
#: (:func:`_key_part_is_secret`): others are skipped by the pattern, not in Python. Each
#: part is tried from its start only (the look-behind), and scanned at most twice.
_KEY_SEP = r"\s_\-.:=,;/|\"'@#&?\\"
_KEY_SEG_RE = re.compile(
    rf"(?<![^{_KEY_SEP}])(?=[^{_KEY_SEP}]*?\d|[^{_KEY_SEP}]{{20}})[^{_KEY_SEP}]++"
)


#: Technical words with digits that name a format, not a credential (``api_key_sha256``,
#: ``secret_v1beta2``, ``private_key_pkcs12``): key parts that stay readable.
_TECH_WORD_RE = re.compile(
    r"(?i:sha\d+|md5|base(?:32|64)(?:url)?|aes\d+(?:gcm|cbc|ctr)?|rsa\d+|ed25519|x25519"
    r"|x509|pkcs\d+|utf8|utf16|v\d+(?:alpha|beta)?\d*|oauth\d|ipv[46]|https?\d?|tls\d+"
    r"|argon2(?:id|i|d)?|bcrypt\d*|pbkdf2(?:sha\d+)?|hmac(?:sha\d+)?|totp\d*|2fa|mfa\d*"
    r"|s3|k8s|p256|p384|p521|secp\d+[kr]1|ecdsa\d*|blake2[bs]?|crc32|int\d+|uint\d+)"
)


def _key_part_is_secret(part: str) -> bool:
    """Whether a part of a secret-like key name looks like a credential, not a word:
    6+ characters mixing letters and digits (not a format name: ``sha256``, ``v1beta2``,
    ``pkcs12``), or 20+ with many capitals (random base62; ``authenticationMethodName``
    is not)."""
    if _looks_like_secret(part) and not _TECH_WORD_RE.fullmatch(part):
        return True
    return len(part) >= 20 and part.isalnum() and sum(c.isupper() for c in part) * 5 >= len(part)


def _is_name_text(text: str, start: int) -> bool:
    """Whether JSON text at ``start`` is an object key or a bare secret name (not a value
    to hash): a string followed by a colon, or one :func:`_is_name` accepts."""
    if text[start] != '"':
        return False
    m = _STR_RE.match(text, start)
    if m is None or not m.group(2):
        return False
    return _COLON_RE.match(text, m.end()) is not None or _is_name(_loose_unescape(m.group(1)))


def _is_name(value: Any) -> bool:
    """Whether a list element is a bare secret *name* (``["password", "token"]`` lists
    field names: the second is not the first one's value)."""
    return (
        type(value) is str and len(value) <= 64
        and normalize_key(key_skeleton(value)) in _NAME_WORDS
    )


def _looks_mixed_case(value: str) -> bool:
    """Whether a word with no digit looks random: 12+ characters, 3+ capitals and 3+
    small letters (``xQzVbNmKpLwR``; ``OpenTelemetry``, ``JavaScript`` do not)."""
    return (
        len(value) >= 12 and sum(c.isupper() for c in value) >= 3
        and sum(c.islower() for c in value) >= 3
    )


def _looks_like_secret(value: str) -> bool:
    """Whether a word that follows a secret name in prose is a credential, not prose:
    6+ characters mixing letters and digits (``invalid token expired`` stays)."""
    return (len(value) >= 6 and any(c.isdigit() for c in value)
            and any(c.isalpha() and not c.isdigit() for c in value))


#: ``name=value`` / ``name: value`` in free text (query strings, headers, DSNs): the name
#: and separator only; the value is measured from there (:data:`_KV_VALUE_RE`), so a
#: non-secret pair never swallows the next one (``https://h/?token=…``).
#: The name is a whole run of name characters (it starts where the run starts, and the
#: run is taken possessively): a bounded name tried from every position of a long run
#: cost up to 64 steps per byte; this scans each byte once. The name proper (its last
#: 64 characters, from a letter) is cut in Python.
#: Name characters: any script's letters and digits (``pаssword=`` with a Cyrillic
#: ``а`` is a name; :meth:`SecretHasher.is_secret_key` folds look-alikes), combining
#: marks, variation selectors and invisible format characters inside a word.
_NAME_CH = (
    r"[\w.\-\u00ad\u0300-\u036f\u200b-\u200f\u2060-\u2064\ufe00-\ufe0f\ufeff"
    r"\u249c-\u24e9\U0001f130-\U0001f189]"  # (circled, parenthesized, squared letters)
)
_KV_RE = re.compile(rf"(?<!{_NAME_CH})({_NAME_CH}++)(=|\s*+:\s*|\s+=\s*)")
#: An XML element's opening tag and its text (``<password>S</password>``, SOAP's
#: ``<wsse:Password Type="…">S</wsse:Password>``; the closing tag may be cut off).
#: (The name: any script's name characters, invisible ones and JSON ``\u`` escapes
#: included, so a look-alike name written escaped in text that does not parse counts.)
_XML_RE = re.compile(
    rf"<((?:{_NAME_CH}|:|\\u[0-9a-fA-F]{{4}}){{1,128}}+)(?:\s[^<>]{{0,1024}}+)?>([^<]++)"
)
#: :data:`_KV_RE` for ASCII text (an ASCII class is a bitmap test in ``re``; the Unicode
#: one is ~1.5x slower per byte on long texts).
_KV_RE_ASCII = re.compile(r"(?<![A-Za-z0-9_.\-])([A-Za-z0-9_.\-]++)(=|\s*+:\s*|\s+=\s*)")
_KV_NAME_RE = re.compile(
    rf"(?:[^\W\d_]|[\u249c-\u24e9\U0001f130-\U0001f189]){_NAME_CH}*\Z"
)
#: The value of a secret pair: quoted (``secret='a b'``, ``password: "x"``: up to the
#: closing quote or the end of the text) or bare (up to a delimiter). One group matches.
_KV_VALUE_RE = re.compile(
    r"(?i:(?:bearer|basic|digest|token|negotiate|ntlm)\s+)?"
    r"(?:'([^'\n]*)'?|\"((?:[^\"\\\n]|\\.)*)\"?|((?:[^\s&;,\"'<>\\]|\\.)+))"
)
#: A header list's value (to the end of the line or of a quoted string) and its pairs.
_COOKIE_LIST_RE = re.compile(r"[^\"\n\r]*+")
_COOKIE_PAIR_RE = re.compile(r"([^=;,\s]++=)([^;,\s]*+)")
#: A Python-repr key (``'secret':``, ``b'token':``) and the value after it: a quoted
#: string (cut or not), a container's opening bracket, or a bare scalar.
_REPR_PAIR_RE = re.compile(r"(?<![\w'\"])[bu]?(?:'([^'\\\n]{1,128}+)'\s*+(:|,|\]\s*+=|=>?)"
                           r"|\"([^\"\\\n]{1,128}+)\"\s*+(,|\]\s*+=|=>?))\s*+")
_REPR_VALUE_RE = re.compile(
    r"[bu]?'((?:[^'\\\n]|\\.)*+)'?|[bu]?\"((?:[^\"\\\n]|\\.)*+)\"?|([\[{(])"
    r"|([^\s,}\])'\"]++)"
)
_REPR_BRACKET_RE = re.compile(r"[\[\]{}()]")
#: Rows of a table in text (CSV, TSV, ``;`` or ``|`` separated, markdown); in JSON text
#: (escaped newlines) a string's quotes end a row too. A header cell's name.
_ROWS_RE = re.compile(r"(\r?\n)")
_ROWS_ESCAPED_RE = re.compile(r'(\\r?\\n|(?<!\\)")')
_TABLE_SEPS = ("\t", "\\t", "|", ";", ",")
_TABLE_NAME_RE = re.compile(r"[\"'`*]*+([A-Za-z][\w.\-]{0,63}+(?: [\w.\-]{1,32}+)?)[\"'`*]*+")
#: A percent-escape (``%3D``): a URL- or form-encoded text is scanned decoded too.
_PCT_RE = re.compile(r"%[0-9A-Fa-f]{2}")
#: ``Bearer+token`` / ``Basic+…``: a form-encoded space after a scheme name.
_PLUS_SCHEME_RE = re.compile(r"(?i)(?:bearer|basic)\+")
#: Objects that name a value instead of keying it (``{"name": "Authorization", "value":
#: …}``: HAR headers, Kubernetes env vars, cloud tags): the value is secret when the name is.
_PAIR_VALUE_KEYS = frozenset(
    {"value", "Value", "VALUE", "values", "Values", "val", "v", "data"}
)
_PAIR_NAME_KEYS = (
    "name", "Name", "key", "Key", "NAME", "KEY", "field", "Field", "header", "Header",
    "param", "parameter", "k", "id",
)
#: ``"name": "…"`` in JSON text (the name possibly cut by the end of the text).
_PAIR_NAME_TEXT_RE = re.compile(r'"([A-Za-z]{1,9})"\s*+:\s*+"([^"\\]*+(?:\\.[^"\\]*+)*+)')
#: A line that is only base64 (a PEM body line, a key printed alone), hashed whole by
#: the structure-free scan when it mixes upper case, lower case and digits.
_B64_LINE_B = re.compile(rb"[A-Za-z0-9+/]{20,}={0,2}")
_B64_CLASSES_B = (re.compile(rb"[0-9]"), re.compile(rb"[A-Z]"), re.compile(rb"[a-z]"))
_GATE_LITERALS = (
    "=", ":", '"', "%", "earer", "EARER", "asic", "\x1b", "'", "-----BEGIN", *_STRUCT_LITERALS,
)
#: No token format of the rule set matches fewer characters: shorter strings skip the
#: ~170 literal tests of :data:`_SHAPE_LITERALS`.
_MIN_TOKEN_LEN = min((r.min_len for r in TOKEN_RULES), default=0)
#: A text that starts with the end of a name and its separator: a line whose head was
#: cut off (``word": "S"}``, ``ssword=S``: interleaved or cut writes, a read that
#: started mid-line). Group 1 is the name's remaining part.
_CUT_HEAD_RE = re.compile(r'\s*+([A-Za-z0-9_.\-]{1,64}+)(\\*"\s*:|\s?[=:])')
#: Ends of secret names that are ordinary words or word endings on their own: a text
#: starting with ``code=`` or ``string:`` is not a cut ``passcode`` / ``connectionstring``.
_CUT_HEAD_WORDS = frozenset({
    "tion", "ation", "zation", "ization", "card", "code", "mber", "umber", "number",
    "ring", "tring", "string", "rase", "hrase", "phrase", "tial", "ential", "kens",
})
#: :data:`_CUT_HEAD_RE` for RE2 (batch prefilter): a name ending like a secret name
#: (the last letters of every vocabulary word), then its separator, at a line's start.
_CUT_HEAD_RE2 = (
    r'^\s*[a-z0-9_.\-]{0,64}(?:ord|swd|key|ken|ens|ret|rets|ial|ials|rer|kie|ion|ing'
    r'|ode|ase|ard|ber|ass|uth|wd)(?:\\*"\s*:|\s?[=:])'
)


def _may_hold_shape(text: str) -> bool:
    """Cheap test that a string may hold a shape: every rule of ``scrub_str`` needs one
    of these substrings (strings without any are left alone without running the rules).
    Plain substring tests: an alternation regex costs several µs per string in ``re``."""
    for x in _GATE_LITERALS:  # a plain loop is faster than any()
        if x in text:
            return True
    if len(text) >= _MIN_TOKEN_LEN:
        for x in _SHAPE_LITERALS:
            if x in text:
                return True
    # a credential named in prose ("invalid token X"), or ``user:pass@host``; a command
    # line with a password flag ("mysql -pS", "sshpass -p S")
    return (
        _may_name_in_prose(text)
        or (" -" in text and _CLI_CMD_RE.search(text) is not None)
        or (not text.isascii() and _lookalike_prose(text))
        or ("<" in text and ">" in text)
    )


#: JSON strings, in order; a missing closing quote (end of text) is allowed.
#: Unrolled (``[^"\\]*+`` runs between escapes, possessive): one step per run instead
#: of one alternation per character, and no backtracking on a string cut by the end.
_STR_RE = re.compile(r'"([^"\\]*+(?:\\.[^"\\]*+)*+)("?)', re.S)
_COLON_RE = re.compile(r"\s*:\s*")
_BRACKET_RE = re.compile(r'[\[\]{}"]')
_SCALAR_RE = re.compile(r"[^,}\]\s]*")
_ESCAPE_RE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.S)
_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}

#: Texts at least this long ask RE2 whether a secret name may be in them before the
#: per-pair / per-string Python scanners run (see ``SecretHasher._may_name_secret``):
#: with google-re2 a search costs ~3 us + ~2 ns/byte; without it pyarrow's costs ~2.5 ms
#: (it compiles the pattern on every call), worth it only on long texts.
_RE2_GATE_CHARS = 2048 if _re2 is not None else 65_536

#: Nesting of JSON-in-a-string scanned by :meth:`SecretHasher.scrub_str`; deeper
#: candidate strings are hashed whole.
MAX_EMBED_DEPTH = 4


def _loose_unescape(content: str) -> str:
    """JSON string content to text without failing (cut escapes, lone surrogates)."""
    try:
        out = orjson.loads('"' + content + '"')
        assert isinstance(out, str)
        return out
    except (orjson.JSONDecodeError, TypeError, AssertionError):
        pass

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] == "u":
            # a cut escape ("\\u12", "\\u" at the end) stays literal text
            return chr(int(e[1:], 16)) if len(e) == 5 else "\\" + e
        return _SIMPLE_ESCAPES.get(e, e)

    return _ESCAPE_RE.sub(one, content)


def _json_str(text: str) -> str:
    """``text`` as a JSON string literal (never raises: lone surrogates are escaped)."""
    try:
        return orjson.dumps(text).decode()
    except TypeError:
        return json.dumps(text)


def _canonical(value: Any) -> bytes:
    """Canonical JSON (sorted keys, compact) of any JSON-like value, at any depth.

    orjson does it in one call up to 255 levels and 64-bit integers; beyond that an
    explicit stack does it (recursion would overflow on hostile nesting).
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        pass
    out: list[str] = []
    stack: list[tuple[bool, Any]] = [(False, value)]  # (is literal text, item)
    while stack:
        literal, item = stack.pop()
        if literal:
            out.append(item)
        elif isinstance(item, dict):
            pairs = sorted(item.items(), key=lambda kv: str(kv[0]))
            stack.append((True, "}"))
            for i in range(len(pairs) - 1, -1, -1):
                k, v = pairs[i]
                stack.append((False, v))
                stack.append((True, ("," if i else "") + _json_str(str(k)) + ":"))
            out.append("{")
        elif isinstance(item, list | tuple):
            stack.append((True, "]"))
            for i in range(len(item) - 1, -1, -1):
                stack.append((False, item[i]))
                if i:
                    stack.append((True, ","))
            out.append("[")
        elif isinstance(item, str):
            out.append(_json_str(item))
        elif type(item) is int:
            out.append(str(item))
        else:
            try:
                out.append(orjson.dumps(item).decode())
            except TypeError:
                out.append(_json_str(repr(item)))
    return "".join(out).encode("utf-8", "surrogatepass")


def _word_forms_re2(word: str) -> str:
    """RE2 (and Python) pattern of ``word`` as a whole word of a key, in any style.

    The superset of where :func:`key_words` yields ``word``: lower case not preceded by a
    letter, Capitalized anywhere, UPPER not preceded by an upper-case letter; none
    followed by a lower-case letter. Case-sensitive inside a case-insensitive pattern.

    The word must also end a *name*: a JSON key (the rest of the string, then its
    closing quote — escaped or not — and a colon), a ``name=`` / ``name:`` pair, or the
    end of the text. (A list element naming the next one has its own alternative in
    :attr:`SecretHasher.candidate_pattern`.) Short words are common in values ("design
    doc auth") and a value match only sends the line down the slow exact path for nothing.
    """
    low, cap, up = word, word.capitalize(), word.upper()
    end = (
        r'(?:$|\\*"\s*:|(?:[^a-z"\\]|\\.)(?:[^"\\]|\\.)*\\*"\s*:'
        r"|(?:[^a-z][A-Za-z0-9_.\-]*)?\s*[:=]|(?:'|\\+\")\s*(?:,|\]\s*=|=>?)\s*\\*['\"])"
    )
    return (
        rf"(?-i:(?:^|[^A-Za-z]|\\[bfnrt]){low}{end}|{cap}{end}"
        rf"|(?:^|[^A-Z]){up}{end})"
    )


def _joined_re2(needle: str) -> str:
    """RE2 (and Python) pattern of a normalized name spelled with any separators."""
    sep = r"(?:[^A-Za-z0-9\\]|\\[^u])*"
    return sep.join(re.escape(c) for c in needle)


class SecretHasher:
    """Replace secrets in log lines with keyed hashes.

    Parameters
    ----------
    key
        HMAC key bytes.
    secret_keys
        Extra secret names, beyond the built-in vocabulary (:data:`WORD_NEEDLES`,
        :data:`LONG_NEEDLES`): a key whose normalized form (:func:`normalize_key`)
        contains one of them (normalized too) is secret.
    exceptions
        Extra normalized key names that are never secret, beyond
        :data:`DEFAULT_EXCEPTIONS` (e.g. ``"tokenizer"``).
    """

    def __init__(
        self, key: bytes, secret_keys: Iterable[str] = (), exceptions: Iterable[str] = ()
    ):
        self._key = key
        extra = {normalize_key(k) for k in secret_keys} - {""}
        self._words = frozenset(WORD_NEEDLES)
        self._needles = tuple(sorted(set(LONG_NEEDLES) | extra))
        self._exceptions = frozenset(DEFAULT_EXCEPTIONS) | {normalize_key(e) for e in exceptions}
        self._key_cache: dict[str, bool] = {}
        self._clean_keys: set[str] = set()  # secret-like keys holding no credential
        self._wild_needles = (*self._needles, *sorted(self._words))
        # every secret name, longest first (cut off the ends of key parts)
        self._vocabulary = tuple(sorted(set(self._needles) | self._words, key=len, reverse=True))
        self._re2_gate: Any = None  # compiled on first use (~6 ms)
        parts = [
            *(_word_forms_re2(w) for w in sorted(self._words | LAST_WORDS)),
            *(_joined_re2(n) for n in self._needles),
            _TOKENS_PREFILTER,  # the rule set's token formats, a PEM key, a cut token
            r"(?-i:[Bb]asic\s)|\x1b\[|identified\s|api\.telegram\.org/bot",
            r"'\s*:",  # a Python-repr pair ({'0token0': 'S'}): _scan_repr reads its key
            _CRYPT + "{16}",  # a crypt hash ($2b$…, $argon2id$…), alone or after "user:"
            # a table's header cell naming a secret, then the row's end (CSV, TSV, markdown)
            rf"(?:^|[^a-z]){_PROSE_NAMES_ALT}[\s'\"*`]*(?:[,;|\t]|\\t)[^\n\\]*(?:\n|\\[rn])",
            r":[^\s\"'/]*@",  # bare userinfo (user:pass@host): _USERINFO_RE hashes it
            # (PuTTY fields and shadow, htpasswd and pgpass lines: name:, "$x$", host:port:)
            r"(?:private-(?:lines|mac)|argon2-salt):|:(?:\$[0-9a-z]{1,8}\$|\{[a-z0-9\-]{3,10}\})"
            r"|(?:^|[\s\"'])[a-z0-9_.*\-]+:(?:\d{1,5}|\*):[^:\s\"']+:[^:\s\"']+:[^\s\"':]",
            r"(?:\\?/){2}[^/\s\"]*@",  # URL userinfo (scheme-relative too)
            r":(?:\\?/){2}[^/\s\"@]*:[^/\s\"@]*\s*$",  # ... cut before its "@"
            r"%[0-9a-f]{2}",  # URL- or form-encoded text (scanned decoded)
            r"^\s*[a-z0-9+/]{20,}={0,2}\s*$",  # a bare base64 line (PEM body)
            # user:pass@host with no scheme; curl -u user:pass
            r"[^\s\"'<>@:/\\]:[^\s\"'<>@/]*@[a-z0-9\[]",
            r"(?:^|\s)(?:-u|--user|--proxy-user)(?:\s+|=)['\"]?[^\s:'\"]+:",
            _CLI_LINE_PATTERN,  # mysql -pS, sshpass -p S, ["redis-cli", "-a", S] …
            # a name in prose ("invalid token X", "auth key: X"); the other names of
            # _PROSE_RE are long needles, matched above wherever they are
            # ("token: X" is a word form above; "api key: X" a long needle)
            rf"(?:^|[^a-z0-9]){_PROSE_NAMES_ALT}\s",
            # a name-shaped string naming the next list element (["token", S],
            # [{"k": "pin"}, {"v": S}]); long needles are matched above anywhere
            r'\\*"[a-z0-9_.\-]*(?:' + "|".join(sorted(self._words))
            + r')[a-z0-9_.\-]*\\*"\s*\}?\s*,',
            # look-alike letters in a name (is_secret_key folds them): a Latin letter
            # next to a non-ASCII character in a JSON string without spaces that ends a
            # key or list element ("pаssword", "p\u200bin", "tóken"), or in a word just
            # before "=" / ":" ("pаssword=…"); a non-ASCII character before "="/":"
            # ("ｐａｓｓ=…"); a whole key / list name of non-ASCII characters ("раѕѕ").
            # Prose in any script does not match (values with spaces): non-English logs
            # stay on the fast path. The negated ASCII class means "a byte >= 0x80" in the
            # Latin-1 batch scan and "a non-ASCII character" in the UTF-8 one: both a
            # superset.
            # (a name may sit between escaped quotes: JSON text inside a string)
            r'"[^"\s\\]*(?:[a-z][^\x00-\x7f]|[^\x00-\x7f][a-z])[^"\s\\]*\\*"\s*[:,}]',
            r"(?:[a-z][^\x00-\x7f]|[^\x00-\x7f][a-z])[^\s\"=:,&;]*[=:]|[^\x00-\x7f]\s?[=:]",
            r'"[^"\\\x00-\x7f]+\\*"\s*[:,}]',
        ]
        # Round 4 (session 6): rules that do not run behind the long-text gate.
        round4 = [
            # a look-alike name in prose, then a word with a digit ("the pаssword is S"):
            # a Latin letter next to a non-ASCII byte, or the UTF-8 bytes of fullwidth,
            # mathematical or circled letters, the long s (Latin-1 scan; ingest's and
            # the middleware's). Words wholly of another script do not match.
            r"(?:[a-z][^\x00-\x7f]|[^\x00-\x7f][a-z]|\xef\xbc[\xa1-\xba]|\xef\xbd[\x81-\x9a]"
            r"|\xf0\x9d[\x90-\x9f]|\xe2\x92[\xb6-\xbf]|\xe2\x93[\x80-\xa9]|\xc5\xbf)"
            r"[^\s\"\\]*\s+(?:(?:is|was)\s+)?['\"]?[^\s'\"\\]*[0-9]",
            _lookalike_names_pattern(True),  # a name wholly in look-alikes: "токен S"
            _CUT_HEAD_RE2,  # a line cut inside a secret name: 'ssword=S', 'word": "S"'
            _ARGV_FLAG_PATTERN,  # ["-u", "root", "-p", S] (the command elsewhere)
            # an XML tag named with non-ASCII characters (a look-alike "<pаssword>S"; ASCII
            # names are matched by the name patterns above), cut before any closing quote
            r'<[^<>\s"]*[^\x00-\x7f][^<>\s"]*(?:\s[^<>]*)?>[^<\s]',
        ]
        self._text_pattern = "|".join(parts + round4)
        # The long-text gate (:meth:`_may_name_secret`) guards the pair and JSON-text
        # scanners only: without the round-4 alternatives, whose rules (prose, cut heads,
        # argv, XML) do not run behind it. The cut-head one would take any string
        # starting "key=" for a cut name (a string's start is no line's start), and the
        # look-alike spellings make a larger DFA (1 MB of 'a:b=c ' 1.13x).
        self._gate_pattern = "|".join(parts) + r"|\\u|hmac:[0-9a-f]{32}"

    # ------------------------------------------------------------------ matching
    @property
    def candidate_pattern(self) -> str:
        """RE2 pattern (run case-insensitively) matching lines that may carry a secret.

        Used vectorized over a whole batch (``pyarrow.compute.match_substring_regex``,
        ``ignore_case=True``): one DFA pass, so the exact path runs only for the few
        lines that need it. It is a superset of what the exact path changes: every
        secret key spelling, token shape, URL userinfo and query secret, and every line
        holding a ``\\u`` escape, and every digest already in a line (the SDK
        middleware's, or a line redacted before), which is recorded as the line's
        credential hash.
        """
        return self._text_pattern + r"|\\u|hmac:[0-9a-f]{32}"

    def is_secret_key(self, key: str) -> bool:
        """Whether values under ``key`` must be hashed (any case or separator style)."""
        # Logs repeat a small vocabulary of keys: memoize (bounded, keys are attacker data).
        hit = self._key_cache.get(key)
        if hit is None:
            hit = self._names_secret_word(key)
            if not hit and not key.isascii():
                # look-alike letters ("pаssword" with a Cyrillic а, fullwidth, zero
                # width inside a word): the folded name, and a mixed-script word with
                # one letter no table folds read as a wildcard
                skel = key_skeleton(key)
                hit = self._names_secret_word(skel) or self._wildcard_secret(skel)
            # bounded in count and in key length (keys are attacker data: 65,536 keys of
            # a megabyte each must not stay in memory)
            if len(self._key_cache) < 65_536 and len(key) <= 256:
                self._key_cache[key] = hit
        return hit

    def _names_secret_word(self, key: str) -> bool:
        joined = normalize_key(key)
        if joined in self._exceptions:
            return False
        words = key_words(key)
        return (
            any(w in self._words for w in words)
            or any(n in joined for n in self._needles)
            or (bool(words) and words[-1] in LAST_WORDS
                and (len(words) == 1 or words[-2] not in REFERENCE_WORDS))
        )

    def _wildcard_secret(self, skel: str) -> bool:
        """Whether a folded key with non-ASCII letters left spells a secret name when one
        such letter stands for any Latin letter, inside a word that also holds Latin
        letters (``"pⱥssword"``: a look-alike no table knows). Whole foreign words
        (``"пароль"``, ``"名前"``) never count: they hold no Latin letter."""
        for w in _LETTER_RUN_RE.findall(skel):
            if w.isascii():
                continue
            # exactly one non-ASCII letter (more is too loose, none is no mixed word):
            # found with one pass, so a long word costs linear time
            unknown = [i for i, c in enumerate(w) if not c.isascii()]
            if len(unknown) != 1 or len(w) < 2:
                continue
            i = unknown[0]
            low = w.lower()
            rest = low[:i] + "\x00" + low[i + 1 :]
            for n in self._wild_needles:
                if len(n) > len(rest):
                    continue
                for j in range(len(n)):
                    probe = n[:j] + "\x00" + n[j + 1 :]
                    if probe in rest and (n not in self._words or rest == probe):
                        return True
        return False

    # ------------------------------------------------------------------ digests
    def digest(self, value: Any) -> str:
        """Keyed hash of one secret value, as stored.

        A string hashes its text; any other value its canonical JSON (sorted keys,
        compact), so a list or object is one digest and equal values hash equal.
        """
        if isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
        elif type(value) is int:  # its JSON text; orjson refuses ints beyond 64 bits
            raw = str(value).encode()
        elif isinstance(value, dict | list):
            raw = _canonical(value)
        else:
            try:
                raw = orjson.dumps(value)
            except TypeError:
                raw = _canonical(value)
        # one-shot C HMAC: ~4x cheaper than hmac.new(...).hexdigest() per secret
        return HASH_PREFIX + hmac.digest(self._key, raw, "sha256").hex()[:32]

    def _hash_value(self, value: Any, found: list[str]) -> Any:
        """The stored form of a value under a secret key (``None`` stays ``None``)."""
        if value is None:
            return None
        if isinstance(value, str) and is_digest(value):
            found.append(value)
            return value
        h = self.digest(value)
        found.append(h)
        return h

    # ------------------------------------------------------------------ structures
    def redact(self, obj: Any, found: list[str]) -> Any:
        """Return ``obj`` with every secret hashed; append the hashes to ``found``.

        Walks with an explicit stack (any depth, never a ``RecursionError``), in
        document order (the first hash becomes the event's ``credential_hash``).
        Containers holding no secret are returned as they are (not copied): a log line
        is mostly scalars under ordinary keys. ``obj`` itself is never modified.
        """
        return self._walk(obj, found, strings=True)

    def _walk(self, obj: Any, found: list[str], *, strings: bool) -> Any:
        """:meth:`redact`; ``strings=False`` checks keys only (the caller knows no string
        can hold a shape)."""
        if isinstance(obj, str):
            return self.scrub_str(obj, found) if strings and _may_hold_shape(obj) else obj
        if not isinstance(obj, dict | list):
            return obj
        gate = _may_hold_shape
        cache = self._key_cache
        # frame: [container, iterator, copy-or-None, parent frame, key in parent]
        stack: list[list[Any]] = [[obj, _items(obj), None, None, None]]
        while stack:
            f = stack[-1]
            is_dict = type(f[0]) is dict
            descended = False
            for k, v in f[1]:
                new_k = k
                if is_dict:
                    secret = cache.get(k)
                    if secret is None:
                        secret = self.is_secret_key(k)
                    if not secret and k in _PAIR_VALUE_KEYS:
                        # {"name": "DB_PASSWORD", "value": …} (k8s env, HAR headers, tags)
                        secret = self._names_secret(f[0])
                    if secret:
                        # a secret *name* is no secret: {"key": "client_secret"}, S
                        new = (v if k in _PAIR_NAME_KEYS and self._names_next(v)
                               else self._hash_value(v, found))
                        # a key can hold a secret too ("Bearer …", "token=…", "secret_S")
                        new_k = self.scrub_str(k, found) if strings and gate(k) else k
                        new_k = self._scrub_key_name(new_k, found)
                        if new is not v or new_k is not k:
                            _set(f, k, new_k, new)
                        continue
                    if strings and gate(k):
                        new_k = self.scrub_str(k, found)
                elif k and self._names_next(f[0][k - 1]) and not _is_name(v):
                    # a list naming its next element: ["password", S], [["Authorization",
                    # "Bearer …"]], ["api_key", S, "page", 2], [{"k": "password"}, {"v": S}]
                    new = self._hash_value(v, found)
                    if new is not v:
                        _set(f, k, k, new)
                    continue
                tv = type(v)
                if tv is list and strings and 0 < len(v) <= 4096 and all(
                    type(x) is str for x in v
                ):
                    nv = self._scrub_argv(v, found)  # ["mysql", "-pS"] / ["sshpass", "-p", S]
                    if nv is not v:
                        _set(f, k, new_k, nv)
                        new_k = k  # (recorded)
                        v = nv
                if tv is dict or tv is list:
                    if new_k is not k:
                        _set(f, k, new_k, v)
                    stack.append([v, _items(v), None, f, k])
                    descended = True
                    break
                if strings and tv is str and gate(v):
                    new = self.scrub_str(v, found)
                    if new is not v or new_k is not k:
                        _set(f, k, new_k, new)
                elif new_k is not k:
                    _set(f, k, new_k, v)
            if descended:
                continue
            stack.pop()
            result = f[0] if f[2] is None else _build(f)
            if f[3] is None:
                return result
            if result is not f[0]:
                _set(f[3], f[4], f[4], result)
        return obj  # pragma: no cover - the loop returns at the root

    def _scrub_key_name(self, key: str, found: list[str]) -> str:
        """A secret-like key with a credential glued to its name (``"secret_S"``,
        ``"secretS"``, ``"S_password"``, ``"authorization S"``): the credential is hashed,
        the name kept. A part of the key counts when, with the vocabulary words at its
        ends cut off, it looks like a credential (:func:`_key_part_is_secret`):
        ``passwordHint``, ``api_key_v2``, ``password_confirmation`` stay."""
        if len(key) < 8 or key.startswith(HASH_PREFIX) or key in self._clean_keys:
            return key
        pieces: list[str] = []
        last = 0
        for m in _KEY_SEG_RE.finditer(key):
            seg = m.group(0)
            # (vocabulary words are letters: a part without a digit can only count by
            # length, so most name words are skipped before any stripping)
            if len(seg) < 6 or (len(seg) < 20 and seg.isalpha()):
                continue
            if key.startswith(HASH_PREFIX, m.start() - len(HASH_PREFIX)) and is_digest(
                HASH_PREFIX + seg
            ):  # a credential hashed before ("secret_hmac:<hex>"): kept, recorded
                found.append(HASH_PREFIX + seg)
                continue
            a, b = self._strip_vocabulary(seg)
            part = seg[a:b]
            if _key_part_is_secret(part):
                s = m.start() + a
                pieces.append(key[last:s])
                pieces.append(self._hash_match(part, found))
                last = s + len(part)
        if not pieces:
            if len(self._clean_keys) < 65_536 and len(key) <= 256:
                self._clean_keys.add(key)
            return key
        pieces.append(key[last:])
        return "".join(pieces)

    def _strip_vocabulary(self, seg: str) -> tuple[int, int]:
        """Bounds of ``seg`` without the secret names at its start and end
        (``secretS`` → ``S``; a name inside a credential is left in it)."""
        low = seg.lower()
        a, b = 0, len(seg)
        changed = True
        rounds = 0
        # (at most 8 rounds: "passwordpassword…S" keeps the rest of its names in the
        # part, which is hashed with the credential; bounded work per segment)
        while changed and a < b and rounds < 8:
            rounds += 1
            changed = False
            for n in self._vocabulary:
                if low.startswith(n, a, b):
                    a += len(n)
                    changed = True
                elif low.endswith(n, a, b):
                    b -= len(n)
                    changed = True
        return a, b

    def _names_next(self, prev: Any) -> bool:
        """Whether a list element names the element after it as a secret: a secret name
        (``"password"``, ``"Authorization"``) or a one-entry object holding one
        (``{"k": "password"}``)."""
        if type(prev) is dict and len(prev) == 1:
            prev = next(iter(prev.values()))
        return (
            type(prev) is str
            and len(prev) <= 256
            # a name, not a URL or a sentence (look-alike letters folded first)
            and _NAME_SHAPE_RE.match(key_skeleton(prev)) is not None
            and self.is_secret_key(prev)
        )

    def _names_secret(self, obj: dict[str, Any]) -> bool:
        """Whether a ``{"name": …, "value": …}`` object names a secret in its name."""
        for nk in _PAIR_NAME_KEYS:
            name = obj.get(nk)
            if type(name) is str and len(name) <= 256 and self.is_secret_key(name):
                return True
        return False

    def plan(self, lines: pa.Array) -> list[int]:
        """Which passes :meth:`redact_line` needs, for a batch of lines at once.

        One RE2 pass over all ``lines`` (binary or string) per test — each token format's
        literals, and the per-string rules' characters (:data:`_PLAN_PATTERNS`)
        — instead of ~25 substring tests per line in Python. Pass ``plan=`` the item of
        the *same bytes* to :meth:`redact_line`; any other line gets ``plan=None``.

        Returns
        -------
        list[int]
            Per line, a bit mask: bit :data:`PLAN_TOKENS` = some token format of the
            rule set (or a PEM key) may be present, bit :data:`PLAN_STRINGS` = some
            string may hold a shape.
        """
        n = len(lines)
        if n == 0:
            return []
        fast = _plan_buffer(lines)
        if fast is not None:
            return fast
        mask = np.zeros(n, dtype=np.int64)
        for bit, pattern in enumerate(_PLAN_PATTERNS):
            # ``lines`` has no nulls (to_numpy would raise, and the caller falls back to
            # per-line tests); no fill_null: its pa.scalar imports pandas too.
            hit = pc.cast(pc.match_substring_regex(lines, pattern), pa.int8())
            # Not BooleanArray.to_numpy: that imports pandas (~0.2 s per ingest process).
            mask |= to_numpy(hit).astype(np.int64) << bit
        return mask.tolist()

    def redact_line(self, line: bytes, plan: int | None = None) -> tuple[bytes, str | None]:
        """Redact one JSON line; never raises.

        Parameters
        ----------
        line
            The raw line.
        plan
            This line's item of :meth:`plan` (computed on these very bytes), or ``None``
            to decide here which passes to run.

        Returns
        -------
        (line, credential_hash)
            The re-serialized line (the same bytes if nothing was secret) and the first
            secret hash found, if any. A line the JSON library cannot take (not JSON,
            truncated, nested too deep, numbers out of range) is scrubbed by
            :meth:`scrub_text` instead, which needs no structure.
        """
        found: list[str] = []
        src = line
        # Token formats hold no JSON-escaped character: replaced in the raw text before
        # parsing (one pass over the line, not one per string). Which formats to run is
        # decided by plain substring tests (C, linear, no per-match Python work however
        # many times a literal repeats).
        if plan is None or plan & PLAN_TOKENS:
            src = self._tokens_bytes(src, found)
        strings = (_STRINGS_B_RE.search(line) is not None if plan is None
                   else bool(plan & PLAN_STRINGS))
        try:
            obj = orjson.loads(src)
        except orjson.JSONDecodeError:
            return self._scrub_bytes(line)
        # (the gate reads the line as logged: a digest put in by the token pass has a colon)
        red = self._walk(obj, found, strings=strings)
        if _has_duplicate_keys(src, obj):
            return self._redact_duplicates(src, line)
        if not found:
            # a digest no rule claims (a token format hashed before, under an ordinary
            # key) is still the line's credential, as it was for the first redaction
            d = _DIGEST_B_RE.search(line) if b"hmac:" in line else None
            return line, (d.group(0).decode() if d is not None else None)
        if red is obj:
            return src, found[0]
        try:
            return orjson.dumps(red), found[0]
        except TypeError:  # deeper than orjson writes (255): fall back to the text scan
            return self._scrub_bytes(line)

    def _redact_duplicates(self, src: bytes, line: bytes) -> tuple[bytes, str | None]:
        """A line with a key twice in one object: ``orjson`` keeps the last value, DuckDB
        (which reads the stored line) the first, so a secret under the first was never
        seen and stored in clear. Every occurrence is kept — the first under its name,
        the others as ``name#2``, ``name#3`` … (so what is parsed does not change and no
        value is lost) — and all are redacted."""
        found: list[str] = []
        try:
            obj = json.loads(src, object_pairs_hook=_keep_duplicates)
            red = self._walk(obj, found, strings=True)
            return orjson.dumps(red), (found[0] if found else None)
        except (ValueError, TypeError, RecursionError):
            return self._scrub_bytes(line)

    def _tokens_bytes(self, src: bytes, found: list[str]) -> bytes:
        """``src`` with every token format of the rule set (and a PEM key) hashed: one RE2
        pass of all of them (:func:`~toolwatch.ingest.secret_rules.tokens_regex`)."""
        if b"-----BEGIN" in src:
            src = _PEM_RE_B.sub(lambda m: self._hash_bytes(m.group(0), found), src)
        # The capture-free gate first on short texts only: it saves a fixed ~4 us per
        # search there, while on a long text holding tokens it would be a second pass.
        if TOKEN_RULES and (len(src) > _TOKENS_GATE_MAX_BYTES
                            or tokens_gate().search(src) is not None):
            src = tokens_regex().sub(lambda m: self._value_b(m, m.lastindex, found), src)
        return src

    def _tokens_str(self, text: str, found: list[str]) -> str:
        """:meth:`_tokens_bytes` for a string (as UTF-8: token formats are ASCII; lone
        surrogates, which RE2 refuses in a string, pass through)."""
        if len(text) < _MIN_TOKEN_LEN:
            return text
        raw = text.encode("utf-8", "surrogatepass")
        out = self._tokens_bytes(raw, found)
        return text if out is raw else out.decode("utf-8", "surrogatepass")

    def _value_b(self, m: Any, g: int, found: list[str]) -> bytes:
        s, e = m.span(g)
        base, whole = m.start(), m.group(0)
        d = _DIGEST_B_RE.match(m.string, max(0, s - len(HASH_PREFIX)))
        if d is not None and d.start() <= s < d.end():  # hashed before: kept, recorded
            found.append(d.group(0).decode())
            return whole
        return whole[: s - base] + self._hash_bytes(m.group(g), found) + whole[e - base :]

    def _hash_named(self, m: re.Match[str], found: list[str]) -> str:
        """A structural rule's match with its (one) set value group hashed."""
        g = next(k for k in ("v", "w", "x") if k in m.re.groupindex and m.group(k))
        s, e = m.span(g)
        base, whole = m.start(), m.group(0)
        return whole[: s - base] + self._hash_match(m.group(g), found) + whole[e - base :]

    def _hash_bytes(self, secret: bytes, found: list[str]) -> bytes:
        return self._hash_match(secret.decode("utf-8", "surrogateescape"), found).encode()

    # ------------------------------------------------------------------ text
    def scrub_text(self, line: bytes) -> bytes:
        """Redact bytes that may not be valid or complete JSON (never raises).

        For quarantined, truncated and over-long lines (their raw prefix is stored for
        forensics): every rule of :meth:`scrub_str`, plus a token format's prefix cut
        short by the end of the text.
        """
        return self._scrub_bytes(line)[0]

    def _scrub_bytes(self, line: bytes) -> tuple[bytes, str | None]:
        found: list[str] = []
        body = line.strip()
        if _B64_LINE_B.fullmatch(body) and all(c.search(body) for c in _B64_CLASSES_B):
            # A bare base64 line: the body of a PEM key (or any key) a server printed
            # over several lines, where no line but the first names what it is.
            h = self._hash_bytes(body, found)
            return line.replace(body, h, 1), found[0]
        text = line.decode("utf-8", "surrogateescape")
        out = self._scrub_cut_head(text, found)
        if out is None:
            out = self.scrub_str(text, found, tail=True)
        if out is text:
            return line, None
        return out.encode("utf-8", "surrogateescape"), (found[0] if found else None)

    def _scrub_cut_head(self, text: str, found: list[str]) -> str | None:
        """A text whose head was cut inside a secret name (``word": "S"}``,
        ``ssword=S``): the name is completed (``"password": "S"}``), scanned by the rules
        of :meth:`scrub_str`, and the completion taken off again. The remaining part must
        be 4+ letters (after separators are dropped) that end a secret name and are no
        ordinary word (:data:`_CUT_HEAD_WORDS`): ``et=…`` or ``code=…`` is no cut name.
        Returns ``None`` when the text does not start so (then :meth:`scrub_str` runs on
        it as it is; the completed text's scan covers every rule, so it is the only one)."""
        m = _CUT_HEAD_RE.match(text)
        if m is None:
            return None
        frag = normalize_key(m.group(1))
        if self.is_secret_key(m.group(1)):
            missing = ""  # a whole name (the JSON key's opening quote may be missing)
        elif len(frag) < 4 or frag in _CUT_HEAD_WORDS:
            return None
        else:
            for n in self._vocabulary:  # longest first
                if len(n) > len(frag) and n.endswith(frag):
                    missing = n[: len(n) - len(frag)]
                    break
            else:
                return None
        if m.group(2)[-1] == ":" and '"' in m.group(2):  # a JSON key: its opening quote
            missing = '"' + missing
        s = m.start(1)
        more: list[str] = []
        red = self.scrub_str(missing + text[s:], more, tail=True)
        if not red.startswith(missing):
            return None
        found.extend(more)
        if not more:
            return text
        return text[:s] + red[len(missing):]

    def scrub_str(
        self, text: str, found: list[str] | None = None, *, tail: bool = False, _depth: int = 0
    ) -> str:
        """Hash every secret *shape* in one string (never raises).

        Token formats, ``Bearer``/``Basic`` credentials, URL userinfo, ``name=value``
        and ``name: value`` pairs with a secret name, and JSON text (complete or not,
        escaped inside a string or not) with values under secret keys. Returns ``text``
        itself when nothing changed.

        Parameters
        ----------
        text
            Any string.
        found
            Digests are appended here.
        tail
            Also hash a token format's prefix at the very end (the text may be cut).
        """
        if found is None:
            found = []
        out, n_found, plain = text, len(found), None
        if "\x1b" in out:  # ANSI colours around a name or its separator
            out = plain = _ANSI_RE.sub("", out)
        out = self._tokens_str(out, found)
        for x in _STRUCT_LITERALS:  # (a plain loop: faster than any())
            if x in out:
                for rx in _STRUCT_RES:
                    out = rx.sub(lambda m: self._hash_named(m, found), out)
                break
        if tail:
            # Both tail rules match only at the end: run them on a window that holds any
            # possible match (not the whole text, where ``re`` would try every position).
            run = len(out) - len(out.rstrip(_TAIL_CHARS))
            ws = max(0, len(out) - run - 256)
            win = out[ws:]
            if any(x in win for x in _TAIL_LITERALS):
                t = _SHAPE_TAIL_RE.sub(lambda m: self._hash_match(m.group(0), found), win)
                if t != win:
                    out = out[:ws] + t
        if "earer" in out or "EARER" in out or "asic" in out:
            out = _SCHEME_RE.sub(lambda m: self._hash_group(m, found), out)
        if "@" in out and ("//" in out or "\\/\\/" in out):
            out = _URL_RE.sub(lambda m: self._hash_userinfo(m, found), out)
        if "@" in out and ":" in out:
            out = _USERINFO_RE.sub(lambda m: self._hash_bare_userinfo(m, found), out)
        if ("-u" in out or "-U" in out) and ":" in out:
            out = _CLI_USER_RE.sub(lambda m: self._hash_cli_password(m, found), out)
        if " -" in out or '"-' in out:  # a flag after a space or a quote (argv as JSON)
            spans = _cli_spans(out)
            if spans:
                out = self._hash_spans(out, spans, found)
        if tail and ":" in out:
            ws = max(out.rfind(c) for c in _URL_TAIL_STOPS) + 1
            win = out[ws:]
            if ":/" in win or ":\\/" in win:
                t = _URL_TAIL_RE.sub(
                    lambda m: m.group(1) + self._hash_match(m.group(2), found), win
                )
                if t != win:
                    out = out[:ws] + t
        # The two scanners below hash only under a secret *name*; they step through
        # every pair / string in Python. On a long text, first ask RE2 (one linear pass)
        # whether any secret name may be there at all, so a megabyte of ordinary pairs
        # or strings costs a few ns per byte instead of ~1 us per pair.
        if ("=" in out or ":" in out or '"' in out) and self._may_name_secret(out):
            if "=" in out or ":" in out:
                out = self._scan_kv(out, found)
            if '"' in out:
                out = self._scan_json_text(out, found, _depth)
        if ("'" in out and (":" in out or "," in out or "=" in out)) or any(
            x in out for x in ('",', '" ,', '"]', '"=', '" =')
        ):  # Python repr: {'secret': 'S'} (what print(args) writes); define('KEY', 'S')
            out = self._scan_repr(out, found)
        if "\n" in out or "\\n" in out:
            out = self._scan_table(out, found)
        if "<" in out and ">" in out:
            out = self._scan_xml(out, found)
        if '-p' in out or '-P' in out:
            out = self._scan_argv_text(out, found)
        if _may_name_in_prose(out):
            out = self._scan_prose(out, found)
        if not out.isascii() and _lookalike_prose(out):
            out = self._scan_prose_folded(out, found)
        if _depth < MAX_EMBED_DEPTH and ("%" in out or "+" in out):
            out = self._scan_decoded(out, found, tail, _depth)
        # The escapes were dropped only to read the text: a value with no secret is kept
        # exactly as logged (a caller id's escape sequence is forensic evidence).
        if out == text or (out == plain and len(found) == n_found):
            return text
        return out

    def _scan_decoded(self, text: str, found: list[str], tail: bool, depth: int) -> str:
        """A URL- or form-encoded text (``?api%5Fkey%3D…``, ``Bearer%20…``, a whole
        encoded URL) hides its separators from the rules above: scan it decoded. When the
        decoded text holds a secret, the decoded text with the secret hashed is kept
        (an encoded copy of the secret must not survive beside its digest)."""
        if _PCT_RE.search(text) is None and _PLUS_SCHEME_RE.search(text) is None:
            return text
        decoded = urllib.parse.unquote_plus(text, errors="surrogateescape")
        if decoded == text:
            return text
        more: list[str] = []
        red = self.scrub_str(decoded, more, tail=tail, _depth=depth + 1)
        if not more:
            return text
        found.extend(more)
        # undecodable bytes of the encoded text come back as lone surrogates: escape them
        # as they were (percent-escapes) so the result stays valid text
        return red.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")

    def _may_name_secret(self, text: str) -> bool:
        """Whether ``text`` may hold a secret name (key, ``name=``, query parameter).

        True for short texts (a pyarrow call costs ~20 us; the Python scanners are
        cheaper there); for long ones, one RE2 pass of :attr:`candidate_pattern`.
        """
        if len(text) < _RE2_GATE_CHARS:
            return True
        raw = text.encode("utf-8", "surrogatepass")
        if _re2 is not None:
            if self._re2_gate is None:
                opts = _re2.Options()
                opts.case_sensitive = False
                opts.max_mem = 64 << 20  # the DFA falls back to NFA beyond it (still linear)
                self._re2_gate = _re2.compile(self._gate_pattern.encode(), opts)
            return self._re2_gate.search(raw) is not None
        arr = pa.array([raw], pa.binary())
        hit = pc.match_substring_regex(arr, self._gate_pattern, ignore_case=True)
        return bool(hit[0].as_py())

    def _hash_match(self, secret: str, found: list[str]) -> str:
        h = secret if is_digest(secret) else self.digest(secret)  # (a digest is kept)
        found.append(h)
        return h

    def _hash_group(self, m: re.Match[str], found: list[str]) -> str:
        g = 1 if m.group(1) is not None else 2
        s, e, base, whole = *m.span(g), m.start(), m.group(0)
        return whole[: s - base] + self._hash_match(m.group(g), found) + whole[e - base :]

    def _hash_userinfo(self, m: re.Match[str], found: list[str]) -> str:
        info = m.group(2)
        if ":" in info:
            user, pw = info.split(":", 1)
            if not pw:
                return m.group(0)
            return f"{m.group(1)}{user}:{self._hash_match(pw, found)}@"
        if len(info) >= 20:  # a token used as the user name (https://<token>@host)
            return f"{m.group(1)}{self._hash_match(info, found)}@"
        return m.group(0)

    def _hash_bare_userinfo(self, m: re.Match[str], found: list[str]) -> str:
        """``user:pass@host`` with no scheme: the password (up to the last ``@``)."""
        user, rest = m.group(1), m.group(2)
        pw = rest[:-1]
        # (a time's "10:30@home" has a numeric "user")
        if not pw or user.isdigit() or user.lower() in _NOT_USERS:
            return m.group(0)
        return f"{user}:{self._hash_match(pw, found)}@"

    def _hash_spans(self, text: str, spans: list[tuple[int, int]], found: list[str]) -> str:
        """``text`` with each (sorted, disjoint) span hashed."""
        pieces: list[str] = []
        last = 0
        for s, e in sorted(spans):
            if s < last:
                continue
            pieces.append(text[last:s])
            pieces.append(self._hash_match(text[s:e], found))
            last = e
        pieces.append(text[last:])
        return "".join(pieces)

    def _scrub_flag_argv(self, argv: list[str], found: list[str]) -> list[str]:
        """An argv list without its command word, starting with a flag (``["-u", "root",
        "-p", S]``: the command sits in another field): the element after ``-p``/``-P``
        is hashed unless it is a port mapping or a path (``["-p", "8080:80"]``,
        ``["-p", "[::1]:53:53/udp"]``, ``["-p", "./out"]``), and a value glued to ``-p``
        when it mixes letters and digits (``-pS3cr3t``; ``-pthread``, ``-p8080`` stay).
        Returns ``argv`` itself when nothing is hashed."""
        out = argv
        for i, a in enumerate(argv):
            if a in ("-p", "-P"):
                if i + 1 == len(argv):
                    break
                v = argv[i + 1]
                if (not v or v.startswith("-") or _PORT_SPEC_RE.fullmatch(v)
                        or v.startswith(_PATH_STARTS) or is_digest(v)):
                    continue
                if out is argv:
                    out = list(argv)
                out[i + 1] = self._hash_match(v, found)
            elif len(a) > 7 and a.startswith("-p") and _looks_like_secret(a[2:]):
                if a[2:].isdigit() or is_digest(a[2:]):
                    continue
                if out is argv:
                    out = list(argv)
                out[i] = "-p" + self._hash_match(a[2:], found)
        return out

    def _scrub_argv(self, argv: list[Any], found: list[str]) -> list[Any]:
        """An argv list (``["mysql", "-u", "root", "-pS"]``, ``["sshpass", "-p", S]``):
        the command-line rules read it joined, the password elements are hashed. Returns
        ``argv`` itself when nothing is."""
        if argv[0].startswith("-") and _CLI_CMD_RE.search(" ".join(argv)) is None:
            return self._scrub_flag_argv(argv, found)
        joined = " ".join(argv)
        if " -" not in joined or _CLI_CMD_RE.search(joined) is None:
            return argv
        spans = _cli_spans(joined)
        if not spans:
            return argv
        out = list(argv)
        starts = []
        pos = 0
        for a in argv:
            starts.append(pos)
            pos += len(a) + 1
        for s, e in spans:
            i = max(0, np.searchsorted(starts, s, side="right") - 1)
            a = out[i]
            ls, le = s - starts[i], min(e - starts[i], len(argv[i]))
            if a is argv[i]:  # (a span never crosses elements: values hold no space)
                out[i] = a[:ls] + self._hash_match(a[ls:le], found) + a[le:]
        return out

    def _hash_cli_password(self, m: re.Match[str], found: list[str]) -> str:
        """``-u user:pass``: the password."""
        pw = m.group(2)
        s = m.start(2) - m.start()
        return m.group(0)[:s] + self._hash_match(pw, found)

    def _scan_prose_folded(self, text: str, found: list[str]) -> str:
        """:meth:`_scan_prose` on ``text`` with look-alike letters folded
        (``the pаssword is S`` with a Cyrillic ``а``, fullwidth, zero width inside a
        word): the names are matched on the folded text, the values hashed as written.
        Whole words of another script fold to nothing that names a secret (``пароль``)."""
        if len(text) >= 512 and _LOOSE_NAMES_RE2 is not None:
            loose = _LOOSE_NAMES_RE2.search(text.encode("utf-8", "surrogatepass"))
        else:
            loose = _LOOSE_NAMES_RE.search(text)
        if loose is None:  # nothing folding could make a name of
            return text
        table = _prose_fold()
        folded = text.translate(table)
        if folded == text or not _may_name_in_prose(folded):
            return text
        keep = None
        if len(folded) != len(text):  # invisible characters dropped: map positions back
            keep = [i for i, ch in enumerate(text) if table.get(ord(ch), 0) is not None]
            keep.append(len(text))
        return self._scan_prose(text, found, folded, keep)

    def _scan_prose(
        self, text: str, found: list[str], folded: str | None = None,
        keep: list[int] | None = None,
    ) -> str:
        """Hash a credential named in prose: ``invalid token X``, ``bad api key: X``,
        ``the password is X``. After an explicit ``:`` / ``=`` any value counts (as in
        :meth:`_scan_kv`); after a space only a word mixing letters and digits, so
        ``token expired`` and ``password reset`` stay readable."""
        src = text if folded is None else folded  # names are matched here
        pieces: list[str] = []
        last = pos = 0
        while True:
            m = _PROSE_RE.search(src, pos)
            if m is None:
                break
            word = m.group(1)
            explicit = m.group(2) is not None
            # "secret key X": the next name word may start the real pair; after ":"/"="
            # the value is skipped whole ("key=key=…" must not rescan the rest each time)
            pos = m.end() if explicit else m.end(1)
            g = 3 if m.group(3) is not None else 4
            secret = self.is_secret_key(word)
            if secret and explicit and folded is None:
                continue  # "token: X" / "pwd=X" is a pair: _scan_kv's (same rules)
            if not secret:
                prev = _PREV_WORD_RE.search(src, max(0, m.start(1) - 33), m.start(1))
                secret = prev is not None and self.is_secret_key(prev.group(1) + "_" + word)
            if not secret:
                continue
            value = m.group(g).rstrip(".!?:")
            if (
                not value
                or _digest_at(src, m.start(g), found)
                or (not explicit and not _looks_like_secret(value)
                    and not _looks_mixed_case(value))
            ):
                continue
            s = m.start(g)
            e = s + len(value)
            if keep is not None:  # folded text without invisible characters
                s, e = keep[s], keep[e - 1] + 1
            if s < last:
                continue
            pieces.append(text[last:s])
            pieces.append(self._hash_match(text[s:e], found))
            last = e
            pos = max(pos, m.start(g) + len(value))
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _scan_argv_text(self, text: str, found: list[str]) -> str:
        """``"-p", "V"`` in JSON text that does not parse: ``V`` is hashed unless it is a
        port mapping, a path or a flag (the rule of :meth:`_scrub_flag_argv`)."""
        pieces: list[str] = []
        last = 0
        for m in _ARGV_FLAG_TEXT_RE.finditer(text):
            v = _loose_unescape(m.group(1))
            if (v.startswith("-") or _PORT_SPEC_RE.fullmatch(v) or v.startswith(_PATH_STARTS)
                    or is_digest(v)):
                continue
            pieces.append(text[last : m.start(1)])
            pieces.append(self._hash_match(v, found))  # (the value as parsed: ingest's digest)
            last = m.end(1)
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _scan_repr(self, text: str, found: list[str]) -> str:
        """Hash values under secret keys in Python-repr pairs (``{'secret': 'S'}``,
        ``{'token': b'S'}``, ``{'auth': {'user': 'u'}}``), read like JSON pairs, and a
        quoted secret name followed by a quoted value (``define('DB_PASSWORD', 'S')``,
        ``os.environ["API_KEY"] = "S"``, ``'token' => 'S'``)."""
        pieces: list[str] = []
        last = 0
        for m in _REPR_PAIR_RE.finditer(text):
            k = 1 if m.group(1) is not None else 3
            if not self.is_secret_key(m.group(k)):
                continue
            s = m.end(k) + 1
            vm = _REPR_VALUE_RE.match(text, m.end())
            if vm is None or not vm.group(vm.lastindex or 1):
                continue
            g = vm.lastindex or 1
            if m.group(k + 1) != ":" and (g > 2 or _is_name(vm.group(g))):
                continue  # after "," / "=": a quoted value only, and not another name
            vs, ve = vm.span(g)
            if vm.group(g)[:1] in "[{(":  # a container: up to its closing bracket
                depth, ve = 0, len(text)
                for b in _REPR_BRACKET_RE.finditer(text, vs):
                    depth += 1 if b.group(0) in "[{(" else -1
                    if depth == 0:
                        ve = b.end()
                        break
            if vs < last or _digest_at(text, vs, found):
                continue
            pieces.append(text[last:vs])
            pieces.append(self._hash_match(text[vs:ve], found))
            last = max(ve, s)
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _scan_table(self, text: str, found: list[str]) -> str:
        """Hash a table's column whose header names a secret (``user,password\\nbob,S``,
        TSV, ``;``, markdown ``| user | password |``): in each following row with as many
        cells, up to a row without; the markdown rule row and the other columns kept."""
        parts = (_ROWS_RE if "\n" in text else _ROWS_ESCAPED_RE).split(text)
        cols: list[int] = []
        sep, width, n = "", 0, len(found)
        for i in range(0, len(parts), 2):
            row = parts[i]
            cells = row.split(sep) if cols else []
            if cols and len(cells) == width and row.strip(" \t|:-"):
                for c in cols:
                    v = cells[c].strip().strip("\"'")
                    if v and not _starts_with_digest(v, found):
                        cells[c] = cells[c].replace(v, self._hash_match(v, found), 1)
                parts[i] = sep.join(cells)
                continue
            cols = [] if len(cells) != width else cols
            low = row.lower()
            if len(row) > 4096 or not any(x in low for x in _PROSE_LITERALS):
                continue
            for sep in _TABLE_SEPS:
                if sep in row:
                    cells = row.split(sep)
                    cols = [j for j, c in enumerate(cells) if (m := _TABLE_NAME_RE.fullmatch(
                        c.strip())) is not None and self.is_secret_key(m.group(1))]
                    width = len(cells)
                    break
        return "".join(parts) if len(found) > n else text

    def _scan_xml(self, text: str, found: list[str]) -> str:
        """Hash the text of XML elements with a secret name (``<password>S</password>``,
        ``<wsse:Password …>S</wsse:Password>``, ``<ApiKey>S`` cut before its end tag)."""
        pieces: list[str] = []
        last = 0
        for m in _XML_RE.finditer(text):
            name = m.group(1)
            if not self.is_secret_key(_loose_unescape(name) if "\\" in name else name):
                continue
            body = m.group(2)
            lead = len(body) - len(body.lstrip())
            value = body.strip()
            if not value or is_digest(value):
                continue
            s = m.start(2) + lead
            pieces.append(text[last:s])
            pieces.append(self._hash_match(value, found))
            last = s + len(value)
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _scan_kv(self, text: str, found: list[str]) -> str:
        """Hash the values of ``name=value`` / ``name: value`` pairs with a secret name."""
        pieces: list[str] = []
        last = pos = 0
        cache = self._key_cache
        kv = _KV_RE_ASCII if text.isascii() else _KV_RE
        while True:
            m = kv.search(text, pos)
            if m is None:
                break
            pos = m.end()
            run, sep = m.group(1), m.group(2)
            if cache.get(run) is False:
                continue  # the common case, cheaply
            # the name as a bounded pattern found it: the run's last 64 characters, from
            # the first letter among them
            nm = _KV_NAME_RE.search(run, max(0, len(run) - 64))
            if nm is None:
                continue
            name = nm.group(0)
            if sep != "=" and name[-1].isdigit():  # "T10:00" is a time, not a pair
                continue
            if not self.is_secret_key(name):
                continue
            if sep != "=" and normalize_key(name).endswith("cookie"):
                # a header list: every cookie of ``Cookie: a=1; sid=S`` (names kept)
                c = _COOKIE_LIST_RE.match(text, pos)
                if c is not None and "=" in c.group(0):
                    pieces.append(text[last:pos])
                    pieces.append(_COOKIE_PAIR_RE.sub(
                        lambda cm: cm.group(1) + self._hash_match(cm.group(2), found)
                        if cm.group(2) else cm.group(0), c.group(0)))
                    last = pos = c.end()
                    continue
            v = _KV_VALUE_RE.match(text, pos)
            if v is None:
                continue
            g = v.lastindex or 3
            value = v.group(g)
            if value and not _digest_at(text, v.start(g), found):
                pieces.append(text[last : v.start(g)])
                pieces.append(self._hash_match(value, found))
                last = v.end(g)
            pos = max(v.end(), pos)
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _scan_json_text(self, text: str, found: list[str], depth: int) -> str:
        """Hash values under secret keys in JSON text that may be cut anywhere.

        Strings are tokenized in order (between JSON strings there are no quotes, so
        this stays aligned); a string followed by ``:`` is a key. The value after a
        secret key is hashed up to its end — a string's closing quote, a container's
        matching bracket, a scalar's delimiter — or to the end of the text.
        """
        pieces: list[str] = []
        last = pos = 0
        n = len(text)
        while pos < n:
            m = _STR_RE.search(text, pos)
            if m is None:
                break
            end = m.end()
            closed = bool(m.group(2))
            c = _COLON_RE.match(text, end) if closed else None
            if c is None:  # a value string (or a cut one): JSON may be escaped inside it
                content = m.group(1)
                # a key cut before its colon? (not above 8 kB: only a cut text ends in
                # an open string, and a quarantined line keeps 4096 characters)
                if not closed and 8 <= len(content) <= 8192:
                    key = _loose_unescape(content)
                    # (its ends only: a cut megabyte of prose is no key to split in words)
                    if self.is_secret_key(key[:256]) or self.is_secret_key(key[-256:]):
                        new_key = self._scrub_key_name(key, found)
                        if new_key is not key:
                            pieces.append(text[last : m.start()])
                            pieces.append(_json_str(new_key)[:-1])
                            last = end
                            break
                if "\\" in content or depth:
                    inner = _loose_unescape(content)
                    if inner != content and _may_hold_shape(inner):
                        if depth >= MAX_EMBED_DEPTH:
                            new = self._hash_match(inner, found)
                        else:
                            new = self.scrub_str(inner, found, tail=not closed, _depth=depth + 1)
                        if new is not inner:
                            lit = _json_str(new)
                            pieces.append(text[last : m.start()])
                            pieces.append(lit if closed else lit[:-1])
                            last = end
                pos = end if end > m.start() else m.start() + 1
                # (<= 512: a 64-character name spelled with escapes, "\\ud835\\udc29…")
                if (
                    closed
                    and (len(content) <= 64 or (len(content) <= 512 and "\\u" in content))
                    and self._names_next(_loose_unescape(content))
                ):
                    # ["password", S] / {"k": "password"}, {"v": S}: hash the next value
                    nx = _LIST_NEXT_RE.match(text, end)
                    vstart = nx.end() if nx is not None else n
                    if vstart < n and not _is_name_text(text, vstart):
                        vend, rep = self._value_at(text, vstart, found)
                        if rep is not None:
                            pieces.append(text[last:vstart])
                            pieces.append(rep)
                            last = vend
                        pos = max(vend, pos)
                continue
            vstart = c.end()
            pos = vstart
            key = _loose_unescape(m.group(1))
            # (or {"name": "DB_PASSWORD", "value": S} in text that does not parse)
            if not self.is_secret_key(key) and (
                key not in _PAIR_VALUE_KEYS or vstart >= n
                or not self._pair_named_in_text(text, m.start())
            ):
                continue
            new_key = self._scrub_key_name(key, found)
            if new_key is not key:  # "secret_S": a credential in the key name
                pieces.append(text[last : m.start()])
                pieces.append(_json_str(new_key))
                last = end
            if vstart >= n:
                continue
            vend, rep = self._value_at(text, vstart, found, key in _PAIR_NAME_KEYS)
            if rep is not None:
                pieces.append(text[last:vstart])
                pieces.append(rep)
                last = vend
            pos = max(vend, vstart)
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _pair_named_in_text(self, text: str, at: int) -> bool:
        """Whether the object around a ``"value":`` key at ``at`` of JSON text (cut or
        not) names a secret under a name key (``"name": "DB_PASSWORD"``), before or
        after it. Looks no further than the object's braces, at most 256 characters each
        way (bounded work per value key), and not at all without a ``{`` in reach."""
        lo = text.rfind("{", max(0, at - 256), at)
        if lo < 0:  # no object starts near: no pair object (a name is its sibling)
            return False
        hi = text.find("}", at, at + 256)
        hi = min(len(text), at + 256) if hi < 0 else hi
        for pm in _PAIR_NAME_TEXT_RE.finditer(text, lo, hi):
            if pm.group(1) in _PAIR_NAME_KEYS and self.is_secret_key(
                _loose_unescape(pm.group(2))
            ):
                return True
        return False

    def _value_at(
        self, text: str, start: int, found: list[str], name_slot: bool = False
    ) -> tuple[int, str | None]:
        """End of the JSON value starting at ``start`` and its replacement (or None);
        ``name_slot``: under a name key (``{"key": "client_secret"}``), a secret name
        is kept (it names the next value)."""
        ch = text[start]
        if ch == '"':
            m = _STR_RE.match(text, start)
            assert m is not None
            value = _loose_unescape(m.group(1))
            if name_slot and self._names_next(value):
                return start, None  # (scanned next as a list element naming the next)
            if _starts_with_digest(value, found):
                return m.end(), None
            close = '"' if m.group(2) else ""
            return m.end(), '"' + self._hash_match(value, found) + close
        if ch in "[{":
            depth, p, end = 0, start, len(text)
            while True:
                b = _BRACKET_RE.search(text, p)
                if b is None:
                    break
                c = b.group(0)
                if c == '"':
                    s = _STR_RE.match(text, b.start())
                    assert s is not None
                    if not s.group(2):
                        break
                    p = s.end()
                    continue
                depth += 1 if c in "[{" else -1
                p = b.end()
                if depth == 0:
                    end = p
                    break
        else:
            m = _SCALAR_RE.match(text, start)
            assert m is not None
            end = m.end()
            if m.group(0) in ("", "null"):
                return end, None
        raw = text[start:end]
        try:
            h = self._hash_match(self.digest(orjson.loads(raw)), found)
        except (orjson.JSONDecodeError, TypeError):
            h = self._hash_match(raw, found)
        return end, '"' + h + '"'


#: Every JSON string of a line in order, group 1 set when it is a key (a colon follows).
#: Between strings there are no quotes, so the scan stays aligned on valid JSON.
_KEY_SCAN_B = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"(\s*:)?')


#: A key whose colon does not follow its closing quote at once (``"k" : 1``).
_SPACED_COLON_B = re.compile(rb'"[ \t\r\n]+:')


def _has_duplicate_keys(line: bytes, obj: Any) -> bool:
    """Whether some object of ``line`` (parsed as ``obj``) names a key twice: the keys in
    the text outnumber the keys ``obj`` kept.

    Keys in the text are counted exactly by tokenizing its strings; first, cheaply, as
    ``":`` pairs, which is exact when no key has space before its colon and no string
    holds an escaped quote (``\\"`` then ``:`` inside a value would count).
    """
    kept = _count_keys(obj)
    if b'\\"' not in line and line.count(b'":') == kept and not _SPACED_COLON_B.search(line):
        return False
    found = _KEY_SCAN_B.findall(line)  # group 1 per string: b"" for a value
    return len(found) - found.count(b"") != kept


def _count_keys(obj: Any) -> int:
    """Keys of every object in a parsed JSON value."""
    kept = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if type(o) is dict:
            kept += len(o)
            stack.extend(v for v in o.values() if type(v) is dict or type(v) is list)
        elif type(o) is list:
            stack.extend(v for v in o if type(v) is dict or type(v) is list)
    return kept


def _keep_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` keeping a repeated key's values as ``name#2``, ``name#3`` …"""
    out: dict[str, Any] = {}
    seen: dict[str, int] = {}
    for k, v in pairs:
        if k in out:
            n = seen.get(k, 1) + 1
            while f"{k}#{n}" in out:
                n += 1
            seen[k], k = n, f"{k}#{n}"
        out[k] = v
    return out


def _items(container: dict[str, Any] | list[Any]) -> Any:
    """(key, value) iterator of a dict, (index, value) of a list."""
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _set(frame: list[Any], key: Any, new_key: Any, value: Any) -> None:
    """Record a changed entry in a walk frame (copying its container on first change)."""
    container = frame[0]
    if frame[2] is None:
        frame[2] = dict(container) if isinstance(container, dict) else list(container)
        if isinstance(container, dict):
            frame.append({})  # renamed keys: old -> new
    copy = frame[2]
    copy[key] = value
    if new_key is not key:
        frame[5][key] = new_key


def _build(frame: list[Any]) -> Any:
    """The frame's copy, with renamed keys applied in place (order kept)."""
    copy = frame[2]
    if isinstance(copy, dict) and len(frame) > 5 and frame[5]:
        renames = frame[5]
        return {renames.get(k, k): v for k, v in copy.items()}
    return copy
