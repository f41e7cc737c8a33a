"""Adversarial review of a restored event-time operator (issue 35, item 4; a65746c,
267a162): whatever reaches it after a savepoint restore, a restored query emits what a
query that never stopped emits (each row once), on the shared session with file input
(``event_time_restore_parts``).

Attacks: running_count keyed by a watermarked column and running_aggregate fed one (no
late-row filter may apply: they have no event-time timeouts); sessionize restored in
claim mode with twice the key groups and twice the shuffle partitions; sessions open in
every key group that all time out in the restored query's first no-data batch (and, with
no-data batches off, in data batches of other key groups) while it still bootstraps;
deduplicate on rows carrying a column of every type, all-null columns among them, so the
empty frames of timed-out calls hold each dtype; and sessions open at the savepoint,
restored (and, for the reference, restarted) under another session time zone.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from eospack.stateful_ops import deduplicate, running_aggregate, running_count, sessionize
from integration_tests.ops.event_time_restore_parts import (
    EVENT_T0,
    SHUFFLE_PARTITIONS,
    TIME_ZONE,
    Restore,
    reference_and_restored,
)

pytestmark = pytest.mark.integration
CHAOS = pytest.mark.chaos

# (key, second) per file, one file per micro-batch; a watermark delay of 5 s. Late rows
# (behind the previous batch's watermark) in the restored query's first batch (b1) and
# later (a20, y3); a restart after the second piece.
PIECES = [
    [[("a", 0), ("b", 2), ("c", 4), ("a", 5), ("d", 6)], [("a", 9), ("z", 40)]],
    [[("b", 1), ("c", 30), ("e", 41), ("z", 45)], [("a", 20), ("y", 3), ("f", 70)]],
    [[("g", 100)], [("c", 60), ("h", 101)]],
]
KEYS = [f"k{index:02d}" for index in range(24)]
# Sessions open in every key group at the savepoint (watermark 3, each session ends at
# 8 s or later); the restored query's first batch moves the watermark to 95, so its next
# batch times out every one of them while the query still bootstraps.
ALL_GROUPS_PIECES = [
    [[(key, index % 8) for index, key in enumerate(KEYS)], [("w", 8)]],
    [[("k01", 2), ("x", 100)], [("k02", 101)], [("y", 102)]],
    [[("k00", 200)], [("y", 300)]],
]


def sessions(events: Any, initial: Any, key_groups: int) -> Any:
    return sessionize(
        events.select("k", "ts"),
        "k",
        "ts",
        "8 seconds",
        key_groups=key_groups,
        initial_state=initial,
    ).selectExpr(
        "k",
        f"unix_seconds(session_start) - {EVENT_T0}",
        f"unix_seconds(session_end) - {EVENT_T0}",
        "count",
    )


def counts_by_timestamp(events: Any, initial: Any, key_groups: int) -> Any:
    counted = running_count(
        events.select("k", "ts"),
        ["k", "ts"],
        key_groups=key_groups,
        output_mode="append",
        initial_state=initial,
    )
    return counted.selectExpr("k", f"unix_seconds(ts) - {EVENT_T0}", "count", "version")


def aggregates_beside_a_watermark(events: Any, initial: Any, key_groups: int) -> Any:
    aggregated = running_aggregate(
        events.select("k", "ts", "t"),
        "k",
        {"t": ["max", "min", "count"]},
        key_groups=key_groups,
        output_mode="append",
        initial_state=initial,
    )
    return aggregated.drop("ts") if "ts" in aggregated.columns else aggregated


def firsts_of_every_type(events: Any, initial: Any, key_groups: int) -> Any:
    wide = events.select(
        "k",
        "ts",
        "t",
        F.lit(None).cast("string").alias("null_string"),
        F.lit(None).cast("double").alias("null_double"),
        F.lit(None).cast("timestamp").alias("null_timestamp"),
        F.lit(None).cast("boolean").alias("null_boolean"),
        F.lit(None).cast("decimal(20,5)").alias("null_decimal"),
        (F.col("t") % 7 / 3).cast("decimal(20,5)").alias("decimal"),
        F.to_date("ts").alias("date"),
        F.col("ts").cast("timestamp_ntz").alias("wall_time"),
        F.encode("k", "utf-8").alias("binary"),
        F.array(F.col("t"), F.lit(None).cast("long")).alias("array"),
        (F.col("t") % 2 == 0).alias("even"),
        F.col("t").cast("int").alias("small"),
        F.col("t").cast("float").alias("single"),
    )
    firsts = deduplicate(
        wide, "k", "20 seconds", event_time="ts", key_groups=key_groups, initial_state=initial
    )
    return firsts.withColumn("t", F.col("t") - EVENT_T0).drop("ts")


def assert_restored_like_reference(
    reference: list[tuple[Any, ...]], continued: list[tuple[Any, ...]]
) -> None:
    assert reference, "the reference emitted nothing"
    assert Counter(continued) == Counter(reference)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(counts_by_timestamp, id="running_count-keyed-by-ts"),
        # The same rule as running_count's (no event-time timeouts): the chaos lane only.
        pytest.param(aggregates_beside_a_watermark, id="running_aggregate-fed-ts", marks=CHAOS),
    ],
)
def test_restored_running_operators_on_a_watermarked_input_keep_every_row(
    spark: Any, tmp_path: Path, build: Any
) -> None:
    """No event-time timeouts, so Spark drops no late row before them: b1, a20 and y3
    (behind the watermark) are counted, restored or not."""
    reference, continued = reference_and_restored(spark, tmp_path, build, PIECES, no_data=True)
    assert_restored_like_reference(reference, continued)
    keys = {row[0] for row in reference}
    assert {"y", "b", "a"} <= keys


@pytest.mark.timeout(300)
def test_a_claimed_restore_with_twice_the_key_groups_and_partitions_closes_sessions_alike(
    spark: Any, tmp_path: Path
) -> None:
    partitions = int(spark.conf.get(SHUFFLE_PARTITIONS))
    restore = Restore(
        mode="claim", key_groups=8, settings={SHUFFLE_PARTITIONS: str(2 * partitions)}
    )
    reference, continued = reference_and_restored(
        spark, tmp_path, sessions, ALL_GROUPS_PIECES, no_data=True, restore=restore
    )
    assert_restored_like_reference(reference, continued)
    assert not (tmp_path / "savepoint").exists() or not any((tmp_path / "savepoint").iterdir())


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "no_data",
    [pytest.param(True, id="no-data"), pytest.param(False, id="data-only", marks=CHAOS)],
)
def test_sessions_open_in_every_key_group_time_out_alike_while_the_restore_bootstraps(
    spark: Any, tmp_path: Path, no_data: bool
) -> None:
    reference, continued = reference_and_restored(
        spark, tmp_path, sessions, ALL_GROUPS_PIECES, no_data=no_data
    )
    assert_restored_like_reference(reference, continued)
    closed = {row[0] for row in reference}
    assert set(KEYS) - {"k01", "k02"} <= closed


@pytest.mark.timeout(300)
def test_empty_frames_of_every_column_type_in_restored_timeouts(spark: Any, tmp_path: Path) -> None:
    reference, continued = reference_and_restored(
        spark, tmp_path, firsts_of_every_type, PIECES, no_data=True
    )
    assert_restored_like_reference(reference, continued)


@pytest.mark.timeout(300)
def test_sessions_open_at_the_savepoint_restored_under_another_session_time_zone(
    spark: Any, tmp_path: Path
) -> None:
    """The reference is restarted under the new time zone at the same point: the restored
    query must close the same sessions at the same instants."""
    restore = Restore(before={TIME_ZONE: "UTC"}, settings={TIME_ZONE: "America/New_York"})
    reference, continued = reference_and_restored(
        spark, tmp_path, sessions, ALL_GROUPS_PIECES, no_data=True, restore=restore
    )
    assert_restored_like_reference(reference, continued)


# The restored query's first batch holds only rows behind the old watermark (35): a visit
# without data for every key group it bootstraps.
LATE_FIRST_PIECES = [PIECES[0], [[("b", 1), ("y", 3)], [("e", 41), ("a", 20)]], PIECES[2]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "build, no_data",
    [
        pytest.param(sessions, True, id="sessionize-no-data"),
        pytest.param(firsts_of_every_type, False, id="deduplicate-data-only", marks=CHAOS),
    ],
)
def test_a_restored_first_batch_of_only_late_rows_is_a_visit_without_data(
    spark: Any, tmp_path: Path, build: Any, no_data: bool
) -> None:
    reference, continued = reference_and_restored(
        spark, tmp_path, build, LATE_FIRST_PIECES, no_data=no_data
    )
    assert_restored_like_reference(reference, continued)
    if no_data:  # without no-data batches the first restored batch drops behind 1 only
        assert "y" not in {row[0] for row in reference}
