"""SQLite for 2pc-jdbc (``SqliteDialect``; embedded default; staging protocol only).

SQLite has no prepared transactions, so pieces go to a staging table and the driver
moves a batch in one transaction. Writers wait up to ``BUSY_TIMEOUT_SECONDS`` for the
database lock (WAL mode lets readers go on meanwhile).
"""

from __future__ import annotations

import datetime
import decimal
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import types as T

from .dialect import PIECE_COLUMN, Dialect, TableName, column_list, quote
from .errors import JdbcConnectionError, JdbcSchemaError, JdbcSinkOptionError

if TYPE_CHECKING:
    from .options import DatabaseUrl, JdbcSinkOptions

BUSY_TIMEOUT_SECONDS = 60.0


class SqliteDialect(Dialect):
    """A SQLite database file shared by the driver and every task.

    Why its own class: SQLite locks the whole database for a write transaction (no row
    locks, so no ``FOR UPDATE`` and no orphan can block a commit), has no prepared
    transactions and no schemas, and takes rows by ``executemany``. Guarantees: every
    transaction is begun explicitly with ``BEGIN IMMEDIATE`` (the write lock is taken at
    once, waiting up to ``BUSY_TIMEOUT_SECONDS``) and rolled back if its block raises;
    schema-qualified tables are refused when connecting.
    """

    name = "sqlite"
    supports_changes = True
    placeholder = "?"
    operational_error = sqlite3.OperationalError
    refuses_columns_by_type = True
    column_types = {
        T.LongType: "INTEGER",
        T.IntegerType: "INTEGER",
        T.ShortType: "INTEGER",
        T.ByteType: "INTEGER",
        T.BooleanType: "BOOLEAN",
        T.FloatType: "REAL",
        T.DoubleType: "REAL",
        T.StringType: "TEXT",
        T.BinaryType: "BLOB",
        T.DateType: "TEXT",
        T.TimestampType: "TEXT",
        T.TimestampNTZType: "TEXT",
    }

    # Connections and transactions ------------------------------------------------------

    def display_url(self, url: DatabaseUrl) -> str:
        return f"jdbc:sqlite:{url.path}"

    def default_schema(self, url: DatabaseUrl) -> str:
        return "main"

    def connect(self, options: JdbcSinkOptions, *, autocommit: bool) -> sqlite3.Connection:
        """Always in autocommit mode, whatever ``autocommit`` says: transactions are begun
        explicitly by ``transaction``."""
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

    @contextmanager
    def transaction(self, connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def limit_lock_wait(self, connection: sqlite3.Connection, lock_timeout_ms: int) -> None:
        """Nothing to set: SQLite has no row locks, and the database lock is waited for up
        to ``BUSY_TIMEOUT_SECONDS`` (set when connecting)."""

    # Catalog -----------------------------------------------------------------------------

    def table_columns(
        self, connection: sqlite3.Connection, table: TableName
    ) -> dict[str, tuple[str, bool]] | None:
        rows = connection.execute(f"PRAGMA table_info({quote(table.name)})").fetchall()
        if not rows:
            return None
        return {
            name: (kind, bool(notnull) and default is None)
            for _, name, kind, notnull, default, _ in rows
        }

    def unique_key_sets(
        self, connection: sqlite3.Connection, table: TableName
    ) -> list[frozenset[str]]:
        primary = frozenset(
            row[1]
            for row in connection.execute(f"PRAGMA table_info({quote(table.name)})")
            if row[5]
        )
        keys = [primary] if primary else []
        for _, index_name, unique, _, partial in connection.execute(
            f"PRAGMA index_list({quote(table.name)})"
        ).fetchall():
            if unique and not partial:
                columns = connection.execute(f"PRAGMA index_info({quote(index_name)})").fetchall()
                keys.append(frozenset(name for _, _, name in columns))
        return keys

    # DDL ---------------------------------------------------------------------------------

    def decimal_type(self, data_type: T.DecimalType) -> str:
        """TEXT: a NUMERIC column would turn decimals into 15-digit doubles."""
        return "TEXT"

    def refuse_lossy_columns(
        self,
        options: JdbcSinkOptions,
        schema: T.StructType,
        existing: Mapping[str, tuple[str, bool]],
    ) -> None:
        """Decimals are written as text. A decimal ``versionColumn`` would be compared as
        text (9.5 above 10.0), and a column of an existing table with SQLite's NUMERIC
        affinity other than TEXT or BLOB (DECIMAL, NUMERIC, REAL; INTEGER for fractions or over
        18 digits) would turn the text into a number that loses digits, both
        without an error: refused, naming the column and the fix."""
        decimals = {
            f.name: f.dataType for f in schema.fields if isinstance(f.dataType, T.DecimalType)
        }
        version = options.version_column
        if version in decimals:
            raise JdbcSinkOptionError(
                f"versionColumn {version!r} is {decimals[version].simpleString()}, which SQLite"
                " would compare as text (9.5 above 10.0): cast it to BIGINT or DOUBLE in the"
                " query, or use PostgreSQL"
            )
        if version is not None and version not in decimals:
            declared = existing.get(version, ("", False))[0]
            version_type = schema[version].dataType
            if isinstance(version_type, T.NumericType) and _text_affinity(declared):
                raise JdbcSchemaError(
                    f"versionColumn {version!r} of dbtable {str(options.table)!r} is {declared},"
                    f" which SQLite would compare as text ('10' below '9') though the DataFrame's"
                    f" is {version_type.simpleString()}: declare the column INTEGER or REAL"
                )
        for name, decimal_type in decimals.items():
            declared = existing.get(name, ("TEXT", False))[0]
            if not _keeps_decimal_text(declared, decimal_type):
                raise JdbcSchemaError(
                    f"dbtable {str(options.table)!r} column {name!r} is {declared}, which SQLite"
                    " turns into a number, losing digits: declare it TEXT (2pc-jdbc writes decimals"
                    " as text) or cast the DataFrame column to DOUBLE"
                )

    def accepts(self, declared: str, data_type: T.DataType) -> bool:
        """By SQLite's type affinity (datatype3.html, 3.1), since SQLite stores any value in
        any column: INTEGER and REAL affinity take numbers and booleans (a string there
        stays text that no longer compares as a number: a retyped column); TEXT affinity
        takes everything but binary; BLOB and NUMERIC affinity (BOOLEAN, DATE, DECIMAL...)
        take anything. Decimals are further checked by ``refuse_lossy_columns``."""
        kind = declared.upper()
        number = "INT" in kind or (
            not _text_affinity(kind)
            and "BLOB" not in kind
            and any(real in kind for real in ("REAL", "FLOA", "DOUB"))
        )
        if number:
            return isinstance(data_type, (T.NumericType, T.BooleanType))
        if _text_affinity(kind):
            return not isinstance(data_type, T.BinaryType)
        return True

    def add_column_sql(self, table: TableName, name: str, sql_type: str) -> str:
        """Plain ``ADD COLUMN`` (SQLite has no ``IF NOT EXISTS`` there): ``planning`` reads
        the catalog first inside the same ``BEGIN IMMEDIATE`` transaction, which holds the
        database's write lock, so two queries cannot both add the column."""
        return f"ALTER TABLE {table.sql()} ADD COLUMN {quote(name)} {sql_type}"

    def create_stage_sql(
        self, stage: TableName, target: TableName, columns: list[str]
    ) -> list[str]:
        """Indexed on the piece column: moves and deletes select a batch's pieces."""
        index = quote(f"{stage.name[:50]}_piece")
        return [
            f"CREATE TABLE IF NOT EXISTS {stage.sql()} AS SELECT CAST(NULL AS TEXT)"
            f" AS {quote(PIECE_COLUMN)}, {column_list(columns)} FROM {target.sql()} WHERE 0",
            f"CREATE INDEX IF NOT EXISTS {index} ON {stage.sql()} ({quote(PIECE_COLUMN)})",
        ]

    def ledger_ddl(self, ledger: TableName) -> list[str]:
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

    # Rows --------------------------------------------------------------------------------

    def write_rows(
        self,
        connection: sqlite3.Connection,
        table: TableName,
        columns: list[str],
        batches: Iterable[pa.RecordBatch],
        batchsize: int,
        piece: str | None = None,
    ) -> int:
        """``executemany`` of at most ``batchsize`` rows each; a piece is one more column."""
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

    def upsert_source(
        self,
        stage: TableName,
        columns: list[str],
        upsert_keys: tuple[str, ...],
        version_column: str | None,
        where: str,
    ) -> str:
        """Every staged row, in version (else staging) order: SQLite applies them one by
        one, so the last one of a key wins unless its version is lower."""
        order = quote(version_column) if version_column else "rowid"
        return f"SELECT {column_list(columns)} FROM {stage.sql()} WHERE {where} ORDER BY {order}"

    def vacuum_stage(self, connection: sqlite3.Connection, stage: TableName) -> None:
        """Nothing to do: deleted rows' pages are reused by the next staged rows."""


def _keeps_decimal_text(declared: str, decimal_type: T.DecimalType) -> bool:
    """Whether a column of this declared type stores a decimal's text without loss, by
    SQLite's affinity rules (datatype3.html, 3.1): TEXT and BLOB affinity keep the text;
    INTEGER keeps whole numbers of up to 18 digits; REAL and NUMERIC make doubles."""
    kind = declared.upper()
    if "INT" in kind:
        return decimal_type.scale == 0 and decimal_type.precision <= 18
    if _text_affinity(kind):
        return True
    return not kind or "BLOB" in kind


def _text_affinity(declared: str) -> bool:
    """SQLite's TEXT affinity (datatype3.html, 3.1): numbers written into it become text."""
    kind = declared.upper()
    return "INT" not in kind and any(text in kind for text in ("CHAR", "CLOB", "TEXT"))


def _sqlite_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")  # str() would write 0E-10 and 1.000E-7
    return value
