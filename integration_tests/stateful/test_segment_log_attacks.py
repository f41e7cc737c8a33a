"""Attacks on the segment log (``state_layout="segment-log"``) in real streaming queries:
a ttl changed on a segment-log checkpoint (raised, then lowered) is applied as on the
key-groups layout, and the counts stay exact across the restarts; a task retried after
the operator appended its segment leaves the log as one attempt would. Savepoints and
restores (issue 41): an event-time savepoint restored rescaled down into either layout
drops late rows and closes, fires and expires as the uninterrupted query (the test
``without_late_rows`` lacked), also with batch 0's commit lost and replayed; a sessionize
savepoint after tombstones and compaction equals the key-groups one and restores; and
``checkpoint inspect --state`` beside a user's own transformWithState operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from eospack.cli import main
from eospack.lab.testing import session_settings, wait_until
from eospack.stateful_ops import deduplicate, read_state, running_count, sessionize
from eospack.stateful_ops.state_store import state_store_conf
from eospack.tools.savepoint import RestoredCheckpoint
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    batch_timestamp_ms,
    countdown,
    run,
    source,
    write_batch,
)

ROCKSDB = {**state_store_conf("rocksdb"), NO_DATA_BATCHES: "false"}
RETRY_DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "segment_log_retry_driver.py"


@pytest.mark.timeout(600)
def test_ttl_raised_then_lowered_on_a_segment_log_checkpoint_keeps_counting(
    spark: SparkSession, tmp_path: Any
) -> None:
    """Failed before the fix: the restart with another ttl failed its first batch
    (StateSchemaMismatchError: stored state was written with ttl_ms=...). One key group:
    a, b at 1 h; a, c at 2 h; a at 30 min: each run continues the counts (no key's ttl
    runs out within the test), and read_state holds each key once."""
    directory, checkpoint = str(tmp_path / "input"), str(tmp_path / "cp")
    os.makedirs(directory)
    sink = Emitted()
    runs = [("1 hour", ["a", "b"]), ("2 hours", ["a", "c"]), ("30 minutes", ["a"])]
    with session_settings(spark, ROCKSDB):
        for batch_id, (ttl, keys) in enumerate(runs):
            write_batch(directory, batch_id, [{"k": k, "n": 1, "v": 1.0, "t": T0} for k in keys])
            result = running_count(
                source(spark, directory), "k", key_groups=1, ttl=ttl, state_layout="segment-log"
            )
            run(result, checkpoint, "update", sink)
        state = read_state(spark, checkpoint)

    first, second, _ = (batch_timestamp_ms(checkpoint, batch_id) for batch_id in range(3))
    assert sink.final() == [
        (0, [("a", 1, first), ("b", 1, first)]),
        (1, [("a", 2, first + 1), ("c", 1, second)]),
        (2, [("a", 3, first + 2)]),
    ]
    assert sorted(map(tuple, state[["k", "count", "version"]].itertuples(index=False))) == [
        ("a", 3, first + 2),
        ("b", 1, first),
        ("c", 1, second),
    ]


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_task_retried_after_its_append_leaves_one_segment_per_batch(tmp_path: Any) -> None:
    """HELD: every task's first attempt fails after the operator appended the batch's
    segment (a UDF after it, same stage, ``local[2,4]`` in a driver process); the retry
    starts from the committed log: counts exact, one 2-row segment per batch."""
    directory, markers = tmp_path / "input", tmp_path / "markers"
    directory.mkdir()
    markers.mkdir()
    row = {"n": 1, "v": 1.0, "t": T0}
    write_batch(str(directory), 0, [{**row, "k": k} for k in "aab"])
    write_batch(str(directory), 1, [{**row, "k": k} for k in "ac"])
    out = tmp_path / "out.json"
    subprocess.run(
        [
            sys.executable,
            str(RETRY_DRIVER),
            *("--input", str(directory), "--checkpoint", str(tmp_path / "cp")),
            *("--markers", str(markers), "--out", str(out)),
        ],
        check=True,
        timeout=240,
    )
    result = json.loads(out.read_text())
    # One failed first attempt per batch (the one task whose partition holds the group).
    assert len(list(markers.iterdir())) == 2
    assert result["attempts"] == [
        [0, [["a", 2, 1], ["b", 1, 1]]],
        [1, [["a", 3, 2], ["c", 1, 1]]],
    ]
    assert result["segment_rows"] == [2, 2]
    assert result["state"] == [["a", 3, 2], ["b", 1, 1], ["c", 1, 1]]


@pytest.mark.timeout(600)
def test_a_due_timer_in_a_batch_with_rows_for_its_group_expires_once(
    spark: SparkSession, tmp_path: Any
) -> None:
    """One key group, ttl 1 s: x, y; after the ttl, x again. The batch has rows for the
    group whose timer is due: x starts a new life (count 1, version the batch's
    timestamp), y leaves, nothing else is emitted, and the log compacts to x alone."""
    directory, checkpoint = str(tmp_path / "input"), str(tmp_path / "cp")
    os.makedirs(directory)
    row = {"n": 1, "v": 1.0, "t": T0}
    write_batch(directory, 0, [{**row, "k": k} for k in ("x", "y")])
    sink = Emitted()
    ttl_ms = 1000

    def start() -> Any:
        result = running_count(
            source(spark, directory),
            "k",
            key_groups=1,
            ttl=f"{ttl_ms} ms",
            state_layout="segment-log",
        )
        return run(result, checkpoint, "update", sink)

    with session_settings(spark, ROCKSDB):
        first = start()
        batch_time = pd.Timestamp(first.lastProgress["timestamp"]).timestamp()
        wait_until(lambda: time.time() > batch_time + 2 * ttl_ms / 1000, 10, "the ttl to pass")
        write_batch(directory, 1, [{**row, "k": "x"}])
        start()
        segments = (
            spark.read.format("statestore")
            .option("stateVarName", "segments")
            .load(checkpoint)
            .select("list_element.segment")
            .collect()
        )
        state = read_state(spark, checkpoint)

    first_ms, second_ms = (batch_timestamp_ms(checkpoint, batch_id) for batch_id in (0, 1))
    assert sink.final() == [
        (0, [("x", 1, first_ms), ("y", 1, first_ms)]),
        (1, [("x", 1, second_ms)]),
    ]
    logged = [pa.ipc.open_stream(bytes(r[0])).read_all() for r in segments]
    assert [segment.select(["k", "count"]).to_pylist() for segment in logged] == [
        [{"k": "x", "count": 1}]
    ]
    assert list(map(tuple, state[["k", "count", "version"]].itertuples(index=False))) == [
        ("x", 1, second_ms)
    ]


@pytest.mark.timeout(600)
def test_timestamp_and_null_composite_keys_equal_key_groups_across_batches(
    spark: SparkSession, tmp_path: Any
) -> None:
    """(k, ts) keys, ts a timestamp, either null: three batches on both layouts (the
    segment log restarted after each batch) emit the same rows and read_state holds the
    same keys and counts; each key's last count is its number of rows."""
    keys = [("a", T0), ("a", None), (None, T0), (None, None), ("b", T0 + 1)]
    batches = [[0, 1, 2, 3, 4, 0], [1, 3, 3], [0, 2, 4, 4]]

    def write(directory: str, batch_id: int) -> None:
        rows = [{"k": keys[i][0], "n": 1, "v": 1.0, "t": keys[i][1]} for i in batches[batch_id]]
        write_batch(directory, batch_id, rows)

    def build(directory: str, layout: str) -> Any:
        events = source(spark, directory).selectExpr("k", "timestamp_seconds(t) AS ts")
        return running_count(events, ["k", "ts"], key_groups=2, state_layout=layout)

    sinks = {layout: Emitted() for layout in ("key-groups", "segment-log")}
    states = {}
    with session_settings(spark, ROCKSDB):
        for layout, sink in sinks.items():
            directory, checkpoint = str(tmp_path / f"{layout}-in"), str(tmp_path / f"{layout}-cp")
            os.makedirs(directory)
            if layout == "key-groups":
                for batch_id in range(len(batches)):
                    write(directory, batch_id)
                run(build(directory, layout), checkpoint, "update", sink)
            else:
                for batch_id in range(len(batches)):
                    write(directory, batch_id)
                    run(build(directory, layout), checkpoint, "update", sink)
            states[layout] = read_state(spark, checkpoint)

    def normal(rows: Any) -> list[tuple[Any, ...]]:
        plain = (tuple(None if pd.isna(value) else value for value in row) for row in rows)
        return sorted(plain, key=repr)

    expected = [(batch_id, normal(rows)) for batch_id, rows in sinks["key-groups"].final()]
    assert [(b, normal(rows)) for b, rows in sinks["segment-log"].final()] == expected
    assert [batch_id for batch_id, _ in expected] == [0, 1, 2]
    columns = ["k", "ts", "count", "version"]
    assert normal(states["segment-log"][columns].itertuples(index=False)) == normal(
        states["key-groups"][columns].itertuples(index=False)
    )
    last = {(row[0], row[1]): row[2] for _, rows in expected for row in rows}
    assert sorted(last.values()) == sorted(Counter(i for batch in batches for i in batch).values())


