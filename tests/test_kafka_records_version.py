"""The chunk decoder checks the kafka-python it runs on (issue 29).

It subclasses kafka-python's private ``Fetcher.PartitionRecords``: on a release it was not
written for, the consumer keeps kafka-python's own decoder and the log says why.
"""

from __future__ import annotations

import logging

import kafka
import pytest
from toolwatch.ingest.sources import kafka_records
from toolwatch.ingest.sources.kafka_records import (
    UnsupportedKafkaPython,
    check_kafka_python,
    install_fast_records,
)


def test_installed_kafka_python_is_supported() -> None:
    assert check_kafka_python() == kafka.__version__


@pytest.mark.parametrize("version", ["2.2.0", "2.3.1", "3.0.12", "3.9"])
def test_versions_in_range_pass(version: str) -> None:
    assert check_kafka_python(version) == version


@pytest.mark.parametrize("version", ["2.1.9", "1.4.7", "4.0.0", "10.1"])
def test_versions_out_of_range_raise_a_clear_error(version: str) -> None:
    with pytest.raises(UnsupportedKafkaPython, match=rf"kafka-python {version}:.*written for"):
        check_kafka_python(version)


def test_unsupported_version_falls_back_to_the_stock_decoder(monkeypatch, caplog) -> None:
    class Consumer:
        class _Fetcher:
            class PartitionRecords:
                def _unpack_records(self) -> None: ...

        def __init__(self) -> None:
            self._fetcher = self._Fetcher()
            self.config: dict = {}

    consumer = Consumer()
    monkeypatch.setattr(kafka, "__version__", "4.1.0")
    with caplog.at_level(logging.WARNING, logger=kafka_records.log.name):
        assert install_fast_records(consumer) is False  # type: ignore[arg-type]
    assert "4.1.0" in caplog.text and "stock decoder" in caplog.text
    assert "PartitionRecords" not in vars(consumer._fetcher)  # left as it was
