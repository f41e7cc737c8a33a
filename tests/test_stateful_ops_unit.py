"""Pure pandas logic of stateful_ops: update functions, key groups' state rows, timeouts.

The operators run through ``StatefulOperator._call`` with a real ``GroupState`` object, the
way Spark's Python worker calls them, but without Spark: frames are built the way Spark
hands them to pandas (integers with nulls as float64, strings as object with None).
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from eospack.stateful_ops import (
    Deduplicate,
    OperatorDefinitionError,
    RunningAggregate,
    RunningCount,
    Sessionize,
    StatefulOperator,
    StateSchemaMismatchError,
    state_codec,
)
from eospack.stateful_ops.base import MARKER_COLUMN, SETTINGS_KEY_GROUP, flag_first_row
from eospack.stateful_ops.initial_state import KEY_GROUP_PARTITION
from eospack.stateful_ops.operators.partial_aggregation import (
    PARTIAL_COUNT,
    partial_aggregates,
    partial_counts,
)
from eospack.stateful_ops.operators.sessionize import merge_sessions
from eospack.stateful_ops.operators.shared import EVENT_US
from eospack.stateful_ops.state_store import configure_state_store, state_store_conf
from eospack.stateful_ops.validation import duration_ms

GROUP_STATE_SCHEMA = StructType(
    [
        StructField("format_version", IntegerType()),
        StructField("operator", StringType()),
        StructField("table", BinaryType()),
    ]
)
KEYED = StructType(
    [
        StructField("k", StringType()),
        StructField("n", IntegerType()),
        StructField("v", DoubleType()),
    ]
)
TIMEOUT_CONF = {
    "none": GroupStateTimeout.NoTimeout,
    "processing": GroupStateTimeout.ProcessingTimeTimeout,
    "event": GroupStateTimeout.EventTimeTimeout,
}


class Group:
    """One key group's state across calls, as Spark would keep it between batches."""

    def __init__(self, operator: StatefulOperator, key_group: int = 0) -> None:
        self.operator = operator
        self.key_group = key_group
        self.value: tuple[Any, ...] | None = None
        self.timeout_ms = -1
        self.updated = False

    def call(
        self,
        frames: Sequence[pd.DataFrame],
        now_ms: int = 1_000_000,
        watermark_ms: int = -1,
        timed_out: bool = False,
    ) -> pd.DataFrame:
        state = GroupState(
            optionalValue=self.value,
            batchProcessingTimeMs=now_ms,
            eventTimeWatermarkMs=watermark_ms,
            timeoutConf=TIMEOUT_CONF[self.operator.timeout],
            hasTimedOut=timed_out,
            watermarkPresent=watermark_ms >= 0,
            defined=self.value is not None,
            updated=False,
            removed=False,
            timeoutTimestamp=-1,
            keyAsUnsafe=b"",
            valueSchema=GROUP_STATE_SCHEMA,
        )
        outputs = list(self.operator._call((self.key_group,), iter(frames), state))
        self.value = tuple(state._value) if state.exists else None
        self.timeout_ms = state._timeout_timestamp
        self.updated = state._updated
        if not outputs:
            return pd.DataFrame(columns=self.operator.out_schema.names)
        return pd.concat(outputs, ignore_index=True)

    def keys_in_state(self) -> int:
        return len(self.operator.load_value(self.value)) if self.value else 0


def rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows as plain Python tuples with None for nulls, sorted."""
    plain = frame.astype(object).where(frame.notna(), None)
    return sorted(map(tuple, plain.itertuples(index=False)), key=repr)


def spark_frame(data: dict[str, list[Any]]) -> pd.DataFrame:
    """A frame as Spark's Arrow conversion builds it (nullable ints become float64)."""
    return pd.DataFrame(data)


def bound(operator: StatefulOperator, keys: Sequence[str], schema: StructType) -> Any:
    operator.bind(keys, schema)
    return operator


# running_count ---------------------------------------------------------------------------


def test_running_count_folds_several_frames_and_versions_per_key() -> None:
    group = Group(bound(RunningCount(["k", "n"]), ["k", "n"], KEYED))
    first = group.call(
        [
            spark_frame({"k": ["a", None, "a"], "n": [1.0, np.nan, 1.0], "v": [0.0] * 3}),
            spark_frame({"k": ["a", "b"], "n": [1, 2], "v": [0.0] * 2}),
        ]
    )
    assert rows(first) == [("a", 1, 3, 1), ("b", 2, 1, 1), (None, None, 1, 1)]
    second = group.call([spark_frame({"k": [None, "c"], "n": [np.nan, 3.0], "v": [0.0, 0.0]})])
    assert rows(second) == [("c", 3, 1, 1), (None, None, 2, 2)]
    third = group.call([spark_frame({"k": ["a"], "n": [1], "v": [0.0]})])
    assert rows(third) == [("a", 1, 4, 2)]


