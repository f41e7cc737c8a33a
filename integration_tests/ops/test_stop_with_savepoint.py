"""Stop-with-savepoint while batches keep coming: replayable-kafka -> running_count (with a
ttl, so Spark also plans a no-data batch on every trigger) -> 2pc-jdbc upserts.

A producer writes keyed records the whole time. The query is stopped with a savepoint (the
API in-process; the CLI through the checkpoint and ``StopRequestListener``). At that moment
the sink's table holds exactly the counts of the records below the savepoint's offsets and
the checkpoint's last batch is the savepoint's, committed. Then the checkpoint itself goes
on, and the savepoint restored into a new checkpoint goes on (into a copy of the table as it
stood): both end with exactly the counts of every record produced, nothing left prepared.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.cli import main
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed, read_all
from eospack.lab.testing import session_settings, wait_until
from eospack.stateful_ops import running_count
from eospack.tools.checkpoint import inspect_checkpoint
from eospack.tools.savepoint import Manifest, RestoredCheckpoint, end_offsets, restore_savepoint
from eospack.tools.stop_with_savepoint import (
    STOP_REQUEST,
    STOPPED,
    honour_stop_requests,
    stop_after_batch,
    stop_with_savepoint,
)
from eospack.tools.supervisor import FixedDelay, supervise
from integration_tests.jdbc_fixtures import pg_ledger, pg_leftovers

pytestmark = pytest.mark.integration

QUERY_SECONDS = 240
OPERATOR = "counts"


class CountingPipeline:
    """One query definition with a 300 ms processing-time trigger, on a checkpoint that may
    hold a restored savepoint. With ``ttl`` the operator has processing-time timeouts, so
    Spark runs a no-data batch on every trigger."""

    def __init__(
        self, spark: Any, kafka: Any, postgres: Any, topic: str, ttl: str | None = None
    ) -> None:
        self.spark, self.postgres, self.topic, self.ttl = spark, postgres, topic, ttl
        self.bootstrap = kafka.endpoint.bootstrap_servers

    def start(self, checkpoint: Path, table: str) -> Any:
        restored = RestoredCheckpoint(checkpoint)
        with session_settings(self.spark, {"spark.sql.shuffle.partitions": "2"}):
            events = (
                self.spark.readStream.format("replayable-kafka")
                .option("kafka.bootstrap.servers", self.bootstrap)
                .option("subscribe", self.topic)
                .option("startingOffsets", restored.starting_offsets("earliest"))
                .load()
                .selectExpr("CAST(key AS STRING) AS key")
            )
            counts = running_count(
                events,
                "key",
                key_groups=4,
                output_mode="append",
                name=OPERATOR,
                ttl=self.ttl,
                initial_state=restored.initial_states([OPERATOR])[OPERATOR],
            )
            return (
                counts.writeStream.format("2pc-jdbc")
                .option("url", self.postgres.endpoint.jdbc_url)
                .option("user", self.postgres.endpoint.user)
                .option("dbtable", table)
                .option("createTableIfNotExists", "true")
                .option("writeMode", "upsert")
                .option("upsertKeys", "key")
                .option("versionColumn", "version")
                .option("deliveryGuarantee", "exactly-once")
                .option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="300 milliseconds")
                .start()
            )

    def run_until(self, checkpoint: Path, table: str, expected: dict[str, int]) -> None:
        """Run live until the table holds ``expected``, then stop after a batch. (Not
        Trigger.AvailableNow: with processing-time timeouts its no-data batches never end.)"""
        query = self.start(checkpoint, table)
        try:

            def reached() -> bool:
                if query.exception() is not None:
                    raise query.exception()
                return table_counts(self.postgres.endpoint.url, table) == expected

            wait_until(reached, QUERY_SECONDS, f"{table} to hold every record's count")
            stop_after_batch(query)
            assert query.awaitTermination(QUERY_SECONDS) and query.exception() is None
        finally:
            query.stop()


class Producer:
    """Keyed records into both partitions, a few at a time, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.stopping = threading.Event()
        self.sent = 0
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self.produce, daemon=True)

    def produce(self) -> None:
        try:
            while not self.stopping.is_set():
                records = [
                    Record(index % 2, f"key-{index % 23:02d}".encode(), b"e")
                    for index in range(self.sent, self.sent + 10)
                ]
                produce_sealed(self.bootstrap, self.topic, records)
                self.sent += len(records)
                self.stopping.wait(0.05)  # pacing, not synchronisation
        except BaseException as error:
            self.failure = error

    def __enter__(self) -> Producer:
        self.thread.start()
        return self

    def __exit__(self, *exception: object) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert self.failure is None, self.failure


