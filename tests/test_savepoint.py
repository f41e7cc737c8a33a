"""Savepoint pieces that need no Spark: restore's copy and move, the manifest, and what a
restored checkpoint hands a query."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from eospack.tools.savepoint import (
    RESTORED_DIRECTORY,
    Manifest,
    OperatorSnapshot,
    RestoredCheckpoint,
    SavepointError,
    describe,
    map_operators,
    restore_savepoint,
)


def write_savepoint(directory: Path) -> Manifest:
    manifest = Manifest(
        batch_id=4,
        source_offsets=[{"events": {"0": 120, "1": 98}, "@starts": {"events": {"0": 100}}}],
        operators=[OperatorSnapshot(0, "running_count", 3, "state/operator-0.parquet", [], 8)],
        checkpoint="/old",
        eospack_version="0.1.0",
        created_at="2026-11-24T00:00:00Z",
    )
    (directory / "state").mkdir(parents=True)
    (directory / "state" / "operator-0.parquet").write_bytes(b"state")
    (directory / "manifest.json").write_text(manifest.to_json())
    return manifest


def test_a_checkpoint_no_restore_prepared_hands_out_the_defaults(tmp_path: Path) -> None:
    restored = RestoredCheckpoint(tmp_path / "checkpoint")
    assert not restored.restored
    assert restored.starting_offsets("latest") == "latest"
    assert restored.initial_state() is None


def test_no_claim_copies_and_claim_moves(tmp_path: Path) -> None:
    savepoint = tmp_path / "savepoint"
    manifest = write_savepoint(savepoint)

    assert restore_savepoint(savepoint, tmp_path / "a") == manifest
    assert (savepoint / "manifest.json").is_file()
    restored = RestoredCheckpoint(f"file://{tmp_path / 'a'}")
    assert json.loads(restored.starting_offsets()) == {
        "events": {"0": 120, "1": 98},
        "@unlisted": "earliest",
    }
    initial = restored.initial_state(0)
    assert initial is not None
    assert Path(initial.path).read_bytes() == b"state"
    assert Path(initial.path).is_relative_to(tmp_path / "a" / RESTORED_DIRECTORY)
    assert restored.initial_state(1) is None

    restore_savepoint(savepoint, tmp_path / "b", "claim")
    assert not savepoint.exists()
    assert RestoredCheckpoint(tmp_path / "b").manifest == manifest


def test_restore_refusals(tmp_path: Path) -> None:
    savepoint = tmp_path / "savepoint"
    write_savepoint(savepoint)
    with pytest.raises(SavepointError, match="use no-claim or claim"):
        restore_savepoint(savepoint, tmp_path / "a", "steal")  # type: ignore[arg-type]
    with pytest.raises(SavepointError, match="is not a savepoint"):
        restore_savepoint(tmp_path / "nothing", tmp_path / "a")
    manifest = json.loads((savepoint / "manifest.json").read_text())
    (savepoint / "manifest.json").write_text(json.dumps({**manifest, "format_version": 9}))
    with pytest.raises(SavepointError, match="version 9; this eospack reads"):
        restore_savepoint(savepoint, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_partitions_unknown_to_the_savepoint_start_at_earliest(tmp_path: Path) -> None:
    """A partition added since the savepoint and a topic the subscription covers since start
    at their earliest offset, as in a query that never stopped; known ones where it ended."""
    from tests.fake_kafka_cluster import FakeCluster, stream_reader

    write_savepoint(tmp_path / "savepoint")
    restore_savepoint(tmp_path / "savepoint", tmp_path / "a")
    restored = RestoredCheckpoint(tmp_path / "a")
    cluster = FakeCluster(
        {
            "events": ("AAAAAAAAAAAAAAAAAAAAAQ", {0: (0, 150), 1: (0, 99), 2: (5, 40)}),
            "later": ("AAAAAAAAAAAAAAAAAAAAAg", {0: (3, 12)}),
        }
    )
    reader = stream_reader(
        cluster, subscribe="events,later", startingOffsets=restored.starting_offsets()
    )
    start = json.loads(json.dumps(reader.initialOffset()))
    assert {topic: ends for topic, ends in start.items() if not topic.startswith("@")} == {
        "events": {"0": 120, "1": 98, "2": 5},
        "later": {"0": 3},
    }
    from eospack.connectors.kafka.errors import KafkaSourceOptionError
    from eospack.connectors.kafka.source.options import parse_options

    with pytest.raises(KafkaSourceOptionError, match='"@unlisted": .soon.: use "earliest"'):
        parse_options(
            {
                "kafka.bootstrap.servers": "broker:9092",
                "subscribe": "events",
                "startingOffsets": '{"events": {"0": 1}, "@unlisted": "soon"}',
            }
        )


def test_restored_checkpoint_hands_its_operators_the_old_watermarks(tmp_path: Path) -> None:
    """The watermarks Spark logged for the savepoint's batch (offset log) and for the next
    one (commit log) reach each operator's initial state; a format 1 savepoint has none."""
    from eospack.tools.savepoint import logged_watermark

    checkpoint = tmp_path / "old"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    (checkpoint / "offsets" / "4").write_text(
        'v1\n{"batchWatermarkMs":1000,"batchTimestampMs":5,"conf":{}}\n{"events":{"0":120}}\n'
    )
    (checkpoint / "commits" / "4").write_text('v1\n{"nextBatchWatermarkMs":195000}\n')
    assert logged_watermark(checkpoint / "offsets" / "4", 1) == 1000
    assert logged_watermark(checkpoint / "commits" / "4", 1) == 195000
    assert logged_watermark(checkpoint / "commits" / "5", 1) is None

    manifest = write_savepoint(tmp_path / "savepoint")
    saved = json.loads((tmp_path / "savepoint" / "manifest.json").read_text())
    saved.update(batch_watermark_ms=1000, next_batch_watermark_ms=195000)
    (tmp_path / "savepoint" / "manifest.json").write_text(json.dumps(saved))
    restore_savepoint(tmp_path / "savepoint", tmp_path / "new")
    initial = RestoredCheckpoint(tmp_path / "new").initial_state(0)
    assert initial is not None
    assert (initial.batch_watermark_ms, initial.next_batch_watermark_ms) == (1000, 195000)
    assert initial.checkpoint_location == str(tmp_path / "new")

    old = {key: value for key, value in json.loads(manifest.to_json()).items()}
    old.update(format_version=1)
    for key in ("batch_watermark_ms", "next_batch_watermark_ms"):
        old.pop(key)
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "manifest.json").write_text(json.dumps(old))
    assert Manifest.read(tmp_path / "v1").next_batch_watermark_ms is None


