"""Event time on the segment log (``state_layout="segment-log"``): every operator with
event-time timeouts emits, batch by batch, what the key-groups layout emits on the same
input, across a restart and a replayed batch, with Spark's late rows dropped alike.

The segment log runs TWS in "EventTime" mode with one event-time timer per key group
(``segment_log_state.set_timer``); the key-groups layout runs GroupState's
EventTimeTimeout. The batches below move the watermark (5 s behind the latest event) so
that keys expire, timers fire and sessions close in key groups with and without rows, and
three rows arrive behind the watermark (Spark drops them before an event-time operator;
running_count and running_aggregate still count them, through their watermark carrier).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from eospack.lab.testing import session_settings
from eospack.stateful_ops import (
    deduplicate,
    read_state,
    running_aggregate,
    running_count,
    sessionize,
)
from eospack.stateful_ops.state_store import state_store_conf
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    batch_timestamp_ms,
    countdown,
    run,
    source,
    with_watermark,
    write_batch,
)

ROCKSDB = state_store_conf("rocksdb")

# (key, event second after T0, n): n sets countdown's timer n seconds after the event
# (0 deletes it). A batch is clocked with the watermark of the batches before it (their
# latest event minus 5 s); Spark drops the rows at or behind the previous batch's.
EVENTS: list[list[tuple[str, int, int]]] = [
    [("a", 0, 1), ("b", 2, 1), ("a", 1, 1), ("c", 3, 2), ("e", 6, 1)],
    # watermark T0+1 s: nothing late; b gets a second open session, e's moves its start
    [("c", 16, 1), ("a", 4, 1), ("h", 5, 0), ("b", 14, 1), ("e", 2, 1)],
    # watermark T0+11 s, late at or behind T0+1 s: b@1
    [("d", 17, 1), ("b", 1, 1), ("a", 12, 3)],
    # watermark T0+12 s, late at or behind T0+11 s: c@10
    [("e", 40, 1), ("c", 10, 1), ("g", 13, 1)],
    # watermark T0+35 s, late at or behind T0+12 s: f@12
    [("e", 41, 2), ("f", 12, 1), ("g", 36, 1)],
]
LATE_KEYS_ONLY = {"f"}  # keys whose every row is late: no event-time operator sees them

Build = Callable[[DataFrame, str], DataFrame]
CASES: dict[str, tuple[Build, str]] = {
    "running_count_ttl_event": (
        lambda df, layout: running_count(
            df, "k", key_groups=4, ttl="10 seconds", ttl_time="event", state_layout=layout
        ),
        "update",
    ),
    "running_aggregate_ttl_event": (
        lambda df, layout: running_aggregate(
            df,
            "k",
            {"v": ["sum", "max"]},
            key_groups=4,
            ttl="10 seconds",
            ttl_time="event",
            state_layout=layout,
        ),
        "update",
    ),
    "timers_event": (
        lambda df, layout: countdown("event")("k", key_groups=4, state_layout=layout).apply(df),
        "update",
    ),
    "deduplicate_event_time": (
        lambda df, layout: deduplicate(
            df, "k", "10 seconds", event_time="ts", key_groups=4, state_layout=layout
        ),
        "append",
    ),
    "sessionize": (
        lambda df, layout: sessionize(
            df, "k", "ts", "5 seconds", key_groups=4, state_layout=layout
        ),
        "append",
    ),
}


def write_events(directory: str, indexes: range) -> None:
    for index in indexes:
        rows = [
            {"k": key, "n": n, "v": second / 2, "t": T0 + second}
            for key, second, n in EVENTS[index]
        ]
        write_batch(directory, index, rows)


def query(spark: SparkSession, directory: str, case: str, layout: str) -> tuple[DataFrame, str]:
    build, mode = CASES[case]
    return build(with_watermark(source(spark, directory)), layout), mode


def uninterrupted_key_groups(spark: SparkSession, root: str, case: str) -> Emitted:
    directory, checkpoint = os.path.join(root, "kg-input"), os.path.join(root, "kg-cp")
    os.makedirs(directory)
    write_events(directory, range(len(EVENTS)))
    sink = Emitted()
    result, mode = query(spark, directory, case, "key-groups")
    run(result, checkpoint, mode, sink)
    return sink


def interrupted_segment_log(spark: SparkSession, root: str, case: str) -> Emitted:
    """Batches 0-1, batch 1's commit forgotten (a crash between the state commit and the
    commit log), then the rest on the same checkpoint: batch 1 replays."""
    directory, checkpoint = os.path.join(root, "sl-input"), os.path.join(root, "sl-cp")
    os.makedirs(directory)
    sink = Emitted()
    write_events(directory, range(2))
    result, mode = query(spark, directory, case, "segment-log")
    run(result, checkpoint, mode, sink)
    for name in ("1", ".1.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    write_events(directory, range(2, len(EVENTS)))
    result, mode = query(spark, directory, case, "segment-log")
    run(result, checkpoint, mode, sink)
    return sink


def state_rows(spark: SparkSession, checkpoint: str) -> list[str]:
    """The folded state, each row as text, batch timestamps as in ``by_batch``."""
    state = read_state(spark, checkpoint).round(9)
    rows = [tuple(row) for row in state.astype(object).itertuples(index=False)]
    return sorted(map(repr, by_batch([(0, rows)], checkpoint)[0][1]))


def by_batch(emitted: list[Any], checkpoint: str) -> list[Any]:
    """``emitted`` with each value within 1000 at or after a batch's timestamp (a ttl
    key's version: its life's first batch timestamp, plus one per later batch with its
    rows) as ``<batch i>+d`` of the latest such batch: the two runs' batches have their
    own processing times (a version grows by a few per batch; batches are ms apart)."""
    stamps = [batch_timestamp_ms(checkpoint, i) for i in range(len(EVENTS))]

    def plain(value: Any) -> Any:
        if not isinstance(value, int):
            return value
        near = [i for i, stamp in enumerate(stamps) if 0 <= value - stamp < 1000]
        if not near:
            return value
        index = max(near, key=lambda i: stamps[i])
        return f"<batch {index}>+{value - stamps[index]}"

    return [(batch_id, [tuple(map(plain, row)) for row in rows]) for batch_id, rows in emitted]


@pytest.mark.chaos
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", sorted(CASES))
def test_event_time_on_the_segment_log_equals_key_groups_across_restart_and_replay(
    spark: SparkSession, tmp_path: Any, case: str
) -> None:
    root = str(tmp_path)
    with session_settings(spark, {**ROCKSDB, NO_DATA_BATCHES: "false"}):
        actual = interrupted_segment_log(spark, root, case)
        expected = uninterrupted_key_groups(spark, root, case)
        actual_state = state_rows(spark, os.path.join(root, "sl-cp"))
        expected_state = state_rows(spark, os.path.join(root, "kg-cp"))

    replays = [rows for batch_id, rows in actual.attempts if batch_id == 1]
    assert len(replays) == 2
    assert replays[0] == replays[1]
    assert [batch_id for batch_id, _ in actual.final()] == list(range(len(EVENTS)))
    assert by_batch(actual.final(), os.path.join(root, "sl-cp")) == by_batch(
        expected.final(), os.path.join(root, "kg-cp")
    )
    assert actual_state == expected_state
    # The comparison has teeth: time moved something after batch 1 ...
    assert any(rows for batch_id, rows in expected.final() if batch_id >= 2)
    if case in ("deduplicate_event_time", "sessionize", "timers_event"):
        # ... and late rows were dropped before the operator, on both layouts.
        emitted_keys = {row[0] for _, rows in expected.final() for row in rows}
        assert not emitted_keys & LATE_KEYS_ONLY, emitted_keys


@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["timers_event", "sessionize"])
def test_event_time_fires_in_no_data_batches_as_on_key_groups(
    spark: SparkSession, tmp_path: Any, case: str
) -> None:
    """With no-data batches on, the watermark's last advance runs a batch without rows on
    both layouts: the same batches, the same rows."""
    emitted = {}
    for layout in ("key-groups", "segment-log"):
        directory = str(tmp_path / f"{layout}-input")
        os.makedirs(directory)
        write_events(directory, range(len(EVENTS)))
        sink = Emitted()
        with session_settings(spark, {**ROCKSDB, NO_DATA_BATCHES: "true"}):
            result, mode = query(spark, directory, case, layout)
            run(result, str(tmp_path / f"{layout}-cp"), mode, sink)
        emitted[layout] = sink.final()
    assert len(emitted["key-groups"]) > len(EVENTS)  # a no-data batch ran
    assert emitted["segment-log"] == emitted["key-groups"]
