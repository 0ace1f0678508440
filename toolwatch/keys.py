"""The HMAC key that secrets are hashed with, shared by ingest and the SDK middleware.

Kept apart from :mod:`toolwatch.ingest.secrets` (which pulls pyarrow, numpy and RE2) so that a
server using :mod:`toolwatch.mcp_middleware` can key its hashes with toolwatch's own key
without those imports.
"""

from __future__ import annotations

import os
import secrets as _stdlib_secrets
from pathlib import Path

from toolwatch.errors import ConfigError


def default_key_file() -> str:
    """``$XDG_CONFIG_HOME/toolwatch/hmac.key`` (``~/.config/toolwatch/hmac.key``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return str(Path(base) / "toolwatch" / "hmac.key")


def load_or_create_key(key_file: str | Path, data_dir: str | Path | None = None) -> bytes:
    """Return the HMAC key: ``$TOOLWATCH_HMAC_KEY`` (hex), else the key file, else a new one.

    Parameters
    ----------
    key_file
        Where the key is kept. Created (mode 0600, exclusive) with 32 random bytes when absent.
    data_dir
        The store directory; a key file inside it is refused, because a key stored beside
        the hashes it protects protects nothing.

    Raises
    ------
    ConfigError
        The environment variable or the file does not hold at least 16 bytes of hex, or the
        file lies inside the store.
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
