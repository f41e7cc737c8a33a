"""Attacks on the segment log's store side without Spark (``segment_log_state.handle_rows``
on an in-memory ListState and timer list): a changed ttl, a name added on a checkpoint,
tombstones of null / composite / timestamp keys, a group emptied by its timer, a timer
visit in a batch that had rows, and a replayed batch; and, restored with the old query's
watermark, a timer on_timer re-registers at a reached time against the key-groups
layout's GroupState path (OPEN there)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from eospack.stateful_ops import (
    FIRED_TIMER_COLUMN,
    StatefulOperator,
    register_timer,
    segment_log_state,
    state_codec,
)
from eospack.stateful_ops.base import MARKER_COLUMN, Clock
from eospack.stateful_ops.operators.running_count import RunningCount
from eospack.stateful_ops.segment_log import fold
from eospack.stateful_ops.state_codec import EXPIRES_COLUMN
from tests.state_handle_fakes import LAYOUT, EventTimeGroupState, new_handle


def bound(ttl: object, keys: tuple[str, ...] = ("k",), name: str | None = None) -> RunningCount:
    operator = RunningCount(list(keys), ttl=ttl, name=name)
    types = {"k": StringType(), "t": TimestampType()}
    operator.bind(list(keys), StructType([StructField(key, types[key]) for key in keys]))
    return operator


def visit(
    operator: RunningCount, handle: Any, rows: pd.DataFrame | None, at_ms: int
) -> list[tuple[Any, ...]]:
    """One key group's call (``rows`` None: its timer fired); the (keys..., count, version)
    rows it emits (missing values as None), sorted."""
    frames = iter([rows]) if rows is not None else None
    emitted = list(segment_log_state.handle_rows(operator, LAYOUT, handle, 0, frames, at_ms))
    columns = [*operator.keys, "count", "version"]
    out = [plain(row) for frame in emitted for row in frame[columns].itertuples(index=False)]
    return sorted(out, key=repr)


def live(operator: RunningCount, handle: Any) -> dict[Any, tuple[int, int, int]]:
    """The group's folded log: key -> (count, version, expiry ms)."""
    if not handle.log.exists():
        return {}
    segments, _ = segment_log_state.read_log(operator, handle.log.get())
    table = fold(segments, list(operator.keys)).to_pandas()
    return {
        tuple(row[k] for k in operator.keys): (
            int(row["count"]),
            int(row["version"]),
            int(row[EXPIRES_COLUMN]),
        )
        for row in table.to_dict("records")
    }


