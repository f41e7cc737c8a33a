"""The embedded services are real: Kafka protocol, SQL with prepared transactions, S3."""

from __future__ import annotations

import socket

import psycopg
import pytest

from eospack.services import ServiceStartError
from eospack.services.kafka_tools import Record, create_topic, end_offsets, produce_sealed, read_all

pytestmark = pytest.mark.integration


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
    from eospack.services import embedded

    with pytest.raises(ServiceStartError, match=f"^{name}.*port {occupied_port} .*already in use"):
        getattr(embedded, service_class)(port=occupied_port)


def test_missing_broker_binary_is_named(monkeypatch, tmp_path):
    from eospack.services.embedded import EmbeddedKafka

    monkeypatch.setenv("EOSPACK_TANSU_BIN", str(tmp_path / "no-tansu"))
    with pytest.raises(ServiceStartError, match="kafka broker .*no executable binary at"):
        EmbeddedKafka()


def test_broker_that_exits_while_starting_reports_its_exit(monkeypatch, tmp_path):
    from eospack.services.embedded import EmbeddedKafka

    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'bind failed: permission denied' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EOSPACK_TANSU_BIN", str(fake))
    with pytest.raises(ServiceStartError, match="exited with code 3.*permission denied"):
        EmbeddedKafka()


def test_unknown_services_mode_is_refused(monkeypatch):
    from eospack.services import start_kafka

    monkeypatch.setenv("EOSPACK_SERVICES", "podman")
    with pytest.raises(ServiceStartError, match="EOSPACK_SERVICES='podman' is not known"):
        start_kafka()
