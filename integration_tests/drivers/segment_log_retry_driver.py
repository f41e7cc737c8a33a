"""The segment-log retry driver: ``running_count(state_layout="segment-log")`` under
``local[2,4]`` (Spark retries a failed task, as on a cluster; the test session's
``local[2]`` retries nothing), with a Python UDF after the operator, in the same stage, that
fails every task's first attempt: the operator has appended the batch's segment when the
task fails. Each failed attempt leaves a marker file. Writes, as JSON to ``--out``, each
batch's rows (per attempt of the sink), the number of rows of every stored segment, and
read_state's (k, count, version)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark import TaskContext
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from eospack.lab.testing import await_query
from eospack.stateful_ops import read_state, running_count
from eospack.stateful_ops.state_store import state_store_conf
from eospack.tools.spark import local_session
from integration_tests.stateful_parts import NO_DATA_BATCHES, source

QUERY_SECONDS = 300


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--markers", required=True, help="a directory for failed attempts")
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    markers = arguments.markers

    spark = local_session(
        app_name="eospack-segment-log-retry",
        master="local[2,4]",
        conf={**state_store_conf("rocksdb"), NO_DATA_BATCHES: "false"},
    )

    def fail_first_attempt(k: str | None) -> str | None:
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0:
            marker = Path(markers) / f"stage-{context.stageId()}-{context.partitionId()}"
            marker.touch()
            raise RuntimeError("the first attempt fails after the segment log's append")
        return k

    failing = F.udf(fail_first_attempt, StringType())
    counts = running_count(
        source(spark, arguments.input), "k", key_groups=1, state_layout="segment-log"
    )
    output = counts.withColumn("k", failing("k"))
    attempts: list[Any] = []

    def sink(batch: Any, batch_id: int) -> None:
        attempts.append([batch_id, sorted(map(list, batch.collect()), key=repr)])

    query = (
        output.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", arguments.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, QUERY_SECONDS)
    segments = (
        spark.read.format("statestore")
        .option("stateVarName", "segments")
        .load(arguments.checkpoint)
        .select("list_element.segment")
        .collect()
    )
    import pyarrow as pa

    sizes = sorted(pa.ipc.open_stream(bytes(row[0])).read_all().num_rows for row in segments)
    state = read_state(spark, arguments.checkpoint)
    result = {
        "attempts": attempts,
        "segment_rows": sizes,
        "state": sorted(map(list, state[["k", "count", "version"]].itertuples(index=False))),
    }
    Path(arguments.out).write_text(json.dumps(result, default=int))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
