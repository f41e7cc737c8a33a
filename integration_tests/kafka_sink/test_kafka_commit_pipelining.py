"""The driver's commit of a 2pc-kafka batch sends every piece's EndTxn at once over its one
admin client (``KafkaResource.commit_pieces``, ``transactions.commit_prepared_together``):
one round trip per batch instead of one per piece. Pinned against Apache Kafka: the pieces
are all in flight together, every one is committed, and a piece the broker aborted is still
reported loudly (``DecidedPieceLostError``) while its siblings are committed anyway."""

from __future__ import annotations

from typing import Any

import pytest

from eospack.commit_protocols import TaskIdentity, transaction_id
from eospack.commit_protocols.pieces import PreparedPiece
from eospack.commit_protocols.resource import DecidedPieceLostError
from eospack.connectors.kafka.client import transactions
from eospack.connectors.kafka.client.transactions import begin, fence, open_transactions, prepare
from eospack.connectors.kafka.sink.resource import KafkaResource, kafka_name
from eospack.lab.services.kafka_tools import create_topic
from integration_tests.kafka_sink_parts import committed_keys, sink_options

pytestmark = pytest.mark.integration

PIECES = 6


def prepared_pieces(options: Any, sink_id: str, batch_id: int, topic: str) -> list[PreparedPiece]:
    """``PIECES`` open transactions of one batch, each with two records, as tasks leave them."""
    pieces = []
    for partition in range(PIECES):
        task = TaskIdentity(sink_id, batch_id, partition, "0xrunax0a0a0a0a")
        producer = begin(
            options.producer_config(), transaction_id(sink_id, batch_id, partition, task.attempt)
        )
        for record in range(2):
            producer.send(topic, key=f"{partition}-{record}".encode(), value=b"v")
        pieces.append(task.piece(2, prepare(producer, 2).to_json()))
    return pieces


@pytest.mark.timeout(180)
def test_every_piece_is_committed_with_all_end_transactions_in_flight_together(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}-sink"
    pieces = prepared_pieces(options, sink_id, 0, unique_name)
    in_flight = 0
    most_in_flight = 0
    end_transaction = transactions._end_transaction

    async def counting(*arguments: Any) -> None:
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        try:
            await end_transaction(*arguments)
        finally:
            in_flight -= 1

    monkeypatch.setattr(transactions, "_end_transaction", counting)
    resource = KafkaResource(options)
    try:
        resource.commit_pieces(pieces)
        resource.commit_pieces(pieces)  # again: idempotent
    finally:
        resource.close()

    assert most_in_flight == PIECES
    assert committed_keys(real_kafka, unique_name) == sorted(
        f"{partition}-{record}".encode() for partition in range(PIECES) for record in range(2)
    )
    assert open_transactions(options.client_config(), sink_id) == []


@pytest.mark.timeout(180)
def test_a_lost_piece_is_reported_and_its_siblings_are_committed_anyway(
    real_kafka: Any, unique_name: str
) -> None:
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}-sink"
    pieces = prepared_pieces(options, sink_id, 3, unique_name)
    fence(options.client_config(), kafka_name(pieces[2]))
    resource = KafkaResource(options)
    try:
        with pytest.raises(DecidedPieceLostError, match=f"batch 3 of sink {sink_id}: .*lost"):
            resource.commit_pieces(pieces)
    finally:
        resource.close()

    assert committed_keys(real_kafka, unique_name) == sorted(
        f"{partition}-{record}".encode()
        for partition in range(PIECES)
        if partition != 2
        for record in range(2)
    )
    assert open_transactions(options.client_config(), sink_id) == []
