"""Attacks on issue 27's fixed-cost changes to replayable-kafka, against real services.

- Small ranges share a read task (``minRecordsPerPartition``): a query restarted with
  another packing replays an undecided batch with other write tasks than its first attempt
  left prepared; the 2PC sink must still write each row once and leave nothing prepared.
- One task reads several ranges with one pooled consumer: a range that is data loss, or one
  held by an open transaction, must not cost the other ranges of the task their rows.
- The poll loop starts at 2 ms and fetches wait 5 ms: a range waiting for a transaction
  still ends with the transaction's outcome, and times out with the transaction named. What
  the wait costs in CPU and fetches is printed (measured, never asserted).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from eospack.connectors.kafka.errors import KafkaDataLossError, KafkaReadTimeoutError
from eospack.connectors.kafka.source import reader as kafka_reader
from eospack.connectors.kafka.source.data_source import read_ranges
from eospack.connectors.kafka.source.offset_ranges import OffsetRange
from eospack.connectors.kafka.source.options import parse_options
from eospack.core import faults
from eospack.lab.services.kafka_tools import (
    Record,
    create_topic,
    delete_records,
    delete_topic,
    end_offsets,
    produce_sealed,
    transactional_producer,
)
from eospack.lab.testing import await_query, wait_until

pytestmark = pytest.mark.integration

FORMAT = "replayable-kafka"


def servers_of(kafka: Any) -> str:
    return kafka.endpoint.bootstrap_servers


def records_of(partitions: int, per_partition: int, tag: str = "v") -> list[Record]:
    return [
        Record(p, f"k{p}-{i}".encode(), f"{tag}{p}-{i}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]


def offsets_read(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    return [
        (partition, offset)
        for batch in batches
        for partition, offset in zip(
            batch.column("partition").to_pylist(), batch.column("offset").to_pylist(), strict=True
        )
    ]


def options_for(servers: str, topic: str, **extra: str) -> Any:
    return parse_options({"kafka.bootstrap.servers": servers, "subscribe": topic, **extra})


# Packing changed between a first attempt and its replay ------------------------------------


class _ReplaySink:
    """One 2PC sink under the replay attack: its options, its rows and its leftovers."""

    format: str
    decide: str
    fence: str | None
    """The call Spark's abort fences through (None: not a call of the fault rig)."""
    attempts = 1
    """How often the sink's client sends a failed call (each attempt claims one fault)."""
    rides_through = False
    """Whether the sink retries a failed decision write itself within the same query (the
    query survives the fault and decides batch 0 in its first attempt)."""

    def __init__(self, service: Any, name: str) -> None:
        self.service, self.name = service, name

    def options(self) -> dict[str, str]:
        raise NotImplementedError

    def rows(self, spark: Any) -> list[tuple[int, int, str]]:
        raise NotImplementedError

    def left_prepared(self) -> int:
        raise NotImplementedError


class _JdbcSink(_ReplaySink):
    format, decide, fence = "2pc-jdbc", "jdbc.decide", "jdbc.fence"

    def options(self) -> dict[str, str]:
        endpoint = self.service.endpoint
        return {
            "url": endpoint.jdbc_url,
            "user": endpoint.user,
            "dbtable": self.name,
            "createTableIfNotExists": "true",
        }

    def rows(self, spark: Any) -> list[tuple[int, int, str]]:
        import psycopg

        with psycopg.connect(self.service.endpoint.url) as connection:
            return connection.execute(
                f'SELECT "partition", "offset", "value" FROM "{self.name}" ORDER BY 1, 2'
            ).fetchall()

    def left_prepared(self) -> int:
        import psycopg

        with psycopg.connect(self.service.endpoint.url) as connection:
            row = connection.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, 'eospack-')"
            ).fetchone()
        return int(row[0]) if row else 0


