"""Settings of the incident roll-up (``[detectors.incidents]``), kept beside
:mod:`toolwatch.detectors.config` (which lists them) and free of heavy imports, so the CLI's
start-up path and ``toolwatch config`` can read them without polars.

See :mod:`toolwatch.detectors.incidents` and ``docs/incidents.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolwatch.config import doc
from toolwatch.errors import ConfigError


@dataclass
class IncidentConfig:
    """How alerts of one actor are rolled up into incidents, and how bad each one is."""

    gap_hours: float = doc(
        "Activity window: alerts of one actor (caller, else client address) whose evidence "
        "starts more than this long after everything before it ended open a new incident. "
        "Long enough for a recon-then-harvest story split by a lunch break, short enough "
        "that last week's incident is not reopened by today's alert.",
        6.0,
    )
    half_life_hours: float = doc(
        "Risk halves for every this many hours since the incident's last alert (measured "
        "from the newest log time in the store, not the wall clock of a replay). "
        "0 = no decay.",
        24.0,
    )
    points_low: float = doc("Risk points (0-100) of a category whose best alert is low.", 35.0)
    points_medium: float = doc("Risk points of a category whose best alert is medium.", 55.0)
    points_high: float = doc("Risk points of a category whose best alert is high.", 75.0)
    points_critical: float = doc("Risk points of a category whose best alert is critical.", 90.0)
    stage_bonus: float = doc(
        "Each further kill-chain stage closes this share (times its points / 100) of the "
        "gap between the risk so far and 100: recon, then credential access, then "
        "collection is worse than any one of them, but never past 100.",
        0.5,
    )
    category_bonus: float = doc(
        "Like stage_bonus, for a further category in a stage already counted (bulk "
        "extraction beside a scraping loop adds less than a new stage).",
        0.25,
    )
    risk_medium: float = doc("Incidents from this (decayed) risk are 'medium' (below: low).", 40.0)
    risk_high: float = doc("Incidents from this risk are 'high'.", 60.0)
    risk_critical: float = doc("Incidents from this risk are 'critical'.", 85.0)
    max_actions: int = doc("Recommended actions listed per incident at most.", 6)

    def __post_init__(self) -> None:
        if self.gap_hours <= 0 or self.half_life_hours < 0:
            raise ConfigError(
                "gap_hours must be > 0 and half_life_hours >= 0",
                key="detectors.incidents.gap_hours",
            )
        if not 0 < self.risk_medium <= self.risk_high <= self.risk_critical <= 100:
            raise ConfigError(
                "risk bands must satisfy 0 < medium <= high <= critical <= 100",
                key="detectors.incidents.risk_medium",
            )
        for name in ("stage_bonus", "category_bonus"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError("must be in [0, 1]", key=f"detectors.incidents.{name}")
        if self.max_actions < 1:
            raise ConfigError("must be >= 1", key="detectors.incidents.max_actions")
