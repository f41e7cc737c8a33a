"""Crash-test driver of 2pc-jdbc ``writeMode=changes``, Trigger.AvailableNow, two sources:

- ``files``: a directory of parquet change files (``jdbc_changes_parts``), one per batch,
  ``repartition(2, "id")`` (two pieces per batch, so between_piece_commits is reachable,
  with disjoint keys: prepared upserts of one key in two tasks would wait on each other);
- ``debezium``: one Debezium JSON topic per table (``<prefix>.<table>``) read with
  ``replayable-kafka``, one query per table, the recipe of docs/connectors/2pc-jdbc.md
  ("Change streams (Debezium)").

Run with the same arguments again after a crash: it restarts from its checkpoints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from eospack.lab.testing import await_query
from eospack.tools.spark import local_session
from integration_tests.jdbc_changes_parts import CHANGE_SCHEMA_DDL, PASSWORD_VARIABLE

ENVELOPE = (
    "before STRUCT<id BIGINT, name STRING>, after STRUCT<id BIGINT, name STRING>,"
    " op STRING, source STRUCT<lsn BIGINT, ts_ms BIGINT>"
)
"""The part of Debezium's JSON envelope the recipe reads (the row images' columns are the
table's)."""


def debezium_changes(spark: SparkSession, servers: str, topic: str, per_trigger: str) -> DataFrame:
    """The recipe: Debezium events -> id, name (the row image: ``after``, or ``before`` for
    a delete), lsn (the version) and op, the columns ``writeMode=changes`` expects."""
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .load()
        .where(F.col("value").isNotNull())  # the tombstone record Debezium sends after a delete
        .select(F.from_json(F.col("value").cast("string"), ENVELOPE).alias("event"))
    )
    return events.select(
        F.coalesce("event.after", "event.before").alias("row"),
        F.col("event.source.lsn").alias("lsn"),
        F.col("event.op").alias("op"),
    ).select("row.*", "lsn", "op")


def sink_options(arguments: argparse.Namespace, table: str, version: str) -> dict[str, str]:
    options = {
        "url": arguments.url,
        "user": arguments.user,
        "dbtable": table,
        "protocol": arguments.protocol,
        "writeMode": "changes",
        "upsertKeys": "id",
        "versionColumn": version,
        "createTableIfNotExists": "true",
    }
    if os.environ.get(PASSWORD_VARIABLE):
        options["password"] = os.environ[PASSWORD_VARIABLE]
    return options


def start_queries(spark: SparkSession, arguments: argparse.Namespace) -> list[Any]:
    checkpoint = Path(arguments.checkpoint)
    if arguments.source == "files":
        frame = (
            spark.readStream.schema(CHANGE_SCHEMA_DDL)
            .option("maxFilesPerTrigger", 1)
            .parquet(arguments.input)
            .repartition(2, "id")
        )
        tables = [(arguments.tables, frame, "version")]
    else:
        tables = [
            (
                arguments.target_prefix + table,
                debezium_changes(
                    spark,
                    arguments.bootstrap_servers,
                    f"{arguments.topic_prefix}.{table}",
                    arguments.max_offsets_per_trigger,
                ),
                "lsn",
            )
            for table in arguments.tables.split(",")
        ]
    return [
        frame.writeStream.format("2pc-jdbc")
        .options(**sink_options(arguments, table, version))
        .option("checkpointLocation", str(checkpoint / table))
        .trigger(availableNow=True)
        .start()
        for table, frame, version in tables
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", choices=("files", "debezium"), required=True)
    parser.add_argument("--input", help="files: the directory of change files")
    parser.add_argument("--bootstrap-servers", help="debezium: the broker")
    parser.add_argument("--topic-prefix", help="debezium: topics are <prefix>.<table>")
    parser.add_argument("--max-offsets-per-trigger", default="200")
    parser.add_argument("--tables", required=True, help="comma-separated tables")
    parser.add_argument("--target-prefix", default="", help="debezium: target = prefix + table")
    parser.add_argument("--checkpoint", required=True, help="one checkpoint per table below")
    parser.add_argument("--url", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--protocol", default="auto")
    arguments = parser.parse_args()
    spark = local_session(app_name="jdbc-changes-driver", master="local[2]")
    for query in start_queries(spark, arguments):
        await_query(query, 600)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
