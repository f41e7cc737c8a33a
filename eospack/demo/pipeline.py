"""One counting pipeline of the demo, run as its own driver process (it gets SIGKILLed).

Reads the events topic with replayable-kafka, keeps a per-key ``running_count`` and
prints it with 2pc-jdbc into two tables: ``<name>_current`` (upsert, versionColumn, so a
printed count never moves backwards) and ``<name>_history`` (append: every printed
(key, count, version) with the micro-batch that printed it). Both are long-running queries
over one DataFrame with a ``processingTime`` trigger, as users run them; once
``--done-file`` exists (the sources have finished), each query processes what is left and
the driver exits 0: by then every event is counted.

    python -m eospack.demo.pipeline --name count_1 --bootstrap-servers ... --jdbc-url ...
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

POLL_SECONDS = 0.5
TABLES = ("current", "history")
MILESTONE_PREFIX = "eospack-pipeline milestone"
"""Lines ``<prefix> <name> <unix time>`` on stdout: where a (re)start spends its time."""


def milestone(name: str) -> None:
    print(f"{MILESTONE_PREFIX} {name} {time.time():.3f}", flush=True)


def source_option(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of --source-option, as a pair."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"--source-option wants NAME=VALUE, got {text!r}")
    return name, value


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True, help="pipeline name, prefix of its tables")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--jdbc-url", required=True)
    parser.add_argument("--jdbc-user", default=None)
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--done-file", required=True, type=Path)
    parser.add_argument("--guarantee", default="exactly-once")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=2000)
    parser.add_argument(
        "--trigger-interval", default="500 milliseconds", help="processingTime of both queries"
    )
    parser.add_argument(
        "--tables",
        nargs="+",
        choices=TABLES,
        default=list(TABLES),
        help="which of the two queries to run (the latency benchmark runs history only)",
    )
    parser.add_argument(
        "--source-option",
        action="append",
        default=[],
        type=source_option,
        metavar="NAME=VALUE",
        help="another replayable-kafka option (repeatable)",
    )
    return parser.parse_args(argv)


def sink_options(arguments: argparse.Namespace, table: str) -> dict[str, str]:
    options = {
        "url": arguments.jdbc_url,
        "dbtable": table,
        "deliveryGuarantee": arguments.guarantee,
        "createTableIfNotExists": "true",
    }
    if arguments.jdbc_user:
        options["user"] = arguments.jdbc_user
    password = os.environ.get("EOSPACK_DEMO_JDBC_PASSWORD")
    if password:
        options["password"] = password
    return options


def main(argv: list[str] | None = None) -> int:
    milestone("python")
    arguments = parse_arguments(argv)
    from eospack.spark import local_session
    from stateful_ops import running_count

    milestone("imports")
    spark = local_session(app_name=f"eospack-demo-{arguments.name}")
    milestone("session")
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(arguments.max_offsets_per_trigger))
        .options(**dict(arguments.source_option))
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
    )
    counts = running_count(events, "key", output_mode="append")
    table_options = {
        "current": {"writeMode": "upsert", "upsertKeys": "key", "versionColumn": "version"},
        "history": {"writeMode": "append", "batchIdColumn": "batch_id"},
    }

    queries = [
        counts.writeStream.format("2pc-jdbc")
        .queryName(f"{arguments.name}_{table}")
        .outputMode("append")
        .options(**sink_options(arguments, f"{arguments.name}_{table}"))
        .options(**table_options[table])
        .option("checkpointLocation", str(arguments.checkpoint_dir / table))
        .trigger(processingTime=arguments.trigger_interval)
        .start()
        for table in arguments.tables
    ]
    milestone("queries")
    while not arguments.done_file.exists():
        spark.streams.awaitAnyTermination(POLL_SECONDS)
        spark.streams.resetTerminated()
        for query in queries:
            if not query.isActive:
                raise RuntimeError(f"{query.name} stopped: {query.exception()}")
    # The sources have finished: count what is there, then stop.
    for query in queries:
        query.processAllAvailable()
        query.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
