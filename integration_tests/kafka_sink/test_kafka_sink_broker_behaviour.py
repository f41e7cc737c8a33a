"""2pc-kafka under ordinary broker behaviour and ordinary options, against Apache Kafka.

Each test pins one hole an adversarial review found (issue 25), at the level of the
sink's own parts (ledger, task writer, coordinator, planner) without a Spark query, so
each runs in seconds; the sink contract suite (test_sink_contract.py) runs the same
situations through real queries:

- another sink's (or a dead driver's) open transaction on the shared ledger topic holds
  the last stable offset back: a reopened ledger must still see every decision before it;
- a record the broker refuses fails the task (and aborts its transaction), in both modes;
- the sink's identity does not depend on how the cluster is addressed;
- producer-only ``kafka.*`` options never reach the ledger's consumer;
- a task transaction the broker aborted before the decision fails the batch undecided.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from kafka import KafkaAdminClient

from eospack.commit_protocols import TaskIdentity, TwoPhaseCommitCoordinator
from eospack.commit_protocols.pieces import DONE, BatchDecision
from eospack.commit_protocols.stream_writer import recover_at_least_once
from eospack.connectors.kafka.client.transactions import open_transactions
from eospack.connectors.kafka.errors import KafkaSendError, PreparedTransactionLostError
from eospack.connectors.kafka.sink.data_source import TwoPhaseKafkaDataSource
from eospack.connectors.kafka.sink.ledger import LEDGER_TRANSACTION_TIMEOUT_MS, Ledger
from eospack.connectors.kafka.sink.resource import KafkaResource
from eospack.connectors.kafka.sink.writer import prepare_task, write_directly
from eospack.lab.services.kafka_tools import create_topic, transactional_producer
from eospack.lab.testing import wait_until
from integration_tests.kafka_sink_parts import committed_keys, sink_options

pytestmark = pytest.mark.integration


def rows(count: int, big_row: int | None = None) -> Iterator[pa.RecordBatch]:
    """``count`` rows keyed ``0..count-1``; row ``big_row`` carries a 20 kB value."""
    values = [b"x" * 20_000 if index == big_row else f"v{index}".encode() for index in range(count)]
    keys = [str(index).encode() for index in range(count)]
    yield pa.RecordBatch.from_pydict(
        {"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary())}
    )


@pytest.mark.timeout(120)
def test_a_reopened_ledger_sees_decisions_behind_another_sinks_open_ledger_transaction(
    real_kafka: Any, unique_name: str
) -> None:
    """A driver of another sink died inside a ledger write: its transaction stays open and
    the ledger's last stable offset stops there. A decision written after it must still
    be found by a restart (else the replayed batch is committed twice)."""
    options = sink_options(real_kafka, unique_name)
    ledger = Ledger(options, "victim")
    ledger.mark_done(BatchDecision("victim", 0, ()))
    crashed = transactional_producer(
        real_kafka.endpoint.bootstrap_servers, "eospack-ledger-crashed", retry_backoff_ms=10
    )
    crashed.begin_transaction()
    crashed.send(options.ledger_topic, key=b"crashed/7", value=b'{"status":"decided"}').get(30)
    ledger.write(BatchDecision("victim", 1, ()))
    ledger.close()

    reopened = Ledger(options, "victim")
    reopened.close()
    crashed.close(timeout=0)

    assert {batch: slot.status for batch, slot in reopened.slots.items()} == {
        0: DONE,
        1: "decided",
    }


@pytest.mark.timeout(60)
def test_ledger_transactions_time_out_soon_so_a_dead_driver_holds_the_ledger_briefly(
    real_kafka: Any, unique_name: str
) -> None:
    options = sink_options(real_kafka, unique_name)
    ledger = Ledger(options, "brief")
    ledger.write(BatchDecision("brief", 0, ()))
    ledger.close()
    admin = KafkaAdminClient(bootstrap_servers=real_kafka.endpoint.bootstrap_servers)
    try:
        described = admin.describe_transactions(["eospack-ledger-brief"])
    finally:
        admin.close()
    timeout = described["eospack-ledger-brief"].transaction_timeout_ms
    assert timeout == LEDGER_TRANSACTION_TIMEOUT_MS < 60_000


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_record_the_broker_refuses_fails_the_task_and_nothing_of_it_is_committed(
    real_kafka: Any, unique_name: str, exactly_once: bool
) -> None:
    """The topic takes records up to 10 kB; one row of 20 is larger. The task must fail
    with the broker's error in one line, and its transaction must not be left open for a
    commit (exactly-once: nothing of the task visible)."""
    create_topic(
        real_kafka.endpoint.bootstrap_servers, unique_name, 1, {"max.message.bytes": "10000"}
    )
    guarantee = "exactly-once" if exactly_once else "at-least-once"
    options = sink_options(real_kafka, unique_name, deliveryGuarantee=guarantee)
    task = TaskIdentity("refused", 0, 0, "0xrunx00000000")

    with pytest.raises(KafkaSendError) as raised:
        if exactly_once:
            prepare_task(options, task, rows(20, big_row=7))
        else:
            write_directly(options, rows(20, big_row=7))

    message = str(raised.value)
    assert "\n" not in message
    assert f"topic {unique_name}" in message and "TooLarge" in message
    assert "max.message.bytes" in message
    config = {"bootstrap_servers": real_kafka.endpoint.bootstrap_servers}
    assert open_transactions(config, "eospack-refused") == []
    if exactly_once:
        assert committed_keys(real_kafka, unique_name) == []


@pytest.mark.timeout(120)
def test_the_sink_id_does_not_depend_on_how_the_cluster_is_addressed(
    real_kafka: Any, unique_name: str
) -> None:
    """The same cluster given as 127.0.0.1 or localhost, with spaces, a trailing comma or
    a second address: one target, so one sink id for one query."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    port = real_kafka.endpoint.bootstrap_servers.rsplit(":", 1)[1]
    schema = StructType([StructField("value", BinaryType())])
    forms = [
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f" 127.0.0.1:{port} , ",
        f"localhost:{port},127.0.0.1:{port}",
    ]
    targets = set()
    for bootstrap in forms:
        source = TwoPhaseKafkaDataSource(
            {"kafka.bootstrap.servers": bootstrap, "topic": unique_name}
        )
        targets.add(source.streamWriter(schema, False).target)
    assert len(targets) == 1, targets
    assert "127.0.0.1" not in next(iter(targets)) and "localhost" not in next(iter(targets))


