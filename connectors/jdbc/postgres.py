"""PostgreSQL for 2pc-jdbc (``PostgresDialect``): connections, catalog checks, COPY of
Arrow batches, prepared transactions.

Rows travel as binary COPY encoded straight from Arrow (``binary_copy``: each column
in its type's wire format, chosen from the table's column types), or as CSV written by
Arrow into ``COPY ... FROM STDIN (FORMAT csv)`` when a column has no exact binary
encoding (listed in ``binary_copy``). Either way floats are first narrowed in Arrow as
Spark's JDBC writer has PostgreSQL narrow them (a double into ``real`` rounded once, a
float into ``numeric`` as the cast's 15- or 6-digit text, a float or decimal into an
integer rounded), never left to the server's
parse of their shortest text, which rounds a second time. CSV timestamps go as UTC
wall-clock text read in a ``TimeZone = 'UTC'`` transaction (Arrow formats zoned timestamps
about 15x slower). Errors are classified by SQLSTATE, never by message text; connection
errors name the server (host, port, database) and the fix, never the password.
"""

from __future__ import annotations

import io
import itertools
import logging
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from psycopg import sql
from pyspark.sql import types as T

from .binary_copy import (
    BinaryEncoding,
    ValueOutOfRangeError,
    column_types,
    server_float_texts,
)
from .dialect import PIECE_COLUMN, Dialect, TableName, column_list, quote
from .errors import JdbcConnectionError, JdbcWriteError

if TYPE_CHECKING:
    from .options import DatabaseUrl, JdbcSinkOptions

logger = logging.getLogger(__name__)

PIECE_SETTING = "eospack.piece"
"""Session setting that fills the staging table's piece column during a COPY."""
DDL_LOCK_KEY = 0x6E05_2BC0
"""Advisory lock serialising the sink's DDL, so queries starting together do not race."""
BUSY_PREPARED_SECONDS = 10.0

