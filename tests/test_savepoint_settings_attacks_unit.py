"""Attacks on savepoint format 4's checked settings (issue 41): ttl turned on, off or
switched between processing and event time through a savepoint, timers of another kind,
the column order, and savepoints of format 1-3, on the restore's own functions.

Each case states what a data engineer did and asserts the exact outcome: the keys and
expiries a restore starts from, or a one-line refusal. Spark runs only the savepoint's
small frames (``with_expiry_of`` and the split are Spark jobs); no query runs here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eospack.stateful_ops import (
    InitialState,
    OperatorDefinitionError,
    RunningAggregate,
    RunningCount,
    StatefulOperator,
)
from eospack.stateful_ops.base import EXPIRES_COLUMN, Clock
from eospack.stateful_ops.initial_state import (
    KEY_GROUP_PARTITION,
    load_key_group,
    split_by_key_group,
    with_expiry_of,
)
from eospack.stateful_ops.state_codec import TIMER_COLUMN
from eospack.tools.savepoint import RESTORED_DIRECTORY, Manifest, RestoredCheckpoint

KEY_ONLY = StructType([StructField("k", StringType())])
TTL = "10 seconds"
TTL_MS = 10_000
OLD_WATERMARK_MS = 1_700_000_035_000
"""The old query's next watermark (event times of 2023, far behind the wall clock)."""
SPARK_WATERMARK_WITHOUT_ONE = 0
"""What Spark logs as the watermark (offset log ``batchWatermarkMs``, commit log
``nextBatchWatermarkMs``) for a query without ``withWatermark``: 0, not nothing."""


def counter(ttl: str | None = None, ttl_time: str = "processing") -> RunningCount:
    operator = RunningCount("k", key_groups=1, ttl=ttl, ttl_time=ttl_time)
    operator.bind(["k"], KEY_ONLY)
    return operator


class Reminder(StatefulOperator):
    """A count per key with a processing-time timer (the update is never called here)."""

    name: ClassVar[str] = "reminder"
    timers = "processing"
    state_fields: ClassVar[StructType] = StructType([StructField("count", LongType())])
    output_fields: ClassVar[StructType] = StructType([StructField("count", LongType())])

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        return state, self.empty_output()


class EventReminder(Reminder):
    timers = "event"


class TimedTotals(RunningAggregate):
    """running_aggregate with several aggregates and event-time timers (a user operator)."""

    timers = "event"


def bound(operator: StatefulOperator) -> Any:
    operator.bind(["k"], KEY_ONLY)
    return operator


def expiries(frame: Any) -> dict[str, int]:
    return {row["k"]: row[EXPIRES_COLUMN] for row in frame.collect()}


def saved_counts(spark: Any, *rows: tuple[str, int]) -> Any:
    """A savepoint of running_count with ttl: (key, expiry ms), count 1, version 1."""
    return spark.createDataFrame(
        [(key, 1, 1, expires) for key, expires in rows],
        f"k string, count long, version long, {EXPIRES_COLUMN} long",
    )


# ttl turned on or rebased from a query without a watermark -------------------------------


def test_fixed_event_ttl_turned_on_from_a_query_without_watermark_counts_from_the_wall_clock(
    spark: Any,
) -> None:
    """A query without withWatermark logs watermark 0, which the restore took for the old
    watermark: every restored key expired at 1970-01-01 00:00:10 in event time, so the
    restored query's first watermark forgot them all. Documented: the wall clock."""
    saved = spark.createDataFrame([("a", 2, 2)], "k string, count long, version long")
    before = int(time.time() * 1000)
    restored = with_expiry_of(counter(TTL, "event"), saved, SPARK_WATERMARK_WITHOUT_ONE)
    after = int(time.time() * 1000)
    assert before + TTL_MS <= expiries(restored)["a"] <= after + TTL_MS


