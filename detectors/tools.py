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
from toolwatch.detectors.features import SEED as _FEATURES_SEED

if TYPE_CHECKING:
    from toolwatch.detectors.base import FeatureSet

__all__ = ["MUTATING_ROLES", "ROLES", "annotate", "annotated", "role_of", "tool_table"]

#: Roles whose calls change state (what concurrency detectors race on).
MUTATING_ROLES = ("write", "irreversible", "admin_exec")

_SEED = 0x7077
#: An aggregate query in an argument's text: a select list that opens with an aggregate
#: function (``SELECT count(*) …``) or a GROUP BY.
_AGGREGATE = r"(?i)\bselect\s+(?:distinct\s+)?(?:count|sum|avg|min|max)\s*\(|\bgroup\s+by\b"

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
         "link", "attach", "upload_own", "increment", "decrement", "process", "reset",
         "migrate", "backfill", "reindex", "upgrade", "convert", "repair", "fix"),
        "write"),
    **dict.fromkeys(
        ("charge", "pay", "refund", "transfer", "delete", "remove", "purge", "drop", "destroy",
         "fulfill", "fulfil", "ship", "approve", "void", "capture", "withdraw", "redeem",
         "wipe", "terminate", "revoke", "settle", "disburse", "payout", "apply", "finalize",
         "release", "execute_payment", "spend",
         # "checkout" is one word, not the verb "check": it places the order.
         "checkout"), "irreversible"),
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

#: Objects of an executing verb that make the call a read (``run_query``, ``runReport``).
READ_OBJECTS = frozenset(("query", "report", "search", "lookup", "analysis", "analytics",
                          "metrics", "stats", "forecast", "preview"))

#: Nouns anywhere in the name that make a tool irreversible whatever its verb
#: (``applyCoupon``, ``createPayment``, ``issueRefund``).
IRREVERSIBLE_NOUNS = ("payment", "refund", "coupon", "payout", "transfer", "withdrawal",
                      "charge")

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def _words(tool: str) -> list[str]:
    last = re.split(r"[./:]", tool)[-1] if tool else ""
    return [w.lower() for w in _WORD.findall(last)]


def first_words(tools: pl.Series) -> pl.Series:
    """``(_words(t) or [""])[0]`` of each name, columnar (null stays null).

    For a million distinct tool names, where the per-name Python loop held a list of
    a million strings and another of their verbs. The Rust regex has no lookahead, so
    ``[A-Z]+(?![a-z])`` is matched as ``[A-Z]+`` followed by an optional lower-case
    letter: when there is one, the last capital starts the next word (``HTTPServer``
    -> ``http``), which is where Python's backtracking ends too.
    """
    last = tools.str.replace(r"(?s)^.*[./:]", "")
    g = last.str.extract_groups(r"([A-Z]?[a-z]+|[A-Z]+|\d+)([a-z]?)")
    w, nxt = g.struct.field("1"), g.struct.field("2")
    cut = (nxt != "") & w.str.contains(r"^[A-Z]{2,}$")
    out = pl.select(
        pl.when(cut).then(w.str.slice(0, w.str.len_chars() - 1)).otherwise(w)
        .str.to_lowercase().fill_null("")
    ).to_series()
    return pl.select(pl.when(tools.is_null()).then(None).otherwise(out)).to_series()


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
        if role == "admin_exec" and any(w in READ_OBJECTS for w in words[1:]):
            # "run_query", "runReport": running a read is reading, not executing code.
            return "read"
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