def test_partial_counts_combine_batches_with_null_and_composite_keys() -> None:
    count = partial_counts(["k", "n"])
    first = pa.record_batch({"k": ["a", None, "a", None], "n": [1, None, 1, 2]})
    second = pa.record_batch({"k": ["a", None], "n": [1, None]})
    out = pa.Table.from_batches(list(count(iter([first, second.slice(0, 0), second]))))
    assert out.column_names == ["k", "n", PARTIAL_COUNT]
    assert sorted(out.to_pylist(), key=repr) == sorted(
        [
            {"k": "a", "n": 1, PARTIAL_COUNT: 3},
            {"k": None, "n": None, PARTIAL_COUNT: 2},
            {"k": None, "n": 2, PARTIAL_COUNT: 1},
        ],
        key=repr,
    )
    assert list(count(iter([]))) == []


def test_running_count_sums_partial_counts() -> None:
    schema = StructType([KEYED["k"], StructField(PARTIAL_COUNT, LongType())])
    group = Group(bound(RunningCount("k"), ["k"], schema))
    frames = [spark_frame({"k": ["a", None], PARTIAL_COUNT: [3, 2]})]
    assert rows(group.call(frames)) == [("a", 3, 1), (None, 2, 1)]
    frames = [
        spark_frame({"k": ["a"], PARTIAL_COUNT: [4]}),
        spark_frame({"k": ["a"], PARTIAL_COUNT: [1]}),
    ]
    assert rows(group.call(frames)) == [("a", 8, 2)]


@pytest.mark.parametrize("partial", [True, False], ids=["partial-counts", "rows"])
def test_running_count_matches_a_dictionary_over_random_batches(partial: bool) -> None:
    """Composite keys with nulls, a key in several frames of a batch, keys coming back:
    every batch's output and the final state equal a plain dictionary's counts."""
    seed = int(np.random.default_rng().integers(1 << 31))
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    fields = [KEYED["k"], KEYED["n"]]
    schema = StructType(fields + ([_long(PARTIAL_COUNT)] if partial else [KEYED["v"]]))
    group = Group(bound(RunningCount(["k", "n"]), ["k", "n"], schema))
    expected: dict[tuple[Any, Any], list[int]] = {}
    for _ in range(6):
        frames: list[pd.DataFrame] = []
        batch: collections.Counter[tuple[Any, Any]] = collections.Counter()
        for _ in range(int(rng.integers(1, 4))):
            size = int(rng.integers(0, 30))
            keys = [["a", "b", None][int(rng.integers(0, 3))] for _ in range(size)]
            numbers = [None if rng.random() < 0.2 else int(rng.integers(0, 4)) for _ in range(size)]
            weights = [int(rng.integers(1, 5)) if partial else 1 for _ in range(size)]
            for key, number, weight in zip(keys, numbers, weights, strict=True):
                batch[(key, number)] += weight
            data: dict[str, list[Any]] = {
                "k": keys,
                "n": [np.nan if x is None else x for x in numbers],
            }
            data[PARTIAL_COUNT if partial else "v"] = weights if partial else [0.0] * size
            frames.append(spark_frame(data))
        for pair, added in batch.items():
            count, version = expected.get(pair, [0, 0])
            expected[pair] = [count + added, version + 1]
        emitted = [
            (k, None if pd.isna(n) else int(n), c, v) for k, n, c, v in rows(group.call(frames))
        ]
        assert sorted(emitted, key=repr) == sorted(
            [(*pair, *expected[pair]) for pair in batch], key=repr
        )
    assert group.value is not None
    stored = group.operator.load_value(group.value)
    assert sorted(
        [(k, None if pd.isna(n) else int(n), c, v) for k, n, c, v in rows(stored)], key=repr
    ) == sorted([(*pair, *value) for pair, value in expected.items()], key=repr)


