"""Typed detector configuration: the ``[detectors]`` table of ``toolwatch.toml``.

Every threshold and window lives here with its documented default, so nothing tunable
hides in detector code. Defaults are chosen for production MCP traffic, where agents make
a few to a few hundred calls per session, and lean towards *ratios, sequences, regularity
and per-entity baselines* rather than absolute volumes (see ``docs/detectors.md``).

Scores are in ``[0, 1]``; a detector raises an alert when its score reaches its
``threshold``. Most rule scores are built with :func:`toolwatch.detectors.scoring.band`: 0.5 exactly
at the signal's ``*_lo`` figure (the point where it starts to count) rising linearly to 1.0
at ``*_hi`` (where it is unmistakable), so with the default threshold of 0.5 the ``*_lo``
keys read as "alert from here" and the ``*_hi`` keys as "critical from here".

Example::

    [detectors]
    entity_window_minutes = 1440

    [detectors.credential_stuffing]
    creds_lo = 8

    [detectors.suppress]
    callers = ["svc-backup"]
    tool_patterns = ["^health"]
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from toolwatch.detectors.concurrency_config import ConcurrencyAbuseConfig, RaceConditionConfig
from toolwatch.detectors.incidents_config import IncidentConfig

from toolwatch.config import doc, from_dict
from toolwatch.errors import ConfigError

_T = TypeVar("_T")


def _registered_settings(key: str) -> type | None:
    """The settings class of the registered detector whose ``config_key`` is ``key``, if it
    brings one (:attr:`toolwatch.detectors.base.Detector.config_class`)."""
    from toolwatch.detectors.registry import REGISTRY  # the registry imports this module

    for cls in REGISTRY.values():
        if cls.config_key == key and cls.config_class is not None:
            return cls.config_class
    return None

#: Category names used in alerts (exactly these). The one definition: the dashboard, the
#: CLI, live mode and the evaluation import it from here.
CATEGORIES = (
    "enumeration", "bulk_extraction", "credential_stuffing", "scraping_loop",
    "tool_loop", "privilege_chain", "step_skip", "duplicate_execution", "cross_server_flow",
    "concurrency_abuse", "race_condition",
    "anomaly",
)

#: Alert severities, lowest first (the one definition; filters and sinks rank by position).
SEVERITIES = ("low", "medium", "high", "critical")

#: Rank of each severity (0 = low), for "at least this severity" filters.
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: What a tool does (see detectors/tools.py).
TOOL_ROLES = ("read", "list_search", "write", "irreversible", "admin_exec", "outbound", "auth")


@dataclass
class EnumerationConfig:
    """Enumeration: walking resource ids (IDOR probing, harvesting by id)."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    rewrite_share_lo: float = doc(
        "Share of a walk's ids that the same session also wrote successfully (an update, "
        "set, migrate … call) from which the walk is maintenance — a schema migration or "
        "backfill reading and updating each document — and scores at most rewrite_score. "
        "0 turns this off.",
        0.8,
    )
    rewrite_score: float = doc(
        "Highest score of such a write-back walk (0.55: an alert at low severity).", 0.55)
    rewrite_clean_miss: float = doc(
        "A write-back walk whose lookups fail (not found, denied) less than this share "
        "read and wrote only ids the caller may touch: maintenance, not enumeration, and "
        "it scores at most rewrite_clean_score. 0 turns this off.",
        0.05,
    )
    rewrite_clean_score: float = doc(
        "Highest score of such a clean write-back walk (below the threshold: quiet).", 0.3)
    harvest_bytes_factor: float = doc(
        "A walk none of whose lookups failed (under rewrite_clean_miss) and whose calls "
        "return on average at least this many times the population's typical bytes per "
        "call reads content in bulk — a backup agent reading every file of the tree it "
        "backs up — which is bulk extraction's business (volume, the caller's routine), "
        "not probing: it scores at most rewrite_clean_score. Probing and harvesting by id "
        "fetch documents of ordinary size; 10 is bulk_extraction's heavy_factor. A walk "
        "with misses is never excused by its size. 0 turns this off.",
        10.0,
    )
    max_step: int = doc(
        "Largest |step| between consecutive numeric ids (in time order) that still counts "
        "as a run (doc-1001, doc-1002 is step 1; invoice-10, invoice-20 step 10). Step-1 "
        "walks are also found with other lookups interleaved.",
        10,
    )
    run_lo: int = doc(
        "A run of this many ids stepping by a constant alerts on its own, even when every "
        "lookup succeeds (low-and-slow harvesting). Chapters, invoices or an auditor's "
        "reports read in order reach a dozen or two; seed 001 counts 100 distinct "
        "resources as its enumeration signal.",
        25,
    )
    run_hi: int = doc("Run length that makes the run signal critical.", 60)
    miss_run_lo: int = doc(
        "A shorter run counts when its lookups mostly fail: run length where the "
        "run-with-misses signal starts.",
        6,
    )
    miss_run_hi: int = doc("Run length where the run-with-misses signal is critical.", 30)
    miss_ratio_lo: float = doc(
        "Share of resource lookups that are not_found/denied from which misses count "
        "(a customer mistyping one booking of five is 0.2).",
        0.3,
    )
    miss_ratio_hi: float = doc("Miss share that makes the miss signals critical.", 0.85)
    distinct_lo: int = doc(
        "Distinct resources from which sparse probing (many ids, mostly missing, in any "
        "order) starts to count.",
        20,
    )
    distinct_hi: int = doc("Distinct resources where sparse probing is critical.", 100)
    dense_lo: int = doc(
        "Length of the longest block of consecutive ids all requested, in any order "
        "(a shuffled walk), from which the dense-block signal alerts.",
        25,
    )
    dense_hi: int = doc("Dense-block length that is critical.", 100)
    dense_new_share_lo: float = doc(
        "The dense-block signal also needs at least this share of the resource lookups to "
        "be first requests of an id (distinct resources / lookups naming a resource): a "
        "shuffled walk asks for each id once, while a person working all day on the few "
        "dozen newest issues of a project re-opens them again and again and so covers a "
        "block of consecutive ids without walking anything (docs/performance.md, Detection "
        "quality). 0 restores the plain dense-block rule.",
        0.5,
    )
    summary_distinct_lo: int = doc(
        "Sessions known only from a summary: distinct resources from which nearly every call "
        "touching a new resource counts as a walk.",
        60,
    )
    summary_distinct_hi: int = doc("Summary distinct resources that are critical.", 300)
    summary_new_share_lo: float = doc(
        "Summary: share of calls that touched a new resource from which it counts. A walk "
        "re-asks some ids (retries, a page of the walk fetched twice), so the share sits "
        "below 1; a client re-reading its own few records stays far lower.",
        0.8,
    )
    summary_bytes_factor: float = doc(
        "Summary: a walk probes, so its responses are small; sessions returning more than "
        "this many times the population's typical bytes per call are harvesting data (bulk "
        "extraction's business), not enumerating.",
        4.0,
    )
    self_z: float = doc(
        "When the caller has an established baseline, the session must also be this many "
        "robust z-scores above the caller's own median distinct resources or run length "
        "(a sync job walking ids every night is normal for it).",
        3.0,
    )
    entity: bool = doc(
        "Also score callers and client addresses per window over sessions not already "
        "flagged for enumeration (distributed enumeration).",
        True,
    )


