"""The native record-batch decoder against its pure-Python reference on what real producers
write to Apache Kafka: kafka-python, librdkafka (confluent-kafka) and the Java producer of
the broker's own jars (``integration_tests/java/DifferentialProducer.java``).

Each client writes a topic whose partition ``p`` it fills with codec ``CODECS[p]`` (none,
gzip, snappy, lz4, zstd): null, empty and binary keys and values (both null at once where
the client allows), headers with unicode keys and null values (where the client allows),
and a value over 1 MB in every partition. The Java producer also writes committed and
aborted transactions interleaved with plain idempotent records; kafka-python a compacted
topic whose offsets have gaps; and the broker itself rebuilds librdkafka's batches on a topic
with compression.type=zstd and LogAppendTime.

The raw record data of every Fetch response is captured from a kafka-python consumer (its
fetcher's ``_parse_fetched_data`` is wrapped), read_uncommitted and read_committed (the
latter with the response's aborted-transactions list), with a small partition fetch size so
that responses end inside a batch. Each captured response is decoded through both paths, at
its fetch offset, at offsets inside its first batch and cut short: identical Arrow tables and
next fetch offsets. Following the fetch offsets from the beginning gives the partition's rows,
which must be exactly the records the producer sent (aborted ones only read_uncommitted).

The other way round, what 2pc-kafka writes through the native encoder (a streaming query in
the session's Spark, exactly-once, every codec) is read by kafka-python, librdkafka, Spark's
JVM source and both decode paths as the same records, which are exactly the rows written.

Record contents are drawn from seeded generators; the seeds are printed. Without the built
extension the module is skipped, except in CI (``CI`` set) unless ``EOSPACK_NATIVE=0``
chose the reference path: there a missing extension fails it.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from eospack.connectors.kafka.records import record_batches
from eospack.connectors.kafka.records.record_batches import DecodedRecords
from eospack.lab.services.kafka_tools import create_compacted_topic, create_topic, end_offsets
from eospack.lab.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
JAVA_PRODUCER = Path(__file__).parents[1] / "java" / "DifferentialProducer.java"
MAX_MESSAGE_BYTES = 8 << 20
LARGE_VALUE_BYTES = 1_300_000
BASE_TIMESTAMP_MS = (int(time.time()) - 600) * 1000
"""Recent: records older than the topic's retention (7 days) would be deleted under the test."""
RECORDS_PER_PARTITION = 60
REFERENCE_CHOICES = ("0", "false", "no", "off")
"""Values of ``EOSPACK_NATIVE`` that select the reference path (``record_batches``)."""

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Sent:
    """One record a producer sent, and whether its transaction was aborted."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int
    aborted: bool = False

    def as_read(self) -> tuple[Any, ...]:
        """What a reader's row holds of it: null headers for a record without any."""
        headers = [{"key": key, "value": value} for key, value in self.headers] or None
        return (self.partition, self.key, self.value, repr(headers), self.timestamp_ms)


@dataclass(frozen=True)
class Fetched:
    """The record data of one partition of one Fetch response, as the broker sent it."""

    partition: int
    fetch_offset: int
    raw: bytes
    aborted_transactions: tuple[tuple[int, int], ...]


@dataclass
class Topics:
    """What the module's producers wrote: topic -> the records sent to it."""

    sent: dict[str, list[Sent]] = field(default_factory=dict)
    compacted: str = ""
    compacted_offsets: dict[tuple[int, int], Sent] = field(default_factory=dict)
    rewritten: str = ""
    rewritten_between_ms: tuple[int, int] = (0, 0)


def skip_without_native() -> None:
    chose_reference = os.environ.get("EOSPACK_NATIVE", "1").strip().lower() in REFERENCE_CHOICES
    if record_batches.NATIVE is None and (chose_reference or not os.environ.get("CI")):
        pytest.skip(f"needs the native path: {record_batches.active_path()}")


# --- what the producers send ------------------------------------------------------------------


