"""stateful_ops on the segment log (``state_layout="segment-log"``) in real streaming queries.

The same JSON batches run through the key-groups layout (uninterrupted) and the segment log
(stopped after two batches, the commit of the second deleted so that it replays on restart,
as a crash between the state commit and the commit log leaves it): every batch emits the
same rows, the replay emits what the first attempt did, and the final counts are exact.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from eospack.lab.testing import session_settings, wait_until
from eospack.stateful_ops import (
    OperatorDefinitionError,
    deduplicate,
    read_state,
    running_aggregate,
    running_count,
)
from eospack.stateful_ops.segment_log import TOMBSTONE_COLUMN, fold
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

ROCKSDB = {**state_store_conf("rocksdb"), NO_DATA_BATCHES: "false"}
SEED = 4141
Build = Callable[[DataFrame, str], DataFrame]


def make_batches(seed: int) -> list[list[dict[str, Any]]]:
    """Four batches over null and composite keys; later batches touch few keys."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    keys = ["a", "b", "c", "d", "e", "f", "g", None]

    def row(k: str | None) -> dict[str, Any]:
        v = rng.choice([None, round(rng.uniform(-5, 5), 2)])
        return {"k": k, "n": rng.choice([1, 2, None]), "v": v, "t": T0}

    sizes = [40, 12, 6, 3]
    return [[row(rng.choice(keys)) for _ in range(size)] for size in sizes]


BATCHES = make_batches(SEED)

CASES: dict[str, Build] = {
    "running_count": lambda df, layout: running_count(
        df, ["k", "n"], key_groups=4, state_layout=layout
    ),
    "running_aggregate": lambda df, layout: running_aggregate(
        df, "k", {"v": ["sum", "min", "max", "count"], "n": ["sum"]}, state_layout=layout
    ),
}


def rounded(emitted: list[tuple[int, list[tuple[Any, ...]]]]) -> list[Any]:
    return [
        (batch_id, [tuple(round(x, 9) if isinstance(x, float) else x for x in row) for row in rows])
        for batch_id, rows in emitted
    ]


def uninterrupted(spark: SparkSession, root: str, build: Build, layout: str) -> Emitted:
    """Every batch in one run (checkpoint ``<root>/<layout>-cp``)."""
    directory = os.path.join(root, f"{layout}-input")
    os.makedirs(directory)
    for index, rows in enumerate(BATCHES):
        write_batch(directory, index, rows)
    sink = Emitted()
    run(build(source(spark, directory), layout), os.path.join(root, f"{layout}-cp"), "update", sink)
    return sink


def interrupted(spark: SparkSession, root: str, build: Build) -> Emitted:
    """Two batches, forget the second's commit, restart with the rest on the checkpoint."""
    directory = os.path.join(root, "interrupted-input")
    checkpoint = os.path.join(root, "interrupted-cp")
    os.makedirs(directory)
    sink = Emitted()
    for index in (0, 1):
        write_batch(directory, index, BATCHES[index])
    run(build(source(spark, directory), "segment-log"), checkpoint, "update", sink)
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    for index in range(2, len(BATCHES)):
        write_batch(directory, index, BATCHES[index])
    run(build(source(spark, directory), "segment-log"), checkpoint, "update", sink)
    return sink


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(CASES))
def test_segment_log_equals_key_groups_across_restart_and_replay(
    spark: SparkSession, tmp_path: Any, name: str
) -> None:
    root = str(tmp_path)
    with session_settings(spark, ROCKSDB):
        expected = uninterrupted(spark, root, CASES[name], "key-groups")
        actual = interrupted(spark, root, CASES[name])
        expected_state = read_state(spark, os.path.join(root, "key-groups-cp"))
        actual_state = read_state(spark, os.path.join(root, "interrupted-cp"))

    replays = [rows for batch_id, rows in actual.attempts if batch_id == 1]
    assert len(replays) == 2
    assert replays[0] == replays[1]
    assert [batch_id for batch_id, _ in actual.final()] == list(range(len(BATCHES)))
    assert rounded(actual.final()) == rounded(expected.final())
    # The same per-key state as the key-groups layout's (read_state folds the logs).
    columns = list(expected_state.columns)
    assert len(actual_state) == len(expected_state) > 0
    assert sorted(map(repr, actual_state[columns].round(9).itertuples(index=False))) == sorted(
        map(repr, expected_state.round(9).itertuples(index=False))
    )
    if name == "running_count":
        # Exact: each key's last emitted count is its number of rows over all batches.
        last: dict[tuple[Any, Any], int] = {}
        for _, rows in actual.final():
            for k, n, count, _version in rows:
                last[(k, n)] = count
        assert last == Counter((r["k"], r["n"]) for batch in BATCHES for r in batch)


