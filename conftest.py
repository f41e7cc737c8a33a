"""Shared pytest fixtures: one SparkSession and real services per pytest session.

Services start lazily, only when a test asks for them, and are stopped at the end.
Every test gets unique topic/table/prefix names through ``unique_name``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The suite starts hundreds of short-lived JVMs (drivers killed and restarted, brokers,
# Spark sessions, executors): with the C1 compiler only they start and warm up about 15%
# faster (measured on a 2-core machine). Tests only; eospack's own sessions keep Java's
# defaults. Java prints a one-line NOTE about it on every JVM's stderr.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

SLOWEST_MODULES_FIRST = (
    "integration_tests/sinks/test_sink_contract.py",
    "integration_tests/packaging/test_fresh_install.py",
    "integration_tests/jdbc/test_jdbc_faults.py",
    "integration_tests/kafka_source/test_kafka_source.py",
    "integration_tests/ops/test_cluster.py",
    "integration_tests/ops/test_stress.py",
    "integration_tests/s3/test_s3_faults.py",
    "integration_tests/kafka_sink/test_kafka_sink.py",
    "integration_tests/s3/test_object_store_checkpoints.py",
)
"""Measured the longest (worker seconds, a 2-core machine). ``make test`` hands whole
modules to two xdist workers in collection order (``--dist loadfile
--no-loadscope-reorder``): longest first, then the other integration modules, unit tests
last to fill the gaps, so that no long module starts when the other worker is nearly done.
A stale entry only costs time."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: index for index, module in enumerate(SLOWEST_MODULES_FIRST)}

    def order(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::")[0]
        if module in rank:
            return (0, rank[module])
        return (1, 0) if module.startswith("integration_tests/") else (2, 0)

    items.sort(key=order)


@pytest.fixture(scope="session")
def spark_kafka_jars() -> tuple[list[Path], str | None]:
    """Spark's own Kafka connector jars if cached or fetchable with mvn, else ([], why not).

    They go on the shared session's ``spark.jars``, so that tests compare replayable-kafka
    with ``format("kafka")`` in one session. Cost: four jars (~10 MB) fetched by the executor
    on its first task; session start and first job measured no slower beyond the noise
    (medians of 4 interleaved starts each on a loaded 2-core machine: 27.0 s vs 26.1 s).
    """
    from eospack.lab.services import ServiceStartError
    from eospack.lab.services.maven import is_cached, mvn_executable, resolve_classpath

    if not is_cached("spark-kafka") and mvn_executable() is None:
        return [], "its jars are not cached and mvn was not found (install Maven)"
    try:
        return resolve_classpath("spark-kafka"), None
    except ServiceStartError as error:
        return [], str(error)


@pytest.fixture(scope="session")
def hadoop_aws_jars() -> tuple[list[Path], str | None]:
    """S3A's jars (hadoop-aws and its AWS SDK bundle, ~690 MB, fetched once) if cached or
    fetchable with mvn, else ([], why not): checkpoints on ``s3a://`` need them."""
    from eospack.lab.services import ServiceStartError
    from eospack.lab.services.maven import is_cached, mvn_executable, resolve_classpath

    if not is_cached("hadoop-aws") and mvn_executable() is None:
        return [], "its jars are not cached and mvn was not found (install Maven)"
    try:
        return resolve_classpath("hadoop-aws"), None
    except ServiceStartError as error:
        return [], str(error)


@pytest.fixture(scope="session")
def spark(
    spark_kafka_jars: tuple[list[Path], str | None],
    hadoop_aws_jars: tuple[list[Path], str | None],
) -> Iterator[Any]:
    """The session's SparkSession, with Spark's own Kafka connector and S3A when they are
    resolvable. S3A goes on the driver's class path (local mode: the executor runs in the
    driver JVM), so its SDK bundle is never copied into the executor's work directory."""
    from eospack.tools.spark import local_session

    class_path = ":".join(str(jar) for jar in hadoop_aws_jars[0])
    session = local_session(
        app_name="eospack-tests",
        extra_jars=spark_kafka_jars[0],
        conf={"spark.driver.extraClassPath": class_path} if class_path else None,
    )
    yield session
    session.stop()


@pytest.fixture
def spark_kafka(spark: Any, spark_kafka_jars: tuple[list[Path], str | None]) -> Any:
    """The session's SparkSession for tests that need Spark's own ``format("kafka")`` (as an
    oracle or a peer); skips the test when the connector is not on the classpath."""
    missing = spark_kafka_jars[1]
    if missing is not None:
        pytest.skip(f'needs Spark\'s own format("kafka"): {missing}')
    return spark


@pytest.fixture(scope="session")
def kafka() -> Iterator[Any]:
    """The session's broker: Apache Kafka where java and mvn exist, else tansu
    (``EOSPACK_BROKER`` chooses); ``kafka.endpoint.kind`` says which."""
    from eospack.lab.services import start_kafka

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


def _needs_apache_kafka(what: str) -> None:
    from eospack.lab.services import apache_kafka_missing, services_mode

    missing = apache_kafka_missing()
    if services_mode() == "docker" or missing is not None:
        why = missing or "EOSPACK_SERVICES=docker"
        pytest.skip(f"{what} runs embedded Apache Kafka only: {why}")


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[Any]:
    """Three Apache Kafka KRaft nodes (RF 3, min ISR 2; ``kill(node)``/``start(node)``),
    started on first use (``eospack.lab.services.kafka_cluster.ApacheKafkaCluster``)."""
    _needs_apache_kafka("the 3-broker cluster")
    from eospack.lab.services.kafka_cluster import ApacheKafkaCluster

    cluster = ApacheKafkaCluster(brokers=3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[Any]:
    """An Apache Kafka broker with a SASL_SSL listener, SCRAM users ``admin`` and ``app``
    (the documented least-privilege grant), started on first use
    (``eospack.lab.services.kafka_cluster.SecuredKafka``)."""
    _needs_apache_kafka("the SASL_SSL broker")
    from eospack.lab.services.kafka_cluster import SecuredKafka

    broker = SecuredKafka()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """PostgreSQL with max_prepared_transactions > 0."""
    from eospack.lab.services import start_postgres

    server = start_postgres(max_prepared_transactions=64)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_without_prepared() -> Iterator[Any]:
    """PostgreSQL with max_prepared_transactions = 0 (PREPARE TRANSACTION refused)."""
    from eospack.lab.services import start_postgres

    server = start_postgres(max_prepared_transactions=0)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mariadb() -> Iterator[Any]:
    """MariaDB 10.11 (``kill()`` is a SIGKILL of mariadbd, ``start()`` restarts it on the
    same data; ``.endpoint.jdbc_url``, ``.endpoint.connect()``), started on first use."""
    from eospack.lab.services import start_mariadb

    server = start_mariadb()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    from eospack.lab.services import start_s3

    endpoint = start_s3(bucket="eospack-tests")
    yield endpoint
    endpoint.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A short name unique to this test, valid as a topic, table or S3 prefix."""
    stem = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:30]
    return f"{stem}_{uuid.uuid4().hex[:8]}"
