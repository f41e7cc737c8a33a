"""MariaDB and MySQL 8 for 2pc-jdbc (``MariaDBDialect``; staging protocol).

Decisions, and why:

- **Quoting.** Every connection the dialect opens adds ``ANSI_QUOTES`` to its session's
  ``sql_mode`` (with ``STRICT_ALL_TABLES``: a value that does not fit is an error, never a
  silent truncation), so the shared builders of ``dialect.py`` quote names with double
  quotes as for PostgreSQL and SQLite; backticks are never written. The session's
  ``time_zone`` is ``'+00:00'``.
- **Protocol.** ``staging``: a task commits its rows, tagged with its piece id, into the
  staging table in one local transaction; the driver moves a batch's rows into the target,
  deletes them and records the decision in one InnoDB transaction. ``protocol=auto``
  picks it. ``protocol=prepared`` is XA: a task writes into the target inside ``XA START``
  and ends with ``XA PREPARE`` (MariaDB 10.5+ and MySQL 8 keep a prepared XA transaction
  across a disconnect and a server restart), the driver ``XA COMMIT``s the pieces its
  decision names, and ``XA RECOVER`` lists leftovers for recovery. Rows are written once
  (staging writes them twice: benchmark 13 measured staging at 0.31x at-least-once at 1M
  rows). The piece id (~70 characters) is the XA id split into ``gtrid`` (64 bytes) and
  ``bqual``. Not ``auto``'s choice yet: XA needs ``XA_RECOVER_ADMIN`` on MySQL 8, and a
  server keeps no outcome of a finished XA transaction, so a piece found gone after the
  decision is taken as committed (only eospack finishes its own pieces; a DBA's ``XA
  ROLLBACK`` of a decided piece is not detected, unlike PostgreSQL's ``pg_xact_status``).
  A task's session may still hold its prepared transaction for a moment after it
  disconnected (``XA COMMIT`` then says unknown XID while ``XA RECOVER`` lists it, measured
  3 times in 200 here): such a commit is retried until ``XA RECOVER`` no longer lists it.
  Appends only: an upsert inside a prepared XA transaction holds InnoDB's next-key locks
  (duplicate-key checks take them even under READ COMMITTED) until ``XA COMMIT``, so the
  tasks of one batch wait on each other until ``lockTimeout`` (the contract suite's
  documented-options query did); ``options`` refuses ``protocol=prepared`` with upsert or
  changes on MariaDB/MySQL.
- **Bulk path.** ``LOAD DATA LOCAL INFILE`` of a temporary file per task, written from
  Arrow (each column formatted and escaped by Arrow compute, rows joined by Arrow).
  Measured on MariaDB 10.11 here (2-core machine shared with other work), 100k rows
  (bigint, text, double, datetime(6)) in one transaction: from Python tuples, ``LOAD
  DATA`` ~378k rows/s against ~89k rows/s for multi-row ``INSERT ... VALUES`` (pymysql's
  ``executemany``, 10,000 rows per call; ~71k at 1,000); through this module from Arrow
  batches (timestamp conversion included), ``_load_data`` ~145k rows/s against
  ~34-46k rows/s for ``_insert_rows``: 3-4x either way, so ``LOAD DATA`` it is. A server
  that refuses local files (MySQL 8's default ``local_infile=OFF``) gets the multi-row
  ``INSERT`` (``batchsize`` rows per statement) instead, logged once per process. ``LOAD DATA``
  turns bad values into warnings, not errors: any warning fails the write, naming the
  server's message.
- **Types.** As Spark's JDBC writer stores them: timestamps ``DATETIME(6)`` in UTC
  (microseconds), decimals ``DECIMAL(p,s)``, ``DOUBLE``/``FLOAT``, ``LONGBLOB``, strings
  ``LONGTEXT`` (utf8mb4, binary collation: keys compare as Spark compares them), except
  upsert key columns of tables the sink creates: ``VARCHAR(255)``/``VARBINARY(255)``,
  because InnoDB cannot index a ``TEXT`` column without a prefix length (a longer key
  value is refused with the server's error; create the table yourself for longer keys).
  NaN and infinities are refused (MySQL has none).
- **Upsert.** ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE`` with ``VALUES(col)`` (in
  MariaDB 10.x and MySQL 8.4; MySQL warns it is deprecated) and the version guard
  ``IF(stored IS NULL OR stored < new, new, stored)`` per column, the version column
  assigned last (MySQL evaluates the assignments left to right).
- **DDL.** MySQL commits implicitly before DDL, so the query-start DDL is serialised by a
  named lock (``GET_LOCK``, waiting at most ``lockTimeout``), not by a transaction.
  Tables are InnoDB. Lock waits: ``innodb_lock_wait_timeout`` (whole seconds, rounded up).
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pymysql
from pyspark.sql import types as T

from .dialect import (
    CHANGE_DELETE,
    CHANGE_UPSERT,
    PIECE_COLUMN,
    Dialect,
    TableName,
    column_list,
    quote,
)
from .errors import JdbcConnectionError, JdbcSchemaError, JdbcSinkOptionError, JdbcWriteError

if TYPE_CHECKING:
    from .options import DatabaseUrl, JdbcSinkOptions

logger = logging.getLogger(__name__)

DDL_LOCK_NAME = "eospack_2pc_jdbc_ddl"
LOCK_WAIT_ERRORS = frozenset({1205})
"""ER_LOCK_WAIT_TIMEOUT: an InnoDB row lock or a metadata lock waited its whole timeout."""
CONNECT_TIMEOUT_SECONDS = 10
"""As ``options.DEFAULT_CONNECT_TIMEOUT_SECONDS`` (not imported: options imports this)."""
SESSION_SETUP = (
    "SET SESSION sql_mode = CONCAT_WS(',', @@SESSION.sql_mode, 'ANSI_QUOTES',"
    " 'STRICT_ALL_TABLES'), time_zone = '+00:00'"
)
KEY_STRING_TYPE = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
KEY_BINARY_TYPE = "VARBINARY(255)"
_LOCAL_INFILE_REFUSED = frozenset({1148, 3948, 4166, 2068})
"""Error codes of a refused ``LOAD DATA LOCAL``: 1148 (older servers), 3948 (MySQL 8),
4166 (MariaDB 10.x), 2068 (a client's refusal)."""
_AUTHENTICATION_ERRORS = frozenset({1045, 1044, 1698})
_UNKNOWN_DATABASE = 1049
_UNKNOWN_XID = 1397
_XA_RECOVER_REFUSED = frozenset({1227, 1044, 1142})
XA_GTRID_BYTES = 64
ATTACHED_XA_SECONDS = 10.0
"""How long a commit waits for a prepared XA transaction still held by its task's closing
session."""
_local_infile_refused_logged = False


class MariaDBConnection:
    """A pymysql connection with the ``execute`` of psycopg's and sqlite3's connections,
    which the shared code calls: it returns a (buffered) cursor."""

    def __init__(self, raw: pymysql.Connection[Any]) -> None:
        self.raw = raw
        self.xa_gid: str | None = None
        """The XA transaction this connection began (``begin_prepared``), until prepared."""

    def execute(self, statement: str, params: Iterable[Any] | None = None) -> Any:
        cursor = self.raw.cursor()
        values = tuple(params) if params is not None else ()
        cursor.execute(statement, values if values else None)
        return cursor

    def commit(self) -> None:
        self.raw.commit()

    def rollback(self) -> None:
        self.raw.rollback()

    def close(self) -> None:
        if self.raw.open:
            self.raw.close()

    @property
    def autocommit(self) -> bool:
        return bool(self.raw.get_autocommit())

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self.raw.autocommit(value)


class MariaDBDialect(Dialect):
    """MariaDB 10.5+ and MySQL 8 through pymysql; see the module docstring for the
    decisions. Guarantees: connection errors name the server and the fix, never the
    password; every row lock wait is bounded by ``lockTimeout``; query-start DDL is
    serialised across sessions."""

    name = "mariadb"
    placeholder = "%s"
    operational_error = pymysql.err.OperationalError
    lock_clause = " FOR UPDATE"
    orphans_can_block_commit = False
    supports_prepared_transactions = True
    auto_uses_prepared = False
    stage_keeps_column_types = True
    supports_changes = True
    column_types = {
        T.LongType: "BIGINT",
        T.IntegerType: "INT",
        T.ShortType: "SMALLINT",
        T.ByteType: "TINYINT",
        T.BooleanType: "BOOLEAN",
        T.FloatType: "FLOAT",
        T.DoubleType: "DOUBLE",
        T.StringType: "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        T.BinaryType: "LONGBLOB",
        T.DateType: "DATE",
        T.TimestampType: "DATETIME(6)",
        T.TimestampNTZType: "DATETIME(6)",
    }

    # Connections and transactions ------------------------------------------------------

    prepared_leftovers = "prepared XA pieces"
    manual_rollback = "XA ROLLBACK '<gtrid>', '<bqual>' with the parts XA RECOVER lists"

    def display_url(self, url: DatabaseUrl) -> str:
        return f"jdbc:mariadb://{url.host}:{url.port}/{url.database}"

    def default_schema(self, url: DatabaseUrl) -> str:
        return url.database

    def connect(self, options: JdbcSinkOptions, *, autocommit: bool) -> MariaDBConnection:
        try:
            raw = pymysql.connect(
                host=options.url.host,
                port=options.url.port,
                user=options.user,
                password=options.password or "",
                database=options.url.database,
                charset="utf8mb4",
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                autocommit=autocommit,
                local_infile=True,
                init_command=SESSION_SETUP,
            )
        except pymysql.err.MySQLError as error:
            raise connection_error(options, error) from error
        return MariaDBConnection(raw)

    @contextmanager
    def transaction(self, connection: MariaDBConnection) -> Iterator[MariaDBConnection]:
        connection.raw.begin()
        try:
            yield connection
        except BaseException:
            try:
                connection.raw.rollback()
            except Exception as error:  # a lost connection: the server rolls back itself
                logger.debug("2pc-jdbc could not roll back: %s", type(error).__name__)
            raise
        connection.raw.commit()

    @contextmanager
    def ddl_transaction(
        self, connection: MariaDBConnection, options: JdbcSinkOptions
    ) -> Iterator[MariaDBConnection]:
        """A named lock (``GET_LOCK``) held while the sink's tables are checked and made:
        MySQL commits before each DDL statement, so a transaction would not serialise
        them. It and every statement inside wait at most ``lockTimeout`` (whole seconds): a
        prepared XA piece left by a crashed run holds its row locks for ever, and query start
        must fail with a message naming the sink's XA pieces rather than wait InnoDB's 50 s."""
        seconds = max(1, math.ceil(options.lock_timeout_ms / 1000))
        connection.execute(
            f"SET SESSION innodb_lock_wait_timeout = {seconds}, lock_wait_timeout = {seconds}"
        )
        row = connection.execute("SELECT GET_LOCK(%s, %s)", (DDL_LOCK_NAME, seconds)).fetchone()
        if row is None or row[0] != 1:
            raise JdbcWriteError(
                f"2pc-jdbc could not prepare the tables of {options.describe()} at query start:"
                f" another session held the lock {DDL_LOCK_NAME!r} for over"
                f" {options.lock_timeout_ms}ms (lockTimeout): wait for the other query's start,"
                " or raise lockTimeout"
            )
        try:
            yield connection
        except pymysql.err.OperationalError as error:
            if error.args[0] not in LOCK_WAIT_ERRORS:
                raise
            raise self.locked_tables_error(options, connection) from error
        finally:
            try:
                connection.execute("SELECT RELEASE_LOCK(%s)", (DDL_LOCK_NAME,))
            except Exception as error:  # a lost session releases its locks
                logger.debug("2pc-jdbc could not release the DDL lock: %s", error)

    def limit_lock_wait(self, connection: MariaDBConnection, lock_timeout_ms: int) -> None:
        seconds = max(1, math.ceil(lock_timeout_ms / 1000))
        connection.execute(f"SET SESSION innodb_lock_wait_timeout = {int(seconds)}")

    # Catalog -----------------------------------------------------------------------------

    def table_columns(
        self, connection: MariaDBConnection, table: TableName
    ) -> dict[str, tuple[str, bool]] | None:
        rows = connection.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE = 'NO' AND COLUMN_DEFAULT IS NULL"
            " AND EXTRA NOT LIKE '%%auto_increment%%' AND EXTRA NOT LIKE '%%GENERATED%%'"
            " FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s"
            " ORDER BY ORDINAL_POSITION",
            (table.schema, table.name),
        ).fetchall()
        if not rows:
            return None
        return {str(name): (str(kind), bool(required)) for name, kind, required in rows}

    def unique_key_sets(
        self, connection: MariaDBConnection, table: TableName
    ) -> list[frozenset[str]]:
        """Unique indexes over whole columns (a prefix index does not make values unique)."""
        rows = connection.execute(
            "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = COALESCE(%s, DATABASE()) AND TABLE_NAME = %s"
            " AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            (table.schema, table.name),
        ).fetchall()
        indexes: dict[str, set[str]] = {}
        prefixed: set[str] = set()
        for index, column, sub_part in rows:
            indexes.setdefault(str(index), set()).add(str(column))
            if sub_part is not None:
                prefixed.add(str(index))
        return [frozenset(columns) for index, columns in indexes.items() if index not in prefixed]

    # DDL ---------------------------------------------------------------------------------

    def decimal_type(self, data_type: T.DecimalType) -> str:
        return f"DECIMAL({data_type.precision},{data_type.scale})"

    def refuse_lossy_columns(
        self,
        options: JdbcSinkOptions,
        schema: T.StructType,
        existing: Mapping[str, tuple[str, bool]],
    ) -> None:
        """Names with ``%``: pymysql formats parameters into the statement with Python's
        ``%`` operator, so such a name would break every statement that has parameters."""
        names = [*schema.fieldNames(), str(options.table), str(options.ledger_table)]
        for name in names:
            if "%" in name:
                raise JdbcSchemaError(
                    f"name {name!r} contains '%', which 2pc-jdbc cannot use with MariaDB or"
                    " MySQL (its driver formats parameters with '%'): rename it"
                )

    def create_table_sql(
        self, table: TableName, schema: T.StructType, primary_key: tuple[str, ...] = ()
    ) -> str:
        """InnoDB; string and binary key columns as ``VARCHAR(255)``/``VARBINARY(255)``
        (InnoDB indexes no ``TEXT``/``BLOB`` without a prefix length)."""
        columns = []
        for field in schema.fields:
            kind = self.column_type(field)
            if field.name in primary_key and isinstance(field.dataType, T.StringType):
                kind = KEY_STRING_TYPE
            elif field.name in primary_key and isinstance(field.dataType, T.BinaryType):
                kind = KEY_BINARY_TYPE
            columns.append(f"{quote(field.name)} {kind}")
        if primary_key:
            columns.append(f"PRIMARY KEY ({column_list(primary_key)})")
        return f"CREATE TABLE IF NOT EXISTS {table.sql()} ({', '.join(columns)}) ENGINE=InnoDB"

    def create_stage_sql(
        self, stage: TableName, target: TableName, columns: list[str]
    ) -> list[str]:
        """The target's column types (``CREATE TABLE ... SELECT``, no keys: a batch may
        hold a key twice) plus the indexed piece column."""
        piece = quote(PIECE_COLUMN)
        index = quote(f"{stage.name[:50]}_piece")
        return [
            f"CREATE TABLE IF NOT EXISTS {stage.sql()} ({piece} VARCHAR(255) CHARACTER SET"
            f" utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '', INDEX {index} ({piece}))"
            f" ENGINE=InnoDB SELECT {column_list(columns)} FROM {target.sql()} WHERE 1 = 0"
        ]

    def ledger_ddl(self, ledger: TableName) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {ledger.sql()} ("
            " sink_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " batch_id BIGINT NOT NULL, target LONGTEXT NOT NULL,"
            ' protocol VARCHAR(32) NOT NULL, "rows" BIGINT NOT NULL,'
            " status VARCHAR(16) NOT NULL,"
            " committed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
            " pieces LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,"
            " PRIMARY KEY (sink_id, batch_id)) ENGINE=InnoDB"
        ]

    def insert_slot(
        self, connection: MariaDBConnection, ledger: TableName, values: tuple[Any, ...]
    ) -> bool:
        """``ON DUPLICATE KEY UPDATE`` of nothing: 1 row affected when inserted, 0 when the
        slot existed (pymysql does not ask for found rows)."""
        cursor = connection.execute(
            f"INSERT INTO {ledger.sql()}"
            ' (sink_id, batch_id, target, protocol, "rows", status, pieces)'
            " VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON DUPLICATE KEY UPDATE sink_id = sink_id",
            values,
        )
        return int(cursor.rowcount) == 1

    # Rows --------------------------------------------------------------------------------

    def write_rows(
        self,
        connection: MariaDBConnection,
        table: TableName,
        columns: list[str],
        batches: Iterable[pa.RecordBatch],
        batchsize: int,
        piece: str | None = None,
    ) -> int:
        """``LOAD DATA LOCAL INFILE`` of one temporary file (multi-row ``INSERT`` where the
        server refuses local files); a piece is set by the statement."""
        prepared = [_prepared(batch, columns, table) for batch in batches if batch.num_rows]
        if not prepared:
            return 0
        rows = sum(batch.num_rows for batch in prepared)
        global _local_infile_refused_logged
        try:
            loaded = _load_data(connection, table, columns, prepared, piece)
        except pymysql.err.MySQLError as error:
            if not error.args or error.args[0] not in _LOCAL_INFILE_REFUSED:
                raise _refused(error, table) from error
            if not _local_infile_refused_logged:
                _local_infile_refused_logged = True
                logger.warning(
                    "2pc-jdbc: the server refuses LOAD DATA LOCAL INFILE (%s): writing with"
                    " multi-row INSERT instead, about 4x slower (set local_infile=ON on the"
                    " server for the fast path)",
                    error.args[-1],
                )
            loaded = _insert_rows(connection, table, columns, prepared, batchsize, piece)
        if loaded != rows:
            raise JdbcWriteError(
                f"2pc-jdbc wrote {loaded} rows into {str(table)!r} for the task's {rows}:"
                " nothing is committed; check the table's triggers and keys"
            )
        return rows

    def upsert_source(
        self,
        stage: TableName,
        columns: list[str],
        upsert_keys: tuple[str, ...],
        version_column: str | None,
        where: str,
    ) -> str:
        """Every staged row of the pieces, in key order (concurrent moves lock rows in the
        same order); the version guard keeps the highest version whatever the order."""
        order = column_list(upsert_keys)
        return f"SELECT {column_list(columns)} FROM {stage.sql()} WHERE {where} ORDER BY {order}"

    def upsert_sql(
        self,
        target: TableName,
        columns: list[str],
        keys: tuple[str, ...],
        version_column: str | None,
        source: str,
    ) -> str:
        """``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE`` (no ``ON CONFLICT`` here). With
        a version column every assignment is guarded by ``IF(stored is older, new, stored)``
        and the version column is assigned last: MySQL evaluates assignments left to right,
        so an earlier one would otherwise compare against the new version."""
        selected = column_list(columns)
        updated = [name for name in columns if name not in keys]
        if version_column in updated:
            updated = [name for name in updated if name != version_column] + [version_column]
        if not updated:
            first = quote(keys[0])
            action = f"{first} = {target.sql()}.{first}"
        elif version_column:
            stored = f"{target.sql()}.{quote(version_column)}"
            newer = f"{stored} IS NULL OR {stored} < VALUES({quote(version_column)})"
            action = ", ".join(
                f"{quote(name)} = IF({newer}, VALUES({quote(name)}), {target.sql()}.{quote(name)})"
                for name in updated
            )
        else:
            action = ", ".join(f"{quote(name)} = VALUES({quote(name)})" for name in updated)
        return f"INSERT INTO {target.sql()} ({selected}) {source} ON DUPLICATE KEY UPDATE {action}"

    # Change streams: MySQL refuses a DELETE whose subquery reads the table it deletes from
    # (error 1093; MariaDB allows it since 10.3), so deletes join instead.

    def delete_rows_sql(
        self, target: TableName, keys: tuple[str, ...], version_column: str, latest: str, op: str
    ) -> str:
        version = quote(version_column)
        return (
            f"DELETE eospack_t FROM {target.sql()} eospack_t JOIN ({latest}) eospack_w"
            f" ON {self.keys_match(keys, 'eospack_t', 'eospack_w')}"
            f" WHERE eospack_w.{op} = '{CHANGE_DELETE}' AND (eospack_t.{version} IS NULL OR"
            f" eospack_t.{version} < eospack_w.{version})"
        )

    def drop_tombstones_sql(
        self,
        tombstones: TableName,
        keys: tuple[str, ...],
        version_column: str,
        latest: str,
        op: str,
    ) -> str:
        version = quote(version_column)
        return (
            f"DELETE eospack_b FROM {tombstones.sql()} eospack_b JOIN ({latest}) eospack_w"
            f" ON {self.keys_match(keys, 'eospack_b', 'eospack_w')}"
            f" WHERE eospack_w.{op} = '{CHANGE_UPSERT}' AND eospack_b.{version} <"
            f" eospack_w.{version}"
        )

    def create_tombstones_sql(
        self, tombstones: TableName, target: TableName, keys: tuple[str, ...], version_column: str
    ) -> list[str]:
        """The key and version columns with the target's types, unique on the keys, in one
        statement (MySQL has no ``CREATE INDEX IF NOT EXISTS``)."""
        return [
            f"CREATE TABLE IF NOT EXISTS {tombstones.sql()} (UNIQUE KEY"
            f" {quote(f'{tombstones.name[:48]}_key')} ({column_list(keys)})) ENGINE=InnoDB"
            f" AS SELECT {column_list([*keys, version_column])} FROM {target.sql()} WHERE 1 = 0"
        ]

    def vacuum_stage(self, connection: MariaDBConnection, stage: TableName) -> None:
        """Nothing to do: InnoDB purges deleted rows in the background."""

    # XA transactions (protocol=prepared) ---------------------------------------------------

    def max_prepared_transactions(self, connection: MariaDBConnection) -> int:
        """No server limit; ``XA RECOVER`` must be allowed (recovery lists leftovers with
        it), else ``protocol=prepared`` is refused here, at query start."""
        try:
            connection.execute("XA RECOVER")
        except pymysql.err.MySQLError as error:
            if error.args and error.args[0] in _XA_RECOVER_REFUSED:
                raise JdbcSinkOptionError(
                    "protocol=prepared (XA) needs XA RECOVER, which the server refuses to"
                    " this user: GRANT XA_RECOVER_ADMIN ON *.* (MySQL 8), or use"
                    " protocol=staging"
                ) from error
            raise
        return 1 << 20

    def prepared_gids(self, connection: MariaDBConnection, prefix: str) -> list[str]:
        """None when the server refuses ``XA RECOVER`` to this user (MySQL 8 without
        ``XA_RECOVER_ADMIN``): such a user's queries cannot have prepared any (query start
        refuses ``protocol=prepared`` then), and staging or at-least-once must not fail."""
        try:
            rows = connection.execute("XA RECOVER").fetchall()
        except pymysql.err.MySQLError as error:
            if error.args and error.args[0] in _XA_RECOVER_REFUSED:
                return []
            raise
        gids = [_gid_of(row) for row in rows]
        return sorted(gid for gid in gids if gid.startswith(prefix))

    def begin_prepared(self, connection: MariaDBConnection, gid: str) -> None:
        """READ COMMITTED: a prepared transaction keeps its locks until ``XA COMMIT``, and
        under InnoDB's default REPEATABLE READ they include gap locks that other tasks'
        writes would wait on; READ COMMITTED locks only the rows a statement writes."""
        connection.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        connection.execute("XA START %s, %s", _xid(gid))
        connection.xa_gid = gid

    def prepare(self, connection: MariaDBConnection) -> None:
        assert connection.xa_gid is not None, "begin_prepared first"
        xid = _xid(connection.xa_gid)
        connection.execute("XA END %s, %s", xid)
        connection.execute("XA PREPARE %s, %s", xid)
        connection.xa_gid = None

    def current_transaction_id(self, connection: MariaDBConnection) -> str:
        """Empty: MariaDB and MySQL keep no outcome of a finished XA transaction to ask."""
        return ""

    def finish_prepared(
        self, connection: MariaDBConnection, gid: str, verb: str, *, wait_if_busy: bool = True
    ) -> bool:
        """``XA COMMIT``/``XA ROLLBACK``; False when ``XA RECOVER`` no longer lists the gid.
        An unknown XID that ``XA RECOVER`` still lists is held by its task's closing session:
        retried for up to ``ATTACHED_XA_SECONDS`` (``wait_if_busy``)."""
        deadline = time.monotonic() + ATTACHED_XA_SECONDS
        while True:
            try:
                connection.execute(f"XA {verb} %s, %s", _xid(gid))
                return True
            except pymysql.err.MySQLError as error:
                if not error.args or error.args[0] != _UNKNOWN_XID:
                    raise
            if gid not in self.prepared_gids(connection, gid):
                return False
            if not wait_if_busy or time.monotonic() > deadline:
                raise JdbcWriteError(
                    f"2pc-jdbc could not {verb.lower()} XA transaction {gid}: the server"
                    " lists it but another session still holds it: end that session (or"
                    " wait for it to disconnect) and restart the query"
                )
            time.sleep(0.05)

    def transaction_status(self, connection: MariaDBConnection, xid: str) -> str | None:
        return None


