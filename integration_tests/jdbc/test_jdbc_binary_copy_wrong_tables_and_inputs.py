"""Attacks on 2pc-jdbc's per-column binary COPY (``binary_copy``) and its CSV fallback:
wrong-but-plausible tables and inputs, each as a real query through the sink. The
guarantee under attack: every row lands once with exactly the value Spark had, or the task
fails before anything is visible with one line naming the column.

Holes that are not fixed are ``xfail(strict=True)`` with the hole in the reason; a test
that passes pins what ``test_jdbc_types`` does not."""

from __future__ import annotations

import dataclasses
import datetime
import re
import sqlite3
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.lab.testing import await_query, wait_until
from integration_tests.jdbc.jdbc_type_columns_parts import COLUMNS, NAMES, comparable, expected_rows
from integration_tests.jdbc_fixtures import pg_leftovers, run_file_query, start_file_query

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 120.0
UTC = datetime.timezone.utc


def write_file(directory: Path, table: pa.Table, index: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / f"part-{index:04d}.parquet")


def pg_options(endpoint: Any, table: str, **extra: str) -> dict[str, str]:
    options = {"url": endpoint.jdbc_url, "user": endpoint.user, "dbtable": table, **extra}
    if endpoint.password:
        options["password"] = endpoint.password
    return options


def pg_fetch(url: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, options="-c TimeZone=UTC") as connection:
        return connection.execute(statement).fetchall()