def test_deduplicate_matches_a_dictionary_over_random_batches() -> None:
    """Composite keys with nulls: a row is emitted exactly when its key is not remembered,
    once per key and batch (the first row), and remembered until its ttl passes."""
    seed = int(np.random.default_rng().integers(1 << 31))
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    group = Group(bound(Deduplicate(["k", "n"], "10 seconds"), ["k", "n"], KEYED))
    expires: dict[tuple[Any, Any], int] = {}
    for batch in range(8):
        now_ms = 1_000_000 + batch * 4_000
        size = int(rng.integers(0, 25))
        keys = [["a", "b", None][int(rng.integers(0, 3))] for _ in range(size)]
        numbers = [None if rng.random() < 0.2 else int(rng.integers(0, 3)) for _ in range(size)]
        values = list(range(batch * 100, batch * 100 + size))
        frame = spark_frame(
            {"k": keys, "n": [np.nan if x is None else x for x in numbers], "v": values}
        )
        expires = {key: at for key, at in expires.items() if at > now_ms * 1000}
        wanted = []
        for key, number, value in zip(keys, numbers, values, strict=True):
            if (key, number) not in expires:
                expires[(key, number)] = (now_ms + 10_000) * 1000
                wanted.append((key, number, float(value)))
        out = group.call([frame], now_ms=now_ms)
        got = [(k, None if pd.isna(n) else int(n), float(v)) for k, n, v in rows(out)]
        assert got == sorted(wanted, key=repr)


def test_empty_batch_keeps_state_and_emits_nothing() -> None:
    group = Group(bound(RunningCount("k"), ["k"], KEYED))
    group.call([spark_frame({"k": ["a"], "n": [1], "v": [1.0]})])
    stored = group.value
    assert len(group.call([spark_frame({"k": [], "n": [], "v": []})])) == 0
    assert group.value == stored


def test_group_state_row_is_versioned_arrow() -> None:
    group = Group(bound(RunningCount("k"), ["k"], KEYED))
    group.call([spark_frame({"k": ["a", "b"], "n": [1, 1], "v": [1.0, 1.0]})])
    assert group.value is not None
    format_version, operator, _ = group.value
    assert (format_version, operator) == (state_codec.STATE_FORMAT_VERSION, "running_count")
    table = state_codec.decode("running_count", group.value, group.operator.arrow_state_schema)
    assert rows(table) == [("a", 1, 1), ("b", 1, 1)]


# running_aggregate -----------------------------------------------------------------------


def test_running_aggregate_sql_null_semantics_across_batches() -> None:
    operator = RunningAggregate("k", {"v": ["sum", "mean", "min", "max", "count"], "n": "sum"})
    group = Group(bound(operator, ["k"], KEYED))
    first = group.call(
        [spark_frame({"k": ["a", "a", "b"], "n": [1.0, np.nan, np.nan], "v": [1.0, 3.0, None]})]
    )
    assert rows(first) == [
        ("a", 4.0, 2.0, 1.0, 3.0, 2, 1, 1),
        ("b", None, None, None, None, 0, None, 1),
    ]
    second = group.call([spark_frame({"k": ["a", "b"], "n": [5, 2], "v": [-2.0, 7.0]})])
    assert rows(second) == [
        ("a", 2.0, 2 / 3, -2.0, 3.0, 3, 6, 2),
        ("b", 7.0, 7.0, 7.0, 7.0, 1, 2, 2),
    ]


def test_partial_aggregates_give_the_pandas_path_result_with_nulls_and_nan() -> None:
    aggs = {"v": ["sum", "mean", "min", "max", "count"], "n": ["sum", "max"]}
    raw = Group(bound(RunningAggregate("k", aggs), ["k"], KEYED))
    operator = RunningAggregate("k", aggs)
    operator.column_types = {"v": DoubleType(), "n": IntegerType()}
    operator.partial = True
    partial_fields = StructType(operator.aggregate_fields(operator.column_types))
    partial = Group(bound(operator, ["k"], StructType([KEYED["k"], *partial_fields.fields])))
    aggregate = partial_aggregates(
        ["k"], operator._partial_spec(), partial_fields, settings_marker=True
    )
    batches = [
        pa.record_batch(
            {
                "k": ["a", "a", "b", None, "a"],
                "n": pa.array([1, None, 3, 4, 2], pa.int32()),
                "v": [1.0, float("nan"), None, 2.5, None],
            }
        ),
        pa.record_batch({"k": ["b"], "n": pa.array([None], pa.int32()), "v": [-1.0]}),
    ]
    table = pa.Table.from_batches(list(aggregate(iter([batches[0].slice(0, 0), *batches]))))
    assert table.column_names == ["k", *partial_fields.names, MARKER_COLUMN]
    assert table.column(MARKER_COLUMN).to_pylist() == [False] * 3 + [True]
    assert table.schema.field("sum__n").type == pa.int64()
    assert table.schema.field("max__n").type == pa.int32()
    partials = table.slice(0, 3).drop_columns([MARKER_COLUMN]).to_pandas()
    expected = [
        ("a", 1.0, 1.0, 1.0, 1.0, 1, 3, 2, 1),
        ("b", -1.0, -1.0, -1.0, -1.0, 1, 3, 3, 1),
        (None, 2.5, 2.5, 2.5, 2.5, 1, 4, 4, 1),
    ]
    assert rows(partial.call([partials])) == expected
    assert rows(raw.call([pa.Table.from_batches(batches).to_pandas()])) == expected
    assert partial.value == raw.value  # same state, whichever path computed it
    assert list(aggregate(iter([batches[0].slice(0, 0)]))) == []


