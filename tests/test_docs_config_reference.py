"""docs/detectors.md's configuration reference is the code's, so copying a key from it
works and every key is there (the reference once documented a key that did not exist)."""

from __future__ import annotations

from pathlib import Path

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


def test_config_page_is_what_toolwatch_config_prints() -> None:
    """docs/config.md's table is ``toolwatch config -f markdown``: every key of every
    section, defaults readable on any machine (no home directory of the one it ran on)."""
    from toolwatch.cli import config_reference
    from toolwatch.config import markdown_table

    want = markdown_table(config_reference())
    text = (ROOT / "docs" / "config.md").read_text()
    assert want in text, (
        "docs/config.md drifted from the code: regenerate its table with "
        "`toolwatch config -f markdown`")
    keys = [r[0] for r in config_reference()]
    assert len(keys) == len(set(keys)) and len(keys) > 200
    assert {"store.data_dir", "detectors.enumeration.run_lo", "live.flush_events"} <= set(keys)
    assert "/root/" not in want and str(Path.home()) not in want
