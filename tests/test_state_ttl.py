"""ttl on running_count's state, without Spark: the base class's expiry bookkeeping
(``update_live``, ``expire``, ``next_wake_up_ms``) on a bound operator and a fixed clock."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eospack.stateful_ops import OperatorDefinitionError
from eospack.stateful_ops.base import EXPIRES_COLUMN, TTL_EVENT_US_COLUMN, Clock
from eospack.stateful_ops.operators.deduplicate import Deduplicate
from eospack.stateful_ops.operators.partial_aggregation import PARTIAL_COUNT
from eospack.stateful_ops.operators.running_count import RunningCount


def bound(ttl: object) -> RunningCount:
    operator = RunningCount("k", ttl=ttl)
    operator.bind(["k"], StructType([StructField("k", StringType())]))
    return operator


def batch(operator: RunningCount, state: pd.DataFrame, keys: list[str], at_ms: int) -> tuple:
    rows = operator.fold(iter([pd.DataFrame({"k": keys})]))
    new_state, output = operator.update_live(rows, state, Clock(at_ms, None))
    return new_state, sorted(map(tuple, output[["k", "count", "version"]].to_numpy().tolist()))


def as_dict(state: pd.DataFrame) -> dict[str, tuple[int, int, int]]:
    return {
        row["k"]: (int(row["count"]), int(row["version"]), int(row[EXPIRES_COLUMN]))
        for row in state.to_dict("records")
    }


def test_touched_keys_expire_ttl_after_their_batch_and_untouched_keep_their_expiry() -> None:
    operator = bound("10 seconds")
    state, output = batch(operator, operator.empty_state(), ["a", "a", "b"], 1_000)
    assert output == [("a", 2, 1_000), ("b", 1, 1_000)]
    assert as_dict(state) == {"a": (2, 1_000, 11_000), "b": (1, 1_000, 11_000)}
    state, output = batch(operator, state, ["b"], 5_000)
    assert output == [("b", 2, 1_001)]
    assert as_dict(state) == {"a": (2, 1_000, 11_000), "b": (2, 1_001, 15_000)}
    assert operator.next_wake_up_ms(state, Clock(5_000, None)) == 11_000
    # At 11 s a's ttl has run out: it is gone before the batch, and comes back from nothing
    # (its new life's version starts at the batch's timestamp, above its old life's).
    state, output = batch(operator, state, ["a", "c"], 11_000)
    assert output == [("a", 1, 11_000), ("c", 1, 11_000)]
    assert as_dict(state) == {
        "b": (2, 1_001, 15_000),
        "a": (1, 11_000, 21_000),
        "c": (1, 11_000, 21_000),
    }


def test_a_fired_timeout_drops_exactly_the_keys_whose_ttl_ran_out() -> None:
    operator = bound("10 seconds")
    state, _ = batch(operator, operator.empty_state(), ["a"], 1_000)
    state, _ = batch(operator, state, ["b"], 4_000)
    kept, output = operator.expire(state, Clock(11_000, None))
    assert as_dict(kept) == {"b": (1, 4_000, 14_000)} and not len(output)
    kept, _ = operator.expire(kept, Clock(14_000, None))
    assert not len(kept)


def test_ttl_is_a_duration_and_refused_where_the_operator_expires_keys_itself() -> None:
    with pytest.raises(OperatorDefinitionError, match=r"running_count: ttl='soon' is not a"):
        RunningCount("k", ttl="soon")
    with pytest.raises(OperatorDefinitionError, match="ttl is not supported here"):

        class Expiring(Deduplicate):
            timeout = "processing"

        RunningCount.__init__(Expiring("k", "1 minute"), "k", ttl="1 minute")
    assert RunningCount("k").ttl_ms is None and RunningCount("k").timeout == "none"
    assert bound("2 minutes").timeout == "processing"


def test_a_savepoint_without_expiries_restored_with_ttl_gets_the_full_ttl_and_back(
    spark: Any,
) -> None:
    """Turning ttl on or off goes through a savepoint (``with_expiry_of``, used by the
    split of ``initial_state``): on, each key expires ttl after the restore; off, the
    expiries are dropped."""
    import time

    from eospack.stateful_ops.initial_state import with_expiry_of

    saved = spark.createDataFrame([("a", 2, 1), ("b", 1, 1)], "k string, count long, version long")
    before = int(time.time() * 1000)
    restored = with_expiry_of(bound("1 minute"), saved)
    assert restored.columns == ["k", "count", "version", EXPIRES_COLUMN]
    expiries = [row[EXPIRES_COLUMN] for row in restored.collect()]
    assert len(set(expiries)) == 1 and before + 60_000 <= expiries[0] <= time.time() * 1000 + 60_000
    plain = RunningCount("k")
    plain.bind(["k"], StructType([StructField("k", StringType())]))
    back = with_expiry_of(plain, restored)
    assert back.columns == ["k", "count", "version"]
    assert sorted(back.collect()) == sorted(saved.collect())
    assert with_expiry_of(plain, saved) is saved


FAR = 10**13


def event_bound(ttl: object) -> RunningCount:
    """running_count with ttl_time="event", bound as its partial-count step sends rows."""
    operator = RunningCount("k", ttl=ttl, ttl_time="event")
    schema = StructType(
        [
            StructField("k", StringType()),
            StructField(PARTIAL_COUNT, LongType()),
            StructField(TTL_EVENT_US_COLUMN, LongType()),
        ]
    )
    operator.bind(["k"], schema)
    return operator


def event_batch(
    operator: RunningCount,
    state: pd.DataFrame,
    partials: list[tuple[str, int, int | None]],
    watermark_ms: int,
) -> tuple:
    """One batch of partial counts (key, rows, latest event second) at ``watermark_ms``;
    the processing time is far ahead (``FAR`` + the watermark) and only starts versions."""
    frame = pd.DataFrame(
        {
            "k": [key for key, _, _ in partials],
            PARTIAL_COUNT: [count for _, count, _ in partials],
            TTL_EVENT_US_COLUMN: pd.array(
                [None if second is None else second * 1_000_000 for _, _, second in partials],
                dtype="Int64",
            ),
        }
    )
    rows = operator.fold(iter([frame]))
    new_state, output = operator.update_live(rows, state, Clock(FAR + watermark_ms, watermark_ms))
    return new_state, sorted(map(tuple, output[["k", "count", "version"]].to_numpy().tolist()))


def test_event_time_ttl_expires_a_key_once_the_watermark_passes_its_latest_event() -> None:
    operator = event_bound("10 seconds")
    assert operator.timeout == "event"
    # a's rows come from two input partitions (latest events 100 s and 90 s).
    state, output = event_batch(
        operator, operator.empty_state(), [("a", 2, 100), ("b", 1, 50), ("a", 1, 90)], 0
    )
    assert output == [("a", 3, FAR), ("b", 1, FAR)]
    assert as_dict(state) == {"a": (3, FAR, 110_000), "b": (1, FAR, 60_000)}
    assert operator.next_wake_up_ms(state, Clock(0, 0)) == 60_000
    assert not operator.due(state, Clock(10**13, 59_999)) and operator.due(state, Clock(0, 60_000))
    # At watermark 60 s b is gone (it starts again); a late row of a keeps a's expiry, and a
    # row without event time counts as at the watermark.
    state, output = event_batch(operator, state, [("a", 1, 20), ("b", 1, None)], 60_000)
    assert output == [("a", 4, FAR + 1), ("b", 1, FAR + 60_000)]
    assert as_dict(state) == {"a": (4, FAR + 1, 110_000), "b": (1, FAR + 60_000, 70_000)}
    kept, _ = operator.expire(state, Clock(0, 70_000))
    assert as_dict(kept) == {"a": (4, FAR + 1, 110_000)}
    kept, _ = operator.expire(kept, Clock(0, 110_000))
    assert not len(kept)


def test_ttl_time_is_checked_in_one_line() -> None:
    with pytest.raises(OperatorDefinitionError) as error:
        RunningCount("k", ttl="1 minute", ttl_time="wall")
    assert str(error.value) == "running_count: ttl_time='wall'; use 'processing' or 'event'"
    with pytest.raises(OperatorDefinitionError) as error:
        RunningCount("k", ttl_time="event")
    assert str(error.value) == (
        "running_count: ttl_time='event' without ttl; pass ttl= (a duration) too"
    )
    schema = event_bound("1 minute").arrow_state_schema
    assert schema.metadata == {b"key_groups": b"8", b"ttl_time": b"event"}
    assert bound("1 minute").arrow_state_schema.metadata == {b"key_groups": b"8"}


def test_partial_counts_carry_each_keys_latest_event_time() -> None:
    import pyarrow as pa

    from eospack.stateful_ops.operators.partial_aggregation import partial_counts

    count = partial_counts(["k"], event_column="e")
    batches = [
        pa.record_batch({"k": ["a", "b", "a"], "e": [5, None, 9]}),
        pa.record_batch({"k": ["a", "c"], "e": [7, 1]}),
    ]
    table = pa.Table.from_batches(list(count(iter(batches))))
    assert sorted(zip(*table.to_pydict().values(), strict=True)) == [
        ("a", 3, 9),
        ("b", 1, None),
        ("c", 1, 1),
    ]


def test_a_state_is_refused_by_a_query_with_the_other_ttl_time() -> None:
    from eospack.stateful_ops import StateSchemaMismatchError, state_codec

    event, processing = event_bound("1 minute"), bound("1 minute")
    for written, reading, message in [
        (event, processing, "written with ttl_time=event, this query declares ttl_time=processing"),
        (processing, event, "written with ttl_time=processing, this query declares ttl_time=event"),
    ]:
        blob = state_codec.encode(written.empty_state(), written.arrow_state_schema)
        row = (state_codec.STATE_FORMAT_VERSION, "running_count", blob)
        with pytest.raises(StateSchemaMismatchError, match=message):
            reading.load_value(row)
        assert len(written.load_value(row)) == 0


def test_rows_sent_without_partial_counts_carry_their_keys_latest_event_time() -> None:
    """Keys of nested types skip the partial step: the rows themselves reach the operator,
    and folding them keeps each key's latest event time."""
    operator = RunningCount("k", ttl="10 seconds", ttl_time="event")
    schema = StructType(
        [StructField("k", StringType()), StructField(TTL_EVENT_US_COLUMN, LongType())]
    )
    operator.bind(["k"], schema)
    frame = pd.DataFrame(
        {"k": ["a", "b", "a"], TTL_EVENT_US_COLUMN: pd.array([5_000_000, None, 9_000_000])}
    )
    rows = operator.fold(iter([frame]))
    state, output = operator.update_live(rows, operator.empty_state(), Clock(5_000, 1_000))
    assert sorted(map(tuple, output[["k", "count", "version"]].to_numpy().tolist())) == [
        ("a", 2, 5_000),
        ("b", 1, 5_000),
    ]
    assert as_dict(state) == {"a": (2, 5_000, 19_000), "b": (1, 5_000, 11_000)}


