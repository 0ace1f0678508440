"""Incidents: one actor's alerts rolled up into one story an on-call engineer can act on.

An *incident* is every alert of one **actor** — the caller id, else the client address,
else (neither known) the session — within one **activity window**: alerts whose evidence
starts more than ``gap_hours`` after everything before it ended open a new incident. Its
id is a hash of (actor kind, actor, first alert's ``first_seen``), so a later version of
any of its alerts (more evidence, higher score) keeps the id.

Each alert category belongs to one kill-chain **stage** (:data:`CATEGORY_STAGE`) and
carries MITRE ATT&CK technique ids (:data:`TECHNIQUES`); the incident lists its stages in
kill-chain order. Its **risk** (0-100) starts at the points of its worst category and each
further stage (category) closes part of the gap to 100; it then halves every
``half_life_hours`` since the last alert. **Recommended actions** are filled from each
alert's own fields and evidence — strings for a person, never executed.

The computation is columnar (polars) and pure: alerts in, incidents out. The query
connections' ``incidents`` view calls it at read time on the ``alerts`` view (see
:func:`toolwatch.query.query_connection`), so batch ``analyze`` and live ``tail`` stores
give the same incidents from the same alerts. See ``docs/incidents.md``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime

import polars as pl
from toolwatch.detectors.incidents_config import IncidentConfig

__all__ = [
    "CATEGORY_STAGE",
    "INCIDENT_COLUMNS",
    "STAGES",
    "TECHNIQUES",
    "IncidentConfig",
    "build_incidents",
]

#: Kill-chain stages, in order. ``unclassified`` (the isolation forest's ``anomaly``) says
#: "unlike other sessions", not what was done, so it sits after the story.
STAGES = ("discovery", "credential_access", "collection", "exfiltration", "impact",
          "unclassified")

#: Stage of each alert category (docs/incidents.md says why each one sits where it does).
CATEGORY_STAGE: dict[str, str] = {
    "enumeration": "discovery",
    "credential_stuffing": "credential_access",
    "bulk_extraction": "collection",
    "scraping_loop": "collection",
    "cross_server_flow": "exfiltration",
    "privilege_chain": "impact",
    "step_skip": "impact",
    "duplicate_execution": "impact",
    "race_condition": "impact",
    "concurrency_abuse": "impact",
    "tool_loop": "impact",
    "anomaly": "unclassified",
}

#: MITRE ATT&CK (Enterprise) technique ids per category; names in docs/incidents.md.
TECHNIQUES: dict[str, tuple[str, ...]] = {
    "enumeration": ("T1083", "T1087"),
    "credential_stuffing": ("T1110.004",),
    "bulk_extraction": ("T1119", "T1213"),
    "scraping_loop": ("T1119",),
    "cross_server_flow": ("T1567", "T1020"),
    "privilege_chain": ("T1552.001", "T1548"),
    "step_skip": ("T1565.001", "T1657"),
    "duplicate_execution": ("T1657", "T1565.001"),
    "race_condition": ("T1565.001",),
    "concurrency_abuse": ("T1499.003",),
    "tool_loop": ("T1499.003",),
    "anomaly": (),
}

#: Triage statuses (dashboard/triage.py STATUSES), and how an incident without its own
#: verdict derives one from its alerts' (see :func:`build_incidents`).
STATUSES = ("open", "acknowledged", "false_positive", "escalated")

_TS = pl.Datetime("us", "UTC")
_STR_LIST = pl.List(pl.String())

#: Output columns and types of :func:`build_incidents` (the ``incidents`` view).
INCIDENT_COLUMNS: dict[str, pl.DataType] = {
    "incident_id": pl.String(),
    "actor_type": pl.String(),
    "actor_id": pl.String(),
    "caller_ids": _STR_LIST,
    "client_ips": _STR_LIST,
    "servers": _STR_LIST,
    "categories": _STR_LIST,
    "stages": _STR_LIST,
    "techniques": _STR_LIST,
    "risk": pl.Float64(),
    "peak_risk": pl.Float64(),
    "severity": pl.String(),
    "first_seen": _TS,
    "last_seen": _TS,
    "n_alerts": pl.Int64(),
    "alert_ids": _STR_LIST,
    "recommended_actions": _STR_LIST,
    "summary": pl.String(),
    "status": pl.String(),
    "linked_incident_ids": _STR_LIST,
}

#: Evidence fields the action templates read (JSON paths into the alert's evidence text).
_EVIDENCE_FIELDS = (
    "top_tool", "resource_key", "run_first_id", "run_last_id", "distinct_resources",
    "distinct_failed_credentials", "total_bytes", "distinct_pages", "loop_tool",
    "first_escalation", "business_key", "skipped_step", "missing_prerequisite", "tool",
    "executions", "resource", "peak_in_flight", "outbound_tool", "outbound_server",
    "source_servers", "bytes_read_elsewhere",
)
#: Categories whose presence alone calls for cutting the actor off (revoke / block).
_CUT_OFF = ("credential_stuffing", "privilege_chain", "cross_server_flow")


def empty_incidents() -> pl.DataFrame:
    """A frame with the incident columns and no rows."""
    return pl.DataFrame(schema=INCIDENT_COLUMNS)


def build_incidents(
    alerts: pl.DataFrame,
    *,
    now: datetime | None = None,
    config: IncidentConfig | None = None,
    alert_status: Mapping[str, str] | None = None,
    incident_status: Mapping[str, str] | None = None,
) -> pl.DataFrame:
    """Roll alerts up into incidents, riskiest first.

    Parameters
    ----------
    alerts
        Alerts with ``toolwatch.schema.ALERTS`` columns (the store's ``alerts`` view or
        ``--alerts-out`` rows with evidence as JSON text). Several versions of one alert
        are allowed: the latest ``detected_at`` is used.
    now
        Time the risk decays to. Default: the newest ``detected_at`` / ``last_seen`` of
        ``alerts`` (log time, so a forensic replay is not decayed by the wall clock).
    config
        Windows, risk points and bands (``[detectors.incidents]``).
    alert_status
        Triage status per alert id (alerts not in it are ``open``).
    incident_status
        Incident-level verdict per incident id; wins over the alerts' statuses.

    Returns
    -------
    polars.DataFrame
        :data:`INCIDENT_COLUMNS`. ``status`` is the incident's own verdict, else
        ``escalated`` if any alert is, ``false_positive`` if all are, ``acknowledged``
        if every alert is acknowledged or a false positive, else ``open``.
    """
    cfg = config or IncidentConfig()
    if alerts.height == 0:
        return empty_incidents()
    gap_us = int(cfg.gap_hours * 3_600_000_000)
    a = _prepare(alerts, cfg, alert_status)
    if now is None:
        now = max(a["detected_at"].max(), a["last_seen"].max())  # type: ignore[type-var]
    elif now.tzinfo is None:
        now = now.replace(tzinfo=UTC)

    # Activity windows per actor: a new incident where an alert starts more than the gap
    # after every earlier alert of the actor ended.
    a = a.sort("actor_type", "actor_id", "first_seen", "alert_id").with_columns(
        (
            pl.col("first_seen")
            > pl.col("last_seen").cum_max().shift(1).over("actor_type", "actor_id")
            + pl.duration(microseconds=gap_us)
        )
        .fill_null(True)
        .cast(pl.Int64)
        .cum_sum()
        .over("actor_type", "actor_id")
        .alias("_seq")
    )
    key = ["actor_type", "actor_id", "_seq"]
    a = a.with_columns(
        pl.col("first_seen").min().over(key).alias("_start"),
    ).with_columns(
        pl.concat_str(
            "actor_type", "actor_id", pl.col("_start").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ"),
            separator="\x1f",
        ).alias("_idkey")
    )
    ids = a["_idkey"].unique()
    id_map = dict(zip(ids.to_list(), [_incident_id(k) for k in ids.to_list()], strict=True))
    a = a.with_columns(pl.col("_idkey").replace_strict(id_map).alias("incident_id"))

    risk = _risk(a, cfg, now)
    inc = (
        a.sort("incident_id", "_stage_rank", "first_seen", "alert_id")
        .group_by("incident_id", maintain_order=True)
        .agg(
            pl.col("actor_type").first(),
            pl.col("actor_id").first(),
            pl.col("_caller").drop_nulls().unique(maintain_order=True).alias("caller_ids"),
            pl.col("_ip").drop_nulls().unique(maintain_order=True).alias("client_ips"),
            pl.col("category").unique(maintain_order=True).alias("categories"),
            pl.col("_stage").unique(maintain_order=True).alias("stages"),
            pl.col("_techniques").list.explode(keep_nulls=False, empty_as_null=False)
            .unique(maintain_order=True).alias("techniques"),
            pl.col("first_seen").min(),
            pl.col("last_seen").max(),
            pl.len().cast(pl.Int64).alias("n_alerts"),
            pl.col("alert_id").sort_by("first_seen", "alert_id").alias("alert_ids"),
            pl.col("_action").drop_nulls().unique(maintain_order=True).alias("_actions"),
            pl.col("server").sort_by("first_seen").drop_nulls().unique(maintain_order=True)
            .alias("servers"),
            pl.col("_status").alias("_statuses"),
        )
        .join(risk, on="incident_id", how="left")
    )
    inc = _link(inc, a, gap_us)
    inc = inc.with_columns(
        pl.when(pl.col("risk") >= cfg.risk_critical).then(pl.lit("critical"))
        .when(pl.col("risk") >= cfg.risk_high).then(pl.lit("high"))
        .when(pl.col("risk") >= cfg.risk_medium).then(pl.lit("medium"))
        .otherwise(pl.lit("low")).alias("severity"),
        _derived_status(incident_status).alias("status"),
    )
    inc = inc.with_columns(
        pl.concat_list(_actor_action(), "_actions").list.drop_nulls()
        .list.unique(maintain_order=True).list.head(cfg.max_actions)
        .alias("recommended_actions"),
        _summary().alias("summary"),
    )
    return (
        inc.select(list(INCIDENT_COLUMNS))
        .cast(INCIDENT_COLUMNS)  # type: ignore[arg-type]
        .sort(["risk", "last_seen", "incident_id"], descending=[True, True, False])
    )


def alert_actions(alerts: pl.DataFrame) -> pl.DataFrame:
    """``alerts`` with an ``action`` column: each alert's recommended action.

    The same text the alert contributes to its incident's ``recommended_actions``, built
    from the alert's category and its own evidence (tool, server, ids walked, bytes…).
    Row order and the other columns are kept; an alert with no template (an unknown
    category) gets null.
    """
    if alerts.height == 0:
        return alerts.with_columns(pl.lit(None, dtype=pl.String).alias("action"))
    acts = _prepare(alerts, IncidentConfig(), None).select(
        "alert_id", pl.col("_action").alias("action")
    )
    return alerts.join(acts, on="alert_id", how="left", maintain_order="left")


def _incident_id(key: str) -> str:
    """``inc-`` + blake2b-80 of actor kind, actor and window start (deterministic)."""
    return "inc-" + hashlib.blake2b(key.encode(), digest_size=10).hexdigest()


def _prepare(
    alerts: pl.DataFrame, cfg: IncidentConfig, alert_status: Mapping[str, str] | None
) -> pl.DataFrame:
    """Latest version per alert, with actor, stage, points, techniques and action."""
    a = alerts
    if "detected_at" in a.columns:
        a = a.sort("detected_at", descending=True).unique("alert_id", keep="first")
    caller = pl.coalesce(
        pl.col("caller_id"),
        pl.when(pl.col("entity_type") == "caller_id").then(pl.col("entity_id")),
    )
    ip = pl.coalesce(
        pl.col("client_ip"),
        pl.when(pl.col("entity_type") == "client_ip").then(pl.col("entity_id")),
    )
    stage_rank = {s: i for i, s in enumerate(STAGES)}
    points = {"low": cfg.points_low, "medium": cfg.points_medium, "high": cfg.points_high,
              "critical": cfg.points_critical}
    techniques = {c: list(t) for c, t in TECHNIQUES.items()}
    a = a.with_columns(
        caller.alias("_caller"),
        ip.alias("_ip"),
        pl.col("category").replace_strict(CATEGORY_STAGE, default="unclassified").alias("_stage"),
        pl.col("severity").replace_strict(points, default=cfg.points_low, return_dtype=pl.Float64)
        .alias("_points"),
        pl.col("category").replace_strict(techniques, default=[], return_dtype=_STR_LIST)
        .alias("_techniques"),
        pl.col("alert_id").replace_strict(dict(alert_status or {}), default="open",
                                          return_dtype=pl.String).alias("_status"),
    )
    a = _evidence_fields(a).with_columns(
        pl.when(pl.col("_caller").is_not_null()).then(pl.lit("caller_id"))
        .when(pl.col("_ip").is_not_null()).then(pl.lit("client_ip"))
        .otherwise(pl.lit("session")).alias("actor_type"),
        pl.coalesce("_caller", "_ip", "session_id", "entity_id").alias("actor_id"),
        pl.col("_stage").replace_strict(stage_rank, return_dtype=pl.Int64).alias("_stage_rank"),
    )
    return a.with_columns(_category_action().alias("_action"))


def _evidence_fields(a: pl.DataFrame) -> pl.DataFrame:
    """``_e_<field>`` columns (text) for the evidence fields the action templates use, and
    ``_e_chain_keys``.

    One typed JSON decode of the evidence (numbers read as text): 21 JSON-path lookups
    parsed every evidence 21 times (4.6 s for 100k alerts, against 0.4 s). Evidence
    whose fields have other shapes than the detectors write (hand-made alerts files)
    falls back to the lookups.
    """
    chain_dtype = pl.List(pl.Struct({"business_key": pl.String}))
    dtype = pl.Struct({
        **{f: pl.String for f in _EVIDENCE_FIELDS},
        "chain": chain_dtype,
        "overlapping_calls": pl.List(pl.Struct({"tool": pl.String})),
    })
    try:
        ev = a.select(pl.col("evidence").str.json_decode(dtype).alias("_ev")).to_series()
        fields = [ev.struct.field(f).alias(f"_e_{f}") for f in _EVIDENCE_FIELDS]
        chain = ev.struct.field("chain")
        race_tool = ev.struct.field("overlapping_calls").list.first().struct.field("tool")
        out = a.with_columns(*fields, chain.alias("_chain"), race_tool.alias("_e_race_tool"))
    except (pl.exceptions.PolarsError, ValueError):
        out = a.with_columns(
            *[pl.col("evidence").str.json_path_match(f"$.{f}").alias(f"_e_{f}")
              for f in _EVIDENCE_FIELDS],
            pl.lit(None, dtype=chain_dtype).alias("_chain"),
            pl.col("evidence").str.json_path_match("$.overlapping_calls[0].tool")
            .alias("_e_race_tool"),
        )
    return out.with_columns(_chain_keys().alias("_e_chain_keys")).drop("_chain")


def _chain_keys() -> pl.Expr:
    """The business keys of a sequence alert's chain (documents read, orders touched...),
    first five, as ``a, b, c (+2 more)``; null when the evidence has no chain."""
    chain = pl.col("_chain").list.eval(
        pl.element().struct.field("business_key").drop_nulls().unique(maintain_order=True)
    )
    n = chain.list.len()
    head = chain.list.head(5).list.join(", ")
    return (
        pl.when(n > 5).then(pl.format("{} (+{} more)", head, n - 5))
        .when(n > 0).then(head)
    )


def _e(field: str, default: str) -> pl.Expr:
    return pl.col(f"_e_{field}").fill_null(default)


def _mb(field: str) -> pl.Expr:
    return pl.format("{} MB", (pl.col(f"_e_{field}").cast(pl.Float64, strict=False) / 1e6)
                     .round(1).fill_null(0.0))


def _who() -> pl.Expr:
    return (
        pl.when(pl.col("actor_type") == "caller_id").then(pl.format("caller {}", "actor_id"))
        .when(pl.col("actor_type") == "client_ip").then(pl.format("address {}", "actor_id"))
        .otherwise(pl.format("session {}", "actor_id"))
    )


def _category_action() -> pl.Expr:
    """One action per alert, from its category's template and its own fields."""
    who, srv = _who(), pl.col("server").fill_null("its server")
    tool_raw = pl.coalesce("_e_top_tool", "_e_tool", "_e_loop_tool")
    tool = tool_raw.fill_null("its calls")  # summary-only sessions name no tool
    with_tool = pl.when(tool_raw.is_not_null()).then(pl.format(" with {}", tool_raw)) \
        .otherwise(pl.lit(""))
    keys = pl.col("_e_chain_keys")
    walked = pl.when(pl.col("_e_run_first_id").is_not_null()).then(
        pl.format(", {} … {}", "_e_run_first_id", _e("run_last_id", "?"))
    ).otherwise(pl.lit(""))
    race_tool = pl.col("_e_race_tool")
    templates = {
        "enumeration": pl.format(
            "Rate-limit {} on {} for {} and check object-level access to {} "
            "(walked {} ids{})",
            tool, srv, who, _e("resource_key", "resource"), _e("distinct_resources", "many"),
            walked,
        ),
        "credential_stuffing": pl.format(
            "Rate-limit authentication on {} per address and caller: {} distinct credentials "
            "failed from {}",
            srv, _e("distinct_failed_credentials", "many"), who,
        ),
        "bulk_extraction": pl.format(
            "Review the {} {} pulled{} on {} and cap response/export sizes there",
            _mb("total_bytes"), who, with_tool, srv,
        ),
        "scraping_loop": pl.format(
            "Rate-limit paging of {} on {} for {} ({} pages walked)",
            tool, srv, who, _e("distinct_pages", "many"),
        ),
        "tool_loop": pl.format(
            "Stop {}'s agent looping on {} on {} (limit identical repeated calls)",
            who, pl.coalesce("_e_loop_tool", "_e_top_tool").fill_null("one tool"), srv,
        ),
        "privilege_chain": pl.format(
            "Rotate the secrets {} read on {} and review what {} did; review: {}",
            who, srv, _e("first_escalation", "the escalation call"),
            keys.fill_null("the chain in the alert"),
        ),
        "step_skip": pl.format(
            "Hold {} for {} on {} and enforce its prerequisite ({}) server-side",
            _e("skipped_step", "the step"), _e("business_key", "this key"), srv,
            _e("missing_prerequisite", "see the alert"),
        ),
        "duplicate_execution": pl.format(
            "Require idempotency keys on {} on {} and reverse the duplicate executions for {} "
            "({} runs)",
            pl.coalesce("_e_tool", "_e_top_tool").fill_null("the tool"), srv,
            _e("business_key", "this key"), _e("executions", "several"),
        ),
        "race_condition": pl.format(
            "Serialize {} per resource on {} (lock or idempotency key) and check {} for double "
            "execution",
            race_tool.fill_null("the racing tool"), srv, _e("resource", "the resource"),
        ),
        "concurrency_abuse": pl.format(
            "Cap concurrent calls per caller on {}: {} had {} calls in flight at once",
            srv, who, _e("peak_in_flight", "many"),
        ),
        "cross_server_flow": pl.format(
            "Block outbound {} on {} for {} and review what it read on {} ({}); review: {}",
            _e("outbound_tool", "calls"), _e("outbound_server", "the outbound server"), who,
            _e("source_servers", "other servers"), _mb("bytes_read_elsewhere"),
            keys.fill_null("the chain in the alert"),
        ),
        "anomaly": pl.format(
            "Review session {} of {} on {}: unlike other sessions (see its reasons)",
            pl.coalesce("session_id", "entity_id"), who, srv,
        ),
    }
    expr: pl.Expr | None = None
    for cat, tpl in templates.items():
        expr = (pl.when(pl.col("category") == cat).then(tpl) if expr is None
                else expr.when(pl.col("category") == cat).then(tpl))
    assert expr is not None
    return expr.otherwise(None)  # type: ignore[attr-defined]


