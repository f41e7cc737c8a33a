"""Attacks on operator names and ttl (issue 41) with wrong-but-plausible usage, without Spark.

Each case states what a data engineer did and asserts the exact outcome: a one-line refusal
naming the argument and the fix, or exact state, expiries and output rows. Holes that
cannot be fixed in the operators, ``map_operators``, ``validation`` or the CLI are strict
xfails marked ``OPEN``; their fix is described in the reason.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from eospack.cli import main
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
    SPLIT_COMPLETE,
    load_key_group,
    split_by_key_group,
    split_name,
)
from eospack.stateful_ops.operators.deduplicate import Deduplicate
from eospack.stateful_ops.validation import duration_ms
from eospack.tools.savepoint import (
    RESTORE_OPTIONS,
    RESTORED_DIRECTORY,
    Manifest,
    OperatorSnapshot,
    RestoredCheckpoint,
    SavepointError,
    map_operators,
    restore_savepoint,
)

KEY_ONLY = StructType([StructField("k", StringType())])
KEY_AND_VALUE = StructType([StructField("k", StringType()), StructField("v", LongType())])
GROUP_STATE_SCHEMA = StructType(
    [
        StructField("format_version", IntegerType()),
        StructField("operator", StringType()),
        StructField("table", BinaryType()),
    ]
)
TIMEOUTS = {
    "none": GroupStateTimeout.NoTimeout,
    "processing": GroupStateTimeout.ProcessingTimeTimeout,
}


def counter(ttl: object = None, name: str | None = None) -> RunningCount:
    operator = RunningCount("k", ttl=ttl, name=name)
    operator.bind(["k"], KEY_ONLY)
    return operator


def counted(
    operator: StatefulOperator, state: pd.DataFrame, keys: list[Any], at_ms: int
) -> tuple[pd.DataFrame, list[tuple[Any, ...]]]:
    """One batch of ``keys`` at processing time ``at_ms`` through ``update_live``."""
    rows = operator.fold(iter([pd.DataFrame({"k": keys})]))
    new_state, output = operator.update_live(rows, state, Clock(at_ms, None))
    return new_state, plain(output)


def plain(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows as Python tuples, None for nulls, sorted."""
    values = frame.astype(object).where(frame.notna(), None)
    return sorted(map(tuple, values.itertuples(index=False)), key=repr)


def by_key(state: pd.DataFrame) -> dict[Any, tuple[int, ...]]:
    """Key -> (count, version, expiry) of a running_count state with ttl."""
    values = state.astype(object).where(state.notna(), None)
    return {
        row["k"]: (int(row["count"]), int(row["version"]), int(row[EXPIRES_COLUMN]))
        for row in values.to_dict("records")
    }


class Bucket:
    """One key group's state row across calls, as Spark keeps it between batches."""

    def __init__(self, operator: StatefulOperator) -> None:
        self.operator = operator
        self.value: tuple[Any, ...] | None = None

    def call(
        self, frames: Sequence[pd.DataFrame], now_ms: int, timed_out: bool = False
    ) -> list[tuple[Any, ...]]:
        state = GroupState(
            optionalValue=self.value,
            batchProcessingTimeMs=now_ms,
            eventTimeWatermarkMs=-1,
            timeoutConf=TIMEOUTS[self.operator.timeout],
            hasTimedOut=timed_out,
            watermarkPresent=False,
            defined=self.value is not None,
            updated=False,
            removed=False,
            timeoutTimestamp=-1,
            keyAsUnsafe=b"",
            valueSchema=GROUP_STATE_SCHEMA,
        )
        outputs = list(self.operator._call((0,), iter(frames), state))
        self.value = tuple(state._value) if state.exists else None
        return plain(pd.concat(outputs, ignore_index=True)) if outputs else []


# ttl values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "expected_ms"),
    [
        ("5 minutes", 300_000),
        ("5m", 300_000),
        ("5 MINUTES", 300_000),
        ("  5 minutes ", 300_000),
        ("1 day", 86_400_000),
        (datetime.timedelta(minutes=5), 300_000),
        ("36500 days", 36_500 * 86_400_000),
    ],
)
def test_held_ttl_spellings_a_user_writes_mean_what_they_say(ttl: object, expected_ms: int) -> None:
    assert counter(ttl).ttl_ms == expected_ms


