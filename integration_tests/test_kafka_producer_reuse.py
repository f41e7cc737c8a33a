"""What a 2pc-kafka task saves on its producer, pinned against Apache Kafka
(``connectors/kafka/producer_pool.py``, ``writer.py``):

- at-least-once tasks of one Python worker share one kept producer (no new bootstrap or
  first metadata lookup per task), and a task that failed closes and drops it, so its
  unsent records never ride along with the next task's flush;
- an exactly-once task initialises its transactional producer while it reads its first
  input batch, and still writes exactly its rows in its own transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from eospack.commit_protocols import TaskIdentity
from eospack.connectors.kafka import producer_pool, writer
from eospack.connectors.kafka.transactions import PreparedTransaction, commit_prepared
from eospack.services.kafka_tools import create_topic
from integration_tests.kafka_sink_parts import committed_keys, sink_options

pytestmark = pytest.mark.integration


def keyed_rows(prefix: str, count: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict(
        {
            "key": pa.array([f"{prefix}{index}".encode() for index in range(count)]),
            "value": pa.array([b"v"] * count),
        }
    )


def failing_rows(prefix: str, count: int) -> Iterator[pa.RecordBatch]:
    yield from keyed_rows(prefix, count)
    raise RuntimeError("the task's input failed")


@pytest.mark.timeout(120)
def test_at_least_once_tasks_share_a_kept_producer_and_a_failed_task_drops_it(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name, deliveryGuarantee="at-least-once")
    producer_pool.close_kept()
    made: list[Any] = []
    real_producer = writer.KafkaProducer

    def counted(**config: Any) -> Any:
        made.append(real_producer(**config))
        return made[-1]

    monkeypatch.setattr(writer, "KafkaProducer", counted)
    try:
        assert writer.write_directly(options, keyed_rows("a", 5)) == 5
        assert writer.write_directly(options, keyed_rows("b", 5)) == 5
        assert len(made) == 1
        assert producer_pool.kept_count() == 1

        with pytest.raises(RuntimeError, match="input failed"):
            writer.write_directly(options, failing_rows("c", 5))
        assert producer_pool.kept_count() == 0
        assert made[0]._closed

        assert writer.write_directly(options, keyed_rows("d", 5)) == 5
        assert len(made) == 2
    finally:
        producer_pool.close_kept()
    keys = committed_keys(real_kafka, unique_name)
    assert [key for key in keys if not key.startswith(b"c")] == sorted(
        f"{prefix}{index}".encode() for prefix in "abd" for index in range(5)
    )


@pytest.mark.timeout(120)
def test_an_exactly_once_task_opens_its_transaction_while_reading_its_first_batch(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    reading = threading.Event()
    real_begin = writer.begin

    def begin_once_reading(config: Any, transactional_id: str) -> Any:
        assert reading.wait(20), "the producer was opened before the input was read"
        return real_begin(config, transactional_id)

    def rows() -> Iterator[pa.RecordBatch]:
        reading.set()
        yield from keyed_rows("e", 7)

    monkeypatch.setattr(writer, "begin", begin_once_reading)
    task = TaskIdentity(f"{unique_name}-sink", 0, 0, "0xrunax0a0a0a0a")
    piece = writer.prepare_task(options, task, rows())

    assert piece.rows == 7
    assert committed_keys(real_kafka, unique_name) == []
    commit_prepared(options.client_config(), PreparedTransaction.from_json(piece.handle))
    assert committed_keys(real_kafka, unique_name) == sorted(
        f"e{index}".encode() for index in range(7)
    )


@pytest.mark.timeout(120)
def test_an_exactly_once_task_whose_input_fails_closes_the_producer_it_opened(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    opened: list[Any] = []
    real_begin = writer.begin

    def remembered(config: Any, transactional_id: str) -> Any:
        opened.append(real_begin(config, transactional_id))
        return opened[-1]

    def broken() -> Iterator[pa.RecordBatch]:
        raise RuntimeError("no first batch")
        yield  # pragma: no cover - a generator

    monkeypatch.setattr(writer, "begin", remembered)
    task = TaskIdentity(f"{unique_name}-sink", 0, 0, "0xrunax0b0b0b0b")
    with pytest.raises(RuntimeError, match="no first batch"):
        writer.prepare_task(options, task, broken())
    assert len(opened) == 1 and opened[0]._closed


TASK_SLOTS = 2
BATCHES = 30


@pytest.mark.xfail(
    strict=True,
    reason="transactional ids are per task attempt until they are pooled (issue 37; design"
    " in connectors/kafka/producer_pool.py): the broker keeps one per task of every batch",
)
@pytest.mark.timeout(300)
def test_the_broker_keeps_a_bounded_number_of_the_sinks_transactional_ids(
    real_kafka: Any, unique_name: str
) -> None:
    """Issue 37's goal: after many batches, at most 2x the task slots of the sink's ids
    (Flink pools them, FLINK-34554); a transactional id's state stays on the broker for
    ``transactional.id.expiration.ms`` (7 days) after its last use."""
    from kafka import KafkaAdminClient

    from eospack.commit_protocols import TwoPhaseCommitCoordinator
    from eospack.commit_protocols.pieces import sink_prefix
    from eospack.connectors.kafka.resource import KafkaResource

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}-sink"
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    for batch_id in range(BATCHES):
        pieces = [
            writer.prepare_task(
                options,
                TaskIdentity(sink_id, batch_id, slot, f"0xrunax{batch_id:04d}{slot:04d}"),
                keyed_rows(f"{batch_id}-{slot}-", 3),
            )
            for slot in range(TASK_SLOTS)
        ]
        coordinator.commit(pieces, batch_id)
    coordinator.resource.close()
    assert len(committed_keys(real_kafka, unique_name)) == BATCHES * TASK_SLOTS * 3

    admin = KafkaAdminClient(bootstrap_servers=real_kafka.endpoint.bootstrap_servers)
    try:
        listed = admin.list_transactions()
    finally:
        admin.close()
    ids = {
        listing.transactional_id
        for listings in listed.values()
        for listing in listings
        if listing.transactional_id.startswith(sink_prefix(sink_id))
    }
    assert len(ids) <= 2 * TASK_SLOTS, f"{len(ids)} transactional ids after {BATCHES} batches"
