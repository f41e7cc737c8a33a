"""Which transactional id a 2pc-kafka task takes from its worker's pool
(``connectors/kafka/sink/producer_pool.py``): pure logic, no broker. What a broker does with the
ids (reuse, leftovers rolled back, a replay in a new run) is pinned by
``integration_tests/kafka_sink/test_kafka_producer_reuse.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from eospack.commit_protocols import TaskIdentity, parse_transaction_id
from eospack.connectors.kafka.sink import producer_pool


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    producer_pool._BATCHES.clear()
    yield
    producer_pool._BATCHES.clear()


def task(
    batch: int, partition: int, attempt: str = "0xrunax1234abcd", sink: str = "s1"
) -> TaskIdentity:
    return TaskIdentity(sink, batch, partition, attempt)


def test_tasks_of_one_batch_take_distinct_indices_and_the_next_batch_starts_over() -> None:
    first = [producer_pool.pooled_transactional_id(task(3, partition)) for partition in range(3)]
    assert [producer_pool.pooled_index(name) for name in first] == [0, 1, 2]
    again = [producer_pool.pooled_transactional_id(task(4, partition)) for partition in (5, 6)]
    assert again == first[:2]


def test_a_failed_tasks_index_is_taken_by_the_next_task_of_its_batch() -> None:
    first = producer_pool.pooled_transactional_id(task(3, 0))
    failed = producer_pool.pooled_transactional_id(task(3, 1))
    producer_pool.release_transactional_id(task(3, 1), failed)
    assert producer_pool.pooled_transactional_id(task(3, 1, "1xrunax99999999")) == failed
    assert producer_pool.pooled_transactional_id(task(3, 2)) not in (first, failed)


def test_another_run_or_sink_never_shares_an_id() -> None:
    ours = producer_pool.pooled_transactional_id(task(3, 0))
    other_run = producer_pool.pooled_transactional_id(task(3, 0, "0xrunbx1234abcd"))
    other_sink = producer_pool.pooled_transactional_id(task(3, 0, sink="s2"))
    assert len({ours, other_run, other_sink}) == 3
    assert producer_pool.is_pooled(ours, "s1") and not producer_pool.is_pooled(other_sink, "s1")


def test_another_process_never_shares_an_id(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = producer_pool.pooled_transactional_id(task(3, 0))
    monkeypatch.setattr(producer_pool.os, "getpid", lambda: -1)
    producer_pool._BATCHES.clear()
    assert producer_pool.pooled_transactional_id(task(3, 0)) != ours


def test_without_a_run_or_for_an_older_batch_a_task_gets_an_id_of_its_own() -> None:
    no_run = task(3, 0, "0xnorunx1234abcd")
    assert producer_pool.pooled_transactional_id(no_run) == no_run.piece(0).transaction_id
    producer_pool.pooled_transactional_id(task(5, 0))
    older = task(4, 0)
    assert producer_pool.pooled_transactional_id(older) == older.piece(0).transaction_id


def test_a_pooled_id_is_never_read_as_a_piece_name() -> None:
    name = producer_pool.pooled_transactional_id(task(3, 0))
    assert name.startswith("eospack-s1-pool_")
    assert parse_transaction_id(name) is None
    assert producer_pool.pooled_index(task(3, 0).piece(0).transaction_id) is None


def test_many_sinks_in_one_worker_never_reset_a_batch_in_progress() -> None:
    first = producer_pool.pooled_transactional_id(task(3, 0))
    for number in range(20):
        producer_pool.pooled_transactional_id(task(7, 0, sink=f"other{number}"))
    assert producer_pool.pooled_transactional_id(task(3, 1)) != first
