"""What the stateful_ops query tests share: JSON input files that are one micro-batch each,
their stream (optionally watermarked), and a ``foreachBatch`` sink that keeps every batch
attempt, for queries run with ``Trigger.AvailableNow``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from eospack.lab.testing import await_query

SCHEMA = "k string, n int, v double, t long"
T0 = 1_700_000_000
QUERY_TIMEOUT = 120
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def write_batch(directory: str, index: int, rows: list[dict[str, Any]]) -> None:
    path = os.path.join(directory, f"batch-{index:04d}.json")
    with open(path, "w") as handle:
        handle.write("\n".join(json.dumps(row) for row in rows))
    os.utime(path, (1_000_000 + index, 1_000_000 + index))


def source(spark: SparkSession, directory: str) -> DataFrame:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(directory)


def with_watermark(df: DataFrame) -> DataFrame:
    return df.withColumn("ts", F.timestamp_seconds("t")).withWatermark("ts", "5 seconds")


@dataclass
class Emitted:
    """Everything a query emitted, per batch attempt, rows sorted for comparison."""

    attempts: list[tuple[int, list[tuple[Any, ...]]]] = field(default_factory=list)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.attempts.append((batch_id, sorted(map(tuple, batch.collect()), key=repr)))

    def final(self) -> list[tuple[int, list[tuple[Any, ...]]]]:
        """What an idempotent sink holds: the last attempt of each batch id, in order."""
        last = dict(self.attempts)
        return [(batch_id, last[batch_id]) for batch_id in sorted(last)]


def run(result: DataFrame, checkpoint: str, mode: str, sink: Emitted) -> StreamingQuery:
    query = (
        result.writeStream.outputMode(mode)
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, QUERY_TIMEOUT)
    return query