def test_partial_aggregates_survive_column_names_like_arrow_aggregate_names() -> None:
    operator = RunningAggregate("v_count", {"v": ["sum"], "v_sum": ["count", "max"]})
    operator.column_types = {"v": LongType(), "v_sum": DoubleType()}
    fields = StructType(operator.aggregate_fields(operator.column_types))
    aggregate = partial_aggregates(["v_count"], operator._partial_spec(), fields)
    batch = pa.record_batch({"v_count": ["x", "x"], "v": [1, 2], "v_sum": [0.5, None]})
    (out,) = aggregate(iter([batch, batch]))
    assert out.to_pylist() == [
        {"v_count": "x", "rows": 4, "n__v": 4, "sum__v": 6, "n__v_sum": 2, "max__v_sum": 0.5}
    ]


def test_running_aggregate_rejects_unknown_aggregate() -> None:
    with pytest.raises(OperatorDefinitionError, match="aggregate 'p99' for column 'v'"):
        RunningAggregate("k", {"v": "p99"})


# deduplicate -----------------------------------------------------------------------------


def test_deduplicate_processing_time_expires_per_key_inside_the_group() -> None:
    operator = bound(Deduplicate("k", "10 seconds"), ["k"], KEYED)
    group = Group(operator)
    frame = spark_frame({"k": ["a", "b", "a"], "n": [1, 2, 3], "v": [0.0] * 3})
    assert rows(group.call([frame], now_ms=1_000_000)) == [("a", 1, 0.0), ("b", 2, 0.0)]
    assert group.timeout_ms == 1_010_000
    later = spark_frame({"k": ["a", "c"], "n": [4, 5], "v": [0.0, 0.0]})
    assert rows(group.call([later], now_ms=1_005_000)) == [("c", 5, 0.0)]
    assert group.timeout_ms == 1_010_000
    # a and b expire at 1_010_000; c (emitted at 1_005_000) is still remembered.
    assert len(group.call([], now_ms=1_010_000, timed_out=True)) == 0
    assert group.keys_in_state() == 1
    assert group.timeout_ms == 1_015_000
    group.call([], now_ms=1_015_000, timed_out=True)
    assert group.value is None  # nothing left: the state row is removed


def test_deduplicate_event_time_keeps_key_until_watermark_passes() -> None:
    schema = StructType([*KEYED.fields, StructField("ts", TimestampType()), _long(EVENT_US)])
    operator = bound(Deduplicate("k", "10 seconds", event_time="ts"), ["k"], schema)
    group = Group(operator)
    ts = pd.Timestamp("2024-01-01")

    def frame(keys: list[str], seconds: list[int]) -> pd.DataFrame:
        times = [ts + pd.Timedelta(seconds=s) for s in seconds]
        return spark_frame(
            {
                "k": keys,
                "n": list(range(len(keys))),
                "v": [0.0] * len(keys),
                "ts": times,
                EVENT_US: [int(t.timestamp() * 1_000_000) for t in times],
            }
        )

    base_ms = int(ts.timestamp() * 1000)
    # Out of order within the batch: the earliest event of a key is the one emitted.
    out = group.call([frame(["a", "a"], [5, 2])], watermark_ms=base_ms)
    assert [(k, t) for k, _, _, t in rows(out)] == [("a", ts + pd.Timedelta(seconds=2))]
    assert group.timeout_ms == base_ms + 12_000 - 1
    assert len(group.call([frame(["a"], [11])], watermark_ms=base_ms + 11_999)) == 0
    again = group.call([frame(["a"], [20])], watermark_ms=base_ms + 12_000)
    assert len(again) == 1


