"""A Spark Connect client running the flagship pipeline once (Trigger.AvailableNow):
replayable-kafka -> running_count -> 2pc-jdbc upserts, planned and run on the server.

A client of its own process: a Connect session switches pyspark into Connect mode for the
whole process, which the test process's classic session must not see.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import eospack
from eospack.lab.testing import await_query
from eospack.stateful_ops import running_count

DONE_LINE = "connect pipeline: batch run finished"


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("--remote", "--bootstrap-servers", "--topic", "--url", "--user", "--table"):
        parser.add_argument(name, required=True)
    parser.add_argument("--checkpoint", required=True, help="a path on the server's machine")
    arguments = parser.parse_args()
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(arguments.remote).getOrCreate()
    eospack.register(spark)
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
    )
    query = (
        running_count(events, "key", output_mode="append")
        .writeStream.format("2pc-jdbc")
        .outputMode("append")
        .option("url", arguments.url)
        .option("user", arguments.user)
        .option("dbtable", arguments.table)
        .option("createTableIfNotExists", "true")
        .option("writeMode", "upsert")
        .option("upsertKeys", "key")
        .option("versionColumn", "version")
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, 240)
    print(DONE_LINE, flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
