"""replayable-kafka on Kafka as production runs it (``make test-kafka-production``).

On the 3-node cluster the input partitions are led by nodes 2 and 3, none by the first
bootstrap address (node 1), so a source that only talks to the first address, or that
never follows a leader change, fails here and not by accident elsewhere:

- the leader of each input partition is SIGKILLed in turn while a query reads (and
  restarted): the query rides through, never fails, and delivers exactly the input, each
  replayed batch identical;
- the driver is SIGKILLed mid-stream and restarted with the bootstrap list reordered, its
  first address a node that is down and the leader of partition 0 moved: exactly the input.

On the SASL_SSL broker, as user ``app`` with only the documented grant (READ and DESCRIBE
on topics ``app.*``; no group, no cluster permission): the driver killed mid-stream and
restarted delivers exactly the input; the broker killed and restarted while the query reads
is ridden through.

Every streaming wait has a deadline; nothing waits by sleeping.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eospack.lab.services.kafka_cluster import ADMIN_USER, APP_TOPIC_PREFIX
from eospack.lab.services.kafka_tools import Record, produce_sealed
from eospack.lab.testing import wait_until
from integration_tests.crash_harness import run_driver
from integration_tests.kafka_source_parts import (
    BatchRecorder,
    expected_rows,
    make_records,
    read_stream,
    start_recording,
)
from integration_tests.production_kafka_parts import (
    bootstrap_addresses,
    kill_and_await_new_leader,
    place_topic,
)

pytestmark = [pytest.mark.production_kafka, pytest.mark.integration]

DRIVER = Path(__file__).parents[1] / "drivers" / "production_kafka_source_driver.py"
INPUT_LEADERS = (2, 3)
"""Partition p of every input topic is led by node INPUT_LEADERS[p]; node 1, the first
bootstrap address, leads none."""
READ_DEADLINE_MS = "30000"
"""kafkaConsumer.pollTimeoutMs of these tests: a leader change must be ridden through well
within it (a new leader takes a few seconds on the test cluster)."""


def produce(servers: str, topic: str, records: list[Record], **client: Any) -> None:
    produce_sealed(servers, topic, records, seal=False, acks="all", retries=20, **client)


def delivered_by_driver(output: Path) -> list[tuple[str, int, int, str]]:
    batches = sorted(output.glob("*.json"), key=lambda path: int(path.stem))
    return sorted(tuple(row) for path in batches for row in json.loads(path.read_text()))  # type: ignore[misc]


def as_text(rows: list[tuple[str, int, int, bytes]]) -> list[tuple[str, int, int, str]]:
    return [(topic, partition, offset, value.decode()) for topic, partition, offset, value in rows]


# The 3-node cluster -------------------------------------------------------------------


@pytest.mark.production_kafka_smoke
@pytest.mark.timeout(300)
def test_each_input_leader_killed_while_the_query_reads_is_ridden_through_exactly_once(
    spark: Any, kafka_cluster: Any, unique_name: str, tmp_path: Path
) -> None:
    """Round k of records is produced, and once the query has delivered part of it (it is
    reading, 30 offsets a batch) the leader of partition k is SIGKILLed; the rest of the
    round is read from the new leader, then records go to the new leaders with the node
    down, then the node restarts. The query must not fail: a fetch or a ListOffsets on the
    dead leader is retried on the new one within kafkaConsumer.pollTimeoutMs (a read) and
    kafka.request.timeout.ms (planning)."""
    servers = kafka_cluster.endpoint.bootstrap_servers
    place_topic(kafka_cluster, unique_name, INPUT_LEADERS)
    recorder = BatchRecorder()
    query = start_recording(
        read_stream(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="30",
            **{"kafkaConsumer.pollTimeoutMs": READ_DEADLINE_MS},
        ),
        tmp_path / "checkpoint",
        recorder,
    )
    produced: list[Record] = []

    def delivered_all() -> bool:
        expected = expected_rows(unique_name, produced)
        return recorder.all_rows() == expected or query.exception() is not None

    try:
        for partition in (0, 1):
            before = len(produced)
            produced += make_records(2, 300, f"while-reading-{partition}-")
            produce(servers, unique_name, produced[before:])
            wait_until(
                lambda before=before: len(recorder.all_rows()) >= before + 60,
                120,
                "the query reading the round",
            )
            assert len(recorder.all_rows()) < len(produced), "the round was read before the kill"
            killed = kill_and_await_new_leader(kafka_cluster, unique_name, partition)
            produced += make_records(2, 20, f"node-{killed}-down-")
            produce(servers, unique_name, produced[-40:])
            wait_until(delivered_all, 120, f"every record produced so far, node {killed} down")
            assert query.exception() is None, query.exception()
            kafka_cluster.start(killed)
        assert query.isActive, query.exception()
    finally:
        query.stop()
    assert query.exception() is None
    assert all(recorder.replays.values()), recorder.replays
    assert recorder.all_rows() == expected_rows(unique_name, produced)


@pytest.mark.timeout(420)
def test_a_driver_killed_mid_stream_restarts_on_a_reordered_bootstrap_list_whose_first_node_is_down(
    kafka_cluster: Any, unique_name: str, tmp_path: Path
) -> None:
    """Run 1 (bootstrap 1,2,3) is SIGKILLed after two batches. Then node 2 (leader of
    partition 0) is SIGKILLed and run 2 starts with bootstrap 2,3,1: its first address
    refuses connections and partition 0 has a new leader. Run 2 finishes what run 1 planned
    and the rest: the batch files hold exactly the input, nothing twice."""
    place_topic(kafka_cluster, unique_name, INPUT_LEADERS)
    records = make_records(2, 60)
    produce(kafka_cluster.endpoint.bootstrap_servers, unique_name, records)
    output, checkpoint = tmp_path / "output", tmp_path / "checkpoint"

    def arguments(bootstrap: str) -> list[str]:
        options = {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": unique_name,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "8",
            "kafkaConsumer.pollTimeoutMs": READ_DEADLINE_MS,
        }
        return [
            "--options",
            json.dumps(options),
            "--checkpoint",
            str(checkpoint),
            "--output",
            str(output),
        ]

    killed_run = run_driver(
        DRIVER,
        arguments(bootstrap_addresses(kafka_cluster, (1, 2, 3))),
        timeout=240,
        kill_when=lambda: len(list(output.glob("*.json"))) >= 2,
    )
    assert killed_run.was_killed, killed_run.explain()
    killed = kill_and_await_new_leader(kafka_cluster, unique_name, 0)
    try:
        restarted = run_driver(
            DRIVER, arguments(bootstrap_addresses(kafka_cluster, (killed, 3, 1))), timeout=240
        )
    finally:
        kafka_cluster.start(killed)
    assert restarted.succeeded, restarted.explain()
    delivered = delivered_by_driver(output)
    assert delivered == as_text(expected_rows(unique_name, records))


# The SASL_SSL broker, least privilege --------------------------------------------------


def secured_input(secured_kafka: Any, unique_name: str, records: list[Record]) -> str:
    from kafka.admin import NewTopic

    topic = f"{APP_TOPIC_PREFIX}{unique_name}-in"
    admin = secured_kafka.admin_client(ADMIN_USER)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    produce(
        secured_kafka.endpoint.bootstrap_servers,
        topic,
        records,
        **secured_kafka.client_config(ADMIN_USER),
    )
    return topic


@pytest.mark.timeout(420)
def test_least_privilege_driver_killed_mid_stream_restarts_and_delivers_exactly_the_input(
    secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """As ``app`` (READ and DESCRIBE on ``app.*`` topics, nothing else): the source needs
    no consumer group (it commits no offsets: they live in the checkpoint), so no group
    permission is granted and none is missing."""
    records = make_records(2, 40)
    topic = secured_input(secured_kafka, unique_name, records)
    output, checkpoint = tmp_path / "output", tmp_path / "checkpoint"
    options = {
        **secured_kafka.client_options("app"),
        "subscribe": topic,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "8",
        "kafkaConsumer.pollTimeoutMs": READ_DEADLINE_MS,
    }
    arguments = ["--options", json.dumps(options), "--checkpoint", str(checkpoint)]
    arguments += ["--output", str(output)]

    killed_run = run_driver(
        DRIVER, arguments, timeout=240, kill_when=lambda: len(list(output.glob("*.json"))) >= 2
    )
    assert killed_run.was_killed, killed_run.explain()
    restarted = run_driver(DRIVER, arguments, timeout=240)

    assert restarted.succeeded, restarted.explain()
    assert delivered_by_driver(output) == as_text(expected_rows(topic, records))


@pytest.mark.timeout(300)
def test_least_privilege_the_broker_killed_and_restarted_while_the_query_reads_is_ridden_through(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """The only broker is SIGKILLed after the first batch and restarted on its log
    directory (acks=all records survive): the query waits for it within its deadlines
    (kafkaConsumer.pollTimeoutMs for a read, kafka.request.timeout.ms for planning, raised
    here above a restart's duration) and delivers exactly the input, never failing."""
    first, second = make_records(2, 150, "first"), make_records(2, 20, "second")
    topic = secured_input(secured_kafka, unique_name, first)
    recorder = BatchRecorder()
    query = start_recording(
        read_stream(
            spark,
            secured_kafka.endpoint.bootstrap_servers,
            **secured_kafka.client_options("app"),
            subscribe=topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="30",
            **{"kafkaConsumer.pollTimeoutMs": "90000", "kafka.request.timeout.ms": "60000"},
        ),
        tmp_path / "checkpoint",
        recorder,
    )
    try:
        wait_until(lambda: recorder.batches, 120, "the first batch")
        secured_kafka.kill(1)
        secured_kafka.start(1)
        produce(
            secured_kafka.endpoint.bootstrap_servers,
            topic,
            second,
            **secured_kafka.client_config(ADMIN_USER),
        )
        expected = expected_rows(topic, first + second)
        wait_until(
            lambda: recorder.all_rows() == expected or query.exception(),
            150,
            "every record after the broker's restart",
        )
        assert query.exception() is None, query.exception()
        assert query.isActive
    finally:
        query.stop()
    assert all(recorder.replays.values()), recorder.replays
    assert recorder.all_rows() == expected_rows(topic, first + second)