@dataclass
class BulkExtractionConfig:
    """Bulk extraction: pulling far more data than the population or the caller usually does."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    min_bytes: int = doc(
        "Sustained volume (bytes returned beyond the single largest response) below this "
        "never counts as bulk, whatever its z-score: ratios on tiny volumes are noise, and "
        "one big download is what people do when they export a report.",
        2_000_000,
    )
    min_rows: int = doc("Like min_bytes for rows, when the server logs rows.", 10_000)
    z_lo: float = doc(
        "Robust z-score (median/MAD of log volume) of the sustained volume versus the "
        "population from which it counts (combined with the caller's own z-score when its "
        "baseline is established: (z_pop + z_own) / sqrt 2). 3.5 is the usual outlier cut "
        "for MAD z-scores.",
        3.5,
    )
    z_hi: float = doc("Population z-score that makes the signal critical.", 9.0)
    heavy_factor: float = doc(
        "Sustained volume must come from heavy calls: the session's other calls must return "
        "on average at least this many times the population's typical call. A long, busy "
        "session piles up volume from ordinary calls; an extraction asks for big chunks.",
        10.0,
    )
    drip_calls_lo: int = doc(
        "Sustained volume also counts, whatever its z-score, from this many calls beyond "
        "the largest responses when they are heavy and focused (above) and add up past "
        "min_bytes / min_rows: an extraction in installments — many responses each far "
        "larger than a typical call, from one resource — is not a population outlier in "
        "total, but no working session looks like it. 0 disables.",
        20,
    )
    drip_calls_hi: int = doc("Such a call count that makes the signal critical.", 100)
    drip_new_share: float = doc(
        "Installments also need this share of the session's calls to name a resource it "
        "had not asked for before (distinct resources / calls): a drip takes many different "
        "things, a person re-reading the few documents they work on all day does not.",
        0.5,
    )
    focus_min: float = doc(
        "Sustained volume must also be focused: at least this share of the session's calls "
        "go to one tool (resource family). An extraction asks one resource for a lot; a "
        "person's working day (documents, queries, tickets, reports, one after another) "
        "spreads its volume over many. Below it the volume pattern scores "
        "0.5 x share / focus_min (sessions without per-call tools, summaries, count as "
        "focused; 0 disables).",
        0.4,
    )
    request_factor: float = doc(
        "A call asking for this many times min_rows records at once (its limit / page-size "
        "argument) is a request for a dump, whether the server serves it or refuses it "
        "(critical at ten times as many; 0 disables).",
        10.0,
    )
    refused_weight: float = doc(
        "Score factor of such a request when every call asking for that many was refused: "
        "an attempt, reported a notch lower.",
        0.8,
    )
    tool_factor: float = doc(
        "Oversized responses: a call returning at least this many times the typical "
        "response of its (server, tool) — bytes, or records where the server logs rows — "
        "is oversized. What is typical for a tool is learned per (server, tool); a tool "
        "seen in fewer than tool_min_sessions sessions has no baseline of its own: it is "
        "compared with the population's typical call, and only its reads of named records "
        "(as on a tool_heavy_share tool) count. 0 disables the pattern.",
        10.0,
    )
    tool_min_sessions: int = doc(
        "Sessions that must have called a (server, tool) for its own typical response size "
        "to be used.",
        20,
    )
    tool_heavy_share: float = doc(
        "On a (server, tool) where at least this share of sessions hold an oversized call "
        "(a query tool that serves dashboards and analysts' exports alike), size says "
        "nothing on its own: only reads of people's or a business's records "
        "([detectors.tools] data_terms / data_tools) or of sensitive places count as "
        "oversized there.",
        0.02,
    )
    oversized_min_bytes: int = doc(
        "Oversized responses of one session adding up to this many bytes count as bulk "
        "extraction (seed 001 alerts on a session returning more than 1 MB); critical at "
        "ten times as much.",
        1_000_000,
    )
    oversized_min_rows: int = doc(
        "Like oversized_min_bytes for records (rows), when the server logs them: 1 MB at "
        "the 200 bytes per record that min_bytes / min_rows assume.",
        5_000,
    )
    single_z_lo: float = doc(
        "A single response this many robust z-scores above the population's largest "
        "responses counts on its own (a one-shot dump far beyond any normal export).",
        6.0,
    )
    single_z_hi: float = doc("Single-response z-score that is critical.", 12.0)
    single_min_bytes: int = doc(
        "...but only from this size: a single response below it never counts.", 50_000_000
    )
    pages_lo: int = doc(
        "Pagination sweep: distinct page numbers / offsets / cursors of one tool in one "
        "session from which walking a listing to its end counts as extraction.",
        25,
    )
    pages_hi: int = doc("Distinct pages that are critical.", 150)
    sweep_min_bytes: int = doc(
        "A pagination sweep must return at least this many bytes (or min_rows rows) to count.",
        1_000_000,
    )
    self_z: float = doc(
        "When the caller has an established baseline, the session must also be this many "
        "robust z-scores above the caller's own median volume / pages (a nightly export is "
        "normal for the account that runs it every night).",
        3.0,
    )
    report_every_calls: int = doc(
        "A long session may hold one large response (a report, an export of own data) per "
        "this many calls: its volume counts beyond its 1 + calls // report_every_calls "
        "largest responses, as any session's counts beyond its single largest, so a long, "
        "busy working session is judged by its ordinary calls (only sessions with twice "
        "this many calls change; 0: beyond the single largest only).",
        50,
    )
    routine_z: float = doc(
        "A caller doing what it does routinely is not anomalous. When the caller's typical "
        "session with a main tool (over baseline_min_sessions sessions on baseline_min_days "
        "days) already scores within habit_margin of the threshold — a service account's "
        "recurring export — a session with that main tool alerts only when its volume "
        "(bytes or records returned) is this many robust z-scores above the median of those "
        "sessions; an entity window likewise against the entity's own windows. A person "
        "whose usual sessions with the tool are small and who suddenly pulls far more has "
        "no such routine and is not shielded. 0 disables.",
        2.0,
    )
    habit_margin: float = doc(
        "A caller is also habitual when its typical active day (over baseline_min_sessions "
        "days) holds a session scoring within this of the threshold: a person who downloads "
        "exports every working day, next to many small sessions on other servers. Such a "
        "session must then be self_z robust z-scores beyond the caller's usual heaviest "
        "session of a day.",
        0.1,
    )
    entity: bool = doc(
        "Also score callers and client addresses per window over sessions not already "
        "flagged (distributed extraction).",
        True,
    )
    short_page_share: float = doc(
        "A page that returned under this share of what it asked for (its limit / page-size "
        "argument in records, or its length in bytes) reached the end of what there is: it "
        "does not count toward a pagination sweep. Walking a listing returns full pages "
        "until the last; a follower of a growing log asks for 64 kB at ever larger offsets "
        "and gets back the few lines written since its last read. 0 counts every page.",
        0.5,
    )
    named_min_bytes: int = doc(
        "Named reads: successful reads of people's or a business's records ([detectors."
        "tools] data_terms / data_tools) or of sensitive places returning this many bytes "
        "in one session (or oversized_min_rows records) count as bulk, whatever their "
        "tool's own baseline, when they are heavy (they average heavy_factor x the "
        "population's typical call) and focused (focus_min of the calls). Seed 001 alerts "
        "on a session returning more than 1 MB; critical at ten times as much. 0 disables.",
        1_000_000,
    )
    named_min_calls: int = doc(
        "Named reads count from this many successful reads in the session: a person "
        "downloading one big report once is not an extraction (every volume pattern "
        "discounts a session's largest response); an extraction asks again.",
        2,
    )
    pipeline_share: float = doc(
        "A session that handed on, whole, at least this share of the records it read (a "
        "later call to another tool or server reports the same record count: an export "
        "loaded into the warehouse) is a pipeline: records moved between systems, whose "
        "destination cross_server_flow judges, not records pulled out. 0 disables.",
        0.9,
    )
    export_terms: list[str] = doc(
        "Words in a tool name that say it exports or dumps whole sets (with a data_terms "
        "name or argument: get_customer_export). Such exports refused refused_exports_lo "
        "times in a session, none served, are an attempted dump.",
        factory=lambda: ["export", "dump"],
    )
    refused_exports_lo: int = doc(
        "Refused exports of named records (none served) in one session from which the "
        "attempt is reported (one refusal is a permission mistake; asking again is trying). "
        "0 disables.",
        2,
    )
    refused_export_score: float = doc(
        "Score of such an attempt: 'low', below a served export of the same size.",
        0.55,
    )


@dataclass
class CredentialStuffingConfig:
    """Credential stuffing: many failed authentications with many different secrets."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    creds_lo: int = doc(
        "Distinct failing credential hashes in one session from which it counts "
        "(a user mistyping a key twice has 1-2).",
        5,
    )
    creds_hi: int = doc("Distinct failing credentials that are critical.", 30)
    attempt_creds: int = doc(
        "A session with at least this many distinct failing credentials and no successful "
        "call at all is reported at attempt_score even below creds_lo (seed 001: "
        "authFailures > 2; a lockout after three failures leaves exactly this). A session "
        "known only from its summary counts with this many auth failures and no resource "
        "reached. 0: off.",
        3,
    )
    attempt_score: float = doc("Score of such a session (a 'low' alert by default).", 0.55)
    failures_lo: int = doc(
        "When logs carry no credential hash: auth failures in one session from which it "
        "counts (benign retries of one bad key are excluded when hashes exist).",
        8,
    )
    failures_hi: int = doc("Auth failures (no hashes) that are critical.", 40)
    fail_ratio_lo: float = doc(
        "Share of a session's calls that failed authentication from which it counts.", 0.3
    )
    fail_ratio_hi: float = doc("Auth failure share that is critical.", 0.8)
    entity_creds_lo: int = doc(
        "Per caller / client address and window: distinct failing credentials (or, without "
        "hashes, failing sessions) from which a distributed attack counts.",
        8,
    )
    entity_creds_hi: int = doc("Entity-level distinct failing credentials that are critical.", 40)
    entity_callers_lo: int = doc(
        "Per client address and window: distinct caller ids with auth failures from which "
        "it counts (one address trying many accounts).",
        6,
    )
    entity_callers_hi: int = doc("Distinct failing caller ids that are critical.", 30)
    fail_only_lo: float = doc(
        "Share of an entity's failing sessions that never succeeded, from which the "
        "entity signal counts. Users who mistype fix the key and succeed; stuffers don't. "
        "Guards shared addresses (NAT, offices).",
        0.5,
    )
    fail_only_hi: float = doc("Never-succeeding share that is critical.", 0.9)


