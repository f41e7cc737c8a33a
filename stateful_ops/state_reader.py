"""Read the per-key state of a stateful_ops query from its checkpoint, as one pandas table.

Uses Spark's state data source (``format("statestore")``) and decodes each key group's Arrow
table, so operators' state stays inspectable although keys are packed into key groups.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from stateful_ops.errors import StateSchemaMismatchError


def read_state(
    spark: SparkSession, checkpoint_location: str, batch_id: int | None = None
) -> pd.DataFrame:
    """One row per stored key (key columns and state fields) after ``batch_id`` (default last).

    The query's stateful operator must be the first (operator id 0) of the checkpoint.
    """
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    rows = reader.load(checkpoint_location).select("value.groupState.*").collect()
    tables = []
    for format_version, operator, blob in rows:
        if format_version != 1:
            raise StateSchemaMismatchError(
                f"{operator}: stored state has format version {format_version}; cannot read it"
            )
        tables.append(pa.ipc.open_stream(bytes(blob)).read_all())
    if not tables:
        return pd.DataFrame()
    return pa.concat_tables(tables).to_pandas()
