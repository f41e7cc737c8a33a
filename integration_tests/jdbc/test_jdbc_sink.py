"""2pc-jdbc against real PostgreSQL 18 (embedded) and SQLite: every protocol and write
mode, upserts that never move backwards, fresh checkpoints, and every bad input failing
the query at start with one line that names the option and never the password."""

from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.lab.testing import await_query
from integration_tests.jdbc_fixtures import (
    pg_ledger,
    pg_leftovers,
    pg_rows,
    sqlite_rows,
    stream_input,
    write_input_files,
)

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 120.0
PASSWORD = "pw-9f3e-never-shown"

APPEND_BATCHES = [
    [(1, "a", 1), (2, "", 1), (3, None, 1)],
    [(4, 'd,"quoted"\nline', 1), (5, "e", 1)],
    [(6, "f", 1)],
]
UPSERT_BATCHES = [
    [(1, "one@1", 1), (2, "two@5", 5)],
    [(1, "one@3", 3), (2, "two@2", 2), (3, "three@1", 1)],
    [(1, "one@2", 2), (3, "three@4", 4), (3, "three@2", 2), (4, "four@1", 1)],
]
UPSERT_EXPECTED = [(1, "one@3", 3), (2, "two@5", 5), (3, "three@4", 4), (4, "four@1", 1)]


def sink_options(server: Any, table: str, **extra: str) -> dict[str, str]:
    return {
        "url": server.endpoint.jdbc_url,
        "user": server.endpoint.user,
        "dbtable": table,
        "createTableIfNotExists": "true",
        **extra,
    }


def run_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    options: dict[str, str],
    partitions: int | None = None,
) -> Any:
    query = (
        stream_input(spark, source, partitions)
        .writeStream.format("2pc-jdbc")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, QUERY_TIMEOUT)
    return query


@pytest.mark.parametrize("protocol", ["prepared", "staging"])
@pytest.mark.parametrize("write_mode", ["append", "upsert"])
def test_each_protocol_and_write_mode_applies_every_row_exactly_once(
    spark, postgres, tmp_path, unique_name, protocol, write_mode
):
    url = postgres.endpoint.url
    upsert = write_mode == "upsert"
    write_input_files(tmp_path / "in", UPSERT_BATCHES if upsert else APPEND_BATCHES)
    options = sink_options(postgres, unique_name, protocol=protocol, writeMode=write_mode)
    if upsert:
        options.update(upsertKeys="id", versionColumn="version")

    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    expected = UPSERT_EXPECTED if upsert else sorted(r for b in APPEND_BATCHES for r in b)
    assert pg_rows(url, unique_name) == expected
    ledger = pg_ledger(url, unique_name)
    assert [(batch, rows, proto, status) for _, batch, rows, proto, status in ledger] == [
        (0, 3 if not upsert else 2, protocol, "done"),
        (1, 2 if not upsert else 3, protocol, "done"),
        (2, 1 if not upsert else 4, protocol, "done"),
    ]
    assert pg_leftovers(url, unique_name) == (0, 0)

    # Restarting from the same checkpoint writes only what is new.
    more = [[(100, "late", 9)]]
    write_input_files(tmp_path / "in", more)
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    assert pg_rows(url, unique_name) == sorted([*expected, (100, "late", 9)])
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_batch_id_column_holds_each_rows_micro_batch(
    spark, postgres, tmp_path, unique_name, guarantee
):
    """The sink adds batchIdColumn; a restart continues with the next batch's id."""
    url = postgres.endpoint.url
    write_input_files(tmp_path / "in", APPEND_BATCHES)
    options = sink_options(
        postgres, unique_name, batchIdColumn="batch_id", deliveryGuarantee=guarantee
    )
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    write_input_files(tmp_path / "in", [[(100, "late", 9)]])
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    query = f'SELECT id, batch_id FROM "{unique_name}" ORDER BY id'
    with psycopg.connect(url) as connection:
        written = connection.execute(query).fetchall()
    expected = [(row[0], batch) for batch, rows in enumerate(APPEND_BATCHES) for row in rows]
    assert written == [*expected, (100, 3)]


def start_error(spark: Any, tmp_path: Path, options: dict[str, str]) -> str:
    """The text of the error that fails the query at start (no row may be written)."""
    write_input_files(tmp_path / "in", APPEND_BATCHES[:1])
    with pytest.raises(Exception) as caught:
        run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    return str(caught.value)


def test_auto_protocol_uses_staging_when_the_server_refuses_prepare(
    spark, postgres_without_prepared, tmp_path, unique_name
):
    server = postgres_without_prepared
    write_input_files(tmp_path / "in", APPEND_BATCHES)
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", sink_options(server, unique_name))
    assert pg_rows(server.endpoint.url, unique_name) == sorted(r for b in APPEND_BATCHES for r in b)
    assert {row[3] for row in pg_ledger(server.endpoint.url, unique_name)} == {"staging"}
    assert pg_leftovers(server.endpoint.url, unique_name) == (0, 0)


