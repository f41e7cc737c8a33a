"""replayable-kafka reads topics the way real producers write them: compressed by librdkafka
(confluent-kafka) and by Apache Kafka's own Java producer with every codec Kafka has, values
over 1 MB, 64 partitions, and one partition whose batches use different codecs.

Every test asserts the exact rows (partition, offset, key, value, headers) of a batch read and
of an AvailableNow stream whose maxOffsetsPerTrigger cuts ranges through the middle of
compressed batches. Where the broker's log directory is local, the tests also check in the
segment files that the batches really carry the codec (a producer may silently fall back to
no compression). They need Apache Kafka (``real_kafka``): tansu stores batches its own way.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.record import MemoryRecords
from pyspark.sql import DataFrame, SparkSession

from eospack.lab.services.kafka_tools import create_topic, end_offsets
from eospack.lab.services.maven import resolve_classpath
from eospack.lab.testing import await_query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CODECS = ("gzip", "snappy", "lz4", "zstd")
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
FAST_FAIL = {"kafkaConsumer.pollTimeoutMs": "20000"}
# Kafka's own console producer reads "key<TAB>value" lines; this marks a null key or value.
NULL_MARKER = "<null>"

Headers = tuple[tuple[str, bytes | None], ...]
# (topic, partition, offset, key, value, headers)
Row = tuple[str, int, int, bytes | None, bytes | None, Headers]


@dataclass(frozen=True)
class Message:
    """One record to produce, with the partition it must land in (header values may be null,
    which ``kafka_tools.Record`` does not allow)."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


def expected_rows(topic: str, messages: Sequence[Message]) -> list[Row]:
    """The rows ``messages`` become when produced in order into empty partitions of ``topic``."""
    next_offset: dict[int, int] = {}
    rows: list[Row] = []
    for m in messages:
        offset = next_offset.get(m.partition, 0)
        next_offset[m.partition] = offset + 1
        rows.append((topic, m.partition, offset, m.key, m.value, m.headers))
    return sorted(rows, key=lambda row: row[:3])


def varied_messages(count: int, partitions: int, seed: int) -> list[Message]:
    """Compressible but not constant values of 20..2000 bytes; some null keys, null values
    and headers (a header value may be null too)."""
    generator = random.Random(seed)
    words = [b"alpha", b"bravo", b"charlie", b"delta", b"echo", b"foxtrot", b"golf"]
    messages = []
    for index in range(count):
        value: bytes | None = (
            b" ".join(generator.choice(words) for _ in range(generator.randint(3, 300)))
            + b"%d" % index
        )
        key: bytes | None = b"key-%d" % (index % 97)
        if index % 17 == 0:
            key = None
        if index % 23 == 0:
            value = None
        headers: Headers = ()
        if index % 5 == 0:
            headers = (("trace", b"%08x" % index), ("empty", None))
        messages.append(Message(index % partitions, key, value, headers))
    return messages


def produce_with_librdkafka(
    servers: str, topic: str, messages: Sequence[Message], compression: str, **config: Any
) -> None:
    """Produce through librdkafka (confluent-kafka), batched as its users run it: linger,
    large batches, idempotence (so offsets follow the send order per partition)."""
    from confluent_kafka import Producer

    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": servers,
            "compression.type": compression,
            "enable.idempotence": True,
            "linger.ms": 50,
            "batch.num.messages": 100_000,
            "batch.size": 4 * 1024 * 1024,
            **config,
        }
    )
    for message in messages:
        producer.produce(
            topic,
            value=message.value,
            key=message.key,
            partition=message.partition,
            headers=list(message.headers) or None,
            on_delivery=delivered,
        )
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0 and not failures, f"librdkafka left {remaining} unsent: {failures[:3]}"


def produce_with_kafka_python(
    servers: str, topic: str, messages: Sequence[Message], compression: str | None
) -> None:
    producer = KafkaProducer(
        bootstrap_servers=servers,
        compression_type=compression,
        linger_ms=50,
        batch_size=1024 * 1024,
        max_in_flight_requests_per_connection=1,
    )
    try:
        futures = [
            producer.send(
                topic,
                key=m.key,
                value=m.value,
                partition=m.partition,
                headers=list(m.headers) or None,
            )
            for m in messages
        ]
        producer.flush()
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close()