@dataclass
class ScrapingLoopConfig:
    """Scraping loop: walking a listing or search by page or cursor, many calls, progressing."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    pages_lo: int = doc(
        "Distinct page numbers / offsets / cursors of one tool in one session from which "
        "walking a listing counts as scraping, whatever the volume.",
        25,
    )
    pages_hi: int = doc("Distinct pages that are critical.", 150)
    calls_lo: int = doc("Calls from which the mechanical-crawl signal counts.", 60)
    calls_hi: int = doc("Calls that make that signal critical.", 400)
    gap_cv_max: float = doc(
        "Inter-call gaps with a coefficient of variation (std/mean) at or below this are "
        "machine-regular. LLM agents and people think between calls (CV ≈ 1).",
        0.35,
    )
    top_tool_share_lo: float = doc(
        "Share of calls going to the single most used tool from which a crawl counts.", 0.7
    )
    rate_lo: float = doc("Calls per minute from which a sustained crawl counts.", 30.0)
    rate_hi: float = doc("Calls per minute that are critical.", 200.0)
    rate_min_calls: int = doc("Calls needed before the rate signal is considered.", 100)
    summary_repeat_lo: float = doc(
        "A session known only from its summary line counts at rate_lo calls per minute, or "
        "from summary_calls_lo calls, when at least this share of its calls touched no new "
        "resource (1 - unique resources / calls): a crawl or loop over a few resources, "
        "not an id walk (which touches a new resource nearly every call), nor a person's "
        "long working session (91 calls over 33 documents: a third new).",
        0.8,
    )
    summary_calls_lo: int = doc(
        "Calls from which a session known only from its summary line counts as a crawl "
        "(seed 001's own scraping-loop signal: callCount > 50); critical at calls_hi.",
        51,
    )
    summary_min_bytes_per_call: int = doc(
        "...and when its calls returned at least this many bytes on average: a crawl "
        "returns listings and pages, a client polling a job or build status a few hundred "
        "bytes.",
        1_000,
    )
    entity: bool = doc(
        "Also score callers and client addresses per window: distinct pages / cursors of "
        "one tool over sessions not flagged on their own that resume a listing (their "
        "first paging call asks for a page above 1 or carries a cursor; at least "
        "entity_min_sessions), against pages_lo / pages_hi: a walk that reconnects "
        "whenever a per-session budget is hit (seed 001). A sync job that starts each run "
        "at the first page does not resume.",
        True,
    )
    tail_short_share_lo: float = doc(
        "A session at least this share of whose successful paged calls are short byte-range "
        "reads (fewer bytes returned than the length asked for, see byte_length_keys) is "
        "following a growing file — a log tailer reading what was written since its last "
        "read — not walking a listing: its offsets count as no pages. A scraper reading a "
        "file by byte ranges gets full chunks until the last. 0 turns this off.",
        0.8,
    )
    byte_length_keys: list[str] = doc(
        "Argument names carrying the number of bytes a read asks for (compared with the "
        "bytes returned; record counts such as limit are not bytes).",
        factory=lambda: ["length", "len", "maxBytes", "max_bytes", "byteLength",
                         "byte_length", "numBytes", "num_bytes"],
    )
    self_z: float = doc(
        "When the caller has an established baseline, its session must also be this many "
        "robust z-scores above the caller's own median calls or pages (a sync or export "
        "job that pages through the same listing every day is normal for it).",
        3.0,
    )


@dataclass
class ToolsConfig:
    """What tools do: roles, business keys, idempotency keys (see detectors/tools.py)."""

    roles: dict[str, str] = doc(
        "Role of a tool, overriding the default from its name's verb: key 'tool' (any server) "
        "or 'server/tool'; value one of read, list_search, write, irreversible, admin_exec, "
        "outbound, auth.",
        factory=dict,
    )
    business_keys: dict[str, str] = doc(
        "Argument naming the business object a tool acts on ('tool' or 'server/tool' -> "
        "argument name, e.g. fulfillOrder = 'orderId'). Default: the resource id found at "
        "ingest (the first argument named like an id, path or uri).",
        factory=dict,
    )
    idempotency_keys: list[str] = doc(
        "Argument names carrying an idempotency key (a retry reusing the same key is a safe "
        "replay, not a duplicate execution).",
        factory=lambda: ["idempotencyKey", "idempotency_key", "Idempotency-Key", "requestId"],
    )
    idempotency_args: dict[str, list[str]] = doc(
        "Extra idempotency-key argument names per 'tool' or 'server/tool'.", factory=dict
    )
    sensitive_terms: list[str] = doc(
        "Substrings (case-insensitive) of a tool name or its argument text that mark a call "
        "as touching a sensitive place: credentials, secrets, system files, user/role tables, "
        "other tenants.",
        factory=lambda: [
            "credential", "password", "passwd", "secret", "/etc/", "shadow", ".ssh", "id_rsa",
            ".env", "vault", "private_key", "privatekey", "apikeys", "api_keys", "user_roles",
            "permissions", "\"roles\"", "\"users\"", "admin", "tenant",
            "kubeconfig", "sudoers",
        ],
    )
    data_terms: list[str] = doc(
        "Substrings (case-insensitive) of a tool name or its argument text that mark a read "
        "as returning people's or a business's records (customer lists, user tables, "
        "payroll, exports and dumps) — unless the argument is an aggregate query (a select "
        "list of count/sum/avg/min/max, or a GROUP BY), which returns figures: sent to "
        "another server, such a read is a data flow whatever its size (cross_server_flow). "
        "Credentials and system files are sensitive_terms.",
        factory=lambda: [
            "customer", "client_list", "contact", "member", "employee", "patient",
            "subscriber", "payroll", "salary", "salaries", "personal", "pii", "ssn",
            "users", "accounts", "export", "dump", "backup", "dataset",
            # A business's own records: whole tables of them are as sensitive as people's.
            "payments", "invoices", "orders", "transactions", "ledger",
        ],
    )
    data_tools: list[str] = doc(
        "Tools ('tool' or 'server/tool') whose reads return sensitive records whatever "
        "their names say (added to data_terms).",
        factory=list,
    )


@dataclass
class ToolLoopConfig:
    """Tool loop: the same call (or a short cycle of calls) repeated with no progress."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    streak_lo: int = doc(
        "Consecutive calls that each repeat an earlier call of the session exactly (same "
        "tool, same arguments, same outcome) from which a loop counts. A handful of polls "
        "of a job status or retries of a failed call stay far below.",
        12,
    )
    streak_hi: int = doc("Repeating streak that is critical.", 80)
    finished_poll_quiet: bool = doc(
        "A streak shaped like a poll that ends is progress, not a loop: one call repeated "
        "with gaps that never shrink (a back-off) or stay near-constant (poll_* keys), "
        "that ends in a response never seen before for that call or in a call of another "
        "tool on the same business key (get_job_status(job) x12 with growing gaps, then "
        "download_result(job)). Such a streak does not count; a loop that never ends, "
        "cycles through several calls or repeats at a machine pace still does. False "
        "restores the plain longest-streak rule.",
        True,
    )
    poll_min_gap_s: float = doc(
        "Median seconds between the repeats of a streak from which it may be a poll "
        "(finished_poll_quiet): nobody polls a job many times a second.",
        0.5,
    )
    poll_nondecreasing: float = doc(
        "Share of a poll's gaps that are at least 0.9x the previous gap (a back-off "
        "growing to its cap) for the finished-poll rule.",
        0.8,
    )
    poll_max_cv: float = doc(
        "...or the largest coefficient of variation of its gaps (a fixed polling interval "
        "with jitter).",
        0.25,
    )
    probe_quiet: bool = doc(
        "A read repeated on a fixed timer is a scheduled probe (a CI health check, a "
        "monitor), not a loop: one read call whose gaps are at least probe_min_gap_s and "
        "vary by at most probe_max_cv (coefficient of variation), at any length (a health "
        "bot polls all day; its schedule bounds its rate). An agent stuck in a loop is paced "
        "by its own inference, which varies; a loop of writes or of several calls still "
        "counts.",
        True,
    )
    probe_min_gap_s: float = doc("Median seconds between a probe's calls, at least.", 5.0)
    probe_words: tuple[str, ...] = doc(
        "Words of a tool name or of its arguments (camelCase or snake_case word, plural "
        "allowed) that make its call a status check, the only read a probe repeats "
        "(getStatus, searchItems(query=health)): a health bot asks for status, "
        "an agent stuck re-reading a document on a steady clock is a loop (seed 003).",
        ("status", "health", "healthcheck", "ping", "heartbeat", "stat", "poll", "metric",
         "monitor", "alive", "ready", "readiness", "liveness", "uptime", "progress", "state"),
    )
    probe_max_cv: float = doc(
        "Largest coefficient of variation of a probe's gaps (a timer with jitter).", 0.15)
    reread_quiet: bool = doc(
        "A streak at human pace whose responses keep changing is someone re-reading the "
        "files they are working on (a review loop over one's own documents), not a stuck "
        "agent: when the median gap between its repeats is at least reread_gap_s and at "
        "least reread_new_share of its repeats return a result (size or outcome) that call "
        "never returned before in the session, and the streak uses one tool, it does not "
        "count. A loop at model pace, one whose responses stay the same at any pace, or a "
        "cycle through different tools (search -> summarize -> search: seed 003's circular "
        "chain) still does. False restores the plain rule.",
        True,
    )
    reread_gap_s: float = doc(
        "Median seconds between a streak's repeats from which it is human-paced (an agent "
        "stuck in a loop calls every few seconds, a person re-reads every few minutes).",
        60.0,
    )
    reread_new_share: float = doc(
        "Share of a streak's repeats that must return a result never seen before for that "
        "call (the file changed since the last read) for the reread_quiet rule.",
        0.5,
    )
    max_cycle: int = doc(
        "Longest cycle of distinct calls (A→B→A→B is 2) still counted as a loop: a "
        "streak must be made of at most this many distinct calls.",
        4,
    )
    periodic_lo: float = doc(
        "A streak of several distinct calls is a loop when at least this share of its "
        "calls repeat the call one cycle before them (A→B→C→A→B→C: a stuck agent's "
        "context produces the same next call). The same few calls taken up in no fixed "
        "order (a person switching between three queries) count only from streak_hi.",
        0.75,
    )
    self_z: float = doc(
        "When the caller loops habitually (its typical session over several days already "
        "scores at alert level: a scheduled health probe, a status poller), a session must "
        "also have a streak this many robust z-scores above the caller's own median.",
        3.0,
    )


