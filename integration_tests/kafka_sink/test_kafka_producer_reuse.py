"""What a 2pc-kafka task saves on its producer, pinned against Apache Kafka
(``connectors/kafka/sink/producer_pool.py``, ``writer.py``):

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
from eospack.connectors.kafka.client import transactions
from eospack.connectors.kafka.client.transactions import PreparedTransaction, commit_prepared
from eospack.connectors.kafka.sink import producer_pool, writer
from eospack.lab.services.kafka_tools import create_topic
from integration_tests.kafka_sink_parts import (
    committed_keys,
    known_transactional_ids,
    sink_options,
)

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
BATCHES = 1000


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_the_broker_keeps_a_bounded_number_of_the_sinks_transactional_ids(
    real_kafka: Any, unique_name: str
) -> None:
    """Issue 37's goal: after many batches, at most 2x the task slots of the sink's ids
    (Flink pools them, FLINK-34554); a transactional id's state stays on the broker for
    ``transactional.id.expiration.ms`` (7 days) after its last use."""
    from eospack.commit_protocols import TwoPhaseCommitCoordinator
    from eospack.commit_protocols.pieces import sink_prefix
    from eospack.connectors.kafka.sink.resource import KafkaResource

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}-sink"
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    for batch_id in range(BATCHES):
        if batch_id % 100 == 0:
            print(f"batch {batch_id} of {BATCHES}", flush=True)
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

    ids = known_transactional_ids(real_kafka.endpoint.bootstrap_servers, sink_prefix(sink_id))
    assert len(ids) <= 2 * TASK_SLOTS, f"{len(ids)} transactional ids after {BATCHES} batches"


# Pooled transactional ids (producer_pool, issue 37) ------------------------------------


def open_under(kafka: Any, sink_id: str) -> list[str]:
    from eospack.commit_protocols.pieces import sink_prefix
    from eospack.connectors.kafka.client.transactions import open_transactions

    return open_transactions(
        {"bootstrap_servers": kafka.endpoint.bootstrap_servers}, sink_prefix(sink_id)
    )


def prepared_batch(options: Any, sink_id: str, run: str, batch_id: int, tasks: int) -> list[Any]:
    """``tasks`` tasks of one batch run one after the other in this process, as a Python
    worker runs the partitions Spark gives it."""
    return [
        writer.prepare_task(
            options,
            TaskIdentity(sink_id, batch_id, partition, f"0x{run}x{batch_id:04d}{partition:04d}"),
            keyed_rows(f"{run}-{batch_id}-{partition}-", 2),
        )
        for partition in range(tasks)
    ]


def expected_keys(run: str, batches: range, tasks: int) -> list[bytes]:
    return sorted(
        f"{run}-{batch}-{partition}-{index}".encode()
        for batch in batches
        for partition in range(tasks)
        for index in range(2)
    )


@pytest.mark.timeout(180)
def test_tasks_of_one_batch_in_one_worker_keep_their_own_ids_and_reuse_them_next_batch(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three partitions of a batch in one worker: three ids (a shared one would let the
    second task's InitProducerId abort the first task's prepared transaction); the next
    batch takes the same three ids and their kept producers (no new producer)."""
    from eospack.commit_protocols import TwoPhaseCommitCoordinator
    from eospack.connectors.kafka.sink.resource import KafkaResource

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    made: list[Any] = []
    real_producer = transactions.KafkaProducer

    def counted(**config: Any) -> Any:
        made.append(real_producer(**config))
        return made[-1]

    monkeypatch.setattr(transactions, "KafkaProducer", counted)
    producer_pool.close_kept()
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        first = prepared_batch(options, sink_id, "runa", 0, 3)
        coordinator.commit(first, 0)
        second = prepared_batch(options, sink_id, "runa", 1, 3)
        coordinator.commit(second, 1)
    finally:
        coordinator.resource.close()
        producer_pool.close_kept()
    first_ids = [piece.handle["transactional_id"] for piece in first]
    assert len(set(first_ids)) == 3
    assert [piece.handle["transactional_id"] for piece in second] == first_ids
    assert len(made) == 3, "the second batch made new producers instead of reusing them"
    assert committed_keys(real_kafka, unique_name) == expected_keys("runa", range(2), 3)
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(180)
def test_a_pooled_leftover_no_decision_names_is_rolled_back_at_the_commit(
    real_kafka: Any, unique_name: str
) -> None:
    """A task whose commit message never reached the driver (it failed after preparing, or
    a zombie) leaves an open transaction under a pooled id, which holds every
    read_committed reader back: the batch's commit rolls it back, and the next batch's task
    on that id (its kept producer fenced meanwhile) writes again."""
    from eospack.commit_protocols import TwoPhaseCommitCoordinator
    from eospack.connectors.kafka.sink.resource import KafkaResource

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    producer_pool.close_kept()
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        named, _never_named = prepared_batch(options, sink_id, "runb", 0, 2)
        assert len(open_under(real_kafka, sink_id)) == 2
        coordinator.commit([named], 0)
        assert open_under(real_kafka, sink_id) == []
        coordinator.commit(prepared_batch(options, sink_id, "runb", 1, 2), 1)
    finally:
        coordinator.resource.close()
        producer_pool.close_kept()
    assert committed_keys(real_kafka, unique_name) == sorted(
        [b"runb-0-0-0", b"runb-0-0-1", *expected_keys("runb", range(1, 2), 2)]
    )
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(180)
def test_a_replay_in_a_new_run_of_the_same_worker_never_aborts_the_crashed_runs_decision(
    real_kafka: Any, unique_name: str
) -> None:
    """Run A decided batch 5 and crashed before committing it; the query restarts in the
    same Spark application, so the same Python worker replays batch 5. Its ids are of run
    B: had they been run A's, their InitProducerId would have aborted the decided
    transactions (data lost). The replay's commit finds A's decision and applies exactly
    A's rows."""
    from eospack.commit_protocols import TwoPhaseCommitCoordinator
    from eospack.commit_protocols.pieces import BatchDecision
    from eospack.connectors.kafka.sink.resource import KafkaResource

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    producer_pool.close_kept()
    crashed = KafkaResource(options)
    try:
        pieces = prepared_batch(options, sink_id, "runc", 5, 2)
        crashed.record_decision(BatchDecision(sink_id, 5, tuple(pieces)))
    finally:
        crashed.close()
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        replay = prepared_batch(options, sink_id, "rund", 5, 2)
        assert coordinator.commit(replay, 5) is None
    finally:
        coordinator.resource.close()
        producer_pool.close_kept()
    assert committed_keys(real_kafka, unique_name) == expected_keys("runc", range(5, 6), 2)
    assert open_under(real_kafka, sink_id) == []
