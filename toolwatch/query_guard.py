"""Whitelist guard for forensic SQL: one plain SELECT over the store's views, nothing else.

Why a whitelist: a statement-type check (``SELECT``/``EXPLAIN`` allowed) let
``EXPLAIN ANALYZE COPY (…) TO '<store>/…'`` run its COPY, and a SELECT can call table
functions that read any file. So the guard parses the SQL with DuckDB's own parser
(``json_serialize_sql``: the parse tree of SELECT statements as JSON; anything that is
not a SELECT — EXPLAIN, COPY, PRAGMA, SET, ATTACH, INSTALL/LOAD, CALL, DDL, DML — does
not serialize and is refused) and walks the whole tree:

* every object in the tree must have a shape the guard knows: its kind (expression
  ``class``, node ``type``) and its keys must be in the tables below, or the query is
  refused (fail closed: a DuckDB upgrade that adds a node type or a key refuses queries
  using it until the guard is reviewed, it never lets them through unseen);
* a table reference must name one of the store's views, or a CTE in scope; no
  catalog/schema qualification (``information_schema``, ``system.main``, another
  database), no time travel (``AT (…)``), no file name (``FROM 'x.parquet'``);
* a table function must be one of :data:`ALLOWED_TABLE_FUNCTIONS` (pure generators);
* a scalar, aggregate or window function must be a built-in of this DuckDB build
  (snapshot of ``duckdb_functions()`` with extension autoloading off, so an unknown name
  can never pull an extension in) and not in :data:`DENIED_FUNCTIONS` (functions that
  read configuration or session state, sleep, parse or plan SQL, or rebuild internal
  binary states from bytes);
* no PIVOT (it runs a hidden pre-query and creates a type), no DESCRIBE/SUMMARIZE;
* names are compared as DuckDB's binder compares them (:func:`fold`: ASCII case only),
  and a name that NFKC/Unicode case folding would read as other letters (a Kelvin sign)
  is refused; a CTE sees only earlier CTEs (itself only when recursive) and may not take
  the name of a catalog table, view or table function; catalog readers are refused
  (``pg_get_viewdef``, ``current_schema``…, ``duckdb_*``/``pragma_*``, and any built-in
  macro whose body has a subquery or a catalog reference).

The guard is the first wall. The second is the connection the query runs on
(:func:`toolwatch.query.query_connection`): no file system access at all, no
writable directory, configuration locked. The third is the process: the guard and the
query run in a child with an OS memory cap, killed at the timeout
(:mod:`toolwatch.query_child`).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import duckdb
import orjson

from toolwatch.errors import QueryRefusedError, first_line

#: Table functions a query may call: pure generators that touch nothing outside the query.
#: Everything else (read_*, glob, query/query_table, duckdb_*(), parquet_*, arrow_scan,
#: which would dereference a pointer given as an argument, …) is refused.
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

#: Built-in functions refused although they touch no file: they reveal or change session
#: state and configuration (paths included), sleep uninterruptibly, parse/plan SQL text
#: (``json_serialize_plan`` binds a statement, which opens the files it names), write to
#: DuckDB's log, use sequences, or turn bytes into internal states (``finalize`` of a
#: forged aggregate state).
DENIED_FUNCTIONS = frozenset(
    {
        "current_setting",
        "getvariable",
        "current_query",
        "current_query_id",
        "current_connection_id",
        "current_transaction_id",
        "txid_current",
        "sleep_ms",
        "pg_sleep",
        "setseed",
        "nextval",
        "currval",
        "setval",
        "write_log",
        "parse_duckdb_log_message",
        "json_serialize_sql",
        "json_deserialize_sql",
        "json_serialize_plan",
        "json_execute_serialized_sql",
        "finalize",
        "combine",
        "combine_aggr",
        "to_aggregate_state",
        "variant_bytes_to_variant",
        "variant_to_parquet_variant",
        "get_block_size",
        "pg_postmaster_start_time",
        "pg_conf_load_time",
        "inet_client_addr",
        "inet_client_port",
        "inet_server_addr",
        "inet_server_port",
        # Catalog readers: pg_get_viewdef() is a macro over duckdb_views(), whose SQL lists
        # every store file path; the others read the catalog or the database's location.
        "pg_get_viewdef",
        "pg_get_constraintdef",
        "pg_get_expr",
        "format_type",
        "current_database",
        "current_catalog",
        "current_schema",
        "current_schemas",
        "version",
        "pragma_version",
        "pragma_platform",
    }
)

#: Name prefixes refused for every function (fail closed: catalog and settings readers,
#: whatever a DuckDB upgrade adds under these names).
DENIED_PREFIXES = ("duckdb_", "pragma_", "pg_get_", "current_setting", "__")

#: Words in a built-in macro's definition that make it refused: a macro's body is bound
#: as DuckDB wrote it, so a subquery or a catalog/table function inside it would get past
#: the walk of the analyst's tree (pg_get_viewdef is ``(SELECT sql FROM duckdb_views()
#: …)``). Only macros of plain expressions over their arguments stay allowed.
_UNSAFE_MACRO = re.compile(
    r"\bselect\b|\bfrom\b|\"system\"|\bsystem\.|\bmain\.|duckdb_|pragma_|"
    r"current_setting|getvariable|sleep_ms|current_query",
    re.IGNORECASE,
)

_EXPR_BASE = frozenset({"class", "type", "alias", "query_location", "query_location_length"})
#: Expression classes and their keys (beyond :data:`_EXPR_BASE`).
_EXPRESSIONS: dict[str, frozenset[str]] = {
    k: frozenset(v) | _EXPR_BASE
    for k, v in {
        "CONSTANT": {"literal"},
        "COLUMN_REF": {"column_names"},
        "PARAMETER": {"identifier"},
        "POSITIONAL_REFERENCE": {"index"},
        "BETWEEN": {"input", "lower", "upper"},
        "CASE": {"case_checks", "else_expr"},
        "CAST": {"child", "try_cast", "type_expr"},
        "COLLATE": {"child", "collation"},
        "COMPARISON": {"left", "right"},
        "CONJUNCTION": {"children"},
        "OPERATOR": {"children"},
        "LAMBDA": {"expr", "lhs", "syntax_type"},
        "SUBQUERY": {"child", "comparison_type", "subquery", "subquery_type"},
        "STAR": {
            "columns",
            "exclude_list",
            "expr",
            "qualified_exclude_list",
            "relation_name",
            "rename_list",
            "replace_list",
        },
        "TYPE": {"catalog", "schema", "type_name", "children", "qualified_name"},
        "FUNCTION": {
            "arguments",
            "catalog",
            "schema",
            "distinct",
            "export_state",
            "filter",
            "function_name",
            # DuckDB 2.0.1 marks calls written in a legacy syntax; a flag, never a name or a
            # value, and it must be a bool (checked in _check_function).
            "is_legacy_function_call",
            "is_operator",
            "order_bys",
            "qualified_name",
        },
        "WINDOW": {
            "arg_orders",
            "arguments",
            "catalog",
            "schema",
            "default_expr",
            "distinct",
            "end",
            "end_expr",
            "exclude_clause",
            "filter_expr",
            "function_name",
            "has_ignore_nulls",
            "is_legacy_function_call",
            "ignore_nulls",
            "offset_expr",
            "orders",
            "partitions",
            "qualified_name",
            "start",
            "start_expr",
        },
    }.items()
}

_QUERY_NODE_KEYS = {
    "SELECT_NODE": {
        "aggregate_handling",
        "cte_map",
        "from_table",
        "group_expressions",
        "group_sets",
        "having",
        "modifiers",
        "qualify",
        "sample",
        "select_list",
        "where_clause",
    },
    "SET_OPERATION_NODE": {
        "children",
        "cte_map",
        "left",
        "modifiers",
        "right",
        "setop_all",
        "setop_type",
    },
    "RECURSIVE_CTE_NODE": {
        "aliases",
        "cte_map",
        "cte_name",
        "key_targets",
        "left",
        "modifiers",
        "right",
        "union_all",
    },
}
_REF_BASE = {"alias", "query_location", "query_location_length", "sample"}
#: Non-expression objects with a string ``type``: query nodes, table refs, modifiers, orders.
_NODES: dict[str, frozenset[str]] = {
    k: frozenset(v) | {"type"}
    for k, v in {
        **_QUERY_NODE_KEYS,
        "BASE_TABLE": _REF_BASE
        | {
            "at_clause",
            "catalog_name",
            "column_name_alias",
            "qualified_name",
            "schema_name",
            "table_name",
        },
        "EMPTY": _REF_BASE,
        "EXPRESSION_LIST": _REF_BASE | {"expected_names", "expected_types", "values"},
        "JOIN": _REF_BASE
        | {
            "condition",
            "delim_flipped",
            "duplicate_eliminated_columns",
            "is_implicit",
            "join_type",
            "left",
            "nearest_approx",
            "nearest_count",
            "nearest_order_type",
            "ranking_expression",
            "ref_type",
            "right",
            "using_columns",
        },
        "SUBQUERY": _REF_BASE | {"column_name_alias", "subquery"},
        "TABLE_FUNCTION": _REF_BASE | {"column_name_alias", "function", "with_ordinality"},
        "DISTINCT_MODIFIER": {"distinct_on_targets"},
        "LIMIT_MODIFIER": {"limit", "limit_type", "offset"},
        "LIMIT_PERCENT_MODIFIER": {"limit", "offset"},
        "ORDER_MODIFIER": {"orders"},
        "ASCENDING": {"expression", "null_order"},
        "DESCENDING": {"expression", "null_order"},
        "ORDER_DEFAULT": {"expression", "null_order"},
    }.items()
}
#: Objects without a kind, recognised by their exact key sets (CTE map and entries,
#: function arguments, literals, names, samples, typed values, CASE arms, ...).
_PLAIN: frozenset[frozenset[str]] = frozenset(
    frozenset(s)
    for s in (
        {"statements", "error"},
        {"node", "named_param_map"},
        {"map"},
        {"key", "value"},
        {"aliases", "key_targets", "materialized", "payload_aggregates", "query_node"},
        {"name", "expression"},
        {"kind", "text"},
        {"path"},
        {"then_expr", "when_expr"},
        {"is_percentage", "method", "repeatable", "sample_rate", "sample_size", "seed"},
        {"is_null", "type", "value"},
        {"id", "type_info"},
    )
)


@dataclass(frozen=True)
class Catalog:
    """What the guard knows of this DuckDB build, taken once (~0.2 s) from a fresh
    connection with extension autoloading off; names folded with :func:`fold`."""

    #: Scalar, aggregate, window and macro functions.
    functions: frozenset[str]
    #: Built-in macros whose body reads the catalog or runs a subquery (refused).
    unsafe_macros: frozenset[str]
    #: Names a CTE may not take: every catalog/system table and view (pg_settings,
    #: duckdb_tables, information_schema's, sqlite_master, …) and every table function.
    reserved: frozenset[str]


_PRIMED: list[Catalog] = []


def prime_catalog(cat: Catalog) -> None:
    """Use ``cat`` as :func:`catalog` (a query child gets its parent's snapshot of the
    same DuckDB build instead of taking its own)."""
    if not _PRIMED:
        _PRIMED.append(cat)
        _allowed.cache_clear()


def catalog() -> Catalog:
    """The guard's snapshot of this DuckDB build (see :class:`Catalog`)."""
    return _PRIMED[0] if _PRIMED else _catalog()


