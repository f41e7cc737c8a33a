"""The same services in Docker (EOSPACK_SERVICES=docker), through testcontainers.

Real Apache Kafka (KRaft), PostgreSQL with prepared transactions enabled, MySQL 8.4 and
MinIO.
Images match docker-compose.yml. Needs a Docker engine and `pip install testcontainers`.
"""

from __future__ import annotations

from typing import Any

from eospack.lab.services.base import (
    KafkaEndpoint,
    MariaDBEndpoint,
    PostgresEndpoint,
    S3Endpoint,
    ServiceStartError,
    remember_broker,
)

KAFKA_IMAGE = "apache/kafka:3.9.1"
POSTGRES_IMAGE = "postgres:17"
MYSQL_IMAGE = "mysql:8.4"
MINIO_IMAGE = "minio/minio:RELEASE.2025-04-22T22-12-26Z"


def _start(name: str, container: Any) -> Any:
    try:
        return container.start()
    except Exception as error:
        raise ServiceStartError(
            f"{name} (docker) could not start: {type(error).__name__}: {error}"
            " (is a Docker engine running? unset EOSPACK_SERVICES for embedded services)"
        ) from error


class DockerKafka:
    name = "kafka broker (docker)"

    def __init__(self) -> None:
        from testcontainers.kafka import KafkaContainer

        self.container = _start(self.name, KafkaContainer(KAFKA_IMAGE).with_kraft())
        self.endpoint = KafkaEndpoint(self.container.get_bootstrap_server(), kind="kafka")
        remember_broker(self.endpoint)

    def stop(self) -> None:
        self.container.stop()


class DockerPostgres:
    name = "postgresql (docker)"

    def __init__(self, max_prepared_transactions: int = 64) -> None:
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer(POSTGRES_IMAGE, username="postgres", password="postgres")
        container.with_command(f"postgres -c max_prepared_transactions={max_prepared_transactions}")
        self.container = _start(self.name, container)
        self.endpoint = PostgresEndpoint(
            host=self.container.get_container_host_ip(),
            port=int(self.container.get_exposed_port(5432)),
            user="postgres",
            password="postgres",
            database=self.container.dbname,
        )

    def kill(self) -> None:
        self.container.get_wrapped_container().kill()

    def start(self) -> None:
        self.container.get_wrapped_container().start()

    def stop(self) -> None:
        self.container.stop()


class DockerMySQL:
    """MySQL 8.4 as docker-compose.yml runs it: user ``eospack`` (password ``eospack``)
    with every privilege on database ``eospack``; not tested on machines without Docker."""

    name = "mysql (docker)"

    def __init__(self) -> None:
        from testcontainers.mysql import MySqlContainer

        container = MySqlContainer(
            MYSQL_IMAGE, username="eospack", password="eospack", dbname="eospack"
        )
        self.container = _start(self.name, container)
        self.endpoint = MariaDBEndpoint(
            host=self.container.get_container_host_ip(),
            port=int(self.container.get_exposed_port(3306)),
            user="eospack",
            password="eospack",
            database="eospack",
        )

    def kill(self) -> None:
        self.container.get_wrapped_container().kill()

    def start(self) -> None:
        self.container.get_wrapped_container().start()

    def stop(self) -> None:
        self.container.stop()


class DockerS3:
    name = "s3 endpoint (docker minio)"

    def __init__(self, bucket: str = "eospack") -> None:
        from testcontainers.minio import MinioContainer

        self.container = _start(self.name, MinioContainer(MINIO_IMAGE))
        config = self.container.get_config()
        self.endpoint = S3Endpoint(
            endpoint_url=f"http://{config['endpoint']}",
            bucket=bucket,
            access_key_id=config["access_key"],
            secret_access_key=config["secret_key"],
        )
        self.endpoint.client().create_bucket(Bucket=bucket)

    def stop(self) -> None:
        self.container.stop()
