"""What replayable-kafka costs a Spark planner process that never talks to Kafka.

Spark 4.3 runs lookup, creation and read planning of a Python data source in worker
processes that import the source's module after they fork; the stream source runner is a
fresh process per query. Those that only build the source and its reader must not pay for
kafka-python, pyarrow or the executor's reader module (together ~0.3 s per process here).
"""

from __future__ import annotations

import subprocess
import sys

from eospack.connectors.kafka.records.schema import spark_schema
from eospack.connectors.kafka.source.data_source import ReplayableKafkaDataSource

OPTIONS = {
    "kafka.bootstrap.servers": "broker:9092",
    "subscribe": "t",
    "startingOffsets": "earliest",
    "kafka.isolation.level": "read_committed",
}

PLANNER = f"""
import sys
from pyspark_replayable_kafka import DefaultSource
source = DefaultSource({OPTIONS!r})
source.streamReader(source.schema())
source.reader(source.schema())
heavy = ("kafka", "pyarrow", "eospack.connectors.kafka.source.reader")
print(",".join(sorted(name for name in heavy if name in sys.modules)))
"""


def test_planning_a_source_imports_neither_kafka_python_nor_pyarrow_nor_the_reader() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PLANNER], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == ""


def test_the_source_schema_is_the_record_schema() -> None:
    for headers in ("false", "true"):
        source = ReplayableKafkaDataSource({**OPTIONS, "includeHeaders": headers})
        assert source.schema() == spark_schema(headers == "true")
