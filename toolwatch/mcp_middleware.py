"""Log every ``tools/call`` of an MCP server built on the official Python SDK, for toolwatch.

Two lines in a server (``pip install toolwatch[mcp]``)::

    from toolwatch.mcp_middleware import ToolwatchMiddleware
    mcp = MCPServer("docs", middleware=[ToolwatchMiddleware("docs")])

Each ``tools/call`` becomes one JSON line on stderr in toolwatch's per-call log contract
(docs/log-format.md): ``ts``, ``session_id``, ``caller_id``, ``client_ip`` (when known),
``client``, ``server``, ``tool``, ``args`` (values under secret-looking keys hashed),
``status`` (``ok`` / ``not_found`` / ``denied`` / ``error``), ``isError``, ``bytes`` (of
the result), ``rows`` (when the result says), ``duration_ms``, ``request_id`` (the JSON-RPC
id). When the process ends, a
``SESSION_END`` summary line follows (calls, distinct resources, bytes, errors, duration).
Run the server under ``toolwatch run`` (or point ``toolwatch tail`` at its stderr).

The status of a failed call comes from the ``isError`` result's text (a ``ToolError``'s
message) or, for any other exception — whose text the SDK withholds from the result — from
the exception itself (``KeyError``/``LookupError``/``FileNotFoundError`` → ``not_found``,
``PermissionError`` → ``denied``, else its message), taken from the SDK's own log record.

Over stdio one server process serves one client connection: the session id is generated
per process (``TOOLWATCH_SESSION_ID`` overrides it). The caller is ``principal(ctx)`` when
given, else the subject (or client id) of the SDK's auth context's verified token, both
logged with ``caller_authenticated: true``; else the client's self-declared ``clientInfo``
name joined to the MCP session (``name#session``, ``caller_authenticated: false``).

Trust boundary (docs/security.md): under ``toolwatch run`` the server gets a per-run key
(``TOOLWATCH_RECORD_KEY``); the middleware then writes a tagged ``TOOLWATCH_HELLO`` line
at start-up and appends ``"tw_tag"`` (an HMAC of the line) to each record, and the
collector stores only tagged records as events. Values are written with every control
character escaped, and the SDK's own log records (a tool's exception quoting an agent's
argument) are flattened to one line, so no argument can start a line on stderr.

Secrets are hashed with the **same rules and key as** ``toolwatch ingest``
(:class:`toolwatch.ingest.secrets.SecretHasher` over the whole line: values under secret-like keys,
look-alike key names, credentials glued to key names, tokens in free text, URL and
``user:pass@host`` credentials, ``Bearer``/``Basic`` headers, name/value pair lists and
objects, command-line password flags, …), so no secret reaches stderr, the spool of
``toolwatch run`` or any other collector of the server's stderr in clear. A secret becomes
``hmac:<32 hex>`` keyed with toolwatch's own HMAC key (``$TOOLWATCH_HMAC_KEY`` in hex, else
the key file ``~/.config/toolwatch/hmac.key``, created on first use:
:func:`toolwatch.keys.load_or_create_key`): the very digest ingest computes, which ingest
then leaves as it is. The same secret hashes the same across sessions (credential-stuffing
detection) and cannot be reversed by a dictionary attack on the log alone. Only when no key
can be had (an invalid ``$TOOLWATCH_HMAC_KEY``, an unwritable home) are digests unkeyed,
``sha256:<32 hex>`` (HMAC-SHA256 under an empty key), with a warning on stderr; ingest
hashes those again with its key.

The scanner (:mod:`toolwatch.ingest.secrets`, which imports pyarrow and numpy: ~0.3 s) is imported
on the first ``tools/call``, not when the server starts.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: Environment variable through which ``toolwatch run`` hands the server its per-run record
#: key (hex). Read once, then removed from the environment: a tool's subprocesses never
#: inherit it.
RECORD_KEY_ENV = "TOOLWATCH_RECORD_KEY"
#: Field appended to every record when a record key is set: the first 32 hex digits of
#: HMAC-SHA256(key, the record's line without this field). ``toolwatch run``'s collector
#: stores as events only lines whose tag verifies (docs/security.md, "Trust boundary").
TAG_FIELD = "tw_tag"
#: The announcement written once at start-up (tagged): from then on the collector knows
#: this stream's records are tagged, and untagged JSON lines on it are server text.
HELLO_EVENT = "TOOLWATCH_HELLO"


def _scrub_initial_environment(name: str) -> None:
    """Overwrite ``name``'s value in the process's initial environment block.

    Removing a variable (``unsetenv``) only drops its pointer: the bytes stay in the block
    the kernel serves as ``/proc/<pid>/environ``, so any tool that can read a file (no
    code execution needed) could read the record key there and tag forged lines. The
    value is overwritten in place with ``0`` characters, which the kernel then serves.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):  # no libc via ctypes: nothing to scrub with
        import ctypes

        libc = ctypes.CDLL(None)
        libc.getenv.restype = ctypes.c_void_p
        libc.getenv.argtypes = [ctypes.c_char_p]
        libc.strlen.restype = ctypes.c_size_t
        libc.strlen.argtypes = [ctypes.c_void_p]
        ptr = libc.getenv(name.encode())
        if ptr:
            ctypes.memset(ptr, ord("0"), libc.strlen(ptr))


