"""Savepoints: a stopped query's last committed batch, owned by the user, restorable into a
new query with other ``key_groups``, shuffle partitions or state store provider.

A savepoint is a directory (a local path, a ``file://`` URI, or any Hadoop file system URI
such as ``s3a://``, read and written through Spark's Hadoop file system:
``eospack.core.checkpoint_files``)::

    manifest.json              written last: a directory without it is no savepoint
    state/operator-<id>.parquet  one row per key: key columns and state fields

The manifest holds the eospack version, the batch id, each source's offsets as Spark
logged them, Spark's watermarks of the batch and of the next one (offset and commit log),
and per stateful operator its name, columns and rows. The state is canonical:
one row per key, whatever ``key_groups``, ``spark.sql.shuffle.partitions`` or state store
provider wrote it.

Why a new checkpoint and not a copied one: Spark reads the shuffle partitions of a query
from its checkpoint and cannot be handed a state store, so a query restored with other
settings must start fresh. ``restore_savepoint`` puts the savepoint inside the new
checkpoint directory (``eospack-savepoint/``, copied for no-claim, moved for claim);
``RestoredCheckpoint`` hands the query its starting offsets and each operator's initial
state (see ``eospack.stateful_ops.initial_state``). The offsets count only until the query's
first batch commits, the state only until every key group holds state; after that the
checkpoint decides, as for any query. The old query's watermark counts as long as it is
ahead of the new query's (Spark's watermark is in the checkpoint, which starts afresh).

Exactly-once across a restore: the new query starts where the savepoint's batch ended, so
nothing the old query committed before the savepoint is read again. ``create_savepoint``
refuses a checkpoint whose last batch is not committed (its sinks may have applied it).
Restoring a savepoint after the old query went on replays what it did after the savepoint,
as in Flink. The 2PC sinks derive their id from the new query's id, so the new query's
ledger starts empty; a query that sets ``sinkId`` must set a new one when restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from eospack.connectors.kafka.source.options import UNLISTED
from eospack.core.checkpoint_files import (
    CheckpointFiles,
    LocalFiles,
    as_hadoop,
    checkpoint_files,
)
from eospack.core.errors import EospackError
from eospack.stateful_ops.initial_state import InitialState
from eospack.stateful_ops.state_reader import read_state_table
from eospack.tools.checkpoint import CheckpointInspectError, inspect_checkpoint

FORMAT = "eospack-savepoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
"""Version 2 adds the old query's watermarks; a version 1 savepoint restores without them."""
MANIFEST = "manifest.json"
RESTORED_DIRECTORY = "eospack-savepoint"
"""Where ``restore_savepoint`` puts the savepoint inside the new checkpoint."""
ClaimMode = Literal["no-claim", "claim"]


class SavepointError(EospackError, ValueError):
    """A savepoint cannot be created or restored; the message says why and what to do."""


@dataclass(frozen=True)
class OperatorSnapshot:
    operator_id: int
    name: str
    rows: int
    file: str
    """Relative to the savepoint directory."""
    columns: list[dict[str, str]]
    key_groups: int
    """What the old query used (informational: a restore may choose another)."""