# A savepoint of an event-time query restored into either layout (issue 41). The old
# query runs RESTORE_OLD on the segment log (watermark 5 s behind the latest event): after
# it, Spark's watermark of the savepoint's batch is T0+1 s and of the next batch T0+11 s.
# The restored query's Spark watermark starts afresh (0, then its own rows' latest event
# minus 5 s, which stays behind the old query's), so only the restored watermarks
# (``without_late_rows``, ``floored_watermark``) make it drop and close what the old query
# would have: restored batch 0 drops at or behind T0+1 s (g@1) and keeps h@5 and d@10
# (behind T0+11 s, which an off-by-one batch would drop); batch 1 drops at or behind
# T0+11 s (i@11, which Spark's own watermark of T0+10 s keeps); batch 2 keeps m@12.
RESTORE_OLD: list[list[tuple[str, int, int]]] = [
    [("a", 0, 1), ("b", 2, 1), ("a", 1, 1), ("c", 3, 2), ("e", 6, 1)],
    [("c", 16, 1), ("a", 4, 1), ("b", 14, 1), ("e", 2, 1)],
]
RESTORE_NEXT: list[list[tuple[str, int, int]]] = [
    [("g", 1, 1), ("h", 5, 1), ("b", 15, 1), ("d", 10, 1)],
    [("i", 11, 1), ("j", 12, 1), ("l", 40, 1)],
    [("m", 12, 1), ("n", 41, 1)],
]
RESTORE_CASES: dict[str, tuple[Any, str]] = {
    "sessionize": (
        lambda df, layout, groups, initial: sessionize(
            df,
            "k",
            "ts",
            "5 seconds",
            key_groups=groups,
            state_layout=layout,
            initial_state=initial,
        ),
        "append",
    ),
    "deduplicate_event_time": (
        lambda df, layout, groups, initial: deduplicate(
            df,
            "k",
            "10 seconds",
            event_time="ts",
            key_groups=groups,
            state_layout=layout,
            initial_state=initial,
        ),
        "append",
    ),
    "timers_event": (
        lambda df, layout, groups, initial: countdown("event")(
            "k", key_groups=groups, state_layout=layout, initial_state=initial
        ).apply(df),
        "update",
    ),
}


