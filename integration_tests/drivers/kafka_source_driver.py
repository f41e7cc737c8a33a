"""Fault-test driver: read a topic with ``format("replayable-kafka")`` under Trigger.AvailableNow
and write each micro-batch's rows to ``<output>/<batch id>.json`` (replaced on a replay, like an
idempotent sink), then exit 0.

Runs on ``--master`` (default ``local[2,2]``: a failed task is retried once, so a transient
read fault is absorbed by Spark without restarting the query). Call faults are armed by the
test through ``EOSPACK_FAULT_DIR`` in the environment.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from eospack.lab.testing import await_query
from eospack.tools.spark import local_session


def write_batch(output: Path, batch_id: int, rows: list[list[Any]]) -> None:
    """Replace the batch's file atomically: a replayed batch overwrites, never appends."""
    temporary = output / f".{batch_id}.json.writing"
    temporary.write_text(json.dumps(rows))
    os.replace(temporary, output / f"{batch_id}.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--master", default="local[2,2]")
    parser.add_argument("--max-offsets-per-trigger", default="8")
    arguments = parser.parse_args()
    output = Path(arguments.output)
    output.mkdir(parents=True, exist_ok=True)

    def on_batch(df: Any, batch_id: int) -> None:
        rows = [
            [r.topic, r.partition, r.offset, bytes(r.value).decode()]
            for r in df.select("topic", "partition", "offset", "value").collect()
        ]
        write_batch(output, batch_id, sorted(rows))

    spark = local_session(app_name="eospack-kafka-source-driver", master=arguments.master)
    query = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", arguments.max_offsets_per_trigger)
        .option("kafkaConsumer.pollTimeoutMs", "15000")
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, timeout=120)
    spark.stop()


if __name__ == "__main__":
    main()