@dataclass(frozen=True)
class Manifest:
    batch_id: int
    source_offsets: list[Any]
    """One entry per source, as Spark logged the batch (replayable-kafka: topic ->
    partition -> end offset, plus the batch's own bookkeeping keys)."""
    operators: list[OperatorSnapshot]
    checkpoint: str
    eospack_version: str
    created_at: str
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    settings: dict[str, str] = field(default_factory=dict)
    batch_watermark_ms: int | None = None
    """Spark's watermark while the savepoint's batch ran (its offset log): the next batch
    drops rows at or behind it, as Spark drops rows behind the previous batch's watermark."""
    next_batch_watermark_ms: int | None = None
    """Spark's watermark for the batch after the savepoint's (its commit log): what the old
    query would have closed sessions and expired keys with next."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def read(cls, directory: Path | CheckpointFiles, relative: str = "") -> Manifest:
        """The manifest of the savepoint at ``directory`` (below it: ``relative``)."""
        files = LocalFiles(directory) if isinstance(directory, Path) else directory
        text = files.read_text(f"{relative}/{MANIFEST}" if relative else MANIFEST)
        if text is None:
            raise SavepointError(
                f"{files.uri(relative)} is not a savepoint (no {MANIFEST}): give a directory"
                " written by eospack savepoint create"
            )
        raw = json.loads(text)
        if raw.get("format") != FORMAT or raw.get("format_version") not in READABLE_VERSIONS:
            raise SavepointError(
                f"{directory} has format {raw.get('format')} version"
                f" {raw.get('format_version')}; this eospack reads {FORMAT} versions"
                f" {', '.join(map(str, READABLE_VERSIONS))}"
            )
        operators = [OperatorSnapshot(**operator) for operator in raw.pop("operators")]
        return cls(operators=operators, **raw)


def local_path(text: str | Path) -> Path:
    """A local path from a path or ``file://`` URI; other schemes are refused."""
    value = str(text)
    scheme = urlsplit(value).scheme
    if scheme == "file":
        return Path(unquote(urlsplit(value).path))
    if scheme and len(scheme) > 1:
        raise SavepointError(
            f"{value}: savepoints live on local or mounted file systems (a path or file://"
            " URI); copy it there first"
        )
    return Path(value)