@pytest.mark.parametrize(
    ("ttl", "message"),
    [
        (0, "running_count: ttl=0 is not a duration;"),
        (300, "running_count: ttl=300 is not a duration;"),
        (1.5, "running_count: ttl=1.5 is not a duration;"),
        (True, "running_count: ttl=True is not a duration;"),
        ("0 seconds", "running_count: ttl='0 seconds' must be positive"),
        ("-5 minutes", "running_count: ttl='-5 minutes' is not a duration;"),
        ("1.5 hours", "running_count: ttl='1.5 hours' is not a duration;"),
        ("5 mins", "running_count: ttl='5 mins' has unknown unit 'mins';"),
        ("1h30m", "running_count: ttl='1h30m' is not a duration;"),
        (datetime.timedelta(minutes=-5), "running_count: ttl=datetime.timedelta(days=-1,"),
        (datetime.timedelta(microseconds=999), "running_count: ttl=datetime.timedelta(mic"),
    ],
)
def test_held_ttl_that_is_no_positive_duration_is_refused_in_one_line(
    ttl: object, message: str
) -> None:
    with pytest.raises(OperatorDefinitionError) as refused:
        RunningCount("k", ttl=ttl)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda ttl: RunningCount("k", ttl=ttl),
        lambda ttl: RunningAggregate("k", {"v": "sum"}, ttl=ttl),
        lambda ttl: Deduplicate("k", ttl),
    ],
)
@pytest.mark.parametrize("ttl", [datetime.timedelta.max, "200000000000 days"])
def test_fixed_a_ttl_meant_as_forever_is_refused_at_definition_not_by_the_first_batch(
    make: Any, ttl: object
) -> None:
    """``timedelta.max`` (or a huge day count) meant "forever" was accepted, then the first
    batch failed in the executor: deduplicate's expiry in µs overflowed int64 already with
    ``timedelta.max``, running_count's in ms with the day count (``OverflowError: Python int
    too large to convert to C long``)."""
    with pytest.raises(OperatorDefinitionError) as refused:
        make(ttl)
    message = str(refused.value)
    assert f"ttl={ttl!r} is longer than 36500 days" in message
    assert "\n" not in message


def test_fixed_the_longest_ttl_accepted_runs_a_batch() -> None:
    operator = counter("36500 days")
    state, output = counted(operator, operator.empty_state(), ["a"], 1_000)
    assert output == [("a", 1, 1_000)]
    assert by_key(state) == {"a": (1, 1_000, 1_000 + 36_500 * 86_400_000)}
    dedup = Deduplicate("k", "36500 days")
    dedup.bind(["k"], KEY_ONLY)
    assert dedup.ttl_us == 36_500 * 86_400_000_000
    assert duration_ms("sessionize", "gap", "36500 days") == 36_500 * 86_400_000


# ttl semantics ---------------------------------------------------------------------------


def test_held_a_key_getting_rows_in_the_batch_it_expires_starts_again_from_one() -> None:
    """Expired means ``last batch + ttl <= now`` (Flink's rule): rows at exactly that time
    count from 1, a new life's version starting at the batch's timestamp; the other keys
    keep their state and expiry."""
    operator = counter("10 seconds")
    state, _ = counted(operator, operator.empty_state(), ["a", "a", "b"], 1_000)
    state, output = counted(operator, state, ["b"], 2_000)
    assert output == [("b", 2, 1_001)]
    state, output = counted(operator, state, ["a", "a", "a"], 11_000)
    assert output == [("a", 3, 11_000)]
    assert by_key(state) == {"b": (2, 1_001, 12_000), "a": (3, 11_000, 21_000)}
    state, output = counted(operator, state, ["a"], 20_999)
    assert output == [("a", 4, 11_001)]
    assert by_key(state) == {"a": (4, 11_001, 30_999)}


def test_held_a_key_expiring_and_coming_back_in_one_batch_through_the_group_call() -> None:
    """Through ``_call``, as Spark's worker calls it: the key group's timeout fires and
    drops only the expired key, without output; the key then comes back at count 1."""
    bucket = Bucket(counter("10 seconds"))
    assert bucket.call([pd.DataFrame({"k": ["a", "b"]})], now_ms=1_000) == [
        ("a", 1, 1_000),
        ("b", 1, 1_000),
    ]
    assert bucket.call([pd.DataFrame({"k": ["b"]})], now_ms=6_000) == [("b", 2, 1_001)]
    assert bucket.call([pd.DataFrame({"k": []})], now_ms=11_001, timed_out=True) == []
    assert by_key(bucket.operator.load_value(bucket.value)) == {"b": (2, 1_001, 16_000)}
    assert bucket.call([pd.DataFrame({"k": ["a", "b"]})], now_ms=16_000) == [
        ("a", 1, 16_000),
        ("b", 1, 16_000),
    ]
    assert bucket.call([pd.DataFrame({"k": []})], now_ms=26_001, timed_out=True) == []
    assert bucket.value is None


