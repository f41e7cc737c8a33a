"""Savepoints of the segment log (``state_layout="segment-log"``) and restores into it
(issue 41, "state at scale": rescaling by savepoint must keep working with the new layout).

- ``eospack savepoint create`` of a segment-log checkpoint writes the rows a key-groups
  checkpoint of the same input gives (key columns, state fields, versions), so the
  savepoint format does not depend on the layout.
- Restored into the segment log (same or twice the key groups) and across layouts
  (segment log to key groups and back): the restored query's first batch emits exactly
  what the old query would have emitted next, and its state is exactly the savepoint's
  plus that batch; the next start finds every key group holding a log and stops
  bootstrapping.
- A driver SIGKILLed in the sink of the restored query's first batch (state loaded,
  nothing committed): the next start bootstraps once, nothing lost or counted twice.
- Processing-time ttl and per-key processing-time timers across a restore: an idle key
  still expires through its key group's timer, a due timer fires once, at its time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from eospack.cli import main
from eospack.lab.testing import session_settings, wait_until
from eospack.stateful_ops import TIMER_COLUMN, read_state, running_count
from eospack.stateful_ops.state_codec import EXPIRES_COLUMN
from eospack.stateful_ops.state_store import state_store_conf
from eospack.tools.savepoint import RestoredCheckpoint
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    Emitted,
    batch_timestamp_ms,
    countdown,
    run,
    source,
    write_batch,
)

ROCKSDB = {**state_store_conf("rocksdb"), NO_DATA_BATCHES: "false"}
RESTORE_DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "restore_kill_driver.py"
OLD_BATCHES = [list("abbcccdddd"), list("bex")]
"""The old query's input: keys by row. After both batches: a 1, b 3, c 3, d 4, e 1, x 1;
versions count the batches a key appeared in (b 2, the others 1)."""
OLD_STATE = {("a", 1, 1), ("b", 3, 2), ("c", 3, 1), ("d", 4, 1), ("e", 1, 1), ("x", 1, 1)}
NEXT_BATCH = list("adfa")
NEXT_OUTPUT = [("a", 3, 2), ("d", 5, 2), ("f", 1, 1)]
NEXT_STATE = {("b", 3, 2), ("c", 3, 1), ("e", 1, 1), ("x", 1, 1), *NEXT_OUTPUT}


def rows_of(keys: list[str]) -> list[dict[str, Any]]:
    return [{"k": key, "n": 1, "v": 1.0, "t": 0} for key in keys]


def counted(spark: SparkSession, root: Path, layout: str, key_groups: int = 4) -> Path:
    """A checkpoint of running_count on ``layout`` that ran ``OLD_BATCHES`` (a segment log
    of two segments per key group that b or e touched)."""
    inputs, checkpoint = root / "old-input", root / "old"
    inputs.mkdir(parents=True)
    for index, keys in enumerate(OLD_BATCHES):
        write_batch(str(inputs), index, rows_of(keys))
    with session_settings(spark, ROCKSDB):
        counts = running_count(
            source(spark, str(inputs)), "k", key_groups=key_groups, state_layout=layout
        )
        run(counts, str(checkpoint), "update", Emitted())
    return checkpoint


def savepointed(checkpoint: Path, savepoint: Path) -> dict[str, Any]:
    """``eospack savepoint create``; the manifest's one operator."""
    assert main(["savepoint", "create", str(checkpoint), str(savepoint)]) == 0
    manifest = json.loads((savepoint / "manifest.json").read_text())
    [operator] = manifest["operators"]
    return dict(operator)


def savepoint_rows(savepoint: Path, operator: dict[str, Any]) -> set[tuple[Any, ...]]:
    table = pq.read_table(str(savepoint / operator["file"]))
    return set(map(tuple, table.to_pandas().itertuples(index=False)))