def create_savepoint(
    spark: SparkSession, checkpoint: str | Path, destination: str | Path
) -> Manifest:
    """Write a savepoint of ``checkpoint``'s last committed batch to ``destination`` (which
    must not exist). Reads the checkpoint only; the query should be stopped. Either may be
    a local path or a Hadoop file system URI (through ``spark``'s Hadoop file system)."""
    from eospack.core.version import __version__

    checkpoint_location = checkpoint_files(checkpoint, spark)
    target_files = checkpoint_files(destination, spark)
    try:
        report = inspect_checkpoint(checkpoint_location)
    except CheckpointInspectError as error:
        raise SavepointError(str(error)) from None
    source = checkpoint_location.location
    if not report.batches:
        raise SavepointError(f"{source} has no batch yet: run the query until it commits one")
    last = report.batches[-1]
    if not last.committed:
        raise SavepointError(
            f"{source}: batch {last.batch_id} was started but not committed (its sinks may"
            " have applied it): start the query again from this checkpoint, stop it after it"
            " commits a batch, then create the savepoint"
        )
    if target_files.exists():
        raise SavepointError(
            f"{target_files.location} exists: give a new directory for the savepoint"
        )
    if isinstance(target_files, LocalFiles):
        target = target_files.root
        staging = target.with_name(f".{target.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
    else:  # written locally, then uploaded: the state files first, the manifest last
        staging = Path(tempfile.mkdtemp(prefix="eospack-savepoint-")) / "savepoint"
    (staging / "state").mkdir(parents=True)
    operators = []
    for operator in report.operators:
        operator_id = int(operator.operator_id)
        table = read_state_table(spark, source, last.batch_id, operator_id)
        if table is None:
            continue
        metadata = table.schema.metadata or {}
        relative = f"state/operator-{operator_id}.parquet"
        plain = table.replace_schema_metadata(None)
        pq.write_table(plain, staging / relative)
        operators.append(
            OperatorSnapshot(
                operator_id=operator_id,
                name=metadata.get(b"operator", b"").decode(),
                rows=plain.num_rows,
                file=relative,
                columns=[{"name": f.name, "type": str(f.type)} for f in plain.schema],
                key_groups=int(metadata.get(b"key_groups", b"0")),
            )
        )
    manifest = Manifest(
        batch_id=last.batch_id,
        source_offsets=last.source_offsets,
        operators=operators,
        checkpoint=str(source),
        eospack_version=__version__,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        settings={"state_store_provider": report.state_store_provider or "Spark default"},
        batch_watermark_ms=watermark_in(
            checkpoint_location.read_text(f"offsets/{last.batch_id}"), 1
        ),
        next_batch_watermark_ms=watermark_in(
            checkpoint_location.read_text(f"commits/{last.batch_id}"), 1
        ),
    )
    if isinstance(target_files, LocalFiles):
        (staging / MANIFEST).write_text(manifest.to_json())
        os.rename(staging, target)
        return manifest
    try:
        target_files.put(staging / "state", "state")
        target_files.write_text(MANIFEST, manifest.to_json())
    finally:
        shutil.rmtree(staging.parent, ignore_errors=True)
    return manifest


def restore_savepoint(
    savepoint: str | Path,
    new_checkpoint: str | Path,
    mode: ClaimMode = "no-claim",
    spark: SparkSession | None = None,
) -> Manifest:
    """Prepare ``new_checkpoint`` (new or empty) for a query that continues from
    ``savepoint``. ``no-claim`` copies it: the savepoint is never changed and the new
    checkpoint shares nothing with it. ``claim`` moves it into the new checkpoint, which
    owns it from then on (no copy on one file system; the savepoint's old path is gone).
    Either may be a Hadoop file system URI: then ``spark`` (default: the active session)
    copies or moves it through Hadoop's file systems."""
    if mode not in ("no-claim", "claim"):
        raise SavepointError(f"--mode {mode!r}: use no-claim or claim")
    source_files = checkpoint_files(savepoint, spark)
    manifest = Manifest.read(source_files)
    target_files = checkpoint_files(new_checkpoint, spark)
    if target_files.names():
        raise SavepointError(
            f"{target_files.location} is not empty: restore into a new checkpoint directory"
            " (a query on an existing checkpoint goes on from it and would ignore the"
            " savepoint)"
        )
    if not (isinstance(source_files, LocalFiles) and isinstance(target_files, LocalFiles)):
        hadoop_source, hadoop_target = as_hadoop(source_files), as_hadoop(target_files)
        if mode == "no-claim":
            partial = f".{RESTORED_DIRECTORY}.partial"
            hadoop_target.delete(partial)
            hadoop_source.copy_to("", hadoop_target, partial)
            hadoop_target.rename(partial, RESTORED_DIRECTORY)
        else:
            hadoop_source.move_to("", hadoop_target, RESTORED_DIRECTORY)
        return manifest
    source, target = source_files.root, target_files.root
    target.mkdir(parents=True, exist_ok=True)
    restored = target / RESTORED_DIRECTORY
    if mode == "no-claim":
        staging = target / f".{RESTORED_DIRECTORY}.partial"
        shutil.copytree(source, staging)
        os.rename(staging, restored)
    else:
        shutil.move(source, restored)
    return manifest


class RestoredCheckpoint:
    """What a query started on ``checkpoint_location`` takes from a restored savepoint: its
    sources' starting offsets and its operators' initial state. On a checkpoint that no
    restore prepared, it hands out the defaults, so one program serves both.

    A checkpoint on a Hadoop file system (``s3a://``, ...) is read through ``spark``
    (default: the active session); its operators' state files are copied into
    ``work_directory``, where the operator splits them by key group and its tasks read
    them: a directory every executor can read (default: a directory of this checkpoint
    under the local temporary directory, which serves local mode and one-host clusters)."""

    def __init__(
        self,
        checkpoint_location: str | Path,
        spark: SparkSession | None = None,
        work_directory: str | Path | None = None,
    ) -> None:
        self.checkpoint: CheckpointFiles = checkpoint_files(checkpoint_location, spark)
        if isinstance(self.checkpoint, LocalFiles):
            self.directory = self.checkpoint.root / RESTORED_DIRECTORY
            self.manifest = Manifest.read(self.directory) if self.directory.is_dir() else None
            return
        location = self.checkpoint.location
        if work_directory is None:
            digest = hashlib.sha256(location.encode()).hexdigest()[:16]
            work_directory = Path(tempfile.gettempdir()) / f"eospack-restored-{digest}"
        self.directory = Path(work_directory) / RESTORED_DIRECTORY
        restored = self.checkpoint.is_directory(RESTORED_DIRECTORY)
        self.manifest = Manifest.read(self.checkpoint, RESTORED_DIRECTORY) if restored else None

    @property
    def restored(self) -> bool:
        return self.manifest is not None

    def starting_offsets(self, default: str = "earliest", source: int = 0) -> str:
        """replayable-kafka's ``startingOffsets`` for source ``source`` (in the order Spark
        logs them): where the savepoint's batch ended, else ``default``.

        Partitions the savepoint does not know (added to a topic since, or topics a
        ``subscribePattern`` matches since) start at their earliest offset, as the old
        query would have read them (Spark's sources start partitions discovered during a
        query at the earliest offset). A JSON ``startingOffsets`` starts unlisted partitions
        at latest, so the JSON says ``"@unlisted": "earliest"``. Why not list the current
        partitions here instead: a partition or topic created between this call and the
        query's first batch would still start at latest, and lose its first records.
        """
        if self.manifest is None:
            return default
        ends = end_offsets(self.manifest.source_offsets[source])
        return json.dumps({**ends, UNLISTED: "earliest"}, sort_keys=True)

    def initial_state(self, operator: int = 0) -> InitialState | None:
        """The ``initial_state`` of stateful operator ``operator`` (Spark's operator id: the
        operators' order in the query), or None."""
        if self.manifest is None:
            return None
        for snapshot in self.manifest.operators:
            if snapshot.operator_id == operator:
                state_file = self.directory / snapshot.file
                if not isinstance(self.checkpoint, LocalFiles) and not state_file.is_file():
                    self.checkpoint.get(f"{RESTORED_DIRECTORY}/{snapshot.file}", state_file)
                return InitialState(
                    path=str(state_file),
                    work_directory=str(self.directory / f"operator-{operator}-split"),
                    batch_watermark_ms=self.manifest.batch_watermark_ms,
                    next_batch_watermark_ms=self.manifest.next_batch_watermark_ms,
                    checkpoint_location=self.checkpoint.location,
                    operator_id=operator,
                )
        return None


def logged_watermark(path: Path, line: int) -> int | None:
    """The watermark in line ``line`` of Spark's offset log (``batchWatermarkMs``) or commit
    log (``nextBatchWatermarkMs``) entry at ``path``; None when it holds none."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return watermark_in(text, line)


def watermark_in(text: str | None, line: int) -> int | None:
    """The watermark in line ``line`` of the text of an offset or commit log entry."""
    try:
        entry = json.loads((text or "").splitlines()[line])
    except (IndexError, ValueError):
        return None
    value = entry.get("batchWatermarkMs", entry.get("nextBatchWatermarkMs"))
    return int(value) if isinstance(value, int) else None


def end_offsets(offsets: dict[str, Any] | None) -> dict[str, Any]:
    """A logged replayable-kafka offset without its bookkeeping keys (``@starts``, ...):
    topic -> partition -> where the batch ended, the form ``startingOffsets`` takes."""
    return {topic: ends for topic, ends in (offsets or {}).items() if not topic.startswith("@")}


def describe(manifest: Manifest) -> str:
    lines = [f"savepoint of batch {manifest.batch_id} (eospack {manifest.eospack_version})"]
    for offsets in manifest.source_offsets:
        ends = {
            topic: parts for topic, parts in (offsets or {}).items() if not topic.startswith("@")
        }
        lines.append(f"  source offsets {json.dumps(ends, sort_keys=True)}")
    if manifest.next_batch_watermark_ms:
        lines.append(f"  watermark {manifest.next_batch_watermark_ms} ms (next batch's)")
    for operator in manifest.operators:
        lines.append(
            f"  operator {operator.operator_id} ({operator.name}): {operator.rows} keys,"
            f" written with key_groups={operator.key_groups}"
        )
    return "\n".join(lines)
