"""Read the per-key state of a stateful_ops query from its checkpoint.

Uses Spark's state data source (``format("statestore")``) and decodes each key group's Arrow
table on the executors (``mapInArrow``), so operators' state stays inspectable although keys
are packed into key groups, and a state of any size is read without passing through the
driver: ``state_frame`` is a DataFrame, one row per key. Only the key groups' schemas (a few
hundred bytes each) reach the driver, to type the frame and name the operator. A state on
the segment log (``state_layout="segment-log"``) is read alike: the executors fold each key
group's log into the key-groups layout's state row first (``segment_log_groups``).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from .base import SETTINGS_KEY_GROUP
from .errors import StateSchemaMismatchError
from .segment_log_state import LAYOUT as SEGMENT_LOG
from .segment_log_state import (
    LOG_STATE,
    OPERATOR_METADATA_KEY,
    encode_segment,
    folded_log,
    operator_layout,
    settings_rows,
    state_variable,
)
from .state_codec import (
    CHECKED_WHEN_PRESENT,
    EXPIRES_COLUMN,
    SETTING_DEFAULTS,
    STATE_FORMAT_VERSION,
    TTL_MS,
)
from .validation import OPERATOR_NAME_METADATA_KEY

GROUP_COLUMNS = ("key_group", "format_version", "operator", "blob")
GROUP_DDL = "key_group long, format_version int, operator string, blob binary"
DESCRIPTION_DDL = "key_group long, format_version int, operator string, schema binary, rows long"


@dataclass(frozen=True)
class DescribedState:
    """What the driver knows of one operator's state after one batch: its columns
    (``schema``), its Arrow schema metadata (``metadata``: ``key_groups``), with the
    operator's kind (``operator``) and, for a named operator, its name (``operator_name``),
    and its number of keys (``rows``)."""

    schema: pa.Schema
    metadata: dict[bytes, bytes]
    rows: int
    """The number of keys (what reading the state gives, known without reading it again)."""

    @property
    def kind(self) -> str:
        return self.metadata.get(b"operator", b"").decode()

    @property
    def checked_settings(self) -> dict[str, str]:
        """The checked settings the state was written with, as a savepoint records them:
        ``state_codec.SETTING_DEFAULTS``'s where not at their default, and those of
        ``CHECKED_WHEN_PRESENT`` where present; with ttl, ``ttl_ms``: the one ttl every
        key's expiry is counted with (``reference_ttl_ms``), informational, so that a
        restore with another ttl moves them by the difference."""
        return {
            name.decode(): self.metadata[name].decode()
            for name in (*SETTING_DEFAULTS, *CHECKED_WHEN_PRESENT, TTL_MS)
            if name in self.metadata
        }

    @property
    def reference_ttl_ms(self) -> int | None:
        """The ttl (ms) the state's expiries are counted with, as read (``decoded_rows``,
        ``write_state_files``): each key group's moved to it from the ttl its rows
        recorded; None without ttl, or when no row recorded its ttl."""
        value = self.metadata.get(TTL_MS)
        return None if value is None else int(value)

    @property
    def key_groups(self) -> int:
        return int(self.metadata.get(b"key_groups", b"0"))

    @property
    def operator_name(self) -> str | None:
        return (self.metadata.get(OPERATOR_NAME_METADATA_KEY) or b"").decode() or None


@dataclass(frozen=True)
class StoredState(DescribedState):
    """A ``DescribedState`` with ``frame``: one row per stored key (key columns and state
    fields, typed by ``schema``), decoded by the executors when an action runs."""

    frame: DataFrame


def read_state(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None = None
) -> pd.DataFrame:
    """One row per stored key (key columns and state fields) after ``batch_id`` (default last).

    The query's stateful operator must be the first (operator id 0) of the checkpoint. The
    result is collected into the driver: for a large state, use ``state_frame``.
    """
    table = read_state_table(spark, checkpoint_location, batch_id)
    return pd.DataFrame() if table is None else table.to_pandas()


def read_state_table(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None = None, operator_id: int = 0
) -> pa.Table | None:
    """The state of operator ``operator_id`` after ``batch_id`` (default last) as one Arrow
    table, collected into the driver in one Spark job (``state_frame`` for a large state),
    its schema's metadata the ``StoredState.metadata``; None when the operator has stored
    nothing (no batch with rows yet)."""
    if operator_layout(spark, checkpoint_location, operator_id) == "segment-log":
        return segment_log_table(spark, checkpoint_location, batch_id, operator_id)
    rows = stored_groups(spark, checkpoint_location, batch_id, operator_id).collect()
    tables = []
    settings_names: list[str | None] = []
    names: set[str | None] = set()
    for key_group, format_version, operator, blob in rows:
        if format_version != STATE_FORMAT_VERSION:
            raise StateSchemaMismatchError(
                f"{operator}: stored state has format version {format_version}; cannot read it"
            )
        table = pa.ipc.open_stream(bytes(blob)).read_all()
        metadata = {**(table.schema.metadata or {}), b"operator": str(operator).encode()}
        stored = metadata.pop(OPERATOR_NAME_METADATA_KEY, None)
        name = stored.decode() if stored is not None else None
        if key_group == SETTINGS_KEY_GROUP:
            settings_names.append(name)
        else:
            names.add(name)
        tables.append(table.replace_schema_metadata(metadata))
    if not tables:
        return None
    result = pa.concat_tables(tables)
    name = settings_names[0] if settings_names else None
    if not settings_names and len(names) == 1:
        name = next(iter(names))
    if name is None:
        return result
    metadata = {**(result.schema.metadata or {}), OPERATOR_NAME_METADATA_KEY: name.encode()}
    return result.replace_schema_metadata(metadata)


def state_frame(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None = None, operator_id: int = 0
) -> StoredState | None:
    """The state of operator ``operator_id`` after ``batch_id`` (default last), or None when
    it has stored nothing (no batch with rows yet). Its name is the settings row's, which
    every batch with rows brings up to date, else the key groups' when they agree.

    Refused (``StateSchemaMismatchError``): a state row of another format version, and key
    groups holding different columns (a checkpoint written by two incompatible queries)."""
    groups = stored_groups(spark, checkpoint_location, batch_id, operator_id)
    descriptions = groups.mapInArrow(describe_groups, DESCRIPTION_DDL).collect()
    described = described_state(operator_id, descriptions)
    if described is None:
        return None
    schema, metadata, rows = described
    spark_schema = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    reference = DescribedState(schema, metadata, rows).reference_ttl_ms
    frame = groups.mapInArrow(decoded_rows(schema, reference), spark_schema)
    return StoredState(schema, metadata, rows, frame)


def described_state(
    operator_id: int, descriptions: Iterable[Sequence[Any]]
) -> tuple[pa.Schema, dict[bytes, bytes], int] | None:
    """The state's columns, metadata (``StoredState.metadata``) and number of keys from one
    description per state row (``DESCRIPTION_DDL``'s first five columns: what
    ``describe_groups`` gives), or None for no state row. Refused
    (``StateSchemaMismatchError``): a state row of another format version, and key groups
    holding different columns."""
    descriptions = list(descriptions)
    if not descriptions:
        return None
    settings_names: list[str | None] = []
    names: set[str | None] = set()
    columns: dict[pa.Schema, int] = {}
    metadata: dict[bytes, bytes] = {}
    rows = 0
    data_ttls: set[int] = set()
    settings_ttls: set[int] = set()
    for key_group, format_version, operator, schema_bytes, group_rows in descriptions:
        rows += group_rows
        if format_version != STATE_FORMAT_VERSION:
            raise StateSchemaMismatchError(
                f"{operator}: stored state has format version {format_version}; cannot read it"
            )
        schema = pa.ipc.read_schema(pa.py_buffer(bytes(schema_bytes)))
        found = dict(schema.metadata or {})
        stored = found.pop(OPERATOR_NAME_METADATA_KEY, None)
        name = stored.decode() if stored is not None else None
        written_ttl = found.pop(TTL_MS, None)
        if key_group == SETTINGS_KEY_GROUP:
            settings_names.append(name)
        else:
            names.add(name)
        if written_ttl is not None:
            ttls = settings_ttls if key_group == SETTINGS_KEY_GROUP else data_ttls
            if key_group == SETTINGS_KEY_GROUP or group_rows:
                ttls.add(int(written_ttl))
        metadata = {**found, **metadata, b"operator": str(operator).encode()}
        plain = schema.remove_metadata()
        columns[plain] = key_group
    if len(columns) > 1:
        described = "; ".join(f"key group {group}: {schema}" for schema, group in columns.items())
        raise StateSchemaMismatchError(
            f"operator {operator_id}: key groups hold different state columns ({described});"
            " the checkpoint was written by incompatible queries: restart from a new"
            " checkpoint location"
        )
    name = settings_names[0] if settings_names else None
    if not settings_names and len(names) == 1:
        name = next(iter(names))
    if name is not None:
        metadata[OPERATOR_NAME_METADATA_KEY] = name.encode()
    schema = next(iter(columns))
    reference = max(data_ttls or settings_ttls, default=None)
    if reference is not None and EXPIRES_COLUMN in schema.names:
        metadata[TTL_MS] = str(reference).encode()
    return schema, metadata, rows


def written_ttl_ms(schema: pa.Schema) -> int | None:
    """The ttl (ms) a state row recorded with its expiries (``TTL_MS``), None when it has
    no expiries or recorded none (a row written before rows recorded their ttl)."""
    value = (schema.metadata or {}).get(TTL_MS)
    if value is None or EXPIRES_COLUMN not in schema.names:
        return None
    return int(value)


def moved_to(table: pa.Table, reference_ttl_ms: int | None) -> pa.Table:
    """``table`` (one key group's rows) with its expiries counted with ``reference_ttl_ms``
    instead of the ttl the rows recorded: each key's expiry is its last batch with rows
    (or latest event) plus the ttl, so it moves by the difference. Unchanged without a
    reference or a recorded ttl."""
    written = written_ttl_ms(table.schema)
    if reference_ttl_ms is None or written is None or written == reference_ttl_ms:
        return table
    index = table.schema.get_field_index(EXPIRES_COLUMN)
    moved = pc.add(table.column(index), pa.scalar(reference_ttl_ms - written, pa.int64()))
    return table.set_column(index, table.schema.field(index), moved)


def stored_groups(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None, operator_id: int
) -> DataFrame:
    """The operator's raw state rows: one per key group (``GROUP_COLUMNS``). On the segment
    log, each key group's log folded by the executors (``segment_log_groups``), so what
    reads state rows (``state_frame``, ``write_state_files``, savepoints) reads either
    layout alike."""
    if operator_layout(spark, checkpoint_location, operator_id) == SEGMENT_LOG:
        return segment_log_groups(spark, checkpoint_location, batch_id, operator_id)
    reader = spark.read.format("statestore").option("operatorId", operator_id)
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    rows = reader.load(checkpoint_location).selectExpr("key.*", "value.groupState.*")
    named = rows.toDF(*GROUP_COLUMNS)
    return named.withColumn("key_group", named["key_group"].cast("long"))


def segment_log_groups(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None, operator_id: int
) -> DataFrame:
    """A segment-log operator's state as the key-groups layout's state rows: per key group
    with a log, one row whose blob is its folded log (``folded_logs``, on the executors:
    the driver never holds keys), and the settings ValueState's row. The format version is
    the key-groups layout's, the segments' encoding (``segment_schema``) being its table's
    plus the tombstone flag the fold drops."""
    logs = state_variable(spark, checkpoint_location, batch_id, operator_id, LOG_STATE)
    logs = logs.selectExpr("key.*", "list_value").toDF("key_group", "segments")
    groups = logs.withColumn("key_group", logs["key_group"].cast("long")).mapInArrow(
        folded_logs, GROUP_DDL
    )
    return groups.unionByName(settings_rows(spark, checkpoint_location, batch_id, operator_id))


def folded_logs(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function folding each key group's log (``folded_log``) into a state
    row of ``GROUP_DDL`` (the kind from the segments' metadata). An executor holds one key
    group's log at a time."""
    for batch in batches:
        key_groups = batch.column("key_group").to_pylist()
        logs = batch.column("segments")
        rows: list[tuple[int, str, bytes]] = []
        for index in range(batch.num_rows):
            elements = logs[index].values
            if elements is None or not len(elements):
                continue
            blobs = elements.field("segment")
            segments = [pa.ipc.open_stream(blob.as_buffer()).read_all() for blob in blobs]
            table = folded_log(segments)
            metadata = dict(table.schema.metadata or {})
            kind = metadata.pop(OPERATOR_METADATA_KEY, b"").decode()
            rows.append(
                (key_groups[index], kind, encode_segment(table.replace_schema_metadata(metadata)))
            )
        if rows:
            columns = list(zip(*rows, strict=True))
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(columns[0], pa.int64()),
                    pa.array([STATE_FORMAT_VERSION] * len(rows), pa.int32()),
                    pa.array(columns[1], pa.string()),
                    pa.array(columns[2], pa.binary()),
                ],
                names=list(GROUP_COLUMNS),
            )


