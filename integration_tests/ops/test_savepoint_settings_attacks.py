"""Attacks on ttl settings through savepoints (issue 41, format 4) on real queries: event-time
ttl turned on from a query without a watermark, and a savepoint of a restored checkpoint.

JSON files, one per micro-batch, ``Trigger.AvailableNow``, no-data batches off; event times
of 2023 (``T0``) with a 5 s watermark delay, so a wall-clock time read as an event time is
years ahead of every watermark here. Emitted rows are (key, count): with ttl a key's
version starts at its batch's timestamp (tests/test_state_ttl.py checks versions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eospack.cli import main
from eospack.lab.testing import session_settings
from eospack.stateful_ops import running_count
from eospack.tools.savepoint import RestoredCheckpoint
from integration_tests.stateful_parts import (
    NO_DATA_BATCHES,
    T0,
    Emitted,
    events_at,
    run,
    source,
    with_watermark,
    write_batch,
)

pytestmark = pytest.mark.integration

TTL = "10 seconds"


def inputs(directory: Path, *batches: list[dict[str, Any]]) -> Path:
    directory.mkdir()
    for index, rows in enumerate(batches):
        write_batch(str(directory), index, rows)
    return directory


def event_ttl_counts(spark: Any, input_directory: Path, checkpoint: Path, sink: Emitted) -> None:
    """running_count with event-time ttl on ``checkpoint`` (restored or not), one run."""
    output = running_count(
        with_watermark(source(spark, str(input_directory))),
        "k",
        key_groups=4,
        initial_state=RestoredCheckpoint(checkpoint).initial_state(),
        ttl=TTL,
        ttl_time="event",
    ).selectExpr("k", "count")
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(output, str(checkpoint), "update", sink)


def savepoint_and_restore(checkpoint: Path, savepoint: Path, restored: Path) -> dict[str, Any]:
    """``checkpoint`` savepointed and restored into ``restored``; the savepoint's manifest."""
    assert main(["savepoint", "create", str(checkpoint), str(savepoint)]) == 0
    assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
    manifest: dict[str, Any] = json.loads((savepoint / "manifest.json").read_text())
    return manifest


@pytest.mark.timeout(400)
@pytest.mark.parametrize("old_ttl", [None, "1 hour"])
def test_fixed_event_ttl_turned_on_from_a_query_without_watermark_keeps_the_restored_keys(
    spark: Any, tmp_path: Path, old_ttl: str | None
) -> None:
    """The old query (no ttl, or processing-time ttl) had no watermark: Spark logs 0 for
    it, which the restore took as the old watermark, so every restored key expired at
    10 s after 1970 in event time, and b, counted twice, restarted at 1 in the restored
    query's second batch. Each restored key gets the full ttl from the wall clock, as
    documented: b counts on."""
    old = tmp_path / "old"
    ttl_arguments = {"ttl": old_ttl} if old_ttl is not None else {}
    output = running_count(
        source(spark, str(inputs(tmp_path / "old-input", events_at(("a", 0), ("b", 2))))),
        "k",
        key_groups=4,
        **ttl_arguments,
    ).selectExpr("k", "count")
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(output, str(old), "update", Emitted())
    restored = tmp_path / "restored"
    manifest = savepoint_and_restore(old, tmp_path / "savepoint", restored)
    assert (manifest["batch_watermark_ms"], manifest["next_batch_watermark_ms"]) == (0, 0)
    recorded_ttl = {} if old_ttl is None else {"ttl_ms": "3600000"}  # what expiries count with
    assert manifest["operators"][0]["settings"] == recorded_ttl
    new_input = inputs(tmp_path / "new-input", events_at(("c", 50)), events_at(("b", 52)))
    sink = Emitted()
    event_ttl_counts(spark, new_input, restored, sink)
    assert sink.final() == [(0, [("c", 1)]), (1, [("b", 2)])]


@pytest.mark.timeout(600)
def test_fixed_a_savepoint_of_a_restored_checkpoint_continues_as_the_restored_query_would(
    spark: Any, tmp_path: Path
) -> None:
    """Event-time ttl kept through two savepoints: the old query's next watermark is 35 s;
    the first restored query counts y at 20 s (expires at 30 s) and its own watermark is
    15 s. Savepointed and restored again, the second restored query must emit what the
    first emits when it goes on with the same rows (y at 21 s, z at 45 s)."""
    old = tmp_path / "old"
    old_input = inputs(tmp_path / "old-input", events_at(("a", 0), ("b", 2)), events_at(("z", 40)))
    event_ttl_counts(spark, old_input, old, Emitted())
    first = tmp_path / "first"
    manifest = savepoint_and_restore(old, tmp_path / "savepoint-1", first)
    assert manifest["next_batch_watermark_ms"] == (T0 + 35) * 1000
    first_input = inputs(tmp_path / "first-input", events_at(("y", 20)))
    first_sink = Emitted()
    event_ttl_counts(spark, first_input, first, first_sink)
    assert first_sink.final() == [(0, [("y", 1)])]
    second = tmp_path / "second"
    savepoint_and_restore(first, tmp_path / "savepoint-2", second)
    write_batch(str(first_input), 1, events_at(("y", 21), ("z", 45)))
    unstopped = Emitted()
    event_ttl_counts(spark, first_input, first, unstopped)
    restored = Emitted()
    second_input = inputs(tmp_path / "second-input", events_at(("y", 21), ("z", 45)))
    event_ttl_counts(spark, second_input, second, restored)
    assert [rows for _, rows in restored.final()] == [rows for _, rows in unstopped.final()]


