"""Attacks on 2pc-jdbc's kept plans (``planning.plan_sink``) and SQLite's refusal of
columns that would store or compare a value other than Spark had it.

A plan is kept per Python process: Spark asks for the writer at every micro-batch and
every start of a query in one session in reused planner processes. The guarantee under
attack: whatever changed in the database between two starts in one SparkSession, every
row lands once with exactly the value Spark had, or the query fails with one line naming
the column; never a value silently rounded or an older version kept. Each test runs two
queries in the shared session with equal options, so the second one meets the first one's
kept plan (options do not include the checkpoint).
"""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.connectors.jdbc.dialect import TableName, stage_table
from integration_tests.jdbc_fixtures import (
    INPUT_SCHEMA_DDL,
    pg_leftovers,
    run_file_query,
    write_input_files,
)

pytestmark = pytest.mark.integration

DECIMAL_SCHEMA = "id BIGINT, amount DECIMAL(38,2)"
DECIMAL_KIND = pa.decimal128(38, 2)


def write_decimals(directory: Path, rows: list[tuple[int, Decimal]], index: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    ids, amounts = zip(*rows, strict=True)
    table = pa.table({"id": list(ids), "amount": pa.array(list(amounts), DECIMAL_KIND)})
    pq.write_table(table, directory / f"part-{index:04d}.parquet")


def sqlite_fetch(database: Path, statement: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute(statement).fetchall()


@pytest.mark.timeout(180)
def test_sqlite_a_table_recreated_with_a_decimal_column_is_refused_by_a_kept_plan(
    spark, tmp_path, unique_name
):
    """The first query creates the table (its decimal column as TEXT). The table is then
    dropped and created again with ``amount DECIMAL(38,2)`` (NUMERIC affinity), and a second
    query with the same options starts in the same session: it must be refused naming the
    column, as a first start is, not store 12345678901234567.89 as the double
    12345678901234568 (was: the kept plan skipped the check)."""
    database = tmp_path / "sink.db"
    options = {
        "url": f"jdbc:sqlite:{database}",
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
    }
    write_decimals(tmp_path / "first", [(1, Decimal("0.10"))], 0)
    run_file_query(spark, tmp_path / "first", tmp_path / "checkpoint1", DECIMAL_SCHEMA, options)
    with sqlite3.connect(database) as connection:
        connection.execute(f'DROP TABLE "{unique_name}"')
        connection.execute(f'CREATE TABLE "{unique_name}" (id INTEGER, amount DECIMAL(38,2))')
    write_decimals(tmp_path / "second", [(2, Decimal("12345678901234567.89"))], 0)
    with pytest.raises(Exception, match="column 'amount' is DECIMAL\\(38,2\\)"):
        run_file_query(
            spark, tmp_path / "second", tmp_path / "checkpoint2", DECIMAL_SCHEMA, options
        )
    assert sqlite_fetch(database, f'SELECT count(*) FROM "{unique_name}"') == [(0,)]


@pytest.mark.parametrize("declared", ["TEXT", "VARCHAR(20)"])
@pytest.mark.timeout(180)
def test_sqlite_refuses_a_numeric_version_column_stored_as_text(
    spark, tmp_path, unique_name, declared
):
    """An existing table whose ``version`` column has TEXT affinity stores the BIGINT
    versions as text, so the upsert compares '10' below '9' and keeps the older row:
    refused at query start naming the column, nothing written (was: version 9 kept over 10)."""
    database = tmp_path / "sink.db"
    with sqlite3.connect(database) as connection:
        connection.execute(
            f'CREATE TABLE "{unique_name}" (id INTEGER PRIMARY KEY, name TEXT, version {declared})'
        )
    write_input_files(tmp_path / "in", [[(1, "newer", 10)], [(1, "older", 9)]])
    options = {
        "url": f"jdbc:sqlite:{database}",
        "dbtable": unique_name,
        "writeMode": "upsert",
        "upsertKeys": "id",
        "versionColumn": "version",
    }
    with pytest.raises(Exception, match="versionColumn 'version'") as caught:
        run_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            INPUT_SCHEMA_DDL,
            options,
            files_per_trigger=1,
        )
    assert f"is {declared}" in str(caught.value)
    assert sqlite_fetch(database, f'SELECT count(*) FROM "{unique_name}"') == [(0,)]


@pytest.mark.timeout(180)
def test_a_staging_table_altered_by_hand_is_not_used_by_a_kept_plan(
    spark, postgres, tmp_path, unique_name
):
    """After a first query, someone narrows the staging table's ``amount`` to
    ``numeric(12,0)`` (the target is unchanged). A second query with the same options in the
    same session must not stage 2.25 as 2: the stage is made again with the target's types,
    as a first start does (was: the kept plan staged into it and 2.00 landed)."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, amount numeric(12,2))')
    options = {
        "url": postgres.endpoint.jdbc_url,
        "user": postgres.endpoint.user,
        "dbtable": unique_name,
        "protocol": "staging",
    }
    if postgres.endpoint.password:
        options["password"] = postgres.endpoint.password
    write_decimals(tmp_path / "first", [(1, Decimal("1.25"))], 0)
    run_file_query(spark, tmp_path / "first", tmp_path / "checkpoint1", DECIMAL_SCHEMA, options)
    stage = stage_table(TableName(None, unique_name))
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"ALTER TABLE {stage.sql()} ALTER COLUMN amount TYPE numeric(12,0)")
    write_decimals(tmp_path / "second", [(2, Decimal("2.25"))], 0)
    run_file_query(spark, tmp_path / "second", tmp_path / "checkpoint2", DECIMAL_SCHEMA, options)
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            f'SELECT id, amount::text FROM "{unique_name}" ORDER BY id'
        ).fetchall()
    assert rows == [(1, "1.25"), (2, "2.25")]
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(180)
def test_sqlite_stores_small_decimals_as_plain_text_with_their_scale(spark, tmp_path, unique_name):
    """Decimals go to SQLite as text. Python's ``str`` writes ``0E-10`` and ``1.000E-7`` for
    a DECIMAL(20,10) zero and 0.0000001: the text must be the plain number with its scale,
    as a TEXT column compares and shows it (was: exponent notation stored)."""
    database = tmp_path / "sink.db"
    kind = pa.decimal128(20, 10)
    values = [Decimal("0"), Decimal("0.0000001"), Decimal("-0.00000012"), Decimal("5")]
    directory = tmp_path / "in"
    directory.mkdir()
    pq.write_table(
        pa.table({"id": [1, 2, 3, 4], "amount": pa.array(values, kind)}),
        directory / "part-0000.parquet",
    )
    options = {
        "url": f"jdbc:sqlite:{database}",
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
    }
    run_file_query(
        spark, directory, tmp_path / "checkpoint", "id BIGINT, amount DECIMAL(20,10)", options
    )
    rows = sqlite_fetch(
        database, f'SELECT id, amount, typeof(amount) FROM "{unique_name}" ORDER BY id'
    )
    assert rows == [
        (1, "0.0000000000", "text"),
        (2, "0.0000001000", "text"),
        (3, "-0.0000001200", "text"),
        (4, "5.0000000000", "text"),
    ]