def table_counts(url: str, table: str) -> dict[str, int]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(f'SELECT key, "count" FROM "{table}"').fetchall()
    return {key: int(count) for key, count in rows}


def copy_table(url: str, source: str, target: str) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{target}" (LIKE "{source}" INCLUDING ALL)')
        connection.execute(f'INSERT INTO "{target}" SELECT * FROM "{source}"')


def counts_below(bootstrap: str, topic: str, manifest: Manifest | None) -> Counter[str]:
    """Keys of the topic's records below the savepoint's end offsets (all with None)."""
    ends = end_offsets(manifest.source_offsets[0])[topic] if manifest else None
    return Counter(
        (key or b"").decode()
        for partition, offset, key, _ in read_all(bootstrap, topic)
        if ends is None or offset < int(ends[str(partition)])
    )


def committed_batches(checkpoint: Path) -> tuple[int, int]:
    """The checkpoint's last planned and last committed batch."""
    batches = inspect_checkpoint(checkpoint).batches
    return batches[-1].batch_id, max(b.batch_id for b in batches if b.committed)


def wait_for_batches(query: Any, batches: int) -> None:
    def progressed() -> bool:
        if query.exception() is not None:
            raise query.exception()
        progress = query.lastProgress
        return bool(progress and progress["batchId"] >= batches)

    wait_until(progressed, 120, f"{batches} batches of query {query.id}")


def check_savepoint_and_continuations(
    pipeline: CountingPipeline,
    url: str,
    tmp_path: Path,
    live: tuple[Path, str],
    savepoint: Path,
    manifest: Manifest,
) -> None:
    """At the savepoint: the table and the checkpoint end exactly at its batch. Then the
    checkpoint and the restored savepoint both go on to exactly every record's count."""
    checkpoint, table = live
    bootstrap, topic = pipeline.bootstrap, pipeline.topic
    assert committed_batches(checkpoint) == (manifest.batch_id, manifest.batch_id)
    at_savepoint = counts_below(bootstrap, topic, manifest)
    assert sum(at_savepoint.values()) > 0
    assert table_counts(url, table) == dict(at_savepoint)
    copy = f"{table}_restored"
    restored = tmp_path / "restored"
    copy_table(url, table, copy)
    restore_savepoint(savepoint, restored)

    everything = counts_below(bootstrap, topic, None)
    assert sum(everything.values()) > sum(at_savepoint.values())
    pipeline.run_until(checkpoint, table, dict(everything))
    pipeline.run_until(restored, copy, dict(everything))
    for name in (table, copy):
        assert table_counts(url, name) == dict(everything)
        assert {status for *_, status in pg_ledger(url, name)} == {"done"}
        assert pg_leftovers(url, name) == (0, 0)


def no_data_batches(query: Any) -> list[int]:
    """Ids of the query's recent batches that read nothing (no-data batches)."""
    return [p["batchId"] for p in query.recentProgress if p["numInputRows"] == 0]


@pytest.mark.timeout(900)
def test_stop_with_savepoint_among_no_data_batches_of_processing_time_timeouts(
    spark: Any, kafka: Any, postgres: Any, tmp_path: Path, unique_name: str
) -> None:
    """The operator's ttl makes Spark plan a no-data batch on every trigger: the query never
    idles, and the stop still lands between two batches."""
    bootstrap, url = kafka.endpoint.bootstrap_servers, postgres.endpoint.url
    create_topic(bootstrap, unique_name, 2)
    pipeline = CountingPipeline(spark, kafka, postgres, unique_name, ttl="1 hour")
    checkpoint, table, savepoint = tmp_path / "live", f"{unique_name}_live", tmp_path / "sp"

    query = pipeline.start(checkpoint, table)
    try:
        with Producer(bootstrap, unique_name):
            wait_for_batches(query, 3)
        produced = max(p["batchId"] for p in query.recentProgress)
        wait_until(
            lambda: len([b for b in no_data_batches(query) if b > produced + 1]) >= 2,
            120,
            "two no-data batches after the input stopped",
        )
        manifest = stop_with_savepoint(query, savepoint, timeout=120)
    finally:
        query.stop()
    assert query.exception() is None
    with Producer(bootstrap, unique_name) as producer:
        wait_until(lambda: producer.sent >= 50, 60, "records after the savepoint")
    check_savepoint_and_continuations(
        pipeline, url, tmp_path, (checkpoint, table), savepoint, manifest
    )


