"""1. replayable-kafka into a no-op sink versus Spark's own Kafka source (JVM) on the same
broker and topic, in the same run; one plain kafka-python consumer is the ceiling row.

Both Spark sources read with the same options (AvailableNow from the earliest offsets,
``kafka.isolation.level=read_committed``, the noop sink); an lz4 and a zstd topic follow.
Where the time of replayable-kafka goes is measured too: the reader alone (no Spark) on one
partition, profiled with cProfile, split into kafka-python's fetching and record decoding,
the Arrow conversion, and the rest.

Also measured at the largest size: the same source handing Spark one Python tuple per
record instead of Arrow record batches (``replayable-kafka-tuples``, registered here for
the benchmark only; its rows are built from the Arrow batches, so it slightly overstates a
native tuple reader).
"""

from __future__ import annotations

import cProfile
import importlib.util
import pstats
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kafka
import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from benchmarks.data import VALUE_BYTES, fill_topic
from benchmarks.harness import Comparison, Figure, Report, measure, say, scaling_note
from eospack.connectors.kafka import reader
from eospack.connectors.kafka.options import parse_options
from eospack.connectors.kafka.planning import OffsetRange
from eospack.connectors.kafka.source import ReplayableKafkaDataSource, ReplayableKafkaStreamReader
from eospack.testing import await_query

TIMEOUT = 900.0
TUPLE_SOURCE = "replayable-kafka-tuples"
PARTITIONS = 4
CODECS = ("lz4", "zstd")
# The options both Spark sources get (Spark's own defaults to read_uncommitted).
COMMON_OPTIONS = {"startingOffsets": "earliest", "kafka.isolation.level": "read_committed"}


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
        .options(**COMMON_OPTIONS)
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


def read_partition_without_spark(bootstrap: str, topic: str, records: int) -> int:
    """The executor's reader alone: partition 0 of ``topic`` through ``read_range``."""
    options = parse_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **COMMON_OPTIONS}
    )
    rows = sum(
        batch.num_rows for batch in reader.read_range(options, OffsetRange(topic, 0, 0, records))
    )
    if rows != records:
        raise AssertionError(f"read_range read {rows} records of {topic}-0, expected {records}")
    return rows


def librdkafka_consumer(bootstrap: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "eospack-benchmark-unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
        }
    )


def read_partition_with_librdkafka(consumer: Any, topic: str, records: int) -> int:
    """What the reader would do with librdkafka (confluent-kafka) decoding instead of
    kafka-python: partition 0 into Arrow arrays of the same columns, 10,000 records a time.
    ``consumer`` is made beforehand, as the reader keeps its consumer between tasks."""
    from confluent_kafka import TopicPartition as LibrdkafkaPartition

    rows = 0
    consumer.assign([LibrdkafkaPartition(topic, 0, 0)])
    deadline = time.monotonic() + TIMEOUT
    while rows < records:
        if time.monotonic() > deadline:
            raise TimeoutError(f"librdkafka read {rows} of {records} records of {topic}-0")
        messages = consumer.consume(num_messages=10_000, timeout=0.5)
        if not messages:
            continue
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([m.key() for m in messages], pa.binary()),
                pa.array([m.value() for m in messages], pa.binary()),
                pa.array([m.offset() for m in messages], pa.int64()),
                pa.array([m.timestamp()[1] * 1000 for m in messages], pa.int64()),
            ],
            names=["key", "value", "offset", "timestamp"],
        )
        rows += batch.num_rows
    consumer.unassign()
    return rows


def profile_reader(bootstrap: str, topic: str, records: int) -> dict[str, float]:
    """Seconds of the reader on one partition, by where they go (cProfile's own time)."""
    profile = cProfile.Profile()
    profile.enable()
    read_partition_without_spark(bootstrap, topic, records)
    profile.disable()
    kafka_package = str(Path(kafka.__file__).parent)
    split = {"kafka-python fetch and decode": 0.0, "Arrow conversion": 0.0, "other": 0.0}
    statistics = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (filename, _, function), row in statistics.items():
        own_seconds = row[2]
        if filename.startswith(kafka_package):
            split["kafka-python fetch and decode"] += own_seconds
        elif function in ("_to_arrow", "_headers") or "pyarrow" in f"{filename} {function}":
            split["Arrow conversion"] += own_seconds
        else:
            split["other"] += own_seconds
    return split