def _take_record_key() -> bytes | None:
    """The per-run record key from the environment (removed from it, and overwritten
    where ``/proc/<pid>/environ`` would show it), or ``None``."""
    # Scrub first: after unsetenv, getenv no longer finds the bytes to overwrite.
    _scrub_initial_environment(RECORD_KEY_ENV)
    text = os.environ.pop(RECORD_KEY_ENV, None)
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        print(f"toolwatch middleware: {RECORD_KEY_ENV} is not >= 16 bytes of hex; "
              "records are written untagged", file=sys.stderr)
        return None
    return key


#: Read at import (before the server can start a subprocess): see :data:`RECORD_KEY_ENV`.
_RECORD_KEY = _take_record_key()


def tag_line(key: bytes, line: str) -> str:
    """``line`` (one JSON object, no newline) with its :data:`TAG_FIELD` appended."""
    mac = hmac.digest(key, line.encode("utf-8"), "sha256")[:16].hex()
    return f'{line[:-1]},"{TAG_FIELD}":"{mac}"}}'


# Control characters that a JSON encoder leaves raw (DEL, C1, and the Unicode line and
# paragraph separators, which several readers and terminals treat as line breaks).
_JSON_RAW_CONTROLS = re.compile("[\x7f-\x9f\u2028\u2029]")
# In log text: every C0 control but TAB, DEL, C1, U+2028/2029.
_TEXT_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_TEXT_ESCAPES = {"\n": "\\n", "\r": "\\r"}


def _json_escape_controls(line: str) -> str:
    """A JSON line with the control characters JSON leaves raw written as ``\\uXXXX``."""
    if _JSON_RAW_CONTROLS.search(line) is None:
        return line
    return _JSON_RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def escape_text_controls(text: str) -> str:
    """``text`` on one line: newlines as ``\\n``, other controls as ``\\xNN``/``\\uNNNN``."""
    if _TEXT_CONTROLS.search(text) is None:
        return text

    def esc(m: re.Match[str]) -> str:
        ch = m.group()
        if ch in _TEXT_ESCAPES:
            return _TEXT_ESCAPES[ch]
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    return _TEXT_CONTROLS.sub(esc, text)


_NOT_FOUND = ("not found", "no such", "does not exist", "doesn't exist", "unknown tool",
              "not exist")
_DENIED = ("denied", "forbidden", "unauthorized", "unauthorised", "not allowed",
           "not permitted", "permission")


def _status_of_text(text: str) -> str:
    """``not_found`` / ``denied`` / ``error`` from an error message (enumeration evidence)."""
    text = text.lower()
    if any(w in text for w in _NOT_FOUND):
        return "not_found"
    if any(w in text for w in _DENIED):
        return "denied"
    return "error"


