"""What the installed Spark offers eospack, found by looking for it, asked in one place.

Why: eospack runs on every Spark 4 line (4.0 to 4.3), and platforms (Databricks, EMR) ship
their own pyspark, which installing eospack must not replace. The Python Data Source API
exists since 4.0 (streaming readers and writers included); a few pieces came later. Each is
a :class:`Feature` found by looking for the pyspark module or class that carries it (the
pyspark of a Spark install comes with its JVM, so the Python side tells), never by parsing
the version, and every connector asks here: it falls back where it can, and otherwise
refuses at query start in one line naming the Spark version and what it lacks
(:func:`require`). docs/platforms.md has the table.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from eospack.core.errors import EospackError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

# The Spark lines eospack supports and tests (make test-compat), and the Pythons.
SUPPORTED_SPARK_LINES = ((4, 0), (4, 1), (4, 2), (4, 3))
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))


class SparkFeatureError(EospackError, RuntimeError):
    """The running Spark lacks something a query asked for (one line: version and what)."""


class Feature(NamedTuple):
    """A piece of Spark's Python API that not every supported line has."""

    name: str
    since: str  # the first Spark line that has it
    what: str  # what it is, in a few words

    @property
    def available(self) -> bool:
        return _available(self.name)


# Admission control for Python stream readers: latestOffset(start, limit),
# getDefaultReadLimit, reportLatestOffset (pyspark.sql.streaming.datasource). Without it
# Spark calls latestOffset() with nothing, and each batch reads all that is available.
ADMISSION_CONTROL = Feature("admission_control", "4.2", "admission control for Python sources")
# SupportsTriggerAvailableNow for Python stream readers. Without it, Spark still runs
# Trigger.AvailableNow: it asks latestOffset() once at the start and reads up to that
# (Spark's AvailableNowDataStreamWrapper), in one batch.
TRIGGER_AVAILABLE_NOW = Feature(
    "trigger_available_now", "4.2", "Trigger.AvailableNow support for Python sources"
)
# DataSourceStreamArrowWriter: a stream writer fed Arrow record batches. Spark 4.0's
# worker feeds any writer that is a DataSourceArrowWriter Arrow batches, streaming or not,
# which is the fallback (commit_protocols/stream_writer.py): the same batches either way.
STREAM_ARROW_WRITER = Feature(
    "stream_arrow_writer", "4.1", "DataSourceStreamArrowWriter, Arrow batches into stream sinks"
)

# pyspark.sql.functions.arrow_udf: the stateful operators' first-row-of-a-partition flag is
# an Arrow iterator UDF; without it the same UDF runs through pandas_udf (a pandas copy of
# one boolean column per batch).
ARROW_UDF = Feature("arrow_udf", "4.1", "Arrow UDFs, arrow_udf")

FEATURES = (ADMISSION_CONTROL, TRIGGER_AVAILABLE_NOW, STREAM_ARROW_WRITER, ARROW_UDF)


@cache
def _available(name: str) -> bool:
    if name in ("admission_control", "trigger_available_now"):
        # The module carries ReadLimit and SupportsTriggerAvailableNow, and the source
        # runner that calls them ships with it.
        return importlib.util.find_spec("pyspark.sql.streaming.datasource") is not None
    if name == "stream_arrow_writer":
        from pyspark.sql import datasource

        return hasattr(datasource, "DataSourceStreamArrowWriter")
    if name == "arrow_udf":
        from pyspark.sql import functions

        return hasattr(functions, "arrow_udf")
    raise ValueError(f"unknown Spark feature {name}")


def arrow_type_utc(data_type: DataType) -> pa.DataType:
    """pyspark's Arrow type of ``data_type``, a timestamp as UTC microseconds, on any line:
    4.2 takes ``timezone="UTC"``, 4.0 and 4.1 have no such argument (UTC is their default)."""
    from pyspark.sql.pandas import types

    if "timezone" in inspect.signature(types.to_arrow_type).parameters:
        return types.to_arrow_type(data_type, timezone="UTC")
    return types.to_arrow_type(data_type)


def arrow_schema_utc(schema: StructType) -> pa.Schema:
    """pyspark's Arrow schema of ``schema``, timestamps as UTC microseconds, on any line."""
    from pyspark.sql.pandas import types

    if "timezone" in inspect.signature(types.to_arrow_schema).parameters:
        return types.to_arrow_schema(schema, timezone="UTC")
    return types.to_arrow_schema(schema)


def spark_version() -> str:
    """The version of the installed pyspark (that of its Spark)."""
    import pyspark

    return pyspark.__version__


def version_line(version: str) -> tuple[int, int] | None:
    """``(4, 1)`` of ``4.1.4`` (also ``4.1.0.dev0``, ``4.1.0rc1``); None if unreadable."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()))
    except (IndexError, ValueError):
        return None


def spark_supported(version: str) -> bool:
    return version_line(version) in SUPPORTED_SPARK_LINES


def python_supported(version: tuple[int, int] = sys.version_info[:2]) -> bool:
    return tuple(version) in SUPPORTED_PYTHONS


def require(feature: Feature, asked: str) -> None:
    """Raise SparkFeatureError, one line, unless the running Spark has ``feature``.

    ``asked`` is what the user asked for that needs it (an option, a trigger).
    """
    if not feature.available:
        raise SparkFeatureError(
            f"{asked} needs Spark {feature.since}+ ({feature.what}); this is Spark"
            f" {spark_version()}"
        )


def describe() -> str:
    """One line: the features this Spark lacks, or that it has them all."""
    missing = [feature for feature in FEATURES if not feature.available]
    if not missing:
        return "every feature eospack uses"
    return "lacks " + "; ".join(f"{f.what} (Spark {f.since}+)" for f in missing)