class _S3Sink(_ReplaySink):
    format, decide, fence = "2pc-s3", "s3.PutObject", "s3.PutObject"
    attempts = 5  # boto3's retries (s3_client's max_attempts)

    def connection(self) -> dict[str, str]:
        endpoint = self.service.endpoint
        return {
            "endpointUrl": endpoint.endpoint_url,
            "region": endpoint.region,
            "accessKeyId": endpoint.access_key_id,
            "secretAccessKey": endpoint.secret_access_key,
        }

    def options(self) -> dict[str, str]:
        return {**self.connection(), "path": f"s3://{self.service.endpoint.bucket}/{self.name}"}

    def rows(self, spark: Any) -> list[tuple[int, int, str]]:
        frame = spark.read.format("2pc-s3").options(**self.options()).load()
        return sorted(
            (row.partition, row.offset, row.value)
            for row in frame.select("partition", "offset", "value").collect()
        )

    def left_prepared(self) -> int:
        answer = self.service.endpoint.client().list_multipart_uploads(
            Bucket=self.service.endpoint.bucket, Prefix=f"{self.name}/"
        )
        return len(answer.get("Uploads", ()))


class _KafkaSink(_ReplaySink):
    format, decide, fence = "2pc-kafka", "kafka_sink.decide", None
    rides_through = True
    """A failed ledger write is a transient Kafka failure: the driver retries it on a ledger
    opened afresh for up to ``ride_through.RIDE_THROUGH_SECONDS`` (issue 37), reading the
    slot back first (a write whose answer was lost is not written twice) and checking the
    pieces again before an undecided batch is decided."""

    def options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": servers_of(self.service),
            "topic": f"{self.name}_out",
            "ledgerTopic": f"{self.name}_ledger",
        }

    def rows(self, spark: Any) -> list[tuple[int, int, str]]:
        from eospack.lab.services.kafka_tools import read_all

        found = read_all(
            servers_of(self.service), f"{self.name}_out", isolation_level="read_committed"
        )
        rows = []
        for _, _, key, value in found:
            partition, offset = (key or b"").decode().split(":")
            rows.append((int(partition), int(offset), (value or b"").decode()))
        return sorted(rows)

    def left_prepared(self) -> int:
        """Records of the output topic past its last stable offset (open transactions)."""
        topic = f"{self.name}_out"
        servers = servers_of(self.service)
        stable = end_offsets(servers, topic, "read_committed")
        high = end_offsets(servers, topic)
        return sum(high[p] - stable[p] for p in high)


_REPLAY_SINKS: dict[str, tuple[type[_ReplaySink], str]] = {
    "2pc-jdbc": (_JdbcSink, "postgres"),
    "2pc-s3": (_S3Sink, "s3"),
    "2pc-kafka": (_KafkaSink, "real_kafka"),
}


def start_into(
    spark: Any, servers: str, topic: str, sink: _ReplaySink, checkpoint: Path, **source: str
) -> Any:
    frame = (
        spark.readStream.format(FORMAT)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafkaConsumer.pollTimeoutMs", "15000")
        .options(**source)
        .load()
    )
    if sink.format == "2pc-kafka":
        frame = frame.selectExpr(
            "CONCAT(CAST(partition AS STRING), ':', CAST(offset AS STRING)) AS key",
            "CAST(value AS STRING) AS value",
        )
    else:
        frame = frame.selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
    return (
        frame.writeStream.format(sink.format)
        .options(**sink.options())
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _replay_cases() -> list[Any]:
    cases = []
    for sink in _REPLAY_SINKS:
        for decided in (False, True):
            for first, replay in (("1", None), (None, "1")):
                quick = sink == "2pc-jdbc" and not decided and first == "1"
                marks = () if quick else (pytest.mark.chaos,)
                outcome = "decided" if decided else "undecided"
                name = f"{sink}-{outcome}-{first or 'default'}-then-{replay or 'default'}"
                cases.append(pytest.param(sink, decided, first, replay, marks=marks, id=name))
    return cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("sink_format", "decided", "first", "replay"), _replay_cases())
