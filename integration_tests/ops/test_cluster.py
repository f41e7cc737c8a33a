"""2pc-jdbc on a Spark cluster: two executor JVMs (``local-cluster``), each with its own
Python workers, where an executor can be lost on its own, a task is retried or speculated
on the other executor, and a late attempt can prepare after its batch was decided.

Every case runs the crash-test driver (``drivers/jdbc_sink_driver.py``: parquet files ->
2pc-jdbc, two pieces per batch, Trigger.AvailableNow) as its own application on the
cluster, with eospack installed in the interpreter every node runs (how a cluster whose
nodes share an image ships it; docs/operations.md, "Running on a cluster"). Each ends
with every input row exactly once in the table, no prepared transaction or staged row of
the sink, and a ledger whose every batch is done: a piece a lost, failed, killed or late
attempt prepared is rolled back by the next commit, never committed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.core import faults
from integration_tests.crash_harness import run_driver
from integration_tests.drivers.jdbc_sink_driver import EXECUTORS_LINE
from integration_tests.jdbc_fixtures import pg_ledger, pg_leftovers, pg_rows, write_input_files
from integration_tests.ops.cluster_parts import StandaloneCluster

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parents[1] / "drivers" / "jdbc_sink_driver.py"
CLUSTER = "local-cluster[2,1,1024]"
DRIVER_TIMEOUT = 240.0
BATCHES = 10


@pytest.fixture(scope="module")
def standalone_cluster() -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster()
    yield cluster
    cluster.stop()


def input_batches(count: int) -> list[list[tuple[int, str, int]]]:
    return [[(b * 10 + i, f"row-{b}-{i}", b) for i in range(6)] for b in range(count)]


def driver_arguments(
    tmp_path: Path,
    postgres: Any,
    table: str,
    *,
    checkpoint_form: str = "path",
    conf: dict[str, str] | None = None,
    lock_timeout: str | None = None,
    master: str = CLUSTER,
) -> list[str]:
    arguments = [
        "--input",
        str(tmp_path / "in"),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--checkpoint-form",
        checkpoint_form,
        "--url",
        postgres.endpoint.jdbc_url,
        "--user",
        postgres.endpoint.user,
        "--table",
        table,
        "--protocol",
        "prepared",
        "--master",
        master,
        "--conf",
        "spark.executor.cores=1",
    ]
    for key, value in (conf or {}).items():
        arguments += ["--conf", f"{key}={value}"]
    if lock_timeout:
        arguments += ["--lock-timeout", lock_timeout]
    return arguments


def prepare_table(
    postgres: Any, tmp_path: Path, table: str, primary_key: bool = True
) -> list[tuple[Any, ...]]:
    """The input files, and the table: with a primary key a duplicate fails loudly; without
    one it shows in the exact row comparison."""
    batches = input_batches(BATCHES)
    write_input_files(tmp_path / "in", batches)
    key = " PRIMARY KEY" if primary_key else ""
    with psycopg.connect(postgres.endpoint.url) as connection:
        connection.execute(f'CREATE TABLE "{table}" (id bigint{key}, name text, version bigint)')
    return sorted(row for batch in batches for row in batch)


def assert_exactly_once_and_clean(postgres: Any, table: str, expected: list[Any]) -> None:
    url = postgres.endpoint.url
    assert pg_rows(url, table) == expected
    assert pg_leftovers(url, table) == (0, 0)
    ledger = pg_ledger(url, table)
    assert {status for *_, status in ledger} == {"done"}
    assert sorted(batch for _, batch, *_ in ledger) == list(range(BATCHES))


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "fault_points",
    [
        pytest.param(("between_piece_commits@2",), id="roll-forward"),
        pytest.param(
            ("after_prepare@1", "between_piece_commits@2", "after_commit@3"),
            id="three-points",
            marks=pytest.mark.chaos,
        ),
    ],
)
def test_driver_killed_at_fault_points_on_a_cluster_then_restarted_applies_each_row_once(
    postgres: Any, tmp_path: Path, unique_name: str, fault_points: tuple[str, ...]
) -> None:
    """The default-CI cluster crash test (one kill, between two piece commits: the batch is
    rolled forward by the restart; three kills in the chaos lane, for CI time); the
    checkpoint is given as a ``file://`` URI."""
    expected = prepare_table(postgres, tmp_path, unique_name)
    arguments = driver_arguments(tmp_path, postgres, unique_name, checkpoint_form="uri")
    for fault_point in fault_points:
        run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT, fault_point=fault_point)
        assert run.was_killed, f"{fault_point} was not reached:\n{run.explain()}"
    final = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT)
    assert final.succeeded, final.explain()
    assert f"{EXECUTORS_LINE}2" in final.output
    assert_exactly_once_and_clean(postgres, unique_name, expected)


@dataclass(frozen=True)
class ExecutorFault:
    """What happens to one task of ``batch_id`` at its PREPARE TRANSACTION, and what must
    show that it happened as meant."""

    mode: faults.Mode
    stall_seconds: float = 0.0
    conf: dict[str, str] = field(default_factory=dict)
    primary_key: bool = True
    standalone: bool = False
    """On the standalone cluster (executors on two hosts) instead of ``local-cluster``."""
    events: tuple[str, ...] = ()
    """Spark listener events that show the fault happened as meant (see ``spark_events``)."""
    batch_id: int = 1
    cleanup_log: str | None = None
    """A line the driver or (standalone) an executor must have logged."""


SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.minTaskRuntime": "500ms",
    # the losing attempt's Python worker is not killed at once: it finishes its PREPARE
    "spark.python.task.killTimeout": "60s",
}

EXECUTOR_FAULTS = {
    # prepared, then its executor JVM dies: the task reruns in a new stage attempt, whose
    # attempt numbers start again at 0, so it waits on the orphan's row locks until
    # lockTimeout; the attempt after that rolls the orphan back (docs/operations.md: cluster limits)
    "executor-lost-after-prepare": ExecutorFault("kill-executor", events=("executor removed",)),
    # prepared, then its Python worker dies: the task fails and is retried
    "python-worker-killed-after-prepare": ExecutorFault("crash", events=("task failed",)),
    # prepared, then the answer is lost: the task rolls its piece back, fails, is retried
    "task-failed-after-prepare": ExecutorFault(
        "after", conf={"spark.task.maxFailures": "4"}, events=("task failed",)
    ),
    # a straggler: a speculative copy prepares and wins, the batch commits, and the
    # original prepares after its batch was decided (a zombie piece): the next commit rolls
    # it back. Append without a key, so the copy never waits on the original's locks.
    "speculated-straggler-prepares-after-the-decision": ExecutorFault(
        "slow",
        stall_seconds=4.0,
        batch_id=4,  # warm Python workers: the other task takes ~0.1 s, not a cold 2.5 s
        conf=SPECULATION,
        primary_key=False,
        standalone=True,
        events=("speculative task", "task killed"),
        cleanup_log="recovery: rolled back orphaned piece",
    ),
}


def event_log(directory: Path) -> dict[str, str]:
    """Spark settings for one plain JSON-lines event log file in ``directory``."""
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def spark_events(directory: Path) -> set[str]:
    """The kinds of Spark listener events in an application's event log that the faults
    above are about: two executors added, speculative task starts, killed or failed tasks,
    executors removed."""
    found, executors_added = set(), 0
    for log in directory.rglob("*"):
        if not log.is_file() or log.name.startswith("."):
            continue
        for line in log.read_text().splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerTaskStart" and event["Task Info"].get("Speculative"):
                found.add("speculative task")
            elif kind == "SparkListenerTaskEnd":
                reason = event.get("Task End Reason", {}).get("Reason")
                if reason == "TaskKilled":
                    found.add("task killed")
                elif reason in ("ExceptionFailure", "ExecutorLostFailure", "TaskResultLost"):
                    found.add("task failed")
            elif kind == "SparkListenerExecutorRemoved":
                found.add("executor removed")
            elif kind == "SparkListenerExecutorAdded":
                executors_added += 1
    if executors_added >= 2:
        found.add("two executors")
    return found


@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(EXECUTOR_FAULTS))
def test_executor_side_faults_on_a_cluster_leave_each_row_once_and_nothing_behind(
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    call_faults: Path,
    case: str,
    request: pytest.FixtureRequest,
) -> None:
    fault = EXECUTOR_FAULTS[case]
    master, cluster = CLUSTER, None
    if fault.standalone:
        cluster = request.getfixturevalue("standalone_cluster")
        master = cluster.master_url
    expected = prepare_table(postgres, tmp_path, unique_name, primary_key=fault.primary_key)
    faults.arm(
        call_faults,
        "jdbc.prepare",
        fault.mode,
        batch_id=fault.batch_id,
        stall_seconds=fault.stall_seconds,
    )
    events = tmp_path / "events"
    events.mkdir()
    conf = {**fault.conf, **event_log(events)}
    arguments = driver_arguments(
        tmp_path,
        postgres,
        unique_name,
        checkpoint_form="conf",
        conf=conf,
        lock_timeout="10s",
        master=master,
    )
    run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT)
    (tmp_path / "driver.log").write_text(run.output)
    assert run.succeeded, run.explain()
    fired = [(entry["call"], entry["mode"]) for entry in faults.injected(call_faults)]
    assert fired == [("jdbc.prepare", fault.mode)], fired
    seen = spark_events(events)
    assert {"two executors", *fault.events} <= seen, seen
    if fault.cleanup_log:
        # the zombie's piece is rolled back by the next batch: its commit, or its tasks
        logs = run.output + (cluster.executor_logs() if cluster else "")
        assert fault.cleanup_log in logs
    assert_exactly_once_and_clean(postgres, unique_name, expected)


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_driver_killed_while_an_executor_is_mid_task_then_restarted_applies_each_row_once(
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    call_faults: Path,
    standalone_cluster: StandaloneCluster,
) -> None:
    """On the standalone cluster the executors outlive the driver for a moment: the task
    stalled before its PREPARE may still prepare after the driver died (a piece nobody will
    decide). The restarted query rolls it back; the rows are applied once."""
    expected = prepare_table(postgres, tmp_path, unique_name)
    faults.arm(call_faults, "jdbc.prepare", "slow", batch_id=3, stall_seconds=5.0)
    arguments = driver_arguments(
        tmp_path, postgres, unique_name, master=standalone_cluster.master_url
    )
    killed = run_driver(
        DRIVER,
        arguments,
        timeout=DRIVER_TIMEOUT,
        kill_when=lambda: bool(faults.injected(call_faults)),
    )
    assert killed.was_killed, killed.explain()
    final = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT)
    assert final.succeeded, final.explain()
    assert_exactly_once_and_clean(postgres, unique_name, expected)