def _status_of_exception(exc: BaseException | None) -> str:
    """Status from an exception and its ``__cause__`` / ``__context__`` chain.

    The type decides first (``LookupError`` — ``KeyError``, ``IndexError`` — and
    ``FileNotFoundError`` are a missing thing, ``PermissionError`` a refusal), then the text
    of each exception in the chain.
    """
    seen: set[int] = set()
    chain: list[BaseException] = []
    while exc is not None and id(exc) not in seen and len(chain) < 16:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for e in chain:
        if isinstance(e, PermissionError):
            return "denied"
        if isinstance(e, LookupError | FileNotFoundError | NotADirectoryError):
            return "not_found"
    for e in chain:
        st = _status_of_text(str(e))
        if st != "error":
            return st
    return "error"


def _error_status(result: Any) -> str:
    """``not_found`` / ``denied`` when the error result's text says so, else ``error``."""
    try:
        content = result.content if hasattr(result, "content") else result.get("content")
        text = " ".join(
            (c.get("text") if isinstance(c, dict) else getattr(c, "text", "")) or ""
            for c in content or []
        )
    except (AttributeError, TypeError):
        return "error"
    return _status_of_text(text)


# Why a logging filter: for an exception that is not a ``ToolError`` (a plain ``ValueError``,
# ``KeyError``, ``PermissionError`` raised by the tool) the SDK returns ``isError`` with only
# "Error executing tool <name>" — the original text is withheld from the client, and from
# middleware, which sees just that result. The one place the original exception still
# exists is the SDK's own ``logger.exception(...)`` call inside the handler, which runs in
# the middleware's task; this filter hands that exception to the call being logged (through
# a context variable, so concurrent calls do not mix) and never drops the record.
_SDK_LOGGER = "mcp.server.mcpserver.server"
_CALL_EXC: ContextVar[list[BaseException] | None] = ContextVar("toolwatch_call_exc", default=None)


class _ToolExceptionCatcher(logging.Filter):
    """Record the exception of the SDK's "tool raised" log record for the current call."""

    def filter(self, record: logging.LogRecord) -> bool:
        box = _CALL_EXC.get()
        if box is not None and record.exc_info and record.exc_info[1] is not None:
            box.append(record.exc_info[1])
        return True


_CATCHER = _ToolExceptionCatcher()


def _install_catcher() -> None:
    lg = logging.getLogger(_SDK_LOGGER)
    if _CATCHER not in lg.filters:
        lg.addFilter(_CATCHER)


class _RecordScrubber(logging.Filter):
    """Scrub a log record's text of secrets before any handler writes it.

    The SDK logs a tool's exception with its traceback (``logger.exception``): the
    exception's message often holds the tool's arguments (``ValueError(f"document {id}
    not found")``), and it goes to the server's stderr — the spool of ``toolwatch run`` —
    beside the middleware's line, not through it. Each line of the rendered message and
    traceback that ingest's RE2 filter picks is replaced by ingest's ``scrub_text`` of
    it (the bytes ingest keeps of such a line); the record then carries the scrubbed text
    as its message, with no ``exc_info`` left for a handler to render again. A record
    without a candidate line passes untouched (one RE2 pass over its text). Never raises,
    never drops a record (one that cannot be scrubbed is replaced by a notice).
    """

    def __init__(self, mw: ToolwatchMiddleware) -> None:
        super().__init__()
        self.mw = mw

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self._scrub(record)
            self._flatten(record)
        except Exception:  # never let a record out unscrubbed
            record.msg, record.args = "[log record withheld: could not be scrubbed]", None
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True

    @staticmethod
    def _flatten(record: logging.LogRecord) -> None:
        """Put the record's message, traceback and stack on one line (controls escaped).

        The SDK logs a raising tool's exception, whose message often quotes the agent's
        argument: with its line breaks, an argument such as ``"x\\n{...}"`` started a
        line of its own on stderr that any collector read as a log record (issue 28).
        Rendered here, escaped (:func:`escape_text_controls`), with no ``exc_info`` left
        for a handler to render again: every record is one line, and a traceback is one
        line rather than one quarantine row per frame.
        """
        msg = record.getMessage()
        tb = record.exc_text
        if record.exc_info and record.exc_info[0] is not None and not tb:
            tb = logging.Formatter().formatException(record.exc_info)
        extra = ([tb] if tb else []) + ([record.stack_info] if record.stack_info else [])
        flat = escape_text_controls("\n".join([msg, *extra]))
        if extra or flat != msg:
            record.msg, record.args = flat, None
            record.exc_info, record.exc_text, record.stack_info = None, None, None

    def _scrub(self, record: logging.LogRecord) -> None:
        if self.mw._hasher is None and not record.exc_info:
            # before the first tools/call no tool has run, so no record can hold its
            # arguments: start-up logging does not import the scanner (pyarrow, ~0.2 s)
            return
        msg = record.getMessage()
        tb = record.exc_text
        if record.exc_info and record.exc_info[0] is not None and not tb:
            tb = logging.Formatter().formatException(record.exc_info)
        parts = [msg] + ([tb] if tb else []) + ([record.stack_info] if record.stack_info else [])
        text = "\n".join(parts)
        hasher = self.mw._scanner()
        gate = self.mw._gate
        raw = text.encode("utf-8", "surrogateescape")
        if gate is not None and gate.search(raw) is None:
            return
        lines = text.split("\n")
        out = []
        changed = False
        for ln in lines:
            b = ln.encode("utf-8", "surrogateescape")
            if gate is None or gate.search(b) is not None:
                red = hasher.scrub_text(b)
                if red != b:
                    changed = True
                    ln = red.decode("utf-8", "backslashreplace")
            out.append(ln)
        if changed:
            record.msg, record.args = "\n".join(out), None
            record.exc_info, record.exc_text, record.stack_info = None, None, None



