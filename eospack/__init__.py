"""eospack: exactly-once streaming connectors for PySpark.

The data sources register themselves through the ``pyspark_*`` modules once the package
is installed as a wheel (or with ``editable_mode=compat``); ``register(spark)`` does the
same by hand, and is needed where Spark's lookup cannot see the modules: after a plain
``pip install -e .`` (pip serves editable packages through an import hook that Spark's
lookup of ``pyspark_*`` modules does not see), or where automatic lookup is turned off.
Every entry point of eospack (``eospack.spark.local_session``, the demo, the benchmarks)
calls it.

``register`` also closes a Spark race (``docs/spark-python-datasource-envvars-race.md``):
two streaming queries reading one Python data source, started at the same moment, insert
the same keys into that source's one shared, unsynchronised environment map; a lost
insert leaves the map one entry short of its size, and every later task that carries the
source fails with "Task not serializable: Illegal size N of collection, expected N+1".
Registering fills in those keys before any query runs, so later writers only overwrite.
In local mode it also checks, once per process, that the Python Spark's workers start can
import eospack (:func:`eospack.doctor.require_worker_python`).

The public face is ``__all__``: what users import from ``eospack`` and what keeps its name
and meaning between releases; everything else (the submodules' other names) is internal.
Spark's Python workers import this package, so its public names resolve lazily (PEP 562
``__getattr__``): ``import eospack`` loads neither pyspark.sql, pandas nor the connectors.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eospack.checkout_layout import serve_checkout_folders
from eospack.errors import EospackError
from eospack.formats import FORMATS, public_error_homes

serve_checkout_folders(Path(__file__).resolve().parent)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from eospack.commit_protocols.identity import SinkIdentityError
    from eospack.commit_protocols.resource import DecidedPieceLostError
    from eospack.connectors.jdbc.errors import (
        JdbcConnectionError,
        JdbcSchemaError,
        JdbcSinkOptionError,
        JdbcWriteError,
    )
    from eospack.connectors.kafka.errors import (
        KafkaAuthenticationError,
        KafkaBrokerUnreachableError,
        KafkaCodecMissingError,
        KafkaDataLossError,
        KafkaReadTimeoutError,
        KafkaSendError,
        KafkaSinkOptionError,
        KafkaSourceOptionError,
        LedgerFencedError,
        PreparedTransactionLostError,
    )
    from eospack.connectors.s3.errors import S3AccessError, S3OptionError, S3WriteError
    from eospack.doctor import WorkerPythonError
    from eospack.savepoint import RestoredCheckpoint
    from eospack.services.base import ServiceStartError
    from eospack.spark import JavaNotFoundError, local_session
    from eospack.stateful_ops import (
        Clock,
        OperatorDefinitionError,
        StatefulOperator,
        StatefulOpsError,
        StateSchemaMismatchError,
        deduplicate,
        running_aggregate,
        running_count,
        sessionize,
    )
    from eospack.supervisor import (
        ExponentialDelay,
        FailureRate,
        FixedDelay,
        PermanentQueryError,
        RestartsExhaustedError,
        supervise,
    )

__version__ = "0.1.0"

# Each lazily resolved public name and the module that defines it.
_HOMES: dict[str, str] = {
    "local_session": "eospack.spark",
    "JavaNotFoundError": "eospack.spark",
    "supervise": "eospack.supervisor",
    "ExponentialDelay": "eospack.supervisor",
    "FailureRate": "eospack.supervisor",
    "FixedDelay": "eospack.supervisor",
    "PermanentQueryError": "eospack.supervisor",
    "RestartsExhaustedError": "eospack.supervisor",
    "running_count": "eospack.stateful_ops",
    "running_aggregate": "eospack.stateful_ops",
    "deduplicate": "eospack.stateful_ops",
    "sessionize": "eospack.stateful_ops",
    "StatefulOperator": "eospack.stateful_ops",
    "Clock": "eospack.stateful_ops",
    "StatefulOpsError": "eospack.stateful_ops",
    "OperatorDefinitionError": "eospack.stateful_ops",
    "StateSchemaMismatchError": "eospack.stateful_ops",
    "RestoredCheckpoint": "eospack.savepoint",
    "WorkerPythonError": "eospack.doctor",
    "ServiceStartError": "eospack.services.base",
    "DecidedPieceLostError": "eospack.commit_protocols.resource",
    "SinkIdentityError": "eospack.commit_protocols.identity",
    # each format's errors users catch: its entry in eospack.formats
    **public_error_homes(),
}

__all__ = [
    "Clock",
    "DecidedPieceLostError",
    "EospackError",
    "ExponentialDelay",
    "FailureRate",
    "FixedDelay",
    "JavaNotFoundError",
    "JdbcConnectionError",
    "JdbcSchemaError",
    "JdbcSinkOptionError",
    "JdbcWriteError",
    "KafkaAuthenticationError",
    "KafkaBrokerUnreachableError",
    "KafkaCodecMissingError",
    "KafkaDataLossError",
    "KafkaReadTimeoutError",
    "KafkaSendError",
    "KafkaSinkOptionError",
    "KafkaSourceOptionError",
    "LedgerFencedError",
    "OperatorDefinitionError",
    "PermanentQueryError",
    "PreparedTransactionLostError",
    "RestartsExhaustedError",
    "RestoredCheckpoint",
    "S3AccessError",
    "S3OptionError",
    "S3WriteError",
    "ServiceStartError",
    "SinkIdentityError",
    "StateSchemaMismatchError",
    "StatefulOperator",
    "StatefulOpsError",
    "WorkerPythonError",
    "deduplicate",
    "local_session",
    "register",
    "running_aggregate",
    "running_count",
    "sessionize",
    "supervise",
]


def __getattr__(name: str) -> Any:
    """Import a public name's home module on first use (PEP 562); see the module docstring."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'eospack' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def register(spark: SparkSession) -> None:
    """Make replayable-kafka, 2pc-jdbc, 2pc-s3 and 2pc-kafka usable in ``spark``: each is registered
    unless Spark's automatic lookup found it (registering it again would only make Spark
    warn that it "replaced a statically registered data source").

    In a classic session each format's environment map is then primed against Spark's race
    of queries started together (see the module's docstring). A Spark Connect session is
    served as well, without the priming: its client has no JVM, so the maps live in the
    server, out of reach (``spark._jsparkSession`` raises there). It asks the server
    whether it resolves each format and registers the missing ones with
    ``spark.dataSource.register``, which sends the class to the server; the server must
    import eospack to load it. Connect registrations last as long as the Connect session.

    A classic session in local mode is first checked once per process for a worker Python
    that cannot import eospack: :class:`WorkerPythonError`, one line naming that Python and
    the fix, instead of a ``ModuleNotFoundError`` trace from the first query's workers.
    """
    sources = [entry.data_source.load() for entry in FORMATS.values()]
    if is_spark_connect(spark):
        for source in sources:
            if not connect_server_resolves(spark, source.name()):
                spark.dataSource.register(source)
        return
    from eospack.doctor import require_worker_python

    require_worker_python(spark)
    manager = spark._jsparkSession.sessionState().dataSourceManager()  # type: ignore[attr-defined]
    for source in sources:
        if not manager.dataSourceExists(source.name()):
            spark.dataSource.register(source)
        _prime_environment(spark, source.name())