def segments_of(spark: SparkSession, checkpoint: str) -> list[pa.Table]:
    """The segments of every key group's log, in the state data source's order."""
    rows = (
        spark.read.format("statestore")
        .option("stateVarName", "segments")
        .load(checkpoint)
        .select("list_element.segment")
        .collect()
    )
    return [pa.ipc.open_stream(bytes(row[0])).read_all() for row in rows]


@pytest.mark.timeout(600)
def test_log_compacts_to_live_rows_past_twice_the_live_keys(
    spark: SparkSession, tmp_path: Any
) -> None:
    """One key group of 3 keys: batches 1-3 append one row each (the log reaches 6 rows,
    twice the live keys), batch 4 would make 7 and compacts to 3 live rows, batch 5 appends
    one more. Counts stay exact through the compaction."""
    directory, checkpoint = str(tmp_path / "input"), str(tmp_path / "cp")
    os.makedirs(directory)
    write_batch(directory, 0, [{"k": k, "n": 1, "v": 1.0, "t": T0} for k in "abc"])
    for index in range(1, 6):
        write_batch(directory, index, [{"k": "a", "n": 1, "v": 1.0, "t": T0}])
    sink = Emitted()
    with session_settings(spark, ROCKSDB):
        result = running_count(
            source(spark, directory), "k", key_groups=1, state_layout="segment-log"
        )
        run(result, checkpoint, "update", sink)
        segments = segments_of(spark, checkpoint)
        state = read_state(spark, checkpoint)

    assert sink.final() == [
        (0, [("a", 1, 1), ("b", 1, 1), ("c", 1, 1)]),
        *[(batch, [("a", batch + 1, batch + 1)]) for batch in range(1, 6)],
    ]
    assert sorted(segment.num_rows for segment in segments) == [1, 3]
    compacted = next(segment for segment in segments if segment.num_rows == 3)
    appended = next(segment for segment in segments if segment.num_rows == 1)
    assert not any(compacted[TOMBSTONE_COLUMN].to_pylist())
    live = fold([compacted], ["k"]).select(["k", "count"]).to_pylist()
    assert sorted(live, key=str) == [
        {"k": "a", "count": 5},
        {"k": "b", "count": 1},
        {"k": "c", "count": 1},
    ]
    assert appended.select(["k", "count", TOMBSTONE_COLUMN]).to_pylist() == [
        {"k": "a", "count": 6, TOMBSTONE_COLUMN: False}
    ]
    # read_state folds the log: the live rows, each key once.
    assert sorted(map(tuple, state[["k", "count", "version"]].itertuples(index=False))) == [
        ("a", 6, 6),
        ("b", 1, 1),
        ("c", 1, 1),
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("first", "second"), [("key-groups", "segment-log"), ("segment-log", "key-groups")]
)
def test_restart_with_the_other_layout_is_refused_by_spark(
    spark: SparkSession, tmp_path: Any, first: str, second: str
) -> None:
    """Spark's operator metadata names the operator (applyInPandasWithState or
    transformWithStateInPandasExec): the first batch after the switch fails, before the
    sink sees a row."""
    directory, checkpoint = str(tmp_path / "input"), str(tmp_path / "cp")
    os.makedirs(directory)
    write_batch(directory, 0, [{"k": "a", "n": 1, "v": 1.0, "t": T0}])
    with session_settings(spark, ROCKSDB):
        run(
            running_count(source(spark, directory), "k", state_layout=first),
            checkpoint,
            "update",
            Emitted(),
        )
        write_batch(directory, 1, [{"k": "a", "n": 1, "v": 1.0, "t": T0}])
        sink = Emitted()
        with pytest.raises(
            Exception, match="STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"
        ):
            run(
                running_count(source(spark, directory), "k", state_layout=second),
                checkpoint,
                "update",
                sink,
            )
    assert sink.attempts == []