def test_a_replay_packed_otherwise_than_its_first_attempt_writes_each_row_once(
    request: pytest.FixtureRequest,
    spark: Any,
    kafka: Any,
    unique_name: str,
    tmp_path: Path,
    call_faults: Path,
    sink_format: str,
    decided: bool,
    first: str | None,
    replay: str | None,
) -> None:
    """Batch 0 of five 20-record ranges prepares one piece per task (minRecordsPerPartition
    1: five tasks; the default: one), then its commit fails: undecided (the decision write
    fails, and so does Spark's abort where the rig can fail it, so the pieces stay prepared
    as after a driver crash), or decided (the decision applied, its answer lost). The
    restart packs the ranges the other way and replays batch 0: every row exactly once,
    nothing left prepared, whatever the first attempt left.

    A sink that rides through a failed decision write (2pc-kafka) never lets the first
    attempt fail: the fault must fire, the query must still decide and commit batch 0 with
    every row exactly once and nothing left open, and the restart packed the other way must
    then find nothing to replay (its rows unchanged: no batch written twice)."""
    sink_type, fixture = _REPLAY_SINKS[sink_format]
    sink = sink_type(request.getfixturevalue(fixture), unique_name)
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=5)
    produce_sealed(servers, unique_name, records_of(5, 20))
    checkpoint = tmp_path / "checkpoint"
    retries = sink.attempts - 1
    if decided:
        faults.arm(call_faults, sink.decide, "after", batch_id=0)
        if retries:
            faults.arm(call_faults, sink.decide, "before", batch_id=0, times=retries)
    else:
        faults.arm(call_faults, sink.decide, "before", batch_id=0, times=sink.attempts)
        if sink.fence:
            faults.arm(call_faults, sink.fence, "before", batch_id=0, times=sink.attempts)

    def packing(value: str | None) -> dict[str, str]:
        return {"minRecordsPerPartition": value} if value else {}

    expected = [(p, i, f"v{p}-{i}") for p in range(5) for i in range(20)]
    first_attempt = start_into(spark, servers, unique_name, sink, checkpoint, **packing(first))
    if sink.rides_through:
        await_query(first_attempt, 120)  # raises if the query failed
        assert (call_faults / faults.INJECTED_LOG).read_text().count(sink.decide) == 1
        assert (checkpoint / "commits" / "0").exists(), "batch 0 must be committed"
        assert sink.rows(spark) == expected
        assert sink.left_prepared() == 0
    else:
        with pytest.raises(StreamingQueryException):
            await_query(first_attempt, 120)
        count = (call_faults / faults.INJECTED_LOG).read_text().count(sink.decide)
        assert count >= sink.attempts
        assert not (checkpoint / "commits" / "0").exists()
        if not decided and sink.fence:
            assert sink.left_prepared() == (5 if first else 1), "the pieces must stay prepared"

    await_query(start_into(spark, servers, unique_name, sink, checkpoint, **packing(replay)), 120)

    assert sink.rows(spark) == expected
    assert sink.left_prepared() == 0


# Several ranges in one task ---------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_range_that_is_data_loss_among_packed_ranges_keeps_the_others_rows(
    real_kafka: Any, unique_name: str, fail_on_data_loss: bool
) -> None:
    """Three ranges in one task: p0 whole, p1 planned beyond its end (lost), p2 of which the
    first records were deleted. failOnDataLoss=false: every record still there, once, and
    the pooled consumer goes on after a lost range; true: the task fails naming p1."""
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=3)
    produce_sealed(servers, unique_name, records_of(3, 10))
    delete_records(servers, unique_name, {2: 4})
    options = options_for(
        servers,
        unique_name,
        failOnDataLoss=str(fail_on_data_loss).lower(),
        **{"kafkaConsumer.pollTimeoutMs": "20000"},
    )
    ranges = [
        OffsetRange(unique_name, 0, 0, 10),
        OffsetRange(unique_name, 1, 5, 30),
        OffsetRange(unique_name, 2, 0, 10),
    ]
    kafka_reader.close_idle_consumers()
    try:
        if fail_on_data_loss:
            with pytest.raises(KafkaDataLossError, match=rf"{unique_name}-1 \[5, 30\)"):
                list(read_ranges(options, ranges))
            return
        read = offsets_read(list(read_ranges(options, ranges)))
    finally:
        kafka_reader.close_idle_consumers()
    expected = [(0, i) for i in range(10)] + [(1, i) for i in range(5, 10)]
    assert read == expected + [(2, i) for i in range(4, 10)]


