"""Attacks on what docs/metrics.md promises, with real queries (issue 40's metrics).

Each test breaks one promise if it can: metrics never change results (on, off, served
after the operator is defined, a snapshot directory that became a file, snapshot files that
became directories), values are right (state keys against the state really stored, read
bytes against the produced bytes, late rows once per dropped row with two endpoints), and
secrets (a JDBC password, a ``kafka.sasl.jaas.config``) never reach the snapshot files, the
labels or the ``eospack.batches`` log line. Pure-logic attacks:
``tests/test_metrics_attacks_model.py``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import eospack
import eospack.metrics
from eospack.core.metrics import METRICS_DIR_VARIABLE
from eospack.lab.services.kafka_cluster import APP_TOPIC_PREFIX
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.lab.testing import wait_until
from eospack.stateful_ops import read_state, running_count, sessionize
from integration_tests.kafka_source_parts import read_stream, servers_of
from integration_tests.metrics_parts import (
    into_sqlite,
    scrape,
    timed_events,
    value,
    write_events,
)
from integration_tests.ops.secured_kafka_parts import create_app_topic
from integration_tests.ops.secured_kafka_parts import produce as produce_secured

pytestmark = pytest.mark.integration

PASSWORD = "s3cr3t-Pa55w0rd-jdbc"


def table_rows(database: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as connection:
        return sorted(connection.execute(f'SELECT k, "count", version FROM "{table}"').fetchall())


def keyed_records(partitions: int, per_partition: int, keys: int) -> list[Record]:
    """Records whose keys repeat (``u0`` .. ``u{keys-1}``), so a running count folds."""
    return [
        Record(p, f"u{(i * partitions + p) % keys}".encode(), f"v{p}-{i}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]


class CapturedLog(logging.Handler):
    """Every record of the loggers it is attached to, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.mark.chaos  # five queries, about 50 s; the default lane has the replay and restart cases
