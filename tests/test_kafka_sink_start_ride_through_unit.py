"""A 2pc-kafka query that starts while a broker is down (a restart during a rolling restart,
or after a crash that took a node with it) asks its start-up broker calls again instead of
failing: the production lane's restart with the ledger coordinator's node down failed at
DescribeCluster with ECONNREFUSED (``connectors/kafka/client/ride_through.asked_again``)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import errors as kafka_errors
from pyspark.sql.types import BinaryType, StructField, StructType

from eospack.connectors.kafka.client import ride_through
from eospack.connectors.kafka.errors import KafkaAuthenticationError
from eospack.connectors.kafka.sink import cluster_identity
from eospack.connectors.kafka.sink import data_source as sink


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ride_through.time, "sleep", lambda seconds: None)


def failing(times: int, error: BaseException, answer: Any = "answer") -> Any:
    calls: list[int] = []

    def call(*_: Any, **__: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return answer

    call.calls = calls  # type: ignore[attr-defined]
    return call


def test_a_refused_connection_is_asked_again_until_it_answers() -> None:
    call = failing(2, kafka_errors.KafkaConnectionError("111 ECONNREFUSED"))
    assert ride_through.asked_again("asking", call, 30.0, "2pc-kafka") == "answer"
    assert len(call.calls) == 3


def test_a_refused_login_is_raised_at_once() -> None:
    call = failing(5, KafkaAuthenticationError("login refused"))
    with pytest.raises(KafkaAuthenticationError):
        ride_through.asked_again("asking", call, 30.0, "2pc-kafka")
    assert len(call.calls) == 1


def test_past_the_deadline_the_last_failure_is_raised() -> None:
    call = failing(1000, kafka_errors.KafkaConnectionError("111 ECONNREFUSED"))
    with pytest.raises(kafka_errors.KafkaConnectionError):
        ride_through.asked_again("asking", call, 0.0, "2pc-kafka")
    assert len(call.calls) == 1


def test_the_sinks_start_rides_through_a_dead_node(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = cluster_identity.ClusterFacts("cluster-1", 900_000)
    monkeypatch.setattr(
        sink, "cluster_facts", failing(1, kafka_errors.KafkaConnectionError("refused"), facts)
    )
    topic_check = failing(1, kafka_errors.KafkaConnectionError("refused"), None)
    ledger_check = failing(1, kafka_errors.NodeNotReadyError("node 2"), None)
    monkeypatch.setattr(sink, "check_topic_option", topic_check)
    monkeypatch.setattr(sink, "ensure_ledger_topic", ledger_check)
    monkeypatch.setattr(sink, "check_against_record", lambda options: None)
    source = sink.TwoPhaseKafkaDataSource(
        {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "out"}
    )
    schema = StructType([StructField("value", BinaryType())])
    writer = source.streamWriter(schema, overwrite=False)
    assert writer.options.cluster_id == "cluster-1"
    assert len(topic_check.calls) == 2 and len(ledger_check.calls) == 2
