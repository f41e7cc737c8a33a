"""The segment log's store side without Spark: which rows a batch writes (``change``) and
how TWS frames are named back (``named``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pandas as pd
import pyarrow as pa

from eospack.stateful_ops.segment_log_state import change, named

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("count", pa.int64())])


def operator() -> Any:
    return cast(
        Any,
        SimpleNamespace(
            keys=("k", "n"), log_key_columns=lambda: ("k", "n"), arrow_state_schema=SCHEMA
        ),
    )


def table(rows: list[tuple[Any, Any, Any]]) -> pa.Table:
    return pa.table(
        {name: [row[i] for row in rows] for i, name in enumerate(SCHEMA.names)}, schema=SCHEMA
    )


def test_change_writes_new_and_changed_rows_and_tombstones_removed_keys() -> None:
    stored = table([("a", 1, 1), (None, None, 2), ("b", 1, 3), ("c", None, None)])
    new = table([("a", 1, 1), (None, None, 5), ("d", 2, 1), ("c", None, None)])

    changed, removed = change(operator(), stored, new)

    # Unchanged rows (nulls equal to nulls, null keys a key) are not written again.
    assert changed.to_pylist() == [
        {"k": None, "n": None, "count": 5},
        {"k": "d", "n": 2, "count": 1},
    ]
    assert removed.to_pylist() == [{"k": "b", "n": 1}]


def test_change_of_an_empty_state_writes_everything_and_removes_nothing() -> None:
    new = table([("a", 1, 1)])
    changed, removed = change(operator(), table([]), new)
    assert changed.equals(new)
    assert removed.num_rows == 0
    changed, removed = change(operator(), new, table([]))
    assert changed.num_rows == 0
    assert removed.to_pylist() == [{"k": "a", "n": 1}]


def test_named_gives_tws_frames_their_column_names_back() -> None:
    columns = ("k", "__so_partial_count", "__so_key_group")
    renamed = pd.DataFrame({"k": ["a"], "_1": [2], "_2": [0]})  # pyspark 4.1+: itertuples
    with_key_first = pd.DataFrame([[0, "a", 2, 0]])  # pyspark 4.0: the grouping key first
    frames = list(named(iter([renamed, with_key_first]), columns))
    for frame in frames:
        assert list(frame.columns) == list(columns)
        assert frame.iloc[0].tolist() == ["a", 2, 0]