@pytest.mark.timeout(400)
def test_results_are_the_same_with_metrics_off_on_broken_and_served_after_the_operator(
    spark: Any, kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """replayable-kafka -> running_count -> 2pc-jdbc (SQLite), Trigger.AvailableNow with
    10 offsets per trigger, five times over the same topic: metrics off; on (with a JDBC
    password in the options: it reaches no snapshot file, label or log line of this
    process; the scraped keys equal the keys read back from the state store, the read bytes
    the produced key and value bytes); every snapshot file replaced by a directory; the
    snapshot directory replaced by a file; served after the operator was defined (records
    nothing for the operator, by the docs). The same rows every time."""
    servers, topic = servers_of(kafka), unique_name
    create_topic(servers, topic, partitions=2)
    records = keyed_records(2, 20, keys=7)
    produce_sealed(servers, topic, records)
    metrics = tmp_path / "metrics"
    captured = CapturedLog()
    logging.getLogger("eospack").addHandler(captured)

    def define(run: str) -> Any:
        counts = running_count(
            read_stream(spark, servers, subscribe=topic, startingOffsets="earliest")
            .option("queryName", f"{unique_name}_{run}")
            .option("maxOffsetsPerTrigger", "10")
            .load()
            .selectExpr("CAST(key AS STRING) AS k"),
            "k",
            key_groups=4,
            output_mode="append",
        )
        return (
            counts.writeStream.format("2pc-jdbc")
            .option("url", f"jdbc:sqlite:{tmp_path / (run + '.db')}")
            .option("password", PASSWORD)
            .option("dbtable", run)
            .option("createTableIfNotExists", "true")
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{run}"))
            .trigger(availableNow=True)
        )

    def run(run: str, writer: Any = None) -> list[tuple[Any, ...]]:
        query = (writer or define(run)).start()
        try:
            assert query.awaitTermination(180), f"run {run} did not finish"
            assert query.exception() is None
        finally:
            query.stop()
        return table_rows(tmp_path / f"{run}.db", run)

    try:
        expected = run("off")
        assert len(expected) >= 7 and {row[0] for row in expected} == {f"u{i}" for i in range(7)}
        endpoint = eospack.metrics.serve(spark, port=0, directory=str(metrics))
        try:
            assert run("on") == expected
            # Two queries at once sharing the endpoint: the same rows, each sink its rows.
            both = [define(name).start() for name in ("shared_a", "shared_b")]
            try:
                for query in both:
                    assert query.awaitTermination(180)
                    assert query.exception() is None
            finally:
                for query in both:
                    query.stop()
            for name in ("shared_a", "shared_b"):
                assert table_rows(tmp_path / f"{name}.db", name) == expected
            rows_committed = [
                v
                for (name, labels), v in scrape(endpoint.url).items()
                if name == "eospack_sink_rows_committed_total"
            ]
            assert rows_committed == [len(expected)] * 3
            on_query = f"{unique_name}_on"
            produced = sum(len(r.key) + len(r.value) for r in records)
            read_bytes = "eospack_kafka_source_read_bytes_total"
            wait_until(
                lambda: value(scrape(endpoint.url), read_bytes, query=on_query) == produced,
                10,
                f"{produced} bytes read",
            )
            stored = read_state(spark, str(tmp_path / "checkpoint-on"))
            assert len(stored) == 7

            def keys() -> list[float]:
                return [
                    v
                    for (name, labels), v in scrape(endpoint.url).items()
                    if name == "eospack_state_keys" and dict(labels)["operator"] == "running_count"
                ]

            # One series per query: "on" and the two shared queries, each its 7 stored keys.
            wait_until(lambda: keys() == [7] * 3, 10, "7 keys per query")
            texts = [p.read_text() for p in metrics.glob("*.json")]
            assert texts
            for secret in (PASSWORD,):
                assert not any(secret in text for text in texts), secret
                assert not any(secret in line for line in captured.lines), secret
                with urllib.request.urlopen(endpoint.url, timeout=10) as response:
                    assert secret not in response.read().decode()

            for snapshot in metrics.glob("*.json"):
                snapshot.unlink()
                snapshot.mkdir()
            assert run("snapshots_are_directories") == expected

            shutil.rmtree(metrics)
            metrics.write_text("not a directory")
            assert run("directory_is_a_file") == expected
            scrape(endpoint.url)  # the endpoint still answers
        finally:
            endpoint.close()
            if metrics.is_file():
                metrics.unlink()
        writer = define("served_after")
        endpoint = eospack.metrics.serve(spark, port=0, directory=str(tmp_path / "metrics2"))
        try:
            assert run("served_after", writer) == expected
        finally:
            endpoint.close()
    finally:
        logging.getLogger("eospack").removeHandler(captured)
    assert METRICS_DIR_VARIABLE not in os.environ


def sessions_query(spark: Any, events: Path, checkpoint: Path, name: str) -> Any:
    return (
        sessionize(timed_events(spark, events), "k", "ts", "10 seconds", key_groups=4)
        .writeStream.format("noop")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


@pytest.mark.timeout(300)
def test_late_rows_count_once_with_two_endpoints_and_keys_match_the_state_after_a_restart(
    spark: Any, unique_name: str, tmp_path: Path
) -> None:
    """sessionize (4 key groups, 10 s gap) with ``serve(spark)`` called twice (two
    endpoints on one session): one late row is counted once, not once per endpoint. Then
    the query restarts from its checkpoint (same query id): the scraped keys follow the
    keys really in state (``read_state``) after new keys and after expiries."""
    events = tmp_path / "events"
    events.mkdir()
    checkpoint = tmp_path / "checkpoint"
    first = eospack.metrics.serve(spark, port=0, directory=str(tmp_path / "metrics"))
    second = eospack.metrics.serve(spark, port=0)  # the same directory, as documented
    try:
        query = sessions_query(spark, events, checkpoint, unique_name)
        labels = {"query": str(query.id), "operator": "sessionize"}

        def scraped(name: str, endpoint: Any = second, **more: Any) -> float | None:
            return value(scrape(endpoint.url), name, **{**labels, **more})

        def in_state() -> int:
            return len(read_state(spark, str(checkpoint)))

        late = "eospack_state_late_rows_dropped_total"
        try:
            write_events(events, 0, [("a", 1000), ("b", 1001), ("c", 1002), ("d", 1003)])
            wait_until(lambda: scraped("eospack_state_keys") == 4, 60, "4 keys in state")
            write_events(events, 1, [("e", 1100)])
            wait_until(lambda: scraped("eospack_state_keys") == 1, 60, "1 key left")
            write_events(events, 2, [("f", 1005)])
            wait_until(
                lambda: value(scrape(second.url), late, query=str(query.id)) is not None,
                60,
                "the late row counted",
            )
            query.processAllAvailable()
        finally:
            query.stop()
        assert scraped("eospack_state_keys") == in_state() == 1

        restarted = sessions_query(spark, events, checkpoint, f"{unique_name}_again")
        try:
            assert str(restarted.id) == labels["query"]
            write_events(events, 3, [("g", 1101), ("h", 1102), ("i", 1103)])
            wait_until(lambda: scraped("eospack_state_keys") == 4, 60, "4 keys after restart")
            restarted.processAllAvailable()
            assert in_state() == 4
            write_events(events, 4, [("j", 1200)])
            wait_until(lambda: scraped("eospack_state_keys") == 1, 60, "1 key after expiry")
            restarted.processAllAvailable()
            assert in_state() == 1
            assert scraped("eospack_state_keys_expired_total") == 4 + 4
        finally:
            restarted.stop()
        # By now the listener bus delivered the late batch's progress to both listeners.
        for endpoint in (first, second):
            assert value(scrape(endpoint.url), late, query=labels["query"]) == 1
            assert scraped("eospack_state_keys", endpoint) == 1
    finally:
        second.close()
        first.close()


@pytest.mark.timeout(300)
def test_a_replayed_batch_reads_its_bytes_again_and_commits_nothing_twice(
    spark: Any, kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """Counters count work done: replayable-kafka -> 2pc-jdbc, 20 records, then 6 more in
    a last batch whose commit-log entry is deleted (Spark replays it at the restart, as
    after a driver crash between the sink's commit and Spark's commit log). The read bytes
    are the produced bytes plus the replayed batch's; the rows and batches the sink
    committed count the rows written once (the replay is rolled back)."""
    servers, topic, database = servers_of(kafka), unique_name, tmp_path / "sink.db"
    create_topic(servers, topic, partitions=2)
    first, last = (
        keyed_records(2, 10, keys=5),
        [
            Record(p, f"w{p}-{i}".encode(), f"last{p}-{i}".encode())
            for i in range(3)
            for p in (0, 1)
        ],
    )
    checkpoint = tmp_path / "checkpoint"
    endpoint = eospack.metrics.serve(spark, port=0, directory=str(tmp_path / "metrics"))

    def run() -> None:
        stream = (
            read_stream(spark, servers, subscribe=topic, startingOffsets="earliest")
            .option("queryName", unique_name)
            .load()
        )
        query = (
            into_sqlite(stream, database, unique_name, checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(180)
            assert query.exception() is None
        finally:
            query.stop()

    def names() -> list[str]:
        with sqlite3.connect(database) as connection:
            return sorted(n for (n,) in connection.execute(f'SELECT name FROM "{unique_name}"'))

    def size(records: list[Record]) -> int:
        return sum(len(r.key or b"") + len(r.value or b"") for r in records)

    read_bytes = "eospack_kafka_source_read_bytes_total"
    try:
        produce_sealed(servers, topic, first)
        run()
        produce_sealed(servers, topic, last)
        run()
        commits = sorted(
            int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()
        )
        for name in (str(commits[-1]), f".{commits[-1]}.crc"):
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        run()
        expected = sorted((r.value or b"").decode() for r in first + last)
        assert names() == expected
        wait_until(
            lambda: (
                value(scrape(endpoint.url), read_bytes, query=unique_name)
                == size(first) + 2 * size(last)
            ),
            10,
            "the replayed batch's bytes counted again",
        )
        samples = scrape(endpoint.url)
        (sink_id,) = {
            dict(labels)["sink_id"]
            for name, labels in samples
            if name == "eospack_sink_batches_committed_total"
        }
        sink = {"sink": "2pc-jdbc", "sink_id": sink_id}
        rows = "eospack_sink_rows_committed_total"
        assert value(samples, rows, **sink, mode="exactly_once") == len(expected)
        committed = "eospack_sink_batches_committed_total"
        assert value(samples, committed, **sink, mode="exactly_once") == len(commits)
        assert value(samples, "eospack_sink_pieces_waiting", **sink) == 0
    finally:
        endpoint.close()


@pytest.mark.production_kafka  # the SASL_SSL Apache Kafka broker (as test_kafka_secured)
@pytest.mark.timeout(400)
def test_a_jaas_config_and_a_jdbc_password_reach_no_snapshot_label_or_scrape(
    spark: Any, secured_kafka: Any, unique_name: str, tmp_path: Path
) -> None:
    """replayable-kafka over SASL_SSL (``kafka.sasl.jaas.config`` with the app user's
    password) into 2pc-jdbc with a ``password`` option, metrics on: the records arrive, and
    neither secret is in a snapshot file (every process's: source runner, read tasks,
    commit runner) or the scrape's text (labels included). The ``eospack.batches`` line's
    fields are fixed (sink, sink id, batch, outcome, counts, seconds; the sink id is a hash
    of the query id and the table), so no option value can reach it."""
    from eospack.lab.services.kafka_cluster import APP_USER

    topic = f"{APP_TOPIC_PREFIX}{unique_name}-in"
    create_app_topic(secured_kafka, topic)
    records = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    produce_secured(secured_kafka, topic, records)
    metrics = tmp_path / "metrics"
    endpoint = eospack.metrics.serve(spark, port=0, directory=str(metrics))
    database = tmp_path / "sink.db"
    try:
        stream = (
            spark.readStream.format("replayable-kafka")
            .options(**secured_kafka.client_options())
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        query = (
            into_sqlite(stream, database, "t", tmp_path / "checkpoint")
            .option("password", PASSWORD)
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(240)
            assert query.exception() is None
        finally:
            query.stop()
        with sqlite3.connect(database) as connection:
            assert connection.execute('SELECT COUNT(*) FROM "t"').fetchone()[0] == 20
        jaas_password = secured_kafka.passwords[APP_USER]
        wait_until(
            lambda: (
                value(
                    scrape(endpoint.url),
                    "eospack_kafka_source_read_bytes_total",
                    query=f"subscribe={topic}",
                )
                is not None
            ),
            10,
            "the read tasks' snapshot",
        )
        texts = [p.read_text() for p in metrics.glob("*.json")]
        with urllib.request.urlopen(endpoint.url, timeout=10) as response:
            texts.append(response.read().decode())
        assert len(texts) >= 3
        for secret in (PASSWORD, jaas_password, "ScramLoginModule"):
            assert not any(secret in text for text in texts), secret
    finally:
        endpoint.close()