def codec_records(
    rng: random.Random, *, null_header_values: bool, null_key_and_value: bool
) -> list[Sent]:
    """RECORDS_PER_PARTITION records for each codec's partition; index 7 holds a value over
    1 MB (half random, half one repeated byte: compressible, but not to nothing)."""
    records = []
    for partition in range(len(CODECS)):
        for index in range(RECORDS_PER_PARTITION):
            key = (
                None
                if index % 5 == 0
                else b""
                if index % 11 == 1
                else rng.randbytes(rng.randint(1, 24))
            )
            value: bytes | None = (
                None
                if index % 7 == 3
                else b""
                if index % 13 == 2
                else rng.randbytes(rng.randint(1, 200))
            )
            if index == 7:
                half = LARGE_VALUE_BYTES // 2
                value = rng.randbytes(half) + bytes([rng.randrange(256)]) * half
            if key is None and value is None and not null_key_and_value:
                value = b"v"
            headers: Headers = ()
            if index % 3 == 0:
                headers = (
                    ("h", b"%d" % index),
                    ("schlüssel-键", rng.randbytes(rng.randint(0, 8))),
                    ("nothing", None if null_header_values else b""),
                    ("h", b""),
                )
            elif index % 3 == 1:
                headers = (("only", rng.randbytes(3)),)
            records.append(Sent(partition, key, value, headers, BASE_TIMESTAMP_MS + index))
    return records


def produce_with_kafka_python(servers: str, topic: str, records: Sequence[Sent]) -> None:
    for partition, codec in enumerate(CODECS):
        producer = KafkaProducer(
            bootstrap_servers=servers,
            compression_type=None if codec == "none" else codec,
            linger_ms=50,
            batch_size=65_536,
            max_request_size=MAX_MESSAGE_BYTES,
            acks="all",
        )
        try:
            futures = [
                producer.send(
                    topic,
                    key=record.key,
                    value=record.value,
                    partition=partition,
                    timestamp_ms=record.timestamp_ms,
                    headers=list(record.headers),
                )
                for record in records
                if record.partition == partition
            ]
            producer.flush(30)
            for future in futures:
                future.get(timeout=30)
        finally:
            producer.close(timeout=10)


def produce_with_librdkafka(servers: str, topic: str, records: Sequence[Sent]) -> None:
    from confluent_kafka import Producer

    for partition, codec in enumerate(CODECS):
        failures: list[str] = []

        def delivered(error: Any, _message: Any, failures: list[str] = failures) -> None:
            if error is not None:
                failures.append(str(error))

        producer = Producer(
            {
                "bootstrap.servers": servers,
                "compression.codec": codec,
                "enable.idempotence": True,
                "linger.ms": 50,
                "message.max.bytes": MAX_MESSAGE_BYTES,
            }
        )
        for record in (record for record in records if record.partition == partition):
            producer.produce(
                topic,
                value=record.value,
                key=record.key,
                partition=partition,
                timestamp=record.timestamp_ms,
                headers=list(record.headers) or None,
                on_delivery=delivered,
            )
            producer.poll(0)
        assert producer.flush(30) == 0 and not failures, failures[:3]


