"""Driver-side checks at query start, before any data moves, and the chosen protocol.

``plan_sink`` connects once, resolves ``protocol=auto``, creates or checks the target
table, the staging table and the ledger, and raises one clear error naming the option
at fault. Results are cached per process: Spark calls ``streamWriter`` before every
micro-batch and again for every commit, and the checks need to run once. The checks are
safe while a batch's pieces are prepared and hold their locks: with the tables in place
they only read the catalog, and any DDL waits at most ``lockTimeout`` for a lock.

``mergeSchema`` adds the DataFrame's new columns here (``_add_new_columns`` says why here
and why it is safe). Spark fixes a query's columns when it starts, so a new column comes
with a restart from the same checkpoint, and this module plans its first micro-batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .dialect import (
    PIECE_COLUMN,
    Connection,
    Dialect,
    TableName,
    check_columns,
    quote,
    stage_table,
    tombstone_table,
)
from .errors import JdbcSchemaError, JdbcSinkOptionError
from .options import JdbcSinkOptions, dialect_for

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkPlan:
    protocol: str
    """``prepared`` or ``staging`` (exactly-once), or ``direct`` (at-least-once)."""
    columns: tuple[str, ...]
    stage: TableName


ColumnTypes = dict[str, str]


@dataclass(frozen=True)
class WatchedTables:
    """The tables a kept plan depends on, and their column types when it was made (None:
    the table did not exist)."""

    tables: tuple[TableName, ...]
    types: tuple[ColumnTypes | None, ...]


_PLANS: dict[tuple[JdbcSinkOptions, str], tuple[SinkPlan, WatchedTables | None]] = {}


def plan_sink(options: JdbcSinkOptions, schema: StructType) -> SinkPlan:
    """The checked plan, computed once per process for these options and schema.

    Spark asks for the writer in the same reused planner processes at every micro-batch
    and at every start of a query in one session, so a plan is kept. A plan whose checks
    read column types is kept only while those types are the ones it was made for (one
    catalog query per table): the target's when the staging table copies them or the
    dialect refuses columns by their declared type, and the staging table's own. A restart
    after ``ALTER TABLE``, a table dropped and made again with other types, or a staging
    table altered by hand must not stage into a stale type or skip a refusal, which would
    round or turn into numbers what the target now takes.
    """
    key = (options, schema.json())
    kept = _PLANS.get(key)
    if kept is not None and _types_unchanged(options, kept[1]):
        return kept[0]
    plan, watched = _plan(options, schema)
    _PLANS[key] = (plan, watched)
    return plan


def _types_unchanged(options: JdbcSinkOptions, watched: WatchedTables | None) -> bool:
    if watched is None:
        return True
    dialect = dialect_for(options.url)
    connection = dialect.connect(options, autocommit=True)
    try:
        return _watch(dialect, connection, watched.tables) == watched
    finally:
        connection.close()


def _watch(
    dialect: Dialect, connection: Connection, tables: tuple[TableName, ...]
) -> WatchedTables:
    return WatchedTables(
        tables, tuple(_types(dialect.table_columns(connection, table)) for table in tables)
    )


def _types(columns: dict[str, tuple[str, bool]] | None) -> ColumnTypes | None:
    if columns is None:
        return None
    return {name: column_type for name, (column_type, _) in columns.items()}


def _plan(options: JdbcSinkOptions, schema: StructType) -> tuple[SinkPlan, WatchedTables | None]:
    """The plan, and the tables whose column types it depends on (see :func:`plan_sink`)."""
    check_columns(schema)
    schema = with_batch_id_column(options, schema)
    dialect = dialect_for(options.url)
    for field in schema.fields:
        dialect.column_type(field)
    columns = tuple(schema.fieldNames())
    for option, names in (
        ("upsertKeys", options.upsert_keys),
        ("versionColumn", (options.version_column,) if options.version_column else ()),
    ):
        for name in names:
            if name not in columns:
                raise JdbcSinkOptionError(
                    f"{option} names {name!r}, which is not a column of the DataFrame:"
                    f" use one of {', '.join(columns)}"
                )
    if options.write_mode == "changes":
        _check_change_columns(options, schema)
    stage = stage_table(options.table)
    connection = dialect.connect(options, autocommit=True)
    try:
        protocol = _protocol(options, dialect, connection)
        with dialect.ddl_transaction(connection, options):
            watched = _prepare_tables(options, dialect, schema, protocol, stage, connection)
    finally:
        connection.close()
    return SinkPlan(protocol, columns, stage), watched


_ORDERED_TYPES = (
    IntegralType,
    DecimalType,
    DoubleType,
    FloatType,
    StringType,
    DateType,
    TimestampType,
    TimestampNTZType,
)


def _check_change_columns(options: JdbcSinkOptions, schema: StructType) -> None:
    """``writeMode=changes``: the op column is a string column of the DataFrame, and the
    version column a type the database orders as Spark does (numbers, text, dates,
    timestamps; not booleans, binaries or nested types)."""
    assert options.op_column is not None and options.version_column is not None
    fields = {field.name: field for field in schema.fields}
    op = fields.get(options.op_column)
    if op is None:
        raise JdbcSinkOptionError(
            f"opColumn names {options.op_column!r}, which is not a column of the DataFrame:"
            f" use one of {', '.join(fields)} (or select the operation as {options.op_column!r})"
        )
    if not isinstance(op.dataType, StringType):
        raise JdbcSinkOptionError(
            f"opColumn {options.op_column!r} has type {op.dataType.simpleString()}: cast it to"
            " string (the operation values are compared as text)"
        )
    version = fields[options.version_column].dataType
    if not isinstance(version, _ORDERED_TYPES) or isinstance(version, (BooleanType, BinaryType)):
        raise JdbcSinkOptionError(
            f"versionColumn {options.version_column!r} has type {version.simpleString()},"
            " which cannot order changes: use a number, string, date or timestamp column"
            " (e.g. Debezium's source.lsn or ts_ms)"
        )


def target_schema(options: JdbcSinkOptions, schema: StructType) -> StructType:
    """The columns stored in the target: the sink's columns without the op column."""
    dropped = options.stored_columns_exclude
    if not dropped:
        return schema
    return StructType([field for field in schema.fields if field.name not in dropped])


