"""Per-key timers of StatefulOperator on real Spark streaming queries (JSON file source, one
file per micro-batch, every emitted row kept per batch attempt by a ``foreachBatch`` sink).

Processing-time timers run on Spark's own clock, the batch timestamp (kept in the offset
log, so a replay has the same one): a test waits on the wall clock until a timer is due
and computes each expected row from the batch timestamps the checkpoint recorded.
Event-time timers are driven by the watermark alone, so their outputs are fixed in advance.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from eospack.lab.testing import session_settings, wait_until
from eospack.stateful_ops import (
    FIRED_TIMER_COLUMN,
    TIMER_COLUMN,
    Clock,
    OperatorDefinitionError,
    StatefulOperator,
    read_state,
    register_timer,
)
from eospack.stateful_ops.state_store import state_store_conf
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    batch_timestamp_ms,
    run,
    source,
    with_watermark,
    write_batch,
)


def reminder(kind: str, delay_ms: int) -> type[StatefulOperator]:
    """An operator counting rows per key whose timer, ``delay_ms`` after the key's latest
    row (processing time: the batch's; event time: the row's ``ts``), emits (key, count,
    the time the timer was due) and drops the key. Defined in a function so that Spark's
    workers receive the class itself (pickled by value), not a reference to this module."""

    class Reminder(StatefulOperator):
        name = "reminder"
        timers = kind
        state_fields = "count bigint"
        output_fields = "count bigint, fired_at_ms bigint"

        def prepare(self, df: DataFrame) -> DataFrame:
            return df.select(*self.keys, "ts") if kind == "event" else df.select(*self.keys)

        def update(
            self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
            keys = list(self.keys)
            if kind == "event":
                moments = rows["ts"].astype("int64").to_numpy() // 1_000_000
            else:
                moments = np.full(len(rows), clock.processing_time_ms, dtype=np.int64)
            per_key = (
                rows[keys]
                .assign(moment=moments, new=1)
                .groupby(keys, sort=False)
                .agg(moment=("moment", "max"), new=("new", "sum"))
                .reset_index()
            )
            merged = state.merge(per_key, on=keys, how="outer", sort=False)
            touched = merged["new"].notna().to_numpy()
            merged["count"] = (merged["count"].fillna(0) + merged["new"].fillna(0)).astype("int64")
            due_at = merged["moment"].fillna(0).to_numpy(dtype=np.int64) + delay_ms
            current = merged[TIMER_COLUMN].fillna(0).to_numpy(dtype=np.int64)
            new_state = register_timer(
                merged.drop(columns=["moment", "new"]), touched, np.maximum(due_at, current)
            )
            return new_state, self.empty_output()

        def on_timer(
            self, due_state: pd.DataFrame, clock: Clock
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
            output = due_state[[*self.keys, "count"]].assign(
                fired_at_ms=due_state[FIRED_TIMER_COLUMN]
            )
            return due_state.iloc[0:0], output

    return Reminder


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("state_timers"))


def forget_commit(checkpoint: str, batch_id: int) -> None:
    """What a crash between the state commit and the commit log leaves: the batch replays."""
    for name in (str(batch_id), f".{batch_id}.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))


def stored_timers(spark: SparkSession, checkpoint: str) -> dict[str, tuple[int, int]]:
    state = read_state(spark, checkpoint)
    return {
        row["k"]: (int(row["count"]), int(row[TIMER_COLUMN])) for row in state.to_dict("records")
    }


def rows_of(keys: list[str], t: int = T0) -> list[dict[str, Any]]:
    return [{"k": key, "n": 1, "v": 0.0, "t": t} for key in keys]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("layout", ["key-groups", "segment-log"])
def test_processing_time_timers_fire_once_across_restarts_and_a_replay(
    spark: SparkSession, tmp_root: str, layout: str
) -> None:
    """On both state layouts (the segment log: one TWS timer per key group)."""
    directory = os.path.join(tmp_root, f"processing-{layout}-input")
    checkpoint = os.path.join(tmp_root, f"processing-{layout}-checkpoint")
    os.makedirs(directory)
    operator = reminder("processing", 1_000)
    sink = Emitted()
    store = state_store_conf("rocksdb") if layout == "segment-log" else {}

    def start() -> StreamingQuery:
        with session_settings(spark, {NO_DATA_BATCHES: "false", **store}):
            result = operator("k", key_groups=4, state_layout=layout).apply(
                source(spark, directory)
            )
            return run(result, checkpoint, "update", sink)

    write_batch(directory, 0, rows_of(["x", "y", "x"]))
    start()
    t0 = batch_timestamp_ms(checkpoint, 0)
    assert sink.final() == [(0, [])]
    assert stored_timers(spark, checkpoint) == {"x": (2, t0 + 1_000), "y": (1, t0 + 1_000)}

    # The query stopped; started again after the timers' time, its first batch fires them.
    wait_until(lambda: time.time() * 1000 > t0 + 2_000, 10, "the timers' time to pass")
    write_batch(directory, 1, rows_of(["z"]))
    start()
    t1 = batch_timestamp_ms(checkpoint, 1)
    fired = (1, [("x", 2, t0 + 1_000), ("y", 1, t0 + 1_000)])
    assert sink.final() == [(0, []), fired]
    assert stored_timers(spark, checkpoint) == {"z": (1, t1 + 1_000)}  # x and y left

    # Batch 1's commit lost: its replay (same batch time) fires x and y again, because the
    # state that deleted their timers was never committed; the sink keeps one copy.
    forget_commit(checkpoint, 1)
    start()
    replays = [rows for batch_id, rows in sink.attempts if batch_id == 1]
    assert replays == [fired[1], fired[1]]
    assert stored_timers(spark, checkpoint) == {"z": (1, t1 + 1_000)}

    # Later batches never fire x or y again; z fires once its time has come.
    write_batch(directory, 2, rows_of(["w"]))
    start()
    t2 = batch_timestamp_ms(checkpoint, 2)
    expected = [("z", 1, t1 + 1_000)] if t2 >= t1 + 1_000 else []
    assert sink.final() == [(0, []), fired, (2, expected)]


@pytest.mark.timeout(300)
def test_processing_time_timers_fire_in_batches_without_data(
    spark: SparkSession, tmp_root: str
) -> None:
    """Spark's processing-time timeout wakes the key groups up: the timers fire in a batch
    that has no input rows, once, and the query goes on."""
    directory = os.path.join(tmp_root, "no-data-input")
    checkpoint = os.path.join(tmp_root, "no-data-checkpoint")
    os.makedirs(directory)
    write_batch(directory, 0, rows_of(["x", "y", "x"]))
    sink = Emitted()
    result = reminder("processing", 1_000)("k", key_groups=4).apply(source(spark, directory))
    query = (
        result.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(
            lambda: sum(len(rows) for _, rows in sink.final()) >= 2 or query.exception(),
            90,
            "both timers to fire",
        )
        # A few more batches: nothing fires twice.
        last = max(batch_id for batch_id, _ in sink.attempts)
        wait_until(
            lambda: max(batch_id for batch_id, _ in sink.attempts) >= last + 3 or query.exception(),
            60,
            "three more batches",
        )
    finally:
        query.stop()
    assert query.exception() is None
    t0 = batch_timestamp_ms(checkpoint, 0)
    fired = [(batch_id, row) for batch_id, rows in sink.final() for row in rows]
    assert sorted(row for _, row in fired) == [("x", 2, t0 + 1_000), ("y", 1, t0 + 1_000)]
    input_rows = {p["batchId"]: p["numInputRows"] for p in query.recentProgress}
    assert all(batch_id > 0 and input_rows[batch_id] == 0 for batch_id, _ in fired)
    assert len(read_state(spark, checkpoint)) == 0  # both keys left the state


EVENT_BATCHES = [
    [("a", 0), ("b", 2)],  # timers: a T0+10 s, b T0+12 s
    [("c", 16)],  # watermark T0-3 s: nothing due; c T0+26 s
    [("c", 17)],  # watermark T0+11 s: a fires; c moves to T0+27 s
    [("d", 40)],  # watermark T0+12 s: b fires (a timer at the watermark is due)
    [("d", 41)],  # watermark T0+35 s: c fires; d T0+51 s
]


@pytest.mark.timeout(400)
def test_event_time_timers_fire_when_the_watermark_reaches_them_across_a_restart(
    spark: SparkSession, tmp_root: str
) -> None:
    directory = os.path.join(tmp_root, "event-input")
    checkpoint = os.path.join(tmp_root, "event-checkpoint")
    os.makedirs(directory)
    operator = reminder("event", 10_000)
    sink = Emitted()

    def batch(index: int) -> None:
        rows = [row for key, second in EVENT_BATCHES[index] for row in rows_of([key], T0 + second)]
        write_batch(directory, index, rows)

    def start() -> StreamingQuery:
        result = operator("k", key_groups=4).apply(with_watermark(source(spark, directory)))
        with session_settings(spark, {NO_DATA_BATCHES: "false"}):
            return run(result, checkpoint, "update", sink)

    unwatermarked = source(spark, directory).withColumn("ts", F.timestamp_seconds("t"))
    with pytest.raises(OperatorDefinitionError) as error:
        operator("k").apply(unwatermarked)
    assert str(error.value) == (
        "reminder: timers='event' needs a watermarked event-time column in what prepare()"
        ' returns; call df.withWatermark("<column>", "<delay>") first and keep that column'
        " in prepare()"
    )
    for index in (0, 1):
        batch(index)
    start()
    assert stored_timers(spark, checkpoint) == {
        "a": (1, (T0 + 10) * 1000),
        "b": (1, (T0 + 12) * 1000),
        "c": (1, (T0 + 26) * 1000),
    }
    forget_commit(checkpoint, 1)
    for index in range(2, len(EVENT_BATCHES)):
        batch(index)
    start()
    assert sink.final() == [
        (0, []),
        (1, []),
        (2, [("a", 1, (T0 + 10) * 1000)]),
        (3, [("b", 1, (T0 + 12) * 1000)]),
        (4, [("c", 2, (T0 + 27) * 1000)]),
    ]
    assert [rows for batch_id, rows in sink.attempts if batch_id == 1] == [[], []]
    assert stored_timers(spark, checkpoint) == {"d": (2, (T0 + 51) * 1000)}


@pytest.mark.timeout(400)
def test_event_time_timers_restored_from_a_savepoint_fire_as_the_old_query_would(
    spark: SparkSession, tmp_root: str
) -> None:
    """Batches 0-1 on one checkpoint, a savepoint of it, batches 2-4 on the restored one:
    the restored timers (a column of the state like any other) fire in the same batches
    and with the same rows as in the query that never stopped."""
    from eospack.tools.savepoint import RestoredCheckpoint, create_savepoint, restore_savepoint

    operator = reminder("event", 10_000)
    old_checkpoint = os.path.join(tmp_root, "savepoint-old-checkpoint")
    new_checkpoint = os.path.join(tmp_root, "savepoint-new-checkpoint")
    savepoint = os.path.join(tmp_root, "savepoint")

    def start(directory: str, checkpoint: str, indexes: range, sink: Emitted) -> None:
        os.makedirs(directory)
        for number, index in enumerate(indexes):
            rows = [row for key, s in EVENT_BATCHES[index] for row in rows_of([key], T0 + s)]
            write_batch(directory, number, rows)
        initial_state = RestoredCheckpoint(checkpoint).initial_state()
        result = operator("k", key_groups=4, initial_state=initial_state).apply(
            with_watermark(source(spark, directory))
        )
        with session_settings(spark, {NO_DATA_BATCHES: "false"}):
            run(result, checkpoint, "update", sink)

    old = Emitted()
    start(os.path.join(tmp_root, "savepoint-old-input"), old_checkpoint, range(2), old)
    assert old.final() == [(0, []), (1, [])]
    create_savepoint(spark, old_checkpoint, savepoint)
    restore_savepoint(savepoint, new_checkpoint, spark=spark)
    restored = Emitted()
    start(os.path.join(tmp_root, "savepoint-new-input"), new_checkpoint, range(2, 5), restored)
    assert restored.final() == [
        (0, [("a", 1, (T0 + 10) * 1000)]),
        (1, [("b", 1, (T0 + 12) * 1000)]),
        (2, [("c", 2, (T0 + 27) * 1000)]),
    ]
    assert stored_timers(spark, new_checkpoint) == {"d": (2, (T0 + 51) * 1000)}