class JavaScript:
    """A script for DifferentialProducer.java (see its header for the commands)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def command(self, *fields: object) -> None:
        self.lines.append("\t".join(str(item) for item in fields))

    def send(self, producer: str, topic: str, record: Sent) -> None:
        headers = ",".join(
            f"{key.encode().hex()}:{'-' if value is None else value.hex()}"
            for key, value in record.headers
        )
        self.command(
            "SEND",
            producer,
            topic,
            record.partition,
            record.timestamp_ms,
            "-" if record.key is None else record.key.hex(),
            "-" if record.value is None else record.value.hex(),
            headers,
        )

    def run(self, servers: str, directory: Path) -> None:
        from eospack.lab.services.apache_kafka import java_executable
        from eospack.lab.services.maven import resolve_classpath

        script = directory / "script.tsv"
        script.write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        classpath = ":".join(str(jar) for jar in resolve_classpath("kafka-broker"))
        result = subprocess.run(
            [java_executable(), "-cp", classpath, str(JAVA_PRODUCER), servers, str(script)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]


def transactions_script(script: JavaScript, topic: str, rng: random.Random) -> list[Sent]:
    """Two transactional producers (lz4, zstd) and a plain idempotent one (none) on two
    partitions: a committed and an aborted transaction open at the same time with plain
    records between their batches, then the aborting producer commits one, the committing
    one aborts one, and plain records follow."""
    sent: list[Sent] = []
    timestamp = iter(range(BASE_TIMESTAMP_MS, BASE_TIMESTAMP_MS + 10_000))
    suffix = uuid.uuid4().hex[:8]
    script.command("PRODUCER", "committing", "lz4", f"differential-a-{suffix}")
    script.command("PRODUCER", "aborting", "zstd", f"differential-b-{suffix}")
    script.command("PRODUCER", "plain", "none", "-")

    def send(producer: str, count: int, aborted: bool = False) -> None:
        for index in range(count):
            for partition in (0, 1):
                key = None if index % 3 == 0 else b"%s-%d" % (producer.encode(), index)
                headers: Headers = (("p", producer.encode()),) if index % 2 else ()
                value = b"%s-%d-" % (producer.encode(), index) + rng.randbytes(rng.randint(0, 40))
                record = Sent(partition, key, value, headers, next(timestamp), aborted)
                script.send(producer, topic, record)
                sent.append(record)

    send("plain", 3)
    script.command("BEGIN", "committing")
    script.command("BEGIN", "aborting")
    send("committing", 5)
    send("aborting", 5, aborted=True)
    script.command("FLUSH", "committing")
    script.command("FLUSH", "aborting")
    send("plain", 2)
    script.command("FLUSH", "plain")
    send("committing", 4)
    send("aborting", 4, aborted=True)
    script.command("FLUSH", "aborting")
    script.command("COMMIT", "committing")
    script.command("ABORT", "aborting")
    script.command("BEGIN", "aborting")
    send("aborting", 3)
    script.command("COMMIT", "aborting")
    script.command("BEGIN", "committing")
    send("committing", 3, aborted=True)
    script.command("FLUSH", "committing")
    script.command("ABORT", "committing")
    send("plain", 2)
    script.command("FLUSH", "plain")
    return sent


def fill_compacted_topic(
    servers: str, topic: str, rng: random.Random
) -> dict[tuple[int, int], Sent]:
    """Keyed records (lz4) and tombstones on a compacted topic, appended until the cleaner
    has removed offsets from every partition; returns what was sent at each (partition,
    offset)."""
    create_compacted_topic(servers, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=servers, compression_type="lz4", linger_ms=5)
    sent: dict[tuple[int, int], Sent] = {}
    round_ = iter(range(10_000))

    def append_round() -> None:
        number = next(round_)
        futures = []
        for index in range(24):
            partition = index % 2
            key = b"key-%d" % (index % 6)
            value = (
                None
                if (number + index) % 9 == 0
                else b"%d-%d-" % (number, index) + rng.randbytes(8) + b"z" * 200
            )
            record = Sent(partition, key, value, (), BASE_TIMESTAMP_MS + number * 100 + index)
            futures.append(
                (
                    record,
                    producer.send(
                        topic,
                        key=key,
                        value=value,
                        partition=partition,
                        timestamp_ms=record.timestamp_ms,
                    ),
                )
            )
        producer.flush(30)
        for record, future in futures:
            metadata = future.get(timeout=30)
            sent[(record.partition, metadata.offset)] = record

    def compacted() -> bool:
        append_round()
        rows = read_rows(servers, topic, "read_uncommitted")
        present = {(row[0], row[1]) for row in rows}
        return all(
            any((partition, offset) not in present for p, offset in sent if p == partition)
            for partition in (0, 1)
        )

    try:
        wait_until(compacted, 60, "the cleaner to remove offsets of both partitions", poll=0.5)
    finally:
        producer.close(timeout=10)
    return sent


# --- capture and decode ---------------------------------------------------------------------


def capture_fetches(
    servers: str, topic: str, isolation_level: str, fetch_bytes: int = 48 * 1024
) -> dict[int, list[Fetched]]:
    """Every Fetch response's raw record data per partition, read from the beginning to the
    end offsets (the last stable offsets for read_committed) by a kafka-python consumer."""
    ends = end_offsets(servers, topic, isolation_level)
    consumer = KafkaConsumer(
        bootstrap_servers=servers,
        enable_auto_commit=False,
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=4 * fetch_bytes,
        check_crcs=True,
    )
    captured: dict[int, list[Fetched]] = {partition: [] for partition in ends}
    fetcher: Any = consumer._fetcher
    parse: Callable[[Any], Any] = fetcher._parse_fetched_data

    def capture(completed_fetch: Any) -> Any:
        data = completed_fetch.partition_data
        captured[completed_fetch.topic_partition.partition].append(
            Fetched(
                completed_fetch.topic_partition.partition,
                completed_fetch.fetched_offset,
                bytes(data.records or b""),
                tuple((t.producer_id, t.first_offset) for t in data.aborted_transactions or ()),
            )
        )
        return parse(completed_fetch)

    fetcher._parse_fetched_data = capture
    try:
        partitions = [TopicPartition(topic, partition) for partition in ends]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)

        def at_the_end() -> bool:
            consumer.poll(timeout_ms=200)
            return all(consumer.position(tp) >= ends[tp.partition] for tp in partitions)

        wait_until(at_the_end, 60, f"a consumer to read {topic} to {ends}", poll=0)
    finally:
        consumer.close()
    return captured


def decode_both(
    fetched: Fetched, topic: str, fetch_offset: int, read_committed: bool
) -> DecodedRecords:
    results = [
        record_batches.decode(
            fetched.raw,
            fetch_offset,
            topic,
            fetched.partition,
            read_committed=read_committed,
            aborted_transactions=fetched.aborted_transactions,
            include_headers=include_headers,
            native=native,
        )
        for include_headers in (True, False)
        for native in (True, False)
    ]
    with_headers, with_headers_reference, without, without_reference = results
    for native, reference in ((with_headers, with_headers_reference), (without, without_reference)):
        context = f"{topic}-{fetched.partition} at {fetch_offset} ({len(fetched.raw)} bytes)"
        assert native.batch.num_rows == reference.batch.num_rows, context
        assert native.batch.equals(reference.batch), context
        assert native.batch.schema.equals(reference.batch.schema, check_metadata=True), context
        assert native.next_fetch_offset == reference.next_fetch_offset, context
        assert native.leader_epoch == reference.leader_epoch, context
    assert without.batch.equals(with_headers.batch.drop_columns(["headers"]))
    return with_headers


@dataclass
class Seen:
    """What the decoded responses held, so that a test can tell its case was there."""

    responses: int = 0
    codecs: dict[int, set[str]] = field(default_factory=dict)
    control_batches: int = 0
    log_append_time_batches: int = 0
    partial_batches: int = 0
    aborted_transactions: int = 0

    def add(self, fetched: Fetched) -> None:
        """Walks the response's batch headers (format v2: length at 8, attributes at 21)."""
        self.responses += 1
        self.aborted_transactions += len(fetched.aborted_transactions)
        raw, position = fetched.raw, 0
        while len(raw) - position >= 61:
            end = position + 12 + struct.unpack_from(">i", raw, position + 8)[0]
            if end > len(raw):
                break
            attributes = struct.unpack_from(">h", raw, position + 21)[0]
            codec = CODECS[attributes & 0x07]
            self.codecs.setdefault(fetched.partition, set()).add(codec)
            self.control_batches += bool(attributes & 0x20)
            self.log_append_time_batches += bool(attributes & 0x08)
            position = end
        self.partial_batches += position < len(raw)


