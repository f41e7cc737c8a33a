"""Spark's own Kafka source (``format("kafka")``) as the oracle of replayable-kafka.

One topic holds what makes Kafka reading hard: several partitions, offsets removed by
compaction, committed and aborted transactions (their markers take offsets), transactions
interleaved with plain records, headers (with null values), null keys and null values. Both
sources read it in the same Spark session with the same options, in batch and as an
AvailableNow stream under maxOffsetsPerTrigger; the test asserts the same rows (key, value,
topic, partition, offset, timestamp, timestampType, headers), and in streaming the same rows
per micro-batch, hence the same offset ranges per batch.

Both read with ``kafka.isolation.level=read_committed``: Spark's default is
read_uncommitted, replayable-kafka's read_committed. Needs Apache Kafka (transactions,
compaction) and Spark's Kafka connector on the session's classpath (``spark_kafka``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType
from pyspark.sql import DataFrame, SparkSession

from eospack.lab.services.kafka_tools import (
    Record,
    create_compacted_topic,
    end_offsets,
    produce_sealed,
    read_all,
    transactional_producer,
)
from eospack.lab.testing import await_query, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 3
COLUMNS = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
)

# The options both sources get, beside the subscription and the offsets.
COMMON_OPTIONS = {
    "includeHeaders": "true",
    "kafka.isolation.level": "read_committed",
    "kafkaConsumer.pollTimeoutMs": "20000",
}

Row = tuple[Any, ...]


def compacted_then_transactional_topic(servers: str, topic: str) -> None:
    """Fill ``topic``:

    1. Compaction: keyed records and tombstones, compacted until every partition has gaps.
    2. The topic is switched to ``cleanup.policy=delete``, so nothing changes it any more.
    3. Transactions: committed, aborted, and both interleaved with plain records; plain
       records with null keys, null values (both at once too) and headers.

    Plain records go through librdkafka: kafka-python refuses null header values and records
    whose key and value are both null, which Kafka and other clients allow.
    """
    create_compacted_topic(servers, topic, partitions=PARTITIONS)
    plain = LibrdkafkaProducer(servers)
    for index in range(120):
        value = None if index % 12 == 5 and index > 60 else b"round-%d" % index
        headers = [("round", b"%d" % (index // 12)), ("none", None)] if index % 4 == 0 else None
        plain.send(topic, index % PARTITIONS, b"key-%d" % (index % 12), value, headers)
    plain.flush()
    wait_until(lambda: _compacted(servers, topic, 120), 90, "compaction of every partition", 0.5)
    _stop_compaction(servers, topic)
    wait_until(_stable(servers, topic), 60, "the topic to stop changing", poll=1.5)

    committed = transactional_producer(servers)
    aborted = transactional_producer(servers)
    try:
        committed.begin_transaction()
        aborted.begin_transaction()
        for index in range(60):
            partition = 0 if index % 4 == 0 else index % PARTITIONS  # uneven partitions
            key = None if index % 7 == 0 else b"tx-%d" % index
            headers = [("tx", b"committed")] if index % 3 == 0 else None
            committed.send(
                topic, key=key, value=b"committed-%d" % index, partition=partition, headers=headers
            )
            aborted.send(topic, key=key, value=b"aborted-%d" % index, partition=partition)
            if index % 10 == 0:
                plain.send(topic, partition, None, None)
                plain.send(topic, partition, b"plain", b"between-%d" % index, [("h", b"")])
                plain.send(topic, partition, None, b"no key")
                plain.flush()
            if index == 30:
                committed.flush()
                aborted.flush()
        committed.commit_transaction()
        aborted.abort_transaction()
        for round_ in range(3):
            committed.begin_transaction()
            for partition in range(PARTITIONS):
                committed.send(topic, key=b"later", value=b"later-%d" % round_, partition=partition)
            if round_ == 1:
                committed.abort_transaction()
            else:
                committed.commit_transaction()
        for partition in range(PARTITIONS):
            plain.send(topic, partition, b"last", b"last")
        plain.flush()
    finally:
        committed.close()
        aborted.close()


class LibrdkafkaProducer:
    """confluent-kafka's Producer with idempotence (send order is offset order per partition);
    ``flush`` raises if any record failed."""

    def __init__(self, servers: str) -> None:
        from confluent_kafka import Producer

        self.failures: list[str] = []
        self.producer = Producer(
            {"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 5}
        )

    def send(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None = None,
    ) -> None:
        self.producer.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=headers,
            on_delivery=self._delivered,
        )
        self.producer.poll(0)

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is not None:
            self.failures.append(str(error))

    def flush(self) -> None:
        remaining = self.producer.flush(30)
        assert remaining == 0 and not self.failures, (remaining, self.failures[:3])


def _compacted(servers: str, topic: str, written: int) -> bool:
    """True once every partition lost offsets to compaction. Each call appends one record per
    partition: Kafka compacts only segments that a later append rolled."""
    produce_sealed(servers, topic, [Record(p, b"roll", b"roll") for p in range(PARTITIONS)])
    rows = read_all(servers, topic)
    ends = end_offsets(servers, topic)
    present = {p: sum(1 for row in rows if row[0] == p) for p in range(PARTITIONS)}
    return all(present[p] < ends[p] for p in range(PARTITIONS)) and len(rows) < written


def _stop_compaction(servers: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10_000)
    try:
        admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    topic,
                    configs={"cleanup.policy": "delete", "retention.ms": "-1"},
                )
            ]
        )
    finally:
        admin.close()


def _stable(servers: str, topic: str) -> Any:
    """A condition true once two reads in a row (one poll apart) return the same records."""
    previous: list[Any] = []

    def unchanged() -> bool:
        rows = read_all(servers, topic)
        same = rows == previous
        previous[:] = rows
        return same

    return unchanged


def source(
    spark: SparkSession, streaming: bool, name: str, servers: str, topic: str, **options: str
) -> Any:
    """``format(name)`` over ``topic`` from its earliest offsets with the common options."""
    reader = spark.readStream if streaming else spark.read
    return (
        reader.format(name)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .options(**COMMON_OPTIONS)
        .options(**options)
        .load()
    )


def rows_of(frame: DataFrame) -> list[Row]:
    """The columns of COLUMNS as plain values, in (topic, partition, offset) order."""
    rows = [
        (
            None if row.key is None else bytes(row.key),
            None if row.value is None else bytes(row.value),
            row.topic,
            row.partition,
            row.offset,
            row.timestamp,
            row.timestampType,
            None
            if row.headers is None
            else tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers),
        )
        for row in frame.select(*COLUMNS).collect()
    ]
    return sorted(rows, key=lambda row: (row[2], row[3], row[4]))


def stream_batches(
    spark: SparkSession, name: str, servers: str, topic: str, checkpoint: Path, limit: int
) -> tuple[dict[int, list[Row]], list[dict[str, int]]]:
    """The rows of each non-empty micro-batch of an AvailableNow query, and the end offsets
    its progress reports for ``topic`` after each batch that read rows."""
    batches: dict[int, list[Row]] = {}

    def record(frame: DataFrame, batch_id: int) -> None:
        batches[batch_id] = rows_of(frame)

    query = (
        source(spark, True, name, servers, topic, maxOffsetsPerTrigger=str(limit))
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 240)
    ends = [
        json.loads(progress["sources"][0]["endOffset"])[topic]
        for progress in query.recentProgress
        if progress["numInputRows"] > 0
    ]
    return {batch_id: rows for batch_id, rows in batches.items() if rows}, ends


def offset_ranges(batches: dict[int, list[Row]]) -> dict[int, dict[int, tuple[int, int]]]:
    """Per batch, per partition: the lowest and highest offset read."""
    ranges: dict[int, dict[int, tuple[int, int]]] = {}
    for batch_id, rows in batches.items():
        for row in rows:
            partition, offset = row[3], row[4]
            low, high = ranges.setdefault(batch_id, {}).get(partition, (offset, offset))
            ranges[batch_id][partition] = (min(low, offset), max(high, offset))
    return ranges


def values(rows: Sequence[Row]) -> list[bytes | None]:
    return [row[1] for row in rows]


@pytest.fixture(scope="module")
def oracle_topic(kafka: Any) -> tuple[str, str]:
    """The topic both tests read (filling it takes a while: compaction is waited for)."""
    if kafka.endpoint.kind != "kafka":
        pytest.skip("needs Apache Kafka (transactions, compaction), but the broker is tansu")
    servers = kafka.endpoint.bootstrap_servers
    topic = f"oracle_{time.time_ns():x}"
    compacted_then_transactional_topic(servers, topic)
    return servers, topic


def test_batch_reads_the_same_rows_as_spark(spark_kafka, oracle_topic):
    servers, topic = oracle_topic

    ours = rows_of(
        source(spark_kafka, False, "replayable-kafka", servers, topic, endingOffsets="latest")
    )
    spark_own = rows_of(source(spark_kafka, False, "kafka", servers, topic, endingOffsets="latest"))

    assert ours == spark_own
    # the topic is what it should be: gaps, no aborted records, nulls and headers present
    assert not any(value and value.startswith(b"aborted") for value in values(ours))
    assert b"committed-59" in values(ours) and b"later-1" not in values(ours)
    assert None in values(ours) and any(row[0] is None for row in ours)
    assert any(row[7] and ("none", None) in row[7] for row in ours)
    for partition in range(PARTITIONS):
        offsets = [row[4] for row in ours if row[3] == partition]
        assert offsets != list(range(offsets[0], offsets[0] + len(offsets)))


def test_streaming_reads_the_same_batches_as_spark(spark_kafka, oracle_topic, tmp_path):
    """Same batches: the same rows in each, and the same end offsets logged after each (an
    offset range may end on a transaction marker or a compacted offset, which rows alone
    would not show)."""
    servers, topic = oracle_topic

    ours, our_ends = stream_batches(
        spark_kafka, "replayable-kafka", servers, topic, tmp_path / "ours", 60
    )
    spark_own, spark_ends = stream_batches(
        spark_kafka, "kafka", servers, topic, tmp_path / "spark", 60
    )

    assert offset_ranges(ours) == offset_ranges(spark_own)
    assert ours == spark_own
    assert our_ends == spark_ends
    assert len(ours) > 3