def test_held_null_keys_expire_and_refresh_like_any_key() -> None:
    operator = counter("10 seconds")
    state, output = counted(operator, operator.empty_state(), [None, None, "a"], 1_000)
    assert output == [("a", 1, 1_000), (None, 2, 1_000)]
    state, output = counted(operator, state, [None], 5_000)
    assert output == [(None, 3, 1_001)]
    assert by_key(state) == {"a": (1, 1_000, 11_000), None: (3, 1_001, 15_000)}
    state, output = counted(operator, state, ["a"], 15_000)
    assert output == [("a", 1, 15_000)]
    assert by_key(state) == {"a": (1, 15_000, 25_000)}


def test_held_composite_keys_with_nulls_keep_their_own_expiry_in_running_aggregate() -> None:
    operator = RunningAggregate(["k", "j"], {"v": ["sum", "count"]}, ttl="10 seconds")
    schema = StructType([*KEY_ONLY.fields, StructField("j", LongType()), KEY_AND_VALUE["v"]])
    operator.bind(["k", "j"], schema)

    def batch(state: pd.DataFrame, data: dict[str, list[Any]], at_ms: int) -> Any:
        rows = operator.fold(iter([pd.DataFrame(data)]))
        return operator.update_live(rows, state, Clock(at_ms, None))

    state, output = batch(
        operator.empty_state(),
        {"k": ["a", "a", None], "j": [1.0, None, None], "v": [1.0, 2.0, None]},
        1_000,
    )
    assert plain(output) == [
        ("a", 1, 1, 1, 1_000),
        ("a", None, 2, 1, 1_000),
        (None, None, None, 0, 1_000),
    ]
    state, output = batch(state, {"k": ["a"], "j": [None], "v": [5.0]}, 4_000)
    assert plain(output) == [("a", None, 7, 2, 1_001)]
    values = state.astype(object).where(state.notna(), None)
    expiries = {(row["k"], row["j"]): int(row[EXPIRES_COLUMN]) for row in values.to_dict("records")}
    assert expiries == {("a", 1): 11_000, ("a", None): 14_000, (None, None): 11_000}
    state, output = batch(state, {"k": [None], "j": [None], "v": [3.0]}, 12_000)
    assert plain(output) == [(None, None, 3, 1, 12_000)]
    assert len(state) == 2


def test_held_a_clock_going_backwards_expires_by_each_batch_own_clock() -> None:
    """The batch's timestamp is the clock: a key touched after the clock stepped back
    expires ttl after that (earlier) time, an untouched key keeps its expiry; a replayed
    batch has the same timestamp, so it expires the same keys."""
    operator = counter("10 seconds")
    state, _ = counted(operator, operator.empty_state(), ["a", "b"], 100_000)
    state, output = counted(operator, state, ["a"], 50_000)
    assert output == [("a", 2, 100_001)]
    assert by_key(state) == {"a": (2, 100_001, 60_000), "b": (1, 100_000, 110_000)}
    state, output = counted(operator, state, ["c"], 60_000)
    assert by_key(state) == {"b": (1, 100_000, 110_000), "c": (1, 60_000, 70_000)}


def test_fixed_a_key_coming_back_after_expiry_gets_a_version_a_version_column_sink_accepts() -> (
    None
):
    """With ttl a key's life starts its version at the batch's timestamp (ms), so the
    documented running_count -> 2pc-jdbc upsert (``versionColumn=version``) takes the new
    life's rows instead of keeping the old life's count (it started again at version 1)."""
    operator = counter("10 seconds")
    state = operator.empty_state()
    versions = []
    for at_ms in (1_000, 2_000, 3_000):
        state, output = counted(operator, state, ["a"], at_ms)
        versions.append(output[0][2])
    state, output = counted(operator, state, ["a"], 20_000)
    assert output[0][1] == 1  # the count restarts, as documented
    assert output[0][2] > max(versions)