def _xid(gid: str) -> tuple[str, str]:
    """(gtrid, bqual): an XA gtrid holds at most 64 bytes; the piece id is ASCII."""
    return gid[:XA_GTRID_BYTES], gid[XA_GTRID_BYTES:]


def _gid_of(row: tuple[Any, ...]) -> str:
    """The piece id of an ``XA RECOVER`` row (formatID, gtrid_length, bqual_length, data):
    gtrid and bqual joined, as ``_xid`` split them."""
    data = row[3]
    return data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)


def connection_error(options: JdbcSinkOptions, error: Exception) -> JdbcConnectionError:
    where = options.url.display()
    user = options.user or "(default user)"
    code = error.args[0] if error.args and isinstance(error.args[0], int) else None
    text = str(error.args[-1]) if error.args else type(error).__name__
    if code in _AUTHENTICATION_ERRORS:
        return JdbcConnectionError(
            f"could not log in to {where} as user {user!r}: check the user and password options"
            " (and the user's grants on the database)"
        )
    if code == _UNKNOWN_DATABASE:
        return JdbcConnectionError(
            f"database {options.url.database!r} does not exist on {where}: fix the url option"
        )
    return JdbcConnectionError(
        f"could not connect to {where}: {text} (check the url option and that the server runs)"
    )


