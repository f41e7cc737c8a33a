"""PostgreSQL access for 2pc-jdbc: connections, catalog checks, COPY of Arrow batches.

Rows travel as CSV written by Arrow (``pyarrow.csv.write_csv``) into ``COPY ... FROM
STDIN (FORMAT csv)``: about 6x faster than feeding COPY row by row from Python.
Timestamps go as UTC wall-clock text read in a ``TimeZone = 'UTC'`` transaction: Arrow
formats zoned timestamps about 15x slower than naive ones, and they were 90% of the
CSV time of a typical fact row (same values stored either way). Errors
are classified by SQLSTATE, never by message text; connection errors name the server
(host, port, database) and the fix, never the password.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from connectors.jdbc.dialect import PIECE_COLUMN, TableName, column_list, quote
from connectors.jdbc.errors import JdbcConnectionError
from connectors.jdbc.options import JdbcSinkOptions

PLACEHOLDER = "%s"
PIECE_SETTING = "eospack.piece"
"""Session setting that fills the staging table's piece column during a COPY."""
DDL_LOCK_KEY = 0x6E05_2BC0
"""Advisory lock serialising the sink's DDL, so queries starting together do not race."""

_AUTHENTICATION_SQLSTATES = frozenset({"28000", "28P01"})
_LOGIN_REFUSED_MARKERS = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "FATAL:  role ",
    "authentication failed",
)
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, batch_size=8192)


def connect(options: JdbcSinkOptions, *, autocommit: bool = False) -> psycopg.Connection:
    """Open a connection or raise ``JdbcConnectionError`` with the server and the fix."""
    try:
        return psycopg.connect(autocommit=autocommit, **options.psycopg_kwargs())
    except psycopg.OperationalError as error:
        raise connection_error(options, error) from error


def connection_error(options: JdbcSinkOptions, error: psycopg.Error) -> JdbcConnectionError:
    where = options.url.display()
    user = options.user or "(default user)"
    # libpq reports no SQLSTATE for a refused login (the server's FATAL message is all
    # there is), so these two cases fall back to the server's standard wording.
    sqlstate = getattr(error, "sqlstate", None)
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    refused_login = any(marker in text for marker in _LOGIN_REFUSED_MARKERS)
    if sqlstate in _AUTHENTICATION_SQLSTATES or refused_login:
        return JdbcConnectionError(
            f"could not log in to {where} as user {user!r}: check the user and password options"
        )
    if sqlstate == "3D000" or (
        "FATAL:" in text and "database" in text and "does not exist" in text
    ):
        return JdbcConnectionError(
            f"database {options.url.database!r} does not exist on {where}: fix the url option"
        )
    return JdbcConnectionError(
        f"could not connect to {where}: {text} (check the url option and that the server runs)"
    )


def max_prepared_transactions(connection: psycopg.Connection) -> int:
    row = connection.execute("SELECT current_setting('max_prepared_transactions')").fetchone()
    return int(row[0]) if row else 0


def table_columns(
    connection: psycopg.Connection, table: TableName
) -> dict[str, tuple[str, bool]] | None:
    """Column name -> (type, required: NOT NULL without default); None if no such table."""
    row = connection.execute("SELECT to_regclass(%s)::oid", (table.sql(),)).fetchone()
    if row is None or row[0] is None:
        return None
    rows = connection.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull AND NOT atthasdef"
        " FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
        " ORDER BY attnum",
        (row[0],),
    ).fetchall()
    return {name: (type_name, bool(required)) for name, type_name, required in rows}


def unique_key_sets(connection: psycopg.Connection, table: TableName) -> list[frozenset[str]]:
    """The column sets of the table's unique indexes (what ON CONFLICT can target)."""
    rows = connection.execute(
        "SELECT array_agg(a.attname) FROM pg_index i"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL"
        " GROUP BY i.indexrelid",
        (table.sql(),),
    ).fetchall()
    return [frozenset(names) for (names,) in rows]


@contextmanager
def ddl_transaction(
    connection: psycopg.Connection, lock_timeout_ms: int
) -> Iterator[psycopg.Connection]:
    """A transaction holding the sink's DDL advisory lock until it ends.

    Its statements wait at most ``lock_timeout_ms`` for a table lock: a prepared
    transaction left by a crashed run can hold one for ever, and query start must fail
    with a message rather than hang.
    """
    with connection.transaction():
        connection.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'")
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_KEY,))
        yield connection