def read_through_both_paths(
    servers: str, topic: str, isolation_level: str
) -> tuple[list[tuple[Any, ...]], Seen]:
    """The partition rows (partition, key, value, headers repr, timestamp ms, offset) read by
    following the fetch offsets through the captured responses, each response decoded by
    both paths from its fetch offset and from offsets inside its first batch; and what the
    decoded responses held."""
    read_committed = isolation_level == "read_committed"
    ends = end_offsets(servers, topic, isolation_level)
    rows: list[tuple[Any, ...]] = []
    seen = Seen()
    for partition, fetches in sorted(capture_fetches(servers, topic, isolation_level).items()):
        # The first response at each offset that holds data (a response may leave a
        # partition empty when others filled it).
        by_offset = {fetched.fetch_offset: fetched for fetched in reversed(fetches) if fetched.raw}
        position = min(by_offset) if by_offset else ends[partition]
        while position < ends[partition]:
            assert position in by_offset, (topic, partition, position, sorted(by_offset))
            fetched = by_offset[position]
            decoded = decode_both(fetched, topic, position, read_committed)
            seen.add(fetched)
            inside = sorted(
                {position + 1, position + 3, position + 17} & set(range(decoded.next_fetch_offset))
            )
            for offset in inside:
                decode_both(fetched, topic, offset, read_committed)
            # The same response cut short, as a broker's byte limit cuts its last batch.
            for length in {len(fetched.raw) // 2, len(fetched.raw) - 1}:
                cut = Fetched(
                    partition, position, fetched.raw[:length], fetched.aborted_transactions
                )
                decode_both(cut, topic, position, read_committed)
            table = decoded.batch.to_pydict()
            for index in range(decoded.batch.num_rows):
                rows.append(
                    (
                        table["partition"][index],
                        table["key"][index],
                        table["value"][index],
                        repr(table["headers"][index]),
                        round(table["timestamp"][index].timestamp() * 1000),
                        table["offset"][index],
                    )
                )
            assert decoded.next_fetch_offset > position
            position = decoded.next_fetch_offset
    offsets = [(row[0], row[5]) for row in rows]
    assert offsets == sorted(set(offsets)), "offsets must rise within each partition"
    return rows, seen


def read_rows(servers: str, topic: str, isolation_level: str) -> list[tuple[int, int]]:
    """(partition, offset) of every record, read by kafka-python's own consumer."""
    ends = end_offsets(servers, topic, isolation_level)
    consumer = KafkaConsumer(
        bootstrap_servers=servers,
        enable_auto_commit=False,
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
    )
    rows: list[tuple[int, int]] = []
    try:
        partitions = [TopicPartition(topic, partition) for partition in ends]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)

        def at_the_end() -> bool:
            for tp, messages in consumer.poll(timeout_ms=200).items():
                rows.extend((tp.partition, message.offset) for message in messages)
            return all(consumer.position(tp) >= ends[tp.partition] for tp in partitions)

        wait_until(at_the_end, 30, f"a consumer to read {topic}", poll=0)
    finally:
        consumer.close()
    return rows