def is_spark_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect_server_resolves(spark: SparkSession, format_name: str) -> bool:
    """Whether the server of Connect session ``spark`` finds ``format_name`` (by its
    automatic lookup or a registration in this session). Analysing a read with a given
    schema looks the format up without starting the data source: milliseconds, no Python
    process. Errors other than "not found" are raised."""
    try:
        spark.read.schema("probe INT").format(format_name).load().schema  # noqa: B018
    except Exception as error:
        condition = getattr(error, "getCondition", None)
        if callable(condition) and condition() == "DATA_SOURCE_NOT_FOUND":
            return False
        raise
    return True


# The keys Spark 4.3's PythonStreamingSourceRunner.init() puts into the environment map of
# the data source it starts (``PythonFunction.envVars``, shared by every query of the
# session that uses the format); planner and executor runners write to copies.
SOURCE_RUNNER_KEYS = (
    "SPARK_LOCAL_DIRS",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "SPARK_PYTHON_RUNTIME",
)


def _prime_environment(spark: SparkSession, format_name: str) -> None:
    """Insert SOURCE_RUNNER_KEYS into ``format_name``'s shared environment map now, so that
    concurrent query starts never change the map's structure (a put of a present key only
    replaces its value). The values are Spark's settings; the runner overwrites them with
    its own (the block manager's directories under the local dirs) before it starts a
    worker, and every other runner copies the map first."""
    jvm_session = spark._jsparkSession  # type: ignore[attr-defined]
    conf = jvm_session.sparkContext().conf()
    local_dirs = spark._jvm.org.apache.spark.util.Utils.getConfiguredLocalDirs(conf)  # type: ignore[attr-defined,union-attr]
    values = {
        "SPARK_LOCAL_DIRS": ",".join(local_dirs),
        "SPARK_AUTH_SOCKET_TIMEOUT": str(
            conf.getTimeAsSeconds("spark.python.authenticate.socketTimeout", "15s")
        ),
        "SPARK_BUFFER_SIZE": str(conf.getSizeAsBytes("spark.buffer.size", "65536")),
        "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
    }
    manager = jvm_session.sessionState().dataSourceManager()
    environment = manager.lookupDataSource(format_name).dataSourceCls().envVars()
    for key in SOURCE_RUNNER_KEYS:
        if not environment.containsKey(key):
            environment.put(key, values[key])
