"""``mergeSchema=true``: a column added upstream reaches the target without a new checkpoint.

Spark fixes a streaming query's schema when it starts, so a new column arrives as a
restart from the same checkpoint with a DataFrame that carries it. Each test runs real
availableNow queries over parquet files (one file per micro-batch) and checks the exact
rows: nothing lost, nothing doubled, the rows written before the column NULL there, no
prepared transaction or staged row left.
"""

from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.connectors.jdbc.dialect import TableName, stage_table
from eospack.core import faults
from eospack.lab.testing import await_query
from integration_tests.jdbc_fixtures import (
    FILE_QUERY_TIMEOUT,
    pg_leftovers,
    run_file_query,
    start_file_query,
)
from integration_tests.jdbc_pipeline import Pipeline

pytestmark = pytest.mark.integration

OLD_SCHEMA = "id BIGINT, name STRING"
NEW_SCHEMA = "id BIGINT, name STRING, note STRING"
OLD_ROWS = [[(1, "a"), (2, "b")], [(3, "c")]]
NEW_ROWS = [[(4, "d", "x4"), (5, "e", None)], [(6, "f", "x6")]]
EXPECTED = [(1, "a", None), (2, "b", None), (3, "c", None)] + [
    row for batch in NEW_ROWS for row in batch
]


def write_batches(directory: Path, batches: list[list[tuple[Any, ...]]], names: list[str]) -> None:
    """One parquet file per micro-batch, after those already there."""
    directory.mkdir(parents=True, exist_ok=True)
    start = len(list(directory.glob("*.parquet")))
    for offset, rows in enumerate(batches):
        columns = {name: [row[i] for row in rows] for i, name in enumerate(names)}
        table = pa.table(
            {
                name: pa.array(values, pa.int64() if name == "id" else pa.string())
                for name, values in columns.items()
            }
        )
        pq.write_table(table, directory / f"part-{start + offset:04d}.parquet")