def without_offsets(rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted((row[:5] for row in rows), key=repr)


def assert_same_rows(got: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]]) -> None:
    """Exact multisets; on a difference, says what is missing and what is extra (shortened)."""
    missing = Counter(map(repr, want)) - Counter(map(repr, got))
    extra = Counter(map(repr, got)) - Counter(map(repr, want))
    assert not missing and not extra, (
        f"{len(got)} rows read, {len(want)} sent;"
        f" missing {sum(missing.values())}: {[row[:160] for row in list(missing)[:3]]};"
        f" extra {sum(extra.values())}: {[row[:160] for row in list(extra)[:3]]}"
    )


def expected(records: Sequence[Sent], read_committed: bool) -> list[tuple[Any, ...]]:
    return sorted(
        (record.as_read() for record in records if not (read_committed and record.aborted)),
        key=repr,
    )


# --- the topics -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def topics(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topics]:
    if kafka.endpoint.kind != "kafka":
        pytest.skip("needs Apache Kafka (transactions, compaction), but the broker is tansu")
    skip_without_native()
    servers = kafka.endpoint.bootstrap_servers
    seed = random.randrange(2**32)
    print(f"test_record_batches_differential: record contents seed {seed}", file=sys.stderr)
    rng = random.Random(seed)
    stem = f"differential_{uuid.uuid4().hex[:8]}"
    written = Topics()
    large = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}

    for client, produce, null_header_values, null_key_and_value in (
        ("kafka_python", produce_with_kafka_python, False, False),
        ("librdkafka", produce_with_librdkafka, True, True),
    ):
        topic = f"{stem}_{client}"
        create_topic(servers, topic, len(CODECS), large)
        records = codec_records(
            rng, null_header_values=null_header_values, null_key_and_value=null_key_and_value
        )
        produce(servers, topic, records)
        written.sent[topic] = records

    script = JavaScript()
    java_topic = f"{stem}_java"
    create_topic(servers, java_topic, len(CODECS), large)
    java_records = codec_records(rng, null_header_values=True, null_key_and_value=True)
    for partition, codec in enumerate(CODECS):
        script.command("PRODUCER", codec, codec, "-")
        for record in java_records:
            if record.partition == partition:
                script.send(codec, java_topic, record)
        script.command("FLUSH", codec)
    written.sent[java_topic] = java_records
    transactions_topic = f"{stem}_java_transactions"
    create_topic(servers, transactions_topic, 2)
    written.sent[transactions_topic] = transactions_script(script, transactions_topic, rng)
    script.run(servers, tmp_path_factory.mktemp("java"))

    written.compacted = f"{stem}_compacted"
    written.compacted_offsets = fill_compacted_topic(servers, written.compacted, rng)

    written.rewritten = f"{stem}_broker_rewritten"
    rewriting = {"compression.type": "zstd", "message.timestamp.type": "LogAppendTime"}
    create_topic(servers, written.rewritten, 2, {**large, **rewriting})
    records = codec_records(rng, null_header_values=True, null_key_and_value=True)
    records = [record for record in records if record.partition < 2]
    started_ms = int(time.time() * 1000)
    produce_with_librdkafka(servers, written.rewritten, records)
    written.rewritten_between_ms = (started_ms, int(time.time() * 1000))
    written.sent[written.rewritten] = records
    yield written


