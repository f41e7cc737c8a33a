"""sessionize (output mode append): event-time session windows per key.

Per key, events closer than ``gap`` form a session ``[first event, last event + gap)``; a
session is emitted once the watermark reaches its end, and then removed from state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..base import DEFAULT_KEY_GROUPS, Clock, StatefulOperator
from ..initial_state import InitialState
from ..validation import duration_ms, require_event_time
from .shared import EVENT_US, long_field, refuse_name_clash


class Sessionize(StatefulOperator):
    """Event-time session windows per key, emitted when the watermark closes them."""

    name: ClassVar[str] = "sessionize"
    output_mode = "append"
    timeout = "event"
    state_fields: ClassVar[StructType] = StructType(
        [long_field("session_start_us"), long_field("session_end_us"), long_field("count")]
    )
    output_fields: ClassVar[StructType] = state_fields

    def __init__(
        self,
        key: str | Sequence[str],
        event_time: str,
        gap: object,
        key_groups: int = DEFAULT_KEY_GROUPS,
        initial_state: InitialState | None = None,
        name: str | None = None,
        state_layout: str = "key-groups",
    ) -> None:
        super().__init__(
            key,
            key_groups,
            initial_state=initial_state,
            name=name,
            state_layout=state_layout,
        )
        self.gap_us = duration_ms(self.name, "gap", gap) * 1000
        self.event_time = event_time

    def validate(self, df: DataFrame) -> None:
        require_event_time(self.name, df, self.event_time)
        refuse_name_clash(self.name, self.keys, ["session_start", "session_end", "count"])

    def prepare(self, df: DataFrame) -> DataFrame:
        # Spark refuses event-time timeouts unless the watermarked column reaches the operator.
        event_time = F.col(self.event_time)
        return df.select(*self.keys, event_time, F.unix_micros(event_time).alias(EVENT_US))

    def finish(self, df: DataFrame) -> DataFrame:
        return df.select(
            *self.keys,
            F.timestamp_micros("session_start_us").alias("session_start"),
            F.timestamp_micros("session_end_us").alias("session_end"),
            "count",
        )

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        keys = list(self.keys)
        events = rows[EVENT_US].astype("int64")
        intervals = rows[keys].assign(
            session_start_us=events, session_end_us=events + self.gap_us, count=1
        )
        sessions = merge_sessions(pd.concat([state, intervals], ignore_index=True), keys)
        if clock.watermark_ms is None:
            return sessions, self.empty_output()
        closed = (sessions["session_end_us"] <= clock.watermark_ms * 1000).to_numpy()
        return sessions[~closed], sessions[closed]

    def on_timeout(self, state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.update(self.fold(iter([])), state, clock)

    def wake_up_ms(self, state: pd.DataFrame, clock: Clock) -> int | None:
        return -(-int(state["session_end_us"].min()) // 1000)

    def log_key_columns(self) -> tuple[str, ...]:
        """A key's open sessions are disjoint, so their starts tell them apart (a merge that
        moves a start replaces the old session by the merged one in the segment log)."""
        return (*self.keys, "session_start_us")

    def keys_in(self, state: pd.DataFrame) -> int:
        """A key may hold several open sessions (one state row each)."""
        return len(state[list(self.keys)].drop_duplicates())


def merge_sessions(intervals: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Merge half-open intervals [session_start_us, session_end_us) that overlap, per key."""
    columns = [*keys, "session_start_us", "session_end_us", "count"]
    if not len(intervals):
        return intervals[columns]
    key_id = intervals.groupby(keys, dropna=False, sort=False).ngroup().rename("__so_kid")
    ordered = intervals.assign(__so_kid=key_id).sort_values(
        ["__so_kid", "session_start_us"], kind="stable"
    )
    reach = ordered.groupby("__so_kid")["session_end_us"].cummax()
    previous_reach = reach.groupby(ordered["__so_kid"]).shift()
    starts = previous_reach.isna() | (ordered["session_start_us"] >= previous_reach)
    session_id = starts.cumsum().to_numpy()
    spec = {k: (k, "first") for k in keys}
    spec.update(
        session_start_us=("session_start_us", "min"),
        session_end_us=("session_end_us", "max"),
        count=("count", "sum"),
    )
    merged = ordered.groupby(session_id, sort=True).agg(**spec).reset_index(drop=True)
    return merged[columns]


def sessionize(
    df: DataFrame,
    key: str | Sequence[str],
    event_time: str,
    gap: object,
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    initial_state: InitialState | None = None,
    name: str | None = None,
    state_layout: str = "key-groups",
) -> DataFrame:
    """Closed sessions per key: key column(s), ``session_start``, ``session_end``, ``count``.

    ``initial_state``, ``name``: as for ``running_count``.
    """
    return Sessionize(
        key,
        event_time,
        gap,
        key_groups=key_groups,
        initial_state=initial_state,
        name=name,
        state_layout=state_layout,
    ).apply(df)
