"""SQLite access for 2pc-jdbc (embedded default; staging protocol only).

SQLite has no prepared transactions, so pieces go to a staging table and the driver
moves a batch in one transaction. Writers wait up to ``BUSY_TIMEOUT_SECONDS`` for the
database lock (WAL mode lets readers go on meanwhile).
"""

from __future__ import annotations

import datetime
import decimal
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from connectors.jdbc.dialect import PIECE_COLUMN, TableName, column_list, quote
from connectors.jdbc.errors import JdbcConnectionError, JdbcSinkOptionError
from connectors.jdbc.options import JdbcSinkOptions

PLACEHOLDER = "?"
BUSY_TIMEOUT_SECONDS = 60.0


def connect(options: JdbcSinkOptions, *, autocommit: bool = True) -> sqlite3.Connection:
    """A connection in autocommit mode: transactions are begun explicitly with ``begin``."""
    if options.table.schema is not None or options.ledger_table.schema is not None:
        raise JdbcSinkOptionError(
            "dbtable and ledgerTable cannot be schema-qualified with SQLite: use plain names"
        )
    try:
        connection = sqlite3.connect(
            options.url.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None
        )
        connection.execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as error:
        raise JdbcConnectionError(
            f"could not open {options.url.display()}: {error} (fix the url option)"
        ) from error
    return connection


def begin(connection: sqlite3.Connection) -> None:
    connection.execute("BEGIN IMMEDIATE")


@contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    begin(connection)
    try:
        yield connection
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def table_columns(
    connection: sqlite3.Connection, table: TableName
) -> dict[str, tuple[str, bool]] | None:
    rows = connection.execute(f"PRAGMA table_info({quote(table.name)})").fetchall()
    if not rows:
        return None
    return {
        name: (kind, bool(notnull) and default is None)
        for _, name, kind, notnull, default, _ in rows
    }


def unique_key_sets(connection: sqlite3.Connection, table: TableName) -> list[frozenset[str]]:
    primary = frozenset(
        row[1] for row in connection.execute(f"PRAGMA table_info({quote(table.name)})") if row[5]
    )
    keys = [primary] if primary else []
    for _, index_name, unique, _, partial in connection.execute(
        f"PRAGMA index_list({quote(table.name)})"
    ).fetchall():
        if unique and not partial:
            columns = connection.execute(f"PRAGMA index_info({quote(index_name)})").fetchall()
            keys.append(frozenset(name for _, _, name in columns))
    return keys


def create_stage_sql(stage: TableName, target: TableName, columns: list[str]) -> list[str]:
    index = quote(f"{stage.name[:50]}_piece")
    return [
        f"CREATE TABLE IF NOT EXISTS {stage.sql()} AS SELECT CAST(NULL AS TEXT)"
        f" AS {quote(PIECE_COLUMN)}, {column_list(columns)} FROM {target.sql()} WHERE 0",
        f"CREATE INDEX IF NOT EXISTS {index} ON {stage.sql()} ({quote(PIECE_COLUMN)})",
    ]


def ledger_ddl(ledger: TableName) -> list[str]:
    index = quote(f"{ledger.name[:48]}_unfinished")
    return [
        f"CREATE TABLE IF NOT EXISTS {ledger.sql()} ("
        " sink_id TEXT NOT NULL, batch_id INTEGER NOT NULL, target TEXT NOT NULL,"
        " protocol TEXT NOT NULL, rows INTEGER NOT NULL, status TEXT NOT NULL,"
        " committed_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,"
        " pieces TEXT NOT NULL, PRIMARY KEY (sink_id, batch_id))",
        f"CREATE INDEX IF NOT EXISTS {index} ON {ledger.sql()} (sink_id, batch_id)"
        " WHERE status = 'decided'",
    ]


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def insert_batches(
    connection: sqlite3.Connection,
    table: TableName,
    columns: list[str],
    batches: Iterable[pa.RecordBatch],
    batchsize: int,
    piece: str | None = None,
) -> int:
    """Insert the rows (tagged with ``piece`` when given) in the open transaction."""
    names = ([PIECE_COLUMN] if piece is not None else []) + columns
    marks = ", ".join("?" for _ in names)
    statement = f"INSERT INTO {table.sql()} ({column_list(names)}) VALUES ({marks})"
    rows = 0
    for batch in batches:
        values = [
            [_sqlite_value(value) for value in column.to_pylist()] for column in batch.columns
        ]
        prefix = [[piece] * batch.num_rows] if piece is not None else []
        records = list(zip(*prefix, *values, strict=True))
        for start in range(0, len(records), batchsize):
            connection.executemany(statement, records[start : start + batchsize])
        rows += batch.num_rows
    return rows
