"""2pc-kafka's contract cases on Kafka as production runs it (``make test-kafka-production``).

The adapters ``kafka-cluster`` (3 KRaft nodes, RF 3, min ISR 2; the output topic's
partitions led by nodes 2 and 3, none by the first bootstrap address) and ``kafka-secured``
(SASL_SSL, user ``app`` with only the documented grant: topics ``app.*``, the ledger topic
among them, TransactionalIds ``eospack-*``) reuse the 2pc-kafka adapter with another fixture
(``sink_contract/adapters.py``, ``PRODUCTION_ADAPTERS``); this module alone collects them,
under the ``production_kafka`` marker, so ``make test`` never starts these brokers.

Where the harness has a crash point, the cluster loses a node there too:

- a driver SIGKILLed at ``between_piece_commits`` (after a task retry) restarts while the
  node coordinating the ledger's transactions is down;
- mid-query, the node leading the output topic's partition 0 is SIGKILLed while a task
  has its piece in flight (``kafka_sink.prepare`` held back); in another query the node
  coordinating the ledger's transactions while the driver is about to write a decision
  (``kafka_sink.decide`` held back). The held call goes on with the node down, and the
  node is restarted while its query runs.

Each case ends with the contract's end state (``ContractRun.assert_each_row_once``): each
row exactly once for read_committed readers, no transaction Ongoing under the sink's
prefix or its ledger's id, every decision done, the sink's own inspection agreeing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eospack.core import faults
from eospack.lab.testing import await_query, wait_until
from integration_tests.production_kafka_parts import (
    LEADER_CHANGE_SECONDS,
    ongoing_transactions,
)
from integration_tests.sink_contract.adapters import (
    PRODUCTION_ADAPTERS,
    BoundSink,
    KafkaClusterSink,
    sink_params,
)
from integration_tests.sink_contract.harness import QUERY_TIMEOUT, ContractRun

pytestmark = [pytest.mark.production_kafka, pytest.mark.integration]

NODE_DOWN_HELD_SECONDS = 6.0
"""A hold the kill and the successor's election (a few seconds on the test cluster) fit
in, the node's restart (about 10 s) does not: the held call resumes with the node down."""