def test_a_fresh_checkpoint_on_the_same_table_is_a_new_sink_and_is_not_skipped(
    spark, postgres, tmp_path, unique_name
):
    url = postgres.endpoint.url
    write_input_files(tmp_path / "in", APPEND_BATCHES[:2])
    options = sink_options(postgres, unique_name)
    run_query(spark, tmp_path / "in", tmp_path / "first", options)
    run_query(spark, tmp_path / "in", tmp_path / "second", options)
    once = sorted(r for b in APPEND_BATCHES[:2] for r in b)
    assert pg_rows(url, unique_name) == sorted(once + once)
    ledger = pg_ledger(url, unique_name)
    assert len({row[0] for row in ledger}) == 2 and len(ledger) == 4


def test_at_least_once_writes_every_row_without_a_ledger(spark, postgres, tmp_path, unique_name):
    url = postgres.endpoint.url
    write_input_files(tmp_path / "in", UPSERT_BATCHES)
    options = sink_options(
        postgres,
        unique_name,
        deliveryGuarantee="at-least-once",
        writeMode="upsert",
        upsertKeys="id",
        versionColumn="version",
    )
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    assert pg_rows(url, unique_name) == UPSERT_EXPECTED
    assert pg_ledger(url, unique_name) == []
    assert pg_leftovers(url, unique_name) == (0, 0)


INSTANTS = [
    datetime.datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=datetime.UTC),
    datetime.datetime(2024, 3, 31, 0, 59, 59, 999999, tzinfo=datetime.UTC),
    datetime.datetime(2024, 10, 27, 1, 30, tzinfo=datetime.UTC),
    None,
]


