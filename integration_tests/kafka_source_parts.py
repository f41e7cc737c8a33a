"""Shared by the replayable-kafka integration tests: records, expected rows, stream readers
and runs that record each micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamReader, StreamingQuery

from eospack.lab.services.kafka_tools import (
    Record,
)
from eospack.lab.testing import await_query

FORMAT = "replayable-kafka"


# A hung read fails in seconds instead of Spark's 120 s default.
FAST_FAIL = {"kafkaConsumer.pollTimeoutMs": "15000"}


def servers_of(kafka: Any) -> str:
    return kafka.endpoint.bootstrap_servers


def make_records(partitions: int, per_partition: int, tag: str = "v") -> list[Record]:
    return [
        Record(p, f"k{p}-{i}".encode(), f"{tag}{p}-{i}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]


def read_stream(spark: SparkSession, servers: str, **options: str) -> DataStreamReader:
    reader = spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", servers)
    return reader.options(**FAST_FAIL).options(**options)


def keyed_rows(df: DataFrame) -> list[tuple[str, int, int, bytes]]:
    return sorted(
        (r.topic, r.partition, r.offset, bytes(r.value))
        for r in df.select("topic", "partition", "offset", "value").collect()
    )


def expected_rows(topic: str, records: list[Record]) -> list[tuple[str, int, int, bytes]]:
    next_offset: dict[int, int] = {}
    rows = []
    for record in records:
        offset = next_offset.get(record.partition, 0)
        next_offset[record.partition] = offset + 1
        assert record.value is not None
        rows.append((topic, record.partition, offset, record.value))
    return sorted(rows)


def start_recording(
    stream: DataStreamReader, checkpoint: Path, recorder: BatchRecorder
) -> StreamingQuery:
    """A long-running query (200 ms trigger) that hands every batch to ``recorder``."""
    return (
        stream.load()
        .writeStream.foreachBatch(recorder)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def run_available_now(
    stream: DataStreamReader,
    checkpoint: Path,
    on_batch: Callable[[DataFrame, int], None],
    timeout: float = 90,
) -> StreamingQuery:
    query = (
        stream.load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, timeout)
    return query


class BatchRecorder:
    """foreachBatch target keyed by batch id: a replayed batch is compared, not appended."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple[str, int, int, bytes]]] = {}
        self.replays: dict[int, bool] = {}

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = keyed_rows(df)
        if batch_id in self.batches:
            self.replays[batch_id] = self.batches[batch_id] == rows
        self.batches[batch_id] = rows

    def all_rows(self) -> list[tuple[str, int, int, bytes]]:
        return sorted(row for rows in self.batches.values() for row in rows)

    def sizes(self) -> list[int]:
        return [len(self.batches[b]) for b in sorted(self.batches)]