@pytest.mark.timeout(900)
def test_cli_stop_is_honoured_by_the_listener_and_refused_in_one_line_without_it(
    spark: Any,
    kafka: Any,
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bootstrap, url = kafka.endpoint.bootstrap_servers, postgres.endpoint.url
    create_topic(bootstrap, unique_name, 2)
    pipeline = CountingPipeline(spark, kafka, postgres, unique_name)
    checkpoint, table, savepoint = tmp_path / "live", f"{unique_name}_live", tmp_path / "sp"
    command = ["savepoint", "create", "--stop", str(checkpoint), str(savepoint)]

    with Producer(bootstrap, unique_name) as producer, contextlib.ExitStack() as stack:
        query = pipeline.start(checkpoint, table)
        stack.callback(query.stop)
        wait_for_batches(query, 2)
        capsys.readouterr()
        assert main([*command, "--timeout", "3"]) == 1
        error = capsys.readouterr().err.strip()
        assert error.startswith("eospack savepoint create: no query on") and "\n" not in error
        assert "honour_stop_requests(spark)" in error
        assert query.isActive and not (checkpoint / STOP_REQUEST).exists()
        assert not savepoint.exists()

        listener = honour_stop_requests(spark)
        try:
            assert main([*command, "--timeout", "120"]) == 0
        finally:
            spark.streams.removeListener(listener)
        assert query.awaitTermination(60) and query.exception() is None
        assert not (checkpoint / STOP_REQUEST).exists() and not (checkpoint / STOPPED).exists()
        after = producer.sent
        wait_until(lambda: producer.sent >= after + 50, 60, "records after the savepoint")
    manifest = Manifest.read(savepoint)
    check_savepoint_and_continuations(
        pipeline, url, tmp_path, (checkpoint, table), savepoint, manifest
    )


@pytest.mark.timeout(600)
def test_a_supervised_query_stopped_with_a_savepoint_ends_supervise_without_a_restart(
    spark: Any, kafka: Any, postgres: Any, tmp_path: Path, unique_name: str
) -> None:
    """supervise runs in the test's thread (a query started from another Python thread does
    not find the Python data sources registered in the session); the CLI runs beside it."""
    bootstrap, url = kafka.endpoint.bootstrap_servers, postgres.endpoint.url
    create_topic(bootstrap, unique_name, 2)
    pipeline = CountingPipeline(spark, kafka, postgres, unique_name)
    checkpoint, table, savepoint = tmp_path / "live", f"{unique_name}_live", tmp_path / "sp"
    started: list[Any] = []
    outcome: dict[str, Any] = {}

    def start_queries() -> Any:
        started.append(pipeline.start(checkpoint, table))
        return started[-1]

    def stop_with_the_cli() -> None:
        try:
            wait_until(lambda: started, 120, "the supervised query to start")
            wait_for_batches(started[0], 2)
            command = ["savepoint", "create", "--stop", "--timeout", "120"]
            outcome["exit"] = main([*command, str(checkpoint), str(savepoint)])
        except BaseException as error:
            outcome["error"] = error
        finally:
            if outcome.get("exit") != 0:
                for query in started:
                    query.stop()

    listener = honour_stop_requests(spark)
    cli = threading.Thread(target=stop_with_the_cli, daemon=True)
    try:
        with Producer(bootstrap, unique_name):
            cli.start()
            restarts = supervise(start_queries, FixedDelay(attempts=3, delay=1.0))
            cli.join(120)
    finally:
        spark.streams.removeListener(listener)
        for query in started:
            query.stop()
    assert not cli.is_alive() and outcome == {"exit": 0}
    assert restarts == 0 and len(started) == 1
    manifest = Manifest.read(savepoint)
    assert committed_batches(checkpoint) == (manifest.batch_id, manifest.batch_id)
    assert table_counts(url, table) == dict(counts_below(bootstrap, unique_name, manifest))