class Target:
    """One target table: PostgreSQL with a protocol, or SQLite; options and reads."""

    def __init__(self, kind: str, postgres: Any, tmp_path: Path, table: str) -> None:
        self.kind, self.table = kind, table
        if kind == "sqlite":
            self.path = tmp_path / "sink.db"
            self.options = {"url": f"jdbc:sqlite:{self.path}", "dbtable": table}
        else:
            self.url = postgres.endpoint.url
            self.options = {
                "url": postgres.endpoint.jdbc_url,
                "user": postgres.endpoint.user,
                "dbtable": table,
                "protocol": kind.split("-")[1],
            }
            if postgres.endpoint.password:
                self.options["password"] = postgres.endpoint.password
        self.options["createTableIfNotExists"] = "true"

    def fetch(self, statement: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as connection:
                return connection.execute(statement).fetchall()
        with psycopg.connect(self.url) as connection:
            return connection.execute(statement).fetchall()

    def execute(self, statement: str) -> None:
        if self.kind == "sqlite":
            with sqlite3.connect(self.path) as connection:
                connection.execute(statement)
        else:
            with psycopg.connect(self.url, autocommit=True) as connection:
                connection.execute(statement)

    def rows(self) -> list[tuple[Any, ...]]:
        return self.fetch(f'SELECT id, name, note FROM "{self.table}" ORDER BY id')

    def columns(self, table: str) -> list[str]:
        if self.kind == "sqlite":
            return [row[1] for row in self.fetch(f'PRAGMA table_info("{table}")')]
        return [
            name
            for (name,) in self.fetch(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass("
                f"'\"{table}\"') AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
            )
        ]

    def ledger(self) -> list[tuple[int, str]]:
        return [
            (int(batch), str(status))
            for batch, status in self.fetch(
                "SELECT batch_id, status FROM eospack_commits"
                f" WHERE target = '{self.table}' ORDER BY batch_id"
            )
        ]

    def leftovers(self) -> tuple[int, int]:
        if self.kind != "sqlite":
            return pg_leftovers(self.url, self.table)
        stage = stage_table(TableName(None, self.table)).name
        if not self.columns(stage):
            return (0, 0)
        return (0, int(self.fetch(f'SELECT count(*) FROM "{stage}"')[0][0]))


@pytest.mark.parametrize("kind", ["postgres-prepared", "postgres-staging", "sqlite"])
@pytest.mark.timeout(300)
def test_a_restart_with_a_new_column_adds_it_with_merge_schema_and_is_refused_without(
    spark, postgres, tmp_path, unique_name, kind
):
    target = Target(kind, postgres, tmp_path, unique_name)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_batches(source, OLD_ROWS, ["id", "name"])
    run_file_query(spark, source, checkpoint, OLD_SCHEMA, target.options, files_per_trigger=1)
    stage = stage_table(TableName(None, unique_name)).name
    stage_before = target.columns(stage)
    if stage_before:  # rows another query staged before the ALTER (not this sink's pieces)
        target.execute(
            f'INSERT INTO "{stage}" (eospack_piece, id, name)'
            " VALUES ('eospack-zzother-0-0-0', 99, 'other')"
        )
    write_batches(source, NEW_ROWS, ["id", "name", "note"])

    with pytest.raises(Exception, match="has no column 'note'") as refused:
        run_file_query(spark, source, checkpoint, NEW_SCHEMA, target.options, files_per_trigger=1)
    assert "set mergeSchema=true" in str(refused.value)
    assert target.fetch(f'SELECT id FROM "{unique_name}" ORDER BY id') == [(1,), (2,), (3,)]

    merged = {**target.options, "mergeSchema": "true"}
    run_file_query(spark, source, checkpoint, NEW_SCHEMA, merged, files_per_trigger=1)

    assert target.rows() == EXPECTED
    assert target.ledger() == [(0, "done"), (1, "done"), (2, "done"), (3, "done")]
    if stage_before:  # a stage made before the ALTER, holding rows, got the column too
        assert "note" not in stage_before and "note" in target.columns(stage)
        assert target.fetch(f'SELECT eospack_piece, id, note FROM "{stage}"') == [
            ("eospack-zzother-0-0-0", 99, None)
        ]
        target.execute(f'DELETE FROM "{stage}"')
    assert target.leftovers() == (0, 0)


@pytest.mark.parametrize("kind", ["postgres-prepared", "postgres-staging", "sqlite"])
@pytest.mark.timeout(300)
def test_a_failed_commit_after_the_alter_ends_exactly_once_with_the_column(
    spark, postgres, tmp_path, unique_name, call_faults, kind
):
    """The commit of the first batch with the new column fails after the planning ALTER
    committed (the decision write loses its connection before it applies). The restart
    finds the column, adds nothing, and replays the batch: each row once."""
    target = Target(kind, postgres, tmp_path, unique_name)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_batches(source, OLD_ROWS, ["id", "name"])
    run_file_query(spark, source, checkpoint, OLD_SCHEMA, target.options, files_per_trigger=1)
    write_batches(source, NEW_ROWS, ["id", "name", "note"])
    merged = {**target.options, "mergeSchema": "true"}
    faults.arm(call_faults, "jdbc.decide", "before", batch_id=2)

    with pytest.raises(Exception, match="jdbc.decide"):
        run_file_query(spark, source, checkpoint, NEW_SCHEMA, merged, files_per_trigger=1)
    assert [f["call"] for f in faults.injected(call_faults)] == ["jdbc.decide"]
    assert "note" in target.columns(unique_name)
    assert target.fetch(f'SELECT id FROM "{unique_name}" ORDER BY id') == [(1,), (2,), (3,)]

    run_file_query(spark, source, checkpoint, NEW_SCHEMA, merged, files_per_trigger=1)

    assert target.rows() == EXPECTED
    assert target.columns(unique_name).count("note") == 1
    assert target.ledger() == [(0, "done"), (1, "done"), (2, "done"), (3, "done")]
    assert target.leftovers() == (0, 0)


@pytest.mark.parametrize(
    ("kind", "number", "text"),
    [("postgres-staging", "bigint", "text"), ("sqlite", "INTEGER", "TEXT")],
)
@pytest.mark.timeout(300)
def test_retyped_and_dropped_required_columns_are_refused_even_with_merge_schema(
    spark, postgres, tmp_path, unique_name, kind, number, text
):
    """Refused at query start in one line naming the column and the fix, nothing written:
    a DataFrame ``id`` that became a date while the table's is bigint, and a DataFrame
    without ``name``, which the table requires (NOT NULL, no default). A DataFrame without
    the nullable ``note`` is written, ``note`` NULL (as without mergeSchema)."""
    target = Target(kind, postgres, tmp_path, unique_name)
    target.execute(
        f'CREATE TABLE "{unique_name}" (id {number} NOT NULL, name {text} NOT NULL, note {text})'
    )
    options = {**target.options, "mergeSchema": "true"}
    retyped = tmp_path / "retyped_renamed"
    retyped.mkdir()
    pq.write_table(
        pa.table({"id": pa.array([datetime.date(2024, 1, 7)]), "name": pa.array(["g"])}),
        retyped / "part-0000.parquet",
    )
    with pytest.raises(Exception, match=f"column 'id' is {number}") as caught:
        run_file_query(spark, retyped, tmp_path / "cp1", "id DATE, name STRING", options)
    line = str(caught.value).split("JdbcSchemaError: ")[-1].splitlines()[0]
    assert "cannot store the DataFrame's date (a retyped column): cast it back" in line

    dropped = tmp_path / "dropped"
    pq.write_table(pa.table({"id": pa.array([8], pa.int64())}), _file(dropped))
    with pytest.raises(Exception, match="column 'name' is NOT NULL without a default"):
        run_file_query(spark, dropped, tmp_path / "cp2", "id BIGINT", options)
    assert target.fetch(f'SELECT count(*) FROM "{unique_name}"') == [(0,)]

    fewer = tmp_path / "fewer"
    pq.write_table(
        pa.table({"id": pa.array([9], pa.int64()), "name": pa.array(["i"])}), _file(fewer)
    )
    run_file_query(spark, fewer, tmp_path / "cp3", OLD_SCHEMA, options)
    assert target.rows() == [(9, "i", None)]
    assert target.columns(unique_name) == ["id", "name", "note"]
    assert target.leftovers() == (0, 0)


def _file(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "part-0000.parquet"


@pytest.mark.timeout(300)
def test_a_prepared_transaction_left_on_the_table_fails_the_alter_after_lock_timeout_naming_it(
    spark, postgres, tmp_path, unique_name
):
    """A crashed run's prepared piece holds a lock on the table that ADD COLUMN waits for:
    the restart with the new column fails after lockTimeout in one line naming the prepared
    transaction, adds nothing; once the piece is finished, the restart adds the column."""
    target = Target("postgres-prepared", postgres, tmp_path, unique_name)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_batches(source, OLD_ROWS, ["id", "name"])
    run_file_query(spark, source, checkpoint, OLD_SCHEMA, target.options, files_per_trigger=1)
    write_batches(source, NEW_ROWS, ["id", "name", "note"])
    gid = f"eospack-left_{unique_name[-8:]}-9-0-0"
    merged = {**target.options, "mergeSchema": "true", "lockTimeout": "1s"}
    crashed = psycopg.connect(target.url)
    try:
        crashed.tpc_begin(gid)
        crashed.execute(f"INSERT INTO \"{unique_name}\" (id, name) VALUES (100, 'left')")
        crashed.tpc_prepare()
        crashed.close()
        with pytest.raises(Exception, match="locked by another session for over 1000ms") as caught:
            run_file_query(spark, source, checkpoint, NEW_SCHEMA, merged, files_per_trigger=1)
        assert f"(prepared transactions of eospack sinks: {gid})" in str(caught.value)
        assert "note" not in target.columns(unique_name)
    finally:
        crashed.close()
        if target.fetch(f"SELECT 1 FROM pg_prepared_xacts WHERE gid = '{gid}'"):
            target.execute(f"ROLLBACK PREPARED '{gid}'")

    run_file_query(spark, source, checkpoint, NEW_SCHEMA, merged, files_per_trigger=1)

    assert target.rows() == EXPECTED
    assert target.ledger() == [(0, "done"), (1, "done"), (2, "done"), (3, "done")]
    assert target.leftovers() == (0, 0)


@pytest.mark.parametrize("kind", ["postgres-prepared", "sqlite"])
@pytest.mark.timeout(300)
def test_two_queries_adding_the_same_column_at_once_leave_one_column_and_every_row_once(
    spark, postgres, tmp_path, unique_name, kind
):
    """Two queries (own checkpoints, own files) start together, both adding ``note``: the
    DDL transactions are serialised, the second finds the column, both write their rows."""
    target = Target(kind, postgres, tmp_path, unique_name)
    write_batches(tmp_path / "old", [OLD_ROWS[0]], ["id", "name"])
    run_file_query(spark, tmp_path / "old", tmp_path / "cp0", OLD_SCHEMA, target.options)
    merged = {**target.options, "mergeSchema": "true"}
    write_batches(tmp_path / "a", [[(10, "a", "from a")]], ["id", "name", "note"])
    write_batches(tmp_path / "b", [[(20, "b", "from b")]], ["id", "name", "note"])
    queries = [
        start_file_query(spark, tmp_path / name, tmp_path / f"cp_{name}", NEW_SCHEMA, merged)
        for name in ("a", "b")
    ]
    for query in queries:
        await_query(query, FILE_QUERY_TIMEOUT)

    assert target.rows() == [
        (1, "a", None),
        (2, "b", None),
        (10, "a", "from a"),
        (20, "b", "from b"),
    ]
    assert target.columns(unique_name) == ["id", "name", "note"]
    assert target.leftovers() == (0, 0)


@pytest.mark.timeout(300)
def test_a_kept_plan_adds_the_column_again_after_it_was_dropped_by_hand(
    spark, postgres, tmp_path, unique_name
):
    """Plans are kept per process across micro-batches and queries with equal options and
    schema. With mergeSchema a kept plan holds only while the table's columns are those it
    was made for: after someone drops ``note``, the next query with the same options plans
    again and adds it (was kept: its tasks would COPY into a column that is gone)."""
    target = Target("postgres-prepared", postgres, tmp_path, unique_name)
    merged = {**target.options, "mergeSchema": "true"}
    write_batches(tmp_path / "a", [[(1, "a", "one")]], ["id", "name", "note"])
    run_file_query(spark, tmp_path / "a", tmp_path / "cp_a", NEW_SCHEMA, merged)
    target.execute(f'ALTER TABLE "{unique_name}" DROP COLUMN note')
    write_batches(tmp_path / "b", [[(2, "b", "two")]], ["id", "name", "note"])

    run_file_query(spark, tmp_path / "b", tmp_path / "cp_b", NEW_SCHEMA, merged)

    assert target.rows() == [(1, "a", None), (2, "b", "two")]
    assert target.leftovers() == (0, 0)


@pytest.mark.chaos  # its own driver JVM, about a minute; the default lane has the fault-point case
@pytest.mark.timeout(400)
def test_a_driver_killed_after_deciding_the_first_batch_with_the_new_column_ends_exactly_once(
    spark, postgres, tmp_path, unique_name, call_faults
):
    """``protocol=prepared``: the driver adds ``note`` at planning, its tasks prepare rows
    carrying it, it decides batch 4 and is SIGKILLed before COMMIT PREPARED. The restart
    (same checkpoint, same columns) finds the column, so it needs no table lock that the
    decided pieces hold, commits them and goes on: every row once, ``note`` present once."""
    pipeline = Pipeline(postgres, tmp_path, unique_name, call_faults)
    assert pipeline.run(spark, "--protocol", "prepared").succeeded
    added = [
        [(100 + b * 10 + i, f"new-{b}-{i}", b, f"note-{b}-{i}") for i in range(4)] for b in (4, 5)
    ]
    for index, rows in enumerate(added, start=len(pipeline.batches)):
        columns = list(zip(*rows, strict=True))
        pq.write_table(
            pa.table(
                {
                    "id": pa.array(columns[0], pa.int64()),
                    "name": pa.array(columns[1]),
                    "version": pa.array(columns[2], pa.int64()),
                    "note": pa.array(columns[3]),
                }
            ),
            tmp_path / "in" / f"part-{index:04d}.parquet",
        )

    crashed = pipeline.crash(
        "--protocol", "prepared", "--merge-schema", fault_point="after_decision@4"
    )
    assert crashed.was_killed
    assert pipeline.ledger()[4] == "decided"
    final = pipeline.run(spark, "--protocol", "prepared", "--merge-schema")

    assert final.succeeded, final.explain()
    with psycopg.connect(pipeline.url) as connection:
        rows = connection.execute(
            f'SELECT id, name, version, note FROM "{unique_name}" ORDER BY id'
        ).fetchall()
    assert rows == sorted(
        [(*row, None) for row in pipeline.expected] + [row for batch in added for row in batch]
    )
    assert pipeline.ledger() == dict.fromkeys(range(6), "done")
    assert pg_leftovers(pipeline.url, unique_name) == (0, 0)
