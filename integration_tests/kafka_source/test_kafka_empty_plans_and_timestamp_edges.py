"""What an adversarial review of replayable-kafka's edge reads tried through real queries
(the unit-level half is tests/test_record_batches_attacks.py): plans that hold no offsets
reached by other roads than an empty topic (a pattern matching nothing, a partition with
no records, endingOffsetsByTimestamp before every record, Trigger.AvailableNow with
maxOffsetsPerTrigger on an empty topic), with Spark's own source as the oracle where it is
on the classpath; and a record timestamp beyond Spark's range under a two-phase-commit sink,
which must fail the query in one line and leave nothing committed and nothing open. These
held; what failed (timestamp options beyond a long failing the planner with ``struct.error``)
is the last test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from eospack.connectors.kafka.client.transactions import open_transactions
from eospack.lab.services.kafka_tools import create_topic, read_all
from eospack.lab.testing import await_query

pytestmark = [pytest.mark.integration]

LONG_MAX = 2**63 - 1


def formats(spark_kafka_jars: tuple[list[Any], str | None]) -> list[str]:
    """replayable-kafka, and Spark's own source when its connector is on the classpath."""
    return ["replayable-kafka"] + ([] if spark_kafka_jars[1] else ["kafka"])


def batch_read(spark: SparkSession, fmt: str, servers: str, **options: str) -> DataFrame:
    return (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", servers)
        .options(**{"startingOffsets": "earliest", "endingOffsets": "latest", **options})
        .load()
    )


def error_text(error: BaseException) -> str:
    return str(getattr(error, "desc", None) or error)


@pytest.mark.timeout(240)
def test_plans_without_offsets_by_every_road_are_empty_dataframes(
    spark, kafka, unique_name, spark_kafka_jars
):
    servers = kafka.endpoint.bootstrap_servers
    half = f"{unique_name}_half"
    create_topic(servers, half, partitions=2)
    producer = KafkaProducer(bootstrap_servers=servers)
    for index in range(3):
        producer.send(half, b"v%d" % index, partition=0, timestamp_ms=1_700_000_000_000 + index)
    producer.flush()
    producer.close()
    roads = {
        "a pattern matching no topic": {"subscribePattern": f"{unique_name}_nothing_.*"},
        "a partition without records": {"assign": json.dumps({half: [1]})},
        "endingOffsetsByTimestamp before every record": {
            "subscribe": half,
            "endingOffsetsByTimestamp": json.dumps({half: {"0": 1_600_000_000_000, "1": 1}}),
        },
        "minPartitions over nothing": {
            "assign": json.dumps({half: [1]}),
            "minPartitions": "3",
        },
    }
    for fmt in formats(spark_kafka_jars):
        for road, options in roads.items():
            assert batch_read(spark, fmt, servers, **options).collect() == [], (fmt, road)
        assert batch_read(spark, fmt, servers, subscribe=half).count() == 3, fmt


@pytest.mark.timeout(240)
def test_available_now_with_max_offsets_on_an_empty_topic_ends_with_no_rows(
    spark, kafka, unique_name, tmp_path
):
    servers = kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=3)
    seen: list[Any] = []
    query = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", unique_name)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1")
        .option("minPartitions", "4")
        .load()
        .writeStream.foreachBatch(lambda frame, _batch: seen.extend(frame.collect()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 180)
    assert seen == []


ROWS = 30_000
"""Records of the good partition: its task is still sending when the other one fails."""


def any_timestamp_topic(servers: str, topic: str, partitions: int) -> None:
    create_topic(
        servers, topic, partitions, configs={"message.timestamp.after.max.ms": str(LONG_MAX)}
    )


@pytest.mark.timeout(300)
def test_a_timestamp_beyond_range_fails_a_2pc_kafka_query_leaving_nothing(
    spark, real_kafka, unique_name, tmp_path
):
    """Two tasks: one reads a partition of good records into its transaction, the other
    meets a record beyond Spark's range and fails the job. The query fails in one line
    naming the record; nothing of the batch is committed and no transaction of the sink
    is left open, whether the good task had prepared its piece or was stopped mid-send."""
    millis = -(10**17)
    servers = real_kafka.endpoint.bootstrap_servers
    source, out = f"{unique_name}_in", f"{unique_name}_out"
    any_timestamp_topic(servers, source, 2)
    create_topic(servers, out, partitions=2)
    producer = KafkaProducer(bootstrap_servers=servers, linger_ms=0)
    for index in range(ROWS):
        producer.send(source, b"x" * 10, key=b"k%d" % index, partition=0)
    for index in range(3):
        producer.send(source, b"fine", key=b"f%d" % index, partition=1)
    producer.flush()
    producer.send(source, b"bad", key=b"bad", partition=1, timestamp_ms=millis).get(timeout=30)
    producer.close()
    sink_id = f"ts_{unique_name[-12:]}"
    query = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("minPartitions", "2")
        .load()
        .selectExpr("key", "value")
        .writeStream.format("2pc-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", out)
        .option("ledgerTopic", f"{out}_ledger")
        .option("sinkId", sink_id)
        .option("kafka.batch.size", "16384")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as failed:
        await_query(query, 240)
    named = f"Record {source}-1 at offset 3 has timestamp {millis} ms, outside what Spark's"
    text = error_text(failed.value)
    assert named in text
    line = next(line for line in text.splitlines() if named in line)
    assert "fix the producer's timestamps" in line
    assert read_all(servers, out, isolation_level="read_committed") == []
    print("records the failed batch sent (aborted):", len(read_all(servers, out)))
    config = {"bootstrap_servers": servers}
    assert open_transactions(config, f"eospack-{sink_id}-") == []
    assert open_transactions(config, f"eospack-ledger-{sink_id}") == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "option",
    [
        {"startingTimestamp": str(2**63)},
        {"endingTimestamp": "99999999999999999999999"},
        {"startingOffsetsByTimestamp": json.dumps({"{topic}": {"0": 2**64}})},
        {"endingOffsetsByTimestamp": json.dumps({"{topic}": {"0": 2**63}})},
    ],
    ids=lambda option: next(iter(option)),
)
def test_a_timestamp_option_beyond_a_long_is_refused_in_one_line(kafka, unique_name, option):
    """Kafka's ListOffsets carries a long: the planner failed with kafka-python's
    ``struct.error: int too large to convert`` (naming no option). Spark's source refuses
    such a value when it parses the option."""
    from eospack.connectors.kafka.errors import KafkaSourceOptionError
    from eospack.connectors.kafka.source.data_source import ReplayableKafkaBatchReader
    from eospack.connectors.kafka.source.options import parse_options

    servers = kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=1)
    ((name, value),) = option.items()
    options = {
        "kafka.bootstrap.servers": servers,
        "subscribe": unique_name,
        name.lower(): value.replace("{topic}", unique_name),
    }
    with pytest.raises(KafkaSourceOptionError, match=f"^Option {name} "):
        ReplayableKafkaBatchReader(parse_options(options)).partitions()
