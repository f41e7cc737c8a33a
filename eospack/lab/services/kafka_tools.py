"""Topic and record helpers for tests, the demo and benchmarks, on Apache Kafka or tansu.

Why sealing: tansu answers ListOffsets(latest) with the base offset of a partition's
last record batch + 1. On tansu ``produce_sealed`` therefore sends each partition's last
record alone, so the reported end offset is exact; on Apache Kafka, which reports end
offsets correctly, it just produces batched. The product itself does not work around
tansu: it speaks the Kafka protocol.

The admin helpers (partitions, record deletion, topic deletion, compacted topics) and
transactions need Apache Kafka: tansu lacks CreatePartitions and DeleteRecords and
ignores read_committed.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import TopicAlreadyExistsError

from eospack.lab.services.base import broker_kind


@dataclass(frozen=True)
class Record:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


def _admin(bootstrap_servers: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=10_000)


def create_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int = 1,
    configs: Mapping[str, str] | None = None,
) -> None:
    """Create ``topic`` (with topic ``configs``) and wait until its metadata shows every
    partition. An existing topic is left as it is."""
    admin = _admin(bootstrap_servers)
    try:
        admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=partitions,
                    replication_factor=1,
                    topic_configs=dict(configs or {}),
                )
            ]
        )
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
    wait_for_partitions(bootstrap_servers, topic, partitions)


def create_compacted_topic(
    bootstrap_servers: str, topic: str, partitions: int = 1, segment_ms: int = 100
) -> None:
    """A ``cleanup.policy=compact`` topic whose segments roll every ``segment_ms`` and are
    compacted as soon as the cleaner looks (about every second on the embedded broker).

    Kafka never compacts the active segment: records become compactable once a later
    append rolls the segment they are in (after ``segment_ms``).
    """
    create_topic(
        bootstrap_servers,
        topic,
        partitions,
        configs={
            "cleanup.policy": "compact",
            "segment.ms": str(segment_ms),
            "min.cleanable.dirty.ratio": "0.001",
            "min.compaction.lag.ms": "0",
            "max.compaction.lag.ms": str(max(segment_ms, 1_000)),
            "delete.retention.ms": "100",
            "file.delete.delay.ms": "100",
        },
    )


def add_partitions(bootstrap_servers: str, topic: str, total_partitions: int) -> None:
    """Grow ``topic`` to ``total_partitions`` (CreatePartitions; Apache Kafka only)."""
    admin = _admin(bootstrap_servers)
    try:
        admin.create_partitions({topic: NewPartitions(total_count=total_partitions)})
    finally:
        admin.close()
    wait_for_partitions(bootstrap_servers, topic, total_partitions)


def delete_records(bootstrap_servers: str, topic: str, before: Mapping[int, int]) -> None:
    """Delete each partition's records below the offset ``before[partition]``
    (DeleteRecords; Apache Kafka only). Afterwards the partition's beginning offset is
    that offset; -1 deletes up to the end offset."""
    admin = _admin(bootstrap_servers)
    try:
        admin.delete_records(
            {TopicPartition(topic, partition): offset for partition, offset in before.items()}
        )
    finally:
        admin.close()


def delete_topic(bootstrap_servers: str, topic: str, timeout: float = 20.0) -> None:
    """Delete ``topic`` and wait until metadata no longer lists it."""
    admin = _admin(bootstrap_servers)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + timeout
        while topic in admin.list_topics():
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} was still listed {timeout} s after deletion")
            time.sleep(0.05)
    finally:
        admin.close()


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
    bootstrap_servers: str,
    topic: str,
    records: Iterable[Record],
    seal: bool | None = None,
    **producer_config: object,
) -> dict[int, int]:
    """Produce ``records`` in order per partition; return the count sent per partition.

    Sealed (for tansu): all but each partition's last record go batched; the last ones
    follow one at a time, each acknowledged before the next, so every partition ends with
    a one-record batch. Unsealed: everything batched, then flushed. ``seal=None`` seals
    unless this process started the broker at ``bootstrap_servers`` and it is Apache Kafka
    (``KafkaEndpoint.kind``); brokers started elsewhere are sealed, which is correct on
    any broker, only slower. Every record is acknowledged when this returns; a failed
    send raises.
    """
    if seal is None:
        seal = broker_kind(bootstrap_servers) != "kafka"
    producer = KafkaProducer(
        bootstrap_servers=bootstrap_servers, **{"linger_ms": 5, "acks": 1, **producer_config}
    )
    failures: list[BaseException] = []
    try:
        if seal:
            counts = _produce_sealed(producer, topic, records, failures)
        else:
            counts = defaultdict(int)
            for record in records:
                _send(producer, topic, record, failures)
                counts[record.partition] += 1
            producer.flush()
    finally:
        producer.close()
    if failures:
        raise failures[0]
    return dict(counts)


def _produce_sealed(
    producer: KafkaProducer,
    topic: str,
    records: Iterable[Record],
    failures: list[BaseException],
) -> dict[int, int]:
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        by_partition[record.partition].append(record)
    for partition_records in by_partition.values():
        for record in partition_records[:-1]:
            _send(producer, topic, record, failures)
    producer.flush()
    for partition_records in by_partition.values():
        _send(producer, topic, partition_records[-1], failures).get(timeout=30)
    return {partition: len(rows) for partition, rows in by_partition.items()}


def _send(producer: KafkaProducer, topic: str, record: Record, failures: list[BaseException]):
    future = producer.send(
        topic,
        key=record.key,
        value=record.value,
        partition=record.partition,
        headers=list(record.headers) or None,
    )
    future.add_errback(failures.append)
    return future


def transactional_producer(
    bootstrap_servers: str, transactional_id: str | None = None, **producer_config: object
) -> KafkaProducer:
    """A KafkaProducer with ``transactional_id`` (a fresh one by default), its transactions
    initialised: call ``begin_transaction``, send, then ``commit_transaction`` or
    ``abort_transaction``; ``close()`` it when done."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap_servers,
        transactional_id=transactional_id or f"eospack-test-{uuid.uuid4().hex}",
        **producer_config,
    )
    try:
        producer.init_transactions()
    except BaseException:
        producer.close()
        raise
    return producer


