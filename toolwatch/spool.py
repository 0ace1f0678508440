"""Spool first: a wrapped server's stderr goes to a file under the store before anything else.

``toolwatch run -- CMD`` starts the server with a **spool file as its stderr**
(``<data_dir>/spool/<wrapper-id>.log``). Every byte the server writes reaches the file
through the kernel, with no process of ours in between: a wrapper killed at any moment
(``kill -9`` included) loses nothing the server wrote. The wrapper echoes the spool to its
own stderr by tailing it (whatever showed the server's stderr before still does), and
parsing, storing and detection read the spool like ``tail`` reads a file, with
checkpointed offsets (:class:`SpoolSource`, driven by :func:`toolwatch.live_cli.collect_spools`).

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
:func:`main` (the console entry point) starts a ``run`` command's server before the CLI
and its dependencies are even imported.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from toolwatch.safe_open import (
    UnsafeFile,
    open_regular,
    read_regular,
    set_aside,
    store_owners,
)

# Cold start: no typing, dataclasses, json or uuid on the wrapper's path to its server's
# first byte (dataclasses alone pulls inspect/ast/dis: ~10-30 ms on a busy host). Names
# used only in annotations (strings here) are imported for type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from toolwatch.ingest.records import RawBatch
    from toolwatch.ingest.sources.file_tail import LineAssembler

#: Signals forwarded to the wrapped server.
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
#: Bytes of a spool's start searched for the middleware's hello when a collector resumes
#: a spool past it.
HELLO_PROBE_BYTES = 1 << 16
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
        "spool: refusing %s: %s (set aside, never read)", path, reason)


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
        self.fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL
                          | getattr(os, "O_NOFOLLOW", 0), 0o600)
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

    def __init__(self, argv: list[str], env: dict[str, str] | None = None,
                 stderr: int | None = None):
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
                info = os.waitid(os.P_PID, self.proc.pid,
                                 os.WEXITED | os.WNOHANG | os.WNOWAIT)
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
        self.started_at = time.monotonic()

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
class _Entry:
    """One spool being read by a collector."""

    def __init__(self, wid: str, meta: dict[str, Any], fd: int, asm: LineAssembler,
                 lock: Any = None):
        self.wid = wid
        self.meta = meta
        self.fd = fd
        self.asm = asm
        self.lock = lock  # held once the wrapper is gone
        self.done = False
        self.announced = False
        self.trust: Any = None  # toolwatch.ingest.sources.process.StreamTrust
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        #: Truncations seen (salts the stream id of what follows each one).
        self.generation = 0
        #: The server has exited and its wrapper is gone, but another process (a child
        #: the server forked) still holds the spool open for writing: since when.
        self.writers_since: float | None = None
        self._writers_checked = 0.0
        self._writers = False


def _spool_writers(path: Path, dev: int, ino: int) -> bool:
    """Whether a process other than this one has the spool open for writing (Linux).

    Looks through ``/proc/<pid>/fd`` for the spool's inode (a readlink per descriptor,
    a stat and the fdinfo flags only for those naming the spool). A child the server
    forked inherits its stderr and may outlive it; its lines reach the spool after the
    server's exit. Where ``/proc`` is not there (not Linux) there are never writers.
    """
    try:
        pids = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return False
    me = str(os.getpid())
    real = os.path.realpath(path)
    names = (real, real + " (deleted)")
    for pid in pids:
        if pid == me:
            continue
        base = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(base)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{base}/{fd}") not in names:
                    continue
                st = os.stat(f"{base}/{fd}")
                if (st.st_dev, st.st_ino) != (dev, ino):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                    flags = next((int(ln.split()[1], 8) for ln in fh
                                  if ln.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            if flags & 3:  # O_WRONLY or O_RDWR
                return True
    return False


def _trust_of(meta: dict[str, Any], fd: int) -> Any:
    """The trust state of a spool: its run's record key, and whether the middleware's
    hello is already in the spool (a collector resuming past it must still know)."""
    from toolwatch.ingest.sources.process import StreamTrust

    key = None
    text = meta.get("record_key")
    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            key = bytes.fromhex(text)
    trust = StreamTrust(key or None)
    if trust.key is not None:
        with contextlib.suppress(OSError):
            trust.probe(os.pread(fd, HELLO_PROBE_BYTES, 0))
    return trust


class SpoolSource:
    """Read every spool of a store like ``tail`` reads files (collector side).

    A spool is a stream of its own: source ``run:<server name>``, fingerprint of its
    first line salted with the wrapper id, offsets = file offsets, resumed from the
    store's checkpoint. A spool whose wrapper is gone (its lock is free) and whose server
    no longer runs is read to its end, emitted with ``final=True`` (waiting JSON-RPC
    requests are stored unanswered) and reported by :meth:`finished`; the caller removes it
    with :meth:`remove` once that batch is committed.

    Parameters
    ----------
    data_dir
        Store directory.
    checkpoints
        The store's checkpoints (fingerprint -> offset).
    orphans_only
        Only spools whose wrapper is gone (recovery by a process that is not a collector).
    read_bytes, max_line_bytes
        Read size per call; line cut length.
    """

    def __init__(
        self,
        data_dir: str | Path,
        checkpoints: dict[str, int],
        *,
        orphans_only: bool = False,
        read_bytes: int = 4 << 20,
        max_line_bytes: int = 1_048_576,
        writer_grace_s: float = WRITER_GRACE_S,
    ):
        self.dir = spool_dir(data_dir)
        self.checkpoints = checkpoints
        self.orphans_only = orphans_only
        self.read_bytes = read_bytes
        self.max_line_bytes = max_line_bytes
        self.writer_grace_s = writer_grace_s
        self.owners = store_owners(data_dir)
        self.entries: dict[str, _Entry] = {}
        self.new_fingerprints: list[str] = []
        self.bytes_read = 0
        self._finished: list[str] = []
        #: Spool files set aside (name -> reason): never read.
        self.rejected: dict[str, str] = {}
        #: Spools left for a later collector (recovery while a writer still has them).
        self.deferred: set[str] = set()
        #: Truncations or rewrites of a spool noticed (each starts a new stream).
        self.truncations = 0
        #: Bytes of partial lines lost to truncations.
        self.lost_partial_bytes = 0
        self._drain_started: float | None = None
        self._drain_target: dict[str, int] = {}

    def _assembler(self, wid: str, meta: dict[str, Any], generation: int) -> LineAssembler:
        """The line assembler of a spool's ``generation``-th stream (0: before any
        truncation; each truncation starts a stream with an id of its own)."""
        from toolwatch.ingest.sources.file_tail import LineAssembler

        salt = f"spool:{wid}" if not generation else f"spool:{wid}:{generation}"
        return LineAssembler(f"run:{meta.get('name', 'server')}", self.checkpoints,
                             salt=salt.encode(), max_line_bytes=self.max_line_bytes)

    def _reject(self, name: str, reason: str) -> None:
        """Set a spool-directory file aside (moved under ``spool/rejected/``), log it."""
        path = self.dir / name
        self.rejected[name] = reason
        _refused(path, reason)
        set_aside(path, self.dir / REJECTED_DIR)

    def _open(self, wid: str) -> _Entry | None:
        import json


        lock = None
        try:
            meta = json.loads(read_regular(self.dir / f"{wid}.meta", META_MAX_BYTES,
                                           owners=self.owners))
            if not isinstance(meta, dict):
                raise ValueError("meta is not an object")
        except UnsafeFile as exc:
            self._reject(f"{wid}.meta", exc.reason)
            return None
        except (OSError, ValueError):
            # No meta yet: a wrapper writes it right after starting its server. While the
            # wrapper holds its lock, wait for it (the meta names the stream); a wrapper
            # that died before writing it leaves a free lock: read the spool as "server".
            lock = _lock_nb(self.dir / f"{wid}.lock")
            if lock is None:
                return None
            meta = {"name": "server"}
        if self.orphans_only and lock is None:
            lock = _lock_nb(self.dir / f"{wid}.lock")
            if lock is None or _pid_alive(meta.get("child_pid")):
                if lock is not None:
                    lock.close()
                return None
        try:
            # O_NOFOLLOW | O_NONBLOCK, a plain file of ours with one link: a FIFO here
            # hung every collector, a symlink copied any readable file into quarantine.
            fd = open_regular(self.dir / f"{wid}.log", owners=self.owners, single_link=True)
        except UnsafeFile as exc:
            if lock is not None:  # ours (taken just now, or the dead wrapper's): drop it
                (self.dir / f"{wid}.lock").unlink(missing_ok=True)
                lock.close()
            self._reject(f"{wid}.log", exc.reason)
            return None
        except OSError:
            if lock is not None:
                lock.close()
            return None
        asm = self._assembler(wid, meta, 0)
        e = _Entry(wid, meta, fd, asm, lock=lock)
        e.trust = _trust_of(meta, fd)
        return e

    def trust_of(self, source_fp: str) -> Any:
        """The :class:`~toolwatch.ingest.sources.process.StreamTrust` of the spool whose
        stream is ``source_fp`` (None: unknown stream, read as unauthenticated)."""
        for e in self.entries.values():
            if e.asm.fp == source_fp:
                return e.trust
        return None

    def scan(self) -> None:
        """Pick up spools that appeared."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for n in names:
            if not n.endswith(".log"):
                continue
            wid = n[:-4]
            if wid in self.entries or wid in self.deferred:
                continue
            e = self._open(wid)
            if e is not None:
                self.entries[wid] = e

    def _server_gone(self, e: _Entry) -> bool:
        """Whether the wrapper and its server are gone (takes the wrapper's lock if so)."""
        if e.lock is None:
            e.lock = _lock_nb(self.dir / f"{e.wid}.lock")
            if e.lock is None:
                return False
        return not _pid_alive(e.meta.get("child_pid"))

    def _has_writers(self, e: _Entry) -> bool:
        """Whether another process still has the spool open for writing (cached for
        :data:`WRITER_SCAN_INTERVAL_S`)."""
        now = time.monotonic()
        if now - e._writers_checked >= WRITER_SCAN_INTERVAL_S:
            e._writers_checked = now
            e._writers = _spool_writers(self.dir / f"{e.wid}.log", e.dev, e.ino)
            if e._writers and e.writers_since is None:
                e.writers_since = now
        return e._writers

    def _gone(self, e: _Entry) -> bool:
        """Whether every writer of the spool is gone: the wrapper, its server, and any
        child of the server still holding the spool open."""
        return self._server_gone(e) and not self._has_writers(e)

    def _check_rewrite(self, e: _Entry) -> None:
        """A spool truncated or rewritten under the reader starts a new stream from 0.

        A server may truncate its stderr (``ftruncate(2, 0)``); with ``O_APPEND`` its next
        lines go to the new end, below where this reader's file offset points, and were
        never read (51 of 53 calls lost). Detected by size and content
        (:meth:`LineAssembler.rewritten`), looked at only when the size or mtime changed.
        """
        try:
            st = os.fstat(e.fd)
        except OSError:
            return
        changed = (st.st_size, st.st_mtime_ns) != (e.size, e.mtime_ns)
        e.size, e.mtime_ns = st.st_size, st.st_mtime_ns
        if not changed or not e.asm.rewritten(e.fd, st.st_size):
            return
        self.truncations += 1
        self.lost_partial_bytes += len(e.asm.buf)
        e.generation += 1
        e.asm = self._assembler(e.wid, e.meta, e.generation)
        e.announced = False
        os.lseek(e.fd, 0, os.SEEK_SET)
        if e.wid in self._drain_target:  # a final pass reads what the new stream holds
            self._drain_target[e.wid] = st.st_size

    def _read(self, e: _Entry, budget: int) -> Iterator[RawBatch]:
        """Up to ``budget`` bytes of ``e`` as batches; long lines cut as they grow."""
        left = budget
        while left > 0:
            if not e.asm.fp:
                # A checkpoint beyond the end names a stream that was truncated since.
                e.asm.size_hint = e.size
            try:
                data = os.read(e.fd, min(self.read_bytes, left))
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                data = b""
            if not data:
                return
            left -= len(data)
            self.bytes_read += len(data)
            b = e.asm.feed(data)
            self._announce(e)
            if b is not None and len(b):
                yield b
            # Cut an over-long line as it grows, not after the budget: a 500 MiB line
            # was held whole and its checkpoint never moved (collect --once stuck at 64 MiB).
            cut = e.asm.cut_long_line()
            if cut is not None:
                yield cut

    def poll(self, budget: int = 64 << 20) -> Iterator[RawBatch]:
        """Batches of complete lines appended to the spools since the last call.

        A spool whose wrapper, server and every other writer are gone is read to its
        end (any size, in ``budget`` steps between which the caller flushes) and
        finished; one whose server has exited while a child still writes is read on
        (a recovery, ``orphans_only``, leaves it to a later collector instead).
        """
        self.scan()
        for e in list(self.entries.values()):
            if e.done:
                continue
            self._check_rewrite(e)
            before = self.bytes_read
            yield from self._read(e, budget)
            if self.bytes_read - before >= budget:
                continue  # more to read: the next poll goes on
            cut = e.asm.cut_long_line()
            if cut is not None:
                yield cut
            if not self._server_gone(e):
                continue
            if self._has_writers(e):
                if self.orphans_only:
                    self._defer(e)  # its checkpoint covers what was read
                continue
            # Gone: whatever reached the file is all there will be.
            while True:
                got = self.bytes_read
                yield from self._read(e, self.read_bytes)
                if self.bytes_read == got:
                    break
            b = e.asm.feed(b"", final=True)
            self._announce(e)
            e.done = True
            self._finished.append(e.wid)
            if b is not None and (len(b) or b.final):
                yield b

    def _defer(self, e: _Entry) -> None:
        """Stop reading ``e`` in this process; a later collector resumes it."""
        self.entries.pop(e.wid, None)
        self.deferred.add(e.wid)
        with contextlib.suppress(OSError):
            os.close(e.fd)
        if e.lock is not None:
            e.lock.close()

    def draining(self) -> bool:
        """After a stop: whether the final pass has more to read before it may end.

        True while a spool holds bytes that were there when the drain began (a wrapper's
        final pass, ``collect --once``: the whole spool, not one 64 MiB step), and, for up
        to ``writer_grace_s``, while a spool whose server exited is still held open for
        writing by a child of it. Past the grace the rest stays for the next collector.
        """
        now = time.monotonic()
        if self._drain_started is None:
            self._drain_started = now
            for e in self.entries.values():
                with contextlib.suppress(OSError):
                    self._drain_target[e.wid] = os.fstat(e.fd).st_size
        for e in self.entries.values():
            if e.done:
                continue
            target = self._drain_target.get(e.wid)
            if target is None:  # appeared during the drain
                with contextlib.suppress(OSError):
                    target = self._drain_target[e.wid] = os.fstat(e.fd).st_size
            if target is not None and e.asm.read_offset < target:
                return True
            if (now - self._drain_started < self.writer_grace_s
                    and self._server_gone(e) and self._has_writers(e)):
                return True
        return False

    def _announce(self, e: _Entry) -> None:
        if not e.announced and e.asm.fp is not None:
            e.announced = True
            if e.asm.resumed_from > 0:
                self.new_fingerprints.append(e.asm.fp)

    def finished(self) -> list[str]:
        """Wrapper ids whose last batch has been emitted (remove after the commit)."""
        return list(self._finished)

    def remove(self, wids: list[str]) -> None:
        """Delete committed, finished spools."""
        for wid in wids:
            e = self.entries.pop(wid, None)
            with contextlib.suppress(ValueError):
                self._finished.remove(wid)
            for suffix in (".log", ".meta"):
                (self.dir / f"{wid}{suffix}").unlink(missing_ok=True)
            (self.dir / f"{wid}.lock").unlink(missing_ok=True)
            if e is not None:
                with contextlib.suppress(OSError):
                    os.close(e.fd)
                if e.lock is not None:
                    e.lock.close()

    def live_count(self) -> int:
        """Spools being read whose wrapper still runs."""
        return sum(1 for e in self.entries.values() if not e.done)

    def lag_bytes(self) -> int:
        """Bytes in the spools not yet read."""
        n = 0
        for e in self.entries.values():
            with contextlib.suppress(OSError):
                n += max(0, os.fstat(e.fd).st_size - e.asm.read_offset)
        return n

    def close(self) -> None:
        """Close every spool (they stay for the next collector)."""
        for e in self.entries.values():
            with contextlib.suppress(OSError):
                os.close(e.fd)
            if e.lock is not None:
                e.lock.close()
        self.entries.clear()


