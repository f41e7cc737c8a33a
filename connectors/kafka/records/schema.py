"""The Kafka record schema, written once: the rows replayable-kafka gives Spark, as Spark's
own ``format("kafka")`` has them (``headers`` last, with includeHeaders).

``FIELDS`` is the one definition; ``spark_schema`` and ``arrow_schema`` are its Spark and
Arrow forms. The source's driver, its executor reader and the pure-Python decoder take the
schema from here. The native decoder (``native/src/decode.rs``) builds the same schema in
Rust; ``tests/test_kafka_record_schema.py`` holds the two together.

This module imports neither pyspark nor pyarrow at import time: Spark's planner processes
ask for the schema and must not pay for pyarrow (``tests/test_kafka_source_imports.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

ColumnType = Literal["binary", "string", "int", "long", "timestamp"]

FIELDS: tuple[tuple[str, ColumnType], ...] = (
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
)
"""The columns of every record, in order, every one nullable."""

HEADERS_COLUMN = "headers"
"""The last column with includeHeaders: a list of (``key`` string, ``value`` binary)."""

HEADER_FIELDS: tuple[tuple[str, ColumnType], ...] = (("key", "string"), ("value", "binary"))
"""The fields of one header."""

HEADERS_ITEM_NAME = "element"
"""The name of the Arrow list's item field (pyspark's Arrow conversion names it so)."""


def spark_schema(include_headers: bool) -> StructType:
    """The rows' Spark schema."""
    from pyspark.sql.types import ArrayType, StructField, StructType

    fields = [StructField(name, _spark_type(kind)) for name, kind in FIELDS]
    if include_headers:
        header = StructType([StructField(name, _spark_type(kind)) for name, kind in HEADER_FIELDS])
        fields.append(StructField(HEADERS_COLUMN, ArrayType(header)))
    return StructType(fields)


def arrow_header_item() -> pa.StructType:
    """One header as an Arrow struct."""
    import pyarrow as pa

    return pa.struct([pa.field(name, _arrow_type(kind)) for name, kind in HEADER_FIELDS])


def arrow_headers() -> pa.ListType:
    """The ``headers`` column's Arrow type."""
    import pyarrow as pa

    return pa.list_(pa.field(HEADERS_ITEM_NAME, arrow_header_item()))


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The rows' Arrow schema (pyspark's Arrow types for ``spark_schema``)."""
    import pyarrow as pa

    fields = [pa.field(name, _arrow_type(kind)) for name, kind in FIELDS]
    if include_headers:
        fields.append(pa.field(HEADERS_COLUMN, arrow_headers()))
    return pa.schema(fields)


def _spark_type(kind: ColumnType) -> DataType:
    from pyspark.sql import types

    return {
        "binary": types.BinaryType,
        "string": types.StringType,
        "int": types.IntegerType,
        "long": types.LongType,
        "timestamp": types.TimestampType,
    }[kind]()


def _arrow_type(kind: ColumnType) -> pa.DataType:
    import pyarrow as pa

    return {
        "binary": pa.binary(),
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }[kind]
