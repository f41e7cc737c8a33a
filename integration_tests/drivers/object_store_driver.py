"""Crash-test driver: replayable-kafka into a 2pc sink with the checkpoint on ``s3a://``.

``--pipeline counts``: the events' keys -> running_count (key_groups 4) -> 2pc-jdbc in
append mode (every (key, count, version) fact is a row, so a batch applied twice or lost
shows as a doubled or missing version). ``--pipeline events``: each event -> 2pc-kafka
(key and value as read, two write tasks a batch). Trigger.AvailableNow with
``maxOffsetsPerTrigger``, then exit 0.

The session gets the hadoop-aws jars (``--jar``, driver class path: local mode runs its
executor in the driver JVM) and the S3A settings of ``--s3-endpoint``; credentials come
from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, never an argument. A run killed at a
fault point is restarted in a test's own session with ``start_query`` (the same query).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integration_tests.s3.object_store_parts import s3a_settings

KEY_GROUPS = 4


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", choices=("counts", "events"), required=True)
    parser.add_argument("--checkpoint", required=True, help="an s3a:// URI")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--source-topic", required=True)
    parser.add_argument("--max-offsets", default="100")
    parser.add_argument("--jdbc-url")
    parser.add_argument("--jdbc-user")
    parser.add_argument("--table")
    parser.add_argument("--topic", help="events: the 2pc-kafka topic (its ledger: <topic>_ledger)")
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--s3-region", default="us-east-1")
    parser.add_argument("--jar", action="append", default=[], help="a hadoop-aws jar")
    return parser.parse_args(argv)


def start_query(spark: Any, arguments: argparse.Namespace) -> Any:
    """Start the driver's query on ``spark`` (this driver's session, or a test's own)."""
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.source_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", arguments.max_offsets)
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
    )
    if arguments.pipeline == "counts":
        from eospack.stateful_ops import running_count

        counts = running_count(
            events.select("key"), "key", key_groups=KEY_GROUPS, output_mode="append"
        )
        writer = (
            counts.writeStream.format("2pc-jdbc")
            .option("url", arguments.jdbc_url)
            .option("user", arguments.jdbc_user)
            .option("dbtable", arguments.table)
            .option("createTableIfNotExists", "true")
        )
    else:
        writer = (
            events.repartition(2)  # two pieces a batch: between_piece_commits is reachable
            .writeStream.format("2pc-kafka")
            .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
            .option("topic", arguments.topic)
            .option("ledgerTopic", f"{arguments.topic}_ledger")
        )
    return (
        writer.option("checkpointLocation", arguments.checkpoint).trigger(availableNow=True).start()
    )


def main() -> int:
    from eospack.lab.testing import await_query
    from eospack.tools.spark import local_session

    arguments = parse_arguments()
    conf = {
        "spark.driver.extraClassPath": ":".join(arguments.jar),
        **{
            f"spark.hadoop.{key}": value
            for key, value in s3a_settings(arguments.s3_endpoint, arguments.s3_region).items()
        },
    }
    spark = local_session(app_name="eospack-object-store-driver", conf=conf)
    await_query(start_query(spark, arguments), timeout=240)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
