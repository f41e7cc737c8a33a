"""replayable-kafka against the embedded broker: schema, batch and streaming reads, admission
control, AvailableNow, offset gaps, data loss, errors, and exactly-once across a restart;
replays of batch 0 and of batches with new partitions read the ranges first planned; topic
re-creation (topic ids), CreatePartitions, DeleteRecords and read_committed on Apache Kafka
(``real_kafka`` skips those on tansu).

Test data is always produced with ``produce_sealed`` (the embedded broker reports exact end
offsets only when a partition's last record batch holds one record).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamReader

from eospack.connectors.kafka.source import reader as kafka_reader
from eospack.connectors.kafka.source.offset_format import topic_id_text
from eospack.connectors.kafka.source.offset_ranges import OffsetRange
from eospack.connectors.kafka.source.options import parse_options
from eospack.core.spark_features import ADMISSION_CONTROL
from eospack.lab.services.kafka_tools import (
    Record,
    add_partitions,
    create_topic,
    delete_records,
    delete_topic,
    end_offsets,
    produce_sealed,
    produce_transaction,
    transactional_producer,
)
from eospack.lab.testing import wait_until
from integration_tests.kafka_source_parts import (
    FAST_FAIL,
    FORMAT,
    BatchRecorder,
    expected_rows,
    keyed_rows,
    make_records,
    read_stream,
    run_available_now,
    servers_of,
    start_recording,
)

pytestmark = pytest.mark.integration


def read_batch(spark: SparkSession, servers: str, **options: str) -> DataFrame:
    reader = spark.read.format(FORMAT).option("kafka.bootstrap.servers", servers)
    return reader.options(**FAST_FAIL).options(**options).load()


def test_batch_read_schema_headers_and_ending_offsets(spark, kafka, unique_name):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    records = [
        Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), headers=[("n", b"%d" % i)] * (i % 2))
        for i in range(40)
    ]
    produce_sealed(servers, unique_name, records)

    df = read_batch(
        spark,
        servers,
        subscribe=unique_name,
        includeHeaders="true",
        startingOffsets=json.dumps({unique_name: {"0": 5, "1": -2}}),
        endingOffsets=json.dumps({unique_name: {"0": 15, "1": -1}}),
    )

    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    rows = df.collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, o) for o in range(5, 15)] + [
        (1, o) for o in range(20)
    ]
    by_value = {bytes(r.value): r for r in rows}
    assert by_value[b"v10"].key == b"k10" and by_value[b"v10"].headers is None
    assert [(h.key, bytes(h.value)) for h in by_value[b"v11"].headers] == [("n", b"11")]
    assert {r.timestampType for r in rows} == {0}
    assert all(abs(time.time() - r.timestamp.timestamp()) < 600 for r in rows)


def test_batch_read_min_partitions_splits_ranges_without_loss_or_overlap(spark, kafka, unique_name):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    records = make_records(1, 1000)
    produce_sealed(servers, unique_name, records)

    df = read_batch(spark, servers, subscribe=unique_name, minPartitions="4")

    assert df.rdd.getNumPartitions() == 4
    assert keyed_rows(df) == expected_rows(unique_name, records)


@pytest.mark.parametrize(("min_records", "tasks"), [(None, 2), ("1", 5), ("100000", 1)])
def test_small_ranges_share_tasks_up_to_min_records_per_partition(
    spark, kafka, unique_name, min_records, tasks
):
    """Five ranges of 120, 120, 120, 120 and 9,990 records: the default (10,000) packs
    the four small ones into one task and leaves the large one alone; 1 packs nothing (one
    task per range, as Spark); 100,000 packs all. Every row once whatever the packing."""
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=5)
    records = make_records(4, 120) + [
        Record(4, record.key, record.value) for record in make_records(1, 9_990, "big")
    ]
    produce_sealed(servers, unique_name, records)
    options = {"minRecordsPerPartition": min_records} if min_records else {}

    df = read_batch(spark, servers, subscribe=unique_name, **options)

    assert df.rdd.getNumPartitions() == tasks
    assert keyed_rows(df) == expected_rows(unique_name, records)


@pytest.mark.compat
def test_streaming_reads_several_topics_and_partitions(spark, kafka, unique_name, tmp_path):
    servers = servers_of(kafka)
    first, second = f"{unique_name}_a", f"{unique_name}_b"
    create_topic(servers, first, partitions=3)
    create_topic(servers, second, partitions=2)
    records_first = make_records(3, 30, "a")
    records_second = make_records(2, 25, "b")
    produce_sealed(servers, first, records_first)
    produce_sealed(servers, second, records_second)
    recorder = BatchRecorder()

    stream = read_stream(spark, servers, subscribe=f"{first},{second}", startingOffsets="earliest")
    run_available_now(stream, tmp_path / "checkpoint", recorder)

    assert recorder.all_rows() == sorted(
        expected_rows(first, records_first) + expected_rows(second, records_second)
    )


def test_max_offsets_per_trigger_sizes_batches_and_reports_lag(spark, kafka, unique_name, tmp_path):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    records = make_records(2, 50)
    produce_sealed(servers, unique_name, records)
    recorder = BatchRecorder()

    stream = read_stream(
        spark,
        servers,
        subscribe=unique_name,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="30",
    )
    query = run_available_now(stream, tmp_path / "checkpoint", recorder)

    assert recorder.sizes() == [30, 30, 30, 10]
    assert recorder.all_rows() == expected_rows(unique_name, records)
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    logged = [json.loads(p["sources"][0]["endOffset"]) for p in progress]
    # Spark's Kafka shape for the ends, and each batch's own starts beside them.
    assert [{unique_name: offsets[unique_name]} for offsets in logged] == [
        {unique_name: {"0": 15, "1": 15}},
        {unique_name: {"0": 30, "1": 30}},
        {unique_name: {"0": 45, "1": 45}},
        {unique_name: {"0": 50, "1": 50}},
    ]
    assert [offsets["@starts"] for offsets in logged] == [
        {unique_name: {"0": 0, "1": 0}},
        {unique_name: {"0": 15, "1": 15}},
        {unique_name: {"0": 30, "1": 30}},
        {unique_name: {"0": 45, "1": 45}},
    ]
    assert set(logged[0]) == {unique_name, "@starts", "@topicIds"}
    assert json.loads(progress[0]["sources"][0]["latestOffset"]) == {
        unique_name: {"0": 50, "1": 50}
    }


def test_available_now_stops_at_the_offsets_present_at_start(spark, kafka, unique_name, tmp_path):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    records = make_records(2, 20)
    produce_sealed(servers, unique_name, records)
    recorder = BatchRecorder()

    def produce_more_during_first_batch(df: DataFrame, batch_id: int) -> None:
        if batch_id == 0:
            produce_sealed(servers, unique_name, make_records(2, 5, "late"))
        recorder(df, batch_id)

    stream = read_stream(
        spark,
        servers,
        subscribe=unique_name,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="10",
        # AvailableNow ignores the minimum: it must finish, not wait for 1000 offsets.
        minOffsetsPerTrigger="5",
    )
    run_available_now(stream, tmp_path / "checkpoint", produce_more_during_first_batch)

    assert recorder.sizes() == [10, 10, 10, 10]
    assert recorder.all_rows() == expected_rows(unique_name, records)
    assert end_offsets(servers, unique_name) == {0: 25, 1: 25}


def test_min_offsets_per_trigger_alone_is_accepted_by_available_now(
    spark, kafka, unique_name, tmp_path
):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, make_records(1, 10))
    recorder = BatchRecorder()

    stream = read_stream(
        spark,
        servers,
        subscribe=unique_name,
        startingOffsets="earliest",
        minOffsetsPerTrigger="1000",
    )
    run_available_now(stream, tmp_path / "checkpoint", recorder)

    assert recorder.sizes() == [10]


@pytest.mark.timeout(150)
def test_pattern_subscription_picks_up_a_new_topic_from_its_earliest_offset(
    spark, kafka, unique_name
):
    servers = servers_of(kafka)
    old_topic, new_topic = f"{unique_name}_old", f"{unique_name}_new"
    create_topic(servers, old_topic, partitions=1)
    produce_sealed(servers, old_topic, make_records(1, 5, "before"))
    table = f"pattern_{unique_name}"
    query = (
        read_stream(spark, servers, subscribePattern=f"{unique_name}_.*")  # startingOffsets=latest
        .load()
        .writeStream.format("memory")
        .queryName(table)
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        # The first (empty) trigger has resolved the starting offsets to latest.
        wait_until(lambda: query.lastProgress, 60, "the first trigger")
        produce_sealed(servers, old_topic, make_records(1, 3, "after"))
        create_topic(servers, new_topic, partitions=2)
        new_records = make_records(2, 4, "new")
        produce_sealed(servers, new_topic, new_records)
        expected = sorted(
            [(old_topic, 0, 5 + i, b"after0-%d" % i) for i in range(3)]
            + expected_rows(new_topic, new_records)
        )
        wait_until(
            lambda: len(spark.table(table).collect()) >= len(expected),
            60,
            "rows of the new topic",
        )
        assert query.exception() is None
        assert keyed_rows(spark.table(table)) == expected
    finally:
        query.stop()


def produce_transactions(servers: str, topic: str, transactions: int, tag: str) -> list[bytes]:
    """Committed transactions of two records each: every commit marker takes an offset."""
    producer = KafkaProducer(bootstrap_servers=servers, transactional_id=f"{topic}-{tag}")
    values = []
    try:
        producer.init_transactions()
        for t in range(transactions):
            producer.begin_transaction()
            for i in range(2):
                value = f"{tag}-{t}-{i}".encode()
                producer.send(topic, value=value, partition=0).get(timeout=30)
                values.append(value)
            producer.commit_transaction()
    finally:
        producer.close()
    return values


def test_offset_gaps_from_transaction_markers_read_the_same_rows_again(
    spark, kafka, unique_name, tmp_path
):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    values = produce_transactions(servers, unique_name, 6, "tx")
    # Two records and one commit marker per transaction: offsets 2, 5, 8, ... hold no record.
    assert end_offsets(servers, unique_name) == {0: 18}
    record_offsets = [o for o in range(18) if o % 3 != 2]
    recorder = BatchRecorder()

    stream = read_stream(
        spark, servers, subscribe=unique_name, startingOffsets="earliest", maxOffsetsPerTrigger="4"
    )
    run_available_now(stream, tmp_path / "checkpoint", recorder)

    all_rows = recorder.all_rows()
    assert [(o, v) for _, _, o, v in all_rows] == list(zip(record_offsets, values, strict=True))
    # Batches end on markers and mid-transaction alike; each is [start, end) by position.
    assert recorder.sizes() == [3, 3, 2, 3, 1]
    # Reading each batch's range again returns exactly its rows, including a range that
    # holds only a marker ([2, 3)) and one that ends on a marker.
    for start, end in [(0, 4), (4, 8), (2, 3), (9, 18)]:
        again = read_batch(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets=json.dumps({unique_name: {"0": start}}),
            endingOffsets=json.dumps({unique_name: {"0": end}}),
        )
        assert keyed_rows(again) == [r for r in all_rows if start <= r[2] < end]


def test_a_consumer_is_reused_between_ranges_in_one_worker(kafka, unique_name):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    produce_sealed(servers, unique_name, make_records(2, 10))
    options = parse_options({"kafka.bootstrap.servers": servers, "subscribe": unique_name})
    kafka_reader.close_idle_consumers()
    try:
        first = list(kafka_reader.read_range(options, OffsetRange(unique_name, 0, 2, 7)))
        (consumer,) = kafka_reader._idle_consumers.values()
        second = list(kafka_reader.read_range(options, OffsetRange(unique_name, 1, 0, 10)))
        assert list(kafka_reader._idle_consumers.values()) == [consumer]
    finally:
        kafka_reader.close_idle_consumers()
    assert [o for b in first for o in b.column("offset").to_pylist()] == [2, 3, 4, 5, 6]
    assert [o for b in second for o in b.column("offset").to_pylist()] == list(range(10))


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_starting_offset_beyond_the_end_is_data_loss(
    spark, kafka, unique_name, tmp_path, fail_on_data_loss
):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    records = make_records(1, 10)
    produce_sealed(servers, unique_name, records)
    recorder = BatchRecorder()
    stream = read_stream(
        spark,
        servers,
        subscribe=unique_name,
        startingOffsets=json.dumps({unique_name: {"0": 50}}),
        failOnDataLoss=str(fail_on_data_loss).lower(),
    )

    if fail_on_data_loss:
        with pytest.raises(Exception) as raised:
            run_available_now(stream, tmp_path / "checkpoint", recorder)
        message = str(raised.value)
        assert f"asks for offset 50 of {unique_name}-0" in message
        assert "outside the available offsets [0, 10]" in message
        assert "failOnDataLoss=false" in message
        assert recorder.batches == {}
    else:
        run_available_now(stream, tmp_path / "checkpoint", recorder)
        assert recorder.all_rows() == expected_rows(unique_name, records)


def recreate_topic(servers: str, topic: str) -> None:
    delete_topic(servers, topic)
    create_topic(servers, topic, partitions=1)
    wait_until(lambda: end_offsets(servers, topic) == {0: 0}, 20, "the re-created empty topic")


def topic_id_of(servers: str, topic: str) -> str | None:
    consumer = KafkaConsumer(bootstrap_servers=servers)
    try:
        consumer.topics()
        return topic_id_text(consumer._client.cluster.topic_id(topic))
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("fail_on_data_loss", "new_count"),
    [(True, 3), (True, 25), (False, 25)],
    ids=["fail-fewer-records", "fail-more-records", "continue-more-records"],
)
def test_recreated_topic_is_data_loss(
    spark, kafka, unique_name, tmp_path, fail_on_data_loss, new_count
):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    old_records = make_records(1, 10, "old")
    produce_sealed(servers, unique_name, old_records)
    old_id = topic_id_of(servers, unique_name)
    recorder = BatchRecorder()
    checkpoint = tmp_path / "checkpoint"

    def stream() -> DataStreamReader:
        return read_stream(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets="earliest",
            failOnDataLoss=str(fail_on_data_loss).lower(),
        )

    run_available_now(stream(), checkpoint, recorder)
    assert recorder.all_rows() == expected_rows(unique_name, old_records)
    recreate_topic(servers, unique_name)
    # With more records than before, offsets do not go backwards: only the id tells.
    new_records = make_records(1, new_count, "new")
    produce_sealed(servers, unique_name, new_records)
    new_id = topic_id_of(servers, unique_name)
    assert None not in (old_id, new_id) and old_id != new_id

    if fail_on_data_loss:
        with pytest.raises(Exception) as raised:
            run_available_now(stream(), checkpoint, recorder)
        message = str(raised.value)
        assert (
            f"Topic {unique_name} was deleted and re-created: its topic id changed from"
            f" {old_id} to {new_id} (the query had read {unique_name}-0 to offset 10)"
        ) in message
        assert "failOnDataLoss=false" in message
        assert len(recorder.batches) == 1
    else:
        run_available_now(stream(), checkpoint, recorder)
        # The new topic is read from its earliest offset.
        assert recorder.all_rows() == sorted(
            expected_rows(unique_name, old_records) + expected_rows(unique_name, new_records)
        )


@pytest.mark.timeout(200)
def test_a_replay_after_the_topic_was_recreated_never_reads_the_new_topic(
    spark, real_kafka, unique_name, tmp_path
):
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, make_records(1, 10, "old"))
    checkpoint = tmp_path / "checkpoint"
    recorder = BatchRecorder()
    stream = read_stream(
        spark, servers, subscribe=unique_name, startingOffsets="earliest", maxOffsetsPerTrigger="5"
    )
    run_until_failure(stream, checkpoint, fail_batch(1))  # batch 1, [5, 10), is not committed
    recreate_topic(servers, unique_name)
    produce_sealed(servers, unique_name, make_records(1, 20, "new"))

    with pytest.raises(Exception) as raised:
        run_available_now(stream, checkpoint, recorder)

    assert (
        f"Cannot replay {unique_name}-0 [5, 10): topic {unique_name} was deleted and re-created"
        " after the batch was planned"
    ) in str(raised.value)
    assert recorder.batches == {}


def latest_log_entry(log_dir: Path) -> int:
    return max(int(p.name) for p in log_dir.iterdir() if p.name.isdigit())


def forget_log_entry(log_dir: Path, batch_id: int) -> None:
    for name in (str(batch_id), f".{batch_id}.crc"):
        (log_dir / name).unlink(missing_ok=True)


def forget_last_commit(checkpoint: Path) -> int:
    """Make the checkpoint look like a crash between a batch's sink write and its commit."""
    last_commit = latest_log_entry(checkpoint / "commits")
    last_planned = latest_log_entry(checkpoint / "offsets")
    if last_planned > last_commit:
        forget_log_entry(checkpoint / "offsets", last_planned)
    forget_log_entry(checkpoint / "commits", last_commit)
    return last_commit