_AUTHENTICATION_SQLSTATES = frozenset({"28000", "28P01"})
_LOGIN_REFUSED_MARKERS = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "FATAL:  role ",
    "authentication failed",
)
_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, batch_size=8192)


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg: COPY for bulk rows, prepared transactions for pieces.

    Why its own class: PostgreSQL locks rows (so orphaned pieces can block a commit and
    ledger slots are locked ``FOR UPDATE``), has prepared transactions, and takes rows
    fastest by COPY. Guarantees: connection errors name the server and the fix, never the
    password; every wait for a lock is bounded by ``lockTimeout``; DDL at query start is
    serialised across sessions by an advisory lock.
    """

    name = "postgresql"
    supports_changes = True
    placeholder = "%s"
    operational_error = psycopg.OperationalError
    lock_clause = " FOR UPDATE"
    orphans_can_block_commit = True
    supports_prepared_transactions = True
    stage_keeps_column_types = True
    column_types = {
        T.LongType: "bigint",
        T.IntegerType: "integer",
        T.ShortType: "smallint",
        T.ByteType: "smallint",
        T.BooleanType: "boolean",
        T.FloatType: "real",
        T.DoubleType: "double precision",
        T.StringType: "text",
        T.BinaryType: "bytea",
        T.DateType: "date",
        T.TimestampType: "timestamp with time zone",
        T.TimestampNTZType: "timestamp without time zone",
    }

    # Connections and transactions ------------------------------------------------------

    prepared_leftovers = "prepared transactions"
    manual_rollback = "ROLLBACK PREPARED '<gid>'"

    def display_url(self, url: DatabaseUrl) -> str:
        return f"postgresql://{url.host}:{url.port}/{url.database}"

    def default_schema(self, url: DatabaseUrl) -> str:
        return "public"

    def connect(self, options: JdbcSinkOptions, *, autocommit: bool) -> psycopg.Connection:
        try:
            return psycopg.connect(autocommit=autocommit, **options.psycopg_kwargs())
        except psycopg.OperationalError as error:
            raise connection_error(options, error) from error

    def transaction(self, connection: psycopg.Connection) -> AbstractContextManager[object]:
        return connection.transaction()

    @contextmanager
    def ddl_transaction(
        self, connection: psycopg.Connection, options: JdbcSinkOptions
    ) -> Iterator[psycopg.Connection]:
        """A transaction holding the sink's DDL advisory lock until it ends.

        Its statements wait at most ``lockTimeout`` for a table lock: a prepared
        transaction left by a crashed run can hold one for ever, and query start must fail
        with a message (naming the sink's prepared transactions) rather than hang.
        """
        try:
            with connection.transaction():
                connection.execute(f"SET LOCAL lock_timeout = '{int(options.lock_timeout_ms)}ms'")
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK_KEY,))
                yield connection
        except psycopg.errors.LockNotAvailable as error:
            raise self.locked_tables_error(options, connection) from error

    def limit_lock_wait(self, connection: psycopg.Connection, lock_timeout_ms: int) -> None:
        connection.execute(f"SET LOCAL lock_timeout = '{lock_timeout_ms}ms'")

    # Catalog -----------------------------------------------------------------------------

    def table_columns(
        self, connection: psycopg.Connection, table: TableName
    ) -> dict[str, tuple[str, bool]] | None:
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

    def unique_key_sets(
        self, connection: psycopg.Connection, table: TableName
    ) -> list[frozenset[str]]:
        rows = connection.execute(
            "SELECT array_agg(a.attname) FROM pg_index i"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL"
            " GROUP BY i.indexrelid",
            (table.sql(),),
        ).fetchall()
        return [frozenset(names) for (names,) in rows]

    # DDL ---------------------------------------------------------------------------------

    def decimal_type(self, data_type: T.DecimalType) -> str:
        return f"numeric({data_type.precision},{data_type.scale})"

    def create_stage_sql(
        self, stage: TableName, target: TableName, columns: list[str]
    ) -> list[str]:
        """UNLOGGED and without an index, so staging costs about one extra COPY. It only
        ever holds rows of undecided batches (the move into the target, the ledger row and
        the delete are one transaction), and that commit checks the staged row count
        against the tasks' counts: if a database crash empties the table, the commit
        fails, nothing is applied, and Spark's replay of the batch stages it again.
        """
        return [
            f"CREATE UNLOGGED TABLE IF NOT EXISTS {stage.sql()} AS SELECT NULL::text"
            f' COLLATE "C" AS {quote(PIECE_COLUMN)}, {column_list(columns)}'
            f" FROM {target.sql()} WITH NO DATA",
            f"ALTER TABLE {stage.sql()} ALTER COLUMN {quote(PIECE_COLUMN)}"
            f" SET DEFAULT current_setting('{PIECE_SETTING}')",
        ]

    def ledger_ddl(self, ledger: TableName) -> list[str]:
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

    # Rows --------------------------------------------------------------------------------

    def write_rows(
        self,
        connection: psycopg.Connection,
        table: TableName,
        columns: list[str],
        batches: Iterable[pa.RecordBatch],
        batchsize: int,
        piece: str | None = None,
    ) -> int:
        """One COPY; a piece fills the staging table's piece column through its default."""
        with connection.cursor() as cursor:
            if piece is not None:
                set_piece(cursor, piece)
            return copy_batches(cursor, table, columns, batches, batchsize)

    def pieces_filter(self, count: int) -> str:
        return f"{quote(PIECE_COLUMN)} = ANY(%s)"

    def pieces_params(self, pieces: list[str]) -> list[object]:
        return [pieces]

    def upsert_source(
        self,
        stage: TableName,
        columns: list[str],
        upsert_keys: tuple[str, ...],
        version_column: str | None,
        where: str,
    ) -> str:
        """Per key, the row with the highest version (PostgreSQL cannot touch a row twice in
        one statement), in key order, so concurrent upserts lock rows in the same order."""
        keys = column_list(upsert_keys)
        order = keys + (f", {quote(version_column)} DESC NULLS LAST" if version_column else "")
        return (
            f"SELECT DISTINCT ON ({keys}) {column_list(columns)} FROM {stage.sql()}"
            f" WHERE {where} ORDER BY {order}"
        )

    def latest_changes_sql(
        self,
        stage: TableName,
        columns: list[str],
        keys: tuple[str, ...],
        version_column: str,
        op_column: str,
        where: str,
    ) -> str:
        """As the base class's, with ``DISTINCT ON`` (one sort, no window)."""
        return (
            f"SELECT DISTINCT ON ({column_list(keys)}) {column_list(columns)} FROM {stage.sql()}"
            f" WHERE {where} ORDER BY {column_list(keys)}, {quote(version_column)} DESC,"
            f" {quote(op_column)} ASC"
        )

    def apply_changes_sql(
        self,
        target: TableName,
        stage: TableName,
        tombstones: TableName,
        columns: list[str],
        keys: tuple[str, ...],
        version_column: str,
        op_column: str,
        piece_count: int,
    ) -> list[str]:
        """The base class's four steps as one statement: the newest change per key is
        computed once (a ``MATERIALIZED`` CTE) and the steps run as data-modifying CTEs on
        one snapshot. Same rows as running them in order, because each key's winner is a
        delete or an upsert, never both: the delete and the new tombstones touch only the
        delete winners' keys, the upsert and the forgotten tombstones only the upsert
        winners', so no step reads what another changes (and no row is changed twice).
        Benchmark 14 at 1M changes: 0.58x -> 0.80x writeMode=upsert (profiled: three of the
        four rankings and statements were the gap)."""
        latest = self.latest_changes_sql(
            stage, columns, keys, version_column, op_column, self.pieces_filter(piece_count)
        )
        delete, record, upsert, forget = super().apply_changes_sql(
            target, stage, tombstones, columns, keys, version_column, op_column, piece_count
        )
        return [
            f"WITH eospack_latest AS MATERIALIZED ({latest}),"
            f" eospack_deleted AS ({_from_latest(delete, latest)}),"
            f" eospack_recorded AS ({_from_latest(record, latest)}),"
            f" eospack_forgotten AS ({_from_latest(forget, latest)})"
            f" {_from_latest(upsert, latest)}"
        ]

    def vacuum_stage(self, connection: psycopg.Connection, stage: TableName) -> None:
        """Reclaim the moved rows at once (2-3 ms): otherwise every later move and recovery
        scan reads the dead rows of all batches since the last autovacuum, up to a minute's
        worth. Housekeeping only: a failure is logged and ignored."""
        try:
            connection.execute(f"VACUUM {stage.sql()}")
        except psycopg.Error as error:
            logger.debug("2pc-jdbc could not vacuum %s: %s", stage, error)

    # Prepared transactions -----------------------------------------------------------------

    def max_prepared_transactions(self, connection: psycopg.Connection) -> int:
        row = connection.execute("SELECT current_setting('max_prepared_transactions')").fetchone()
        return int(row[0]) if row else 0

    def prepared_gids(self, connection: psycopg.Connection, prefix: str) -> list[str]:
        rows = connection.execute(
            "SELECT gid FROM pg_prepared_xacts"
            " WHERE database = current_database() AND starts_with(gid, %s) ORDER BY gid",
            (prefix,),
        ).fetchall()
        return [gid for (gid,) in rows]

    def begin_prepared(self, connection: psycopg.Connection, gid: str) -> None:
        connection.tpc_begin(gid)

    def prepare(self, connection: psycopg.Connection) -> None:
        connection.tpc_prepare()

    def current_transaction_id(self, connection: psycopg.Connection) -> str:
        """The 64-bit id: a later ``COMMIT PREPARED`` that finds the gid gone asks
        ``pg_xact_status`` what happened to it (``transaction_status``)."""
        row = connection.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        return str(row[0])

    def finish_prepared(
        self, connection: psycopg.Connection, gid: str, verb: str, *, wait_if_busy: bool = True
    ) -> bool:
        """SQLSTATE 42704 means the gid is gone. Another session finishing the same gid at
        this moment (two tasks cleaning up the same leftover, SQLSTATE 55000 "is busy") is
        waited for, up to ``BUSY_PREPARED_SECONDS``, if ``wait_if_busy``; it then is gone,
        which the caller verifies."""
        statement = sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid))
        deadline = time.monotonic() + BUSY_PREPARED_SECONDS
        while True:
            try:
                connection.execute(statement)
                return True
            except psycopg.errors.UndefinedObject:
                return False
            except psycopg.errors.ObjectInUse:
                if not wait_if_busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def transaction_status(self, connection: psycopg.Connection, xid: str) -> str | None:
        row = connection.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
        return row[0] if row else None


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
    """COPY the Arrow batches into ``table`` (one COPY statement); return the row count.

    Binary COPY (``binary_copy``) when every column has an exact binary encoding for its
    type in ``table``, else CSV. A value the table refuses fails with ``JdbcWriteError``
    naming the column (and leaves the open transaction to be rolled back).
    """
    chunks = rechunk(batches, batchsize)
    first = next(chunks, None)
    if first is None:
        return 0
    encoding = BinaryEncoding(columns, first.schema, column_types(cursor, table.sql()))
    rows = 0
    chunk_start = 0

    def counted() -> Iterator[pa.Table]:
        nonlocal rows, chunk_start
        for chunk in itertools.chain([first], chunks):
            chunk_start = rows
            rows += chunk.num_rows
            yield chunk

    try:
        if encoding.binary:
            statement = f"COPY {table.sql()} ({column_list(columns)}) FROM STDIN (FORMAT binary)"
            with cursor.copy(statement) as copy:
                for data in encoding.encode(counted()):
                    copy.write(data)
        elif encoding.float_texts:
            # The server formats these floats: one query, then one COPY, per chunk (a
            # query cannot run while a COPY is open on the connection).
            cursor.execute("SET LOCAL TimeZone = 'UTC'")  # csv_ready writes timestamps in UTC
            statement = f"COPY {table.sql()} ({column_list(columns)}) FROM STDIN (FORMAT csv)"
            for chunk in counted():
                texts = server_float_texts(cursor, chunk, sorted(encoding.float_texts))
                ready = csv_ready(encoding.with_wire_types(texts))
                buffer = io.BytesIO()
                pa_csv.write_csv(ready, buffer, _CSV_OPTIONS)
                with cursor.copy(statement) as copy:
                    copy.write(buffer.getbuffer())
        else:
            logger.debug("2pc-jdbc COPYs %s as CSV: %s", table, encoding.fallback_reason)
            statement = f"COPY {table.sql()} ({column_list(columns)}) FROM STDIN (FORMAT csv)"
            cursor.execute("SET LOCAL TimeZone = 'UTC'")  # csv_ready writes timestamps in UTC
            with cursor.copy(statement) as copy:
                for chunk in counted():
                    buffer = io.BytesIO()
                    ready = csv_ready(encoding.with_wire_types(chunk))
                    pa_csv.write_csv(ready, buffer, _CSV_OPTIONS)
                    copy.write(buffer.getbuffer())
    except ValueOutOfRangeError as error:
        raise JdbcWriteError(
            f"2pc-jdbc could not write column {error.column!r} of {str(table)!r} (row"
            f" {chunk_start + error.index + 1} of the task): {error.reason}: {error.fix}"
        ) from error
    except psycopg.Error as error:
        refused = refused_value_error(
            error, table, columns, chunk_start if encoding.float_texts else 0
        )
        if refused is None:
            raise
        raise refused from error
    return rows


