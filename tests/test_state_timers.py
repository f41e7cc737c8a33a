"""Per-key timers of StatefulOperator, without Spark: ``step`` (the state change of one call
of a key group) on a bound operator and a fixed clock, as Spark would call it batch after
batch with the committed state of the previous one."""

from __future__ import annotations

from typing import Any, ClassVar

import pandas as pd
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from eospack.stateful_ops import (
    FIRED_TIMER_COLUMN,
    TIMER_COLUMN,
    Clock,
    OperatorDefinitionError,
    StatefulOperator,
    delete_timer,
    register_timer,
)
from eospack.stateful_ops.base import EXPIRES_COLUMN
from eospack.stateful_ops.operators.running_count import RunningCount
from eospack.stateful_ops.operators.shared import long_field

DELAY_MS = 10_000


class Reminder(StatefulOperator):
    """Counts rows per key; ``DELAY_MS`` after a key's last row its timer emits (key, count,
    the time the timer was due) and drops the key."""

    name: ClassVar[str] = "reminder"
    timers = "processing"
    state_fields: ClassVar[StructType] = StructType([long_field("count")])
    output_fields: ClassVar[StructType] = StructType(
        [long_field("count"), long_field("fired_at_ms")]
    )

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        keys = list(self.keys)
        counts = rows.groupby(keys, dropna=False, sort=False).size().rename("new").reset_index()
        merged = state.merge(counts, on=keys, how="outer", sort=False)
        merged["count"] = merged["count"].fillna(0).astype("int64") + merged["new"].fillna(0)
        touched = merged["new"].notna().to_numpy()
        merged = merged.drop(columns=["new"])
        return register_timer(merged, touched, self.now(clock) + DELAY_MS), self.empty_output()

    def now(self, clock: Clock) -> int:
        return clock.processing_time_ms

    def on_timer(self, due_state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        output = due_state[[*self.keys, "count"]].assign(fired_at_ms=due_state[FIRED_TIMER_COLUMN])
        return due_state.iloc[0:0], output


class EventReminder(Reminder):
    """Reminder on event time: the timer is due once the watermark reaches it."""

    name: ClassVar[str] = "event_reminder"
    timers = "event"

    def now(self, clock: Clock) -> int:
        assert clock.watermark_ms is not None
        return clock.watermark_ms


def bound(operator: StatefulOperator) -> Any:
    operator.bind(["k"], StructType([StructField("k", StringType())]))
    return operator


def step(
    operator: StatefulOperator, state: pd.DataFrame, keys: list[str] | None, clock: Clock
) -> tuple[pd.DataFrame, list[tuple[Any, ...]]]:
    """One call: ``keys`` the batch's rows of the group, None for a visit without data."""
    rows = None if keys is None else operator.fold(iter([pd.DataFrame({"k": keys})]))
    new_state, output = operator.step(rows, state, clock)
    return new_state, sorted(map(tuple, output.astype(object).to_numpy().tolist()))


def timers(state: pd.DataFrame) -> dict[str, Any]:
    return {
        row["k"]: None if pd.isna(row[TIMER_COLUMN]) else int(row[TIMER_COLUMN])
        for row in state.to_dict("records")
    }


def at(ms: int) -> Clock:
    return Clock(ms, None)


def test_a_timer_fires_once_at_the_first_batch_whose_clock_reaches_it_never_before() -> None:
    operator = bound(Reminder("k"))
    state, output = step(operator, operator.empty_state(), ["a", "a", "b"], at(1_000))
    assert output == [] and timers(state) == {"a": 11_000, "b": 11_000}
    assert operator.next_wake_up_ms(state, at(1_000)) == 11_000
    state, output = step(operator, state, ["b"], at(5_000))  # b's timer moves on
    assert output == [] and timers(state) == {"a": 11_000, "b": 15_000}
    state, output = step(operator, state, None, at(10_999))
    assert output == [] and timers(state) == {"a": 11_000, "b": 15_000}
    assert not operator.due(state, at(10_999)) and operator.due(state, at(11_000))
    state, output = step(operator, state, None, at(11_000))
    assert output == [("a", 2, 11_000)]
    assert timers(state) == {"b": 15_000}  # a left the state with its timer
    state, output = step(operator, state, None, at(14_000))
    assert output == []
    state, output = step(operator, state, ["c"], at(30_000))
    assert output == [("b", 2, 15_000)]
    assert timers(state) == {"c": 40_000}
    # The committed state after a firing holds no due timer: nothing fires twice.
    state, output = step(operator, state, None, at(30_001))
    assert output == [] and timers(state) == {"c": 40_000}


def test_due_timers_fire_before_the_batch_rows_and_the_key_starts_again() -> None:
    """Flink's order: a's timer (11 s) precedes rows that arrive at 12 s, so the rows start
    a new count instead of joining the fired one."""
    operator = bound(Reminder("k"))
    state, _ = step(operator, operator.empty_state(), ["a"], at(1_000))
    state, output = step(operator, state, ["a", "a"], at(12_000))
    assert output == [("a", 1, 11_000)]
    assert list(state["count"]) == [2] and timers(state) == {"a": 22_000}


def test_a_timer_update_sets_at_a_time_already_reached_fires_in_the_same_call() -> None:
    class Immediate(Reminder):
        def now(self, clock: Clock) -> int:
            return clock.processing_time_ms - DELAY_MS  # due right away

    operator = bound(Immediate("k"))
    state, output = step(operator, operator.empty_state(), ["a", "b", "b"], at(1_000))
    assert output == [("a", 1, 1_000), ("b", 2, 1_000)]
    assert not len(state)


def test_on_timer_re_registers_and_a_reached_time_waits_for_the_next_batch() -> None:
    """on_timer keeps the key and sets the next timer: 5 s later (fires later), or at the
    time that just fired (already reached: fires at the next batch, not in a loop)."""

    class Repeating(Reminder):
        every_ms = 5_000

        def on_timer(
            self, due_state: pd.DataFrame, clock: Clock
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
            _, output = super().on_timer(due_state, clock)
            next_at = due_state[FIRED_TIMER_COLUMN] + self.every_ms
            return register_timer(due_state, None, next_at), output

    operator = bound(Repeating("k"))
    state, _ = step(operator, operator.empty_state(), ["a"], at(1_000))
    state, output = step(operator, state, None, at(11_000))
    assert output == [("a", 1, 11_000)] and timers(state) == {"a": 16_000}
    state, output = step(operator, state, None, at(40_000))  # one firing per call
    assert output == [("a", 1, 16_000)] and timers(state) == {"a": 21_000}
    operator.every_ms = 0
    state, output = step(operator, state, None, at(40_000))
    assert output == [("a", 1, 21_000)] and timers(state) == {"a": 21_000}
    state, output = step(operator, state, None, at(40_001))
    assert output == [("a", 1, 21_000)]


def test_a_state_returned_without_the_timer_column_keeps_each_keys_timer() -> None:
    """An update that rebuilds the table (as running_count does) need not copy timers:
    the keys it keeps keep theirs, a new key has none."""

    class Rebuilding(Reminder):
        def update(
            self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
            if not len(state):
                return super().update(rows, state, clock)
            keys = sorted({*state["k"], *rows["k"]})
            counts = {k: 0 for k in keys} | dict(zip(state["k"], state["count"], strict=True))
            for k in rows["k"]:
                counts[k] += 1
            rebuilt = pd.DataFrame({"k": keys, "count": [counts[k] for k in keys]})
            return rebuilt, self.empty_output()

    operator = bound(Rebuilding("k"))
    state, _ = step(operator, operator.empty_state(), ["b"], at(1_000))
    state, _ = step(operator, state, ["a", "b"], at(2_000))
    assert timers(state) == {"a": None, "b": 11_000}
    assert dict(zip(state["k"], state["count"], strict=True)) == {"a": 1, "b": 2}
    state, output = step(operator, state, None, at(11_000))
    assert output == [("b", 2, 11_000)] and timers(state) == {"a": None}
    assert operator.next_wake_up_ms(state, at(11_000)) is None


def test_delete_timer_and_register_timer_touch_only_the_masked_keys() -> None:
    operator = bound(Reminder("k"))
    state, _ = step(operator, operator.empty_state(), ["a", "b", "c"], at(0))
    changed = register_timer(state, state["k"] == "b", 3)
    assert timers(changed) == {"a": 10_000, "b": 3, "c": 10_000}
    per_key = register_timer(state, None, [1, 2, 3])
    assert timers(per_key) == {"a": 1, "b": 2, "c": 3}
    assert timers(delete_timer(per_key, [True, False, True])) == {"a": None, "b": 2, "c": None}
    assert timers(delete_timer(per_key)) == {"a": None, "b": None, "c": None}
    assert timers(state) == {"a": 10_000, "b": 10_000, "c": 10_000}  # inputs unchanged
    with pytest.raises(OperatorDefinitionError, match="the frame has no __so_timer_at_ms"):
        register_timer(pd.DataFrame({"k": ["a"]}), None, 1)


def test_event_time_timers_fire_when_the_watermark_reaches_them() -> None:
    operator = bound(EventReminder("k"))
    assert operator.timeout == "event"
    state, output = step(operator, operator.empty_state(), ["a"], Clock(1, 1_000))
    assert output == [] and timers(state) == {"a": 11_000}
    state, output = step(operator, state, None, Clock(999_999, 10_999))
    assert output == []
    state, output = step(operator, state, ["b"], Clock(2, 11_000))
    assert output == [("a", 1, 11_000)] and timers(state) == {"b": 21_000}
    # Without a watermark no event-time timer is due.
    assert step(operator, state, None, Clock(10**9, None))[1] == []


def test_timers_survive_encoding_into_the_state_row() -> None:
    from eospack.stateful_ops import state_codec

    operator = bound(Reminder("k"))
    state, _ = step(operator, operator.empty_state(), ["a", "b"], at(0))
    state = delete_timer(state, state["k"] == "a")
    blob = state_codec.encode(state[operator.arrow_state_schema.names], operator.stored_schema())
    decoded = operator.load_value((state_codec.STATE_FORMAT_VERSION, operator.name, blob))
    assert timers(decoded) == {"a": None, "b": 10_000}
    assert decoded[TIMER_COLUMN].dtype == "Int64"
    assert operator.arrow_state_schema.names == ["k", "count", TIMER_COLUMN]


def test_timers_with_ttl_wake_the_group_at_the_earliest_of_both() -> None:
    operator = bound(Reminder("k", ttl="5 seconds"))
    assert operator.arrow_state_schema.names == ["k", "count", EXPIRES_COLUMN, TIMER_COLUMN]
    state, _ = step(operator, operator.empty_state(), ["a"], at(1_000))
    assert operator.next_wake_up_ms(state, at(1_000)) == 6_000  # ttl before the timer
    state, output = step(operator, state, None, at(6_000))
    assert output == [] and not len(state)  # expired by ttl before its timer


def test_timer_kinds_are_checked_when_the_operator_is_defined() -> None:
    class Bogus(Reminder):
        timers = "wall"

    with pytest.raises(OperatorDefinitionError) as error:
        Bogus("k")
    assert str(error.value) == "reminder: timers='wall'; use one of none, processing, event"
    with pytest.raises(OperatorDefinitionError) as error:
        EventReminder("k", ttl="1 minute")
    assert str(error.value) == (
        "event_reminder: timers='event' with processing-time ttl: Spark keeps one timeout"
        " kind per operator; use the same kind for both"
    )
    assert Reminder("k").timeout == "processing" and RunningCount("k").timers == "none"


def test_a_state_is_refused_by_the_same_operator_with_the_other_timer_kind() -> None:
    """Due times are one clock's: a restart that switches a checkpoint's timers between
    processing and event time is refused by its first batch, naming timers, both ways."""
    from eospack.stateful_ops import StateSchemaMismatchError, state_codec

    class ReminderOnEventTime(Reminder):
        timers = "event"

    processing, event = bound(Reminder("k")), bound(ReminderOnEventTime("k"))
    for written, reading, message in [
        (event, processing, "written with timers=event, this query declares timers=processing"),
        (processing, event, "written with timers=processing, this query declares timers=event"),
    ]:
        blob = state_codec.encode(written.empty_state(), written.stored_schema())
        row = (state_codec.STATE_FORMAT_VERSION, "reminder", blob)
        with pytest.raises(StateSchemaMismatchError, match=message):
            reading.load_value(row)
        assert len(written.load_value(row)) == 0
