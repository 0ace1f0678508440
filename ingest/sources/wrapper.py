"""Spool first: a wrapped server's stderr goes to a file under the store before anything else.

``toolwatch run -- CMD`` starts the server with a **spool file as its stderr**
(``<data_dir>/spool/<wrapper-id>.log``). Every byte the server writes reaches the file
through the kernel, with no process of ours in between: a wrapper killed at any moment
(``kill -9`` included) loses nothing the server wrote. The wrapper echoes the spool to its
own stderr by tailing it (whatever showed the server's stderr before still does), and
parsing, storing and detection read the spool like ``tail`` reads a file, with
checkpointed offsets (:class:`toolwatch.ingest.sources.spool.SpoolSource`, driven by
:func:`toolwatch.live_cli.collect_spools`).

Files of one wrapper (``<wid>`` = wrapper pid + random suffix):

``<wid>.lock``
    ``flock``-ed by the wrapper for its whole life (the descriptor is not inherited by the
    server). Free lock = the wrapper is gone.
``<wid>.meta``
    JSON: argv, source name, wrapper and server pids, start time.
``<wid>.log``
    The server's stderr, byte for byte.

A spool is removed only after the store commit that holds its last line. A spool whose
wrapper died is *orphaned*: the next toolwatch process that writes to the store (``run``,
``collect``, ``tail``, ``kafka``, ``ingest --follow``, ``ingest``, ``analyze``) ingests it,
exactly once: its stream id is salted with the wrapper id and its offset checkpointed with
the data, so what an earlier process already committed is skipped. Only the holder of the
store's **collector lock** (``spool/collector.lock``) reads spools, so two processes never
ingest the same one.

This module is on the wrapper's cold-start path: it imports the standard library only.
:func:`toolwatch.spool.main` (the console entry point) starts a ``run`` command's server
before the CLI and its dependencies are even imported. The reader of spools is
:mod:`toolwatch.ingest.sources.spool`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from toolwatch.safe_open import UnsafeFile, open_regular, set_aside

# Cold start: no typing, dataclasses, json or uuid on the wrapper's path to its server's
# first byte (dataclasses alone pulls inspect/ast/dis: ~10-30 ms on a busy host). Names
# used only in annotations (strings here) are imported for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: Signals that, once the server has exited, make the wrapper leave at once.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

COLLECTOR_LOCK = "collector.lock"
#: The wrapped server's environment variable holding the run's record key (hex); the
#: same name as toolwatch.mcp_middleware.RECORD_KEY_ENV (kept equal by a test).
RECORD_KEY_ENV = "TOOLWATCH_RECORD_KEY"
#: Bytes read at a time when a collector resuming a spool searches it for the
#: middleware's hello (the whole spool is searched).
HELLO_PROBE_BYTES = 1 << 20
#: Longest unfinished line kept between two chunks of that search (a hello is < 1 KiB).
HELLO_CARRY_BYTES = 1 << 16
#: Where files of the spool directory that are not toolwatch's (a FIFO, a symlink, a
#: device, a hard link, another user's file) are moved, never read (docs/security.md).
REJECTED_DIR = "rejected"
#: Largest meta file read (ours are < 1 KiB).
META_MAX_BYTES = 1 << 20
#: Seconds a collector's final pass keeps reading a spool whose server has exited while
#: another process (a child the server forked) still has it open for writing; past it the
#: rest is left to the next collector (``[live] writer_grace_s``).
WRITER_GRACE_S = 5.0
#: Seconds between two looks for a spool's remaining writers (/proc scan).
WRITER_SCAN_INTERVAL_S = 0.5


def spool_dir(data_dir: str | Path) -> Path:
    """``<data_dir>/spool``."""
    return Path(data_dir) / "spool"


def _refused(path: Path | str, reason: str) -> None:
    """Log a planted file that was set aside (logging is imported only then)."""
    import logging

    logging.getLogger("toolwatch.spool").error(
        "spool: refusing %s: %s (set aside, never read)", path, reason
    )


def _lock_nb(path: Path, mode: str = "a") -> Any | None:
    """Open ``path`` and take an exclusive ``flock`` without waiting; the handle or None.

    Opened with ``O_NOFOLLOW | O_NONBLOCK`` (:func:`toolwatch.safe_open.open_regular`): a
    FIFO planted under a lock's name made every collector hang in ``open(2)``, a symlink
    made it create or touch the file it points at. Such a file is a lock nobody can take
    (None), and is logged.
    """
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except UnsafeFile as exc:
        _refused(path, exc.reason)
        return None
    except OSError:
        return None
    fh = os.fdopen(fd, mode)
    fh.buffer.raw.name = str(path)  # as open() would name it
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    return fh


def try_collector_lock(data_dir: str | Path) -> Any | None:
    """The store's collector lock if free (hold the returned handle; close to release).

    A lock file that is not a plain file (planted) is set aside and made again: it would
    otherwise keep every collector of the store from starting.
    """
    d = spool_dir(data_dir)
    with contextlib.suppress(OSError):
        d.mkdir(parents=True, exist_ok=True)
    path = d / COLLECTOR_LOCK
    with contextlib.suppress(OSError):
        if not stat_is_regular(os.lstat(path)):
            set_aside(path, d / REJECTED_DIR)
    return _lock_nb(path)


def stat_is_regular(st: os.stat_result) -> bool:
    """Whether an ``lstat`` result is a plain file."""
    import stat as _stat

    return _stat.S_ISREG(st.st_mode)


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped: its wrapper died) is not writing any more.
    with contextlib.suppress(OSError):
        st = Path(f"/proc/{pid}/stat").read_text()
        if st[st.rfind(")") + 2 :].startswith("Z"):
            return False
    return True


# --------------------------------------------------------------------------- wrapper side
class Spool:
    """The wrapper's own spool: lock, meta and the log file the server writes to.

    Parameters
    ----------
    data_dir
        Store directory.
    argv
        The server's command line (recorded in the meta file).
    """

    def __init__(self, data_dir: str | Path, argv: list[str]):
        self.dir = spool_dir(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.wid = f"{os.getpid()}-{os.urandom(4).hex()}"
        self.lock_path = self.dir / f"{self.wid}.lock"
        self.meta_path = self.dir / f"{self.wid}.meta"
        self.log_path = self.dir / f"{self.wid}.log"
        self._lock = open(self.lock_path, "w")  # noqa: SIM115 - held for the wrapper's life
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.meta: dict[str, Any] = {
            "wid": self.wid,
            "argv": argv,
            "name": Path(argv[0]).name if argv else "server",
            "wrapper_pid": os.getpid(),
            "child_pid": None,
            "started_ns": time.time_ns(),
        }
        # The meta file is written once the server runs (start_wrapped): json is off the
        # path to the first byte. A collector skips a spool without meta while its lock is
        # held (SpoolSource._open).
        # O_APPEND: the server and anything it spawns append whole writes, never overwrite.
        # O_EXCL | O_NOFOLLOW: the name is new (pid + random); never a planted link.
        self.fd = os.open(
            self.log_path,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
            0o600,
        )
        #: The echo's descriptor, opened before the server runs: the server may replace
        #: the spool's name (a FIFO, a symlink), never the file this names.
        self.read_fd = os.open(self.log_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def write_meta(self) -> None:
        """Write the meta file atomically (tmp + rename)."""
        import json

        tmp = self.meta_path.with_suffix(".meta.tmp")
        tmp.unlink(missing_ok=True)
        # 0600: the meta holds the run's record key (what makes a line an event)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(self.meta))
        os.replace(tmp, self.meta_path)

    def release(self) -> None:
        """Let a collector finalize this spool (the server has exited)."""
        if self._lock is not None:
            # fsync through a descriptor we hold: opening the name again would follow
            # whatever the server put there meanwhile (a FIFO hung the wrapper).
            fd = self.fd if self.fd >= 0 else self.read_fd
            with contextlib.suppress(OSError):
                os.fsync(fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        if self.read_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            self.read_fd = -1
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class Echo:
    """Tail the spool file to a descriptor (the wrapper's stderr) on a thread.

    Polls with a back-off from 2 ms (just after data) to 50 ms (idle), so a line shows up
    on the wrapper's stderr within 50 ms and an idle wrapper makes ~20 empty reads/s.
    """

    def __init__(self, path: Path, out_fd: int = 2, fd: int | None = None):
        # ``fd``: the spool opened when it was created (Spool.read_fd), not by name.
        self.fd = fd if fd is not None else open_regular(path)
        self.out_fd = out_fd
        self.bytes = 0
        self.errors = 0
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spool-echo", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.002
        try:
            while True:
                data = os.read(self.fd, 1 << 16)
                if data:
                    self.bytes += len(data)
                    self._write(data)
                    delay = 0.002
                    continue
                if self.done.is_set():
                    # one last read: anything written before the server's exit is there
                    data = os.read(self.fd, 1 << 20)
                    while data:
                        self._write(data)
                        data = os.read(self.fd, 1 << 20)
                    return
                self.done.wait(delay)
                delay = min(delay * 2, 0.05)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)

    def _write(self, data: bytes) -> None:
        if self.errors:
            return  # our stderr is gone: the spool still has everything
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except InterruptedError:
                continue
            except OSError:
                self.errors += 1
                return
            view = view[n:]

    def finish(self, timeout: float = 2.0) -> None:
        """Echo what is left and stop."""
        self.done.set()
        self._thread.join(timeout)


def _die_with_parent() -> Any:
    """A pre-exec hook that makes the server get SIGKILL when its wrapper dies (Linux).

    The server runs in its own process group (so a signal to the wrapper's group reaches
    it once, forwarded), which would let it escape an MCP client's final ``killpg(SIGKILL)``
    of the wrapper's group; the parent-death signal keeps the client's guarantee that the
    whole tree is gone. Whatever the server wrote is in the spool already.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    kill = int(signal.SIGKILL)

    def hook() -> None:
        prctl(1, kill, 0, 0, 0)  # PR_SET_PDEATHSIG

    return hook


class WrappedServer:
    """A child process with inherited stdin/stdout; stderr to ``stderr`` (a spool file).

    Parameters
    ----------
    argv
        The server's command line.
    env
        Environment (default: inherited).
    stderr
        Descriptor the child's stderr goes to (default: a pipe, see :attr:`proc`).
    """

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, stderr: int | None = None
    ):
        if not argv:
            raise ValueError("no command to run: use toolwatch run -- CMD ARGS...")
        self.argv = argv
        self.env = env
        self.stderr = stderr
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_ns = 0
        self._own_group = False
        self._old_handlers: dict[int, object] = {}
        self.forwarded: list[int] = []
        #: Set by a stop signal (SIGINT/SIGTERM/SIGHUP) received after the server exited.
        self.stop_after_exit = threading.Event()
        self.exited = threading.Event()
        #: ``code -> None`` that ends the wrapper (e.g. ``os._exit``): called ~100 ms after a
        #: stop signal that comes once the server has exited, wherever the wrapper is then
        #: (still importing the CLI, or committing). Everything the server wrote is in the
        #: spool already, so leaving is safe; the client's SIGKILL 2 s later would not be.
        self.abandon: Any = None
        self._abandoning = False

    def start(self) -> WrappedServer:
        """Spawn the child; install signal forwarding."""
        interactive = False
        with contextlib.suppress(OSError, ValueError):
            interactive = os.isatty(0)
        # With a terminal on stdin the child must stay in our process group (or reading
        # the tty would stop it); the tty then signals both of us, so SIGINT/SIGQUIT are
        # not forwarded a second time. Under an MCP client (pipes) the child gets its own
        # group and every signal reaches it exactly once, through us.
        self._own_group = not interactive
        self.started_ns = time.time_ns()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=None,
            stdout=None,
            stderr=subprocess.PIPE if self.stderr is None else self.stderr,
            bufsize=0,
            env=self.env,
            process_group=0 if self._own_group else None,
            preexec_fn=_die_with_parent() if self._own_group else None,
        )
        self._install_forwarding()
        return self

    def _install_forwarding(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in FORWARDED_SIGNALS:
            if not self._own_group and sig in (signal.SIGINT, signal.SIGQUIT):
                handler: object = signal.SIG_IGN if sig == signal.SIGQUIT else self._noop
            else:
                handler = self._forward
            with contextlib.suppress(OSError, ValueError):
                self._old_handlers[sig] = signal.signal(sig, handler)  # type: ignore[arg-type]

    def _noop(self, signum: int, _frame: object) -> None:
        self.forwarded.append(-signum)
        if self.exited.is_set() or self.exit_status() is not None:
            self.stop_after_exit.set()
            self._abandon_soon()

    def _forward(self, signum: int, _frame: object) -> None:
        self.forwarded.append(signum)
        # poll(), not returncode: a server that exited at stdin EOF is a zombie until
        # reaped, and the client's SIGTERM 2 s later must count as "after the exit".
        if self.proc is not None and not self.exited.is_set() and self.exit_status() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)
        elif signum in STOP_SIGNALS:
            self.stop_after_exit.set()
            self._abandon_soon()

    def exit_status(self) -> int | None:
        """The server's exit status as a shell reports it, or None while it runs.

        Safe in a signal handler: ``waitid(WNOWAIT)`` looks without reaping, so it takes
        no lock that the main thread's ``Popen.wait`` may hold.
        """
        if self.proc is None:
            return None
        rc = self.proc.returncode
        if rc is None:
            try:
                info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped meanwhile: returncode is set
                rc = self.proc.returncode
                return None if rc is None else (128 - rc if rc < 0 else rc)
            if info is None or info.si_pid == 0:
                return None
            if info.si_code == os.CLD_EXITED:
                return info.si_status
            return 128 + info.si_status
        return 128 - rc if rc < 0 else rc

    def _abandon_soon(self, grace: float = 0.08) -> None:
        """Call :attr:`abandon` with the server's code after ``grace`` s (once)."""
        if self.abandon is None or self._abandoning:
            return
        code = self.exit_status()
        if code is None:
            return
        self._abandoning = True
        t = threading.Timer(grace, self.abandon, args=(code,))
        t.daemon = True
        t.start()

    def restore_signals(self, on_stop: Any = None) -> None:
        """Put back the signal handlers that were there before :meth:`start`.

        With ``on_stop`` (``(signum, frame) -> None``), the stop signals get that handler
        instead, installed over the forwarding one with no default-action gap between: a
        wrapper whose server has exited and whose work is done may still be shutting down
        when the MCP client's SIGTERM comes, and must then exit with the server's code, not
        die of the signal.
        """
        for sig, h in list(self._old_handlers.items()):
            if on_stop is not None and sig in STOP_SIGNALS:
                h = on_stop
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, h)  # type: ignore[arg-type]
        self._old_handlers.clear()

    @property
    def pid(self) -> int:
        """The child's pid."""
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        """The child's return code, or ``None`` while it runs."""
        assert self.proc is not None
        return self.proc.poll()

    def exit_code(self) -> int:
        """Wait for the child; its exit status as a shell would report it."""
        assert self.proc is not None
        rc = self.proc.wait()
        return 128 - rc if rc < 0 else rc

    def salt(self) -> bytes:
        """Stream-identity salt: this run's pid and start time."""
        return f"run:{self.pid}:{self.started_ns}".encode()


