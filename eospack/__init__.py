"""eospack: exactly-once streaming connectors for PySpark.

The data sources register themselves through the ``pyspark_*`` modules once the package
is installed as a wheel (or with ``editable_mode=compat``); ``register(spark)`` does the
same by hand, and is needed where Spark's lookup cannot see the modules: after a plain
``pip install -e .`` (pip serves editable packages through an import hook that Spark's
lookup of ``pyspark_*`` modules does not see), or where automatic lookup is turned off.
Every entry point of eospack (``eospack.tools.spark.local_session``, the demo, the benchmarks)
calls it.

``register`` also closes a Spark race (``docs/spark-python-datasource-envvars-race.md``):
two streaming queries reading one Python data source, started at the same moment, insert
the same keys into that source's one shared, unsynchronised environment map; a lost
insert leaves the map one entry short of its size, and every later task that carries the
source fails with "Task not serializable: Illegal size N of collection, expected N+1".
Registering fills in those keys before any query runs, so later writers only overwrite.
In local mode it also checks, once per process, that the Python Spark's workers start can
import eospack (:func:`eospack.tools.doctor.require_worker_python`).

The public face is ``__all__``: what users import from ``eospack`` and what keeps its name
and meaning between releases; everything else (the submodules' other names) is internal.
Spark's Python workers import this package, so its public names resolve lazily (PEP 562
``__getattr__``): ``import eospack`` loads neither pyspark.sql, pandas nor the connectors.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eospack.core.checkout_layout import serve_checkout_folders
from eospack.core.errors import EospackError
from eospack.core.version import __version__ as __version__
from eospack.tools.formats import public_error_homes
from eospack.tools.registration import register as register_formats

serve_checkout_folders(Path(__file__).resolve().parent)


def register(spark: SparkSession) -> None:
    """Make eospack's formats usable in ``spark`` (``eospack.tools.registration.register``:
    the module docstring above says why and what it checks). With the Spark conf
    ``spark.eospack.metrics.port`` set, also serve the metrics there, once per process
    (``eospack.tools.metrics.serve_from_conf``; docs/metrics.md)."""
    from eospack.tools.metrics import serve_from_conf

    register_formats(spark)
    serve_from_conf(spark)


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
    from eospack.core.java import JavaNotFoundError
    from eospack.lab.services.base import ServiceStartError
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
    from eospack.tools.doctor import WorkerPythonError
    from eospack.tools.savepoint import RestoredCheckpoint
    from eospack.tools.spark import local_session
    from eospack.tools.stop_with_savepoint import (
        StopWithSavepointError,
        honour_stop_requests,
        stop_with_savepoint,
    )
    from eospack.tools.supervisor import (
        ExponentialDelay,
        FailureRate,
        FixedDelay,
        PermanentQueryError,
        RestartsExhaustedError,
        supervise,
    )


# Each lazily resolved public name and the module that defines it.
_HOMES: dict[str, str] = {
    "local_session": "eospack.tools.spark",
    "JavaNotFoundError": "eospack.core.java",
    "supervise": "eospack.tools.supervisor",
    "ExponentialDelay": "eospack.tools.supervisor",
    "FailureRate": "eospack.tools.supervisor",
    "FixedDelay": "eospack.tools.supervisor",
    "PermanentQueryError": "eospack.tools.supervisor",
    "RestartsExhaustedError": "eospack.tools.supervisor",
    "running_count": "eospack.stateful_ops",
    "running_aggregate": "eospack.stateful_ops",
    "deduplicate": "eospack.stateful_ops",
    "sessionize": "eospack.stateful_ops",
    "StatefulOperator": "eospack.stateful_ops",
    "Clock": "eospack.stateful_ops",
    "StatefulOpsError": "eospack.stateful_ops",
    "OperatorDefinitionError": "eospack.stateful_ops",
    "StateSchemaMismatchError": "eospack.stateful_ops",
    "RestoredCheckpoint": "eospack.tools.savepoint",
    "stop_with_savepoint": "eospack.tools.stop_with_savepoint",
    "honour_stop_requests": "eospack.tools.stop_with_savepoint",
    "StopWithSavepointError": "eospack.tools.stop_with_savepoint",
    "WorkerPythonError": "eospack.tools.doctor",
    "ServiceStartError": "eospack.lab.services.base",
    "DecidedPieceLostError": "eospack.commit_protocols.resource",
    "SinkIdentityError": "eospack.commit_protocols.identity",
    # each format's errors users catch: its entry in eospack.tools.formats
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
    "StopWithSavepointError",
    "WorkerPythonError",
    "deduplicate",
    "honour_stop_requests",
    "local_session",
    "register",
    "running_aggregate",
    "running_count",
    "sessionize",
    "stop_with_savepoint",
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
