"""Helpers for entity-window scoring (caller id, client address per hopping window).

Entity rows are computed on hashes (``et``, ``eh``, ``w``) for speed; these helpers turn
them back into the strings alerts need, and list the sessions behind a window — only for
the windows that matter.
"""

from __future__ import annotations

import polars as pl
from toolwatch.detectors.base import FeatureSet
from toolwatch.detectors.features import entity_names, group_agg

KEYS = ["et", "eh", "w"]

#: Aggregations every entity-window frame carries for :func:`finish`.
IDENTITY_AGGS = [
    pl.col("ceh").n_unique().alias("_n_callers"),
    pl.col("ceh").drop_nulls().first().alias("_ceh"),
    pl.col("ieh").n_unique().alias("_n_ips"),
    pl.col("ieh").drop_nulls().first().alias("_ieh"),
    pl.col("sh").first().alias("_sh"),
]


def finish(agg: pl.DataFrame, features: FeatureSet) -> pl.DataFrame:
    """Add ``entity_type``, ``entity_id``, ``caller_id``, ``client_ip`` and ``server``.

    The other entity is named only when exactly one was involved (a caller seen from one
    address, an address used by one caller).
    """
    s = features.sessions
    out = entity_names(agg, s)
    callers = s.select(pl.col("ceh").alias("_ceh"), pl.col("caller_id").alias("_caller"))
    ips = s.select(pl.col("ieh").alias("_ieh"), pl.col("client_ip").alias("_ip"))
    servers = s.select(pl.col("sh").alias("_sh"), "server")
    out = (
        out.join(callers.drop_nulls().unique("_ceh"), on="_ceh", how="left")
        .join(ips.drop_nulls().unique("_ieh"), on="_ieh", how="left")
        .join(servers.unique("_sh"), on="_sh", how="left")
    )
    return out.with_columns(
        pl.when(pl.col("et") == 0).then(pl.col("entity_id"))
        .when(pl.col("_n_callers") == 1).then(pl.col("_caller"))
        .alias("caller_id"),
        pl.when(pl.col("et") == 1).then(pl.col("entity_id"))
        .when(pl.col("_n_ips") == 1).then(pl.col("_ip"))
        .alias("client_ip"),
    ).drop("_caller", "_ip", "_ceh", "_ieh", "_n_callers", "_n_ips", "_sh")


def sessions_of(
    rows: pl.DataFrame, windows: pl.DataFrame, features: FeatureSet, limit: int = 200
) -> pl.DataFrame:
    """Sessions (ids, first ``limit`` sorted) and dominant tool behind each window.

    Parameters
    ----------
    rows
        Exploded rows (``et``, ``eh``, ``w``, ``sh`` and optionally ``tlh``).
    windows
        The windows wanted (``et``, ``eh``, ``w``).
    """
    if windows.height == 0:
        return pl.DataFrame(
            schema={"et": pl.Int8, "eh": pl.UInt64, "w": pl.Int64,
                    "session_ids": pl.List(pl.String), "top_tool": pl.String}
        )
    sub = rows.join(windows.select(KEYS), on=KEYS, how="semi")
    names = features.sessions.select("sh", "session_id")
    per = sub.select([*KEYS, "sh"]).unique().join(names, on="sh", how="left")
    out = group_agg(
        per, KEYS,
        pl.col("session_id").drop_nulls().sort().head(limit).alias("session_ids")
    )
    if "tlh" in sub.columns:
        tools = features.events.select("tlh", "tool").unique("tlh")
        top = (
            sub.filter(pl.col("tlh").is_not_null())
            .group_by([*KEYS, "tlh"])
            .agg(pl.len().alias("n"))
            .join(tools, on="tlh", how="left")
            .sort(["n", "tool"], descending=[True, False])
            .group_by(KEYS, maintain_order=True)
            .first()
            .select([*KEYS, pl.col("tool").alias("top_tool")])
        )
        out = out.join(top, on=KEYS, how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.String).alias("top_tool"))
    return out