def restored_run(
    spark: SparkSession,
    root: Path,
    savepoint: Path,
    layout: str,
    key_groups: int,
    batches: list[list[str]],
) -> tuple[Path, Emitted]:
    """Restore ``savepoint`` into a new checkpoint and run running_count on ``layout``
    from it over ``batches``, one start per batch."""
    restored, inputs = root / "restored", root / "new-input"
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    inputs.mkdir()
    sink = Emitted()
    for index, keys in enumerate(batches):
        write_batch(str(inputs), index, rows_of(keys))
        initial_state = RestoredCheckpoint(restored, spark).initial_state()
        with session_settings(spark, ROCKSDB):
            counts = running_count(
                source(spark, str(inputs)),
                "k",
                key_groups=key_groups,
                state_layout=layout,
                initial_state=initial_state,
            )
            run(counts, str(restored), "update", sink)
    return restored, sink


def state_rows(spark: SparkSession, checkpoint: Path) -> set[tuple[Any, ...]]:
    state = read_state(spark, str(checkpoint))
    return set(map(tuple, state[["k", "count", "version"]].itertuples(index=False)))


@pytest.mark.timeout(600)
def test_a_segment_log_savepoint_holds_the_rows_of_a_key_groups_savepoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The same input through either layout: the same columns, rows and key groups."""
    operators = {}
    rows = {}
    for layout in ("key-groups", "segment-log"):
        checkpoint = counted(spark, tmp_path / layout, layout)
        savepoint = tmp_path / layout / "savepoint"
        operators[layout] = savepointed(checkpoint, savepoint)
        rows[layout] = savepoint_rows(savepoint, operators[layout])
    assert rows["segment-log"] == rows["key-groups"] == OLD_STATE
    for field in ("name", "rows", "columns", "key_groups", "settings", "operator_name"):
        assert operators["segment-log"][field] == operators["key-groups"][field], field


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("old_layout", "new_layout", "key_groups"),
    [
        ("segment-log", "segment-log", 4),
        ("segment-log", "segment-log", 8),
        ("segment-log", "key-groups", 4),
        ("key-groups", "segment-log", 8),
    ],
)
def test_a_restore_continues_exactly_and_bootstraps_once(
    spark: SparkSession, tmp_path: Path, old_layout: str, new_layout: str, key_groups: int
) -> None:
    """The restored query's first batch emits what the old query would have next, its
    state is the savepoint's plus that batch; the second start stops bootstrapping (every
    key group holds state) and counts on."""
    checkpoint = counted(spark, tmp_path, old_layout)
    savepoint = tmp_path / "savepoint"
    savepointed(checkpoint, savepoint)
    restored, sink = restored_run(
        spark, tmp_path, savepoint, new_layout, key_groups, [NEXT_BATCH, ["x"]]
    )
    assert sink.final() == [(0, NEXT_OUTPUT), (1, [("x", 2, 2)])]
    assert state_rows(spark, restored) == (NEXT_STATE - {("x", 1, 1)}) | {("x", 2, 2)}
    split = restored / "eospack-savepoint" / "operator-0-split"
    assert (split / f"_bootstrapped-{key_groups}").exists()


def run_killed_restore(checkpoint: Path, inputs: Path, key_groups: int) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(RESTORE_DRIVER),
            "--checkpoint",
            str(checkpoint),
            "--input",
            str(inputs),
            "--key-groups",
            str(key_groups),
            "--kill-at",
            "batch",
            "--state-layout",
            "segment-log",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == -9, (result.returncode, result.stdout, result.stderr[-2000:])
    lines = result.stdout.splitlines()
    assert "KILLING" in lines and "NOT KILLED" not in lines


@pytest.mark.chaos  # a driver JVM of its own, ~40 s
@pytest.mark.timeout(900)
def test_a_driver_killed_in_the_bootstrap_batch_bootstraps_once_on_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    """SIGKILL in the sink of the restored query's first batch (segment log, twice the key
    groups): the state it loaded was never committed, so the next start loads the split
    again, once: nothing lost, nothing counted twice."""
    checkpoint = counted(spark, tmp_path, "segment-log")
    savepoint = tmp_path / "savepoint"
    savepointed(checkpoint, savepoint)
    restored, inputs = tmp_path / "restored", tmp_path / "new-input"
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    inputs.mkdir()
    write_batch(str(inputs), 0, rows_of(NEXT_BATCH))
    run_killed_restore(restored, inputs, 8)
    assert not (restored / "commits" / "0").exists()
    sink = Emitted()
    with session_settings(spark, ROCKSDB):
        counts = running_count(
            source(spark, str(inputs)),
            "k",
            key_groups=8,
            state_layout="segment-log",
            initial_state=RestoredCheckpoint(restored, spark).initial_state(),
        )
        run(counts, str(restored), "update", sink)
    assert sink.final() == [(0, NEXT_OUTPUT)]
    assert state_rows(spark, restored) == NEXT_STATE


@pytest.mark.timeout(600)
def test_processing_time_ttl_expires_an_idle_restored_key_through_its_timer(
    spark: SparkSession, tmp_path: Path
) -> None:
    """x and y, savepointed, restored on the segment log: x again at once (count 2), then
    after the ttl x and u: x counts from 1 again and y, whose key group gets no row, left
    the state through its key group's timer."""
    groups = dict(
        spark.createDataFrame([(k,) for k in "xyu"], "k string")
        .selectExpr("k", "pmod(xxhash64(k), 4)")
        .collect()
    )
    assert groups["y"] not in (groups["x"], groups["u"]), groups
    ttl_ms = 10_000  # longer than savepoint, restore and start: y is loaded before it expires
    old_input, old = tmp_path / "old-input", tmp_path / "old"
    old_input.mkdir()
    write_batch(str(old_input), 0, rows_of(["x", "y"]))

    def counts(directory: Path, initial_state: Any = None) -> Any:
        return running_count(
            source(spark, str(directory)),
            "k",
            key_groups=4,
            ttl=f"{ttl_ms} ms",
            state_layout="segment-log",
            initial_state=initial_state,
        )

    with session_settings(spark, ROCKSDB):
        run(counts(old_input), str(old), "update", Emitted())
    savepoint, restored, new_input = tmp_path / "savepoint", tmp_path / "restored", tmp_path / "in"
    savepointed(old, savepoint)
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    new_input.mkdir()
    sink = Emitted()
    for index, keys in enumerate([["x"], ["x", "u"]]):
        write_batch(str(new_input), index, rows_of(keys))
        with session_settings(spark, ROCKSDB):
            initial_state = RestoredCheckpoint(restored, spark).initial_state()
            query = run(counts(new_input, initial_state), str(restored), "update", sink)
        if index == 0:
            assert [(b, [row[:2] for row in rows]) for b, rows in sink.final()] == [(0, [("x", 2)])]
            assert {row[:2] for row in state_rows(spark, restored)} == {("x", 2), ("y", 1)}
            expired_at = pd.Timestamp(query.lastProgress["timestamp"]).timestamp() + ttl_ms / 1000
            wait_until(lambda: time.time() > expired_at + 0.5, 30, "the ttl")  # noqa: B023
    assert [row[:2] for row in sink.final()[1][1]] == [("u", 1), ("x", 1)]
    assert {row[:2] for row in state_rows(spark, restored)} == {("u", 1), ("x", 1)}


