"""eospack: exactly-once streaming connectors for PySpark.

The data sources register themselves through the ``pyspark_*`` modules once the package
is installed as a wheel (or with ``editable_mode=compat``); ``register(spark)`` does the
same by hand, and is needed where Spark's lookup cannot see the modules: after a plain
``pip install -e .`` (pip serves editable packages through an import hook that Spark's
lookup of ``pyspark_*`` modules does not see), or where automatic lookup is turned off.
Every entry point of eospack (``eospack.spark.local_session``, the demo, the benchmarks)
calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__version__ = "0.1.0"


def register(spark: SparkSession) -> None:
    """Register replayable-kafka, 2pc-jdbc and 2pc-s3 with ``spark``."""
    from pyspark_2pc_jdbc import DefaultSource as JdbcSource
    from pyspark_2pc_s3 import DefaultSource as S3Source
    from pyspark_replayable_kafka import DefaultSource as KafkaSource

    for source in (KafkaSource, JdbcSource, S3Source):
        spark.dataSource.register(source)