@pytest.mark.timeout(180)
def test_a_column_type_changed_while_a_task_waits_for_the_table_is_not_misread(
    spark, postgres, tmp_path, unique_name
):
    """Hole (fixed): the task read the column types, then its COPY waited for the table
    lock of an ``ALTER ... TYPE`` that committed meanwhile; the binary encoding chosen for
    ``bigint`` was then read by ``double precision``'s receive function, and 1, 2, 3 were
    stored as the doubles with those bit patterns (5e-324, 1e-323, 1.5e-323) without any
    error. Now the types are read after the COPY's own table lock is held."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, v bigint)')
    write_file(
        tmp_path / "in",
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": pa.array([1, 2, 3], pa.int64())}),
    )
    alter = psycopg.connect(url)
    try:
        alter.execute(f'ALTER TABLE "{unique_name}" ALTER COLUMN v TYPE double precision')
        query = start_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            "id BIGINT, v BIGINT",
            pg_options(postgres.endpoint, unique_name, protocol="prepared", lockTimeout="60s"),
            files_per_trigger=1,
        )
        with psycopg.connect(url, autocommit=True) as watcher:
            wait_until(
                lambda: watcher.execute(
                    "SELECT count(*) FROM pg_locks WHERE relation = to_regclass(%s)"
                    " AND NOT granted",
                    (f'"{unique_name}"',),
                ).fetchone()[0],
                60.0,
                "the task waiting for the table lock held by ALTER",
            )
        alter.commit()
    finally:
        alter.close()
    await_query(query, QUERY_TIMEOUT)
    rows = pg_fetch(url, f'SELECT id, v FROM "{unique_name}" ORDER BY id')
    assert comparable(rows) == comparable([(1, 1.0), (2, 2.0), (3, 3.0)])
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(180)
def test_text_into_a_latin1_database_keeps_its_characters(spark, postgres, tmp_path, unique_name):
    database = f"latin1_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
        connection.execute(
            f"CREATE DATABASE {database} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'"
            " TEMPLATE template0"
        )
    endpoint = dataclasses.replace(postgres.endpoint, database=database)
    try:
        with psycopg.connect(endpoint.url, autocommit=True) as connection:
            connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, name text)')
        write_file(tmp_path / "in", pa.table({"id": [1, 2], "name": ["ü", "café"]}))
        run_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            "id BIGINT, name STRING",
            pg_options(endpoint, unique_name, deliveryGuarantee="at-least-once"),
            files_per_trigger=1,
        )
        with psycopg.connect(endpoint.url, client_encoding="UTF8") as connection:
            rows = connection.execute(
                f'SELECT id, name FROM "{unique_name}" ORDER BY id'
            ).fetchall()
        assert rows == [(1, "ü"), (2, "café")]
    finally:
        with psycopg.connect(postgres.endpoint.url, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({"protocol": "prepared"}, id="prepared-append"),
        pytest.param({"protocol": "staging"}, id="staging"),
        pytest.param(
            {"protocol": "prepared", "writeMode": "upsert", "upsertKeys": "id"},
            id="prepared-upsert",
        ),
    ],
)
@pytest.mark.timeout(180)
def test_a_widened_column_is_not_rounded_by_a_stale_staging_table(
    spark, postgres, tmp_path, unique_name, extra
):
    """The table is ALTERed between two micro-batches (two runs of one checkpoint): the
    second batch must be stored with the column's new type. Appends in prepared
    transactions read the types at every COPY and pass."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f'CREATE TABLE "{unique_name}" (id bigint PRIMARY KEY, amount numeric(6,2))'
        )
    kind = pa.decimal128(10, 4)
    options = pg_options(postgres.endpoint, unique_name, **extra)
    schema = "id BIGINT, amount DECIMAL(10,4)"
    write_file(
        tmp_path / "in", pa.table({"id": [1], "amount": pa.array([Decimal("1.2345")], kind)})
    )
    run_file_query(
        spark, tmp_path / "in", tmp_path / "checkpoint", schema, options, files_per_trigger=1
    )
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'ALTER TABLE "{unique_name}" ALTER COLUMN amount TYPE numeric(12,4)')
    write_file(
        tmp_path / "in", pa.table({"id": [2], "amount": pa.array([Decimal("1.2345")], kind)}), 1
    )
    run_file_query(
        spark, tmp_path / "in", tmp_path / "checkpoint", schema, options, files_per_trigger=1
    )
    rows = pg_fetch(url, f'SELECT id, amount::text FROM "{unique_name}" ORDER BY id')
    assert rows == [(1, "1.2300"), (2, "1.2345")]
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(180)
def test_sqlite_refuses_a_decimal_version_column_it_would_compare_as_text(
    spark, tmp_path, unique_name
):
    """SQLite stores decimals as text, so version 9.5 would win over 10.0 and the upsert
    would keep the older row: refused at query start, naming the option, nothing written
    (was: the older row kept)."""
    database = tmp_path / "sink.db"
    kind = pa.decimal128(10, 1)
    write_file(
        tmp_path / "in",
        pa.table(
            {
                "id": [1, 1],
                "name": ["newer", "older"],
                "version": pa.array([Decimal("10.0"), Decimal("9.5")], kind),
            }
        ),
    )
    options = {
        "url": f"jdbc:sqlite:{database}",
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
        "writeMode": "upsert",
        "upsertKeys": "id",
        "versionColumn": "version",
    }
    with pytest.raises(Exception, match="versionColumn 'version' is decimal") as caught:
        run_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            "id BIGINT, name STRING, version DECIMAL(10,1)",
            options,
            files_per_trigger=1,
        )
    assert "cast it to BIGINT or DOUBLE" in str(caught.value)
    assert not database.exists() or not _sqlite_tables(database)


