"""Savepoints: a stopped query's last committed batch, owned by the user, restorable into a
new query with other ``key_groups``, shuffle partitions or state store provider.

A savepoint is a directory (a local path, a ``file://`` URI, or any Hadoop file system URI
such as ``s3a://``, read and written through Spark's Hadoop file system:
``eospack.core.checkpoint_files``)::

    manifest.json              written last: a directory without it is no savepoint
    state/operator-<id>/       Parquet, one row per key: key columns and state fields
                               (a single file operator-<id>.parquet before distributed
                               savepoints; both restore)

Neither create nor restore passes the state through the driver: ``create_savepoint`` reads
it with Spark's state data source, the executors decode the key groups and write the
Parquet files straight to the savepoint's path, in one Spark job for a local savepoint
(``state_reader.write_state_files``), through Spark's Parquet writer elsewhere
(``state_reader.state_frame``); a segment-log state is folded into the key-groups
layout's rows first, so the savepoint does not depend on the layout; a restore
splits it by key group in a Spark job (``initial_state.split_by_key_group``). The driver
holds each key group's schema only, so its memory does not grow with the number of keys.

The manifest holds the eospack version, the batch id, each source's offsets as Spark
logged them, Spark's watermarks of the batch and of the next one (offset and commit log),
and per stateful operator its kind (``name``), its stable name if it has one
(``operator_name``, Flink's uid), columns and rows. The state is canonical:
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

Operator names (Flink's uid): ``RestoredCheckpoint.initial_states(names)`` maps the
savepoint's state to the new query's operators by name, whatever their positions; a
savepoint operator without a name (written before names, or by an unnamed operator) maps
by position as before (``names[i]``; None there stands for the query's unnamed operator
``i``, which takes it with ``initial_state(i)``). A savepoint operator no query operator
claims, or a query operator the savepoint has no state for, is refused in one line unless
missing state is allowed (``allow_missing=True``, or ``eospack savepoint restore
--allow-missing``, Flink's ``--allowNonRestoredState``): then the former's state is
dropped and the latter starts empty. The checks hold while the savepoint's copy matters:
a savepoint operator whose state the checkpoint holds (its bootstrap completed) needs no
claimant, and once a batch committed a new name is the checkpoint's business, so renaming
or dropping an operator between restarts of a restored checkpoint behaves as on any
checkpoint. See ``map_operators``.

Exactly-once across a restore: the new query starts where the savepoint's batch ended, so
nothing the old query committed before the savepoint is read again. ``create_savepoint``
refuses a checkpoint whose last batch is not committed (its sinks may have applied it).
Restoring a savepoint after the old query went on replays what it did after the savepoint,
as in Flink. The 2PC sinks derive their id from the new query's id, so the new query's
ledger starts empty; a query that sets ``sinkId`` must set a new one when restored.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import pyarrow as pa
from pyspark.sql import SparkSession

from eospack.connectors.kafka.source.options import UNLISTED
from eospack.core.checkpoint_files import (
    CheckpointFiles,
    LocalFiles,
    as_hadoop,
    checkpoint_files,
    spark_path,
)
from eospack.core.errors import EospackError
from eospack.stateful_ops.initial_state import (
    BOOTSTRAP_COMPLETE,
    SETTINGS_ROW,
    InitialState,
    bootstrap_needed,
    operator_id_of,
)
from eospack.stateful_ops.state_reader import (
    DescribedState,
    state_frame,
    stored_groups,
    write_state_files,
)
from eospack.stateful_ops.validation import operator_name
from eospack.tools.checkpoint import CheckpointInspectError, CheckpointReport, inspect_checkpoint

FORMAT = "eospack-savepoint"
FORMAT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
"""Version 2 adds the old query's watermarks; a version 1 savepoint restores without them.
Version 3 adds operator names (``OperatorSnapshot.operator_name``); older savepoints have
none, so their operators map by position. Version 4 adds each operator's checked settings
(``OperatorSnapshot.settings``: ttl_time, timers), which older savepoints leave unknown;
since 2026-11-29 it also holds ``ttl_ms`` (the ttl the expiries count with) for an operator
with ttl, without a version change: a savepoint without it restores its expiries unmoved."""
MANIFEST = "manifest.json"
RESTORE_OPTIONS = "restore-options.json"
"""Written by ``restore_savepoint`` next to the restored manifest: the restore's options
(``allow_missing``), the default of ``RestoredCheckpoint``."""
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
    operator_name: str | None = None
    """The operator's stable name (Flink's uid); None for an unnamed operator or a
    savepoint written before names (format version 1 and 2)."""
    settings: dict[str, str] | None = None
    """The checked settings its state was written with where not at their default
    (``ttl_time``: "event", ``timers``: "event"); None for a savepoint written before they
    were recorded (format version 1-3): unknown, so a restore cannot check them. With ttl
    also ``ttl_ms``: the one ttl every key's expiry in the file counts with (key groups
    written with another ttl are moved to it), so that a restore with another ttl moves
    them by the difference; absent in savepoints written before 2026-11-29."""

    def label(self) -> str:
        """How errors and the CLI name the operator: its name, else its position."""
        if self.operator_name is not None:
            return self.operator_name
        return f"unnamed operator {self.operator_id}"


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
    a local path or a Hadoop file system URI (through ``spark``'s Hadoop file system).

    A local destination is staged beside it (``.<name>.partial``) and renamed into place
    under a lock (``exclusive_destination``): it exists complete or not at all, and a
    second create to it while one runs is refused. Elsewhere (``s3a://``, ...) it is
    written in place, the manifest last: a create killed midway leaves a directory
    without manifest, which restore refuses and a create there names in one line."""
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
    if isinstance(target_files, LocalFiles):
        target = target_files.root
        with exclusive_destination(target):
            refuse_existing(target_files)
            staging = target.with_name(f".{target.name}.partial")
            shutil.rmtree(staging, ignore_errors=True)  # left by a create that was killed
            staging.mkdir(parents=True)
            try:
                manifest = write_savepoint(spark, checkpoint_location, report, LocalFiles(staging))
                os.rename(staging, target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return manifest
    refuse_existing(target_files)
    # Written in place: the state files first, the manifest last.
    return write_savepoint(spark, checkpoint_location, report, target_files)


def refuse_existing(target_files: CheckpointFiles) -> None:
    """Refuse a savepoint destination that exists, in one line; one without a manifest is
    named as what it is: a create that was interrupted (on object storage it writes in
    place), to delete before creating there again."""
    if not target_files.exists():
        return
    if not target_files.exists(MANIFEST) and target_files.is_directory(""):
        raise SavepointError(
            f"{target_files.location} exists without {MANIFEST} (an interrupted savepoint"
            " create?): delete it, or give a new directory for the savepoint"
        )
    raise SavepointError(f"{target_files.location} exists: give a new directory for the savepoint")


@contextmanager
def exclusive_destination(target: Path) -> Iterator[None]:
    """Hold ``target``'s create lock (``.<name>.lock`` beside it, ``flock``) while a create
    stages and renames it, so two creates to one local destination never share its
    staging directory (the second, in this or another process, is refused in one line
    and changes nothing). The kernel releases the lock of a killed process, so a create
    killed midway never blocks the next. The lock file is removed once the savepoint is
    in place (a later create finds the destination and stops there); after a failure it
    stays, empty, for the next create to take."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SavepointError(
                f"{target}: another eospack savepoint create is writing this savepoint now:"
                " wait for it to end, or give another directory"
            ) from None
        yield
        lock.unlink(missing_ok=True)


def write_savepoint(
    spark: SparkSession,
    checkpoint_location: CheckpointFiles,
    report: CheckpointReport,
    written: CheckpointFiles,
) -> Manifest:
    """Write the state of ``report``'s last batch and then the manifest into ``written``."""
    from eospack.core.version import __version__

    source = checkpoint_location.location
    last = report.batches[-1]
    operators = []
    for operator in report.operators:
        operator_id = int(operator.operator_id)
        relative = f"state/operator-{operator_id}"
        stored: DescribedState | None
        if isinstance(written, LocalFiles):
            # One Spark job: the executors decode and write (state_reader.write_state_files).
            stored = write_state_files(
                spark, source, last.batch_id, operator_id, written.root / relative
            )
        else:
            stored = state_frame(spark, source, last.batch_id, operator_id)
            if stored is not None:
                stored.frame.write.parquet(spark_path(written.uri(relative)))
        if stored is None:
            continue
        operators.append(
            OperatorSnapshot(
                operator_id=operator_id,
                name=stored.kind,
                rows=stored.rows,
                file=relative,
                columns=[{"name": f.name, "type": str(f.type)} for f in stored.schema],
                key_groups=stored.key_groups,
                operator_name=stored.operator_name,
                settings=stored.checked_settings,
            )
        )
    batch_watermark, next_batch_watermark = clocked_watermarks(
        checkpoint_location,
        last.batch_id,
        watermark_in(checkpoint_location.read_text(f"offsets/{last.batch_id}"), 1),
        watermark_in(checkpoint_location.read_text(f"commits/{last.batch_id}"), 1),
    )
    manifest = Manifest(
        batch_id=last.batch_id,
        source_offsets=last.source_offsets,
        operators=operators,
        checkpoint=str(source),
        eospack_version=__version__,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        settings={"state_store_provider": report.state_store_provider or "Spark default"},
        batch_watermark_ms=batch_watermark,
        next_batch_watermark_ms=next_batch_watermark,
    )
    written.write_text(MANIFEST, manifest.to_json())
    return manifest


def clocked_watermarks(
    checkpoint: CheckpointFiles,
    batch_id: int,
    batch_watermark: int | None,
    next_batch_watermark: int | None,
) -> tuple[int | None, int | None]:
    """The watermarks a checkpoint's event-time operators ran batch ``batch_id`` with and
    would run the next one with: Spark's own (``batch_watermark``, ``next_batch_watermark``)
    or, for a checkpoint restored from a savepoint, at least that savepoint's, since its
    operators clock with the higher of both (``StatefulOperator.clock``): Spark's own
    watermark starts afresh in the new checkpoint and trails the old query's for a while.
    Recording only Spark's would let a savepoint of a restored checkpoint keep keys its
    query had expired, and turning ttl off from it keep keys run out."""
    if checkpoint.read_text(f"{RESTORED_DIRECTORY}/{MANIFEST}") is None:
        return batch_watermark, next_batch_watermark
    restored = Manifest.read(checkpoint, RESTORED_DIRECTORY)
    floor = restored.batch_watermark_ms if batch_id == 0 else restored.next_batch_watermark_ms
    return highest(batch_watermark, floor), highest(
        next_batch_watermark, restored.next_batch_watermark_ms
    )


def highest(first: int | None, second: int | None) -> int | None:
    """The higher of two watermarks, where None means none is known."""
    known = [watermark for watermark in (first, second) if watermark is not None]
    return max(known) if known else None


def restore_savepoint(
    savepoint: str | Path,
    new_checkpoint: str | Path,
    mode: ClaimMode = "no-claim",
    spark: SparkSession | None = None,
    allow_missing: bool = False,
) -> Manifest:
    """Prepare ``new_checkpoint`` (new or empty) for a query that continues from
    ``savepoint``. ``no-claim`` copies it: the savepoint is never changed and the new
    checkpoint shares nothing with it. ``claim`` moves it into the new checkpoint, which
    owns it from then on (no copy on one file system; the savepoint's old path is gone).
    Either may be a Hadoop file system URI: then ``spark`` (default: the active session)
    copies or moves it through Hadoop's file systems.

    ``allow_missing`` (the CLI's ``--allow-missing``) is recorded in the new checkpoint
    as the default of ``RestoredCheckpoint``: a restored query may then drop savepoint
    operators it does not claim and start operators the savepoint lacks empty."""
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
        # The manifest last, as create writes one in place: a rename on an object store
        # copies object by object (manifest.json before state/), so a restore killed in a
        # directory rename left a manifest over part of the state, restored without a word.
        hadoop_source, hadoop_target = as_hadoop(source_files), as_hadoop(target_files)
        transfer = hadoop_source.copy_to if mode == "no-claim" else hadoop_source.move_to
        for name in sorted(hadoop_source.names("")):
            if name != MANIFEST:
                transfer(name, hadoop_target, f"{RESTORED_DIRECTORY}/{name}")
        target_files.write_text(
            f"{RESTORED_DIRECTORY}/{RESTORE_OPTIONS}", restore_options(allow_missing)
        )
        transfer(MANIFEST, hadoop_target, f"{RESTORED_DIRECTORY}/{MANIFEST}")
        if mode == "claim":
            hadoop_source.delete("")
        return manifest
    source, target = source_files.root, target_files.root
    target.mkdir(parents=True, exist_ok=True)
    restored = target / RESTORED_DIRECTORY
    if mode == "claim":
        try:
            os.rename(source, restored)  # one file system: the savepoint moves whole
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
        else:
            (restored / RESTORE_OPTIONS).write_text(restore_options(allow_missing))
            return manifest
    copy_manifest_last(source, restored, restore_options(allow_missing))
    if mode == "claim":
        shutil.rmtree(source)
    return manifest


def copy_manifest_last(source: Path, restored: Path, options: str) -> None:
    """Copy the savepoint ``source`` to ``restored``: every file but the manifest, then the
    restore's options, then the manifest (renamed into place whole). A restore killed
    midway leaves ``restored`` without a manifest, which ``RestoredCheckpoint`` refuses in
    one line; a staging directory renamed at the end left nothing a query could see, so
    the query started next on the checkpoint began afresh (no state, default offsets)
    without a word, and a move across file systems copied the manifest first."""

    def but_the_manifest(directory: str, names: list[str]) -> set[str]:
        return {MANIFEST} & set(names) if Path(directory) == source else set()

    shutil.copytree(source, restored, symlinks=True, ignore=but_the_manifest)
    (restored / RESTORE_OPTIONS).write_text(options)
    partial = restored / f".{MANIFEST}.partial"
    shutil.copyfile(source / MANIFEST, partial)
    os.rename(partial, restored / MANIFEST)


def restore_options(allow_missing: bool) -> str:
    """The restore's record, written by every restore (so a savepoint restored again from a
    checkpoint's ``eospack-savepoint/`` never inherits an earlier restore's options):
    ``allow_missing`` and a ``restore_id`` naming this restore, which keeps the local work
    directory of a checkpoint on object storage apart from that of an earlier restore at
    the same URI."""
    return json.dumps({"allow_missing": allow_missing, "restore_id": uuid.uuid4().hex})


def checked_allow_missing(value: object) -> bool | None:
    """``allow_missing`` as given: True, False or None (the default); anything else (the
    string "false" from a configuration file) refused in one line."""
    if value is None or isinstance(value, bool):
        return value
    raise SavepointError(
        f"allow_missing={value!r}: give True or False (or leave it out to take what"
        " eospack savepoint restore recorded)"
    )


def map_operators(
    snapshots: Sequence[OperatorSnapshot],
    names: Sequence[str | None],
    allow_missing: bool = False,
    *,
    held_by_checkpoint: Callable[[OperatorSnapshot], bool] | None = None,
    restore_committed: bool = False,
) -> dict[str, OperatorSnapshot | None]:
    """Which savepoint operator each of the query's named operators ``names`` continues
    from (Flink's uid semantics).

    A named savepoint operator maps to the query operator of that name. An unnamed one
    (a savepoint from before names, or an unnamed operator) maps by position: operator id
    ``i`` to ``names[i]``, so ``names`` lists the query's operators in the order it defines
    them (Spark's operator ids), which only matters for unnamed state. ``None`` in
    ``names`` stands for an unnamed query operator at that position: it claims the
    unnamed savepoint operator of that id (which it takes with ``initial_state(i)``) and
    gets no entry in the result, so a query naming only some of its operators restores
    without ``allow_missing``. Refused, each in one line naming the operators and the
    fix: an invalid or repeated name in ``names``, a savepoint holding two operators of
    one name, and, unless ``allow_missing``, a savepoint operator nothing claims (its
    state would be lost) or a name the savepoint has no state for (it would start empty).
    With ``allow_missing`` the former is dropped and the latter maps to None (starts
    empty), as Flink's ``--allowNonRestoredState``.

    After the restore took effect the checkpoint decides, as for any query:
    ``held_by_checkpoint(snapshot)`` (asked only of unclaimed savepoint operators) says
    whether the restored checkpoint already holds that operator's state (its bootstrap
    completed): then nothing is lost and it needs no claimant, so renaming or dropping an
    operator between restarts of a restored checkpoint only relabels, as on any
    checkpoint. ``restore_committed``: the restored checkpoint committed a batch, so a
    name without savepoint state is an operator added to a running checkpoint, which
    Spark's state decides about: None, not refused.

    Also refused: ``names`` that is not a list or tuple of names (one name as a string
    was iterated by character, a set has no order, a generator was used up by the checks)
    and names differing only in case (the restored operators' work directories are named
    after them, and some file systems ignore case). Pure: no Spark, no files (but what
    ``held_by_checkpoint`` reads)."""
    check_names(names)
    given = [name for name in names if name is not None]
    by_case: dict[str, list[str]] = {}
    for name in given:
        by_case.setdefault(name.casefold(), []).append(name)
    repeated = sorted({name for name in given if given.count(name) > 1})
    if repeated:
        raise SavepointError(
            f"operator name(s) {', '.join(repeated)} given more than once: give each"
            " operator of the query its own name"
        )
    cased = sorted(
        name for spellings in by_case.values() if len(spellings) > 1 for name in spellings
    )
    if cased:
        raise SavepointError(
            f"operator names {', '.join(cased)} differ only in case: give the query's"
            " operators names that differ in more than case (their restored state is kept"
            " in directories named after them, and some file systems ignore case)"
        )
    by_name: dict[str, list[OperatorSnapshot]] = {}
    for snapshot in snapshots:
        if snapshot.operator_name is not None:
            by_name.setdefault(snapshot.operator_name, []).append(snapshot)
    doubled = sorted(name for name, held in by_name.items() if len(held) > 1)
    if doubled:
        ids = "; ".join(
            f"{name} (operators {', '.join(str(s.operator_id) for s in by_name[name])})"
            for name in doubled
        )
        raise SavepointError(
            f"the savepoint holds several operators named {ids}: names must be unique"
            " within a query; restore it with initial_state(operator_id) by position, or"
            " give the old query's operators distinct names and take a new savepoint"
        )
    mapping: dict[str, OperatorSnapshot | None] = {
        name: by_name[name][0] for name in given if name in by_name
    }
    unclaimed = [
        s for s in snapshots if s.operator_name is not None and s.operator_name not in mapping
    ]
    for snapshot in snapshots:
        if snapshot.operator_name is not None:
            continue
        position = snapshot.operator_id
        claimant = names[position] if position < len(names) else ""
        if claimant is None:
            continue  # the unnamed query operator there takes it with initial_state(i)
        if claimant and claimant not in mapping:
            mapping[claimant] = snapshot
        else:
            unclaimed.append(snapshot)
    missing = [name for name in given if name not in mapping]
    if not allow_missing:
        if held_by_checkpoint is not None:
            unclaimed = [s for s in unclaimed if not held_by_checkpoint(s)]
        if restore_committed:
            missing = []
    if not allow_missing and (unclaimed or missing):
        problems = []
        if unclaimed:
            unnamed = [s.operator_id for s in unclaimed if s.operator_name is None]
            hint = (
                f" (an unnamed operator of this query that takes it stands in names as None"
                f" at its position: names[{unnamed[0]}] = None, and takes"
                f" initial_state({unnamed[0]}))"
                if unnamed and any(s.operator_name is not None for s in snapshots)
                else ""
            )
            problems.append(
                f"savepoint operator(s) {', '.join(s.label() for s in unclaimed)} claimed by"
                f" no operator of this query (their state would be dropped){hint}"
            )
        if missing:
            saved = {
                s.operator_name.casefold(): s.operator_name for s in unclaimed if s.operator_name
            }
            spelled = [saved[name.casefold()] for name in missing if name.casefold() in saved]
            hint = (
                f" (names are case-sensitive: the savepoint has {', '.join(spelled)})"
                if spelled
                else ""
            )
            problems.append(
                f"operator(s) {', '.join(missing)} have no state in the savepoint (they"
                f" would start empty){hint}"
            )
        raise SavepointError(
            f"{'; '.join(problems)}: name the operators as in the savepoint"
            f" ({describe_names(snapshots)}), or allow missing state with"
            " allow_missing=True (CLI: eospack savepoint restore --allow-missing)"
        )
    return {name: mapping.get(name) for name in given}


def check_names(names: object) -> None:
    """Refuse, in one line, ``names`` that is not a list or tuple of valid operator names
    (None stands for an unnamed operator)."""
    if isinstance(names, str):
        raise SavepointError(
            f"names={names!r} is one string: pass a list of the query's operator names,"
            f" e.g. initial_states([{names!r}])"
        )
    if not isinstance(names, (list, tuple)):
        raise SavepointError(
            f"names={names!r} is not a list: pass a list of the query's operator names in"
            " the order the query defines the operators"
        )
    for name in names:
        if name is None:
            continue
        try:
            operator_name("RestoredCheckpoint.initial_states", name)
        except ValueError as error:
            raise SavepointError(str(error)) from None


def describe_names(snapshots: Sequence[OperatorSnapshot]) -> str:
    return ", ".join(f"{s.operator_id}: {s.label()}" for s in snapshots) or "no operators"


class RestoredCheckpoint:
    """What a query started on ``checkpoint_location`` takes from a restored savepoint: its
    sources' starting offsets and its operators' initial state. On a checkpoint that no
    restore prepared, it hands out the defaults, so one program serves both.

    A checkpoint on a Hadoop file system (``s3a://``, ...) is read through ``spark``
    (default: the active session); its operators' state files are copied into
    ``work_directory``, where the operator splits them by key group and its tasks read
    them: a directory every executor can read (default: a directory of this checkpoint
    under the local temporary directory, which serves local mode and one-host clusters).

    ``allow_missing``: whether ``initial_states`` may drop savepoint operators the query
    does not claim and start query operators the savepoint lacks empty; None (default)
    takes what the restore recorded (``eospack savepoint restore --allow-missing``), else
    False."""

    def __init__(
        self,
        checkpoint_location: str | Path,
        spark: SparkSession | None = None,
        work_directory: str | Path | None = None,
        allow_missing: bool | None = None,
    ) -> None:
        self.checkpoint: CheckpointFiles = checkpoint_files(checkpoint_location, spark)
        self.spark = spark
        self.allow_missing = checked_allow_missing(allow_missing)
        if isinstance(self.checkpoint, LocalFiles):
            self.directory = self.checkpoint.root / RESTORED_DIRECTORY
            self.manifest = Manifest.read(self.directory) if self.directory.is_dir() else None
            if self.allow_missing is None:
                self.allow_missing = recorded_allow_missing(
                    self.checkpoint, self.manifest is not None
                )
            return
        location = self.checkpoint.location
        restored = self.checkpoint.is_directory(RESTORED_DIRECTORY)
        if work_directory is None:
            identity = f"{location}\n{recorded_restore_id(self.checkpoint, restored)}"
            digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
            work_directory = Path(tempfile.gettempdir()) / f"eospack-restored-{digest}"
        self.directory = Path(work_directory) / RESTORED_DIRECTORY
        self.manifest = Manifest.read(self.checkpoint, RESTORED_DIRECTORY) if restored else None
        if self.allow_missing is None:
            self.allow_missing = recorded_allow_missing(self.checkpoint, restored)

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
        operators' order in the query), or None: the mapping by position, for unnamed
        operators. Named operators take theirs from ``initial_states``; the state of a
        savepoint operator that has a name carries it, so an operator of another name, or
        none, refuses it in one line."""
        if self.manifest is None:
            return None
        for snapshot in self.manifest.operators:
            if snapshot.operator_id == operator:
                return self.state_of(
                    snapshot, f"operator-{operator}-split", operator, snapshot.operator_name
                )
        return None

    def initial_states(
        self, names: Sequence[str | None], allow_missing: bool | None = None
    ) -> dict[str, InitialState | None]:
        """Each of the query's named operators ``names`` (its ``name=`` arguments, in the
        order the query defines them; None for an unnamed operator, which takes its state
        with ``initial_state(i)``) with its ``initial_state``: the savepoint operator of
        that name (an unnamed savepoint operator by position), None for a name the
        savepoint lacks, when allowed. On a checkpoint no restore prepared, every name gets
        None.

        Refuses in one line (``SavepointError``) what ``map_operators`` refuses: a
        savepoint operator nothing claims, or a name without state, unless
        ``allow_missing`` (default: the constructor's, else what the restore recorded).
        Once the restore took effect the checkpoint decides, as for any query: a savepoint
        operator whose state this checkpoint holds (``held_by_checkpoint``) needs no
        claimant (renaming or dropping it between restarts only relabels), and once a
        batch committed a name without savepoint state gets None."""
        if self.manifest is None:
            return dict.fromkeys(map_operators([], names, allow_missing=True))
        allowed = self.allow_missing if allow_missing is None else allow_missing
        allowed = checked_allow_missing(allowed)
        mapping = map_operators(
            self.manifest.operators,
            names,
            bool(allowed),
            held_by_checkpoint=self.held_by_checkpoint,
            restore_committed=self.committed(),
        )
        states: dict[str, InitialState | None] = {}
        for position, name in enumerate(names):
            if name is None:
                continue
            snapshot = mapping[name]
            states[name] = (
                None
                if snapshot is None
                else self.state_of(snapshot, f"operator-{name}-split", position, name)
            )
        return states

    def committed(self) -> bool:
        """Whether the restored checkpoint committed a batch (its own commit log)."""
        return any(name.isdigit() for name in self.checkpoint.names("commits"))

    def held_by_checkpoint(self, snapshot: OperatorSnapshot) -> bool:
        """Whether this checkpoint holds ``snapshot``'s state: its bootstrap completed here
        (every key group of the operator holds state in a committed batch), so the
        savepoint's copy is no longer needed.

        Read first from the record the operator's start leaves in its work directory
        (``_bootstrapped-<key_groups>``: ``operator-<name>-split`` for a named savepoint
        operator, ``operator-<id>-split`` for an unnamed one); the first start after the
        bootstrap batch has no record yet, so then the checkpoint's state is read through
        Spark's state data source (``spark``, else the active session) as the operator's
        own start does (``initial_state.bootstrap_needed``, which writes the record, so a
        rename is accepted at every later start too, whatever the state then says). False
        when nothing says so: no Spark session, no committed batch, state unreadable."""
        label = snapshot.operator_name or str(snapshot.operator_id)
        directory = self.directory / f"operator-{label}-split"
        if any(directory.glob(f"{BOOTSTRAP_COMPLETE}-*")):
            return True
        if not self.committed():
            return False
        spark = self.spark or SparkSession.getActiveSession()
        if spark is None:
            return False
        location = self.checkpoint.location
        operator_id: int | None = snapshot.operator_id
        if snapshot.operator_name is not None:
            operator_id = operator_id_of(spark, location, snapshot.operator_name)
        if operator_id is None:
            return False
        key_groups = stored_key_groups(spark, location, operator_id)
        if key_groups is None:
            return False
        state = InitialState(
            path=self.checkpoint.uri(f"{RESTORED_DIRECTORY}/{snapshot.file}"),
            work_directory=str(directory),
            checkpoint_location=location,
            operator_id=operator_id,
        )
        return not bootstrap_needed(spark, state, key_groups)

    def state_of(
        self,
        snapshot: OperatorSnapshot,
        work_name: str,
        operator_id: int,
        name: str | None,
    ) -> InitialState:
        """``snapshot``'s state file (fetched from a remote checkpoint) as an InitialState."""
        assert self.manifest is not None
        return InitialState(
            path=self.checkpoint.uri(f"{RESTORED_DIRECTORY}/{snapshot.file}"),
            work_directory=str(self.directory / work_name),
            batch_watermark_ms=self.manifest.batch_watermark_ms,
            next_batch_watermark_ms=self.manifest.next_batch_watermark_ms,
            checkpoint_location=self.checkpoint.location,
            operator_id=operator_id,
            operator_name=name,
            state_settings=snapshot.settings,
        )


def stored_key_groups(spark: SparkSession, checkpoint: str, operator_id: int) -> int | None:
    """The ``key_groups`` operator ``operator_id`` of ``checkpoint`` stored its state with (its
    settings row's Arrow metadata, after the last committed batch), or None when it holds no
    settings row or cannot be read."""
    try:
        rows = (
            stored_groups(spark, checkpoint, None, operator_id)
            .where(f"key_group = {SETTINGS_ROW}")
            .select("blob")
            .collect()
        )
        for (blob,) in rows:
            metadata = pa.ipc.open_stream(bytes(blob)).schema.metadata or {}
            if b"key_groups" in metadata:
                return int(metadata[b"key_groups"])
    except Exception:  # not a stateful_ops operator, or nothing stored: not held
        return None
    return None


def recorded_restore_id(checkpoint: CheckpointFiles, restored: bool) -> str:
    """The ``restore_id`` the restore recorded ("" for a restore before restore ids)."""
    if not restored:
        return ""
    text = checkpoint.read_text(f"{RESTORED_DIRECTORY}/{RESTORE_OPTIONS}")
    try:
        return str(json.loads(text or "{}").get("restore_id", ""))
    except ValueError:
        return ""


def recorded_allow_missing(checkpoint: CheckpointFiles, restored: bool) -> bool:
    """What ``restore_savepoint(allow_missing=...)`` recorded in ``checkpoint`` (False when
    nothing was recorded)."""
    if not restored:
        return False
    text = checkpoint.read_text(f"{RESTORED_DIRECTORY}/{RESTORE_OPTIONS}")
    try:
        return bool(json.loads(text or "{}").get("allow_missing", False))
    except ValueError:
        return False


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
        named = f"name {operator.operator_name}" if operator.operator_name else "unnamed"
        lines.append(
            f"  operator {operator.operator_id} ({operator.name}, {named}): {operator.rows}"
            f" keys, written with key_groups={operator.key_groups}"
        )
    return "\n".join(lines)
