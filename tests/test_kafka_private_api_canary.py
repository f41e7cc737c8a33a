"""kafka-python's private parts that eospack relies on, by name: every use sits in
``connectors/kafka/client/`` (a kafka-python without a name breaks the client room only),
and each name is listed here, so that an upgraded kafka-python that renamed or dropped one
fails this test rather than a query in production.

Attributes an object sets in ``__init__`` are looked up in the names its constructors'
code assigns; methods and class attributes on the class itself.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.cluster import ClusterMetadata
from kafka.consumer.fetcher import Fetcher
from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport
from kafka.producer.record_accumulator import IncompleteProducerBatches, RecordAccumulator
from kafka.producer.sender import Sender
from kafka.producer.transaction_manager import TransactionManager, TransactionState
from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatch

KAFKA = Path(__file__).resolve().parent.parent / "connectors" / "kafka"

PRIVATE_NAMES: dict[type, tuple[str, ...]] = {
    # client/consumers.py
    KafkaConsumer: ("_client", "_fetcher"),
    MemoryRecords: ("_buffer",),
    # client/producers.py, client/transactions.py, client/producer_batches.py
    KafkaProducer: (
        "_transaction_manager",
        "_accumulator",
        "_sender",
        "_closed",
        "_init_transactions_result",
    ),
    TransactionManager: (
        "_lock",
        "_pending_requests",
        "_current_state",
        "_last_error",
        "_transaction_started",
        "_new_partitions_in_transaction",
        "_pending_partitions_in_transaction",
        "_partitions_in_transaction",
        "_pending_txn_offset_commits",
    ),
    RecordAccumulator: ("_tp_lock", "_batches", "_incomplete", "_flushes_in_progress"),
    IncompleteProducerBatches: ("_incomplete",),
    # client/transactions.py, client/cluster_configs.py
    KafkaAdminClient: ("_manager", "_net", "_find_coordinator_id", "_describe_configs_request"),
    ClusterMetadata: ("_coordinators",),
    # client/socket_reads.py, client/authentication.py
    KafkaTCPTransport: ("_sock_recv", "_sock"),
    KafkaSSLTransport: ("_sock_recv", "_build_ssl_context"),
    # client/strict_records.py (overridden or read by the strict reference decoder)
    DefaultRecordBatch: ("_maybe_uncompress", "_read_msg", "_buffer", "_pos"),
    Fetcher.PartitionRecords: ("_contains_abort_marker",),
}

PUBLIC_NAMES_OF_PRIVATE_PARTS: dict[type, tuple[str, ...]] = {
    TransactionManager: (
        "has_in_flight_transactional_request",
        "producer_id_and_epoch",
        "last_error",
        "has_error",
        "begin_commit",
        "begin_abort",
    ),
    RecordAccumulator: ("has_incomplete", "begin_flush"),
    IncompleteProducerBatches: ("all",),
    Sender: ("wakeup", "force_close"),
    ClusterMetadata: ("leader_for_partition",),
    Fetcher: ("PartitionRecords",),
}


def assigned_in_constructors(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        constructor = klass.__dict__.get("__init__")
        if constructor is not None and hasattr(constructor, "__code__"):
            names.update(constructor.__code__.co_names)
        names.update(getattr(klass, "__slots__", ()))
    return names


def has_name(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in assigned_in_constructors(cls)


@pytest.mark.parametrize(
    ("cls", "name"),
    [(cls, name) for cls, names in PRIVATE_NAMES.items() for name in names]
    + [(cls, name) for cls, names in PUBLIC_NAMES_OF_PRIVATE_PARTS.items() for name in names],
    ids=lambda value: value.__qualname__ if isinstance(value, type) else value,
)
def test_the_installed_kafka_python_still_has(cls: type, name: str) -> None:
    assert has_name(cls, name), f"kafka-python's {cls.__qualname__} has no {name}"


def test_begin_again_resets_a_transaction_manager_that_starts_uninitialised() -> None:
    """``transactions.begin_again`` sets the state back to ``UNINITIALIZED`` and reads the
    manager's fields: a new manager has them all, in that state."""
    manager = TransactionManager(transactional_id="canary")
    for name in PRIVATE_NAMES[TransactionManager]:
        assert hasattr(manager, name), name
    assert manager._current_state == TransactionState.UNINITIALIZED
    assert isinstance(RecordAccumulator.has_incomplete, property)


def private_attributes_used(path: Path) -> set[str]:
    """Underscore attributes read or assigned on anything but ``self`` in ``path``."""
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
        ):
            used.add(node.attr)
    return used


NOT_KAFKA_PYTHON = {
    "_import_from_c_capsule",  # pyarrow's, in records/record_batches.py
    "_token",  # token_provider.TokenProvider's own field
}


def test_every_private_name_outside_the_client_room_is_none_of_kafka_pythons() -> None:
    outside = {
        f"{path.relative_to(KAFKA)}: {name}"
        for path in sorted(KAFKA.rglob("*.py"))
        if "client" not in path.relative_to(KAFKA).parts
        for name in private_attributes_used(path)
        if name not in NOT_KAFKA_PYTHON
    }
    assert sorted(outside) == []


def test_every_private_name_the_client_room_uses_is_listed_here() -> None:
    listed = {name for names in PRIVATE_NAMES.values() for name in names} | NOT_KAFKA_PYTHON
    used: dict[str, Any] = {
        name: path.name
        for path in sorted((KAFKA / "client").glob("*.py"))
        for name in private_attributes_used(path)
    }
    assert sorted(set(used) - listed) == []
