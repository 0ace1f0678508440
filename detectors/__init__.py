"""toolwatch detectors: flag enumeration, bulk extraction, credential stuffing and scraping
loops with explainable rules, and anything else unusual with an isolation forest.

Public API
----------
``run_batch(events, summaries, config, *, history=None, model_path=None, now=None)``
    Alerts (``toolwatch.schema.ALERTS`` columns) for a batch; :func:`detect` returns the
    same plus suppressed alerts, per-detector scores and timings.
``train(events, summaries, config, model_path)``
    Fit the isolation forest on history and save it with skops.
``StreamDetector``
    The engine over a stream (what every live command runs): window, alert tracker,
    micro-batch ``update``; same alert ids as batch.
``DetectorsConfig``
    The ``[detectors]`` config table.
``REGISTRY``
    Detector name → class; every registered detector runs and is contract-tested.

See ``docs/detectors.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolwatch.detectors.alerts import ALERT_COLUMNS, alert_id
    from toolwatch.detectors.base import Detector, FeatureSet
    from toolwatch.detectors.config import CATEGORIES, DetectorsConfig
    from toolwatch.detectors.pipeline import (
        DetectResult,
        detect,
        run_batch,
        train,
    )
    from toolwatch.detectors.registry import REGISTRY
    from toolwatch.detectors.stream import StreamDetector

#: Public name -> module defining it. Imported on first use (PEP 562), so that importing a
#: light submodule — ``detectors.config`` for CATEGORIES / SEVERITIES in the CLI's and the
#: live engine's start-up path — does not pull polars and every detector in.
_LAZY = {
    "ALERT_COLUMNS": "toolwatch.detectors.alerts",
    "alert_id": "toolwatch.detectors.alerts",
    "Detector": "toolwatch.detectors.base",
    "FeatureSet": "toolwatch.detectors.base",
    "CATEGORIES": "toolwatch.detectors.config",
    "DetectorsConfig": "toolwatch.detectors.config",
    "DetectResult": "toolwatch.detectors.pipeline",
    "detect": "toolwatch.detectors.pipeline",
    "run_batch": "toolwatch.detectors.pipeline",
    "train": "toolwatch.detectors.pipeline",
    "REGISTRY": "toolwatch.detectors.registry",
    "StreamDetector": "toolwatch.detectors.stream",
}


def __getattr__(name: str) -> Any:
    """Public names and submodules (``detectors.features`` …), imported on first use."""
    mod = _LAZY.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(mod), name)
    else:
        try:
            value = importlib.import_module(f"toolwatch.detectors.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"toolwatch.detectors.{name}":
                raise
            raise AttributeError(f"module 'detectors' has no attribute {name!r}") from None
    globals()[name] = value
    return value


__all__ = [
    "ALERT_COLUMNS",
    "CATEGORIES",
    "REGISTRY",
    "DetectResult",
    "Detector",
    "DetectorsConfig",
    "FeatureSet",
    "StreamDetector",
    "alert_id",
    "detect",
    "run_batch",
    "train",
]