@pytest.mark.compat
@pytest.mark.timeout(200)
def test_restart_from_checkpoint_delivers_every_record_exactly_once(
    spark, kafka, unique_name, tmp_path
):
    """With admission control (Spark 4.2+) batches of at most 30; without it (4.0, 4.1)
    each batch reads what is there, so the records arrive in rounds, a batch each, and
    the last round only after the restart."""
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=3)
    records = make_records(3, 100)
    rounds = [records]
    if not ADMISSION_CONTROL.available:
        rounds = [records[:75], records[75:150], records[150:225]]
    checkpoint = tmp_path / "checkpoint"
    recorder = BatchRecorder()
    limit = {"maxOffsetsPerTrigger": "30"} if ADMISSION_CONTROL.available else {}

    def stream() -> DataStreamReader:
        return read_stream(
            spark, servers, subscribe=unique_name, startingOffsets="earliest", **limit
        )

    first_run = start_recording(stream(), checkpoint, recorder)
    try:
        for number, batch in enumerate(rounds, 1):
            produce_sealed(servers, unique_name, batch)
            if ADMISSION_CONTROL.available:
                break  # batches of 30: stopped after three, mid-stream
            sent = sum(len(r) for r in rounds[:number])
            wait_until(lambda sent=sent: len(recorder.all_rows()) >= sent, 90, "the round")
        wait_until(lambda: len(recorder.batches) >= 3, 90, "three batches of the first run")
    finally:
        first_run.stop()
    assert first_run.exception() is None
    stopped_at = len(recorder.batches)
    assert stopped_at < 10, "the first run must stop mid-stream"
    # Forget the last commit (and a batch planned after it), as if the driver died after the
    # sink ran but before Spark recorded the commit: the restart must replay that batch.
    last_commit = forget_last_commit(checkpoint)
    if not ADMISSION_CONTROL.available:
        produce_sealed(servers, unique_name, records[225:])

    run_available_now(stream(), checkpoint, recorder)

    assert recorder.replays.get(last_commit) is True
    if ADMISSION_CONTROL.available:  # a batch planned again is cut at the same 30 records
        assert all(recorder.replays.values()), recorder.replays
    else:  # a batch planned after the forgotten commit is forgotten too: planned again, larger
        assert all(same for b, same in recorder.replays.items() if b <= last_commit)
    if ADMISSION_CONTROL.available:
        assert all(size <= 30 for size in recorder.sizes())
    delivered = recorder.all_rows()
    assert len(delivered) == len(set(delivered)) == 300
    assert delivered == expected_rows(unique_name, records)