@dataclass
class PrivilegeChainConfig:
    """Privilege chain: sensitive reads, then writes / grants / executions, in one session."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    sensitive_reads_lo: int = doc(
        "Sensitive reads (credentials, system files, user/role tables, other tenants; see "
        "tools.sensitive_terms) before a mutating call from which the chain counts.",
        1,
    )
    sensitive_reads_hi: int = doc("Sensitive reads that make the chain critical.", 6)
    approval_args: list[str] = doc(
        "Argument names (case-insensitive) that carry a change or approval record. When every "
        "write/grant/exec call after the sensitive reads names one, the chain is a change "
        "window and scores at most approved_score. An agent can forge such an argument: "
        "empty this list where change records are not part of the tools' arguments.",
        factory=lambda: ["changeTicket", "change_ticket", "changeId", "change_id",
                         "changeRequest", "change_request", "approvalId", "approval_id"],
    )
    limit_verbs: list[str] = doc(
        "With limit_nouns: a tool whose name holds one of these verbs and one of those "
        "nouns lifts a limit (resetUsageCounter, raise_quota, clearRateLimit). Called in a "
        "session after it was refused with status rate_limited, it is a privilege chain at "
        "limit_reset_score.",
        factory=lambda: ["reset", "clear", "raise", "increase", "lift", "bump", "override",
                         "extend", "restore"],
    )
    limit_nouns: list[str] = doc(
        "See limit_verbs.", factory=lambda: ["usage", "quota", "limit", "counter", "rate",
                                             "budget", "credit"])
    limit_reset_score: float = doc(
        "Score of a session that lifts a limit it was just refused by (0.85: high).", 0.85)
    approved_score: float = doc(
        "Highest score of a chain whose escalating calls all name an approval record. "
        "0 (default): an approved change window is quiet, as it looks the same every time "
        "it runs; 0.55 keeps it visible at low severity (a forged approval argument is "
        "then still seen).", 0.0)


#: Verbs after which a cart or order is frozen (see StepSkipConfig.workflows).
_FREEZING = ("lock", "freeze", "finalize", "finalise", "seal", "checkout")


@dataclass
class WorkflowRule:
    """One declared workflow step: ``step`` requires an earlier ``requires`` call."""

    step: str = doc(
        "Tool name, or 'verb:<verb>' for any tool whose name starts with that verb "
        "(verb:fulfill matches fulfillOrder and fulfill_order), or 'verb:<verb>:<object>' "
        "for such a tool whose name also holds the object word (verb:pay:expense matches "
        "payExpense, not payOrder).",
        "",
    )
    requires: list[str] = doc(
        "Tools (or verb:<verb>) one of which must have succeeded earlier for the same "
        "business key and caller.",
        factory=list,
    )
    key: str = doc(
        "Business-key argument name; empty: the tool's business key (tools.business_keys, "
        "else the resource id).",
        "",
    )
    not_after: list[str] = doc(
        "Tools (or verb:<verb>) after whose success for the same business key this step must "
        "not run (items added to a cart whose price is locked, an order fulfilled after its "
        "refund). A rule with both requires and not_after is two rules.",
        factory=list,
    )


@dataclass
class StepSkipConfig:
    """Step skip: an irreversible workflow step without its prerequisite for the same key."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    workflows: list[WorkflowRule] = doc(
        "Declared workflow rules (win over learned ones).",
        factory=lambda: [
            WorkflowRule("verb:fulfill", ["verb:charge", "verb:pay", "verb:capture"]),
            WorkflowRule("verb:fulfil", ["verb:charge", "verb:pay", "verb:capture"]),
            WorkflowRule("verb:ship", ["verb:charge", "verb:pay", "verb:capture"]),
            # Seed 000 names approveExpense as a state-machine step: an expense is paid
            # (reimbursed) only once approved, which is what the approval is for in every
            # expense process. Keyed to the expense itself (payExpense, reimburse_expense;
            # not payOrder or payInvoice, which a customer pays without anyone approving).
            *[WorkflowRule(f"verb:{v}:expense", ["verb:approve"])
              for v in ("pay", "reimburse")],
            # Seed 000, sequence manipulation: a locked, checked-out or finalised cart or
            # order is not changed afterwards, and a refunded order is not sent.
            *[WorkflowRule(f"verb:{v}", not_after=[f"verb:{x}" for x in _FREEZING])
              for v in ("add", "update", "remove", "set", "edit", "modify", "apply")],
            *[WorkflowRule(f"verb:{v}", not_after=["verb:refund", "verb:void", "verb:cancel"])
              for v in ("fulfill", "fulfil", "ship")],
        ],
    )
    declared_score: float = doc("Score of a skipped declared step.", 0.9)
    prerequisite_any_caller: bool = doc(
        "A prerequisite done by anyone for the business key counts (the customer paid, the "
        "warehouse fulfils: the order's state is what the workflow needs, seed 000). False: "
        "only the caller's own earlier prerequisite counts.",
        True,
    )
    origin_minutes: int = doc(
        "A step skipped for a key its caller's session never named (an order id the "
        "checkout did not log) came from the caller's own order: the caller's other "
        "sessions that locked or checked out (the freezing verbs) within this many minutes "
        "before the skip, and never did the missing prerequisite afterwards, carry the "
        "alert too (0: only the skipping session).",
        60,
    )
    origin_requires: list[str] = doc(
        "The origin_minutes tie applies to rules requiring one of these (what follows a "
        "checkout: a payment); a skip of any other rule (an expense approved unread) says "
        "nothing about the caller's purchases.",
        factory=lambda: ["verb:charge", "verb:pay", "verb:capture"],
    )
    attempts: bool = doc(
        "Report steps the server refused (outcome error or denied) that had no prerequisite: "
        "the attempt is the finding (seed 000), at attempt_score.",
        True,
    )
    attempt_score: float = doc(
        "Score of a refused step without its prerequisite (at most the rule's own score; "
        "the default is a 'low' alert).",
        0.6,
    )
    learn: bool = doc(
        "Also learn workflows from history (toolwatch train; without a trained model, "
        "from the data at hand).",
        True,
    )
    learned_score: float = doc(
        "Score of a skipped learned step (lower: learned rules are not confirmed by anyone).",
        0.6,
    )
    min_support: int = doc(
        "A learned rule needs the step seen at least this many times with a business key.",
        20,
    )
    min_confidence: float = doc(
        "...and preceded by its prerequisite (same key and caller) at least this share of "
        "the time.",
        0.97,
    )


