"""``toolwatch dashboard``: start the Streamlit app on the store.

The app reads the store through fresh in-memory DuckDB connections over the Parquet
files, so it runs while ``ingest``/``tail`` write and never locks them.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

APP = Path(__file__).resolve().parent / "app.py"
PASSWORD_ENV = "TOOLWATCH_DASHBOARD_PASSWORD"  # noqa: S105 - a variable name


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def streamlit_argv(host: str, port: int, data_dir: Path) -> list[str]:
    """The ``streamlit run`` command line for the dashboard."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.runOnSave",
        "false",
        "--server.fileWatcherType",
        "none",
        "--server.enableXsrfProtection",
        "true",
        "--server.maxUploadSize",
        "1",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--client.showErrorDetails",
        "type",
        "--theme.base",
        "light",
        "--",
        "--data-dir",
        str(data_dir),
    ]


def dashboard_command(
    host: Annotated[
        str, typer.Option("--host", help="Address to bind. Beyond localhost needs a password.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="TCP port.")] = 8501,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Config file (TOML). Default: ./toolwatch.toml"),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", "-d", help="Store directory (overrides config).")
    ] = None,
    password_env: Annotated[
        str,
        typer.Option("--password-env", help="Environment variable holding the dashboard password."),
    ] = PASSWORD_ENV,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth", help="Allow binding beyond localhost without a password."
        ),
    ] = False,
) -> None:
    """Open the review dashboard (Streamlit) on the store; prints its URL.

    Example: toolwatch dashboard -d .toolwatch/data --port 8501
    """
    from toolwatch.config import load_config
    from toolwatch.errors import ToolwatchError

    try:
        cfg = load_config(config)
    except ToolwatchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    root = Path(data_dir) if data_dir is not None else cfg.data_dir
    env = dict(os.environ)
    password = os.environ.get(password_env, "")
    if password:
        env[PASSWORD_ENV] = password
    else:
        env.pop(PASSWORD_ENV, None)
    oidc = env.get("TOOLWATCH_DASHBOARD_AUTH", "").lower() == "oidc"
    if not is_loopback(host) and not (password or oidc or insecure_no_auth):
        typer.echo(
            f"error: refusing to bind {host} without authentication: set ${password_env} "
            "(or TOOLWATCH_DASHBOARD_AUTH=oidc with an [auth] secrets section), "
            "or pass --insecure-no-auth",
            err=True,
        )
        raise typer.Exit(2)
    if not root.exists():
        typer.echo(
            f"note: store {root} does not exist yet; the dashboard will show it empty", err=True
        )
    env["TOOLWATCH_DATA_DIR"] = str(root)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    typer.echo(f"toolwatch dashboard on {root}: http://{shown}:{port}/", err=False)
    sys.stdout.flush()
    proc = subprocess.Popen(streamlit_argv(host, port, root), env=env)

    def _forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    raise typer.Exit(code if code and code > 0 else 0)
