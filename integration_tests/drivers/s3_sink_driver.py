"""Crash-test driver: stream a directory of parquet files into ``format("2pc-s3")``.

One micro-batch per input file (``maxFilesPerTrigger=1``), two write tasks per batch
(round-robin repartition, so a batch has two pieces to commit), Trigger.AvailableNow,
then exit 0. Credentials come from boto3's default chain (AWS_ACCESS_KEY_ID etc. in the
environment). A run killed at a fault point is restarted with the same arguments.
"""

from __future__ import annotations

import argparse

from eospack.spark import local_session
from eospack.testing import await_query

SCHEMA = "id BIGINT, grp STRING"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--partition-by", default="")
    arguments = parser.parse_args()

    spark = local_session(app_name="eospack-s3-crash-driver")
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(arguments.source)
        .repartition(2)
        .writeStream.format("2pc-s3")
        .option("endpointUrl", arguments.endpoint_url)
        .option("partitionBy", arguments.partition_by)
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(availableNow=True)
        .start(arguments.path)
    )
    await_query(query, timeout=120)
    spark.stop()


if __name__ == "__main__":
    main()
