"""2pc-kafka against Apache Kafka: a read_committed consumer sees each row exactly once.

The crash test kills the driver at steps of the commit protocol in batch k of run k
(between two transaction commits by default; at every step, from after the tasks prepared
to after the commit, in the chaos lane), then runs to the end: the output topic holds each
row once for read_committed, no transaction of the sink stays open, and every decision in
the ledger is done. read_uncommitted sees the crashed runs' aborted records (documented).
Further: a broker SIGKILLed with a decided batch (the driver killed right after the
decision), a decided batch the broker timed out, tasks retried after their worker died or
their flush's answer was lost, the decision's ledger write failing or losing its answer, a
transaction commit losing its answer (Spark's abort), at-least-once mode, a bad option in
one line without its secret.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from eospack.commit_protocols import derive_sink_id, faults, sink_prefix
from eospack.connectors.kafka_sink.ledger import read_slots
from eospack.connectors.kafka_sink.options import DEFAULT_LEDGER_TOPIC
from eospack.connectors.kafka_sink.transactions import open_transactions
from eospack.services.kafka_tools import create_topic, read_all
from eospack.testing import await_query, wait_until
from integration_tests.crash_harness import DriverRun, run_driver
from integration_tests.drivers.kafka_sink_driver import start_query
from integration_tests.test_s3_crash import write_source

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parent / "drivers" / "kafka_sink_driver.py"
DRIVER_TIMEOUT = 240.0
ALL_FAULT_POINTS = [
    "after_prepare",
    "before_decision",
    "after_decision",
    "between_piece_commits",
    "after_commit",
]


def records(bootstrap: str, topic: str, isolation: str) -> Counter[tuple[str, str]]:
    """Every record up to the end offsets (read_committed: to the last stable offset)."""
    rows = read_all(bootstrap, topic, isolation_level=isolation)
    return Counter((key.decode(), value.decode()) for _, _, key, value in rows)


class SinkRun:
    """One test's crash driver: input files (one batch each), checkpoint, output topic."""

    def __init__(self, tmp_path: Path, kafka: Any, topic: str, batches: int) -> None:
        self.bootstrap = kafka.endpoint.bootstrap_servers
        self.topic = topic
        create_topic(self.bootstrap, topic, 2)
        self.source = tmp_path / "source"
        self.source.mkdir()
        self.batches = write_source(self.source, batches)
        self.checkpoint = tmp_path / "checkpoint"

    def in_own_process(
        self,
        options: dict[str, str] | None = None,
        *extra: str,
        fault_point: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> DriverRun:
        arguments = [
            "--source",
            str(self.source),
            "--checkpoint",
            str(self.checkpoint),
            "--bootstrap-servers",
            self.bootstrap,
            "--topic",
            self.topic,
            *(f"--option={name}={value}" for name, value in (options or {}).items()),
            *extra,
        ]
        return run_driver(
            DRIVER,
            arguments,
            timeout=DRIVER_TIMEOUT,
            fault_point=fault_point,
            environment=environment,
        )

    def crash(self, fault_point: str, options: dict[str, str] | None = None) -> None:
        run = self.in_own_process(options, fault_point=fault_point)
        assert run.was_killed, f"{fault_point} was not reached:\n{run.explain()}"

    def restart_here(self, spark: Any, options: dict[str, str] | None = None) -> None:
        """The same query in the test's session (same checkpoint: same sink id)."""
        query = start_query(
            spark, str(self.source), str(self.checkpoint), self.bootstrap, self.topic, options
        )
        await_query(query, DRIVER_TIMEOUT)

    def records(self, isolation: str) -> Counter[tuple[str, str]]:
        return records(self.bootstrap, self.topic, isolation)

    def expected(self, batches: int | None = None) -> Counter[tuple[str, str]]:
        """The records of every batch, or of the first ``batches``."""
        written = self.batches[:batches]
        return Counter((group, str(row_id)) for batch in written for row_id, group in batch)

    def sink_id(self) -> str:
        """Derived as the sink derives it: from the query id in the checkpoint and the target."""
        query_id = json.loads((self.checkpoint / "metadata").read_text().splitlines()[0])["id"]
        return derive_sink_id(query_id, f"kafka://{self.bootstrap}/{self.topic}")

    def open_transactions(self) -> list[str]:
        return open_transactions({"bootstrap_servers": self.bootstrap}, sink_prefix(self.sink_id()))

    def ledger(self) -> dict[int, str]:
        """Each remembered batch's status in the ledger topic."""
        config = {"bootstrap_servers": self.bootstrap}
        slots = read_slots(config, DEFAULT_LEDGER_TOPIC, self.sink_id())
        return {batch: slot.status for batch, slot in slots.items()}

    def assert_each_row_once(self) -> None:
        """Every row once for read_committed, no transaction left open, every slot done."""
        assert self.records("read_committed") == self.expected()
        assert self.open_transactions() == []
        assert set(self.ledger().values()) == {"done"}


@pytest.mark.timeout(600)
def test_driver_killed_between_transaction_commits_then_restarted(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """A decided batch half committed must be rolled forward (default CI; a kill right
    after the decision is the broker-restart test's, every step the chaos lane's)."""
    crash_then_restart(spark, real_kafka, tmp_path, unique_name, ["between_piece_commits"])


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_driver_killed_at_every_commit_step_then_restarted_writes_each_row_once(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    crash_then_restart(spark, real_kafka, tmp_path, unique_name, ALL_FAULT_POINTS)


def crash_then_restart(
    spark: Any, kafka: Any, tmp_path: Path, topic: str, fault_points: list[str]
) -> None:
    """Run k is killed at ``fault_points[k]`` in batch k; then a clean run to the end."""
    run = SinkRun(tmp_path, kafka, topic, len(fault_points) + 1)
    for batch, fault_point in enumerate(fault_points):
        run.crash(f"{fault_point}@{batch}")
        committed = run.records("read_committed")
        assert max(committed.values(), default=1) == 1, f"a record twice after {fault_point}"
    run.restart_here(spark)

    run.assert_each_row_once()
    slots = run.ledger()
    assert max(slots) == len(run.batches) - 1 and len(slots) <= 2  # older slots forgotten
    assert run.records("read_uncommitted") - run.expected(), "the crashed runs' aborted records"


@pytest.mark.timeout(300)
def test_retried_tasks_leave_each_row_once_and_their_failed_attempts_aborted(
    real_kafka: Any, tmp_path: Path, unique_name: str, call_faults: Path
) -> None:
    """Under local[2,3] Spark retries a failed task. In batch 1 a task's Python worker dies
    right after its transaction is flushed (left open, never reported); in batch 2 a task's
    flush fails after it applied (the task aborts its own transaction). The retries write
    again under new transactional ids; the dead attempt's transaction is fenced by the
    commit's recovery."""
    run = SinkRun(tmp_path, real_kafka, unique_name, 3)
    faults.arm(call_faults, "kafka_sink.prepare", "crash", batch_id=1)
    faults.arm(call_faults, "kafka_sink.prepare", "after", batch_id=2)

    finished = run.in_own_process(
        None,
        "--master",
        "local[2,3]",
        environment={faults.FAULT_DIRECTORY_VARIABLE: str(call_faults)},
    )

    assert finished.succeeded, finished.explain()
    fired = [(fault["mode"], fault["seen_batch"]) for fault in faults.injected(call_faults)]
    assert fired == [("crash", 1), ("after", 2)]
    assert run.records("read_committed") == run.expected()
    assert run.open_transactions() == []
    assert run.records("read_uncommitted") - run.expected(), "the failed attempts' records"


@pytest.mark.timeout(600)
def test_a_decided_batch_survives_a_broker_kill_and_is_finished_by_the_restart(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """Killed after the decision, before any commit; then the broker is SIGKILLed and
    started again: the prepared transactions survive it, and the restart commits them."""
    run = SinkRun(tmp_path, real_kafka, unique_name, 2)
    run.crash("after_decision@0")
    assert run.records("read_committed") == Counter()
    real_kafka.kill()
    real_kafka.start()

    run.restart_here(spark)
    assert run.records("read_committed") == run.expected()
    assert run.open_transactions() == []


@pytest.mark.timeout(600)
def test_a_decided_batch_the_broker_timed_out_fails_the_restart_loudly(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """The query stayed down longer than kafka.transaction.timeout.ms after deciding: the
    broker aborted its transactions. The restart must not pass the batch for done."""
    run = SinkRun(tmp_path, real_kafka, unique_name, 1)
    timeout = {"kafka.transaction.timeout.ms": "1000"}
    run.crash("after_decision@0", timeout)
    wait_until(
        lambda: run.open_transactions() == [],
        60,
        "the broker to abort the timed-out transactions",
        poll=1.0,
    )
    with pytest.raises(Exception, match="DecidedPieceLostError: 2pc-kafka batch 0 of sink"):
        run.restart_here(spark, timeout)
    assert run.records("read_committed") == Counter()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_decision_write_that_fails_or_loses_its_answer_then_a_restart_writes_each_row_once(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str, call_faults: Path, mode: str
) -> None:
    """The ledger write of batch 1's decision fails before it applies, or applies and its
    answer is lost. The commit raises and Spark calls abort: abort fences the undecided
    batch (its transactions aborted), or rolls the decided one forward. The query fails;
    its restart ends with each row once."""
    run = SinkRun(tmp_path, real_kafka, unique_name, 3)
    faults.arm(call_faults, "kafka_sink.decide", mode, batch_id=1)

    with pytest.raises(Exception, match="KafkaConnectionError"):
        run.restart_here(spark)
    assert [fault["call"] for fault in faults.injected(call_faults)] == ["kafka_sink.decide"]
    applied = 2 if mode == "after" else 1
    assert run.records("read_committed") == run.expected(applied)
    assert run.open_transactions() == []
    assert run.ledger()[1] == ("done" if mode == "after" else "aborted")

    run.restart_here(spark)
    run.assert_each_row_once()


@pytest.mark.timeout(300)
def test_spark_abort_after_a_partial_commit_rolls_the_batch_forward(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str, call_faults: Path
) -> None:
    """Batch 1's first transaction commit applies and its answer is lost: commit raises and
    Spark calls abort with the same messages, which must commit the other transaction, not
    fence it."""
    run = SinkRun(tmp_path, real_kafka, unique_name, 3)
    faults.arm(call_faults, "kafka_sink.commit_piece", "after", batch_id=1)

    with pytest.raises(Exception, match="KafkaConnectionError"):
        run.restart_here(spark)
    assert [fault["call"] for fault in faults.injected(call_faults)] == ["kafka_sink.commit_piece"]
    assert run.records("read_committed") == run.expected(2)
    assert run.open_transactions() == []
    assert run.ledger() == {0: "done", 1: "done"}

    run.restart_here(spark)
    run.assert_each_row_once()


@pytest.mark.timeout(300)
def test_at_least_once_writes_every_row_without_transactions(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    run = SinkRun(tmp_path, real_kafka, unique_name, 2)
    run.restart_here(spark, {"deliveryGuarantee": "at-least-once"})
    assert run.records("read_committed") == run.expected()
    assert run.open_transactions() == []


@pytest.mark.timeout(120)
def test_a_bad_option_fails_the_query_start_in_one_line_without_secrets(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """The cases of each option are unit tests (tests/test_kafka_sink_options.py)."""
    run = SinkRun(tmp_path, real_kafka, unique_name, 1)
    jaas = 'org.Nope required username="u" password="hunter2-secret";'
    with pytest.raises(Exception) as raised:
        run.restart_here(spark, {"kafka.sasl.jaas.config": jaas})
    text = str(raised.value)
    assert "must be a PlainLoginModule or ScramLoginModule" in text
    assert "hunter2-secret" not in text
    assert run.records("read_uncommitted") == Counter()
