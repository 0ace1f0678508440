"""Arrow arrays built without ``pyarrow.array``.

``pa.array``, ``pa.scalar``, ``pa.repeat`` and ``Schema.empty_table`` ask pyarrow's pandas
shim whether their input is a pandas object, and the first such question imports pandas:
~0.18 s of one core, paid by every ``toolwatch ingest``/``analyze`` process on its first
batch, while the other parse worker waits on the import lock. Nothing on the ingest path
needs pandas, so the hot path builds its arrays from buffers with these helpers instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_STRING = pa.string()

_NUMERIC = {
    np.dtype(np.int32): pa.int32(),
    np.dtype(np.int64): pa.int64(),
    np.dtype(np.float64): pa.float64(),
}


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    """Arrow validity bitmap (LSB first) of a boolean mask; None when nothing is null."""
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def from_numpy(values: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """Zero-copy Arrow array over a 1-d int32/int64/float64 numpy array (no nulls).

    ``type`` may reinterpret the 8-byte values (e.g. ``pa.timestamp("us", tz="UTC")``
    over int64 microseconds).
    """
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype not in _NUMERIC:
        raise TypeError(f"from_numpy: unsupported array {values.dtype}[{values.ndim}-d]")
    arrow_type = type or _NUMERIC[values.dtype]
    if arrow_type.bit_width != values.dtype.itemsize * 8:
        raise TypeError(f"from_numpy: {values.dtype} cannot be read as {arrow_type}")
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def strings(values: Sequence[str | bytes | None], type: pa.DataType = _STRING) -> pa.Array:
    """A string/binary array (``pa.string()``, ``large_string``, ``binary``,
    ``large_binary``) from Python values; ``None`` is null. Strings are UTF-8 encoded."""
    large = type in (pa.large_string(), pa.large_binary())
    encoded = [v.encode() if isinstance(v, str) else (v or b"") for v in values]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(encoded))
    return pa.Array.from_buffers(
        type,
        len(encoded),
        [_validity(valid), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
    )


def repeat(value: str, n: int, type: pa.DataType = _STRING) -> pa.Array:
    """``value`` repeated ``n`` times as a string array."""
    return strings([value], type).take(from_numpy(np.zeros(n, dtype=np.int32)))


def masked(values: pa.Array, at: np.ndarray) -> pa.Array:
    """``values`` taken at int64 positions ``at``; a negative position gives null."""
    indices = pa.Array.from_buffers(
        pa.int64(), len(at), [_validity(at >= 0), pa.py_buffer(np.maximum(at, 0))]
    )
    return values.take(indices)


def empty(schema: pa.Schema) -> pa.Table:
    """A table with no rows and this schema."""
    return pa.Table.from_batches([], schema)


def scalar(value: str, type: pa.DataType = _STRING) -> pa.Scalar:
    """A string scalar, for compute kernels (a bare ``str`` argument goes through
    ``pa.scalar``)."""
    return strings([value], type)[0]


def to_numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A fixed-width numeric Arrow array without nulls as numpy (zero-copy for one chunk)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    dtype = np.dtype(values.type.to_pandas_dtype())
    if any(c.null_count for c in chunks):
        raise ValueError("to_numpy: array has nulls")
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype)[c.offset : c.offset + len(c)]
        for c in chunks
        if len(c)
    ]
    if not parts:
        return np.empty(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
