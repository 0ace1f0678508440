"""``toolwatch analyze``: ingest given logs and run every detector over them."""

from __future__ import annotations

import contextlib
import importlib
import logging
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa
from rich.console import Console
from rich.table import Table
from rich.text import Text

from toolwatch import schema
from toolwatch.allocator import _ARENAS_ALL, _duckdb_mallctl, release_memory
from toolwatch.config import Config
from toolwatch.gc_pause import gc_paused
from toolwatch.ingest import arrays
from toolwatch.ingest.runner import IngestResult, ingest_paths
from toolwatch.output import json_safe, safe_text, table_cell
from toolwatch.store import Store

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    # polars is imported by the functions that use it: ``analyze`` starts parsing before
    # paying for that import (see toolwatch.ingest.runner).
    import polars as pl

    from toolwatch.ingest.pipeline import BatchOutput


@dataclass
class AnalyzeResult:
    """Ingest counters plus the alerts raised."""

    ingest: IngestResult
    alerts: pl.DataFrame


def load_events(store: Store, fingerprints: list[str] | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Events and summaries of the given streams (all streams when ``None``)."""
    import polars as pl

    con = store.connect()
    try:
        where = "WHERE source_fp IN (SELECT unnest($fps))" if fingerprints is not None else ""
        params = {"fps": fingerprints} if fingerprints is not None else {}
        # The raw line is for forensics only; detectors never read it (it is most of the bytes).
        ev = pl.from_arrow(
            con.sql(
                f"SELECT * EXCLUDE (raw) FROM events {where} ORDER BY ts", params=params
            ).to_arrow_table()
        )
        su = pl.from_arrow(
            con.sql(f"SELECT * FROM summaries {where} ORDER BY ts", params=params).to_arrow_table()
        )
    finally:
        con.close()
    assert isinstance(ev, pl.DataFrame) and isinstance(su, pl.DataFrame)
    return ev, su


def run_detectors(
    config: Config, events: pl.DataFrame, summaries: pl.DataFrame, model_path: Path | None = None
) -> pl.DataFrame:
    """Every registered detector over the events; returns alerts (schema.ALERTS columns).

    The detection engine's detector function (the one every live command runs, see
    :func:`toolwatch.detectors.stream.engine_detector`) over everything at once.
    """
    import polars as pl

    try:
        from toolwatch import detectors
        from toolwatch.detectors.stream import engine_detector
    except ImportError:  # pragma: no cover - detectors package absent
        return pl.from_arrow(pa.Table.from_batches([], schema=schema.ALERTS))  # type: ignore[return-value]
    dcfg = detectors.DetectorsConfig.from_dict(config.detectors)
    detect = engine_detector(
        dcfg, model_path=config.trained_forest if model_path is None else model_path,
        data_dir=config.data_dir,
        suppress_unauthenticated=config.triage.suppress_unauthenticated_callers,
        isolated=False)  # batch fits the forest in process (scikit-learn is warm)
    return detect(events, summaries)


def alerts_to_arrow(alerts: pl.DataFrame) -> pa.Table:
    """Alerts frame as an Arrow table of the store's alert schema."""
    return alerts.select(schema.ALERTS.names).to_arrow().cast(schema.ALERTS)


def write_alerts_jsonl(alerts: pl.DataFrame, path: Path) -> None:
    """Alerts as JSON lines (docs/alert.schema.json); ``evidence`` as an object.

    Terminal-safe like the live sinks' lines (:func:`toolwatch.output.json_safe`): entity
    ids and reasons come from the logs, and this file gets ``cat``/``tail -f``'d."""

    with open(path, "wb") as fh:
        for row in alerts.select(schema.ALERTS.names).iter_rows(named=True):
            row["evidence"] = orjson.loads(row["evidence"]) if row.get("evidence") else {}
            text = orjson.dumps(row, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC).decode()
            fh.write(json_safe(text).encode() + b"\n")


def _warm_imports() -> None:
    """Import the detectors and scikit-learn (see :func:`analyze_paths`)."""
    try:
        importlib.import_module("toolwatch.detectors.pipeline")
        from toolwatch.detectors.forest import _import_sklearn

        _import_sklearn()  # without pandas, as the forest itself imports it
    except ImportError:  # pragma: no cover - reported where the module is used
        return