def with_batch_id_column(options: JdbcSinkOptions, schema: StructType) -> StructType:
    """The columns the sink writes: the DataFrame's, plus ``batchIdColumn`` if set."""
    name = options.batch_id_column
    if name is None:
        return schema
    if name in schema.fieldNames():
        raise JdbcSinkOptionError(
            f"batchIdColumn {name!r} is already a column of the DataFrame: name a new column"
            " (the sink adds it and fills it with each row's micro-batch id)"
        )
    return StructType([*schema.fields, StructField(name, LongType(), nullable=False)])


def _protocol(options: JdbcSinkOptions, dialect: Dialect, connection: Connection) -> str:
    if not options.exactly_once:
        return "direct"
    if not dialect.supports_prepared_transactions or options.protocol == "staging":
        return "staging"
    if options.protocol == "auto" and not dialect.auto_uses_prepared:
        logger.info("2pc-jdbc %s: protocol=auto uses staging", options.describe())
        return "staging"
    if options.protocol == "auto" and options.write_mode == "changes":
        # Staging applies a batch's changes in one statement over all pieces: no task
        # waits on another's prepared row of the same key (a change stream's keys spread
        # over tasks unless repartitioned by key), and benchmark 14 measured it faster.
        logger.info("2pc-jdbc %s: protocol=auto uses staging for changes", options.describe())
        return "staging"
    limit = dialect.max_prepared_transactions(connection)
    if options.protocol == "prepared" and limit == 0:
        raise JdbcSinkOptionError(
            f"protocol=prepared needs max_prepared_transactions > 0 on {options.url.display()}"
            " (it is 0): set it in postgresql.conf and restart the server, or use"
            " protocol=staging"
        )
    if options.protocol != "auto":
        return options.protocol
    chosen = "prepared" if limit > 0 else "staging"
    logger.info(
        "2pc-jdbc %s: protocol=auto uses %s (max_prepared_transactions=%d)",
        options.describe(),
        chosen,
        limit,
    )
    return chosen