@pytest.mark.timeout(600)
def test_a_restored_processing_time_timer_fires_once_at_its_time(
    spark: SparkSession, tmp_path: Path
) -> None:
    """countdown (per-key processing-time timers) savepointed with a's timer 2 s after the
    old batch, restored on the segment log: a fires exactly once, at that time, in
    whichever restored batch first reaches it; b's timer, far away, stays registered."""
    countdown_class = countdown("processing")
    old_input, old = tmp_path / "old-input", tmp_path / "old"
    old_input.mkdir()
    write_batch(str(old_input), 0, [{"k": "a", "n": 2, "v": 0.0, "t": 0}])

    def output(directory: Path, initial_state: Any = None) -> Any:
        operator = countdown_class(
            "k", key_groups=4, state_layout="segment-log", initial_state=initial_state
        )
        return operator.apply(source(spark, str(directory)))

    with session_settings(spark, ROCKSDB):
        run(output(old_input), str(old), "update", Emitted())
    due_ms = batch_timestamp_ms(old, 0) + 2000
    savepoint, restored, new_input = tmp_path / "savepoint", tmp_path / "restored", tmp_path / "in"
    savepointed(old, savepoint)
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    new_input.mkdir()
    sink = Emitted()
    for index in range(2):
        write_batch(str(new_input), index, [{"k": "b", "n": 600, "v": 0.0, "t": 0}])
        with session_settings(spark, ROCKSDB):
            initial_state = RestoredCheckpoint(restored, spark).initial_state()
            run(output(new_input, initial_state), str(restored), "update", sink)
        wait_until(lambda: time.time() * 1000 > due_ms + 100, 20, "a's timer to be due")
    fired = [row for _, rows in sink.final() for row in rows]
    assert fired == [("a", 1, due_ms)]
    state = read_state(spark, str(restored))
    assert list(state["k"]) == ["b"]
    assert int(state["count"].iloc[0]) == 2
    assert int(state[TIMER_COLUMN].iloc[0]) == batch_timestamp_ms(restored, 1) + 600_000


