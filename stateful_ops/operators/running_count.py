"""running_count (output mode update): a running count per key, versioned.

One output row per key that received rows in the batch; ``version`` is the number of
batches in which the key received rows, so it grows by exactly one each time the key's
count changes. Rows are counted within each input partition first
(``partial_aggregation``), so one row per key and partition is shuffled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

from ..base import (
    DEFAULT_KEY_GROUPS,
    MARKER_COLUMN,
    TTL_EVENT_US_COLUMN,
    Clock,
    StatefulOperator,
    canonical,
)
from ..initial_state import InitialState
from .partial_aggregation import (
    NESTED_TYPES,
    PARTIAL_COUNT,
    partial_counts,
)
from .shared import NEW_ROWS, key_codes, long_field, next_versions, refuse_name_clash


class RunningCount(StatefulOperator):
    """Running count per key with a version that grows once per batch the key appears in."""

    name: ClassVar[str] = "running_count"
    state_fields: ClassVar[StructType] = StructType([long_field("count"), long_field("version")])
    output_fields: ClassVar[StructType] = state_fields
    output_mode = "update"

    def validate(self, df: DataFrame) -> None:
        refuse_name_clash(self.name, self.keys, ["count", "version"])

    def prepare(self, df: DataFrame) -> DataFrame:
        """Count rows per key within each input partition first (Spark's partial count).

        The stateless ``mapInArrow`` step shrinks what is shuffled, sorted and handed to
        pandas from one row per input row to one row per key and partition. Nested key types
        (which Arrow cannot group by) skip it. With ``ttl_time="event"`` each row also
        carries its key's latest event time (``TTL_EVENT_US_COLUMN``) and the watermark
        reaches the operator on ``watermark_carrier``.
        """
        event_column = TTL_EVENT_US_COLUMN if self.event_time_field is not None else None
        keys = df.select(*self.keys)
        if self.event_time_field is not None:
            event_time = F.col(self.event_time_field.name).cast("timestamp")
            keys = df.select(*self.keys, F.unix_micros(event_time).alias(TTL_EVENT_US_COLUMN))
        if any(isinstance(f.dataType, NESTED_TYPES) for f in keys.schema.fields):
            return self.with_watermark_carrier(keys)
        fields = [*keys.schema.fields[: len(self.keys)]]
        fields.append(StructField(PARTIAL_COUNT, LongType(), False))
        if event_column is not None:
            fields.append(StructField(event_column, LongType(), True))
        if self.emit_settings_markers:
            fields.append(StructField(MARKER_COLUMN, BooleanType(), False))
        count = partial_counts(
            list(self.keys), settings_marker=self.emit_settings_markers, event_column=event_column
        )
        return self.with_watermark_carrier(keys.mapInArrow(count, StructType(fields)))

    def with_watermark_carrier(self, prepared: DataFrame) -> DataFrame:
        if self.event_time_field is None:
            return prepared
        return prepared.select("*", self.watermark_carrier())

    def fold(self, frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
        """Partial counts are passed on as they are (one row per key and input partition):
        ``update`` sums a key's rows, so a second group-by here would only cost time."""
        if PARTIAL_COUNT not in self.input_schema.names:
            return super().fold(frames)
        columns = [*self.keys, PARTIAL_COUNT]
        if TTL_EVENT_US_COLUMN in self.input_schema.names:
            columns.append(TTL_EVENT_US_COLUMN)
        parts = [frame[columns] for frame in frames if len(frame)]
        if not parts:
            return super().fold(iter([]))
        rows = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
        rows = canonical(rows, self.key_schema.fields)
        return rows.rename(columns={PARTIAL_COUNT: NEW_ROWS})

    def pre_aggregate(self, rows: pd.DataFrame) -> pd.DataFrame:
        grouped = rows.groupby(list(self.keys), dropna=False, sort=False)
        counts = grouped[PARTIAL_COUNT].sum() if PARTIAL_COUNT in rows else grouped.size()
        counts = counts.rename(NEW_ROWS).reset_index()
        if TTL_EVENT_US_COLUMN in rows:
            latest = grouped[TTL_EVENT_US_COLUMN].max().reset_index(drop=True)
            counts[TTL_EVENT_US_COLUMN] = latest.to_numpy()
        return counts

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Stored keys keep their order, new keys follow in order of arrival; ``rows`` may
        hold a key more than once (once per input partition)."""
        keys = list(self.keys)
        both = pd.concat([state[keys], rows[keys]], ignore_index=True)
        codes, firsts = key_codes(both, keys)
        stored = len(state)
        new_rows = np.bincount(
            codes[stored:],
            weights=rows[NEW_ROWS].to_numpy(dtype=np.float64),
            minlength=len(firsts),
        ).astype(np.int64)  # float64 sums are exact below 2**53 rows
        count = np.zeros(len(firsts), dtype=np.int64)
        version = np.zeros(len(firsts), dtype=np.int64)
        count[codes[:stored]] = state["count"].to_numpy(dtype=np.int64)
        version[codes[:stored]] = state["version"].to_numpy(dtype=np.int64)
        changed = new_rows > 0
        new_state = both.iloc[firsts].reset_index(drop=True)
        new_state["count"] = count + new_rows
        new_state["version"] = next_versions(
            version, changed, self.ttl_ms, clock.processing_time_ms
        )
        return new_state, new_state[changed]


def running_count(
    df: DataFrame,
    key: str | Sequence[str],
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    output_mode: str = "update",
    initial_state: InitialState | None = None,
    name: str | None = None,
    ttl: object | None = None,
    ttl_time: str = "processing",
    state_layout: str = "key-groups",
    checkpoint_location: str | None = None,
) -> DataFrame:
    """Key column(s), ``count`` and ``version`` per key changed in the batch.

    ``output_mode`` must match the query's: ``"update"`` (default) for Spark's own sinks,
    ``"append"`` for Python data source sinks such as 2pc-jdbc and 2pc-s3, which Spark
    runs in Append mode only. The emitted rows are the same in both: each is one
    (key, count, version) fact that is never retracted.

    ``initial_state``: per-key state to start from, from a savepoint
    (``RestoredCheckpoint(checkpointLocation).initial_state()``, or by name
    ``.initial_states([...])[name]``; see ``initial_state``).

    ``name``: the operator's stable name (Flink's uid), 1 to 128 characters of
    ``[A-Za-z0-9_.-]``, unique within the query: a savepoint records it and a restore maps
    state by it, wherever the operator sits in the new query. Omitted (default), the
    operator is unnamed and its state maps by position (Spark's operator id), as before.
    See docs/stateful-operators.md, Operator names.

    ``ttl`` (a duration: ``"30 minutes"`` or a ``timedelta``): forget a key that received
    no row for that long in processing time (the batches' timestamps); it then counts from
    1 again if it comes back. With ttl a key's version starts at its first batch's
    timestamp (ms) and grows by one per batch, so it keeps growing across the key's lives
    and a sink with ``versionColumn=version`` takes a new life's rows. Unset (default):
    keys are kept forever, and versions start at 1.

    ``ttl_time``: ``"processing"`` (default, as above) or ``"event"``: a key expires once
    the watermark reaches its latest event time plus ``ttl`` (the event time is the input's
    watermarked column; ``withWatermark`` is required). Rows behind the watermark still
    count, as without ttl.

    ``state_layout``: ``"key-groups"`` (default) or ``"segment-log"`` (opt-in, RocksDB
    only: a batch writes only the keys it changed). See docs/stateful-operators.md, "The
    segment log".

    ``checkpoint_location``: the query's ``checkpointLocation``, optional. Given, a restart
    that turns ``ttl`` on or off for that checkpoint is refused here, before the query
    starts, in one line naming ttl and the fix (Spark refuses it in its first batch with a
    multi-line error that names no setting of this operator); see ``restart_check``.
    """
    return RunningCount(
        key,
        key_groups=key_groups,
        output_mode=output_mode,
        initial_state=initial_state,
        name=name,
        ttl=ttl,
        ttl_time=ttl_time,
        state_layout=state_layout,
        checkpoint_location=checkpoint_location,
    ).apply(df)
