"""1. replayable-kafka into a no-op sink versus Spark's own Kafka source (JVM) on the same
broker and topic, in the same run; the ceiling is the extension alone, without Spark.

Both Spark sources read with the same options (AvailableNow from the earliest offsets,
``kafka.isolation.level=read_committed``, the noop sink), alternating after a warm-up each;
an lz4 and a zstd topic follow. The ceiling row is the executor's reader alone
(``reader.read_range``: kafka-python fetches, ``record_batches.decode`` turns each fetched
partition into one Arrow batch) on one partition in one process, next to the same reader on
the same data with the pure-Python reference decoder (``record_batches.NATIVE`` set to
None for the measurement) and with librdkafka (confluent-kafka) building the same Arrow
columns from its messages. Where the reader's time goes is profiled: cProfile splits the
main thread (waiting for Fetch responses, the native decode, kafka-python's fetcher, the
rest); kafka-python's network thread (socket reads, response parsing) is CPU time from /proc.

Also measured at 1M records: the same source handing Spark one Python tuple per record
instead of Arrow record batches (``replayable-kafka-tuples``, registered here for the
benchmark only; its rows are built from the Arrow batches, so it slightly overstates a
native tuple reader).
"""

from __future__ import annotations

import contextlib
import cProfile
import importlib.util
import os
import pstats
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kafka
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from benchmarks import fixed_cost
from benchmarks.data import VALUE_BYTES, fill_topic
from benchmarks.harness import Comparison, Figure, Report, measure, say, scaling_note
from benchmarks.spark_reads import COMMON_OPTIONS, read_with_spark
from eospack.connectors.kafka.records import native_path, record_batches
from eospack.connectors.kafka.source import reader
from eospack.connectors.kafka.source.data_source import (
    ReplayableKafkaDataSource,
    ReplayableKafkaStreamReader,
)
from eospack.connectors.kafka.source.offset_ranges import OffsetRange
from eospack.connectors.kafka.source.options import parse_options

TIMEOUT = 900.0
TUPLE_SOURCE = "replayable-kafka-tuples"
TUPLE_SIZE = 1_000_000
PARTITIONS = 4
CODECS = ("lz4", "zstd")
GOAL_SIZE = 1_000_000
"""From this size on, the goal (>= 1.0x Spark's source) applies."""


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


def read_partition_without_spark(bootstrap: str, topic: str, records: int) -> int:
    """The executor's reader alone: partition 0 of ``topic`` through ``read_range`` (its
    consumer is kept between calls, as a Python worker keeps it between tasks)."""
    options = parse_options(
        {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, **COMMON_OPTIONS}
    )
    rows = sum(
        batch.num_rows for batch in reader.read_range(options, OffsetRange(topic, 0, 0, records))
    )
    if rows != records:
        raise AssertionError(f"read_range read {rows} records of {topic}-0, expected {records}")
    return rows


@contextlib.contextmanager
def reference_decoder() -> Iterator[None]:
    """``record_batches.decode`` on its pure-Python reference path for the duration
    (``EOSPACK_NATIVE=0`` is read once, at import)."""
    native = record_batches.NATIVE
    record_batches.NATIVE = None
    try:
        yield
    finally:
        record_batches.NATIVE = native


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
    """What the reader would do with librdkafka (confluent-kafka) instead: partition 0 into
    Arrow arrays of the same columns, 10,000 records a time. ``consumer`` is made (and
    connected by the warm-up) beforehand, as the reader keeps its consumer between tasks."""
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
        count = len(messages)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([m.key() for m in messages], pa.binary()),
                pa.array([m.value() for m in messages], pa.binary()),
                pa.array([topic] * count, pa.string()),
                pa.array([m.partition() for m in messages], pa.int32()),
                pa.array([m.offset() for m in messages], pa.int64()),
                pa.array([m.timestamp()[1] * 1000 for m in messages], pa.int64()),
                pa.array([m.timestamp()[0] for m in messages], pa.int32()),
            ],
            names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
        )
        rows += batch.num_rows
    consumer.unassign()
    return rows


Timings = tuple[tuple[float, ...], tuple[float, ...]]


