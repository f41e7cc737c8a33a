"""Driver of the rolling-restart test and benchmark: ``replayable-kafka`` -> ``2pc-kafka``
(exactly-once) as its own Spark driver, running until the test or benchmark asks it to stop.

Why a driver of its own: a task can outlive a broker it was sending to (a send in flight
when its partition's leader or its coordinator dies waits up to the producer's
``delivery.timeout.ms`` and then fails the task). A real cluster retries such a task
(``spark.task.maxFailures``, 4); ``local[2]`` of a test session retries nothing, so one
failed task would fail the query. ``--master local[2,4]`` retries like a cluster.

Every batch's progress (id, input rows, durations, its timestamp) is appended to
``--progress`` as one JSON line; the driver stops its query and exits 0 once ``--stop-file``
exists; a failed query prints its error and exits 3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from eospack.tools.spark import local_session


def start_query(spark: Any, arguments: argparse.Namespace) -> Any:
    servers = arguments.bootstrap_servers
    sink_options = dict(option.split("=", 1) for option in arguments.option)
    return (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", arguments.input)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(arguments.max_offsets))
        .option("kafkaConsumer.pollTimeoutMs", "60000")
        .load()
        .select("key", "value")
        .writeStream.format("2pc-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", arguments.output)
        .option("ledgerTopic", arguments.ledger)
        .option("sinkId", arguments.sink_id)
        .options(**sink_options)
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(processingTime=f"{arguments.trigger_ms} milliseconds")
        .start()
    )


def record_progress(query: Any, path: Path, seen: set[tuple[int, str]]) -> None:
    """Append the progress of batches not recorded yet (Spark keeps the last 100)."""
    with path.open("a", encoding="utf-8") as out:
        for progress in query.recentProgress:
            key = (int(progress["batchId"]), str(progress["timestamp"]))
            if key in seen:
                continue
            seen.add(key)
            entry = {
                "batchId": key[0],
                "timestamp": key[1],
                "numInputRows": int(progress["numInputRows"]),
                "durationMs": dict(progress["durationMs"]),
                "recorded": time.time(),
            }
            out.write(json.dumps(entry) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--progress", required=True, type=Path)
    parser.add_argument("--stop-file", required=True, type=Path)
    parser.add_argument("--max-offsets", type=int, default=200)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--option", action="append", default=[], help="NAME=VALUE sink option")
    arguments = parser.parse_args()

    spark = local_session(app_name="eospack-kafka-to-kafka", master=arguments.master)
    query = start_query(spark, arguments)
    seen: set[tuple[int, str]] = set()
    try:
        while not arguments.stop_file.exists():
            query.awaitTermination(0.5)  # raises once the query failed
            record_progress(query, arguments.progress, seen)
            if not query.isActive:
                print("the query stopped by itself", file=sys.stderr, flush=True)
                return 3
    except Exception as error:  # the query failed: its error is the driver's answer
        print(f"QUERY FAILED: {error}", file=sys.stderr, flush=True)
        return 3
    query.stop()
    record_progress(query, arguments.progress, seen)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
