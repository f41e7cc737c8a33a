"""The stateless step before the shuffle of running_count and running_aggregate.

Spark-style partial aggregation: a ``mapInArrow`` function turns one input partition's rows
into one row per key (counts, or the partial aggregates that are the state fields), so what
is shuffled, sorted and handed to pandas shrinks from one row per input row to one row per
key and partition. With ``settings_marker`` it also adds the settings marker row (see
``base``) at the cost of one row per partition. Floating-point NaN counts as null, as in the
pandas path, so both paths give the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import ArrayType, MapType, StructType

from ..base import MARKER_COLUMN

PARTIAL_COUNT = "__so_partial_count"
NESTED_TYPES = (ArrayType, MapType, StructType)


def partial_counts(
    keys: list[str], settings_marker: bool = False, event_column: str | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function: rows per key (nulls are a key) in one partition's batches.

    With ``settings_marker``, a partition that has rows also yields one settings marker: a
    copy of its first output row with ``MARKER_COLUMN`` true (false on every count row), so
    the marker costs one row per partition and no extra pass over the data. With
    ``event_column`` (a long column: event time in microseconds), each key's row also
    carries its latest event time in that column (null when none of its rows has one).
    """
    aggregates: list[tuple[Any, str]] = [([], "count_all")]
    combines = [("count_all", "sum")]
    if event_column is not None:
        aggregates.append((event_column, "max"))
        combines.append((f"{event_column}_max", "max"))

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        partials = []
        for batch in batches:
            if batch.num_rows:
                table = pa.Table.from_batches([batch])
                partials.append(table.group_by(keys, use_threads=False).aggregate(aggregates))
        if not partials:
            return
        combined = pa.concat_tables(partials)
        count_name, event_name = "count_all", f"{event_column}_max"
        if len(partials) > 1:
            combined = combined.group_by(keys, use_threads=False).aggregate(combines)
            count_name, event_name = f"{count_name}_sum", f"{event_name}_max"
        columns = {key: combined[key] for key in keys}
        columns[PARTIAL_COUNT] = combined[count_name].cast(pa.int64())
        if event_column is not None:
            columns[event_column] = combined[event_name].cast(pa.int64())
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
