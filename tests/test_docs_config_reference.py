"""The configuration reference is the code's, so copying a key from the docs works and
every key is there (the reference once documented a key that did not exist)."""

from __future__ import annotations

import re
from pathlib import Path

from toolwatch.detectors.config import DetectorsConfig

from tests.conftest import ROOT
from toolwatch.cli import TUNING_HEADING, config_reference
from toolwatch.config import describe, markdown_table

#: Suffixes of threshold-like keys: a backticked word ending so in docs/detectors.md is
#: taken for a key and must exist (``dup_ratio_lo`` once did not).
_KEYISH = re.compile(r"`([a-z][a-z0-9_]*_(?:lo|hi|min|max|score|factor|share))`")
_DOTTED = re.compile(r"`(?:detectors\.)?([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+)`")


def test_config_page_is_what_toolwatch_config_prints() -> None:
    """docs/config.md's table is ``toolwatch config -f markdown``: every key of every
    section, defaults readable on any machine (no home directory of the one it ran on)."""
    want = markdown_table(config_reference())
    knobs = markdown_table(config_reference(tuning=True))
    text = (ROOT / "docs" / "config.md").read_text()
    for table in (want, knobs):
        assert table in text, (
            "docs/config.md drifted from the code: regenerate its tables with "
            "`toolwatch config -f markdown`")
    assert text.index(want) < text.index(TUNING_HEADING) < text.index(knobs)
    keys = [r[0] for r in config_reference()]
    assert len(keys) == len(set(keys)) and len(keys) > 180
    assert {"store.data_dir", "detectors.enumeration.run_lo", "live.flush_events"} <= set(keys)
    tuning = [r[0] for r in config_reference(tuning=True)]
    assert {"tuning.live.max_detect_events", "tuning.ingest.parse_workers"} <= set(tuning)
    assert not {k.removeprefix("tuning.") for k in tuning} & set(keys)  # each in one table
    assert "/root/" not in want and str(Path.home()) not in want


def test_detectors_page_names_only_keys_that_exist() -> None:
    """Keys docs/detectors.md names in backticks exist: dotted ones as written under
    ``[detectors]``, threshold-like words as the last part of some detectors key."""
    keys = {k for k, _, _ in describe(DetectorsConfig)}
    leaves = {k.rsplit(".", 1)[-1] for k in keys}
    sections = {k.split(".", 1)[0] for k in keys}
    text = (ROOT / "docs" / "detectors.md").read_text()
    dotted = {m for m in _DOTTED.findall(text) if m.split(".", 1)[0] in sections}
    assert dotted, "the page names no dotted key: the check would be vacuous"
    missing = sorted(d for d in dotted
                     if d not in keys and not any(k.startswith(d + ".") for k in keys))
    assert not missing, f"docs/detectors.md names keys that do not exist: {missing}"
    words = set(_KEYISH.findall(text))
    assert len(words) > 20
    unknown = sorted(w for w in words if w not in leaves and w not in sections)
    assert not unknown, f"docs/detectors.md names keys that do not exist: {unknown}"