def _prepare_tables(
    options: JdbcSinkOptions,
    dialect: Dialect,
    schema: StructType,
    protocol: str,
    stage: TableName,
    connection: Connection,
) -> WatchedTables | None:
    """Create or check the target, staging and ledger tables; the tables whose column
    types the plan depends on (see :func:`plan_sink`)."""
    table = options.table
    staged_schema = schema
    schema = target_schema(options, schema)
    existing = dialect.table_columns(connection, table)
    if existing is None:
        if not options.create_table:
            raise JdbcSchemaError(
                f"dbtable {str(table)!r} does not exist in {options.url.display()}: create it"
                " or set createTableIfNotExists=true"
            )
        connection.execute(dialect.create_table_sql(table, schema, options.upsert_keys))
        existing = dialect.table_columns(connection, table) or {}
    if options.merge_schema:
        existing = _add_new_columns(options, dialect, schema, table, connection, existing)
    _check_table_columns(options, schema, existing)
    dialect.refuse_lossy_columns(options, schema, existing)
    _refuse_retyped_columns(options, dialect, schema, existing)
    if options.upsert_keys and frozenset(options.upsert_keys) not in dialect.unique_key_sets(
        connection, table
    ):
        keys = ", ".join(quote(key) for key in options.upsert_keys)
        raise JdbcSchemaError(
            f"upsertKeys ({', '.join(options.upsert_keys)}) match no primary key or unique index"
            f" of dbtable {str(table)!r}: create one (CREATE UNIQUE INDEX ON {table.sql()}"
            f" ({keys})) or fix upsertKeys"
        )
    staged = protocol == "staging" or options.write_mode != "append"
    if staged:
        _ensure_stage(options, dialect, staged_schema, stage, connection, existing)
    if options.write_mode == "changes":
        assert options.version_column is not None
        tombstones = tombstone_table(table)
        if dialect.table_columns(connection, tombstones) is None:
            for statement in dialect.create_tombstones_sql(
                tombstones, table, options.upsert_keys, options.version_column
            ):
                connection.execute(statement)
    if options.exactly_once and dialect.table_columns(connection, options.ledger_table) is None:
        for statement in dialect.ledger_ddl(options.ledger_table):
            connection.execute(statement)
    watched: tuple[TableName, ...] = (
        (table,)
        if dialect.refuses_columns_by_type
        or options.merge_schema
        or (staged and dialect.stage_keeps_column_types)
        else ()
    )
    if staged:
        watched += (stage,)
    return _watch(dialect, connection, watched) if watched else None


def _check_table_columns(
    options: JdbcSinkOptions, schema: StructType, existing: dict[str, tuple[str, bool]]
) -> None:
    table = str(options.table)
    missing = [name for name in schema.fieldNames() if name not in existing]
    if missing:
        raise JdbcSchemaError(
            f"dbtable {table!r} has no column {', '.join(repr(m) for m in missing)} that the"
            f" DataFrame writes (table columns: {', '.join(existing)}): add it to the table"
            " or select only the table's columns (or set mergeSchema=true to add new columns"
            " as nullable)"
        )
    required = [
        name for name, (_, needed) in existing.items() if needed and name not in schema.names
    ]
    if required:
        raise JdbcSchemaError(
            f"dbtable {table!r} column {required[0]!r} is NOT NULL without a default and the"
            " DataFrame has no such column: add it to the DataFrame or give it a default"
        )


