"""Registry of detectors: name → class. ``run_batch`` runs every enabled one.

Add a detector by subclassing :class:`toolwatch.detectors.base.Detector` and listing it here; the
contract test (``tests/test_detectors_contract.py``) then checks it automatically.
"""

from __future__ import annotations

from toolwatch.detectors.base import Detector
from toolwatch.detectors.bulk import BulkExtractionDetector
from toolwatch.detectors.concurrency import ConcurrencyAbuseDetector, RaceConditionDetector
from toolwatch.detectors.config import DetectorsConfig
from toolwatch.detectors.credential import CredentialStuffingDetector
from toolwatch.detectors.enumeration import EnumerationDetector
from toolwatch.detectors.forest import IsolationForestDetector
from toolwatch.detectors.scraping import ScrapingLoopDetector
from toolwatch.detectors.sequence import SEQUENCE_DETECTORS

REGISTRY: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        EnumerationDetector,
        BulkExtractionDetector,
        CredentialStuffingDetector,
        ScrapingLoopDetector,
        *SEQUENCE_DETECTORS,
        ConcurrencyAbuseDetector,
        RaceConditionDetector,
        IsolationForestDetector,
    )
}


def build(config: DetectorsConfig, names: list[str] | None = None) -> list[Detector]:
    """Instantiate the enabled detectors (all, or those named), in registry order."""
    chosen = REGISTRY if names is None else {n: REGISTRY[n] for n in names}
    dets = [cls(config) for cls in chosen.values()]
    return [d for d in dets if d.enabled]
