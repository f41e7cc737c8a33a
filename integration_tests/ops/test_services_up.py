"""``eospack services up`` listens where docker-compose.yml publishes (Kafka 9092,
PostgreSQL 5432, MariaDB/MySQL 3306, S3 9000) when those ports are free, so examples written
for either run as written; a taken port falls back to a free one and its settings line says so."""

from __future__ import annotations

import socket

import boto3
import psycopg
import pymysql
import pytest
from kafka import KafkaAdminClient

from eospack.cli import COMPOSE_CREDENTIALS, start_services, well_known_or_free_port
from eospack.connectors.jdbc.options import parse_options as parse_jdbc_options
from eospack.lab.services.base import free_port

pytestmark = pytest.mark.integration


def test_a_free_preferred_port_is_used_and_a_taken_one_falls_back_with_a_note() -> None:
    free = free_port()
    assert well_known_or_free_port(free) == (free, None)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        port, note = well_known_or_free_port(taken)
    assert port != taken
    assert note == f"port {taken} is taken, so this one listens on {port} instead"


@pytest.mark.timeout(180)
def test_services_listen_on_the_preferred_ports_and_a_taken_one_is_named_in_its_line() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = {
            "kafka": taken,
            "postgresql": free_port(),
            "mariadb": free_port(),
            "s3": free_port(),
        }
        started, lines = start_services(ports)
    try:
        kafka_line = next(line for line in lines if line.startswith("kafka.bootstrap.servers"))
        bootstrap = kafka_line.split()[1]
        assert not bootstrap.endswith(f":{taken}")
        assert kafka_line.endswith(
            f"(port {taken} is taken, so this one listens on {bootstrap.rsplit(':', 1)[1]} instead)"
        )
        assert "taken" not in " ".join(line for line in lines if not line.startswith("kafka"))
        KafkaAdminClient(bootstrap_servers=bootstrap).close()

        user, password = COMPOSE_CREDENTIALS["postgresql"]
        url = f"postgresql://{user}@127.0.0.1:{ports['postgresql']}/postgres"
        assert (
            f"postgresql url           {url}  (password {password}: export PGPASSWORD for a"
            " server that asks)"
        ) in lines
        with psycopg.connect(url, password=password) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
        # The quick start passes the printed url to 2pc-jdbc's url option as it is.
        assert parse_jdbc_options({"url": url, "dbtable": "counts"}).url.display()

        maria_user, maria_password = COMPOSE_CREDENTIALS["mariadb"]
        jdbc_url = f"jdbc:mariadb://127.0.0.1:{ports['mariadb']}/eospack"
        assert (
            f"mariadb jdbc url         {jdbc_url}  (user {maria_user}, password {maria_password})"
        ) in lines
        connection = pymysql.connect(
            host="127.0.0.1",
            port=ports["mariadb"],
            user=maria_user,
            password=maria_password,
            database="eospack",
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
        connection.close()

        assert any(
            line.startswith(f"s3 endpointUrl           http://127.0.0.1:{ports['s3']}  (bucket")
            for line in lines
        )
        access_key_id, secret_access_key = COMPOSE_CREDENTIALS["s3"]
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{ports['s3']}",
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            region_name="us-east-1",
        )
        assert [bucket["Name"] for bucket in client.list_buckets()["Buckets"]] == ["eospack"]
    finally:
        for service in reversed(started):
            service.stop()
