"""Attacks on the segment log (``state_layout="segment-log"``) in real streaming queries:
a ttl changed on a segment-log checkpoint (raised, then lowered) is applied as on the
key-groups layout, and the counts stay exact across the restarts; a task retried after
the operator appended its segment leaves the log as one attempt would."""

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
import pytest
from pyspark.sql import SparkSession

from eospack.lab.testing import session_settings, wait_until
from eospack.stateful_ops import read_state, running_count
from eospack.stateful_ops.state_store import state_store_conf
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    batch_timestamp_ms,
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
