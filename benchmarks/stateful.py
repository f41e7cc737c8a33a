"""4. running_count versus Spark's built-in streaming groupBy(key).count()."""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.data import keyed_parquet_directory
from benchmarks.harness import Comparison, Figure, Report, measure, say
from eospack.testing import await_query

TIMEOUT = 900.0
FILES = 5


def count_stream(spark, directory: Path, use_running_count: bool) -> None:
    from eospack.stateful_ops import running_count

    events = (
        spark.readStream.schema("key string, value long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
    )
    counts = running_count(events, "key") if use_running_count else events.groupBy("key").count()
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-stateful-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)


def run(report: Report, spark, workdir: Path, rows: int, keys: int, repetitions: int) -> None:
    say(f"stateful: {rows:,} rows over {keys:,} keys in {FILES} micro-batches")
    directory = keyed_parquet_directory(workdir / f"keyed-{rows}", rows, keys, FILES)
    ours = Figure(
        "running_count",
        measure(lambda: count_stream(spark, directory, True), repetitions),
        rows,
    )
    builtin = Figure(
        "groupBy(key).count()",
        measure(lambda: count_stream(spark, directory, False), repetitions),
        rows,
    )
    report.add(Comparison("4. stateful count", f"{rows:,} rows, {keys:,} keys", ours, builtin, 0.5))