@dataclass
class DuplicateExecutionConfig:
    """Duplicate execution: an irreversible call executed twice for the same business key."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    window_minutes: int = doc(
        "A duplicate is a replay of one operation: an agent retrying on ambiguity, or the "
        "same call replayed from a reconnected session, comes back within minutes. Each "
        "execution counts when it follows the previous one of the same operation (same "
        "caller, tool and business arguments) within this time; the same order, expense or "
        "item acted on again hours later is a separate intent (a second purchase, a "
        "re-approval), not a duplicate.",
        60,
    )
    metered_min_ops: int = doc(
        "A call whose arguments name no business object (no order, payment, expense, "
        "recipient: no business key) is only a quantity and a label ('spend 5 credits for "
        "ocr'). When one caller runs at least this many different such operations of a tool "
        "(a metered workload), its equal ones recur by chance and are not duplicates. 0 "
        "turns this off.",
        3,
    )
    executions_hi: int = doc("Distinct executions that make the alert critical.", 4)
    ignore_args: list[str] = doc(
        "Arguments that do not change which operation a call is (besides the "
        "[detectors.tools] idempotency keys): a retry differing only in these is the same "
        "operation executed again.",
        factory=lambda: ["requestId", "request_id", "traceId", "trace_id", "correlationId",
                         "correlation_id", "nonce", "timestamp", "clientTime", "client_time",
                         "attempt", "retry"],
    )
    attempts_lo: int = doc(
        "Refused tries of an operation after it had succeeded (no idempotency key, or a new "
        "one) from which the session is reported at attempt_score: an attempted second "
        "execution the server happened to stop. 0 turns this off.",
        1,
    )
    attempt_score: float = doc("Score of such a session (a 'low' alert by default).", 0.55)
    reread_score: float = doc(
        "Score of an operation whose every repeat came reread_min_minutes or more after "
        "the previous execution, with a read of the same business object in between "
        "(getExpense, approveExpense, then both again minutes later): a second decision "
        "at a person's pace rather than a retry loop's replay, still reported (a 'low' "
        "alert by default). 0 scores it like any duplicate.",
        0.55,
    )
    reread_min_minutes: float = doc(
        "...at least this long after the previous execution: a retry or an exploit comes "
        "back within seconds, reads in between or not (seed 000's discount applied again "
        "between reads of the cart total).",
        3.0,
    )


@dataclass
class CrossServerFlowConfig:
    """Cross-server flow: data read on one server leaving through another's outbound tool."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc("Score from which an alert is raised.", 0.5)
    window_minutes: int = doc(
        "Reads this long before an outbound call (same caller, else same session) count.", 60
    )
    min_bytes: int = doc(
        "Bytes read from other servers before the outbound call from which it counts "
        "(uploads of a caller's own small files stay below); a sensitive read counts "
        "whatever its size.",
        1_000_000,
    )
    bytes_hi: int = doc("Bytes read elsewhere that make the flow critical.", 20_000_000)
    min_rows: int = doc(
        "Records (rows) read from other servers before the outbound call from which it "
        "counts, like min_bytes: volume is bytes or records.",
        1_000,
    )
    rows_hi: int = doc("Records read elsewhere that make the flow critical.", 100_000)
    data_score: float = doc(
        "Score of a flow whose reads returned records of people or a business "
        "([detectors.tools] data_terms / data_tools) at any size (high by default).",
        0.85,
    )
    data_min_rows: int = doc(
        "A read of such records counts when it is a collection: named an export, dump or "
        "backup, or returning at least this many rows...",
        20,
    )
    data_min_bytes: int = doc("...or at least this many bytes.", 50_000)
    oversized_factor: float = doc(
        "A read returning at least this many times what its (server, tool) typically "
        "returns (a 600 kB file from a file server whose reads are a few kB; tools seen in "
        "bulk_extraction.tool_min_sessions sessions or more) counts like a collection of "
        "records: sensitive by what it returns against what that tool returns to everyone "
        "else (0 disables).",
        10.0,
    )
    record_score: float = doc(
        "Score of a flow whose reads returned such records but no collection (a customer "
        "record or a payroll file of a few kB, then an upload to a third-party tool). Off "
        "by default: a support agent reading one customer and emailing them is the job; a "
        "deployment whose outbound tools never carry records sets it (0.6: low).",
        0.0,
    )
    payload_args: list[str] = doc(
        "Argument names (case-insensitive) that carry content out with a call: a call "
        "naming one on another server than the reads can take data out whatever the tool "
        "is called (text handed to a plugin's summarizer, attachments on a mail).",
        factory=lambda: ["attachments", "attachment", "text", "data", "content",
                         "contents", "document", "documents", "file", "files"],
    )
    size_args: list[str] = doc(
        "Argument names (case-insensitive) in which an outbound call states how many bytes "
        "it carries (an upload's sizeBytes). When the latest reads of one session on "
        "another server add up to that size (size_match_tolerance), they are what was "
        "sent: the flow is those reads (their volume, their sessions) and scores at least "
        "verbatim_score (seed 003: the data read on the trusted server is what reached the "
        "plugin).",
        factory=lambda: ["sizeBytes", "size_bytes", "byteSize", "byte_size", "sizeInBytes",
                         "contentLength", "content_length", "payloadBytes", "payload_bytes"],
    )
    size_match_tolerance: float = doc(
        "Relative difference between the stated size and the reads' bytes within which they "
        "are the same data (0.005: half a percent, an envelope of a few hundred bytes on a "
        "megabyte; 0 disables). Only stated sizes of at least data_min_bytes are matched: "
        "a few kB add up by chance.",
        0.005,
    )
    verbatim_score: float = doc(
        "Score of a flow whose outbound call (outbound by name) states the size of reads "
        "made on another server: the documents themselves left, whatever their volume "
        "(medium by default).",
        0.7,
    )
    rare_dest_callers: int = doc(
        "A destination (the e-mail domain or URL host in the call's arguments, else its "
        "server and tool) that fewer than this many callers of the batch send to is outside "
        "the organisation's usual ones: reads carried there (a payload_args argument) "
        "score external_score whatever their size (0 and rare_dest_share 0 disable). A "
        "destination becomes one of the organisation's own when several accounts use it, "
        "not when a handful of accounts (acting together) do.",
        5,
    )
    rare_dest_share: float = doc(
        "...or an address (mail domain, URL host) that gets fewer than this share of the "
        "tool's calls (a domain a few accounts send to, where most mail goes to the "
        "organisation's own).",
        0.2,
    )
    external_score: float = doc(
        "Score of reads carried to a rare destination (documents attached to a mail to a "
        "personal address).",
        0.7,
    )
    external_record_score: float = doc(
        "Score of records of people or a business carried to a rare destination (one "
        "customer record pasted into a plugin nobody else uses).",
        0.75,
    )
    own_session_first: bool = doc(
        "An outbound call whose own session read on another server first carries only "
        "that session's reads; only an upload-only session (each server giving the client "
        "its own session id) takes the caller's reads in other sessions. False: every read "
        "of the caller in the window counts.",
        True,
    )
    source_share_lo: float = doc(
        "A session the data was read in carries the alert too when it supplied at least "
        "this share of the bytes read before the outbound call (or a sensitive read): a "
        "busy caller's other connections with a few small reads in the hour are not where "
        "the data came from (0: every session read in).",
        0.2,
    )
    sources_need_volume: bool = doc(
        "A session the data was read in carries the alert for its share of the bytes only "
        "when the flow counts by volume (min_bytes read before the outbound call); a flow "
        "that alerts only for its sensitive reads is carried by the outbound call's session "
        "and the sessions holding those reads. Otherwise a compromised account's .env read "
        "and send would also flag the owner's own lookups of that hour. False: any session "
        "supplying source_share_lo.",
        True,
    )
    self_z: float = doc(
        "When the caller's typical active day already holds a flow at alert level (a person "
        "who reads from several servers and then posts to chat or saves to their own folder "
        "every working day; over baseline_min_sessions days, at least baseline_min_days), a "
        "flow by volume must also read this many robust z-scores more than the caller's own "
        "usual flows. Flows from sensitive reads are never excused.",
        3.0,
    )
    self_vs_day_max: bool = doc(
        "The caller's usual flows that self_z is measured against are its largest flow of "
        "each active day (as the habit itself is judged per day), not every outbound call: "
        "a person who posts to chat many times a day after small reads, and once or twice "
        "after downloading an export, has a small median flow, so each export day would "
        "look 'far beyond its usual'. False: one observation per outbound call.",
        True,
    )
    habit_margin: float = doc(
        "The caller's typical active day counts as holding a flow when its largest flow "
        "scores within this of the threshold (reads of most of min_bytes, then out).",
        0.1,
    )


