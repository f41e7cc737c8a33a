"""A local SparkSession set up the way eospack's tests, demo and benchmarks need it.

Why a helper: a plain ``SparkSession.builder.getOrCreate()`` on a fresh machine starts
Python workers with the system interpreter (no pyarrow there), keeps 200 shuffle
partitions (slow for small local batches) and fails with a JVM stack trace when Java is
missing or too new. ``local_session`` fixes all three and fails early with one line. It
also registers eospack's formats explicitly: Spark's automatic lookup of ``pyspark_*``
modules does not see packages installed by pip's default editable mode (an import hook).
With pip's pyspark it starts Spark from a Spark home whose Python workers import the
installed pyspark rather than compiling ``pyspark.zip`` (see :func:`worker_spark_home`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from eospack.core.cache import cache_directory
from eospack.core.java import check_java
from eospack.core.spark_features import TRIGGER_AVAILABLE_NOW
from eospack.tools.registration import register

AVAILABLE_NOW_WRAPPER = "spark.sql.streaming.triggerAvailableNowWrapper.enabled"


def worker_spark_home(
    pyspark_home: Path | None = None, cache: Path | None = None, configured: str | None = None
) -> Path | None:
    """A Spark home for pip's pyspark whose Python workers import the installed pyspark.

    Why: Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every
    Python worker's path, and pip's pyspark ships both, so every fresh worker process
    compiles pyspark from the zip, which keeps no bytecode: ~0.7 s a process on a 2-core
    machine. A Python data source pays it once per streaming query (its source runner is a
    new process) and in every planner forked from a daemon (they import their module after
    the fork). The zips hold the same files as the installed packages (plus pyspark's
    tests). This home links every entry of the package's Spark home except
    ``python/lib``, under the eospack cache directory, so workers import the installed
    pyspark and py4j with their cached bytecode; Spark's scripts and jars are the same.

    ``configured`` is ``$SPARK_HOME`` (read when None). Returns None, leaving Spark as it
    is, when it names another Spark than the installed pyspark, when that pyspark has no
    ``python/lib/pyspark.zip``, or when the links cannot be made.
    """
    home = (pyspark_home or Path(pyspark.__file__).parent).resolve()
    configured = os.environ.get("SPARK_HOME", "") if configured is None else configured
    if configured and Path(configured).resolve() != home:
        return None
    if not (home / "python" / "lib" / "pyspark.zip").is_file():
        return None
    if cache is None:
        cache = cache_directory()
    key = hashlib.sha256(f"{home}:{pyspark.__version__}".encode()).hexdigest()[:16]
    target = cache / "spark-home" / key
    if (target / "bin").is_dir():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=target.parent))
        staging.chmod(0o755)
        for entry in home.iterdir():
            if entry.name != "python":
                (staging / entry.name).symlink_to(entry)
                continue
            (staging / "python").mkdir()
            for inner in entry.iterdir():
                if inner.name != "lib":
                    (staging / "python" / inner.name).symlink_to(inner)
        try:
            staging.rename(target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another process made it first
    except OSError:
        return None
    return target if (target / "bin").is_dir() else None


def local_session(
    app_name: str = "eospack",
    master: str = "local[2]",
    shuffle_partitions: int = 2,
    conf: Mapping[str, str] | None = None,
    extra_jars: Sequence[str | Path] = (),
) -> SparkSession:
    """Start (or return the running) local SparkSession for eospack.

    Guarantees: Python workers run the current interpreter (importing the installed pyspark,
    see :func:`worker_spark_home`), the UI is off, shuffles use ``shuffle_partitions``
    partitions, and Java is checked before the JVM starts.
    ``extra_jars`` (e.g. Spark's own Kafka connector) join any ``spark.jars`` of ``conf``;
    like every setting here they only take effect when this call starts the JVM.
    """
    check_java()
    if SparkContext._active_spark_context is None:
        spark_home = worker_spark_home()
        if spark_home is not None:
            os.environ["SPARK_HOME"] = str(spark_home)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.daemon.module", "eospack.python_daemon")
    )
    if not TRIGGER_AVAILABLE_NOW.available:
        # Spark 4.0 and 4.1 run Trigger.AvailableNow on a Python source as one batch (a
        # restart then only replays its last batch) unless Spark's wrapper asks the source
        # for its latest offset at the start and reads up to it (docs/platforms.md).
        builder = builder.config(AVAILABLE_NOW_WRAPPER, "true")
    settings = dict(conf or {})
    jars = [settings.get("spark.jars", ""), *(str(jar) for jar in extra_jars)]
    if any(jars):
        settings["spark.jars"] = ",".join(jar for jar in jars if jar)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