@pytest.mark.parametrize(
    "extra",
    [{"protocol": "prepared"}, {"protocol": "staging"}, {"deliveryGuarantee": "at-least-once"}],
    ids=["prepared", "staging", "at-least-once"],
)
def test_timestamps_keep_their_instant_whatever_the_time_zones(
    spark, postgres, tmp_path, unique_name, extra
):
    """Spark's session zone and the server's zone differ from UTC; the instant survives."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(
            f'CREATE TABLE "{unique_name}" (id bigint, at timestamptz, at_utc timestamp)'
        )
        database = postgres.endpoint.database
        connection.execute(f"ALTER DATABASE {database} SET TimeZone = 'Asia/Kolkata'")
    directory = tmp_path / "in"
    directory.mkdir()
    table = pa.table(
        {"id": list(range(len(INSTANTS))), "at": INSTANTS, "at_utc": INSTANTS},
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("at", pa.timestamp("us", tz="UTC")),
                ("at_utc", pa.timestamp("us", tz="UTC")),
            ]
        ),
    )
    pq.write_table(table, directory / "part-0000.parquet")
    previous_zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        query = (
            spark.readStream.schema("id BIGINT, at TIMESTAMP, at_utc TIMESTAMP")
            .parquet(str(directory))
            .writeStream.format("2pc-jdbc")
            .options(**sink_options(postgres, unique_name, **extra))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        await_query(query, QUERY_TIMEOUT)
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous_zone)
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"ALTER DATABASE {database} RESET TimeZone")
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            f'SELECT id, at, at_utc FROM "{unique_name}" ORDER BY id'
        ).fetchall()
    naive_utc = [None if at is None else at.replace(tzinfo=None) for at in INSTANTS]
    assert [row[0] for row in rows] == list(range(len(INSTANTS)))
    assert [row[1] for row in rows] == INSTANTS
    assert [row[2] for row in rows] == naive_utc
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.parametrize("write_mode", ["append", "upsert"])
def test_sqlite_staging_applies_every_row_exactly_once(spark, tmp_path, unique_name, write_mode):
    database = tmp_path / "sink.db"
    upsert = write_mode == "upsert"
    write_input_files(tmp_path / "in", UPSERT_BATCHES if upsert else APPEND_BATCHES)
    options = {
        "url": f"jdbc:sqlite:{database}",
        "dbtable": unique_name,
        "createTableIfNotExists": "true",
        "writeMode": write_mode,
    }
    if upsert:
        options.update(upsertKeys="id", versionColumn="version")
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    expected = UPSERT_EXPECTED if upsert else sorted(r for b in APPEND_BATCHES for r in b)
    assert sqlite_rows(database, unique_name) == expected
    with sqlite3.connect(database) as connection:
        ledger = connection.execute(
            "SELECT batch_id, protocol, status FROM eospack_commits ORDER BY batch_id"
        ).fetchall()
        stage = connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%eospack_stage%'"
        ).fetchone()
        staged = connection.execute(f'SELECT count(*) FROM "{stage[0]}"').fetchone()
    assert ledger == [(0, "staging", "done"), (1, "staging", "done"), (2, "staging", "done")]
    assert staged == (0,)


def test_password_never_shows_in_plans_progress_or_logs(
    spark, postgres, tmp_path, unique_name, capsys
):
    write_input_files(tmp_path / "in", APPEND_BATCHES[:1])
    options = sink_options(postgres, unique_name, password=PASSWORD)  # trust auth ignores it
    query = run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    query.explain(extended=True)
    shown = capsys.readouterr()
    assert "2pc-jdbc" in shown.out or "WriteToMicroBatchDataSource" in shown.out
    assert PASSWORD not in shown.out + shown.err
    assert PASSWORD not in str(query.lastProgress) + str(query.recentProgress)
    with psycopg.connect(postgres.endpoint.url) as connection:
        ledger = connection.execute("SELECT string_agg(pieces, '') FROM eospack_commits").fetchone()
    assert PASSWORD not in str(ledger)


BAD_INPUTS = {
    "unknown url scheme": (
        {"url": "mysql://db.example:3306/shop"},
        "url scheme 'mysql' is not supported: use jdbc:postgresql://host:port/database,"
        " postgresql://host:port/database, jdbc:mariadb://host:port/database,"
        " jdbc:mysql://host:port/database or jdbc:sqlite:PATH",
    ),
    "missing dbtable": (
        {"dbtable": None},
        "Option dbtable is required: set dbtable to <table> or <schema>.<table>",
    ),
    "unsafe table name": (
        {"dbtable": 'x"; DROP TABLE y; --'},
        "dbtable part 'x\"; DROP TABLE y; --' contains a double quote or a control character,"
        " so it cannot be quoted safely as an SQL identifier: rename it (letters, digits,"
        " underscores)",
    ),
    "upsertKeys naming an absent column": (
        {"writeMode": "upsert", "upsertKeys": "order_id"},
        "upsertKeys names 'order_id', which is not a column of the DataFrame:"
        " use one of id, name, version",
    ),
    "batch id column clash": (
        {"batchIdColumn": "name"},
        "batchIdColumn 'name' is already a column of the DataFrame: name a new column",
    ),
    "missing table": (
        {"createTableIfNotExists": "false"},
        "dbtable '{table}' does not exist in postgresql://127.0.0.1:{port}/postgres: create it"
        " or set createTableIfNotExists=true",
    ),
    "wrong credentials": (
        {"user": "nobody", "password": PASSWORD},
        "could not log in to postgresql://127.0.0.1:{port}/postgres as user 'nobody':"
        " check the user and password options",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_at_start_naming_the_option(spark, postgres, tmp_path, unique_name, case):
    changes, expected = BAD_INPUTS[case]
    options = sink_options(postgres, unique_name, password=PASSWORD)
    for key, value in changes.items():
        if value is None:
            options.pop(key)
        else:
            options[key] = value
    error = start_error(spark, tmp_path, options)
    assert expected.format(table=unique_name, port=postgres.port) in error
    assert PASSWORD not in error


def test_existing_table_with_other_columns_is_refused(spark, postgres, tmp_path, unique_name):
    with psycopg.connect(postgres.endpoint.url) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, title text, version bigint)')
    error = start_error(spark, tmp_path, sink_options(postgres, unique_name))
    assert (
        f"dbtable '{unique_name}' has no column 'name' that the DataFrame writes (table columns:"
        " id, title, version): add it to the table or select only the table's columns"
    ) in error
    assert pg_rows_count(postgres.endpoint.url, unique_name) == 0


def test_upsert_keys_without_unique_index_are_refused(spark, postgres, tmp_path, unique_name):
    with psycopg.connect(postgres.endpoint.url) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, name text, version bigint)')
    options = sink_options(postgres, unique_name, writeMode="upsert", upsertKeys="id")
    error = start_error(spark, tmp_path, options)
    assert (
        f"upsertKeys (id) match no primary key or unique index of dbtable '{unique_name}':"
        f' create one (CREATE UNIQUE INDEX ON "{unique_name}" ("id")) or fix upsertKeys'
    ) in error


def test_prepared_protocol_is_refused_without_prepared_transactions(
    spark, postgres_without_prepared, tmp_path, unique_name
):
    server = postgres_without_prepared
    error = start_error(spark, tmp_path, sink_options(server, unique_name, protocol="prepared"))
    assert (
        f"protocol=prepared needs max_prepared_transactions > 0 on"
        f" postgresql://127.0.0.1:{server.port}/postgres (it is 0): set it in postgresql.conf"
        " and restart the server, or use protocol=staging"
    ) in error


def pg_rows_count(url: str, table: str) -> int:
    with psycopg.connect(url) as connection:
        row = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    return int(row[0]) if row else 0
