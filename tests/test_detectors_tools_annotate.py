"""``detectors.tools.annotate`` against a row-by-row reference (generated frames).

The columnar annotation keys tools and argument texts by 64-bit hashes and runs its
regular expressions only on the distinct texts that mention a key or a sensitive term;
this checks it gives what a plain per-event reading of the documented rules gives.
"""

from __future__ import annotations

import re

import orjson
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from toolwatch.detectors import DetectorsConfig
from toolwatch.detectors.features import prepare_events
from toolwatch.detectors.tools import MUTATING_ROLES, _value_pattern, annotate, role_of

TOOLS = ["fulfillOrder", "chargePayment", "getDoc", "readSecret", "", None, "search_users",
         "sendEmail", "createOrder", "runShell", "applyCoupon"]
SERVERS = ["shop", "payments", None, ""]
KEYS = ["orderId", "idempotencyKey", "dedupeToken", "requestId", "path", "q"]
VALUES = st.one_of(
    st.sampled_from(["o-1", "o-2", "/etc/passwd", "ADMIN panel", "vault/x", 'a"b', "x\\y"]),
    st.integers(-5, 10**6),
)
ROWS = st.lists(
    st.fixed_dictionaries({
        "server": st.sampled_from(SERVERS),
        "tool": st.sampled_from(TOOLS),
        "args": st.one_of(st.none(), st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=3)
                          .map(lambda d: orjson.dumps(d).decode())),
        "resource_id": st.sampled_from([None, "doc-1", "doc-2"]),
        "resource_key": st.sampled_from([None, "id", "orderId"]),
    }),
    max_size=40,
)
CONFIGS = [
    {},
    {"tools": {"business_keys": {"fulfillOrder": "orderId", "shop/chargePayment": "orderId",
                                 "createOrder": "path"},
               "idempotency_args": {"payments/chargePayment": ["dedupeToken"]},
               "roles": {"getDoc": "write", "shop/sendEmail": "read"}}},
    {"tools": {"sensitive_terms": [], "idempotency_keys": []}},
]


def _extract(args: str, key: str) -> str | None:
    m = re.search(_value_pattern(key), args)
    if m is None:
        return None
    return m.group(1) if m.group(1) is not None else m.group(2)


def _override(table: dict, server: str | None, tool: str | None) -> object:
    if tool is None:
        return None
    v = table.get(f"{server}/{tool}")
    return table.get(tool) if v is None else v


def _reference(rows: list[dict], cfg: DetectorsConfig) -> list[dict]:
    tc = cfg.tools
    pairs = {(r["server"], r["tool"]) for r in rows}
    extra = [k for s, t in pairs for k in (_override(tc.idempotency_args, s, t) or [])]
    idem_keys = sorted({*tc.idempotency_keys, *extra})
    terms = [t.lower() for t in tc.sensitive_terms]
    out = []
    for r in rows:
        args = r["args"] or ""
        role = role_of(r["tool"], r["server"], tc)
        bk_arg = _override(tc.business_keys, r["server"], r["tool"])
        idem = None
        if any(f'"{k}"' in args for k in idem_keys):
            idem = next((v for k in idem_keys if (v := _extract(args, k)) is not None), None)
        if bk_arg is not None:
            bk = _extract(args, bk_arg) if f'"{bk_arg}"' in args else None
        else:
            bk = r["resource_id"]
        out.append({
            "tool_role": role,
            "mutates": role in MUTATING_ROLES,
            "irreversible": role == "irreversible",
            "outbound": role == "outbound",
            "sensitive": any(t in (r["tool"] or "").lower() for t in terms)
            or any(t in args.lower() for t in terms),
            "bk_arg": bk_arg if bk_arg is not None else r["resource_key"],
            "bk": bk,
            "idem": idem,
        })
    return out


@settings(max_examples=150, deadline=None)
@given(rows=ROWS, which=st.sampled_from(range(len(CONFIGS))), prepared=st.booleans())
def test_annotate_matches_row_by_row_reading(rows: list[dict], which: int,
                                             prepared: bool) -> None:
    cfg = DetectorsConfig.from_dict(CONFIGS[which])
    schema = {"server": pl.String, "tool": pl.String, "args": pl.String,
              "resource_id": pl.String, "resource_key": pl.String}
    df = pl.DataFrame(rows, schema=schema)
    if prepared:  # prepared events carry ``rh``, which annotate reuses as ``bkh``
        df = prepare_events(df.with_columns(
            pl.lit(0).cast(pl.Datetime("us", "UTC")).alias("ts")), cfg)
    got = annotate(df, cfg)
    want = _reference(rows, cfg)
    cols = ["tool_role", "mutates", "irreversible", "outbound", "sensitive", "bk_arg", "bk",
            "idem"]
    assert got.select(cols).to_dicts() == want
    # Hashes: null exactly where the value is null, equal values hash equal.
    for v, h in (("bk", "bkh"), ("idem", "idemh")):
        pairs = got.select(v, h).rows()
        assert all((a is None) == (b is None) for a, b in pairs)
        seen: dict[str, int] = {}
        for a, b in pairs:
            if a is not None:
                assert seen.setdefault(a, b) == b
    assert got.height == len(rows)


def test_running_a_read_is_a_read() -> None:
    """'run' executes code, but run_query / runReport run a read."""
    from toolwatch.detectors.tools import role_of

    assert role_of("run_query") == role_of("runReport") == "read"
    assert role_of("runCommand") == role_of("run_script") == "admin_exec"


def test_an_aggregate_over_records_returns_figures_not_records() -> None:
    """A data_terms table read row by row is a read of records; an aggregate over the
    same table (a select list of count/sum/…, or a GROUP BY) returns figures."""
    cfg = DetectorsConfig()
    sqls = {
        "SELECT * FROM orders": True,
        "select * from customers where id = 7": True,
        "SELECT region, sum(amount) FROM orders GROUP BY 1": False,
        "SELECT count(*) FROM payments": False,
        "SELECT COUNT(DISTINCT id) FROM users": False,
        "SELECT * FROM analytics.cohorts": False,  # no records word: not named
    }
    df = pl.DataFrame({
        "server": ["internal"] * len(sqls), "tool": ["run_query"] * len(sqls),
        "args": [orjson.dumps({"sql": q}).decode() for q in sqls],
    })
    got = annotate(df, cfg)["data"].to_list()
    assert got == list(sqls.values())