def pending_spools(data_dir: str | Path) -> list[dict[str, Any]]:
    """Spools on a store: wrapper id, bytes, whether its wrapper still runs (``status``)."""
    import json

    d = spool_dir(data_dir)
    out: list[dict[str, Any]] = []
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.log")):
        wid = p.stem
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if not stat_is_regular(st):
            # Planted (a FIFO, a symlink): never opened here; listed as orphaned so the
            # next writing command's recovery sets it aside (SpoolSource._reject).
            out.append({"wid": wid, "name": "", "bytes": 0, "wrapper_alive": False,
                        "server_pid": None, "orphaned": True, "planted": True})
            continue
        try:
            meta = json.loads(read_regular(d / f"{wid}.meta", META_MAX_BYTES))
        except (OSError, ValueError):
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
        lock = _lock_nb(d / f"{wid}.lock")
        alive = lock is None
        if lock is not None:
            lock.close()
        with contextlib.suppress(OSError):
            out.append({
                "wid": wid,
                "name": meta.get("name", ""),
                "bytes": st.st_size,
                "wrapper_alive": alive,
                "server_pid": meta.get("child_pid"),
                "orphaned": not alive and not _pid_alive(meta.get("child_pid")),
            })
    return out


def has_orphans(data_dir: str | Path) -> bool:
    """Whether any spool waits for ingestion with its wrapper gone (cheap check)."""
    return any(s["orphaned"] for s in pending_spools(data_dir))


