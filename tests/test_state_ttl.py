"""ttl on running_count's state, without Spark: the base class's expiry bookkeeping
(``update_live``, ``expire``, ``next_wake_up_ms``) on a bound operator and a fixed clock."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from eospack.stateful_ops import OperatorDefinitionError
from eospack.stateful_ops.base import EXPIRES_COLUMN, Clock
from eospack.stateful_ops.operators.deduplicate import Deduplicate
from eospack.stateful_ops.operators.running_count import RunningCount


def bound(ttl: object) -> RunningCount:
    operator = RunningCount("k", ttl=ttl)
    operator.bind(["k"], StructType([StructField("k", StringType())]))
    return operator


def batch(operator: RunningCount, state: pd.DataFrame, keys: list[str], at_ms: int) -> tuple:
    rows = operator.fold(iter([pd.DataFrame({"k": keys})]))
    new_state, output = operator.update_live(rows, state, Clock(at_ms, None))
    return new_state, sorted(map(tuple, output[["k", "count", "version"]].to_numpy().tolist()))


def as_dict(state: pd.DataFrame) -> dict[str, tuple[int, int, int]]:
    return {
        row["k"]: (int(row["count"]), int(row["version"]), int(row[EXPIRES_COLUMN]))
        for row in state.to_dict("records")
    }


def test_touched_keys_expire_ttl_after_their_batch_and_untouched_keep_their_expiry() -> None:
    operator = bound("10 seconds")
    state, output = batch(operator, operator.empty_state(), ["a", "a", "b"], 1_000)
    assert output == [("a", 2, 1), ("b", 1, 1)]
    assert as_dict(state) == {"a": (2, 1, 11_000), "b": (1, 1, 11_000)}
    state, output = batch(operator, state, ["b"], 5_000)
    assert output == [("b", 2, 2)]
    assert as_dict(state) == {"a": (2, 1, 11_000), "b": (2, 2, 15_000)}
    assert operator.next_wake_up_ms(state, Clock(5_000, None)) == 11_000
    # At 11 s a's ttl has run out: it is gone before the batch, and comes back from nothing.
    state, output = batch(operator, state, ["a", "c"], 11_000)
    assert output == [("a", 1, 1), ("c", 1, 1)]
    assert as_dict(state) == {"b": (2, 2, 15_000), "a": (1, 1, 21_000), "c": (1, 1, 21_000)}


def test_a_fired_timeout_drops_exactly_the_keys_whose_ttl_ran_out() -> None:
    operator = bound("10 seconds")
    state, _ = batch(operator, operator.empty_state(), ["a"], 1_000)
    state, _ = batch(operator, state, ["b"], 4_000)
    kept, output = operator.expire(state, Clock(11_000, None))
    assert as_dict(kept) == {"b": (1, 1, 14_000)} and not len(output)
    kept, _ = operator.expire(kept, Clock(14_000, None))
    assert not len(kept)


def test_ttl_is_a_duration_and_refused_where_the_operator_expires_keys_itself() -> None:
    with pytest.raises(OperatorDefinitionError, match=r"running_count: ttl='soon' is not a"):
        RunningCount("k", ttl="soon")
    with pytest.raises(OperatorDefinitionError, match="ttl is not supported here"):

        class Expiring(Deduplicate):
            timeout = "processing"

        RunningCount.__init__(Expiring("k", "1 minute"), "k", ttl="1 minute")
    assert RunningCount("k").ttl_ms is None and RunningCount("k").timeout == "none"
    assert bound("2 minutes").timeout == "processing"


def test_a_savepoint_without_expiries_restored_with_ttl_gets_the_full_ttl_and_back(
    spark: Any,
) -> None:
    """Turning ttl on or off goes through a savepoint (``with_expiry_of``, used by the
    split of ``initial_state``): on, each key expires ttl after the restore; off, the
    expiries are dropped."""
    import time

    from eospack.stateful_ops.initial_state import with_expiry_of

    saved = spark.createDataFrame([("a", 2, 1), ("b", 1, 1)], "k string, count long, version long")
    before = int(time.time() * 1000)
    restored = with_expiry_of(bound("1 minute"), saved)
    assert restored.columns == ["k", "count", "version", EXPIRES_COLUMN]
    expiries = [row[EXPIRES_COLUMN] for row in restored.collect()]
    assert len(set(expiries)) == 1 and before + 60_000 <= expiries[0] <= time.time() * 1000 + 60_000
    plain = RunningCount("k")
    plain.bind(["k"], StructType([StructField("k", StringType())]))
    back = with_expiry_of(plain, restored)
    assert back.columns == ["k", "count", "version"]
    assert sorted(back.collect()) == sorted(saved.collect())
    assert with_expiry_of(plain, saved) is saved
