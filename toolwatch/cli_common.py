"""What every ``toolwatch`` command shares: the store options, config loading, errors.

Kept light (typer, rich, config): it is imported by every invocation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from toolwatch.config import Config, load_config, locate_store

err = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Config file (TOML). Default: ./toolwatch.toml"),
]
DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", "-d", help="Store directory (overrides config).")
]


def config_for(config: Path | None, data_dir: Path | None) -> Config:
    """The configuration a command runs with: the file, then ``--data-dir`` over it."""
    cfg = load_config(config)
    if data_dir is not None:
        cfg.store.data_dir = str(data_dir)
    return locate_store(cfg)


def fail(exc: Exception, code: int = 1) -> typer.Exit:
    """Print ``exc`` as an error on stderr; the exit to raise (``raise fail(e) from None``).

    The message is printed as plain text with control characters escaped: error texts
    quote logged values (paths, tool names, a DuckDB error quoting a cell), which must
    neither drive the terminal nor be read as rich markup.
    """
    from toolwatch.output import error_text

    err.print(error_text(exc), highlight=False, soft_wrap=True)  # one line, whatever the width
    return typer.Exit(code)
