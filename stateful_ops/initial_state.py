"""Start an operator from given per-key state: what a savepoint restore runs on.

Spark has no state writer, so a restored query cannot be handed a state store. Instead an
operator given an ``InitialState`` (Parquet, one row per key: the key columns and the
state fields, as ``eospack savepoint create`` writes it) bootstraps on first use:

- Before the query starts, a Spark job splits the savepoint by key group with the same
  Spark expression the stream uses (``pmod(xxhash64(keys), key_groups)``), so the split
  follows this query's ``key_groups``, whatever the savepoint's were: rescaling. The
  executors read the savepoint and write the split (one Parquet directory per key group,
  ``write_split``); the driver never holds the keys.
- Every batch with input rows routes one bootstrap marker per input partition to every
  key group (next to the settings marker), so its first such batch visits all of them.
  A key group without state loads its keys from the split and goes on as usual; once
  visited it keeps a state row even when it holds no key, so it never loads twice.
- Nothing is stored until that batch commits: a crash before it bootstraps again.
- On the segment log (``state_layout="segment-log"``) the same: a key group without a
  log loads its keys and writes them as its first segment (an empty one too), and
  "holds state" means holds a log (``held_key_groups``).
- Bootstrapping stops once every key group holds state: a query started on a restored
  checkpoint whose last committed batch has a state row for each key group (read
  through Spark's state data source) sends no bootstrap markers, and records that in the
  work directory, so a key group emptied later never loads its keys again. Until then a
  visit by markers alone is a visit without data: it expires what is due (as Spark's
  timeout would) or re-arms the timeout, and rewrites nothing else.
- Keys are split with the operator's own key types: the file holds timestamps as state
  does (tz-naive wall times of the session time zone), which Spark would read back as
  TIMESTAMP_NTZ and hash differently; they are cast to the key's type first (Spark's cast
  reads a wall time in the session time zone), so a restored key lands in the key group a
  running query sends its rows to. The session time zone must therefore be the old
  query's, as for any restart of an operator keyed by timestamps.
- The watermark: ``batch_watermark_ms`` and ``next_batch_watermark_ms`` are the old
  query's (its offset and commit logs), and a fresh checkpoint's watermark starts at 0.
  An operator with event-time timeouts clocks every batch with at least
  ``next_batch_watermark_ms`` (closing sessions and expiring keys as the old query would
  have next) and drops rows at or behind the watermark Spark would have dropped them
  with: ``batch_watermark_ms`` in the restored query's batch 0, ``next_batch_watermark_ms``
  afterwards (Spark drops rows at or behind the previous batch's watermark; its own
  watermark takes over once it passes). Other operators keep every row, as Spark does
  (it drops late rows only before event-time timeouts).

Guarantee: the first batch sees exactly the savepoint's keys with their state, and every
later batch sees the state the previous one committed. Cost: one marker row per input
partition and key group per batch until bootstrapping stops, and key groups that get only
markers are not rewritten (operators with timeouts decode their state to re-arm them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import DataType

from eospack.core.checkpoint_files import checkpoint_files, spark_path

from .errors import OperatorDefinitionError
from .segment_log_state import LAYOUT as SEGMENT_LOG
from .segment_log_state import LOG_STATE, operator_layout, settings_rows
from .state_codec import (
    EXPIRES_COLUMN,
    EXPIRY_CLOCK,
    SETTING_DEFAULTS,
    TIMER_COLUMN,
    TTL_MS,
    expiry_clock_change,
    stored_name,
)

if TYPE_CHECKING:
    from .base import StatefulOperator

SPLIT_COMPLETE = "_complete"
KEY_GROUP_PARTITION = "__so_key_group"
"""The split's partition column: ``__so_key_group=<n>/`` holds that key group's keys.
Reserved (``__so_``), so it never collides with a key or state column: a split by
``key_group``, the name before, could not be written for a query keyed by a column
``key_group`` (Spark: ambiguous reference)."""
SETTINGS_ROW = -1
"""The key group of an operator's settings row (``base.SETTINGS_KEY_GROUP``): its blob is
an empty table, the only rows ``operator_id_of`` brings to the driver."""
BOOTSTRAP_COMPLETE = "_bootstrapped"


@dataclass(frozen=True)
class InitialState:
    """Per-key state to start from: ``path`` is the Parquet file, ``work_directory`` a
    directory the restored query owns, where the per-key-group split is written.
    ``checkpoint_location`` and ``operator_id`` name the restored query's own state (to
    see whether bootstrapping is complete); the watermarks are the old query's (None when
    unknown: a savepoint of format 1, or a query without a watermark).

    ``operator_name``: set when the state was claimed by name
    (``RestoredCheckpoint.initial_states``): the operator it is handed to must carry that
    name, and the restored query's own state of it is found by that name, whatever its
    position (``operator_id`` then only counts while no operator of the checkpoint holds
    state under the name)."""

    path: str
    work_directory: str
    batch_watermark_ms: int | None = None
    next_batch_watermark_ms: int | None = None
    checkpoint_location: str | None = None
    operator_id: int = 0
    operator_name: str | None = None
    state_settings: dict[str, str] | None = None
    """The checked settings the savepoint's state was written with where not at their
    default (``ttl_time``, ``timers``), and the ttl its expiries count with (``ttl_ms``,
    see ``with_expiry_of``); None: unknown (a savepoint of format 1-3)."""

    def stored_setting(self, name: str) -> str | None:
        """The savepoint's value of checked setting ``name``, None when unknown."""
        if self.state_settings is None:
            return None
        default = SETTING_DEFAULTS.get(name.encode())
        return self.state_settings.get(name, None if default is None else default.decode())