@dataclass
class AnomalyConfig:
    """Isolation forest over log-scaled session features."""

    enabled: bool = doc("Run this detector.", True)
    threshold: float = doc(
        "Isolation score (2^(-mean path length / c(n)), in [0, 1]) from which an alert is "
        "raised; ~0.5 is ordinary. Set high: rules name the attacks, the forest should only "
        "speak up for sessions clearly unlike any other.",
        0.72,
    )
    contamination: float = doc(
        "Also require the score to clear this upper quantile of the training scores by "
        "quantile_margin: the most unusual 0.5% of ordinary traffic is what ordinary traffic "
        "looks like at its most unusual, so an alert must be clearly beyond it.",
        0.005,
    )
    quantile_margin: float = doc(
        "How far above the training quantile (isolation-score units) a session must be.", 0.05
    )
    floor_mads: float = doc(
        "Each feature is floored at the top of its ordinary range, median + this many "
        "robust standard deviations (1.4826 MAD) of the training sessions, so a session is "
        "never isolated by ordinary variation in one figure (0: floor at the median).",
        0.0,
    )
    outlier_z: float = doc(
        "An anomaly also needs one figure this many robust z-scores (median/MAD, after "
        "tolerances) beyond its training median, so every alert points at something "
        "clearly outside the ordinary range, not at mild variation the forest happened "
        "to isolate.",
        3.5,
    )
    n_estimators: int = doc("Trees in the forest.", 100)
    max_samples: int = doc("Sessions drawn per tree (the paper's 256 works well).", 256)
    min_train_sessions: int = doc(
        "Fewer training sessions than this leaves the forest unfitted (neutral score 0): the "
        "alert quantile of a few hundred sessions is one or two sessions, i.e. noise.",
        500,
    )
    max_train_sessions: int = doc(
        "Training sessions are sampled down to this many (deterministically).", 200_000
    )
    random_state: int = doc("Seed, so fits are reproducible.", 7)
    on_version_mismatch: str = doc(
        "A saved model written by another scikit-learn major.minor: 'error' (raise "
        "ModelError) or 'refit' (warn and fit on the data at hand).",
        "refit",
    )
    explain_top: int = doc("Features named in an anomaly alert's reasons.", 3)
    habit_margin: float = doc(
        "Callers whose typical session (over baseline_min_sessions sessions on "
        "baseline_min_days days) already scores within this of the alert threshold alert "
        "only this far above their own typical isolation score.",
        0.05,
    )


