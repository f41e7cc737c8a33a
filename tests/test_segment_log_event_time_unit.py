"""Event time on the segment log without Spark: ``segment_log_state.handle_rows`` with
TWS's event-time timer rules (a timer fires, after the batch's rows, once the watermark
reaches it: checked on Spark 4.0.5, 4.1.4 and 4.3.0) against the key-groups layout's
``_call`` with GroupState's (a timeout fires in a call without rows once the watermark
is past it; every call clears it), on the same random batches. Both must emit the same
rows in the same batches and hold the same state.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from eospack.stateful_ops import StatefulOperator, segment_log_state, state_codec
from eospack.stateful_ops.base import (
    EVENT_TIME_COLUMN,
    WATERMARK_METADATA_KEY,
)
from eospack.stateful_ops.operators.deduplicate import Deduplicate
from eospack.stateful_ops.operators.sessionize import Sessionize
from eospack.stateful_ops.operators.shared import EVENT_US
from eospack.stateful_ops.segment_log import fold
from tests.state_handle_fakes import LAYOUT, EventTimeGroupState, ListState, Timers

INPUT = StructType(
    [
        StructField("k", StringType()),
        StructField("ts", TimestampType()),
        StructField(EVENT_US, LongType()),
    ]
)


def sessionize() -> StatefulOperator:
    operator = Sessionize("k", "ts", "5 seconds")
    operator.bind(["k"], INPUT)
    return operator


def deduplicate() -> StatefulOperator:
    operator = Deduplicate("k", "5 seconds", event_time="ts")
    operator.bind(["k"], INPUT)
    return operator


def events(rng: random.Random, low_s: int) -> pd.DataFrame:
    """A few rows after ``low_s`` (none behind the watermark: Spark drops those first)."""
    seconds = [low_s + rng.randint(1, 12) for _ in range(rng.randint(0, 4))]
    keys = [rng.choice(["a", "b", None]) for _ in seconds]
    ts = pd.to_datetime([s * 1_000_000_000 for s in seconds]).astype("datetime64[ns]")
    return pd.DataFrame({"k": keys, "ts": ts, EVENT_US: [s * 1_000_000 for s in seconds]})


def out_rows(frames: Iterator[pd.DataFrame], operator: StatefulOperator) -> list[str]:
    columns = list(operator.out_schema.names)
    return sorted(repr(tuple(row)) for f in frames for row in f[columns].itertuples(index=False))


def state_rows(table: pd.DataFrame) -> list[str]:
    return sorted(repr(tuple(row)) for row in table.astype(object).itertuples(index=False))


@pytest.mark.parametrize("make", [sessionize, deduplicate], ids=["sessionize", "deduplicate"])
@pytest.mark.parametrize("seed", [41, 4141, 414141])
def test_event_time_on_the_segment_log_equals_key_groups(make: Any, seed: int) -> None:
    """Failed before the fix: sessionize's log kept one session per key (a key with two
    open sessions lost one), and no event-time timer was registered."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    log_operator, groups_operator = make(), make()
    handle = SimpleNamespace(log=ListState(), timers=Timers(), settings=None)
    group_state = EventTimeGroupState()
    latest_s, watermark_ms = 0, 0
    for batch in range(30):
        rows = events(rng, watermark_ms // 1000)
        if len(rows):
            latest_s = max(latest_s, int(rows[EVENT_US].max()) // 1_000_000)
        frames = [rows] if len(rows) else None

        # The segment log: the group's rows, then its timer if the watermark is past it.
        log_out: list[str] = []
        if frames is not None:
            log_out += out_rows(
                segment_log_state.handle_rows(
                    log_operator, LAYOUT, handle, 0, iter(frames), 1_000, watermark_ms
                ),
                log_operator,
            )
        fired = [at for at in handle.timers.registered if at <= watermark_ms]
        assert len(handle.timers.registered) <= 1
        for at in fired:
            log_out += out_rows(
                segment_log_state.handle_rows(
                    log_operator, LAYOUT, handle, 0, None, 1_000, watermark_ms
                ),
                log_operator,
            )
            if at in handle.timers.registered:  # pyspark deletes the fired timer after
                handle.timers.deleteTimer(at)
        log_out.sort()

        # The key-groups layout: a call with the rows, or a timed-out call without.
        group_state.watermark_ms = watermark_ms
        groups_out: list[str] = []
        timed_out = group_state.timeout_ms is not None and watermark_ms > group_state.timeout_ms
        if frames is not None or timed_out:
            group_state.hasTimedOut = frames is None
            group_state.timeout_ms = None  # Spark clears it on every call
            groups_out = out_rows(
                groups_operator._call((0,), iter(frames or [rows]), group_state),  # type: ignore[arg-type]
                groups_operator,
            )
        assert log_out == groups_out, (batch, watermark_ms)

        live = (
            fold(
                segment_log_state.read_log(log_operator, handle.log.get())[0],
                list(log_operator.log_key_columns()),
            ).to_pandas()
            if handle.log.exists()
            else log_operator.empty_state()
        )
        held = (
            state_codec.decode(log_operator.name, group_state.get, log_operator.arrow_state_schema)
            if group_state.exists
            else log_operator.empty_state()
        )
        assert state_rows(live) == state_rows(held), batch
        # The event-time timer fires in the batches GroupState's timeout fires in: TWS
        # fires at the watermark, GroupState strictly past its timeout.
        assert handle.timers.registered == (
            [] if group_state.timeout_ms is None else [group_state.timeout_ms + 1]
        )
        watermark_ms = max(watermark_ms, (latest_s - rng.randint(0, 6)) * 1000)


def test_a_restored_event_time_query_drops_the_old_querys_late_rows_on_both_layouts() -> None:
    """Restored from a savepoint whose next batch watermark is 12 s, a row at 11 s is one
    the old query would have dropped: both layouts drop it (before the fix the segment log
    counted it), a row at 13 s goes through."""
    watermarked = StructType(
        [
            StructField("k", StringType()),
            StructField("ts", TimestampType(), metadata={WATERMARK_METADATA_KEY: 5_000}),
            StructField(EVENT_US, LongType()),
        ]
    )
    seconds = {"late": 11, "kept": 13}
    rows = pd.DataFrame(
        {
            "k": list(seconds),
            "ts": pd.to_datetime([s * 1_000_000_000 for s in seconds.values()]),
            EVENT_US: [s * 1_000_000 for s in seconds.values()],
            EVENT_TIME_COLUMN: [s * 1_000_000 for s in seconds.values()],
        }
    )
    outputs = {}
    for layout in ("segment-log", "key-groups"):
        operator = Deduplicate("k", "5 seconds", event_time="ts", state_layout=layout)
        operator.bind(["k"], watermarked)
        operator.restored_watermarks = (10_000, 12_000)
        if layout == "segment-log":
            handle = SimpleNamespace(log=ListState(), timers=Timers(), settings=None)
            frames = segment_log_state.handle_rows(
                operator, LAYOUT, handle, 0, iter([rows.copy()]), 1_000, 12_000
            )
        else:
            group_state = EventTimeGroupState()
            group_state.watermark_ms = 12_000
            frames = operator._call((0,), iter([rows.copy()]), group_state)  # type: ignore[arg-type]
        outputs[layout] = sorted(key for frame in frames for key in frame["k"])
    assert outputs == {"segment-log": ["kept"], "key-groups": ["kept"]}