def analyze_paths(
    config: Config,
    paths: list[str],
    *,
    alerts_out: Path | None = None,
    progress: bool | None = None,
) -> AnalyzeResult:
    """Ingest ``paths`` then detect over the events of exactly those streams."""
    with gc_paused():  # the detectors too (see toolwatch.gc_pause)
        return _analyze_paths(config, paths, alerts_out=alerts_out, progress=progress)


def _analyze_paths(
    config: Config, paths: list[str], *, alerts_out: Path | None, progress: bool | None
) -> AnalyzeResult:
    # scikit-learn (with the scipy and pandas it pulls in) costs ~1 s of CPU to import;
    # do it while the logs are parsed, when DuckDB and pyarrow hold the cores without the
    # GIL. (Importing it after ingest, beside the detectors' polars work, measured the
    # same: on two cores it is CPU either phase has to give up.)
    warm = threading.Thread(target=_warm_imports, daemon=True)
    warm.start()
    store = Store(config.data_dir, compact_min_files=config.store.compact_min_files,
                  vacuum_hours=config.store.vacuum_hours)
    # Keep what this run stores (minus the raw line) instead of reading it back; if part
    # of the input was already in the store, read those streams' events from the store.
    kept_events: list[pa.Table] = []
    kept_summaries: list[pa.Table] = []
    # Only the columns the detectors read are held: the others' memory is then reused by
    # the next batches instead of each batch taking fresh pages from the kernel.
    columns: list[str] = []
    budget = config.analyze.max_events_in_memory
    # Past the budget the events are read back from the store in partitions instead.
    held = {"n": 0, "over": config.analyze.partitions > 1}

    def keep(out: BatchOutput) -> None:
        if held["over"]:
            return
        if not columns:
            columns.extend(_detector_columns())
        held["n"] += out.events.num_rows
        if budget > 0 and held["n"] > budget:
            held["over"] = True
            kept_events.clear()
            kept_summaries.clear()
            return
        kept_events.append(_compact(out.events.select(columns)))
        kept_summaries.append(out.summaries)

    res = ingest_paths(config, paths, store=store, progress=progress, on_output=keep)
    warm.join()
    n_parts = _partitions(config, store, res.fingerprints) if (
        held["over"] or res.counters.sources_skipped_bytes or res.failures
    ) else 1
    if n_parts > 1:
        alerts = run_partitioned(config, store, res.fingerprints, n_parts)
        return _finish(store, alerts, res, alerts_out)
    if not held["over"] and res.counters.sources_skipped_bytes == 0 and not res.failures:
        release_memory()  # what ingest freed (its pool and heap pages), under the copy below
        kept = pa.schema([schema.EVENTS.field(c) for c in _detector_columns()])
        events = _frame(kept_events, kept)
        summaries = _frame(kept_summaries, schema.SUMMARIES)
    else:
        kept_events.clear()
        events, summaries = load_events(store, res.fingerprints)
    kept_events.clear()
    kept_summaries.clear()
    # The batches are one frame now: Arrow's pool (mimalloc) and the glibc heap keep what
    # they held as free pages (~0.3 GB at 1M events), under detection's own peak.
    release_memory()
    alerts = run_detectors(config, events, summaries)
    return _finish(store, alerts, res, alerts_out)


def _finish(
    store: Store, alerts: pl.DataFrame, res: IngestResult, alerts_out: Path | None
) -> AnalyzeResult:
    if alerts.height:
        store.write_batch({"alerts": alerts_to_arrow(alerts)})
        store.close()
    if alerts_out is not None:
        write_alerts_jsonl(alerts, alerts_out)
    return AnalyzeResult(ingest=res, alerts=alerts)


def _sid(a: str = "") -> str:
    """Session key SQL, with the stand-in of events without a session id (as
    detectors.features builds it); ``a`` is a table alias prefix such as ``e.``."""
    return f"coalesce({a}session_id, 'nosession:' || coalesce({a}caller_id, {a}client_ip, '?'))"


def _where(fingerprints: list[str] | None, alias: str = "") -> tuple[str, dict[str, object]]:
    if fingerprints is None:
        return "TRUE", {}
    return f"{alias}source_fp IN (SELECT unnest($fps))", {"fps": fingerprints}


