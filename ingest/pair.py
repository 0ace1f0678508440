"""Transform ``pair``: join JSON-RPC ``tools/call`` requests with their responses.

A logging proxy writes the request and, later, the response (matched by JSON-RPC ``id``
within one connection/session). A response can land in a later batch than its request,
so unmatched requests wait in a bounded pending table. They are emitted as events with
outcome ``unknown`` when the stream ends, when they wait longer than ``max_wait``, or when
the table overflows — an event is never held forever. A response with no request is
quarantined (``orphan_response``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import polars as pl
from toolwatch.ingest.intervals import MAX_DURATION_MS

_KEY = ["session_id", "rpc_id"]
_RESP_COLS = ["status", "status_raw", "is_error_b", "bytes", "ts"]


def _interval(req: pl.Expr, resp: pl.Expr) -> list[pl.Expr]:
    """``start_ts`` / ``end_ts`` of a paired call: request time to response time."""
    ok = (resp >= req) & ((resp - req).dt.total_microseconds() <= MAX_DURATION_MS * 1000)
    return [
        pl.when(ok).then(req).otherwise(pl.col("start_ts")).alias("start_ts"),
        pl.when(ok).then(resp).otherwise(pl.col("end_ts")).alias("end_ts"),
    ]


@dataclass
class PairCounters:
    """What ``pair`` did."""

    paired: int = 0
    unanswered: int = 0
    orphans: int = 0


class Pairer:
    """Stateful request/response pairing.

    Parameters
    ----------
    max_wait
        How long (log time) a request waits for its response before being emitted alone.
    max_pending
        Bound on waiting requests; the oldest are emitted alone past it.
    """

    def __init__(self, max_wait: timedelta = timedelta(minutes=5), max_pending: int = 100_000):
        self.max_wait = max_wait
        self.max_pending = max_pending
        self.pending: pl.DataFrame | None = None
        self.counters = PairCounters()
        # Ids of recent non-tool requests (initialize, tools/list, ping): their responses
        # are protocol traffic, not orphans. Bounded like the pending table.
        self._other_ids: dict[tuple[str | None, str | None], None] = {}

    def note_other_requests(self, rows: pl.DataFrame) -> None:
        """Remember ids of JSON-RPC requests that are not tool calls."""
        for key in rows.select(_KEY).iter_rows():
            self._other_ids[key] = None
        while len(self._other_ids) > self.max_pending:
            self._other_ids.pop(next(iter(self._other_ids)))

    def split_protocol(self, orphans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Split unmatched responses into (answers to non-tool requests, true orphans)."""
        if orphans.height == 0 or not self._other_ids:
            return orphans.clear(), orphans
        known = pl.DataFrame(
            list(self._other_ids), schema={"session_id": pl.String, "rpc_id": pl.String},
            orient="row",
        )
        proto = orphans.join(known, on=_KEY, how="semi")
        return proto, orphans.join(known, on=_KEY, how="anti")

    def pair(
        self, reqs: pl.DataFrame, resps: pl.DataFrame, *, final: bool
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Pair requests with responses.

        Parameters
        ----------
        reqs, resps
            Parsed rows of kind ``rpc_req`` / ``rpc_resp`` (same columns).
        final
            The stream ended: emit every pending request.

        Returns
        -------
        (events, orphans)
            Request rows completed with the response's outcome, size and latency; and
            responses that matched no request.
        """
        if self.pending is not None and self.pending.height:
            reqs = pl.concat([self.pending, reqs], how="vertical_relaxed")
        self.pending = None
        for c in ("start_ts", "end_ts"):  # hand-built frames (tests) may lack them
            if c not in reqs.columns:
                reqs = reqs.with_columns(pl.lit(None, reqs.schema["ts"]).alias(c))
        if reqs.height == 0 and resps.height == 0:
            return reqs, resps
        # An id may be reused once its call is answered (JSON-RPC only forbids two
        # outstanding at once): the k-th request with an id in a session pairs with the
        # k-th response with it, in log order (pending requests come first). Pairing every
        # request with the *first* response let an agent that reuses one id store all its
        # calls with that response's outcome (failures as ok) and negative durations.
        nth = pl.int_range(pl.len()).over(_KEY).alias("_nth")
        reqs = reqs.with_columns(nth)
        resps = resps.with_columns(nth)
        key = [*_KEY, "_nth"]
        r = resps.select([*key, *[pl.col(c).alias(f"{c}_r") for c in _RESP_COLS]])
        joined = reqs.join(r, on=key, how="left").drop("_nth")
        matched = joined.filter(pl.col("ts_r").is_not_null())
        events = matched.with_columns(
            pl.col("status_r").alias("status"),
            pl.col("status_raw_r").alias("status_raw"),
            pl.col("is_error_b_r").alias("is_error_b"),
            pl.col("bytes_r").alias("bytes"),
            pl.coalesce(
                pl.col("duration_ms"),
                (pl.col("ts_r") - pl.col("ts")).dt.total_microseconds() / 1000.0,
            ).alias("duration_ms"),
            # In flight from the request to the response (a response logged before its
            # request — clock skew between proxy threads — keeps what the line said).
            *_interval(pl.col("ts"), pl.col("ts_r")),
        ).drop([f"{c}_r" for c in _RESP_COLS])
        waiting = joined.filter(pl.col("ts_r").is_null()).drop([f"{c}_r" for c in _RESP_COLS])
        orphans = resps.join(reqs.select(key), on=key, how="anti").drop("_nth")
        self.counters.paired += events.height
        self.counters.orphans += orphans.height

        if final:
            alone = waiting
            waiting = waiting.clear()
        else:
            newest = pl.concat([reqs["ts"], resps["ts"]]).max()
            cutoff = newest - self.max_wait if newest is not None else None
            too_old = pl.col("ts") < cutoff if cutoff is not None else pl.lit(False)
            alone = waiting.filter(too_old)
            waiting = waiting.filter(~too_old)
            if waiting.height > self.max_pending:
                waiting = waiting.sort("ts")
                alone = pl.concat([alone, waiting.head(waiting.height - self.max_pending)])
                waiting = waiting.tail(self.max_pending)
        self.counters.unanswered += alone.height
        # No response: the outcome is not known (a request line says nothing about it).
        alone = alone.with_columns(
            pl.lit("unknown").alias("status"), pl.lit(None, pl.Boolean).alias("is_error_b"),
            # Sent, never answered: the start is known, the end is not.
            pl.col("ts").alias("start_ts"),
        )
        self.pending = waiting if waiting.height else None
        events = pl.concat([events, alone], how="vertical_relaxed")
        return events, orphans