def produce_transaction(
    bootstrap_servers: str,
    topic: str,
    records: Iterable[Record],
    commit: bool = True,
    transactional_id: str | None = None,
) -> dict[int, int]:
    """Produce ``records`` in one transaction, then commit it (or abort it when ``commit``
    is False); return the count sent per partition. Each partition's commit or abort
    marker takes one offset after the records, so end offsets move one past the last
    record."""
    producer = transactional_producer(bootstrap_servers, transactional_id)
    failures: list[BaseException] = []
    counts: dict[int, int] = defaultdict(int)
    try:
        producer.begin_transaction()
        for record in records:
            _send(producer, topic, record, failures)
            counts[record.partition] += 1
        producer.flush()
        if failures:
            producer.abort_transaction()
            raise failures[0]
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    finally:
        producer.close()
    return dict(counts)


def end_offsets(
    bootstrap_servers: str,
    topic: str,
    isolation_level: str = "read_uncommitted",
    client: Mapping[str, Any] | None = None,
) -> dict[int, int]:
    """Each partition's end offset; with ``read_committed``, the last stable offset (the
    first offset of a still-open transaction, if any). ``client``: kafka-python settings
    (a secured cluster's)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap_servers, isolation_level=isolation_level, **(client or {})
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {tp.partition: offset for tp, offset in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def read_all(
    bootstrap_servers: str,
    topic: str,
    timeout: float = 30.0,
    isolation_level: str = "read_uncommitted",
    client: Mapping[str, Any] | None = None,
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Read every record up to the current end offsets: (partition, offset, key, value).

    ``read_committed`` skips records of aborted transactions and stops at open ones.
    ``client``: kafka-python settings (a secured cluster's).
    """
    ends = end_offsets(bootstrap_servers, topic, isolation_level, client)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        isolation_level=isolation_level,
        **(client or {}),
    )
    rows: list[tuple[int, int, bytes | None, bytes | None]] = []
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


def consumer_group_lag_by_kafka_tool(bootstrap_servers: str, group: str) -> dict[int, int]:
    """The LAG column of ``kafka-consumer-groups.sh --describe --group <group>`` per
    partition, from Apache Kafka's own tool (``ConsumerGroupCommand``, in the broker's
    Maven jars): what a user's lag check reads. Apache Kafka only."""
    import subprocess

    from eospack.lab.services.apache_kafka import java_executable
    from eospack.lab.services.maven import resolve_classpath

    classpath = ":".join(str(jar) for jar in resolve_classpath("kafka-broker"))
    command = [java_executable(), "-cp", classpath]
    command += ["org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"]
    command += ["--bootstrap-server", bootstrap_servers, "--describe", "--group", group]
    described = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    lag: dict[int, int] = {}
    lines = [line.split() for line in described.stdout.splitlines() if line.strip()]
    header = next(line for line in lines if "LAG" in line and "PARTITION" in line)
    for line in lines[lines.index(header) + 1 :]:
        row = dict(zip(header, line, strict=False))
        if row.get("GROUP") == group:
            lag[int(row["PARTITION"])] = int(row["LAG"])
    return lag
