"""toolwatch detectors: flag enumeration, bulk extraction, credential stuffing and scraping
loops with explainable rules, and anything else unusual with an isolation forest.

Public API
----------
``run_batch(events, summaries, config, *, history=None, model_path=None, now=None)``
    Alerts (``toolwatch.schema.ALERTS`` columns) for a batch; :func:`detect` returns the
    same plus suppressed alerts, per-detector scores and timings.
``train(events, summaries, config, model_path)``
    Fit the isolation forest on history and save it with skops.
``IncrementalDetector``
    Live mode over micro-batches, same alert ids as batch.
``DetectorsConfig``
    The ``[detectors]`` config table.
``REGISTRY``
    Detector name → class; every registered detector runs and is contract-tested.

See ``docs/detectors.md``.
"""

from __future__ import annotations

from detectors.alerts import ALERT_COLUMNS, alert_id
from detectors.base import Detector, FeatureSet
from detectors.config import CATEGORIES, DetectorsConfig
from detectors.pipeline import DetectResult, IncrementalDetector, detect, run_batch, train
from detectors.registry import REGISTRY

__all__ = [
    "ALERT_COLUMNS",
    "CATEGORIES",
    "REGISTRY",
    "DetectResult",
    "Detector",
    "DetectorsConfig",
    "FeatureSet",
    "IncrementalDetector",
    "alert_id",
    "detect",
    "run_batch",
    "train",
]
