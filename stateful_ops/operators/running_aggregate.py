"""running_aggregate (output mode update): running sum/count/min/max/mean per key, versioned.

Versioned as running_count: one output row per key that received rows in the batch, and
``version`` grows by exactly one per such batch. Rows are aggregated within each input
partition first (``partial_aggregation``), so one row per key and partition is shuffled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, DoubleType, LongType, StructField, StructType

from ..base import (
    DEFAULT_KEY_GROUPS,
    MARKER_COLUMN,
    TTL_EVENT_US_COLUMN,
    Clock,
    StatefulOperator,
)
from ..errors import OperatorDefinitionError
from ..initial_state import InitialState
from ..validation import INTEGRAL_TYPES, NUMERIC_TYPES, require_column
from .partial_aggregation import NESTED_TYPES, partial_aggregates
from .shared import NEW_ROWS, long_field, next_versions, refuse_name_clash

SUPPORTED_AGGREGATES = ("sum", "count", "min", "max", "mean")


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
        name: str | None = None,
        ttl: object | None = None,
        ttl_time: str = "processing",
        state_layout: str = "key-groups",
        checkpoint_location: str | None = None,
    ) -> None:
        super().__init__(
            key,
            key_groups,
            output_mode,
            initial_state,
            name,
            ttl,
            ttl_time,
            state_layout,
            checkpoint_location,
        )
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
        refuse_name_clash(self.name, self.keys, self.output_names())

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
        spec = self._partial_spec()
        partial_fields = self.aggregate_fields(self.column_types)
        if self.event_time_field is not None:
            # ttl_time="event": each key's latest event time rides along (see RunningCount).
            event_time = F.col(self.event_time_field.name).cast("timestamp")
            event_us = F.unix_micros(event_time).alias(TTL_EVENT_US_COLUMN)
            selected = df.select(*self.keys, *self.aggs, event_us)
            spec.append((TTL_EVENT_US_COLUMN, TTL_EVENT_US_COLUMN, "max"))
            partial_fields.append(StructField(TTL_EVENT_US_COLUMN, LongType(), True))
        if not self.partial:
            return self.with_watermark_carrier(selected)
        fields = [*(selected.schema[key] for key in self.keys), *partial_fields]
        if self.emit_settings_markers:
            fields.append(StructField(MARKER_COLUMN, BooleanType(), False))
        aggregate = partial_aggregates(
            list(self.keys),
            spec,
            StructType(partial_fields),
            settings_marker=self.emit_settings_markers,
        )
        return self.with_watermark_carrier(selected.mapInArrow(aggregate, StructType(fields)))

    def with_watermark_carrier(self, prepared: DataFrame) -> DataFrame:
        if self.event_time_field is None:
            return prepared
        return prepared.select("*", self.watermark_carrier())

    def _needs_sum(self, column: str) -> bool:
        return bool({"sum", "mean"} & set(self.aggs[column]))

    def aggregate_fields(self, column_types: Mapping[str, DataType]) -> list[StructField]:
        """The state fields between the key columns and ``version``: the partial aggregates."""
        fields = [long_field("rows")]
        for column, functions in self.aggs.items():
            data_type = column_types[column]
            fields.append(long_field(f"n__{column}"))
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
        return StructType([*self.key_schema.fields, *fields, long_field("version")])

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
        return StructType([*fields, long_field("version")])

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
        latest = {}
        if TTL_EVENT_US_COLUMN in rows:
            latest[TTL_EVENT_US_COLUMN] = (TTL_EVENT_US_COLUMN, "max")
        if self.partial:
            return grouped.agg(**self._combine_spec(), **latest).reset_index()
        first = next(iter(self.aggs))
        spec: dict[str, tuple[str, str]] = {"rows": (first, "size"), **latest}
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
        incoming = rows.assign(version=0, **{NEW_ROWS: rows["rows"]})
        stored = state.assign(**{NEW_ROWS: 0})
        both = pd.concat([stored, incoming], ignore_index=True)
        spec = {**self._combine_spec(), "version": ("version", "sum")}
        spec[NEW_ROWS] = (NEW_ROWS, "sum")
        merged = both.groupby(keys, dropna=False, sort=False, as_index=False).agg(**spec)
        changed = (merged[NEW_ROWS] > 0).to_numpy()
        merged["version"] = next_versions(
            merged["version"].to_numpy(dtype=np.int64),
            changed,
            self.ttl_ms,
            clock.processing_time_ms,
        )
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


def running_aggregate(
    df: DataFrame,
    key: str | Sequence[str],
    aggs: Mapping[str, str | Sequence[str]],
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
    """Key column(s), ``<column>_<aggregate>`` per requested aggregate, and ``version``.

    ``output_mode``, ``initial_state``, ``name``, ``ttl``, ``ttl_time``,
    ``checkpoint_location``: as for ``running_count``.
    """
    return RunningAggregate(
        key,
        aggs,
        key_groups=key_groups,
        output_mode=output_mode,
        initial_state=initial_state,
        name=name,
        ttl=ttl,
        ttl_time=ttl_time,
        state_layout=state_layout,
        checkpoint_location=checkpoint_location,
    ).apply(df)
