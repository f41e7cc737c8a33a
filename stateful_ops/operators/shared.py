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
