"""The segment log: one key group's state as a list of Arrow segments (the next layout).

Why: a ``GroupState`` row holds one value per key group, so a batch that touches one key of
a group rewrites the whole group (benchmark 17: 964x the built-in count's state bytes per
sparse batch). Kept instead as a list of segments in a ``transformWithStateInPandas``
ListState, a batch appends one segment holding only the keys it changed, and RocksDB's
changelog holds just that segment (benchmark 17's candidate: 1.22x).

What is guaranteed, whatever the order of appends and compactions:

- ``fold`` gives each key's latest row (a later segment wins; within a segment, a later
  row), without the keys whose latest row is a tombstone (a key removed: expired or
  deleted). Nulls are a key, as everywhere in stateful_ops; composite keys compare column
  by column.
- ``next_write`` appends the changed rows while the log stays within twice the live keys
  (plus the change), and otherwise replaces the log by one compacted segment of the live
  rows, without tombstones. So the log never holds more than ``2 * live + changed`` rows,
  and the rows written per batch are, amortised, at most about twice the rows changed.

Pure: Arrow tables in, Arrow tables out; no Spark. The operators run on it with
``state_layout="segment-log"`` (``segment_log_state``; docs/stateful-operators.md, "The
segment log").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TOMBSTONE_COLUMN = "__so_removed"
"""A segment's last column: true on a row that removes its key (its other fields are null)."""

_ORDER_COLUMN = "__so_segment_order"


@dataclass(frozen=True)
class Write:
    """What one batch writes to a key group's log: ``segment`` appended, or, when
    ``replace``, ``segment`` as the log's only element (a compaction)."""

    segment: pa.Table
    replace: bool


def fold(segments: Sequence[pa.Table], keys: Sequence[str]) -> pa.Table:
    """The live rows of a log: each key's latest row, tombstoned keys left out, without the
    tombstone column. Rows keep the order of their latest write."""
    if not segments:
        raise ValueError("fold needs at least one segment (its schema is the state's)")
    table = pa.concat_tables(segments)
    if table.num_rows == 0:
        return table.drop_columns([TOMBSTONE_COLUMN])
    order = pa.array(np.arange(table.num_rows, dtype=np.int64))
    numbered = table.append_column(_ORDER_COLUMN, order)
    latest = numbered.group_by(list(keys), use_threads=False).aggregate([(_ORDER_COLUMN, "max")])
    positions = pc.sort_indices(latest[f"{_ORDER_COLUMN}_max"])
    chosen = table.take(pc.take(latest[f"{_ORDER_COLUMN}_max"], positions))
    alive = pc.invert(pc.fill_null(chosen[TOMBSTONE_COLUMN], False))
    return chosen.filter(alive).drop_columns([TOMBSTONE_COLUMN])


def as_segment(rows: pa.Table, removed: pa.Table | None = None) -> pa.Table:
    """A segment of ``rows`` (the state's columns) followed by tombstones for the keys of
    ``removed`` (its key columns, a subset of the state's; its other fields null)."""
    live = rows.append_column(TOMBSTONE_COLUMN, pa.array(np.zeros(rows.num_rows, dtype=bool)))
    if removed is None or removed.num_rows == 0:
        return live
    columns = [
        removed[field.name]
        if field.name in removed.column_names
        else pa.nulls(removed.num_rows, field.type)
        for field in rows.schema
    ]
    flags = pa.array(np.ones(removed.num_rows, dtype=bool))
    tombstones = pa.Table.from_arrays([*columns, flags], schema=live.schema)
    return pa.concat_tables([live, tombstones])


def next_write(logged_rows: int, live: pa.Table, changed: pa.Table) -> Write:
    """What to write after a batch: ``changed`` (a segment from ``as_segment``) appended to
    a log of ``logged_rows`` rows, or the log compacted to ``live`` (the fold after the
    change) when the log would hold more than twice the live keys."""
    if logged_rows + changed.num_rows > 2 * live.num_rows:
        return Write(as_segment(live), replace=True)
    return Write(changed, replace=False)
