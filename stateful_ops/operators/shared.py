"""What the ready operators share: internal column names, the key numbering, field helpers.

``key_codes`` numbers keys by first appearance, nulls included as a key; running_count and
deduplicate both rely on that order (stored keys first, then new keys in order of arrival).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from pyspark.sql.types import LongType, StructField

from ..errors import OperatorDefinitionError

EVENT_US = "__so_event_us"
NEW_ROWS = "__so_new_rows"


def next_versions(
    versions: np.ndarray, changed: np.ndarray, ttl_ms: int | None, processing_time_ms: int
) -> np.ndarray:
    """Each key's version after a batch: one more where the key changed. ``versions`` is 0
    for a key not in state. Without ttl a new key starts at 1. With ttl a key may leave
    the state and come back, so a new key starts at the batch's timestamp (ms): every
    earlier life of the key ended below it (a life starting at T and changed in n batches
    ends at T + n - 1, at most its last batch's timestamp, which is earlier than this
    batch's while batch timestamps increase), so a sink with ``versionColumn=version``
    takes the new life's rows. A replayed batch has the same timestamp, hence the same
    versions."""
    first = 1 if ttl_ms is None else max(1, processing_time_ms)
    starting = changed & (versions == 0)
    return np.where(starting, first, versions + changed.astype(np.int64))


def long_field(name: str) -> StructField:
    return StructField(name, LongType(), True)


def refuse_name_clash(operator: str, keys: Sequence[str], outputs: Sequence[str]) -> None:
    clash = sorted(set(keys) & set(outputs))
    if clash:
        raise OperatorDefinitionError(
            f"{operator}: key column(s) {', '.join(clash)} clash with output columns;"
            " rename them with withColumnRenamed first"
        )


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
