"""The pipeline: source batches -> parse -> pair -> sessionize -> store (-> detectors).

Every component counts what it processed, rejected and dropped (:class:`Counters`); the
CLI prints them at the end of a run and live mode exposes them in ``toolwatch status``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from toolwatch.ingest import arrays
from toolwatch.ingest.pair import Pairer
from toolwatch.ingest.parse import ParserPool
from toolwatch.ingest.records import RawBatch, slice_batch
from toolwatch.ingest.sessionize import Sessionizer, escape_logged

from toolwatch import schema
from toolwatch.config import Config
from toolwatch.store import Checkpoint, Store

log = logging.getLogger(__name__)

#: Outcomes that do not make a call an error when the log has no error flag.
_NOT_ERRORS = arrays.strings(["ok", "unknown"])


def _epoch_us(t: datetime) -> int:
    """Microseconds since the epoch of an aware datetime (exact, no float rounding)."""
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


@dataclass
class Counters:
    """Per-run counters, by component (Vector-style processed/rejected/dropped)."""

    lines_read: int = 0
    events_stored: int = 0
    summaries_stored: int = 0
    rpc_responses_merged: int = 0
    rpc_requests_unanswered: int = 0
    secrets_redacted: int = 0
    quarantined: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    sources: int = 0
    sources_skipped_bytes: int = 0

    @property
    def quarantined_total(self) -> int:
        """All quarantined lines, any reason."""
        return sum(self.quarantined.values())

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping for JSON output."""
        return {
            "lines_read": self.lines_read,
            "events_stored": self.events_stored,
            "summaries_stored": self.summaries_stored,
            "rpc_responses_merged": self.rpc_responses_merged,
            "rpc_requests_unanswered": self.rpc_requests_unanswered,
            "secrets_redacted": self.secrets_redacted,
            "quarantined": dict(self.quarantined),
            "quarantined_total": self.quarantined_total,
            "batches": self.batches,
            "sources": self.sources,
            "already_stored_bytes_skipped": self.sources_skipped_bytes,
        }


@dataclass
class BatchOutput:
    """Tables produced from one raw batch, ready for the store."""

    events: pa.Table
    summaries: pa.Table
    quarantine: pa.Table
    checkpoint: Checkpoint


_EVENT_COLS = [c for c in schema.EVENTS.names]
#: What the sessionizer reads of a session-less event.
_SESSIONIZE_COLS = ["session_id", "caller_id", "client_ip", "server", "ts"]


#: Beyond this many rows of other kinds, one filter is cheaper than the slices between them.
_MAX_CUTS = 64


def _rows_between(tbl: pa.Table, kind: pa.ChunkedArray, k: str) -> pa.Table:
    """The rows of ``tbl`` whose ``kind`` is ``k``, which are nearly all of them.

    Taken as zero-copy slices between the few rows of other kinds instead of a filter,
    which copies every column: ~10 ms for a 16 MiB batch of plain calls, on the thread
    that keeps batches in order.
    """
    other = arrays.to_numpy(pc.indices_nonzero(pc.not_equal(kind, arrays.scalar(k))))
    if len(other) > _MAX_CUTS:
        return tbl.filter(pc.equal(kind, arrays.scalar(k)))
    cuts = [-1, *other.tolist(), tbl.num_rows]
    parts = [tbl.slice(a + 1, b - a - 1) for a, b in itertools.pairwise(cuts) if b - a > 1]
    return pa.concat_tables(parts) if parts else tbl.slice(0, 0)


