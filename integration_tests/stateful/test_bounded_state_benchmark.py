"""Benchmark 18 (bounded state under ttl) at a tiny scale: the benchmark's query runs, and
its state after the last batch is exactly what the ttl leaves, replayed from the rows each
batch read (the rate source's values are consecutive) and the batch timestamps the offset
log recorded. The full run (30 minutes, 1M keys per 5 minutes) is ``make
bench-bounded-state``; the brief's scaled run (2 minutes, 20k keys per 30 s) takes 2 minutes
by construction, so this test runs 30 s at 3,000 keys per 6 s ttl, with a 2 s trigger."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bounded_state import Load, keys_of_rows, measure
from eospack.stateful_ops import read_state
from integration_tests.stateful_parts import batch_timestamp_ms

EXPIRES = "__so_expires_at_ms"  # stateful_ops.state_codec.EXPIRES_COLUMN


def replayed_state(
    load: Load, checkpoint: str, input_rows: dict[int, int], last_batch: int
) -> set[tuple[str, int, int]]:
    """(key, count, expiry) of every key the ttl keeps after ``last_batch``: each batch
    first drops the keys whose expiry is at or before its time, then counts its rows and
    sets their keys' expiry to its time plus the ttl."""
    ttl_ms = round(load.ttl_seconds * 1000)
    state: dict[str, tuple[int, int]] = {}
    value = 0
    for batch_id in sorted(input_rows)[: last_batch + 1]:
        now = batch_timestamp_ms(checkpoint, batch_id)
        state = {key: kept for key, kept in state.items() if kept[1] > now}
        for key in keys_of_rows(load, value, value + input_rows[batch_id]):
            state[key] = (state.get(key, (0, 0))[0] + 1, now + ttl_ms)
        value += input_rows[batch_id]
    return {(key, count, expires) for key, (count, expires) in state.items()}


@pytest.mark.chaos  # a 30 s run of benchmark 18 plus its session, ~50 s
@pytest.mark.timeout(240)
def test_bounded_state_benchmark_keeps_exactly_the_live_keys(spark: Any, tmp_path: Path) -> None:
    load = Load(
        minutes=0.5, keys_per_period=2_000, period_seconds=10, ttl_seconds=10, trigger_seconds=2
    )
    lines: list[str] = []
    started = time.monotonic()
    measurement = measure(spark, load, tmp_path, progress=lines.append)
    print(f"measured in {time.monotonic() - started:.1f} s:", *lines, sep="\n")

    batches = sorted(measurement.input_rows)
    assert batches == list(range(len(batches))), "a batch's progress report was missed"
    # Every key group must be called in every batch for the replay to be exact: with
    # hundreds of rows per batch over 8 key groups, each gets rows.
    assert all(rows >= 200 for rows in list(measurement.input_rows.values())[1:])
    last = measurement.samples[-1]
    assert last.batch_id == batches[-1]
    stored = read_state(spark, measurement.checkpoint, last.batch_id)
    kept = {
        (key, int(count), int(expires))
        for key, count, expires in stored[["key", "count", EXPIRES]].itertuples(index=False)
    }
    rows = measurement.input_rows
    assert kept == replayed_state(load, measurement.checkpoint, rows, last.batch_id)
    # Every sample counted keys (not key groups) after its batch.
    assert [sample.keys for sample in measurement.samples] == [
        len(replayed_state(load, measurement.checkpoint, rows, sample.batch_id))
        for sample in measurement.samples
    ]
    assert measurement.max_keys == max(sample.keys for sample in measurement.samples) > 0