# sessionize ------------------------------------------------------------------------------


def _long(name: str) -> StructField:
    return StructField(name, LongType())


def test_merge_sessions_handles_out_of_order_and_null_keys() -> None:
    gap = 10
    starts = [0, 25, 5, 100, 3, 12]
    intervals = pd.DataFrame(
        {
            "k": ["a", "a", "a", "a", None, None],
            "session_start_us": starts,
            "session_end_us": [s + gap for s in starts],
            "count": [1, 1, 1, 1, 1, 1],
        }
    )
    merged = merge_sessions(intervals, ["k"])
    expected = [("a", 0, 15, 2), ("a", 25, 35, 1), ("a", 100, 110, 1), (None, 3, 22, 2)]
    assert rows(merged) == sorted(expected, key=repr)


def test_sessionize_closes_sessions_when_watermark_reaches_end() -> None:
    schema = StructType([KEYED["k"], StructField("ts", TimestampType()), _long(EVENT_US)])
    operator = bound(Sessionize("k", "ts", "10 seconds"), ["k"], schema)
    group = Group(operator)
    second = 1_000_000

    def frame(keys: list[str], seconds: list[int]) -> pd.DataFrame:
        return spark_frame(
            {"k": keys, "ts": [pd.NaT] * len(keys), EVENT_US: [s * second for s in seconds]}
        )

    assert len(group.call([frame(["a", "a", "b"], [0, 8, 1])], watermark_ms=0)) == 0
    assert group.timeout_ms == 11_000 - 1  # wakes up once the watermark reaches b's end
    # a's session is extended across batches by an event within the gap.
    out = group.call([frame(["a"], [15])], watermark_ms=11_000)
    assert rows(out) == [("b", 1 * second, 11 * second, 1)]
    assert len(group.call([], watermark_ms=24_999, timed_out=True)) == 0
    closed = group.call([], watermark_ms=25_000, timed_out=True)
    assert rows(closed) == [("a", 0, 25 * second, 3)]
    assert group.value is None


def test_a_bootstrapped_key_group_loads_once_and_keeps_its_timeouts(tmp_path: Any) -> None:
    """initial_state: the first visit (here only bootstrap markers) loads the key group's keys
    and arms their timeout; a visit with only markers afterwards rewrites nothing and keeps
    the timeout; an emptied key group keeps its row, so its keys never load again."""
    schema = StructType([KEYED["k"], StructField("ts", TimestampType()), _long(EVENT_US)])
    operator = bound(Sessionize("k", "ts", "10 seconds"), ["k"], schema)
    second = 1_000_000
    initial = pa.table(
        {"k": ["a"], "session_start_us": [0], "session_end_us": [10 * second], "count": [2]},
        schema=operator.arrow_state_schema,
    )
    write_split_group(tmp_path, 3, initial)
    operator.bootstrap_directory = str(tmp_path)
    group = Group(operator, key_group=3)
    marker = spark_frame({"k": ["z"], "ts": [pd.NaT], EVENT_US: [0], MARKER_COLUMN: [True]})

    assert len(group.call([marker], watermark_ms=5_000)) == 0
    assert group.keys_in_state() == 1 and group.timeout_ms == 10_000 - 1
    assert len(group.call([marker], watermark_ms=6_000)) == 0
    assert not group.updated and group.timeout_ms == 10_000 - 1
    closed = group.call([], watermark_ms=10_000, timed_out=True)
    assert rows(closed) == [("a", 0, 10 * second, 2)]
    assert group.value is not None and group.keys_in_state() == 0
    assert len(group.call([marker], watermark_ms=20_000)) == 0
    assert group.keys_in_state() == 0


def write_split_group(directory: Any, key_group: int, table: pa.Table) -> None:
    """One key group of a restored operator's split, as ``split_by_key_group`` writes it."""
    group_directory = Path(directory) / f"{KEY_GROUP_PARTITION}={key_group}"
    group_directory.mkdir(parents=True)
    pq.write_table(table, group_directory / "part-0.parquet")