def open_transaction(servers: str, topic: str, partition: int, count: int) -> Any:
    producer = transactional_producer(servers, transaction_timeout_ms=300_000)
    producer.begin_transaction()
    for index in range(count):
        producer.send(topic, value=b"txn-%d" % index, partition=partition)
    producer.flush()
    return producer


class _Reading(threading.Thread):
    """Reads ``ranges`` in one task on a thread; records rows, error and CPU seconds."""

    def __init__(self, options: Any, ranges: list[OffsetRange]) -> None:
        super().__init__(daemon=True)
        self.options, self.ranges = options, ranges
        self.rows: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0

    def run(self) -> None:
        started, cpu = time.monotonic(), time.thread_time()
        try:
            for batch in read_ranges(self.options, self.ranges):
                self.rows.extend(offsets_read([batch]))
        except BaseException as error:
            self.error = error
        finally:
            self.cpu_seconds = time.thread_time() - cpu
            self.wall_seconds = time.monotonic() - started


@pytest.mark.timeout(120)
@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_a_packed_range_held_by_an_open_transaction_ends_with_its_outcome(
    real_kafka: Any, unique_name: str, outcome: str
) -> None:
    """Two ranges in one task, read_committed: p0 whole, then p1 planned up to its high
    watermark (as read_uncommitted plans) while a transaction is open in it. The task waits,
    then reads the committed records (or skips the aborted ones) and nothing else."""
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=2)
    produce_sealed(servers, unique_name, records_of(2, 5))
    producer = open_transaction(servers, unique_name, 1, 3)
    try:
        high = end_offsets(servers, unique_name)[1]
        assert high == 8
        options = options_for(servers, unique_name)
        ranges = [OffsetRange(unique_name, 0, 0, 5), OffsetRange(unique_name, 1, 0, high)]
        kafka_reader.close_idle_consumers()
        reading = _Reading(options, ranges)
        reading.start()
        wait_until(lambda: len(reading.rows) >= 10, 30, "the records before the transaction")
        assert reading.is_alive(), "the read ended before the transaction was decided"
        if outcome == "commit":
            producer.commit_transaction()
        else:
            producer.abort_transaction()
        reading.join(60)
        assert not reading.is_alive()
    finally:
        producer.close()
        kafka_reader.close_idle_consumers()
    assert reading.error is None, reading.error
    committed = [(1, i) for i in range(5, 8)] if outcome == "commit" else []
    assert sorted(reading.rows) == sorted([(p, i) for p in range(2) for i in range(5)] + committed)
    print(
        f"waited for the transaction: {reading.wall_seconds:.2f} s wall,"
        f" {reading.cpu_seconds:.3f} s CPU on the reading thread"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fetch_max_wait_ms", [None, pytest.param("100", marks=pytest.mark.chaos)])
def test_a_packed_range_stuck_on_an_open_transaction_times_out_naming_it(
    real_kafka: Any, unique_name: str, fetch_max_wait_ms: str | None
) -> None:
    """The second range of a task waits on a transaction that is never decided: the task
    fails after kafkaConsumer.pollTimeoutMs of that range, naming the range and the
    transaction. Prints the CPU the wait cost with the 5 ms default and a user's 100 ms."""
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=2)
    produce_sealed(servers, unique_name, records_of(2, 5))
    producer = open_transaction(servers, unique_name, 1, 3)
    try:
        extra = {"kafkaConsumer.pollTimeoutMs": "4000"}
        if fetch_max_wait_ms:
            extra["kafka.fetch.max.wait.ms"] = fetch_max_wait_ms
        options = options_for(servers, unique_name, **extra)
        ranges = [OffsetRange(unique_name, 0, 0, 5), OffsetRange(unique_name, 1, 0, 8)]
        kafka_reader.close_idle_consumers()
        reading = _Reading(options, ranges)
        reading.start()
        reading.join(60)
        assert not reading.is_alive()
    finally:
        producer.abort_transaction()
        producer.close()
        kafka_reader.close_idle_consumers()
    assert isinstance(reading.error, KafkaReadTimeoutError), reading.error
    message = str(reading.error)
    assert f"{unique_name}-1 [0, 8)" in message
    assert "stuck at offset 5 for 4000 ms" in message
    assert "a transaction open at that offset is not decided yet" in message
    assert "kafkaConsumer.pollTimeoutMs" in message
    assert sorted(reading.rows[:5]) == [(0, i) for i in range(5)]
    print(
        f"fetch.max.wait.ms={fetch_max_wait_ms or 'default 5'}: stuck {reading.wall_seconds:.2f}"
        f" s wall, {reading.cpu_seconds:.3f} s CPU on the reading thread"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_packed_task_whose_first_range_was_deleted_with_its_topic_reads_the_next(
    real_kafka: Any, unique_name: str, fail_on_data_loss: bool
) -> None:
    """The first range of a task belongs to a topic deleted after planning; the second to
    a topic that is still there. failOnDataLoss=false: the task reads the second range
    whole with the same pooled consumer; true: it fails naming the deleted range."""
    servers = servers_of(real_kafka)
    gone, kept = f"{unique_name}_gone", f"{unique_name}_kept"
    for topic in (gone, kept):
        create_topic(servers, topic, partitions=1)
        produce_sealed(servers, topic, records_of(1, 10))
    delete_topic(servers, gone)
    options = parse_options(
        {
            "kafka.bootstrap.servers": servers,
            "subscribe": f"{gone},{kept}",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
            "kafka.request.timeout.ms": "3000",
            "kafkaConsumer.pollTimeoutMs": "30000",
        }
    )
    ranges = [OffsetRange(gone, 0, 0, 10), OffsetRange(kept, 0, 0, 10)]
    kafka_reader.close_idle_consumers()
    try:
        if fail_on_data_loss:
            with pytest.raises(KafkaDataLossError, match=rf"{gone}-0 \[0, 10\)"):
                list(read_ranges(options, ranges))
            return
        batches = list(read_ranges(options, ranges))
    finally:
        kafka_reader.close_idle_consumers()
    assert [topic for batch in batches for topic in batch.column("topic").to_pylist()] == [
        kept
    ] * 10
    assert offsets_read(batches) == [(0, i) for i in range(10)]


@pytest.mark.timeout(120)
def test_a_poll_timeout_shorter_than_the_stall_check_still_reports_data_loss(
    real_kafka: Any, unique_name: str
) -> None:
    """kafkaConsumer.pollTimeoutMs=1000 (below the reader's 2 s stall check) and a range
    planned beyond the partition's end, failOnDataLoss=false: the lost offsets are data
    loss (skipped with a warning), not a read timeout that fails the task on every replay."""
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, records_of(1, 10))
    options = options_for(
        servers,
        unique_name,
        failOnDataLoss="false",
        **{"kafkaConsumer.pollTimeoutMs": "1000"},
    )
    kafka_reader.close_idle_consumers()
    try:
        batches = list(read_ranges(options, [OffsetRange(unique_name, 0, 5, 30)]))
    finally:
        kafka_reader.close_idle_consumers()
    assert offsets_read(batches) == [(0, i) for i in range(5, 10)]


@pytest.mark.timeout(120)
def test_a_poll_timeout_shorter_than_the_stall_check_names_the_open_transaction(
    real_kafka: Any, unique_name: str
) -> None:
    """kafkaConsumer.pollTimeoutMs=1000 and a read_committed range held by a transaction
    that stays open: the timeout names the transaction, not the brokers."""
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, records_of(1, 5))
    producer = open_transaction(servers, unique_name, 0, 3)
    options = options_for(servers, unique_name, **{"kafkaConsumer.pollTimeoutMs": "1000"})
    kafka_reader.close_idle_consumers()
    try:
        with pytest.raises(KafkaReadTimeoutError) as raised:
            list(read_ranges(options, [OffsetRange(unique_name, 0, 0, 8)]))
    finally:
        producer.abort_transaction()
        producer.close()
        kafka_reader.close_idle_consumers()
    assert "a transaction open at that offset is not decided yet" in str(raised.value)
