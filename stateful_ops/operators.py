"""The ready operators: running_count, running_aggregate, deduplicate and sessionize.

Each is a StatefulOperator (key groups, one state row per group, vectorised pandas).
Per-key contracts:

- running_count / running_aggregate (output mode update): one output row per key that
  received rows in the batch; ``version`` is the number of batches in which the key received
  rows, so it grows by exactly one each time the key's count changes. Both aggregate within
  each input partition first (a stateless mapInArrow step that also emits the settings
  markers, see ``base``), so one row per key and partition is shuffled.
- deduplicate (append): the first row of a key is emitted; later rows of the key are dropped
  while the key is remembered. Processing time: remembered until ``ttl`` after the batch
  that emitted it. Event time: remembered until the watermark reaches the emitted row's
  event time + ``ttl``. Expired keys are removed from state (GroupState timeouts wake idle
  groups up).
- sessionize (append): per key, events closer than ``gap`` form a session
  ``[first event, last event + gap)``; a session is emitted once the watermark reaches its
  end, and then removed from state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    MapType,
    StructField,
    StructType,
)

from eospack.stateful_ops.base import (
    DEFAULT_KEY_GROUPS,
    MARKER_COLUMN,
    Clock,
    StatefulOperator,
    canonical,
)
from eospack.stateful_ops.errors import OperatorDefinitionError
from eospack.stateful_ops.initial_state import InitialState
from eospack.stateful_ops.validation import (
    INTEGRAL_TYPES,
    NUMERIC_TYPES,
    duration_ms,
    require_column,
    require_event_time,
)

SUPPORTED_AGGREGATES = ("sum", "count", "min", "max", "mean")
EVENT_US = "__so_event_us"
PARTIAL_COUNT = "__so_partial_count"
NESTED_TYPES = (ArrayType, MapType, StructType)
_NEW_ROWS = "__so_new_rows"
_KEY_CODE = "__so_key_code"


def _long(name: str) -> StructField:
    return StructField(name, LongType(), True)


def _refuse_name_clash(operator: str, keys: Sequence[str], outputs: Sequence[str]) -> None:
    clash = sorted(set(keys) & set(outputs))
    if clash:
        raise OperatorDefinitionError(
            f"{operator}: key column(s) {', '.join(clash)} clash with output columns;"
            " rename them with withColumnRenamed first"
        )


class RunningCount(StatefulOperator):
    """Running count per key with a version that grows once per batch the key appears in."""

    name: ClassVar[str] = "running_count"
    state_fields: ClassVar[StructType] = StructType([_long("count"), _long("version")])
    output_fields: ClassVar[StructType] = state_fields
    output_mode = "update"

    def validate(self, df: DataFrame) -> None:
        _refuse_name_clash(self.name, self.keys, ["count", "version"])

    def prepare(self, df: DataFrame) -> DataFrame:
        """Count rows per key within each input partition first (Spark's partial count).

        The stateless ``mapInArrow`` step shrinks what is shuffled, sorted and handed to
        pandas from one row per input row to one row per key and partition. Nested key types
        (which Arrow cannot group by) skip it.
        """
        keys = df.select(*self.keys)
        if any(isinstance(f.dataType, NESTED_TYPES) for f in keys.schema.fields):
            return keys
        fields = [*keys.schema.fields, StructField(PARTIAL_COUNT, LongType(), False)]
        if self.emit_settings_markers:
            fields.append(StructField(MARKER_COLUMN, BooleanType(), False))
        count = partial_counts(list(self.keys), settings_marker=self.emit_settings_markers)
        return keys.mapInArrow(count, StructType(fields))

    def fold(self, frames: Iterator[pd.DataFrame]) -> pd.DataFrame:
        """Partial counts are passed on as they are (one row per key and input partition):
        ``update`` sums a key's rows, so a second group-by here would only cost time."""
        if PARTIAL_COUNT not in self.input_schema.names:
            return super().fold(frames)
        columns = [*self.keys, PARTIAL_COUNT]
        parts = [frame[columns] for frame in frames if len(frame)]
        if not parts:
            return super().fold(iter([]))
        rows = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
        rows = canonical(rows, self.key_schema.fields)
        return rows.rename(columns={PARTIAL_COUNT: _NEW_ROWS})

    def pre_aggregate(self, rows: pd.DataFrame) -> pd.DataFrame:
        grouped = rows.groupby(list(self.keys), dropna=False, sort=False)
        counts = grouped[PARTIAL_COUNT].sum() if PARTIAL_COUNT in rows else grouped.size()
        return counts.rename(_NEW_ROWS).reset_index()

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
            weights=rows[_NEW_ROWS].to_numpy(dtype=np.float64),
            minlength=len(firsts),
        ).astype(np.int64)  # float64 sums are exact below 2**53 rows
        count = np.zeros(len(firsts), dtype=np.int64)
        version = np.zeros(len(firsts), dtype=np.int64)
        count[codes[:stored]] = state["count"].to_numpy(dtype=np.int64)
        version[codes[:stored]] = state["version"].to_numpy(dtype=np.int64)
        changed = new_rows > 0
        new_state = both.iloc[firsts].reset_index(drop=True)
        new_state["count"] = count + new_rows
        new_state["version"] = version + changed
        return new_state, new_state[changed]


