"""Crash-test driver: a directory of parquet files -> 2pc-jdbc, Trigger.AvailableNow.

Run with the same arguments again after a crash: it restarts from its checkpoint. Tests
run the runs that need no crash in their own session instead (``start_query``): the same
query, without a JVM start.
``repartition(2, "id")`` gives every batch two pieces (so between_piece_commits is
reachable) with disjoint keys (prepared upserts of one key in two tasks would wait).
``--merge-schema`` reads one more column, ``note STRING`` (NULL in files without it), with
``mergeSchema=true``: a restart with a column added upstream. ``--checkpoint-form`` gives
the checkpoint the three ways users do: the option with a path, the option with a
``file://`` URI, or ``spark.sql.streaming.checkpointLocation`` with a query name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.tools.spark import local_session
from integration_tests.jdbc_fixtures import INPUT_SCHEMA_DDL, stream_input

CHECKPOINT_CONF = "spark.sql.streaming.checkpointLocation"
EXECUTORS_LINE = "executors at the end: "


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--checkpoint-form", choices=("path", "uri", "conf"), default="path")
    parser.add_argument("--url", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--protocol", required=True)
    parser.add_argument("--write-mode", default="append")
    parser.add_argument("--lock-timeout", default=None)
    parser.add_argument("--merge-schema", action="store_true")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    return parser.parse_args(argv)


def start_query(spark: Any, arguments: argparse.Namespace) -> Any:
    """Start the query on ``spark`` (this driver's session, or a test's own session)."""
    options = {
        "url": arguments.url,
        "user": arguments.user,
        "dbtable": arguments.table,
        "protocol": arguments.protocol,
        "writeMode": arguments.write_mode,
        "createTableIfNotExists": "true",
    }
    if arguments.write_mode == "upsert":
        options.update(upsertKeys="id", versionColumn="version")
    if arguments.lock_timeout:
        options["lockTimeout"] = arguments.lock_timeout
    schema = INPUT_SCHEMA_DDL
    if arguments.merge_schema:
        options["mergeSchema"] = "true"
        schema += ", note STRING"
    writer = (
        stream_input(spark, Path(arguments.input), partitions=2, schema=schema)
        .writeStream.format("2pc-jdbc")
        .options(**options)
        .trigger(availableNow=True)
    )
    if arguments.checkpoint_form == "path":
        writer = writer.option("checkpointLocation", arguments.checkpoint)
    elif arguments.checkpoint_form == "uri":
        writer = writer.option("checkpointLocation", Path(arguments.checkpoint).as_uri())
    else:
        spark.conf.set(CHECKPOINT_CONF, arguments.checkpoint)
        writer = writer.queryName("jdbc_crash_driver")
    return writer.start()


def main() -> int:
    arguments = parse_arguments()
    conf = dict(setting.split("=", 1) for setting in arguments.conf)
    spark = local_session(app_name="jdbc-crash-driver", master=arguments.master, conf=conf)
    start_query(spark, arguments).awaitTermination()
    # the driver is in the list too: what a cluster test checks it ran on
    executors = len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1
    print(f"{EXECUTORS_LINE}{executors}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