@pytest.mark.parametrize("hours", [1, 24 * 60])
def test_fixed_changing_ttl_on_a_checkpoint_applies_it_to_untouched_keys(hours: int) -> None:
    """ttl lowered (30 days -> 1 hour) or raised (-> 60 days) on a checkpoint applies to every
    key from its last batch with rows (Flink: the current ttl from the last access), not
    only to keys touched since: a state that outgrew memory shrinks as soon as its key
    groups are visited. A key group's rows record the ttl they were written with."""
    bucket = Bucket(counter("30 days"))
    bucket.call([pd.DataFrame({"k": ["idle", "busy"]})], now_ms=1_000)
    bucket.operator = counter(f"{hours} hours")
    later = 1_000 + 2 * 3_600_000
    emitted = bucket.call([pd.DataFrame({"k": ["busy"]})], now_ms=later)
    stored = by_key(bucket.operator.load_value(bucket.value))
    if hours == 1:  # both keys' last rows were 2 hours ago: busy starts a new life
        assert emitted == [("busy", 1, later)]
        assert stored == {"busy": (1, later, later + 3_600_000)}
    else:
        assert emitted == [("busy", 2, 1_001)]
        assert stored == {
            "idle": (1, 1_000, 1_000 + hours * 3_600_000),
            "busy": (2, 1_001, later + hours * 3_600_000),
        }


# ttl across restarts ---------------------------------------------------------------------


def written_split(tmp_path: Path, operator: StatefulOperator) -> InitialState:
    """A restored operator's split as a first start wrote it (``operator``'s schema, two
    keys in key group 0) and the InitialState naming it: what a second start finds."""
    initial = InitialState(str(tmp_path / "state.parquet"), str(tmp_path / "work"))
    directory = tmp_path / "work" / split_name(operator)
    (directory / f"{KEY_GROUP_PARTITION}=0").mkdir(parents=True)
    columns: dict[str, list[int] | list[str]] = {"k": ["a", "b"], "count": [2, 1]}
    columns["version"] = [1, 1]
    if operator.ttl_ms is not None:
        columns[EXPIRES_COLUMN] = [5_000, 5_000]
    table = pa.table(columns).cast(operator.arrow_state_schema)
    pq.write_table(table, directory / f"{KEY_GROUP_PARTITION}=0" / "part-0.parquet")
    (directory / SPLIT_COMPLETE).touch()
    return initial


def test_held_a_restart_before_the_first_commit_reuses_the_split_so_no_second_fresh_ttl(
    tmp_path: Path,
) -> None:
    """The split is written once per key_groups (with the expiries of that first start):
    a second start loads the same keys with the same expiries."""
    operator = counter("1 hour")
    initial = written_split(tmp_path, operator)
    directory = split_by_key_group(None, initial, operator)  # type: ignore[arg-type]
    loaded = load_key_group(directory, 0, operator.arrow_state_schema)
    assert loaded is not None and by_key(loaded) == {"a": (2, 1, 5_000), "b": (1, 1, 5_000)}


@pytest.mark.parametrize(("first", "second"), [(None, "1 hour"), ("1 hour", None)])
def test_fixed_ttl_changed_before_a_restored_query_first_commit_still_bootstraps(
    spark: Any, tmp_path: Path, first: str | None, second: str | None
) -> None:
    """The split was reused by key_groups alone: started once without ttl and, before its
    first batch committed, again with ttl (or the other way), the tasks failed casting it.
    The split is now named after the stored columns too."""
    saved = pa.table({"k": ["a", "b"], "count": [2, 1], "version": [1, 1]})
    pq.write_table(saved, tmp_path / "state.parquet")
    initial = InitialState(str(tmp_path / "state.parquet"), str(tmp_path / "work"))
    split_by_key_group(spark, initial, counter(first))
    operator = counter(second)
    directory = split_by_key_group(spark, initial, operator)
    loaded = [load_key_group(directory, group, operator.arrow_state_schema) for group in range(8)]
    keys = sorted(key for frame in loaded if frame is not None for key in frame["k"])
    assert keys == ["a", "b"]


# operator names --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["zählung", " counts", "counts ", "counts\n", "counts\t", "\uff43ounts", "counts/v2", ""],
)
def test_held_names_with_unicode_whitespace_or_path_characters_are_refused(name: str) -> None:
    with pytest.raises(OperatorDefinitionError) as refused:
        RunningCount("k", name=name)
    assert str(refused.value).startswith(f"running_count: name={name!r} is not a valid")
    assert "\n" not in str(refused.value)


def snapshot(operator_id: int, name: str | None) -> OperatorSnapshot:
    return OperatorSnapshot(
        operator_id, "running_count", 2, f"state/operator-{operator_id}.parquet", [], 8, name
    )


def names_generator() -> Iterator[str]:
    yield "by-a"


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("by-a", "names='by-a' is one string: pass a list of the query's operator names"),
        ({"by-a"}, "names={'by-a'} is not a list: pass a list of the query's operator names"),
        (
            names_generator(),
            "names=<generator object names_generator",
        ),
    ],
)
def test_fixed_names_given_as_a_string_set_or_generator_are_refused_in_one_line(
    names: Any, message: str
) -> None:
    """``initial_states("by-a")`` iterated the characters (``{'b': None, 'y': None, ...}``,
    then a KeyError for 'by-a'); a generator was consumed by the checks."""
    for snapshots in ([], [snapshot(0, "by-a")]):
        with pytest.raises(SavepointError) as refused:
            map_operators(snapshots, names, allow_missing=True)
        assert str(refused.value).startswith(message)
        assert "\n" not in str(refused.value)


