"""Driver of the source tests on Kafka as production runs it: ``format("replayable-kafka")``
with the options given as JSON (a cluster's bootstrap list in any order, a secured
broker's ``kafka.*`` settings), Trigger.AvailableNow, each micro-batch's rows written to
``<output>/<batch id>.json`` (replaced on a replay, like an idempotent sink), then exit 0.

Killed by the test mid-stream (``crash_harness.run_driver(kill_when=...)``) and run again
on the same checkpoint: the union of the batch files must be exactly the input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.lab.testing import await_query
from eospack.tools.spark import local_session


def write_batch(output: Path, batch_id: int, rows: list[list[Any]]) -> None:
    """Replace the batch's file atomically: a replayed batch overwrites, never appends."""
    temporary = output / f".{batch_id}.json.writing"
    temporary.write_text(json.dumps(rows))
    os.replace(temporary, output / f"{batch_id}.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--options", required=True, help="the source's options as JSON")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--master", default="local[2,2]")
    arguments = parser.parse_args()
    output = Path(arguments.output)
    output.mkdir(parents=True, exist_ok=True)

    def on_batch(df: Any, batch_id: int) -> None:
        rows = [
            [r.topic, r.partition, r.offset, bytes(r.value).decode()]
            for r in df.select("topic", "partition", "offset", "value").collect()
        ]
        write_batch(output, batch_id, sorted(rows))

    spark = local_session(app_name="eospack-production-kafka-source", master=arguments.master)
    query = (
        spark.readStream.format("replayable-kafka")
        .options(**json.loads(arguments.options))
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, timeout=150)
    spark.stop()


if __name__ == "__main__":
    main()
