"""Savepoint pieces that need no Spark: restore's copy and move, the manifest, and what a
restored checkpoint hands a query."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eospack.tools.savepoint import (
    RESTORED_DIRECTORY,
    Manifest,
    OperatorSnapshot,
    RestoredCheckpoint,
    SavepointError,
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