def test_fixed_none_in_names_stands_for_an_unnamed_operator_and_refusals_stay_one_line() -> None:
    """None in the list raised TypeError while joining the error message; it now stands for
    an unnamed query operator (which takes its state with ``initial_state(i)``): it claims
    the unnamed savepoint operator at its position, gets no entry, and a refusal around it
    is one line naming the rest."""
    saved = [snapshot(0, None), snapshot(1, "counts")]
    assert map_operators(saved, [None, "counts"]) == {"counts": saved[1]}
    assert map_operators([], [None, "counts", None], allow_missing=True) == {"counts": None}
    with pytest.raises(SavepointError) as refused:
        map_operators([snapshot(0, "by-a")], [None, "by-b"])
    assert str(refused.value).startswith(
        "savepoint operator(s) by-a claimed by no operator of this query (their state would"
        " be dropped); operator(s) by-b have no state in the savepoint"
    )
    assert "\n" not in str(refused.value)
    with pytest.raises(SavepointError, match="by-a given more than once"):
        map_operators([], [None, "by-a", None, "by-a"], allow_missing=True)


def test_fixed_a_single_name_as_a_string_is_refused_also_on_an_unrestored_checkpoint(
    tmp_path: Path,
) -> None:
    with pytest.raises(SavepointError, match="names='by-a' is one string"):
        RestoredCheckpoint(tmp_path / "fresh").initial_states("by-a")


def test_fixed_names_differing_only_in_case_are_refused() -> None:
    """The restored operators' work directories are named after them
    (``operator-<name>-split``): on a case-insensitive file system (macOS, Windows)
    ``Counts`` and ``counts`` would share one split and load each other's keys."""
    with pytest.raises(SavepointError) as refused:
        map_operators([snapshot(0, "counts"), snapshot(1, "Counts")], ["counts", "Counts"])
    assert str(refused.value).startswith(
        "operator names Counts, counts differ only in case: give the query's operators"
        " names that differ in more than case"
    )


def test_fixed_a_name_differing_from_the_savepoint_only_in_case_says_so() -> None:
    with pytest.raises(SavepointError) as refused:
        map_operators([snapshot(0, "Counts")], ["counts"])
    message = str(refused.value)
    assert "operator(s) counts have no state in the savepoint" in message
    assert "(names are case-sensitive: the savepoint has Counts)" in message
    assert "\n" not in message


def test_held_names_map_exactly_whatever_the_case_or_punctuation_when_distinct() -> None:
    saved = [snapshot(0, "a.b"), snapshot(1, "a-b"), snapshot(2, "a_b")]
    assert map_operators(saved, ["a_b", "a.b", "a-b"]) == {
        "a_b": saved[2],
        "a.b": saved[0],
        "a-b": saved[1],
    }


def restored_checkpoint(
    tmp_path: Path, operators: Sequence[OperatorSnapshot], format_version: int = 3, **restore: Any
) -> Path:
    """A savepoint with ``operators`` (fake state files) restored into a new checkpoint."""
    savepoint = tmp_path / "savepoint"
    manifest = Manifest(
        batch_id=3,
        source_offsets=[{"events": {"0": 10}}],
        operators=list(operators),
        checkpoint="/old",
        eospack_version="0.1.0",
        created_at="2026-11-29T00:00:00Z",
        format_version=format_version,
    )
    raw = json.loads(manifest.to_json())
    if format_version < 3:
        for operator in raw["operators"]:
            operator.pop("operator_name")
    (savepoint / "state").mkdir(parents=True)
    for operator in operators:
        (savepoint / operator.file).write_bytes(f"state of {operator.operator_id}".encode())
    (savepoint / "manifest.json").write_text(json.dumps(raw))
    checkpoint = tmp_path / "checkpoint"
    restore_savepoint(savepoint, checkpoint, **restore)
    return checkpoint


