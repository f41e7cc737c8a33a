"""The flagship pipeline from a Spark Connect client: replayable-kafka -> running_count ->
2pc-jdbc, planned and run on a Spark Connect server the fixture starts.

The client is its own process (``drivers/connect_pipeline_driver.py``); the server has
eospack installed, so Spark's lookup finds the formats there and its Python planners and
workers import eospack. Two runs on one checkpoint (the second after more events) must
leave each event counted once: the exact per-key counts, no prepared transaction or staged
row, every ledger batch done.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.services.kafka_tools import Record, create_topic, produce_sealed
from integration_tests.crash_harness import run_driver
from integration_tests.drivers.connect_pipeline_driver import DONE_LINE
from integration_tests.jdbc_fixtures import pg_ledger, pg_leftovers
from integration_tests.spark_connect_server import SparkConnectServer

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parent / "drivers" / "connect_pipeline_driver.py"
CLIENT_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def connect_server() -> Iterator[SparkConnectServer]:
    server = SparkConnectServer()
    yield server
    server.stop()


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
    connect_server: SparkConnectServer, kafka: Any, postgres: Any, tmp_path: Path,
    unique_name: str,
) -> None:  # fmt: skip
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    bootstrap = kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    arguments = [
        "--remote", connect_server.remote_url, "--bootstrap-servers", bootstrap,
        "--topic", unique_name, "--url", postgres.endpoint.jdbc_url,
        "--user", postgres.endpoint.user, "--table", unique_name,
        "--checkpoint", str(tmp_path / "checkpoint"),
    ]  # fmt: skip
    produced: Counter[str] = Counter()
    for events in (300, 200):
        produced += produce(bootstrap, unique_name, events, rng)
        run = run_driver(DRIVER, arguments, timeout=CLIENT_TIMEOUT)
        assert run.succeeded and DONE_LINE in run.output, run.explain()
        assert printed_counts(postgres.endpoint.url, unique_name) == dict(produced)
    url = postgres.endpoint.url
    assert pg_leftovers(url, unique_name) == (0, 0)
    assert {status for *_, status in pg_ledger(url, unique_name)} == {"done"}
