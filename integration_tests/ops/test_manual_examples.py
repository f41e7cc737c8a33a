"""Every Python example of the manual (README.md, docs/**/*.md) runs against the services.

One test per fenced ``python`` block (id = page:line), collected when the tests are, so a
page added or moved is covered without editing this file. A block runs in the session's
SparkSession (its ``SparkSession.builder...getOrCreate()`` returns it) with its service
addresses replaced by the test services' (``manual_examples_parts.SUBSTITUTIONS``). Before it
runs, the topics it subscribes to exist and hold keyed records; after it, every streaming
query it started has processed them without an exception, each table, topic or S3 path
it writes holds rows, and the queries are stopped. A block that builds streaming
DataFrames but starts no query (a source's or an operator's example) has each of them run
into Spark's memory sink until it has processed the records, without an exception.

Decision on passwords: the manual writes docker-compose.yml's (``postgres``), which
``eospack services up`` prints too and the embedded PostgreSQL accepts (it trusts local
connections); the quick start reads its addresses from ``EOSPACK_KAFKA`` and
``EOSPACK_POSTGRES``, which this runner sets. No example needs a secret of its own.

A block not meant to run says why on the line before its fence:
``<!-- example: not run (reason) -->``; a marker without a reason fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed, read_all
from integration_tests.ops.manual_examples_parts import (
    DBTABLE,
    ROOT,
    S3_PATH,
    SINK_TOPIC,
    SUBSCRIBED,
    Example,
    Services,
    collect_examples,
    create_table_like,
    examples_in,
    given_namespace,
    substitute,
    unique_suffix,
)

pytestmark = pytest.mark.integration

EXAMPLES = collect_examples()

RECORDS = [
    Record(partition=number % 2, key=f"key{number % 5}".encode(), value=b"1")
    for number in range(20)
]


@pytest.fixture
def services(kafka: Any, postgres: Any, s3: Any, tmp_path: Path) -> Services:
    return Services(
        bootstrap_servers=kafka.endpoint.bootstrap_servers,
        jdbc_url=postgres.endpoint.jdbc_url,
        postgres_url=postgres.endpoint.url,
        s3_endpoint=s3.endpoint,
        tmp_path=tmp_path,
        suffix=unique_suffix(),
    )


def run_into_memory(frame: Any, name: str, suffix: str) -> Any:
    """Run a streaming DataFrame a block built but did not start (a source's or an
    operator's example) into Spark's memory sink, in the output mode its operator allows."""
    from pyspark.errors import AnalysisException

    for mode in ("append", "update"):
        try:
            return (
                frame.writeStream.format("memory")
                .queryName(f"manual_{name}_{suffix}")
                .outputMode(mode)
                .trigger(availableNow=True)
                .start()
            )
        except AnalysisException:
            if mode == "update":
                raise
    raise AssertionError("unreachable")


def test_a_marker_directly_above_a_fence_skips_it_and_one_without_a_reason_is_caught() -> None:
    page = ROOT / "docs" / "example.md"
    text = "\n".join(
        [
            "<!-- example: not run (needs a cluster) -->",
            "```python",
            "a = 1",
            "```",
            "<!-- example: not run () -->",
            "```python",
            "b = 2",
            "```",
            "<!-- example: not run -->",
            "```python",
            "c = 3",
            "```",
            "<!-- example: not run (a blank line parts it from the fence) -->",
            "",
            "```python",
            "d = 4",
            "```",
            "",
        ]
    )
    found = [
        (example.id, example.code, example.not_run_reason) for example in examples_in(page, text)
    ]
    assert found == [
        ("docs/example.md:2", "a = 1\n", "needs a cluster"),
        ("docs/example.md:6", "b = 2\n", ""),
        ("docs/example.md:10", "c = 3\n", ""),
        ("docs/example.md:15", "d = 4\n", None),
    ]


def test_every_example_that_does_not_run_says_why() -> None:
    without_reason = [example.id for example in EXAMPLES if example.not_run_reason == ""]
    assert without_reason == [], (
        "write the reason in the marker: <!-- example: not run (reason) -->"
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("example", [pytest.param(example, id=example.id) for example in EXAMPLES])
def test_the_example_runs_as_written_against_the_services(
    example: Example, spark: Any, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    if example.not_run_reason is not None:
        pytest.skip(f"not run: {example.not_run_reason or '(no reason given)'}")
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    code = substitute(example.code, services)
    bootstrap = services.bootstrap_servers
    given_topic = f"manual_given_{services.suffix}"
    subscribed = SUBSCRIBED.findall(code)
    sink_topics = SINK_TOPIC.findall(code)
    for topic in [*subscribed, *sink_topics, given_topic]:
        create_topic(bootstrap, topic, partitions=2)
    produces_its_own = "KafkaProducer" in code
    for topic in [*([] if produces_its_own else subscribed), given_topic]:
        produce_sealed(bootstrap, topic, RECORDS)
    namespace = given_namespace(spark, code, services, given_topic)
    tables = DBTABLE.findall(code)
    for table in tables:
        if "createTableIfNotExists" in code:
            with psycopg.connect(services.postgres_url, autocommit=True) as connection:
                connection.execute(f"DROP TABLE IF EXISTS {table}")
        else:
            create_table_like(services.postgres_url, table, namespace["df"])
    monkeypatch.setenv("EOSPACK_KAFKA", bootstrap)
    monkeypatch.setenv("EOSPACK_POSTGRES", services.postgres_url)

    shuffle_partitions = spark.conf.get("spark.sql.shuffle.partitions")
    running_before = {query.id for query in spark.streams.active}
    try:
        given = dict(namespace)
        exec(compile(code, example.id, "exec"), namespace)
        started = [query for query in spark.streams.active if query.id not in running_before]
        into_memory = []
        if not started:
            into_memory = [
                run_into_memory(value, name, services.suffix)
                for name, value in namespace.items()
                if isinstance(value, DataFrame)
                and value.isStreaming
                and given.get(name) is not value
            ]
            started = list(into_memory)
        started += [
            value
            for value in namespace.values()
            if isinstance(value, StreamingQuery) and value.id not in {q.id for q in started}
        ]
        for query in started:
            if query.isActive:
                query.processAllAvailable()
            assert query.exception() is None, f"{query.name or query.id}: {query.exception()}"
    finally:
        for query in spark.streams.active:
            if query.id not in running_before:
                query.stop()
        spark.conf.set("spark.sql.shuffle.partitions", shuffle_partitions)

    if into_memory:
        emitted = {query.name: spark.table(query.name).count() for query in into_memory}
        assert any(emitted.values()), f"no frame of the example emitted a row: {emitted}"
    for table in tables:
        with psycopg.connect(services.postgres_url) as connection:
            (rows,) = connection.execute(f"SELECT count(*) FROM {table}").fetchone() or (0,)
        assert rows > 0, f"{table} holds no rows"
    for topic in sink_topics:
        assert read_all(bootstrap, topic, isolation_level="read_committed"), f"{topic} is empty"
    for path in S3_PATH.findall(code):
        prefix = path.split("/", 3)[3]
        listed = services.s3_endpoint.client().list_objects_v2(
            Bucket=services.s3_endpoint.bucket, Prefix=prefix
        )
        data = [item["Key"] for item in listed.get("Contents", []) if "/_" not in item["Key"]]
        assert data, f"{path} holds no data files: {listed.get('Contents', [])}"
