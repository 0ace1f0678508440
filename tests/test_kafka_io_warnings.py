"""kafka-python's slow-IO-step warnings are counted, not printed (they are GIL waits).

kafka-python 3 logs "Task ... ran for 0.128s (>0.100s threshold). It is blocking the event
loop -- likely a tight sync loop inside a coroutine. Other pollers will time out." when a
step of its IO thread takes over 0.1 s of wall time. In `toolwatch kafka` that step waits
for the GIL beside the parse and the detection, so under load stderr filled with
warnings that the consumer hangs. They are counted in the source's status instead.
"""

from __future__ import annotations

import logging

import pytest

# A plain import: the Kafka source ships with toolwatch, so failing to import it is a
# failure here, not a reason to skip.
import toolwatch.ingest.sources.kafka as kafka_src


def _warn_like_kafka_python(logger: logging.Logger, elapsed: float) -> None:
    # the exact call kafka/net/selector.py makes: a preformatted message, no args
    task = "<kafka.net.selector.Task object at 0x7f>"
    msg = (f"Task {task!r} ran for {elapsed:.3f}s (>{0.1:.3f}s threshold). It is blocking "
           "the event loop -- likely a tight sync loop inside a coroutine. Other pollers "
           "will time out.")
    logger.warning(msg)


def test_slow_step_warnings_are_counted_not_printed(caplog: pytest.LogCaptureFixture) -> None:
    sel = logging.getLogger("kafka.net.selector")
    before = kafka_src._SlowIoSteps.count
    with caplog.at_level(logging.INFO):
        for k in range(3):
            _warn_like_kafka_python(sel, 0.11 + k / 100)
        sel.warning("Task %s left RUNNING after step; demoting to UNSCHEDULED", "t")
        sel.error("IO loop crashed (client_id=%s)", "c")
    assert kafka_src._SlowIoSteps.count == before + 3
    shown = [r.getMessage() for r in caplog.records if r.name == "kafka.net.selector"]
    # every other record of that logger still reaches the user
    assert shown == ["Task t left RUNNING after step; demoting to UNSCHEDULED",
                     "IO loop crashed (client_id=c)"]
