"""StatefulOperator: keyed state on applyInPandasWithState, grouped into Flink-style key groups.

Why key groups: a one-call-per-key ``applyInPandasWithState`` pays a Python call, a pandas
frame and a state row per key per batch, which runs at about a tenth of Spark's built-in
count. Here each row is assigned to one of ``key_groups`` buckets by
``pmod(xxhash64(key), key_groups)``; Spark groups by the bucket, and the bucket's keys share
ONE state row holding a typed Arrow table with one row per key (see ``state_codec``). An
operator sees all rows and all stored keys of a bucket at once and updates them with
vectorised pandas. The per-key contract is kept: output rows, versions and expiry are per key.

Guarantees: Spark commits the group state rows at the end of every micro-batch (the batch
barrier), so after a restart every key's state equals the state at the last committed batch,
and a replayed batch (same batch id, same offsets, same batch timestamp and watermark)
produces the same output, provided the operator's ``update`` is deterministic.
Fixed settings: ``key_groups`` and the key columns (names, order, types) decide which state
row holds a key, so they are part of the checkpoint. They are stored in every state row's Arrow
schema (with the state fields) and, because a bucket without state cannot know what it should
have held, also in a reserved settings bucket (``SETTINGS_KEY_GROUP``) that every batch with
input rows visits: one settings marker row per input partition is routed there (a
Chandy-Lamport marker in spirit). A restart with another ``key_groups``, other key columns or
another state schema therefore fails the first batch with input rows, whichever keys it holds,
in the stateful stage, which runs before the sink's batch commit. Markers never reach
``update``, ``on_timeout`` or the output. A checkpoint written before settings markers existed
has no settings row; its first batch with rows records the settings of the restarted query.
Starting from given state (``initial_state``, a savepoint's keys): see ``initial_state``;
restored with the old query's watermarks, an operator with event-time timeouts clocks every
batch with at least the old query's next watermark and drops the rows the old query would
have dropped as late (Spark drops late rows before no other stateful operator).
A call that receives no data row (only bootstrap markers, or only late rows) is a visit
without data, as Spark's: it expires what is due and otherwise changes nothing.
Limits: each batch rewrites the whole state row of every bucket that received rows, so
snapshot size grows with keys per bucket (``state_layout="segment-log"`` writes only the
changed keys: ``segment_log_state``; docs/stateful-operators.md has figures).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import (
    BooleanType,
    DataType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eospack.core.metrics import RECORDER
from eospack.core.spark_features import ARROW_UDF, arrow_type_utc

from . import segment_log_state, state_codec
from .errors import OperatorDefinitionError
from .initial_state import (
    InitialState,
    bootstrap_needed,
    load_key_group,
    split_by_key_group,
)
from .operators.shared import key_codes
from .restart_check import refuse_timeout_switch
from .state_codec import EXPIRES_COLUMN, TIMER_COLUMN
from .validation import (
    INTEGRAL_TYPES,
    OPERATOR_NAME_METADATA_KEY,
    WATERMARK_METADATA_KEY,
    duration_ms,
    key_columns,
    operator_name,
)

# Spark's applyInPandasWithState worker pads its output with an all-NA frame before a
# pd.concat, and pandas 2.x warns about that on every call: harmless noise from Spark's own
# code (pyspark/worker.py), printed once per stateful micro-batch. Only that warning, from
# that module, is silenced, in the worker processes that run these operators.
warnings.filterwarnings(
    "ignore",
    message="The behavior of DataFrame concatenation with empty or all-NA entries",
    category=FutureWarning,
    module="pyspark.worker",
)

DEFAULT_KEY_GROUPS = 8
KEY_GROUP_COLUMN = "__so_key_group"
# In the frame ``on_timer`` receives: the time (ms) each key's timer was due at.
FIRED_TIMER_COLUMN = "__so_fired_timer_ms"
# With ttl_time="event": each row's (or partial row's) latest event time in microseconds.
TTL_EVENT_US_COLUMN = "__so_ttl_event_us"
TTL_TIMES = ("processing", "event")
# Boolean column of prepared rows: true for a settings marker, false for a data row.
MARKER_COLUMN = "__so_settings_marker"
# Restored with a watermark: each row's watermarked event time in microseconds.
EVENT_TIME_COLUMN = "__so_event_time_us"
# The local property Spark sets on a micro-batch's jobs (MicroBatchExecution.BATCH_ID_KEY).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# The query's id (StreamExecution.QUERY_ID_KEY): stable across restarts of a checkpoint.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Key group of the settings markers; data rows get pmod(...) >= 0, so it never holds keys.
SETTINGS_KEY_GROUP = -1
# 2262-01-01 UTC, shortly before the last instant pandas holds: a marker's event time, never
# behind the watermark, and still convertible when the marker reaches pandas.
_NEVER_LATE_US = 9_214_646_400_000_000

# Where a key group's state lives: one GroupState row ("key-groups", the default, which
# existing checkpoints hold), or a transformWithStateInPandas ListState of Arrow segments
# ("segment-log", opt-in: see segment_log_state).
STATE_LAYOUTS = ("key-groups", "segment-log")

_TIMEOUTS = {
    "none": GroupStateTimeout.NoTimeout,
    "processing": GroupStateTimeout.ProcessingTimeTimeout,
    "event": GroupStateTimeout.EventTimeTimeout,
}


@dataclass(frozen=True)
class Clock:
    """Time as seen by one call: constant for a batch and identical when the batch replays."""

    processing_time_ms: int
    watermark_ms: int | None


def arrow_field(field: StructField) -> pa.Field:
    """Arrow type used to store a Spark column in state (timestamps kept tz-naive, as pandas)."""
    arrow_type = arrow_type_utc(field.dataType)
    if pa.types.is_timestamp(arrow_type):
        arrow_type = pa.timestamp("us")
    return pa.field(field.name, arrow_type, nullable=True)


def canonical(frame: pd.DataFrame, fields: Sequence[StructField]) -> pd.DataFrame:
    """Give columns one pandas dtype whatever their nulls, so stored and new keys compare equal.

    Spark hands an integer column with nulls to pandas as float64 and without nulls as int64;
    both become nullable Int64 here (and booleans nullable boolean), which also keeps sums
    of integers exact. Timestamps read back from Arrow state (microseconds) become
    datetime64[ns] like Spark's input.
    """
    changes: dict[str, pd.Series] = {}
    for field in fields:
        column = frame[field.name]
        if isinstance(field.dataType, INTEGRAL_TYPES):
            if column.dtype != "Int64":
                changes[field.name] = column.astype("Int64")
        elif isinstance(field.dataType, BooleanType):
            if column.dtype != "boolean":
                changes[field.name] = column.astype("boolean")
        elif isinstance(field.dataType, (TimestampType, TimestampNTZType)):
            if column.dtype != "datetime64[ns]":
                changes[field.name] = column.astype("datetime64[ns]")
        elif isinstance(field.dataType, StringType) and column.hasnans:
            column = column.astype(object)
            changes[field.name] = column.where(column.notna(), None)
    return frame.assign(**changes) if changes else frame


class StatefulOperator:
    """Base of keyed stateful operators, vectorised over the keys of a key group.

    A subclass declares ``name``, ``state_fields`` (DDL of the per-key state after the key
    columns), ``output_fields`` (DDL of the output after the key columns), ``output_mode``
    and ``timeout`` ("none", "processing" or "event"), and implements

    - ``update(rows, state, clock) -> (new_state, output)``: ``rows`` holds this batch's rows
      of the bucket (all frames of the iterator, folded through ``pre_aggregate``), ``state``
      one row per stored key (key columns plus ``state_fields``). Return the full new state
      table (keys absent from it are forgotten) and the rows to emit.
    - ``on_timeout(state, clock) -> (new_state, output)``: called when the bucket's timeout
      fired and it received no rows; default keeps the state and emits nothing.
    - ``wake_up_ms(state, clock) -> int | None``: the earliest time (processing time, or
      event time compared with the watermark) at which some key must be looked at again.
    - ``on_timer(due_state, clock) -> (new_state_of_those_keys, output)``: with ``timers``
      ("processing" or "event"), called with exactly the keys whose timer is due; see
      ``fire_timers`` for the per-key timer contract and ``register_timer`` /
      ``delete_timer`` for setting timers from ``update`` and ``on_timer``.

    The base class owns key-group assignment, GroupState timeouts, schema strings, the state
    encoding and pandas conversion. Rows reaching ``update`` keep their key and value columns
    (integers as nullable Int64, booleans as nullable boolean).

    ``state_layout``: "key-groups" (default) keeps a key group's keys in one GroupState
    row, rewritten whenever one of its keys changes; "segment-log" (opt-in, RocksDB only)
    appends only the changed keys to a ListState (``segment_log_state``). The layout is
    part of the checkpoint: restart a checkpoint with the layout it was written with.

    ``checkpoint_location`` (optional): the query's ``checkpointLocation``; given (or known
    from a restored ``initial_state``), ``apply`` refuses ttl or timers turned on or off
    for that checkpoint in one line before the query starts (``restart_check``), where
    Spark would fail the first batch with a multi-line error naming no setting of ours.

    ``name`` (the constructor argument, kept as ``operator_name``; the class attribute
    ``name`` is the operator's kind) is the operator's stable name, Flink's uid: stored in
    every state row it writes (Arrow metadata ``operator_name``), listed by ``savepoint
    create``, and what ``RestoredCheckpoint.initial_states`` maps a savepoint's state by,
    whatever the operator's position in the query. Omitted (None, the default), the
    operator is unnamed and maps by position (Spark's operator id) as before names
    existed. A name is not checked against a running checkpoint's state: Spark addresses
    that state by position, so renaming an operator between restarts of one checkpoint
    only relabels it (its settings row takes the new name at the next batch with rows).
    """

    name: ClassVar[str] = "stateful_operator"
    state_fields: ClassVar[str | StructType] = ""
    output_fields: ClassVar[str | StructType] = ""
    output_mode: str = "update"
    timeout: str = "none"
    timers: str = "none"

    def __init__(
        self,
        key: str | Sequence[str],
        key_groups: int = DEFAULT_KEY_GROUPS,
        output_mode: str | None = None,
        initial_state: InitialState | None = None,
        name: str | None = None,
        ttl: object | None = None,
        ttl_time: str = "processing",
        state_layout: str = "key-groups",
        checkpoint_location: str | None = None,
    ) -> None:
        self.operator_name = operator_name(self.name, name)
        self.checkpoint_location = checkpoint_location
        if state_layout not in STATE_LAYOUTS:
            raise OperatorDefinitionError(
                f"{self.name}: state_layout={state_layout!r}; use 'key-groups' (the default)"
                " or 'segment-log'"
            )
        self.state_layout = state_layout
        if output_mode is not None:
            if output_mode not in ("update", "append"):
                raise OperatorDefinitionError(
                    f"{self.name}: output_mode={output_mode!r}; use 'update' or 'append'"
                )
            self.output_mode = output_mode
        if not isinstance(key_groups, int) or key_groups <= 0:
            raise OperatorDefinitionError(
                f"{self.name}: key_groups={key_groups!r} must be a positive integer"
            )
        if self.timeout not in _TIMEOUTS:
            raise OperatorDefinitionError(
                f"{self.name}: timeout={self.timeout!r}; use one of {', '.join(_TIMEOUTS)}"
            )
        if initial_state is not None and not isinstance(initial_state, InitialState):
            raise OperatorDefinitionError(
                f"{self.name}: initial_state={initial_state!r}; pass"
                " RestoredCheckpoint(checkpointLocation).initial_state() or None"
            )
        restored_name = initial_state.operator_name if initial_state is not None else None
        if restored_name is not None and restored_name != self.operator_name:
            if self.operator_name is None:
                raise OperatorDefinitionError(
                    f"{self.name}: initial_state holds the state of operator"
                    f" {restored_name!r}, this operator has no name; give it"
                    f" name={restored_name!r} and pass"
                    f" restored.initial_states([...])[{restored_name!r}]"
                )
            raise OperatorDefinitionError(
                f"{self.name}: initial_state holds the state of operator {restored_name!r},"
                f" this operator is named {self.operator_name!r}; pass"
                f" restored.initial_states([...])[{self.operator_name!r}]"
            )
        self.ttl_ms: int | None = None
        if ttl is not None:
            if self.timeout != "none":
                raise OperatorDefinitionError(
                    f"{self.name}: ttl is not supported here (the operator expires its keys"
                    " itself); leave ttl unset"
                )
            self.ttl_ms = duration_ms(self.name, "ttl", ttl)
            self.timeout = "processing" if ttl_time == "processing" else "event"
        if ttl_time not in TTL_TIMES:
            raise OperatorDefinitionError(
                f"{self.name}: ttl_time={ttl_time!r}; use 'processing' or 'event'"
            )
        if ttl_time == "event" and ttl is None:
            raise OperatorDefinitionError(
                f"{self.name}: ttl_time='event' without ttl; pass ttl= (a duration) too"
            )
        self.ttl_time = ttl_time
        # With ttl_time="event": the input's watermarked column (set by apply()).
        self.event_time_field: StructField | None = None
        if self.timers not in _TIMEOUTS:
            raise OperatorDefinitionError(
                f"{self.name}: timers={self.timers!r}; use one of {', '.join(_TIMEOUTS)}"
            )
        if self.timers != "none" and self.timeout not in ("none", self.timers):
            raise OperatorDefinitionError(
                f"{self.name}: timers={self.timers!r} with {self.timeout}-time"
                f" {'ttl' if self.ttl_ms is not None else 'timeout'}: Spark keeps one timeout"
                " kind per operator; use the same kind for both"
            )
        if self.timers != "none":
            self.timeout = self.timers
        self.key = key
        self.key_groups = key_groups
        self.initial_state = initial_state
        # Set by apply() when initial_state is given: the per-key-group split to load from
        # (None once every key group holds state), and the old query's watermarks.
        self.bootstrap_directory: str | None = None
        self.restored_watermarks: tuple[int | None, int | None] = (None, None)
        # False only to reproduce checkpoints written before settings markers existed (tests).
        self.emit_settings_markers = True
        # Set by apply() when metrics are on in the defining process (see ``record_state``).
        self.metrics_directory: str | None = None
        self.keys: tuple[str, ...] = ()
        self.key_schema = StructType()
        self.input_schema = StructType()
        self.state_schema = StructType()
        self.out_schema = StructType()
        self.arrow_state_schema = pa.schema([])

    # Hooks a subclass may override -------------------------------------------------------

    def validate(self, df: DataFrame) -> None:
        """Check operator-specific arguments against ``df``; raise OperatorDefinitionError."""

    def prepare(self, df: DataFrame) -> DataFrame:
        """Columns sent to Python: by default the key columns and nothing else.

        A stateless Python step here may add the settings markers itself (see
        ``RunningCount``): a boolean ``MARKER_COLUMN``, true on one extra row per input
        partition that has rows (only while ``emit_settings_markers``). Without that column
        the base class adds the markers in a separate step (see ``with_settings_markers``).
        """
        return df.select(*self.keys)

    def finish(self, df: DataFrame) -> DataFrame:
        """Projection applied to the operator's output (e.g. to restore timestamps)."""
        return df

    def state_schema_for(self, input_schema: StructType) -> StructType:
        return StructType(list(self.key_schema.fields) + _ddl(self.state_fields).fields)

    def output_schema_for(self, input_schema: StructType) -> StructType:
        return StructType(list(self.key_schema.fields) + _ddl(self.output_fields).fields)

    def pre_aggregate(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Fold one input frame before frames are concatenated (default: keep the rows)."""
        return rows

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        raise NotImplementedError

    def on_timeout(self, state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        return state, self.empty_output()

    def wake_up_ms(self, state: pd.DataFrame, clock: Clock) -> int | None:
        return None

    def on_timer(self, due_state: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Called with the keys whose timer is due (``timers`` set): their state rows, the
        timer already deleted (``TIMER_COLUMN`` null) and the time it was due at in
        ``FIRED_TIMER_COLUMN``. Return the new state of those keys (a key left out leaves
        the state; ``register_timer`` sets a next timer) and the rows to emit. Default:
        keep the keys, emit nothing."""
        return due_state, self.empty_output()

    def keys_in(self, state: pd.DataFrame) -> int:
        """How many keys ``state`` holds (one row per key unless a subclass keeps more)."""
        return len(state)

    # Helpers for subclasses ----------------------------------------------------------------

    def empty_output(self) -> pd.DataFrame:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in self.out_schema.names})

    def empty_state(self) -> pd.DataFrame:
        return self.canonical_state(self.arrow_state_schema.empty_table().to_pandas())

    def canonical_state(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``canonical`` for a state table, the timer column as nullable Int64."""
        frame = canonical(frame, self.state_schema.fields)
        if self.timers != "none" and frame[TIMER_COLUMN].dtype != "Int64":
            frame = frame.assign(**{TIMER_COLUMN: frame[TIMER_COLUMN].astype("Int64")})
        return frame

    # Driver side ---------------------------------------------------------------------------

    def apply(self, df: DataFrame) -> DataFrame:
        """Validate against ``df`` (before any query starts) and return the output DataFrame."""
        keys = key_columns(self.name, df, self.key)
        self.keys = keys
        if self.ttl_time == "event":
            watermarked = [f for f in df.schema.fields if WATERMARK_METADATA_KEY in f.metadata]
            if not watermarked:
                raise OperatorDefinitionError(
                    f"{self.name}: ttl_time='event' needs a watermark on the input; call"
                    f' df.withWatermark("<event-time column>", "<delay>") before {self.name}'
                )
            self.event_time_field = watermarked[0]
        self.validate(df)
        self.metrics_directory = RECORDER.directory()
        prepared = self.prepare(df)
        if self.timers == "event" and not any(
            WATERMARK_METADATA_KEY in field.metadata for field in prepared.schema.fields
        ):
            raise OperatorDefinitionError(
                f"{self.name}: timers='event' needs a watermarked event-time column in what"
                ' prepare() returns; call df.withWatermark("<column>", "<delay>") first and'
                " keep that column in prepare()"
            )
        if self.ttl_time == "event" and TTL_EVENT_US_COLUMN not in prepared.columns:
            raise OperatorDefinitionError(
                f"{self.name}: ttl_time='event' is not supported by this operator (its rows"
                " carry no event time); use running_count or running_aggregate"
            )
        self.bind(keys, without_marker(prepared.schema))
        self.refuse_timeout_switch(df)
        if self.state_layout == "segment-log":
            segment_log_state.refuse_other_store(df)
        if self.initial_state is not None:
            self.emit_settings_markers = True
            self.restored_watermarks = (
                self.initial_state.batch_watermark_ms,
                self.initial_state.next_batch_watermark_ms,
            )
            if bootstrap_needed(df.sparkSession, self.initial_state, self.key_groups):
                self.bootstrap_directory = split_by_key_group(
                    df.sparkSession, self.initial_state, self
                )
        if self.state_layout == "segment-log":
            layout = segment_log_state.Layout(SETTINGS_KEY_GROUP, Clock, MARKER_COLUMN)
            result = segment_log_state.apply(
                self, self.bucketed(prepared), KEY_GROUP_COLUMN, layout
            )
            return self.finish(result)
        result = (
            self.bucketed(prepared)
            .groupBy(KEY_GROUP_COLUMN)
            .applyInPandasWithState(
                self._call,
                self.out_schema,
                state_codec.GROUP_STATE_DDL,
                self.output_mode,
                _TIMEOUTS[self.timeout],
            )
        )
        return self.finish(result)

    def refuse_timeout_switch(self, df: DataFrame) -> None:
        """Refuse ttl or timers turned on or off for the query's checkpoint, when known:
        ``checkpoint_location``, else a restored ``initial_state``'s checkpoint (its
        operator by name, else by position)."""
        checkpoint, operator_id = self.checkpoint_location, None
        restored = self.initial_state
        if checkpoint is None and restored is not None and restored.checkpoint_location:
            checkpoint = restored.checkpoint_location
            operator_id = restored.operator_id if restored.operator_name is None else None
        if checkpoint is not None:
            refuse_timeout_switch(df.sparkSession, self, checkpoint, operator_id)

    def bind(self, keys: Sequence[str], input_schema: StructType) -> None:
        """Fix key, input, state and output schemas (pure: no Spark session needed)."""
        self.keys = tuple(keys)
        self.input_schema = input_schema
        self.key_schema = StructType([input_schema[name] for name in self.keys])
        self.state_schema = self.state_schema_for(input_schema)
        self.out_schema = self.output_schema_for(input_schema)
        fields = [arrow_field(f) for f in self.state_schema.fields]
        if self.ttl_ms is not None:
            fields.append(pa.field(EXPIRES_COLUMN, pa.int64(), nullable=True))
        if self.timers != "none":
            fields.append(pa.field(TIMER_COLUMN, pa.int64(), nullable=True))
        settings = {"key_groups": str(self.key_groups)}
        if self.ttl_ms is not None and self.ttl_time == "event":
            # Expiries in event time: a checked setting, so that a processing-time ttl
            # checkpoint is not read as event time (added only for event time, so that
            # processing-time ttl checkpoints written before keep their schema).
            settings["ttl_time"] = "event"
        if self.timers == "event":
            # Timer due times in event time, checked like ttl_time (processing-time timers,
            # the first kind, keep the schema they were written with).
            settings["timers"] = "event"
        self.arrow_state_schema = pa.schema(fields, metadata=settings)

    def watermark_carrier(self) -> Column:
        """With ttl_time="event": the input's watermarked column, for the rows that carry
        their event time in ``TTL_EVENT_US_COLUMN`` instead. Spark runs event-time timeouts
        only when a watermarked column reaches the operator, and drops the rows it holds at
        or behind the watermark; this one holds 2262-01-01 (as settings markers do), so it
        satisfies Spark and no row is dropped: running_count and running_aggregate count
        every row of a watermarked input, with or without event-time ttl."""
        field = self.event_time_field
        assert field is not None
        never_late = F.timestamp_micros(F.lit(_NEVER_LATE_US)).cast(field.dataType)
        return never_late.alias(field.name, metadata=field.metadata)

    def stored_schema(self) -> pa.Schema:
        """The schema state rows are written with: the state schema plus, informational
        (never checked by ``decode``), a named operator's name and the ttl in ms."""
        metadata = dict(self.arrow_state_schema.metadata or {})
        if self.operator_name is not None:
            metadata[OPERATOR_NAME_METADATA_KEY] = self.operator_name.encode()
        if self.ttl_ms is not None:
            metadata[state_codec.TTL_MS] = str(self.ttl_ms).encode()
        return self.arrow_state_schema.with_metadata(metadata)

    def watermarked_column(self) -> str | None:
        """The input's watermarked column when restored with a watermark, else None.

        Only for event-time timeouts: Spark drops late rows before a stateful operator
        only then, so an operator without them (processing time, none) keeps every row
        of a watermarked input, restored or not.
        """
        if self.timeout != "event":
            return None
        if all(watermark is None for watermark in self.restored_watermarks):
            return None
        for field in self.input_schema.fields:
            if WATERMARK_METADATA_KEY in field.metadata:
                return field.name
        return None

    def key_group_column(self) -> Column:
        hashed = F.xxhash64(*[F.col(name) for name in self.keys])
        return F.pmod(hashed, F.lit(self.key_groups)).cast("int")

    def bucketed(self, prepared: DataFrame) -> DataFrame:
        """``prepared`` with ``KEY_GROUP_COLUMN``; settings markers go to SETTINGS_KEY_GROUP.

        Restored with the old query's watermark, rows also carry their watermarked event
        time in microseconds (``EVENT_TIME_COLUMN``), for the late-row check in ``_call``.
        """
        event_time = self.watermarked_column()
        if event_time is not None:
            prepared = prepared.withColumn(EVENT_TIME_COLUMN, F.unix_micros(F.col(event_time)))
        if not self.emit_settings_markers:
            if MARKER_COLUMN in prepared.columns:
                prepared = prepared.where(~F.col(MARKER_COLUMN)).drop(MARKER_COLUMN)
            return prepared.withColumn(KEY_GROUP_COLUMN, self.key_group_column())
        marked = prepared if MARKER_COLUMN in prepared.columns else with_settings_markers(prepared)
        if self.bootstrap_directory is not None:
            # Bootstrap markers: each marker also visits every key group (it stays flagged).
            every_group = [SETTINGS_KEY_GROUP, *range(self.key_groups)]
            targets = F.when(
                F.col(MARKER_COLUMN), F.array(*[F.lit(group) for group in every_group])
            ).otherwise(F.array(self.key_group_column()))
            return marked.withColumn(KEY_GROUP_COLUMN, F.explode(targets))
        key_group = F.when(F.col(MARKER_COLUMN), F.lit(SETTINGS_KEY_GROUP)).otherwise(
            self.key_group_column()
        )
        return marked.withColumn(KEY_GROUP_COLUMN, key_group).drop(MARKER_COLUMN)

    # Executor side -------------------------------------------------------------------------

    def _call(
        self, bucket: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        if bucket[0] == SETTINGS_KEY_GROUP:
            for _ in frames:
                pass
            self.check_settings(state)
            return
        if self.metrics_directory is not None:
            RECORDER.point_at(self.metrics_directory)
        clock = self.clock(state)
        if self.bootstrap_directory is not None:
            frames = (rows_where(frame, ~frame[MARKER_COLUMN]) for frame in frames)
        if self.watermarked_column() is not None:
            frames = self.without_late_rows(frames)
        if state.hasTimedOut:
            for _ in frames:
                pass
            new_state, output = self.step(None, self.load(state, bucket[0]), clock)
        else:
            rows = self.fold(frames)
            if len(rows):
                new_state, output = self.step(rows, self.load(state, bucket[0]), clock)
            else:
                # Only bootstrap markers or late rows: a visit without data, as Spark's.
                if state.exists and self.timeout == "none":
                    return
                stored = self.load(state, bucket[0])
                if self.due(stored, clock):
                    new_state, output = self.step(None, stored, clock)
                elif state.exists:
                    if len(stored):  # Spark clears the timeout on every call: set it again
                        self.set_timeout(state, stored, clock)
                    return
                else:
                    new_state, output = stored, self.empty_output()
        state_bytes = self.save(state, new_state, clock)
        self.record_state(bucket[0], new_state, state_bytes)
        if len(output):
            yield output[list(self.out_schema.names)]

    def step(
        self, rows: pd.DataFrame | None, stored: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """One call's change of a key group: ``rows`` (None for a visit without data: a
        fired timeout, or a due key group visited by markers alone) applied to ``stored``.

        With ``timers``: the stored keys whose timer is due fire first (``on_timer`` sees
        them before ``update`` sees the batch's rows, as in Flink a timer precedes the
        rows that arrive after its time); then ``update`` (or ``expire``); then the keys
        whose timer ``update`` set at a time this batch's clock has already reached fire in
        the same call. A key fires at most once per call: a timer ``on_timer`` sets at a
        time already reached fires at the next batch (processing time) or the next
        watermark advance (event time). Pure (no Spark), so a fixed clock tests it."""
        outputs = []
        fired: pd.DataFrame | None = None
        if self.timers != "none":
            stored, output, fired = self.fire_timers(stored, clock)
            outputs.append(output)
        if rows is None:
            new_state, output = self.expire(stored, clock)
        else:
            new_state, output = self.update_live(rows, stored, clock)
        outputs.append(output)
        if self.timers != "none":
            new_state, output, _ = self.fire_timers(new_state, clock, fired)
            outputs.append(output)
        emitted = [frame[list(self.out_schema.names)] for frame in outputs if len(frame)]
        if not emitted:
            return new_state, self.empty_output()
        return new_state, emitted[0] if len(emitted) == 1 else pd.concat(emitted, ignore_index=True)

    def fire_timers(
        self, state: pd.DataFrame, clock: Clock, already_fired: pd.DataFrame | None = None
    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
        """Fire the due timers of ``state``: (new state, output, the keys that fired or None).

        Due: a timer at or before this call's processing time ("processing") or watermark
        ("event"; none without a watermark). The due keys (except those in
        ``already_fired``) go to ``on_timer`` with their timer deleted; what it returns
        replaces them, keys it leaves out leave the state. The deletion is part of the
        state Spark commits with the batch, so a timer fires exactly once per
        registration: a replayed batch fires it again only because the batch's state was
        never committed, with the same clock, hence the same keys."""
        now = clock.processing_time_ms if self.timers == "processing" else clock.watermark_ms
        if now is None or not len(state):
            return state, self.empty_output(), None
        due = (state[TIMER_COLUMN] <= now).fillna(False).to_numpy(dtype=bool)
        if already_fired is not None and len(already_fired):
            due &= ~self.holds_key(already_fired, state)
        if not due.any():
            return state, self.empty_output(), None
        timers = state[TIMER_COLUMN]
        due_state = (
            state[due]
            .assign(**{FIRED_TIMER_COLUMN: timers[due].astype("int64")})
            .assign(**{TIMER_COLUMN: pd.array([pd.NA] * int(due.sum()), dtype="Int64")})
            .reset_index(drop=True)
        )
        fired_state, output = self.on_timer(due_state, clock)
        fired_state = self.with_timers_of(fired_state, due_state)
        kept = state[~due]
        new_state = (
            pd.concat([kept, fired_state], ignore_index=True)
            if len(fired_state)
            else kept.reset_index(drop=True)
        )
        return self.canonical_state(new_state), output, due_state[list(self.keys)]

    def holds_key(self, holder: pd.DataFrame, frame: pd.DataFrame) -> np.ndarray:
        """Per row of ``frame``: whether its key is one of ``holder``'s (nulls are a key)."""
        keys = list(self.keys)
        codes, _ = key_codes(pd.concat([holder[keys], frame[keys]], ignore_index=True), keys)
        held = int(codes[: len(holder)].max()) + 1 if len(holder) else 0
        return codes[len(holder) :] < held

    def with_timers_of(self, new_state: pd.DataFrame, old_state: pd.DataFrame) -> pd.DataFrame:
        """``new_state`` as a callback returned it, given the frame it received: without
        ``TIMER_COLUMN``, each key keeps the timer it had in ``old_state`` (a new key has
        none), so a callback that rebuilds the table need not copy the column."""
        if self.timers == "none":
            return new_state
        new_state = new_state.drop(columns=[FIRED_TIMER_COLUMN], errors="ignore")
        if TIMER_COLUMN in new_state.columns:
            return new_state.assign(**{TIMER_COLUMN: new_state[TIMER_COLUMN].astype("Int64")})
        keys = list(self.keys)
        both = pd.concat([old_state[keys], new_state[keys]], ignore_index=True)
        codes, firsts = key_codes(both, keys)
        held = int(codes[: len(old_state)].max()) + 1 if len(old_state) else 0
        new_codes = codes[len(old_state) :]
        known = new_codes < held
        timers = pd.array([pd.NA] * len(new_state), dtype="Int64")
        old_timers = old_state[TIMER_COLUMN].astype("Int64").array
        timers[known] = old_timers[firsts[new_codes[known]]]
        return new_state.assign(**{TIMER_COLUMN: timers})

    def updated(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``update``, with the timers the returned state omits carried by key."""
        new_state, output = self.update(rows, state, clock)
        return self.with_timers_of(new_state, state), output

    def update_live(
        self, rows: pd.DataFrame, stored: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``update``; with ``ttl``, on the keys not expired yet, and every key that
        received rows expires ``ttl`` after this batch's processing time (the others keep
        their expiry). A key that expired starts again from nothing, as if never seen.

        With ``ttl_time="event"``: a key expires ``ttl`` after its latest event time (rows
        carry it in ``TTL_EVENT_US_COLUMN``; a row without one counts as at the
        watermark), so a late row never makes its key expire sooner."""
        if self.ttl_ms is None:
            return self.updated(rows, stored, clock)
        live = self.unexpired(stored, clock)
        new_state, output = self.updated(rows, live.drop(columns=[EXPIRES_COLUMN]), clock)
        keys = list(self.keys)
        codes, _ = key_codes(pd.concat([new_state[keys], live[keys], rows[keys]]), keys)
        kept, live_codes = len(new_state), codes[len(new_state) : len(new_state) + len(live)]
        row_slots = np.minimum(codes[kept + len(live) :], kept)
        if self.ttl_time == "event":
            watermark = clock.watermark_ms or 0
            event_ms = (rows[TTL_EVENT_US_COLUMN].astype("Int64") // 1000).fillna(watermark)
            latest = np.full(kept + 1, watermark, dtype=np.int64)
            latest[row_slots] = np.iinfo(np.int64).min
            np.maximum.at(latest, row_slots, event_ms.to_numpy(dtype=np.int64))
            expires = latest[:kept] + self.ttl_ms
        else:
            expires = np.full(kept, clock.processing_time_ms + self.ttl_ms, dtype=np.int64)
        untouched = np.ones(kept + 1, dtype=bool)
        untouched[row_slots] = False
        known = live_codes < kept
        carried = live[EXPIRES_COLUMN].to_numpy(dtype=np.int64)[known]
        refreshed = expires[live_codes[known]]
        if self.ttl_time == "event":
            refreshed = np.maximum(refreshed, carried)
        expires[live_codes[known]] = np.where(untouched[live_codes[known]], carried, refreshed)
        return new_state.assign(**{EXPIRES_COLUMN: expires}), output

    def unexpired(self, stored: pd.DataFrame, clock: Clock) -> pd.DataFrame:
        """The keys of ``stored`` whose ttl has not run out at this batch (counted): by
        the batch's processing time, or with ``ttl_time="event"`` its watermark."""
        now = clock.processing_time_ms if self.ttl_time == "processing" else clock.watermark_ms
        if now is None:
            return stored.reset_index(drop=True)
        live = stored[stored[EXPIRES_COLUMN].to_numpy(dtype=np.int64) > now]
        if len(live) < len(stored) and self.metrics_directory is not None:
            labels = self.metrics_labels()
            RECORDER.add("eospack_state_keys_expired_total", labels, len(stored) - len(live))
        return live.reset_index(drop=True)

    def expire(self, stored: pd.DataFrame, clock: Clock) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``on_timeout`` (with ``ttl``: dropping the keys whose ttl ran out), counted: a
        fired timeout and the keys it removed."""
        if self.ttl_ms is not None:
            if self.metrics_directory is not None:
                RECORDER.add("eospack_state_timeouts_fired_total", self.metrics_labels())
            return self.unexpired(stored, clock), self.empty_output()
        new_state, output = self.on_timeout(stored, clock)
        if self.metrics_directory is not None:
            labels = self.metrics_labels()
            RECORDER.add("eospack_state_timeouts_fired_total", labels)
            expired = max(0, self.keys_in(stored) - self.keys_in(new_state))
            RECORDER.add("eospack_state_keys_expired_total", labels, expired)
        return new_state, output

    def metrics_labels(self) -> dict[str, str]:
        """The operator's metric labels: the query's id (Spark's, kept across restarts) and
        the operator's name (its kind when unnamed)."""
        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        return {"query": query or "", "operator": self.operator_name or self.name}

    def record_state(self, key_group: int, new_state: pd.DataFrame, state_bytes: int) -> None:
        """With metrics on where the operator was defined: the key group's keys and encoded
        bytes after this call, as gauges labelled by key group (the endpoint sums them per
        operator; a key group's newest value wins, whichever worker wrote it), written to
        the worker's snapshot shortly after (``flush_soon``: once for the calls that come
        meanwhile, so a batch's many key groups cost one rewrite). Spark starts this UDF's
        Python workers without the pack's environment, so the directory travels with the
        operator (``metrics_directory``, set by ``apply``). The key columns and the
        operator's ``name`` label the gauges too (summed away by the endpoint like the key
        group), so two operators of one kind in one query on different keys, or named
        apart, add up instead of overwriting each other's key groups; both labels are the
        same after a restart, so an old run's values are replaced, not added. A key
        group's values are ordered by Spark's batch id (kept across restarts), not by the
        writing executor's clock: on a cluster whose clocks differ, the newest batch's value
        still wins."""
        if self.metrics_directory is None:
            return
        labels = {
            **self.metrics_labels(),
            "key_group": str(key_group),
            "key_columns": ",".join(self.keys),
            "operator_name": self.operator_name or "",
        }
        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        at = float(batch) if batch is not None and batch.isdigit() else None
        RECORDER.set("eospack_state_keys", labels, self.keys_in(new_state), at)
        RECORDER.set("eospack_state_bytes", labels, state_bytes, at)
        RECORDER.flush_soon()

    def clock(self, state: GroupState) -> Clock:
        """This call's clock; restored, the watermark is at least the old query's next one."""
        watermark = state.getCurrentWatermarkMs() if self.timeout == "event" else None
        return Clock(state.getCurrentProcessingTimeMs(), self.floored_watermark(watermark))

    def floored_watermark(self, watermark_ms: int | None) -> int | None:
        """The watermark a call's clock holds: None without event-time timeouts; restored,
        at least the old query's next one (both layouts clock batches with this)."""
        if self.timeout != "event" or watermark_ms is None:
            return None
        floor = self.restored_watermarks[1]
        return watermark_ms if floor is None else max(watermark_ms, floor)

    def log_key_columns(self) -> tuple[str, ...]:
        """What identifies one state row in the segment log (``segment_log_state``): the key
        columns, unless a key holds several rows (then a subclass adds what tells them
        apart)."""
        return self.keys

    def without_late_rows(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """Drop rows at or behind the watermark the old query would have dropped them with
        (Spark drops rows at or behind the previous batch's watermark; in the restored
        query's batch 0 that is the savepoint batch's, afterwards at least the next one's)."""
        batch_watermark, next_batch_watermark = self.restored_watermarks
        context = TaskContext.get()
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        late_ms = batch_watermark if batch == "0" else next_batch_watermark
        for frame in frames:
            if late_ms is not None:
                event_us = frame[EVENT_TIME_COLUMN]
                frame = rows_where(frame, event_us.isna() | (event_us > late_ms * 1000))
            yield frame

    def due(self, stored: pd.DataFrame, clock: Clock) -> bool:
        """Whether a key of ``stored`` must expire now (Spark's timeout would fire)."""
        if self.timeout == "none" or not len(stored):
            return False
        wake_up = self.next_wake_up_ms(stored, clock)
        now = clock.processing_time_ms if self.timeout == "processing" else clock.watermark_ms
        return wake_up is not None and now is not None and wake_up <= now

    def fold(self, frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
        columns = [n for n in self.input_schema.names]
        parts = [
            self.pre_aggregate(canonical(frame[columns], self.input_schema.fields))
            for frame in frames
            if len(frame)
        ]
        if not parts:
            empty = pd.DataFrame({n: pd.Series(dtype=object) for n in columns})
            return self.pre_aggregate(canonical(empty, self.input_schema.fields))
        return parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)

    def check_settings(self, state: GroupState) -> None:
        """Refuse settings other than the stored ones; store them on the first visit.

        The settings row is an empty state table: its Arrow schema holds the key columns
        and state fields, its metadata ``key_groups``, so ``state_codec.decode`` reports a
        change exactly as it does for a data bucket. It is written once, never rewritten.
        A checkpoint from before settings markers has no settings row: its first batch
        with input rows records the settings of the restarted query.
        """
        if state.exists:
            state_codec.decode(self.name, state.get, self.arrow_state_schema)
            if state_codec.stored_name(state.get) == self.operator_name:
                return
            # Renamed on this checkpoint: the settings row, which savepoints read the name
            # from, takes the new name (it is otherwise never rewritten).
        blob = state_codec.encode(self.empty_state(), self.stored_schema())
        state.update((state_codec.STATE_FORMAT_VERSION, self.name, blob))

    def load(self, state: GroupState, key_group: int) -> pd.DataFrame:
        """The bucket's stored keys; for a bucket without state, its initial state if any."""
        if state.exists:
            return self.load_value(state.get)
        initial = self.initial_state_of(key_group)
        return self.empty_state() if initial is None else initial

    def initial_state_of(self, key_group: int) -> pd.DataFrame | None:
        """While bootstrapping, ``key_group``'s keys in the split (None: none, or not
        bootstrapping); both layouts load a key group without state through it."""
        if self.bootstrap_directory is None:
            return None
        initial = load_key_group(self.bootstrap_directory, key_group, self.arrow_state_schema)
        return None if initial is None else self.canonical_state(initial)

    def load_value(self, value: tuple[Any, ...]) -> pd.DataFrame:
        """Decode a stored group state row into the per-key state table; with ttl, the
        expiries moved by the change of ttl since the row was written (``TTL_MS``)."""
        table = state_codec.decode(self.name, value, self.arrow_state_schema)
        if self.ttl_ms is not None and EXPIRES_COLUMN in table.columns:
            written = state_codec.stored_metadata(value, state_codec.TTL_MS)
            if written is not None and int(written) != self.ttl_ms:
                moved = table[EXPIRES_COLUMN].to_numpy(dtype=np.int64) - int(written)
                table[EXPIRES_COLUMN] = moved + self.ttl_ms
        return self.canonical_state(table)

    def save(self, state: GroupState, new_state: pd.DataFrame, clock: Clock) -> int:
        """Store ``new_state``; an empty one removes the row, except while bootstrapping,
        where the row must stay to say that the bucket's initial state was loaded. Returns
        the bytes stored (0 for a removed row)."""
        if not len(new_state) and self.bootstrap_directory is None:
            state.remove()
            return 0
        blob = state_codec.encode(new_state[self.arrow_state_schema.names], self.stored_schema())
        state.update((state_codec.STATE_FORMAT_VERSION, self.name, blob))
        if len(new_state):
            self.set_timeout(state, new_state, clock)
        return len(blob)

    def next_wake_up_ms(self, stored: pd.DataFrame, clock: Clock) -> int | None:
        """When the group must be visited again: the earliest of the first key's expiry
        with ``ttl``, the first key's timer with ``timers``, and the operator's
        ``wake_up_ms``."""
        times = []
        if self.ttl_ms is not None:
            times.append(int(stored[EXPIRES_COLUMN].min()))
        if self.timers != "none":
            first_timer = stored[TIMER_COLUMN].min()
            if not pd.isna(first_timer):
                times.append(int(first_timer))
        wake_up = self.wake_up_ms(stored, clock)
        if wake_up is not None:
            times.append(wake_up)
        return min(times) if times else None

    def set_timeout(self, state: GroupState, stored: pd.DataFrame, clock: Clock) -> None:
        wake_up = self.next_wake_up_ms(stored, clock)
        if wake_up is None:
            return
        if self.timeout == "processing":
            # Spark fires at a batch whose time is after now + duration (strictly): a group
            # with rows at exactly wake_up fires its due keys itself (``step``).
            state.setTimeoutDuration(max(1, wake_up - clock.processing_time_ms))
        elif self.timeout == "event":
            # Spark fires when watermark > timestamp; we want watermark >= wake_up.
            watermark = clock.watermark_ms if clock.watermark_ms is not None else 0
            state.setTimeoutTimestamp(max(wake_up - 1, watermark, 1))


def rows_where(frame: pd.DataFrame, mask: pd.Series) -> pd.DataFrame:
    """The rows of ``frame`` where ``mask`` holds.

    A timed-out call (``state.hasTimedOut``) gets one empty frame whose columns pyspark
    builds from their names alone, so they are object-typed: ``frame[mask]`` with a mask of
    that dtype selects columns, not rows, and leaves a frame without any column.
    """
    return frame.loc[mask.to_numpy(dtype=bool)]


def register_timer(
    state: pd.DataFrame,
    where: Sequence[bool] | np.ndarray | pd.Series | None,
    at_ms: int | Sequence[int] | np.ndarray | pd.Series,
) -> pd.DataFrame:
    """``state`` (a frame ``update`` or ``on_timer`` received, or built from one) with the
    timer of the keys where ``where`` holds (a boolean mask by position; None: every key)
    set to ``at_ms`` (one time in ms, or one per row of ``state``). A key holds one timer:
    registering replaces the one it had. Returns a new frame; ``state`` is unchanged."""
    times = pd.Series(
        pd.array(np.broadcast_to(at_ms, (len(state),)), dtype="Int64"), index=state.index
    )
    return _with_timers(state, where, times)


def delete_timer(
    state: pd.DataFrame, where: Sequence[bool] | np.ndarray | pd.Series | None = None
) -> pd.DataFrame:
    """``state`` with no timer for the keys where ``where`` holds (None: every key)."""
    nothing = pd.Series(pd.array([pd.NA] * len(state), dtype="Int64"), index=state.index)
    return _with_timers(state, where, nothing)


def _with_timers(
    state: pd.DataFrame, where: Sequence[bool] | np.ndarray | pd.Series | None, times: pd.Series
) -> pd.DataFrame:
    if TIMER_COLUMN not in state.columns:
        raise OperatorDefinitionError(
            f"register_timer/delete_timer: the frame has no {TIMER_COLUMN} column; set the"
            " operator's class attribute timers = 'processing' or 'event' and pass the state"
            " frame update or on_timer received"
        )
    current = state[TIMER_COLUMN].astype("Int64")
    if where is None:
        return state.assign(**{TIMER_COLUMN: times})
    mask = np.asarray(where, dtype=bool)
    return state.assign(**{TIMER_COLUMN: current.where(~mask, times)})


def without_marker(schema: StructType) -> StructType:
    return StructType([field for field in schema.fields if field.name != MARKER_COLUMN])


def with_settings_markers(df: DataFrame) -> DataFrame:
    """``df`` plus ``MARKER_COLUMN``, and a copy of each input partition's first row as marker.

    Spark refuses ``monotonically_increasing_id`` in streaming queries, so the first row of a
    partition is found by an Arrow iterator UDF that sees the partition's batches in order; it
    receives one constant boolean column, the rows themselves stay in the JVM (any column
    type works), and an explode emits the flagged row twice. A marker's watermarked
    event-time column is set to 2262-01-01: Spark drops rows behind the watermark before an
    event-time-timeout operator sees them, and a dropped marker would check nothing.
    """
    # The iterator UDF type comes from flag_first_row's hints, which pyspark's stubs miss.
    if ARROW_UDF.available:
        first_row = F.arrow_udf(flag_first_row, BooleanType())  # type: ignore[call-overload]
    else:  # Spark 4.0: the same iterator UDF through pandas
        first_row = F.pandas_udf(flag_first_row_pandas, BooleanType())  # type: ignore[call-overload]
    first_row = first_row.asNondeterministic()
    copies = F.when(F.col(MARKER_COLUMN), F.array(F.lit(False), F.lit(True))).otherwise(
        F.array(F.lit(False))
    )
    marked = df.withColumn(MARKER_COLUMN, first_row(F.lit(True))).withColumn(
        MARKER_COLUMN, F.explode(copies)
    )
    if not any(WATERMARK_METADATA_KEY in field.metadata for field in df.schema.fields):
        return marked
    columns = []
    for field in df.schema.fields:
        column = F.col(field.name)
        if WATERMARK_METADATA_KEY in field.metadata:
            never_late = F.timestamp_micros(F.lit(_NEVER_LATE_US)).cast(field.dataType)
            column = F.when(F.col(MARKER_COLUMN), never_late).otherwise(column)
            column = column.alias(field.name, metadata=field.metadata)
        columns.append(column)
    return marked.select(*columns, MARKER_COLUMN)


def flag_first_row(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
    """True for the first row of a partition, false for every other (one call per partition)."""
    first = True
    for batch in batches:
        flags = np.zeros(len(batch), dtype=bool)
        if first and len(batch):
            flags[0] = True
            first = False
        yield pa.array(flags)


def flag_first_row_pandas(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
    """:func:`flag_first_row` as a pandas iterator UDF (Spark 4.0 has no ``arrow_udf``)."""
    for flags in flag_first_row(pa.Array.from_pandas(batch) for batch in batches):
        yield flags.to_pandas()


def _ddl(ddl: str | StructType) -> StructType:
    if isinstance(ddl, StructType):
        return ddl
    if not ddl:
        return StructType()
    parsed: DataType = StructType.fromDDL(ddl)
    assert isinstance(parsed, StructType)
    return parsed
