"""Settings of the concurrency detectors (``[detectors.concurrency_abuse]`` and
``[detectors.race_condition]``), kept beside :mod:`toolwatch.detectors.config` (which lists them).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolwatch.config import doc


@dataclass
class ConcurrencyAbuseConfig:
    """Concurrency abuse: far more calls in flight at once than the caller and population."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    peak_lo: int = doc(
        "Calls in flight at the same moment in one session from which it counts. LLM agents "
        "issue a handful of parallel tool calls; dozens at once is a client working around "
        "per-call limits.",
        12,
    )
    peak_hi: int = doc("Peak in-flight calls that are critical.", 48)
    read_peak_lo: int = doc(
        "peak_lo for a session whose calls all read: a client fanning out a dozen queries "
        "(a dashboard loading its panels) is ordinary; writes, sends and logins in "
        "parallel race limits and quotas (seed 004) and count from peak_lo. A caller-wide "
        "window of reads only is scaled the same way (read_peak_lo / peak_lo times the "
        "caller thresholds).",
        16,
    )
    caller_cap: int = doc(
        "Seed 004's per-caller concurrency limit (MAX_CONCURRENT_PER_CALLER = 10): calls "
        "in flight above it are over the cap. Going over it once is a page or a dashboard "
        "loading its panels; see waves_lo.",
        10,
    )
    waves_lo: int = doc(
        "Separate episodes over caller_cap (the in-flight count rising past it again after "
        "falling back) from which a session counts from caller_cap + 1 in flight, reads "
        "included, when its calls ask for new things (fresh_share_lo): a client that goes "
        "over the cap again and again works through the limit (seed 004), a page load and "
        "a reload are two. 0 turns the rule off.",
        3,
    )
    fresh_share_lo: float = doc(
        "Share of the session's calls that are the first of their (tool, arguments) from "
        "which its waves over the cap are new work: a dashboard refreshing the same panels "
        "re-asks the same queries and stays under it.",
        0.8,
    )
    attempt_score: float = doc(
        "Score cap of a session whose peak reaches the thresholds only when the calls the "
        "server refused for a limit (status rate_limited) are counted (a 'low' alert by "
        "default): the attempt is reported, below a burst that was served.",
        0.55,
    )
    pop_ratio_lo: float = doc(
        "The peak must also be at least this many times the population's typical peak "
        "(median peak of the sessions with min_calls or more calls; caller-wide peaks are "
        "compared with it too).",
        4.0,
    )
    pop_min_sessions: int = doc(
        "The population comparison needs at least this many busy sessions (min_calls or "
        "more calls); with fewer, the population is mostly the session itself.",
        20,
    )
    self_ratio_lo: float = doc(
        "When the caller has an established baseline, the peak must also be at least this "
        "many times its usual (median) peak: a batch job that always runs 20 calls at once "
        "is normal for the account that runs it.",
        2.5,
    )
    burst_window_ms: float = doc(
        "Sessions whose lines carry no durations are point calls: the fallback counts calls "
        "started within this window (a burst rate) instead of calls in flight.",
        1000.0,
    )
    interval_share_lo: float = doc(
        "Share of a session's calls that must carry an interval (start and end) for the "
        "in-flight count; below it the session uses the burst-rate fallback.",
        0.5,
    )
    min_calls: int = doc(
        "Sessions with fewer calls are not swept (their peak cannot reach peak_lo).", 12
    )
    callers: bool = doc(
        "Also score each caller across its sessions: the peak of its calls in flight at "
        "once over all its sessions, per entity window (an agent that spreads its "
        "parallelism over many sessions, each modest on its own).",
        True,
    )
    caller_peak_lo: int = doc(
        "Calls in flight at the same moment across one caller's sessions from which it "
        "counts.",
        16,
    )
    caller_peak_hi: int = doc("Caller-wide peak in-flight calls that are critical.", 64)
    caller_max_session_share: float = doc(
        "A caller-wide peak counts only when no single session holds more than this share "
        "of the calls in flight at that moment (otherwise that session's own alert speaks) "
        "and at least entity_min_sessions sessions take part.",
        0.5,
    )
    caller_baseline_skips_bursts: bool = doc(
        "The caller's usual caller-wide peak leaves out windows whose peak one session's own "
        "burst explains (that session reaches peak_lo and holds more than "
        "caller_max_session_share of the window's peak): such a burst is flagged as a "
        "session, and counting it as the caller's normal would excuse a later burst spread "
        "over several sessions. False counts every busy window.",
        True,
    )


@dataclass
class RaceConditionConfig:
    """Race condition: overlapping mutating calls on the same resource or business key."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    calls_lo: int = doc(
        "Mutating calls on one resource whose intervals overlap (one connected cluster) from "
        "which a race counts: two is already the check-then-act pattern.",
        2,
    )
    calls_hi: int = doc("Overlapping mutating calls that are critical.", 6)
    min_overlap_ms: float = doc(
        "Overlap below this is timestamp rounding between back-to-back calls, not a race.",
        10.0,
    )
    ok_score: float = doc(
        "Score of a race in which at least two of the overlapping calls succeeded (the "
        "double spend went through), when that is higher than the count's score.",
        0.8,
    )
    max_listed_calls: int = doc("Calls listed per alert's evidence.", 12)
