"""An S3-compatible endpoint for tests: moto's standalone server on loopback.

Object storage is outside this machine in production; moto's server speaks the S3 wire
protocol (signed requests, conditional puts, listings), so delta-rs and pyarrow talk to
it exactly as to S3. Each server keeps its buckets in memory and is gone when it stops.

Usage::

    with S3Server() as s3:
        s3.create_bucket("bkt")
        env = {**os.environ, **s3.env()}   # credentials and endpoint for a child
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from types import TracebackType

import pytest

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's server on a free loopback port (a real process, the S3 protocol)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> S3Server:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self._proc.returncode}")
            try:
                socket.create_connection((HOST, self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.1)
        self._proc.kill()
        raise RuntimeError("moto server did not start within 60 s")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)

    def env(self) -> dict[str, str]:
        """Environment of a process using this endpoint (test credentials)."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            # botocore/pyarrow must not look for real profiles or instance metadata.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def create_bucket(self, name: str) -> None:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(
            endpoint_override=f"{HOST}:{self.port}", scheme="http", access_key="testing",
            secret_key="testing", region="us-east-1", allow_bucket_creation=True,
        )
        fs.create_dir(name)


@pytest.fixture(scope="session")
def s3_server() -> S3Server:  # type: ignore[misc]
    """A running moto S3 server for the session."""
    with S3Server() as s3:
        yield s3
