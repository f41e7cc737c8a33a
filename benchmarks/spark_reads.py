"""Reading a Kafka topic through a Spark source, shared by the source benchmarks.

``benchmarks.kafka_source`` (throughput) and ``benchmarks.fixed_cost`` (the cost of a query
over one record) time the same query; it lives here so that neither imports the other (the
source benchmark runs the fixed-cost one as part of where its time goes).
"""

from __future__ import annotations

import tempfile
from typing import Any

from eospack.lab.testing import await_query

TIMEOUT = 900.0
# The options both Spark sources get (Spark's own defaults to read_uncommitted).
COMMON_OPTIONS = {"startingOffsets": "earliest", "kafka.isolation.level": "read_committed"}


def read_with_spark(spark, bootstrap: str, topic: str, source: str = "replayable-kafka") -> Any:
    """One AvailableNow query of ``topic`` into the noop sink, awaited; returns it."""
    query = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .options(**COMMON_OPTIONS)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-source-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, TIMEOUT)
    return query