@pytest.mark.timeout(600)
def test_a_named_segment_log_operator_restores_by_name_and_stops_bootstrapping(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A named operator's savepoint state, claimed by name (``initial_states``): its
    restored checkpoint's state is found by that name (the settings ValueState), so the
    second start stops bootstrapping and the savepoint operator counts as held."""
    old_input, old = tmp_path / "old-input", tmp_path / "old"
    old_input.mkdir()
    for index, keys in enumerate(OLD_BATCHES):
        write_batch(str(old_input), index, rows_of(keys))

    def counts(directory: Path, initial_state: Any = None) -> Any:
        return running_count(
            source(spark, str(directory)),
            "k",
            key_groups=4,
            name="counts",
            state_layout="segment-log",
            initial_state=initial_state,
        )

    with session_settings(spark, ROCKSDB):
        run(counts(old_input), str(old), "update", Emitted())
    savepoint, restored, new_input = tmp_path / "savepoint", tmp_path / "restored", tmp_path / "in"
    assert savepointed(old, savepoint)["operator_name"] == "counts"
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    new_input.mkdir()
    sink = Emitted()
    for index, keys in enumerate([NEXT_BATCH, ["x"]]):
        write_batch(str(new_input), index, rows_of(keys))
        with session_settings(spark, ROCKSDB):
            [initial_state] = (
                RestoredCheckpoint(restored, spark).initial_states(["counts"]).values()
            )
            run(counts(new_input, initial_state), str(restored), "update", sink)
    assert sink.final() == [(0, NEXT_OUTPUT), (1, [("x", 2, 2)])]
    split = restored / "eospack-savepoint" / "operator-counts-split"
    assert (split / "_bootstrapped-4").exists()


@pytest.mark.timeout(600)
def test_a_savepoint_holds_expiries_at_the_ttl_of_the_key_groups_last_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    """x and y in one key group with a ttl of 1 hour, then x alone with 2 hours: the
    key-groups layout rewrites the group's row with y's expiry moved to the new ttl
    (``load_value``); the log keeps y's segment as written, so the savepoint moves it:
    both keys' expiries are at 2 hours from their last batch with rows."""
    inputs, checkpoint = tmp_path / "in", tmp_path / "old"
    inputs.mkdir()
    for index, (keys, ttl) in enumerate([(["x", "y"], "1 hour"), (["x"], "2 hours")]):
        write_batch(str(inputs), index, rows_of(keys))
        with session_settings(spark, ROCKSDB):
            counts = running_count(
                source(spark, str(inputs)), "k", key_groups=1, ttl=ttl, state_layout="segment-log"
            )
            run(counts, str(checkpoint), "update", Emitted())
    savepoint = tmp_path / "savepoint"
    operator = savepointed(checkpoint, savepoint)
    table = pq.read_table(str(savepoint / operator["file"])).to_pandas()
    expires = dict(zip(table["k"], table[EXPIRES_COLUMN], strict=True))
    two_hours = 2 * 3600 * 1000
    assert expires == {
        "x": batch_timestamp_ms(checkpoint, 1) + two_hours,
        "y": batch_timestamp_ms(checkpoint, 0) + two_hours,
    }
