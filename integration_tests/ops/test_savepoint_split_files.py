"""Savepoint create's state files (``state_reader.write_state_files``) and the restore's
split (``initial_state.write_split``), written by the executors' Python workers, hold each
key once: files no successful task attempt reported, as a failed attempt leaves them, are
deleted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eospack.lab.testing import count_keys_to_noop
from eospack.stateful_ops.initial_state import KEY_GROUP_PARTITION, write_split
from eospack.stateful_ops.state_reader import state_frame, write_state_files


@pytest.mark.timeout(300)
def test_split_holds_each_row_once_in_its_key_group(spark: Any, tmp_path: Path) -> None:
    rows = [(index % 5, f"key-{index}", index) for index in range(1000)]
    frame = spark.createDataFrame(rows, f"{KEY_GROUP_PARTITION} int, key string, count long")
    directory = tmp_path / "groups"
    leftover = directory / f"{KEY_GROUP_PARTITION}=0" / "part-failed-attempt.parquet"
    leftover.parent.mkdir(parents=True)
    pq.write_table(pa.table({"key": ["key-0"], "count": pa.array([99], pa.int64())}), leftover)

    write_split(frame.repartition(3), directory)

    assert not leftover.exists()
    for group in range(5):
        table = pq.read_table(str(directory / f"{KEY_GROUP_PARTITION}={group}"), partitioning=None)
        assert table.column_names == ["key", "count"]
        keys, counts = table.column("key").to_pylist(), table.column("count").to_pylist()
        found = sorted(zip(keys, counts, strict=True))
        assert found == sorted((key, count) for g, key, count in rows if g == group)
    assert sorted(path.name for path in directory.iterdir()) == [
        f"{KEY_GROUP_PARTITION}={group}" for group in range(5)
    ]


@pytest.mark.timeout(300)
def test_savepoint_state_files_hold_each_key_once(spark: Any, tmp_path: Path) -> None:
    """``write_state_files`` (create's one job) writes what ``state_frame`` reads, each key
    once, and deletes files no successful task attempt reported."""
    keys = [f"user-{index % 300}" for index in range(1000)]
    spark.createDataFrame([(key,) for key in keys], "key string").write.parquet(
        str(tmp_path / "input")
    )
    checkpoint = str(tmp_path / "checkpoint")
    count_keys_to_noop(spark, str(tmp_path / "input"), checkpoint, key_groups=8)
    directory = tmp_path / "state"
    leftover = directory / "part-failed-attempt.parquet"
    directory.mkdir()
    pq.write_table(pa.table({"key": ["user-0"]}), leftover)

    described = write_state_files(spark, checkpoint, None, 0, directory)

    assert described is not None and described.rows == 300 and described.key_groups == 8
    assert not leftover.exists()
    written = pq.read_table(str(directory))
    assert written.schema.remove_metadata() == described.schema
    counts = Counter(keys)
    assert sorted(
        zip(written.column("key").to_pylist(), written.column("count").to_pylist(), strict=True)
    ) == sorted(counts.items())
    stored = state_frame(spark, checkpoint, None, 0)
    assert stored is not None
    assert sorted(map(tuple, stored.frame.collect())) == sorted(
        map(tuple, spark.read.parquet(str(directory)).collect())
    )