def test_fixed_processing_ttl_rebased_to_event_time_from_a_query_without_watermark(
    spark: Any,
) -> None:
    """Processing-time ttl (no watermark, as such queries have) switched to event time: the
    key run out by the wall clock stays gone, the live one gets the full ttl from the wall
    clock (it got 0 + ttl, and expired at the restored query's first watermark)."""
    now = int(time.time() * 1000)
    saved = saved_counts(spark, ("gone", now - 1), ("live", now + 3_600_000))
    restored = with_expiry_of(
        counter(TTL, "event"), saved, SPARK_WATERMARK_WITHOUT_ONE, stored_ttl_time="processing"
    )
    found = expiries(restored)
    assert list(found) == ["live"]
    assert now + TTL_MS <= found["live"] <= int(time.time() * 1000) + TTL_MS


def test_held_event_ttl_turned_off_at_watermark_zero_keeps_the_keys_the_old_query_kept(
    spark: Any,
) -> None:
    """Watermark 0 with event-time expiries is the old query's real clock (no event moved
    it yet): turning ttl off drops nothing that clock had not run out, whatever the wall
    clock says."""
    saved = saved_counts(spark, ("gone", 0), ("live", 1_700_000_010_000))
    restored = with_expiry_of(counter(), saved, 0, stored_ttl_time="event")
    assert [row["k"] for row in restored.collect()] == ["live"]
    assert restored.columns == ["k", "count", "version"]


# boundaries and round trips ------------------------------------------------------------


@pytest.mark.parametrize("ttl", [None, TTL])
def test_held_a_key_expiring_exactly_at_the_old_watermark_is_gone_as_in_the_old_query(
    spark: Any, ttl: str | None
) -> None:
    """The old query's next batch forgets a key whose expiry is its watermark (live: expiry
    > watermark); turned off, or rebased to processing time, the restore drops it too and
    keeps the key one millisecond later."""
    saved = saved_counts(spark, ("at", OLD_WATERMARK_MS), ("after", OLD_WATERMARK_MS + 1))
    restored = with_expiry_of(counter(ttl), saved, OLD_WATERMARK_MS, stored_ttl_time="event")
    assert [row["k"] for row in restored.collect()] == ["after"]
    operator = counter(TTL, "event")
    kept = operator.unexpired(
        pd.DataFrame({"k": ["at", "after"], EXPIRES_COLUMN: [OLD_WATERMARK_MS] * 2}),
        Clock(0, OLD_WATERMARK_MS),
    )
    assert len(kept) == 0


def test_held_event_to_processing_to_event_through_two_restores_keeps_the_live_keys(
    spark: Any,
) -> None:
    """Event time (the old watermark drops what ran out), processing time (the full ttl
    from the wall clock), back to event time (the full ttl from the second savepoint's
    watermark): every step keeps exactly the live keys, with expiries of its own time."""
    saved = saved_counts(spark, ("gone", OLD_WATERMARK_MS - 1), ("live", OLD_WATERMARK_MS + 5))
    processing = with_expiry_of(counter(TTL), saved, OLD_WATERMARK_MS, stored_ttl_time="event")
    now = int(time.time() * 1000)
    assert list(expiries(processing)) == ["live"]
    assert expiries(processing)["live"] >= now - 60_000 + TTL_MS
    second_watermark = OLD_WATERMARK_MS + 60_000
    event = with_expiry_of(
        counter(TTL, "event"), processing, second_watermark, stored_ttl_time="processing"
    )
    assert expiries(event) == {"live": second_watermark + TTL_MS}


def test_held_a_format_3_event_ttl_savepoint_restored_with_the_same_ttl_keeps_its_expiries(
    spark: Any,
) -> None:
    """A savepoint written before format 4 records no ttl_time: restored into the same
    event-time ttl its expiries are kept as they are (not read as processing time, which
    would have dropped every key against the wall clock)."""
    saved = saved_counts(spark, ("a", OLD_WATERMARK_MS + 1), ("b", OLD_WATERMARK_MS + 9))
    restored = with_expiry_of(counter(TTL, "event"), saved, OLD_WATERMARK_MS, None)
    assert expiries(restored) == {"a": OLD_WATERMARK_MS + 1, "b": OLD_WATERMARK_MS + 9}