def _hmac_key() -> bytes:
    """toolwatch's HMAC key, or ``b""`` (unkeyed digests) when none can be had."""
    from toolwatch.keys import default_key_file, load_or_create_key

    try:
        return load_or_create_key(default_key_file())
    except Exception as exc:  # a server must start even when its home is read-only
        print(f"toolwatch middleware: no HMAC key ({exc}); secrets are written as unkeyed "
              "sha256 digests. Set TOOLWATCH_HMAC_KEY (hex, >= 16 bytes).", file=sys.stderr)
        return b""


_UNKEYED_PREFIX = "sha256:"
#: What is written when redaction itself fails (never the arguments).
_SAFE_FIELDS = ("ts", "session_id", "server", "status", "isError", "bytes", "duration_ms",
                "request_id", "event", "callCount", "uniqueResourcesAccessed",
                "totalBytesReturned", "errors", "durationMs")


def _make_hasher(key: bytes) -> Any:
    """Ingest's :class:`~toolwatch.ingest.secrets.SecretHasher` under ``key``.

    Imported here, not at module level: :mod:`toolwatch.ingest.secrets` pulls pyarrow and numpy
    (~0.3 s), which a server should not pay at start-up. Without a key the digests are
    unkeyed and say so (``sha256:``, not ingest's ``hmac:``): ingest then hashes them again
    with its key instead of storing a digest anyone can recompute as if it were keyed.
    """
    from toolwatch.ingest.secrets import HASH_PREFIX, SecretHasher

    if key:
        return SecretHasher(key)

    class _UnkeyedHasher(SecretHasher):
        def digest(self, value: Any) -> str:
            return _UNKEYED_PREFIX + super().digest(value)[len(HASH_PREFIX):]

    return _UnkeyedHasher(b"")


def _make_gate(hasher: Any) -> Any:
    """The line filter ingest runs before its scanner, or ``None`` (scan every line).

    Ingest sends a line to :meth:`SecretHasher.redact_line` only when the hasher's
    :attr:`~toolwatch.ingest.secrets.SecretHasher.candidate_pattern` (a superset of what the
    scanner changes) matches it, case-insensitively, in one RE2 pass over its bytes read
    as Latin-1 (``ingest/parse.py``). The same filter here, compiled the same way, skips
    the scanner for the lines ingest would skip: ~10x cheaper on an ordinary call, and
    exactly ingest's output either way.
    """
    try:
        import re2
    except ImportError:  # google-re2 is a dependency of toolwatch; without it, scan all
        return None
    try:
        opts = re2.Options()
        opts.encoding = re2.Options.Encoding.LATIN1
        opts.case_sensitive = False
        opts.never_nl = True
        opts.max_mem = 64 << 20  # ingest's budget: the big pattern's DFA, no NFA fallback
        return re2.compile(f"(?m:{hasher.candidate_pattern})".encode("latin-1"), opts)
    except Exception:  # a pattern this RE2 refuses: scan every line (a superset)
        return None


