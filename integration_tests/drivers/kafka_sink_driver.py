"""Crash-test driver: stream a directory of parquet files into ``format("2pc-kafka")``.

One micro-batch per input file (``maxFilesPerTrigger=1``), two write tasks per batch
(round-robin repartition, so a batch has two transactions to commit), each row one record
(key ``grp``, value ``id``), Trigger.AvailableNow, then exit 0. A run killed at a fault
point is restarted with the same arguments, or in a test's own SparkSession with
``start_query`` (the same query, so the same sink id).
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
    bootstrap: str,
    topic: str,
    options: Mapping[str, str] | None = None,
) -> Any:
    """Start the driver's query in ``spark``; ``options`` adds sink options."""
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(source)
        .repartition(2)
        .selectExpr("grp AS key", "CAST(id AS STRING) AS value")
        .writeStream.format("2pc-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .options(**(options or {}))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--master", default="local[2]", help="local[2,3]: tasks are retried")
    parser.add_argument("--option", action="append", default=[], help="NAME=VALUE sink option")
    arguments = parser.parse_args()

    spark = local_session(app_name="eospack-kafka-sink-crash-driver", master=arguments.master)
    options = dict(option.split("=", 1) for option in arguments.option)
    query = start_query(
        spark,
        arguments.source,
        arguments.checkpoint,
        arguments.bootstrap_servers,
        arguments.topic,
        options,
    )
    await_query(query, timeout=120)
    spark.stop()


if __name__ == "__main__":
    main()