# the split, written once per restored checkpoint ----------------------------------------


def state_file(tmp_path: Path, table: pa.Table) -> str:
    path = tmp_path / "state.parquet"
    pq.write_table(table, path)
    return str(path)


def test_fixed_a_split_of_processing_ttl_is_not_reused_after_switching_to_event_time(
    spark: Any, tmp_path: Path
) -> None:
    """The first start of a restored query (processing-time ttl) split the savepoint with
    wall-clock expiries and stopped before its first commit; started again with event-time
    ttl, it loaded that split (the same columns): wall-clock expiries read as event times,
    years past the 2023 events, so no restored key would expire. The split is now per
    checked setting too, so the second start rebases from the old watermark."""
    now = int(time.time() * 1000)
    saved = pa.table({"k": ["a"], "count": [2], "version": [2], EXPIRES_COLUMN: [now + 3_600_000]})
    initial = InitialState(
        state_file(tmp_path, saved),
        str(tmp_path / "work"),
        next_batch_watermark_ms=OLD_WATERMARK_MS,
        state_settings={},
    )
    split_by_key_group(spark, initial, counter(TTL))
    event = counter(TTL, "event")
    loaded = load_key_group(split_by_key_group(spark, initial, event), 0, event.arrow_state_schema)
    assert loaded is not None
    assert loaded.to_dict("records") == [
        {"k": "a", "count": 2, "version": 2, EXPIRES_COLUMN: OLD_WATERMARK_MS + TTL_MS}
    ]


def test_fixed_a_split_of_processing_timers_is_not_reused_by_event_timers(
    spark: Any, tmp_path: Path
) -> None:
    """The same with timers: a second start with timers='event' on the first start's split
    of processing-time timers ran them on the watermark (a 2026 due time never reached by
    2023 events); it is refused in one line, as the first start would have been."""
    saved = pa.table({"k": ["a"], "count": [1], TIMER_COLUMN: [1_800_000_000_000]})
    path = state_file(tmp_path, saved)
    initial = InitialState(path, str(tmp_path / "work"), state_settings={})
    split_by_key_group(spark, initial, bound(Reminder("k", key_groups=1)))
    with pytest.raises(OperatorDefinitionError) as refused:
        split_by_key_group(spark, initial, bound(EventReminder("k", key_groups=1)))
    assert str(refused.value) == (
        f"reminder: initial_state {path} holds processing-time timers and this operator has"
        " timers='event', whose due times are another clock's; keep timers='processing' for"
        " this savepoint"
    )


def test_held_event_ttl_turned_on_with_event_timers_and_several_aggregates_in_stored_order(
    spark: Any, tmp_path: Path
) -> None:
    """running_aggregate with several aggregates and event-time timers, restored with
    event-time ttl turned on: each key keeps its timer, gets the old watermark + ttl, and
    the split holds the columns in the state's order (expiry before the timer)."""
    operator = TimedTotals("k", {"v": ["sum", "max"]}, key_groups=2, ttl=TTL, ttl_time="event")
    operator.bind(["k"], StructType([StructField("k", StringType()), StructField("v", LongType())]))
    without_ttl = pa.schema(
        [field for field in operator.arrow_state_schema if field.name != EXPIRES_COLUMN]
    )
    values = {
        field.name: [7, None] if field.name == TIMER_COLUMN else [1, 2]
        for field in without_ttl
        if field.name != "k"
    }
    saved = pa.table({"k": ["a", "b"], **values}).cast(without_ttl)
    initial = InitialState(
        state_file(tmp_path, saved),
        str(tmp_path / "work"),
        next_batch_watermark_ms=OLD_WATERMARK_MS,
        state_settings={"timers": "event"},
    )
    directory = split_by_key_group(spark, initial, operator)
    groups = [load_key_group(directory, group, operator.arrow_state_schema) for group in range(2)]
    loaded = pd.concat([group for group in groups if group is not None])
    assert list(loaded.columns) == operator.arrow_state_schema.names
    assert list(operator.arrow_state_schema.names[-2:]) == [EXPIRES_COLUMN, TIMER_COLUMN]
    by_key = {row["k"]: row for row in loaded.to_dict("records")}
    assert {key: row[EXPIRES_COLUMN] for key, row in by_key.items()} == {
        "a": OLD_WATERMARK_MS + TTL_MS,
        "b": OLD_WATERMARK_MS + TTL_MS,
    }
    assert by_key["a"][TIMER_COLUMN] == 7 and pd.isna(by_key["b"][TIMER_COLUMN])
    assert {path.name for path in Path(directory).iterdir() if path.is_dir()} == {
        f"{KEY_GROUP_PARTITION}={group}" for group in range(2) if groups[group] is not None
    }