# Operator names (Flink's uid) -------------------------------------------------------------


def snapshot(operator_id: int, name: str | None, kind: str = "running_count") -> OperatorSnapshot:
    return OperatorSnapshot(
        operator_id, kind, 1, f"state/operator-{operator_id}.parquet", [], 8, name
    )


def test_named_state_maps_by_name_whatever_the_positions() -> None:
    saved = [snapshot(0, "by-a"), snapshot(1, "by-b", "deduplicate")]
    mapping = map_operators(saved, ["by-b", "by-a"])
    assert mapping == {"by-b": saved[1], "by-a": saved[0]}


def test_unnamed_state_maps_by_position_as_before_names() -> None:
    saved = [snapshot(0, None), snapshot(1, None)]
    assert map_operators(saved, ["first", "second"]) == {"first": saved[0], "second": saved[1]}
    mixed = [snapshot(0, None), snapshot(1, "counts")]
    assert map_operators(mixed, ["old", "counts"]) == {"old": mixed[0], "counts": mixed[1]}


@pytest.mark.parametrize(
    ("saved", "names", "message"),
    [
        (
            [snapshot(0, "by-a"), snapshot(1, "by-b")],
            ["by-a"],
            "savepoint operator(s) by-b claimed by no operator of this query (their state"
            " would be dropped): name the operators as in the savepoint (0: by-a, 1: by-b),"
            " or allow missing state with allow_missing=True (CLI: eospack savepoint"
            " restore --allow-missing)",
        ),
        (
            [snapshot(0, "by-a")],
            ["by-a", "new"],
            "operator(s) new have no state in the savepoint (they would start empty): name"
            " the operators as in the savepoint (0: by-a), or allow missing state with"
            " allow_missing=True (CLI: eospack savepoint restore --allow-missing)",
        ),
        (
            [snapshot(0, None), snapshot(1, None)],
            ["only"],
            "savepoint operator(s) unnamed operator 1 claimed by no operator of this query",
        ),
        (
            [snapshot(0, "twice"), snapshot(1, "twice")],
            ["twice"],
            "the savepoint holds several operators named twice (operators 0, 1): names must"
            " be unique within a query",
        ),
        ([snapshot(0, "a")], ["a", "a"], "operator name(s) a given more than once"),
        ([snapshot(0, "a")], ["a b"], "name='a b' is not a valid operator name"),
    ],
)
def test_mapping_refusals_are_one_line(
    saved: list[OperatorSnapshot], names: list[str], message: str
) -> None:
    with pytest.raises(SavepointError) as error:
        map_operators(saved, names)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_allow_missing_drops_unclaimed_state_and_starts_new_operators_empty() -> None:
    saved = [snapshot(0, "by-a"), snapshot(1, "by-b")]
    assert map_operators(saved, ["by-b", "new"], allow_missing=True) == {
        "by-b": saved[1],
        "new": None,
    }