def tool_table(
    events: pl.DataFrame, config: DetectorsConfig, *, idem_lists: bool = True,
    distinct: bool = False,
) -> pl.DataFrame:
    """One row per distinct ``(server, tool)`` with its role and keys.

    Parameters
    ----------
    events
        Rows with ``server`` and ``tool``; the table keeps their first-seen order.
    config
        Detector configuration (its ``tools`` table).
    idem_lists
        False: ``idem_args`` is null except on tools with an ``idempotency_args``
        override (their full list), so a million distinct tools do not each carry a
        copy of the default list; the defaults are ``config.tools.idempotency_keys``.
    distinct
        True: the ``(server, tool)`` rows of ``events`` are already distinct (the
        table is built on them as they are, without a string group-by of the pairs).

    Returns
    -------
    polars.DataFrame
        ``server``, ``tool``, ``tool_role`` (one of :data:`ROLES`), ``mutates``,
        ``irreversible``, ``outbound``, ``sensitive_tool`` (the name itself names a
        sensitive place: ``getCredentials``, ``readSecret``), ``data_tool`` (it names
        records of people or a business: ``get_customer_export``), ``bk_arg`` (configured
        business-key argument, or null: the resource id found at ingest is used) and
        ``idem_args`` (idempotency-key argument names, list).
    """
    tc = config.tools
    pairs = events.select("server", "tool")
    if not distinct:
        pairs = pairs.unique(maintain_order=True)
    server, tool = pl.col("server"), pl.col("tool")
    # Columnar over the distinct pairs: a log can name a million distinct tools (issue 28:
    # 6 GB at 1M names, almost all of it a Python list of lists per tool turned into the
    # idem_args column). Only the role rule and the configured overrides run in Python.
    roles = [role_of(t, sv, tc) for sv, t in pairs.iter_rows()]
    # f"{server}/{tool}" as Python spells it (a null server reads "None").
    sv_tool = pl.format("{}/{}", server.fill_null("None"), tool.fill_null("None"))
    low = tool.fill_null("").str.to_lowercase()
    terms = [t.lower() for t in tc.sensitive_terms]
    dterms = [t.lower() for t in tc.data_terms]
    sens = low.str.contains_any(terms) if terms else pl.lit(False)
    data = low.str.contains_any(dterms) if dterms else pl.lit(False)
    if tc.data_tools:
        dtools = list(tc.data_tools)
        data = data | tool.is_in(dtools).fill_null(False) | sv_tool.is_in(dtools)
    base = list(tc.idempotency_keys)
    out = pairs.with_columns(pl.Series("tool_role", roles, pl.String))
    bk = pl.lit(None, pl.String)
    idem = pl.lit(base if idem_lists else None, dtype=pl.List(pl.String))
    if tc.business_keys or tc.idempotency_args:
        # Overrides name a few tools: look them up on the rows that may match only.
        keys = [*tc.business_keys, *tc.idempotency_args]
        cand = out.with_row_index("_i").filter(
            tool.is_in(keys).fill_null(False) | sv_tool.is_in(keys))
        ov_i, ov_bk, ov_idem = [], [], []
        for i, sv, t in cand.select("_i", "server", "tool").iter_rows():
            extra = _override(tc.idempotency_args, sv, t) or []
            ov_i.append(i)
            ov_bk.append(_override(tc.business_keys, sv, t))
            ov_idem.append([*base, *[k for k in extra if k not in base]])
        ov = pl.DataFrame(
            {"_i": ov_i, "_bk": ov_bk, "_idem": ov_idem},
            schema={"_i": pl.UInt32, "_bk": pl.String, "_idem": pl.List(pl.String)},
        )
        out = out.with_row_index("_i").join(ov, on="_i", how="left", maintain_order="left")
        bk, idem = pl.col("_bk"), pl.coalesce(pl.col("_idem"), idem)
    role = pl.col("tool_role")
    return out.select(
        "server", "tool", "tool_role",
        role.is_in(list(MUTATING_ROLES)).alias("mutates"),
        (role == "irreversible").alias("irreversible"),
        (role == "outbound").alias("outbound"),
        sens.alias("sensitive_tool"),
        data.alias("data_tool"),
        bk.alias("bk_arg"),
        idem.alias("idem_args"),
    )


def _value_pattern(key: str) -> str:
    # "key": "value" or "key": 123 — values up to 512 characters, escapes allowed.
    return rf'"{re.escape(key)}"\s*:\s*(?:"((?:[^"\\]|\\.){{0,512}})"|(-?[0-9][0-9.eE+-]{{0,40}}))'


def _extract(args: pl.Expr, key: str) -> pl.Expr:
    pat = _value_pattern(key)
    return pl.coalesce(args.str.extract(pat, 1), args.str.extract(pat, 2))