def _risk(a: pl.DataFrame, cfg: IncidentConfig, now: datetime) -> pl.DataFrame:
    """``incident_id``, ``peak_risk`` and decayed ``risk`` per incident.

    Per category, the points of its best alert. Sorted worst first, the first category
    gives the risk; each further one closes ``bonus * points / 100`` of the gap to 100
    (``stage_bonus`` for a stage not yet counted, ``category_bonus`` otherwise), so
    ``100 - risk = (100 - p1) * prod(1 - b_k * p_k / 100)``.
    """
    cats = (
        a.group_by("incident_id", "category")
        .agg(pl.col("_points").max(), pl.col("_stage").first(), pl.col("last_seen").max())
        .sort(["incident_id", "_points", "_stage", "category"],
              descending=[False, True, False, False])
        .with_columns(
            pl.int_range(pl.len()).over("incident_id").alias("_k"),
            pl.col("_stage").is_first_distinct().over("incident_id").alias("_new_stage"),
        )
        .with_columns(
            pl.when(pl.col("_k") == 0).then(0.0).otherwise(
                (1.0 - pl.when(pl.col("_new_stage") & (pl.col("_stage") != "unclassified"))
                 .then(cfg.stage_bonus).otherwise(cfg.category_bonus)
                 * pl.col("_points") / 100.0).clip(1e-12, 1.0).log()
            ).alias("_log")
        )
    )
    age_h = (pl.lit(now, dtype=_TS) - pl.col("last_seen")).dt.total_microseconds() / 3.6e9
    decay = (
        pl.lit(0.5).pow(age_h.clip(lower_bound=0.0) / cfg.half_life_hours)
        if cfg.half_life_hours > 0 else pl.lit(1.0)
    )
    return (
        cats.group_by("incident_id")
        .agg(
            (100.0 - (100.0 - pl.col("_points").first()) * pl.col("_log").sum().exp())
            .alias("peak_risk"),
            pl.col("last_seen").max(),
        )
        .with_columns(
            pl.col("peak_risk").clip(0.0, 100.0).round(1),
            (pl.col("peak_risk") * decay).clip(0.0, 100.0).round(1).alias("risk"),
        )
        .drop("last_seen")
    )