def _refused(error: Exception, table: TableName) -> Exception:
    """A value the server refused, as a ``JdbcWriteError`` naming the table and the
    server's reason; connection errors are passed on as they are."""
    if isinstance(error, pymysql.err.OperationalError) and error.args[0] >= 2000:
        return error
    code = error.args[0] if error.args else "?"
    reason = str(error.args[-1]) if error.args else type(error).__name__
    return JdbcWriteError(
        f"2pc-jdbc could not write into {str(table)!r}: {reason} (error {code}): make the"
        " DataFrame's values fit the columns' types, or change the columns"
    )


def _prepared(batch: pa.RecordBatch, columns: list[str], table: TableName) -> pa.RecordBatch:
    """The batch's columns as the server takes them: zoned timestamps as UTC wall-clock
    (the session's time zone is UTC), booleans as 0/1; NaN and infinities refused."""
    arrays = []
    for name in columns:
        array = batch.column(batch.schema.get_field_index(name))
        kind = array.type
        if pa.types.is_dictionary(kind):
            array = pc.cast(array, kind.value_type)
            kind = array.type
        if pa.types.is_timestamp(kind):
            array = array.cast(pa.timestamp("us", tz=kind.tz)) if kind.unit != "us" else array
            if kind.tz is not None:
                array = array.cast(pa.timestamp("us"))
        elif pa.types.is_boolean(kind):
            array = pc.cast(array, pa.int8())
        elif pa.types.is_floating(kind):
            finite = pc.is_finite(array)
            if pc.any(pc.invert(pc.fill_null(finite, True))).as_py():
                raise JdbcSchemaError(
                    f"column {name!r} of {str(table)!r} holds NaN or an infinity, which"
                    " MariaDB and MySQL cannot store: replace them first (e.g. nanvl(col,"
                    " NULL)) or cast the column to string"
                )
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, names=columns)