def test_a_restored_operator_keeps_the_old_watermark_and_expires_on_marker_visits(
    tmp_path: Any,
) -> None:
    """Restored with the old query's watermarks (195 s next): a visit by bootstrap markers
    alone is a visit without data, so what that watermark closes closes (Spark's watermark
    is still 0 in a fresh checkpoint); a row at or behind it is late and dropped (no second
    session for a closed key); a later visit with Spark's own watermark closes the rest."""
    ts = StructField("ts", TimestampType(), True, {"spark.watermarkDelayMs": 5000})
    schema = StructType([KEYED["k"], ts, _long(EVENT_US)])
    operator = bound(Sessionize("k", "ts", "10 seconds"), ["k"], schema)
    second = 1_000_000
    initial = pa.table(
        {
            "k": ["a", "b"],
            "session_start_us": [1 * second, 200 * second],
            "session_end_us": [17 * second, 210 * second],
            "count": [3, 1],
        },
        schema=operator.arrow_state_schema,
    )
    write_split_group(tmp_path, 3, initial)
    operator.bootstrap_directory = str(tmp_path)
    operator.restored_watermarks = (0, 195_000)
    group = Group(operator, key_group=3)

    def frame(keys: list[str], seconds: list[int], markers: list[bool]) -> pd.DataFrame:
        events = [value * second for value in seconds]
        return spark_frame(
            {
                "k": keys,
                "ts": [pd.NaT] * len(keys),
                EVENT_US: events,
                MARKER_COLUMN: markers,
                "__so_event_time_us": events,  # base.EVENT_TIME_COLUMN
            }
        )

    marker = frame(["z"], [0], [True])
    closed = group.call([marker], watermark_ms=0)
    assert rows(closed) == [("a", 1 * second, 17 * second, 3)]
    assert group.keys_in_state() == 1 and group.timeout_ms == 210_000 - 1
    assert len(group.call([frame(["z", "a"], [0, 100], [True, False])], watermark_ms=0)) == 0
    assert group.keys_in_state() == 1 and group.timeout_ms == 210_000 - 1
    closed = group.call([marker], watermark_ms=300_000)
    assert rows(closed) == [("b", 200 * second, 210 * second, 1)]
    assert group.value is not None and group.keys_in_state() == 0


# state encoding and schema evolution -----------------------------------------------------


def test_state_codec_round_trips_composite_null_and_timestamp_keys() -> None:
    schema = StructType(
        [
            StructField("k", StringType()),
            StructField("n", LongType()),
            StructField("ts", TimestampType()),
        ]
    )
    operator = bound(RunningCount(["k", "n", "ts"]), ["k", "n", "ts"], schema)
    group = Group(operator)
    stamp = datetime.datetime(2024, 5, 1, 12, 30, 15, 123456)
    frame = spark_frame(
        {"k": ["x", None, None], "n": [2**62, np.nan, np.nan], "ts": [stamp, pd.NaT, pd.NaT]}
    )
    group.call([frame])
    out = group.call([spark_frame({"k": [None], "n": [np.nan], "ts": [pd.NaT]})])
    assert rows(out) == [(None, None, None, 3, 2)]
    first = group.call([spark_frame({"k": ["x"], "n": [2**62], "ts": [stamp]})])
    assert rows(first) == [("x", 2**62, pd.Timestamp(stamp), 2, 2)]


def test_state_written_by_another_operator_or_schema_is_refused() -> None:
    counted = bound(RunningCount("k"), ["k"], KEYED)
    group = Group(counted)
    group.call([spark_frame({"k": ["a"], "n": [1], "v": [1.0]})])
    assert group.value is not None

    aggregated = bound(RunningAggregate("k", {"v": "sum"}), ["k"], KEYED)
    with pytest.raises(StateSchemaMismatchError) as error:
        aggregated.load_value(group.value)
    assert str(error.value) == (
        "running_aggregate: stored state was written by operator 'running_count';"
        " restart from a new checkpoint location"
    )
    retyped = bound(RunningCount("v"), ["v"], KEYED)
    with pytest.raises(StateSchemaMismatchError) as error:
        retyped.load_value(group.value)
    assert str(error.value) == (
        "running_count: stored state schema changed: stored columns no longer declared: k;"
        " declared columns missing from stored state: v; restart from a new checkpoint location"
    )
    regrouped = bound(RunningCount("k", key_groups=3), ["k"], KEYED)
    with pytest.raises(StateSchemaMismatchError) as error:
        regrouped.load_value(group.value)
    assert str(error.value) == (
        "running_count: stored state was written with key_groups=8, this query declares"
        " key_groups=3; keep key_groups=8 for this checkpoint or restart from a new"
        " checkpoint location"
    )
    with pytest.raises(StateSchemaMismatchError, match="format version 7"):
        counted.load_value((7, *group.value[1:]))


