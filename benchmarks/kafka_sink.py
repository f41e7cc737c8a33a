"""9. 2pc-kafka exactly-once versus its own at-least-once mode and Spark's Kafka sink.

The same stream (Parquet files, one micro-batch of 100,000 rows each, two write tasks per
batch) goes into a new two-partition topic per repetition, as records with a string key
and value: through 2pc-kafka with ``deliveryGuarantee=exactly-once`` (a Kafka transaction
per task, committed by the driver), with ``at-least-once`` (the same producer without
transactions), and through Spark's own ``format("kafka")`` (the JVM producer,
at-least-once; jars of the ``spark-kafka`` set). Goal: exactly-once costs at most 15% of
at-least-once. The record count of each topic is checked once per contender.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from benchmarks.data import parquet_directory, parquet_stream
from benchmarks.harness import Comparison, Figure, Report, measure, say
from eospack.services.kafka_tools import create_topic
from eospack.testing import await_query

TIMEOUT = 900.0


def write(spark: Any, directory: Path, bootstrap: str, topic: str, options: dict[str, str]) -> None:
    sink = options.pop("format", "2pc-kafka")
    query = (
        parquet_stream(spark, directory)
        .repartition(2)
        .selectExpr("CAST(id AS STRING) AS key", "name AS value")
        .writeStream.format(sink)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .options(**options)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-kafka-sink-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def committed_records(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees (end offsets minus transaction markers)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        group_id=None,
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
        max_poll_records=50_000,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        return sum(1 for _ in consumer)
    finally:
        consumer.close()


def contender(
    spark: Any,
    directory: Path,
    bootstrap: str,
    label: str,
    rows: int,
    repetitions: int,
    options: dict[str, str],
) -> Figure:
    topics: list[str] = []

    def new_topic() -> None:
        topics.append(f"bench-kafka-sink-{time.time_ns()}")
        create_topic(bootstrap, topics[-1], 2)

    say(f"kafka sink: {label}")
    seconds = measure(
        lambda: write(spark, directory, bootstrap, topics[-1], dict(options)),
        repetitions,
        setup=new_topic,
    )
    found = committed_records(bootstrap, topics[-1])
    if found != rows:
        raise RuntimeError(f"{label} wrote {found:,} records, expected {rows:,}")
    return Figure(label, seconds, rows, "records/s")


def run(
    report: Report,
    spark: Any,
    bootstrap: str,
    workdir: Path,
    rows: int,
    repetitions: int,
    spark_kafka: bool,
) -> None:
    """``spark_kafka``: the session has the jars of Spark's own Kafka connector."""
    directory = parquet_directory(workdir / f"kafka-sink-rows-{rows}", rows)
    size = f"{rows:,} records"
    exactly_once = contender(
        spark, directory, bootstrap, "2pc-kafka exactly-once", rows, repetitions, {}
    )
    at_least_once = contender(
        spark,
        directory,
        bootstrap,
        "2pc-kafka at-least-once",
        rows,
        repetitions,
        {"deliveryGuarantee": "at-least-once"},
    )
    report.add(
        Comparison(
            "9. kafka sink: exactly-once vs its at-least-once",
            size,
            exactly_once,
            at_least_once,
            0.85,
        )
    )
    if spark_kafka:
        spark_sink = contender(
            spark,
            directory,
            bootstrap,
            "Spark's Kafka sink",
            rows,
            repetitions,
            {"format": "kafka"},
        )
        report.add(
            Comparison("9. kafka sink vs Spark's Kafka sink", size, exactly_once, spark_sink)
        )
    else:
        report.notes.append("kafka sink: Spark's Kafka sink left out (spark-kafka jars missing)")
