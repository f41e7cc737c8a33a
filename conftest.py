"""Shared pytest fixtures: one SparkSession and real services per pytest session.

Services start lazily, only when a test asks for them, and are stopped at the end.
Every test gets unique topic/table/prefix names through ``unique_name``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from eospack.spark import local_session

    session = local_session(app_name="eospack-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka() -> Iterator[Any]:
    """The session's broker: Apache Kafka where java and mvn exist, else tansu
    (``EOSPACK_BROKER`` chooses); ``kafka.endpoint.kind`` says which."""
    from eospack.services import start_kafka

    broker = start_kafka()
    yield broker
    broker.stop()


@pytest.fixture
def real_kafka(kafka: Any) -> Any:
    """The session's broker, for tests that need Apache Kafka's semantics (read_committed,
    exact end offsets of batched writes, CreatePartitions, DeleteRecords, compaction);
    skips the test when the broker is tansu."""
    if kafka.endpoint.kind != "kafka":
        pytest.skip(
            "needs Apache Kafka, but the session broker is tansu (EOSPACK_BROKER=tansu, or"
            " java/mvn missing)"
        )
    return kafka


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """PostgreSQL with max_prepared_transactions > 0."""
    from eospack.services import start_postgres

    server = start_postgres(max_prepared_transactions=64)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_without_prepared() -> Iterator[Any]:
    """PostgreSQL with max_prepared_transactions = 0 (PREPARE TRANSACTION refused)."""
    from eospack.services import start_postgres

    server = start_postgres(max_prepared_transactions=0)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    from eospack.services import start_s3

    endpoint = start_s3(bucket="eospack-tests")
    yield endpoint
    endpoint.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A short name unique to this test, valid as a topic, table or S3 prefix."""
    stem = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:30]
    return f"{stem}_{uuid.uuid4().hex[:8]}"