def _token_subject() -> str | None:
    """The caller of the SDK's auth context: the verified access token's ``subject``, else
    its ``client_id``; ``None`` without one (stdio, or a server without auth)."""
    try:
        from mcp.server.auth.middleware.auth_context import get_access_token
    except ImportError:
        return None
    try:
        token = get_access_token()
    except Exception:  # an SDK change: attribution falls back, the call is still logged
        return None
    if token is None:
        return None
    return getattr(token, "subject", None) or getattr(token, "client_id", None) or None


def _transport_session(ctx: Any) -> str | None:
    """The transport's MCP session id (Streamable HTTP's ``mcp-session-id``), if any."""
    for get in (lambda: ctx.session_id, lambda: ctx.request.headers.get("mcp-session-id")):
        sid = None
        with contextlib.suppress(Exception):  # stdio: no request, no transport session
            sid = get()
        if isinstance(sid, str) and sid:
            return sid
    return None


class ToolwatchMiddleware:
    """SDK server middleware: one toolwatch log line per ``tools/call``, SESSION_END at exit.

    Parameters
    ----------
    server
        Server name logged with every call.
    stream
        Where lines go (default: ``sys.stderr``; stdout belongs to the protocol).
    principal
        ``ctx -> str | None``: the authenticated caller (e.g. from an auth token); default:
        the client's ``clientInfo.name``.
    client_ip
        ``ctx -> str | None``: the client address when the transport knows it (HTTP).
    session_id
        Fixed session id (default: ``$TOOLWATCH_SESSION_ID`` or a random one per process).
    """

    def __init__(
        self,
        server: str,
        *,
        stream: TextIO | None = None,
        principal: Callable[[Any], str | None] | None = None,
        client_ip: Callable[[Any], str | None] | None = None,
        session_id: str | None = None,
    ):
        self.server = server
        self.stream = stream
        self.principal = principal
        self.client_ip = client_ip
        self.session_id = session_id or os.environ.get("TOOLWATCH_SESSION_ID") or (
            f"{server}-{uuid.uuid4().hex[:16]}"
        )
        self._key = _hmac_key()
        self._hasher: Any = None  # toolwatch.ingest.secrets.SecretHasher, on the first call
        self._gate: Any = None  # ingest's RE2 line filter, built with the scanner
        self._hasher_lock = threading.Lock()
        self._lock = threading.Lock()
        self._started = time.time()
        self._calls = 0
        self._errors = 0
        self._bytes = 0
        self._resources: set[str] = set()
        self._caller: str | None = None
        self._ended = False
        #: The per-run record key of ``toolwatch run`` (:data:`RECORD_KEY_ENV`), or None.
        self.record_key: bytes | None = _RECORD_KEY
        _install_catcher()
        # The SDK's own log (a tool's exception and its traceback) is scrubbed too: on the
        # SDK's logger now, on the root logger's handlers at the first call (by then the
        # server has set up its logging), so a tool's own records are covered as well.
        self._scrubber = _RecordScrubber(self)
        logging.getLogger(_SDK_LOGGER).addFilter(self._scrubber)
        self._filter_root_handlers()
        atexit.register(self.session_end)
        if self.record_key is not None:
            # Before the server reads its first request: the collector learns that this
            # stream's records are tagged before any argument can reach stderr.
            self._write({"event": HELLO_EVENT, "ts": _now(), "session_id": self.session_id,
                         "server": self.server}, scan=False)

    def _filter_root_handlers(self) -> None:
        """Scrub and flatten every record the root logger's handlers write."""
        for h in logging.getLogger().handlers:
            if self._scrubber not in h.filters:
                h.addFilter(self._scrubber)

    # ------------------------------------------------------------------ helpers
    def _scanner(self) -> Any:
        """The secret scanner, created (and :mod:`toolwatch.ingest.secrets` loaded) on first use."""
        h = self._hasher
        if h is None:
            with self._hasher_lock:
                if self._hasher is None:
                    hasher = _make_hasher(self._key)
                    self._gate = _make_gate(hasher)
                    self._hasher = hasher
                h = self._hasher
        return h

    def redact(self, value: Any) -> Any:
        """``value`` with every secret hashed, by ingest's rules (a copy; never raises).

        Values under secret-like keys are replaced whole; secrets inside strings (tokens,
        URL credentials, ``Bearer`` headers, ``name=value`` pairs, …) are hashed in place.
        """
        try:
            return self._scanner().redact(value, [])
        except Exception:  # never log what could not be redacted
            return "[unredactable]"

    def _line(self, record: dict[str, Any], *, scan: bool = True) -> tuple[str, bool]:
        """``record`` as one redacted JSON line (with its newline), tagged under ``run``,
        and whether redaction changed it (:meth:`_redacted_line`).

        Control characters JSON leaves raw (DEL, C1, U+2028/2029) are written as
        ``\\uXXXX`` escapes, so no value can break the line for any reader. With a
        record key (``toolwatch run``), the line gets its :data:`TAG_FIELD`.
        """
        line, changed = self._redacted_line(record, scan=scan)
        if self.record_key is not None:
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: the tag is over UTF-8 bytes
                line = line.encode("utf-8", "backslashreplace").decode("utf-8")
            line = tag_line(self.record_key, line)
        return line + "\n", changed

    def _redacted_line(self, record: dict[str, Any], *, scan: bool = True) -> tuple[str, bool]:
        """``record`` as one redacted JSON line (with its newline), and whether redaction
        changed it.

        The *whole* serialized line goes through :meth:`SecretHasher.redact_line`, exactly
        what ingest runs on it: the same digests (ingest's second pass changes nothing)
        and secrets in any field (a ``caller_id`` from a ``principal`` hook, a tool name),
        not only in ``args``. ``scan=False`` skips the scanner (a ``SESSION_END`` before any
        call: nothing in it came from a client, and the exit should not import pyarrow).
        """
        line = _json_escape_controls(json.dumps(record, ensure_ascii=False, default=str))
        if not scan:
            return line, False
        try:
            raw = line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escaped, as JSON allows
            line = json.dumps(record, ensure_ascii=True, default=str)
            raw = line.encode("utf-8")
        try:
            hasher = self._scanner()
            if self._gate is not None and self._gate.search(raw) is None:
                return line, False  # no candidate: ingest would not scan it either
            red, _ = hasher.redact_line(raw)
        except Exception:  # never write what could not be redacted
            safe = {k: record[k] for k in _SAFE_FIELDS if k in record}
            return json.dumps({**safe, "error": "unredactable"}, default=str), True
        if red == raw:
            return line, False
        return _json_escape_controls(red.decode("utf-8", "replace")), True

    def _write(self, record: dict[str, Any], *, scan: bool = True) -> None:
        self._emit(self._line(record, scan=scan)[0])

    def _emit(self, line: str) -> None:
        out = self.stream or sys.stderr
        with self._lock:
            try:
                buf = getattr(out, "buffer", None) if self.record_key is not None else None
                if buf is not None:
                    # Tagged: the tag covers the line's UTF-8 bytes, whatever the text
                    # stream's encoding (a C locale's ASCII would escape them otherwise).
                    out.flush()
                    buf.write(line.encode("utf-8"))
                    buf.flush()
                else:
                    out.write(line)
                    out.flush()
            except (OSError, ValueError):
                pass  # stderr gone: never break the server for its logging

    def _who(self, ctx: Any) -> tuple[str | None, str | None, str | None, bool]:
        """Caller, client (``name/version``), client address, and whether the caller's
        identity is authenticated.

        The caller is, first that applies: the ``principal`` hook's answer
        (authenticated: the server vouches for it); the SDK's auth context (an access
        token verified by the server: its ``subject``, else its ``client_id``;
        authenticated); else the client's self-declared ``clientInfo`` name joined to
        the MCP session (``name#session``, not authenticated), so two default clients
        (both named ``mcp``) are two callers, and a client naming itself after a trusted
        caller does not become that caller.
        """
        caller = client = ip = None
        authenticated = False
        name = None
        try:
            cp = ctx.session.client_params
            if cp is not None and cp.client_info is not None:
                client = f"{cp.client_info.name}/{cp.client_info.version}"
                name = cp.client_info.name
        except AttributeError:
            pass
        if self.principal is not None:
            caller = self.principal(ctx)
            authenticated = caller is not None
        if caller is None:
            caller = _token_subject()
            authenticated = caller is not None
        if caller is None and name is not None:
            caller = f"{name}#{_transport_session(ctx) or self.session_id}"
        if self.client_ip is not None:
            ip = self.client_ip(ctx)
        return caller, client, ip, authenticated

    @staticmethod
    def _measure(result: Any) -> tuple[int, bool, int | None]:
        """Bytes of the result as sent, its isError flag, rows if the result says."""
        try:
            dump = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        except AttributeError:
            dump = result
        try:
            size = len(json.dumps(dump, separators=(",", ":"), default=str).encode())
        except (TypeError, ValueError):
            size = 0
        is_error = bool(dump.get("isError")) if isinstance(dump, dict) else False
        rows = None
        sc = dump.get("structuredContent") if isinstance(dump, dict) else None
        if isinstance(sc, dict):
            for k in ("rows", "row_count", "rowCount", "count"):
                if isinstance(sc.get(k), int):
                    rows = sc[k]
                    break
        return size, is_error, rows

    # ------------------------------------------------------------------ middleware
    async def __call__(self, ctx: Any, call_next: Callable[[Any], Any]) -> Any:
        """Wrap one inbound message; only ``tools/call`` is logged."""
        if getattr(ctx, "method", None) != "tools/call":
            return await call_next(ctx)
        params = dict(ctx.params or {})
        t0 = time.perf_counter()
        self._filter_root_handlers()  # (a handler added since: covered too)
        status, is_error, size, rows, detail = "ok", False, 0, None, None
        box: list[BaseException] = []
        token = _CALL_EXC.set(box)
        try:
            result = await call_next(ctx)
            size, is_error, rows = self._measure(result)
            if is_error:
                # the result's text first (a ToolError's message reaches it); else the
                # exception the SDK logged and withheld from the result
                status = _error_status(result)
                if status == "error" and box:
                    status = _status_of_exception(box[-1])
            return result
        except BaseException as exc:
            # protocol errors (MCPError, ValidationError) reach middleware raised
            status, is_error, detail = _status_of_exception(exc), True, type(exc).__name__
            raise
        finally:
            _CALL_EXC.reset(token)
            caller, client, ip, authenticated = self._who(ctx)
            args = params.get("arguments") or {}
            rec: dict[str, Any] = {
                "ts": _now(),
                "session_id": self.session_id,
                "caller_id": caller,
                "caller_authenticated": authenticated,
                "client_ip": ip,
                "client": client,
                "server": self.server,
                "tool": params.get("name"),
                "args": args,
                "status": status,
                "isError": is_error,
                "bytes": size,
                "duration_ms": round((time.perf_counter() - t0) * 1000, 3),
                "request_id": getattr(ctx, "request_id", None),
            }
            if rows is not None:
                rec["rows"] = rows
            if detail:
                rec["error"] = detail
            line, changed = self._line({k: v for k, v in rec.items() if v is not None})
            self._emit(line)
            if changed:  # the summary counts resources as logged (hashed), never a secret
                try:
                    args = json.loads(line).get("args")
                except (ValueError, AttributeError):
                    args = None
            with self._lock:
                self._calls += 1
                self._errors += int(is_error)
                self._bytes += size
                self._caller = caller or self._caller
                if isinstance(args, dict):
                    for v in args.values():
                        if isinstance(v, str | int) and not isinstance(v, bool):
                            self._resources.add(str(v))
                            break

    def session_end(self) -> None:
        """Write the ``SESSION_END`` summary (once; also registered with :mod:`atexit`)."""
        if self._ended:
            return
        self._ended = True
        rec = {
            "event": "SESSION_END",
            "ts": _now(),
            "session_id": self.session_id,
            "caller_id": self._caller,
            "server": self.server,
            "callCount": self._calls,
            "uniqueResourcesAccessed": len(self._resources),
            "totalBytesReturned": self._bytes,
            "errors": self._errors,
            "durationMs": round((time.time() - self._started) * 1000, 1),
        }
        # (the caller comes from a call, which loaded the scanner: no call, nothing to scan)
        self._write({k: v for k, v in rec.items() if v is not None},
                    scan=self._hasher is not None)


__all__ = ["ToolwatchMiddleware"]