def produce_with_java(
    servers: str, topic: str, messages: Sequence[Message], compression: str
) -> None:
    """Produce through Apache Kafka's own Java producer: ``ConsoleProducer`` from the broker's
    jars, fed "key<TAB>value" lines on stdin. Its default partitioner decides partitions, so
    every message must be for partition 0 of a one-partition topic; text keys and values
    only (one line each), no headers."""
    assert all(m.partition == 0 and not m.headers for m in messages)
    classpath = os.pathsep.join(str(jar) for jar in resolve_classpath("kafka-broker"))
    lines = "".join(f"{_line_text(m.key)}\t{_line_text(m.value)}\n" for m in messages)
    result = subprocess.run(
        [
            "java",
            "-Xmx256m",
            "-cp",
            classpath,
            "org.apache.kafka.tools.ConsoleProducer",
            "--bootstrap-server",
            servers,
            "--topic",
            topic,
            "--compression-codec",
            compression,
            "--property",
            "parse.key=true",
            "--property",
            "key.separator=\t",
            "--property",
            f"null.marker={NULL_MARKER}",
            "--producer-property",
            "linger.ms=100",
            "--producer-property",
            "batch.size=1048576",
        ],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def _line_text(data: bytes | None) -> str:
    if data is None:
        return NULL_MARKER
    text = data.decode()
    assert "\t" not in text and "\n" not in text and text != NULL_MARKER
    return text


def log_codecs(kafka: Any, topic: str, partition: int) -> list[str] | None:
    """The codec of each record batch in the partition's segment files, in offset order;
    None when the broker's log directory is not on this machine (Docker)."""
    log_dir = getattr(kafka, "log_dir", None)
    if log_dir is None:
        return None
    codecs = []
    for segment in sorted(Path(log_dir, f"{topic}-{partition}").glob("*.log")):
        records = MemoryRecords(segment.read_bytes())
        while (batch := records.next_batch()) is not None:
            if not batch.is_control_batch:
                codecs.append(CODEC_NAMES[batch.compression_type])
    return codecs


def read_batch(spark: SparkSession, servers: str, topics: str, **options: str) -> list[Row]:
    frame = (
        spark.read.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topics)
        .option("includeHeaders", "true")
        .options(**FAST_FAIL)
        .options(**options)
        .load()
    )
    return rows_of(frame)


def read_stream(
    spark: SparkSession, servers: str, topics: str, checkpoint: Path, **options: str
) -> dict[int, list[Row]]:
    """Rows of each micro-batch of an AvailableNow query from the earliest offsets."""
    batches: dict[int, list[Row]] = {}

    def record(frame: DataFrame, batch_id: int) -> None:
        batches[batch_id] = rows_of(frame)

    query = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topics)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .options(**FAST_FAIL)
        .options(**options)
        .load()
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 180)
    return batches


def rows_of(frame: DataFrame) -> list[Row]:
    rows = frame.select("topic", "partition", "offset", "key", "value", "headers").collect()
    return sorted(
        (
            row.topic,
            row.partition,
            row.offset,
            None if row.key is None else bytes(row.key),
            None if row.value is None else bytes(row.value),
            tuple(
                (header.key, None if header.value is None else bytes(header.value))
                for header in row.headers or ()
            ),
        )
        for row in rows
    )


