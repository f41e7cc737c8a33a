"""SQL text for PostgreSQL and SQLite: identifier quoting, Spark -> SQL types, DDL.

Names are always quoted as identifiers, never pasted into SQL as given; a name that
cannot be quoted safely (empty, too long for PostgreSQL's 63-byte limit, control
characters, double quotes) is refused with ``JdbcIdentifierError`` instead of escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pyspark.sql import types as T

from connectors.jdbc.errors import JdbcIdentifierError, JdbcSchemaError

DialectName = Literal["postgresql", "sqlite"]

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


def column_type(dialect: DialectName, field: T.StructField) -> str:
    """The SQL type that stores a Spark column without loss; unsupported types are refused."""
    data_type = field.dataType
    postgres = dialect == "postgresql"
    simple: dict[type[T.DataType], tuple[str, str]] = {
        T.LongType: ("bigint", "INTEGER"),
        T.IntegerType: ("integer", "INTEGER"),
        T.ShortType: ("smallint", "INTEGER"),
        T.ByteType: ("smallint", "INTEGER"),
        T.BooleanType: ("boolean", "BOOLEAN"),
        T.FloatType: ("real", "REAL"),
        T.DoubleType: ("double precision", "REAL"),
        T.StringType: ("text", "TEXT"),
        T.BinaryType: ("bytea", "BLOB"),
        T.DateType: ("date", "TEXT"),
        T.TimestampType: ("timestamp with time zone", "TEXT"),
        T.TimestampNTZType: ("timestamp without time zone", "TEXT"),
    }
    for spark_type, (pg_type, sqlite_type) in simple.items():
        if isinstance(data_type, spark_type):
            return pg_type if postgres else sqlite_type
    if isinstance(data_type, T.DecimalType):
        return f"numeric({data_type.precision},{data_type.scale})" if postgres else "NUMERIC"
    raise JdbcSchemaError(
        f"column {field.name!r} has type {data_type.simpleString()}, which 2pc-jdbc cannot"
        " store: cast it to a supported type first (e.g. to_json(col) for arrays, maps, structs)"
    )


def check_columns(schema: T.StructType) -> None:
    """Refuse DataFrame columns that cannot be quoted or clash with the sink's own column."""
    for field in schema.fields:
        check_identifier(field.name, "column")
        if field.name.lower() == PIECE_COLUMN:
            raise JdbcIdentifierError(
                f"column {field.name!r} is reserved by 2pc-jdbc's staging table: rename it"
            )


def create_table_sql(
    dialect: DialectName,
    table: TableName,
    schema: T.StructType,
    primary_key: tuple[str, ...] = (),
) -> str:
    columns = [f"{quote(field.name)} {column_type(dialect, field)}" for field in schema.fields]
    if primary_key:
        columns.append(f"PRIMARY KEY ({column_list(primary_key)})")
    return f"CREATE TABLE IF NOT EXISTS {table.sql()} ({', '.join(columns)})"


def column_list(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(quote(name) for name in names)


def pieces_filter(dialect: DialectName, count: int) -> str:
    """``WHERE`` condition selecting staging rows of ``count`` pieces (see ``pieces_params``)."""
    if dialect == "postgresql":
        return f"{quote(PIECE_COLUMN)} = ANY(%s)"
    return f"{quote(PIECE_COLUMN)} IN ({', '.join('?' for _ in range(count))})"


def pieces_params(dialect: DialectName, pieces: list[str]) -> list[object]:
    return [pieces] if dialect == "postgresql" else list(pieces)


def move_from_stage_sql(
    dialect: DialectName,
    target: TableName,
    stage: TableName,
    columns: list[str],
    upsert_keys: tuple[str, ...],
    version_column: str | None,
    piece_count: int,
) -> str:
    """Append or upsert the staged rows of some pieces into the target.

    Upsert keeps, per key, the row with the highest version (PostgreSQL cannot touch a
    row twice in one statement) and replaces a stored row only if its version is lower
    (or NULL), so a stored value never moves backwards. Rows are taken in key order, so
    concurrent upserts lock rows in the same order.
    """
    selected = column_list(columns)
    where = pieces_filter(dialect, piece_count)
    if not upsert_keys:
        return (
            f"INSERT INTO {target.sql()} ({selected})"
            f" SELECT {selected} FROM {stage.sql()} WHERE {where}"
        )
    keys = column_list(upsert_keys)
    if dialect == "postgresql":
        order = keys + (f", {quote(version_column)} DESC NULLS LAST" if version_column else "")
        source = (
            f"SELECT DISTINCT ON ({keys}) {selected} FROM {stage.sql()}"
            f" WHERE {where} ORDER BY {order}"
        )
    else:
        order = quote(version_column) if version_column else "rowid"
        source = f"SELECT {selected} FROM {stage.sql()} WHERE {where} ORDER BY {order}"
    updated = [name for name in columns if name not in upsert_keys]
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
        f" ON CONFLICT ({keys}) {action}"
    )


def delete_from_stage_sql(dialect: DialectName, stage: TableName, piece_count: int) -> str:
    return f"DELETE FROM {stage.sql()} WHERE {pieces_filter(dialect, piece_count)}"


def stage_table(target: TableName) -> TableName:
    """The staging table of a target: same schema, name derived from the target's."""
    import hashlib

    digest = hashlib.sha256(str(target).encode()).hexdigest()[:8]
    return target.sibling(f"{target.name[:30]}_eospack_stage_{digest}")
