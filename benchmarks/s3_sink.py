"""6. 2pc-s3 MB/s into the S3 endpoint versus boto3 upload_fileobj of the same Parquet bytes.

Besides the query (the figure the target is about) two context figures say where the time
goes: the same Spark query into the ``noop`` sink (what Spark itself costs to read the
files and run the micro-batches: the ceiling of any Spark sink here) and the sink's own
write path without Spark (``TaskWriter`` encoding Arrow batches to Parquet and uploading
them as multipart parts, then completing them), each against the same upload baseline.
"""

from __future__ import annotations

import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from benchmarks.data import parquet_directory, parquet_stream
from benchmarks.harness import Comparison, Figure, Report, measure, say
from commit_protocols import TaskIdentity
from connectors.s3.client import s3_client
from connectors.s3.options import parse_sink_options
from connectors.s3.resource import complete_file
from connectors.s3.writer import TaskWriter
from eospack.testing import await_query

TIMEOUT = 900.0


def write_with_eospack(spark: Any, directory: Path, endpoint: Any, prefix: str) -> None:
    query = (
        parquet_stream(spark, directory)
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


def read_with_spark_into_noop(spark: Any, directory: Path) -> None:
    query = (
        parquet_stream(spark, directory)
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-s3-noop-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def write_path_without_spark(endpoint: Any, files: list[Path]) -> Callable[[], None]:
    """Each file as one task would write it: Arrow batches of 10,000 rows (Spark's
    maxRecordsPerBatch) into ``TaskWriter.prepare``, then the driver's completion."""
    options = parse_sink_options(
        {
            "path": f"s3://{endpoint.bucket}/bench-s3-write-path",
            "endpointUrl": endpoint.endpoint_url,
            "region": endpoint.region,
            "accessKeyId": endpoint.access_key_id,
            "secretAccessKey": endpoint.secret_access_key,
            "checkpointLocation": tempfile.mkdtemp(prefix="bench-s3-path-"),
        }
    )
    client = s3_client(options.connection)
    batches = [pq.read_table(path).to_batches(max_chunksize=10_000) for path in files]

    def write() -> None:
        attempt = f"{time.time_ns():x}"
        for partition, file_batches in enumerate(batches):
            task = TaskIdentity("benchmark", 0, partition, attempt)
            piece = TaskWriter(options, client).prepare(task, iter(file_batches))
            for file in piece.handle["files"]:
                complete_file(client, endpoint.bucket, file)

    return write


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
    say("s3: context: the same Spark query into the noop sink; the write path without Spark")
    noop_seconds = measure(lambda: read_with_spark_into_noop(spark, directory), repetitions)
    path_seconds = measure(write_path_without_spark(endpoint, files), repetitions)
    megabytes = written / 2**20
    ours = Figure("2pc-s3", ours_seconds, megabytes, "MB/s")
    baseline = Figure(
        "boto3 upload_fileobj", baseline_seconds, sum(len(p) for p in payloads) / 2**20, "MB/s"
    )
    report.notes.append(
        f"s3: 2pc-s3 wrote {megabytes:.1f} MiB in {len(files)} micro-batches; the baseline"
        f" uploaded the input files re-encoded as Parquet ({scale:.2f}x of that size); ratios"
        " compare MB/s. Context rows: Spark's own cost (the same query into the noop sink,"
        " counted as if it had written those MiB) and the sink's encode-and-upload path"
        " without Spark."
    )
    size = f"{rows:,} rows"
    report.add(Comparison("6. s3 sink", size, ours, baseline, 0.7))
    noop = Figure("Spark query into noop (ceiling)", noop_seconds, megabytes, "MB/s")
    report.add(Comparison("6. s3: Spark's own cost", size, noop, baseline))
    path = Figure("2pc-s3 write path, no Spark", path_seconds, megabytes, "MB/s")
    report.add(Comparison("6. s3: sink write path", size, path, baseline))