@pytest.mark.timeout(180)
def test_sqlite_refuses_decimals_into_an_existing_column_that_would_lose_their_digits(
    spark, tmp_path, unique_name
):
    """A DECIMAL column of an existing SQLite table has NUMERIC affinity: the decimal's text
    would become a double (12345678901234567.89 stored as 12345678901234568) without an
    error. Refused at query start naming the column; a TEXT column keeps every digit."""
    database = tmp_path / "sink.db"
    with sqlite3.connect(database) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id INTEGER, amount DECIMAL(38,2))')
    amounts = [Decimal("12345678901234567.89"), Decimal("0.10")]
    write_file(
        tmp_path / "in",
        pa.table({"id": [1, 2], "amount": pa.array(amounts, pa.decimal128(38, 2))}),
    )
    options = {"url": f"jdbc:sqlite:{database}", "dbtable": unique_name}
    schema = "id BIGINT, amount DECIMAL(38,2)"
    with pytest.raises(Exception, match="column 'amount' is DECIMAL\\(38,2\\)") as caught:
        run_file_query(spark, tmp_path / "in", tmp_path / "checkpoint", schema, options)
    assert "declare it TEXT" in str(caught.value)
    with sqlite3.connect(database) as connection:
        assert connection.execute(f'SELECT count(*) FROM "{unique_name}"').fetchone() == (0,)
        connection.execute(f'DROP TABLE "{unique_name}"')
        connection.execute(f'CREATE TABLE "{unique_name}" (id INTEGER, amount TEXT)')
    run_file_query(spark, tmp_path / "in", tmp_path / "checkpoint2", schema, options)
    with sqlite3.connect(database) as connection:
        rows = connection.execute(
            f'SELECT id, CAST(amount AS TEXT) FROM "{unique_name}" ORDER BY id'
        ).fetchall()
    assert rows == [(1, "12345678901234567.89"), (2, "0.10")]


PG_TYPES = {
    "BIGINT": "bigint",
    "INT": "integer",
    "SMALLINT": "smallint",
    "TINYINT": "smallint",
    "FLOAT": "real",
    "DOUBLE": "double precision",
    "BOOLEAN": "boolean",
    "STRING": "text",
    "BINARY": "bytea",
    "DATE": "date",
    "TIMESTAMP": "timestamptz",
    "TIMESTAMP_NTZ": "timestamp",
}
INSTANTS = next(values for name, _, _, values in COLUMNS if name == "at")
DAYS = next(values for name, _, _, values in COLUMNS if name == "day")


@pytest.mark.parametrize("forced_csv", [False, True], ids=["binary", "csv-fallback"])
@pytest.mark.timeout(180)
def test_every_type_and_cross_zone_timestamps_are_stored_alike_by_binary_and_csv(
    spark, postgres, tmp_path, unique_name, forced_csv
):
    """Pins what ``test_jdbc_types`` leaves open: the CSV fallback (forced by a string into
    a ``uuid`` column) stores every supported type as binary COPY does, and under a session
    time zone that is not UTC (America/New_York) a Spark ``timestamp`` lands in a
    ``timestamp`` column as its UTC wall-clock time, a ``timestamp_ntz`` in a
    ``timestamptz`` column is read as UTC, and a date in a ``timestamp`` column is its
    midnight, in both formats."""
    url = postgres.endpoint.url
    ddl = ", ".join(
        f"{name} {PG_TYPES.get(kind) or 'numeric' + kind[len('DECIMAL') :]}"
        for name, kind, _, _ in COLUMNS
    )
    extra_ddl = ", at_wall timestamp, wall_zoned timestamptz, day_at timestamp" + (
        ", tag uuid" if forced_csv else ""
    )
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" ({ddl}{extra_ddl})')
    arrays = {name: pa.array(values, kind) for name, _, kind, values in COLUMNS}
    naive = [None if at is None else at.replace(tzinfo=None) for at in INSTANTS]
    arrays["at_wall"] = pa.array(INSTANTS, pa.timestamp("us", tz="UTC"))
    arrays["wall_zoned"] = pa.array(naive, pa.timestamp("us"))
    arrays["day_at"] = pa.array(DAYS, pa.date32())
    schema = ", ".join(f"{name} {kind}" for name, kind, _, _ in COLUMNS)
    schema += ", at_wall TIMESTAMP, wall_zoned TIMESTAMP_NTZ, day_at DATE"
    if forced_csv:
        arrays["tag"] = pa.array(["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"] * len(INSTANTS))
        schema += ", tag STRING"
    write_file(tmp_path / "in", pa.table(arrays))
    previous_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        run_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            schema,
            pg_options(postgres.endpoint, unique_name, protocol="prepared"),
            files_per_trigger=1,
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous_zone)
    selected = ", ".join(f"{name}::float8" if name == "single" else name for name in NAMES)
    rows = pg_fetch(
        url,
        f'SELECT {selected}, at_wall, wall_zoned, day_at FROM "{unique_name}" ORDER BY id',
    )
    midnights = [
        None if day is None else datetime.datetime.combine(day, datetime.time()) for day in DAYS
    ]
    expected = [
        (*row, wall, None if wall is None else wall.replace(tzinfo=UTC), midnight)
        for row, wall, midnight in zip(expected_rows(), naive, midnights, strict=True)
    ]
    assert comparable(rows) == comparable(expected)
    assert pg_leftovers(url, unique_name) == (0, 0)