def _pair_key() -> pl.Expr:
    # One 64-bit key per (server, tool): polars groups and joins one integer column far
    # faster than two string columns. Null hashes differ from "" hashes, so a null tool
    # stays distinct from an empty one, as the string columns were.
    return pl.struct(pl.col("server").hash(_SEED), pl.col("tool").hash(_SEED)).hash(_SEED)


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
        ``sensitive``, ``data`` (the call reads records of people or a business, by tool
        name or argument text: ``data_terms``, ``data_tools``), ``bk_arg``, ``bk``,
        ``bkh``, ``idem``, ``idemh``.

    Notes
    -----
    Cost: per event, two hashes (the (server, tool) pair and the argument text) and two
    lookups on those integer keys; everything else runs on the few distinct tools and on
    the distinct argument texts that mention a sensitive term or a configured key.
    """
    return _annotate(events, config)[0]


def _annotate(
    events: pl.DataFrame, config: DetectorsConfig
) -> tuple[pl.DataFrame, tuple[tuple[str, ...], tuple[str, ...]]]:
    """:func:`annotate`, and the argument names it looked for: ``(idempotency keys,
    business keys)`` of the ``(server, tool)`` pairs present.

    Every event's annotation is a function of the event and of these two sets, so two
    frames annotated with the same sets can be stacked instead of annotated again
    (:meth:`toolwatch.detectors.base.FeatureSet.union`).
    """
    tc = config.tools
    ev = events
    for c, dt in (("server", pl.String), ("tool", pl.String), ("args", pl.String),
                  ("resource_id", pl.String), ("resource_key", pl.String)):
        if c not in ev.columns:
            ev = ev.with_columns(pl.lit(None, dt).alias(c))
    keys = ev.select(_pair_key().alias("_pk"), pl.col("args").fill_null("").hash(_SEED)
                     .alias("_ah"))
    firsts = pl.concat([keys.select("_pk"), ev.select("server", "tool")], how="horizontal")
    firsts = firsts.filter(pl.col("_pk").is_first_distinct())
    # Distinct keys are distinct pairs: no second de-duplication on the strings (at 1M
    # distinct tools that hash table was the annotation's peak).
    table = tool_table(firsts, config, idem_lists=False, distinct=True)
    if table.height == firsts.height:
        # Same rows in the same order (tool_table keeps first-seen order): no need to
        # join a million tool names back on their strings.
        table = pl.concat([firsts.select("_pk"), table], how="horizontal")
    else:  # two pairs share a 64-bit key: match on the strings
        table = firsts.join(table, on=["server", "tool"], how="left", nulls_equal=True)
    # Per event, the columns it needs (not the list of idempotency argument names).
    keyed = keys.select("_pk").join(
        table.select("_pk", "tool_role", "mutates", "irreversible", "outbound",
                     "sensitive_tool", "data_tool", "bk_arg"),
        on="_pk", how="left", maintain_order="left")
    # Argument texts worth a regular expression: those mentioning a configured key or a
    # sensitive term. One Aho-Corasick pass over the *distinct* texts finds them; only
    # the texts with a finding are looked up per event.
    # Distinct names columnar: one Python list per distinct tool is what 1M tools cost.
    idem_keys = sorted(
        {*(tc.idempotency_keys if table.height else ()),
         *table["idem_args"].explode().drop_nulls().unique().to_list()}
    )
    bk_keys = sorted(table["bk_arg"].drop_nulls().unique().to_list())
    distinct = pl.concat([keys.select("_ah"), ev.select("args")], how="horizontal").filter(
        pl.col("_ah").is_first_distinct()).with_columns(pl.col("args").fill_null(""))
    args = pl.col("args")
    sens = (pl.lit(False) if not tc.sensitive_terms else args.str.contains_any(
        list(tc.sensitive_terms), ascii_case_insensitive=True))
    dsens = (pl.lit(False) if not tc.data_terms else args.str.contains_any(
        list(tc.data_terms), ascii_case_insensitive=True)
        # An aggregate query over a table of records returns figures, not the records.
        & ~args.str.contains(_AGGREGATE))
    has_idem = args.str.contains_any([f'"{k}"' for k in idem_keys]) if idem_keys else None
    has_bk = args.str.contains_any([f'"{k}"' for k in bk_keys]) if bk_keys else None
    conds = [pl.col("_sens_args"), pl.col("_data_args"),
             *[c for c in (has_idem, has_bk) if c is not None]]
    # The regular expressions then run on the few texts with a finding only.
    d = distinct.with_columns(sens.alias("_sens_args"), dsens.alias("_data_args")).filter(
        pl.any_horizontal(conds))
    d = d.select(
        "_ah", "_sens_args", "_data_args",
        (pl.lit(None, pl.String) if has_idem is None else pl.when(has_idem).then(
            pl.coalesce([_extract(args, k) for k in idem_keys]))).alias("idem"),
        *[pl.when(has_bk).then(_extract(args, k)).alias(f"_bk_{i}")
          for i, k in enumerate(bk_keys)],
    )
    lk = keys.select("_ah").join(d, on="_ah", how="left", maintain_order="left")
    if bk_keys:
        configured = pl.coalesce(
            [pl.when(keyed["bk_arg"] == k).then(pl.col(f"_bk_{i}")) for i, k in enumerate(bk_keys)]
        )
        bk_conf = lk.select(configured.alias("_bk_conf"))["_bk_conf"]
        bk = pl.when(keyed["bk_arg"].is_not_null()).then(bk_conf).otherwise(
            pl.col("resource_id"))
    else:
        bk = pl.col("resource_id")
    out = ev.with_columns(
        keyed["tool_role"],
        keyed["mutates"],
        keyed["irreversible"],
        keyed["outbound"],
        (keyed["sensitive_tool"] | lk["_sens_args"].fill_null(False)).alias("sensitive"),
        (keyed["data_tool"] | lk["_data_args"].fill_null(False)).alias("data"),
        pl.coalesce(keyed["bk_arg"], pl.col("resource_key")).alias("bk_arg"),
        bk.alias("bk"),
        lk["idem"].alias("idem"),
    )
    if not bk_keys and _SEED == _FEATURES_SEED and out.schema.get("rh") == pl.UInt64:
        # The business key is the resource id, whose hash (same seed, null for null) the
        # prepared events already carry.
        bkh = pl.col("rh")
    else:
        bkh = pl.when(pl.col("bk").is_not_null()).then(pl.col("bk").hash(_SEED))
    return out.with_columns(
        bkh.alias("bkh"),
        pl.when(pl.col("idem").is_not_null()).then(pl.col("idem").hash(_SEED)).alias("idemh"),
    ), (tuple(idem_keys), tuple(bk_keys))


def annotated(features: FeatureSet) -> pl.DataFrame:
    """:func:`annotate` of ``features.events``, computed once per feature set (cached)."""
    cached = getattr(features, "_tools_annotated", None)
    if cached is not None and cached.height == features.events.height:
        return cached
    out, keys = _annotate(features.events, features.config)
    features._tools_annotated = out  # type: ignore[attr-defined]
    features._tools_keys = keys  # type: ignore[attr-defined]
    return out
