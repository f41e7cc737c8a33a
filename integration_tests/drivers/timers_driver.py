"""The timers driver: a query of ``stateful_parts.countdown`` (per-key timers) in a process
of its own, so that a test can SIGKILL it while timers are registered and due.

JSON files (one micro-batch each) -> countdown -> a ``foreachBatch`` sink that writes each
batch attempt to a file of its own (``attempt-<batch id>-<ns>.json``, written whole by a
rename) and then passes the ``after_commit`` fault point: armed, the driver dies after the
sink wrote the batch and before Spark's commit log, so the restart replays the batch.
``--trigger interval`` runs until killed, ``available-now`` to the end of the files.
No-data batches are off: a due timer fires only in a batch with rows, so a test controls
when timers fire. The checkpoint's savepoint, if restored there, is the initial state.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eospack.core.fault_points import AFTER_COMMIT, fault_point
from eospack.lab.testing import await_query
from eospack.tools.savepoint import RestoredCheckpoint
from eospack.tools.spark import local_session
from integration_tests.stateful_parts import NO_DATA_BATCHES, countdown, source, with_watermark

QUERY_SECONDS = 300


def attempt_writer(directory: Path) -> Any:
    """The sink: each attempt of a batch to its own file, named by batch id and time."""
    directory.mkdir(parents=True, exist_ok=True)

    def write(batch: Any, batch_id: int) -> None:
        rows = sorted([list(row) for row in batch.collect()], key=repr)
        name = f"attempt-{batch_id:04d}-{time.time_ns()}.json"
        staging = directory / f".{name}"
        staging.write_text(json.dumps(rows))
        os.rename(staging, directory / name)
        fault_point(AFTER_COMMIT, batch_id)

    return write


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink", required=True, help="a directory for the batch attempts")
    parser.add_argument("--kind", choices=("processing", "event"), default="processing")
    parser.add_argument("--trigger", choices=("interval", "available-now"), required=True)
    parser.add_argument("--key-groups", type=int, default=4)
    arguments = parser.parse_args()

    spark = local_session(app_name="eospack-timers", conf={NO_DATA_BATCHES: "false"})
    events = source(spark, arguments.input)
    if arguments.kind == "event":
        events = with_watermark(events)
    initial_state = RestoredCheckpoint(arguments.checkpoint).initial_state()
    operator = countdown(arguments.kind)(
        "k", key_groups=arguments.key_groups, initial_state=initial_state
    )
    output = operator.apply(events)
    writer = (
        output.writeStream.outputMode("update")
        .foreachBatch(attempt_writer(Path(arguments.sink)))
        .option("checkpointLocation", arguments.checkpoint)
    )
    if arguments.trigger == "interval":
        query = writer.trigger(processingTime="200 milliseconds").start()
        query.awaitTermination()  # until the test kills the driver
    else:
        query = writer.trigger(availableNow=True).start()
        await_query(query, QUERY_SECONDS)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
