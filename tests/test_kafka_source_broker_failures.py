"""replayable-kafka's ride-through of broker failures (issue 37), without a broker: the
driver's metadata calls retry a dropped connection until kafka.request.timeout.ms and then
name the last error; the consumers reconnect to a restarted broker within a second and an
executor's consumer bootstraps within the read's deadline. The same on real brokers:
integration_tests/kafka_source/test_kafka_source_production_kafka.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from eospack.connectors.kafka.errors import KafkaBrokerUnreachableError
from eospack.connectors.kafka.source import broker_metadata
from eospack.connectors.kafka.source.broker_metadata import KafkaMetadata
from eospack.connectors.kafka.source.options import parse_options


def options(**extra: str) -> Any:
    return parse_options({"kafka.bootstrap.servers": "a:9092,b:9092", "subscribe": "t", **extra})


class FlakyConsumer:
    """Stands in for kafka-python's consumer: each instance's ``topics`` fails with the
    next of ``failures`` (shared), then answers."""

    created = 0

    def __init__(self, failures: list[BaseException], **_: Any) -> None:
        self.failures = failures
        FlakyConsumer.created += 1

    def topics(self) -> set[str]:
        if self.failures:
            raise self.failures.pop(0)
        return {"t"}

    def close(self) -> None:
        pass


def metadata_with(
    monkeypatch: pytest.MonkeyPatch, failures: list[BaseException], **extra: str
) -> KafkaMetadata:
    import kafka

    metadata = KafkaMetadata(options(**extra))
    FlakyConsumer.created = 0
    monkeypatch.setattr(kafka, "KafkaConsumer", lambda **config: FlakyConsumer(failures, **config))
    monkeypatch.setattr(broker_metadata, "raise_if_refused", lambda *_: None)
    return metadata


def test_a_dropped_connection_is_asked_again_with_a_fresh_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node SIGKILLed mid-call (its leaderships moving): the call is made again, on a
    consumer that bootstraps from any address, and the answer comes through."""
    failures: list[BaseException] = [KafkaConnectionError("socket disconnected")] * 2
    metadata = metadata_with(monkeypatch, failures)
    assert metadata._call(lambda consumer: consumer.topics()) == {"t"}
    assert FlakyConsumer.created == 3


def test_a_connection_dropping_past_the_request_timeout_names_the_last_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failures: list[BaseException] = [KafkaConnectionError("111 ECONNREFUSED")] * 1000
    metadata = metadata_with(monkeypatch, failures, **{"kafka.request.timeout.ms": "1500"})
    started = time.monotonic()
    with pytest.raises(KafkaBrokerUnreachableError) as raised:
        metadata._call(lambda consumer: consumer.topics())
    assert time.monotonic() - started < 1.5 + 0.5
    assert str(raised.value) == (
        "Kafka at a:9092,b:9092 (option kafka.bootstrap.servers) did not answer within 1500 ms"
        " (KafkaConnectionError: 111 ECONNREFUSED): check the servers are up and reachable,"
        " or raise kafka.request.timeout.ms"
    )


def test_a_request_that_timed_out_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own timeout already spent the deadline: one attempt, then the error."""
    failures: list[BaseException] = [KafkaTimeoutError("request timed out"), KafkaTimeoutError()]
    metadata = metadata_with(monkeypatch, failures)
    with pytest.raises(KafkaBrokerUnreachableError, match=r"\(KafkaTimeoutError: request timed"):
        metadata._call(lambda consumer: consumer.topics())
    assert FlakyConsumer.created == 1


def test_consumers_reconnect_within_a_second_and_bootstrap_within_the_read_deadline() -> None:
    """kafka-python's own default waits up to 30 s between reconnects: a read whose broker
    restarted within seconds sat past kafkaConsumer.pollTimeoutMs (the SASL_SSL kill test
    failed so). A user's kafka.reconnect.backoff.max.ms wins."""
    parsed = options(**{"kafkaConsumer.pollTimeoutMs": "45000"})
    assert parsed.consumer_config()["reconnect_backoff_max_ms"] == 1_000
    assert parsed.consumer_config()["bootstrap_timeout_ms"] == 45_000
    assert parsed.metadata_consumer_config()["reconnect_backoff_max_ms"] == 1_000
    assert parsed.metadata_consumer_config()["bootstrap_timeout_ms"] == 10_000
    chosen = options(**{"kafka.reconnect.backoff.max.ms": "5000"})
    assert chosen.consumer_config()["reconnect_backoff_max_ms"] == 5_000