def key_codes(frame: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the number of its key (nulls are a key), numbered in order of first
    appearance; and per key number, the position of its first row."""
    if len(keys) == 1:
        codes, _ = pd.factorize(frame[keys[0]], use_na_sentinel=False)
    else:
        codes = frame.groupby(keys, dropna=False, sort=False).ngroup().to_numpy()
    codes = np.asarray(codes, dtype=np.int64)
    first = np.ones(len(codes), dtype=bool)
    first[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    return codes, np.flatnonzero(first)


def partial_counts(
    keys: list[str], settings_marker: bool = False
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function: rows per key (nulls are a key) in one partition's batches.

    With ``settings_marker``, a partition that has rows also yields one settings marker: a
    copy of its first output row with ``MARKER_COLUMN`` true (false on every count row), so
    the marker costs one row per partition and no extra pass over the data.
    """

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partials = []
        for batch in batches:
            if batch.num_rows:
                table = pa.Table.from_batches([batch])
                partials.append(
                    table.group_by(keys, use_threads=False).aggregate([([], "count_all")])
                )
        if not partials:
            return
        combined = pa.concat_tables(partials)
        if len(partials) > 1:
            combined = combined.group_by(keys, use_threads=False).aggregate([("count_all", "sum")])
            combined = combined.rename_columns(
                ["count_all" if name == "count_all_sum" else name for name in combined.column_names]
            )
        columns = {key: combined[key] for key in keys}
        columns[PARTIAL_COUNT] = combined["count_all"].cast(pa.int64())
        counts = pa.table(columns)
        yield from (with_marker(counts) if settings_marker else counts).to_batches()

    return count


def with_marker(table: pa.Table) -> pa.Table:
    """``table`` with ``MARKER_COLUMN`` false, plus a copy of its first row flagged true."""
    marked = pa.concat_tables([table, table.slice(0, 1)])
    flags = np.zeros(marked.num_rows, dtype=bool)
    flags[-1] = True
    return marked.append_column(MARKER_COLUMN, pa.array(flags))


_COMBINE = {"count_all": "sum", "count": "sum", "sum": "sum", "min": "min", "max": "max"}


def partial_aggregates(
    keys: list[str],
    spec: Sequence[tuple[str, str, str]],
    schema: StructType,
    settings_marker: bool = False,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function: per key (nulls are a key), the partial aggregates of a partition.

    ``spec`` lists (output name, input column, Arrow aggregate: count_all, count, sum, min or
    max); ``schema`` gives the output types. Floating-point NaN counts as null, as in the
    pandas path (Spark hands NaN and null to pandas alike), so both give the same state.
    Columns are renamed to positional names while grouping, so no user column name can
    collide with a name Arrow gives an aggregate.
    """
    key_names = [f"__so_key_{index}" for index in range(len(keys))]
    sources = list(dict.fromkeys(source for _, source, fn in spec if fn != "count_all"))
    value_names = {source: f"__so_value_{index}" for index, source in enumerate(sources)}
    partial_names = [f"__so_partial_{index}" for index in range(len(spec))]
    targets = [to_arrow_type(schema[name].dataType) for name, _, _ in spec]

    def first_pass(table: pa.Table) -> list[pa.ChunkedArray]:
        grouped = table.group_by(key_names, use_threads=False).aggregate(
            [([], fn) if fn == "count_all" else (value_names[source], fn) for _, source, fn in spec]
        )
        partials = [
            grouped[fn if fn == "count_all" else f"{value_names[source]}_{fn}"]
            for _, source, fn in spec
        ]
        return [grouped[name] for name in key_names] + partials

    def combine(table: pa.Table) -> list[pa.ChunkedArray]:
        merged = table.group_by(key_names, use_threads=False).aggregate(
            [(name, _COMBINE[fn]) for name, (_, _, fn) in zip(partial_names, spec, strict=True)]
        )
        partials = [
            merged[f"{name}_{_COMBINE[fn]}"]
            for name, (_, _, fn) in zip(partial_names, spec, strict=True)
        ]
        return [merged[name] for name in key_names] + partials

    def aggregate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partials = []
        for batch in batches:
            if not batch.num_rows:
                continue
            table = pa.Table.from_batches([batch]).select([*keys, *sources])
            table = _nan_as_null(table.rename_columns([*key_names, *value_names.values()]))
            partials.append(pa.table(first_pass(table), names=[*key_names, *partial_names]))
        if not partials:
            return
        combined = pa.concat_tables(partials)
        if len(partials) > 1:
            combined = pa.table(combine(combined), names=[*key_names, *partial_names])
        columns = [combined[name] for name in key_names]
        columns += [
            combined[name].cast(target) for name, target in zip(partial_names, targets, strict=True)
        ]
        table = pa.table(columns, names=[*keys, *(name for name, _, _ in spec)])
        yield from (with_marker(table) if settings_marker else table).to_batches()

    return aggregate


def _nan_as_null(table: pa.Table) -> pa.Table:
    for index, field in enumerate(table.schema):
        if field.name.startswith("__so_value_") and pa.types.is_floating(field.type):
            column = table.column(index)
            table = table.set_column(index, field, pc.if_else(pc.is_nan(column), None, column))
    return table


class RunningAggregate(StatefulOperator):
    """Running sum/count/min/max/mean per key and column, versioned like RunningCount.

    Output columns are named ``<column>_<aggregate>``. SQL semantics: nulls are ignored,
    ``count`` counts non-null values, sum/min/max/mean of no non-null value is null.
    """

    name: ClassVar[str] = "running_aggregate"
    output_mode = "update"

    def __init__(
        self,
        key: str | Sequence[str],
        aggs: Mapping[str, str | Sequence[str]],
        key_groups: int = DEFAULT_KEY_GROUPS,
        output_mode: str | None = None,
        initial_state: InitialState | None = None,
    ) -> None:
        super().__init__(key, key_groups, output_mode, initial_state)
        if not isinstance(aggs, Mapping) or not aggs:
            raise OperatorDefinitionError(
                f'{self.name}: aggs={aggs!r}; pass a mapping like {{"amount": ["sum", "max"]}}'
            )
        self.aggs: dict[str, tuple[str, ...]] = {}
        for column, functions in aggs.items():
            names = (functions,) if isinstance(functions, str) else tuple(functions)
            for fn in names:
                if fn not in SUPPORTED_AGGREGATES:
                    raise OperatorDefinitionError(
                        f"{self.name}: aggregate {fn!r} for column {column!r} is not"
                        f" supported; use one of {', '.join(SUPPORTED_AGGREGATES)}"
                    )
            if not names:
                raise OperatorDefinitionError(f"{self.name}: no aggregate for column {column!r}")
            self.aggs[column] = tuple(dict.fromkeys(names))
        self.column_types: dict[str, DataType] = {}
        # Whether prepare() sends partial aggregates (True) or the rows themselves.
        self.partial = False

    def validate(self, df: DataFrame) -> None:
        for column, functions in self.aggs.items():
            data_type = require_column(self.name, df, column, role="aggregate")
            if column in self.keys:
                raise OperatorDefinitionError(
                    f"{self.name}: column {column!r} is a key; aggregate another column"
                )
            numeric_only = set(functions) - {"count"}
            if numeric_only and not isinstance(data_type, NUMERIC_TYPES):
                raise OperatorDefinitionError(
                    f"{self.name}: {', '.join(sorted(numeric_only))} of column {column!r}"
                    f" needs a numeric column (integer or floating point), not"
                    f" {data_type.simpleString()}; only count works on it"
                )
        _refuse_name_clash(self.name, self.keys, self.output_names())

    def output_names(self) -> list[str]:
        return [f"{c}_{fn}" for c, fns in self.aggs.items() for fn in fns] + ["version"]

    def prepare(self, df: DataFrame) -> DataFrame:
        """Aggregate within each input partition first (Spark's partial aggregation).

        As for ``RunningCount``: a stateless ``mapInArrow`` step turns the rows of a
        partition into one row of partial aggregates (the state fields) per key, and adds
        the settings marker. Nested key or value types (which Arrow cannot group or
        aggregate) skip it and send the rows themselves.
        """
        selected = df.select(*self.keys, *self.aggs)
        self.column_types = {column: df.schema[column].dataType for column in self.aggs}
        self.partial = not any(isinstance(f.dataType, NESTED_TYPES) for f in selected.schema)
        if not self.partial:
            return selected
        partial_fields = self.aggregate_fields(self.column_types)
        fields = [*(selected.schema[key] for key in self.keys), *partial_fields]
        if self.emit_settings_markers:
            fields.append(StructField(MARKER_COLUMN, BooleanType(), False))
        aggregate = partial_aggregates(
            list(self.keys),
            self._partial_spec(),
            StructType(partial_fields),
            settings_marker=self.emit_settings_markers,
        )
        return selected.mapInArrow(aggregate, StructType(fields))

    def _needs_sum(self, column: str) -> bool:
        return bool({"sum", "mean"} & set(self.aggs[column]))

    def aggregate_fields(self, column_types: Mapping[str, DataType]) -> list[StructField]:
        """The state fields between the key columns and ``version``: the partial aggregates."""
        fields = [_long("rows")]
        for column, functions in self.aggs.items():
            data_type = column_types[column]
            fields.append(_long(f"n__{column}"))
            if self._needs_sum(column):
                sum_type = LongType() if isinstance(data_type, INTEGRAL_TYPES) else DoubleType()
                fields.append(StructField(f"sum__{column}", sum_type, True))
            for extreme in ("min", "max"):
                if extreme in functions:
                    fields.append(StructField(f"{extreme}__{column}", data_type, True))
        return fields

    def _partial_spec(self) -> list[tuple[str, str, str]]:
        """(state field, input column, Arrow aggregate) of each partial aggregate."""
        spec = [("rows", "", "count_all")]
        for column, functions in self.aggs.items():
            spec.append((f"n__{column}", column, "count"))
            if self._needs_sum(column):
                spec.append((f"sum__{column}", column, "sum"))
            for extreme in ("min", "max"):
                if extreme in functions:
                    spec.append((f"{extreme}__{column}", column, extreme))
        return spec

    def _column_types(self, input_schema: StructType) -> Mapping[str, DataType]:
        """Types of the aggregated columns: from prepare(), else from the rows' schema."""
        return self.column_types or {c: input_schema[c].dataType for c in self.aggs}

    def state_schema_for(self, input_schema: StructType) -> StructType:
        fields = self.aggregate_fields(self._column_types(input_schema))
        return StructType([*self.key_schema.fields, *fields, _long("version")])

    def output_schema_for(self, input_schema: StructType) -> StructType:
        fields = list(self.key_schema.fields)
        column_types = self._column_types(input_schema)
        for column, functions in self.aggs.items():
            data_type = column_types[column]
            sum_type = LongType() if isinstance(data_type, INTEGRAL_TYPES) else DoubleType()
            result_types = {
                "sum": sum_type,
                "count": LongType(),
                "min": data_type,
                "max": data_type,
                "mean": DoubleType(),
            }
            fields += [StructField(f"{column}_{fn}", result_types[fn], True) for fn in functions]
        return StructType([*fields, _long("version")])

    def _combine_spec(self) -> dict[str, tuple[str, str]]:
        spec = {"rows": ("rows", "sum")}
        for column, functions in self.aggs.items():
            spec[f"n__{column}"] = (f"n__{column}", "sum")
            if self._needs_sum(column):
                spec[f"sum__{column}"] = (f"sum__{column}", "sum")
            for extreme in ("min", "max"):
                if extreme in functions:
                    spec[f"{extreme}__{column}"] = (f"{extreme}__{column}", extreme)
        return spec

    def pre_aggregate(self, rows: pd.DataFrame) -> pd.DataFrame:
        grouped = rows.groupby(list(self.keys), dropna=False, sort=False)
        if self.partial:
            return grouped.agg(**self._combine_spec()).reset_index()
        first = next(iter(self.aggs))
        spec: dict[str, tuple[str, str]] = {"rows": (first, "size")}
        for column, functions in self.aggs.items():
            spec[f"n__{column}"] = (column, "count")
            if self._needs_sum(column):
                spec[f"sum__{column}"] = (column, "sum")
            for extreme in ("min", "max"):
                if extreme in functions:
                    spec[f"{extreme}__{column}"] = (column, extreme)
        return grouped.agg(**spec).reset_index()

    def update(
        self, rows: pd.DataFrame, state: pd.DataFrame, clock: Clock
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        keys = list(self.keys)
        incoming = rows.assign(version=0, **{_NEW_ROWS: rows["rows"]})
        stored = state.assign(**{_NEW_ROWS: 0})
        both = pd.concat([stored, incoming], ignore_index=True)
        spec = {**self._combine_spec(), "version": ("version", "sum")}
        spec[_NEW_ROWS] = (_NEW_ROWS, "sum")
        merged = both.groupby(keys, dropna=False, sort=False, as_index=False).agg(**spec)
        changed = (merged[_NEW_ROWS] > 0).to_numpy()
        merged["version"] = merged["version"] + changed.astype("int64")
        new_state = merged[list(self.state_schema.names)]
        out = merged[changed]
        output = out[keys].copy()
        for column, functions in self.aggs.items():
            n = out[f"n__{column}"]
            for fn in functions:
                name = f"{column}_{fn}"
                if fn == "count":
                    output[name] = n
                elif fn == "sum":
                    output[name] = out[f"sum__{column}"].mask(n == 0)
                elif fn == "mean":
                    output[name] = (out[f"sum__{column}"].astype("float64") / n).mask(n == 0)
                else:
                    output[name] = out[f"{fn}__{column}"]
        output["version"] = out["version"]
        return new_state, output


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
    ) -> None:
        super().__init__(key, key_groups, initial_state=initial_state)
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
        return StructType([*self.key_schema.fields, _long("expires_at_us")])

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


class Sessionize(StatefulOperator):
    """Event-time session windows per key, emitted when the watermark closes them."""

    name: ClassVar[str] = "sessionize"
    output_mode = "append"
    timeout = "event"
    state_fields: ClassVar[StructType] = StructType(
        [_long("session_start_us"), _long("session_end_us"), _long("count")]
    )
    output_fields: ClassVar[StructType] = state_fields

    def __init__(
        self,
        key: str | Sequence[str],
        event_time: str,
        gap: object,
        key_groups: int = DEFAULT_KEY_GROUPS,
        initial_state: InitialState | None = None,
    ) -> None:
        super().__init__(key, key_groups, initial_state=initial_state)
        self.gap_us = duration_ms(self.name, "gap", gap) * 1000
        self.event_time = event_time

    def validate(self, df: DataFrame) -> None:
        require_event_time(self.name, df, self.event_time)
        _refuse_name_clash(self.name, self.keys, ["session_start", "session_end", "count"])

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


def running_count(
    df: DataFrame,
    key: str | Sequence[str],
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    output_mode: str = "update",
    initial_state: InitialState | None = None,
) -> DataFrame:
    """Key column(s), ``count`` and ``version`` per key changed in the batch.

    ``output_mode`` must match the query's: ``"update"`` (default) for Spark's own sinks,
    ``"append"`` for Python data source sinks such as 2pc-jdbc and 2pc-s3, which Spark
    runs in Append mode only. The emitted rows are the same in both: each is one
    (key, count, version) fact that is never retracted.

    ``initial_state``: per-key state to start from, from a savepoint
    (``RestoredCheckpoint(checkpointLocation).initial_state()``; see ``initial_state``).
    """
    return RunningCount(
        key, key_groups=key_groups, output_mode=output_mode, initial_state=initial_state
    ).apply(df)


def running_aggregate(
    df: DataFrame,
    key: str | Sequence[str],
    aggs: Mapping[str, str | Sequence[str]],
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    output_mode: str = "update",
    initial_state: InitialState | None = None,
) -> DataFrame:
    """Key column(s), ``<column>_<aggregate>`` per requested aggregate, and ``version``.

    ``output_mode``, ``initial_state``: as for ``running_count``.
    """
    return RunningAggregate(
        key, aggs, key_groups=key_groups, output_mode=output_mode, initial_state=initial_state
    ).apply(df)


def deduplicate(
    df: DataFrame,
    key: str | Sequence[str],
    ttl: object,
    event_time: str | None = None,
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    initial_state: InitialState | None = None,
) -> DataFrame:
    """First row per key within ``ttl`` (processing time, or event time with a watermark)."""
    return Deduplicate(
        key, ttl, event_time, key_groups=key_groups, initial_state=initial_state
    ).apply(df)


def sessionize(
    df: DataFrame,
    key: str | Sequence[str],
    event_time: str,
    gap: object,
    *,
    key_groups: int = DEFAULT_KEY_GROUPS,
    initial_state: InitialState | None = None,
) -> DataFrame:
    """Closed sessions per key: key column(s), ``session_start``, ``session_end``, ``count``."""
    return Sessionize(
        key, event_time, gap, key_groups=key_groups, initial_state=initial_state
    ).apply(df)
