"""Event-time ttl turned on or off through a savepoint (issue 41, ttl across a restore).

A savepoint holds no event time per key, only (with ttl) when each key expires. Turned on
through a savepoint, event-time ttl gives every restored key the full ttl from the
restore, in event time: from the old query's next watermark, which the restored query
clocks its first batch with (as processing-time ttl counts from the restore's time).
Turned off, the keys whose ttl had run out by that watermark must not come back, and the
others must keep their state. JSON files, one per micro-batch, no-data batches off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from eospack.cli import main
from eospack.lab.testing import session_settings
from eospack.stateful_ops import read_state, running_count
from eospack.stateful_ops.base import EXPIRES_COLUMN
from eospack.tools.savepoint import Manifest, RestoredCheckpoint
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    batch_timestamp_ms,
    events_at,
    run,
    source,
    with_watermark,
    write_batch,
)

pytestmark = pytest.mark.integration

TTL = "10 seconds"


def counts(
    spark: Any, input_directory: Path, checkpoint: Path, ttl: str | None, sink: Emitted
) -> None:
    """One Trigger.AvailableNow run of running_count on ``checkpoint`` (restored or not)."""
    initial_state = RestoredCheckpoint(checkpoint).initial_state()
    ttl_arguments = {"ttl": ttl, "ttl_time": "event"} if ttl is not None else {}
    output = running_count(
        with_watermark(source(spark, str(input_directory))),
        "k",
        key_groups=4,
        initial_state=initial_state,
        **ttl_arguments,
    ).selectExpr("k", "count", "version")
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(output, str(checkpoint), "update", sink)


def savepointed(spark: Any, tmp_path: Path, ttl: str | None) -> Path:
    """a at 0 s, b at 2 s, then z at 40 s (the next watermark: 35 s), savepointed and
    restored into a new checkpoint (returned)."""
    old_input, old = tmp_path / "old-input", tmp_path / "old"
    old_input.mkdir()
    write_batch(str(old_input), 0, events_at(("a", 0), ("b", 2)))
    write_batch(str(old_input), 1, events_at(("z", 40)))
    counts(spark, old_input, old, ttl, Emitted())
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(old), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    return restored


@pytest.mark.timeout(300)
def test_event_time_ttl_turned_on_through_a_savepoint_counts_from_the_restore_watermark(
    spark: Any, tmp_path: Path
) -> None:
    """Restored keys expire at the restore's watermark (35 s) + ttl = 45 s: the batch
    whose watermark is 45 s forgets a, b and z, so a comes back at count 1. With ttl a new
    life's version is its batch's timestamp (ms)."""
    restored = savepointed(spark, tmp_path, ttl=None)
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    write_batch(str(new_input), 0, events_at(("c", 50)))
    write_batch(str(new_input), 1, events_at(("a", 52)))
    sink = Emitted()
    counts(spark, new_input, restored, TTL, sink)
    first, second = (batch_timestamp_ms(restored, batch) for batch in (0, 1))
    assert sink.final() == [(0, [("c", 1, first)]), (1, [("a", 1, second)])]
    state = read_state(spark, str(restored))
    assert dict(zip(state["k"], state["count"], strict=True)) == {"a": 1, "c": 1}


@pytest.mark.timeout(300)
def test_fixed_event_time_ttl_turned_off_through_a_savepoint_keeps_the_unexpired_keys(
    spark: Any, tmp_path: Path
) -> None:
    """a (expired at 10 s) and b (12 s) ran out by the restore's watermark (35 s): they
    never come back; z (expires at 50 s) keeps its count and version (its life started in
    the old query's batch 1, with ttl), and a starts again at version 1 (no ttl now)."""
    restored = savepointed(spark, tmp_path, ttl=TTL)
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    write_batch(str(new_input), 0, events_at(("z", 50), ("a", 51)))
    sink = Emitted()
    counts(spark, new_input, restored, None, sink)
    z_life = batch_timestamp_ms(tmp_path / "old", 1)
    assert sink.final() == [(0, [("a", 1, 1), ("z", 2, z_life + 1)])]


@pytest.mark.timeout(300)
def test_fixed_event_time_ttl_restored_as_processing_time_ttl_gives_live_keys_the_full_ttl(
    spark: Any, tmp_path: Path
) -> None:
    """The savepoint's expiries are event times (2023 here), which a wall clock has long
    passed: kept as they were, z expired in the restored query's first batch and restarted
    at 1. The keys run out by the old watermark (a, b) stay gone; z gets the full
    processing-time ttl from the restore and keeps its count."""
    restored = savepointed(spark, tmp_path, ttl=TTL)
    new_input = tmp_path / "new-input"
    new_input.mkdir()
    write_batch(str(new_input), 0, events_at(("z", 50), ("a", 51)))
    sink = Emitted()
    output = running_count(
        with_watermark(source(spark, str(new_input))),
        "k",
        key_groups=4,
        initial_state=RestoredCheckpoint(restored).initial_state(),
        ttl="1 hour",
    ).selectExpr("k", "count", "version")
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(output, str(restored), "update", sink)
    z_life = batch_timestamp_ms(tmp_path / "old", 1)
    a_life = batch_timestamp_ms(restored, 0)
    assert sink.final() == [(0, [("a", 1, a_life), ("z", 2, z_life + 1)])]


@pytest.mark.timeout(300)
def test_fixed_event_time_ttl_lowered_through_a_savepoint_applies_to_the_restored_keys(
    spark: Any, tmp_path: Path
) -> None:
    """Flink's rule through a savepoint: the restored query's ttl applies to every restored
    key from its latest event. The old checkpoint ran with ttl='2 hours' (idle at 0 s,
    recent at 6000 s, both in key group 1), then with ttl='3 hours' (other at 6001 s, key
    group 3): group 1 still records 2 hours. The savepoint counts every expiry with one
    ttl (3 hours, recorded as ``ttl_ms``); restored with ttl='1 hour' at the old next
    watermark (5996 s), idle (0 s + 1 hour) is gone and comes back at count 1, recent and
    other expire 1 hour after their latest event. Without the fix idle was kept (its 2
    hours ran to 7200 s) and counted 2."""
    hour_ms, t0_ms = 3_600_000, T0 * 1000
    old_input, old = tmp_path / "old-input", tmp_path / "old"
    old_input.mkdir()
    write_batch(str(old_input), 0, events_at(("idle", 0), ("recent", 6000)))
    counts(spark, old_input, old, "2 hours", Emitted())
    write_batch(str(old_input), 1, events_at(("other", 6001)))
    counts(spark, old_input, old, "3 hours", Emitted())
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(old), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    (snapshot,) = Manifest.read(savepoint).operators
    assert snapshot.settings == {"ttl_time": "event", "ttl_ms": str(3 * hour_ms)}
    saved = pd.read_parquet(savepoint / snapshot.file)
    assert dict(zip(saved["k"], saved[EXPIRES_COLUMN], strict=True)) == {
        "idle": t0_ms + 3 * hour_ms,
        "recent": t0_ms + 6_000_000 + 3 * hour_ms,
        "other": t0_ms + 6_001_000 + 3 * hour_ms,
    }

    new_input = tmp_path / "new-input"
    new_input.mkdir()
    write_batch(str(new_input), 0, events_at(("idle", 6010)))
    sink = Emitted()
    counts(spark, new_input, restored, "1 hour", sink)
    assert sink.final() == [(0, [("idle", 1, batch_timestamp_ms(restored, 0))])]
    state = read_state(spark, str(restored))
    assert {
        key: (count, expires)
        for key, count, expires in zip(
            state["k"], state["count"], state[EXPIRES_COLUMN], strict=True
        )
    } == {
        "idle": (1, t0_ms + 6_010_000 + hour_ms),
        "recent": (1, t0_ms + 6_000_000 + hour_ms),
        "other": (1, t0_ms + 6_001_000 + hour_ms),
    }
