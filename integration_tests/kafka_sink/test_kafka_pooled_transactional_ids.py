"""An adversarial review of 2pc-kafka's pooled transactional ids (commit 36908c3 and after:
``connectors/kafka/sink/producer_pool.py``), against Apache Kafka, at the level of the sink's own
parts (``writer.prepare_task`` run in this process as a Python worker runs its tasks, the
driver's ``TwoPhaseCommitCoordinator`` over ``KafkaResource``): each case ends with every
row exactly once as a read_committed consumer sees it and nothing open under the sink's
prefix. Cases that held stay as regressions of paths no other test walks. The holes it
found are fixed: a query wrongly sharing the sinkId fenced the running query's prepared
batch (pooled ids now name their query and recovery fences only its own), and sinkId
``ledger`` fenced other sinks' ledgers (refused now; the unit twin of this file pins it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eospack.commit_protocols import TaskIdentity, TwoPhaseCommitCoordinator, transaction_id
from eospack.commit_protocols.pieces import DONE, BatchDecision, PreparedPiece, sink_prefix
from eospack.commit_protocols.stream_writer import recover_at_least_once
from eospack.connectors.kafka.client.transactions import (
    admin_client,
    begin,
    open_epochs,
    open_transactions,
    prepare,
)
from eospack.connectors.kafka.sink import producer_pool, writer
from eospack.connectors.kafka.sink.ledger import read_slots_if_any
from eospack.connectors.kafka.sink.resource import KafkaResource
from eospack.core import faults
from eospack.lab.services.kafka_tools import create_topic
from integration_tests.kafka_sink_parts import committed_keys, sink_options

pytestmark = pytest.mark.integration


def rows_of(prefix: str, count: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict(
        {
            "key": pa.array([f"{prefix}{index}".encode() for index in range(count)], pa.binary()),
            "value": pa.array([b"v"] * count, pa.binary()),
        }
    )


def failing_rows(prefix: str, count: int) -> Iterator[pa.RecordBatch]:
    yield from rows_of(prefix, count)
    raise RuntimeError("the task's input failed mid-task")


def keys(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{index}".encode() for index in range(count)]


def task(sink_id: str, run: str, batch_id: int, partition: int, attempt: int = 0) -> TaskIdentity:
    """A task of query run ``run`` (the attempt string's run part, as Spark's job group
    gives it) with an attempt string unique per (batch, partition, attempt)."""
    return TaskIdentity(
        sink_id, batch_id, partition, f"{attempt}x{run}x{batch_id:03d}{partition:02d}{attempt}"
    )


def committed_batches(
    coordinator: Any, options: Any, sink_id: str, run: str, batch_ids: range
) -> list[bytes]:
    """Batches of 2 tasks of run ``run`` prepared in this process and committed; their keys."""
    expected: list[bytes] = []
    for batch_id in batch_ids:
        pieces = [
            writer.prepare_task(
                options,
                task(sink_id, run, batch_id, partition),
                rows_of(f"b{batch_id}p{partition}-", 2),
            )
            for partition in range(2)
        ]
        coordinator.commit(pieces, batch_id)
        expected += keys(f"b{batch_id}p0-", 2) + keys(f"b{batch_id}p1-", 2)
    return expected


def open_under(kafka: Any, sink_id: str) -> list[str]:
    return open_transactions(
        {"bootstrap_servers": kafka.endpoint.bootstrap_servers}, sink_prefix(sink_id)
    )


def epochs_of(kafka: Any, names: list[str]) -> dict[str, tuple[int, int]]:
    admin = admin_client({"bootstrap_servers": kafka.endpoint.bootstrap_servers})
    try:
        return open_epochs(admin, names)
    finally:
        admin.close()


@pytest.fixture(autouse=True)
def fresh_pool() -> Iterator[None]:
    """This process plays one Python worker: no producer kept from another test."""
    producer_pool.close_kept()
    yield
    producer_pool.close_kept()


@pytest.mark.timeout(240)
def test_more_tasks_of_a_batch_than_kept_producers_with_one_failing_mid_batch(
    real_kafka: Any, unique_name: str
) -> None:
    """Six partitions in one worker per batch (more than MAX_KEPT_TRANSACTIONAL: the first
    tasks' producers are closed while their transactions wait for the driver), the third
    task's input fails after it sent rows (its index is given back and retaken by its retry
    in the same worker), and a fourth attempt's Python side prepares but its message never
    reaches the driver (Spark failed the task afterwards; the retry takes a new index).
    Two batches: each named row once, nothing open."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 3)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    expected: list[bytes] = []
    try:
        for batch_id in range(2):
            pieces: list[PreparedPiece] = []
            for partition in range(6):
                prefix = f"b{batch_id}p{partition}-"
                if partition == 2:
                    with pytest.raises(RuntimeError, match="mid-task"):
                        writer.prepare_task(
                            options,
                            task(sink_id, "runaaaa", batch_id, partition, 0),
                            failing_rows(f"failed-{prefix}", 4),
                        )
                if partition == 3:
                    writer.prepare_task(  # Python side done, Spark failed the task after
                        options,
                        task(sink_id, "runaaaa", batch_id, partition, 0),
                        rows_of(f"dropped-{prefix}", 4),
                    )
                attempt = 1 if partition in (2, 3) else 0
                pieces.append(
                    writer.prepare_task(
                        options,
                        task(sink_id, "runaaaa", batch_id, partition, attempt),
                        rows_of(prefix, 3),
                    )
                )
                expected += keys(prefix, 3)
            assert producer_pool.kept_count() <= producer_pool.MAX_KEPT_TRANSACTIONAL
            coordinator.commit(pieces, batch_id)
            assert open_under(real_kafka, sink_id) == []
    finally:
        coordinator.resource.close()
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(240)
def test_two_sinks_interleaved_in_one_worker_never_touch_each_others_transactions(
    real_kafka: Any, unique_name: str
) -> None:
    """Two queries' sinks share a Python worker: their tasks alternate, one sink's commit
    (and its roll back of unattributed pooled leftovers) runs while the other's batch is
    prepared but not decided, and the kept producers of both evict each other."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sinks = {"a": f"{unique_name}_a", "b": f"{unique_name}_b"}
    coordinators = {
        name: TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka") for name in sinks
    }
    expected: list[bytes] = []
    try:
        for batch_id in range(3):
            prepared: dict[str, list[PreparedPiece]] = {name: [] for name in sinks}
            for partition in range(3):
                for name, sink_id in sinks.items():
                    prefix = f"{name}{batch_id}p{partition}-"
                    prepared[name].append(
                        writer.prepare_task(
                            options,
                            task(sink_id, f"run{name}", batch_id, partition),
                            rows_of(prefix, 2),
                        )
                    )
                    expected += keys(prefix, 2)
            coordinators["a"].commit(prepared["a"], batch_id)
            assert len(open_under(real_kafka, sinks["b"])) == 3, "sink a's commit touched b"
            coordinators["b"].commit(prepared["b"], batch_id)
    finally:
        for coordinator in coordinators.values():
            coordinator.resource.close()
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert [open_under(real_kafka, sink_id) for sink_id in sinks.values()] == [[], []]


@pytest.mark.timeout(240)
def test_pieces_without_records_under_pooled_ids_across_batches(
    real_kafka: Any, unique_name: str
) -> None:
    """Tasks of 0 rows take and keep pooled ids like the others (their transaction never
    reaches the broker, the driver ends nothing for them); the ids then serve tasks with
    rows in later batches, and the other way round."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    shapes = [(0, 3, 0), (2, 0, 0), (0, 0, 0), (1, 1, 1)]
    expected: list[bytes] = []
    try:
        for batch_id, counts in enumerate(shapes):
            pieces = []
            for partition, count in enumerate(counts):
                prefix = f"b{batch_id}p{partition}-"
                pieces.append(
                    writer.prepare_task(
                        options,
                        task(sink_id, "runzero", batch_id, partition),
                        rows_of(prefix, count),
                    )
                )
                expected += keys(prefix, count)
            coordinator.commit(pieces, batch_id)
    finally:
        coordinator.resource.close()
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(240)
def test_inspection_of_a_running_and_of_a_crashed_sink_fences_no_pooled_transaction(
    real_kafka: Any, unique_name: str
) -> None:
    """``eospack checkpoint inspect`` while a batch is prepared (running query) and after a
    crash that left a decided batch on ids that served earlier batches too (other epochs):
    every pooled transaction keeps its producer id and epoch, the decided ones are reported
    as the decided batch's pieces, and the restart then commits exactly the decided rows."""
    from eospack.tools.checkpoint import inspect_sink

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    raw_options = {
        "kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers,
        "topic": unique_name,
        "ledgerTopic": f"{unique_name}_ledger",
        "sinkId": sink_id,
    }
    crashed = KafkaResource(options)
    coordinator = TwoPhaseCommitCoordinator(crashed, "2pc-kafka")
    expected: list[bytes] = []
    try:
        expected += committed_batches(coordinator, options, sink_id, "runinsp", range(2))
        running = [
            writer.prepare_task(
                options, task(sink_id, "runinsp", 2, partition), rows_of(f"b2p{partition}-", 2)
            )
            for partition in range(2)
        ]
        before = epochs_of(real_kafka, open_under(real_kafka, sink_id))
        assert len(before) == 2
        state = inspect_sink("2pc-kafka", "(unused)", raw_options)
        assert epochs_of(real_kafka, open_under(real_kafka, sink_id)) == before
        assert not state.unfinished
        decision = crashed.record_decision(BatchDecision(sink_id, 2, tuple(running)))
        assert decision.is_decided
        # the driver dies here: decided, nothing committed
        state = inspect_sink("2pc-kafka", "(unused)", raw_options)
        assert epochs_of(real_kafka, open_under(real_kafka, sink_id)) == before
        assert [decision.batch_id for decision in state.unfinished] == [2]
        assert sorted(state.prepared_pieces) == sorted(piece.transaction_id for piece in running)
        assert committed_keys(real_kafka, unique_name) == sorted(expected)
    finally:
        crashed.close()
    restarted = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        replay = [
            writer.prepare_task(
                options,
                task(sink_id, "runafter", 2, partition),
                rows_of(f"replay-b2p{partition}-", 2),
            )
            for partition in range(2)
        ]
        assert restarted.commit(replay, 2) is None
    finally:
        restarted.resource.close()
    expected += keys("b2p0-", 2) + keys("b2p1-", 2)
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(240)
def test_an_undecided_crash_on_ids_that_served_earlier_batches_is_rolled_back_not_attributed(
    real_kafka: Any, unique_name: str
) -> None:
    """The crashed run's ids served batches 0 and 1 (decided, done) and batch 2 was
    prepared but never decided: the open transactions have the ids the done slots name
    but other epochs, so recovery must not attribute them to batches 0 and 1; the replay
    commits its own rows once."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    expected: list[bytes] = []
    try:
        expected += committed_batches(coordinator, options, sink_id, "runcrsh", range(2))
        for partition in range(2):
            writer.prepare_task(
                options, task(sink_id, "runcrsh", 2, partition), rows_of(f"lost-b2p{partition}-", 2)
            )
    finally:
        coordinator.resource.close()
    resource = KafkaResource(options)
    try:
        listed = list(resource.prepared_pieces(sink_id))
        assert [piece.batch_id for piece in listed] == [], "misattributed to a done batch"
    finally:
        resource.close()
    restarted = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        replay = [
            writer.prepare_task(
                options, task(sink_id, "runrstr", 2, partition), rows_of(f"b2p{partition}-", 2)
            )
            for partition in range(2)
        ]
        restarted.commit(replay, 2)
    finally:
        restarted.resource.close()
    expected += keys("b2p0-", 2) + keys("b2p1-", 2)
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(240)
def test_an_at_least_once_run_after_an_exactly_once_crash_on_pooled_ids(
    real_kafka: Any, unique_name: str
) -> None:
    """Exactly-once run: batch 3 decided on pooled ids (not committed) and a pooled
    leftover no decision names (a task Spark failed after its Python side prepared); the
    query restarts at-least-once: its first commit commits the decided rows, rolls the
    leftover back, and marks the decision done."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    crashed = KafkaResource(options)
    try:
        decided = [
            writer.prepare_task(
                options, task(sink_id, "runeos", 3, partition), rows_of(f"b3p{partition}-", 2)
            )
            for partition in range(2)
        ]
        writer.prepare_task(options, task(sink_id, "runeos", 3, 0, 1), rows_of("leftover-", 2))
        assert crashed.record_decision(BatchDecision(sink_id, 3, tuple(decided))).is_decided
    finally:
        crashed.close()
    assert len(open_under(real_kafka, sink_id)) == 3
    at_least_once = sink_options(real_kafka, unique_name, deliveryGuarantee="at-least-once")
    resource = KafkaResource(at_least_once)
    try:
        recover_at_least_once(resource, "2pc-kafka", sink_id, 3, query_id=None)
    finally:
        resource.close()
    assert committed_keys(real_kafka, unique_name) == sorted(keys("b3p0-", 2) + keys("b3p1-", 2))
    assert open_under(real_kafka, sink_id) == []
    assert read_slots_if_any(options, sink_id, fence_stuck=False)[3].status == DONE


