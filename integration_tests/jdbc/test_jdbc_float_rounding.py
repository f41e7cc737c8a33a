"""2pc-jdbc stores a Spark ``float`` or ``double`` in a PostgreSQL ``real``, ``double
precision``, ``numeric`` or ``numeric(p,s)`` column exactly as Spark's own JDBC writer
does (the oracle: the PostgreSQL JDBC driver binds ``setDouble``/``setFloat`` as float8 /
float4 parameters, and the server casts them to the column's type), on both COPY paths:
binary COPY and the CSV fallback.

Each case writes the same rows through the sink and, with ``DataFrame.write.jdbc``, into
an identical twin table, and compares the stored values exactly: ``real`` and ``double
precision`` as their bits (``float4send``/``float8send``), ``numeric`` as its text. The
values are exact float32 midpoints (1 + 2^-24 must round to even, not be rounded twice
through its shortest decimal text), ties of PostgreSQL's float-to-numeric text (15
significant digits for a double, 6 for a float), signed zeros, NaN, infinities,
denormals and random doubles (seeded; the seed is printed, ``EOSPACK_FLOAT_SEED``
replays it). A value a column refuses (a double beyond ``real``'s range or rounding to
zero in it, an infinity or 11 integer digits into ``numeric(20,10)``) is refused by
Spark's writer, and by the sink with one line naming the column, storing nothing.
"""

from __future__ import annotations

import decimal
import math
import random
import re
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.connectors.jdbc.binary_copy import BinaryEncoding, column_types
from eospack.connectors.jdbc.dialect import TableName
from eospack.connectors.jdbc.errors import JdbcWriteError
from eospack.connectors.jdbc.postgres import copy_batches
from integration_tests.jdbc.jdbc_oracle_parts import (
    oracle_properties,
    seed_from_environment,
    sink_options,
    spark_jdbc_writer,
)
from integration_tests.jdbc_fixtures import pg_leftovers, run_file_query

pytestmark = pytest.mark.integration

FLT_MAX = float(np.finfo(np.float32).max)

FIXED_VALUES = [
    1 + 2**-24,  # an exact float32 midpoint: round to even gives 1.0, shortest text 1.0000001
    1 + 3 * 2**-24,  # a midpoint rounding up to even
    -(1 + 2**-24),
    2.0**24 + 1,  # 16777217: a midpoint between floats 16777216 and 16777218
    0.1,
    1 / 3,
    0.0,
    -0.0,
    math.nan,
    math.inf,
    -math.inf,
    1e-45,
    1.4e-45,
    2.0**-149,  # the smallest float32 denormal
    3 * 2.0**-151,  # rounds up to 2^-149
    2.0**-150,  # a tie between 0 and 2^-149: rounds to 0, so real refuses it (underflow)
    1e-46,
    1e-300,
    5e-324,
    3.4028235e38,  # above FLT_MAX but below the midpoint to 2^128: rounds to FLT_MAX
    FLT_MAX,
    2.0**128 - 2.0**103,  # FLT_MAX + half an ulp: rounds to 2^128, real refuses it (overflow)
    -3.5e38,
    3.5e38,
    1e300,
    1000000000000005.0,  # a tie at 15 significant digits (float8 -> numeric)
    1234565.0,  # a tie at 6 significant digits (float4 -> numeric)
    123456789.0,
    12345678901.5,  # 11 integer digits: numeric(20,10) refuses it
    9999999999.99999999,
    5e-11,  # numeric(20,10) rounds the tie half away from zero
    -2.5e-11,
    0.30000000000000004,
    2.0**53 + 2,
]

RANDOM_VALUES = 400
HEADLINE = {
    "d_real": "1",
    "f_real": "1",
    "d_double": "1.0000000596046448",
    "f_double": "1",
    "d_numeric": "1.00000005960464",
    "f_numeric": "1",
    "d_numeric_20_10": "1.0000000596",
    "f_numeric_20_10": "1.0000000000",
}
"""What 1 + 2^-24 (the first value) is stored as, also when the oracle is not compared."""

SOURCES = {"d": ("DOUBLE", pa.float64()), "f": ("FLOAT", pa.float32())}
COLUMN_TYPES = {
    "real": "real",
    "double": "double precision",
    "numeric": "numeric",
    "numeric_20_10": "numeric(20,10)",
}
BINARY_TARGETS = ("real", "double")
"""Column types that take a float or double in binary COPY; numeric columns are always
written through CSV (PostgreSQL's float-to-numeric text has no binary encoding)."""