@pytest.mark.timeout(120)
def test_segment_log_refusals_name_the_option(spark: SparkSession, tmp_path: Any) -> None:
    directory = str(tmp_path / "input")
    os.makedirs(directory)
    df = source(spark, directory)
    with pytest.raises(
        OperatorDefinitionError, match=r"^running_count: state_layout='rows'; use 'key-groups'"
    ):
        running_count(df, "k", state_layout="rows")
    with (
        session_settings(spark, state_store_conf("hdfs", changelog=False)),
        pytest.raises(
            OperatorDefinitionError,
            match=r"spark\.sql\.streaming\.stateStore\.providerClass.*configure_state_store",
        ),
    ):
        running_count(df, "k", state_layout="segment-log")
    # Event time is supported (test_segment_log_event_time): defining it is not refused.
    watermarked = with_watermark(df)
    with session_settings(spark, ROCKSDB):
        running_count(watermarked, "k", ttl="1 hour", ttl_time="event", state_layout="segment-log")
        deduplicate(watermarked, "k", "1 hour", event_time="ts", state_layout="segment-log")


FIRST_BATCH, SECOND_BATCH = "<batch 0 timestamp>", "<batch 1 timestamp>"
TTL_CASES: dict[str, tuple[Callable[[DataFrame, str], DataFrame], list[Any], list[Any]]] = {
    "deduplicate": (
        lambda df, ttl: deduplicate(df, "k", ttl, key_groups=4, state_layout="segment-log"),
        [("x", 1, 2.0, T0), ("y", 1, 2.0, T0)],
        [("u", 1, 2.0, T0), ("x", 1, 2.0, T0)],
    ),
    "running_count": (
        lambda df, ttl: running_count(df, "k", key_groups=4, ttl=ttl, state_layout="segment-log"),
        [("x", 2, FIRST_BATCH), ("y", 1, FIRST_BATCH)],
        [("u", 1, SECOND_BATCH), ("x", 1, SECOND_BATCH)],
    ),
    "running_aggregate": (
        lambda df, ttl: running_aggregate(
            df, "k", {"v": "sum"}, key_groups=4, ttl=ttl, state_layout="segment-log"
        ),
        [("x", 4.0, FIRST_BATCH), ("y", 2.0, FIRST_BATCH)],
        [("u", 2.0, SECOND_BATCH), ("x", 2.0, SECOND_BATCH)],
    ),
}
"""With ttl a key's version starts at its life's first batch timestamp (ms):
``FIRST_BATCH`` and ``SECOND_BATCH`` stand for batch 0's and batch 1's."""


def with_batch_timestamps(rows: list[Any], checkpoint: str) -> list[Any]:
    """``rows`` with ``FIRST_BATCH`` / ``SECOND_BATCH`` replaced by those batches' timestamps."""
    stamps = {FIRST_BATCH: 0, SECOND_BATCH: 1}
    return [
        tuple(
            batch_timestamp_ms(checkpoint, stamps[field]) if field in stamps else field
            for field in row
        )
        for row in rows
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(TTL_CASES))
def test_processing_time_ttl_on_the_segment_log_forgets_idle_keys(
    spark: SparkSession, tmp_path: Any, name: str
) -> None:
    """As the key-groups layout's ttl test: x and y, then (after the ttl) x and u: x counts
    from 1 again and y left the state through its key group's TWS timer (the group gets no
    row)."""
    build, first_batch, second_batch = TTL_CASES[name]
    groups = dict(
        spark.createDataFrame([(k,) for k in "xyu"], "k string")
        .selectExpr("k", "pmod(xxhash64(k), 4)")
        .collect()
    )
    # y's key group gets no row in the second batch: y leaves through the group's timer.
    assert groups["y"] not in (groups["x"], groups["u"]), groups
    directory, checkpoint = str(tmp_path / "input"), str(tmp_path / "cp")
    os.makedirs(directory)
    ttl_ms = 1000
    row = {"n": 1, "v": 2.0, "t": T0}
    write_batch(directory, 0, [{**row, "k": k} for k in ("x", "y", "x")])
    sink = Emitted()

    def start() -> StreamingQuery:
        with session_settings(spark, ROCKSDB):
            result = build(source(spark, directory), f"{ttl_ms} ms")
            return run(result, checkpoint, "append" if name == "deduplicate" else "update", sink)

    first = start()
    assert sink.final() == [(0, with_batch_timestamps(first_batch, checkpoint))]
    batch_time = pd.Timestamp(first.lastProgress["timestamp"]).timestamp()
    wait_until(lambda: time.time() > batch_time + 2 * ttl_ms / 1000, 10, "the ttl to pass")
    write_batch(directory, 1, [{**row, "k": k} for k in ("x", "u")])
    start()
    assert sink.final()[1] == (1, with_batch_timestamps(second_batch, checkpoint))
    assert sorted(read_state(spark, checkpoint)["k"]) == ["u", "x"]
