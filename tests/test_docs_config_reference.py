"""docs/detectors.md's configuration reference is the code's, so copying a key from it
works and every key is there (the reference once documented a key that did not exist)."""

from __future__ import annotations

from toolwatch.detectors.config import DetectorsConfig

from tests.conftest import ROOT
from toolwatch.config import markdown_reference


def test_detectors_reference_equals_the_code() -> None:
    text = (ROOT / "docs" / "detectors.md").read_text()
    want = markdown_reference(DetectorsConfig)
    assert want in text, (
        "docs/detectors.md's configuration reference drifted from detectors/config.py: "
        "regenerate it with toolwatch.config.markdown_reference(DetectorsConfig)")
    assert text.count("| key | default | meaning |") == 1
