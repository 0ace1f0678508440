"""Source ``stdin``: a pipe of log lines (``toolwatch ingest -``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import BinaryIO

from toolwatch.ingest.records import RawBatch
from toolwatch.ingest.sources.file import StreamReader


class StdinSource:
    """Read standard input to EOF in chunks.

    Parameters
    ----------
    chunk_bytes
        Read size.
    checkpoints
        Already-stored offsets per stream fingerprint (a re-piped log is skipped).
    stream
        Defaults to ``sys.stdin.buffer``; injectable for wrappers.
    max_line_bytes
        Over-long lines are cut while read (see
        :class:`~toolwatch.ingest.sources.file.StreamReader`).
    """

    def __init__(
        self,
        chunk_bytes: int,
        checkpoints: dict[str, int],
        stream: BinaryIO | None = None,
        max_line_bytes: int | None = None,
    ):
        self.chunk_bytes = chunk_bytes
        self.checkpoints = checkpoints
        self.max_line_bytes = max_line_bytes
        self.stream = stream if stream is not None else sys.stdin.buffer
        self.size = 0

    def batches(self) -> Iterator[RawBatch]:
        """Yield stdin's lines in batches."""
        self.reader = StreamReader(
            self.stream, "stdin", self.chunk_bytes, self.checkpoints, self.max_line_bytes
        )
        yield from self.reader.batches()

    def progress(self) -> int:
        """Bytes read so far."""
        r = getattr(self, "reader", None)
        return r.bytes_read if r else 0