def write_event_batch(directory: Path, index: int, events: list[tuple[str, int, int]]) -> None:
    rows = [{"k": key, "n": n, "v": second / 2, "t": T0 + second} for key, second, n in events]
    write_batch(str(directory), index, rows)


def event_query(
    spark: SparkSession, directory: Path, case: str, layout: str, groups: int, initial: Any
) -> tuple[Any, str]:
    build, mode = RESTORE_CASES[case]
    events = source(spark, str(directory))
    events = events.withColumn("ts", F.timestamp_seconds("t")).withWatermark("ts", "5 seconds")
    return build(events, layout, groups, initial), mode


@pytest.mark.chaos  # six queries per case: 17-20 s each idle, 55 s total; ~75 s each loaded
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", sorted(RESTORE_CASES))
def test_an_event_time_savepoint_restored_rescaled_down_continues_as_the_old_query(
    spark: SparkSession, tmp_path: Path, case: str
) -> None:
    """Segment-log savepoint of an event-time query (sessionize: b holds two open
    sessions), restored into 2 key groups (from 4) on each layout, one start per batch:
    every restored batch emits what the uninterrupted query emitted for it, row for row.
    Writes the test ``without_late_rows`` was merged without."""
    with session_settings(spark, ROCKSDB):
        old_input, old_cp = tmp_path / "old-input", tmp_path / "old"
        old_input.mkdir()
        for index, events in enumerate(RESTORE_OLD):
            write_event_batch(old_input, index, events)
        result, mode = event_query(spark, old_input, case, "segment-log", 4, None)
        run(result, str(old_cp), mode, Emitted())
        savepoint = tmp_path / "savepoint"
        assert main(["savepoint", "create", str(old_cp), str(savepoint)]) == 0

        whole_input = tmp_path / "whole-input"
        whole_input.mkdir()
        for index, events in enumerate([*RESTORE_OLD, *RESTORE_NEXT]):
            write_event_batch(whole_input, index, events)
        uninterrupted = Emitted()
        result, mode = event_query(spark, whole_input, case, "key-groups", 4, None)
        run(result, str(tmp_path / "whole"), mode, uninterrupted)

        restored_sinks = {}
        for layout in ("segment-log", "key-groups"):
            restored, inputs = tmp_path / f"{layout}-restored", tmp_path / f"{layout}-input"
            assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
            inputs.mkdir()
            sink = Emitted()
            for index, events in enumerate(RESTORE_NEXT):
                write_event_batch(inputs, index, events)
                initial = RestoredCheckpoint(restored, spark).initial_state()
                result, mode = event_query(spark, inputs, case, layout, 2, initial)
                run(result, str(restored), mode, sink)
            restored_sinks[layout] = sink.final()

    expected = [
        (batch_id - len(RESTORE_OLD), rows)
        for batch_id, rows in uninterrupted.final()
        if batch_id >= len(RESTORE_OLD)
    ]
    assert [batch_id for batch_id, _ in expected] == [0, 1, 2]
    emitted_keys = {row[0] for _, rows in expected for row in rows}
    assert "h" in emitted_keys and not emitted_keys & {"g", "i"}, emitted_keys  # teeth
    assert restored_sinks["key-groups"] == expected
    assert restored_sinks["segment-log"] == expected


