"""The flagship pipeline from a Spark Connect client: replayable-kafka -> running_count ->
2pc-jdbc, planned and run on a Spark Connect server the fixture starts.

The client is its own process (``drivers/connect_pipeline_driver.py``); the server has
eospack installed, so Spark's lookup finds the formats there and its Python planners and
workers import eospack. Two runs on one checkpoint (the second after more events) must
leave each event counted once: the exact per-key counts, no prepared transaction or staged
row, every ledger batch done.

Two checks run a Connect session in this process instead: ``eospack.register`` adds nothing
where the server's lookup finds the formats (no "replaced" warning in the server's log),
and a failed query reaches the client with eospack's error line, so ``eospack.supervise``
still stops at once on a permanent failure. pyspark marks the whole process as Connect
(``SPARK_CONNECT_MODE_ENABLED``) on its first Connect session and never unmarks it;
``connect_session`` does, so the classic session other tests of this worker share keeps
working.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession

import eospack
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.lab.testing import wait_until
from eospack.tools import registration
from eospack.tools.supervisor import first_line, is_permanent
from integration_tests.crash_harness import run_driver
from integration_tests.drivers.connect_pipeline_driver import DONE_LINE
from integration_tests.jdbc_fixtures import pg_ledger, pg_leftovers
from integration_tests.ops.connect_parts import SparkConnectServer

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parents[1] / "drivers" / "connect_pipeline_driver.py"
CLIENT_TIMEOUT = 300.0
QUERY_SECONDS = 120
FORMATS = ("replayable-kafka", "2pc-jdbc", "2pc-s3", "2pc-kafka")
CONNECT_MODE_VARIABLE = "SPARK_CONNECT_MODE_ENABLED"
REPLACED_WARNING = "replaced a statically registered data source"


@pytest.fixture(scope="module")
def connect_server() -> Iterator[SparkConnectServer]:
    server = SparkConnectServer()
    yield server
    server.stop()


@pytest.fixture
def connect_session(connect_server: SparkConnectServer) -> Iterator[SparkSession]:
    """A fresh Connect session in this process; Connect mode undone afterwards."""
    was_connect = CONNECT_MODE_VARIABLE in os.environ
    session = SparkSession.builder.remote(connect_server.remote_url).create()
    try:
        yield session
    finally:
        session.stop()
        if not was_connect:
            os.environ.pop(CONNECT_MODE_VARIABLE, None)


def printed_counts(url: str, table: str) -> dict[str, int]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(f'SELECT key, "count" FROM "{table}"').fetchall()
    return {key: int(count) for key, count in rows}


def produce(bootstrap: str, topic: str, count: int, rng: random.Random) -> Counter[str]:
    keys = [f"key-{rng.randrange(20):02d}" for _ in range(count)]
    produce_sealed(
        bootstrap, topic, [Record(index % 2, key.encode(), b"e") for index, key in enumerate(keys)]
    )
    return Counter(keys)


@pytest.mark.timeout(600)
def test_pipeline_from_a_connect_client_counts_each_event_once_across_two_runs(
    connect_server: SparkConnectServer,
    kafka: Any,
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    bootstrap = kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    arguments = [
        "--remote",
        connect_server.remote_url,
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        unique_name,
        "--url",
        postgres.endpoint.jdbc_url,
        "--user",
        postgres.endpoint.user,
        "--table",
        unique_name,
        "--checkpoint",
        str(tmp_path / "checkpoint"),
    ]
    produced: Counter[str] = Counter()
    for events in (300, 200):
        produced += produce(bootstrap, unique_name, events, rng)
        run = run_driver(DRIVER, arguments, timeout=CLIENT_TIMEOUT)
        assert run.succeeded and DONE_LINE in run.output, run.explain()
        assert printed_counts(postgres.endpoint.url, unique_name) == dict(produced)
    url = postgres.endpoint.url
    assert pg_leftovers(url, unique_name) == (0, 0)
    assert {status for *_, status in pg_ledger(url, unique_name)} == {"done"}


@pytest.mark.timeout(240)
def test_register_adds_nothing_when_the_servers_lookup_finds_the_formats(
    connect_server: SparkConnectServer, connect_session: SparkSession
) -> None:
    """The server imports eospack, so its lookup of ``pyspark_*`` modules finds the formats:
    ``register`` must not replace them (Spark would warn). Registering one by hand shows
    that the warning would reach the log, so its absence before means something."""
    assert all(registration.connect_server_resolves(connect_session, name) for name in FORMATS)
    assert not registration.connect_server_resolves(connect_session, "eospack-no-such-format")

    eospack.register(connect_session)
    assert REPLACED_WARNING not in connect_server.log_file.read_text(errors="replace")

    from pyspark_replayable_kafka import DefaultSource as KafkaSource

    connect_session.dataSource.register(KafkaSource)
    wait_until(
        lambda: REPLACED_WARNING in connect_server.log_file.read_text(errors="replace"),
        10,
        "the server's warning about a replaced data source",
    )


@pytest.mark.timeout(240)
def test_a_failed_query_reaches_the_client_with_eospacks_error_line(
    connect_session: SparkSession, postgres: Any, tmp_path: Path, unique_name: str
) -> None:
    """Server-side Python errors come back as Connect exceptions (the class eospack raised is
    not rebuilt on the client), but their text keeps eospack's error line: ``supervise``
    classifies failures by that text, so it still stops at once on a permanent one."""
    writer = (
        connect_session.readStream.format("rate")
        .load()
        .selectExpr("value AS id")
        .writeStream.format("2pc-jdbc")
        .option("url", postgres.endpoint.jdbc_url)
        .option("user", postgres.endpoint.user)
        .option("dbtable", unique_name)
        .option("writeMode", "sideways")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
    )
    failure: BaseException | None
    try:
        query = writer.start()  # through Connect, start() itself may raise the failure
        query.awaitTermination(QUERY_SECONDS)
        failure = query.exception()
    except Exception as error:
        failure = error
    assert failure is not None
    assert type(failure).__module__ == "pyspark.errors.exceptions.connect"
    assert is_permanent(failure)
    assert first_line(failure) == (
        "JdbcSinkOptionError: Option writeMode is 'sideways':"
        " use append (default), upsert or changes"
    )