def _add_new_columns(
    options: JdbcSinkOptions,
    dialect: Dialect,
    schema: StructType,
    table: TableName,
    connection: Connection,
    existing: dict[str, tuple[str, bool]],
) -> dict[str, tuple[str, bool]]:
    """``mergeSchema``: add the DataFrame's columns the target lacks, nullable, typed by
    the dialect's type mapping; return the target's columns after.

    Why here, in the DDL transaction at planning time, and not in the transaction that
    applies the batch: tasks write the new column before the driver commits (a prepared
    transaction COPYs into the target, a staged piece into the stage), so it must exist
    before any task runs, and Spark asks for the plan before every micro-batch, so the
    first batch of a query restarted with a new column is planned, and the column added,
    before its tasks start. Safe against a crash between this ALTER and the batch's commit:
    the column is nullable and holds no value until a batch commits, so a run that dies
    there leaves the target's rows as they were, and its restart finds the column (the
    catalog is read first and the statement is ``IF NOT EXISTS`` where the database has
    it), adds nothing and replays the batch. Two queries adding the same column are
    serialised by the DDL transaction (PostgreSQL's advisory lock, SQLite's write lock)
    and the second finds it there; if they disagree on its type, the second is refused as
    a retyped column. A column NOT NULL in the DataFrame is added nullable, as Delta Lake
    does: the rows already in the table have no value for it, and Spark's nullability is
    inferred from the query, not a constraint of the data.
    """
    new = [field for field in schema.fields if field.name not in existing]
    if not new:
        return existing
    for field in new:
        sql_type = dialect.column_type(field)
        connection.execute(dialect.add_column_sql(table, field.name, sql_type))
        logger.info(
            "2pc-jdbc %s: mergeSchema added column %s %s (nullable)",
            options.describe(),
            field.name,
            sql_type,
        )
    return dialect.table_columns(connection, table) or {}


def _refuse_retyped_columns(
    options: JdbcSinkOptions,
    dialect: Dialect,
    schema: StructType,
    existing: dict[str, tuple[str, bool]],
) -> None:
    """A DataFrame column whose type the target's existing column cannot store (a column
    retyped upstream) is refused, with or without ``mergeSchema``: 2pc-jdbc never changes
    a column's type (see ``Dialect.accepts``)."""
    for field in schema.fields:
        declared = existing[field.name][0]
        if not dialect.accepts(declared, field.dataType):
            raise JdbcSchemaError(
                f"dbtable {str(options.table)!r} column {field.name!r} is {declared}, which"
                f" cannot store the DataFrame's {field.dataType.simpleString()} (a retyped"
                f" column): cast it back in the query (e.g. col.cast(...)) or change the"
                " table's column yourself (mergeSchema only adds columns, it never retypes)"
            )


def _ensure_stage(
    options: JdbcSinkOptions,
    dialect: Dialect,
    schema: StructType,
    stage: TableName,
    connection: Connection,
    target_columns: dict[str, tuple[str, bool]],
) -> None:
    """The staging table has the DataFrame's columns with the target's current types (a
    stage left with a column's old type would round or refuse rows the target now takes):
    an empty stale stage is recreated, one holding rows is refused. With ``mergeSchema`` a
    stage made before the target gained a column gets it too (nullable, the target's
    type): rows staged before read NULL there, as they would in the target. Extra columns
    in the stage (the DataFrame lacks a nullable column of the target) are harmless: rows
    are staged and moved by column name, so they stay NULL.
    """
    wanted = {PIECE_COLUMN, *schema.fieldNames()}
    stored = [name for name in schema.fieldNames() if name not in options.stored_columns_exclude]
    existing = dialect.table_columns(connection, stage)
    if existing is not None and options.merge_schema:
        added = [name for name in stored if name not in existing]
        for name in added:
            connection.execute(dialect.add_column_sql(stage, name, target_columns[name][0]))
        if added:
            existing = dialect.table_columns(connection, stage)
    stale = existing is not None and (
        not wanted <= set(existing)
        or (
            dialect.stage_keeps_column_types
            and any(existing[name][0] != target_columns[name][0] for name in stored)
        )
    )
    if existing is not None and stale:
        if connection.execute(f"SELECT 1 FROM {stage.sql()} LIMIT 1").fetchone() is not None:
            raise JdbcSchemaError(
                f"staging table {str(stage)!r} still holds rows staged with other columns"
                " or column types: finish that query first (restart it from its checkpoint"
                " with the table as it was) or drop the staging table (it holds only rows of"
                " batches not yet decided, which their queries stage again)"
            )
        connection.execute(f"DROP TABLE {stage.sql()}")
    elif existing is not None:
        return
    for statement in dialect.create_stage_sql(stage, options.table, stored):
        connection.execute(statement)
    for name in sorted(options.stored_columns_exclude):
        connection.execute(dialect.add_text_column_sql(stage, name))
