"""replayable-kafka at the edges of what a read can meet, with Spark's own source as the
oracle where it is on the classpath: a read whose plan holds no offsets at all (an empty
topic, startingOffsets equal to endingOffsets), and record timestamps at and beyond what
Spark's TimestampType holds (microseconds in a long, i.e. about +-292,000 years).

Spark's source converts a record's CreateTime with ``Math.multiplyExact(millis, 1000)``:
beyond the range it fails the task ("long overflow"). replayable-kafka failed nowhere and
read a wrapped instant (CreateTime -1e17 ms as year -244134, 2**62 ms as 1970); now it fails
the task in one line that names the record. Before 1582-10-15 Spark's source also moves the
instant by its Julian-calendar rebase (``DateTimeUtils.fromJavaTimestamp``, in the executor
JVM's time zone); replayable-kafka keeps the instant Kafka stored (docs/connectors).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from eospack.connectors.kafka.records.record_batches import MAX_TIMESTAMP_MILLIS
from eospack.lab.services.kafka_tools import create_topic, end_offsets
from eospack.lab.testing import await_query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LONG_MAX = 2**63 - 1
GREGORIAN_SINCE_MS = -12_219_292_800_000
"""1582-10-15T00:00:00Z: from here on Spark's source applies no calendar rebase."""


def read(spark: SparkSession, fmt: str, servers: str, topic: str, **options: str) -> DataFrame:
    return (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .options(**{"startingOffsets": "earliest", "endingOffsets": "latest", **options})
        .load()
    )


def formats(spark_kafka_jars: tuple[list[Any], str | None]) -> list[str]:
    """replayable-kafka, and Spark's own source when its connector is on the classpath."""
    return ["replayable-kafka"] + ([] if spark_kafka_jars[1] else ["kafka"])


def test_a_batch_read_that_plans_no_offsets_is_an_empty_dataframe(
    spark, kafka, unique_name, spark_kafka_jars
):
    """PySpark reads one placeholder partition when ``partitions()`` is empty; the reader
    failed on it with AssertionError. Spark's own source returns an empty DataFrame."""
    servers = kafka.endpoint.bootstrap_servers
    empty, filled = f"{unique_name}_empty", f"{unique_name}_filled"
    create_topic(servers, empty, partitions=2)
    create_topic(servers, filled, partitions=1)
    producer = KafkaProducer(bootstrap_servers=servers)
    for index in range(3):
        producer.send(filled, b"v%d" % index, partition=0).get(timeout=30)
    producer.close()
    end = end_offsets(servers, filled)[0]
    same = json.dumps({filled: {"0": end}})
    for fmt in formats(spark_kafka_jars):
        assert read(spark, fmt, servers, empty).collect() == []
        assert read(spark, fmt, servers, empty, minPartitions="4").count() == 0
        frame = read(spark, fmt, servers, filled, startingOffsets=same, endingOffsets=same)
        assert frame.collect() == [], fmt
        assert read(spark, fmt, servers, filled).count() == 3, fmt


def test_a_stream_over_an_empty_topic_ends_with_no_rows(spark, kafka, unique_name, tmp_path):
    servers = kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=2)
    seen: list[Any] = []
    await_query(stream_all(spark, servers, unique_name, tmp_path, seen), 120)
    assert seen == []


def stream_all(
    spark: SparkSession, servers: str, topic: str, tmp_path: Any, seen: list[Any]
) -> StreamingQuery:
    """An AvailableNow query over ``topic`` from earliest, collecting its rows into ``seen``."""
    return (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(lambda frame, _batch: seen.extend(frame.collect()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


def produce_timestamps(servers: str, topic: str, timestamps_ms: list[int]) -> None:
    """One record per timestamp into partition 0, each its own batch, values ``t<index>``."""
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=0)
    try:
        for index, timestamp in enumerate(timestamps_ms):
            producer.send(topic, b"t%d" % index, partition=0, timestamp_ms=timestamp).get(
                timeout=30
            )
    finally:
        producer.close()


def any_timestamp_topic(servers: str, topic: str) -> None:
    """A topic that takes CreateTimes far in the future too (Kafka 4 refuses more than an
    hour ahead by default)."""
    create_topic(servers, topic, configs={"message.timestamp.after.max.ms": str(LONG_MAX)})


def micros(frame: DataFrame) -> list[tuple[int, int]]:
    rows = frame.selectExpr("offset", "unix_micros(timestamp) AS micros").collect()
    return sorted((row.offset, row.micros) for row in rows)


def test_timestamps_at_the_edges_of_sparks_range_read_as_spark_reads_them(
    spark_kafka, real_kafka, unique_name
):
    servers = real_kafka.endpoint.bootstrap_servers
    any_timestamp_topic(servers, unique_name)
    edges = [MAX_TIMESTAMP_MILLIS, 253_402_300_800_000, GREGORIAN_SINCE_MS, -1, 0]
    produce_timestamps(servers, unique_name, edges)
    ours = micros(read(spark_kafka, "replayable-kafka", servers, unique_name))
    assert ours == [(offset, millis * 1000) for offset, millis in enumerate(edges)]
    assert ours == micros(read(spark_kafka, "kafka", servers, unique_name))


def error_text(error: BaseException) -> str:
    return str(getattr(error, "desc", None) or error)


@pytest.mark.parametrize("millis", [-(10**17), MAX_TIMESTAMP_MILLIS + 1, 2**62])
def test_a_timestamp_beyond_sparks_range_fails_the_read_as_sparks_source_does(
    spark, real_kafka, unique_name, spark_kafka_jars, tmp_path, millis
):
    """Batch and streaming fail in one line naming the record and its value."""
    servers = real_kafka.endpoint.bootstrap_servers
    any_timestamp_topic(servers, unique_name)
    produce_timestamps(servers, unique_name, [0, millis, 5])
    named = f"Record {unique_name}-0 at offset 1 has timestamp {millis} ms, outside what Spark's"

    with pytest.raises(Exception) as raised:
        read(spark, "replayable-kafka", servers, unique_name).collect()
    assert named in error_text(raised.value)
    line = next(line for line in error_text(raised.value).splitlines() if named in line)
    assert "fix the producer's timestamps" in line
    if "kafka" in formats(spark_kafka_jars):
        with pytest.raises(Exception, match="long overflow"):
            read(spark, "kafka", servers, unique_name).collect()

    seen: list[Any] = []
    with pytest.raises(StreamingQueryException) as failed:
        await_query(stream_all(spark, servers, unique_name, tmp_path, seen), 120)
    assert named in error_text(failed.value)
    assert seen == []

    # As the message advises: starting past the record reads on.
    after = json.dumps({unique_name: {"0": 2}})
    assert micros(read(spark, "replayable-kafka", servers, unique_name, startingOffsets=after)) == [
        (2, 5000)
    ]
