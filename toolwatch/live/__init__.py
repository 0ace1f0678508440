"""Live mode: micro-batches from followed sources, incremental detection, alert sinks.

Every live source (a tailed file, a wrapped server's stderr, a followed pipe, a Kafka
partition) hands :class:`~toolwatch.ingest.records.RawBatch` objects to a :class:`LivePipeline`.
The pipeline buffers them and *flushes* at most every ``live.flush_interval_s`` seconds
(or once ``live.flush_events`` lines are waiting). One flush:

1. runs the same transforms as ``ingest``/``analyze`` (:class:`toolwatch.ingest.pipeline.Pipeline`,
   one call per stream with that stream's buffered lines merged);
2. adds the new events to the bounded window of the detection engine
   (:class:`~toolwatch.detectors.stream.StreamDetector`) and runs the detectors on the
   events of every entity (session, caller, client address, credential) touched by this
   micro-batch, over that entity's window — so an alert is raised as soon as evidence
   crosses its threshold, not at session end;
3. keeps only alerts that are new or whose severity/score/evidence changed
   (the engine's alert tracker): an alert is *updated*, never duplicated (the alert id
   is the detectors' deterministic id from entity, category and window);
4. commits events, summaries, quarantined lines, those alert versions and the stream
   checkpoints in **one** atomic store batch (:meth:`toolwatch.store.Store.write_batch`);
5. only then hands the alerts to the sinks and runs the ``on_commit`` hooks (the Kafka
   consumer commits its offsets there).

A process killed at any point therefore leaves the store with a whole flush or none of
it, and a restart resumes from the checkpoints: no event lost, none stored twice.

Memory is bounded: the pipeline holds at most one flush of raw lines, the window at most
``live.max_window_events`` events (older events of finished sessions expire first, see
``toolwatch.detectors.stream.DetectionWindow``), and the alert tracker at most
``live.max_tracked_alerts`` ids.

Package layout (each file says what it holds):

* :mod:`~toolwatch.live.config` — :class:`LiveConfig` and :class:`SinkConfig`;
* :mod:`toolwatch.detectors.stream` — the detection engine: window, alert tracker;
* :mod:`~toolwatch.live.detection` — when and how much to detect, baseline history;
* :mod:`~toolwatch.live.status` — :class:`LiveStatus`, :class:`StatusPublisher`,
  :func:`prometheus_text`, :func:`read_statuses`;
* :mod:`~toolwatch.live.commit` — the commit thread, :class:`FlushResult`;
* :mod:`~toolwatch.live.warmup` — reloading stored state after a restart;
* :mod:`~toolwatch.live.pipeline` — :class:`LivePipeline`, which ties them together;
* :mod:`~toolwatch.live.stop` — :class:`StopFlag` and the signal handlers;
* :mod:`~toolwatch.live.driver` — the one loop that runs any live source
  (:mod:`toolwatch.ingest.sources.base`) into a pipeline, with acknowledgements.
"""

from __future__ import annotations

from toolwatch.detectors.config import SEVERITY_RANK
from toolwatch.live.commit import FlushResult
from toolwatch.live.config import LiveConfig, SinkConfig
from toolwatch.live.detection import DetectFn, default_detector
from toolwatch.live.pipeline import LivePipeline, merge_batches
from toolwatch.live.status import (
    LiveStatus,
    RateMeter,
    StatusPublisher,
    prometheus_text,
    read_statuses,
    status_dir,
)
from toolwatch.live.stop import StopFlag, free_port, install_stop_handlers

__all__ = [
    "SEVERITY_RANK",
    "DetectFn",
    "FlushResult",
    "LiveConfig",
    "LivePipeline",
    "LiveStatus",
    "RateMeter",
    "SinkConfig",
    "StatusPublisher",
    "StopFlag",
    "default_detector",
    "free_port",
    "install_stop_handlers",
    "merge_batches",
    "prometheus_text",
    "read_statuses",
    "status_dir",
]