def run_until_failure(stream: DataStreamReader, checkpoint: Path, on_batch, timeout: float = 90):
    """Start a query whose foreachBatch raises; return the exception it stopped with."""
    query = (
        stream.load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException) as raised:
            if not query.awaitTermination(timeout):
                raise TimeoutError(f"the query did not fail within {timeout} s")
    finally:
        query.stop()
    return raised.value


def logged_offsets(checkpoint: Path, batch_id: int) -> dict[str, Any]:
    """The source offset Spark logged for ``batch_id`` (last line of the offset log entry)."""
    return json.loads((checkpoint / "offsets" / str(batch_id)).read_text().splitlines()[-1])


def fail_batch(batch_to_fail: int) -> Callable[[DataFrame, int], None]:
    def on_batch(df: DataFrame, batch_id: int) -> None:
        if batch_id == batch_to_fail:
            raise RuntimeError(f"the sink dies before batch {batch_id} commits")

    return on_batch


@pytest.mark.compat
@pytest.mark.timeout(200)
def test_uncommitted_batch_zero_replays_its_range_with_default_starting_offsets(
    spark, kafka, unique_name, tmp_path
):
    """Spark replays an uncommitted batch 0 from a fresh initialOffset(), which with
    startingOffsets=latest is beyond the batch's end once records arrived meanwhile."""
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=2)
    produce_sealed(servers, unique_name, make_records(2, 5, "before"))
    checkpoint = tmp_path / "checkpoint"

    run_until_failure(read_stream(spark, servers, subscribe=unique_name), checkpoint, fail_batch(0))
    assert not (checkpoint / "commits" / "0").exists()
    planned = logged_offsets(checkpoint, 0)
    assert planned[unique_name] == {"0": 5, "1": 5}
    # While the query is down, more records arrive: a fresh "latest" is now 9, 9.
    produce_sealed(servers, unique_name, make_records(2, 4, "down"))
    recorder = BatchRecorder()

    run_available_now(read_stream(spark, servers, subscribe=unique_name), checkpoint, recorder)

    assert recorder.batches[0] == []  # batch 0 read what it planned: nothing
    assert logged_offsets(checkpoint, 0) == planned
    delivered = recorder.all_rows()
    assert delivered == sorted(
        (unique_name, p, 5 + i, b"down%d-%d" % (p, i)) for p in range(2) for i in range(4)
    )


