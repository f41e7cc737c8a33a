"""PostgreSQL's binary COPY format encoded straight from Arrow (``pgpq``, Rust), driven by
the target table's column types.

Why: with CSV (``pyarrow.csv`` text that the server parses again) a COPY of 1M rows of
(bigint, text, double, timestamptz) cost 0.2 s of client and 0.8-0.9 s of server CPU
here; binary COPY sends each value in its type's wire format, which the server stores
without parsing: 0.1 s and 0.45 s, 1.6-1.9x the rows per second of one connection.

Binary COPY is strict: the server reads each field with the *column's* receive function,
so an Arrow int32 sent to a ``bigint`` column would be refused (or, worse, misread). The
encoding is therefore chosen per column from the catalog (``column_types``), and each
Arrow column is first cast to the Arrow type that matches the column (losslessly, except
the narrowing Spark's JDBC writer would see, described below):

=============================  =========================================================
column type (domains: base)    Arrow columns accepted (cast first; narrowing: below)
=============================  =========================================================
bigint                         int8, int16, int32, int64; float32, float64, decimal128
integer                        int8, int16, int32; float32, float64, decimal128
smallint                       int8, int16; float32, float64, decimal128
double precision               float32 (widened exactly), float64
real                           float32, float64 (rounded once, nearest-even; see below)
boolean                        bool
numeric (any precision/scale)  decimal128 (the column's typmod rounds as for text input)
text, varchar(n), char(n)      string, large_string (varchar/char check their length)
json, jsonb                    string, large_string
bytea                          binary, large_binary
date                           date32
timestamp, timestamptz         timestamp of any unit and zone (sent as its UTC instant)
=============================  =========================================================

Dictionary-encoded columns are decoded first. **CSV stays** (``FORMAT csv``, for the
whole COPY: one COPY has one format) when any column falls outside this table: integers
into a narrower integer, into ``real``, ``double precision`` or ``numeric``; floats into
``numeric``; strings into ``numeric``, ``uuid``, ``inet``, enums or any other type parsed
from text; arrays and user-defined types. The server then parses and range-checks the
text as before; the columns that do have an encoding are cast to its Arrow type first in
CSV too, so each value is stored the same in either format.

Floats follow Spark's own JDBC writer, which binds a double as a float8 and a float as a
float4 parameter and lets PostgreSQL cast it to the column's type: a double into ``real``
is rounded once to the nearest float32 (ties to even: 1 + 2^-24 is 1, not the 1.0000001
of its shortest text parsed again) and refused like PostgreSQL's cast refuses it when it
overflows (beyond 3.4028235e38) or underflows to zero, naming the column (``to_real``);
a float or double into ``numeric`` goes as the text of PostgreSQL's float-to-numeric
cast, 6 or 15 significant digits (``numeric_text``), to which the column's typmod then
applies as it does after the cast. A float or decimal into an integer column is rounded
as PostgreSQL's casts round it (floats half to even, ``rint``; decimals half away from
zero) and refused outside the type's range (``to_integer``); sent as text, the server
refused a double 2.5 and even a decimal 2.00, both stored as 2 by Spark's writer.

Guarantees: a value is stored exactly (integers, floats bit for bit, decimals digit for
digit with their scale, timestamps to the microsecond before 1970 and up to 9999), or
narrowed to the column's type as Spark's JDBC writer narrows it (as above), or the
COPY fails; the rows go in the caller's transaction, so a failure leaves nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pgpq import ArrowToPostgresBinaryEncoder, encoders
from pgpq import schema as pg_schema

from eospack.core.errors import EospackError

EncoderFactory = Callable[[pa.Field], Any]


def _string_as(output: Callable[[], Any]) -> EncoderFactory:
    def build(field: pa.Field) -> Any:
        if pa.types.is_large_string(field.type):
            return encoders.LargeStringEncoderBuilder.new_with_output(field, output())
        return encoders.StringEncoderBuilder.new_with_output(field, output())

    return build


def _binary(field: pa.Field) -> Any:
    if pa.types.is_large_binary(field.type):
        return encoders.LargeBinaryEncoderBuilder(field)
    return encoders.BinaryEncoderBuilder(field)


def _integers(*kinds: pa.DataType) -> Callable[[pa.DataType], bool]:
    """Integer columns take these integer types, and floats and decimals (rounded)."""
    return lambda kind: (
        kind in kinds or kind in (pa.float32(), pa.float64()) or pa.types.is_decimal128(kind)
    )


_SMALL_INTEGERS = (pa.int8(), pa.int16())
_INTEGERS = (*_SMALL_INTEGERS, pa.int32())


def _is_string(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _is_binary(kind: pa.DataType) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


@dataclass(frozen=True)
class _Rule:
    accepts: Callable[[pa.DataType], bool]
    wire_type: Callable[[pa.DataType], pa.DataType]
    """The Arrow type a column is cast to before encoding (given the column's type)."""
    encoder: EncoderFactory


def _same(kind: pa.DataType) -> pa.DataType:
    return kind


def _fixed(kind: pa.DataType) -> Callable[[pa.DataType], pa.DataType]:
    return lambda _: kind


_RULES: Mapping[str, _Rule] = {
    "int8": _Rule(
        _integers(*_INTEGERS, pa.int64()), _fixed(pa.int64()), encoders.Int64EncoderBuilder
    ),
    "int4": _Rule(_integers(*_INTEGERS), _fixed(pa.int32()), encoders.Int32EncoderBuilder),
    "int2": _Rule(_integers(*_SMALL_INTEGERS), _fixed(pa.int16()), encoders.Int16EncoderBuilder),
    "float8": _Rule(
        lambda kind: kind in (pa.float32(), pa.float64()),
        _fixed(pa.float64()),
        encoders.Float64EncoderBuilder,
    ),
    "float4": _Rule(
        lambda kind: kind in (pa.float32(), pa.float64()),
        _fixed(pa.float32()),
        encoders.Float32EncoderBuilder,
    ),
    "bool": _Rule(pa.types.is_boolean, _same, encoders.BooleanEncoderBuilder),
    "numeric": _Rule(pa.types.is_decimal128, _same, encoders.Decimal128EncoderBuilder),
    "text": _Rule(_is_string, _same, _string_as(pg_schema.Text)),
    "varchar": _Rule(_is_string, _same, _string_as(pg_schema.Text)),
    "bpchar": _Rule(_is_string, _same, _string_as(pg_schema.Text)),
    "json": _Rule(_is_string, _same, _string_as(pg_schema.Text)),
    "jsonb": _Rule(_is_string, _same, _string_as(pg_schema.Jsonb)),
    "bytea": _Rule(_is_binary, _same, _binary),
    "date": _Rule(pa.types.is_date32, _same, encoders.Date32EncoderBuilder),
    "timestamp": _Rule(
        pa.types.is_timestamp,
        _fixed(pa.timestamp("us")),
        encoders.TimestampMicrosecondEncoderBuilder,
    ),
    "timestamptz": _Rule(
        pa.types.is_timestamp,
        _fixed(pa.timestamp("us")),
        encoders.TimestampMicrosecondEncoderBuilder,
    ),
}

COLUMN_TYPES_SQL = (
    "WITH RECURSIVE chain (attname, typname, typtype, typbasetype) AS ("
    " SELECT a.attname, t.typname, t.typtype, t.typbasetype"
    " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
    " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
    " UNION ALL SELECT c.attname, t.typname, t.typtype, t.typbasetype"
    " FROM chain c JOIN pg_type t ON t.oid = c.typbasetype WHERE c.typtype = 'd')"
    " SELECT attname, typname FROM chain WHERE typtype <> 'd'"
)
"""Each column's type name (``pg_type.typname``; a domain's base type, followed through
domains over domains, whose receive functions all end in the base type's before checking
their constraints). Only one level was followed before: a double into a domain over a
domain over ``real`` went as its shortest text (rounded twice), over ``numeric`` with all
its digits, and over ``integer`` was refused ('invalid input syntax')."""


def column_types(cursor: Any, table_sql: str) -> dict[str, str]:
    """Column name -> type name (``int8``, ``varchar``, ``_int4`` for an array...).

    Takes the COPY's own table lock (``ROW EXCLUSIVE``, in the caller's transaction)
    before reading the catalog: otherwise an ``ALTER ... TYPE`` committed between this
    read and the COPY (which then waits for its lock) makes the server read the values
    with the new type's receive function, and a ``bigint`` 1 sent to a column that became
    ``double precision`` is stored as 5e-324 without an error.
    """
    cursor.execute(f"LOCK TABLE {table_sql} IN ROW EXCLUSIVE MODE")
    return dict(cursor.execute(COLUMN_TYPES_SQL, (table_sql,)).fetchall())


def _decoded(kind: pa.DataType) -> pa.DataType:
    return kind.value_type if pa.types.is_dictionary(kind) else kind


_FLOATS = (pa.float32(), pa.float64())
_NUMERIC_DIGITS = {pa.float64(): 15, pa.float32(): 6}
"""Significant digits of PostgreSQL's float8 -> numeric and float4 -> numeric casts
(``DBL_DIG``, ``FLT_DIG``: ``snprintf("%.*g")`` in ``float8_numeric``/``float4_numeric``),
the casts Spark's JDBC writer meets: it binds doubles and floats as float8 and float4
parameters."""


class ValueOutOfRangeError(EospackError, ValueError):
    """A value PostgreSQL's cast to the column's type would refuse, found before the COPY
    sends it: ``column``, its ``index`` in the table being sent, PostgreSQL's wording and
    which cast (``reason``), and the ``fix``."""

    def __init__(self, column: str, index: int, reason: str, fix: str) -> None:
        super().__init__(f"column {column!r}, row {index + 1}: {reason}")
        self.column = column
        self.index = index
        self.reason = reason
        self.fix = fix


_INTEGER_RANGES = {pa.int16(): ("smallint", 2**15), pa.int32(): ("integer", 2**31)}
_INTEGER_RANGES[pa.int64()] = ("bigint", 2**63)


def to_integer(column: pa.ChunkedArray, wire_type: pa.DataType, name: str) -> pa.ChunkedArray:
    """Floats and decimals as integers the way PostgreSQL casts Spark's JDBC writer's float8,
    float4 and numeric parameters: floats rounded half to even (``rint`` in ``dtoi4``,
    ``ftoi4``...), decimals half away from zero (``numeric_int4``...); NaN, infinities and
    values outside the type's range refused with PostgreSQL's '<type> out of range'."""
    type_name, bound = _INTEGER_RANGES[wire_type]
    if pa.types.is_decimal(column.type):
        # One more integer digit before rounding (9.5 in a decimal(38,37) rounds to 10,
        # which that type cannot hold: Arrow raised instead of rounding), in decimal256.
        widened = pa.decimal256(column.type.precision + 1, column.type.scale)
        whole = pa.decimal256(40, 0)
        rounded = pc.round(column.cast(widened), 0, round_mode="half_towards_infinity")
        rounded = rounded.cast(whole)
        refused = pc.or_(
            pc.less(rounded, pa.scalar(Decimal(-bound), whole)),
            pc.greater(rounded, pa.scalar(Decimal(bound - 1), whole)),
        )
        source = "a decimal"
    else:
        rounded = pc.round(column, 0, round_mode="half_to_even")
        refused = pc.or_(
            pc.is_nan(rounded),
            pc.or_(pc.less(rounded, float(-bound)), pc.greater_equal(rounded, float(bound))),
        )
        source = "a double" if column.type == pa.float64() else "a float"
    index = pc.index(refused, True).as_py()
    if index >= 0:
        raise ValueOutOfRangeError(
            name,
            index,
            f"{type_name} out of range, as PostgreSQL's cast of {source} to {type_name}"
            " refuses it (SQLSTATE 22003)",
            "make the DataFrame's values fit the column's type, or change the column",
        )
    return rounded.cast(wire_type)


def to_real(column: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """Doubles as float32, rounded once to nearest-even, as PostgreSQL's float8 -> real
    cast does (``float8_to_float4``) for the float8 parameters of Spark's JDBC writer.

    A finite double whose float32 is infinite (beyond 3.4028235e38 after rounding) or a
    non-zero double whose float32 is zero is refused, as PostgreSQL refuses it ('value out
    of range: overflow' / 'underflow'), never stored as Infinity or 0. Sending the double's
    shortest text for the server to parse (``strtof``) would round twice instead: 1 + 2^-24
    became 1.0000001, not 1, and FLT_MAX + half an ulp became FLT_MAX, not an error.
    """
    narrowed = column.cast(pa.float32())
    overflow = pc.and_(pc.is_inf(narrowed), pc.invert(pc.is_inf(column)))
    underflow = pc.and_(pc.equal(narrowed, 0), pc.not_equal(column, 0))
    for refused, reason in ((overflow, "overflow"), (underflow, "underflow")):
        index = pc.index(refused, True).as_py()
        if index >= 0:
            raise ValueOutOfRangeError(
                name,
                index,
                f"value out of range: {reason}, as PostgreSQL's cast of a double to real"
                " refuses it (SQLSTATE 22003)",
                "cast the column to FLOAT in the query (Infinity or 0 for such values) or"
                " make the column double precision",
            )
    return narrowed


def numeric_text(column: pa.ChunkedArray) -> pa.Array:
    """Floats as the text PostgreSQL's float -> numeric casts make of them: 15 significant
    digits of a double, 6 of a float (1 + 2^-24 is 1.00000005960464; 1/3 as a float is
    0.333333), ``nan`` and ``inf`` as numeric's NaN and Infinity. The server then applies
    the column's typmod to this text, as it does to the cast's result. Formatted per value
    in Python: about 0.7 s per million values here (only floats into ``numeric`` columns,
    which the sink never creates, pay it)."""
    digits = _NUMERIC_DIGITS[column.type]
    spec = f".{digits}g"
    return pa.array(
        [None if value is None else format(value, spec) for value in column.to_pylist()],
        pa.string(),
    )


_TEXT_TYPES = ("text", "varchar", "bpchar")


def server_float_texts(cursor: Any, table: pa.Table, names: Iterable[str]) -> pa.Table:
    """The float columns ``names`` of ``table`` as the text PostgreSQL's float8 / float4 ->
    text casts make of them (what Spark's JDBC writer stores: it binds float8 / float4
    parameters, which the server casts to the text column), asked of the server in one
    query per column (``extra_float_digits`` 3, as the JDBC driver sets it). The values
    go as their exact (round-trip) text, so the server formats the same float."""
    cursor.execute("SELECT set_config('extra_float_digits', '3', true)")
    for name in names:
        column = table.column(name)
        kind = "float4" if column.type == pa.float32() else "float8"
        texts = cursor.execute(
            f"SELECT v::text FROM unnest(%s::{kind}[]) WITH ORDINALITY AS u (v, n) ORDER BY n",
            (column.to_pylist(),),
        ).fetchall()
        array = pa.array([text for (text,) in texts], pa.string())
        table = table.set_column(table.schema.get_field_index(name), name, array)
    return table


def decimal_text(column: pa.ChunkedArray) -> pa.Array:
    """Decimals as PostgreSQL's numeric -> text cast writes them: plain digits with the
    type's scale, never an exponent (Spark's JDBC writer binds a numeric parameter)."""
    return pa.array(
        [None if value is None else format(value, "f") for value in column.to_pylist()],
        pa.string(),
    )


class BinaryEncoding:
    """How one COPY's Arrow columns become binary COPY rows, or why they cannot.

    Built once per COPY from the first batch's schema; every later batch of the task has
    the same schema (Spark's Arrow handoff fixes it per query), and one that differs is
    cast to it or fails the COPY, never sent as other bytes.
    """

    def __init__(self, columns: list[str], schema: pa.Schema, types: Mapping[str, str]) -> None:
        self.columns = columns
        self.fallback_reason: str | None = None
        self.wire_types: dict[str, pa.DataType] = {}
        self.numeric_texts: set[str] = set()
        """Float columns into ``numeric``: sent (as CSV) as PostgreSQL's cast text."""
        self.float_texts: set[str] = set()
        """Float columns into text columns: sent (as CSV) as the server's own float8out /
        float4out text (``server_float_texts``), which Python's and Arrow's formatting of
        floats is not (1e-05 is 0.00001 in Arrow's CSV; 6.6357283748296464e+16 is
        PostgreSQL's text of a double whose shortest is 6.635728374829646e+16)."""
        self.decimal_texts: set[str] = set()
        """Decimal columns into text columns: sent as numeric's text (``decimal_text``),
        which Arrow's CSV writer is not (1E-37 for a decimal(38,37) 1e-37)."""
        self._builders: dict[str, Any] = {}
        for name in columns:
            kind = _decoded(schema.field(name).type)
            type_name = types.get(name, "?")
            if type_name == "numeric" and kind in _FLOATS:
                self.numeric_texts.add(name)
            if type_name in _TEXT_TYPES and kind in _FLOATS:
                self.float_texts.add(name)
            if type_name in _TEXT_TYPES and pa.types.is_decimal(kind):
                self.decimal_texts.add(name)
            rule = _RULES.get(type_name)
            if rule is None or not rule.accepts(kind):
                self.fallback_reason = self.fallback_reason or (
                    f"column {name!r} ({kind} into {type_name}) has no exact binary encoding"
                )
                continue
            field = pa.field(name, rule.wire_type(kind))
            self.wire_types[name] = field.type
            self._builders[name] = rule.encoder(field)
        self.schema = pa.schema([(name, self.wire_types[name]) for name in self.wire_types])

    @property
    def binary(self) -> bool:
        return self.fallback_reason is None

    def encode(self, tables: Iterable[pa.Table]) -> Iterator[bytes]:
        """The whole binary COPY stream (header, rows, trailer) in pieces of about one
        table each."""
        encoder = ArrowToPostgresBinaryEncoder.new_with_encoders(self.schema, self._builders)
        yield encoder.write_header()
        for table in tables:
            for batch in self.wire_batches(table):
                chunk = encoder.write_batch(batch)
                if chunk:
                    yield chunk
        yield encoder.finish()

    def wire_batches(self, table: pa.Table) -> list[pa.RecordBatch]:
        """The table's columns in COPY order, cast to the encoding's Arrow types."""
        return self.with_wire_types(table).select(self.columns).to_batches()

    def with_wire_types(self, table: pa.Table) -> pa.Table:
        """Columns with an encoding cast to its Arrow type, floats into ``numeric`` as
        PostgreSQL's cast text (``numeric_text``), the others as they are.

        The CSV path uses it too, so a value is stored the same whichever format the COPY
        has: a float32 into a ``double precision`` column goes as its exact double, not as
        the shortest text of the float32 (0.1f is 0.10000000149011612, not 0.1), and a
        double into ``real`` as its float32 rounded once (``to_real``). Raises
        ``ValueOutOfRangeError`` for a double that ``real`` cannot hold.
        """
        for index, field in enumerate(table.schema):
            wire_type = self.wire_types.get(field.name)
            numeric = field.name in self.numeric_texts
            if field.name in self.decimal_texts:
                table = table.set_column(index, field.name, decimal_text(table.column(index)))
                continue
            if wire_type is None and not numeric:
                continue
            column = table.column(index)
            if pa.types.is_dictionary(column.type):
                column = pc.cast(column, column.type.value_type)
            if numeric:
                table = table.set_column(index, field.name, numeric_text(column))
                continue
            assert wire_type is not None
            if column.type == pa.float64() and wire_type == pa.float32():
                column = to_real(column, field.name)
            elif pa.types.is_integer(wire_type) and not pa.types.is_integer(column.type):
                column = to_integer(column, wire_type, field.name)
            elif column.type != wire_type:
                column = column.cast(wire_type)
            table = table.set_column(index, pa.field(field.name, wire_type), column)
        return table
