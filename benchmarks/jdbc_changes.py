"""14. 2pc-jdbc ``writeMode=changes`` versus ``writeMode=upsert`` into PostgreSQL.

The same keyed stream through both modes, in one run, the contenders interleaved
(``jdbc_sink.interleaved``): 1M changes (every one an update, ``op = 'u'``) over 100k keys in
10 micro-batches, each key's version rising with the stream. ``upsert`` takes the stream
without the op column. The goal row compares each mode with ``protocol=auto`` (what a user
gets: ``staging`` for changes, ``prepared`` for upsert); the two rows after it compare the
modes under one protocol each, pricing only what ``changes`` adds to an upsert: the op column
through the stage, the per-key latest change of a batch, the tombstone check.
Each run ends with one row per key (checked).
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import Comparison, Figure, Report, say
from benchmarks.jdbc_sink import MICRO_BATCHES, TIMEOUT, Contender, checked_write, interleaved
from eospack.lab.testing import await_query

SCHEMA = "id long, name string, version long, op string"
CHANGES = "2pc-jdbc writeMode=changes (auto: staging)"
UPSERT = "2pc-jdbc writeMode=upsert (auto: prepared)"
UPSERT_STAGING = "2pc-jdbc writeMode=upsert protocol=staging"
CHANGES_PREPARED = "2pc-jdbc writeMode=changes protocol=prepared"


def change_files(directory: Path, rows: int, keys: int) -> Path:
    """``rows`` updates over ``keys`` keys, one file per micro-batch; version = position."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // MICRO_BATCHES)
    for index, start in enumerate(range(0, rows, per_file)):
        positions = range(start, min(start + per_file, rows))
        table = pa.table(
            {
                "id": pa.array([p * 7919 % keys for p in positions], pa.int64()),
                "name": pa.array([f"name-{p}" for p in positions]),
                "version": pa.array([p + 1 for p in positions], pa.int64()),
                "op": pa.array(["u"] * len(positions)),
            }
        )
        pq.write_table(table, directory / f"part-{index:05d}.parquet")
    return directory


def write(
    spark: Any, directory: Path, postgres: Any, table: str, mode: str, protocol: str = "auto"
) -> None:
    frame = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(directory))
    if mode == "upsert":
        frame = frame.drop("op")
    endpoint = postgres.endpoint
    query = (
        frame.writeStream.format("2pc-jdbc")
        .option("url", endpoint.jdbc_url)
        .option("user", endpoint.user)
        .option("dbtable", table)
        .option("writeMode", mode)
        .option("protocol", protocol)
        .option("upsertKeys", "id")
        .option("versionColumn", "version")
        .option("createTableIfNotExists", "true")
        .option("checkpointLocation", tempfile.mkdtemp(prefix=f"bench-{mode}-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def _execute(url: str, statement: str) -> Any:
    with psycopg.connect(url, autocommit=True) as connection:
        return connection.execute(statement).fetchone() if statement.startswith("SELECT") else None


def run(
    report: Report, spark: Any, postgres: Any, workdir: Path, rows: int, repetitions: int
) -> None:
    keys = max(rows // 10, 1)
    directory = change_files(workdir / f"changes-{rows}", rows, keys)
    say(f"jdbc-changes: {rows:,} updates over {keys:,} keys into PostgreSQL, changes vs upsert")
    url = postgres.endpoint.url
    contenders: dict[str, Contender] = {}
    for label, mode, protocol in (
        (CHANGES, "changes", "auto"),
        (UPSERT, "upsert", "auto"),
        (UPSERT_STAGING, "upsert", "staging"),
        (CHANGES_PREPARED, "changes", "prepared"),
    ):
        table = f"bench_{mode}_{protocol}_{rows}"
        contenders[label] = checked_write(
            partial(write, spark, directory, postgres, table, mode, protocol),
            reset=partial(_execute, url, f"DROP TABLE IF EXISTS {table}"),
            count=lambda table=table: int(_execute(url, f"SELECT count(*) FROM {table}")[0]),
            rows=keys,
        )
    seconds = interleaved(contenders, repetitions)
    size = f"{rows:,} changes, {keys:,} keys"
    figures = {label: Figure(label, seconds[label], rows) for label in contenders}
    benchmark = "14. jdbc changes vs upsert"
    report.add(Comparison(benchmark, size, figures[CHANGES], figures[UPSERT], 0.8))
    report.add(Comparison(benchmark, size, figures[CHANGES], figures[UPSERT_STAGING]))
    report.add(Comparison(benchmark, size, figures[CHANGES_PREPARED], figures[UPSERT]))