def split_by_key_group(
    spark: SparkSession, initial_state: InitialState, operator: StatefulOperator
) -> str:
    """Write ``initial_state``'s keys into one Parquet directory per key group of
    ``operator`` (once per ``key_groups``) and return the directory holding them. Refuses a
    file whose columns are not the operator's state columns, before any query starts.

    The split is a Spark job: executors read the savepoint (a local path or any Hadoop file
    system URI), compute each key's group and write it, so the driver never holds the
    state. The work directory must be one every executor can read and write (local mode,
    one host, or a shared mount)."""
    refuse_another_expiry_clock(operator, initial_state)
    directory = Path(initial_state.work_directory) / split_name(
        operator, stored_ttl_ms(initial_state) is not None
    )
    if (directory / SPLIT_COMPLETE).exists():
        return str(directory)
    try:
        frame = spark.read.parquet(spark_path(initial_state.path))
    except AnalysisException as error:
        reason = str(error).splitlines()[0]
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {initial_state.path} cannot be read ({reason});"
            " give the state file of a savepoint restored with eospack savepoint restore"
        ) from None
    watermark_ms = initial_state.next_batch_watermark_ms
    if watermark_ms is None:
        watermark_ms = initial_state.batch_watermark_ms
    frame = with_expiry_of(
        operator,
        frame,
        watermark_ms,
        initial_state.stored_setting("ttl_time"),
        stored_ttl_ms(initial_state),
    )
    frame = with_timer_column_of(
        operator, frame, initial_state.path, initial_state.stored_setting("timers")
    )
    stored = from_arrow_schema(operator.arrow_state_schema, prefer_timestamp_ntz=True)
    expected = [(field.name, field.dataType) for field in stored.fields]
    found = [(field.name, field.dataType) for field in frame.schema.fields]
    added = {EXPIRES_COLUMN, TIMER_COLUMN}
    if sorted(found, key=str) == sorted(expected, key=str) and [
        column for column in found if column[0] not in added
    ] == [column for column in expected if column[0] not in added]:
        # ttl turned on through a savepoint with timers appends its expiry after them
        frame = frame.select(*(name for name, _ in expected))
        found = expected
    if found != expected:
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {initial_state.path} holds columns"
            f" {describe(found)} but this operator's state is {describe(expected)}: restore"
            " the savepoint into a query with the same key columns and operator"
        )
    split = typed_key_groups(frame, operator, KEY_GROUP_PARTITION)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    written = staging / "groups"
    write_split(split, written)
    (written / SPLIT_COMPLETE).touch()
    try:
        os.rename(written, directory)
    except OSError:  # another start split it first: theirs is the same
        pass
    shutil.rmtree(staging, ignore_errors=True)
    return str(directory)


def stored_ttl_ms(initial_state: InitialState) -> int | None:
    """The ttl (ms) the savepoint's expiries are counted with (``OperatorSnapshot.settings``
    ``ttl_ms``), None when it has no expiries or does not say (a savepoint written before
    it recorded its reference ttl)."""
    value = initial_state.stored_setting(TTL_MS.decode())
    return None if value is None else int(value)


def refuse_another_expiry_clock(operator: StatefulOperator, initial_state: InitialState) -> None:
    """Refuse deduplicate's expiries of one clock restored into the other (event_time
    switched), where the savepoint says which (unknown: not refused), before any split."""
    declared = (operator.arrow_state_schema.metadata or {}).get(EXPIRY_CLOCK)
    stored = initial_state.stored_setting(EXPIRY_CLOCK.decode())
    if declared is not None and stored is not None and stored != declared.decode():
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {initial_state.path}:"
            f" {expiry_clock_change(stored, declared)}"
        )


