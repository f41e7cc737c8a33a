"""2pc-jdbc stores every value of every type it supports exactly, by every path: PostgreSQL
with protocol prepared, staging and at-least-once (binary COPY, CSV COPY where a column
needs it), and SQLite (``executemany``). Values are read back with the database's own
driver and compared as Python values. A value a column refuses fails the task with one
line naming the column and leaves no prepared transaction and no staged row."""

from __future__ import annotations

import datetime
import math
import re
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from integration_tests.jdbc.jdbc_type_columns_parts import (
    COLUMNS,
    NAMES,
    comparable,
    expected_rows,
)
from integration_tests.jdbc_fixtures import pg_leftovers, run_file_query

pytestmark = pytest.mark.integration


SCHEMA_DDL = ", ".join(f"{name} {ddl}" for name, ddl, _, _ in COLUMNS)


def write_input(directory: Path, rows: int = 8) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    arrays = [pa.array(values[:rows], kind) for _, _, kind, values in COLUMNS]
    pq.write_table(pa.table(arrays, names=NAMES), directory / "part-0000.parquet")


def pg_read(url: str, table: str, names: list[str]) -> list[tuple[Any, ...]]:
    selected = ", ".join(f'"{name}"::float8' if name == "single" else f'"{name}"' for name in names)
    with psycopg.connect(url, options="-c TimeZone=UTC") as connection:
        return connection.execute(f'SELECT {selected} FROM "{table}" ORDER BY id').fetchall()


PROTOCOLS = pytest.mark.parametrize(
    "extra",
    [{"protocol": "prepared"}, {"protocol": "staging"}, {"deliveryGuarantee": "at-least-once"}],
    ids=["prepared", "staging", "at-least-once"],
)


@PROTOCOLS
@pytest.mark.timeout(180)
def test_every_supported_type_round_trips_exactly_into_postgresql(
    spark, postgres, tmp_path, unique_name, extra
):
    """Tables created by the sink (its own column types); NULL in every column."""
    url = postgres.endpoint.url
    write_input(tmp_path / "in")
    options = {
        "url": postgres.endpoint.jdbc_url,
        "user": postgres.endpoint.user,
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
        **extra,
    }
    run_file_query(spark, tmp_path / "in", tmp_path / "checkpoint", SCHEMA_DDL, options)
    assert comparable(pg_read(url, unique_name, NAMES)) == comparable(expected_rows())
    assert pg_leftovers(url, unique_name) == (0, 0)


def sqlite_value(name: str, value: Any) -> Any:
    """SQLite keeps dates, timestamps and decimals as text (``sqlite.py``), booleans as 0/1,
    and stores a float -0.0 as the integer 0 (the one value its REAL cannot carry)."""
    if value is None:
        return None
    if name in ("single", "double") and value == 0:
        return -0.0
    if name == "flag":
        return bool(value)
    if name in ("wide", "whole_decimal", "money"):
        return Decimal(str(value))
    if name == "day":
        return datetime.date.fromisoformat(value)
    if name in ("at", "local"):
        return datetime.datetime.fromisoformat(value)
    return value


@pytest.mark.timeout(180)
def test_every_supported_type_round_trips_exactly_into_sqlite(spark, tmp_path, unique_name):
    database = tmp_path / "sink.db"
    write_input(tmp_path / "in")
    options = {
        "url": f"jdbc:sqlite:{database}",
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
    }
    run_file_query(spark, tmp_path / "in", tmp_path / "checkpoint", SCHEMA_DDL, options)
    with sqlite3.connect(database) as connection:
        stored = connection.execute(
            f'SELECT {", ".join(NAMES)} FROM "{unique_name}" ORDER BY id'
        ).fetchall()
    read = [
        tuple(sqlite_value(name, value) for name, value in zip(NAMES, row, strict=True))
        for row in stored
    ]
    assert comparable(read) == comparable(expected_rows())