def by_topic(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Rows per topic, so that a failure names the topic (and so the codec) that differs."""
    topics: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda row: row[:3]):
        topics.setdefault(row[0], []).append(row)
    return topics


def assert_reads_exactly(
    spark: SparkSession,
    servers: str,
    expected: dict[str, list[Row]],
    checkpoint: Path,
    per_trigger: int,
    **options: str,
) -> None:
    """A batch read and an AvailableNow stream of ``expected``'s topics both return exactly
    ``expected``; the stream in several micro-batches of at most ``per_trigger`` offsets."""
    topics = ",".join(expected)
    assert by_topic(read_batch(spark, servers, topics, **options)) == expected
    batches = read_stream(
        spark, servers, topics, checkpoint, maxOffsetsPerTrigger=str(per_trigger), **options
    )
    assert by_topic([row for rows in batches.values() for row in rows]) == expected
    assert len([rows for rows in batches.values() if rows]) > 1


def test_librdkafka_compressed_topics_read_exactly(spark, real_kafka, unique_name, tmp_path):
    """One topic per codec, written by librdkafka with linger, so batches hold many records."""
    servers = real_kafka.endpoint.bootstrap_servers
    expected = {}
    for seed, codec in enumerate(CODECS):
        topic = f"{unique_name}_{codec}"
        create_topic(servers, topic, partitions=2)
        messages = varied_messages(2_000, partitions=2, seed=seed)
        produce_with_librdkafka(servers, topic, messages, codec)
        assert end_offsets(servers, topic) == {0: 1000, 1: 1000}
        codecs = log_codecs(real_kafka, topic, 0)
        assert codecs is None or set(codecs) == {codec}, (topic, codecs)
        expected[topic] = expected_rows(topic, messages)

    assert_reads_exactly(spark, servers, expected, tmp_path / "checkpoint", 3_000)


def test_java_producer_compressed_topics_read_exactly(spark, real_kafka, unique_name, tmp_path):
    """One topic per codec, written by Apache Kafka's own Java producer."""
    servers = real_kafka.endpoint.bootstrap_servers
    expected = {}
    for codec in CODECS:
        topic = f"{unique_name}_{codec}"
        create_topic(servers, topic, partitions=1)
        messages = [
            Message(
                0,
                None if i % 11 == 0 else f"key-{i % 13}".encode(),
                None if i % 19 == 0 else f"{codec} value {i} ".encode() * (1 + i % 40),
            )
            for i in range(1_500)
        ]
        produce_with_java(servers, topic, messages, codec)
        assert end_offsets(servers, topic) == {0: 1500}
        codecs = log_codecs(real_kafka, topic, 0)
        assert codecs is None or set(codecs) == {codec}, (topic, codecs)
        expected[topic] = expected_rows(topic, messages)

    assert_reads_exactly(spark, servers, expected, tmp_path / "checkpoint", 2_500)


def test_values_over_one_megabyte(spark, real_kafka, unique_name, tmp_path):
    """Values of 1.5 and 3 MiB, uncompressed and zstd: the topics allow 8 MiB messages.
    A batch read with the fetch size raised as a user would; a stream with
    kafka.max.partition.fetch.bytes of 1 MiB, below one record (a broker returns the first
    batch of a partition whatever its size, so reading goes on)."""
    servers = real_kafka.endpoint.bootstrap_servers
    generator = random.Random(7)
    expected = {}
    for codec in ("none", "zstd"):
        topic = f"{unique_name}_{codec}"
        create_topic(servers, topic, partitions=2, configs={"max.message.bytes": "8388608"})
        messages = []
        for index in range(8):
            size = (3 if index % 3 == 0 else 1.5) * 2**20
            # hex text: compresses to about half, still over 1 MiB for the 3 MiB values
            value = generator.randbytes(int(size) // 2).hex().encode()
            messages.append(Message(index % 2, b"big-%d" % index, value))
        messages.append(Message(0, b"small", b"after the big ones"))
        produce_with_librdkafka(servers, topic, messages, codec, **{"message.max.bytes": 2**23})
        codecs = log_codecs(real_kafka, topic, 0)
        assert codecs is None or set(codecs) == {codec}, (topic, codecs)
        expected[topic] = expected_rows(topic, messages)

    topics = ",".join(expected)
    raised = {"kafka.max.partition.fetch.bytes": str(16 * 2**20)}
    assert by_topic(read_batch(spark, servers, topics, **raised)) == expected
    batches = read_stream(
        spark,
        servers,
        topics,
        tmp_path / "checkpoint",
        maxOffsetsPerTrigger="10",
        **{"kafka.max.partition.fetch.bytes": str(2**20)},
    )
    assert by_topic([row for rows in batches.values() for row in rows]) == expected


def test_sixty_four_partitions(spark, real_kafka, unique_name, tmp_path):
    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=64)
    messages = varied_messages(64 * 20, partitions=64, seed=64)
    produce_with_librdkafka(servers, unique_name, messages, "lz4")

    assert end_offsets(servers, unique_name) == {p: 20 for p in range(64)}
    expected = {unique_name: expected_rows(unique_name, messages)}
    assert_reads_exactly(spark, servers, expected, tmp_path / "checkpoint", 1_000)


def test_mixed_codecs_in_one_partition(spark, real_kafka, unique_name, tmp_path):
    """Batches from three producers and five codecs follow each other in one partition; the
    stream's ranges start and end inside batches of different codecs."""
    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=1)
    written: list[Message] = []
    steps = [
        ("librdkafka", "gzip"),
        ("kafka-python", "zstd"),
        ("java", "lz4"),
        ("librdkafka", "snappy"),
        ("kafka-python", None),
        ("java", "zstd"),
        ("kafka-python", "lz4"),
        ("librdkafka", "zstd"),
        ("kafka-python", "snappy"),
    ]
    for step, (producer, codec) in enumerate(steps):
        messages = [
            Message(0, f"{producer}-{step}".encode(), f"{codec} {step}.{i} ".encode() * (i % 9))
            for i in range(150)
        ]
        if producer == "librdkafka":
            produce_with_librdkafka(servers, unique_name, messages, str(codec))
        elif producer == "kafka-python":
            produce_with_kafka_python(servers, unique_name, messages, codec)
        else:
            produce_with_java(servers, unique_name, messages, str(codec))
        written.extend(messages)

    codecs = log_codecs(real_kafka, unique_name, 0)
    if codecs is not None:
        runs = [codec for index, codec in enumerate(codecs) if codecs[index - 1 : index] != [codec]]
        assert runs == [codec or "none" for _, codec in steps]
    expected = {unique_name: expected_rows(unique_name, written)}
    assert_reads_exactly(spark, servers, expected, tmp_path / "checkpoint", 400)