# fixed settings: the settings key group that every batch with rows visits -----------------


class NeverUpdated(RunningCount):
    """A running count whose hooks must not run for the settings key group."""

    def update(self, rows: pd.DataFrame, state: pd.DataFrame, clock: Any) -> Any:
        raise AssertionError(f"update received {len(rows)} rows")

    def on_timeout(self, state: pd.DataFrame, clock: Any) -> Any:
        raise AssertionError("on_timeout was called")


def test_settings_key_group_records_settings_once_and_never_reaches_update() -> None:
    group = Group(bound(NeverUpdated("k"), ["k"], KEYED), key_group=SETTINGS_KEY_GROUP)
    marker = spark_frame({"k": ["a"], "n": [1], "v": [1.0]})
    assert len(group.call([marker, marker])) == 0
    assert group.updated
    assert group.value is not None
    assert group.value[:2] == (state_codec.STATE_FORMAT_VERSION, "running_count")
    assert group.keys_in_state() == 0  # an empty state table: only its schema matters
    recorded = group.value
    assert len(group.call([marker])) == 0
    assert not group.updated  # checked, not rewritten
    assert group.value == recorded


@pytest.mark.parametrize(
    ("key", "key_groups", "schema", "message"),
    [
        (
            "k",
            16,
            KEYED,
            "running_count: stored state was written with key_groups=8, this query declares"
            " key_groups=16; keep key_groups=8 for this checkpoint or restart from a new"
            " checkpoint location",
        ),
        (
            "n",
            8,
            KEYED,
            "running_count: stored state schema changed: stored columns no longer declared: k;"
            " declared columns missing from stored state: n; restart from a new checkpoint"
            " location",
        ),
        (
            ["n", "k"],
            8,
            KEYED,
            "running_count: stored state schema changed: column order differs;"
            " restart from a new checkpoint location",
        ),
        (
            ["k", "n"],
            8,
            StructType([KEYED["k"], StructField("n", LongType())]),
            "running_count: stored state schema changed: retyped: n int32 -> int64;"
            " restart from a new checkpoint location",
        ),
    ],
)
def test_settings_key_group_refuses_changes_of_the_key_to_group_mapping(
    key: str | list[str], key_groups: int, schema: StructType, message: str
) -> None:
    stored_key = ["k"] if key in ("k", "n") else ["k", "n"]
    group = Group(bound(RunningCount(stored_key), stored_key, KEYED), SETTINGS_KEY_GROUP)
    group.call([])
    keys = [key] if isinstance(key, str) else key
    group.operator = bound(RunningCount(key, key_groups=key_groups), keys, schema)
    with pytest.raises(StateSchemaMismatchError) as error:
        group.call([spark_frame({"k": ["a"], "n": [1], "v": [1.0]})])
    assert str(error.value) == message


def test_partial_counts_add_one_settings_marker_per_partition() -> None:
    count = partial_counts(["k"], settings_marker=True)
    first = pa.record_batch({"k": ["b", "a", "b"]})
    second = pa.record_batch({"k": ["a"]})
    out = pa.Table.from_batches(list(count(iter([first.slice(0, 0), first, second]))))
    assert out.column_names == ["k", PARTIAL_COUNT, MARKER_COLUMN]
    data = [row for row in out.to_pylist() if not row[MARKER_COLUMN]]
    markers = [row for row in out.to_pylist() if row[MARKER_COLUMN]]
    assert sorted(data, key=repr) == [
        {"k": "a", PARTIAL_COUNT: 2, MARKER_COLUMN: False},
        {"k": "b", PARTIAL_COUNT: 2, MARKER_COLUMN: False},
    ]
    assert len(markers) == 1  # its key is a real one, so non-nullable keys stay valid
    assert markers[0]["k"] in ("a", "b")
    assert list(count(iter([first.slice(0, 0)]))) == []  # no rows, no marker


def test_flag_first_row_flags_only_the_first_row_of_a_partition() -> None:
    batches = [pa.array([], pa.bool_()), pa.array([True] * 3), pa.array([True] * 2)]
    flags = [array.to_pylist() for array in flag_first_row(iter(batches))]
    assert flags == [[], [True, False, False], [False, False]]