def builtin_functions() -> frozenset[str]:
    """Names of the scalar, aggregate, window and macro functions built into this DuckDB.

    Taken once from a fresh connection with extension autoloading off; lower-cased.
    """
    return catalog().functions


@functools.cache
def _catalog() -> Catalog:
    con = duckdb.connect(
        config={"autoload_known_extensions": False, "autoinstall_known_extensions": False}
    )
    try:
        funcs = con.execute(
            "SELECT function_name, function_type, coalesce(macro_definition, '') "
            "FROM duckdb_functions()"
        ).fetchall()
        rels = con.execute(
            "SELECT view_name FROM duckdb_views() UNION ALL "
            "SELECT table_name FROM duckdb_tables()"
        ).fetchall()
    finally:
        con.close()
    functions = frozenset(
        fold(n) for n, t, _ in funcs if t in ("scalar", "aggregate", "window", "macro")
    )
    unsafe = frozenset(fold(n) for n, t, d in funcs if t == "macro" and _UNSAFE_MACRO.search(d))
    reserved = frozenset(fold(r[0]) for r in rels) | frozenset(
        fold(n) for n, t, _ in funcs if t in ("table", "table_macro")
    )
    return Catalog(functions, unsafe, reserved)


def fold(name: str) -> str:
    """An identifier as DuckDB's binder compares it: ASCII letters lower-cased, nothing
    else (``"xK"`` with a Kelvin sign is not ``xk`` to DuckDB, though Python's
    ``str.lower`` says it is)."""
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _loose(name: str) -> str:
    """The widest folding a reader might apply (NFKC, then Unicode case folding)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def _unambiguous(name: str, what: str) -> str:
    """``name`` folded as DuckDB does; refused when a wider folding reads it otherwise
    (a Kelvin sign, a long s, full-width letters, ligatures): whatever a name like that
    was meant to match, the guard and DuckDB could disagree on it."""
    f = fold(name)
    if _loose(name) != _loose(f) or _loose(f) != f:
        raise QueryRefusedError(
            f"query refused: {what} name {_short(name)!r} has characters that fold to "
            "other letters (Unicode case folding/NFKC); write it in plain letters"
        )
    return f


def allowed_functions() -> frozenset[str]:
    """Built-in functions minus :data:`DENIED_FUNCTIONS` and DuckDB's ``__internal`` ones."""
    return _allowed()


