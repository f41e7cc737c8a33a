"""One counting pipeline of the demo, run as its own driver process (it gets SIGKILLed).

Reads the events topic with replayable-kafka and keeps a per-key ``running_count``. With
``--sink jdbc`` (default) it prints the counts with 2pc-jdbc into two tables:
``<name>_current`` (upsert, versionColumn, so a printed count never moves backwards) and
``<name>_history`` (append: every printed (key, count, version) with the micro-batch that
printed it). With ``--sink kafka`` it prints them with 2pc-kafka into ``--output-topic``:
one record per printed count, keyed by the key, its value the JSON
``{"count": ..., "version": ...}``. One query is enough there: the topic is the history,
and its last record per key is the current count. The sink partitions by key (no
partition column), so a key's records keep their order in one partition.

Each query is a long-running one with a ``processingTime`` trigger, as users run them,
with its checkpoint in ``--checkpoint-dir/<query>`` (``current`` and ``history``, or
``output``); once ``--done-file`` exists (the sources have finished), each query
processes what is left and the driver exits 0: by then every event is counted.

    python -m eospack.lab.demo.pipeline --name count_1 --bootstrap-servers ... --jdbc-url ...
    python -m eospack.lab.demo.pipeline --name count_1 --bootstrap-servers ... --sink kafka
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_SECONDS = 0.5
TABLES = ("current", "history")
KAFKA_QUERY = "output"
"""The one query of ``--sink kafka``: its name suffix and checkpoint directory."""
QUERY_DIRECTORIES = (*TABLES, KAFKA_QUERY)
"""Every checkpoint directory a pipeline may have under ``--checkpoint-dir``."""
SINKS = ("jdbc", "kafka")
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
    parser.add_argument(
        "--sink", choices=SINKS, default="jdbc", help="2pc-jdbc tables (default) or 2pc-kafka"
    )
    parser.add_argument("--jdbc-url", default=None, help="required with --sink jdbc")
    parser.add_argument("--jdbc-user", default=None)
    parser.add_argument(
        "--output-topic", default=None, help="--sink kafka: where to print (<name>_out)"
    )
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--done-file", required=True, type=Path)
    parser.add_argument("--guarantee", default="exactly-once")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=2000)
    parser.add_argument(
        "--trigger-interval", default="500 milliseconds", help="processingTime of the queries"
    )
    parser.add_argument(
        "--tables",
        nargs="+",
        choices=TABLES,
        default=None,
        help="--sink jdbc: which of the two queries to run (default both; the latency"
        " benchmark runs history only)",
    )
    parser.add_argument(
        "--source-option",
        action="append",
        default=[],
        type=source_option,
        metavar="NAME=VALUE",
        help="another replayable-kafka option (repeatable)",
    )
    arguments = parser.parse_args(argv)
    # Checked here, before a Spark session starts: a missing option fails in a second.
    if arguments.sink == "jdbc":
        if not arguments.jdbc_url:
            parser.error("--sink jdbc needs --jdbc-url (jdbc:postgresql://host:port/db)")
        if arguments.output_topic:
            parser.error("--output-topic applies to --sink kafka")
        arguments.tables = arguments.tables or list(TABLES)
    else:
        if arguments.jdbc_url or arguments.jdbc_user or arguments.tables:
            parser.error("--jdbc-url, --jdbc-user and --tables apply to --sink jdbc")
        arguments.output_topic = arguments.output_topic or f"{arguments.name}_out"
    return arguments


@dataclass(frozen=True)
class PipelineCommand:
    """The command line of this pipeline as a driver process: ``python <arguments()>``.

    The one place that writes it, beside ``parse_arguments`` that reads it: the demo's
    orchestrator, the crash tests and the benchmarks all start the pipeline through it, so a
    flag renamed or added here cannot be missed by one of them. An option left ``None`` is
    not passed, and the pipeline's own default applies. The sink's options are set by the
    demo's output (``eospack.lab.demo.outputs``) with ``dataclasses.replace``.
    """

    name: str
    bootstrap_servers: str
    topic: str
    checkpoint_dir: Path
    done_file: Path
    sink: str | None = None
    jdbc_url: str | None = None
    jdbc_user: str | None = None
    output_topic: str | None = None
    guarantee: str | None = None
    max_offsets_per_trigger: int | None = None
    trigger_interval: str | None = None
    more: Sequence[str] = ()
    """Further arguments as they are (``--tables``, ``--source-option``)."""

    def arguments(self) -> list[str]:
        arguments = [
            "-m",
            "eospack.lab.demo.pipeline",
            "--name",
            self.name,
            "--bootstrap-servers",
            self.bootstrap_servers,
            "--topic",
            self.topic,
            "--checkpoint-dir",
            str(self.checkpoint_dir),
            "--done-file",
            str(self.done_file),
        ]
        optional = {
            "--sink": self.sink,
            "--jdbc-url": self.jdbc_url,
            "--jdbc-user": self.jdbc_user,
            "--output-topic": self.output_topic,
            "--guarantee": self.guarantee,
            "--max-offsets-per-trigger": self.max_offsets_per_trigger,
            "--trigger-interval": self.trigger_interval,
        }
        for flag, value in optional.items():
            if value is not None:
                arguments += [flag, str(value)]
        return [*arguments, *self.more]


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


def start_jdbc_queries(counts: Any, arguments: argparse.Namespace) -> list[Any]:
    """``<name>_current`` and ``<name>_history`` (or those of ``--tables``)."""
    table_options = {
        "current": {"writeMode": "upsert", "upsertKeys": "key", "versionColumn": "version"},
        "history": {"writeMode": "append", "batchIdColumn": "batch_id"},
    }
    return [
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


def start_kafka_query(counts: Any, arguments: argparse.Namespace) -> Any:
    """Every printed count as one record of ``--output-topic``: key, JSON count and version.

    No partition column: the producer's partitioner puts every record of a key into one
    partition, so a consumer sees a key's counts in the order they were printed.
    """
    return (
        counts.selectExpr(
            "key", "to_json(named_struct('count', `count`, 'version', version)) AS value"
        )
        .writeStream.format("2pc-kafka")
        .queryName(f"{arguments.name}_{KAFKA_QUERY}")
        .outputMode("append")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("topic", arguments.output_topic)
        .option("deliveryGuarantee", arguments.guarantee)
        .option("checkpointLocation", str(arguments.checkpoint_dir / KAFKA_QUERY))
        .trigger(processingTime=arguments.trigger_interval)
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    milestone("python")
    arguments = parse_arguments(argv)
    from eospack.stateful_ops import running_count
    from eospack.tools.spark import local_session

    milestone("imports")
    from eospack.core.spark_features import ADMISSION_CONTROL

    spark = local_session(app_name=f"eospack-demo-{arguments.name}")
    milestone("session")
    # Spark 4.0 and 4.1 cannot limit a Python source's batches: each reads what is there.
    limit = str(arguments.max_offsets_per_trigger) if ADMISSION_CONTROL.available else ""
    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", limit)
        .option("queryName", arguments.name)
        .options(**dict(arguments.source_option))
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
    )
    counts = running_count(events, "key", output_mode="append")
    if arguments.sink == "kafka":
        queries = [start_kafka_query(counts, arguments)]
    else:
        queries = start_jdbc_queries(counts, arguments)
    milestone("queries")
    while not arguments.done_file.exists():
        spark.streams.awaitAnyTermination(POLL_SECONDS)  # type: ignore[arg-type]  # float s work
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