def random_values(seed: int, count: int) -> list[float]:
    """Exact float32 midpoints, doubles spread over real's range and random bit patterns."""
    generator = random.Random(seed)
    values: list[float] = []
    while len(values) < count:
        kind = len(values) % 3
        if kind == 0:
            bits = generator.randrange(1, 0x7F7F_FFFF)
            low = struct.unpack("<f", struct.pack("<I", bits))[0]
            high = struct.unpack("<f", struct.pack("<I", bits + 1))[0]
            value = (low + high) / 2
        elif kind == 1:
            value = 10 ** generator.uniform(-46, 39)
        else:
            value = struct.unpack("<d", struct.pack("<Q", generator.getrandbits(64)))[0]
            if math.isnan(value):
                continue
        values.append(-value if generator.random() < 0.5 else value)
    return values


def as_float32(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def column_names(targets: tuple[str, ...]) -> list[str]:
    return [f"{source}_{target}" for target in targets for source in SOURCES]


def table_ddl(name: str, targets: tuple[str, ...], *, forced_csv: bool) -> str:
    """``id integer`` takes Spark's bigint only through CSV (a narrower integer)."""
    columns = ", ".join(
        f"{column} {COLUMN_TYPES[column.split('_', 1)[1]]}" for column in column_names(targets)
    )
    return f'CREATE TABLE "{name}" (id {"integer" if forced_csv else "bigint"}, {columns})'


def spark_schema(targets: tuple[str, ...]) -> str:
    return "id BIGINT, " + ", ".join(
        f"{column} {SOURCES[column[0]][0]}" for column in column_names(targets)
    )


def refused_by_postgresql(connection: psycopg.Connection, value: float, column: str) -> bool:
    """Whether PostgreSQL's assignment cast from the bound parameter type (float8 for a
    double, float4 for a float) to the column's type refuses ``value``: the rule Spark's
    writer meets."""
    source, target = column.split("_", 1)
    parameter = "float8" if source == "d" else "float4"
    try:
        connection.execute(f"SELECT %s::float8::{parameter}::{COLUMN_TYPES[target]}", (value,))
    except psycopg.DataError:
        return True
    return False


def input_table(
    connection: psycopg.Connection, values: list[float], targets: tuple[str, ...]
) -> tuple[pa.Table, list[tuple[str, float]]]:
    """One row per value, each column holding it (as float32 in float columns), or NULL
    where the column refuses it; and the refused (column, value) pairs."""
    columns: dict[str, Any] = {"id": pa.array(range(len(values)), pa.int64())}
    refused: list[tuple[str, float]] = []
    for column in column_names(targets):
        source = column[0]
        kept: list[float | None] = []
        for value in values:
            value = as_float32(value) if source == "f" else value
            if refused_by_postgresql(connection, value, column):
                refused.append((column, value))
                kept.append(None)
            else:
                kept.append(value)
        columns[column] = pa.array(kept, SOURCES[source][1])
    return pa.table(columns), refused


def stored_values(url: str, table: str, names: list[str]) -> list[tuple[Any, ...]]:
    """Rows by id: ``real``/``double precision`` as their bits, ``numeric`` as text."""
    selected = []
    for column in names:
        target = column.split("_", 1)[1]
        if target == "real":
            selected.append(f"encode(float4send({column}), 'hex')")
        elif target == "double":
            selected.append(f"encode(float8send({column}), 'hex')")
        else:
            selected.append(f"{column}::text")
    with psycopg.connect(url) as connection:
        return connection.execute(
            f'SELECT id, {", ".join(selected)} FROM "{table}" ORDER BY id'
        ).fetchall()


def readable(url: str, table: str, names: list[str]) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        connection.execute("SET extra_float_digits = 3")
        rows = connection.execute(
            f'SELECT id, {", ".join(f"{c}::text" for c in names)} FROM "{table}" ORDER BY id'
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def assert_stored_alike(
    url: str, table: str, twin: str, names: list[str], inputs: list[Any], seed: int
) -> None:
    """The sink's table holds exactly what Spark's writer put in the twin, row by row
    (``inputs[id]`` is row ``id``'s input, for the message)."""
    ours, oracle = stored_values(url, table, names), stored_values(url, twin, names)
    assert len(ours) == len(oracle) == len(inputs)
    if ours == oracle:
        return
    ours_text, oracle_text = readable(url, table, names), readable(url, twin, names)
    differences = [
        f"{names[index]} {inputs[row[0]]!r}: sink {ours_text[row[0]][index]},"
        f" Spark's writer {oracle_text[row[0]][index]}"
        for row, expected in zip(ours, oracle, strict=True)
        for index in range(len(names))
        if row[index + 1] != expected[index + 1]
    ]
    pytest.fail(
        f"seed {seed}: {len(differences)} values differ from Spark's JDBC writer:\n"
        + "\n".join(differences[:40])
    )


@pytest.fixture(scope="module")
def jdbc_writer(spark: Any) -> dict[str, str]:
    """Spark's own JDBC writer with the PostgreSQL JDBC driver (``jdbc_oracle_parts``)."""
    return spark_jdbc_writer(spark)


PATHS = pytest.mark.parametrize("forced_csv", [False, True], ids=["binary", "csv-fallback"])


@PATHS
@pytest.mark.timeout(300)
def test_floats_and_doubles_are_stored_as_sparks_own_jdbc_writer_stores_them(
    spark, jdbc_writer, postgres, tmp_path, unique_name, forced_csv
):
    """Binary: ``real`` and ``double precision`` columns only (every column has a binary
    encoding); CSV: the same with an ``integer`` id (a bigint into it forces CSV) and the
    ``numeric`` columns. The twin table is written by ``DataFrame.write.jdbc``."""
    seed = seed_from_environment()
    url = postgres.endpoint.url
    targets = tuple(COLUMN_TYPES) if forced_csv else BINARY_TARGETS
    twin = f"{unique_name}_spark"
    values = FIXED_VALUES + random_values(seed, RANDOM_VALUES)
    with psycopg.connect(url, autocommit=True) as connection:
        for name in (unique_name, twin):
            connection.execute(table_ddl(name, targets, forced_csv=forced_csv))
        rows, _ = input_table(connection, values, targets)
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(rows, source / "part-0000.parquet")

    run_file_query(
        spark,
        source,
        tmp_path / "checkpoint",
        spark_schema(targets),
        sink_options(postgres.endpoint, unique_name),
    )
    spark.read.schema(spark_schema(targets)).parquet(str(source)).write.mode("append").jdbc(
        postgres.endpoint.jdbc_url,
        twin,
        properties=oracle_properties(postgres.endpoint, jdbc_writer),
    )

    names = column_names(targets)
    assert_stored_alike(url, unique_name, twin, names, values, seed)
    first_row = dict(zip(names, readable(url, unique_name, names)[0], strict=True))
    assert {name: first_row[name] for name in HEADLINE if name in first_row} == {
        name: text for name, text in HEADLINE.items() if name in first_row
    }
    assert pg_leftovers(url, unique_name) == (0, 0)
    with psycopg.connect(url, autocommit=True) as connection:
        with connection.transaction(), connection.cursor() as cursor:
            types = column_types(cursor, f'"{unique_name}"')
        encoding = BinaryEncoding(rows.column_names, rows.schema, types)
        assert encoding.binary is not forced_csv, encoding.fallback_reason


EXACT_SOURCES = {"l": "BIGINT", "n": "DECIMAL(38,18)"}
EXACT_NAMES = ["l_real", "l_double", "l_numeric", "n_real", "n_double", "n_numeric_20_10"]
FIXED_INTEGERS = [
    2**24 + 1,  # a float32 midpoint: ties to even, 16777216
    2**24 + 3,
    2**53 + 1,  # a float64 midpoint
    2**53 + 3,
    2**62 + 2**38,  # a float32 midpoint at 2^62
    2**63 - 1,
    -(2**63),
    0,
    -1,
    123456789,
]
FIXED_DECIMALS = [
    Decimal(2**24 + 1),
    Decimal(2**24 + 1) + Decimal("1e-18"),  # just above the midpoint: rounds up
    Decimal("1.000000059604644775"),  # 1 + 2^-24 cut to 18 places: just below the midpoint
    Decimal("1.000000059604644776"),  # just above it
    Decimal("0.1"),
    Decimal("-0.333333333333333333"),
    Decimal("9999999999.99999999994999"),
    Decimal("0.00000000005"),  # numeric(20,10) rounds the tie away from zero
    Decimal(0),
    Decimal("123456789.123456789123456789"),
]


def exact_inputs(seed: int, count: int) -> list[tuple[int, Decimal]]:
    """Integers of every magnitude and decimals with 18 places, fixed then random."""
    generator = random.Random(seed)
    integers = list(FIXED_INTEGERS)
    decimals = list(FIXED_DECIMALS)
    while len(integers) < count:
        integers.append(
            generator.getrandbits(generator.randrange(1, 64)) * generator.choice((1, -1))
        )
        digits = generator.randrange(1, 28)
        decimals.append(
            Decimal(generator.getrandbits(digits * 10 // 3) * generator.choice((1, -1)))
            .scaleb(-18)
            .quantize(Decimal("1e-18"))
        )
    return list(zip(integers, decimals[: len(integers)], strict=True))


@pytest.mark.timeout(300)
def test_integers_and_decimals_into_float_and_numeric_columns_are_stored_as_by_spark(
    spark, jdbc_writer, postgres, tmp_path, unique_name
):
    """The same class of hole checked for the other sources the server narrows (they go
    through CSV, parsed once from their exact text): a bigint or a decimal into ``real``
    and ``double precision`` (rounded once, ties to even) and into ``numeric``."""
    seed = seed_from_environment()
    url = postgres.endpoint.url
    twin = f"{unique_name}_spark"
    inputs = exact_inputs(seed, 300)
    columns = ", ".join(f"{name} {COLUMN_TYPES[name.split('_', 1)[1]]}" for name in EXACT_NAMES)
    with psycopg.connect(url, autocommit=True) as connection:
        for name in (unique_name, twin):
            connection.execute(f'CREATE TABLE "{name}" (id integer, {columns})')
    arrays: dict[str, Any] = {"id": pa.array(range(len(inputs)), pa.int64())}
    for name in EXACT_NAMES:
        if name.startswith("l"):
            arrays[name] = pa.array([integer for integer, _ in inputs], pa.int64())
        else:
            arrays[name] = pa.array([number for _, number in inputs], pa.decimal128(38, 18))
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(pa.table(arrays), source / "part-0000.parquet")
    schema = "id BIGINT, " + ", ".join(f"{name} {EXACT_SOURCES[name[0]]}" for name in EXACT_NAMES)

    run_file_query(
        spark, source, tmp_path / "checkpoint", schema, sink_options(postgres.endpoint, unique_name)
    )
    spark.read.schema(schema).parquet(str(source)).write.mode("append").jdbc(
        postgres.endpoint.jdbc_url,
        twin,
        properties=oracle_properties(postgres.endpoint, jdbc_writer),
    )

    assert_stored_alike(url, unique_name, twin, EXACT_NAMES, inputs, seed)
    assert readable(url, unique_name, EXACT_NAMES)[0][0] == "1.6777216e+07"


INTEGER_TYPES = {"int2": "smallint", "int4": "integer", "int8": "bigint"}
INTEGER_SOURCES = {
    "d": ("DOUBLE", pa.float64(), "float8"),
    "f": ("FLOAT", pa.float32(), "float4"),
    "n": ("DECIMAL(38,18)", pa.decimal128(38, 18), "numeric(38,18)"),
}
INTEGER_NAMES = [f"{source}_{target}" for target in INTEGER_TYPES for source in INTEGER_SOURCES]
FIXED_TIES = [
    0.5,
    1.5,
    2.5,
    -0.5,
    -2.5,
    0.49999999999999994,
    -0.0,
    32766.5,
    32767.5,  # rounds to 32768: smallint refuses it
    -32768.5,  # half to even -32768 (a float), half away from zero -32769 (a decimal)
    -32769.5,
    2147483646.5,
    2147483647.5,
    -2147483648.5,
    2.0**63 - 1024,  # the largest double below 2^63
    2.0**63,
    -(2.0**63),
    1e10,
    math.nan,
    math.inf,
    -math.inf,
]
FIXED_DECIMAL_TIES = [
    Decimal("32767.499999999999999999"),
    Decimal("9223372036854775807.4"),
    Decimal("9223372036854775807.5"),
    Decimal("-9223372036854775808.5"),
    Decimal("-9223372036854775808.499999999999999999"),
]


def integer_inputs(seed: int, count: int) -> list[tuple[float, Decimal]]:
    """(double, decimal) per row: ties and range edges, then random ties and fractions of
    every magnitude up to 2^64."""
    generator = random.Random(seed)
    places = Decimal("1e-18")
    with decimal.localcontext(decimal.Context(prec=60)):
        rows = [
            (value, Decimal(value if math.isfinite(value) else 0).quantize(places))
            for value in FIXED_TIES
        ]
    rows += [(float(number), number) for number in FIXED_DECIMAL_TIES]
    with decimal.localcontext(decimal.Context(prec=60)):
        while len(rows) < count:
            whole = generator.getrandbits(generator.randrange(1, 65)) * generator.choice((1, -1))
            fraction = generator.choice(
                (Decimal("0.5"), Decimal(generator.getrandbits(60)) / 2**60)
            )
            number = (whole + fraction).quantize(places)
            rows.append((float(number), number))
    return rows


def refused_cast(connection: psycopg.Connection, value: Any, parameter: str, kind: str) -> bool:
    try:
        connection.execute(f"SELECT %s::{parameter}::{kind}", (value,))
    except psycopg.DataError:
        return True
    return False


@PATHS
@pytest.mark.timeout(300)
def test_floats_and_decimals_into_integer_columns_are_rounded_as_by_sparks_writer(
    spark, jdbc_writer, postgres, tmp_path, unique_name, forced_csv
):
    """The same class found elsewhere: a double, float or decimal into ``smallint``,
    ``integer`` or ``bigint`` was sent as text, which the server refused ('invalid input
    syntax' for 2.5, and for a decimal 2.00), where Spark's writer stores the value its
    float8/float4/numeric parameter casts to (floats half to even, decimals half away from
    zero). Both COPY paths against the twin table; the values PostgreSQL's cast refuses are
    NULL in the compared rows, and a sample of them must fail the sink's COPY naming the
    column."""
    seed = seed_from_environment()
    url = postgres.endpoint.url
    twin = f"{unique_name}_spark"
    inputs = integer_inputs(seed, 300)
    columns = ", ".join(f"{name} {INTEGER_TYPES[name[2:]]}" for name in INTEGER_NAMES)
    arrays: dict[str, Any] = {"id": pa.array(range(len(inputs)), pa.int64())}
    refused: list[tuple[str, Any]] = []
    with psycopg.connect(url, autocommit=True) as connection:
        for name in (unique_name, twin):
            id_type = "integer" if forced_csv else "bigint"
            connection.execute(f'CREATE TABLE "{name}" (id {id_type}, {columns})')
        for name in INTEGER_NAMES:
            _, arrow_type, parameter = INTEGER_SOURCES[name[0]]
            kept: list[Any] = []
            for double, number in inputs:
                value: Any = {"d": double, "f": as_float32(double), "n": number}[name[0]]
                if refused_cast(connection, value, parameter, INTEGER_TYPES[name[2:]]):
                    refused.append((name, value))
                    value = None
                kept.append(value)
            arrays[name] = pa.array(kept, arrow_type)
    rows = pa.table(arrays)
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(rows, source / "part-0000.parquet")
    schema = "id BIGINT, " + ", ".join(
        f"{name} {INTEGER_SOURCES[name[0]][0]}" for name in INTEGER_NAMES
    )

    run_file_query(
        spark, source, tmp_path / "checkpoint", schema, sink_options(postgres.endpoint, unique_name)
    )
    spark.read.schema(schema).parquet(str(source)).write.mode("append").jdbc(
        postgres.endpoint.jdbc_url,
        twin,
        properties=oracle_properties(postgres.endpoint, jdbc_writer),
    )

    assert_stored_alike(url, unique_name, twin, INTEGER_NAMES, inputs, seed)
    assert readable(url, unique_name, INTEGER_NAMES)[2] == ("2", "2", "3") * 3  # 2.5
    assert pg_leftovers(url, unique_name) == (0, 0)
    with psycopg.connect(url) as connection, connection.cursor() as cursor:
        encoding = BinaryEncoding(
            rows.column_names, rows.schema, column_types(cursor, f'"{unique_name}"')
        )
        assert encoding.binary is not forced_csv, encoding.fallback_reason
        for name, value in refused[:: max(1, len(refused) // 25)]:
            batch = pa.record_batch(
                [pa.array([1], pa.int64()), pa.array([value], INTEGER_SOURCES[name[0]][1])],
                names=["id", name],
            )
            refusal = pytest.raises(JdbcWriteError, match=f"column '{name}' .*out of range")
            with refusal, connection.transaction():
                copy_batches(cursor, TableName(None, unique_name), ["id", name], [batch], 10)


REFUSED = [
    pytest.param("d_real", 3.5e38, False, id="double-over-real-max-binary"),
    pytest.param("d_real", 3.5e38, True, id="double-over-real-max-csv"),
    pytest.param("d_real", 1e-46, False, id="double-under-real-min-binary"),
    pytest.param("d_real", 1e-46, True, id="double-under-real-min-csv"),
]


@pytest.mark.parametrize(("column", "value", "forced_csv"), REFUSED)
@pytest.mark.timeout(180)
def test_a_double_that_real_cannot_hold_fails_the_task_naming_the_column(
    spark, postgres, tmp_path, unique_name, column, value, forced_csv
):
    """Spark's writer fails with PostgreSQL's 'value out of range' (float8 to float4); the
    sink must fail too, through the whole query, and store neither Infinity nor zero."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(table_ddl(unique_name, BINARY_TARGETS, forced_csv=forced_csv))
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(
        pa.table({"id": pa.array([1, 2], pa.int64()), column: pa.array([1.5, value])}),
        source / "part-0000.parquet",
    )
    with pytest.raises(Exception) as caught:
        run_file_query(
            spark,
            source,
            tmp_path / "checkpoint",
            f"id BIGINT, {column} DOUBLE",
            sink_options(postgres.endpoint, unique_name),
        )
    lines = [
        line
        for line in str(caught.value).splitlines()
        if re.search(rf"JdbcWriteError: .*column '{column}' .*row 2 of .*out of range", line)
    ]
    assert lines, str(caught.value)[-3000:]
    with psycopg.connect(url) as connection:
        assert connection.execute(f'SELECT count(*) FROM "{unique_name}"').fetchone() == (0,)
    assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(300)
def test_every_value_a_column_refuses_is_refused_by_sparks_writer_and_by_both_copy_paths(
    spark, jdbc_writer, postgres, unique_name
):
    """Each (column, value) that PostgreSQL's cast refuses among the fixed values: Spark's
    writer fails on it alone, and so does the sink's COPY (binary where the column has a
    binary encoding, and CSV) with ``JdbcWriteError`` naming the column, leaving nothing."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        _, refused = input_table(connection, FIXED_VALUES, tuple(COLUMN_TYPES))
        for suffix, forced_csv, targets in (
            ("binary", False, BINARY_TARGETS),
            ("csv", True, tuple(COLUMN_TYPES)),
            ("spark", True, tuple(COLUMN_TYPES)),
        ):
            connection.execute(table_ddl(f"{unique_name}_{suffix}", targets, forced_csv=forced_csv))
    assert {column for column, _ in refused} == {"d_real", "d_numeric_20_10", "f_numeric_20_10"}
    properties = oracle_properties(postgres.endpoint, jdbc_writer)
    accepted_by_spark = []
    for column, value in refused:
        frame = spark.createDataFrame([(1, value)], f"id BIGINT, {column} {SOURCES[column[0]][0]}")
        try:
            frame.write.mode("append").jdbc(
                postgres.endpoint.jdbc_url, f"{unique_name}_spark", properties=properties
            )
        except Exception:  # its PSQLException cannot be deserialised here: any failure counts
            continue
        accepted_by_spark.append((column, value))
    assert accepted_by_spark == []

    not_refused = []
    for column, value in refused:
        binary = column.split("_", 1)[1] in BINARY_TARGETS
        for suffix in ("binary", "csv") if binary else ("csv",):
            table = TableName(None, f"{unique_name}_{suffix}")
            batch = pa.record_batch(
                [pa.array([1], pa.int64()), pa.array([value], SOURCES[column[0]][1])],
                names=["id", column],
            )
            with psycopg.connect(url) as connection, connection.cursor() as cursor:
                try:
                    copy_batches(cursor, table, ["id", column], [batch], 100)
                except JdbcWriteError as error:
                    assert f"column {column!r}" in str(error), str(error)
                    assert "\n" not in str(error)
                    connection.rollback()
                    continue
                connection.rollback()
                not_refused.append((suffix, column, value))
    assert not_refused == []
    with psycopg.connect(url) as connection:
        for suffix in ("binary", "csv", "spark"):
            count = connection.execute(f'SELECT count(*) FROM "{unique_name}_{suffix}"')
            assert count.fetchone() == (0,)


def test_the_fixed_values_cover_each_refusal_and_each_rounding_direction() -> None:
    """The fixed values hold what the cases rely on (pure arithmetic, no services)."""
    assert as_float32(1 + 2**-24) == 1.0
    assert as_float32(1 + 3 * 2**-24) == 1 + 4 * 2**-24
    assert as_float32(2.0**128 - 2.0**103) == math.inf
    assert as_float32(3.4028235e38) == FLT_MAX
    assert as_float32(2.0**-150) == 0.0
    assert format(1000000000000005.0, ".15g") == "1e+15"
    assert format(1234565.0, ".6g") == "1.23456e+06"
    assert Decimal(format(5e-11, ".15g")) == Decimal("5E-11")