@pytest.mark.compat
@pytest.mark.timeout(200)
def test_partitions_added_mid_stream_are_read_exactly_once(spark, real_kafka, unique_name):
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)
    first = make_records(1, 5, "first")
    produce_sealed(servers, unique_name, first)
    table = f"added_{unique_name}"
    query = (
        read_stream(spark, servers, subscribe=unique_name, startingOffsets="earliest")
        .load()
        .writeStream.format("memory")
        .queryName(table)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: spark.table(table).count() >= 5, 60, "the first records")
        add_partitions(servers, unique_name, 3)
        later = make_records(3, 4, "later")
        produce_sealed(servers, unique_name, later)
        expected = sorted(
            expected_rows(unique_name, first)
            + [(unique_name, 0, 5 + i, b"later0-%d" % i) for i in range(4)]
            + [row for row in expected_rows(unique_name, later) if row[1] > 0]
        )
        wait_until(lambda: spark.table(table).count() >= len(expected), 60, "the new partitions")
        assert query.exception() is None
        assert keyed_rows(spark.table(table)) == expected
    finally:
        query.stop()


@pytest.mark.timeout(200)
@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_replayed_batch_reads_a_new_partitions_planned_range_after_delete_records(
    spark, real_kafka, unique_name, tmp_path, fail_on_data_loss
):
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, make_records(1, 3, "p0"))
    checkpoint = tmp_path / "checkpoint"
    recorder = BatchRecorder()

    def stream() -> DataStreamReader:
        return read_stream(
            spark,
            servers,
            subscribe=unique_name,
            startingOffsets="earliest",
            failOnDataLoss=str(fail_on_data_loss).lower(),
        )

    run_available_now(stream(), checkpoint, recorder)
    add_partitions(servers, unique_name, 2)
    produce_sealed(servers, unique_name, [Record(1, None, b"p1-%d" % i) for i in range(10)])
    run_until_failure(stream(), checkpoint, fail_batch(1))
    assert logged_offsets(checkpoint, 1)["@starts"] == {unique_name: {"1": 0}}
    # Retention moves on before the replay.
    delete_records(servers, unique_name, {1: 6})

    if fail_on_data_loss:
        with pytest.raises(Exception) as raised:
            run_available_now(stream(), checkpoint, recorder)
        assert (
            f"Cannot read {unique_name}-1 [0, 10): offsets from 0 to 6 of {unique_name}-1 are"
            " gone (earliest available is 6)"
        ) in str(raised.value)
        assert "failOnDataLoss=false" in str(raised.value)
        assert 1 not in recorder.batches
    else:
        run_available_now(stream(), checkpoint, recorder)
        assert [(p, o) for _, p, o, _ in recorder.batches[1]] == [(1, o) for o in range(6, 10)]


