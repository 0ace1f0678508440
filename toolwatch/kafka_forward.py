"""``python -m toolwatch.kafka_forward -b HOST:PORT -t TOPIC``: stdin lines to Kafka.

The producer side of the ``kafka`` source (:mod:`toolwatch.ingest.sources.kafka`): each
JSON log line becomes one message keyed by its caller id (else session id), so a caller's
lines reach one partition, hence one ``toolwatch kafka`` member.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import orjson


def message_key(line: bytes) -> bytes | None:
    """The Kafka key for a log line: its caller id, else its session id, else None.

    Top-level fields under any alias of docs/log-format.md (``caller_id``, ``callerId``,
    ``user_id``, ... then ``session_id``, ``sessionId``, ...). Keying by caller keeps a
    caller on one partition, hence on one ``toolwatch kafka`` member. A line that is not a
    JSON object, or has neither field, gets no key (the producer spreads those).
    """
    from toolwatch.ingest.aliases import ALIASES

    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    for field in ("caller_id", "session_id"):
        for name in ALIASES[field]:
            v = obj.get(name)
            if isinstance(v, str) and v:
                return v.encode()
            if isinstance(v, int) and not isinstance(v, bool):
                return str(v).encode()
    return None


def forward_lines(stream: BinaryIO, producer: Any, topic: str, tee: BinaryIO | None = None) -> int:
    """Send every non-empty line of ``stream`` to ``topic``, keyed by :func:`message_key`.

    ``tee`` also gets each line as read (so a server's stderr still reaches its log).
    Returns the number of messages sent; the producer is flushed at the end of the stream.
    """
    n = 0
    for raw in stream:
        if tee is not None:
            tee.write(raw)
        line = raw.rstrip(b"\r\n")
        if not line:
            continue
        producer.send(topic, key=message_key(line), value=line)
        n += 1
    producer.flush()
    if tee is not None:
        tee.flush()
    return n


def forward_main(argv: list[str] | None = None) -> int:
    """``python -m toolwatch.kafka_forward -b HOST:PORT -t TOPIC``: stdin lines to Kafka.

    For an MCP server that logs JSON lines to stderr::

        python my_server.py 2> >(python -m toolwatch.kafka_forward -b kafka:9092 -t mcp-logs)
    """
    import argparse
    import sys

    from kafka import KafkaProducer

    p = argparse.ArgumentParser(
        prog="python -m toolwatch.kafka_forward",
        description="Forward JSON log lines from stdin to Kafka, "
        "keyed by caller id (else session id).",
    )
    p.add_argument("-b", "--bootstrap-servers", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument(
        "--compression", default="zstd", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    p.add_argument("--linger-ms", type=int, default=50)
    p.add_argument("--tee", action="store_true", help="also copy the lines to stderr")
    a = p.parse_args(argv)
    prod = KafkaProducer(
        bootstrap_servers=a.bootstrap_servers.split(","),
        linger_ms=a.linger_ms,
        compression_type=None if a.compression == "none" else a.compression,
    )
    try:
        forward_lines(sys.stdin.buffer, prod, a.topic, sys.stderr.buffer if a.tee else None)
    finally:
        prod.close(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(forward_main())