# Sessionize in one key group, so that every batch writes its log: sessions close
# (tombstones) in batches 1-4 and the log compacts; after batch 4, a holds two open
# sessions ([40, 45) and [60, 65)). The next batches close and merge across the restore.
SESSIONS_OLD: list[list[tuple[str, int, int]]] = [
    [("a", 0, 1), ("b", 2, 1), ("b", 14, 1)],
    [("a", 20, 1), ("c", 21, 1)],
    [("b", 30, 1), ("d", 31, 1), ("a", 22, 1)],
    [("a", 40, 1), ("e", 40, 1), ("c", 22, 1)],
    [("f", 45, 1), ("b", 33, 1), ("a", 60, 1)],
]
SESSIONS_NEXT: list[list[tuple[str, int, int]]] = [
    [("a", 58, 1), ("g", 57, 1), ("h", 80, 1)],
    [("i", 81, 1)],
]


def sessions_savepoint(spark: SparkSession, root: Path, layout: str) -> tuple[Path, set[Any]]:
    """``SESSIONS_OLD`` through sessionize on ``layout`` (one key group), savepointed: the
    savepoint and its rows."""
    inputs, checkpoint, savepoint = root / f"{layout}-in", root / f"{layout}-cp", root / layout
    inputs.mkdir()
    for index, events in enumerate(SESSIONS_OLD):
        write_event_batch(inputs, index, events)
    result, mode = event_query(spark, inputs, "sessionize", layout, 1, None)
    run(result, str(checkpoint), mode, Emitted())
    assert main(["savepoint", "create", str(checkpoint), str(savepoint)]) == 0
    manifest = json.loads((savepoint / "manifest.json").read_text())
    [operator] = manifest["operators"]
    rows = pq.read_table(str(savepoint / operator["file"])).to_pandas()
    return savepoint, set(map(tuple, rows.astype(object).itertuples(index=False)))


