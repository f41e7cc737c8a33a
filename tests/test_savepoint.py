"""Savepoint pieces that need no Spark: restore's copy and move, the manifest, and what a
restored checkpoint hands a query."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eospack.savepoint import (
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
    assert json.loads(restored.starting_offsets()) == {"events": {"0": 120, "1": 98}}
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