# savepoints of format 1-3 ----------------------------------------------------------------


def restored_manifest(tmp_path: Path, version: int, snapshot: dict[str, Any]) -> Path:
    """A checkpoint restored from a savepoint of format ``version`` (the manifest that
    version wrote: no ``settings`` before 4, no names before 3, no watermarks before 2)."""
    checkpoint = tmp_path / f"restored-{version}"
    directory = checkpoint / RESTORED_DIRECTORY
    directory.mkdir(parents=True)
    manifest: dict[str, Any] = {
        "batch_id": 3,
        "source_offsets": [{"t": {"0": 9}}],
        "operators": [snapshot],
        "checkpoint": "/old",
        "eospack_version": "0.1.0",
        "created_at": "2026-11-01T00:00:00Z",
        "format": "eospack-savepoint",
        "format_version": version,
        "settings": {"state_store_provider": "Spark default"},
    }
    if version >= 2:
        manifest["batch_watermark_ms"] = OLD_WATERMARK_MS - 5_000
        manifest["next_batch_watermark_ms"] = OLD_WATERMARK_MS
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return checkpoint


@pytest.mark.parametrize("version", [1, 2, 3])
def test_held_savepoints_of_format_1_to_3_restore_with_their_settings_unknown(
    tmp_path: Path, version: int
) -> None:
    snapshot: dict[str, Any] = {
        "operator_id": 0,
        "name": "running_count",
        "rows": 1,
        "file": "state/operator-0",
        "columns": [{"name": "k", "type": "string"}],
        "key_groups": 4,
    }
    if version == 3:
        snapshot["operator_name"] = None
    initial = RestoredCheckpoint(restored_manifest(tmp_path, version, snapshot)).initial_state()
    assert initial is not None and initial.state_settings is None
    assert initial.stored_setting("ttl_time") is None and initial.stored_setting("timers") is None
    expected = None if version == 1 else OLD_WATERMARK_MS
    assert initial.next_batch_watermark_ms == expected


def test_held_a_format_4_savepoint_at_the_defaults_says_processing_not_unknown(
    tmp_path: Path,
) -> None:
    snapshot = {
        "operator_id": 0,
        "name": "reminder",
        "rows": 1,
        "file": "state/operator-0",
        "columns": [{"name": "k", "type": "string"}],
        "key_groups": 4,
        "operator_name": None,
        "settings": {},
    }
    checkpoint = restored_manifest(tmp_path, 4, snapshot)
    assert Manifest.read(checkpoint / RESTORED_DIRECTORY).operators[0].settings == {}
    initial = RestoredCheckpoint(checkpoint).initial_state()
    assert initial is not None
    assert initial.stored_setting("ttl_time") == "processing"
    assert initial.stored_setting("timers") == "processing"


