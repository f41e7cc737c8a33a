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


def batch_timestamp_ms(checkpoint: str | os.PathLike[str], batch_id: int) -> int:
    """The processing time Spark gave batch ``batch_id`` (its offset log entry)."""
    with open(os.path.join(checkpoint, "offsets", str(batch_id)), encoding="utf-8") as handle:
        return int(json.loads(handle.read().splitlines()[1])["batchTimestampMs"])


def events_at(*keys_and_seconds: tuple[str, int]) -> list[dict[str, Any]]:
    """Input rows of ``SCHEMA``: one per (key, event time in seconds after ``T0``)."""
    return [{"k": key, "n": 1, "v": 0.0, "t": T0 + second} for key, second in keys_and_seconds]


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


def countdown(kind: str) -> type[Any]:
    """An operator with per-key timers of ``kind`` ("processing" or "event"): each row
    ``(k, n)`` counts one for its key; ``n > 0`` (re)sets the key's timer ``n`` seconds
    after the row's moment (processing time: the batch's; event time: the row's ``ts``),
    ``n = 0`` deletes it. A due timer emits (key, count, the time it was due at, in ms)
    and drops the key. ``kind="none"``: the same counter without timers (``n`` ignored),
    the same operator with its timers turned off. Defined in a function so that Spark's
    workers receive the class itself (pickled by value), not a reference to this module."""
    import numpy as np
    import pandas as pd

    from eospack.stateful_ops import (
        FIRED_TIMER_COLUMN,
        Clock,
        StatefulOperator,
        delete_timer,
        register_timer,
    )

    class Countdown(StatefulOperator):
        name = "countdown"
        timers = kind
        state_fields = "count bigint"
        output_fields = "count bigint, fired_at_ms bigint"

        def prepare(self, df: DataFrame) -> DataFrame:
            columns = [*self.keys, "n"]
            return df.select(*columns, "ts") if kind == "event" else df.select(*columns)

        def update(
            self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
            keys = list(self.keys)
            if kind == "event":
                moments = rows["ts"].astype("int64").to_numpy() // 1_000_000
            else:
                moments = np.full(len(rows), clock.processing_time_ms, dtype=np.int64)
            seconds = rows["n"].astype("int64").to_numpy()
            # One row per key and batch in these tests: its n decides the key's timer.
            per_key = (
                rows[keys]
                .assign(due=moments + seconds * 1000, cancel=seconds == 0, new=1)
                .groupby(keys, sort=False)
                .agg(due=("due", "max"), cancel=("cancel", "any"), new=("new", "sum"))
                .reset_index()
            )
            merged = state.merge(per_key, on=keys, how="outer", sort=False)
            touched = merged["new"].notna().to_numpy()
            cancel = merged["cancel"].fillna(False).to_numpy(dtype=bool)
            merged["count"] = (merged["count"].fillna(0) + merged["new"].fillna(0)).astype("int64")
            due = merged["due"].fillna(0).to_numpy(dtype=np.int64)
            new_state = merged.drop(columns=["due", "cancel", "new"])
            if kind == "none":
                return new_state, self.empty_output()
            new_state = register_timer(new_state, touched & ~cancel, due)
            return delete_timer(new_state, cancel), self.empty_output()

        def on_timer(
            self, due_state: pd.DataFrame, clock: Clock
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
            output = due_state[[*self.keys, "count"]].assign(
                fired_at_ms=due_state[FIRED_TIMER_COLUMN]
            )
            return due_state.iloc[0:0], output

    return Countdown
