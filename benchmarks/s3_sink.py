"""6. 2pc-s3 MB/s into the S3 endpoint versus boto3 upload_fileobj of the same Parquet bytes."""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.data import parquet_directory
from benchmarks.harness import Comparison, Figure, Report, measure, say
from benchmarks.jdbc_sink import SCHEMA
from eospack.testing import await_query

TIMEOUT = 900.0


def write_with_eospack(spark: Any, directory: Path, endpoint: Any, prefix: str) -> None:
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
        .writeStream.format("2pc-s3")
        .option("path", f"s3://{endpoint.bucket}/{prefix}")
        .option("endpointUrl", endpoint.endpoint_url)
        .option("region", endpoint.region)
        .option("accessKeyId", endpoint.access_key_id)
        .option("secretAccessKey", endpoint.secret_access_key)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-s3-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def data_bytes_under(client: Any, bucket: str, prefix: str) -> int:
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        total += sum(
            item["Size"] for item in page.get("Contents", []) if "/_eospack/" not in item["Key"]
        )
    return total


def run(report: Report, spark: Any, s3: Any, workdir: Path, rows: int, repetitions: int) -> None:
    endpoint = s3.endpoint
    client = endpoint.client()
    directory = parquet_directory(workdir / f"s3-rows-{rows}", rows)
    say(f"s3: {rows:,} rows as Parquet through 2pc-s3")
    prefixes: list[str] = []

    def write() -> None:
        prefixes.append(f"bench-s3/{time.time_ns()}")
        write_with_eospack(spark, directory, endpoint, prefixes[-1])

    ours_seconds = measure(write, repetitions)
    written = data_bytes_under(client, endpoint.bucket, prefixes[-1])
    say(f"s3: boto3 upload_fileobj of the same {written / 2**20:.1f} MiB of Parquet")
    files = sorted(directory.glob("*.parquet"))
    payloads = []
    for path in files:
        buffer = io.BytesIO()
        pq.write_table(pq.read_table(path), buffer)
        payloads.append(buffer.getvalue())
    scale = written / max(1, sum(len(p) for p in payloads))

    def upload() -> None:
        for index, payload in enumerate(payloads):
            key = f"bench-s3-baseline/{time.time_ns()}-{index}.parquet"
            client.upload_fileobj(io.BytesIO(payload), endpoint.bucket, key)

    baseline_seconds = measure(upload, repetitions)
    ours = Figure("2pc-s3", ours_seconds, written / 2**20, "MB/s")
    baseline = Figure(
        "boto3 upload_fileobj", baseline_seconds, sum(len(p) for p in payloads) / 2**20, "MB/s"
    )
    report.notes.append(
        f"s3: 2pc-s3 wrote {written / 2**20:.1f} MiB; the baseline uploaded the input files"
        f" re-encoded as Parquet ({scale:.2f}x of that size); ratios compare MB/s."
    )
    report.add(Comparison("6. s3 sink", f"{rows:,} rows", ours, baseline, 0.7))
