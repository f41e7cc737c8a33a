"""Shared by the 2pc-jdbc integration and crash tests: input files and database checks."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from eospack.connectors.jdbc.dialect import TableName, stage_table
from eospack.lab.testing import await_query

INPUT_SCHEMA_DDL = "id BIGINT, name STRING, version BIGINT"
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("version", pa.int64())])


def write_input_files(directory: Path, batches: list[list[tuple[int, str, int]]]) -> None:
    """One parquet file per micro-batch (read with maxFilesPerTrigger=1), in order."""
    directory.mkdir(parents=True, exist_ok=True)
    start = len(list(directory.glob("*.parquet")))
    for offset, rows in enumerate(batches):
        index = start + offset
        path = directory / f"part-{index:04d}.parquet"
        columns = list(zip(*rows, strict=True)) if rows else [[], [], []]
        pq.write_table(pa.table([list(c) for c in columns], schema=ARROW_SCHEMA), path)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def stream_input(
    spark: Any, directory: Path, partitions: int | None = None, schema: str = INPUT_SCHEMA_DDL
) -> Any:
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))
    return frame.repartition(partitions, "id") if partitions else frame


def pg_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute(f'SELECT id, name, version FROM "{table}" ORDER BY id').fetchall()


def pg_leftovers(url: str, table: str) -> tuple[int, int]:
    """(prepared xacts of any eospack sink, rows in the table's staging table)."""
    stage = stage_table(TableName(None, table))
    with psycopg.connect(url) as connection:
        prepared = connection.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE starts_with(gid, 'eospack-')"
        ).fetchone()
        staged = connection.execute(
            "SELECT CASE WHEN to_regclass(%s) IS NULL THEN 0 ELSE 1 END", (stage.sql(),)
        ).fetchone()
        staged_rows = 0
        if staged and staged[0]:
            row = connection.execute(f"SELECT count(*) FROM {stage.sql()}").fetchone()
            staged_rows = int(row[0]) if row else 0
    return int(prepared[0]) if prepared else 0, staged_rows


def pg_ledger(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute(
            "SELECT sink_id, batch_id, rows, protocol, status FROM eospack_commits"
            " WHERE target = %s ORDER BY sink_id, batch_id",
            (table,),
        ).fetchall()


def sqlite_rows(path: Path, table: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(f'SELECT id, name, version FROM "{table}" ORDER BY id').fetchall()


FILE_QUERY_TIMEOUT = 120.0


def start_file_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    schema: str,
    options: dict[str, str],
    files_per_trigger: int | None = None,
) -> Any:
    """An availableNow query of the parquet files in ``source`` into 2pc-jdbc; with
    ``files_per_trigger`` each micro-batch reads at most that many files."""
    reader = spark.readStream.schema(schema)
    if files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", files_per_trigger)
    return (
        reader.parquet(str(source))
        .writeStream.format("2pc-jdbc")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def run_file_query(
    spark: Any,
    source: Path,
    checkpoint: Path,
    schema: str,
    options: dict[str, str],
    files_per_trigger: int | None = None,
) -> None:
    """``start_file_query`` awaited to its end; a failed query raises its error."""
    query = start_file_query(spark, source, checkpoint, schema, options, files_per_trigger)
    await_query(query, FILE_QUERY_TIMEOUT)