# five queries: 23 s idle (70 s on a loaded machine)
@pytest.mark.timeout(900)
def test_a_sessionize_savepoint_after_tombstones_and_compaction_equals_key_groups_and_restores(
    spark: SparkSession, tmp_path: Path
) -> None:
    """HELD: a segment-log savepoint taken after closed sessions (tombstones) and
    compaction holds the key-groups savepoint's rows (a's two open sessions included); the
    key-groups savepoint restored into the segment log with 3 key groups (from 1) emits
    what the uninterrupted query emitted next, batch by batch."""
    with session_settings(spark, ROCKSDB):
        _, log_rows = sessions_savepoint(spark, tmp_path, "segment-log")
        groups_savepoint, groups_rows = sessions_savepoint(spark, tmp_path, "key-groups")
        segments = (
            spark.read.format("statestore")
            .option("stateVarName", "segments")
            .load(str(tmp_path / "segment-log-cp"))
            .collect()
        )

        whole_input = tmp_path / "whole-input"
        whole_input.mkdir()
        for index, events in enumerate([*SESSIONS_OLD, *SESSIONS_NEXT]):
            write_event_batch(whole_input, index, events)
        uninterrupted = Emitted()
        result, mode = event_query(spark, whole_input, "sessionize", "key-groups", 1, None)
        run(result, str(tmp_path / "whole"), mode, uninterrupted)

        restored, inputs = tmp_path / "restored", tmp_path / "restored-input"
        assert main(["savepoint", "restore", str(groups_savepoint), str(restored)]) == 0
        inputs.mkdir()
        sink = Emitted()
        for index, events in enumerate(SESSIONS_NEXT):
            write_event_batch(inputs, index, events)
            initial = RestoredCheckpoint(restored, spark).initial_state()
            result, mode = event_query(spark, inputs, "sessionize", "segment-log", 3, initial)
            run(result, str(restored), mode, sink)

    assert log_rows == groups_rows
    assert len([row for row in log_rows if row[0] == "a"]) == 2  # a's two open sessions
    # The log compacted: fewer segments than the five batches that wrote it.
    assert 0 < len(segments) < len(SESSIONS_OLD)
    expected = [
        (batch_id - len(SESSIONS_OLD), rows)
        for batch_id, rows in uninterrupted.final()
        if batch_id >= len(SESSIONS_OLD)
    ]
    assert [batch_id for batch_id, _ in expected] == [0, 1]
    assert all(rows for _, rows in expected)
    assert sink.final() == expected


