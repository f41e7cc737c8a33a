"""Pure-logic attacks on 2pc-kafka's pooled transactional ids
(``connectors/kafka/sink/producer_pool.py``); what a broker does with them is attacked in
``integration_tests/kafka_sink/test_kafka_pooled_transactional_ids.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from eospack.commit_protocols import TaskIdentity, transaction_id
from eospack.connectors.kafka.sink import producer_pool
from eospack.connectors.kafka.sink.ledger import LEDGER_ID_PREFIX


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    producer_pool._BATCHES.clear()
    yield
    producer_pool._BATCHES.clear()


def test_a_forked_worker_never_shares_its_parents_pooled_ids() -> None:
    """Spark's daemon forks its Python workers: a child that inherited the parent's token
    and batch indices must still take ids of its own (attempts running at once)."""
    identity = TaskIdentity("s1", 3, 0, "0xrunax1234abcd")
    parent = producer_pool.pooled_transactional_id(identity)
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        try:
            os.write(writing, producer_pool.pooled_transactional_id(identity).encode())
        finally:
            os._exit(0)
    os.close(writing)
    try:
        received = os.read(reading, 1000).decode()
    finally:
        os.close(reading)
        os.waitpid(child, 0)
    assert received.startswith(f"{producer_pool.pooled_prefix('s1', None)}runa")
    assert received != parent
    assert received.rpartition("_")[0] != parent.rpartition("_")[0]


def test_no_piece_name_of_any_sink_passes_for_a_pooled_id() -> None:
    """Per-attempt names (before pooling, and the fallback for tasks without a run) whose
    attempt carries ``pool_`` in its run part are never taken for pooled ids."""
    for run in ("pool_", "xpool_1", "pool_abc"):
        name = transaction_id("s1", 3, 0, f"0x{run}x1234abcd")
        assert producer_pool.pooled_index(name) is None
        assert not producer_pool.is_pooled(name, "s1")


def test_the_sink_id_ledger_is_refused_in_one_line() -> None:
    """sinkId ``ledger`` would own the prefix ``eospack-ledger-`` of every ledger's
    transactional id, and its recovery took the ledger of a sink named ``pool_...`` for one
    of its pooled leftovers and fenced it (found by this attack; refused since)."""
    from eospack.connectors.kafka.errors import KafkaSinkOptionError
    from eospack.connectors.kafka.sink.options import parse_options

    with pytest.raises(KafkaSinkOptionError) as refused:
        parse_options({"kafka.bootstrap.servers": "localhost:9092", "sinkid": "ledger"})
    message = str(refused.value)
    assert "\n" not in message and "sinkId" in message and "reserved" in message
    assert f"eospack-{'ledger'}-" == LEDGER_ID_PREFIX


def test_a_pooled_id_names_its_query() -> None:
    """Recovery rolls back only its own query's pooled leftovers: another query wrongly
    sharing the sinkId may be about to decide its own."""
    ours = producer_pool.pooled_transactional_id(
        TaskIdentity("s1", 3, 0, "0xrunax1234abcd", query_id="q1")
    )
    theirs = producer_pool.pooled_transactional_id(
        TaskIdentity("s1", 3, 0, "0xrunax1234abcd", query_id="q2")
    )
    assert ours != theirs
    assert producer_pool.is_pooled(ours, "s1", {"q1"}) and not producer_pool.is_pooled(
        theirs, "s1", {"q1"}
    )
    assert producer_pool.is_pooled(theirs, "s1")
