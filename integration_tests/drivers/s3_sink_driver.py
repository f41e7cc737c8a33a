"""Crash-test driver: stream a directory of parquet files into ``format("2pc-s3")``.

One micro-batch per input file (``maxFilesPerTrigger=1``), two write tasks per batch
(round-robin repartition, so a batch has two pieces to commit), Trigger.AvailableNow,
then exit 0. Credentials come from boto3's default chain (AWS_ACCESS_KEY_ID etc. in the
environment). A run killed at a fault point is restarted with the same arguments, or in
a test's own SparkSession with ``start_query`` (the same query, so the same sink id).
Call faults are armed by the test through ``EOSPACK_FAULT_DIR`` in the environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from eospack.lab.testing import await_query
from eospack.tools.spark import local_session

SCHEMA = "id BIGINT, grp STRING"


def start_query(
    spark: Any,
    source: str,
    checkpoint: str,
    path: str,
    endpoint_url: str,
    partition_by: str = "",
    options: Mapping[str, str] | None = None,
) -> Any:
    """Start the driver's query in ``spark``; ``options`` adds sink options (credentials)."""
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(source)
        .repartition(2)
        .writeStream.format("2pc-s3")
        .option("endpointUrl", endpoint_url)
        .option("partitionBy", partition_by)
        .options(**(options or {}))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(path)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--partition-by", default="")
    arguments = parser.parse_args()

    spark = local_session(app_name="eospack-s3-crash-driver")
    query = start_query(
        spark,
        arguments.source,
        arguments.checkpoint,
        arguments.path,
        arguments.endpoint_url,
        arguments.partition_by,
    )
    await_query(query, timeout=120)
    spark.stop()


if __name__ == "__main__":
    main()
