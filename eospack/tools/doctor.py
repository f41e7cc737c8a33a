"""``eospack doctor``: what would stop eospack's formats from working, found without a JVM.

Why: the two usual failures on a new machine, a missing or unsupported Java and formats
that Spark's automatic lookup cannot see, otherwise show up as JVM stack traces
(``[DATA_SOURCE_NOT_FOUND]``) only once a query runs. Each check prints one line saying
what is wrong and what to do. A third line says which Kafka data path runs (the native
extension and whether it is a release build, or the pure-Python reference where it could
not be built). Given a running session (``run_doctor(spark=...)``, or ``eospack doctor
--session`` for the one :func:`eospack.tools.spark.local_session` starts) it also reports the
settings behind a micro-batch's fixed cost (:func:`session_checks`).
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TextIO

from eospack.core.errors import EospackError
from eospack.tools.formats import FORMATS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The modules Spark's lookup imports, and the format each one's DefaultSource names.
FORMAT_MODULES = {entry.lookup_module: entry.name for entry in FORMATS.values()}

FORMATS_FOUND = "formats: found by Spark's automatic lookup ({formats})"
FORMATS_NOT_FOUND = (
    "formats: Spark's automatic lookup cannot see eospack's pyspark_* modules (installed with"
    " pip's default editable mode, served by an import hook): call eospack.register(spark)"
    " after creating your session, or reinstall with"
    " pip install -e . --config-settings editable_mode=compat, or as a wheel"
)


class CheckResult(NamedTuple):
    """One check: whether it passed, and the line that says so."""

    passed: bool
    line: str


def formats_visible_to_spark() -> bool:
    """Whether Spark's automatic lookup of Python data sources would find all four formats.

    Spark 4.3 registers Python data sources by listing the top-level modules named
    ``pyspark_*`` with ``pkgutil.iter_modules()`` in a Python worker
    (``pyspark/sql/worker/lookup_data_sources.py``). That listing only sees modules that
    exist as files in a ``sys.path`` entry; modules served by an import hook (a
    ``sys.meta_path`` finder, which is how pip's default editable mode installs eospack)
    import fine but are not listed, and ``format("2pc-jdbc")`` then fails with
    ``DATA_SOURCE_NOT_FOUND`` unless ``eospack.register(spark)`` is called. The answer is
    for this interpreter's ``sys.path``; Spark's workers also have their working directory
    on it, so a job started from the project folder may find the modules anyway.
    """
    listed = {
        module.name for module in pkgutil.iter_modules() if module.name.startswith("pyspark_")
    }
    return listed.issuperset(FORMAT_MODULES)


def formats_check(visible: bool) -> CheckResult:
    """The one line about the formats, given whether Spark's lookup sees them."""
    if visible:
        return CheckResult(True, FORMATS_FOUND.format(formats=", ".join(FORMAT_MODULES.values())))
    return CheckResult(False, FORMATS_NOT_FOUND)


def java_check(java_home: str | None = None) -> CheckResult:
    """The one line about the Java Spark would start (``JAVA_HOME``, else ``java`` on PATH)."""
    from eospack.core.java import SUPPORTED_JAVA_MAJORS, JavaNotFoundError, check_java

    try:
        major = check_java(java_home)
    except JavaNotFoundError as error:
        return CheckResult(False, f"java: {error}")
    supported = " or ".join(str(version) for version in SUPPORTED_JAVA_MAJORS)
    return CheckResult(True, f"java: Java {major} (Spark 4 needs {supported})")


def data_path_check() -> CheckResult:
    """The one line about the Kafka data path: the native extension and its build (release,
    or debug: slower, never wrong), or the pure-Python reference (slower, never wrong) and
    what is missing for the native one."""
    from eospack.connectors.kafka.records import native_path

    return CheckResult(True, f"kafka data path: {native_path.active_path()}")


def platform_checks(
    spark_version: str | None = None, python_version: tuple[int, int] | None = None
) -> list[CheckResult]:
    """Two lines: the Spark (the installed pyspark) and the Python found, each with whether
    eospack supports it; the Spark line also says what that Spark lacks (docs/platforms.md)."""
    from eospack.core import spark_features

    spark_version = spark_version or spark_features.spark_version()
    python_version = python_version or (sys.version_info.major, sys.version_info.minor)
    lines = ", ".join(f"{major}.{minor}" for major, minor in spark_features.SUPPORTED_SPARK_LINES)
    if spark_features.spark_supported(spark_version):
        spark = CheckResult(
            True, f"spark: Spark {spark_version} (supported; {spark_features.describe()})"
        )
    else:
        spark = CheckResult(
            False,
            f"spark: Spark {spark_version} is not supported: install pyspark of a supported"
            f" line ({lines})",
        )
    python = ".".join(str(part) for part in python_version)
    pythons = ", ".join(f"{major}.{minor}" for major, minor in spark_features.SUPPORTED_PYTHONS)
    if spark_features.python_supported(python_version):
        return [spark, CheckResult(True, f"python: Python {python} (supported: {pythons})")]
    return [
        spark,
        CheckResult(False, f"python: Python {python} is not supported: use Python {pythons}"),
    ]


WORKER_PYTHON_SETTING = "spark.pyspark.python"
WORKER_PYTHON_VARIABLE = "PYSPARK_PYTHON"


class WorkerPythonError(EospackError, RuntimeError):
    """The Python that Spark's local workers start cannot import eospack."""


def worker_python(
    context_python: str | None, settings: Mapping[str, str], environment: Mapping[str, str]
) -> str:
    """The Python executable Spark's workers start for eospack's formats and operators.

    pyspark decides it once, when the SparkContext starts: ``PYSPARK_PYTHON`` from the
    driver's environment, else ``python3`` on PATH (``pyspark/core/context.py``,
    ``sc.pythonExec``); under ``spark-submit`` the ``spark.pyspark.python`` setting is
    copied into that variable before the driver starts (Spark's ``PythonRunner``).
    ``context_python`` is that decision when a context exists and wins; without one, the
    same order is applied to ``settings`` and ``environment``.
    """
    if context_python:
        return context_python
    return (
        settings.get(WORKER_PYTHON_SETTING) or environment.get(WORKER_PYTHON_VARIABLE) or "python3"
    )


def worker_python_problem(python: str) -> str | None:
    """None when ``python`` (a path or a name on PATH) can import eospack, else the one line
    saying which Python the workers start and how to point them at this one. The current
    interpreter is not started again (it imported eospack already); any other costs one
    ``python -c "import eospack"`` (100-300 ms)."""
    fix = (
        f"set {WORKER_PYTHON_VARIABLE}={sys.executable} before the session starts"
        f" (or {WORKER_PYTHON_SETTING}={sys.executable} with spark-submit)"
    )
    if python == sys.executable:
        return None
    try:
        completed = subprocess.run(
            [python, "-c", "import eospack"], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"worker python: {python} cannot be started ({type(error).__name__}): {fix}"
    if completed.returncode != 0:
        return f"worker python: {python} (what Spark's workers start) cannot import eospack: {fix}"
    return None


def worker_python_check(python: str) -> CheckResult:
    """The one line about the Python Spark's workers start (see :func:`worker_python`)."""
    problem = worker_python_problem(python)
    if problem is not None:
        return CheckResult(False, problem)
    return CheckResult(True, f"worker python: {python} imports eospack")


_checked_worker_pythons: set[str] = set()


def require_worker_python(spark: SparkSession) -> None:
    """Raise WorkerPythonError, one line, when ``spark`` is a local-mode session whose
    workers start a Python that cannot import eospack (they would otherwise fail at the
    first batch with a long ``ModuleNotFoundError`` trace). Checked once per Python per
    process; sessions on a cluster are not checked (their workers run elsewhere)."""
    context = spark.sparkContext
    if not (context.master or "").startswith("local"):
        return
    python = worker_python(getattr(context, "pythonExec", None), {}, os.environ)
    if python in _checked_worker_pythons:
        return
    problem = worker_python_problem(python)
    if problem is not None:
        raise WorkerPythonError(problem)
    _checked_worker_pythons.add(python)


PYTHON_DAEMON = "eospack.python_daemon"
DAEMON_MODULE_SETTING = "spark.python.daemon.module"
WORKER_REUSE_SETTING = "spark.python.worker.reuse"


def session_checks(
    settings: dict[str, str], spark_home: str | None, workers_python: str | None = None
) -> list[CheckResult]:
    """Lines about a running session's settings that a micro-batch pays for, from its
    ``settings`` (Spark's conf) and the ``SPARK_HOME`` its Python workers are started from;
    with ``workers_python`` (the Python its workers start), first a line saying whether that
    Python imports eospack (a failed one breaks every query, see :func:`worker_python_check`).

    Each is what :func:`eospack.tools.spark.local_session` sets, and why (docs/operations.md,
    "Running on a cluster"): worker reuse, eospack's Python daemon (a reused worker's
    cleanup after each task walks only that task's objects), and a Spark home whose
    workers do not compile pyspark from ``pyspark.zip``. A failed line costs time, never
    correctness.
    """
    results = [] if workers_python is None else [worker_python_check(workers_python)]
    if settings.get(WORKER_REUSE_SETTING, "true").lower() == "true":
        results.append(CheckResult(True, "python workers: reused between tasks"))
    else:
        results.append(
            CheckResult(
                False,
                f"python workers: {WORKER_REUSE_SETTING}=false starts a Python process for"
                f" every task: set {WORKER_REUSE_SETTING}=true",
            )
        )
    daemon = settings.get(DAEMON_MODULE_SETTING, "pyspark.daemon")
    if daemon == PYTHON_DAEMON:
        results.append(CheckResult(True, f"python daemon: {PYTHON_DAEMON}"))
    else:
        results.append(
            CheckResult(
                False,
                f"python daemon: {daemon} makes each reused worker walk its whole heap after"
                f" every task (30-80 ms a task): set {DAEMON_MODULE_SETTING}={PYTHON_DAEMON}",
            )
        )
    if spark_home and (Path(spark_home) / "python" / "lib" / "pyspark.zip").is_file():
        results.append(
            CheckResult(
                False,
                f"spark home: {spark_home} puts python/lib/pyspark.zip first on every Python"
                " worker's path (each new worker compiles pyspark, ~0.7 s): start Spark with"
                " eospack.tools.spark.local_session or a SPARK_HOME without python/lib",
            )
        )
    else:
        results.append(CheckResult(True, "spark home: Python workers import the installed pyspark"))
    return results


def running_session_checks(spark: SparkSession) -> list[CheckResult]:
    """:func:`session_checks` for ``spark``: its conf, the SPARK_HOME of this driver, and
    (in local mode, where the workers run on this machine) the Python its workers start."""
    context = spark.sparkContext
    settings = dict(context.getConf().getAll())
    python = None
    if (context.master or "").startswith("local"):
        python = worker_python(getattr(context, "pythonExec", None), settings, os.environ)
    return session_checks(settings, os.environ.get("SPARK_HOME"), python)


def run_doctor(
    output: TextIO | None = None,
    java_home: str | None = None,
    spark: SparkSession | None = None,
) -> int:
    """Print one line per check (to stdout by default); return 0 when all passed, else 1.
    With ``spark``, the running session's settings are checked as well."""
    results = [java_check(java_home), formats_check(formats_visible_to_spark()), data_path_check()]
    results += platform_checks()
    if spark is not None:
        results += running_session_checks(spark)
    for result in results:
        print(result.line, file=output or sys.stdout, flush=True)
    return 0 if all(result.passed for result in results) else 1