@functools.cache
def _allowed() -> frozenset[str]:
    cat = catalog()
    return frozenset(
        f
        for f in cat.functions
        if f not in DENIED_FUNCTIONS
        and f not in cat.unsafe_macros
        and not f.startswith(DENIED_PREFIXES)
    )


def parse(sql: str, con: duckdb.DuckDBPyConnection | None = None) -> dict[str, Any]:
    """The parse tree of ``sql`` as DuckDB's parser sees it (``json_serialize_sql``).

    Raises
    ------
    QueryRefusedError
        If ``sql`` does not parse, or is not made of SELECT statements only.
    """
    if not isinstance(sql, str):
        raise QueryRefusedError("the query must be text")
    own = con is None
    con = con or duckdb.connect(
        config={"autoload_known_extensions": False, "autoinstall_known_extensions": False}
    )
    try:
        # fetchall: a result left unfinished would block the connection's next query.
        ((text,),) = con.execute("SELECT json_serialize_sql($q)", {"q": sql}).fetchall()
    except duckdb.Error as exc:
        raise QueryRefusedError(f"cannot parse SQL: {_all_lines(exc)}") from exc
    finally:
        if own:
            con.close()
    try:
        tree = orjson.loads(text)
    except orjson.JSONDecodeError as exc:  # nesting deeper than orjson's limit
        raise QueryRefusedError("query refused: nested too deeply") from exc
    if not isinstance(tree, dict) or tree.get("error") is not False:
        raise QueryRefusedError(_not_select_message(sql, tree))
    return tree