def legacy_piece(
    options: Any, task_identity: TaskIdentity, prefix: str, count: int
) -> PreparedPiece:
    """A piece as 2pc-kafka wrote it before pooling: the transactional id is the piece's
    own name (sink, batch, partition, attempt), the producer closed after its flush."""
    name = transaction_id(
        task_identity.sink_id,
        task_identity.batch_id,
        task_identity.partition_id,
        task_identity.attempt,
    )
    producer = begin(options.producer_config(), name)
    records = writer.send_rows(producer, options, rows_of(prefix, count))
    prepared = prepare(producer, records)
    return task_identity.piece(records, prepared.to_json())


@pytest.mark.timeout(240)
def test_a_decision_of_the_version_before_pooling_is_finished_after_the_upgrade(
    real_kafka: Any, unique_name: str
) -> None:
    """The pre-pooling version decided batch 4 (pieces named eospack-<sink>-4-<p>-<attempt>)
    and left an undecided piece of batch 4 (a failed attempt) and one of batch 5 (prepared
    when it crashed); the upgraded query replays 4 on pooled ids (its replay is rolled
    back, the old decision committed), then runs 5."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    crashed = KafkaResource(options)
    try:
        decided = [
            legacy_piece(options, task(sink_id, "runold", 4, partition), f"b4p{partition}-", 2)
            for partition in range(2)
        ]
        legacy_piece(options, task(sink_id, "runold", 4, 0, 1), "stray4-", 2)
        assert crashed.record_decision(BatchDecision(sink_id, 4, tuple(decided))).is_decided
        legacy_piece(options, task(sink_id, "runold", 5, 0), "stray5-", 2)
    finally:
        crashed.close()
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        replay = [
            writer.prepare_task(
                options, task(sink_id, "runnew", 4, partition), rows_of(f"replay4p{partition}-", 2)
            )
            for partition in range(2)
        ]
        assert coordinator.commit(replay, 4) is None
        later = [
            writer.prepare_task(
                options, task(sink_id, "runnew", 5, partition), rows_of(f"b5p{partition}-", 2)
            )
            for partition in range(2)
        ]
        assert coordinator.commit(later, 5) is not None
    finally:
        coordinator.resource.close()
    assert committed_keys(real_kafka, unique_name) == sorted(
        keys("b4p0-", 2) + keys("b4p1-", 2) + keys("b5p0-", 2) + keys("b5p1-", 2)
    )
    assert open_under(real_kafka, sink_id) == []


# Through real queries ------------------------------------------------------------------


@pytest.fixture
def kafka_sink(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> Any:
    from integration_tests.sink_contract.adapters import Kafka, KafkaSink

    bound = Kafka.open(request, tmp_path, unique_name)
    assert isinstance(bound, KafkaSink)
    return bound


def run_many_partitions(run: Any, partitions: int) -> None:
    """The contract's query, with ``partitions`` tasks per batch instead of 2: on the
    session's ``local[2]`` each Python worker runs about ``partitions / 2`` tasks of every
    batch (more than it keeps producers), and with 20 rows per batch some tasks get none."""
    from eospack.lab.testing import await_query
    from integration_tests.sink_contract.inputs import SCHEMA

    query = (
        run.sink.spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(run.source))
        .repartition(partitions)
        .selectExpr("grp AS key", "CAST(id AS STRING) AS value")
        .writeStream.format("2pc-kafka")
        .options(**run.options)
        .option("checkpointLocation", str(run.checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        await_query(query, 180)
    finally:
        run.remember_sink_id()


@pytest.mark.timeout(420)
def test_a_same_session_restart_over_many_partitions_finishes_the_crashed_runs_decision(
    kafka_sink: Any, call_faults: Path
) -> None:
    """24 tasks per batch on 2 slots (about 12 per worker, 4 without rows). Run 1 commits
    batches 0 and 1; run 2 decides batch 2 and fails before committing any piece (the
    piece commit fails in Spark's commit and again in its abort); run 3 starts in the same
    session, so the same Python workers, still keeping run 2's producers with their open
    decided transactions, replay batch 2 and run batch 3. Each row once, nothing open."""
    from integration_tests.sink_contract.harness import ContractRun

    run = ContractRun(kafka_sink)
    run.add_batches(2)
    run_many_partitions(run, 24)
    run.add_batches(1)
    faults.arm(call_faults, "kafka_sink.commit_piece", "before", batch_id=2, times=2)
    with pytest.raises(Exception, match="injected fault"):
        run_many_partitions(run, 24)
    run.assert_nothing_doubled()
    assert len(run.sink.leftovers(run.sink_ids, run.options)) > 2
    run.add_batches(1)
    run_many_partitions(run, 24)
    run.assert_each_row_once()


@pytest.mark.timeout(420)
def test_tasks_retried_after_their_flush_failed_in_reused_workers_write_each_row_once(
    kafka_sink: Any, call_faults: Path
) -> None:
    """A driver under ``local[2,3]``: in batch 1 two tasks' flush applies and its answer
    is lost (their transaction is aborted, their pooled index given back), and Spark
    retries them in the same reused Python workers, which take the index again for the
    retry. The query finishes on its own; each row once, nothing open."""
    from integration_tests.sink_contract.harness import ContractRun

    run = ContractRun(kafka_sink)
    run.add_batches(3)
    faults.arm(call_faults, "kafka_sink.prepare", "after", batch_id=1, times=2)
    finished = run.run_driver(master="local[2,3]", fault_directory=call_faults)
    assert finished.succeeded, finished.explain()
    assert [entry["call"] for entry in faults.injected(call_faults)] == ["kafka_sink.prepare"] * 2
    run.assert_each_row_once()


@pytest.mark.timeout(300)
def test_a_kept_producer_whose_restart_times_out_never_fences_the_new_producer_of_its_id(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every kept producer's InitProducerId (``begin_again``) gives up after 1 ms (a
    coordinator slow to answer): its request may still be in flight when the task closes
    it and makes a new producer on the same id (how often depends on the broker's speed:
    at least once). That late InitProducerId must never land after the new producer's and
    abort the transaction the task prepares (lost, or a fenced task). Twelve batches of
    three tasks: each row once, nothing open."""
    from eospack.connectors.kafka.client import transactions

    real_begin_again = transactions.begin_again
    gave_up: list[str] = []

    def impatient(producer: Any) -> None:
        monkeypatch.setattr(transactions, "ATTEMPT_SECONDS", 0.001)
        try:
            real_begin_again(producer)
        except Exception as error:
            gave_up.append(type(error).__name__)
            raise
        finally:
            monkeypatch.undo()

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_sink"
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    expected: list[bytes] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer, "begin_again", impatient)
        try:
            for batch_id in range(12):
                pieces = []
                for partition in range(3):
                    prefix = f"b{batch_id}p{partition}-"
                    pieces.append(
                        writer.prepare_task(
                            options,
                            task(sink_id, "runslow", batch_id, partition),
                            rows_of(prefix, 3),
                        )
                    )
                    expected += keys(prefix, 3)
                coordinator.commit(pieces, batch_id)
        finally:
            coordinator.resource.close()
    print(f"begin_again gave up {len(gave_up)} times: {sorted(set(gave_up))}")
    assert gave_up, "no kept producer gave up (its InitProducerId answered within 1 ms)"
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert open_under(real_kafka, sink_id) == []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("other_batch", [0, 10], ids=["refused", "far_ahead"])
def test_a_query_refused_for_sharing_a_sinkid_never_loses_the_running_querys_batch(
    real_kafka: Any, unique_name: str, other_batch: int
) -> None:
    """Query 2 runs with sinkId S (batches 0 and 1 done). Query 1 is started from a new
    checkpoint (a savepoint restored into a new query) and keeps sinkId S: its batch 0
    finds query 2's slot, and its commit is refused loudly (``SinkIdentityError``), as
    designed; Spark then calls its abort, which recovers the sink. Meanwhile query 2's
    batch 2 is prepared and checked alive, about to be decided. Before pooling, that
    recovery left batch 2 alone (pieces of a batch above 0 are not touched) or fenced its
    slot (query 2's decision then refused: a replay). Query 2 must never lose batch 2.
    ``far_ahead``: query 1 is at batch 10, which no slot holds yet: its commit succeeds
    (the shared sinkId is refused later, when one query reaches the other's slots) and
    recovers the sink the same way."""
    from eospack.commit_protocols import DecidedPieceLostError, SinkIdentityError

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    sink_id = f"{unique_name}_shared"

    def query_task(query: str, run: str, batch_id: int, partition: int) -> TaskIdentity:
        base = task(sink_id, run, batch_id, partition)
        return TaskIdentity(sink_id, batch_id, partition, base.attempt, query_id=query)

    def prepared(query: str, run: str, batch_id: int, label: str) -> list[PreparedPiece]:
        return [
            writer.prepare_task(
                options,
                query_task(query, run, batch_id, partition),
                rows_of(f"{label}b{batch_id}p{partition}-", 2),
            )
            for partition in range(2)
        ]

    running = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    expected: list[bytes] = []
    lost: list[str] = []
    try:
        for batch_id in range(2):
            running.commit(prepared("q2", "runqtwo", batch_id, "q2"), batch_id)
            expected += keys(f"q2b{batch_id}p0-", 2) + keys(f"q2b{batch_id}p1-", 2)
        batch_two = prepared("q2", "runqtwo", 2, "q2")
        expected += keys("q2b2p0-", 2) + keys("q2b2p1-", 2)
        other_pieces = prepared("q1", "runqone", other_batch, "q1")
        real_check = running.resource.check_prepared

        def checked_then_the_other_query_runs(decision: BatchDecision) -> None:
            real_check(decision)
            other = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
            try:
                if other_batch == 0:
                    with pytest.raises(SinkIdentityError):
                        other.commit(other_pieces, 0)
                    other.abort(other_pieces, 0)  # what Spark does when commit raises
                else:
                    other.commit(other_pieces, other_batch)
                    expected.extend(keys("q1b10p0-", 2) + keys("q1b10p1-", 2))
            finally:
                other.resource.close()

        running.resource.check_prepared = checked_then_the_other_query_runs  # type: ignore[method-assign]
        try:
            running.commit(batch_two, 2)
        except DecidedPieceLostError as error:
            lost.append(str(error))
        except Exception as error:  # a loud refusal is fine: query 2 replays batch 2
            print(f"query 2's commit failed: {error}")
            replay = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
            try:
                replay.commit(prepared("q2", "runqtwo2", 2, "q2"), 2)
            finally:
                replay.resource.close()
    finally:
        running.resource.close()
    assert lost == [], f"query 2's decided batch 2 was lost: {lost[0][:300] if lost else ''}"
    assert committed_keys(real_kafka, unique_name) == sorted(expected)
    assert open_under(real_kafka, sink_id) == []