@pytest.mark.parametrize("client", ["kafka_python", "librdkafka", "java"])
@pytest.mark.parametrize("isolation_level", ["read_uncommitted", "read_committed"])
def test_every_codec_written_by_a_client_decodes_identically(
    topics: Topics, kafka: Any, client: str, isolation_level: str
) -> None:
    topic = next(name for name in topics.sent if name.endswith(f"_{client}"))
    assert topic != topics.rewritten
    rows, seen = read_through_both_paths(kafka.endpoint.bootstrap_servers, topic, isolation_level)
    assert_same_rows(without_offsets(rows), expected(topics.sent[topic], False))
    # kafka-python sends a batch uncompressed when the codec gains nothing.
    assert {partition: codecs - {"none"} for partition, codecs in seen.codecs.items()} == {
        partition: {codec} - {"none"} for partition, codec in enumerate(CODECS)
    }
    assert all(CODECS[partition] in codecs for partition, codecs in seen.codecs.items())


@pytest.mark.parametrize("isolation_level", ["read_uncommitted", "read_committed"])
def test_committed_and_aborted_transactions_decode_identically(
    topics: Topics, kafka: Any, isolation_level: str
) -> None:
    topic = next(name for name in topics.sent if name.endswith("_java_transactions"))
    read_committed = isolation_level == "read_committed"
    rows, seen = read_through_both_paths(kafka.endpoint.bootstrap_servers, topic, isolation_level)
    sent = topics.sent[topic]
    assert_same_rows(without_offsets(rows), expected(sent, read_committed))
    assert any(record.aborted for record in sent)
    # Four markers per partition: two commits, two aborts.
    assert seen.control_batches >= 8
    if read_committed:
        assert seen.aborted_transactions >= 4
    assert seen.codecs == {0: {"none", "lz4", "zstd"}, 1: {"none", "lz4", "zstd"}}


def test_a_compacted_topic_with_gaps_decodes_identically(topics: Topics, kafka: Any) -> None:
    """Both paths agree on the cleaned log; every row read is the record sent at its offset,
    and each key's latest record is there (Kafka's compaction guarantee)."""
    servers = kafka.endpoint.bootstrap_servers
    rows, seen = read_through_both_paths(servers, topics.compacted, "read_uncommitted")
    assert all("lz4" in codecs for codecs in seen.codecs.values())
    for row in rows:
        assert row[:5] == topics.compacted_offsets[(row[0], row[5])].as_read()
    assert len(rows) < len(topics.compacted_offsets)
    latest: dict[tuple[int, bytes | None], Sent] = {}
    for (_, _), record in sorted(topics.compacted_offsets.items()):
        latest[(record.partition, record.key)] = record
    kept = {record.as_read() for record in latest.values() if record.value is not None}
    assert kept <= set(without_offsets(rows))


# --- what the native encoder writes, read back by every client -------------------------------

SINK_PARTITIONS = 3
SINK_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
"""Each costs a streaming query and four reads: about 5 s once the session's first query
has warmed up its Python workers (that one takes about 25 s)."""
SINK_ROWS = 240

SinkRow = tuple[int | None, bytes | None, bytes | None, Headers]
"""(partition column, key, value, headers) of one row written to 2pc-kafka."""


