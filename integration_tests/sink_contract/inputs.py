"""The contract suite's input and its one query: parquet files in, one 2PC sink out.

Why files: a file source replays a batch exactly (Spark's replay of an uncommitted batch
reads the same file), needs no service, and ``maxFilesPerTrigger=1`` makes file k batch k
(modification times increase with k). Every sink gets the same rows ``(id BIGINT, grp
STRING, version BIGINT)`` (``version``: the batch's index, for 2pc-jdbc's versionColumn)
through ``repartition(2)`` (round robin), so each batch has two pieces to commit
(``between_piece_commits`` is reachable) and no key is written by two tasks. The query
runs with Trigger.AvailableNow: it processes what is there and stops, which is what makes
a restart a plain second call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = "id BIGINT, grp STRING, version BIGINT"
ROWS_PER_BATCH = 200


def write_source(
    directory: Path, count: int, rows_per_batch: int = ROWS_PER_BATCH, first_id: int = 0
) -> list[list[tuple[int, str]]]:
    """Append ``count`` files to ``directory``, one per batch, and return their rows.

    Ids continue from ``first_id`` + the rows already written by earlier calls (so a test
    adds batches as it goes); ``grp`` alternates ``g0``/``g1``, ``version`` is the file's
    index (the returned rows are (id, grp)). Modification times increase
    with the file's index, so that file k is batch k.
    """
    directory.mkdir(parents=True, exist_ok=True)
    existing = sorted(directory.glob("part-*.parquet"))
    start = len(existing)
    batches = []
    for index in range(start, start + count):
        base = first_id + index * rows_per_batch
        ids = list(range(base, base + rows_per_batch))
        groups = [f"g{i % 2}" for i in ids]
        file = directory / f"part-{index:03d}.parquet"
        table = pa.table(
            {"id": pa.array(ids, pa.int64()), "grp": groups, "version": [index] * len(ids)}
        )
        pq.write_table(table, file)
        os.utime(file, (1_700_000_000 + index, 1_700_000_000 + index))
        batches.append(list(zip(ids, groups, strict=True)))
    return batches


def start_query(
    spark: Any,
    sink_format: str,
    source: str,
    checkpoint: str,
    options: Mapping[str, str],
    as_kafka_records: bool = False,
) -> Any:
    """Start the contract's query in ``spark`` (the test's session or a driver's).

    ``as_kafka_records``: each row becomes one record, key ``grp``, value ``id`` as text.
    """
    frame = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(source)
        .repartition(2)
    )
    if as_kafka_records:
        frame = frame.selectExpr("grp AS key", "CAST(id AS STRING) AS value")
    return (
        frame.writeStream.format(sink_format)
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
