"""replayable-kafka's ``commitOffsetsToGroup``: each committed batch's end offsets reach the
consumer group (what lag tools read); the group is never read back (deleted and moved while
the query is down, the restarted query reads exactly what its checkpoint says); a group the
broker refuses (one with an active member) never fails the query.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import RetriableError
from kafka.structs import OffsetAndMetadata

from eospack.connectors.kafka.client.group_offsets import COMMIT_METADATA
from eospack.lab.services.kafka_tools import create_topic, end_offsets, produce_sealed
from eospack.lab.testing import wait_until
from integration_tests.kafka_source_parts import (
    BatchRecorder,
    expected_rows,
    make_records,
    read_stream,
    servers_of,
    start_recording,
)

pytestmark = pytest.mark.integration


def listed_offsets(servers: str, group: str) -> dict[TopicPartition, OffsetAndMetadata]:
    """The group's committed offsets; none while the coordinator is not ready (a fresh broker
    answers COORDINATOR_NOT_AVAILABLE while it creates its offsets topic, then
    COORDINATOR_LOAD_IN_PROGRESS while it loads the group's partition): the caller asks again."""
    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10_000)
    try:
        return dict(admin.list_group_offsets({group: None}).get(group, {}))
    except RetriableError:
        return {}
    finally:
        admin.close()


def group_offsets(servers: str, group: str) -> dict[int, tuple[int, str]]:
    found = listed_offsets(servers, group)
    return {tp.partition: (om.offset, om.metadata) for tp, om in found.items()}


def committed(servers: str, topic: str) -> dict[int, tuple[int, str]]:
    return {p: (end, COMMIT_METADATA) for p, end in end_offsets(servers, topic).items()}


@pytest.mark.timeout(240)
def test_group_offsets_follow_committed_batches_and_never_drive_recovery(
    spark: Any, kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    servers, topic, group = servers_of(kafka), unique_name, f"{unique_name}-lag"
    create_topic(servers, topic, partitions=2)
    checkpoint = tmp_path / "checkpoint"
    stream = read_stream(
        spark, servers, subscribe=topic, startingOffsets="earliest", commitOffsetsToGroup=group
    )
    first, second = make_records(2, 15, "a"), make_records(2, 10, "b")
    produce_sealed(servers, topic, first)
    recorder = BatchRecorder()
    query = start_recording(stream, checkpoint, recorder)
    try:
        wait_until(lambda: len(recorder.all_rows()) == 30, 120, "the first 30 rows")
        wait_until(
            lambda: group_offsets(servers, group) == committed(servers, topic),
            30,
            "the group at the batch end offsets",
            0.5,
        )
        produce_sealed(servers, topic, second)
        wait_until(lambda: len(recorder.all_rows()) == 50, 60, "50 rows")
        wait_until(
            lambda: group_offsets(servers, group) == committed(servers, topic),
            30,
            "the group at the batch end offsets",
            0.5,
        )
    finally:
        query.stop()
    assert recorder.all_rows() == expected_rows(topic, first + second)

    # While the query is down: the group is deleted, then given offsets that would re-read
    # partition 0 and skip partition 1 if anything read them; new records arrive.
    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10_000)
    try:
        admin.delete_groups([group])
        admin.alter_group_offsets(
            group,
            {
                TopicPartition(topic, 0): OffsetAndMetadata(0, "", None),
                TopicPartition(topic, 1): OffsetAndMetadata(40, "", None),
            },
        )
    finally:
        admin.close()
    third = make_records(2, 5, "c")
    produce_sealed(servers, topic, third)
    restarted = BatchRecorder()
    query = start_recording(stream, checkpoint, restarted)
    try:
        wait_until(lambda: len(restarted.all_rows()) >= 10, 120, "the 10 new rows")
        wait_until(
            lambda: group_offsets(servers, group) == committed(servers, topic),
            30,
            "the group at the batch end offsets",
            0.5,
        )
    finally:
        query.stop()
    every = expected_rows(topic, first + second + third)
    assert restarted.all_rows() == [row for row in every if row[3].startswith(b"c")]


@pytest.mark.timeout(240)
def test_a_group_the_broker_refuses_never_fails_the_query(
    spark: Any, kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """A group with an active member refuses a group-less commit (UNKNOWN_MEMBER_ID or
    similar): the query reads every row once, and the member's offsets stay its own."""
    servers, topic, group = servers_of(kafka), unique_name, f"{unique_name}-busy"
    other = f"{unique_name}_other"
    create_topic(servers, topic, partitions=1)
    create_topic(servers, other, partitions=1)
    member = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False)
    # Joined before its metadata knew the topic, the member was assigned nothing and kept
    # waiting (a CI run timed out so): it subscribes once the topic's partitions are known.
    wait_until(lambda: member.partitions_for_topic(other), 60, f"metadata of {other}")
    member.subscribe([other])
    stop = threading.Event()

    def keep_membership() -> None:
        while not stop.is_set():
            member.poll(timeout_ms=200)

    thread = threading.Thread(target=keep_membership, daemon=True)
    thread.start()
    try:
        wait_until(lambda: bool(member.assignment()), 60, "the member to join its group")
        records = make_records(1, 20)
        produce_sealed(servers, topic, records)
        recorder = BatchRecorder()
        stream = read_stream(
            spark, servers, subscribe=topic, startingOffsets="earliest", commitOffsetsToGroup=group
        )
        query = start_recording(stream, tmp_path / "checkpoint", recorder)
        try:
            wait_until(lambda: len(recorder.all_rows()) == 20, 120, "20 rows")
            produce_sealed(servers, topic, make_records(1, 5, "late"))
            wait_until(lambda: len(recorder.all_rows()) == 25, 60, "25 rows")
            assert query.isActive and query.exception() is None
        finally:
            query.stop()
        assert recorder.all_rows() == expected_rows(topic, records + make_records(1, 5, "late"))
        assert topic not in {tp.topic for tp in listed_offsets(servers, group)}
    finally:
        stop.set()
        thread.join(10)
        member.close()