def timed_with_cpu(run: Callable[[], object], repetitions: int, warmups: int) -> Timings:
    """Wall-clock and this process's CPU seconds of ``run`` per repetition."""
    wall: list[float] = []
    cpu: list[float] = []
    for index in range(warmups + repetitions):
        started, started_cpu = time.perf_counter(), time.process_time()
        run()
        if index >= warmups:
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    return tuple(wall), tuple(cpu)


PROFILE_PARTS = (
    "waiting for Fetch responses",
    "native decode (eospack._native)",
    "kafka-python fetcher and consumer",
    "Arrow (pyarrow)",
    "other (reader, record_batches wrapper, numpy)",
)
"""The main thread's time by part. kafka-python 3 runs its network I/O (socket reads and
the parsing of Fetch responses) in its own thread, which cProfile does not see: its CPU
time is measured from /proc instead."""


def _part(filename: str, function: str, kafka_package: str) -> str | None:
    """The part a function's own time belongs to; None for a builtin that is not a part of
    its own (its time goes to its callers' parts)."""
    if "acquire' of '_thread" in function or "wait' of '_thread" in function:
        return PROFILE_PARTS[0]
    if "decode_records" in function:
        return PROFILE_PARTS[1]
    if filename.startswith(kafka_package):
        return PROFILE_PARTS[2]
    if "pyarrow" in filename or "pyarrow" in function or "_import_from_c" in function:
        return PROFILE_PARTS[3]
    if filename == "~":
        return None
    return PROFILE_PARTS[4]


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user and system) of this process's threads so far, by thread name;
    threads not started from Python are summed under "other"."""
    ticks = os.sysconf("SC_CLK_TCK")
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    seconds: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task), "other")
        seconds[name] = seconds.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def profile_reader(bootstrap: str, topic: str, records: int) -> tuple[float, dict[str, float]]:
    """Wall-clock seconds of the reader on one partition, and seconds by part: the main
    thread's, from cProfile's own times (a builtin's time goes to the parts of the functions
    that called it), and the CPU seconds of kafka-python's network thread."""
    before = thread_cpu_seconds()
    started = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    read_partition_without_spark(bootstrap, topic, records)
    profile.disable()
    wall = time.perf_counter() - started
    after = thread_cpu_seconds()
    kafka_package = str(Path(kafka.__file__).parent)
    split = dict.fromkeys(PROFILE_PARTS, 0.0)
    statistics = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (filename, _, function), row in statistics.items():
        own_seconds, callers = row[2], row[4]
        part = _part(filename, function, kafka_package)
        if part is not None:
            split[part] += own_seconds
            continue
        for (caller_file, _, caller_function), edge in callers.items():
            caller_part = _part(caller_file, caller_function, kafka_package) or PROFILE_PARTS[4]
            split[caller_part] += edge[2]
    network = sum(
        seconds - before.get(name, 0.0)
        for name, seconds in after.items()
        if name.startswith("kafka-io")
    )
    split["kafka-python network thread, CPU (socket reads, Fetch response parsing)"] = network
    return wall, split


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
    ``tuple_output``: also measure the tuple-output contender (at 1M records, or the
    largest size below)."""
    say(f"source: eospack's Kafka data path is {native_path.active_path()}")
    report.notes.append(f"source: Kafka data path {native_path.active_path()}")
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
            target=1.0 if size >= GOAL_SIZE else None,
        )
    if codec_size:
        for codec in CODECS:
            topic = f"bench_source_{codec}_{codec_size}_{time.time_ns()}"
            say(f"source: producing {codec_size:,} records into a {codec} topic")
            fill_topic(bootstrap, topic, codec_size, PARTITIONS, compression=codec)
            _compare(
                report,
                spark,
                bootstrap,
                topic,
                f"{codec_size:,}, {codec}",
                codec_size,
                repetitions,
                spark_kafka,
                target=1.0 if codec_size >= GOAL_SIZE else None,
            )
    if tuple_output:
        size = max((s for s in sizes if s <= TUPLE_SIZE), default=min(sizes))
        spark.dataSource.register(TupleOutputKafkaSource)
        say(f"source: replayable-kafka with tuple output instead of Arrow [{size:,}]")
        tuples = Figure(
            "replayable-kafka, tuple output",
            measure(lambda: read_with_spark(spark, bootstrap, topics[size], TUPLE_SOURCE), 1),
            size,
        )
        report.add(
            Comparison("1. source: Arrow vs tuple output", f"{size:,}", by_size[size], tuples)
        )
    largest = max(sizes)
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
    topic, ``benchmarks.fixed_cost``), the reader's own work (the executor's reader alone on
    one partition: native, reference and librdkafka; profiled), and what is left: Spark
    running the micro-batch around the reader."""
    fixed = fixed_cost.run(report, spark, bootstrap, repetitions, spark_kafka)
    per_partition = records // PARTITIONS
    size = f"{per_partition:,}, one partition"
    say(f"source: the extension alone on one partition ({per_partition:,} records)")
    wall, cpu = timed_with_cpu(
        lambda: read_partition_without_spark(bootstrap, topic, per_partition), repetitions, 1
    )
    alone = Figure("the extension alone (read_range, native decode)", wall, per_partition)
    alone_cpu = Figure("native, CPU time of the process", cpu, per_partition, "records/CPU s")
    # The reference path is ~15x slower: one timed run on a warm consumer.
    say(f"source: the same reader with the pure-Python reference decoder ({per_partition:,})")
    with reference_decoder():
        wall, cpu = timed_with_cpu(
            lambda: read_partition_without_spark(bootstrap, topic, per_partition), 1, 0
        )
    reference = Figure("the same reader, pure-Python reference decoder", wall, per_partition)
    reference_cpu = Figure(
        "reference, CPU time of the process", cpu, per_partition, "records/CPU s"
    )
    report.add(Comparison("1. source ceiling: native vs reference decoder", size, alone, reference))
    report.add(
        Comparison(
            "1. source ceiling: native vs reference, per CPU second",
            size,
            alone_cpu,
            reference_cpu,
        )
    )
    if importlib.util.find_spec("confluent_kafka") is not None:
        say(f"source: librdkafka (confluent-kafka) to Arrow ({per_partition:,})")
        consumer = librdkafka_consumer(bootstrap)
        try:
            librdkafka = Figure(
                "librdkafka (confluent-kafka) messages to Arrow",
                # Per-message Python objects: one timed run after the warm-up.
                measure(lambda: read_partition_with_librdkafka(consumer, topic, per_partition), 1),
                per_partition,
            )
        finally:
            consumer.close()
        report.add(Comparison("1. source ceiling: native vs librdkafka", size, alone, librdkafka))
    say("source: the extension alone, profiled")
    profiled, split = profile_reader(bootstrap, topic, per_partition)
    reader.close_idle_consumers()
    shares = ", ".join(
        f"{name} {seconds:.2f} s ({seconds / profiled:.0%})" for name, seconds in split.items()
    )
    report.notes.append(
        f"source ceiling, the extension alone on one partition ({per_partition:,} records,"
        f" one process): {alone.describe()} wall clock, {alone_cpu.describe()} of the"
        f" process (the broker runs on the same 2 cores); the reference decoder on the same"
        f" data {reference.describe()} ({reference_cpu.describe()})."
        f" Profiled ({profiled:.2f} s wall clock under cProfile; shares of that): main thread"
        f" {shares}."
    )
    # Two cores read two partitions at a time.
    reading = alone.median_seconds * PARTITIONS / 2
    rest = query.median_seconds - fixed.median_seconds - reading
    report.notes.append(
        f"source, where replayable-kafka's {query.median_seconds:.1f} s for {records:,} records"
        f" go: {fixed.median_seconds:.1f} s fixed cost per query (a one-record topic);"
        f" ~{reading:.1f} s the reader's own work ({PARTITIONS} partitions at the rate of the"
        f" extension alone, two at a time on 2 cores); ~{max(rest, 0.0):.1f} s Spark running"
        " the micro-batch around it (task launch, Arrow hand-over from the Python worker to"
        " the JVM, Arrow-to-row conversion, the noop sink)."
    )