def recover_orphans(config: Any) -> int:
    """Ingest spools of dead wrappers (``ingest``/``analyze`` call this on opening the store).

    A directory listing when there is nothing to do; the live engine is imported only
    when an orphaned spool exists. Returns the number of orphaned spools found.
    """
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
        value = store.get("data_dir", DEFAULT_DATA_DIR) if isinstance(store, dict) else (
            DEFAULT_DATA_DIR)
        return value if isinstance(value, str) else None
    return env_dir or DEFAULT_DATA_DIR


#: Commands whose process lives long beside a production server (``ingest`` only with
#: ``--follow``): their allocators are tuned to hand freed memory back (:func:`tune_memory`).
LIVE_COMMANDS = frozenset({"tail", "collect", "kafka", "run"})

#: jemalloc options of polars' allocator in a live process: freed pages go back to the OS
#: after 250 ms (jemalloc's default keeps them ~10 s, polars' own default 0.5 s + 1 s
#: muzzy), a background thread does the purging, so an idle process shrinks too, and one
#: arena instead of 4 per core (polars' worker threads, the reader and the commit thread
#: each filled an arena of their own with the same micro-batch-sized blocks). Without it a
#: live process keeps the high-water mark of the last detection passes. Decay 0 (return
#: at once) measured the least memory but costs ~25% throughput (every micro-batch's
#: buffers page-fault back in); 250 ms keeps a micro-batch's worth for the next one.
#: The hour of log time at 10k events/s as a backlog (docs/performance.md "Live memory",
#: session 7): decay 250 peak 483 / VmHWM 494 MiB at 85.6k events/s; decay 0 447 / 470
#: at 66.3k; polars' defaults (untuned) 525 / 531 at ~78k.
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:250,muzzy_decay_ms:0,narenas:1"