def _text_column(array: pa.Array) -> tuple[pa.Array, bool]:
    """One column as ``LOAD DATA``'s default text format (tab-separated, backslash
    escapes, ``\\N`` for NULL); True when it is hex (binary: loaded through ``UNHEX``)."""
    kind = array.type
    is_hex = False
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        text = pa.array([None if v is None else v.hex() for v in array.to_pylist()], pa.string())
        is_hex = True
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = array
        for raw, escaped in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\x00", "\\0")):
            text = pc.replace_substring(text, raw, escaped)
    else:
        text = pc.cast(array, pa.string())
    return pc.fill_null(pc.cast(text, pa.string()), "\\N"), is_hex


def _load_data(
    connection: MariaDBConnection,
    table: TableName,
    columns: list[str],
    batches: list[pa.RecordBatch],
    piece: str | None,
) -> int:
    """Write the batches into one temporary file and ``LOAD DATA LOCAL INFILE`` it; any
    warning (a value the server adjusted) fails the write."""
    descriptor, path = tempfile.mkstemp(prefix="eospack-jdbc-", suffix=".tsv")
    targets: list[str] = []
    assignments: list[str] = []
    try:
        with os.fdopen(descriptor, "wb") as file:
            for batch in batches:
                texts = []
                targets, assignments = [], []
                for index, name in enumerate(columns):
                    text, is_hex = _text_column(batch.column(index))
                    texts.append(text)
                    if is_hex:
                        targets.append(f"@eospack_{index}")
                        assignments.append(f"{quote(name)} = UNHEX(@eospack_{index})")
                    else:
                        targets.append(quote(name))
                joined = pc.binary_join_element_wise(*texts, "\t")
                file.write(_data_bytes(pc.binary_join_element_wise(joined, "\n", "")))
        if piece is not None:
            assignments.append(f"{quote(PIECE_COLUMN)} = %s")
        statement = (
            f"LOAD DATA LOCAL INFILE %s INTO TABLE {table.sql()} CHARACTER SET utf8mb4"
            f" ({', '.join(targets)})" + (f" SET {', '.join(assignments)}" if assignments else "")
        )
        cursor = connection.execute(statement, (path, *([piece] if piece is not None else [])))
        loaded = int(cursor.rowcount)
        _fail_on_warnings(connection, table)
        return loaded
    finally:
        os.unlink(path)


