"""``eospack services up`` listens where docker-compose.yml publishes (Kafka 9092,
PostgreSQL 5432, MariaDB/MySQL 3306, S3 9000) when those ports are free, so examples written
for either run as written; a taken port falls back to a free one and its settings line says so."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import boto3
import psycopg
import pymysql
import pytest
from kafka import KafkaAdminClient

from eospack.cli import COMPOSE_CREDENTIALS, start_services, well_known_or_free_port
from eospack.connectors.jdbc.options import parse_options as parse_jdbc_options
from eospack.lab.services.base import free_port

pytestmark = pytest.mark.integration


def unclaimed_ports(count: int) -> list[int]:
    """``count`` free ports below the kernel's ephemeral range: a port ``free_port`` picks
    is ephemeral, and between choosing it and a service binding it an outgoing connection of
    another process (the other test worker's) may take it (seen in CI: PostgreSQL refused its
    port while Kafka started). Ports below that range are only ever bound on purpose. The scan
    starts at a place that depends on this process, so two workers start apart."""
    range_file = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(range_file.read_text().split()[0]) if range_file.exists() else 32768
    ports: list[int] = []
    candidate = 20_000 + os.getpid() % 5_000
    while len(ports) < count and candidate < low:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
                ports.append(candidate)
            except OSError:
                pass
        candidate += 1
    assert len(ports) == count, f"no {count} free ports between 20000 and {low}"
    return ports


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
        postgresql, mariadb, s3 = unclaimed_ports(3)
        ports = {"kafka": taken, "postgresql": postgresql, "mariadb": mariadb, "s3": s3}
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
