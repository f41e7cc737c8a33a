"""1. replayable-kafka into a no-op sink versus one plain kafka-python consumer.

Also measured: the same source handing Spark one Python tuple per record instead of Arrow
record batches (``replayable-kafka-tuples``, registered here for the benchmark only; its
rows are built from the Arrow batches, so it slightly overstates a native tuple reader).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from benchmarks.data import VALUE_BYTES, fill_topic
from benchmarks.harness import Comparison, Figure, Report, measure, say, scaling_note
from connectors.kafka.source import ReplayableKafkaDataSource, ReplayableKafkaStreamReader
from eospack.testing import await_query

TIMEOUT = 900.0
TUPLE_SOURCE = "replayable-kafka-tuples"


class TupleOutputStreamReader(ReplayableKafkaStreamReader):
    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        for batch in super().read(partition):
            yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


class TupleOutputKafkaSource(ReplayableKafkaDataSource):
    """replayable-kafka yielding tuples: what the Python Data Source API does without Arrow."""

    @classmethod
    def name(cls) -> str:
        return TUPLE_SOURCE

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return TupleOutputStreamReader(self.kafka_options)


def read_with_spark(spark, bootstrap: str, topic: str, source: str = "replayable-kafka") -> None:
    query = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-source-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def read_with_consumer(bootstrap: str, topic: str, expected: int) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        seen = 0
        deadline = time.monotonic() + TIMEOUT
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"kafka-python read {seen} of {expected} records")
            for messages in consumer.poll(timeout_ms=500, max_records=100_000).values():
                seen += len(messages)
        if seen != expected:
            raise AssertionError(f"kafka-python read {seen} records, expected {expected}")
    finally:
        consumer.close()


def run(report: Report, spark, bootstrap: str, sizes: list[int], repetitions: int) -> None:
    spark.dataSource.register(TupleOutputKafkaSource)
    by_size: dict[int, Figure] = {}
    for size in sizes:
        topic = f"bench_source_{size}_{int(time.time())}"
        say(f"source: producing {size:,} records of {VALUE_BYTES} bytes into 4 partitions")
        fill_topic(bootstrap, topic, size)
        say("source: reading with replayable-kafka (Arrow, then tuples) and with kafka-python")
        arrow = Figure(
            "replayable-kafka",
            measure(lambda t=topic: read_with_spark(spark, bootstrap, t), repetitions),
            size,
        )
        tuples = Figure(
            "replayable-kafka, tuple output",
            measure(
                lambda t=topic: read_with_spark(spark, bootstrap, t, TUPLE_SOURCE), repetitions
            ),
            size,
        )
        plain = Figure(
            "kafka-python consumer",
            measure(lambda t=topic, n=size: read_with_consumer(bootstrap, t, n), repetitions),
            size,
        )
        report.add(
            Comparison("1. source (AvailableNow, noop sink)", f"{size:,}", arrow, plain, 1.0)
        )
        report.add(Comparison("1. source: Arrow vs tuple output", f"{size:,}", arrow, tuples))
        by_size[size] = arrow
    if len(by_size) > 1:
        report.notes.append(scaling_note("source: replayable-kafka", by_size))
