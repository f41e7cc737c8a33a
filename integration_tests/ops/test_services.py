"""The embedded services are real: Kafka protocol, SQL with prepared transactions, S3.

The broker is Apache Kafka where java and mvn exist (tests needing its semantics take the
``real_kafka`` fixture and skip on tansu); ``EOSPACK_BROKER=tansu`` runs the rest on tansu.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from eospack.lab.services import ServiceStartError, apache_kafka_missing, embedded_broker_kind
from eospack.lab.services.base import broker_kind
from eospack.lab.services.kafka_tools import (
    Record,
    add_partitions,
    create_compacted_topic,
    create_topic,
    delete_records,
    delete_topic,
    end_offsets,
    produce_sealed,
    produce_transaction,
    read_all,
)
from eospack.lab.testing import wait_until

pytestmark = pytest.mark.integration


def needs_apache_kafka_here() -> None:
    reason = apache_kafka_missing()
    if reason:
        pytest.skip(f"Apache Kafka cannot run here: {reason}")


def test_kafka_produce_and_read_back_with_exact_end_offsets(kafka, unique_name):
    servers = kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=3)
    records = [Record(i % 3, f"k{i}".encode(), f"v{i}".encode()) for i in range(900)]

    assert produce_sealed(servers, unique_name, records) == {0: 300, 1: 300, 2: 300}

    assert end_offsets(servers, unique_name) == {0: 300, 1: 300, 2: 300}
    rows = read_all(servers, unique_name)
    assert sorted(value for _, _, _, value in rows) == sorted(r.value for r in records)
    assert [offset for partition, offset, _, _ in rows if partition == 1] == list(range(300))


def test_postgres_write_read_and_prepared_transactions(postgres, unique_name):
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {unique_name} (id int primary key, name text)")
        connection.execute(f"INSERT INTO {unique_name} VALUES (1, 'one'), (2, 'two')")
        assert connection.execute(f"SELECT id, name FROM {unique_name} ORDER BY id").fetchall() == [
            (1, "one"),
            (2, "two"),
        ]
        limit = connection.execute("SHOW max_prepared_transactions").fetchone()
        assert limit is not None and int(limit[0]) > 0

    transaction_id = f"eospack-test-{unique_name}"
    connection = psycopg.connect(postgres.endpoint.url)
    connection.tpc_begin(connection.xid(1, transaction_id, "q"))
    connection.execute(f"INSERT INTO {unique_name} VALUES (3, 'three')")
    connection.tpc_prepare()
    connection.close()
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        assert connection.execute(f"SELECT count(*) FROM {unique_name}").fetchone() == (2,)
        connection.tpc_commit(connection.xid(1, transaction_id, "q"))
        assert connection.execute(f"SELECT count(*) FROM {unique_name}").fetchone() == (3,)


def test_postgres_without_prepared_transactions_refuses_prepare(postgres_without_prepared):
    with psycopg.connect(postgres_without_prepared.endpoint.url, autocommit=True) as connection:
        assert connection.execute("SHOW max_prepared_transactions").fetchone() == ("0",)


def test_s3_put_and_get(s3, unique_name):
    client = s3.endpoint.client()
    client.put_object(Bucket=s3.endpoint.bucket, Key=f"{unique_name}/a.txt", Body=b"hello")
    body = client.get_object(Bucket=s3.endpoint.bucket, Key=f"{unique_name}/a.txt")["Body"]
    assert body.read() == b"hello"


@pytest.fixture
def occupied_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("service_class", "name"),
    [("EmbeddedKafka", "kafka broker"), ("EmbeddedPostgres", "postgresql"), ("EmbeddedS3", "s3")],
)
def test_service_on_a_taken_port_fails_naming_service_and_port(service_class, name, occupied_port):
    from eospack.lab.services import embedded

    with pytest.raises(ServiceStartError, match=f"^{name}.*port {occupied_port} .*already in use"):
        getattr(embedded, service_class)(port=occupied_port)


def test_missing_broker_binary_is_named(monkeypatch, tmp_path):
    from eospack.lab.services.embedded import EmbeddedKafka

    monkeypatch.setenv("EOSPACK_TANSU_BIN", str(tmp_path / "no-tansu"))
    with pytest.raises(ServiceStartError, match="kafka broker .*no executable binary at"):
        EmbeddedKafka()


def test_broker_that_exits_while_starting_reports_its_exit(monkeypatch, tmp_path):
    from eospack.lab.services.embedded import EmbeddedKafka

    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'bind failed: permission denied' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EOSPACK_TANSU_BIN", str(fake))
    with pytest.raises(ServiceStartError, match="exited with code 3.*permission denied"):
        EmbeddedKafka()


def test_unknown_services_mode_is_refused(monkeypatch):
    from eospack.lab.services import start_kafka

    monkeypatch.setenv("EOSPACK_SERVICES", "podman")
    with pytest.raises(ServiceStartError, match="EOSPACK_SERVICES='podman' is not known"):
        start_kafka()


def test_session_broker_kind_follows_eospack_broker(kafka):
    wanted = os.environ.get("EOSPACK_BROKER", "").strip().lower()
    if os.environ.get("EOSPACK_SERVICES", "embedded") == "docker":
        assert kafka.endpoint.kind == "kafka"
    elif wanted:
        assert kafka.endpoint.kind == wanted
    else:
        assert kafka.endpoint.kind == ("tansu" if apache_kafka_missing() else "kafka")
    assert broker_kind(kafka.endpoint.bootstrap_servers) == kafka.endpoint.kind


def test_unknown_broker_choice_is_refused(monkeypatch):
    monkeypatch.setenv("EOSPACK_BROKER", "redpanda")
    with pytest.raises(ServiceStartError, match="^EOSPACK_BROKER='redpanda' is not known"):
        embedded_broker_kind()


def test_without_java_the_default_broker_is_tansu_with_one_log_line(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("EOSPACK_BROKER", raising=False)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    with caplog.at_level(logging.WARNING, logger="eospack.lab.services"):
        assert embedded_broker_kind() == "tansu"
    assert [record.getMessage() for record in caplog.records] == [
        "eospack: the embedded broker is tansu, not Apache Kafka: java was not found"
        " (JAVA_HOME or PATH) (install what is missing, or set EOSPACK_BROKER=tansu to choose"
        " tansu quietly)"
    ]


def test_apache_kafka_reports_exact_end_offsets_of_batched_writes(real_kafka, unique_name):
    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=3)
    records = [Record(i % 3, f"k{i}".encode(), f"v{i}".encode()) for i in range(3000)]

    assert produce_sealed(servers, unique_name, records, seal=False, batch_size=64 * 1024) == {
        0: 1000,
        1: 1000,
        2: 1000,
    }

    assert end_offsets(servers, unique_name) == {0: 1000, 1: 1000, 2: 1000}
    rows = read_all(servers, unique_name)
    assert [(p, o) for p, o, _, _ in rows] == [(p, o) for p in range(3) for o in range(1000)]
    assert sorted(value for _, _, _, value in rows) == sorted(r.value for r in records)


class RecordingProducer:
    """Stands in for KafkaProducer: records sends, flushes and waits on acknowledgements."""

    events: list[str]

    def __init__(self, **config: object) -> None:
        self.events = RecordingProducer.events = []

    def send(self, topic: str, key: bytes | None, value: bytes | None, **kwargs: object) -> Any:
        self.events.append(f"send {value!r}")
        producer = self

        class Future:
            def add_errback(self, callback: object) -> None:
                pass

            def get(self, timeout: float) -> None:
                producer.events.append(f"wait {value!r}")

        return Future()

    def flush(self) -> None:
        self.events.append("flush")

    def close(self) -> None:
        self.events.append("close")


@pytest.mark.parametrize(
    ("kind", "seal", "sealed"),
    [("tansu", None, True), ("kafka", None, False), (None, None, True), ("kafka", True, True)],
)
def test_produce_sealed_seals_unless_the_broker_is_apache_kafka(monkeypatch, kind, seal, sealed):
    from eospack.lab.services import base, kafka_tools

    monkeypatch.setattr(kafka_tools, "KafkaProducer", RecordingProducer)
    address = "127.0.0.1:1"
    if kind is not None:
        monkeypatch.setitem(base._STARTED_BROKERS, address, kind)
    records = [Record(0, None, b"a"), Record(0, None, b"b"), Record(1, None, b"c")]

    assert produce_sealed(address, "topic", records, seal=seal) == {0: 2, 1: 1}

    expected = (
        ["send b'a'", "flush", "send b'b'", "wait b'b'", "send b'c'", "wait b'c'", "close"]
        if sealed
        else ["send b'a'", "send b'b'", "send b'c'", "flush", "close"]
    )
    assert RecordingProducer.events == expected


def test_read_committed_hides_an_aborted_transaction(real_kafka, unique_name):
    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=1)
    aborted = [Record(0, b"a", f"aborted-{i}".encode()) for i in range(3)]
    committed = [Record(0, b"c", f"committed-{i}".encode()) for i in range(2)]

    assert produce_transaction(servers, unique_name, aborted, commit=False) == {0: 3}
    assert produce_transaction(servers, unique_name, committed) == {0: 2}

    # 3 aborted records, their abort marker, 2 committed records, their commit marker
    assert end_offsets(servers, unique_name) == {0: 7}
    assert end_offsets(servers, unique_name, "read_committed") == {0: 7}
    uncommitted = read_all(servers, unique_name)
    assert [(offset, value) for _, offset, _, value in uncommitted] == [
        (0, b"aborted-0"),
        (1, b"aborted-1"),
        (2, b"aborted-2"),
        (4, b"committed-0"),
        (5, b"committed-1"),
    ]
    visible = read_all(servers, unique_name, isolation_level="read_committed")
    assert [(offset, value) for _, offset, _, value in visible] == [
        (4, b"committed-0"),
        (5, b"committed-1"),
    ]


def test_partitions_records_and_topics_can_be_added_and_deleted(real_kafka, unique_name):
    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, [Record(0, None, f"v{i}".encode()) for i in range(10)])

    add_partitions(servers, unique_name, 3)
    produce_sealed(servers, unique_name, [Record(2, None, b"in-new-partition")])
    assert end_offsets(servers, unique_name) == {0: 10, 1: 0, 2: 1}

    delete_records(servers, unique_name, {0: 6})
    assert [(p, o) for p, o, _, _ in read_all(servers, unique_name)] == [
        (0, 6),
        (0, 7),
        (0, 8),
        (0, 9),
        (2, 0),
    ]
    consumer = KafkaConsumer(bootstrap_servers=servers)
    try:
        assert consumer.beginning_offsets([TopicPartition(unique_name, 0)]) == {
            TopicPartition(unique_name, 0): 6
        }
    finally:
        consumer.close()

    delete_topic(servers, unique_name)
    consumer = KafkaConsumer(bootstrap_servers=servers)
    try:
        assert unique_name not in consumer.topics()
    finally:
        consumer.close()


@pytest.mark.timeout(120)
def test_compacted_topic_keeps_the_latest_value_per_key(real_kafka, unique_name):
    servers = real_kafka.endpoint.bootstrap_servers
    create_compacted_topic(servers, unique_name)
    produce_sealed(servers, unique_name, [Record(0, b"k", f"v{i}".encode()) for i in range(20)])

    def compacted() -> bool:
        # an append rolls the aged segment; the cleaner then compacts the rolled ones
        produce_sealed(servers, unique_name, [Record(0, b"roll", b"r")])
        values = [value for _, _, key, value in read_all(servers, unique_name) if key == b"k"]
        return values == [b"v19"]

    wait_until(compacted, timeout=60, description="compaction of key k", poll=0.5)


def test_killed_broker_restarts_on_its_log_directory_with_its_data(real_kafka, unique_name):
    from eospack.lab.services.apache_kafka import ApacheKafka

    if not isinstance(real_kafka, ApacheKafka):
        pytest.skip("kills the embedded Apache Kafka process")
    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=2)
    before = [Record(i % 2, None, f"before-{i}".encode()) for i in range(100)]
    produce_sealed(servers, unique_name, before, acks="all")
    process_id = real_kafka.process.pid

    real_kafka.kill()
    try:
        assert real_kafka.process.poll() == -9
    finally:
        real_kafka.start()

    assert real_kafka.process.pid != process_id
    assert real_kafka.endpoint.bootstrap_servers == servers
    after = [Record(i % 2, None, f"after-{i}".encode()) for i in range(10)]
    produce_sealed(servers, unique_name, after)
    assert end_offsets(servers, unique_name) == {0: 55, 1: 55}
    values = sorted(value for _, _, _, value in read_all(servers, unique_name))
    assert values == sorted(record.value for record in before + after)


def test_paused_broker_answers_nothing_until_resumed(kafka, unique_name):
    if not hasattr(kafka, "pause"):
        pytest.skip("pauses an embedded broker process")
    servers = kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=1)
    produce_sealed(servers, unique_name, [Record(0, None, b"one")])

    kafka.pause()
    try:
        with pytest.raises(KafkaError):
            KafkaConsumer(bootstrap_servers=servers, api_version_auto_timeout_ms=1_000)
    finally:
        kafka.resume()

    assert end_offsets(servers, unique_name) == {0: 1}


def test_apache_kafka_on_a_taken_port_fails_in_one_line(occupied_port):
    needs_apache_kafka_here()
    from eospack.lab.services.apache_kafka import ApacheKafka

    with pytest.raises(ServiceStartError) as raised:
        ApacheKafka(port=occupied_port)
    message = str(raised.value)
    assert message == (
        f"kafka broker (apache kafka) could not start: port {occupied_port} on 127.0.0.1 is"
        " already in use (stop what holds it, or choose another port)"
    )


def test_apache_kafka_without_java_fails_in_one_line(monkeypatch, tmp_path):
    from eospack.lab.services.apache_kafka import ApacheKafka

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    with pytest.raises(ServiceStartError) as raised:
        ApacheKafka()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("kafka broker (apache kafka) could not start: Java was not found")
    assert message.endswith("(or set EOSPACK_BROKER=tansu)")


def test_apache_kafka_without_mvn_and_jars_fails_in_one_line(monkeypatch, tmp_path):
    java = shutil.which("java")
    if java is None:
        pytest.skip("needs java")
    from eospack.lab.services.apache_kafka import ApacheKafka

    monkeypatch.setenv("JAVA_HOME", str(Path(java).resolve().parents[1]))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("EOSPACK_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(ServiceStartError) as raised:
        ApacheKafka()
    assert str(raised.value) == (
        "jar set kafka-broker could not be fetched: mvn was not found on PATH (install Maven,"
        " e.g. apt-get install maven, then run `eospack services fetch`)"
    )


def test_apache_kafka_that_exits_while_starting_reports_why_in_one_line():
    needs_apache_kafka_here()
    from eospack.lab.services.apache_kafka import ApacheKafka

    with pytest.raises(ServiceStartError) as raised:
        ApacheKafka(heap="lots")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "kafka broker (apache kafka) exited with code 1 while starting: Invalid maximum heap"
        " size: -Xmxlots"
    )


def test_start_errors_quote_the_java_exception_not_its_stack_frames(tmp_path):
    from eospack.lab.services.base import _log_tail

    log = tmp_path / "service.log"
    log.write_text(
        "[2026-11-23 17:46:51,904] ERROR Exiting Kafka due to fatal exception (kafka.Kafka$)\n"
        "java.lang.RuntimeException: Stored node id 7 doesn't match previous node id 1\n"
        "\tat kafka.server.KafkaRaftServer.<init>(KafkaRaftServer.scala:55)\n"
        "\tat kafka.Kafka.main(Kafka.scala)\n"
        "\t... 3 more\n"
    )
    assert _log_tail(log, lines=2) == (
        "[2026-11-23 17:46:51,904] ERROR Exiting Kafka due to fatal exception (kafka.Kafka$)"
        " | java.lang.RuntimeException: Stored node id 7 doesn't match previous node id 1"
    )


SPARK_KAFKA_READER = """
import json, sys
from eospack.tools.spark import local_session

