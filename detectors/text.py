"""Formatting helpers for reasons: plain sentences with real numbers."""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from typing import Any


def duration(seconds: float | None) -> str:
    """Human duration: ``45 s``, ``4 min``, ``3.1 h``, ``2.0 days``."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "an unknown time"
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def span_us(first: int | None, last: int | None) -> float | None:
    """Seconds between two µs timestamps."""
    if first is None or last is None:
        return None
    return (last - first) / 1e6


def pct(x: float | None) -> str:
    """``0.923`` → ``92%``."""
    return f"{(x or 0.0) * 100:.0f}%"


def size(n: float | None) -> str:
    """Bytes in SI units: ``512 B``, ``4.2 MB``."""
    v = float(n or 0)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1000 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1000
    return f"{v:.1f} TB"  # pragma: no cover


def num(x: float | None) -> str:
    """Compact number: integers as such, others with 1-2 significant decimals."""
    if x is None:
        return "?"
    v = float(x)
    if v.is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def iso(us: int | None) -> str | None:
    """µs since epoch → ISO-8601 UTC with ``Z``."""
    if us is None:
        return None
    return _iso(us)


@functools.lru_cache(maxsize=8192)
def _iso(us: int) -> str:
    # Alert ids and window evidence format the same hop-aligned window starts for many
    # alerts of a pass (and of every pass): a pure function of an int, memoized.
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clean(d: dict[str, Any]) -> dict[str, Any]:
    """Evidence dict with NaN/None dropped and floats rounded for readability."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if v is None:
            continue
        if isinstance(v, float):
            if math.isnan(v) or math.isinf(v):
                continue
            v = round(v, 4)
        out[k] = v
    return out