@pytest.mark.timeout(200)
def test_a_new_partition_whose_first_records_are_deleted_is_data_loss(
    spark, real_kafka, unique_name, tmp_path
):
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, make_records(1, 3, "p0"))
    checkpoint = tmp_path / "checkpoint"
    recorder = BatchRecorder()
    stream = read_stream(spark, servers, subscribe=unique_name, startingOffsets="earliest")
    run_available_now(stream, checkpoint, recorder)
    add_partitions(servers, unique_name, 2)
    produce_sealed(servers, unique_name, [Record(1, None, b"p1-%d" % i) for i in range(10)])
    delete_records(servers, unique_name, {1: 4})

    with pytest.raises(Exception) as raised:
        run_available_now(stream, checkpoint, recorder)

    assert (
        f"Added partition {unique_name}-1 starts from 4 instead of 0. Some data may have been"
        " missed. If this is expected (e.g. a deleted topic or retention), set the option"
        " failOnDataLoss=false"
    ) in str(raised.value)
    assert len(recorder.batches) == 1


def open_transaction(servers: str, topic: str, values: list[bytes]) -> KafkaProducer:
    """A transaction with ``values`` sent and flushed but neither committed nor aborted."""
    producer = transactional_producer(servers, transaction_timeout_ms=300_000)
    producer.begin_transaction()
    for value in values:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    return producer