_COPY_CONTEXT = re.compile(r"^COPY [^\n]*?, line (\d+), column (.+)$", re.MULTILINE)


def refused_value_error(
    error: psycopg.Error, table: TableName, columns: list[str], first_row: int = 0
) -> JdbcWriteError | None:
    """A value the server refused during COPY, as one line naming the column and row with
    the server's reason (the context line, which quotes a CSV field, is left out); None
    for any other error (connection errors are classified in ``sink``)."""
    match = _COPY_CONTEXT.search(error.diag.context or "")
    if match is None:
        return None
    line, rest = match.groups()
    row = int(line) + first_row
    named = [name for name in columns if rest == name or rest.startswith(f"{name}: ")]
    column = max(named, key=len) if named else rest.split(":")[0]
    reason = (error.diag.message_primary or type(error).__name__).splitlines()[0]
    fix = "make the DataFrame's values fit the column's type, or change the column"
    if error.sqlstate == "22021" and "0x00" in reason:
        fix = (
            "PostgreSQL text cannot hold a NUL character: remove them first"
            " (regexp_replace(col, '\\\\x00', ''))"
        )
    return JdbcWriteError(
        f"2pc-jdbc could not write column {column!r} of {str(table)!r} (row {row} of the"
        f" task): {reason} (SQLSTATE {error.sqlstate}): {fix}"
    )


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


def _from_latest(statement: str, latest: str) -> str:
    """``statement`` reading the ``eospack_latest`` CTE where it held ``latest``."""
    assert statement.count(f"({latest})") == 1
    return statement.replace(f"({latest})", "(SELECT * FROM eospack_latest)")
