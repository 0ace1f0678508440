"""Ending live loops cleanly: the stop flag and the signals that set it."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


class StopFlag:
    """Set by signal handlers (SIGINT/SIGTERM) to end a live loop cleanly."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        #: How many signals asked for the stop (a second one ends a final pass at once).
        self.signals = 0

    def set(self, signum: int | None = None) -> None:
        """Request a stop (``signum``: by that signal)."""
        self.signum = signum
        if signum is not None:
            self.signals += 1
        self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()


def install_stop_handlers(flag: StopFlag) -> None:
    """SIGINT/SIGTERM/SIGHUP set ``flag`` (the loop then flushes and exits)."""
    import signal

    def handler(signum: int, _frame: Any) -> None:
        flag.set(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(s, handler)


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (for tests and the metrics endpoint)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