#: glibc malloc arenas in a live process (default: 8 per core). Arrow buffers that DuckDB
#: exports (every parsed micro-batch) are glibc-allocated on the parser threads; each
#: arena keeps its own free memory.
MALLOC_ARENAS = 2

#: Seconds between two ``malloc_trim(0)`` (and Arrow pool releases) in a live process.
TRIM_INTERVAL_S = 5.0

_M_ARENA_MAX = -8  # glibc mallopt parameter

#: Dirty/muzzy decay (ms) set on DuckDB's own jemalloc in a live process (its default is
#: 1000 with no background thread, so what the parser connection freed stays resident
#: until later allocations let it decay: measured 25-58 MiB resident for ~2 MiB in use
#: between micro-batches at 10k events/s). 0: freed pages go back at once.
DUCKDB_DECAY_MS = 0

_ARENAS_ALL = 4096  # jemalloc's MALLCTL_ARENAS_ALL


def _duckdb_mallctl() -> Any:
    """``duckdb_je_mallctl`` of the loaded DuckDB module (its bundled jemalloc), or None."""
    mod = sys.modules.get("_duckdb")
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(path).duckdb_je_mallctl
    except (OSError, AttributeError):  # a DuckDB built without jemalloc (macOS, musl)
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def tune_duckdb_allocator(decay_ms: int = DUCKDB_DECAY_MS) -> bool:
    """Make DuckDB's bundled jemalloc return freed pages after ``decay_ms`` (all arenas).

    DuckDB (Linux wheels) allocates through a jemalloc of its own, configured when it
    loads (decay 1000 ms, no background thread, so decay only advances while DuckDB
    allocates); ``_RJEM_MALLOC_CONF`` is polars' and does not reach it. Its options
    can be changed at run time through ``duckdb_je_mallctl``: the default for new arenas
    (``arenas.*_decay_ms``) and each existing arena's (``arena.<i>.*_decay_ms``), then
    one purge of what it holds. Call after ``import duckdb``.

    Returns
    -------
    bool
        Whether DuckDB's jemalloc was found and set.
    """
    fn = _duckdb_mallctl()
    if fn is None:
        return False
    import ctypes

    val = ctypes.c_ssize_t(decay_ms)
    size = ctypes.sizeof(val)
    ok = True
    for kind in ("dirty", "muzzy"):
        ok &= fn(f"arenas.{kind}_decay_ms".encode(), None, None, ctypes.byref(val), size) == 0
    n = ctypes.c_uint(0)
    nsz = ctypes.c_size_t(ctypes.sizeof(n))
    if fn(b"arenas.narenas", ctypes.byref(n), ctypes.byref(nsz), None, 0) == 0:
        for i in range(n.value):
            for kind in ("dirty", "muzzy"):
                # Arenas not initialized yet answer an error: they take arenas.* above.
                fn(f"arena.{i}.{kind}_decay_ms".encode(), None, None, ctypes.byref(val), size)
    fn(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, 0)
    return bool(ok)


