"""Run sources through the pipeline into the store, with progress and a summary."""

from __future__ import annotations

import gc
import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from toolwatch.ingest.parse import ParserPool
from toolwatch.ingest.sources import FileSource, StdinSource, expand_paths

from toolwatch.config import Config
from toolwatch.errors import SourceError, StoreError
from toolwatch.gc_pause import gc_paused
from toolwatch.store import Store

if TYPE_CHECKING:  # polars: imported once the parse workers are busy (see _ingest_paths)
    from toolwatch.ingest.pipeline import BatchOutput, Counters, Pipeline


#: Batches between two garbage collections during a run (automatic ones are off).
_GC_EVERY = 32


@dataclass
class IngestResult:
    """Outcome of one ``ingest`` run."""

    counters: Counters
    fingerprints: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def ingest_paths(
    config: Config,
    paths: list[str],
    *,
    store: Store | None = None,
    progress: bool | None = None,
    on_output: Callable[[BatchOutput], None] | None = None,
) -> IngestResult:
    """Ingest files/globs/``-`` into the store (see :func:`_ingest_paths`)."""
    with gc_paused():
        return _ingest_paths(config, paths, store=store, progress=progress, on_output=on_output)


def _ingest_paths(
    config: Config,
    paths: list[str],
    *,
    store: Store | None,
    progress: bool | None,
    on_output: Callable[[BatchOutput], None] | None,
) -> IngestResult:
    """Ingest files/globs/``-`` into the store.

    A source that cannot be read at all is reported in ``failures`` and the others still
    run; bad lines never fail a run (they are quarantined). ``on_output`` sees every
    batch's tables as they are committed (``analyze`` keeps them instead of re-reading).
    """
    store = store or Store(config.data_dir, compact_min_files=config.store.compact_min_files,
                  vacuum_hours=config.store.vacuum_hours)
    parser = ParserPool.from_config(config)
    pipe: Pipeline | None = None

    def start_pipeline() -> Pipeline:
        # The transforms need polars, ~0.15 s of one core to import: it is imported here,
        # once the first batches are in the parse workers' hands, instead of before them.
        nonlocal pipe
        if pipe is None:
            from toolwatch.ingest.pipeline import Pipeline

            pipe = Pipeline(config, store, parser=parser)
        return pipe

    failures: list[str] = []
    fingerprints: list[str] = []
    batches = 0
    try:
        targets = expand_paths(paths)
    except SourceError as exc:
        failures.append(str(exc))
        targets = []
        for p in paths:
            try:
                targets.extend(expand_paths([p]))
            except SourceError:
                continue
    show = sys.stderr.isatty() if progress is None else progress
    # Stages overlap on the machine's cores (DuckDB, pyarrow and polars release the GIL):
    # the next batches are parsed by the parser pool while batch N's stateful transforms
    # run here, in order, and earlier batches are compressed and committed on ``writer``.
    # A bounded number of batches in flight bounds memory to a few chunks; one writer
    # thread keeps commits, and so checkpoints, in stream order.
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")
    failed: list[BaseException] = []

    def write_in_order(pipeline: Pipeline, out: BatchOutput) -> None:
        # A batch queued behind a failed one must not commit: its checkpoint would skip
        # the lost batch's lines.
        if failed:
            raise StoreError("not written: an earlier batch of this run failed to commit")
        try:
            pipeline.write(out)
        except BaseException as exc:
            failed.append(exc)
            raise

    checkpoints = store.checkpoints()
    cap = config.ingest.max_line_bytes
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        disable=not show,
        transient=True,
    ) as bar:
        for path in targets:
            # Writes run in submission order on the one writer thread; two may wait, so
            # the next batch is read and transformed while the previous one is written.
            pending: deque[Future[None]] = deque()
            try:
                src: FileSource | StdinSource = (
                    StdinSource(config.ingest.chunk_bytes, checkpoints, max_line_bytes=cap)
                    if path == "-"
                    else FileSource(path, config.ingest.chunk_bytes, checkpoints, cap)
                )
                task = bar.add_task(path, total=src.size or None)
                for batch, parsed in parser.parse_ahead(src.batches(), start_pipeline):
                    pipeline = start_pipeline()
                    out = pipeline.transform(batch, parsed)
                    while len(pending) >= 2:
                        pending.popleft().result()
                    pending.append(writer.submit(write_in_order, pipeline, out))
                    batches += 1
                    if batches % _GC_EVERY == 0:
                        gc.collect()  # only what this run made: the rest is frozen
                    bar.update(task, completed=src.progress())
                    if on_output:
                        on_output(out)
                while pending:
                    pending.popleft().result()
                counters = start_pipeline().counters
                reader = getattr(src, "reader", None)
                if reader is not None:
                    counters.sources_skipped_bytes += reader.skipped_bytes
                    if reader.fingerprint:
                        fingerprints.append(reader.fingerprint)
                counters.sources += 1
                bar.remove_task(task)
            except SourceError as exc:
                while pending:
                    pending.popleft().result()  # what was read before the failure is kept
                failures.append(str(exc))
    writer.shutdown(wait=True)
    pipe = start_pipeline()
    pipe.close()
    for name in ("events", "quarantine", "summaries", "streams"):
        store.compact(name)
    store.close()
    return IngestResult(pipe.counters, fingerprints, failures)