def run(
    report: Report,
    spark,
    bootstrap: str,
    sizes: list[int],
    repetitions: int,
    spark_kafka: bool,
    codec_size: int | None,
    tuple_output: bool = True,
) -> None:
    """``spark_kafka``: Spark's own format("kafka") is on the session's classpath;
    ``codec_size``: records of the lz4 and zstd topics (None: no codec topics);
    ``tuple_output``: also measure the tuple-output contender at the largest size."""
    by_size: dict[int, Figure] = {}
    topics: dict[int, str] = {}
    for size in sizes:
        topic = f"bench_source_{size}_{time.time_ns()}"
        topics[size] = topic
        say(
            f"source: producing {size:,} records of {VALUE_BYTES} bytes into {PARTITIONS}"
            " partitions"
        )
        fill_topic(bootstrap, topic, size, PARTITIONS)
        by_size[size] = _compare(
            report,
            spark,
            bootstrap,
            topic,
            f"{size:,}",
            size,
            repetitions,
            spark_kafka,
            target=1.0 if size >= 1_000_000 else None,
        )
        say("source: one kafka-python consumer (ceiling)")
        plain = Figure(
            "kafka-python consumer",
            measure(lambda t=topic, n=size: read_with_consumer(bootstrap, t, n), repetitions),
            size,
        )
        report.add(
            Comparison("1. source vs kafka-python (ceiling)", f"{size:,}", by_size[size], plain)
        )
    largest = max(sizes)
    if tuple_output:
        spark.dataSource.register(TupleOutputKafkaSource)
        say("source: replayable-kafka with tuple output instead of Arrow")
        tuples = Figure(
            "replayable-kafka, tuple output",
            measure(lambda: read_with_spark(spark, bootstrap, topics[largest], TUPLE_SOURCE), 1),
            largest,
        )
        report.add(
            Comparison("1. source: Arrow vs tuple output", f"{largest:,}", by_size[largest], tuples)
        )
    if codec_size:
        for codec in CODECS:
            topic = f"bench_source_{codec}_{codec_size}_{time.time_ns()}"
            say(f"source: producing {codec_size:,} records into a {codec} topic")
            fill_topic(bootstrap, topic, codec_size, PARTITIONS, compression=codec)
            target = 1.0 if codec_size >= 1_000_000 else None
            _compare(
                report,
                spark,
                bootstrap,
                topic,
                f"{codec_size:,}, {codec}",
                codec_size,
                repetitions,
                spark_kafka,
                target,
            )
    _where_the_time_goes(
        report,
        spark,
        bootstrap,
        topics[largest],
        largest,
        by_size[largest],
        repetitions,
        spark_kafka,
    )
    if len(by_size) > 1:
        report.notes.append(scaling_note("source: replayable-kafka", by_size))


def _compare(
    report: Report,
    spark,
    bootstrap: str,
    topic: str,
    size_label: str,
    records: int,
    repetitions: int,
    spark_kafka: bool,
    target: float | None,
) -> Figure:
    """replayable-kafka and, when available, Spark's own source on ``topic``, alternating so
    that machine load drifting during the run hits both alike."""
    say(f"source [{size_label}]: replayable-kafka" + (" and Spark's kafka source" * spark_kafka))
    ours: list[float] = []
    theirs: list[float] = []
    for index in range(repetitions + 1):
        warm_up = index == 0
        for contender, timings in (("replayable-kafka", ours), ("kafka", theirs)):
            if contender == "kafka" and not spark_kafka:
                continue
            started = time.perf_counter()
            read_with_spark(spark, bootstrap, topic, contender)
            if not warm_up:
                timings.append(time.perf_counter() - started)
    figure = Figure("replayable-kafka", tuple(ours), records)
    if spark_kafka:
        jvm = Figure("Spark's kafka source (JVM)", tuple(theirs), records)
        report.add(Comparison("1. source vs Spark's kafka source", size_label, figure, jvm, target))
    else:
        report.add_figure(f"1. source [{size_label}]", figure)
    return figure


def _where_the_time_goes(
    report: Report,
    spark,
    bootstrap: str,
    topic: str,
    records: int,
    query: Figure,
    repetitions: int,
    spark_kafka: bool,
) -> None:
    """Three parts of a query's time: its fixed cost (the same query over a one-record
    topic), the reader's own work (the executor's reader alone on one partition, profiled),
    and what is left: Spark running the micro-batch around the reader."""
    tiny = f"bench_source_one_record_{time.time_ns()}"
    fill_topic(bootstrap, tiny, 1, partitions=1)
    say("source: fixed cost per query (a one-record topic)")
    fixed = Figure(
        "replayable-kafka, one record",
        measure(lambda: read_with_spark(spark, bootstrap, tiny), repetitions),
        1,
        "s",
    )
    if spark_kafka:
        jvm_fixed = Figure(
            "Spark's kafka source, one record",
            measure(lambda: read_with_spark(spark, bootstrap, tiny, "kafka"), repetitions),
            1,
            "s",
        )
        report.add(
            Comparison(
                "1. source: fixed cost per query",
                "1 record",
                fixed,
                jvm_fixed,
                higher_is_better=False,
            )
        )
    else:
        report.add_figure("1. source: fixed cost per query", fixed)
    per_partition = records // PARTITIONS
    say(f"source: the reader alone on one partition ({per_partition:,} records), then profiled")
    alone = Figure(
        "reader alone, one partition, one process",
        measure(lambda: read_partition_without_spark(bootstrap, topic, per_partition), 1),
        per_partition,
    )
    if importlib.util.find_spec("confluent_kafka") is not None:
        consumer = librdkafka_consumer(bootstrap)
        try:
            librdkafka = Figure(
                "librdkafka (confluent-kafka) to Arrow, one partition",
                measure(lambda: read_partition_with_librdkafka(consumer, topic, per_partition), 1),
                per_partition,
            )
        finally:
            consumer.close()
        report.add(
            Comparison(
                "1. source: reader's decoding, kafka-python vs librdkafka",
                f"{per_partition:,}",
                alone,
                librdkafka,
            )
        )
    else:
        report.add_figure("1. source: reader without Spark", alone)
    split = profile_reader(bootstrap, topic, per_partition)
    total = sum(split.values()) or 1.0
    shares = ", ".join(f"{name} {seconds / total:.0%}" for name, seconds in split.items())
    # Two cores read two partitions at a time.
    reading = alone.median_seconds * PARTITIONS / 2
    rest = query.median_seconds - fixed.median_seconds - reading
    report.notes.append(
        f"source, where replayable-kafka's {query.median_seconds:.1f} s for {records:,} records"
        f" go: {fixed.median_seconds:.1f} s fixed cost per query (a one-record topic);"
        f" ~{reading:.1f} s the reader's own work ({alone.describe()} on one core, {PARTITIONS}"
        f" partitions on 2 cores; cProfile: {shares}); ~{max(rest, 0.0):.1f} s Spark running"
        " the micro-batch around it (task launch, Arrow hand-over from the Python worker to"
        " the JVM, the noop sink)."
    )
