"""What a tool *does*: roles, business keys and idempotency keys, computed columnar.

Sequence detectors (tool loops, privilege chains, step skips, duplicate execution,
cross-server flows) and the concurrency detectors need to know which calls read, which
mutate state, which are irreversible and which send data out, and which argument names
the business object (``orderId``) or carries an idempotency key. Nothing here is a
per-event Python loop: roles are decided once per *distinct* ``(server, tool)`` pair and
joined back, and argument values are extracted once per *distinct* argument text.

Roles (:data:`ROLES`), by the tool name's leading verb (``fulfillOrder`` → ``fulfill`` →
``irreversible``), then a few nouns anywhere in the name (``applyCoupon`` →
``irreversible``), overridable per tool or per ``server/tool`` in ``[detectors.tools]``:

* ``read`` — get, read, fetch, view, download, export, summarize … (the default);
* ``list_search`` — list, search, find, query, browse, scan …;
* ``write`` — create, update, set, put, write, add, save, log, cancel, book …;
* ``irreversible`` — charge, pay, refund, transfer, delete, fulfil, ship, approve, void,
  capture, withdraw, redeem, purge …, and names mentioning payment / refund / coupon;
* ``admin_exec`` — exec, execute, run, shell, eval, grant, deploy, install, sudo …;
* ``outbound`` — upload, send, post, publish, email, notify, share, webhook, forward …;
* ``auth`` — login, authenticate, connect, signin, token, refresh ….

Example config::

    [detectors.tools]
    idempotency_keys = ["idempotencyKey", "Idempotency-Key"]
    [detectors.tools.roles]
    "shop-server/fulfillOrder" = "irreversible"
    runReport = "read"                # any server
    [detectors.tools.business_keys]
    fulfillOrder = "orderId"
    [detectors.tools.idempotency_args]
    "payments/chargePayment" = ["dedupeToken"]

Interface (also used by ``detectors/concurrency.py``):

* :func:`tool_table` — one row per distinct ``(server, tool)``: ``tool_role``,
  ``mutates``, ``irreversible``, ``outbound``, ``sensitive_tool``, ``bk_arg``.
* :func:`annotate` — adds per-event columns ``tool_role``, ``mutates``, ``irreversible``,
  ``outbound``, ``sensitive`` (the call touches a sensitive place: by tool name or by
  argument text), ``bk`` (business-key value: the configured argument, else the
  resource id found at ingest), ``bk_arg`` (its argument name), ``bkh`` (64-bit hash of
  ``bk``), ``idem`` (idempotency-key value or null) and ``idemh`` (its hash).
* :func:`annotated` — :func:`annotate` of a :class:`~toolwatch.detectors.base.FeatureSet`'s events,
  computed once per feature set and cached on it.

Keys and values are compared as stored: a secret argument already hashed at ingest
(``hmac:…``) is still equal to itself, which is all duplicate detection needs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import polars as pl
from toolwatch.detectors.config import TOOL_ROLES as ROLES
from toolwatch.detectors.config import DetectorsConfig, ToolsConfig

if TYPE_CHECKING:
    from toolwatch.detectors.base import FeatureSet

__all__ = ["MUTATING_ROLES", "ROLES", "annotate", "annotated", "role_of", "tool_table"]

#: Roles whose calls change state (what concurrency detectors race on).
MUTATING_ROLES = ("write", "irreversible", "admin_exec")

_SEED = 0x7077

#: Leading verb → role. The verb is the name's first word (camelCase, snake_case,
#: kebab-case or dotted: ``fulfillOrder``, ``fulfill_order``, ``orders.fulfill`` → last
#: dotted part's first word).
VERBS: dict[str, str] = {
    **dict.fromkeys(
        ("list", "search", "find", "query", "browse", "scan", "lookup", "enumerate",
         "filter", "select", "paginate", "page", "recent"), "list_search"),
    **dict.fromkeys(
        ("create", "update", "set", "put", "write", "edit", "add", "insert", "save", "modify",
         "patch", "move", "rename", "log", "append", "upsert", "commit", "merge", "submit",
         "book", "reserve", "cancel", "sync", "assign", "tag", "comment", "mark", "archive",
         "restore", "import", "register", "schedule", "enqueue", "start", "open", "close",
         "link", "attach", "upload_own"), "write"),
    **dict.fromkeys(
        ("charge", "pay", "refund", "transfer", "delete", "remove", "purge", "drop", "destroy",
         "fulfill", "fulfil", "ship", "approve", "void", "capture", "withdraw", "redeem",
         "wipe", "terminate", "revoke", "settle", "disburse", "payout", "apply", "finalize",
         "release", "execute_payment"), "irreversible"),
    **dict.fromkeys(
        ("exec", "execute", "run", "shell", "eval", "grant", "deploy", "install", "sudo",
         "elevate", "impersonate", "invoke", "chmod", "chown", "spawn", "script", "admin",
         "promote", "escalate", "provision"), "admin_exec"),
    **dict.fromkeys(
        ("upload", "send", "post", "publish", "email", "mail", "notify", "share", "webhook",
         "forward", "tweet", "sms", "message", "push", "emit", "broadcast", "exfil", "sendmail",
         "slack", "transmit"), "outbound"),
    **dict.fromkeys(
        ("login", "logout", "authenticate", "auth", "signin", "connect", "token", "refresh",
         "authorize", "oauth", "verify_credentials"), "auth"),
    **dict.fromkeys(
        ("get", "read", "fetch", "view", "show", "describe", "download", "export", "load",
         "summarize", "retrieve", "check", "status", "poll", "inspect", "verify", "review",
         "count", "stat", "head", "cat", "resolve", "preview", "render", "compare", "diff",
         "validate", "estimate", "quote", "calculate", "wait", "ping", "health"), "read"),
}

#: Nouns anywhere in the name that make a tool irreversible whatever its verb
#: (``applyCoupon``, ``createPayment``, ``issueRefund``).
IRREVERSIBLE_NOUNS = ("payment", "refund", "coupon", "payout", "transfer", "withdrawal",
                      "charge")

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def _words(tool: str) -> list[str]:
    last = re.split(r"[./:]", tool)[-1] if tool else ""
    return [w.lower() for w in _WORD.findall(last)]


def role_of(tool: str | None, server: str | None = None,
            config: ToolsConfig | None = None) -> str:
    """Role of one tool name (the scalar rule :func:`tool_table` applies per distinct tool).

    Parameters
    ----------
    tool, server
        Tool and server names as logged.
    config
        ``[detectors.tools]``; overrides are looked up as ``server/tool`` then ``tool``.
    """
    cfg = config or ToolsConfig()
    name = tool or ""
    for key in (f"{server}/{name}", name):
        if key in cfg.roles:
            return cfg.roles[key]
    words = _words(name)
    if words:
        role = VERBS.get(words[0])
        if role is None and len(words) > 1:
            # "bulkDelete", "adminGrantRole": a qualifier before the verb.
            second = VERBS.get(words[1])
            role = second if second not in (None, "read") else None
        if role in (None, "write") and any(n in w for w in words for n in IRREVERSIBLE_NOUNS):
            role = "irreversible"
        if role is not None:
            return role
    return "read"


def _override(cfg_map: dict[str, object], server: str | None, tool: str | None) -> object:
    if tool is None:
        return None
    v = cfg_map.get(f"{server}/{tool}")
    return cfg_map.get(tool) if v is None else v


def tool_table(events: pl.DataFrame, config: DetectorsConfig) -> pl.DataFrame:
    """One row per distinct ``(server, tool)`` with its role and keys.

    Returns
    -------
    polars.DataFrame
        ``server``, ``tool``, ``tool_role`` (one of :data:`ROLES`), ``mutates``,
        ``irreversible``, ``outbound``, ``sensitive_tool`` (the name itself names a
        sensitive place: ``getCredentials``, ``readSecret``), ``bk_arg`` (configured
        business-key argument, or null: the resource id found at ingest is used) and
        ``idem_args`` (idempotency-key argument names, list).
    """
    tc = config.tools
    pairs = events.select("server", "tool").unique(maintain_order=True)
    rows = pairs.rows()
    terms = [t.lower() for t in tc.sensitive_terms]
    roles, sens, bks, idems = [], [], [], []
    # A handful of distinct tools: plain Python over them is the columnar way here.
    for server, tool in rows:
        roles.append(role_of(tool, server, tc))
        low = (tool or "").lower()
        sens.append(any(t in low for t in terms))
        bks.append(_override(tc.business_keys, server, tool))
        extra = _override(tc.idempotency_args, server, tool) or []
        idems.append([*tc.idempotency_keys, *[k for k in extra if k not in tc.idempotency_keys]])
    role = pl.Series("tool_role", roles, pl.String)
    return pairs.with_columns(
        role,
        role.is_in(list(MUTATING_ROLES)).alias("mutates"),
        (role == "irreversible").alias("irreversible"),
        (role == "outbound").alias("outbound"),
        pl.Series("sensitive_tool", sens, pl.Boolean),
        pl.Series("bk_arg", bks, pl.String),
        pl.Series("idem_args", idems, pl.List(pl.String)),
    )


def _value_pattern(key: str) -> str:
    # "key": "value" or "key": 123 — values up to 512 characters, escapes allowed.
    return rf'"{re.escape(key)}"\s*:\s*(?:"((?:[^"\\]|\\.){{0,512}})"|(-?[0-9][0-9.eE+-]{{0,40}}))'


def _extract(args: pl.Expr, key: str) -> pl.Expr:
    pat = _value_pattern(key)
    return pl.coalesce(args.str.extract(pat, 1), args.str.extract(pat, 2))


def annotate(events: pl.DataFrame, config: DetectorsConfig) -> pl.DataFrame:
    """Per-event role, sensitivity, business key and idempotency key (columnar).

    Parameters
    ----------
    events
        Rows with at least ``server``, ``tool``, ``args`` and optionally ``resource_id``
        (prepared events or raw ``schema.EVENTS`` rows); row order is kept.
    config
        Detector configuration (its ``tools`` table).

    Returns
    -------
    polars.DataFrame
        ``events`` plus ``tool_role``, ``mutates``, ``irreversible``, ``outbound``,
        ``sensitive``, ``bk_arg``, ``bk``, ``bkh``, ``idem``, ``idemh``.
    """
    tc = config.tools
    ev = events
    for c, dt in (("server", pl.String), ("tool", pl.String), ("args", pl.String),
                  ("resource_id", pl.String), ("resource_key", pl.String)):
        if c not in ev.columns:
            ev = ev.with_columns(pl.lit(None, dt).alias(c))
    table = tool_table(ev, config)
    keyed = ev.select("server", "tool").join(
        table, on=["server", "tool"], how="left", maintain_order="left", nulls_equal=True
    )
    ah = pl.col("args").fill_null("").hash(_SEED)
    base = ev.select(
        ah.alias("_ah"), "args", keyed["idem_args"].alias("_ia"), keyed["bk_arg"].alias("_bka"),
    )
    # Argument texts worth a regular expression: those mentioning a configured key or a
    # sensitive term. One Aho-Corasick pass over the *distinct* texts finds them.
    idem_keys = sorted({k for ks in table["idem_args"].to_list() for k in ks})
    bk_keys = sorted({k for k in table["bk_arg"].drop_nulls().to_list()})
    distinct = base.filter(pl.col("_ah").is_first_distinct()).with_columns(
        pl.col("args").fill_null("")
    )
    looked = distinct.select("_ah").with_columns(
        pl.col("_ah").alias("_ah2"),
        (pl.lit(False) if not tc.sensitive_terms else distinct["args"].str.contains_any(
            list(tc.sensitive_terms), ascii_case_insensitive=True)).alias("_sens_args"),
    ).drop("_ah2")
    if idem_keys:
        d_idem = distinct.filter(
            pl.col("args").str.contains_any([f'"{k}"' for k in idem_keys])
        )
        idem = pl.coalesce([_extract(pl.col("args"), k) for k in idem_keys]) if d_idem.height \
            else pl.lit(None, pl.String)
        d_idem = d_idem.select("_ah", idem.alias("idem")) if d_idem.height else \
            pl.DataFrame(schema={"_ah": pl.UInt64, "idem": pl.String})
    else:
        d_idem = pl.DataFrame(schema={"_ah": pl.UInt64, "idem": pl.String})
    if bk_keys:
        d_bk = distinct.filter(pl.col("args").str.contains_any([f'"{k}"' for k in bk_keys]))
        d_bk = d_bk.select("_ah", *[_extract(pl.col("args"), k).alias(f"_bk_{i}")
                                    for i, k in enumerate(bk_keys)])
    lk = base.select("_ah", "_bka").join(looked, on="_ah", how="left", maintain_order="left")
    lk = lk.join(d_idem, on="_ah", how="left", maintain_order="left")
    if bk_keys:
        lk = lk.join(d_bk, on="_ah", how="left", maintain_order="left")
        configured = pl.coalesce(
            [pl.when(pl.col("_bka") == k).then(pl.col(f"_bk_{i}"))
             for i, k in enumerate(bk_keys)]
        )
    else:
        configured = pl.lit(None, pl.String)
    lk = lk.select(
        pl.col("_sens_args").fill_null(False),
        pl.col("idem"),
        configured.alias("_bk_conf"),
    )
    bk = pl.when(keyed["bk_arg"].is_not_null()).then(lk["_bk_conf"]).otherwise(
        pl.col("resource_id"))
    out = ev.with_columns(
        keyed["tool_role"],
        keyed["mutates"],
        keyed["irreversible"],
        keyed["outbound"],
        (keyed["sensitive_tool"] | lk["_sens_args"]).alias("sensitive"),
        pl.coalesce(keyed["bk_arg"], pl.col("resource_key")).alias("bk_arg"),
        bk.alias("bk"),
        lk["idem"].alias("idem"),
    )
    return out.with_columns(
        pl.when(pl.col("bk").is_not_null()).then(pl.col("bk").hash(_SEED)).alias("bkh"),
        pl.when(pl.col("idem").is_not_null()).then(pl.col("idem").hash(_SEED)).alias("idemh"),
    )


def annotated(features: FeatureSet) -> pl.DataFrame:
    """:func:`annotate` of ``features.events``, computed once per feature set (cached)."""
    cached = getattr(features, "_tools_annotated", None)
    if cached is not None and cached.height == features.events.height:
        return cached
    out = annotate(features.events, features.config)
    features._tools_annotated = out  # type: ignore[attr-defined]
    return out