# argument parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10 seconds", 10_000),
        ("500 ms", 500),
        ("1 minute", 60_000),
        ("2 hours", 7_200_000),
        (datetime.timedelta(milliseconds=1), 1),
    ],
)
def test_duration_parsing(value: object, expected: int) -> None:
    assert duration_ms("op", "ttl", value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0 seconds", "op: ttl='0 seconds' must be positive (at least 1 ms)"),
        (datetime.timedelta(0), "op: ttl=datetime.timedelta(0) must be positive (at least 1 ms)"),
        ("10 fortnights", "op: ttl='10 fortnights' has unknown unit 'fortnights';"),
        (10, "op: ttl=10 is not a duration;"),
    ],
)
def test_bad_durations(value: object, message: str) -> None:
    with pytest.raises(OperatorDefinitionError) as error:
        duration_ms("op", "ttl", value)
    assert str(error.value).startswith(message)


def test_key_groups_must_be_positive() -> None:
    with pytest.raises(OperatorDefinitionError, match="key_groups=0 must be a positive integer"):
        RunningCount("k", key_groups=0)


def test_state_store_conf() -> None:
    assert state_store_conf() == {
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    }
    with pytest.raises(OperatorDefinitionError, match="changelog checkpointing needs"):
        state_store_conf("hdfs", changelog=True)


def test_configure_state_store_on_a_builder() -> None:
    from pyspark.sql import SparkSession

    builder = SparkSession.Builder()
    assert configure_state_store(builder, "hdfs", changelog=False) is builder
    assert builder._options["spark.sql.streaming.stateStore.providerClass"].endswith(
        "HDFSBackedStateStoreProvider"
    )
    assert (
        builder._options["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"]
        == "false"
    )


def test_output_mode_is_checked_and_append_is_accepted():
    from eospack.stateful_ops import OperatorDefinitionError, RunningCount

    assert RunningCount("k", output_mode="append").output_mode == "append"
    assert RunningCount("k").output_mode == "update"
    with pytest.raises(
        OperatorDefinitionError,
        match=r"^running_count: output_mode='complete'; use 'update' or 'append'$",
    ):
        RunningCount("k", output_mode="complete")


# Operator names (Flink's uid) -------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a b", "x/y", "é", "a" * 129, 7])
def test_an_invalid_operator_name_is_refused_in_one_line(name: Any) -> None:
    with pytest.raises(OperatorDefinitionError) as error:
        RunningCount("k", name=name)
    assert str(error.value).startswith(f"running_count: name={name!r} is not a valid")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "make", [RunningCount, lambda key, name: Deduplicate(key, "1 minute", name=name)]
)
def test_every_operator_takes_a_name_default_none(make: Any) -> None:
    assert make("k", name=None).operator_name is None
    assert make("k", name="counts-by_user.v2").operator_name == "counts-by_user.v2"


def test_a_named_operator_stores_its_name_and_a_rename_relabels_the_settings_row() -> None:
    operator = bound(RunningCount("k", name="counts"), ["k"], KEYED)
    data = Group(operator)
    data.call([spark_frame({"k": ["a", "a"], "n": [1, 1], "v": [0.0, 0.0]})])
    assert data.value is not None and state_codec.stored_name(data.value) == "counts"
    settings = Group(operator, key_group=SETTINGS_KEY_GROUP)
    settings.call([spark_frame({"k": ["a"], "n": [1], "v": [0.0]})])
    assert settings.value is not None and state_codec.stored_name(settings.value) == "counts"

    renamed = bound(RunningCount("k", name="tallies"), ["k"], KEYED)
    settings.operator = renamed
    settings.call([spark_frame({"k": ["a"], "n": [1], "v": [0.0]})])
    assert settings.updated and state_codec.stored_name(settings.value) == "tallies"
    data.operator = renamed  # a name is no checked setting: the stored keys load as before
    assert rows(data.call([spark_frame({"k": ["a"], "n": [1], "v": [0.0]})])) == [("a", 3, 2)]
    unnamed = Group(bound(RunningCount("k"), ["k"], KEYED))
    unnamed.call([spark_frame({"k": ["a"], "n": [1], "v": [0.0]})])
    assert unnamed.value is not None and state_codec.stored_name(unnamed.value) is None


def test_initial_state_claimed_for_another_name_is_refused() -> None:
    from eospack.stateful_ops import InitialState

    state = InitialState("/x.parquet", "/work", operator_name="by-a")
    with pytest.raises(OperatorDefinitionError, match="holds the state of operator 'by-a'"):
        RunningCount("k", initial_state=state, name="by-b")
