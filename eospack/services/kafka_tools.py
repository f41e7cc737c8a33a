"""Topic creation and a *sealing* producer for tests, the demo and benchmarks.

Why sealing: the embedded broker (tansu) answers ListOffsets(latest) with the base
offset of a partition's last record batch + 1. ``produce_sealed`` therefore sends each
partition's last record alone, so the reported end offset is exact. The product itself
does not work around this: real Kafka reports end offsets correctly.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import TopicAlreadyExistsError


@dataclass(frozen=True)
class Record:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


def create_topic(bootstrap_servers: str, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` and wait until its metadata shows every partition."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    wait_for_partitions(bootstrap_servers, topic, partitions)


def add_partitions(bootstrap_servers: str, topic: str, total_partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000)
    try:
        admin.create_partitions({topic: NewPartitions(total_count=total_partitions)})
    finally:
        admin.close()
    wait_for_partitions(bootstrap_servers, topic, total_partitions)


def wait_for_partitions(
    bootstrap_servers: str, topic: str, partitions: int, timeout: float = 20.0
) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            consumer._client.cluster.request_update()
            known = consumer.partitions_for_topic(topic) or set()
            if len(known) >= partitions:
                return
            time.sleep(0.05)
        raise TimeoutError(f"topic {topic} did not show {partitions} partitions in {timeout} s")
    finally:
        consumer.close()


def produce_sealed(
    bootstrap_servers: str, topic: str, records: Iterable[Record], **producer_config: object
) -> dict[int, int]:
    """Produce ``records`` in order per partition; return the count sent per partition.

    All but each partition's last record go batched; the last ones follow one at a time,
    each acknowledged before the next, so every partition ends with a one-record batch.
    """
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        by_partition[record.partition].append(record)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap_servers, **{"linger_ms": 5, "acks": 1, **producer_config}
    )
    try:
        for partition_records in by_partition.values():
            for record in partition_records[:-1]:
                _send(producer, topic, record)
        producer.flush()
        for partition_records in by_partition.values():
            _send(producer, topic, partition_records[-1]).get(timeout=30)
    finally:
        producer.close()
    return {partition: len(rows) for partition, rows in by_partition.items()}


def _send(producer: KafkaProducer, topic: str, record: Record):
    return producer.send(
        topic,
        key=record.key,
        value=record.value,
        partition=record.partition,
        headers=list(record.headers) or None,
    )


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def read_all(
    bootstrap_servers: str, topic: str, timeout: float = 30.0
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Read every record up to the current end offsets: (partition, offset, key, value)."""
    ends = end_offsets(bootstrap_servers, topic)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    rows = []
    try:
        partitions = [TopicPartition(topic, p) for p in ends]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp.partition] for tp in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end offsets {ends}")
            for tp, messages in consumer.poll(timeout_ms=200).items():
                rows.extend((tp.partition, m.offset, m.key, m.value) for m in messages)
    finally:
        consumer.close()
    return sorted(rows)
