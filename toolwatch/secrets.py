"""Keyed hashing of secrets found in tool arguments.

Argument values under secret-looking keys (``apiKey``, ``password``, ``token`` …) are
never stored in clear. They are replaced by ``hmac:<32 hex>``, an HMAC-SHA256 under a key
kept *outside* the store: equal secrets still hash equal, so detectors can count distinct
credentials, but someone holding only the store cannot recover or brute-force them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets as _stdlib_secrets
from pathlib import Path
from typing import Any

import orjson

from toolwatch.errors import ConfigError

HASH_PREFIX = "hmac:"


def load_or_create_key(key_file: str | Path, data_dir: str | Path | None = None) -> bytes:
    """Return the HMAC key: ``$TOOLWATCH_HMAC_KEY`` (hex), else the key file, else a new one.

    Parameters
    ----------
    key_file
        Where the key is kept. Created (mode 0600, exclusive) with 32 random bytes when absent.
    data_dir
        The store directory; a key file inside it is refused, because a key stored beside
        the hashes it protects protects nothing.
    """
    env = os.environ.get("TOOLWATCH_HMAC_KEY")
    if env:
        try:
            key = bytes.fromhex(env.strip())
        except ValueError as exc:
            raise ConfigError("TOOLWATCH_HMAC_KEY must be hex", path="env") from exc
        if len(key) < 16:
            raise ConfigError("TOOLWATCH_HMAC_KEY must be at least 16 bytes", path="env")
        return key
    path = Path(key_file).expanduser().resolve()
    if data_dir is not None:
        store = Path(data_dir).expanduser().resolve()
        if path == store or store in path.parents:
            raise ConfigError(
                f"the HMAC key file {path} must not live inside the store {store}",
                key="secrets.hmac_key_file",
            )
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first: read theirs below
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(_stdlib_secrets.token_hex(32) + "\n")
    try:
        return bytes.fromhex(path.read_text().strip())
    except ValueError as exc:
        raise ConfigError("HMAC key file is not hex", path=str(path)) from exc


class SecretHasher:
    """Replace secret argument values with keyed hashes.

    Parameters
    ----------
    key
        HMAC key bytes.
    secret_keys
        Case-insensitive substrings; a JSON object key containing any of them is secret.
    """

    def __init__(self, key: bytes, secret_keys: list[str]):
        self._key = key
        self._needles = tuple(k.lower() for k in secret_keys)
        self._key_cache: dict[str, bool] = {}

    @property
    def candidate_pattern(self) -> str:
        """RE2 pattern (case-insensitive) matching lines that may carry a secret.

        Used vectorized over a whole batch (``pyarrow.compute.match_substring_regex``):
        one DFA pass, ~20 ms per 16 MiB, so the exact JSON-walking path runs only for
        the few lines that need it.
        """
        return "|".join(re.escape(n) for n in self._needles) + r"|\\u"

    def digest(self, value: Any) -> str:
        """Keyed hash of one secret value, as stored."""
        if isinstance(value, str):
            raw = value
        elif type(value) is int:  # its JSON text; orjson refuses ints beyond 64 bits
            raw = str(value)
        else:
            raw = orjson.dumps(value).decode()
        mac = hmac.new(self._key, raw.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return HASH_PREFIX + mac.hexdigest()[:32]

    def is_secret_key(self, key: str) -> bool:
        """Whether values under ``key`` must be hashed."""
        # Logs repeat a small vocabulary of keys: memoize (bounded, keys are attacker data).
        hit = self._key_cache.get(key)
        if hit is None:
            low = key.lower()
            hit = any(n in low for n in self._needles)
            if len(self._key_cache) < 65_536:
                self._key_cache[key] = hit
        return hit

    def redact(self, obj: Any, found: list[str]) -> Any:
        """Return ``obj`` with every secret value hashed; append the hashes to ``found``.

        Containers holding no secret are returned as they are (not copied): a log line
        is mostly scalars under ordinary keys, and this runs for every line that may
        carry a secret.
        """
        if isinstance(obj, dict):
            out: dict[str, Any] | None = None
            for k, v in obj.items():
                if isinstance(v, dict | list):
                    new = self.redact(v, found)
                    if new is v:
                        continue
                elif v is None or isinstance(v, bool) or not self.is_secret_key(k):
                    continue
                else:
                    new = v if isinstance(v, str) and v.startswith(HASH_PREFIX) else self.digest(v)
                    found.append(new)
                if out is None:
                    out = dict(obj)
                out[k] = new
            return obj if out is None else out
        if isinstance(obj, list):
            items: list[Any] | None = None
            for i, v in enumerate(obj):
                if isinstance(v, dict | list):
                    new = self.redact(v, found)
                    if new is not v:
                        if items is None:
                            items = list(obj)
                        items[i] = new
            return obj if items is None else items
        return obj

    def redact_line(self, line: bytes) -> tuple[bytes, str | None]:
        """Redact one JSON line.

        Returns
        -------
        (line, credential_hash)
            The re-serialized line (unchanged if it is not valid JSON: the parser will
            quarantine it, and quarantine stores it only after :meth:`scrub_text`) and the
            first secret hash found, if any.
        """
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return self.scrub_text(line), None
        found: list[str] = []
        red = self.redact(obj, found)
        if not found:
            return line, None
        return orjson.dumps(red), found[0]

    _TEXT_SECRET = re.compile(
        rb'(?i)("[^"\\]*(?:key|password|passwd|token|secret|authorization|credential|cookie)'
        rb'[^"\\]*"\s*:\s*")((?:[^"\\]|\\.)*)(")'
    )

    def scrub_text(self, line: bytes) -> bytes:
        """Best-effort redaction of a line that is not valid JSON (e.g. truncated).

        Quarantine keeps raw lines for forensics; a truncated line can still carry an API
        key in clear, so string values under secret-looking keys are hashed textually.
        """
        return self._TEXT_SECRET.sub(
            lambda m: (
                m.group(1)
                + self.digest(m.group(2).decode("utf-8", "replace")).encode()
                + m.group(3)
            ),
            line,
        )