@pytest.mark.timeout(120)
def test_producer_only_options_do_not_reach_the_ledger_consumer(
    real_kafka: Any, unique_name: str
) -> None:
    """kafka.compression.type and kafka.linger.ms are producer settings that KafkaConsumer
    refuses: the ledger reads with a consumer of its own settings only."""
    options = sink_options(
        real_kafka, unique_name, **{"kafka.compression.type": "gzip", "kafka.linger.ms": "5"}
    )
    resource = KafkaResource(options)
    decided = resource.record_decision(BatchDecision("producer_options", 0, ()))
    resource.mark_done(decided)
    reopened = Ledger(options, "producer_options")
    reopened.close()
    assert {batch: slot.status for batch, slot in reopened.slots.items()} == {0: DONE}


@pytest.mark.timeout(180)
def test_a_task_transaction_the_broker_aborted_before_the_decision_fails_the_batch_undecided(
    real_kafka: Any, unique_name: str
) -> None:
    """The batch took longer than kafka.transaction.timeout.ms: the broker aborted a
    task's transaction before the driver decided. Deciding would make the batch half
    visible and fail every restart; the commit must refuse before deciding, and Spark's
    abort then fences the slot, so the replay writes the batch again."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    options = sink_options(real_kafka, unique_name, **{"kafka.transaction.timeout.ms": "1000"})
    task = TaskIdentity("slow", 0, 0, "0xrunx00000000")
    piece = prepare_task(options, task, rows(5))
    config = {"bootstrap_servers": real_kafka.endpoint.bootstrap_servers}
    wait_until(
        lambda: open_transactions(config, "eospack-slow") == [],
        60,
        "the broker to abort the timed-out transaction",
        poll=0.5,
    )
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")

    with pytest.raises(PreparedTransactionLostError, match="kafka.transaction.timeout.ms"):
        coordinator.commit([piece], 0)
    coordinator.abort([piece], 0)

    ledger = Ledger(options, "slow")
    ledger.close()
    assert ledger.slots[0].status == "aborted"
    assert committed_keys(real_kafka, unique_name) == []


@pytest.mark.timeout(60)
def test_at_least_once_recovery_of_a_sink_without_a_ledger_creates_none(
    real_kafka: Any, unique_name: str
) -> None:
    """A sink that only ever ran at-least-once has no decisions: its once-per-run recovery
    must not create the ledger topic (nor need a ledger's transactional ACL)."""
    options = sink_options(real_kafka, unique_name, deliveryGuarantee="at-least-once")
    recover_at_least_once(KafkaResource(options), "2pc-kafka", "alo_only", 3)
    admin = KafkaAdminClient(bootstrap_servers=real_kafka.endpoint.bootstrap_servers)
    try:
        assert options.ledger_topic not in admin.list_topics()
    finally:
        admin.close()
