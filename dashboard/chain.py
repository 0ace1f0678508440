"""A session's call sequence with the chain of a sequence alert marked (no Streamlit here).

Sequence alerts (tool_loop, privilege_chain, step_skip, duplicate_execution,
cross_server_flow) carry the ordered calls that make their chain in ``evidence.chain``
(time to the millisecond, server, tool, business key, outcome; see
``detectors.sequence.chain_evidence``). :func:`call_sequence` lines those records up with
the session's stored calls, so the session page can show the whole sequence with the
chain highlighted. Matching is by (time to the ms, server, tool): the evidence is about
the very calls stored, so it needs no fuzzy join; a chain call of another session (a
cross-server flow's other half) simply matches nothing here.
"""

from __future__ import annotations

from typing import Any

import orjson
import polars as pl

#: Columns of :func:`call_sequence` output, in display order.
COLUMNS = ("step", "chain_step", "ts", "server", "tool", "resource_id", "status", "bytes")


def evidence_dict(evidence: Any) -> dict[str, Any]:
    """An alert's evidence (JSON text, bytes or a dict) as a dict; {} when absent or bad."""
    if isinstance(evidence, (str, bytes)):
        try:
            evidence = orjson.loads(evidence)
        except orjson.JSONDecodeError:
            return {}
    return evidence if isinstance(evidence, dict) else {}


def chain_records(evidence: Any) -> list[dict[str, Any]]:
    """The ``chain`` list of an alert's evidence (JSON text or dict); [] when absent/bad."""
    chain = evidence_dict(evidence).get("chain")
    if not isinstance(chain, list):
        return []
    return [c for c in chain if isinstance(c, dict)]


def _ms_key(col: pl.Expr) -> pl.Expr:
    return col.dt.replace_time_zone(None).dt.truncate("1ms")


def _text(v: Any) -> str | None:
    """Evidence values are log-derived and may have any JSON type: only strings match."""
    return v if isinstance(v, str) else None


def call_sequence(events: pl.DataFrame, evidence: Any) -> pl.DataFrame:
    """The session's calls in order, numbered, with ``chain_step`` set on the chain's calls.

    Parameters
    ----------
    events
        :func:`toolwatch.dashboard.data.session_events` output (``ts`` UTC, ``server``, ``tool`` …).
    evidence
        The alert's evidence (JSON text or dict), or None.

    Returns
    -------
    polars.DataFrame
        :data:`COLUMNS`: ``step`` (1-based position in the session), ``chain_step``
        (1-based position in the alert's chain, null for calls outside it).
    """
    ev = events.with_row_index("step", offset=1).with_columns(pl.col("step").cast(pl.Int64))
    for c in COLUMNS:
        if c not in ev.columns and c != "chain_step":
            ev = ev.with_columns(pl.lit(None).alias(c))
    chain = chain_records(evidence)
    rows = [
        {"chain_step": i + 1, "_t": _text(c.get("time")), "_server": _text(c.get("server")),
         "_tool": _text(c.get("tool"))}
        for i, c in enumerate(chain)
    ]
    if not rows or ev.height == 0:
        return ev.with_columns(pl.lit(None, pl.Int64).alias("chain_step")).select(COLUMNS)
    ch = pl.DataFrame(rows, schema={"chain_step": pl.Int64, "_t": pl.String,
                                    "_server": pl.String, "_tool": pl.String})
    ch = ch.with_columns(
        pl.col("_t").str.to_datetime(time_unit="us", time_zone="UTC", strict=False)
        .dt.replace_time_zone(None).alias("_k")
    ).filter(pl.col("_k").is_not_null())
    # One chain call per stored call (the first chain position that names it).
    ch = ch.group_by("_k", "_server", "_tool").agg(pl.col("chain_step").min())
    keyed = ev.with_columns(_ms_key(pl.col("ts").cast(pl.Datetime("us", "UTC"))).alias("_k"))
    out = keyed.join(
        ch, left_on=["_k", "server", "tool"], right_on=["_k", "_server", "_tool"],
        how="left", nulls_equal=True,
    )
    return out.sort("step").select(COLUMNS)