SPLIT_BUFFER_BYTES = 128 * 1024 * 1024
"""How much of its part of the savepoint a task of the split holds before writing it out."""


def write_split(split: DataFrame, directory: Path) -> None:
    """Write ``split`` (the state columns and ``KEY_GROUP_PARTITION``) into ``directory``,
    one ``KEY_GROUP_PARTITION=<n>/`` directory of Parquet files per key group, in one Spark
    job without a shuffle: Spark computes each key's group (the stream's expression) and
    each task's Python worker sorts its part of the savepoint by it and writes each key
    group's rows with Arrow's Parquet writer (``split_writer``).

    Why not ``split.write.partitionBy(...)``: Spark sorts every task's rows by key group
    for its Parquet writer, which took about half of a restore's seconds (docs/
    performance.md). Commit: each task attempt writes files of its own names and reports
    them; the files no successful attempt reported (a failed attempt's) are deleted, so no
    key is loaded twice."""
    written = split.mapInArrow(split_writer(str(directory)), "file string").collect()
    kept = {row["file"] for row in written}
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob(f"{KEY_GROUP_PARTITION}=*/*"):
        if f"{path.parent.name}/{path.name}" not in kept:
            path.unlink()


def split_writer(directory: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function writing its rows into ``directory``, one Parquet file per
    key group (``KEY_GROUP_PARTITION``, not written: the directory names it) and per
    ``SPLIT_BUFFER_BYTES`` of rows, and yielding the files' names relative to
    ``directory``."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        files: list[str] = []
        buffered: list[pa.RecordBatch] = []
        size = 0

        def flush() -> None:
            table = pa.Table.from_batches(buffered).sort_by(KEY_GROUP_PARTITION)
            groups = table.column(KEY_GROUP_PARTITION).to_numpy()
            starts = [0, *(np.flatnonzero(np.diff(groups)) + 1)]
            ends = [*starts[1:], len(groups)]
            rows = table.drop_columns([KEY_GROUP_PARTITION])
            for start, end in zip(starts, ends, strict=True):
                group = f"{KEY_GROUP_PARTITION}={int(groups[start])}"
                os.makedirs(os.path.join(directory, group), exist_ok=True)
                file = f"{group}/part-{uuid.uuid4().hex}.parquet"
                pq.write_table(rows.slice(start, end - start), os.path.join(directory, file))
                files.append(file)

        for batch in batches:
            if not batch.num_rows:
                continue
            buffered.append(batch)
            size += batch.nbytes
            if size >= SPLIT_BUFFER_BYTES:
                flush()
                buffered, size = [], 0
        if buffered:
            flush()
        if files:
            yield pa.RecordBatch.from_arrays([pa.array(files, pa.string())], names=["file"])

    return write


def split_name(operator: StatefulOperator, ttl_moved: bool = False) -> str:
    """The split's directory: per ``key_groups`` and stored columns, so a restart with
    another ``ttl`` setting (or columns) before the first commit splits again rather than
    loading a split of other columns; and per partition column, so a split written by an
    eospack with the partition column ``key_group`` is split again, not read as empty.
    Per checked setting away from its default too (``ttl_time``, ``timers``): the columns
    are the same in either time, and a split of processing-time expiries or timers loaded
    as event times would expire or fire by the other clock (unchecked: the restore checks
    the settings only while it splits). Settings at their defaults add nothing, so such a
    split keeps its name. With ``ttl_moved`` (the savepoint records the ttl its expiries
    count with, which the split moves to the operator's), per ttl value too: a restart
    with another ttl before the first commit splits again with that ttl."""
    columns = ",".join(f"{field.name}:{field.type}" for field in operator.arrow_state_schema)
    columns = f"{KEY_GROUP_PARTITION};{columns}"
    metadata = operator.arrow_state_schema.metadata or {}
    settings = [
        f"{name.decode()}={metadata[name].decode()}"
        for name in SETTING_DEFAULTS
        if name in metadata
    ]
    if ttl_moved and operator.ttl_ms is not None:
        settings.append(f"ttl_ms={operator.ttl_ms}")
    if settings:
        columns = f"{columns};{','.join(settings)}"
    digest = hashlib.sha256(columns.encode()).hexdigest()[:12]
    return f"key-groups-{operator.key_groups}-{digest}"


def typed_key_groups(frame: DataFrame, operator: StatefulOperator, key_group: str) -> DataFrame:
    """``frame`` (the state columns as stored: ``arrow_state_schema``'s, with ``ttl`` the
    expiry too) with ``key_group``: each key's group computed on the key cast to the
    operator's own Spark type, with the stream's expression."""
    names = operator.arrow_state_schema.names
    stored = [f"__so_stored_{index}" for index in range(len(names))]
    renamed = frame.toDF(*stored)
    typed = renamed.select(
        *stored,
        *[
            F.col(stored[names.index(key)]).cast(operator.state_schema[key].dataType).alias(key)
            for key in operator.keys
        ],
    )
    return typed.select(
        operator.key_group_column().alias(key_group),
        *[F.col(column).alias(name) for column, name in zip(stored, names, strict=True)],
    )


def bootstrap_needed(spark: SparkSession, initial_state: InitialState, key_groups: int) -> bool:
    """Whether a query on the restored checkpoint must still bootstrap: False once the
    checkpoint's last committed batch holds a state row for every key group (recorded in
    the work directory, so it stays False when a key group empties later)."""
    done = Path(initial_state.work_directory) / f"{BOOTSTRAP_COMPLETE}-{key_groups}"
    if done.exists():
        return False
    checkpoint = initial_state.checkpoint_location
    if checkpoint is None or not any(
        name.isdigit() for name in checkpoint_files(checkpoint, spark).names("commits")
    ):
        return True
    operator_id: int | None = initial_state.operator_id
    if initial_state.operator_name is not None:
        operator_id = operator_id_of(spark, checkpoint, initial_state.operator_name)
        if operator_id is None:
            return True
    assert operator_id is not None
    try:
        held = held_key_groups(spark, checkpoint, operator_id)
    except Exception:  # no state of this operator yet (Spark's reader refuses)
        return True
    if held != set(range(key_groups)):
        return True
    done.parent.mkdir(parents=True, exist_ok=True)
    done.touch()
    return False


def held_key_groups(spark: SparkSession, checkpoint: str, operator_id: int) -> set[int]:
    """The key groups holding state after ``checkpoint``'s last committed batch: a state
    row (key groups), a log (segment log: its ListState of segments, which a bootstrap
    never clears)."""
    reader = spark.read.format("statestore").option("operatorId", operator_id)
    try:
        layout = operator_layout(spark, checkpoint, operator_id)
    except Exception:  # no operator metadata: a key-groups checkpoint of an older Spark
        layout = "key-groups"
    if layout == SEGMENT_LOG:
        reader = reader.option("stateVarName", LOG_STATE)
    rows = reader.load(checkpoint).selectExpr("key.*").collect()
    return {int(row[0]) for row in rows if row[0] is not None and row[0] >= 0}


def operator_id_of(spark: SparkSession, checkpoint: str, name: str) -> int | None:
    """The operator id under which ``checkpoint``'s last committed batch holds the state of
    the operator named ``name`` (read from each operator's settings row), or None."""
    files = checkpoint_files(checkpoint, spark)
    for operator in sorted((entry for entry in files.names("state") if entry.isdigit()), key=int):
        try:
            if operator_layout(spark, checkpoint, int(operator)) == SEGMENT_LOG:
                stored = settings_rows(spark, checkpoint, None, int(operator))
            else:
                stored = (
                    spark.read.format("statestore")
                    .option("operatorId", int(operator))
                    .load(checkpoint)
                    .selectExpr("key.*", "value.groupState.*")
                    .toDF("key_group", "format_version", "operator", "blob")
                )
            rows = stored.where(F.col("key_group") == SETTINGS_ROW).collect()
        except Exception:  # not a stateful_ops operator, or nothing stored yet
            continue
        settings = [(version, kind, blob) for _, version, kind, blob in rows]
        if any(stored_name(row) == name for row in settings):
            return int(operator)
    return None


def with_expiry_of(
    operator: StatefulOperator,
    frame: DataFrame,
    watermark_ms: int | None = None,
    stored_ttl_time: str | None = None,
    stored_ttl_ms: int | None = None,
) -> DataFrame:
    """A savepoint's state as the operator keeps it with or without ``ttl``: turning ttl on
    through a savepoint gives every restored key the full ttl from the restore (the split
    is written once, so a restart replays with the same expiries); turning it off drops the
    expiries and the keys whose ttl had run out by the restore (a stopped query leaves
    them in state until a timeout visits their key group): they never come back.

    With ``ttl_time="event"`` the restore's time is ``watermark_ms``, the old query's next
    watermark (the restored query's first batch clocks with at least it): the savepoint
    holds no event time per key, and a key without one counts as at the watermark, as a
    row without one does. Unknown (a query without a watermark): the wall clock.

    The savepoint's expiries are in the time of its ``stored_ttl_time`` (None: unknown, a
    savepoint of format 1-3, taken as processing time): turning ttl off drops the keys run
    out by the restore in that time, and a ttl kept in the other time (processing to event
    or back) first drops those, then gives the others the full ttl, as turning it on does.

    A ttl kept in the same time but of another value (``stored_ttl_ms``: the ttl the
    savepoint's expiries count with) applies to the restored keys as it does on one
    checkpoint (Flink's rule): every kept expiry moves by the new ttl minus the stored one,
    so each key lives the new ttl from its last batch with rows (or latest event), and the
    keys whose new ttl ran out by the restore are dropped. Unknown (None: a savepoint
    written before it recorded its ttl), the expiries are kept as they are.
    """
    wall_clock_ms = int(time.time() * 1000)

    def restored_at(ttl_time: str | None) -> int:
        """The restore's time in ``ttl_time``: what the stored expiries ran out by."""
        if ttl_time == "event" and watermark_ms is not None:
            return watermark_ms
        return wall_clock_ms

    def counted_from(ttl_time: str) -> int:
        """Where a new ttl counts from: as ``restored_at``, but Spark logs watermark 0 for a
        query without one (never nothing), which as an event time would run every restored
        key out at the restored query's first watermark: the wall clock instead."""
        if ttl_time == "event" and not watermark_ms:
            return wall_clock_ms
        return restored_at(ttl_time)

    has_expiry = EXPIRES_COLUMN in frame.columns
    other_time = operator.ttl_ms is not None and operator.ttl_time != (
        stored_ttl_time or operator.ttl_time
    )
    if has_expiry and (operator.ttl_ms is None or other_time):
        run_out = restored_at(stored_ttl_time)
        frame = frame.where(F.col(EXPIRES_COLUMN) > run_out).drop(EXPIRES_COLUMN)
        has_expiry = False
    if operator.ttl_ms is not None and not has_expiry:
        expires = counted_from(operator.ttl_time) + operator.ttl_ms
        return frame.withColumn(EXPIRES_COLUMN, F.lit(expires).cast("long"))
    if has_expiry and stored_ttl_ms is not None and stored_ttl_ms != operator.ttl_ms:
        assert operator.ttl_ms is not None  # without ttl the expiries were dropped above
        moved = (F.col(EXPIRES_COLUMN) + F.lit(operator.ttl_ms - stored_ttl_ms)).cast("long")
        frame = frame.withColumn(EXPIRES_COLUMN, moved)
        return frame.where(F.col(EXPIRES_COLUMN) > restored_at(operator.ttl_time))
    return frame


def with_timer_column_of(
    operator: StatefulOperator, frame: DataFrame, path: str, stored_timers: str | None = None
) -> DataFrame:
    """A savepoint's state as an operator with or without ``timers`` keeps it. Timers
    turned on: every restored key starts without a timer, as the old operator left it (an
    exact continuation). Turned off: refused, since the savepoint's registered timers
    would never fire and their output would be lost; the operator keeps its timers (an
    ``on_timer`` that emits nothing lets them pass). Another kind (``stored_timers``, None:
    unknown, a savepoint of format 1-3): refused, since due times of one clock compared
    with the other fire too early or never."""
    has_timers = TIMER_COLUMN in frame.columns
    if (
        has_timers
        and operator.timers != "none"
        and stored_timers is not None
        and stored_timers != operator.timers
    ):
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {path} holds {stored_timers}-time timers and this"
            f" operator has timers={operator.timers!r}, whose due times are another clock's;"
            f" keep timers={stored_timers!r} for this savepoint"
        )
    if operator.timers != "none" and not has_timers:
        return frame.withColumn(TIMER_COLUMN, F.lit(None).cast("long"))
    if operator.timers == "none" and has_timers:
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {path} holds per-key timers (its operator set"
            " timers) and this operator has timers='none', so they would never fire; keep"
            " the old operator's timers ('processing' or 'event'; an on_timer that emits"
            " nothing lets them pass)"
        )
    return frame


def load_key_group(directory: str, key_group: int, schema: pa.Schema) -> pd.DataFrame | None:
    """The initial state of ``key_group`` (None when the savepoint had none of its keys)."""
    path = Path(directory) / f"{KEY_GROUP_PARTITION}={key_group}"
    if not path.is_dir():
        return None
    table = pq.read_table(str(path), partitioning=None)
    return table.select(schema.names).cast(schema).to_pandas()


def describe(columns: list[tuple[str, DataType]]) -> str:
    return ", ".join(f"{name} {data_type.simpleString()}" for name, data_type in columns)