class Wrapped:
    """A started server with its spool and stderr echo (see :func:`start_wrapped`)."""

    def __init__(self, server: WrappedServer, spool: Spool, echo: Echo, data_dir: Path):
        self.server = server
        self.spool = spool
        self.echo = echo
        self.data_dir = data_dir

    def finish(self) -> None:
        """The server has exited: echo the rest, release the spool to the collector."""
        self.server.exited.set()
        self.echo.finish()
        self.spool.release()

    def abandon(self, code: int) -> None:
        """Leave now with ``code`` (a stop signal after the server's exit): echo what is
        left (briefly) and exit; the spool stays for the collector or the next writer."""
        with contextlib.suppress(Exception):
            self.echo.finish(timeout=0.05)
        os._exit(code)


def start_wrapped(data_dir: str | Path, argv: list[str]) -> Wrapped:
    """Create a spool, start the server with it as stderr, start echoing it.

    Raises
    ------
    OSError
        The command cannot be started (the spool is removed again).
    """
    sp = Spool(data_dir, argv)
    # The trust boundary (docs/security.md): a per-run key for the server's toolwatch
    # middleware, which tags its records with it; the collector reads it from the meta.
    key = os.urandom(16).hex()
    sp.meta["record_key"] = key
    env = dict(os.environ)
    env[RECORD_KEY_ENV] = key
    srv = WrappedServer(argv, env=env, stderr=sp.fd)
    try:
        srv.start()
    except OSError:
        sp.release()
        for p in (sp.log_path, sp.meta_path, sp.lock_path):
            p.unlink(missing_ok=True)
        raise
    sp.meta["child_pid"] = srv.pid
    sp.meta["started_ns"] = srv.started_ns
    sp.write_meta()
    # The server has its own copy of the descriptor; ours is only needed to release.
    os.close(sp.fd)
    sp.fd = -1
    w = Wrapped(srv, sp, Echo(sp.log_path, fd=os.dup(sp.read_fd)), Path(data_dir))
    srv.abandon = w.abandon
    return w


# --------------------------------------------------------------------------- collector side