def sink_rows(rng: random.Random) -> list[SinkRow]:
    """Rows with Spark's Kafka sink columns: explicit partitions and nulls, null and empty
    keys and values, headers with unicode keys and null values, one value over 1 MB."""
    rows: list[SinkRow] = []
    for index in range(SINK_ROWS):
        partition = index % SINK_PARTITIONS if index % 4 == 0 else None
        key = None if index % 3 == 0 else b"" if index % 17 == 1 else b"key-%d" % (index % 29)
        value: bytes | None = (
            None
            if index % 11 == 4
            else b""
            if index % 19 == 2
            else b"value-%d-" % index + rng.randbytes(rng.randint(0, 60))
        )
        if index == 100:
            value = rng.randbytes(LARGE_VALUE_BYTES // 2) + b"\x07" * (LARGE_VALUE_BYTES // 2)
        headers: Headers = ()
        if index % 5 == 0:
            headers = (("h", b"%d" % index), ("ключ-键", None), ("h", b""))
        elif index % 5 == 1:
            headers = (("only", rng.randbytes(2)),)
        rows.append((partition, key, value, headers))
    return rows


def write_sink_source(directory: Path, rows: Sequence[SinkRow]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eospack.connectors.kafka.records.record_batches import HEADERS

    directory.mkdir(parents=True)
    table = pa.table(
        {
            "partition": pa.array([row[0] for row in rows], pa.int32()),
            "key": pa.array([row[1] for row in rows], pa.binary()),
            "value": pa.array([row[2] for row in rows], pa.binary()),
            "headers": pa.array(
                [[{"key": key, "value": value} for key, value in row[3]] or None for row in rows],
                HEADERS,
            ),
        }
    )
    pq.write_table(table, directory / "part-000.parquet")


ReadBack = tuple[int, int, bytes | None, bytes | None, str, int]
"""(partition, offset, key, value, headers repr, timestamp ms) of a record as a client read it."""


def headers_repr(headers: Sequence[tuple[str, bytes | None]] | None) -> str:
    return repr([{"key": key, "value": value} for key, value in headers or ()] or None)


def read_back_with_kafka_python(servers: str, topic: str) -> list[ReadBack]:
    ends = end_offsets(servers, topic, "read_committed")
    consumer = KafkaConsumer(
        bootstrap_servers=servers,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    rows: list[ReadBack] = []
    try:
        partitions = [TopicPartition(topic, partition) for partition in ends]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)

        def at_the_end() -> bool:
            for tp, messages in consumer.poll(timeout_ms=200).items():
                rows.extend(
                    (tp.partition, m.offset, m.key, m.value, headers_repr(m.headers), m.timestamp)
                    for m in messages
                )
            return all(consumer.position(tp) >= ends[tp.partition] for tp in partitions)

        wait_until(at_the_end, 60, f"kafka-python to read {topic}", poll=0)
    finally:
        consumer.close()
    return sorted(rows)


def read_back_with_librdkafka(servers: str, topic: str) -> list[ReadBack]:
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as LibrdkafkaPartition

    ends = end_offsets(servers, topic, "read_committed")
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"differential-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": False,
        }
    )
    rows: list[ReadBack] = []
    positions = dict.fromkeys(ends, 0)
    try:
        consumer.assign([LibrdkafkaPartition(topic, partition, 0) for partition in ends])

        def at_the_end() -> bool:
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                assert message.error() is None, message.error()
                partition, offset = message.partition(), message.offset()
                rows.append(
                    (
                        partition,
                        offset,
                        message.key(),
                        message.value(),
                        headers_repr(message.headers()),
                        message.timestamp()[1],
                    )
                )
                positions[partition] = offset + 1
            # The last records of a partition may be followed by a transaction marker.
            return all(
                positions[partition] >= end
                or consumer.position([LibrdkafkaPartition(topic, partition)])[0].offset >= end
                for partition, end in ends.items()
            )

        wait_until(at_the_end, 60, f"librdkafka to read {topic}", poll=0)
    finally:
        consumer.close()
    return sorted(rows)


def read_back_with_spark(spark: Any, servers: str, topic: str) -> list[ReadBack]:
    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .selectExpr(
            "partition", "offset", "key", "value", "headers", "unix_millis(timestamp) AS ms"
        )
    )
    return sorted(
        (
            row["partition"],
            row["offset"],
            None if row["key"] is None else bytes(row["key"]),
            None if row["value"] is None else bytes(row["value"]),
            headers_repr(
                [
                    (item["key"], None if item["value"] is None else bytes(item["value"]))
                    for item in row["headers"] or ()
                ]
            ),
            row["ms"],
        )
        for row in frame.collect()
    )