def _link(inc: pl.DataFrame, a: pl.DataFrame, gap_us: int) -> pl.DataFrame:
    """Join callers and addresses: an address incident lists the callers seen from that
    address around its window; a caller incident links to those address incidents."""
    pairs = a.filter(pl.col("_caller").is_not_null() & pl.col("_ip").is_not_null()).select(
        pl.col("_ip").alias("_pair_ip"),
        pl.col("_caller").alias("_pair_caller"),
        pl.col("incident_id").alias("_pair_inc"),
        pl.col("first_seen").alias("_pf"),
        pl.col("last_seen").alias("_pl"),
    )
    gap = pl.duration(microseconds=gap_us)
    hits = (
        inc.filter(pl.col("actor_type") == "client_ip")
        .select("incident_id", "actor_id", "first_seen", "last_seen")
        .join(pairs, left_on="actor_id", right_on="_pair_ip", how="inner")
        .filter((pl.col("_pf") <= pl.col("last_seen") + gap)
                & (pl.col("_pl") >= pl.col("first_seen") - gap)
                & (pl.col("_pair_inc") != pl.col("incident_id")))
    )
    by_addr = hits.group_by("incident_id").agg(
        pl.col("_pair_caller").unique().sort().alias("_linked_callers"),
        pl.col("_pair_inc").unique().sort().alias("_linked_a"),
    )
    by_caller = hits.group_by("_pair_inc").agg(
        pl.col("incident_id").unique().sort().alias("_linked_b")
    ).rename({"_pair_inc": "incident_id"})
    empty = pl.lit([], dtype=_STR_LIST)
    return (
        inc.join(by_addr, on="incident_id", how="left")
        .join(by_caller, on="incident_id", how="left")
        .with_columns(
            pl.concat_list(pl.col("caller_ids"), pl.col("_linked_callers").fill_null(empty))
            .list.unique(maintain_order=True).alias("caller_ids"),
            pl.concat_list(pl.col("_linked_a").fill_null(empty),
                           pl.col("_linked_b").fill_null(empty))
            .list.unique().list.sort().alias("linked_incident_ids"),
        )
    )