def plain(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row with every missing value (None, NaN, NA, NaT) as None, so rows compare."""
    return tuple(None if value is None or pd.isna(value) else value for value in row)


def keys(*values: str | None) -> pd.DataFrame:
    return pd.DataFrame({"k": list(values)})


def test_ttl_raised_then_lowered_on_a_segment_log_moves_every_key_as_key_groups() -> None:
    """Failed before the fix: the segment's informational ``ttl_ms`` was a checked setting,
    so any ttl change on a segment-log checkpoint was refused (StateSchemaMismatchError),
    where the key-groups layout moves the expiries (``base.load_value``)."""
    handle = new_handle()
    assert visit(bound("10 seconds"), handle, keys("a", "b"), 1_000) == [
        ("a", 1, 1_000),
        ("b", 1, 1_000),
    ]
    raised = bound("20 seconds")
    assert visit(raised, handle, keys("c"), 2_000) == [("c", 1, 2_000)]
    # a and b live 20 s from their last batch with rows (1 s), c from 2 s.
    assert live(raised, handle) == {
        ("a",): (1, 1_000, 21_000),
        ("b",): (1, 1_000, 21_000),
        ("c",): (1, 2_000, 22_000),
    }
    assert handle.timers.registered == [21_000]
    # At 15 s (past the old ttl, before the new one) the group's timer keeps them all.
    assert visit(raised, handle, None, 15_000) == []
    assert set(live(raised, handle)) == {("a",), ("b",), ("c",)}
    # Lowered to 5 s: at 16 s every old key's ttl has run out (a, b at 6 s; c at 7 s).
    lowered = bound("5 seconds")
    assert visit(lowered, handle, keys("a", "d"), 16_000) == [
        ("a", 1, 16_000),
        ("d", 1, 16_000),
    ]
    assert live(lowered, handle) == {
        ("a",): (1, 16_000, 21_000),
        ("d",): (1, 16_000, 21_000),
    }


def test_a_name_added_on_a_segment_log_checkpoint_is_accepted_as_with_key_groups() -> None:
    """Failed before the fix: the segment's informational operator name was checked, so
    naming an unnamed operator on its checkpoint was refused (key-groups accepts it)."""
    handle = new_handle()
    visit(bound("10 seconds"), handle, keys("a"), 1_000)
    named = bound("10 seconds", name="counts")
    assert visit(named, handle, keys("a"), 2_000) == [("a", 2, 1_001)]


def test_null_composite_timestamp_keys_expire_by_tombstones_and_an_emptied_group_clears() -> None:
    """Composite (string, timestamp) keys with nulls: expired keys are tombstoned (not
    folded back), a group whose every key expired by its timer clears its log and timer,
    and a key coming back starts a new life at the batch's timestamp."""
    operator = bound("10 seconds", keys=("k", "t"))
    handle = new_handle()
    t = pd.Timestamp("2026-11-29 12:00:00")  # as Spark passes them: naive
    first = pd.DataFrame({"k": ["a", None, "a", None], "t": [t, t, pd.NaT, pd.NaT]})
    assert len(visit(operator, handle, first, 1_000)) == 4
    second = pd.DataFrame({"k": [None], "t": [t]})
    assert len(visit(operator, handle, second, 5_000)) == 1
    # At 11 s the three keys last written at 1 s expire through the timer: tombstones.
    assert handle.timers.registered == [11_000]
    assert visit(operator, handle, None, 11_000) == []
    assert list(live(operator, handle)) == [(None, t)]
    assert handle.timers.registered == [15_000]
    # At 15 s the last key expires: the log is cleared, no timer is left.
    assert visit(operator, handle, None, 15_000) == []
    assert handle.log.items is None and handle.timers.registered == []
    back = visit(operator, handle, pd.DataFrame({"k": ["a"], "t": [pd.NaT]}), 20_000)
    assert [(row[0], row[2], row[3]) for row in back] == [("a", 1, 20_000)]


def test_a_timer_visit_after_rows_in_the_same_batch_changes_nothing() -> None:
    """Spark fires the group's timer after its rows; the rows' call re-registers the timer
    past the batch, but were the old one still to fire in that batch, the visit without
    data emits nothing and leaves the log as it is (no segment written twice)."""
    operator = bound("10 seconds")
    handle = new_handle()
    visit(operator, handle, keys("a", "b"), 1_000)
    visit(operator, handle, keys("b"), 5_000)
    assert visit(operator, handle, keys("b", "c"), 11_000) == [("b", 3, 1_002), ("c", 1, 11_000)]
    log_after_rows = list(handle.log.items or [])
    assert visit(operator, handle, None, 11_000) == []
    assert handle.log.items == log_after_rows
    assert set(live(operator, handle)) == {("b",), ("c",)}


def test_a_replayed_batch_from_the_committed_log_writes_the_same_segment() -> None:
    """A retried task or a replayed batch starts from the last committed log: it emits the
    same rows and leaves the same log as the first attempt (TWS state is per attempt)."""
    operator = bound("10 seconds")
    handle = new_handle()
    visit(operator, handle, keys("a", "b", "c"), 1_000)
    committed = list(handle.log.items or [])
    first = visit(operator, handle, keys("a", "d"), 2_000)
    after_first = list(handle.log.items or [])
    handle.log.items = list(committed)
    assert visit(operator, handle, keys("a", "d"), 2_000) == first
    assert handle.log.items == after_first
    assert [pa.ipc.open_stream(b).read_all().num_rows for (b,) in after_first] == [3, 2]


def key_groups_visit(
    operator: RunningCount, row: tuple[Any, ...] | None, rows: pd.DataFrame | None, at_ms: int
) -> tuple[tuple[Any, ...] | None, list[tuple[Any, ...]]]:
    """The key-groups layout's store path for one visit, without GroupState: ``load_value``
    (which moves expiries by a ttl change), ``step``, the encoded row (None: removed)."""
    stored = operator.load_value(row) if row is not None else operator.empty_state()
    folded = operator.fold(iter([rows])) if rows is not None else None
    new_state, output = operator.step(folded, stored, Clock(at_ms, None))
    emitted = [
        plain(r) for r in output[[*operator.keys, "count", "version"]].itertuples(index=False)
    ]
    if not len(new_state):
        return None, sorted(emitted, key=repr)
    blob = state_codec.encode(
        new_state[operator.arrow_state_schema.names], operator.stored_schema()
    )
    return (state_codec.STATE_FORMAT_VERSION, operator.name, blob), sorted(emitted, key=repr)


@pytest.mark.parametrize("seed", [41, 4141, 414141])
def test_many_batches_with_ttl_changes_equal_the_key_groups_path(seed: int) -> None:
    """Random batches over null keys, timer visits and ttl changes (raised and lowered) on
    one key group: the segment log emits what the key-groups path emits, folds to its state
    (expiries included), and never holds more than twice its live keys (cleared when none
    is left)."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    handle, row = new_handle(), None
    ttls = ["4 seconds", "9 seconds", "2 seconds"]
    operator = bound(ttls[0])
    at_ms = 1_000
    for _ in range(60):
        at_ms += rng.choice([1, 300, 900, 2_500])
        if rng.random() < 0.08:
            operator = bound(rng.choice(ttls))
        rows = None
        if rng.random() < 0.8:
            rows = keys(
                *[rng.choice(["a", "b", "c", "d", "e", None]) for _ in range(rng.randint(1, 5))]
            )
        emitted = visit(operator, handle, rows, at_ms)
        row, expected = key_groups_visit(operator, row, rows, at_ms)
        assert emitted == expected, at_ms
        model_state = (
            {}
            if row is None
            else {
                (r["k"],): (int(r["count"]), int(r["version"]), int(r[EXPIRES_COLUMN]))
                for r in operator.load_value(row).to_dict("records")
            }
        )
        assert live(operator, handle) == model_state, at_ms
        logged = sum(pa.ipc.open_stream(b).read_all().num_rows for (b,) in handle.log.items or [])
        assert logged <= 2 * len(model_state), at_ms


class Pinger(StatefulOperator):
    """Counts rows per key; a key's rows (re)set its timer 5 s after the batch, which
    emits (key, count, due time) and drops the key."""

    name = "pinger"
    timers = "processing"
    state_fields = StructType([StructField("count", LongType())])
    output_fields = StructType(
        [StructField("count", LongType()), StructField("fired_at_ms", LongType())]
    )

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        keys = list(self.keys)
        per_key = (
            rows[keys].assign(new=1).groupby(keys, sort=False, dropna=False).sum().reset_index()
        )
        merged = state.merge(per_key, on=keys, how="outer", sort=False)
        touched = merged["new"].notna().to_numpy()
        merged["count"] = (merged["count"].fillna(0) + merged["new"].fillna(0)).astype("int64")
        due = np.full(len(merged), clock.processing_time_ms + 5_000, dtype=np.int64)
        return register_timer(merged.drop(columns=["new"]), touched, due), self.empty_output()

    def on_timer(self, due_state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        output = due_state[[*self.keys, "count"]].assign(fired_at_ms=due_state[FIRED_TIMER_COLUMN])
        return due_state.iloc[0:0], output


def pinger(ttl: str) -> Pinger:
    operator = Pinger("k", ttl=ttl)
    operator.bind(["k"], StructType([StructField("k", StringType())]))
    return operator


def test_ttl_lowered_with_timers_moves_expiries_not_timers_on_both_layouts() -> None:
    """ttl 10 s then 3 s on an operator with timers: expiries move by the difference,
    timers stay absolute; a key whose lowered ttl ran out before its timer is dropped
    without firing. Both layouts emit the same rows and register the same wake-ups."""
    handle, row = new_handle(), None

    def both(operator: Pinger, rows: pd.DataFrame | None, at_ms: int) -> list[tuple[Any, ...]]:
        nonlocal row
        frames = iter([rows]) if rows is not None else None
        emitted = segment_log_state.handle_rows(operator, LAYOUT, handle, 0, frames, at_ms)
        columns = ["k", "count", "fired_at_ms"]
        log_out = sorted(plain(r) for f in emitted for r in f[columns].itertuples(index=False))
        stored = operator.load_value(row) if row is not None else operator.empty_state()
        folded = operator.fold(iter([rows])) if rows is not None else None
        new_state, output = operator.step(folded, stored, Clock(at_ms, None))
        groups_out = sorted(plain(r) for r in output[columns].itertuples(index=False))
        assert log_out == groups_out, at_ms
        wake_up = (
            operator.next_wake_up_ms(new_state, Clock(at_ms, None)) if len(new_state) else None
        )
        assert handle.timers.registered == ([] if wake_up is None else [max(wake_up, at_ms + 1)])
        row = None
        if len(new_state):
            blob = state_codec.encode(
                new_state[operator.arrow_state_schema.names], operator.stored_schema()
            )
            row = (state_codec.STATE_FORMAT_VERSION, operator.name, blob)
        return log_out

    slow, fast = pinger("10 seconds"), pinger("3 seconds")
    assert both(slow, keys("a", "b"), 1_000) == []
    assert both(slow, keys("a"), 2_000) == []
    assert handle.timers.registered == [6_000]
    assert both(slow, None, 6_000) == [("b", 1, 6_000)]
    assert handle.timers.registered == [7_000]
    # ttl lowered to 3 s: a (last rows at 2 s) expired at 5 s, before its timer at 7 s.
    assert both(fast, keys("c"), 6_600) == []
    assert handle.timers.registered == [9_600]  # c's expiry, before its timer at 11.6 s
    assert both(fast, None, 9_600) == []
    assert handle.log.items is None and handle.timers.registered == []


def test_a_key_groups_row_written_before_ttl_ms_keeps_its_expiries_when_ttl_changes() -> None:
    """Pinned limit (documented): a key-groups row written before rows recorded ``ttl_ms``
    says nothing of its ttl, so a ttl changed on such a checkpoint leaves its untouched
    keys at their old expiry (raised: they leave at the old ttl); keys with rows since
    live the new ttl, and rows written from then on record it."""
    old = bound("10 seconds")
    state, _ = old.update_live(
        old.fold(iter([keys("a", "b")])), old.empty_state(), Clock(1_000, None)
    )
    legacy = old.stored_schema().remove_metadata()
    legacy = legacy.with_metadata(old.arrow_state_schema.metadata)
    row = (state_codec.STATE_FORMAT_VERSION, old.name, state_codec.encode(state, legacy))
    raised = bound("20 seconds")
    loaded = raised.load_value(row)
    assert dict(zip(loaded["k"], loaded[EXPIRES_COLUMN], strict=True)) == {"a": 11_000, "b": 11_000}
    new_state, _ = raised.update_live(raised.fold(iter([keys("b")])), loaded, Clock(2_000, None))
    assert dict(zip(new_state["k"], new_state[EXPIRES_COLUMN], strict=True)) == {
        "a": 11_000,
        "b": 22_000,
    }


def test_a_bootstrap_loads_a_group_once_expires_what_is_due_and_never_clears_its_log(
    tmp_path: Any,
) -> None:
    """Restored (``bootstrap_directory``): a group without a log visited by markers alone
    loads its split, expires its due key (a visit without data) and writes the rest as its
    first segment, its timer at the next expiry; markers alone on a group with a log change
    nothing; a group whose keys all expire keeps a log (an empty segment), so it never
    loads its split again."""
    import pyarrow.parquet as pq

    operator = bound("1000 ms")
    schema = operator.arrow_state_schema
    for group, keys, expiries in [(0, ["a", "b"], [500, 5000]), (1, ["c"], [500])]:
        split = tmp_path / f"__so_key_group={group}"
        split.mkdir()
        ones = [1] * len(keys)
        columns = {"k": keys, "count": ones, "version": ones, EXPIRES_COLUMN: expiries}
        pq.write_table(pa.table(columns, schema=schema), str(split / "part.parquet"))
    operator.bootstrap_directory = str(tmp_path)
    markers = pd.DataFrame({"k": ["z"], MARKER_COLUMN: [True]})
    handle = new_handle()
    assert visit(operator, handle, markers, 1000) == []
    assert live(operator, handle) == {("b",): (1, 1, 5000)}
    assert handle.timers.registered == [5000]
    assert visit(operator, handle, markers, 9000) == []
    assert live(operator, handle) == {("b",): (1, 1, 5000)}
    assert visit(operator, handle, None, 9000) == []  # b's timer
    assert handle.log.exists() and live(operator, handle) == {}

    emptied = new_handle()
    frames = iter([markers])
    assert list(segment_log_state.handle_rows(operator, LAYOUT, emptied, 1, frames, 1000)) == []
    assert emptied.log.exists() and live(operator, emptied) == {}


class Repeater(StatefulOperator):
    """Event-time timers; a key's first firing re-registers its timer at the time it fired
    at (already reached: it fires again at the next watermark advance, ``step``), adding
    100 to its count; its second firing drops it. Emits (k, count, fired_at_ms)."""

    name = "repeater"
    timers = "event"
    state_fields = StructType([StructField("count", LongType())])
    output_fields = StructType(
        [StructField("count", LongType()), StructField("fired_at_ms", LongType())]
    )

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        return state, self.empty_output()

    def on_timer(self, due_state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        fired_at = due_state[FIRED_TIMER_COLUMN].astype("int64")
        output = due_state[["k", "count"]].assign(fired_at_ms=fired_at)
        again = (due_state["count"] < 100).to_numpy()
        kept = due_state.assign(count=due_state["count"] + 100)
        kept = register_timer(kept, None, fired_at.to_numpy())[again]
        return kept.reset_index(drop=True), output


def restored_repeater(split: Any) -> Repeater:
    """A Repeater restored with the old query's next watermark 10 s, bootstrapping from
    ``split``, whose key group 0 holds r (count 1) with its timer at 5 s: due at the floor."""
    import pyarrow.parquet as pq

    operator = Repeater("k")
    operator.bind(["k"], StructType([StructField("k", StringType())]))
    directory = split / f"__so_key_group={0}"
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "part.parquet").exists():
        table = pa.table(
            {"k": ["r"], "count": [1], state_codec.TIMER_COLUMN: [5_000]},
            schema=operator.arrow_state_schema,
        )
        pq.write_table(table, str(directory / "part.parquet"))
    operator.bootstrap_directory = str(split)
    operator.restored_watermarks = (0, 10_000)
    return operator


@pytest.mark.xfail(
    strict=True,
    reason="OPEN (stateful_ops/base.py StatefulOperator._call, key-groups layout): restored"
    " and bootstrapping, a visit by bootstrap markers alone (or, restored, by rows"
    " without_late_rows drops) fires a timer on_timer re-registered at a time already"
    " reached, by the floored clock, in a batch whose watermark did not advance; the"
    " segment log (its TWS timer) and the uninterrupted query fire it at the next advance."
    " Fix: keep in the state row the watermark a re-armed timeout was set at and fire on"
    " such a visit only keys due by a watermark past it (or fire only restored keys on the"
    " first visit and re-arm otherwise)",
)
def test_a_restored_timer_reregistered_at_the_floor_fires_at_the_next_advance_on_both(
    tmp_path: Any,
) -> None:
    """Restored with the old query's next watermark 10 s (Spark's own starts at 0): r's
    timer (5 s) fires at the first visit on both layouts and on_timer re-registers it at
    5 s. The next batch (markers alone, Spark's watermark still behind the floor: no
    advance) must fire nothing: r fires again when the watermark advances (batch 2)."""
    markers = pd.DataFrame({"k": ["z"], MARKER_COLUMN: [True]})
    log_operator = restored_repeater(tmp_path)
    groups_operator = restored_repeater(tmp_path)
    handle = new_handle()
    group_state = EventTimeGroupState()

    def segment_log_batch(spark_watermark_ms: int, with_markers: bool) -> list[tuple[Any, ...]]:
        frames = iter([markers]) if with_markers else None
        out = []
        if frames is not None:
            out += list(
                segment_log_state.handle_rows(
                    log_operator, LAYOUT, handle, 0, frames, 1_000, spark_watermark_ms
                )
            )
        for at in [at for at in handle.timers.registered if at <= spark_watermark_ms]:
            out += list(
                segment_log_state.handle_rows(
                    log_operator, LAYOUT, handle, 0, None, 1_000, spark_watermark_ms
                )
            )
            if at in handle.timers.registered:
                handle.timers.deleteTimer(at)
        return sorted(tuple(row) for f in out for row in f.itertuples(index=False))

    def key_groups_batch(spark_watermark_ms: int, with_markers: bool) -> list[tuple[Any, ...]]:
        group_state.watermark_ms = spark_watermark_ms
        timeout = group_state.timeout_ms
        timed_out = timeout is not None and spark_watermark_ms > timeout
        if not with_markers and not timed_out:
            return []
        group_state.hasTimedOut = not with_markers
        group_state.timeout_ms = None  # Spark clears it on every call
        frames = iter([markers])
        out = list(groups_operator._call((0,), frames, group_state))  # type: ignore[arg-type]
        return sorted(tuple(row) for f in out for row in f.itertuples(index=False))

    batches = [(0, True), (0, True), (20_000, True)]
    expected = [[("r", 1, 5_000)], [], [("r", 101, 5_000)]]
    assert [segment_log_batch(*batch) for batch in batches] == expected
    assert [key_groups_batch(*batch) for batch in batches] == expected