@pytest.mark.timeout(250)
def test_read_committed_reads_exactly_the_committed_records_and_replays_them(
    spark, real_kafka, unique_name, tmp_path
):
    servers = servers_of(real_kafka)
    create_topic(servers, unique_name, partitions=1)

    def transaction(tag: str, count: int, commit: bool) -> list[bytes]:
        values = [f"{tag}-{i}".encode() for i in range(count)]
        records = [Record(0, None, v) for v in values]
        produce_transaction(servers, unique_name, records, commit=commit)
        return values

    committed = transaction("a", 3, True)  # offsets 0-2, marker 3
    aborted = transaction("b", 2, False)  # offsets 4-5, marker 6
    committed += transaction("c", 2, True)  # offsets 7-8, marker 9
    pending = [b"d-0", b"d-1"]  # offsets 10-11, open while the query plans
    producer = open_transaction(servers, unique_name, pending)
    try:
        assert end_offsets(servers, unique_name, "read_committed") == {0: 10}
        checkpoint = tmp_path / "checkpoint"
        recorder = BatchRecorder()

        def stream() -> DataStreamReader:
            return read_stream(
                spark,
                servers,
                subscribe=unique_name,
                startingOffsets="earliest",
                maxOffsetsPerTrigger="4",
            )

        run_available_now(stream(), checkpoint, recorder)
        # Batches [0, 4), [4, 8), [8, 10): aborted records and markers skipped by position.
        assert [[(o, v) for _, _, o, v in rows] for rows in recorder.batches.values()] == [
            [(0, b"a-0"), (1, b"a-1"), (2, b"a-2")],
            [(7, b"c-0")],
            [(8, b"c-1")],
        ]
        assert recorder.all_rows() == [
            (unique_name, 0, o, v) for o, v in zip([0, 1, 2, 7, 8], committed, strict=True)
        ]
        last = latest_log_entry(checkpoint / "offsets")
        assert logged_offsets(checkpoint, last)[unique_name] == {"0": 10}
        # A replay, with the transaction still open, reads the same rows.
        forget_last_commit(checkpoint)
        run_available_now(stream(), checkpoint, recorder)
        assert recorder.replays == {last: True}
        producer.commit_transaction()
    finally:
        producer.close()
    run_available_now(stream(), checkpoint, recorder)
    assert recorder.all_rows()[-2:] == [(unique_name, 0, 10, b"d-0"), (unique_name, 0, 11, b"d-1")]
    assert not any(value in aborted for _, _, _, value in recorder.all_rows())
    # read_uncommitted, when asked for, returns the aborted records too.
    uncommitted = read_batch(
        spark, servers, subscribe=unique_name, **{"kafka.isolation.level": "read_uncommitted"}
    )
    assert [bytes(v) for _, _, _, v in keyed_rows(uncommitted)] == [
        b"a-0",
        b"a-1",
        b"a-2",
        b"b-0",
        b"b-1",
        b"c-0",
        b"c-1",
        b"d-0",
        b"d-1",
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_broker_fails_within_the_request_timeout(spark, tmp_path):
    servers = f"127.0.0.1:{free_port()}"
    stream = read_stream(
        spark, servers, subscribe="anything", **{"kafka.request.timeout.ms": "3000"}
    )
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        run_available_now(stream, tmp_path / "checkpoint", BatchRecorder(), timeout=60)
    assert time.monotonic() - started < 45
    assert (
        f"Kafka at {servers} (option kafka.bootstrap.servers) did not answer within 3000 ms"
        in str(raised.value)
    )


def test_unknown_topic_in_assign_is_an_option_error(spark, kafka, unique_name):
    servers = servers_of(kafka)
    create_topic(servers, unique_name, partitions=1)
    df = read_batch(spark, servers, assign=json.dumps({unique_name: [0, 1], "no_such_topic": [0]}))
    with pytest.raises(Exception) as raised:
        df.collect()
    assert (
        f"Option assign names no_such_topic-0, {unique_name}-1, which do not exist on {servers}:"
        " create them or fix assign"
    ) in str(raised.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"subscribe": "t", "maxOffsetsPerTrigger": "-1"},
            "Option maxOffsetsPerTrigger is '-1': use a positive integer",
        ),
        (
            {"subscribe": "t", "assign": '{"t":[0]}'},
            "Set exactly one of the options subscribe, subscribePattern or assign"
            " (found subscribe and assign)",
        ),
    ],
)
def test_bad_options_fail_when_the_stream_is_defined(spark, kafka, options, message):
    with pytest.raises(Exception) as raised:
        read_stream(spark, servers_of(kafka), **options).load()
    assert message in str(raised.value)


def test_ending_offsets_are_refused_for_streaming(spark, kafka, tmp_path):
    stream = read_stream(spark, servers_of(kafka), subscribe="t", endingOffsets="latest")
    with pytest.raises(Exception) as raised:
        run_available_now(stream, tmp_path / "checkpoint", BatchRecorder())
    assert "Option endingOffsets is for batch queries only: remove it from readStream" in str(
        raised.value
    )
