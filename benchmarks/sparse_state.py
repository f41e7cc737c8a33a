"""17. State bytes written by a sparse batch: 1,000 rows on random keys over 1M keys in state.

Issue 41's row: the bytes of state files one micro-batch writes when it touches few of many
keys, against Spark's built-in ``groupBy("key").count()`` in the same run, on the same store
(RocksDB with changelog checkpointing: a batch uploads only the records it changed, so the
changelog files of a batch are what it wrote; snapshots are materialised in the background
from the whole state and are left out for every contender alike).

The contenders read the same Parquet files: one file with every key once (the load batch),
then ``SPARSE_BATCHES`` files of ``SPARSE_ROWS`` rows on random keys, one file per batch.

- ``running_count`` (key groups, the shipped layout): a batch rewrites the state row of every
  key group it touches, so 1,000 random keys rewrite the whole state.
- ``running_count (segment log)`` (``state_layout="segment-log"``, opt-in): each key group
  keeps a list of Arrow segments in a ``transformWithStateInPandas`` ListState, a batch
  appends one segment with its changed keys (RocksDB merges the appended element only), and
  a group whose log outgrows twice its live keys is compacted to one segment
  (``stateful_ops/segment_log_state.py``). It replaced the hand-written candidate processor
  that measured the design first (1.24x, benchmarks/results/2026-11-29-sparse-state.md).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import Comparison, Figure, Report, say
from eospack.lab.testing import await_query, session_settings
from eospack.stateful_ops.state_store import state_store_conf

TIMEOUT = 1800.0
SPARSE_ROWS = 1000
SPARSE_BATCHES = 5
TARGET = 5.0
"""Issue 41's goal: a sparse batch writes at most 5x the built-in count's state bytes."""


def sparse_parquet_directory(directory: Path, keys: int, seed: int = 41) -> Path:
    """Every key once, then ``SPARSE_BATCHES`` files of ``SPARSE_ROWS`` random keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"key": pa.array(np.char.add("k", np.arange(keys).astype(str)))}),
        directory / "part-00000.parquet",
    )
    random = np.random.default_rng(seed)
    for index in range(1, SPARSE_BATCHES + 1):
        chosen = random.integers(0, keys, SPARSE_ROWS)
        pq.write_table(
            pa.table({"key": pa.array(np.char.add("k", chosen.astype(str)))}),
            directory / f"part-{index:05d}.parquet",
        )
    return directory


def changelog_bytes_by_version(checkpoint: Path) -> dict[int, int]:
    """Bytes of the RocksDB changelog files of each state version, all partitions summed."""
    written: dict[int, int] = {}
    for path in (checkpoint / "state").rglob("*.changelog"):
        match = re.fullmatch(r"(\d+)\.changelog", path.name)
        if match:
            version = int(match.group(1))
            written[version] = written.get(version, 0) + path.stat().st_size
    return written


def run_sparse(spark: Any, directory: Path, query: Callable) -> tuple[list[int], list[float]]:
    """The changelog bytes and the durations (s) of the sparse batches of one query."""
    checkpoint = Path(tempfile.mkdtemp(prefix="bench-sparse-"))
    events = spark.readStream.schema("key string").option("maxFilesPerTrigger", 1)
    started = (
        query(events.parquet(str(directory)))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(started, TIMEOUT)
    durations = [
        progress["durationMs"]["triggerExecution"] / 1000
        for progress in started.recentProgress
        if progress["numInputRows"] and progress["batchId"] > 0
    ]
    written = changelog_bytes_by_version(checkpoint)
    # State version v is written by batch v - 1; batch 0 is the load.
    return [written.get(batch + 1, 0) for batch in range(1, SPARSE_BATCHES + 1)], durations


def built_in_count(events: Any) -> Any:
    return events.groupBy("key").count()


def running_count_query(events: Any) -> Any:
    from eospack.stateful_ops import running_count

    return running_count(events, "key")


def segment_log_query(events: Any) -> Any:
    from eospack.stateful_ops import running_count

    return running_count(events, "key", state_layout="segment-log")


def run(report: Report, spark: Any, workdir: Path, keys: int) -> None:
    """The row: running_count on both layouts against the built-in count."""
    say(
        f"sparse state: {keys:,} keys loaded, then {SPARSE_BATCHES} batches of {SPARSE_ROWS:,}"
        " rows on random keys (RocksDB, changelog checkpointing)"
    )
    directory = sparse_parquet_directory(workdir / f"sparse-{keys}", keys)
    measured: dict[str, tuple[list[int], list[float]]] = {}
    with session_settings(spark, state_store_conf("rocksdb")):
        for label, query in (
            ("groupBy(key).count()", built_in_count),
            ("running_count", running_count_query),
            ("running_count (segment log)", segment_log_query),
        ):
            say(f"  sparse state: {label}")
            started = time.monotonic()
            measured[label] = run_sparse(spark, directory, query)
            say(f"  sparse state: {label} done in {time.monotonic() - started:.1f} s")
    baseline = _bytes_figure("groupBy(key).count()", measured)
    size = f"{SPARSE_ROWS:,} rows over {keys:,} keys"
    for label in ("running_count", "running_count (segment log)"):
        report.add(
            Comparison(
                "17. sparse state bytes",
                size,
                _bytes_figure(label, measured),
                baseline,
                target=TARGET,
                higher_is_better=False,
                note="changelog bytes per sparse batch",
            )
        )
    for label, (_, durations) in measured.items():
        report.add_figure(
            "17. sparse state bytes", Figure(f"{label}: sparse batch", tuple(durations), 1, "s")
        )
    report.notes.append(
        "sparse state: bytes are the RocksDB changelog files of each sparse batch (snapshots,"
        " written in the background from the whole state, left out for all contenders);"
        " 'running_count (segment log)' is running_count(..., state_layout='segment-log')"
    )


def _bytes_figure(label: str, measured: dict[str, tuple[list[int], list[float]]]) -> Figure:
    return Figure(label, tuple(float(size) for size in measured[label][0]), 1, "bytes")