def test_held_allow_missing_recorded_by_the_cli_is_overridden_by_code_both_ways(
    tmp_path: Path,
) -> None:
    saved = [snapshot(0, "by-a"), snapshot(1, "by-b")]
    lenient = restored_checkpoint(tmp_path / "lenient", saved, allow_missing=True)
    assert RestoredCheckpoint(lenient).initial_states(["by-a"])["by-a"] is not None
    with pytest.raises(SavepointError, match="by-b claimed by no operator"):
        RestoredCheckpoint(lenient, allow_missing=False).initial_states(["by-a"])
    with pytest.raises(SavepointError, match="by-b claimed by no operator"):
        RestoredCheckpoint(lenient).initial_states(["by-a"], allow_missing=False)
    strict = restored_checkpoint(tmp_path / "strict", saved)
    with pytest.raises(SavepointError, match="by-b claimed by no operator"):
        RestoredCheckpoint(strict).initial_states(["by-a"])
    states = RestoredCheckpoint(strict).initial_states(["by-a", "new"], allow_missing=True)
    assert states["new"] is None and states["by-a"] is not None
    assert Path(states["by-a"].path).read_bytes() == b"state of 0"


def test_held_a_format_2_savepoint_with_names_maps_by_position_and_refuses_extra_names(
    tmp_path: Path,
) -> None:
    checkpoint = restored_checkpoint(
        tmp_path, [snapshot(0, None), snapshot(1, None)], format_version=2
    )
    restored = RestoredCheckpoint(checkpoint)
    states = restored.initial_states(["second", "first"])
    assert Path(states["second"].path).read_bytes() == b"state of 0"  # type: ignore[union-attr]
    assert Path(states["first"].path).read_bytes() == b"state of 1"  # type: ignore[union-attr]
    assert states["second"].operator_name == "second"  # type: ignore[union-attr]
    with pytest.raises(SavepointError) as refused:
        restored.initial_states(["only"])
    assert str(refused.value).startswith(
        "savepoint operator(s) unnamed operator 1 claimed by no operator of this query"
    )


def test_held_two_checkpoints_restored_from_one_savepoint_share_nothing(tmp_path: Path) -> None:
    saved = [snapshot(0, "by-a"), snapshot(1, "by-b")]
    first = restored_checkpoint(tmp_path / "one", saved, allow_missing=True)
    second = tmp_path / "two"
    restore_savepoint(tmp_path / "one" / "savepoint", second)
    by_a = RestoredCheckpoint(first).initial_states(["by-a"])["by-a"]
    by_b = RestoredCheckpoint(second).initial_states(["by-a", "by-b"])["by-b"]
    assert by_a is not None and by_b is not None
    assert Path(by_a.work_directory).is_relative_to(first)
    assert Path(by_b.work_directory).is_relative_to(second)
    with pytest.raises(SavepointError, match="by-b claimed by no operator"):
        RestoredCheckpoint(second).initial_states(["by-a"])


def test_fixed_a_restore_without_allow_missing_never_inherits_an_earlier_restores_option(
    tmp_path: Path,
) -> None:
    saved = [snapshot(0, "by-a"), snapshot(1, "by-b")]
    first = restored_checkpoint(tmp_path, saved, mode="claim", allow_missing=True)
    assert (first / RESTORED_DIRECTORY / RESTORE_OPTIONS).is_file()
    again = tmp_path / "again"
    restore_savepoint(first / RESTORED_DIRECTORY, again)
    with pytest.raises(SavepointError, match="by-b claimed by no operator"):
        RestoredCheckpoint(again).initial_states(["by-a"])


def test_fixed_allow_missing_as_the_string_false_does_not_allow_dropping_state(
    tmp_path: Path,
) -> None:
    checkpoint = restored_checkpoint(tmp_path, [snapshot(0, "by-a"), snapshot(1, "by-b")])
    with pytest.raises((SavepointError, TypeError, ValueError)):
        RestoredCheckpoint(checkpoint, allow_missing="false").initial_states(  # type: ignore[arg-type]
            ["by-a"]
        )


def bootstrapped(state: InitialState | None, key_groups: int = 8) -> None:
    """What the operator's start records once its bootstrap completed (``bootstrap_needed``)."""
    assert state is not None
    marker = Path(state.work_directory) / f"_bootstrapped-{key_groups}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def committed(checkpoint: Path, batch_id: int = 0) -> None:
    (checkpoint / "commits").mkdir(exist_ok=True)
    (checkpoint / "commits" / str(batch_id)).write_text("v1\n{}")


