"""A restart that changes what recovery depends on: ``deliveryGuarantee`` or ``ledgerTopic``.

deliveryGuarantee: an exactly-once run decides batch k and stops before committing it
(its driver killed right after the decision, or every transaction commit failing, so that
Spark's abort cannot roll it forward either). The query restarts at-least-once: its first
commit must finish what the exactly-once run left (nothing open or prepared, the slot
done, every row at least once), even when a decided piece was lost meanwhile (then the
at-least-once replay has rewritten its rows: the slot is marked done). Switched back to
exactly-once, the next restart succeeds and the new rows arrive once. 2pc-kafka with its
driver killed (the one driver process of this module) and with a lost piece; 2pc-jdbc
``prepared`` with upserts, whose leftovers hold the row locks the replay writes; 2pc-s3,
whose leftovers are uploads in progress.

ledgerTopic (2pc-kafka): a restart naming another ledger topic than the query's earlier
runs recorded in the checkpoint is refused at query start, in one line, before any row
moves.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.commit_protocols.inspection import SinkState
from eospack.connectors.kafka.client.transactions import fence
from eospack.connectors.kafka.sink.options import DEFAULT_LEDGER_TOPIC
from eospack.core import faults
from eospack.lab.services.kafka_tools import create_topic, read_all
from eospack.lab.testing import await_query
from eospack.tools.checkpoint import inspect_sink
from integration_tests.crash_harness import run_driver
from integration_tests.drivers.kafka_sink_driver import start_query
from integration_tests.jdbc_fixtures import (
    pg_rows,
    stream_input,
    write_input_files,
)

pytestmark = pytest.mark.integration

KAFKA_DRIVER = Path(__file__).parents[1] / "drivers" / "kafka_sink_driver.py"
QUERY_TIMEOUT = 240.0
AT_LEAST_ONCE = {"deliveryGuarantee": "at-least-once"}
SINK_ID_GIVEN = "(unused: the queries set sinkId)"
"""The query id handed to inspection, which derives no sink id when sinkId is given."""


def write_batches(
    directory: Path, first: int, count: int, rows: int = 200
) -> list[list[tuple[int, str]]]:
    """Files ``first`` .. ``first + count - 1``, one per micro-batch (read with
    maxFilesPerTrigger=1, modification times in file order), rows ``(id, grp)``."""
    directory.mkdir(parents=True, exist_ok=True)
    batches = []
    for index in range(first, first + count):
        ids = list(range(index * rows, (index + 1) * rows))
        groups = [f"g{i % 2}" for i in ids]
        file = directory / f"part-{index:03d}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "grp": groups}), file)
        os.utime(file, (1_700_000_000 + index, 1_700_000_000 + index))
        batches.append(list(zip(ids, groups, strict=True)))
    return batches


class KafkaQuery:
    """One 2pc-kafka query of a test: input files (one batch each), checkpoint, output
    topic, and a sinkId of its own (so that the test reads the ledger without deriving)."""

    def __init__(self, tmp_path: Path, kafka: Any, name: str, batches: int) -> None:
        self.bootstrap = kafka.endpoint.bootstrap_servers
        self.topic = name
        self.sink_id = name
        create_topic(self.bootstrap, name, 2)
        self.source = tmp_path / "source"
        self.batches = write_batches(self.source, 0, batches)
        self.checkpoint = tmp_path / "checkpoint"

    def options(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"sinkId": self.sink_id, **(extra or {})}

    def add_batches(self, count: int) -> None:
        self.batches += write_batches(self.source, len(self.batches), count)

    def crash(self, fault_point: str) -> None:
        arguments = [
            "--source",
            str(self.source),
            "--checkpoint",
            str(self.checkpoint),
            "--bootstrap-servers",
            self.bootstrap,
            "--topic",
            self.topic,
            *(f"--option={name}={value}" for name, value in self.options().items()),
        ]
        run = run_driver(KAFKA_DRIVER, arguments, timeout=QUERY_TIMEOUT, fault_point=fault_point)
        assert run.was_killed, f"{fault_point} was not reached:\n{run.explain()}"

    def run_here(self, spark: Any, extra: dict[str, str] | None = None) -> None:
        """The same query (same checkpoint) in the test's session, to the end of its input."""
        query = start_query(
            spark,
            str(self.source),
            str(self.checkpoint),
            self.bootstrap,
            self.topic,
            self.options(extra),
        )
        await_query(query, QUERY_TIMEOUT)

    def records(self) -> Counter[tuple[str, str]]:
        rows = read_all(self.bootstrap, self.topic, isolation_level="read_committed")
        return Counter(
            ((key or b"").decode(), (value or b"").decode()) for _, _, key, value in rows
        )

    def expected(self, first: int = 0, end: int | None = None) -> Counter[tuple[str, str]]:
        return Counter(
            (group, str(row_id)) for batch in self.batches[first:end] for row_id, group in batch
        )

    def state(self, topic: str = DEFAULT_LEDGER_TOPIC) -> SinkState:
        """The sink as its resource reports it (read only: no ledger is opened or fenced)."""
        options = {"kafka.bootstrap.servers": self.bootstrap, "topic": self.topic}
        return inspect_sink(
            "2pc-kafka", SINK_ID_GIVEN, {**options, **self.options(), "ledgerTopic": topic}
        )

    def open_transactions(self) -> list[str]:
        """The sink's task transactions still open (its prepared pieces)."""
        return list(self.state().prepared_pieces)

    def ledger(self, topic: str = DEFAULT_LEDGER_TOPIC) -> dict[int, str]:
        return {decision.batch_id: decision.status for decision in self.state(topic).decisions}