def _not_select_message(sql: str, tree: Any) -> str:
    msg = str(tree.get("error_message", "")) if isinstance(tree, dict) else ""
    if "Only SELECT" not in msg:
        return f"cannot parse SQL: {_all_lines(Exception(msg)) if msg else 'unknown error'}"
    try:
        kinds = [s.type.name for s in duckdb.extract_statements(sql)]
    except duckdb.Error:
        kinds = []
    kind = next((k for k in kinds if k != "SELECT"), "a non-SELECT statement")
    return f"query refused: only a plain SELECT is allowed, got {kind}"


def _all_lines(exc: BaseException, limit: int = 2000) -> str:
    """DuckDB's whole message (its later lines hold the hints: the offending line with a
    caret, "Did you mean …"), blank lines dropped, bounded."""
    text = "\n".join(ln.rstrip() for ln in str(exc).strip().splitlines() if ln.strip())
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "…"


def check_query(
    sql: str, views: Iterable[str], *, con: duckdb.DuckDBPyConnection | None = None
) -> dict[str, Any]:
    """Accept exactly one plain SELECT over ``views``; return its parse tree.

    Parameters
    ----------
    sql
        The query text, as the analyst typed it.
    views
        Names the query may read from (case-insensitive), besides its own CTEs.
    con
        Connection whose parser to use (the one that will run the query, so what is
        checked is what runs); a fresh one if omitted.

    Raises
    ------
    QueryRefusedError
        Naming the first construct that is not allowed.
    """
    tree = parse(sql, con)
    stmts = tree.get("statements")
    if set(tree) != {"statements", "error"} or not isinstance(stmts, list):
        raise QueryRefusedError("query refused: unexpected parse tree")
    if len(stmts) != 1:
        raise QueryRefusedError(f"query refused: exactly one statement expected, got {len(stmts)}")
    # Second opinion on the count: the statement splitter must agree with the serializer.
    try:
        n = len(duckdb.extract_statements(sql))
    except duckdb.Error as exc:
        raise QueryRefusedError(f"cannot parse SQL: {first_line(exc)}") from exc
    if n != 1:
        raise QueryRefusedError(f"query refused: exactly one statement expected, got {n}")
    _walk(tree, frozenset(fold(v) for v in views), allowed_functions())
    return tree


