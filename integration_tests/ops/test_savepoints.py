"""Savepoints end to end: replayable-kafka -> running_count -> 2pc-jdbc (upserts, exactly-once).

A reference query runs three rounds of events on its own checkpoint (it never stops, as far
as its output can tell). A second query runs round one, is stopped, and savepointed; the
savepoint is restored no-claim into a new checkpoint (same settings) and claim into another
(twice the key groups, twice the shuffle partitions, RocksDB instead of the default state
store), each continuing into its own copy
of the sink's table as it stood at the savepoint. After rounds two and three every table
holds exactly the reference's (key, count, version) rows, nothing is left prepared, the
no-claim savepoint is byte for byte what it was, and the claimed one has moved.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.cli import main
from eospack.core.checkpoint_files import CheckpointFilesError
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.lab.testing import await_query, session_settings
from eospack.stateful_ops import (
    OperatorDefinitionError,
    read_state,
    running_aggregate,
    running_count,
)
from eospack.stateful_ops.state_store import state_store_conf
from eospack.tools.checkpoint import inspect_checkpoint
from eospack.tools.savepoint import RESTORED_DIRECTORY, RestoredCheckpoint
from integration_tests.jdbc_fixtures import pg_ledger, pg_leftovers

pytestmark = pytest.mark.integration

QUERY_SECONDS = 180


class Pipeline:
    """One query definition, started with Trigger.AvailableNow on a given checkpoint."""

    def __init__(self, spark: Any, kafka: Any, postgres: Any, topic: str) -> None:
        self.spark, self.postgres, self.topic = spark, postgres, topic
        self.bootstrap = kafka.endpoint.bootstrap_servers

    def run(
        self,
        checkpoint: Path,
        table: str,
        key_groups: int = 8,
        partitions: int = 2,
        provider: str = "hdfs",
    ) -> None:
        """One run to the end of the topic; shuffle partitions and state store provider
        only count for a new checkpoint (Spark keeps a checkpoint's own)."""
        restored = RestoredCheckpoint(checkpoint)
        settings = {
            "spark.sql.shuffle.partitions": str(partitions),
            **state_store_conf(provider, changelog=provider == "rocksdb"),
        }
        with session_settings(self.spark, settings):
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
                key_groups=key_groups,
                output_mode="append",
                initial_state=restored.initial_state(),
            )
            query = (
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
                .trigger(availableNow=True)
                .start()
            )
            await_query(query, QUERY_SECONDS)


def produce_round(bootstrap: str, topic: str, count: int, rng: random.Random) -> Counter[str]:
    keys = [f"key-{rng.randrange(40):02d}" for _ in range(count)]
    produce_sealed(
        bootstrap, topic, [Record(index % 2, key.encode(), b"e") for index, key in enumerate(keys)]
    )
    return Counter(keys)


def table_rows(url: str, table: str) -> dict[str, tuple[int, int]]:
    with psycopg.connect(url) as connection:
        rows = connection.execute(f'SELECT key, "count", version FROM "{table}"').fetchall()
    return {key: (int(count), int(version)) for key, count, version in rows}