OVERFLOWS = [
    pytest.param("integer", "BIGINT", pa.int64(), 2**31, id="bigint-into-integer"),
    pytest.param("smallint", "INT", pa.int32(), 32768, id="int-into-smallint"),
    pytest.param("domain", "INT", pa.int32(), -1, id="domain-check-binary"),
    pytest.param("json", "STRING", pa.string(), '{"a": ', id="invalid-json-binary"),
    pytest.param("uuid", "STRING", pa.string(), "not-a-uuid", id="invalid-uuid-csv"),
]
GOOD = {"json": "{}", "uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "boolean": False}
"""A boolean into an integer column is refused at query start since mergeSchema (a retyped
column: ``Dialect.accepts``, test_jdbc_merge_schema), before any value reaches the server."""


@pytest.mark.parametrize(("column_type", "spark_type", "kind", "bad"), OVERFLOWS)
@pytest.mark.timeout(180)
def test_a_value_a_narrower_column_cannot_hold_fails_naming_the_column_and_never_wraps(
    spark, postgres, tmp_path, unique_name, column_type, spark_type, kind, bad
):
    """The CSV fallback's range and syntax checks and the binary receive functions' own
    (a domain's CHECK, json's syntax): the value is refused by the server, the task fails
    with one line naming the column, nothing lands (not a wrapped integer, not invalid
    JSON; a boolean, which would turn into 1, is refused at query start: see ``GOOD``)."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        if column_type == "domain":
            column_type = f'"{unique_name}_positive"'
            connection.execute(f"CREATE DOMAIN {column_type} AS integer CHECK (VALUE > 0)")
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, "Narrow Col" {column_type})')
    good = GOOD.get(column_type, GOOD["boolean"] if kind == pa.bool_() else 1)
    write_file(
        tmp_path / "in",
        pa.table({"id": [1, 2], "Narrow Col": pa.array([good, bad], kind)}),
    )
    with pytest.raises(Exception) as caught:
        run_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            f"id BIGINT, `Narrow Col` {spark_type}",
            pg_options(postgres.endpoint, unique_name, protocol="prepared"),
            files_per_trigger=1,
        )
    lines = [
        line
        for line in str(caught.value).splitlines()
        if re.search(r"JdbcWriteError: .*column 'Narrow Col'", line)
    ]
    assert lines, str(caught.value)[-3000:]
    assert pg_fetch(url, f'SELECT count(*) FROM "{unique_name}"') == [(0,)]
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(180)
def test_an_upsert_into_a_schema_qualified_table_of_awkward_shape_reads_its_own_catalog(
    spark, postgres, tmp_path, unique_name
):
    """Pins the catalog lookup and the staging table's types on a table of awkward shape: a
    quoted schema-qualified name with upper case and a space, a decoy of the same name in
    ``public`` whose types would choose other (wrong) binary encodings, DataFrame columns
    in another order than the table's, a NOT NULL column with a default and a generated
    column the DataFrame lacks, a domain with a CHECK, ``varchar(5)`` and ``numeric(6,2)``
    (a decimal(10,4) is rounded as the server rounds text): the upsert goes through the
    staging table inside a prepared transaction."""
    url = postgres.endpoint.url
    schema_name = f"Other {unique_name[-8:]}"
    table = f'"{schema_name}"."Shape T"'
    domain = f'"{schema_name}"."positive"'
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema_name}"')
        connection.execute(f"CREATE DOMAIN {domain} AS integer CHECK (VALUE > 0)")
        connection.execute(
            'CREATE TABLE IF NOT EXISTS public."Shape T" ("Id" bigint PRIMARY KEY,'
            ' "the value" text, "Positive" bigint, note bytea)'
        )
        connection.execute(
            f'CREATE TABLE {table} ("Id" bigint PRIMARY KEY, "the value" numeric(6,2),'
            " created timestamptz NOT NULL DEFAULT now(),"
            ' doubled bigint GENERATED ALWAYS AS ("Id" * 2) STORED,'
            f' "Positive" {domain}, note varchar(5))'
        )
        connection.execute(
            f'INSERT INTO {table} ("Id", "the value", "Positive", note) VALUES (1, 9, 9, \'old\')'
        )
    write_file(
        tmp_path / "in",
        pa.table(
            {
                "note": ["ab", "five5"],
                "the value": pa.array(
                    [Decimal("1.2345"), Decimal("-1.2350")], pa.decimal128(10, 4)
                ),
                "Positive": pa.array([7, 2147483647], pa.int32()),
                "Id": [1, 2],
            }
        ),
    )
    try:
        run_file_query(
            spark,
            tmp_path / "in",
            tmp_path / "checkpoint",
            "note STRING, `the value` DECIMAL(10,4), Positive INT, Id BIGINT",
            pg_options(
                postgres.endpoint,
                f"{schema_name}.Shape T",
                protocol="prepared",
                writeMode="upsert",
                upsertKeys="Id",
            ),
            files_per_trigger=1,
        )
        rows = pg_fetch(
            url,
            f'SELECT "Id", "the value"::text, "Positive", note, doubled, created IS NOT NULL'
            f' FROM {table} ORDER BY "Id"',
        )
        assert rows == [(1, "1.23", 7, "ab", 2, True), (2, "-1.24", 2147483647, "five5", 4, True)]
        assert pg_fetch(url, 'SELECT count(*) FROM public."Shape T"') == [(0,)]
        assert pg_fetch(url, "SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema_name}" CASCADE')
            connection.execute('DROP TABLE IF EXISTS public."Shape T"')


@pytest.mark.timeout(180)
def test_a_timestamp_into_a_date_column_keeps_its_utc_day_as_documented(
    spark, postgres, tmp_path, unique_name
):
    """Values take the column's own rules, as in Spark's JDBC writer
    (docs/connectors/2pc-jdbc.md, Limits): a timestamp into a date column keeps the day of
    its UTC instant."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, "day" date)')
    at = datetime.datetime(2024, 1, 1, 23, 30, tzinfo=UTC)
    write_file(
        tmp_path / "in",
        pa.table({"id": [1], "day": pa.array([at], pa.timestamp("us", tz="UTC"))}),
    )
    run_file_query(
        spark,
        tmp_path / "in",
        tmp_path / "checkpoint",
        "id BIGINT, day TIMESTAMP",
        pg_options(postgres.endpoint, unique_name, protocol="prepared"),
        files_per_trigger=1,
    )
    assert pg_fetch(url, f'SELECT id, "day" FROM "{unique_name}"') == [
        (1, datetime.date(2024, 1, 1))
    ]
    assert pg_leftovers(url, unique_name) == (0, 0)


def _sqlite_tables(database: Path) -> list[str]:
    with sqlite3.connect(database) as connection:
        return [row[0] for row in connection.execute("SELECT name FROM sqlite_master")]