def _kind(obj: dict[str, Any]) -> tuple[str, str | None]:
    cls = obj.get("class")
    if cls is not None:
        return "expr", cls if isinstance(cls, str) else None
    typ = obj.get("type")
    if isinstance(typ, str):
        return "node", typ
    return "plain", None


def _walk(tree: dict[str, Any], views: frozenset[str], functions: frozenset[str]) -> None:
    """Iterative walk (no recursion limit to hit) with the CTE names visible at each point."""
    stack: list[tuple[Any, frozenset[str]]] = [(tree, frozenset())]
    while stack:
        obj, scope = stack.pop()
        if isinstance(obj, list):
            stack.extend((v, scope) for v in obj)
            continue
        if obj is None or isinstance(obj, str | bool | int | float):
            continue
        if not isinstance(obj, dict):
            raise QueryRefusedError(f"query refused: unknown value {type(obj).__name__}")
        family, kind = _kind(obj)
        keys = frozenset(obj)
        if family == "expr":
            allowed = _EXPRESSIONS.get(kind or "")
            if allowed is None:
                raise QueryRefusedError(f"query refused: {kind} expressions are not allowed")
        elif family == "node":
            allowed = _NODES.get(kind or "")
            if allowed is None:
                raise QueryRefusedError(f"query refused: {_node_name(kind)} is not allowed")
        else:
            allowed = keys if keys in _PLAIN else None
            if allowed is None:
                raise QueryRefusedError(
                    f"query refused: unknown parse-tree object with keys {sorted(keys)}"
                )
        extra = keys - allowed
        if extra:
            raise QueryRefusedError(
                f"query refused: unknown field(s) {sorted(extra)} in {kind or 'object'}"
            )
        children: dict[str, Any] = obj
        if family == "node" and kind in _QUERY_NODE_KEYS:
            scope, children = _enter_ctes(obj, scope, stack)
        elif family == "node" and kind == "BASE_TABLE":
            _check_table(obj, views, scope)
        elif family == "node" and kind == "TABLE_FUNCTION":
            children = _check_table_function(obj)
        elif family == "expr" and kind in ("FUNCTION", "WINDOW"):
            _check_function(obj, functions)
        elif family == "expr" and kind == "TYPE":
            _check_qualified(obj, "type_name", "catalog", "schema", "type")
        for value in children.values():
            if isinstance(value, dict | list):
                stack.append((value, scope))


def _node_name(kind: str | None) -> str:
    return {
        "SHOW_REF": "DESCRIBE/SUMMARIZE/SHOW",
        "PIVOT": "PIVOT/UNPIVOT",
    }.get(kind or "", f"{kind}")


def _enter_ctes(
    node: dict[str, Any], scope: frozenset[str], stack: list[tuple[Any, frozenset[str]]]
) -> tuple[frozenset[str], dict[str, Any]]:
    """Push the CTE bodies with the names each may see; return the node's own scope.

    CTE *i* sees the enclosing scope and CTEs 0..i-1 (itself only as a recursive CTE,
    whose ``RECURSIVE_CTE_NODE`` body adds its own name); the rest of the node sees all
    of them. Scoping is exact because DuckDB's is: in ``WITH pg_settings AS (SELECT *
    FROM pg_settings)`` the inner name is the catalog's view, not the CTE. A CTE may not
    take the name of a catalog table, view or table function at all (folded as DuckDB
    and as Unicode would), so no reading of the query can mistake one for the other.
    """
    cte_map = node.get("cte_map")
    rest = {k: v for k, v in node.items() if k != "cte_map"}
    if cte_map is None:
        return scope, rest
    if (
        not isinstance(cte_map, dict)
        or set(cte_map) != {"map"}
        or not isinstance(cte_map["map"], list)
    ):
        raise QueryRefusedError("query refused: malformed WITH clause")
    inner = scope
    for entry in cte_map["map"]:
        if not isinstance(entry, dict) or set(entry) != {"key", "value"}:
            raise QueryRefusedError("query refused: malformed WITH clause")
        name, value = entry["key"], entry["value"]
        if not isinstance(name, str) or not isinstance(value, dict):
            raise QueryRefusedError("query refused: malformed WITH clause")
        folded = _unambiguous(name, "CTE")
        if folded in _reserved() or _loose(name) in _reserved():
            raise QueryRefusedError(
                f"query refused: CTE name {_short(name)!r} is the name of a DuckDB catalog "
                "table, view or function; pick another name"
            )
        stack.append((value, inner))  # checked as a plain object, its query_node in `inner`
        inner = inner | {folded}
    if node.get("type") == "RECURSIVE_CTE_NODE" and isinstance(node.get("cte_name"), str):
        inner = inner | {_unambiguous(node["cte_name"], "CTE")}
    return inner, rest


