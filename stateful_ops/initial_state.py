"""Start an operator from given per-key state: what a savepoint restore runs on.

Spark has no state writer, so a restored query cannot be handed a state store. Instead an
operator given an ``InitialState`` (a Parquet file, one row per key: the key columns and
the state fields, as ``eospack savepoint create`` writes it) bootstraps on first use:

- On the driver, before the query starts, the file is split by key group with the same
  Spark expression the stream uses (``pmod(xxhash64(keys), key_groups)``), so the split
  follows this query's ``key_groups``, whatever the savepoint's were: rescaling.
- Every batch with input rows routes one bootstrap marker per input partition to every
  key group (next to the settings marker), so its first such batch visits all of them.
  A key group without state loads its keys from the split and goes on as usual; once
  visited it keeps a state row even when it holds no key, so it never loads twice.
- Nothing is stored until that batch commits: a crash before it bootstraps again.

Guarantee: the first batch sees exactly the savepoint's keys with their state, and every
later batch sees the state the previous one committed. Cost: one marker row per input
partition and key group per batch, and key groups that get only markers are not
rewritten (operators with timeouts decode their state to re-arm them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from eospack.stateful_ops.errors import OperatorDefinitionError

if TYPE_CHECKING:
    from eospack.stateful_ops.base import StatefulOperator

SPLIT_COMPLETE = "_complete"


@dataclass(frozen=True)
class InitialState:
    """Per-key state to start from: ``path`` is the Parquet file, ``work_directory`` a
    directory the restored query owns, where the per-key-group split is written."""

    path: str
    work_directory: str


def split_by_key_group(
    spark: SparkSession, initial_state: InitialState, operator: StatefulOperator
) -> str:
    """Write ``initial_state``'s keys into one Arrow file per key group of ``operator`` (once
    per ``key_groups``) and return that directory. Refuses a file whose columns are not the
    operator's state columns, before any query starts."""
    directory = Path(initial_state.work_directory) / f"key-groups-{operator.key_groups}"
    if (directory / SPLIT_COMPLETE).exists():
        return str(directory)
    expected = pa.schema([field.remove_metadata() for field in operator.arrow_state_schema])
    try:
        found = pq.read_schema(initial_state.path)
    except (OSError, pa.ArrowInvalid) as error:
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {initial_state.path} cannot be read ({error});"
            " give the state file of a savepoint restored with eospack savepoint restore"
        ) from None
    if [(field.name, field.type) for field in found] != [
        (field.name, field.type) for field in expected
    ]:
        raise OperatorDefinitionError(
            f"{operator.name}: initial_state {initial_state.path} holds columns"
            f" {describe(found)} but this operator's state is {describe(expected)}: restore"
            " the savepoint into a query with the same key columns and operator"
        )
    key_group = "__so_initial_key_group"
    rows = spark.read.parquet(initial_state.path)
    split = rows.select(operator.key_group_column().alias(key_group), *expected.names).toArrow()
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    groups = split.column(key_group).to_numpy(zero_copy_only=False)
    state = split.drop_columns([key_group]).cast(expected)
    for group in sorted(set(groups.tolist())):
        path = str(staging / f"{group}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, expected) as writer:
            writer.write_table(state.filter(pa.array(groups == group)))
    (staging / SPLIT_COMPLETE).touch()
    try:
        os.rename(staging, directory)
    except OSError:  # another start split it first: theirs is the same
        shutil.rmtree(staging, ignore_errors=True)
    return str(directory)


def load_key_group(directory: str, key_group: int, schema: pa.Schema) -> pd.DataFrame | None:
    """The initial state of ``key_group`` (None when the savepoint had none of its keys)."""
    path = Path(directory) / f"{key_group}.arrow"
    if not path.exists():
        return None
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all().cast(schema).to_pandas()


def describe(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name} {field.type}" for field in schema)
