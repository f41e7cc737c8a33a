"""Adversarial review of 2pc-jdbc's float narrowing (issue 35, item 3): every way a float,
double or decimal reaches a column that narrows it must store what Spark's own JDBC
writer stores (the oracle: ``DataFrame.write.jdbc`` into a twin table), through each
write mode (prepared appends, staging, upsert with a versionColumn), and a refused value
must leave nothing committed, prepared or staged and fail a restart again in one line.

What it proved (each failed before its fix):

- a domain over a domain over ``real`` / ``numeric`` / ``integer`` was seen as an unknown
  type: a double went as its shortest text (1 + 2^-24 stored as 1.0000001, 0.1 + 0.2 as
  0.30000000000000004 in numeric) or was refused ('invalid input syntax' for 2.5);
- a decimal with a scale leaving one integer digit (decimal(38,37)) into an integer
  column failed the task with Arrow's 'Rounded value 10.000... does not fit in
  precision' instead of storing 10 (or -10);
What held: floats and doubles into single domains, -0.0 into numeric, subnormals and
FLT_MAX's rounding boundaries into real, NULLs mixed in, a float's 15 / 6 digit text
overflowing numeric(p,s) (refused by the server, naming the column), each write mode; a
refusal leaves nothing prepared or staged and a restart fails the same way. Lists into
number arrays are refused at query start (a documented limit), never half-written.
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

DOMAINS = [
    "CREATE DOMAIN {p}_r1 AS real",
    "CREATE DOMAIN {p}_r2 AS {p}_r1 CHECK (VALUE IS NULL OR VALUE <> 'NaN'::real)",
    "CREATE DOMAIN {p}_n1 AS numeric",
    "CREATE DOMAIN {p}_n2 AS {p}_n1",
    "CREATE DOMAIN {p}_i1 AS integer",
    "CREATE DOMAIN {p}_i2 AS {p}_i1",
]

COLUMNS: dict[str, tuple[str, str, str, pa.DataType]] = {
    # name: (column type, Spark type, parameter type Spark's writer binds, Arrow type)
    "d_r2": ("{p}_r2", "DOUBLE", "float8", pa.float64()),
    "f_r2": ("{p}_r2", "FLOAT", "float4", pa.float32()),
    "d_n2": ("{p}_n2", "DOUBLE", "float8", pa.float64()),
    "f_n2": ("{p}_n2", "FLOAT", "float4", pa.float32()),
    "d_i2": ("{p}_i2", "DOUBLE", "float8", pa.float64()),
    "w_i2": ("{p}_i2", "DECIMAL(38,37)", "numeric", pa.decimal128(38, 37)),
    "w_int8": ("bigint", "DECIMAL(38,37)", "numeric", pa.decimal128(38, 37)),
    "w_int2": ("smallint", "DECIMAL(38,37)", "numeric", pa.decimal128(38, 37)),
    "n_r2": ("{p}_r2", "DECIMAL(38,18)", "numeric", pa.decimal128(38, 18)),
    "d_numeric_5_2": ("numeric(9,2)", "DOUBLE", "float8", pa.float64()),
}

EDGE_DOUBLES = [
    1 + 2**-24,  # a float32 midpoint: real stores 1, its shortest text parsed again 1.0000001
    0.1 + 0.2,  # numeric stores 0.3 (15 digits), its shortest text 0.30000000000000004
    2.5,  # integers round half to even: 2
    -0.0,
    FLT_MAX,
    3.4028235e38,  # rounds to FLT_MAX
    2.0**128 - 2.0**103,  # rounds beyond FLT_MAX: real refuses it
    1e-40,  # a float32 subnormal
    2.0**-150,  # rounds to 0 in real: refused
    5e-324,
    math.nan,
    math.inf,
    1 / 3,
    123456.5,
    -2147483648.5,
]
EDGE_DECIMALS = [
    Decimal(2**24 + 1),  # a float32 midpoint: real stores 16777216
    Decimal("1.000000059604644776"),  # just above 1 + 2^-24: real stores 1.0000001
    Decimal("340282356779733661637539395458142568448"[:20]),
]
EDGE_WIDE_DECIMALS = [
    Decimal("9.5"),  # rounds to 10: one more integer digit than decimal(38,37) holds
    Decimal("-9.5"),
    Decimal("9.9999999999999999999999999999999999999"),
    Decimal("0.5"),
    Decimal("-0.5"),
    Decimal("2.4999999999999999999999999999999999999"),
]


def random_double(generator: random.Random) -> float:
    kind = generator.randrange(4)
    if kind == 0:
        bits = generator.randrange(1, 0x7F7F_FFFF)
        low = struct.unpack("<f", struct.pack("<I", bits))[0]
        high = struct.unpack("<f", struct.pack("<I", bits + 1))[0]
        value = (low + high) / 2
    elif kind == 1:
        value = 10 ** generator.uniform(-46, 39)
    elif kind == 2:
        value = generator.randrange(-40000, 40000) + generator.choice((0.5, 0.25, 0.0))
    else:
        value = generator.choice(EDGE_DOUBLES)
    return -value if generator.random() < 0.5 else value


def random_wide_decimal(generator: random.Random) -> Decimal:
    if generator.random() < 0.3:
        return generator.choice(EDGE_WIDE_DECIMALS)
    return Decimal(generator.randrange(-(10**38) + 1, 10**38)).scaleb(-37)


def as_float32(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(value))


class Inputs:
    """Seeded rows, with NULLs mixed in; a value that PostgreSQL's cast from the parameter
    Spark's writer binds refuses is NULL, so Spark's writer can write the twin."""

    def __init__(self, connection: psycopg.Connection, prefix: str, seed: int, rows: int):
        self.connection = connection
        self.prefix = prefix
        generator = random.Random(seed)
        self.columns: dict[str, list[Any]] = {"id": list(range(rows)), "v": [1] * rows}
        for name, (column_type, _, parameter, arrow_type) in COLUMNS.items():
            target = column_type.format(p=prefix)
            values: list[Any] = []
            for row in range(rows):
                if row >= len(EDGE_DOUBLES) and generator.random() < 0.1:
                    values.append(None)
                else:
                    value = self.value(generator, arrow_type, row)
                    values.append(self.kept(value, parameter, target))
            self.columns[name] = values

    @staticmethod
    def value(generator: random.Random, arrow_type: pa.DataType, row: int) -> Any:
        if pa.types.is_decimal(arrow_type):
            if arrow_type.scale == 37:
                return (
                    EDGE_WIDE_DECIMALS[row]
                    if row < len(EDGE_WIDE_DECIMALS)
                    else random_wide_decimal(generator)
                )
            if generator.random() < 0.2:
                return generator.choice(EDGE_DECIMALS)
            digits = generator.randrange(1, 38)
            return Decimal(generator.randrange(-(10**digits) + 1, 10**digits)).scaleb(-18)
        value = EDGE_DOUBLES[row] if row < len(EDGE_DOUBLES) else random_double(generator)
        return as_float32(value) if arrow_type == pa.float32() else value

    def kept(self, value: Any, parameter: str, target: str) -> Any:
        try:
            self.connection.execute(f"SELECT %s::{parameter}::{target}", (value,))
        except psycopg.DataError:
            return None
        except psycopg.errors.CheckViolation:
            return None
        return value

    def table(self) -> pa.Table:
        arrays = {
            "id": pa.array(self.columns["id"], pa.int64()),
            "v": pa.array(self.columns["v"], pa.int64()),
        }
        for name, (_, _, _, arrow_type) in COLUMNS.items():
            arrays[name] = pa.array(self.columns[name], arrow_type)
        return pa.table(arrays)


def create_tables(connection: psycopg.Connection, prefix: str, names: list[str]) -> None:
    for statement in DOMAINS:
        connection.execute(statement.format(p=prefix))
    columns = ", ".join(
        f"{name} {column_type.format(p=prefix)}" for name, (column_type, *_) in COLUMNS.items()
    )
    for name in names:
        connection.execute(f'CREATE TABLE "{name}" (id bigint PRIMARY KEY, v bigint, {columns})')


def stored_text(url: str, table: str) -> dict[int, tuple[Any, ...]]:
    """Each row's values as PostgreSQL's exact text (floats with extra_float_digits 3)."""
    names = ["v", *COLUMNS]
    with psycopg.connect(url) as connection:
        connection.execute("SET extra_float_digits = 3")
        rows = connection.execute(
            f'SELECT id, {", ".join(f"{c}::text" for c in names)} FROM "{table}" ORDER BY id'
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


def spark_schema() -> str:
    return "id BIGINT, v BIGINT, " + ", ".join(
        f"{name} {spark_type}" for name, (_, spark_type, *_) in COLUMNS.items()
    )


MODES = {
    "prepared": {"protocol": "prepared"},
    "staging": {"protocol": "staging"},
    "upsert": {
        "protocol": "prepared",
        "writeMode": "upsert",
        "upsertKeys": "id",
        "versionColumn": "v",
    },
}


@pytest.fixture(scope="module")
def jdbc_writer(spark: Any) -> dict[str, str]:
    return spark_jdbc_writer(spark)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.timeout(300)
def test_nested_domains_and_wide_decimals_are_stored_as_by_sparks_writer(
    spark, jdbc_writer, postgres, tmp_path, unique_name, mode
):
    """Doubles, floats and decimals into domains over domains over ``real``, ``numeric``
    and ``integer``, decimal(38,37) into integer columns (9.5 rounds to 10) and doubles
    into numeric(9,2), with NULLs, FLT_MAX and its rounding boundaries, subnormals, -0.0
    and ties; in each write mode, against the twin written by ``DataFrame.write.jdbc``."""
    seed = seed_from_environment()
    url = postgres.endpoint.url
    twin = f"{unique_name}_spark"
    prefix = unique_name[-12:] + "_" + mode[:2]
    with psycopg.connect(url, autocommit=True) as connection:
        create_tables(connection, prefix, [unique_name, twin])
        rows = Inputs(connection, prefix, seed, 120).table()
    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(rows, source / "part-0000.parquet")

    run_file_query(
        spark,
        source,
        tmp_path / "checkpoint",
        spark_schema(),
        {**sink_options(postgres.endpoint, unique_name), **MODES[mode]},
    )
    spark.read.schema(spark_schema()).parquet(str(source)).write.mode("append").jdbc(
        postgres.endpoint.jdbc_url,
        twin,
        properties=oracle_properties(postgres.endpoint, jdbc_writer),
    )

    ours, oracle = stored_text(url, unique_name), stored_text(url, twin)
    assert len(oracle) == rows.num_rows
    names = ["v", *COLUMNS]
    differences = [
        f"row {key} {names[index]} {rows.column(names[index])[key]}: sink {ours[key][index]},"
        f" Spark's writer {oracle[key][index]}"
        for key in oracle
        for index in range(len(names))
        if key not in ours or ours[key][index] != oracle[key][index]
    ]
    assert differences == [], f"seed {seed}:\n" + "\n".join(differences[:40])
    assert len(ours) == rows.num_rows
    assert ours[0][names.index("d_r2")] == "1"  # 1 + 2^-24
    assert ours[1][names.index("d_n2")] == "0.3"  # 0.1 + 0.2
    assert ours[0][names.index("w_i2")] == "10"  # 9.5
    assert pg_leftovers(url, unique_name) == (0, 0)


REFUSALS = [
    pytest.param("d_r2", [1.5, 1e-46], "DOUBLE", "underflow", "staging", id="nested-domain-real"),
    pytest.param(
        "d_i2", [1.5, 3e10], "DOUBLE", "integer out of range", "upsert", id="nested-domain-int"
    ),
    pytest.param(
        "d_numeric_5_2",
        [1.5, 9999999.995],
        "DOUBLE",
        "numeric field overflow",
        "staging",
        id="numeric-9-2",
    ),
    pytest.param(
        "w_int2",
        [Decimal("1.5"), Decimal("9.5")],
        "DECIMAL(38,37)",
        None,
        "upsert",
        id="wide-decimal-fits",
    ),
]


@pytest.mark.parametrize(("column", "values", "spark_type", "reason", "mode"), REFUSALS)
@pytest.mark.timeout(240)
def test_a_refused_value_leaves_nothing_and_a_restart_refuses_it_again(
    spark, postgres, tmp_path, unique_name, column, values, spark_type, reason, mode
):
    """Batch 0 (one row) commits; batch 1 holds a value the column's
    cast refuses: the query fails with one line naming the column, batch 1 leaves no row,
    no prepared transaction and no staged row, and a restart from the checkpoint fails the
    same way (never stores it, never loops silently). A decimal(38,37) 9.5 is not refused:
    it is stored as 10 (it failed with Arrow's precision error before)."""
    url = postgres.endpoint.url
    prefix = unique_name[-12:]
    with psycopg.connect(url, autocommit=True) as connection:
        create_tables(connection, prefix, [unique_name])
    arrow_type = COLUMNS[column][3]
    source = tmp_path / "in"
    source.mkdir()
    for index, value in enumerate(values):
        table = pa.table(
            {
                "id": pa.array([index], pa.int64()),
                "v": pa.array([1], pa.int64()),
                column: pa.array([value], arrow_type),
            }
        )
        pq.write_table(table, source / f"part-{index:04d}.parquet")
    schema = f"id BIGINT, v BIGINT, {column} {spark_type}"
    options = {**sink_options(postgres.endpoint, unique_name), **MODES[mode]}

    def run() -> None:
        run_file_query(spark, source, tmp_path / "checkpoint", schema, options, 1)

    if reason is None:
        run()
        with psycopg.connect(url) as connection:
            stored = connection.execute(
                f'SELECT id, {column} FROM "{unique_name}" ORDER BY id'
            ).fetchall()
        assert stored == [(0, 2), (1, 10)]
        assert pg_leftovers(url, unique_name) == (0, 0)
        return
    for _ in range(2):
        with pytest.raises(Exception) as caught:
            run()
        lines = [
            line
            for line in str(caught.value).splitlines()
            if re.search(rf"JdbcWriteError: .*column '{column}' .*row 1 of .*{reason}", line)
        ]
        assert lines, str(caught.value)[-3000:]
        with psycopg.connect(url) as connection:
            ids = connection.execute(f'SELECT id FROM "{unique_name}" ORDER BY id').fetchall()
        assert ids == [(0,)]
        assert pg_leftovers(url, unique_name) == (0, 0)


@pytest.mark.timeout(120)
def test_a_list_into_a_real_array_column_is_refused_at_query_start_naming_it(
    spark, postgres, tmp_path, unique_name
):
    """Arrays are a documented refusal: an existing ``real[]`` column does not make a
    list<double> pass planning and then fail (or narrow) at write time."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, a real[])')
    source = tmp_path / "in"
    source.mkdir()
    rows = {"id": pa.array([1], pa.int64()), "a": pa.array([[1 + 2**-24]], pa.list_(pa.float64()))}
    pq.write_table(pa.table(rows), source / "part-0000.parquet")
    with pytest.raises(Exception, match=r"column 'a' has type array<double>, which 2pc-jdbc"):
        run_file_query(
            spark,
            source,
            tmp_path / "checkpoint",
            "id BIGINT, a ARRAY<DOUBLE>",
            sink_options(postgres.endpoint, unique_name),
        )
    assert pg_leftovers(url, unique_name) == (0, 0)


def text_decimal(value: float | None, scale: int) -> Decimal | None:
    """A decimal of that scale near ``value`` (folded into the type's range), or None."""
    if value is None or not math.isfinite(value):
        return None
    whole = 10.0 if scale == 37 else 1e35
    folded = math.fmod(value, whole) if abs(value) >= whole else value
    with decimal.localcontext(decimal.Context(prec=80)):
        return Decimal(repr(folded)).quantize(Decimal(1).scaleb(-scale))


TEXT_DOUBLES = [1e-05, 123456789012.0, 1e15, 0.1, -0.0, 1 / 3, 6.635728374829646e16, math.nan]


@pytest.mark.timeout(180)
def test_floats_and_decimals_into_text_columns_are_stored_as_by_sparks_writer(
    spark, jdbc_writer, postgres, tmp_path, unique_name
):
    """Spark's writer stores PostgreSQL's float8out / float4out text; Arrow's CSV writer
    formatted them (0.00001 for 1e-05, 1.23456789012e+11 for 123456789012), and Python's
    shortest text is not PostgreSQL's either (6.6357283748296464e+16). Rows in two
    micro-batches of several COPY chunks (batchsize 3). Decimals: Arrow wrote 1E-37 for a
    decimal(38,37) 1e-37, Spark's writer stores numeric's plain digits."""
    seed = seed_from_environment()
    generator = random.Random(seed)
    values = TEXT_DOUBLES + [random_double(generator) for _ in range(60)]
    values = [None if index % 11 == 10 else value for index, value in enumerate(values)]
    url = postgres.endpoint.url
    twin = f"{unique_name}_spark"
    with psycopg.connect(url, autocommit=True) as connection:
        for name in (unique_name, twin):
            connection.execute(
                f'CREATE TABLE "{name}" (id bigint, d text, f varchar(40), n text, m text)'
            )
    rows = pa.table(
        {
            "id": pa.array(range(len(values)), pa.int64()),
            "d": pa.array(values, pa.float64()),
            "f": pa.array([None if v is None else as_float32(v) for v in values], pa.float32()),
            "n": pa.array([text_decimal(v, 37) for v in values], pa.decimal128(38, 37)),
            "m": pa.array([text_decimal(v, 2) for v in values], pa.decimal128(38, 2)),
        }
    )
    source = tmp_path / "in"
    source.mkdir()
    half = len(values) // 2
    pq.write_table(rows.slice(0, half), source / "part-0000.parquet")
    pq.write_table(rows.slice(half), source / "part-0001.parquet")
    schema = "id BIGINT, d DOUBLE, f FLOAT, n DECIMAL(38,37), m DECIMAL(38,2)"
    options = {**sink_options(postgres.endpoint, unique_name), "batchsize": "3"}
    run_file_query(spark, source, tmp_path / "checkpoint", schema, options, 1)
    spark.read.schema(schema).parquet(str(source)).write.mode("append").jdbc(
        postgres.endpoint.jdbc_url,
        twin,
        properties=oracle_properties(postgres.endpoint, jdbc_writer),
    )
    with psycopg.connect(url) as connection:
        ours, oracle = (
            connection.execute(f'SELECT id, d, f, n, m FROM "{name}" ORDER BY id').fetchall()
            for name in (unique_name, twin)
        )
    assert ours == oracle, f"seed {seed}"
    assert ours[0][1:3] == ("1e-05", "1e-05")
    assert ours[0][3] == "0.0000100000000000000000000000000000000"
    assert pg_leftovers(url, unique_name) == (0, 0)


def test_a_double_too_long_for_a_varchar_names_its_row_of_the_task(postgres, unique_name):
    """Floats into text go one COPY per chunk: a refusal still names the task's row."""
    url = postgres.endpoint.url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'CREATE TABLE "{unique_name}" (id bigint, d varchar(8))')
    values = [1.0, 2.0, 3.0, 4.0, -1.2345678901234567e-300, 6.0]
    batch = pa.record_batch(
        [pa.array(range(len(values)), pa.int64()), pa.array(values, pa.float64())],
        names=["id", "d"],
    )
    with psycopg.connect(url) as connection, connection.cursor() as cursor:
        refusal = pytest.raises(JdbcWriteError, match=r"column 'd' .*\(row 5 of the task\).*long")
        with refusal:
            copy_batches(cursor, TableName(None, unique_name), ["id", "d"], [batch], 2)
