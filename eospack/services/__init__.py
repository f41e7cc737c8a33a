"""Start the services eospack runs against: a Kafka broker, PostgreSQL and S3.

Embedded processes by default (no Docker needed); ``EOSPACK_SERVICES=docker`` uses
testcontainers with the images of docker-compose.yml instead. Every service has an
``endpoint`` with its connection settings and a ``stop()``; a start failure raises
``ServiceStartError`` naming the service and the reason within 30 s.
"""

from __future__ import annotations

import os
from typing import Any

from eospack.services.base import (
    KafkaEndpoint,
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


def start_kafka() -> Any:
    """A running Kafka-protocol broker; ``.endpoint.bootstrap_servers`` to connect."""
    if services_mode() == "docker":
        from eospack.services.docker import DockerKafka

        return DockerKafka()
    from eospack.services.embedded import EmbeddedKafka

    return EmbeddedKafka()


def start_postgres(max_prepared_transactions: int = 64) -> Any:
    """A running PostgreSQL; ``.endpoint.url``; ``kill()``/``start()`` restart it in place."""
    if services_mode() == "docker":
        from eospack.services.docker import DockerPostgres

        return DockerPostgres(max_prepared_transactions)
    from eospack.services.embedded import EmbeddedPostgres

    return EmbeddedPostgres(max_prepared_transactions=max_prepared_transactions)


def start_s3(bucket: str = "eospack") -> Any:
    """A running S3 endpoint with ``bucket`` created; ``.endpoint.client()`` for boto3."""
    if services_mode() == "docker":
        from eospack.services.docker import DockerS3

        return DockerS3(bucket)
    from eospack.services.embedded import EmbeddedS3

    return EmbeddedS3(bucket=bucket)


__all__ = [
    "KafkaEndpoint",
    "PostgresEndpoint",
    "S3Endpoint",
    "Service",
    "ServiceStartError",
    "services_mode",
    "start_kafka",
    "start_postgres",
    "start_s3",
]