#: In a live process with detection, allocations of at least this many bytes get pages of
#: their own (:func:`fix_mmap_threshold`).
MMAP_THRESHOLD = 256 << 10

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Give large heap blocks pages of their own, returned to the OS when freed (glibc).

    glibc serves blocks above its mmap threshold with ``mmap`` and unmaps them on
    ``free``; the threshold is *dynamic*, rising to the size of the largest mmapped block
    freed (up to 32 MiB). A live process frees multi-MiB buffers every micro-batch (numpy
    arrays and Python buffers of a detection pass, a fetch answer's bytes), so after the
    first ones the threshold sits high, these blocks are carved from the heap, and their
    pages stay resident after ``free`` until the next ``malloc_trim``. The probe of a
    1-hour backlog found the highest RSS samples inside a detection pass with 59 MiB of
    glibc heap free but resident. A fixed threshold keeps such blocks mmapped (1M-event
    backlog, interleaved: p95 RSS 416 vs 459 MiB, the same speed;
    docs/performance.md, Live memory).

    Skipped when ``MALLOC_MMAP_THRESHOLD_`` is set (the user's choice), when
    ``TOOLWATCH_MEMORY_TUNING=0``, and where the C library is not glibc. Process-wide:
    called by the live commands when they detect.

    Returns
    -------
    bool
        Whether the threshold was set.
    """
    if (os.environ.get("TOOLWATCH_MEMORY_TUNING", "1") == "0"
            or "MALLOC_MMAP_THRESHOLD_" in os.environ):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):  # not glibc
        return False


_LIBC_TRIM: Any = None


def release_memory() -> None:
    """Return freed heap memory to the OS now: glibc's free pages, Arrow's unused pool.

    What the periodic trimmer of :func:`tune_memory` does every :data:`TRIM_INTERVAL_S`;
    the live memory gate (:mod:`toolwatch.live.memgate`) calls it between two heavy phases
    that take turns, so the second starts from what the first freed. ~1-5 ms.
    """
    global _LIBC_TRIM
    if _LIBC_TRIM is None:
        try:
            import ctypes

            _LIBC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _LIBC_TRIM = False
    with contextlib.suppress(Exception):
        if _LIBC_TRIM:
            _LIBC_TRIM(0)
        pa = sys.modules.get("pyarrow")
        if pa is not None:
            pa.default_memory_pool().release_unused()


#: What ``import polars`` writes into ``_RJEM_MALLOC_CONF`` (its own default, prepended to
#: any value there). A child process of a Python program that imported polars (a
#: supervisor, a notebook, a test or benchmark harness) inherits it: it is polars'
#: setting, not the user's, and must not switch the live tuning off.
POLARS_JEMALLOC_DEFAULT = "dirty_decay_ms:500,muzzy_decay_ms:1000"


def _user_jemalloc_conf(value: str) -> bool:
    """Whether ``_RJEM_MALLOC_CONF`` holds anything beyond polars' own default(s)."""
    rest = value.replace(POLARS_JEMALLOC_DEFAULT, "")
    return any(part.strip() for part in rest.split(","))


def tune_memory(argv: list[str]) -> bool:
    """Allocator settings for a live process; must run before polars/pyarrow are imported.

    A live process (``tail``, ``collect``, ``kafka``, ``run``, ``ingest --follow``)
    allocates and frees a micro-batch's worth of memory every flush through three
    allocators: polars' jemalloc, glibc malloc (Arrow data exported by DuckDB, numpy) and
    Arrow's mimalloc pool. Left at their defaults each keeps what it freed for reuse, and
    the process sits at the sum of their high-water marks. This sets
    ``_RJEM_MALLOC_CONF`` (:data:`JEMALLOC_CONF`, read by polars' jemalloc at its first
    allocation, hence before ``import polars``), caps glibc's arenas
    (:data:`MALLOC_ARENAS`) and starts a daemon thread that returns free heap pages
    (``malloc_trim``) and Arrow's unused pool memory every :data:`TRIM_INTERVAL_S`.

    Settings a user made win: an existing ``_RJEM_MALLOC_CONF`` or ``MALLOC_ARENA_MAX``
    is left alone (but not the value ``import polars`` leaves in the environment of a
    parent process, :data:`POLARS_JEMALLOC_DEFAULT`, which every child inherits);
    ``TOOLWATCH_MEMORY_TUNING=0`` turns all of it off. Other commands (``analyze``,
    ``ingest`` of files) are batch jobs and keep the allocators' defaults.

    Returns
    -------
    bool
        Whether the settings were applied.
    """
    if os.environ.get("TOOLWATCH_MEMORY_TUNING", "1") == "0" or not argv:
        return False
    cmd = argv[0]
    if cmd not in LIVE_COMMANDS and not (cmd == "ingest" and "--follow" in argv):
        return False
    if not _user_jemalloc_conf(os.environ.get("_RJEM_MALLOC_CONF", "")):
        os.environ["_RJEM_MALLOC_CONF"] = JEMALLOC_CONF
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if "MALLOC_ARENA_MAX" not in os.environ:
            libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): jemalloc settings only
        return True

    def trimmer() -> None:
        duck_done = False
        started = time.monotonic()
        next_trim = started + TRIM_INTERVAL_S
        while True:
            # Until DuckDB is loaded, look every 0.1 s: a backlog's first parses and its
            # first detection (the process's first RSS peak, ~3-4 s after start) must
            # find DuckDB's allocator already returning what it frees (it held 30+ MiB
            # resident for ~2 MiB in use at that peak when it was tuned after 5 s).
            # (A process that has not loaded it within 30 s looks at trim times only.)
            now = time.monotonic()
            soon = not duck_done and now - started < 30.0
            time.sleep(0.1 if soon else max(0.0, next_trim - now))
            if not duck_done and "_duckdb" in sys.modules:
                duck_done = True
                with contextlib.suppress(Exception):
                    tune_duckdb_allocator()
            if time.monotonic() < next_trim:
                continue
            next_trim = time.monotonic() + TRIM_INTERVAL_S
            with contextlib.suppress(Exception):
                trim(0)
                pa = sys.modules.get("pyarrow")
                if pa is not None:
                    pa.default_memory_pool().release_unused()

    threading.Thread(target=trimmer, name="toolwatch-trim", daemon=True).start()
    return True


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
