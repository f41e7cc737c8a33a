"""Benchmark inputs, made once per run and shared by the contenders."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eospack.lab.services.base import broker_kind
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed

VALUE_BYTES = 100
ROWS_PER_FILE = 100_000
TABLE_SCHEMA = "id long, name string, amount double, at timestamp"
"""Spark schema of ``table_rows``."""


def fill_topic(
    bootstrap: str, topic: str, records: int, partitions: int = 4, compression: str = "none"
) -> None:
    """``records`` values of ~100 bytes, spread evenly, compressed with ``compression``
    (none, gzip, snappy, lz4, zstd) as the producer batches them.

    On Apache Kafka through librdkafka (confluent-kafka, ~10x faster than kafka-python)
    when installed; otherwise with kafka-python, each partition sealed at its end (tansu).
    """
    create_topic(bootstrap, topic, partitions)
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    if broker_kind(bootstrap) == "kafka" and find_spec("confluent_kafka") is not None:
        _fill_with_librdkafka(bootstrap, topic, records, partitions, compression, value)
        return
    produce_sealed(
        bootstrap,
        topic,
        (Record(index % partitions, None, value) for index in range(records)),
        batch_size=512 * 1024,
        linger_ms=20,
        max_request_size=8 * 1024 * 1024,
        compression_type=None if compression == "none" else compression,
    )


def _fill_with_librdkafka(
    bootstrap: str, topic: str, records: int, partitions: int, compression: str, value: bytes
) -> None:
    from confluent_kafka import Producer

    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": True,
        }
    )
    for index in range(records):
        while True:
            try:
                producer.produce(
                    topic, value=value, partition=index % partitions, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.05)
        if index % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(300)
    if remaining or failures:
        raise RuntimeError(f"{topic}: {remaining} records unsent, failures: {failures[:3]}")


def table_rows(rows: int, offset: int = 0) -> pa.Table:
    """bigint id, text name, double amount, timestamp at: a typical fact table row."""
    ids = pa.array(range(offset, offset + rows), pa.int64())
    names = pa.array([f"customer-{i % 100_000:06d}" for i in range(offset, offset + rows)])
    amounts = pa.array([i * 0.25 for i in range(offset, offset + rows)], pa.float64())
    stamps = pa.array(
        [1_700_000_000_000_000 + i * 1000 for i in range(offset, offset + rows)],
        pa.timestamp("us", tz="UTC"),
    )
    return pa.table({"id": ids, "name": names, "amount": amounts, "at": stamps})


def parquet_directory(directory: Path, rows: int, rows_per_file: int = ROWS_PER_FILE) -> Path:
    """A directory of Parquet files, one micro-batch each with ``maxFilesPerTrigger=1``."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, offset in enumerate(range(0, rows, rows_per_file)):
        size = min(rows_per_file, rows - offset)
        pq.write_table(table_rows(size, offset), directory / f"part-{index:05d}.parquet")
    return directory


def parquet_stream(spark: Any, directory: Path) -> Any:
    """A streaming DataFrame over ``parquet_directory``: one file per micro-batch."""
    return (
        spark.readStream.schema(TABLE_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
    )


def keyed_parquet_directory(directory: Path, rows: int, keys: int, files: int) -> Path:
    """``rows`` rows of (key string, value long) over ``keys`` keys in ``files`` files."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for index in range(files):
        start = index * per_file
        size = min(per_file, rows - start)
        table = pa.table(
            {
                "key": pa.array([f"k{(start + i) * 7919 % keys:06d}" for i in range(size)]),
                "value": pa.array(range(start, start + size), pa.int64()),
            }
        )
        pq.write_table(table, directory / f"part-{index:05d}.parquet")
    return directory
