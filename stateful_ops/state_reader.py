"""Read the per-key state of a stateful_ops query from its checkpoint.

Uses Spark's state data source (``format("statestore")``) and decodes each key group's Arrow
table on the executors (``mapInArrow``), so operators' state stays inspectable although keys
are packed into key groups, and a state of any size is read without passing through the
driver: ``state_frame`` is a DataFrame, one row per key. Only the key groups' schemas (a few
hundred bytes each) reach the driver, to type the frame and name the operator.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from .base import SETTINGS_KEY_GROUP
from .errors import StatefulOpsError, StateSchemaMismatchError
from .segment_log import fold
from .segment_log_state import KEY_COLUMNS_METADATA_KEY, LOG_STATE
from .state_codec import CHECKED_WHEN_PRESENT, SETTING_DEFAULTS, STATE_FORMAT_VERSION
from .validation import OPERATOR_NAME_METADATA_KEY

GROUP_COLUMNS = ("key_group", "format_version", "operator", "blob")
DESCRIPTION_DDL = "key_group long, format_version int, operator string, schema binary, rows long"


@dataclass(frozen=True)
class StoredState:
    """One operator's state after one batch: ``frame`` holds one row per stored key (key
    columns and state fields, typed by ``schema``), decoded by the executors when an action
    runs; ``metadata`` is the state's Arrow schema metadata (``key_groups``), with the
    operator's kind (``operator``) and, for a named operator, its name (``operator_name``)."""

    frame: DataFrame
    schema: pa.Schema
    metadata: dict[bytes, bytes]
    rows: int
    """The number of keys (what ``frame.count()`` gives, known without reading it again)."""

    @property
    def kind(self) -> str:
        return self.metadata.get(b"operator", b"").decode()

    @property
    def checked_settings(self) -> dict[str, str]:
        """The checked settings the state was written with, as a savepoint records them:
        ``state_codec.SETTING_DEFAULTS``'s where not at their default, and those of
        ``CHECKED_WHEN_PRESENT`` where present."""
        return {
            name.decode(): self.metadata[name].decode()
            for name in (*SETTING_DEFAULTS, *CHECKED_WHEN_PRESENT)
            if name in self.metadata
        }

    @property
    def key_groups(self) -> int:
        return int(self.metadata.get(b"key_groups", b"0"))

    @property
    def operator_name(self) -> str | None:
        return (self.metadata.get(OPERATOR_NAME_METADATA_KEY) or b"").decode() or None


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
    if not descriptions:
        return None
    settings_names: list[str | None] = []
    names: set[str | None] = set()
    columns: dict[pa.Schema, int] = {}
    metadata: dict[bytes, bytes] = {}
    rows = 0
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
        if key_group == SETTINGS_KEY_GROUP:
            settings_names.append(name)
        else:
            names.add(name)
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
    spark_schema = from_arrow_schema(schema, prefer_timestamp_ntz=True)
    frame = groups.mapInArrow(decoded_rows(schema), spark_schema)
    return StoredState(frame, schema, metadata, rows)


def stored_groups(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None, operator_id: int
) -> DataFrame:
    """The operator's raw state rows: one per key group (``GROUP_COLUMNS``)."""
    refuse_segment_log(spark, checkpoint_location, operator_id)
    reader = spark.read.format("statestore").option("operatorId", operator_id)
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    rows = reader.load(checkpoint_location).selectExpr("key.*", "value.groupState.*")
    named = rows.toDF(*GROUP_COLUMNS)
    return named.withColumn("key_group", named["key_group"].cast("long"))


def operator_layout(spark: SparkSession, checkpoint_location: str, operator_id: int) -> str:
    """The operator's state layout: "segment-log" when Spark's operator metadata names it
    ``transformWithStateInPandasExec``, else "key-groups"."""
    operators = (
        spark.read.format("state-metadata")
        .load(checkpoint_location)
        .where(f"operatorId = {int(operator_id)}")
        .select("operatorName")
        .distinct()
        .collect()
    )
    if any(str(row[0]).startswith("transformWithState") for row in operators):
        return "segment-log"
    return "key-groups"


def refuse_segment_log(spark: SparkSession, checkpoint_location: str, operator_id: int) -> None:
    """Refuse, in one line, a state on the segment log where only the key-groups layout is
    read (``state_frame``, and so savepoints)."""
    if operator_layout(spark, checkpoint_location, operator_id) == "segment-log":
        raise StatefulOpsError(
            f"operator {operator_id} keeps its state with state_layout='segment-log':"
            " savepoints (state_frame) of it are not supported yet; read_state reads it, or"
            " use state_layout='key-groups' for state you need to savepoint"
        )


def segment_log_table(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None, operator_id: int
) -> pa.Table | None:
    """``read_state_table`` of an operator on the segment log: each key group's ListState
    (in list order, through the state data source) folded to its live rows."""
    reader = (
        spark.read.format("statestore")
        .option("operatorId", operator_id)
        .option("stateVarName", LOG_STATE)
        .option("flattenCollectionTypes", "false")
    )
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    tables = []
    for row in reader.load(checkpoint_location).select("list_value").collect():
        segments = [pa.ipc.open_stream(bytes(element[0])).read_all() for element in row[0]]
        if not segments:
            continue
        metadata = dict(segments[0].schema.metadata or {})
        keys = json.loads(metadata.pop(KEY_COLUMNS_METADATA_KEY).decode())
        tables.append(fold(segments, keys).replace_schema_metadata(metadata))
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
    schema: pa.Schema,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function turning state rows into their keys' rows of ``schema``; an
    executor holds one key group's table at a time."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            blobs = batch.column("blob")
            for index in range(batch.num_rows):
                table = pa.ipc.open_stream(blobs[index].as_buffer()).read_all()
                if table.num_rows:
                    yield from table.replace_schema_metadata(None).cast(schema).to_batches()

    return decode