def test_a_missing_codec_library_fails_in_one_line_naming_the_package(
    kafka, unique_name, monkeypatch
):
    """On the reference path, an executor whose Python lacks a codec's package (eospack
    depends on all of them, so this is a broken environment) fails the read with one line
    naming codec and package; the native path decodes every codec itself."""
    from kafka import codec

    from eospack.connectors.kafka.records import record_batches
    from eospack.connectors.kafka.source import reader
    from eospack.connectors.kafka.source.offset_ranges import OffsetRange
    from eospack.connectors.kafka.source.options import parse_options

    servers = kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=1)
    messages = [Message(0, None, b"compressible " * 20) for _ in range(10)]
    produce_with_kafka_python(servers, unique_name, messages, "zstd")
    options = parse_options(
        {"kafka.bootstrap.servers": servers, "subscribe": unique_name, **FAST_FAIL}
    )
    monkeypatch.setattr(codec, "zstd", None)
    if record_batches.NATIVE is not None:
        batches = list(reader.read_range(options, OffsetRange(unique_name, 0, 0, 10)))
        assert [row["value"] for batch in batches for row in batch.to_pylist()] == [
            message.value for message in messages
        ]
        reader.close_idle_consumers()
    monkeypatch.setattr(record_batches, "NATIVE", None)

    with pytest.raises(Exception) as raised:
        list(reader.read_range(options, OffsetRange(unique_name, 0, 0, 10)))

    assert type(raised.value).__name__ == "KafkaCodecMissingError"
    assert str(raised.value) == (
        f"Cannot read {unique_name}-0 [0, 10): its records are compressed with zstd and this"
        " Python has no zstd decoder: pip install zstandard (eospack depends on it through"
        " kafka-python[zstd]; install it wherever Spark's Python workers run)"
    )
