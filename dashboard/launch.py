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
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

APP = Path(__file__).resolve().parent / "app.py"
PASSWORD_ENV = "TOOLWATCH_DASHBOARD_PASSWORD"  # noqa: S105 - a variable name
PROXY_HEADER_ENV = "TOOLWATCH_DASHBOARD_TRUSTED_PROXY_HEADER"


@dataclass
class _Failures:
    count: int = 0
    until: float = 0.0


@dataclass
class LoginThrottle:
    """Password attempts limited per client address *and* for the whole process.

    A delay inside one browser session does not slow an attacker who opens many sessions
    in parallel. This throttle is module state of the dashboard process, shared by every
    session (Streamlit runs each session's script in a thread of one process): after the
    ``n``-th consecutive failure from an address (beyond ``free_failures``, a typo's
    allowance), that address must wait ``min(base_s * 2**(n-1-free_failures), max_s)``
    before its next attempt is even checked; and across
    all addresses at most ``process_burst`` failures are allowed, refilled at
    ``process_per_min`` per minute, so spoofed or rotating addresses cannot multiply the
    rate either. A success clears its address's count (not the process bucket).

    The back-off *delays* attempts, it never refuses one (:meth:`attempt`): an attempt
    made during a wait is held for the wait (at most ``max_delay_s``) and then checked,
    so the right password always gets in and nobody can lock the analysts out by
    failing on purpose. Attempts from one address are checked one at a time, so parallel
    sessions from that address do not multiply its rate; the delay is applied before
    the check, so its length tells nothing about the guess.

    Parameters
    ----------
    base_s
        Wait after the first failure from an address, in seconds.
    max_s
        Longest wait for one address, in seconds.
    process_burst
        Failures the whole process tolerates in a burst.
    process_per_min
        Failures per minute the whole process tolerates in the long run.
    free_failures
        Failures per address before its back-off starts.
    max_delay_s
        Longest an attempt is held before its password is checked, in seconds.
    clock
        Monotonic clock (a parameter so tests need not sleep).
    """

    base_s: float = 1.0
    max_s: float = 300.0
    process_burst: float = 10.0
    process_per_min: float = 10.0
    free_failures: int = 1
    max_delay_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _by_addr: dict[str, _Failures] = field(default_factory=dict)
    _tokens: float | None = None
    _stamp: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _addr_locks: dict[str, threading.Lock] = field(default_factory=dict)

    def _refill(self, now: float) -> None:
        if self._tokens is None:
            self._tokens, self._stamp = self.process_burst, now
        self._tokens = min(
            self.process_burst, self._tokens + (now - self._stamp) * self.process_per_min / 60
        )
        self._stamp = now

    def wait_s(self, addr: str | None) -> float:
        """Seconds before ``addr`` may try a password (0 when it may try now)."""
        with self._lock:
            now = self.clock()
            self._refill(now)
            f = self._by_addr.get(addr or "?")
            per_addr = max(0.0, f.until - now) if f else 0.0
            assert self._tokens is not None
            process = 0.0 if self._tokens >= 1 else (1 - self._tokens) * 60 / self.process_per_min
            return max(per_addr, process)

    def failed(self, addr: str | None) -> None:
        """Record a wrong password from ``addr``."""
        with self._lock:
            now = self.clock()
            self._refill(now)
            assert self._tokens is not None
            self._tokens = max(0.0, self._tokens - 1)
            f = self._by_addr.setdefault(addr or "?", _Failures())
            f.count += 1
            over = f.count - self.free_failures
            if over > 0:
                f.until = now + min(self.base_s * 2 ** (over - 1), self.max_s)
            if len(self._by_addr) > 10_000:  # bounded: forget addresses whose wait is over
                self._by_addr = {a: v for a, v in self._by_addr.items() if v.until > now}

    def succeeded(self, addr: str | None) -> None:
        """Clear ``addr``'s failures after a correct password."""
        with self._lock:
            self._by_addr.pop(addr or "?", None)

    def _addr_lock(self, addr: str | None) -> threading.Lock:
        with self._lock:
            if len(self._addr_locks) > 10_000:  # bounded: drop locks nobody holds
                self._addr_locks = {a: k for a, k in self._addr_locks.items() if k.locked()}
            return self._addr_locks.setdefault(addr or "?", threading.Lock())

    def attempt(self, addr: str | None, check: Callable[[], bool]) -> tuple[bool, float]:
        """Check one password attempt from ``addr`` under the back-off.

        Parameters
        ----------
        addr
            The client's address (None when unknown: all such clients share one key).
        check
            Compares the submitted password with the expected one (constant time).

        Returns
        -------
        tuple of (bool, float)
            Whether the password was right, and how long the attempt was held first.
            A right password is always accepted, whatever the back-off.
        """
        with self._addr_lock(addr):  # one attempt at a time per address
            delay = min(self.wait_s(addr), self.max_delay_s)
            if delay > 0:
                self.sleep(delay)
            good = bool(check())
            if good:
                self.succeeded(addr)
            else:
                self.failed(addr)
            return good, delay


def client_address(
    peer: str | None, headers: Mapping[str, str] | None, trusted_header: str
) -> str | None:
    """The address the login back-off is keyed by.

    Parameters
    ----------
    peer
        The TCP peer address Streamlit reports (None on localhost).
    headers
        The request headers (any case).
    trusted_header
        Header set by a trusted reverse proxy (e.g. ``X-Forwarded-For``); empty means
        headers are never trusted. Behind a proxy the peer is the proxy, so without this
        every client would share one key.

    Returns
    -------
    str or None
        The last address in the header (the one the proxy appended; entries to its
        left are whatever the client sent) when it parses as an IP address, else the peer.
    """
    if trusted_header and headers:
        want = trusted_header.lower()
        for name, value in headers.items():
            if name.lower() != want or not isinstance(value, str):
                continue
            last = value.rsplit(",", 1)[-1].strip().strip("[]")
            try:
                return str(ipaddress.ip_address(last))
            except ValueError:
                break
    return peer


#: The dashboard process's throttle (imported by dashboard/app.py in every session).
LOGIN_THROTTLE = LoginThrottle()


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
    trusted_proxy_header: Annotated[
        str | None,
        typer.Option(
            "--trusted-proxy-header",
            help="Header a reverse proxy sets to the client address (e.g. X-Forwarded-For); "
            "the login back-off is keyed by it. Default: [dashboard] trusted_proxy_header.",
        ),
    ] = None,
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
    header = (
        trusted_proxy_header
        if trusted_proxy_header is not None
        else cfg.dashboard.trusted_proxy_header
    )
    if header:
        env[PROXY_HEADER_ENV] = header
    else:
        env.pop(PROXY_HEADER_ENV, None)
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