def executor_data_path(spark: Any) -> str:
    """``record_batches.active_path()`` as the session's Python workers (the sink's tasks)
    have it."""

    def active_path(_: Any) -> str:
        from eospack.connectors.kafka.records import record_batches

        return record_batches.active_path()

    return str(spark.sparkContext.parallelize([0], 1).map(active_path).collect()[0])


@pytest.mark.parametrize("compression", SINK_CODECS)
def test_what_the_native_encoder_writes_every_client_reads_identically(
    spark_kafka: Any, kafka: Any, tmp_path: Path, unique_name: str, compression: str
) -> None:
    """2pc-kafka (exactly-once: transactional, native encoder) writes the rows; kafka-python,
    librdkafka and Spark's JVM source read the same records (partition, offset, key, value,
    headers, timestamp), which are exactly the rows, each in the partition it asked for or
    its key's murmur2 partition; and both decode paths agree on the raw data."""
    from eospack.lab.testing import await_query

    if kafka.endpoint.kind != "kafka":
        pytest.skip("needs Apache Kafka (read_committed), but the broker is tansu")
    skip_without_native()
    servers = kafka.endpoint.bootstrap_servers
    seed = random.randrange(2**32)
    print(f"native encoder read-back: rows seed {seed}", file=sys.stderr)
    rows = sink_rows(random.Random(seed))
    create_topic(
        servers, unique_name, SINK_PARTITIONS, {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    )
    write_sink_source(tmp_path / "source", rows)
    frame = spark_kafka.readStream.schema(
        "partition INT, key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
    ).parquet(str(tmp_path / "source"))
    options = {
        "kafka.bootstrap.servers": servers,
        "topic": unique_name,
        "ledgerTopic": f"{unique_name}_ledger",
        "kafka.max.request.size": str(MAX_MESSAGE_BYTES),
        "kafka.batch.size": "16384",
        "checkpointLocation": str(tmp_path / "checkpoint"),
    }
    if compression != "none":
        # "none" is the default; kafka-python refuses it by name ("Not supported codec").
        options["kafka.compression.type"] = compression
    query = (
        frame.repartition(2)
        .writeStream.format("2pc-kafka")
        .options(**options)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 180)
    assert executor_data_path(spark_kafka).startswith("native"), "the sink ran the reference"

    by_kafka_python = read_back_with_kafka_python(servers, unique_name)
    by_librdkafka = read_back_with_librdkafka(servers, unique_name)
    by_spark = read_back_with_spark(spark_kafka, servers, unique_name)
    assert by_librdkafka == by_kafka_python
    assert by_spark == by_kafka_python
    decoded, seen = read_through_both_paths(servers, unique_name, "read_committed")
    assert (
        sorted((row[0], row[5], row[1], row[2], row[3], row[4]) for row in decoded)
        == by_kafka_python
    )
    assert compression in set().union(*seen.codecs.values())

    assert_same_rows(
        [(row[2], row[3], row[4]) for row in by_kafka_python],
        [(key, value, headers_repr(headers)) for _, key, value, headers in rows],
    )
    contents = Counter((key, value, headers_repr(headers)) for _, key, value, headers in rows)
    placed = {(row[2], row[3], row[4]): row[0] for row in by_kafka_python}
    for wanted, key, value, headers in rows:
        if contents[(key, value, headers_repr(headers))] > 1:
            continue  # rows alike: which went where cannot be told
        partition = placed[(key, value, headers_repr(headers))]
        if wanted is not None:
            assert partition == wanted
        elif key is not None:
            assert partition == record_batches.NATIVE.partition_for_key(key, SINK_PARTITIONS)


def test_batches_the_broker_rewrote_decode_identically(topics: Topics, kafka: Any) -> None:
    """A topic with compression.type=zstd and LogAppendTime: the broker itself rebuilds the
    producer's batches (gzip and uncompressed) as zstd, stamped with its append time, which
    every record then carries."""
    rows, seen = read_through_both_paths(
        kafka.endpoint.bootstrap_servers, topics.rewritten, "read_uncommitted"
    )
    sent = topics.sent[topics.rewritten]
    assert_same_rows([row[:4] for row in rows], [record.as_read()[:4] for record in sent])
    assert seen.codecs == {0: {"zstd"}, 1: {"zstd"}}
    assert seen.log_append_time_batches > 0
    first, last = topics.rewritten_between_ms
    assert all(first <= row[4] <= last for row in rows), (
        first,
        last,
        sorted({row[4] for row in rows}),
    )