@dataclass
class SuppressConfig:
    """Allowlists: alerts matching any of these are dropped (and counted)."""

    callers: list[str] = doc("Caller ids whose alerts are dropped.", factory=list)
    client_ips: list[str] = doc("Client addresses whose alerts are dropped.", factory=list)
    servers: list[str] = doc("Servers whose alerts are dropped.", factory=list)
    tools: list[str] = doc(
        "Tools: an alert whose evidence is dominated by one of these tools is dropped.",
        factory=list,
    )
    caller_patterns: list[str] = doc(
        "Regular expressions (re.search) on caller_id; a match drops the alert.", factory=list
    )
    tool_patterns: list[str] = doc(
        "Regular expressions (re.search) on the alert's dominant tool.", factory=list
    )


@dataclass
class DetectorsConfig:
    """Root of the ``[detectors]`` table."""

    entity_window_minutes: int = doc(
        "Length of the windows over which callers and client addresses are scored "
        "(distributed and low-and-slow attacks). Windows hop by entity_hop_minutes, so an "
        "attack no longer than one hop always falls inside one window.",
        1440,
    )
    entity_hop_minutes: int = doc(
        "Hop between entity windows; must divide entity_window_minutes.", 720
    )
    entity_min_sessions: int = doc(
        "Entity windows need evidence from at least this many sessions (fewer is a "
        "session alert's business).",
        2,
    )
    baseline_min_sessions: int = doc(
        "A caller's own baseline is used only once it has this many sessions...", 3
    )
    baseline_min_days: int = doc(
        "...on at least this many distinct UTC days (an attacker's burst of sessions in one "
        "afternoon must not become its own 'normal').",
        2,
    )
    summary_routine_sessions: int = doc(
        "A session known only from its summary line is a few counts. A caller (or client "
        "address) with at least this many summary-only sessions in the history, spread "
        "over summary_routine_hours, whose typical one already scores at alert level, runs "
        "that count as its workload (a sync service the server marks SESSION_ANOMALY every "
        "run): its summary sessions then alert only "
        "their detector's self_z robust z-scores beyond its own median (calls for "
        "scraping_loop, bytes for bulk_extraction). Needs no multi-day history. "
        "0 turns this off.",
        3,
    )
    summary_routine_hours: float = doc(
        "...spread over at least this many hours between the first and the last of them "
        "(a burst of sessions in one sitting is not a routine).",
        6.0,
    )
    summary_routine_spread: float = doc(
        "...and alike: the robust spread (1.4826 x MAD) of their log figure (calls, bytes) "
        "at most this (1.0: most runs within a factor of ~2.7 of the typical one). A "
        "routine repeats; an escalation (7 calls, then 900, 2,400, 5,200) does not.",
        1.0,
    )
    habit_min_days: int = doc(
        "An entity is habitual for a rule detector (its typical session or day already "
        "scores at alert level, so only sessions far beyond its own normal alert) only with "
        "history on at least this many distinct UTC days (and baseline_min_days): a caller "
        "that enumerated slowly on one day and fast on the next must not have made "
        "enumeration its own normal, while a nightly job is habitual by its third night.",
        3,
    )
    fold_overlaps: bool = doc(
        "Fold weaker alerts on the same session into its strongest one (listed under "
        "evidence.also with a reason) instead of emitting several: an isolation-forest alert "
        "on a session that a rule already explains, a rule alert scoring fold_margin below "
        "another category's on the same session, any second category on a session known "
        "only from its summary (its few figures feed every category), and forest alerts on "
        "sessions that an entity alert already lists.",
        True,
    )
    fold_margin: float = doc(
        "Score gap from which a weaker rule category on a session is folded into the "
        "stronger one (a 143-id walk is enumeration first, not also a 'scraping loop').",
        0.25,
    )
    baseline_min_mad: float = doc(
        "Floor on the MAD of log figures (natural log units) in population and own "
        "baselines, so a very uniform population or caller does not turn small differences "
        "into huge z-scores. 0.5 ≈ a factor of 1.65.",
        0.5,
    )
    severity_medium: float = doc("Scores from here are 'medium' (below: 'low').", 0.7)
    severity_high: float = doc("Scores from here are 'high'.", 0.85)
    severity_critical: float = doc("Scores from here are 'critical'.", 0.95)
    page_keys: list[str] = doc(
        "Argument names holding a page number or offset (pagination progression).",
        factory=lambda: [
            "page", "pageNumber", "page_number", "pageNum", "offset", "skip", "start",
            "startIndex", "start_index", "from",
        ],
    )
    cursor_keys: list[str] = doc(
        "Argument names holding an opaque pagination cursor.",
        factory=lambda: [
            "cursor", "pageToken", "page_token", "nextToken", "next_token", "nextCursor",
            "next_cursor", "after", "continuation", "continuationToken", "startCursor",
        ],
    )
    max_session_hours: float = doc(
        "Live mode keeps events this long (and at least one entity window) so sessions "
        "spanning micro-batches are scored whole.",
        24.0,
    )
    enumeration: EnumerationConfig = doc("Enumeration detector.", factory=EnumerationConfig)
    bulk_extraction: BulkExtractionConfig = doc(
        "Bulk-extraction detector.", factory=BulkExtractionConfig
    )
    credential_stuffing: CredentialStuffingConfig = doc(
        "Credential-stuffing detector.", factory=CredentialStuffingConfig
    )
    scraping_loop: ScrapingLoopConfig = doc("Scraping-loop detector.", factory=ScrapingLoopConfig)
    tool_loop: ToolLoopConfig = doc("Tool-loop detector.", factory=ToolLoopConfig)
    privilege_chain: PrivilegeChainConfig = doc(
        "Privilege-chain detector.", factory=PrivilegeChainConfig
    )
    step_skip: StepSkipConfig = doc("Step-skip detector (workflows).", factory=StepSkipConfig)
    duplicate_execution: DuplicateExecutionConfig = doc(
        "Duplicate-execution detector.", factory=DuplicateExecutionConfig
    )
    cross_server_flow: CrossServerFlowConfig = doc(
        "Cross-server-flow detector.", factory=CrossServerFlowConfig
    )
    concurrency_abuse: ConcurrencyAbuseConfig = doc(
        "Concurrency-abuse detector (detectors/concurrency.py).", factory=ConcurrencyAbuseConfig
    )
    race_condition: RaceConditionConfig = doc(
        "Race-condition detector (detectors/concurrency.py).", factory=RaceConditionConfig
    )
    anomaly: AnomalyConfig = doc("Isolation-forest detector.", factory=AnomalyConfig)
    incidents: IncidentConfig = doc(
        "Incident roll-up of alerts per actor (detectors/incidents.py, docs/incidents.md).",
        factory=IncidentConfig,
    )
    suppress: SuppressConfig = doc("Allowlists.", factory=SuppressConfig)
    tools: ToolsConfig = doc(
        "Tool roles, business keys and idempotency keys (detectors/tools.py).",
        factory=ToolsConfig,
    )

    def __post_init__(self) -> None:
        #: Tables of registered detectors that bring their own settings (see :meth:`table`).
        self._tables: dict[str, Any] = {}
        self.validate()

    def validate(self) -> None:
        """Check cross-field constraints.

        Raises
        ------
        ConfigError
            On a window that the hop does not divide, unordered severity bands, an
            invalid regular expression or an unknown ``on_version_mismatch``.
        """
        if self.entity_hop_minutes <= 0 or self.entity_window_minutes <= 0:
            raise ConfigError("windows must be positive", key="detectors.entity_hop_minutes")
        if self.entity_window_minutes % self.entity_hop_minutes:
            raise ConfigError(
                f"entity_hop_minutes ({self.entity_hop_minutes}) must divide "
                f"entity_window_minutes ({self.entity_window_minutes})",
                key="detectors.entity_hop_minutes",
            )
        if not 0 < self.severity_medium <= self.severity_high <= self.severity_critical <= 1:
            raise ConfigError(
                "severity bands must satisfy 0 < medium <= high <= critical <= 1",
                key="detectors.severity_medium",
            )
        if self.anomaly.on_version_mismatch not in ("error", "refit"):
            raise ConfigError(
                "must be 'error' or 'refit'", key="detectors.anomaly.on_version_mismatch"
            )
        for key, role in self.tools.roles.items():
            if role not in TOOL_ROLES:
                raise ConfigError(
                    f"unknown role {role!r}; known: {', '.join(TOOL_ROLES)}",
                    key=f"detectors.tools.roles.{key}",
                )
        for name in ("caller_patterns", "tool_patterns"):
            for pat in getattr(self.suppress, name):
                try:
                    re.compile(pat)
                except re.error as exc:
                    raise ConfigError(
                        f"invalid regular expression {pat!r}: {exc}",
                        key=f"detectors.suppress.{name}",
                    ) from exc

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, *, path: str | None = None) -> DetectorsConfig:
        """Parse the ``[detectors]`` table, rejecting unknown keys and wrong types.

        Parameters
        ----------
        data
            The table (``Config.detectors``); ``None`` or ``{}`` gives the defaults.
        path
            Config file name, for error messages.
        """
        data = dict(data or {})
        # [detectors.<key>] of a registered detector that brings its own settings class
        # (Detector.config_class): a new detector is one module plus one registry line.
        known = {f.name for f in dataclasses.fields(cls)}
        extra = {k: data.pop(k) for k in list(data)
                 if k not in known and _registered_settings(k) is not None}
        cfg = from_dict(cls, data, path=path, prefix="detectors")
        for key, table in extra.items():
            if not isinstance(table, dict):
                raise ConfigError("expected a table", path=path, key=f"detectors.{key}")
            cfg._tables[key] = from_dict(_registered_settings(key), dict(table), path=path,
                                         prefix=f"detectors.{key}")
        return cfg

    def table(self, key: str, cls: type[_T]) -> _T:
        """Settings of a registered detector whose table is not a field of this class:
        as parsed from ``[detectors.<key>]``, else ``cls``'s defaults."""
        got = self._tables.get(key)
        return got if got is not None else cls()

    def severity(self, score: float) -> str:
        """Severity band of a score: low, medium, high or critical."""
        if score >= self.severity_critical:
            return "critical"
        if score >= self.severity_high:
            return "high"
        if score >= self.severity_medium:
            return "medium"
        return "low"

    @property
    def window_us(self) -> int:
        """Entity window length in microseconds."""
        return self.entity_window_minutes * 60_000_000

    @property
    def hop_us(self) -> int:
        """Entity window hop in microseconds."""
        return self.entity_hop_minutes * 60_000_000
