"""Which COPY format 2pc-jdbc picks for a table's column types (pure logic; the values
themselves are checked against PostgreSQL in integration_tests/jdbc/test_jdbc_types.py)."""

from __future__ import annotations

import pyarrow as pa

from eospack.connectors.jdbc.binary_copy import BinaryEncoding

SPARK_ARROW = pa.schema(
    [
        ("big", pa.int64()),
        ("whole", pa.int32()),
        ("tiny", pa.int8()),
        ("single", pa.float32()),
        ("flag", pa.bool_()),
        ("amount", pa.decimal128(38, 10)),
        ("label", pa.string()),
        ("payload", pa.binary()),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="Europe/Paris")),
        ("local", pa.timestamp("us")),
    ]
)
SINK_TYPES = {
    "big": "int8",
    "whole": "int4",
    "tiny": "int2",
    "single": "float4",
    "flag": "bool",
    "amount": "numeric",
    "label": "text",
    "payload": "bytea",
    "day": "date",
    "at": "timestamptz",
    "local": "timestamp",
}


def test_tables_the_sink_creates_are_copied_in_binary() -> None:
    encoding = BinaryEncoding(SPARK_ARROW.names, SPARK_ARROW, SINK_TYPES)
    assert encoding.binary, encoding.fallback_reason
    assert encoding.schema.field("tiny").type == pa.int16()
    assert encoding.schema.field("at").type == pa.timestamp("us")


def test_a_column_without_an_exact_binary_encoding_makes_the_copy_csv() -> None:
    for name, type_name in [("big", "int4"), ("label", "numeric"), ("label", "uuid")]:
        encoding = BinaryEncoding(SPARK_ARROW.names, SPARK_ARROW, {**SINK_TYPES, name: type_name})
        assert not encoding.binary
        assert f"column {name!r}" in (encoding.fallback_reason or "")


def test_csv_gets_the_same_values_as_binary_for_the_encodable_columns() -> None:
    """A float32 into a double column is sent as its exact double in CSV too, dictionary
    columns are decoded, zoned timestamps keep their UTC instant."""
    schema = pa.schema(
        [
            ("single", pa.float32()),
            ("label", pa.dictionary(pa.int32(), pa.string())),
            ("at", pa.timestamp("us", tz="Europe/Paris")),
            ("amount", pa.string()),
        ]
    )
    types = {"single": "float8", "label": "varchar", "at": "timestamptz", "amount": "numeric"}
    encoding = BinaryEncoding(schema.names, schema, types)
    assert not encoding.binary
    table = pa.table(
        [
            pa.array([0.1], pa.float32()),
            pa.array(["x"]).dictionary_encode(),
            pa.array([0], pa.timestamp("us", tz="Europe/Paris")),
            pa.array(["1.5"]),
        ],
        schema=schema,
    )
    ready = encoding.with_wire_types(table)
    assert ready.column("single").to_pylist() == [0.10000000149011612]
    assert ready.column("label").type == pa.string()
    assert ready.column("at").type == pa.timestamp("us")
    assert ready.column("at").cast(pa.int64()).to_pylist() == [0]
    assert ready.column("amount").to_pylist() == ["1.5"]


def test_the_binary_stream_has_header_rows_and_trailer() -> None:
    schema = pa.schema([("big", pa.int32())])
    encoding = BinaryEncoding(["big"], schema, {"big": "int8"})
    table = pa.table([pa.array([1, None], pa.int32())], schema=schema)
    stream = b"".join(encoding.encode([table]))
    header = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
    row_one = b"\x00\x01" + b"\x00\x00\x00\x08" + (1).to_bytes(8, "big")
    row_null = b"\x00\x01" + b"\xff\xff\xff\xff"
    assert stream == header + row_one + row_null + b"\xff\xff"