def _derived_status(incident_status: Mapping[str, str] | None) -> pl.Expr:
    st = pl.col("_statuses")
    derived = (
        pl.when(st.list.contains("escalated")).then(pl.lit("escalated"))
        .when(st.list.eval(pl.element() == "false_positive").list.all())
        .then(pl.lit("false_positive"))
        .when(st.list.eval(pl.element().is_in(["acknowledged", "false_positive"])).list.all())
        .then(pl.lit("acknowledged"))
        .otherwise(pl.lit("open"))
    )
    if not incident_status:
        return derived
    own = pl.col("incident_id").replace_strict(dict(incident_status), default=None,
                                               return_dtype=pl.String)
    return pl.coalesce(own, derived)


def _actor_action() -> pl.Expr:
    """Cut the actor off when the incident is high/critical or names a cut-off category."""
    cut = pl.col("severity").is_in(["high", "critical"]) | pl.col("categories").list.eval(
        pl.element().is_in(list(_CUT_OFF))
    ).list.any()
    n_callers = pl.col("caller_ids").list.len()
    return (
        pl.when(cut & (pl.col("actor_type") == "caller_id"))
        .then(pl.format("Revoke caller {}'s token and sessions until reviewed",
                        "actor_id"))
        .when(cut & (pl.col("actor_type") == "client_ip") & (n_callers > 1))
        .then(pl.format("Block address {} until reviewed (it serves {} callers: check it is "
                        "not a shared NAT or proxy first)", "actor_id", n_callers))
        .when(cut & (pl.col("actor_type") == "client_ip"))
        .then(pl.format("Block address {} until reviewed", "actor_id"))
    )


