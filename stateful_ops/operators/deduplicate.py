"""deduplicate (output mode append): the first row of a key, its repeats dropped while remembered.

Processing time: a key is remembered until ``ttl`` after the batch that emitted it. Event
time: until the watermark reaches the emitted row's event time + ``ttl``. Expired keys are
removed from state (GroupState timeouts wake idle groups up).
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
from ..state_codec import EXPIRY_CLOCK
from ..validation import duration_ms, require_event_time
from .shared import EVENT_US, key_codes, long_field

_KEY_CODE = "__so_key_code"


class Deduplicate(StatefulOperator):
    """Emit the first row of each key; drop its repeats while the key is remembered."""

    name: ClassVar[str] = "deduplicate"
    output_mode = "append"

    def __init__(
        self,
        key: str | Sequence[str],
        ttl: object,
        event_time: str | None = None,
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
        self.ttl_us = duration_ms(self.name, "ttl", ttl) * 1000
        self.event_time = event_time
        self.timeout = "event" if event_time is not None else "processing"
        self.columns: list[str] = []

    def validate(self, df: DataFrame) -> None:
        if self.event_time is not None:
            require_event_time(self.name, df, self.event_time)
        self.columns = list(df.columns)

    def prepare(self, df: DataFrame) -> DataFrame:
        if self.event_time is None:
            return df
        return df.withColumn(EVENT_US, F.unix_micros(F.col(self.event_time)))

    def state_schema_for(self, input_schema: StructType) -> StructType:
        return StructType([*self.key_schema.fields, long_field("expires_at_us")])

    def bind(self, keys: Sequence[str], input_schema: StructType) -> None:
        """The state's metadata also records the clock of ``expires_at_us`` (a checked
        setting: a restart or a restore with ``event_time`` switched is refused)."""
        super().bind(keys, input_schema)
        metadata = {**(self.arrow_state_schema.metadata or {}), EXPIRY_CLOCK: self.timeout.encode()}
        self.arrow_state_schema = self.arrow_state_schema.with_metadata(metadata)

    def output_schema_for(self, input_schema: StructType) -> StructType:
        return StructType([f for f in input_schema.fields if f.name != EVENT_US])

    def _now_us(self, clock: Clock) -> int | None:
        if self.event_time is None:
            return clock.processing_time_ms * 1000
        return None if clock.watermark_ms is None else clock.watermark_ms * 1000

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        keys = list(self.keys)
        now_us = self._now_us(clock)
        live = state if now_us is None else state[state["expires_at_us"] > now_us]
        if not len(rows):
            return live, self.empty_output()
        # Keys numbered by first appearance, live keys first: a row's key is remembered
        # exactly when its number is below len(live).
        codes, _ = key_codes(pd.concat([live[keys], rows[keys]], ignore_index=True), keys)
        row_codes = codes[len(live) :]
        unseen = row_codes >= len(live)
        fresh = rows[unseen].assign(**{_KEY_CODE: row_codes[unseen]})
        if self.event_time is not None:
            fresh = fresh.sort_values(EVENT_US, kind="stable")
            expires = fresh[EVENT_US] + self.ttl_us
        else:
            expires = pd.Series(clock.processing_time_ms * 1000 + self.ttl_us, index=fresh.index)
        first = ~fresh[_KEY_CODE].duplicated(keep="first")
        emitted = fresh[first.to_numpy()]
        remembered = emitted[keys].assign(expires_at_us=expires[first.to_numpy()].astype("int64"))
        new_state = pd.concat([live, remembered], ignore_index=True)
        return new_state, emitted[list(self.out_schema.names)]

    def on_timeout(self, state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.update(self.fold(iter([])), state, clock)

    def wake_up_ms(self, state: pd.DataFrame, clock: Clock) -> int | None:
        return -(-int(state["expires_at_us"].min()) // 1000)


def deduplicate(
    df: DataFrame,
    key: str | Sequence[str],
    ttl: object,
    event_time: str | None = None,
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    initial_state: InitialState | None = None,
    name: str | None = None,
    state_layout: str = "key-groups",
) -> DataFrame:
    """First row per key within ``ttl`` (processing time, or event time with a watermark).

    ``initial_state``, ``name``: as for ``running_count``.
    """
    return Deduplicate(
        key,
        ttl,
        event_time,
        key_groups=key_groups,
        initial_state=initial_state,
        name=name,
        state_layout=state_layout,
    ).apply(df)