@pytest.mark.parametrize(
    "amount_type", ["text", "numeric"], ids=["binary", "csv-for-a-string-into-numeric"]
)
@pytest.mark.timeout(180)
def test_columns_of_other_types_take_the_values_for_their_own_type(
    spark, postgres, tmp_path, unique_name, amount_type
):
    """An existing table whose column types differ from the DataFrame's: an int into a
    bigint, a smallint into an integer, a float into a double, strings into jsonb, json
    and varchar, a decimal into a numeric of another scale, NaN into a double; and a
    string into text (the COPY is binary) or into numeric (no binary encoding: the COPY
    is CSV, and every value must be stored as the binary COPY stores it)."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f'CREATE TABLE "{unique_name}" (id bigint, widened bigint, small_int integer,'
            " single_double double precision, document jsonb, plain_json json,"
            f" amount {amount_type}, short varchar(40), scaled numeric(12,4), nan double precision)"
        )
    source = tmp_path / "in"
    source.mkdir()
    table = pa.table(
        {
            "id": pa.array([0, 1, 2], pa.int64()),
            "widened": pa.array([-(2**31), 2**31 - 1, None], pa.int32()),
            "small_int": pa.array([-32768, 32767, None], pa.int16()),
            "single_double": pa.array([0.1, -2.5, None], pa.float32()),
            "document": pa.array(['{"a": [1, 2], "b": "x\\ny"}', "[]", None]),
            "plain_json": pa.array(['{"kept":  "as typed"}', "null", None]),
            "amount": pa.array(["12.5000", "-0.000001", None]),
            "short": pa.array(['quote "x", comma', "ünï\tcode", None]),
            "scaled": pa.array(
                [Decimal("-1.50"), Decimal("12345678.99"), None], pa.decimal128(10, 2)
            ),
            "nan": pa.array([math.nan, 1.0, None], pa.float64()),
        }
    )
    pq.write_table(table, source / "part-0000.parquet")
    schema = (
        "id BIGINT, widened INT, small_int SMALLINT, single_double FLOAT, document STRING,"
        " plain_json STRING, amount STRING, short STRING, scaled DECIMAL(10,2), nan DOUBLE"
    )
    options = {
        "url": postgres.endpoint.jdbc_url,
        "user": postgres.endpoint.user,
        "dbtable": unique_name,
        "protocol": "prepared",
    }
    run_file_query(spark, source, tmp_path / "checkpoint", schema, options)
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT id, widened, small_int, single_double, document::text, plain_json::text,"
            f' amount::text, short, scaled::text, nan FROM "{unique_name}" ORDER BY id'
        ).fetchall()
    assert comparable(rows) == comparable(
        [
            (
                0,
                -(2**31),
                -32768,
                float(np.float32(0.1)),
                '{"a": [1, 2], "b": "x\\ny"}',
                '{"kept":  "as typed"}',
                "12.5000",
                'quote "x", comma',
                "-1.5000",
                math.nan,
            ),
            (
                1,
                2**31 - 1,
                32767,
                -2.5,
                "[]",
                "null",
                "-0.000001",
                "ünï\tcode",
                "12345678.9900",
                1.0,
            ),
            (2, None, None, None, None, None, None, None, None, None),
        ]
    )
    assert pg_leftovers(url, unique_name) == (0, 0)


REFUSED = [
    pytest.param("varchar(5)", "fits", "too long!", "prepared", id="too-long-varchar-prepared"),
    pytest.param("varchar(5)", "fits", "too long!", "staging", id="too-long-varchar-staging"),
    pytest.param("text", "fine", "nul \x00 byte", "prepared", id="nul-in-text-prepared"),
]


@pytest.mark.parametrize(("column_type", "good", "bad", "protocol"), REFUSED)
@pytest.mark.timeout(180)
def test_a_value_the_column_refuses_fails_the_task_naming_the_column_and_leaves_nothing(
    spark, postgres, tmp_path, unique_name, column_type, good, bad, protocol
):
    """The refused value sits in the middle of a 20,000-row task, after rows already sent
    to COPY: the transaction is rolled back (nothing prepared, nothing staged, nothing in
    the target) and the error is one line naming the column, without the value."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, "the name" {column_type})')
    source = tmp_path / "in"
    source.mkdir()
    names = [good] * 20_000
    names[12_345] = bad
    table = pa.table({"id": pa.array(range(20_000), pa.int64()), "the name": names})
    pq.write_table(table, source / "part-0000.parquet")
    options = {
        "url": postgres.endpoint.jdbc_url,
        "user": postgres.endpoint.user,
        "dbtable": unique_name,
        "protocol": protocol,
    }
    with pytest.raises(Exception) as caught:
        run_file_query(
            spark, source, tmp_path / "checkpoint", "id BIGINT, `the name` STRING", options
        )
    lines = [
        line
        for line in str(caught.value).splitlines()
        if re.search(r"JdbcWriteError: .*column 'the name'", line)
    ]
    assert lines, str(caught.value)[-3000:]
    assert "too long!" not in lines[0] and "nul" not in lines[0].split("column")[1]
    if "\x00" in bad:
        assert "PostgreSQL text cannot hold a NUL character" in lines[0]
    assert pg_leftovers(url, unique_name) == (0, 0)
    with psycopg.connect(url) as connection:
        assert connection.execute(f'SELECT count(*) FROM "{unique_name}"').fetchone() == (0,)
