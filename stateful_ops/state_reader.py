"""Read the per-key state of a stateful_ops query from its checkpoint.

Uses Spark's state data source (``format("statestore")``) and decodes each key group's Arrow
table, so operators' state stays inspectable although keys are packed into key groups.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from .base import SETTINGS_KEY_GROUP
from .errors import StateSchemaMismatchError
from .validation import OPERATOR_NAME_METADATA_KEY


def read_state(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None = None
) -> pd.DataFrame:
    """One row per stored key (key columns and state fields) after ``batch_id`` (default last).

    The query's stateful operator must be the first (operator id 0) of the checkpoint.
    """
    table = read_state_table(spark, checkpoint_location, batch_id)
    return pd.DataFrame() if table is None else table.to_pandas()


def read_state_table(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None = None, operator_id: int = 0
) -> pa.Table | None:
    """The state of operator ``operator_id`` after ``batch_id`` (default last) as one Arrow
    table, one row per key, its schema's metadata the operator's ``key_groups``, kind
    (``operator``) and, for a named operator, its name (``operator_name``: the settings
    row's, which every batch with rows brings up to date, else the key groups' when they
    agree); None when the operator has stored nothing (no batch with rows yet)."""
    reader = spark.read.format("statestore").option("operatorId", operator_id)
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    rows = reader.load(checkpoint_location).selectExpr("key.*", "value.groupState.*").collect()
    tables = []
    settings_names: list[str | None] = []
    names: set[str | None] = set()
    for key_group, format_version, operator, blob in rows:
        if format_version != 1:
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