def _hash_or_null(col: str) -> str:
    """DuckDB's 64-bit hash of ``col``, NULL where it is NULL (``hash(NULL)`` is not)."""
    return f"CASE WHEN {col} IS NOT NULL THEN hash({col}) END"


def _sql_str(text: str) -> str:
    """``text`` inside a single-quoted SQL literal (a local path, never log data)."""
    return text.replace("'", "''")


def _partitions(config: Config, store: Store, fingerprints: list[str] | None) -> int:
    """How many partitions detection runs in (1 = every event in memory at once)."""
    if config.analyze.partitions > 0:
        return config.analyze.partitions
    budget = config.analyze.max_events_in_memory
    if budget <= 0:
        return 1
    n = _count_events(store, fingerprints)
    # A partition's fit set is the partition (~budget / 3) plus the sample (~budget / 6):
    # detection holds about 2.5x its fit set's events (prepared events, sessions, the
    # partition's cut, detector frames), so a partition peaks near a single pass over
    # budget / 2 events, below the single pass it replaces.
    return 1 if n <= budget else -(-n // max(budget // 3, 1))


def _count_events(store: Store, fingerprints: list[str] | None) -> int:
    where, params = _where(fingerprints)
    con = store.connect()
    try:
        row = con.execute(f"SELECT count(*) FROM events WHERE {where}", params).fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def run_partitioned(
    config: Config, store: Store, fingerprints: list[str] | None, n_parts: int,
    model_path: Path | None = None,
) -> pl.DataFrame:
    """Detect in ``n_parts`` hash partitions read back from the store (bounded memory).

    The passes are the engine's (:func:`toolwatch.detectors.partition.detect_partitioned`:
    by caller, then by client address); this function keys and reads them. Sessions are
    keyed by their caller (sessions without one by session id), so every session and
    every caller's windows are whole in one partition, and by their client address.
    Each partition's detectors are fitted on the partition plus a uniform
    sample of partition keys of about ``max_events_in_memory / 6`` events (all keys when
    the input is that small, which makes the result equal to the single pass): per-caller
    baselines and habits are exact, population baselines come from the sample. The forest
    is fitted once (first partition) and reused. Alert times are relative to the latest
    log time of the whole input.

    Limits: a session with events from several callers (or addresses) is put whole in the
    partition of the smallest one, so that other caller's (address's) windows lose those
    events.
    """
    import polars as pl

    try:
        from toolwatch import detectors
        from toolwatch.detectors.partition import detect_partitioned
    except ImportError:  # pragma: no cover - detectors package absent
        return pl.from_arrow(pa.Table.from_batches([], schema=schema.ALERTS))  # type: ignore[return-value]
    dcfg = detectors.DetectorsConfig.from_dict(config.detectors)
    if model_path is None:
        model_path = config.trained_forest
    budget = config.analyze.max_events_in_memory
    where, params = _where(fingerprints)
    ew, _ = _where(fingerprints, "e.")
    ev_cols = ", ".join(f"e.{c}" for c in _detector_columns())
    con = store.connect()
    spill = Path(tempfile.mkdtemp(prefix="toolwatch-analyze-"))
    found: list[pl.DataFrame] = []
    try:
        # Every read below has its own ORDER BY: DuckDB need not buffer to keep row order.
        con.execute("SET preserve_insertion_order = false")
        n_events = _count_events(store, fingerprints)
        # Sample 1 key in ``every``: about budget / 6 events (every key when small).
        every = max(1, -(-n_events // max(budget // 6, 1))) if budget > 0 else 1
        latest = con.execute(
            f"SELECT max(t) FROM (SELECT max(epoch_us(ts)) AS t FROM events WHERE {where} "
            f"UNION ALL SELECT max(epoch_us(ts)) FROM summaries WHERE {where})",
            params,
        ).fetchone()[0]  # type: ignore[index]
        # One row per session: its partition keys (the smallest hash of its callers, else
        # the session's; the smallest hash of its addresses), all 64-bit hashes rather
        # than strings: the key table and its aggregate stay small with many sessions (two
        # sessions colliding would only share a partition). DuckDB is capped and spills
        # to a temporary directory instead of growing with sessions.
        con.execute(f"SET temp_directory = '{_sql_str(str(spill))}'")
        con.execute("SET memory_limit = '512MB'")
        con.execute(
            f"""
            CREATE TEMP TABLE tw_keys AS
            SELECT sk, coalesce(min(ch), sk) AS ck, min(ih) AS ik, sum(n) AS n,
                   false AS split_ck, false AS split_ik
            FROM (SELECT hash({_sid()}) AS sk, {_hash_or_null('caller_id')} AS ch,
                         {_hash_or_null('client_ip')} AS ih, 1 AS n
                  FROM events WHERE {where}
                  UNION ALL
                  SELECT hash(session_id), {_hash_or_null('caller_id')},
                         {_hash_or_null('client_ip')}, 0
                  FROM summaries WHERE session_id IS NOT NULL AND {where})
            GROUP BY sk
            """,
            params,
        )
        for key, what in (("ck", "caller(s)"), ("ik", "client address(es)")):
            # An address is capped as a caller is: one client address with 3M events was
            # one 3M-event partition of the address pass (5.1 GB) after the caller pass
            # had been spread.
            split = _split_big_keys(con, config, n_parts, key)
            if split:
                log.warning(
                    "analyze: %d %s with more than %d events spread over partitions by "
                    "session ([analyze] max_events_per_caller): their cross-session windows "
                    "see part of their traffic", split[0], what, split[1],
                )
        # Session keys per pass: ck (caller, else session) and ik (client address).
        column = {"caller": "ck", "address": "ik"}

        def read(key: str, i: int) -> tuple[pl.DataFrame, pl.DataFrame]:
            k = column[key]
            part = f"k.{k} % {n_parts} = {i}"
            # NULL keys (sessions without an address) are in no address partition. A
            # split key (a slice of one caller above the cap) is no sample of the
            # population, and one slice is max_events_per_caller events: sampled, it
            # doubled every partition's fit set.
            sample = "TRUE" if every == 1 else (
                f"k.{k} IS NOT NULL AND NOT k.split_{k} AND hash(k.{k}) % {every} = 0")
            frames = _read_partition(con, ev_cols, ew, params, part, sample)
            _release_read()
            return frames

        found = detect_partitioned(read, n_parts, dcfg, detected_at=latest,
                                   model_path=model_path)
        from toolwatch.detectors.suppress import has_caller_rules

        auth = None
        if (found and not config.triage.suppress_unauthenticated_callers
                and has_caller_rules(config.data_dir)):
            # The events are no longer in memory: the alerted callers' marking comes from
            # the store, aggregated there as _caller_auth does (one row per caller; their
            # names are a bound list, never SQL text).
            callers = pl.concat([a.select("caller_id") for a in found]).drop_nulls().unique()
            auth = pl.from_arrow(con.sql(
                "SELECT caller_id, CASE WHEN bool_or(NOT caller_authenticated) THEN false "
                "WHEN count(caller_authenticated) = 0 THEN NULL ELSE true END "
                f"AS caller_authenticated FROM events WHERE {where} "
                "AND caller_id IN (SELECT unnest($callers)) GROUP BY caller_id",
                params={**params, "callers": callers["caller_id"].to_list()},
            ).to_arrow_table())
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
    alerts = pl.concat(found, how="vertical_relaxed") if found else None
    if alerts is None:
        alerts = pl.from_arrow(pa.Table.from_batches([], schema=schema.ALERTS))  # type: ignore[assignment]
    assert isinstance(alerts, pl.DataFrame)
    from toolwatch.detectors.suppress import apply_triage_suppressions

    return apply_triage_suppressions(
        alerts, config.data_dir,
        unauthenticated=config.triage.suppress_unauthenticated_callers, auth=auth)


def _split_big_keys(con: object, config: Config, n_parts: int,
                    key: str = "ck") -> tuple[int, int] | None:
    """Give the sessions of callers (``key`` ``ck``; client addresses: ``ik``) above the
    per-caller cap their own partition keys.

    A partition holds whole callers, so one caller with 3M events was one 3M-event
    partition (4.3 GB) whatever ``n_parts``. Past the cap, such a caller's sessions get
    ``ceil(events / cap)`` keys (by session hash), which go round the partitions.

    Returns
    -------
    tuple of (int, int) or None
        Callers split and the cap, or None when none was.
    """
    if n_parts <= 1:
        return None
    a = config.analyze
    cap = a.max_events_per_caller or max(a.max_events_in_memory // 3, 1)
    con.execute(  # type: ignore[attr-defined]
        f"CREATE OR REPLACE TEMP TABLE tw_big AS SELECT {key} AS k, "
        f"CAST(ceil(sum(n) / $cap) AS UBIGINT) AS m FROM tw_keys WHERE {key} IS NOT NULL "
        f"GROUP BY {key} HAVING sum(n) > $cap",
        {"cap": cap},
    ).fetchall()
    # fetchall: a result left half-read blocks the next statement on this connection.
    n_big = con.execute("SELECT count(*) FROM tw_big").fetchall()[0][0]  # type: ignore[attr-defined]
    if not n_big:
        return None
    # Key j (0 <= j < m, by session hash) lands in partition (k + j) % n_parts: the keys
    # go round the partitions instead of hashing into them, where two of four keys often
    # shared one (one 3M-event caller: a 1.6M-event partition beside an empty one).
    # ``k >> 1`` keeps the sum below 2^64.
    con.execute(  # type: ignore[attr-defined]
        f"ALTER TABLE tw_keys ADD COLUMN IF NOT EXISTS split_{key} BOOLEAN DEFAULT false"
    ).fetchall()
    con.execute(  # type: ignore[attr-defined]
        f"UPDATE tw_keys SET {key} = (b.k >> 1) // $n * $n + (b.k % $n + tw_keys.sk % b.m) "
        f"% $n, split_{key} = true FROM tw_big b WHERE tw_keys.{key} = b.k",
        {"n": n_parts},
    ).fetchall()
    return int(n_big), int(cap)


def _read_partition(
    con: object, ev_cols: str, ew: str, params: dict[str, object], part: str, sample: str
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Events and summaries of one partition plus the sample, ``_part`` marking the former.

    Rows come in time order, ties in file and line order (as ingest stores them).
    """
    import polars as pl

    sel = f"{part} AS _part"
    ev = pl.from_arrow(con.sql(  # type: ignore[attr-defined]
        f"SELECT {ev_cols}, {sel} FROM events e JOIN tw_keys k ON k.sk = hash({_sid('e.')}) "
        f"WHERE {ew} AND ({part} OR {sample}) "
        "ORDER BY e.ts, e.source_fp, e.line_no",
        params=params,
    ).to_arrow_table())
    su = pl.from_arrow(con.sql(  # type: ignore[attr-defined]
        f"SELECT e.* EXCLUDE (raw), {sel} FROM summaries e JOIN tw_keys k "
        f"ON k.sk = hash(e.session_id) WHERE {ew} AND ({part} OR {sample}) "
        "ORDER BY e.ts, e.source_fp, e.line_no",
        params=params,
    ).to_arrow_table())
    assert isinstance(ev, pl.DataFrame) and isinstance(su, pl.DataFrame)
    return ev, su


def _release_read() -> None:
    """Return what a partition read freed before the partition is detected on.

    DuckDB allocates through a jemalloc of its own whose freed pages decay only while
    DuckDB allocates again; the partition's sort and Arrow export left them resident
    through the whole detection pass (one caller with 3M events: ~0.3-0.45 GB). A purge
    returns them now; the arenas keep their decay settings, and the next read takes fresh
    pages (the same CPU: 74.5 vs 74.6 s user over 8 partitions). Then glibc's heap and
    Arrow's pool, as before a single pass.
    """
    fn = _duckdb_mallctl()
    if fn is not None:
        with contextlib.suppress(Exception):
            fn(b"arena.%d.purge" % _ARENAS_ALL, None, None, None, 0)
    release_memory()


def _detector_columns() -> list[str]:
    """Event columns the detectors read (all but ``raw`` without the detectors package)."""
    try:
        from toolwatch.detectors.features import EVENT_COLUMNS
    except ImportError:  # pragma: no cover - detectors package absent
        return [n for n in schema.EVENTS.names if n != "raw"]
    return [n for n in schema.EVENTS.names if n in EVENT_COLUMNS]


def _compact(table: pa.Table) -> pa.Table:
    """``table`` with every column copied into buffers of its own (Arrow's pool).

    A parsed batch's columns are DuckDB's Arrow export: every buffer of it keeps the whole
    exported batch alive (one release callback for all columns), the ``raw`` line
    included; and polars' string columns made from it are views into those buffers.
    Holding a few columns of each batch so held all of it (1M events with distinct tool
    names: 402 MB of glibc heap in use for 210 MB of kept columns, and it stayed in use
    through detection). A copy costs one memcpy of the kept columns. (``Table.combine_chunks`` keeps
    one-chunk columns as they are; ``concat_arrays`` always allocates.)
    """
    if table.num_rows == 0:
        return table
    cols = [pa.concat_arrays(col.chunks) for col in table.columns]
    return pa.Table.from_arrays(cols, schema=table.schema)


def _frame(tables: list[pa.Table], sch: pa.Schema) -> pl.DataFrame:
    """Concatenate batch tables into one frame in time order (as the store view is).

    ``tables`` is emptied, so the batch chunks go as soon as the one-chunk frame exists.
    (Copying column by column and dropping each from every batch table saved ~0.7 GB at
    3M events but cost ~7 s per 1M events; inputs that large now go to
    :func:`run_partitioned` instead.)
    """
    import polars as pl

    df = pl.from_arrow(pa.concat_tables(tables) if tables else arrays.empty(sch))
    tables.clear()
    assert isinstance(df, pl.DataFrame)
    # One log file is usually in time order already, and sorting a 1M-row frame costs
    # ~0.5 s even then (every column is gathered); the check is one pass over ``ts``.
    # Either way the result is one chunk per column, which the detectors need (see
    # detectors.features.prepare_events), made here so the many-chunk frame is let go.
    return df.rechunk() if df["ts"].is_sorted() else df.sort("ts")


def print_alerts(
    alerts: pl.DataFrame, limit: int = 50, data_dir: str | Path | None = None
) -> None:
    """Flagged sessions and entities, most severe first.

    ``data_dir``: the store, named in the closing hint so the commands it suggests work
    as printed (``toolwatch alerts`` alone reads the configured store, not this one).
    """
    import polars as pl

    # Wide enough for one alert per line when piped (rich falls back to 80 columns).
    console = Console(width=max(Console().width, 160))
    if alerts.height == 0:
        console.print("no alerts")
        return
    from toolwatch.detectors.config import SEVERITY_RANK

    # Most severe first: the scale is defined once, in detectors/config.py.
    order = {s: -r for s, r in SEVERITY_RANK.items()}
    df = alerts.with_columns(
        pl.col("severity").replace_strict(order, default=9).alias("_o")
    ).sort(["_o", "score"], descending=[False, True])
    t = Table(title=f"{alerts.height} alert(s): flagged sessions and entities")
    for c in ("severity", "category", "caller @ address", "entity", "window (UTC)",
              "first reason"):
        t.add_column(c, overflow="fold")
    for r in df.head(limit).iter_rows(named=True):
        # Who before ids: most alerts are about a session, whose id says nothing.
        who = f"{r.get('caller_id') or '?'} @ {r.get('client_ip') or '?'}"
        entity = f"{r['entity_type']}={r['entity_id']}"
        window = f"{r['first_seen']:%m-%d %H:%M} → {r['last_seen']:%m-%d %H:%M}"
        reason = (r["reasons"] or [""])[0]
        # Ids and reasons quote logged values: escaped Text, never markup or raw controls,
        # and cut (a 300 kB session id folded into thousands of lines of table).
        t.add_row(*(Text(table_cell(v)) for v in (r["severity"], r["category"], who, entity,
                                                 window, reason)))
    console.print(t)
    import shlex

    store = f" -d {shlex.quote(str(data_dir))}" if data_dir is not None else ""
    if alerts.height > limit:
        more = f"… {alerts.height - limit} more: toolwatch alerts{store}"
        console.print(Text(safe_text(more)), soft_wrap=True)
    hint = f"the same alerts rolled up per actor: toolwatch incidents{store}"
    console.print(Text(safe_text(hint)), soft_wrap=True)
