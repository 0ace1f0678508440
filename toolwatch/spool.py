"""The ``toolwatch`` console entry: start a ``run`` command's server, then the CLI.

A wrapped server's stderr goes to a spool file under the store before anything else
(:mod:`toolwatch.ingest.sources.wrapper`; read back by :mod:`toolwatch.ingest.sources.spool`).
This module is on the wrapper's cold-start path: it imports the standard library and the
wrapper only, parses just enough of argv to start the server, tunes the allocators
(:mod:`toolwatch.allocator`) and only then imports the CLI.
"""

from __future__ import annotations

import contextlib
import os
import sys

from toolwatch.allocator import tune_memory
from toolwatch.ingest.sources.wrapper import Wrapped, start_wrapped

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def recover_orphans(config: Any) -> int:
    """Ingest spools of dead wrappers (``ingest``/``analyze`` call this on opening the store).

    A directory listing when there is nothing to do; the live engine is imported only
    when an orphaned spool exists. Returns the number of orphaned spools found.
    """
    from toolwatch.ingest.sources.spool import has_orphans

    if not has_orphans(config.data_dir):
        return 0
    from toolwatch.live_cli import recover_spools

    return recover_spools(config)


# --------------------------------------------------------------------------- entry point
_VALUE_OPTS = {"--alerts-out", "--webhook", "--metrics-port"}
_FLAG_OPTS = {"--slack", "-v", "--verbose"}

#: A ``run`` command's server started by :func:`main` before the CLI was imported.
PRESTARTED: dict[str, Wrapped] = {}


def _prestart(args: list[str]) -> None:
    """Start ``toolwatch run [OPTS] -- CMD`` 's server now; leave anything unusual to typer."""
    data_dir: str | None = None
    config: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            argv = args[i + 1 :]
            break
        name, eq, val = a.partition("=")
        if name in ("-d", "--data-dir", "-c", "--config", *_VALUE_OPTS):
            if not eq:
                i += 1
                if i >= len(args):
                    return
                val = args[i]
            if name in ("-d", "--data-dir"):
                data_dir = val
            elif name in ("-c", "--config"):
                config = val
        elif a not in _FLAG_OPTS:
            return  # --help, an unknown option or no "--": the CLI decides
        i += 1
    else:
        return
    if not argv:
        return
    try:
        store = data_dir if data_dir is not None else _configured_data_dir(config)
        if store is None:
            return
        PRESTARTED["run"] = start_wrapped(store, argv)
    except Exception:
        return


#: ``[store] data_dir`` default (toolwatch.config.StoreConfig; kept equal by a test).
DEFAULT_DATA_DIR = ".toolwatch/data"


def _configured_data_dir(config: str | None) -> str | None:
    """The store directory as :func:`toolwatch.config.load_config` would resolve it.

    Standard library only (``tomllib`` when a config file is involved): ``$TOOLWATCH_DATA_DIR``,
    else the config file's (``-c``, ``$TOOLWATCH_CONFIG``, ``./toolwatch.toml``)
    ``[store] data_dir``, else the default. ``None`` when the file is missing or not
    valid TOML: the CLI then reports the error (and no server has been started).
    """
    env_dir = os.environ.get("TOOLWATCH_DATA_DIR")
    chosen = config or os.environ.get("TOOLWATCH_CONFIG")
    if chosen is None and os.path.isfile("toolwatch.toml"):
        chosen = "toolwatch.toml"
    if chosen is not None:
        import tomllib

        try:
            with open(chosen, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, ValueError):
            return None
        if env_dir:
            return env_dir
        store = data.get("store")
        value = (
            store.get("data_dir", DEFAULT_DATA_DIR)
            if isinstance(store, dict)
            else (DEFAULT_DATA_DIR)
        )
        return value if isinstance(value, str) else None
    return env_dir or DEFAULT_DATA_DIR


#: Commands whose process lives long beside a production server (``ingest`` only with
#: ``--follow``): their allocators are tuned to hand freed memory back (:func:`tune_memory`).


def main() -> None:
    """Console entry point: start a ``run`` command's server first, then the CLI."""
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        _prestart(sys.argv[2:])
    # After the server has started (its cold start stays as short as it was), before the
    # CLI imports polars: allocator settings must precede the first allocation.
    tune_memory(sys.argv[1:])
    from toolwatch.cli import main as cli_main

    try:
        cli_main()
    finally:
        left = PRESTARTED.pop("run", None)
        if left is not None:  # the CLI refused the command line: do not leave it running
            with contextlib.suppress(OSError):
                left.server.proc.terminate()  # type: ignore[union-attr]
            left.finish()