def test_restored_checkpoint_hands_state_by_name_and_records_allow_missing(
    tmp_path: Path,
) -> None:
    savepoint = tmp_path / "savepoint"
    write_savepoint(savepoint)
    saved = json.loads((savepoint / "manifest.json").read_text())
    saved["operators"] = [asdict(snapshot(0, "by-a")), asdict(snapshot(1, "by-b"))]
    (savepoint / "manifest.json").write_text(json.dumps(saved))
    (savepoint / "state" / "operator-1.parquet").write_bytes(b"state of b")

    restore_savepoint(savepoint, tmp_path / "strict")
    restored = RestoredCheckpoint(tmp_path / "strict")
    states = restored.initial_states(["by-b", "by-a"])
    by_b, by_a = states["by-b"], states["by-a"]
    assert by_a is not None and by_b is not None
    assert Path(by_b.path).read_bytes() == b"state of b"
    assert (by_b.operator_name, by_b.operator_id, by_a.operator_id) == ("by-b", 0, 1)
    assert by_a.work_directory != by_b.work_directory
    with pytest.raises(SavepointError, match="by-a claimed by no operator"):
        restored.initial_states(["by-b"])
    assert restored.initial_states(["by-b"], allow_missing=True)["by-b"] == by_b
    assert restored.initial_state(1) is not None  # by position, as before names

    restore_savepoint(savepoint, tmp_path / "lenient", allow_missing=True)
    lenient = RestoredCheckpoint(tmp_path / "lenient")
    assert lenient.initial_states(["by-b", "new"])["new"] is None
    with pytest.raises(SavepointError, match="by-a claimed by no operator"):
        RestoredCheckpoint(tmp_path / "lenient", allow_missing=False).initial_states(["by-b"])
    assert RestoredCheckpoint(tmp_path / "fresh").initial_states(["x"]) == {"x": None}


def test_manifests_before_names_still_read(tmp_path: Path) -> None:
    """A format 2 manifest (no operator_name) reads, its operators unnamed."""
    manifest = write_savepoint(tmp_path / "savepoint")
    saved = json.loads(manifest.to_json())
    saved["format_version"] = 2
    for operator in saved["operators"]:
        operator.pop("operator_name")
    (tmp_path / "savepoint" / "manifest.json").write_text(json.dumps(saved))
    (operator,) = Manifest.read(tmp_path / "savepoint").operators
    assert operator.operator_name is None
    assert "operator 0 (running_count, unnamed): 3 keys" in describe(
        Manifest.read(tmp_path / "savepoint")
    )
