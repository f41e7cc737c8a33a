"""What 2pc-jdbc needs of a database, as one interface (``Dialect``), and the SQL text
both databases share: identifier quoting, table names, the staging table's name.

``Dialect`` is the sink's only view of a database, in the manner of Flink's
``JdbcDialect``: planning, the task writer and the driver's resource ask it how to
connect, quote parameters, read the catalog, create tables, write rows and move staged
rows, and never compare database names. ``PostgresDialect`` (``postgres.py``),
``SqliteDialect`` (``sqlite.py``) and ``MariaDBDialect`` (``mariadb.py``) implement it;
``options.dialect_for`` picks one from the parsed URL.

Names are always quoted as identifiers, never pasted into SQL as given; a name that
cannot be quoted safely (empty, too long for PostgreSQL's 63-byte limit, control
characters, double quotes) is refused with ``JdbcIdentifierError`` instead of escaped.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
from pyspark.sql import types as T

from .errors import JdbcIdentifierError, JdbcSchemaError, JdbcWriteError

if TYPE_CHECKING:
    from .options import DatabaseUrl, JdbcSinkOptions
    from .planning import SinkPlan

DialectName = Literal["postgresql", "sqlite", "mariadb"]
Connection = Any
"""A ``psycopg.Connection``, a ``sqlite3.Connection`` or a ``mariadb.MariaDBConnection``:
only its dialect uses it beyond ``execute``, ``commit`` and ``close``."""

MAX_IDENTIFIER_BYTES = 63
PIECE_COLUMN = "eospack_piece"
"""The staging table's column naming the piece (transaction id) a row belongs to."""


def check_identifier(name: str, what: str) -> str:
    """Return ``name`` if it can be quoted safely, else raise naming ``what`` and the fix."""
    problem = None
    if not name or name != name.strip():
        problem = "is empty or has surrounding spaces"
    elif len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        problem = f"is longer than {MAX_IDENTIFIER_BYTES} bytes"
    elif '"' in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        problem = "contains a double quote or a control character"
    if problem:
        raise JdbcIdentifierError(
            f"{what} {name[:80]!r} {problem}, so it cannot be quoted safely as an SQL"
            " identifier: rename it (letters, digits, underscores)"
        )
    return name


def quote(name: str) -> str:
    """A checked name as a double-quoted identifier (same syntax in PostgreSQL and SQLite)."""
    check_identifier(name, "identifier")
    return f'"{name}"'


@dataclass(frozen=True)
class TableName:
    """A table, optionally schema-qualified; names are case-sensitive (always quoted)."""

    schema: str | None
    name: str

    @classmethod
    def parse(cls, value: str, option: str) -> TableName:
        parts = value.split(".")
        if len(parts) > 2:
            raise JdbcIdentifierError(
                f"{option} {value!r} has more than one dot: use <table> or <schema>.<table>"
            )
        for part in parts:
            check_identifier(part, f"{option} part")
        return cls(parts[0], parts[1]) if len(parts) == 2 else cls(None, parts[0])

    def sql(self) -> str:
        return f"{quote(self.schema)}.{quote(self.name)}" if self.schema else quote(self.name)

    def sibling(self, name: str) -> TableName:
        """Another table in the same schema (the staging table of a target)."""
        return TableName(self.schema, name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


def check_columns(schema: T.StructType) -> None:
    """Refuse DataFrame columns that cannot be quoted or clash with the sink's own column."""
    for field in schema.fields:
        check_identifier(field.name, "column")
        if field.name.lower() == PIECE_COLUMN:
            raise JdbcIdentifierError(
                f"column {field.name!r} is reserved by 2pc-jdbc's staging table: rename it"
            )


def column_list(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(quote(name) for name in names)


def stage_table(target: TableName) -> TableName:
    """The staging table of a target: same schema, name derived from the target's."""
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:8]
    return target.sibling(f"{target.name[:30]}_eospack_stage_{digest}")


def tombstone_table(target: TableName) -> TableName:
    """``writeMode=changes``: the table of deleted keys and their delete's version, so an
    older insert or update of a deleted key arriving in a later batch stays ignored."""
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:8]
    return target.sibling(f"{target.name[:30]}_eospack_tomb_{digest}")