@pytest.mark.chaos  # five queries per case: 15-16 s each idle, ~40 s each loaded
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", ["sessionize", "timers_event"])
def test_an_event_time_restore_replayed_before_its_first_commit_bootstraps_once(
    spark: SparkSession, tmp_path: Path, case: str
) -> None:
    """HELD: the segment-log savepoint of ``RESTORE_OLD`` restored into the segment log;
    restored batch 0 runs, its commit is forgotten (a crash between the state commit and
    the commit log), the next start replays it (bootstrapping again, dropping late rows by
    the savepoint batch's watermark, as batch 0) and runs batch 1, a third start (after the
    first commit) runs batch 2: the same rows as the uninterrupted query, the replay equal
    to the first attempt."""
    with session_settings(spark, ROCKSDB):
        old_input, old_cp = tmp_path / "old-input", tmp_path / "old"
        old_input.mkdir()
        for index, events in enumerate(RESTORE_OLD):
            write_event_batch(old_input, index, events)
        result, mode = event_query(spark, old_input, case, "segment-log", 4, None)
        run(result, str(old_cp), mode, Emitted())
        savepoint = tmp_path / "savepoint"
        assert main(["savepoint", "create", str(old_cp), str(savepoint)]) == 0

        whole_input = tmp_path / "whole-input"
        whole_input.mkdir()
        for index, events in enumerate([*RESTORE_OLD, *RESTORE_NEXT]):
            write_event_batch(whole_input, index, events)
        uninterrupted = Emitted()
        result, mode = event_query(spark, whole_input, case, "key-groups", 4, None)
        run(result, str(tmp_path / "whole"), mode, uninterrupted)

        restored, inputs = tmp_path / "restored", tmp_path / "restored-input"
        assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
        inputs.mkdir()
        sink = Emitted()
        for index, events in enumerate(RESTORE_NEXT):
            write_event_batch(inputs, index, events)
            initial = RestoredCheckpoint(restored, spark).initial_state()
            result, mode = event_query(spark, inputs, case, "segment-log", 4, initial)
            run(result, str(restored), mode, sink)
            if index == 0:
                for name in ("0", ".0.crc"):
                    (restored / "commits" / name).unlink()

    expected = [
        (batch_id - len(RESTORE_OLD), rows)
        for batch_id, rows in uninterrupted.final()
        if batch_id >= len(RESTORE_OLD)
    ]
    attempts = [rows for batch_id, rows in sink.attempts if batch_id == 0]
    assert len(attempts) == 2 and attempts[0] == attempts[1]
    assert sink.final() == expected
    assert any(rows for _, rows in expected)


def spark_own_processor() -> type:
    """A user's own StatefulProcessor (not stateful_ops): counts rows per key in a
    ValueState. Defined in a function, so that Spark's workers receive the class itself."""
    from pyspark.sql.streaming import StatefulProcessor

    class CountPerKey(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", "count bigint")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            seen = sum(len(frame) for frame in rows)
            total = (self.count.get()[0] if self.count.exists() else 0) + seen
            self.count.update((total,))
            yield pd.DataFrame({"k": [key[0]], "count": [total]})

        def close(self) -> None:
            return None

    return CountPerKey


@pytest.mark.timeout(600)
def test_inspect_state_of_a_checkpoint_with_a_users_own_transform_with_state_operator(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Failed before the fix (SparkRuntimeException STDS_INVALID_OPTION_VALUE: state
    variable segments is not defined): ``checkpoint inspect --state`` leaves Spark's own
    operators as they are (no keys), but a user's transformWithStateInPandas operator is
    named transformWithState* in Spark's operator metadata, as the segment log's is, so it
    was read as a segment log and the inspect failed."""
    from eospack.tools.checkpoint import inspect_checkpoint

    inputs, checkpoint = tmp_path / "in", tmp_path / "cp"
    inputs.mkdir()
    write_batch(str(inputs), 0, [{"k": k, "n": 1, "v": 1.0, "t": T0} for k in "aab"])
    with session_settings(spark, ROCKSDB):
        counts = (
            source(spark, str(inputs))
            .select("k")
            .groupBy("k")
            .transformWithStateInPandas(
                spark_own_processor()(), "k string, count bigint", "Update", "None"
            )
        )
        sink = Emitted()
        run(counts, str(checkpoint), "update", sink)
        report = inspect_checkpoint(str(checkpoint), spark=spark)
        ours = tmp_path / "ours"
        logged = running_count(source(spark, str(inputs)), "k", state_layout="segment-log")
        run(logged, str(ours), "update", Emitted())
        our_report = inspect_checkpoint(str(ours), spark=spark)
    assert sink.final() == [(0, [("a", 2), ("b", 1)])]
    [operator] = report.operators
    assert operator.name is None and operator.keys is None
    [our_operator] = our_report.operators  # the segment log's is still read
    assert (our_operator.name, our_operator.keys) == ("running_count", 2)