@pytest.fixture
def sink(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> Iterator[BoundSink]:
    bound = PRODUCTION_ADAPTERS[request.param].open(request, tmp_path, unique_name)
    yield bound
    bound.close()


def contract(case: str, *names: str) -> Any:
    """Parametrize ``sink`` over the production adapters ``names`` (all by default)."""
    adapters = {
        name: adapter for name, adapter in PRODUCTION_ADAPTERS.items() if not names or name in names
    }
    return pytest.mark.parametrize("sink", sink_params(case, adapters), indirect=True)


def fired(fault_directory: Path) -> list[tuple[object, object, object]]:
    return [(f["call"], f["mode"], f["seen_batch"]) for f in faults.injected(fault_directory)]


def ledger_coordinator(sink: KafkaClusterSink, run: ContractRun) -> int:
    """The node coordinating the transactions of the ledger of the run's (one) sink id."""
    (sink_id,) = run.sink_ids
    return int(sink.kafka.transaction_coordinator(sink.ledger_transactional_id(sink_id)))


def assert_no_transaction_ongoing(sink: BoundSink, run: ContractRun) -> None:
    """Read from the cluster as its super user: nothing Ongoing under ``eospack-`` that
    names one of the run's sink ids (pieces and the ledger)."""
    ongoing = ongoing_transactions(
        sink.bootstrap,  # type: ignore[attr-defined]
        ["eospack-"],
        sink.client(),  # type: ignore[attr-defined]
    )
    assert [t for t in ongoing if any(sink_id in t for sink_id in run.sink_ids)] == []


# SIGKILLs ------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@contract("test_killed_at_a_crash_point_after_a_task_retry_then_restarted_writes_each_row_once")
def test_killed_at_a_crash_point_after_a_task_retry_then_restarted_writes_each_row_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """The default lane's SIGKILL case: under ``local[2,3]`` batch 0's task dies right
    after it prepared and is retried; batch 1's driver is SIGKILLed between piece commits.
    On the cluster the restart runs with the ledger's transaction coordinator down (its
    node SIGKILLed after the driver's), and must still finish or fence both batches."""
    run = ContractRun(sink)
    run.add_batches(3)
    prepare = sink.adapter.calls.prepare
    assert prepare is not None
    faults.arm(call_faults, prepare, "crash", batch_id=0)
    point = sink.adapter.default_crash_point

    killed = run.run_driver(f"{point}@1", master="local[2,3]", fault_directory=call_faults)

    assert killed.was_killed, f"{point} was not reached:\n{killed.explain()}"
    assert fired(call_faults) == [(prepare, "crash", 0)], killed.explain()
    run.assert_nothing_doubled()
    if isinstance(sink, KafkaClusterSink):
        coordinator = ledger_coordinator(sink, run)
        sink.kafka.kill(coordinator)
        try:
            run.run_here()
        finally:
            sink.kafka.start(coordinator)
    else:
        run.run_here()
    run.assert_each_row_once()
    assert_no_transaction_ongoing(sink, run)


def run_with_a_node_killed_at(
    sink: KafkaClusterSink,
    call_faults: Path,
    call: str,
    held_seconds: float,
    serving: Callable[[ContractRun], int],
) -> ContractRun:
    """One query of three batches, never restarted: batch 1's ``call`` is held back
    ``held_seconds``; meanwhile the node ``serving(run)`` names is SIGKILLed, its
    successor awaited, and the node restarted. The query must finish by itself; returns
    the run for the end-state check."""
    cluster = sink.kafka
    run = ContractRun(sink)
    run.add_batches(3)
    faults.arm(call_faults, call, "slow", 1, held_seconds)
    killed: int | None = None
    query = run.start_here()
    try:
        wait_until(
            lambda: (call, "slow", 1) in fired(call_faults) or not query.isActive,
            180,
            f"batch 1's {call} held back",
        )
        assert query.isActive, query.exception()
        run.remember_sink_id()
        killed = serving(run)
        cluster.kill(killed)
        wait_until(
            lambda: serving(run) not in (killed, -1),
            LEADER_CHANGE_SECONDS,
            f"node {killed}'s successor",
        )
        cluster.start(killed)
        killed = None
        await_query(query, QUERY_TIMEOUT)
    finally:
        if query.isActive:
            query.stop()
        if killed is not None:
            cluster.start(killed)
    run.remember_sink_id()
    assert fired(call_faults) == [(call, "slow", 1)]
    return run


@pytest.mark.production_kafka_smoke
@pytest.mark.timeout(300)
@contract(
    "test_the_output_leader_killed_while_a_piece_is_in_flight_then_each_row_once", "kafka-cluster"
)
def test_the_output_leader_killed_while_a_piece_is_in_flight_then_each_row_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """A task of batch 1 has sent its rows into its open transaction and is held before it
    flushes and reports its piece (``kafka_sink.prepare``) when the node leading output
    partition 0 dies; the task's producer resumes with the node down and must send and
    flush to the new leader, and the driver's decision and piece commits meet the node
    down or rejoining (it is restarted while the query goes on)."""
    assert isinstance(sink, KafkaClusterSink)
    prepare = sink.adapter.calls.prepare
    assert prepare is not None
    run = run_with_a_node_killed_at(
        sink,
        call_faults,
        prepare,
        NODE_DOWN_HELD_SECONDS,
        lambda _: int(sink.kafka.leader(sink.topic, 0)),
    )
    run.assert_each_row_once()
    assert_no_transaction_ongoing(sink, run)


@pytest.mark.timeout(300)
@contract(
    "test_the_ledger_coordinator_killed_while_a_decision_is_written_then_each_row_once",
    "kafka-cluster",
)
def test_the_ledger_coordinator_killed_while_a_decision_is_written_then_each_row_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """The driver holds batch 1's decision write (``kafka_sink.decide``) when the node
    coordinating the ledger's transactions dies: the ledger must find the new coordinator
    and write the decision within its timeouts (failed the query before dba2448: the
    write's error path closed the ledger's producer with ``timeout=0``, whose flush raised
    KafkaTimeoutError "Timeout waiting for future")."""
    assert isinstance(sink, KafkaClusterSink)
    run = run_with_a_node_killed_at(
        sink,
        call_faults,
        sink.adapter.calls.decide,
        NODE_DOWN_HELD_SECONDS,
        lambda run: ledger_coordinator(sink, run),
    )
    run.assert_each_row_once()
    assert_no_transaction_ongoing(sink, run)


# Call faults ---------------------------------------------------------------------------


@pytest.mark.timeout(600)
@contract("test_a_decision_write_failing_or_losing_its_answer_and_a_lost_commit_answer_each_once")
def test_a_decision_write_failing_or_losing_its_answer_and_a_lost_commit_answer_each_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """As the default lane's case: batch 0's decision write fails before it applies,
    batch 1's applies and its answer is lost, batch 2's first piece commit applies and its
    answer is lost; each run fails, the restarts write each row once."""
    calls = sink.adapter.calls
    assert calls.commit_piece is not None
    plan = [(calls.decide, "before"), (calls.decide, "after"), (calls.commit_piece, "after")]
    run = ContractRun(sink)
    for batch, (call, mode) in enumerate(plan):
        run.add_batches(1)
        faults.arm(call_faults, call, mode, batch_id=batch)  # type: ignore[arg-type]
        run.run_through_fault()
        assert (call, mode, batch) in fired(call_faults)
        run.assert_nothing_doubled()
    run.add_batches(1)
    run.run_here()
    run.assert_each_row_once()
    assert_no_transaction_ongoing(sink, run)


@pytest.mark.timeout(300)
@contract("test_every_documented_option_at_once_through_a_real_query", "kafka-secured")
def test_every_documented_option_at_once_through_a_real_query(sink: BoundSink) -> None:
    """With only the documented grant, every documented option (ledgerTopic inside
    ``app.*``) in one query of two batches."""
    values: dict[str, str] = {}
    for option in sink.adapter.documented_options:
        values.update(option.extra)
        values[option.name] = option.sample(sink) if callable(option.sample) else option.sample
    values["sinkId"] = f"documented_{sink.name[-8:]}"
    run = ContractRun(sink, values)
    run.add_batches(2)
    run.run_here()
    run.assert_each_row_once()
    assert_no_transaction_ongoing(sink, run)