def test_held_an_unnamed_event_ttl_savepoint_claimed_by_a_new_name_rescaled_and_rebased(
    spark: Any, tmp_path: Path
) -> None:
    """Three changes at once: the savepoint's unnamed operator (2 key groups, event-time
    ttl) is claimed by position by a query naming it, with 8 key groups and processing-time
    ttl. The keys run out by the old watermark stay gone; every other key lands in the key
    group the stream sends its rows to (Spark's own hash, computed here) with the full ttl
    from the wall clock."""
    snapshot = {
        "operator_id": 0,
        "name": "running_count",
        "rows": 40,
        "file": "state/operator-0",
        "columns": [{"name": "k", "type": "string"}],
        "key_groups": 2,
        "operator_name": None,
        "settings": {"ttl_time": "event"},
    }
    checkpoint = restored_manifest(tmp_path, 4, snapshot)
    keys = [f"key-{index}" for index in range(40)]
    expiry = [OLD_WATERMARK_MS + (1 if index % 4 else 0) for index in range(40)]
    saved = pa.table({"k": keys, "count": [3] * 40, "version": [3] * 40, EXPIRES_COLUMN: expiry})
    state_directory = checkpoint / RESTORED_DIRECTORY / "state" / "operator-0"
    state_directory.mkdir(parents=True)
    pq.write_table(saved, state_directory / "part-0.parquet")
    initial = RestoredCheckpoint(checkpoint).initial_states(["renamed"])["renamed"]
    assert initial is not None and initial.stored_setting("ttl_time") == "event"
    operator = RunningCount("k", key_groups=8, ttl=TTL, initial_state=initial, name="renamed")
    operator.bind(["k"], KEY_ONLY)
    before = int(time.time() * 1000)
    directory = split_by_key_group(spark, initial, operator)
    after = int(time.time() * 1000)
    live = [key for key, expires in zip(keys, expiry, strict=True) if expires > OLD_WATERMARK_MS]
    groups = {
        row["k"]: row["group"]
        for row in spark.createDataFrame([(key,) for key in live], "k string")
        .select("k", operator.key_group_column().alias("group"))
        .collect()
    }
    found: dict[str, int] = {}
    for group in range(8):
        loaded = load_key_group(directory, group, operator.arrow_state_schema)
        for row in [] if loaded is None else loaded.to_dict("records"):
            assert groups[row["k"]] == group and (row["count"], row["version"]) == (3, 3)
            assert before + TTL_MS <= row[EXPIRES_COLUMN] <= after + TTL_MS
            found[row["k"]] = group
    assert found == groups and len(found) == 30


def test_fixed_ttl_lowered_through_a_savepoint_applies_to_the_restored_keys(spark: Any) -> None:
    """A savepoint records the ttl its expiries count with (``ttl_ms``); restored with a
    lower ttl every kept key lives the new ttl from its last batch with rows (Flink's rule,
    as on one checkpoint): a key idle for 2 hours restored with ttl='1 hour' is gone, not
    kept for the rest of its 30 days, and the recent key's expiry moves to its last row +
    1 hour."""
    now = int(time.time() * 1000)
    month_ms, hour_ms = 30 * 86_400_000, 3_600_000
    last_rows = {"idle": now - 2 * hour_ms, "recent": now - 60_000}
    saved = saved_counts(spark, *[(key, at + month_ms) for key, at in last_rows.items()])
    restored = with_expiry_of(
        counter("1 hour"), saved, None, stored_ttl_time="processing", stored_ttl_ms=month_ms
    )
    assert expiries(restored) == {"recent": last_rows["recent"] + hour_ms}