def test_fixed_renaming_an_operator_between_restarts_of_a_restored_checkpoint_relabels(
    tmp_path: Path,
) -> None:
    """A restored checkpoint kept checking names against its savepoint at every start, so
    a rename after the bootstrap was refused ('by-a claimed by no operator, tallies would
    start empty') although the checkpoint holds by-a's state and Spark hands it to the
    renamed operator by position."""
    checkpoint = restored_checkpoint(tmp_path, [snapshot(0, "by-a")])
    bootstrapped(RestoredCheckpoint(checkpoint).initial_states(["by-a"])["by-a"])
    committed(checkpoint)
    assert RestoredCheckpoint(checkpoint).initial_states(["tallies"]) == {"tallies": None}
    assert RestoredCheckpoint(checkpoint).initial_states(["by-a"])["by-a"] is not None


def test_held_renaming_an_operator_before_its_bootstrap_completed_is_refused(
    tmp_path: Path,
) -> None:
    """Attack on the rename fix: until the checkpoint holds by-a's state (no batch
    committed, or batches committed but by-a's key groups not all visited: no record and
    no state to read) the savepoint's copy is the only one, so a rename would drop it."""
    checkpoint = restored_checkpoint(tmp_path, [snapshot(0, "by-a")])
    assert RestoredCheckpoint(checkpoint).initial_states(["by-a"])["by-a"] is not None
    for _ in ("no batch committed", "a batch committed, by-a not bootstrapped"):
        with pytest.raises(SavepointError) as refused:
            RestoredCheckpoint(checkpoint).initial_states(["tallies"])
        assert str(refused.value).startswith(
            "savepoint operator(s) by-a claimed by no operator of this query (their state"
            " would be dropped)"
        )
        assert "\n" not in str(refused.value)
        committed(checkpoint)


def test_held_dropping_a_named_operator_after_its_bootstrap_is_the_checkpoints_business(
    tmp_path: Path,
) -> None:
    """Attack on the rename fix: once every savepoint operator's state is in the checkpoint,
    dropping one is a change to a running checkpoint, as on any checkpoint (names are not
    checked against it); dropping one whose bootstrap has not completed is refused,
    naming it, since its state exists only in the savepoint."""
    saved = [snapshot(0, "by-a"), snapshot(1, "by-b")]
    checkpoint = restored_checkpoint(tmp_path, saved)
    states = RestoredCheckpoint(checkpoint).initial_states(["by-a", "by-b"])
    committed(checkpoint)
    bootstrapped(states["by-a"])
    with pytest.raises(SavepointError) as refused:
        RestoredCheckpoint(checkpoint).initial_states(["by-a"])
    assert str(refused.value).startswith(
        "savepoint operator(s) by-b claimed by no operator of this query"
    )
    bootstrapped(states["by-b"])
    kept = RestoredCheckpoint(checkpoint).initial_states(["by-a"])
    assert list(kept) == ["by-a"]
    assert Path(kept["by-a"].path).read_bytes() == b"state of 0"  # type: ignore[union-attr]


def test_held_a_name_added_after_the_restore_committed_starts_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A name the savepoint lacks is refused while the restore has committed nothing (a
    typo would start empty); once a batch committed, it is an operator added to a running
    checkpoint: None, and Spark's state decides, as without a restore."""
    checkpoint = restored_checkpoint(tmp_path, [snapshot(0, "by-a")])
    with pytest.raises(SavepointError, match="operator[(]s[)] extra have no state"):
        RestoredCheckpoint(checkpoint).initial_states(["by-a", "extra"])
    committed(checkpoint)
    states = RestoredCheckpoint(checkpoint).initial_states(["by-a", "extra"])
    assert states["extra"] is None and states["by-a"] is not None


def test_held_a_name_reused_by_another_operator_kind_is_refused_by_its_columns(
    tmp_path: Path, spark: Any
) -> None:
    """Attack: the savepoint's running_count by-a handed by name to a deduplicate named
    by-a. The mapping cannot see kinds (names only), so the split refuses it in one line
    before any query starts: its columns are not the deduplicate's state."""
    saved = snapshot(0, "by-a")
    checkpoint = restored_checkpoint(tmp_path, [saved])
    state_file = checkpoint / RESTORED_DIRECTORY / saved.file
    pq.write_table(
        pa.table({"k": ["x"], "count": pa.array([2], pa.int64()), "version": [2]}),
        state_file,
    )
    state = RestoredCheckpoint(checkpoint).initial_states(["by-a"])["by-a"]
    firsts = Deduplicate("k", ttl="1 hour", name="by-a", initial_state=state)
    firsts.bind(["k"], KEY_ONLY)
    with pytest.raises(OperatorDefinitionError) as refused:
        split_by_key_group(spark, state, firsts)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "holds columns k string, count bigint, version bigint but this operator" in message
    assert "\n" not in message


