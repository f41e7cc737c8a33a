"""A user's event-time program on file input, run piece by piece on a reference checkpoint
and on a checkpoint that is stopped, savepointed and restored: shared by the savepoint
attacks (each input file is one micro-batch; rows are (key, second) pairs)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from eospack.cli import main
from eospack.lab.testing import await_query, session_settings
from eospack.tools.savepoint import RestoredCheckpoint

QUERY_SECONDS = 180
EVENT_T0 = 1_700_000_000
EVENT_SCHEMA = "k string, t long"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
TIME_ZONE = "spark.sql.session.timeZone"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"

Pieces = list[list[tuple[str, int]]]
Build = Callable[[Any, Any, int], Any]
"""(watermarked events, initial_state, key_groups) -> the rows the query emits"""


def hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), hashable(v)) for k, v in value.items()))
    if isinstance(value, bytearray):
        return bytes(value)
    return value


@dataclass
class EventTimeProgram:
    """``run`` adds the next files and runs the query to their end (Trigger.AvailableNow)."""

    spark: Any
    build: Build
    no_data: bool
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def run(
        self,
        directory: Path,
        checkpoint: Path,
        files: Pieces,
        key_groups: int = 4,
        settings: dict[str, str] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        written = len(list(directory.glob("*.json")))
        for index, rows in enumerate(files, start=written):
            path = directory / f"batch-{index:04d}.json"
            path.write_text("\n".join(json.dumps({"k": k, "t": EVENT_T0 + t}) for k, t in rows))
            os.utime(path, (1_000_000 + index, 1_000_000 + index))
        conf = {NO_DATA_BATCHES: str(self.no_data).lower(), **(settings or {})}
        with session_settings(self.spark, conf):
            events = (
                self.spark.readStream.schema(EVENT_SCHEMA)
                .option("maxFilesPerTrigger", 1)
                .json(str(directory))
                .withColumn("ts", F.timestamp_seconds("t"))
                .withWatermark("ts", "5 seconds")
            )
            initial = RestoredCheckpoint(checkpoint).initial_state()
            output = self.build(events, initial, key_groups)
            query = (
                output.writeStream.outputMode("append")
                .foreachBatch(self.collect)
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
            await_query(query, QUERY_SECONDS)

    def collect(self, batch: Any, batch_id: int) -> None:
        self.rows.extend(hashable(tuple(row)) for row in batch.collect())


@dataclass(frozen=True)
class Restore:
    """How the restored query differs from the reference after the savepoint."""

    mode: str = "no-claim"
    key_groups: int = 4
    settings: dict[str, str] = field(default_factory=dict)
    """Session settings of every run after the savepoint (reference and restored)."""
    before: dict[str, str] = field(default_factory=dict)
    """Session settings of the runs up to the savepoint."""


def reference_and_restored(
    spark: Any,
    tmp_path: Path,
    build: Build,
    pieces: list[Pieces],
    no_data: bool,
    restore: Restore | None = None,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows of a reference run of ``pieces`` piece by piece on one checkpoint, and those
    of a query stopped after the first piece and savepointed, whose restored query runs
    the other pieces."""
    restore = restore or Restore()
    reference = EventTimeProgram(spark, build, no_data)
    for index, piece in enumerate(pieces):
        settings = restore.before if index == 0 else restore.settings
        reference.run(tmp_path / "reference-input", tmp_path / "reference", piece, 4, settings)
    program = EventTimeProgram(spark, build, no_data)
    program.run(tmp_path / "stopped-input", tmp_path / "stopped", pieces[0], 4, restore.before)
    savepoint, restored = tmp_path / "savepoint", tmp_path / "restored"
    assert main(["savepoint", "create", str(tmp_path / "stopped"), str(savepoint)]) == 0
    assert (
        main(["savepoint", "restore", "--mode", restore.mode, str(savepoint), str(restored)]) == 0
    )
    for piece in pieces[1:]:
        program.run(
            tmp_path / "restored-input", restored, piece, restore.key_groups, restore.settings
        )
    return reference.rows, program.rows