def _data_bytes(lines: pa.Array) -> memoryview:
    """The concatenated values of a string array (each already ends with a newline): its
    data buffer between the first and the last offset, copied by nobody."""
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
    start = int(offsets[lines.offset])
    end = int(offsets[lines.offset + len(lines)])
    return memoryview(lines.buffers()[2])[start:end]


def _fail_on_warnings(connection: MariaDBConnection, table: TableName) -> None:
    row = connection.execute("SELECT @@warning_count").fetchone()
    if row is None or not row[0]:
        return
    warnings = connection.execute("SHOW WARNINGS LIMIT 3").fetchall()
    shown = "; ".join(f"{message} (error {code})" for _, code, message in warnings)
    raise JdbcWriteError(
        f"2pc-jdbc could not write into {str(table)!r}: the server adjusted {row[0]} values"
        f" while loading them: {shown}: make the DataFrame's values fit the columns' types,"
        " or change the columns"
    )


def _insert_rows(
    connection: MariaDBConnection,
    table: TableName,
    columns: list[str],
    batches: list[pa.RecordBatch],
    batchsize: int,
    piece: str | None,
) -> int:
    """Multi-row ``INSERT ... VALUES`` of ``batchsize`` rows per statement (pymysql's
    ``executemany`` joins the rows into one statement)."""
    names = ([PIECE_COLUMN] if piece is not None else []) + columns
    marks = ", ".join("%s" for _ in names)
    statement = f"INSERT INTO {table.sql()} ({column_list(names)}) VALUES ({marks})"
    loaded = 0
    cursor = connection.raw.cursor()
    for batch in batches:
        values = [column.to_pylist() for column in batch.columns]
        prefix = [[piece] * batch.num_rows] if piece is not None else []
        records = list(zip(*prefix, *values, strict=True))
        for start in range(0, len(records), batchsize):
            try:
                loaded += int(cursor.executemany(statement, records[start : start + batchsize]))
            except pymysql.err.MySQLError as error:
                raise _refused(error, table) from error
    return loaded
