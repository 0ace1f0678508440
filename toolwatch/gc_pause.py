"""Pausing Python's garbage collector for batch commands.

``toolwatch ingest`` and ``analyze`` hold ~60k long-lived objects (the modules of polars,
pyarrow, duckdb, scikit-learn) and make almost no reference cycles. Automatic collections,
triggered by allocation counts rather than memory, walked all of those objects with the
GIL held, stalling the pipeline's threads, and ran dozens of times while the modules
themselves were imported.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_depth = 0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic garbage collection inside (nests; main thread only).

    Objects that exist on entry are frozen (``gc.freeze``), so an explicit
    ``gc.collect()`` inside — ``ingest`` runs one every 32 batches — only walks what was
    made since. Measured on 1M events: freezing alone 6-12% less CPU, turning automatic
    collection off another ~3%, and ~0.05 s less start-up while the big modules import.
    """
    global _depth
    _depth += 1
    if _depth > 1:
        try:
            yield
        finally:
            _depth -= 1
        return
    gc.freeze()
    automatic = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _depth -= 1
        if automatic:
            gc.enable()
        gc.unfreeze()
