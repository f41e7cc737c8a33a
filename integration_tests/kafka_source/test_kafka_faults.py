"""replayable-kafka under broker-call faults (``eospack.connectors.kafka.client.broker_calls``).

An armed ``kafka.<call>`` fault makes one call fail as kafka-python fails: a dropped connection
before the call applied or after (its answer lost), or a stall ending in a timeout. On the
executor (``kafka.poll``) it fails the task; on the driver (``kafka.metadata``,
``kafka.end_offsets``, ``kafka.beginning_offsets``) a stall fails planning, and a dropped
connection is asked again until kafka.request.timeout.ms has passed (issue 37: a broker
killed mid-call), so it fails planning only when it keeps dropping that long. Either way the
query stops; restarted from its checkpoint it must deliver every record exactly once,
replayed batches identical. A connection dropped once on the driver is ridden through.
Under ``local[2,2]`` Spark retries the failed task instead, and the same query finishes
with the same guarantee.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from eospack.core import faults
from eospack.lab.services.kafka_tools import create_topic, produce_sealed
from eospack.lab.testing import wait_until
from integration_tests.crash_harness import run_driver
from integration_tests.kafka_source_parts import (
    BatchRecorder,
    expected_rows,
    make_records,
    read_stream,
    run_available_now,
    servers_of,
    start_recording,
)

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parents[1] / "drivers" / "kafka_source_driver.py"
STALL_SECONDS = 1.0
DRIVER_RETRIES_EXHAUSTED = 60
"""More dropped connections than a driver call retries within kafka.request.timeout.ms
(10 s: backoffs of 0.1 s doubling to 1 s, about 15 attempts)."""


def fired(directory: Path) -> list[tuple[str, str]]:
    return [(str(entry["call"]), str(entry["mode"])) for entry in faults.injected(directory)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("call", "mode", "when", "message"),
    [
        ("kafka.poll", "before", "mid-stream", "injected fault: kafka.poll before"),
        pytest.param(
            "kafka.poll",
            "stall",
            "at start",
            "injected fault: kafka.poll stall",
            marks=pytest.mark.chaos,
        ),
        (
            "kafka.end_offsets",
            "after",
            "mid-stream",
            "did not answer within 10000 ms (KafkaConnectionError: injected fault:"
            " kafka.end_offsets after",
        ),
        ("kafka.metadata", "stall", "mid-stream", "(KafkaTimeoutError: injected fault"),
        ("kafka.beginning_offsets", "before", "at start", "(KafkaConnectionError: injected"),
    ],
)
def test_a_broker_fault_stops_the_query_and_the_restart_delivers_every_record_once(
    spark: Any,
    kafka: Any,
    unique_name: str,
    tmp_path: Path,
    call_faults: Path,
    call: str,
    mode: faults.Mode,
    when: str,
    message: str,
) -> None:
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    first, second = make_records(2, 10, "first"), make_records(2, 6, "second")
    produce_sealed(servers, unique_name, first)
    checkpoint = tmp_path / "checkpoint"
    recorder = BatchRecorder()

    def stream() -> Any:
        return read_stream(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="8",
        )

    # a dropped connection on the driver fails planning only when it keeps dropping
    times = DRIVER_RETRIES_EXHAUSTED if call != "kafka.poll" and mode != "stall" else 1
    if when == "at start":
        faults.arm(call_faults, call, mode, stall_seconds=STALL_SECONDS, times=times)
    query = start_recording(stream(), checkpoint, recorder)
    try:
        if when == "mid-stream":
            wait_until(lambda: recorder.batches, 60, "a first committed batch")
            faults.arm(call_faults, call, mode, stall_seconds=STALL_SECONDS, times=times)
        produce_sealed(servers, unique_name, second)
        with pytest.raises(StreamingQueryException) as raised:
            if not query.awaitTermination(90):
                raise TimeoutError(f"the query survived the {call} {mode} fault")
    finally:
        query.stop()
    assert message in str(raised.value)
    assert set(fired(call_faults)) == {(call, mode)}
    for armed in call_faults.glob("*.fault"):  # the faults the retries did not claim
        armed.unlink()

    run_available_now(stream(), checkpoint, recorder)

    assert all(recorder.replays.values()), recorder.replays
    delivered = recorder.all_rows()
    assert delivered == sorted(
        expected_rows(unique_name, first)
        + [(unique_name, r.partition, 10 + i // 2, r.value) for i, r in enumerate(second)]
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("call", "mode"), [("kafka.end_offsets", "after"), ("kafka.metadata", "before")]
)
def test_a_driver_call_whose_connection_drops_once_is_asked_again_and_the_query_goes_on(
    spark: Any,
    kafka: Any,
    unique_name: str,
    tmp_path: Path,
    call_faults: Path,
    call: str,
    mode: faults.Mode,
) -> None:
    """A broker killed mid-call on the driver (issue 37): planning asks again with a fresh
    consumer, the query never fails and delivers every record once."""
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    first, second = make_records(2, 10, "first"), make_records(2, 6, "second")
    produce_sealed(servers, unique_name, first)
    recorder = BatchRecorder()
    query = start_recording(
        read_stream(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="8",
        ),
        tmp_path / "checkpoint",
        recorder,
    )
    expected = sorted(
        expected_rows(unique_name, first)
        + [(unique_name, r.partition, 10 + i // 2, r.value) for i, r in enumerate(second)]
    )
    try:
        wait_until(lambda: recorder.batches, 60, "a first committed batch")
        faults.arm(call_faults, call, mode)
        produce_sealed(servers, unique_name, second)
        wait_until(
            lambda: recorder.all_rows() == expected or query.exception() is not None,
            90,
            "every record",
        )
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    assert fired(call_faults) == [(call, mode)]
    assert all(recorder.replays.values()), recorder.replays
    assert recorder.all_rows() == expected


@pytest.mark.chaos  # a driver process of its own: about a minute on two busy cores
@pytest.mark.timeout(240)
def test_a_failed_read_is_retried_by_spark_and_the_query_finishes_exactly_once(
    kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    records = make_records(2, 12, "v")
    produce_sealed(servers, unique_name, records)
    fault_directory = tmp_path / "faults"
    # One fault: a task that failed twice would fail the job under local[2,2].
    faults.arm(fault_directory, "kafka.poll", "after")
    output = tmp_path / "output"

    run = run_driver(
        DRIVER,
        [
            "--bootstrap-servers",
            servers,
            "--topic",
            unique_name,
            "--checkpoint",
            str(tmp_path / "checkpoint"),
            "--output",
            str(output),
        ],
        timeout=200,
        environment={faults.FAULT_DIRECTORY_VARIABLE: str(fault_directory)},
    )

    assert run.succeeded, run.explain()
    assert fired(fault_directory) == [("kafka.poll", "after")]
    batches = sorted(output.glob("*.json"), key=lambda path: int(path.stem))
    delivered = sorted(tuple(row) for path in batches for row in json.loads(path.read_text()))
    assert delivered == [
        (topic, partition, offset, value.decode())
        for topic, partition, offset, value in expected_rows(unique_name, records)
    ]
    assert len(batches) == 3  # 24 offsets, 8 per batch


@pytest.mark.timeout(300)
def test_a_broker_killed_mid_query_and_restarted_on_its_log_directory_loses_nothing(
    spark: Any, real_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """SIGKILL of the broker JVM while a query reads (acks=all records survive it), then the
    broker restarts on the same log directory and port. The query fails or carries on; run
    from its checkpoint to the end it delivers every record once, replayed batches identical."""
    from eospack.lab.services.apache_kafka import ApacheKafka

    if not isinstance(real_kafka, ApacheKafka):
        pytest.skip("kills the embedded Apache Kafka process")
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=2)
    first, second = make_records(2, 20, "first"), make_records(2, 6, "second")
    produce_sealed(servers, unique_name, first, acks="all")
    checkpoint = tmp_path / "checkpoint"
    recorder = BatchRecorder()

    def stream() -> Any:
        return read_stream(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="8",
            **{"kafka.request.timeout.ms": "3000"},
        )

    query = start_recording(stream(), checkpoint, recorder)
    try:
        wait_until(lambda: len(recorder.batches) >= 2, 60, "two committed batches")
        real_kafka.kill()
        try:
            wait_until(lambda: not query.isActive, 60, "the query to fail without its broker")
        finally:
            real_kafka.start()
    finally:
        query.stop()
    produce_sealed(servers, unique_name, second, acks="all")

    run_available_now(stream(), checkpoint, recorder)

    assert all(recorder.replays.values()), recorder.replays
    assert recorder.all_rows() == sorted(
        expected_rows(unique_name, first)
        + [(unique_name, r.partition, 20 + i // 2, r.value) for i, r in enumerate(second)]
    )
