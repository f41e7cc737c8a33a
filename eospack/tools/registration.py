"""Registering eospack's formats in a Spark session, and priming them against Spark's
race of queries started together (see ``eospack``'s package docstring): ``register`` is
public as ``eospack.register``; every entry point of eospack calls it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eospack.tools.formats import FORMATS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
    from eospack.tools.doctor import require_worker_python

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
