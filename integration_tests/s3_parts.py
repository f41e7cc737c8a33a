"""Shared by the 2pc-s3 integration tests: typed input rows and files, streaming runs, and
reads of what the bucket holds."""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from eospack.lab.testing import await_query

QUERY_TIMEOUT = 120.0


SCHEMA_DDL = "id BIGINT, grp STRING, day DATE, amount DOUBLE, at TIMESTAMP, flag BOOLEAN"


def rows_of(first: int, count: int) -> list[tuple[Any, ...]]:
    return [
        (
            i,
            f"g{i % 3}",
            datetime.date(2024, 1, 1 + i % 2),
            i * 0.5,
            datetime.datetime(2024, 5, 1, 12, 0, i % 60),
            i % 2 == 0,
        )
        for i in range(first, first + count)
    ]


ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("grp", pa.string()),
        ("day", pa.date32()),
        ("amount", pa.float64()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("flag", pa.bool_()),
    ]
)


def write_source(spark: Any, directory: Path, batches: Sequence[list[tuple[Any, ...]]]) -> Any:
    """One parquet file per future micro-batch (read with maxFilesPerTrigger=1); returns
    the rows as Spark reads them back, sorted: what the sink must reproduce."""
    for number, rows in enumerate(batches):
        columns = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [
                pa.array(column, field.type)
                for column, field in zip(columns, ARROW_SCHEMA, strict=True)
            ],
            schema=ARROW_SCHEMA,
        )
        pq.write_table(table, directory / f"part-{number:03d}.parquet")
    return sorted(
        tuple(row) for row in spark.read.schema(SCHEMA_DDL).parquet(str(directory)).collect()
    )


def connection_options(s3: Any) -> dict[str, str]:
    endpoint = s3.endpoint
    return {
        "endpointUrl": endpoint.endpoint_url,
        "region": endpoint.region,
        "accessKeyId": endpoint.access_key_id,
        "secretAccessKey": endpoint.secret_access_key,
    }


def run_stream(
    spark: Any,
    source: Path,
    checkpoint: Path,
    path: str,
    options: dict[str, str],
    files_per_trigger: int = 1,
    partitions: int = 2,
) -> None:
    frame = (
        spark.readStream.schema(SCHEMA_DDL)
        .option("maxFilesPerTrigger", files_per_trigger)
        .parquet(str(source))
    )
    query = (
        frame.repartition(partitions)
        .writeStream.format("2pc-s3")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(path)
    )
    await_query(query, QUERY_TIMEOUT)


def read_committed(spark: Any, s3: Any, path: str, columns: str = "*") -> list[tuple[Any, ...]]:
    frame = spark.read.format("2pc-s3").options(**connection_options(s3)).load(path)
    return sorted(tuple(row) for row in frame.selectExpr(columns).collect())


def open_uploads(s3: Any, prefix: str) -> list[dict[str, Any]]:
    answer = s3.endpoint.client().list_multipart_uploads(
        Bucket=s3.endpoint.bucket, Prefix=f"{prefix}/"
    )
    return list(answer.get("Uploads", ()))


def arrow_batches(rows: int, width: int = 1000) -> Iterator[pa.RecordBatch]:
    rng = random.Random(3)
    for start in range(0, rows, 2000):
        count = min(2000, rows - start)
        yield pa.record_batch(
            {
                "id": pa.array(range(start, start + count), pa.int64()),
                "blob": [rng.randbytes(width) for _ in range(count)],
            }
        )