def create_stage_sql(stage: TableName, target: TableName, columns: list[str]) -> list[str]:
    """The staging table: the target's column types plus the piece column.

    UNLOGGED and without an index, so staging costs about one extra COPY. It only ever
    holds rows of undecided batches (the move into the target, the ledger row and the
    delete are one transaction), and that commit checks the staged row count against
    the tasks' counts: if a database crash empties the table, the commit fails, nothing
    is applied, and Spark's replay of the batch stages it again.
    """
    return [
        f'CREATE UNLOGGED TABLE IF NOT EXISTS {stage.sql()} AS SELECT NULL::text COLLATE "C"'
        f" AS {quote(PIECE_COLUMN)}, {column_list(columns)} FROM {target.sql()} WITH NO DATA",
        f"ALTER TABLE {stage.sql()} ALTER COLUMN {quote(PIECE_COLUMN)}"
        f" SET DEFAULT current_setting('{PIECE_SETTING}')",
    ]


def ledger_ddl(ledger: TableName) -> list[str]:
    index = quote(f"{ledger.name[:48]}_unfinished")
    return [
        f"CREATE TABLE IF NOT EXISTS {ledger.sql()} ("
        " sink_id text NOT NULL, batch_id bigint NOT NULL, target text NOT NULL,"
        " protocol text NOT NULL, rows bigint NOT NULL, status text NOT NULL,"
        " committed_at timestamp with time zone NOT NULL DEFAULT now(),"
        " pieces text NOT NULL, PRIMARY KEY (sink_id, batch_id))",
        f"CREATE INDEX IF NOT EXISTS {index} ON {ledger.sql()} (sink_id, batch_id)"
        " WHERE status = 'decided'",
    ]


def set_piece(cursor: psycopg.Cursor[Any], piece: str) -> None:
    """Rows COPYed into a staging table in this transaction are tagged with ``piece``."""
    cursor.execute("SELECT set_config(%s, %s, true)", (PIECE_SETTING, piece))


def copy_batches(
    cursor: psycopg.Cursor[Any],
    table: TableName,
    columns: list[str],
    batches: Iterable[pa.RecordBatch],
    batchsize: int,
) -> int:
    """COPY the Arrow batches into ``table`` (one COPY statement); return the row count."""
    statement = f"COPY {table.sql()} ({column_list(columns)}) FROM STDIN (FORMAT csv)"
    rows = 0
    cursor.execute("SET LOCAL TimeZone = 'UTC'")  # csv_ready writes timestamps in UTC
    with cursor.copy(statement) as copy:
        for chunk in rechunk(batches, batchsize):
            buffer = io.BytesIO()
            pa_csv.write_csv(csv_ready(chunk), buffer, _CSV_OPTIONS)
            copy.write(buffer.getbuffer())
            rows += chunk.num_rows
    return rows


def rechunk(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Group Arrow batches into tables of about ``rows`` rows (fewer, larger writes)."""
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        pending_rows += batch.num_rows
        if pending_rows >= rows:
            yield pa.Table.from_batches(pending)
            pending, pending_rows = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def csv_ready(table: pa.Table) -> pa.Table:
    """Binary columns as PostgreSQL's bytea hex text, zoned timestamps as naive UTC (read
    back under ``TimeZone = 'UTC'``); everything else Arrow writes itself."""
    for index, column_field in enumerate(table.schema):
        if pa.types.is_timestamp(column_field.type) and column_field.type.tz is not None:
            naive = pa.timestamp(column_field.type.unit)
            table = table.set_column(index, column_field.name, table.column(index).cast(naive))
        elif pa.types.is_binary(column_field.type) or pa.types.is_large_binary(column_field.type):
            values = [
                None if v is None else "\\x" + v.hex() for v in table.column(index).to_pylist()
            ]
            table = table.set_column(index, column_field.name, pa.array(values, pa.string()))
        elif pa.types.is_dictionary(column_field.type):
            table = table.set_column(
                index, column_field.name, pc.cast(table.column(index), column_field.type.value_type)
            )
    return table


def prepared_gids(connection: psycopg.Connection, prefix: str) -> list[str]:
    """The gids of this database's prepared transactions that start with ``prefix``."""
    rows = connection.execute(
        "SELECT gid FROM pg_prepared_xacts"
        " WHERE database = current_database() AND starts_with(gid, %s) ORDER BY gid",
        (prefix,),
    ).fetchall()
    return [gid for (gid,) in rows]


def current_transaction_id(cursor: psycopg.Cursor[Any]) -> str:
    """The running transaction's 64-bit id: recorded with a prepared piece, so that a later
    ``COMMIT PREPARED`` that finds the gid gone can ask ``pg_xact_status`` what happened."""
    cursor.execute("SELECT pg_current_xact_id()::text")
    row = cursor.fetchone()
    assert row is not None
    return str(row[0])