class Pipeline:
    """Parse/normalize/pair/sessionize batches and write them to the store.

    Parameters
    ----------
    config
        Full configuration.
    store
        Destination; ``None`` to only transform (tests, dry runs).
    """

    def __init__(self, config: Config, store: Store | None, parser: ParserPool | None = None):
        self.config = config
        self.store = store
        self.parser = parser if parser is not None else ParserPool.from_config(config)
        self.hasher = self.parser.hasher
        self.pairers: dict[str, Pairer] = {}
        self.sessionizer = Sessionizer(timedelta(minutes=config.ingest.session_gap_minutes))
        self.counters = Counters()

    def transform(self, batch: RawBatch, parsed_tbl: pa.Table | None = None) -> BatchOutput:
        """Run every transform over one batch (no I/O); never raises because of a line.

        ``parsed_tbl`` is ``self.parser.parse(batch)`` when the caller already ran it
        (``ingest`` parses the next batches on worker threads while this one is
        transformed); the stateful transforms (pairing, sessionizing) always run here, in
        batch order.

        Should a transform raise on some row, the state it may have half-updated is put
        back and the batch is done again in halves, down to the offending line, which is
        quarantined as ``unprocessable``: one line never costs its neighbours, and the
        checkpoint still moves past it.
        """
        if parsed_tbl is None:
            parsed_tbl = self.parser.parse(batch)
        saved = self._save_state()
        try:
            return self._transform(batch, parsed_tbl)
        except Exception as exc:  # narrowed to the offending line below
            self._restore_state(saved)
            log.warning("batch of %s fell back to halves: %s", batch.source, exc)
            return self._transform_split(batch, parsed_tbl, exc)

    # ------------------------------------------------------------------ fallback
    def _save_state(self) -> tuple[Any, ...]:
        """What :meth:`_transform` may change: counters, sessionizer and pairer state.

        Shallow copies with their containers copied (frames are immutable): cheap, and
        only containers the transforms mutate in place need their own copy.
        """
        def snap(obj: Any) -> Any:
            c = copy.copy(obj)
            for k, v in vars(c).items():
                if isinstance(v, (dict, list, set, Counter)) or dataclasses.is_dataclass(v):
                    setattr(c, k, copy.copy(v))
            return c

        return (
            snap(self.counters),
            snap(self.sessionizer),
            {fp: snap(p) for fp, p in self.pairers.items()},
        )

    def _restore_state(self, saved: tuple[Any, ...]) -> None:
        self.counters, self.sessionizer, self.pairers = saved

    def _transform_split(
        self, batch: RawBatch, parsed: pa.Table, exc: BaseException
    ) -> BatchOutput:
        """Transform ``batch`` in two halves (recursively); a lone failing line is
        quarantined with the error as its detail."""
        n = len(batch)
        if n <= 1:
            return self._unprocessable(batch, parsed, exc)
        half = n // 2
        outs = []
        for sub, rows in ((slice_batch(batch, 0, half), parsed.slice(0, half)),
                          (slice_batch(batch, half, n), parsed.slice(half))):
            saved = self._save_state()
            try:
                outs.append(self._transform(sub, rows))
            except Exception as sub_exc:  # see transform
                self._restore_state(saved)
                outs.append(self._transform_split(sub, rows, sub_exc))
        return BatchOutput(
            events=pa.concat_tables([o.events for o in outs]),
            summaries=pa.concat_tables([o.summaries for o in outs]),
            quarantine=pa.concat_tables([o.quarantine for o in outs]),
            checkpoint=outs[-1].checkpoint,
        )

    def _unprocessable(self, batch: RawBatch, parsed: pa.Table, exc: BaseException) -> BatchOutput:
        """One line (or an empty final batch) that a transform could not take."""
        now = datetime.now(UTC)
        n = len(batch)
        self.counters.lines_read += n
        if n:
            self.counters.quarantined["unprocessable"] += n
        detail = f"transform failed: {type(exc).__name__}: {str(exc)[:300]}"
        keep = self.config.ingest.quarantine_raw_chars
        raw = parsed.column("raw") if "raw" in parsed.column_names else pa.nulls(n, pa.string())
        cols = {
            "event_id": pc.binary_join_element_wise(
                arrays.repeat(batch.source_fp, n),
                pc.cast(arrays.from_numpy(np.asarray(batch.offsets, dtype=np.int64)), pa.string()),
                ":",
            ),
            "reason": arrays.repeat("unprocessable", n),
            "detail": arrays.repeat(detail, n),
            "source": arrays.repeat(batch.source, n),
            "source_fp": arrays.repeat(batch.source_fp, n),
            "offset": arrays.from_numpy(np.asarray(batch.offsets, dtype=np.int64)),
            "line_no": arrays.from_numpy(np.asarray(batch.line_nos, dtype=np.int64))
            if batch.line_nos is not None else pa.nulls(n, pa.int64()),
            "raw": pc.utf8_slice_codeunits(raw.cast(pa.string()), 0, keep),
            "raw_bytes": parsed.column("raw_bytes") if "raw_bytes" in parsed.column_names
            else pa.nulls(n, pa.int64()),
            "ingested_at": arrays.from_numpy(np.full(n, _epoch_us(now)), schema.TS),
        }
        q = pa.table([cols[c] for c in schema.QUARANTINE.names], names=schema.QUARANTINE.names)
        if batch.final:
            self.pairers.pop(batch.source_fp, None)
        return BatchOutput(
            events=arrays.empty(schema.EVENTS),
            summaries=arrays.empty(schema.SUMMARIES),
            quarantine=q.cast(schema.QUARANTINE),
            checkpoint=Checkpoint(batch.source_fp, batch.source, batch.end_offset),
        )

    def _transform(self, batch: RawBatch, tbl: pa.Table) -> BatchOutput:
        """:meth:`transform` without the fallback."""
        now = datetime.now(UTC)
        self.counters.lines_read += len(batch)
        self.counters.secrets_redacted = self.parser.counters.redacted
        # Plain calls — nearly every row — stay in Arrow from parse to Parquet; only the
        # rarer kinds (JSON-RPC halves, summaries, quarantine) and session-less calls go
        # through polars, so the bulk is never converted back and forth.
        kind = tbl.column("kind")
        present = set(pc.unique(kind).to_pylist())
        rest = tbl.drop_columns(["kind"])

        def rows(k: str) -> pa.Table:
            if k not in present:
                return arrays.empty(rest.schema)
            if len(present) == 1:
                return rest
            return _rows_between(rest, kind, k) if k == "call" else rest.filter(
                pc.equal(kind, arrays.scalar(k))
            )

        def frame(k: str) -> pl.DataFrame:
            df = pl.from_arrow(rows(k))
            assert isinstance(df, pl.DataFrame)
            return df

        quarantined = frame("quarantine")
        reqs, resps = frame("rpc_req"), frame("rpc_resp")
        orphans = protocol = paired = quarantined.clear()
        if reqs.height or resps.height or batch.source_fp in self.pairers:
            pairer = self.pairers.setdefault(batch.source_fp, Pairer())
            pairer.note_other_requests(
                quarantined.filter(
                    (pl.col("reason") == "non_tool_message") & pl.col("rpc_id").is_not_null()
                )
            )
            before = pairer.counters.unanswered
            paired, orphans = pairer.pair(reqs, resps, final=batch.final)
            self.counters.rpc_responses_merged += resps.height - orphans.height
            protocol, orphans = pairer.split_protocol(orphans)
            self.counters.rpc_requests_unanswered += pairer.counters.unanswered - before
            if batch.final:
                self.pairers.pop(batch.source_fp, None)

        events = self._events(rows("call"), paired, batch, now)
        summaries = self._summaries(frame("summary"), batch, now)
        quarantine = self._quarantine(quarantined, orphans, protocol, batch, now)
        return BatchOutput(
            events=events,
            summaries=summaries,
            quarantine=quarantine,
            checkpoint=Checkpoint(batch.source_fp, batch.source, batch.end_offset),
        )

    def _events(
        self, calls: pa.Table, paired: pl.DataFrame, batch: RawBatch, now: datetime
    ) -> pa.Table:
        """Event rows: this batch's calls plus completed JSON-RPC pairs, sessionized."""
        parts = [calls] if calls.num_rows else []
        if paired.height:
            parts.append(paired.select(calls.column_names).to_arrow().cast(calls.schema))
        if not parts:
            return arrays.empty(schema.EVENTS)
        ev = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
        n = ev.num_rows
        is_error = pc.coalesce(
            ev.column("is_error_b"),
            pc.invert(pc.is_in(ev.column("status"), value_set=_NOT_ERRORS)),
        )
        session_id = escape_logged(ev.column("session_id"))
        derived = pc.is_null(session_id)
        if pc.any(derived).as_py():
            todo = pl.from_arrow(ev.filter(derived).select(_SESSIONIZE_COLS))
            assert isinstance(todo, pl.DataFrame)
            ids = self.sessionizer.sessionize(todo)["session_id"].to_arrow()
            session_id = pc.replace_with_mask(
                session_id.combine_chunks(),
                derived.combine_chunks(),
                ids.cast(session_id.type),
            )
        have = set(ev.column_names)  # not ``in ev.column_names``: a new list per test
        cols = {name: ev.column(name) for name in _EVENT_COLS if name in have}
        cols.update(
            session_id=session_id,
            session_derived=derived,
            is_error=is_error,
            source=arrays.repeat(batch.source, n),
            source_fp=arrays.repeat(batch.source_fp, n),
            ingested_at=arrays.from_numpy(np.full(n, _epoch_us(now)), schema.TS),
        )
        return pa.table([cols[name] for name in _EVENT_COLS], names=_EVENT_COLS).cast(
            schema.EVENTS
        )

    def _summaries(self, rows: pl.DataFrame, batch: RawBatch, now: datetime) -> pa.Table:
        if rows.height == 0:
            return arrays.empty(schema.SUMMARIES)
        sid = rows["session_id"].to_arrow()
        escaped = escape_logged(sid)
        if escaped is not sid:
            rows = rows.with_columns(pl.Series("session_id", escaped))
        s = rows.with_columns(
            pl.col("summary_kind").alias("kind"),
            pl.lit(batch.source).alias("source"),
            pl.lit(batch.source_fp).alias("source_fp"),
            pl.lit(now).dt.cast_time_unit("us").alias("ingested_at"),
        )
        return s.select(schema.SUMMARIES.names).to_arrow().cast(schema.SUMMARIES)

    def _quarantine(
        self,
        rows: pl.DataFrame,
        orphans: pl.DataFrame,
        protocol: pl.DataFrame,
        batch: RawBatch,
        now: datetime,
    ) -> pa.Table:
        if protocol.height:
            rows = pl.concat(
                [rows, protocol.with_columns(
                    pl.lit("non_tool_message").alias("reason"),
                    pl.lit("JSON-RPC response to a non-tool request").alias("detail"),
                )],
                how="vertical_relaxed",
            )
        if orphans.height:
            rows = pl.concat(
                [
                    rows,
                    orphans.with_columns(
                        pl.lit("orphan_response").alias("reason"),
                        pl.lit("no tools/call request with this id in this session").alias(
                            "detail"
                        ),
                    ),
                ],
                how="vertical_relaxed",
            )
        if rows.height == 0:
            return arrays.empty(schema.QUARANTINE)
        keep = self.config.ingest.quarantine_raw_chars
        q = rows.with_columns(
            pl.col("raw").str.slice(0, keep).alias("raw"),
            pl.lit(batch.source).alias("source"),
            pl.lit(batch.source_fp).alias("source_fp"),
            pl.lit(now).dt.cast_time_unit("us").alias("ingested_at"),
        )
        for reason, n in q.group_by("reason").len().iter_rows():
            self.counters.quarantined[reason] += n
        return q.select(schema.QUARANTINE.names).to_arrow().cast(schema.QUARANTINE)

    def write(self, out: BatchOutput) -> None:
        """Commit one batch's tables and its checkpoint atomically."""
        self.counters.batches += 1
        self.counters.events_stored += out.events.num_rows
        self.counters.summaries_stored += out.summaries.num_rows
        if self.store is None:
            return
        self.store.write_batch(
            {"events": out.events, "summaries": out.summaries, "quarantine": out.quarantine},
            [out.checkpoint],
        )

    def process(self, batch: RawBatch) -> BatchOutput:
        """Transform and write one batch."""
        out = self.transform(batch)
        self.write(out)
        return out

    def close(self) -> None:
        """Release resources."""
        self.parser.close()