def test_fixed_a_query_naming_only_some_operators_restores_without_allow_missing(
    tmp_path: Path,
) -> None:
    """A query naming only some operators could not restore: the savepoint's unnamed
    operator 0 was refused as unclaimed although the query's unnamed operator takes it
    with initial_state(0), and allow_missing=True, the only way through, also hides a real
    loss. None in names stands for the unnamed operator; without it, operator 0 is
    genuinely unclaimed and refused in one line saying how to list it."""
    checkpoint = restored_checkpoint(tmp_path, [snapshot(0, None), snapshot(1, "counts")])
    restored = RestoredCheckpoint(checkpoint)
    assert Path(restored.initial_state(0).path).read_bytes() == b"state of 0"  # type: ignore[union-attr]
    states = restored.initial_states([None, "counts"])
    assert list(states) == ["counts"]
    assert Path(states["counts"].path).read_bytes() == b"state of 1"  # type: ignore[union-attr]
    with pytest.raises(SavepointError) as refused:
        restored.initial_states(["counts"])
    message = str(refused.value)
    assert message.startswith(
        "savepoint operator(s) unnamed operator 0 claimed by no operator of this query (their"
        " state would be dropped) (an unnamed operator of this query that takes it stands in"
        " names as None at its position: names[0] = None, and takes initial_state(0))"
    )
    assert "\n" not in message


def test_fixed_restoring_by_position_into_a_differently_named_operator_is_refused(
    tmp_path: Path,
) -> None:
    checkpoint = restored_checkpoint(tmp_path, [snapshot(0, "by-b")])
    with pytest.raises(OperatorDefinitionError, match="holds the state of operator 'by-b'"):
        RunningCount(
            "k", name="by-a", initial_state=RestoredCheckpoint(checkpoint).initial_state(0)
        )


def test_fixed_a_key_expired_before_the_savepoint_does_not_come_back_without_ttl(
    spark: Any,
) -> None:
    """A savepoint keeps keys whose ttl had run out but whose key group no timeout visited
    yet (the query stopped); restored without ttl they came back with their old counts."""
    from eospack.stateful_ops.initial_state import with_expiry_of

    past, future = 1_000, 4_000_000_000_000
    saved = spark.createDataFrame(
        [("gone", 7, 3, past), ("kept", 1, 1, future)],
        f"k string, count long, version long, {EXPIRES_COLUMN} long",
    )
    restored = with_expiry_of(counter(), saved)
    assert [row["k"] for row in restored.collect()] == ["kept"]
    assert restored.columns == ["k", "count", "version"]


# the command line -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--allow-missing"],
            "eospack savepoint create: --allow-missing is an option of restore (it is"
            " recorded in the new checkpoint); leave it out of create",
        ),
        (
            ["--mode", "claim"],
            "eospack savepoint create: --mode is an option of restore; leave it out of create",
        ),
    ],
)
def test_fixed_restore_options_given_to_create_are_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    """``eospack savepoint create CKPT SP --allow-missing`` created the savepoint and
    silently dropped the option: the user believed it recorded."""
    code = main(["savepoint", "create", str(tmp_path / "ckpt"), str(tmp_path / "sp"), *options])
    assert code == 2
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "sp").exists()


def test_held_restore_mode_still_defaults_to_no_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = restored_checkpoint(tmp_path / "first", [snapshot(0, "by-a")])
    savepoint = checkpoint.parent / "savepoint"
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "second")]) == 0
    assert "is ready (no-claim)" in capsys.readouterr().out
    assert (savepoint / "manifest.json").is_file()


def test_fixed_the_restore_snippet_names_each_operator_kind_and_unnamed_positions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The printed snippet said ``running_count(..., name='sums', ...)`` for a
    running_aggregate and left out unnamed operators; then its ``initial_states(['sums'])``
    refused the unnamed operator 2 as unclaimed: names stand at their positions, None for
    the unnamed ones."""
    sums = OperatorSnapshot(1, "running_aggregate", 2, "state/operator-1.parquet", [], 8, "sums")
    firsts = OperatorSnapshot(2, "deduplicate", 2, "state/operator-2.parquet", [], 8, None)
    checkpoint = restored_checkpoint(tmp_path / "first", [sums, firsts])
    capsys.readouterr()
    savepoint = checkpoint.parent / "savepoint"
    assert main(["savepoint", "restore", str(savepoint), str(tmp_path / "second")]) == 0
    out = capsys.readouterr().out
    assert out.endswith(
        "  states = restored.initial_states([None, 'sums', None])\n"
        "  running_aggregate(..., name='sums', initial_state=states['sums'])\n"
        "  deduplicate(..., initial_state=restored.initial_state(2))\n"
    )
