"""The segment log (stateful_ops/segment_log.py) against a dict model: the fold of whatever
the writes left equals the model after every batch, and the log stays within its bound."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from eospack.stateful_ops.segment_log import TOMBSTONE_COLUMN, as_segment, fold, next_write

KEYS = ["user", "n"]
SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64()), ("count", pa.int64())])


def rows(entries: list[tuple[str | None, int | None, int]]) -> pa.Table:
    users, numbers, counts = zip(*entries, strict=True) if entries else ((), (), ())
    return pa.table({"user": list(users), "n": list(numbers), "count": list(counts)}, schema=SCHEMA)


def keys_only(entries: list[tuple[str | None, int | None]]) -> pa.Table:
    users, numbers = zip(*entries, strict=True) if entries else ((), ())
    return pa.table(
        {"user": pa.array(list(users), pa.string()), "n": pa.array(list(numbers), pa.int64())}
    )


def as_model(table: pa.Table) -> dict[tuple[str | None, int | None], int]:
    found = {}
    for row in table.to_pylist():
        key = (row["user"], row["n"])
        assert key not in found, f"key {key} twice in a fold"
        found[key] = row["count"]
    return found


def test_a_later_row_wins_tombstones_remove_and_nulls_are_a_key() -> None:
    first = as_segment(rows([("a", 1, 1), (None, None, 5), ("a", None, 7)]))
    second = as_segment(rows([("a", 1, 2), ("a", 1, 3)]), removed=keys_only([(None, None)]))
    third = as_segment(rows([(None, None, 9)]))
    assert as_model(fold([first, second], KEYS)) == {("a", 1): 3, ("a", None): 7}
    assert as_model(fold([first, second, third], KEYS)) == {
        ("a", 1): 3,
        ("a", None): 7,
        (None, None): 9,
    }
    assert fold([first], KEYS).column_names == ["user", "n", "count"]


def test_an_empty_log_folds_to_no_rows_and_a_fold_needs_the_schema() -> None:
    assert fold([as_segment(rows([]))], KEYS).num_rows == 0
    with pytest.raises(ValueError, match="at least one segment"):
        fold([], KEYS)


def test_a_tombstone_row_carries_only_its_key() -> None:
    segment = as_segment(rows([("a", 1, 1)]), removed=keys_only([("b", 2)]))
    assert segment.to_pylist()[1] == {"user": "b", "n": 2, "count": None, TOMBSTONE_COLUMN: True}


@pytest.mark.parametrize("run", range(3))
def test_random_batches_fold_to_the_model_within_the_bound(run: int) -> None:
    seed = random.randrange(2**32)  # drawn in the test: xdist workers must collect alike
    print(f"run {run}: seed {seed}")
    chooser = random.Random(seed)
    universe = [(user, n) for user in ("a", "b", None) for n in (1, 2, None)]
    universe += [(f"k{index}", index) for index in range(40)]
    model: dict[tuple[str | None, int | None], int] = {}
    log: list[pa.Table] = [as_segment(rows([]))]
    written = changed_total = 0
    for _ in range(200):
        touched = chooser.sample(universe, chooser.randint(0, 12))
        removed = [key for key in chooser.sample(universe, chooser.randint(0, 4)) if key in model]
        removed = [key for key in removed if key not in touched]
        updates = [(*key, model.get(key, 0) + chooser.randint(1, 3)) for key in touched]
        for user, n, count in updates:
            model[(user, n)] = count
        for key in removed:
            del model[key]
        changed = as_segment(rows(updates), removed=keys_only(removed))
        logged = sum(segment.num_rows for segment in log)
        live = fold([*log, changed], KEYS)
        write = next_write(logged, live, changed)
        log = [write.segment] if write.replace else [*log, write.segment]
        written += write.segment.num_rows
        changed_total += changed.num_rows
        assert as_model(fold(log, KEYS)) == model
        assert sum(segment.num_rows for segment in log) <= 2 * len(model) + changed.num_rows
    assert written <= 3 * changed_total + len(universe), (written, changed_total)