def segment_log_table(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None, operator_id: int
) -> pa.Table | None:
    """``read_state_table`` of an operator on the segment log: each key group's ListState
    (in list order, through the state data source) folded to its live rows."""
    logs = state_variable(spark, checkpoint_location, batch_id, operator_id, LOG_STATE)
    tables = []
    for row in logs.select("list_value").collect():
        segments = [pa.ipc.open_stream(bytes(element[0])).read_all() for element in row[0]]
        if segments:
            tables.append(folded_log(segments))
    if not tables:
        return None
    return pa.concat_tables(tables)


def describe_groups(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Each state row's key group, format, kind, Arrow schema (serialized; empty for a
    format this code cannot read) and number of keys: what the driver needs, not the keys."""
    for batch in batches:
        blobs = batch.column("blob")
        versions = batch.column("format_version").to_pylist()
        schemas, rows = [], []
        for index in range(batch.num_rows):
            if versions[index] != STATE_FORMAT_VERSION:
                schemas.append(b"")
                rows.append(0)
                continue
            table = pa.ipc.open_stream(blobs[index].as_buffer()).read_all()  # zero-copy
            schemas.append(table.schema.serialize().to_pybytes())
            rows.append(table.num_rows)
        yield pa.RecordBatch.from_arrays(
            [
                batch.column("key_group"),
                batch.column("format_version"),
                batch.column("operator"),
                pa.array(schemas, pa.binary()),
                pa.array(rows, pa.int64()),
            ],
            names=["key_group", "format_version", "operator", "schema", "rows"],
        )


def decoded_rows(
    schema: pa.Schema, reference_ttl_ms: int | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function turning state rows into their keys' rows of ``schema``; an
    executor holds one key group's table at a time. With ``reference_ttl_ms`` (the state's
    ``DescribedState.reference_ttl_ms``) each group's expiries are moved to that ttl from
    the one its rows recorded (``moved_to``), so all keys' expiries count with one ttl."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            blobs = batch.column("blob")
            for index in range(batch.num_rows):
                table = pa.ipc.open_stream(blobs[index].as_buffer()).read_all()
                if table.num_rows:
                    table = moved_to(table, reference_ttl_ms)
                    yield from table.replace_schema_metadata(None).cast(schema).to_batches()

    return decode


WRITTEN_DDL = f"{DESCRIPTION_DDL}, file string"
"""``describe_groups``' columns and the file (its name) the state row's keys went to ("" for
none)."""


def write_state_files(
    spark: SparkSession,
    checkpoint_location: str,
    batch_id: int | None,
    operator_id: int,
    directory: Path,
) -> DescribedState | None:
    """Write the state of operator ``operator_id`` after ``batch_id`` (default last) into
    ``directory`` as Parquet (one row per key: key columns and state fields, what
    ``state_frame`` reads, each key's expiry counted with the state's reference ttl) and
    describe it, in one Spark job (a second, ``move_expiries``, only when a ttl changed on
    the checkpoint left key groups written with another ttl); None (and no directory) when
    the operator has stored nothing. Refused as ``state_frame`` refuses, leaving no
    directory.

    Why not ``state_frame(...).frame.write.parquet``: that reads the state twice (once to
    type the frame, once to write it) and hands every decoded key from the Python worker
    to the JVM for Spark's Parquet writer; here the executors' Python workers write the
    keys as they decode them (``written_groups``, Arrow's Parquet writer) and return only
    the descriptions. ``directory`` is a local path every executor can write (local mode,
    one host, or a shared mount), as for the restore's split.

    Commit: each task attempt writes files of its own names and reports them; the driver
    keeps the reported files (one attempt per partition: the successful one) and deletes
    the rest (those of failed attempts), so no key is written twice. The Parquet schema is
    the state's columns (timestamps in microseconds, as Spark writes them); an operator
    without keys gets one empty file with that schema, so a restore reads its columns."""
    groups = stored_groups(spark, checkpoint_location, batch_id, operator_id)
    rows = groups.mapInArrow(written_groups(str(directory)), WRITTEN_DDL).collect()
    try:
        described = described_state(operator_id, [tuple(row)[:5] for row in rows])
    except StateSchemaMismatchError:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    if described is None:
        shutil.rmtree(directory, ignore_errors=True)
        return None
    schema, metadata, keys = described
    state = DescribedState(schema, metadata, keys)
    kept = {row["file"] for row in rows if row["file"]}
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.iterdir():
        if path.name not in kept:  # a failed task attempt's
            path.unlink()
    if not kept:
        pq.write_table(schema.empty_table(), str(directory / "part-empty.parquet"))
    moves = {
        row["file"]: state.reference_ttl_ms - written
        for row in rows
        if row["file"] and state.reference_ttl_ms is not None
        if (written := written_ttl_ms(pa.ipc.read_schema(pa.py_buffer(row["schema"])))) is not None
        and written != state.reference_ttl_ms
    }
    if moves:
        move_expiries(spark, directory, moves)
    return state


MOVE_DDL = "file string, delta long"


def move_expiries(spark: SparkSession, directory: Path, moves: dict[str, int]) -> None:
    """Move the expiries of the files ``moves`` names (each holds the key groups of one
    written ttl: ``written_groups``) by its delta (ms), so that every key's expiry counts
    with the state's reference ttl, as ``decoded_rows`` reads them. Only after a ttl change
    on the checkpoint left key groups with another ttl; one Spark job, the executors
    rewriting each file into one of a new name.

    Commit as for ``write_state_files``: a task attempt writes files of new names and
    reports them with the file each replaces; the driver deletes the replaced files and
    any file no successful attempt reported, so no expiry is moved twice."""
    root = str(directory)

    def rewrite(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        done: list[tuple[str, str]] = []
        for batch in batches:
            for file, delta in zip(
                batch.column("file").to_pylist(), batch.column("delta").to_pylist(), strict=True
            ):
                table = pq.read_table(os.path.join(root, file), partitioning=None)
                index = table.schema.get_field_index(EXPIRES_COLUMN)
                moved = pc.add(table.column(index), pa.scalar(delta, pa.int64()))
                table = table.set_column(index, table.schema.field(index), moved)
                written = f"part-{uuid.uuid4().hex}.parquet"
                pq.write_table(
                    table,
                    os.path.join(root, written),
                    coerce_timestamps="us",
                    allow_truncated_timestamps=True,
                )
                done.append((file, written))
        if done:
            old, new = zip(*done, strict=True)
            yield pa.RecordBatch.from_arrays(
                [pa.array(old, pa.string()), pa.array(new, pa.string())], names=["old", "new"]
            )

    unmoved = {path.name for path in directory.iterdir()} - set(moves)
    files = spark.createDataFrame(sorted(moves.items()), MOVE_DDL)
    replaced = files.repartition(len(moves)).mapInArrow(rewrite, "old string, new string")
    kept = unmoved | {row["new"] for row in replaced.collect()}
    for path in directory.iterdir():
        if path.name not in kept:  # replaced, or a failed task attempt's
            path.unlink()


def written_groups(
    directory: str,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function writing each state row's keys into a Parquet file of this
    task attempt in ``directory`` (one per distinct columns: key groups of other columns,
    which ``described_state`` refuses, never share a file; and per recorded ttl, so that
    ``move_expiries`` moves a file's expiries by one difference) and yielding, once the files are
    closed, ``describe_groups``' description of each state row and its file's name. An
    executor holds one key group's table at a time."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writers: dict[tuple[pa.Schema, int | None], tuple[str, pq.ParquetWriter]] = {}
        described: list[tuple[Any, ...]] = []
        try:
            for batch in batches:
                blobs = batch.column("blob")
                key_groups = batch.column("key_group").to_pylist()
                versions = batch.column("format_version").to_pylist()
                operators = batch.column("operator").to_pylist()
                for index in range(batch.num_rows):
                    row = (key_groups[index], versions[index], operators[index])
                    if versions[index] != STATE_FORMAT_VERSION:
                        described.append((*row, b"", 0, ""))
                        continue
                    table = pa.ipc.open_stream(blobs[index].as_buffer()).read_all()
                    name = ""
                    if table.num_rows:
                        plain = table.schema.remove_metadata()
                        written = (plain, written_ttl_ms(table.schema))
                        if written not in writers:
                            file = f"part-{uuid.uuid4().hex}.parquet"
                            os.makedirs(directory, exist_ok=True)
                            writers[written] = (
                                file,
                                pq.ParquetWriter(
                                    os.path.join(directory, file),
                                    plain,
                                    coerce_timestamps="us",
                                    allow_truncated_timestamps=True,
                                ),
                            )
                        name, writer = writers[written]
                        writer.write_table(table.replace_schema_metadata(None))
                    schema = table.schema.serialize().to_pybytes()
                    described.append((*row, schema, table.num_rows, name))
        finally:
            for _, writer in writers.values():
                writer.close()
        if described:
            columns = list(zip(*described, strict=True))
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(columns[0], pa.int64()),
                    pa.array(columns[1], pa.int32()),
                    pa.array(columns[2], pa.string()),
                    pa.array(columns[3], pa.binary()),
                    pa.array(columns[4], pa.int64()),
                    pa.array(columns[5], pa.string()),
                ],
                names=["key_group", "format_version", "operator", "schema", "rows", "file"],
            )

    return write