def assert_at_least_once(seen: Counter[Any], expected: Counter[Any]) -> None:
    assert set(seen) == set(expected), "rows missing or foreign"
    assert min(seen.values()) >= 1


@pytest.mark.timeout(600)
def test_kafka_decided_batch_then_at_least_once_then_exactly_once_again(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """The driver is killed right after deciding batch 1 (its two transactions open). The
    at-least-once restart commits them (they would pin the output's last stable offset
    until the broker aborted them, and a later exactly-once run would then fail forever);
    the exactly-once restart after it takes the next batch once."""
    query = KafkaQuery(tmp_path, real_kafka, unique_name, 3)
    query.crash("after_decision@1")
    assert query.records() == query.expected(0, 1)
    assert len(query.open_transactions()) == 2
    assert query.ledger()[1] == "decided"

    query.run_here(spark, AT_LEAST_ONCE)

    assert query.open_transactions() == []
    assert query.ledger()[1] == "done"
    seen = query.records()
    assert_at_least_once(seen, query.expected())
    assert seen - query.expected(1, 2) - query.expected(1, 2) == query.expected(0, 1) + (
        query.expected(2)
    ), "batch 1 twice (decided pieces committed, replay written), the others once"

    query.add_batches(1)
    query.run_here(spark)

    assert query.records() - seen == query.expected(3)
    assert query.open_transactions() == []
    assert set(query.ledger().values()) == {"done"}


@pytest.mark.timeout(300)
def test_kafka_decided_piece_lost_while_at_least_once_is_marked_done_not_a_wedge(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str, call_faults: Path
) -> None:
    """Batch 1 is decided, then every transaction commit fails (the commit's, then Spark's
    abort's roll-forward): the query stops with both transactions open. One of them is then
    aborted behind the sink's back (as the broker does after transaction.timeout.ms). The
    at-least-once restart rewrites batch 1, commits the surviving transaction, marks the
    slot done; switched back, exactly-once restarts instead of failing on the lost piece."""
    query = KafkaQuery(tmp_path, real_kafka, unique_name, 3)
    faults.arm(call_faults, "kafka_sink.commit_piece", "before", batch_id=1, times=2)
    with pytest.raises(Exception, match="KafkaConnectionError"):
        query.run_here(spark)
    assert faults.pending(call_faults) == []
    assert query.ledger()[1] == "decided"
    opened = query.open_transactions()
    assert len(opened) == 2
    fence({"bootstrap_servers": query.bootstrap}, opened[0])

    query.run_here(spark, AT_LEAST_ONCE)

    assert query.open_transactions() == []
    assert query.ledger()[1] == "done"
    seen = query.records()
    assert_at_least_once(seen, query.expected())

    query.add_batches(1)
    query.run_here(spark)

    assert query.records() - seen == query.expected(3)
    assert query.open_transactions() == []
    assert set(query.ledger().values()) == {"done"}


@pytest.mark.timeout(300)
def test_kafka_restart_with_another_ledger_topic_is_refused_in_one_line(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """Batch 0 runs with ledgerTopic A; the restart names B. It would not find A's
    decisions, so it is refused at query start: one line naming the option and the fix,
    and no record of the new batch written."""
    query = KafkaQuery(tmp_path, real_kafka, unique_name, 1)
    first, second = f"{unique_name}_ledger_a", f"{unique_name}_ledger_b"
    query.run_here(spark, {"ledgerTopic": first})
    assert query.records() == query.expected()
    query.add_batches(1)

    with pytest.raises(Exception) as raised:
        query.run_here(spark, {"ledgerTopic": second})

    lines = [line for line in str(raised.value).splitlines() if "Option ledgerTopic is" in line]
    assert lines, str(raised.value)
    assert f"Option ledgerTopic is '{second}'" in lines[0]
    assert f"earlier runs kept their decisions in '{first}'" in lines[0]
    assert f"set ledgerTopic={first}" in lines[0]
    assert query.records() == query.expected(0, 1)

    query.run_here(spark, {"ledgerTopic": first})
    assert query.records() == query.expected()


class JdbcQuery:
    """One 2pc-jdbc query of a test, run in the test's session: upserts into a table with
    a primary key (so an at-least-once replay leaves each row once, and the crashed run's
    prepared transactions hold row locks the replay's writes would wait on)."""

    def __init__(self, postgres: Any, tmp_path: Path, name: str, batches: int) -> None:
        self.url = postgres.endpoint.url
        self.postgres = postgres
        self.table = name
        self.sink_id = name
        self.input = tmp_path / "in"
        self.checkpoint = tmp_path / "checkpoint"
        self.batches: list[list[tuple[int, str, int]]] = []
        self.add_batches(batches)
        with psycopg.connect(self.url) as connection:
            connection.execute(
                f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, name text, version bigint)'
            )

    def add_batches(self, count: int) -> None:
        first = len(self.batches)
        more = [
            [(b * 10 + i, f"row-{b}-{i}", b) for i in range(6)] for b in range(first, first + count)
        ]
        write_input_files(self.input, more)
        self.batches += more

    def run_here(self, spark: Any, extra: dict[str, str] | None = None) -> None:
        options = {
            "url": self.postgres.endpoint.jdbc_url,
            "user": self.postgres.endpoint.user,
            "dbtable": self.table,
            "sinkId": self.sink_id,
            "protocol": "prepared",
            "writeMode": "upsert",
            "upsertKeys": "id",
            "versionColumn": "version",
            "lockTimeout": "5s",
            **(extra or {}),
        }
        query = (
            stream_input(spark, self.input, partitions=2)
            .writeStream.format("2pc-jdbc")
            .options(**options)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        await_query(query, QUERY_TIMEOUT)

    def rows(self) -> list[tuple[Any, ...]]:
        return pg_rows(self.url, self.table)

    def expected(self) -> list[tuple[int, str, int]]:
        return sorted(row for batch in self.batches for row in batch)

    def state(self) -> SinkState:
        """The sink as its resource reports it (read only)."""
        options = {
            "url": self.postgres.endpoint.jdbc_url,
            "user": self.postgres.endpoint.user,
            "dbtable": self.table,
            "sinkId": self.sink_id,
        }
        if self.postgres.endpoint.password:
            options["password"] = self.postgres.endpoint.password
        return inspect_sink("2pc-jdbc", SINK_ID_GIVEN, options)

    def ledger(self) -> dict[int, str]:
        return {decision.batch_id: decision.status for decision in self.state().decisions}

    def prepared(self) -> int:
        kinds = [leftover.kind for leftover in self.state().leftovers]
        return kinds.count("prepared transaction")


@pytest.mark.timeout(300)
def test_jdbc_prepared_decided_batch_then_at_least_once_then_exactly_once_again(
    spark: Any, postgres: Any, tmp_path: Path, unique_name: str, call_faults: Path
) -> None:
    """Batch 1 is decided, then every COMMIT PREPARED fails (the commit's and Spark's
    abort's): the query stops with two prepared transactions holding the rows' locks.
    The at-least-once restart's tasks would wait on them until lockTimeout, before any
    commit could recover: they finish them first. Then exactly-once resumes."""
    query = JdbcQuery(postgres, tmp_path, unique_name, 3)
    faults.arm(call_faults, "jdbc.commit_piece", "before", batch_id=1, times=2)
    with pytest.raises(Exception, match="injected fault: jdbc.commit_piece"):
        query.run_here(spark)
    assert faults.pending(call_faults) == []
    assert query.ledger() == {0: "done", 1: "decided"}
    assert query.prepared() == 2

    query.run_here(spark, AT_LEAST_ONCE)

    assert query.prepared() == 0
    assert query.ledger() == {0: "done", 1: "done"}
    assert query.rows() == query.expected()

    query.add_batches(1)
    query.run_here(spark)

    assert query.rows() == query.expected()
    assert query.prepared() == 0
    assert query.ledger() == {0: "done", 1: "done", 3: "done"}


class S3Query:
    """One 2pc-s3 query of a test, run in the test's session: Parquet under a prefix of
    its own, read back through the 2pc-s3 reader."""

    def __init__(self, s3: Any, tmp_path: Path, name: str, batches: int) -> None:
        endpoint = s3.endpoint
        self.client = endpoint.client()
        self.bucket = endpoint.bucket
        self.prefix = name
        self.path = f"s3://{endpoint.bucket}/{name}"
        self.connection = {
            "endpointUrl": endpoint.endpoint_url,
            "region": endpoint.region,
            "accessKeyId": endpoint.access_key_id,
            "secretAccessKey": endpoint.secret_access_key,
        }
        self.sink_id = name
        self.source = tmp_path / "source"
        self.checkpoint = tmp_path / "checkpoint"
        self.batches = write_batches(self.source, 0, batches, rows=20)

    def add_batches(self, count: int) -> None:
        self.batches += write_batches(self.source, len(self.batches), count, rows=20)

    def run_here(self, spark: Any, extra: dict[str, str] | None = None) -> None:
        query = (
            spark.readStream.schema("id BIGINT, grp STRING")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(self.source))
            .repartition(2)
            .writeStream.format("2pc-s3")
            .options(**self.connection, sinkId=self.sink_id, **(extra or {}))
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start(self.path)
        )
        await_query(query, QUERY_TIMEOUT)

    def rows(self, spark: Any) -> Counter[tuple[int, str]]:
        frame = spark.read.format("2pc-s3").options(**self.connection).load(self.path)
        return Counter((int(row.id), str(row.grp)) for row in frame.select("id", "grp").collect())

    def expected(self, first: int = 0, end: int | None = None) -> Counter[tuple[int, str]]:
        return Counter(row for batch in self.batches[first:end] for row in batch)

    def uploads_in_progress(self) -> list[str]:
        listed = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{self.prefix}/")
        return sorted(upload["Key"] for upload in listed.get("Uploads", ()))


@pytest.mark.chaos  # ~20 s, mostly botocore's backoff between the 10 failed completions
@pytest.mark.timeout(300)
def test_s3_decided_batch_then_at_least_once_then_exactly_once_again(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str, call_faults: Path
) -> None:
    """Batch 1 is decided, then every completion of its first file fails (each of
    botocore's 5 attempts, in the commit and again in Spark's abort): its uploads stay in
    progress. The at-least-once restart completes them; exactly-once then resumes."""
    query = S3Query(s3, tmp_path, unique_name, 3)
    faults.arm(call_faults, "s3.CompleteMultipartUpload", "before", batch_id=1, times=10)
    with pytest.raises(Exception, match="2pc-s3 could not complete"):
        query.run_here(spark)
    assert faults.pending(call_faults) == []
    assert query.uploads_in_progress() != []
    assert query.rows(spark) == query.expected(0, 1)

    query.run_here(spark, AT_LEAST_ONCE)

    assert query.uploads_in_progress() == []
    seen = query.rows(spark)
    assert_at_least_once(seen, query.expected())
    assert seen - query.expected(1, 2) - query.expected(1, 2) == query.expected(0, 1) + (
        query.expected(2)
    ), "batch 1 twice (decided files completed, replay written), the others once"

    query.add_batches(1)
    query.run_here(spark)

    assert query.rows(spark) - seen == query.expected(3)
    assert query.uploads_in_progress() == []