def as_format_3(savepoint: Path) -> None:
    """Rewrite ``savepoint``'s manifest in the shape format 3 wrote: no settings."""
    path = savepoint / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 3
    for operator in manifest["operators"]:
        del operator["settings"]
    path.write_text(json.dumps(manifest, indent=2))


@pytest.mark.timeout(600)
def test_held_a_format_3_savepoint_of_event_ttl_restores_into_event_ttl_as_format_4_does(
    spark: Any, tmp_path: Path
) -> None:
    """A savepoint written before format 4 does not say its expiries are event times;
    restored into the same event-time ttl they are kept as they are, as a format 4
    savepoint's: a and b ran out by the old watermark (35 s), z (expires 50 s) counts on."""
    old = tmp_path / "old"
    old_input = inputs(tmp_path / "old-input", events_at(("a", 0), ("b", 2)), events_at(("z", 40)))
    event_ttl_counts(spark, old_input, old, Emitted())
    outputs = {}
    for version in (3, 4):
        savepoint, restored = tmp_path / f"savepoint-{version}", tmp_path / f"restored-{version}"
        assert main(["savepoint", "create", str(old), str(savepoint)]) == 0
        if version == 3:
            as_format_3(savepoint)
        assert main(["savepoint", "restore", str(savepoint), str(restored)]) == 0
        initial = RestoredCheckpoint(restored).initial_state()
        assert initial is not None
        expected = None if version == 3 else "event"
        assert initial.stored_setting("ttl_time") == expected
        new_input = inputs(tmp_path / f"new-input-{version}", events_at(("z", 50), ("a", 51)))
        sink = Emitted()
        event_ttl_counts(spark, new_input, restored, sink)
        outputs[version] = sink.final()
    assert outputs[3] == outputs[4] == [(0, [("a", 1), ("z", 2)])]


@pytest.mark.timeout(600)
def test_fixed_processing_to_event_to_processing_ttl_through_two_savepoints_keeps_every_key(
    spark: Any, tmp_path: Path
) -> None:
    """Processing-time ttl (no watermark), restored with event-time ttl (c counted there),
    savepointed again and restored with processing-time ttl: no key ran out on the way, so
    each counts on. Before the fix a and b got event-time expiries at 10 s after 1970,
    which the second savepoint's watermark (45 s) had run out: they restarted at 1."""
    old = tmp_path / "old"
    processing_counts = running_count(
        source(spark, str(inputs(tmp_path / "old-input", events_at(("a", 0), ("b", 2))))),
        "k",
        key_groups=4,
        ttl="1 hour",
    ).selectExpr("k", "count")
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(processing_counts, str(old), "update", Emitted())
    event = tmp_path / "event"
    savepoint_and_restore(old, tmp_path / "savepoint-1", event)
    event_sink = Emitted()
    event_input = inputs(tmp_path / "event-input", events_at(("c", 50)))
    event_ttl_counts(spark, event_input, event, event_sink)
    assert event_sink.final() == [(0, [("c", 1)])]
    processing = tmp_path / "processing"
    manifest = savepoint_and_restore(event, tmp_path / "savepoint-2", processing)
    assert manifest["operators"][0]["settings"] == {"ttl_time": "event", "ttl_ms": "10000"}
    assert manifest["next_batch_watermark_ms"] == (T0 + 45) * 1000
    last_input = inputs(tmp_path / "last-input", events_at(("a", 60), ("b", 60), ("c", 60)))
    output = running_count(
        source(spark, str(last_input)),
        "k",
        key_groups=4,
        initial_state=RestoredCheckpoint(processing).initial_state(),
        ttl="1 hour",
    ).selectExpr("k", "count")
    sink = Emitted()
    with session_settings(spark, {NO_DATA_BATCHES: "false"}):
        run(output, str(processing), "update", sink)
    assert sink.final() == [(0, [("a", 2), ("b", 2), ("c", 2)])]