def test_a_deduplicate_state_is_refused_by_a_query_with_event_time_switched() -> None:
    """deduplicate records the clock of its expiries (``expiry_clock``): a restart with
    ``event_time`` set or dropped is refused in one line; a state written before the
    setting existed (no ``expiry_clock``) is read by either."""
    from eospack.stateful_ops import StateSchemaMismatchError, state_codec

    schema = StructType([StructField("k", StringType()), StructField("ts", LongType())])
    event = Deduplicate("k", "1 minute", event_time="ts")
    event.bind(["k"], schema)
    processing = Deduplicate("k", "1 minute")
    processing.bind(["k"], schema)
    for written, reading, fix in [
        (event, processing, "set event_time= again"),
        (processing, event, "drop event_time"),
    ]:
        blob = state_codec.encode(written.empty_state(), written.arrow_state_schema)
        row = (state_codec.STATE_FORMAT_VERSION, "deduplicate", blob)
        with pytest.raises(StateSchemaMismatchError) as refused:
            reading.load_value(row)
        assert fix in str(refused.value) and "\n" not in str(refused.value)
        assert len(written.load_value(row)) == 0
    metadata = dict(event.arrow_state_schema.metadata or {})
    del metadata[state_codec.EXPIRY_CLOCK]
    older = state_codec.encode(
        event.empty_state(), event.arrow_state_schema.with_metadata(metadata)
    )
    for reading in (event, processing):
        assert (
            len(reading.load_value((state_codec.STATE_FORMAT_VERSION, "deduplicate", older))) == 0
        )