CHANGE_UPSERT = "u"
CHANGE_DELETE = "d"
"""What a task stages in the op column of ``writeMode=changes``: the user's operation
values (``insertOps``, ``updateOps``, ``deleteOps``) mapped to these two, since an insert
and an update are applied alike (an upsert)."""


class Dialect(ABC):
    """One database as 2pc-jdbc uses it: what differs between PostgreSQL and SQLite.

    Why: the sink's protocol (ledger, pieces, staging, recovery) is the same for every
    database; only connections, catalog queries, DDL, bulk writes and prepared
    transactions differ. Callers hold a ``Dialect`` and never test which database it is.

    Guarantees: an implementation is stateless (``options.dialect_for`` hands out one
    shared instance per database); every SQL text it returns quotes names with ``quote``
    and takes parameters with ``placeholder``; the shared builders below produce the same
    statement shape for every database, differing only where a hook says so.
    """

    name: ClassVar[DialectName]
    placeholder: ClassVar[str]
    """How a statement marks a parameter (``%s`` or ``?``)."""
    operational_error: ClassVar[type[Exception]]
    """What the driver raises when the connection is lost (the fault rig raises it too)."""
    lock_clause: ClassVar[str] = ""
    """Appended to a ledger ``SELECT`` to lock the slot row (``FOR UPDATE`` where rows
    can be locked; SQLite locks the whole database for a write transaction instead)."""
    orphans_can_block_commit: ClassVar[bool] = False
    """Whether an orphaned piece can hold row locks that a commit would wait on."""
    supports_changes: ClassVar[bool] = False
    """Whether ``writeMode=changes`` runs here: set by a dialect whose ``upsert_sql`` and
    change hooks (``latest_changes_sql`` ... ``create_tombstones_sql``) speak its SQL;
    others refuse the mode at option parsing, in one line."""
    supports_prepared_transactions: ClassVar[bool] = False
    """Whether pieces can be prepared transactions (``protocol=prepared``)."""
    auto_uses_prepared: ClassVar[bool] = True
    """Whether ``protocol=auto`` picks ``prepared`` when the server allows it."""
    stage_keeps_column_types: ClassVar[bool] = False
    """Whether ``create_stage_sql`` copies the target's declared types (with their
    lengths and scales), so a stage made before an ALTER of the target is stale."""
    refuses_columns_by_type: ClassVar[bool] = False
    """Whether ``refuse_lossy_columns`` reads the target's declared types, so a kept plan
    holds only while they are unchanged (a table dropped and made again with other types)."""
    column_types: ClassVar[Mapping[type[T.DataType], str]]
    """Spark type -> SQL type, checked in order (decimals: ``decimal_type``)."""

    # Connections and transactions ------------------------------------------------------

    @abstractmethod
    def display_url(self, url: DatabaseUrl) -> str:
        """The URL for logs and errors (never a credential)."""

    prepared_leftovers: ClassVar[str] = "prepared transactions"
    """What ``locked_tables_error`` calls a crashed run's prepared pieces here."""
    manual_rollback: ClassVar[str] = ""
    """The statement that rolls one back by hand, for ``locked_tables_error``."""

    def locked_tables_error(self, options: JdbcSinkOptions, connection: Connection) -> Exception:
        """Query-start DDL waited ``lockTimeout`` for a table lock: one line naming the
        sink's prepared pieces (a crashed run's hold their locks for ever) and the fixes."""
        gids = self.prepared_gids(connection, "eospack-")
        shown = ", ".join(gids[:3]) + (f" and {len(gids) - 3} more" if len(gids) > 3 else "")
        return JdbcWriteError(
            f"2pc-jdbc could not prepare the tables of {options.describe()} at query start: one"
            f" is locked by another session for over {options.lock_timeout_ms}ms (lockTimeout)"
            + (f" ({self.prepared_leftovers} of eospack sinks: {shown})" if gids else "")
            + ": restart the query with the columns it had before, so that its recovery"
            f" finishes what a crashed run left, or roll them back by hand ({self.manual_rollback})"
        )

    @abstractmethod
    def default_schema(self, url: DatabaseUrl) -> str:
        """The schema an unqualified table name of a new table lands in: ``dbtable`` with
        it and without it name one table (``JdbcSinkOptions.target``)."""

    @abstractmethod
    def connect(self, options: JdbcSinkOptions, *, autocommit: bool) -> Connection:
        """Open a connection or raise ``JdbcConnectionError`` naming the database and fix.

        ``autocommit=False`` lets statements open a transaction implicitly where the driver
        does so (psycopg); transactions the sink relies on are begun with ``transaction``.
        """

    @abstractmethod
    def transaction(self, connection: Connection) -> AbstractContextManager[object]:
        """A transaction: committed when the block ends, rolled back if it raises."""

    def ddl_transaction(
        self, connection: Connection, options: JdbcSinkOptions
    ) -> AbstractContextManager[object]:
        """The transaction that checks and creates the sink's tables at query start."""
        return self.transaction(connection)

    @abstractmethod
    def limit_lock_wait(self, connection: Connection, lock_timeout_ms: int) -> None:
        """Inside a task's transaction: wait at most ``lockTimeout`` for a row lock."""

    # Catalog -----------------------------------------------------------------------------

    @abstractmethod
    def table_columns(
        self, connection: Connection, table: TableName
    ) -> dict[str, tuple[str, bool]] | None:
        """Column name -> (type, required: NOT NULL without default); None if no such table."""

    @abstractmethod
    def unique_key_sets(self, connection: Connection, table: TableName) -> list[frozenset[str]]:
        """The column sets of the table's primary key and unique indexes (ON CONFLICT
        targets)."""

    # DDL ---------------------------------------------------------------------------------

    def column_type(self, field: T.StructField) -> str:
        """The SQL type that stores a Spark column without loss; unsupported types are
        refused."""
        data_type = field.dataType
        for spark_type, sql_type in self.column_types.items():
            if isinstance(data_type, spark_type):
                return sql_type
        if isinstance(data_type, T.DecimalType):
            return self.decimal_type(data_type)
        raise JdbcSchemaError(
            f"column {field.name!r} has type {data_type.simpleString()}, which 2pc-jdbc cannot"
            " store: cast it to a supported type first (e.g. to_json(col) for arrays, maps,"
            " structs)"
        )

    @abstractmethod
    def decimal_type(self, data_type: T.DecimalType) -> str: ...

    def refuse_lossy_columns(  # noqa: B027 - optional hook
        self,
        options: JdbcSinkOptions,
        schema: T.StructType,
        existing: Mapping[str, tuple[str, bool]],
    ) -> None:
        """Refuse, at query start, columns this database would store or compare other than
        the DataFrame holds them (none by default)."""

    def accepts(self, declared: str, data_type: T.DataType) -> bool:
        """Whether a column declared ``declared`` stores a DataFrame column of ``data_type``
        (else: a retyped column, refused at query start with or without ``mergeSchema``).

        By the declared type's family, from its name before any ``(`` (PostgreSQL's
        ``format_type`` and the usual MariaDB/MySQL names). Values take the column's own
        rules, as in Spark's JDBC writer (docs, Limits), so a string goes into any column:
        the database parses it, and a value it cannot parse fails the task naming the
        column and row, nothing committed. Other types are refused where no value of
        theirs could be stored, or only mangled: numbers take every Spark number
        (narrowing as Spark's JDBC writer narrows, see ``binary_copy``); text takes
        everything but binary (it would become hex text); ``bytea``/blobs take binary;
        dates and timestamps take dates and timestamps (a timestamp into a date keeps its
        UTC day); booleans take booleans (``tinyint(1)``, MariaDB's BOOLEAN, numbers too).
        A declared type of no known family (arrays, json, uuid, enums, domains) accepts
        anything: the database refuses, naming the column, what it cannot store.
        """
        family = _FAMILIES.get(declared.strip().lower())
        if family is None:
            family = _FAMILIES.get(declared.split("(")[0].strip().lower())
        if family is None:
            return True
        return _spark_family(data_type) in _ACCEPTED[family]

    def add_column_sql(self, table: TableName, name: str, sql_type: str) -> str:
        """``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``, nullable, without a default (for
        ``mergeSchema``): existing rows read NULL there, and on PostgreSQL it is a catalog
        change only (no table rewrite). Idempotent, so a crash between the ALTER and the
        batch's commit, or two queries adding the same column, leave one column.

        Run inside ``ddl_transaction``. PostgreSQL: transactional, serialised across
        queries by the sink's advisory lock, and it waits at most ``lockTimeout`` for the
        table lock. A database whose DDL commits implicitly (MariaDB, which has ``ADD COLUMN
        IF NOT EXISTS`` too) commits the ALTER on its own: still safe, because the column
        is nullable and empty, so committing it early or twice changes no row. A database
        without ``IF NOT EXISTS`` (SQLite) overrides this, and ``planning`` adds a column
        only after reading the catalog in the same transaction.
        """
        return f"ALTER TABLE {table.sql()} ADD COLUMN IF NOT EXISTS {quote(name)} {sql_type}"

    def create_table_sql(
        self, table: TableName, schema: T.StructType, primary_key: tuple[str, ...] = ()
    ) -> str:
        columns = [f"{quote(field.name)} {self.column_type(field)}" for field in schema.fields]
        if primary_key:
            columns.append(f"PRIMARY KEY ({column_list(primary_key)})")
        return f"CREATE TABLE IF NOT EXISTS {table.sql()} ({', '.join(columns)})"

    @abstractmethod
    def create_stage_sql(
        self, stage: TableName, target: TableName, columns: list[str]
    ) -> list[str]:
        """The staging table: the target's column types plus the piece column."""

    @abstractmethod
    def ledger_ddl(self, ledger: TableName) -> list[str]:
        """The ledger table and its partial index on unfinished decisions."""

    def insert_slot(
        self, connection: Connection, ledger: TableName, values: tuple[Any, ...]
    ) -> bool:
        """Insert a ledger row (sink_id, batch_id, target, protocol, rows, status, pieces)
        unless its slot exists; True when inserted."""
        mark = self.placeholder
        row = connection.execute(
            f"INSERT INTO {ledger.sql()}"
            ' (sink_id, batch_id, target, protocol, "rows", status, pieces)'
            f" VALUES ({', '.join(mark for _ in values)})"
            " ON CONFLICT (sink_id, batch_id) DO NOTHING RETURNING batch_id",
            values,
        ).fetchone()
        return row is not None

    # Rows --------------------------------------------------------------------------------

    @abstractmethod
    def write_rows(
        self,
        connection: Connection,
        table: TableName,
        columns: list[str],
        batches: Iterable[pa.RecordBatch],
        batchsize: int,
        piece: str | None = None,
    ) -> int:
        """Write the rows into ``table`` in the open transaction (tagged with ``piece``,
        for the staging table); return the row count."""

    def pieces_filter(self, count: int) -> str:
        """``WHERE`` condition selecting staging rows of ``count`` pieces (see
        ``pieces_params``): one parameter per piece by default."""
        return f"{quote(PIECE_COLUMN)} IN ({', '.join(self.placeholder for _ in range(count))})"

    def pieces_params(self, pieces: list[str]) -> list[object]:
        return list(pieces)

    @abstractmethod
    def upsert_source(
        self,
        stage: TableName,
        columns: list[str],
        upsert_keys: tuple[str, ...],
        version_column: str | None,
        where: str,
    ) -> str:
        """The ``SELECT`` of the staged rows an upsert inserts (``where`` picks the pieces)."""

    def move_from_stage_sql(
        self,
        target: TableName,
        stage: TableName,
        columns: list[str],
        upsert_keys: tuple[str, ...],
        version_column: str | None,
        piece_count: int,
    ) -> str:
        """Append or upsert the staged rows of some pieces into the target.

        Upsert replaces a stored row only if its version is lower (or NULL), so a stored
        value never moves backwards.
        """
        selected = column_list(columns)
        where = self.pieces_filter(piece_count)
        if not upsert_keys:
            return (
                f"INSERT INTO {target.sql()} ({selected})"
                f" SELECT {selected} FROM {stage.sql()} WHERE {where}"
            )
        source = self.upsert_source(stage, columns, upsert_keys, version_column, where)
        return self.upsert_sql(target, columns, upsert_keys, version_column, source)

    def upsert_sql(
        self,
        target: TableName,
        columns: list[str],
        keys: tuple[str, ...],
        version_column: str | None,
        source: str,
    ) -> str:
        """Insert the rows of ``source`` (a ``SELECT`` of ``columns`` with at most one row
        per key) into ``target``; a row whose ``keys`` exist replaces the stored one, and
        with ``version_column`` only if the stored version is lower or NULL.

        The one statement every upsert of the sink goes through (``writeMode=upsert``, the
        upserts and tombstones of ``writeMode=changes``): a database without
        ``INSERT ... ON CONFLICT`` (MariaDB: ``ON DUPLICATE KEY UPDATE``) overrides this.
        """
        selected = column_list(columns)
        updated = [name for name in columns if name not in keys]
        if not updated:
            action = "DO NOTHING"
        else:
            action = "DO UPDATE SET " + ", ".join(
                f"{quote(name)} = excluded.{quote(name)}" for name in updated
            )
            if version_column:
                stored = f"eospack_target.{quote(version_column)}"
                action += f" WHERE {stored} IS NULL OR {stored} < excluded.{quote(version_column)}"
        return (
            f"INSERT INTO {target.sql()} AS eospack_target ({selected}) {source}"
            f" ON CONFLICT ({column_list(keys)}) {action}"
        )

    # Change streams (writeMode=changes) --------------------------------------------------
    #
    # The staged rows of some pieces hold changes: the target's columns plus the op column
    # (CHANGE_UPSERT or CHANGE_DELETE). ``apply_changes_sql`` turns them into statements
    # run in order in one transaction; each statement uses ``latest_changes_sql`` once, so
    # ``pieces_params`` is their parameter list. A database overrides the hooks whose SQL
    # it does not speak; the order and meaning of the steps stay here.

    def latest_changes_sql(
        self,
        stage: TableName,
        columns: list[str],
        keys: tuple[str, ...],
        version_column: str,
        op_column: str,
        where: str,
    ) -> str:
        """A ``SELECT`` of ``columns`` (which include ``op_column``): per key, the staged
        change of the selected pieces with the highest version. On a tie a delete wins
        (``CHANGE_DELETE`` sorts before ``CHANGE_UPSERT``); between tied upserts the pick
        is arbitrary (versions should be unique per key, as an LSN is).

        Window functions: PostgreSQL, SQLite >= 3.25, MariaDB >= 10.2.
        """
        selected = column_list(columns)
        return (
            f"SELECT {selected} FROM (SELECT {selected}, ROW_NUMBER() OVER (PARTITION BY"
            f" {column_list(keys)} ORDER BY {quote(version_column)} DESC, {quote(op_column)} ASC)"
            f" AS eospack_rank FROM {stage.sql()} WHERE {where}) eospack_ranked"
            " WHERE eospack_rank = 1"
        )

    def keys_match(self, keys: tuple[str, ...], left: str, right: str) -> str:
        return " AND ".join(f"{left}.{quote(key)} = {right}.{quote(key)}" for key in keys)

    def delete_rows_sql(
        self, target: TableName, keys: tuple[str, ...], version_column: str, latest: str, op: str
    ) -> str:
        """Delete the stored rows that a winning delete is newer than (stored version
        lower or NULL). ``latest`` is ``latest_changes_sql``; ``op`` the quoted op column.
        Row-value ``IN``: PostgreSQL, SQLite >= 3.15, MariaDB."""
        version = quote(version_column)
        return (
            f"DELETE FROM {target.sql()} WHERE ({column_list(keys)}) IN (SELECT"
            f" {', '.join(f'eospack_t.{quote(k)}' for k in keys)} FROM {target.sql()} eospack_t"
            f" JOIN ({latest}) eospack_w ON {self.keys_match(keys, 'eospack_t', 'eospack_w')}"
            f" WHERE eospack_w.{op} = '{CHANGE_DELETE}' AND (eospack_t.{version} IS NULL OR"
            f" eospack_t.{version} < eospack_w.{version}))"
        )

    def record_tombstones_sql(
        self,
        target: TableName,
        tombstones: TableName,
        keys: tuple[str, ...],
        version_column: str,
        latest: str,
        op: str,
    ) -> str:
        """After ``delete_rows_sql``: remember each winning delete that no stored row
        outranks (a stored version >= the delete's means the delete is stale), keeping the
        highest delete version per key."""
        version = quote(version_column)
        columns = [*keys, version_column]
        source = (
            f"SELECT {', '.join(f'eospack_w.{quote(c)}' for c in columns)} FROM ({latest})"
            f" eospack_w WHERE eospack_w.{op} = '{CHANGE_DELETE}' AND NOT EXISTS (SELECT 1"
            f" FROM {target.sql()} eospack_t WHERE"
            f" {self.keys_match(keys, 'eospack_t', 'eospack_w')}"
            f" AND eospack_t.{version} >= eospack_w.{version})"
        )
        return self.upsert_sql(tombstones, columns, keys, version_column, source)

    def upsert_changes_sql(
        self,
        target: TableName,
        tombstones: TableName,
        columns: list[str],
        keys: tuple[str, ...],
        version_column: str,
        latest: str,
        op: str,
    ) -> str:
        """Upsert each winning insert or update that no tombstone outranks (a tombstone
        version >= the change's: the key was deleted later); a stored row with a version
        >= the change's stays (``upsert_sql``). ``columns`` are the target's."""
        version = quote(version_column)
        source = (
            f"SELECT {', '.join(f'eospack_w.{quote(c)}' for c in columns)} FROM ({latest})"
            f" eospack_w WHERE eospack_w.{op} = '{CHANGE_UPSERT}' AND NOT EXISTS (SELECT 1"
            f" FROM {tombstones.sql()} eospack_b WHERE"
            f" {self.keys_match(keys, 'eospack_b', 'eospack_w')}"
            f" AND eospack_b.{version} >= eospack_w.{version})"
            f" ORDER BY {', '.join(f'eospack_w.{quote(k)}' for k in keys)}"
        )
        return self.upsert_sql(target, columns, keys, version_column, source)

    def drop_tombstones_sql(
        self,
        tombstones: TableName,
        keys: tuple[str, ...],
        version_column: str,
        latest: str,
        op: str,
    ) -> str:
        """Forget the tombstones that a newer winning insert or update outranks: the
        stored row's version now guards the key."""
        version = quote(version_column)
        return (
            f"DELETE FROM {tombstones.sql()} WHERE ({column_list(keys)}) IN (SELECT"
            f" {', '.join(f'eospack_b.{quote(k)}' for k in keys)} FROM {tombstones.sql()}"
            f" eospack_b JOIN ({latest}) eospack_w ON"
            f" {self.keys_match(keys, 'eospack_b', 'eospack_w')}"
            f" WHERE eospack_w.{op} = '{CHANGE_UPSERT}' AND eospack_b.{version} <"
            f" eospack_w.{version})"
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
        """The statements, in order, that apply the staged changes of ``piece_count``
        pieces (``columns``: the staged ones, op column included): delete outranked rows,
        record tombstones, upsert, forget outranked tombstones. Each takes
        ``pieces_params`` once. Guarantees: per key only the newest change of the pieces
        counts, and it changes the target only if it is newer than both the stored row's
        version and the key's tombstone, so replays and late, older changes are no-ops.
        """
        op = quote(op_column)
        latest = self.latest_changes_sql(
            stage, columns, keys, version_column, op_column, self.pieces_filter(piece_count)
        )
        stored = [name for name in columns if name != op_column]
        return [
            self.delete_rows_sql(target, keys, version_column, latest, op),
            self.record_tombstones_sql(target, tombstones, keys, version_column, latest, op),
            self.upsert_changes_sql(target, tombstones, stored, keys, version_column, latest, op),
            self.drop_tombstones_sql(tombstones, keys, version_column, latest, op),
        ]

    def create_tombstones_sql(
        self, tombstones: TableName, target: TableName, keys: tuple[str, ...], version_column: str
    ) -> list[str]:
        """The tombstone table: the target's key and version columns with their types,
        unique on the keys. Logged (unlike the stage): it outlives batches."""
        index = quote(f"{tombstones.name[:48]}_key")
        return [
            f"CREATE TABLE IF NOT EXISTS {tombstones.sql()} AS SELECT"
            f" {column_list([*keys, version_column])} FROM {target.sql()} WHERE 1 = 0",
            f"CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {tombstones.sql()}"
            f" ({column_list(keys)})",
        ]

    def add_text_column_sql(self, table: TableName, column: str) -> str:
        """A nullable text column added to the stage (the op column of ``changes``)."""
        return f"ALTER TABLE {table.sql()} ADD COLUMN {quote(column)} TEXT"

    def delete_from_stage_sql(self, stage: TableName, piece_count: int) -> str:
        return f"DELETE FROM {stage.sql()} WHERE {self.pieces_filter(piece_count)}"

    def move_from_stage(
        self, connection: Connection, options: JdbcSinkOptions, plan: SinkPlan, pieces: list[str]
    ) -> int:
        """In the open transaction: move the pieces' staged rows into the target and delete
        them; return the rows deleted."""
        params = self.pieces_params(pieces)
        if options.write_mode == "changes":
            assert options.op_column is not None and options.version_column is not None
            for statement in self.apply_changes_sql(
                options.table,
                plan.stage,
                tombstone_table(options.table),
                list(plan.columns),
                options.upsert_keys,
                options.version_column,
                options.op_column,
                len(pieces),
            ):
                connection.execute(statement, params)
            cursor = connection.execute(self.delete_from_stage_sql(plan.stage, len(pieces)), params)
            return int(cursor.rowcount)
        move = self.move_from_stage_sql(
            options.table,
            plan.stage,
            list(plan.columns),
            options.upsert_keys,
            options.version_column,
            len(pieces),
        )
        connection.execute(move, params)
        cursor = connection.execute(self.delete_from_stage_sql(plan.stage, len(pieces)), params)
        return int(cursor.rowcount)

    @abstractmethod
    def vacuum_stage(self, connection: Connection, stage: TableName) -> None:
        """Housekeeping after a move of staged rows; never fails."""

    # Prepared transactions (protocol=prepared) ---------------------------------------------

    def max_prepared_transactions(self, connection: Connection) -> int:
        """How many prepared transactions the server allows at once (0: none)."""
        return 0

    def prepared_gids(self, connection: Connection, prefix: str) -> list[str]:
        """The gids of this database's prepared transactions that start with ``prefix``."""
        return []

    def leave_autocommit(self, connection: Connection) -> None:
        """Before ``begin_prepared`` on a connection opened with ``autocommit=True`` (a
        two-phase transaction needs a connection that does not commit by itself)."""
        connection.autocommit = False

    def begin_prepared(self, connection: Connection, gid: str) -> None:
        """Begin the two-phase transaction ``gid`` on a connection without autocommit."""
        raise self._no_prepared_transactions()

    def prepare(self, connection: Connection) -> None:
        """``PREPARE TRANSACTION``: durable, holding its locks, until finished."""
        raise self._no_prepared_transactions()

    def current_transaction_id(self, connection: Connection) -> str:
        """The running transaction's id, recorded with a prepared piece."""
        raise self._no_prepared_transactions()

    def finish_prepared(
        self, connection: Connection, gid: str, verb: str, *, wait_if_busy: bool = True
    ) -> bool:
        """``COMMIT``/``ROLLBACK PREPARED``; False when the gid is gone."""
        raise self._no_prepared_transactions()

    def transaction_status(self, connection: Connection, xid: str) -> str | None:
        """What became of a transaction id: committed, aborted, in progress or None."""
        raise self._no_prepared_transactions()

    def _no_prepared_transactions(self) -> JdbcWriteError:
        return JdbcWriteError(
            f"2pc-jdbc found a prepared transaction to finish in {self.name}, which has none"
        )


_NUMBER = "number"
_TEXT = "text"
_FAMILIES: dict[str, str] = {
    **dict.fromkeys(
        (
            "smallint",
            "integer",
            "int",
            "bigint",
            "tinyint",
            "mediumint",
            "numeric",
            "decimal",
            "real",
            "double precision",
            "double",
            "float",
        ),
        _NUMBER,
    ),
    **dict.fromkeys(
        (
            "text",
            "character varying",
            "character",
            "varchar",
            "char",
            "tinytext",
            "mediumtext",
            "longtext",
        ),
        _TEXT,
    ),
    **dict.fromkeys(
        ("bytea", "blob", "tinyblob", "mediumblob", "longblob", "binary", "varbinary"), "bytes"
    ),
    "date": "date",
    **dict.fromkeys(
        (
            "timestamp",
            "timestamp with time zone",
            "timestamp without time zone",
            "timestamptz",
            "datetime",
        ),
        "timestamp",
    ),
    "boolean": "boolean",
    "bool": "boolean",
    "tinyint(1)": "tinyint(1)",  # MariaDB's and MySQL's BOOLEAN, also a small number
}
"""Declared type (lower case, whole or before ``(``) -> family (see ``Dialect.accepts``)."""

_ACCEPTED: dict[str, frozenset[str]] = {
    _NUMBER: frozenset({"string", _NUMBER}),
    _TEXT: frozenset({"string", _NUMBER, "boolean", "date", "timestamp"}),
    "bytes": frozenset({"string", "binary"}),
    "date": frozenset({"string", "date", "timestamp"}),
    "timestamp": frozenset({"string", "date", "timestamp"}),
    "boolean": frozenset({"string", "boolean"}),
    "tinyint(1)": frozenset({"string", "boolean", _NUMBER}),
}


def _spark_family(data_type: T.DataType) -> str:
    if isinstance(data_type, T.BooleanType):
        return "boolean"
    if isinstance(data_type, T.NumericType):
        return _NUMBER
    if isinstance(data_type, T.StringType):
        return "string"
    if isinstance(data_type, T.BinaryType):
        return "binary"
    if isinstance(data_type, T.DateType):
        return "date"
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        return "timestamp"
    return data_type.typeName()
