"""The unit of work between sources and transforms: a batch of raw lines."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from toolwatch.ingest import arrays

NEWLINE = 10


@dataclass
class RawBatch:
    """Raw log lines from one stream, in order.

    Attributes
    ----------
    source
        Human-readable origin shown in quarantine and errors (path, ``stdin``, ``kafka:t/0``).
    source_fp
        Stable identity of the stream: event ids and checkpoints are keyed by it.
    lines
        Line bytes *including* their trailing newline (as they sit in the source buffer,
        so no per-line copy is made). Kafka messages carry none.
    offsets
        Byte offset of each line's first byte in the stream (Kafka: message offset).
    line_nos
        1-based line numbers, or null for message-based sources.
    end_offset
        Offset to resume from once this batch is stored (the checkpoint).
    final
        True when the stream has ended (EOF of a file): pending state must be flushed.
    sizes
        Byte size of each line in the stream (with its newline) when the source cut some
        over-long line to a prefix while reading; ``None``: each line is whole.
    fps
        Stream fingerprint of each line when the batch joins several streams to be parsed
        in one go (:func:`join_streams`); ``None``: every line is ``source_fp``'s. Only
        the parser reads it (event ids); the stateful transforms take one stream at a time.
    """

    source: str
    source_fp: str
    lines: pa.LargeBinaryArray
    offsets: np.ndarray
    line_nos: np.ndarray | None
    end_offset: int
    final: bool = False
    sizes: np.ndarray | None = None
    fps: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.lines)


def slice_batch(batch: RawBatch, start: int, stop: int) -> RawBatch:
    """Lines ``start:stop`` of ``batch`` as a batch of their own (no copy of the bytes).

    A part that is not the batch's end resumes at the next part's first line and is not
    final; the last part keeps the batch's end offset and ``final`` flag. Used to redo a
    failed batch in halves, down to the line that made it fail.
    """
    last = stop >= len(batch)
    return dataclasses.replace(
        batch,
        lines=batch.lines.slice(start, stop - start),
        offsets=batch.offsets[start:stop],
        line_nos=None if batch.line_nos is None else batch.line_nos[start:stop],
        sizes=None if batch.sizes is None else batch.sizes[start:stop],
        fps=None if batch.fps is None else batch.fps.slice(start, stop - start),
        end_offset=batch.end_offset if last else int(batch.offsets[stop]),
        final=batch.final and last,
    )


def _whole_sizes(b: RawBatch) -> np.ndarray:
    """Byte size of each line of ``b`` (its ``sizes``, else the lengths of its lines)."""
    if b.sizes is not None:
        return np.asarray(b.sizes, dtype=np.int64)
    lines = b.lines
    offs = np.frombuffer(lines.buffers()[1], dtype=np.int64)[
        lines.offset : lines.offset + len(lines) + 1
    ]
    return np.diff(offs)


def join_streams(streams: list[list[RawBatch]]) -> tuple[RawBatch, list[RawBatch]]:
    """One batch holding every line of several streams, and each stream's part of it.

    ``streams``: per stream, its consecutive batches (one stream per list, each list
    non-empty, all of one kind: every batch with ``line_nos`` or none). The lines are
    copied once into one buffer; the joined batch carries each line's stream in
    ``fps``, so ONE parse (one DuckDB statement, one scan) serves every stream, and the
    per-stream batches are zero-copy slices of it, in the same order, each with its
    own offsets, end offset and ``final`` flag for the stateful transforms.

    Returns
    -------
    (joined, parts)
        ``joined``: lines of ``parts[0]``, then ``parts[1]`` ... (``source_fp`` and
        ``source`` are the first stream's; ``end_offset`` -1: it is never a checkpoint).
    """
    flat = [b for bl in streams for b in bl]
    with_nos = flat[0].line_nos is not None
    if any((b.line_nos is not None) != with_nos for b in flat):
        raise ValueError("join_streams: batches with and without line numbers")
    lines = pa.concat_arrays([b.lines for b in flat]) if len(flat) > 1 else flat[0].lines
    sized = any(b.sizes is not None for b in flat)
    parts: list[RawBatch] = []
    fps: list[pa.Array] = []
    start = 0
    for bl in streams:
        first, last = bl[0], bl[-1]
        n = sum(len(b) for b in bl)
        parts.append(RawBatch(
            source=last.source,
            source_fp=first.source_fp,
            lines=lines.slice(start, n),  # type: ignore[arg-type]
            offsets=np.concatenate([b.offsets for b in bl]) if len(bl) > 1 else bl[0].offsets,
            line_nos=(np.concatenate([b.line_nos for b in bl])  # type: ignore[misc]
                      if with_nos else None),
            end_offset=last.end_offset,
            final=last.final,
            sizes=np.concatenate([_whole_sizes(b) for b in bl]) if sized else None,
        ))
        fps.append(arrays.repeat(first.source_fp, n))
        start += n
    joined = RawBatch(
        source=parts[0].source,
        source_fp=parts[0].source_fp,
        lines=lines,
        offsets=np.concatenate([p.offsets for p in parts]),
        line_nos=np.concatenate([p.line_nos for p in parts])  # type: ignore[misc]
        if with_nos else None,
        end_offset=-1,
        sizes=np.concatenate([p.sizes for p in parts]) if sized else None,  # type: ignore[misc]
        fps=pa.concat_arrays(fps) if len(fps) > 1 else fps[0],
    )
    return joined, parts


def split_lines(buf: bytes, base_offset: int = 0) -> tuple[pa.LargeBinaryArray, np.ndarray, int]:
    """Split a buffer into complete lines without copying their bytes.

    Returns
    -------
    (lines, offsets, consumed)
        ``lines`` shares ``buf``'s memory (each element keeps its ``\\n``); ``offsets`` are
        stream offsets of each line; ``consumed`` is how many bytes of ``buf`` form complete
        lines — the rest is a partial last line that must wait for its newline.
    """
    view = np.frombuffer(buf, dtype=np.uint8)
    # Scanned 1 MiB at a time: a mask over a whole 16 MiB chunk takes 16 MiB of fresh
    # pages from the kernel for every batch (the page faults cost more than the scan).
    step = 1 << 20
    parts = [np.flatnonzero(view[i : i + step] == NEWLINE) + i for i in range(0, len(view), step)]
    nl = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    n = len(nl)
    starts = np.empty(n + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:] = nl + 1
    consumed = int(starts[-1])
    arr = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(starts), pa.py_buffer(buf)]
    )
    return arr, starts[:-1] + base_offset, consumed


def fingerprint(first_line: bytes) -> str:
    """Identity of a stream from its first complete line (like Vector's checksum mode).

    The same log read through another path, a ``.gz`` copy or after a rename keeps its
    identity, so re-ingesting it is skipped and a tailed file is followed across rotation.
    """
    return hashlib.blake2b(first_line.rstrip(b"\r\n"), digest_size=8).hexdigest()