def test_fixed_ttl_raised_through_a_savepoint_keeps_every_key_the_new_ttl(spark: Any) -> None:
    """Raised: a key whose old ttl ran out by the restore (still in the stopped query's
    state: its group was not visited) lives on under the new one, as on one checkpoint."""
    now = int(time.time() * 1000)
    hour_ms = 3_600_000
    last_rows = {"run-out": now - 2 * hour_ms, "recent": now - 60_000}
    saved = saved_counts(spark, *[(key, at + hour_ms) for key, at in last_rows.items()])
    restored = with_expiry_of(counter("3 hours"), saved, None, "processing", hour_ms)
    assert expiries(restored) == {key: at + 3 * hour_ms for key, at in last_rows.items()}
    assert restored.columns == saved.columns


def test_fixed_event_ttl_lowered_through_a_savepoint_counts_from_the_old_watermark(
    spark: Any,
) -> None:
    """Event time: the restore's time is the old query's next watermark, so the key whose
    latest event + the new ttl is at or behind it is dropped, whatever the wall clock."""
    latest = {"gone": OLD_WATERMARK_MS - TTL_MS, "kept": OLD_WATERMARK_MS - TTL_MS + 1}
    saved = saved_counts(spark, *[(key, at + 60_000) for key, at in latest.items()])
    restored = with_expiry_of(counter(TTL, "event"), saved, OLD_WATERMARK_MS, "event", 60_000)
    assert expiries(restored) == {"kept": latest["kept"] + TTL_MS}


def test_held_a_savepoint_without_its_ttl_restores_its_expiries_unmoved(spark: Any) -> None:
    """A savepoint written before it recorded its ttl (no ``ttl_ms``): the restore cannot
    know the old ttl, so every key keeps the expiry it had (documented), as before."""
    now = int(time.time() * 1000)
    saved = saved_counts(spark, ("a", now + 86_400_000))
    restored = with_expiry_of(counter("1 hour"), saved, None, "processing", None)
    assert expiries(restored) == {"a": now + 86_400_000}


def test_fixed_deduplicate_switched_between_event_and_processing_time_through_a_savepoint(
    spark: Any, tmp_path: Path
) -> None:
    """deduplicate's expiry clock is a checked setting (``expiry_clock``): a savepoint of
    event-time deduplicate restored into processing time (which would forget every key at
    its first batch and emit repeats again) is refused in one line naming event_time."""
    from eospack.stateful_ops.operators.deduplicate import Deduplicate
    from eospack.stateful_ops.state_reader import DescribedState

    schema = StructType([StructField("k", StringType()), StructField("ts", LongType())])
    event = Deduplicate("k", ttl="1 minute", event_time="ts", key_groups=1)
    event.bind(["k"], schema)
    processing = Deduplicate("k", ttl="1 minute", key_groups=1)
    processing.bind(["k"], schema)
    recorded = DescribedState(
        event.arrow_state_schema, dict(event.stored_schema().metadata or {}), 1
    ).checked_settings
    saved = pa.table({"k": ["a"], "expires_at_us": [(OLD_WATERMARK_MS + 60_000) * 1000]})
    initial = InitialState(
        state_file(tmp_path, saved),
        str(tmp_path / "work"),
        next_batch_watermark_ms=OLD_WATERMARK_MS,
        state_settings=recorded,
    )
    remembered = saved.to_pandas()
    now = Clock(int(time.time() * 1000), None)
    _, emitted = processing.update(pd.DataFrame({"k": ["a"], "ts": [1]}), remembered, now)
    assert emitted.to_dict("records") == [{"k": "a", "ts": 1}]  # a repeat, emitted again
    assert recorded == {"expiry_clock": "event"}
    with pytest.raises(OperatorDefinitionError, match="event_time") as refused:
        split_by_key_group(spark, initial, processing)
    assert "\n" not in str(refused.value) and "set event_time= again" in str(refused.value)
    assert split_by_key_group(spark, initial, event)  # the same clock restores


