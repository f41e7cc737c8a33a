"""Crash-test driver: a directory of parquet files -> 2pc-jdbc, Trigger.AvailableNow.

Run with the same arguments again after a crash: it restarts from its checkpoint.
``repartition(2, "id")`` gives every batch two pieces (so between_piece_commits is
reachable) with disjoint keys (prepared upserts of one key in two tasks would wait).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.spark import local_session
from integration_tests.jdbc_fixtures import stream_input


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--write-mode", default="append")
    arguments = parser.parse_args()

    spark = local_session(app_name="jdbc-crash-driver")
    options = {
        "url": arguments.url, "user": arguments.user, "dbtable": arguments.table,
        "protocol": arguments.protocol, "writeMode": arguments.write_mode,
        "createTableIfNotExists": "true",
    }  # fmt: skip
    if arguments.write_mode == "upsert":
        options.update(upsertKeys="id", versionColumn="version")
    query = (
        stream_input(spark, Path(arguments.input), partitions=2)
        .writeStream.format("2pc-jdbc")
        .options(**options)
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