servers, topic, jars = sys.argv[1], sys.argv[2], sys.argv[3]
spark = local_session(app_name="eospack-spark-kafka-test", conf={"spark.jars": jars})
rows = (
    spark.read.format("kafka")
    .option("kafka.bootstrap.servers", servers)
    .option("subscribe", topic)
    .option("startingOffsets", "earliest")
    .option("endingOffsets", "latest")
    .load()
    .selectExpr("partition", "offset", "CAST(key AS STRING)", "CAST(value AS STRING)")
    .collect()
)
print("ROWS=" + json.dumps(sorted([list(row) for row in rows])))
spark.stop()
"""


@pytest.mark.timeout(300)
def test_spark_reads_a_topic_with_its_own_kafka_connector(real_kafka, unique_name, tmp_path):
    """Spark's own format("kafka") from the spark-kafka jar set, in a separate Spark
    session (its jars must be on the classpath before the JVM starts)."""
    from eospack.lab.services.maven import resolve_classpath

    servers = real_kafka.endpoint.bootstrap_servers
    create_topic(servers, unique_name, partitions=2)
    records = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]
    produce_sealed(servers, unique_name, records)
    jars = ",".join(str(jar) for jar in resolve_classpath("spark-kafka"))
    script = tmp_path / "read_with_spark_kafka.py"
    script.write_text(SPARK_KAFKA_READER)

    result = subprocess.run(
        [sys.executable, str(script), servers, unique_name, jars],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=Path(__file__).parents[2],
    )

    output = [line for line in result.stdout.splitlines() if line.startswith("ROWS=")]
    assert result.returncode == 0 and output, result.stderr[-3000:]
    rows: list[list[Any]] = json.loads(output[0].removeprefix("ROWS="))
    assert rows == sorted([p, i // 2, f"k{i}", f"v{i}"] for i in range(50) for p in [i % 2])