@pytest.mark.parametrize(
    ("batch_id", "own", "expected"),
    [
        (0, (0, 15_000), (30_000, 35_000)),  # the restored batch 0 drops behind the old batch's
        (3, (20_000, 25_000), (35_000, 35_000)),  # later: behind the old next watermark
        (3, (40_000, 45_000), (40_000, 45_000)),  # Spark's own has passed the old one
    ],
)
def test_fixed_a_restored_checkpoints_savepoint_records_the_watermarks_its_operators_clocked(
    tmp_path: Path, batch_id: int, own: tuple[int, int], expected: tuple[int, int]
) -> None:
    """A checkpoint restored from a savepoint whose watermarks were 30 s (its batch) and
    35 s (the next): its operators clock with at least those, so a savepoint of it records
    at least those, not Spark's own trailing ones. Without a restored savepoint, Spark's."""
    from eospack.core.checkpoint_files import LocalFiles
    from eospack.tools.savepoint import MANIFEST, clocked_watermarks

    checkpoint = LocalFiles(tmp_path)
    assert clocked_watermarks(checkpoint, batch_id, *own) == own
    restored = Manifest(
        batch_id=7,
        source_offsets={},
        operators=[],
        checkpoint="old",
        eospack_version="0.1.0",
        created_at="2026-11-29T00:00:00Z",
        batch_watermark_ms=30_000,
        next_batch_watermark_ms=35_000,
    )
    (tmp_path / RESTORED_DIRECTORY).mkdir()
    (tmp_path / RESTORED_DIRECTORY / MANIFEST).write_text(restored.to_json())
    assert clocked_watermarks(checkpoint, batch_id, *own) == expected
    assert clocked_watermarks(checkpoint, batch_id, None, None) == (
        30_000 if batch_id == 0 else 35_000,
        35_000,
    )


def test_fixed_a_savepoint_read_remotely_counts_every_expiry_with_one_recorded_ttl() -> None:
    """``state_frame`` (how a savepoint onto object storage reads the state): key groups
    written with 2 and 3 hours (a ttl raised on the checkpoint, group 0 not visited since)
    are described with the reference 3 hours, and ``decoded_rows`` moves group 0's
    expiries to it, so ``ttl_ms`` in the savepoint holds for every key."""
    from eospack.stateful_ops.state_codec import STATE_FORMAT_VERSION, encode
    from eospack.stateful_ops.state_reader import (
        DescribedState,
        decoded_rows,
        describe_groups,
        described_state,
    )

    hour_ms = 3_600_000
    operator = counter("2 hours")
    two_hours = operator.stored_schema()
    three_hours = counter("3 hours").stored_schema()
    group_0 = pd.DataFrame(
        {"k": ["a"], "count": [1], "version": [1], EXPIRES_COLUMN: [2 * hour_ms]}
    )
    group_1 = pd.DataFrame(
        {"k": ["b"], "count": [1], "version": [1], EXPIRES_COLUMN: [4 * hour_ms]}
    )
    settings = operator.empty_state()
    rows = pa.RecordBatch.from_pylist(
        [
            {
                "key_group": key_group,
                "format_version": STATE_FORMAT_VERSION,
                "operator": "x",
                "blob": encode(table, schema),
            }
            for key_group, table, schema in [
                (-1, settings, two_hours),
                (0, group_0, two_hours),
                (1, group_1, three_hours),
            ]
        ]
    )
    descriptions = [
        row.values() for batch in describe_groups(iter([rows])) for row in batch.to_pylist()
    ]
    described = described_state(0, descriptions)
    assert described is not None
    schema, metadata, keys = described
    state = DescribedState(schema, metadata, keys)
    assert state.reference_ttl_ms == 3 * hour_ms
    assert state.checked_settings == {"ttl_ms": str(3 * hour_ms)}
    decoded = pa.Table.from_batches(list(decoded_rows(schema, 3 * hour_ms)(iter([rows]))))
    assert dict(
        zip(decoded["k"].to_pylist(), decoded[EXPIRES_COLUMN].to_pylist(), strict=True)
    ) == {
        "a": 3 * hour_ms,
        "b": 4 * hour_ms,
    }
