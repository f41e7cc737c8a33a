"""Pure-logic attacks on 2pc-kafka's pooled transactional ids
(``connectors/kafka/producer_pool.py``); what a broker does with them is attacked in
``integration_tests/test_kafka_pooled_ids_attacks.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from eospack.commit_protocols import TaskIdentity, sink_prefix, transaction_id
from eospack.connectors.kafka import producer_pool
from eospack.connectors.kafka.ledger import LEDGER_ID_PREFIX


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
    assert received.startswith(f"{sink_prefix('s1')}{producer_pool.POOL_MARKER}runa")
    assert received != parent
    assert received.rpartition("_")[0] != parent.rpartition("_")[0]


def test_no_piece_name_of_any_sink_passes_for_a_pooled_id() -> None:
    """Per-attempt names (before pooling, and the fallback for tasks without a run) whose
    attempt carries ``pool_`` in its run part are never taken for pooled ids."""
    for run in ("pool_", "xpool_1", "pool_abc"):
        name = transaction_id("s1", 3, 0, f"0x{run}x1234abcd")
        assert producer_pool.pooled_index(name) is None
        assert not producer_pool.is_pooled(name, "s1")


@pytest.mark.xfail(
    strict=True,
    reason="sinkId 'ledger': is_pooled takes the ledger transactional id of a sink named"
    " pool_... (eospack-ledger-pool_...) for one of its pooled ids, so its recovery fences it",
)
def test_a_ledgers_transactional_id_is_never_a_pooled_id_of_any_sink() -> None:
    for other_sink in ("pool_orders", "pool_abcdef012345abcdef012345_0"):
        ledger_id = f"{LEDGER_ID_PREFIX}{other_sink}"
        assert not producer_pool.is_pooled(ledger_id, "ledger"), ledger_id