def copy_table(url: str, source: str, target: str) -> None:
    """The sink's table as it stands, for a second restored query to continue into."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{target}" (LIKE "{source}" INCLUDING ALL)')
        connection.execute(f'INSERT INTO "{target}" SELECT * FROM "{source}"')


def digest(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


@pytest.mark.timeout(900)
def test_restored_queries_continue_like_a_query_that_never_stopped(
    spark: Any,
    kafka: Any,
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    bootstrap, url = kafka.endpoint.bootstrap_servers, postgres.endpoint.url
    create_topic(bootstrap, unique_name, 2)
    pipeline = Pipeline(spark, kafka, postgres, unique_name)
    reference, stopped = f"{unique_name}_ref", f"{unique_name}_nc"
    rescaled = f"{unique_name}_cl"
    savepoint = tmp_path / "savepoint"

    produced = produce_round(bootstrap, unique_name, 400, rng)
    pipeline.run(tmp_path / "reference", reference)
    pipeline.run(tmp_path / "first", stopped)
    assert main(["savepoint", "create", str(tmp_path / "first"), str(savepoint)]) == 0
    copy_table(url, stopped, rescaled)
    before = digest(savepoint)
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "no-claim")]) == 0
    assert "initial_state=restored.initial_state()" in capsys.readouterr().out
    claimed = tmp_path / "claimed"
    copy = tmp_path / "savepoint-to-claim"
    assert main(["savepoint", "create", str(tmp_path / "first"), str(copy)]) == 0
    assert main(["savepoint", "restore", str(copy), str(claimed), "--mode", "claim"]) == 0
    assert not copy.exists() and (claimed / RESTORED_DIRECTORY / "manifest.json").is_file()

    for events in (300, 200):
        produced += produce_round(bootstrap, unique_name, events, rng)
        pipeline.run(tmp_path / "reference", reference)
        pipeline.run(tmp_path / "no-claim", stopped)
        pipeline.run(claimed, rescaled, key_groups=16, partitions=4, provider="rocksdb")

    expected = table_rows(url, reference)
    assert {key: count for key, (count, _) in expected.items()} == dict(produced)
    assert table_rows(url, stopped) == expected
    assert table_rows(url, rescaled) == expected
    for table in (reference, stopped, rescaled):
        assert {status for *_, status in pg_ledger(url, table)} == {"done"}
        assert pg_leftovers(url, table) == (0, 0)
    assert digest(savepoint) == before
    assert not any(part.name == RESTORED_DIRECTORY for part in savepoint.iterdir())

    reference_state = read_state(spark, str(tmp_path / "reference"))
    states = {"no-claim": read_state(spark, str(tmp_path / "no-claim"))}
    states["claimed"] = read_state(spark, str(claimed))
    for state in (reference_state, *states.values()):
        assert dict(zip(state["key"], state["count"], strict=True)) == dict(produced)
    report = inspect_checkpoint(claimed, spark=spark)
    assert "RocksDB" in (report.state_store_provider or "")
    (operator,) = report.operators
    assert (operator.name, operator.keys, operator.key_groups) == (
        "running_count",
        len(produced),
        16,
    )


@pytest.mark.timeout(300)
def test_savepoint_refusals_are_one_line_and_change_nothing(
    spark: Any,
    kafka: Any,
    postgres: Any,
    tmp_path: Path,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bootstrap = kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    produce_round(bootstrap, unique_name, 50, random.Random(1))
    pipeline = Pipeline(spark, kafka, postgres, unique_name)
    pipeline.run(tmp_path / "first", unique_name)
    savepoint = tmp_path / "savepoint"
    assert main(["savepoint", "create", str(tmp_path / "first"), str(savepoint)]) == 0

    # An uncommitted last batch: its sinks may have applied it, so no savepoint of it.
    offsets = tmp_path / "first" / "offsets"
    last = max(
        (path for path in offsets.iterdir() if path.name.isdigit()), key=lambda p: int(p.name)
    )
    (last.parent / str(int(last.name) + 1)).write_text(last.read_text())
    assert main(["savepoint", "create", str(tmp_path / "first"), str(tmp_path / "other")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "was started but not committed" in error
    assert not (tmp_path / "other").exists()

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "metadata").write_text("{}")
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "busy")]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is not empty" in error
    assert main(["savepoint", "restore", str(tmp_path / "first"), str(tmp_path / "x")]) == 1
    assert "is not a savepoint" in capsys.readouterr().err

    # The savepoint's state is running_count's: another operator refuses it before starting.
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "restored")]) == 0
    restored = RestoredCheckpoint(tmp_path / "restored")
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", unique_name)
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "length(value) AS size")
    )
    with pytest.raises(OperatorDefinitionError, match="initial_state .* holds columns key"):
        running_aggregate(events, "key", {"size": "sum"}, initial_state=restored.initial_state())
    # s3:// is no Hadoop file system outside EMR: one line pointing at s3a://
    with pytest.raises(CheckpointFilesError, match=r"^s3://bucket/checkpoint: .* use s3a://"):
        RestoredCheckpoint("s3://bucket/checkpoint")
