"""The Kafka record schema is defined once in Python (``records/schema.py``); the native
decoder (``native/src/decode.rs``) builds its own in Rust. These hold the forms together:
the Spark schema the source declares, the Arrow schema the reference decoder builds and
the schema of what the native decoder hands over are one schema."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from eospack.connectors.kafka.records import record_batches
from eospack.connectors.kafka.records.schema import FIELDS, arrow_schema, spark_schema

HEADERS = (False, True)


@pytest.mark.parametrize("include_headers", HEADERS)
def test_the_spark_and_arrow_forms_are_one_schema(include_headers: bool) -> None:
    spark_as_arrow = to_arrow_schema(spark_schema(include_headers), timezone="UTC")
    assert spark_as_arrow == arrow_schema(include_headers)
    names = [name for name, _ in FIELDS] + (["headers"] if include_headers else [])
    assert spark_schema(include_headers).fieldNames() == names


def one_encoded_batch() -> bytes:
    rows = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([b"k"], pa.binary()),
            "value": pa.array([b"v"], pa.binary()),
            "headers": pa.array([[{"key": "h", "value": b"1"}]], record_batches.HEADERS),
        }
    )
    settings = record_batches.EncodeSettings(1, 1 << 20, 1 << 20, "none", 1_700_000_000_000)
    batches, _ = record_batches.encode(rows, settings, 0, native=False)
    return bytes(batches[0].data)


@pytest.mark.parametrize("include_headers", HEADERS)
def test_the_reference_decoder_builds_the_record_schema(include_headers: bool) -> None:
    decoded = record_batches.decode(
        one_encoded_batch(),
        0,
        "t",
        0,
        read_committed=False,
        include_headers=include_headers,
        native=False,
    )
    assert decoded.batch.num_rows == 1
    assert decoded.batch.schema == arrow_schema(include_headers)


@pytest.mark.skipif(record_batches.NATIVE is None, reason="the native path is not built")
@pytest.mark.parametrize("include_headers", HEADERS)
def test_the_native_decoder_builds_the_record_schema(include_headers: bool) -> None:
    decoded = record_batches.decode(
        one_encoded_batch(),
        0,
        "t",
        0,
        read_committed=False,
        include_headers=include_headers,
        native=True,
    )
    assert decoded.batch.num_rows == 1
    assert decoded.batch.schema == arrow_schema(include_headers)