def _summary() -> pl.Expr:
    """One line: who, the stages in order, where, how many alerts, how bad."""
    n_ips = pl.col("client_ips").list.len()
    n_callers = pl.col("caller_ids").list.len()
    who = (
        pl.when((pl.col("actor_type") == "caller_id") & (n_ips == 1))
        .then(pl.format("caller {} from {}", "actor_id", pl.col("client_ips").list.first()))
        .when((pl.col("actor_type") == "caller_id") & (n_ips > 1))
        .then(pl.format("caller {} from {} addresses", "actor_id", n_ips))
        .when(pl.col("actor_type") == "caller_id").then(pl.format("caller {}", "actor_id"))
        .when((pl.col("actor_type") == "client_ip") & (n_callers > 0))
        .then(pl.format("address {} ({} callers)", "actor_id", n_callers))
        .when(pl.col("actor_type") == "client_ip").then(pl.format("address {}", "actor_id"))
        .otherwise(pl.format("session {}", "actor_id"))
    )
    stages = pl.col("stages").list.join(" → ").str.replace_all("_", " ")
    servers = pl.col("servers").list.head(3).list.join(", ")
    where = pl.when(pl.col("servers").list.len() > 0).then(pl.format(" on {}", servers)) \
        .otherwise(pl.lit(""))
    return pl.format(
        "{}: {} ({}){}; {} alert(s), risk {} ({})",
        who, stages, pl.col("categories").list.join(", "), where, "n_alerts", "risk",
        "severity",
    )
