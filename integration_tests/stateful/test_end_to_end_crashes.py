"""The pack's promise under crashes: Kafka -> running_count -> 2pc-jdbc, killed and restarted.

One pipeline (the demo's, ``eospack.lab.demo.pipeline``) counts a fixed, pre-produced set of
events. It is SIGKILLed at every named fault point of commit_protocols and at random
instants, restarted from the same checkpoint each time, and finally run to the end.
Then its tables must hold each event's effect exactly once, with monotonic histories
and nothing left prepared.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from eospack.core.fault_points import ALL_FAULT_POINTS
from eospack.lab.demo.outputs import JdbcOutput
from eospack.lab.demo.pipeline import PipelineCommand
from eospack.lab.demo.run import committed_batches
from eospack.lab.demo.verify import check_pipeline
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from integration_tests.crash_harness import run_driver

pytestmark = pytest.mark.integration

DRIVER_TIMEOUT = 150.0
RANDOM_KILLS = 5  # after the five fault points; test_thirty_random_kills (chaos) does 30


def produce_events(bootstrap: str, topic: str, events: int, keys: int, seed: int) -> Counter[str]:
    create_topic(bootstrap, topic, partitions=3)
    rng = random.Random(seed)
    records = [
        Record(rng.randrange(3), f"key-{rng.randrange(keys):03d}".encode(), str(i).encode())
        for i in range(events)
    ]
    produce_sealed(bootstrap, topic, records)
    return Counter(record.key.decode() for record in records if record.key)


def pipeline_arguments(name: str, bootstrap: str, topic: str, postgres, workdir: Path) -> list[str]:
    done_file = workdir / "done"
    done_file.touch()
    return PipelineCommand(
        name=name,
        bootstrap_servers=bootstrap,
        topic=topic,
        checkpoint_dir=workdir / "checkpoints",
        done_file=done_file,
        jdbc_url=postgres.endpoint.jdbc_url,
        jdbc_user=postgres.endpoint.user,
        max_offsets_per_trigger=300,
    ).arguments()


def run_pipeline(arguments: list[str], **crash) -> object:
    return run_driver(arguments[0], arguments[1:], timeout=DRIVER_TIMEOUT, **crash)


def verify(postgres, name: str, produced: Counter[str], crashes: int, workdir: Path):
    with psycopg.connect(postgres.endpoint.url) as connection:
        current: dict[str, int] = dict(
            connection.execute(f'SELECT key, "count" FROM "{name}_current"').fetchall()
        )
        history = connection.execute(
            f'SELECT key, "count", version, batch_id FROM "{name}_history"'
        ).fetchall()
    endpoint = postgres.endpoint
    output = JdbcOutput(
        endpoint.jdbc_url, endpoint.user, [name], "exactly-once", {name: workdir / "checkpoints"}
    )
    leftovers = output.leftovers(name)  # what the sinks' resources report (read only)
    return check_pipeline(name, crashes, produced, current, history, 0, leftovers)


def random_kill_after_progress(checkpoints: Path, rng: random.Random):
    """A kill_when that fires at a random moment after the driver committed a new batch."""
    start = committed_batches(checkpoints)
    state: dict[str, float] = {}

    def kill_when() -> bool:
        if "at" not in state and committed_batches(checkpoints) > start:
            state["at"] = time.monotonic() + rng.uniform(0.0, 1.5)
        return "at" in state and time.monotonic() >= state["at"]

    return kill_when


@pytest.mark.chaos  # by default: test_stress kills this pipeline's driver at random moments;
# test_sink_contract, test_jdbc_faults and test_cluster kill the
# sinks' drivers at their commit steps (the three here cost 8 min)
@pytest.mark.timeout(900)
def test_every_fault_point_and_random_kills_leave_counts_exactly_once(
    kafka, postgres, tmp_path, unique_name
):
    bootstrap = kafka.endpoint.bootstrap_servers
    produced = produce_events(bootstrap, unique_name, events=3000, keys=40, seed=11)
    arguments = pipeline_arguments(unique_name, bootstrap, unique_name, postgres, tmp_path)
    rng = random.Random(5)
    crashes = 0

    for fault_point in ALL_FAULT_POINTS:
        run = run_pipeline(arguments, fault_point=fault_point)
        assert run.was_killed, f"fault point {fault_point} was not reached:\n{run.explain()}"
        crashes += 1
    for _ in range(RANDOM_KILLS):
        kill_when = random_kill_after_progress(tmp_path / "checkpoints", rng)
        run = run_pipeline(arguments, kill_when=kill_when)
        if run.succeeded:
            break  # the pipeline finished before the kill: nothing left to crash
        assert run.was_killed, run.explain()
        crashes += 1
    final = run_pipeline(arguments)
    assert final.succeeded, final.explain()
    assert "DataFrame concatenation with empty or all-NA entries" not in final.output

    result = verify(postgres, unique_name, produced, crashes, tmp_path)
    assert crashes >= len(ALL_FAULT_POINTS) + 1  # the pipeline may finish before a kill
    assert result.counted == sum(produced.values())
    assert (result.lost, result.duplicated, result.history_regressions, result.leftovers) == (
        0,
        0,
        0,
        0,
    )


@pytest.mark.chaos  # the sink-level twin runs by default: test_jdbc_crash.py
@pytest.mark.timeout(600)
def test_postgres_restart_mid_stream_fails_clearly_and_recovers_exactly_once(
    kafka, tmp_path, unique_name
):
    from eospack.lab.services import start_postgres

    postgres = start_postgres()
    try:
        bootstrap = kafka.endpoint.bootstrap_servers
        produced = produce_events(bootstrap, unique_name, events=3000, keys=20, seed=3)
        arguments = pipeline_arguments(unique_name, bootstrap, unique_name, postgres, tmp_path)
        checkpoints = tmp_path / "checkpoints"

        stopped = {"yes": False}

        def stop_database_after_progress() -> bool:
            if not stopped["yes"] and committed_batches(checkpoints) >= 2:
                postgres.kill()
                stopped["yes"] = True
            return False  # the driver is not killed: it must fail by itself

        run = run_driver(
            arguments[0],
            arguments[1:],
            timeout=DRIVER_TIMEOUT,
            kill_when=stop_database_after_progress,
        )
        assert stopped["yes"], "the pipeline finished before the database could be stopped"
        assert not run.succeeded
        assert "connection" in run.output.lower(), run.explain()
        postgres.start()

        final = run_pipeline(arguments)
        assert final.succeeded, final.explain()
        result = verify(postgres, unique_name, produced, 1, tmp_path)
        assert result.verified and result.counted == sum(produced.values()), result
    finally:
        postgres.stop()


@pytest.mark.chaos  # by default: test_kafka_faults stalls and fails the broker calls
@pytest.mark.timeout(600)
def test_broker_unreachable_for_a_while_fails_clearly_and_recovers_exactly_once(
    postgres, tmp_path, unique_name
):
    from eospack.lab.services import services_mode, start_kafka

    if services_mode() != "embedded":
        pytest.skip("pauses the embedded broker process")
    broker = start_kafka()
    try:
        bootstrap = broker.endpoint.bootstrap_servers
        produced = produce_events(bootstrap, unique_name, events=3000, keys=20, seed=4)
        arguments = pipeline_arguments(unique_name, bootstrap, unique_name, postgres, tmp_path)
        checkpoints = tmp_path / "checkpoints"
        paused = {"yes": False}

        def pause_broker_after_progress() -> bool:
            if not paused["yes"] and committed_batches(checkpoints) >= 2:
                os.kill(broker.process.pid, signal.SIGSTOP)
                paused["yes"] = True
            return False

        # a reading task fails 10 s after the broker stops answering, not after 120 s
        arguments += ["--source-option", "kafkaConsumer.pollTimeoutMs=10000"]
        try:
            run = run_driver(
                arguments[0],
                arguments[1:],
                timeout=DRIVER_TIMEOUT,
                kill_when=pause_broker_after_progress,
            )
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
        assert paused["yes"], "the pipeline finished before the broker could be paused"
        assert not run.succeeded
        assert bootstrap in run.output, run.explain()

        final = run_pipeline(arguments)
        assert final.succeeded, final.explain()
        result = verify(postgres, unique_name, produced, 1, tmp_path)
        assert result.verified and result.counted == sum(produced.values()), result
    finally:
        broker.stop()


@pytest.mark.chaos
@pytest.mark.timeout(3600)
def test_thirty_random_kills(kafka, postgres, tmp_path, unique_name):
    bootstrap = kafka.endpoint.bootstrap_servers
    produced = produce_events(bootstrap, unique_name, events=30000, keys=100, seed=21)
    arguments = pipeline_arguments(unique_name, bootstrap, unique_name, postgres, tmp_path)
    rng = random.Random(99)
    crashes = 0
    while crashes < 30:
        run = run_pipeline(
            arguments, kill_when=random_kill_after_progress(tmp_path / "checkpoints", rng)
        )
        if run.succeeded:
            break
        assert run.was_killed, run.explain()
        crashes += 1
    assert run_pipeline(arguments).succeeded
    result = verify(postgres, unique_name, produced, crashes, tmp_path)
    assert result.verified and result.counted == sum(produced.values()), result