def _reserved() -> frozenset[str]:
    return catalog().reserved


def _check_table(ref: dict[str, Any], views: frozenset[str], scope: frozenset[str]) -> None:
    name = ref.get("table_name")
    if not isinstance(name, str):
        raise QueryRefusedError("query refused: malformed table reference")
    if ref.get("catalog_name") or ref.get("schema_name"):
        raise QueryRefusedError(
            f"query refused: qualified table names are not allowed ({_short(name)}); "
            f"use one of the views: {', '.join(sorted(views))}"
        )
    if ref.get("at_clause") is not None:
        raise QueryRefusedError("query refused: AT (time travel) is not allowed")
    _check_qualified(ref, "table_name", "catalog_name", "schema_name", "table")
    folded = _unambiguous(name, "table")
    if folded not in views and folded not in scope:
        raise QueryRefusedError(
            f"query refused: unknown table {_short(name)!r}; "
            f"queries read only the views {', '.join(sorted(views))}"
        )


def _check_table_function(ref: dict[str, Any]) -> dict[str, Any]:
    fn = ref.get("function")
    if not isinstance(fn, dict) or fn.get("class") != "FUNCTION":
        raise QueryRefusedError("query refused: malformed table function")
    name = fn.get("function_name")
    if (
        not isinstance(name, str)
        or _unambiguous(name, "function") not in ALLOWED_TABLE_FUNCTIONS
        or fn.get("catalog")
        or fn.get("schema")
    ):
        raise QueryRefusedError(
            f"query refused: table function {_short(str(name))}() is not allowed "
            f"(allowed: {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}); "
            "read the store through its views"
        )
    extra = frozenset(fn) - _EXPRESSIONS["FUNCTION"]
    if extra:
        raise QueryRefusedError(f"query refused: unknown field(s) {sorted(extra)} in FUNCTION")
    if fn.get("export_state"):
        raise QueryRefusedError("query refused: EXPORT_STATE is not allowed")
    _check_qualified(fn, "function_name", "catalog", "schema", "function")
    # The function object itself is checked here; its arguments etc. are walked as usual.
    return {k: v for k, v in ref.items() if k != "function"} | {
        "_fn_" + k: v for k, v in fn.items() if isinstance(v, dict | list)
    }


def _check_function(fn: dict[str, Any], functions: frozenset[str]) -> None:
    name = fn.get("function_name")
    if not isinstance(name, str):
        raise QueryRefusedError("query refused: malformed function call")
    if not isinstance(fn.get("is_legacy_function_call", False), bool):
        raise QueryRefusedError("query refused: malformed function call")
    if fn.get("catalog") or fn.get("schema"):
        raise QueryRefusedError(
            f"query refused: qualified function names are not allowed ({_short(name)})"
        )
    folded = _unambiguous(name, "function")
    if folded not in functions:
        if folded in builtin_functions():
            raise QueryRefusedError(f"query refused: function {_short(name)}() is not allowed")
        import difflib

        close = difflib.get_close_matches(folded, sorted(functions), n=3, cutoff=0.75)
        hint = f"\nDid you mean {', '.join(c + '()' for c in close)}?" if close else ""
        raise QueryRefusedError(
            f"query refused: function {_short(name)}() is not a built-in{hint}"
        )
    if fn.get("export_state"):
        raise QueryRefusedError("query refused: EXPORT_STATE is not allowed")
    _check_qualified(fn, "function_name", "catalog", "schema", "function")


def _check_qualified(obj: dict[str, Any], name_key: str, cat: str, sch: str, what: str) -> None:
    """``qualified_name.path`` must be just the plain name (the binder may read either)."""
    if obj.get(cat) or obj.get(sch):
        raise QueryRefusedError(f"query refused: qualified {what} names are not allowed")
    q = obj.get("qualified_name")
    if q is None:
        return
    path = q.get("path") if isinstance(q, dict) else None
    name = obj.get(name_key)
    if (
        not isinstance(path, list)
        or len(path) != 1
        or not isinstance(path[0], str)
        or not isinstance(name, str)
        or fold(path[0]) != fold(name)
    ):
        raise QueryRefusedError(f"query refused: qualified {what} names are not allowed")


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "…"
