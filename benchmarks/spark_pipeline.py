"""The recovery benchmark's peer: the demo pipeline as a user would write it with Spark alone.

Spark's own Kafka source (JVM), ``groupBy(key).count()`` (Spark's state store, no Python),
and Spark's JDBC writer in ``foreachBatch``: two long-running queries over one DataFrame
with a ``processingTime`` trigger, like ``eospack.lab.demo.pipeline``. At-least-once (the
writer appends; a replayed batch is written again), so it bounds what a fresh Spark driver
costs before its first commit without any Python data source, planner or worker. Its rows
carry the micro-batch id (``batch_id``), as the demo's history table does, so the latency
benchmark can tell when each batch became visible.

    python -m benchmarks.spark_pipeline --bootstrap-servers ... --topic ... --jdbc-url ...
        --checkpoint-dir DIR --jars JAR,JAR,... [--name NAME] [--tables history]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from eospack.lab.demo.pipeline import TABLES, milestone

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def main(argv: list[str] | None = None) -> int:
    milestone("python")
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("--bootstrap-servers", "--topic", "--jdbc-url", "--jdbc-user", "--jars"):
        parser.add_argument(name, required=True)
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--max-offsets-per-trigger", default="2000")
    parser.add_argument("--name", default="spark_peer", help="prefix of its tables")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES))
    parser.add_argument("--trigger-interval", default="500 milliseconds")
    arguments = parser.parse_args(argv)
    from pyspark.sql.functions import lit

    from eospack.tools.spark import local_session

    milestone("imports")
    spark = local_session(app_name="spark-peer-pipeline", extra_jars=arguments.jars.split(","))
    milestone("session")
    counts = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", arguments.bootstrap_servers)
        .option("subscribe", arguments.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", arguments.max_offsets_per_trigger)
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
        .groupBy("key")
        .count()
    )

    def writer(table: str) -> Callable[[DataFrame, int], None]:
        def write(batch: DataFrame, batch_id: int) -> None:
            batch.withColumn("batch_id", lit(batch_id)).write.jdbc(
                arguments.jdbc_url,
                f"{arguments.name}_{table}",
                mode="append",
                properties={"user": arguments.jdbc_user, "driver": "org.postgresql.Driver"},
            )

        return write

    for table in arguments.tables:
        (
            counts.writeStream.outputMode("update")
            .foreachBatch(writer(table))
            .option("checkpointLocation", str(arguments.checkpoint_dir / table))
            .trigger(processingTime=arguments.trigger_interval)
            .start()
        )
    milestone("queries")
    spark.streams.awaitAnyTermination()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
