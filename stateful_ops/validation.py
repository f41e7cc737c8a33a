"""Driver-side checks of operator arguments; each failure is one OperatorDefinitionError line."""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import (
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    TimestampType,
)

from .errors import OperatorDefinitionError

INTEGRAL_TYPES = (ByteType, ShortType, IntegerType, LongType)
NUMERIC_TYPES = (*INTEGRAL_TYPES, FloatType, DoubleType)

# Spark adds this metadata to the event-time column of withWatermark (EventTimeWatermark).
WATERMARK_METADATA_KEY = "spark.watermarkDelayMs"

_UNIT_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1_000,
    "second": 1_000,
    "seconds": 1_000,
    "m": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")
# The longest duration taken: 100 years. Expiries are kept as int64 ms or µs since the
# epoch; longer ones (timedelta.max, meant as "forever") overflowed in the first batch.
MAX_DURATION_DAYS = 36_500


def key_columns(operator: str, df: DataFrame, key: str | Sequence[str]) -> tuple[str, ...]:
    """Return the key as a non-empty tuple of column names present in ``df``."""
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys:
        raise OperatorDefinitionError(f"{operator}: key is empty; pass a column name or a list")
    for name in keys:
        require_column(operator, df, name, role="key")
    if len(set(keys)) != len(keys):
        raise OperatorDefinitionError(f"{operator}: key {list(keys)} names a column twice")
    return keys


def require_column(operator: str, df: DataFrame, name: str, role: str) -> DataType:
    """Return the type of column ``name``; raise naming the operator, role and known columns."""
    if not isinstance(name, str) or name not in df.columns:
        raise OperatorDefinitionError(
            f"{operator}: {role} column {name!r} is not in the DataFrame;"
            f" available columns: {', '.join(df.columns)}"
        )
    return df.schema[name].dataType


def duration_ms(operator: str, argument: str, value: object) -> int:
    """Parse a positive duration: timedelta, or a string like "10 seconds" / "500 ms".

    At most ``MAX_DURATION_DAYS``, so an expiry (event or processing time plus the
    duration, in µs) stays far inside int64: refused here rather than by the first batch."""
    if isinstance(value, datetime.timedelta):
        ms = int(value / datetime.timedelta(milliseconds=1))
    elif isinstance(value, str) and (match := _DURATION.match(value.lower())):
        amount, unit = match.groups()
        if unit not in _UNIT_MS:
            raise OperatorDefinitionError(
                f"{operator}: {argument}={value!r} has unknown unit {unit!r};"
                f" use one of ms, seconds, minutes, hours, days"
            )
        ms = int(amount) * _UNIT_MS[unit]
    else:
        raise OperatorDefinitionError(
            f"{operator}: {argument}={value!r} is not a duration;"
            f' pass a datetime.timedelta or a string like "10 minutes"'
        )
    if ms <= 0:
        raise OperatorDefinitionError(
            f"{operator}: {argument}={value!r} must be positive (at least 1 ms)"
        )
    if ms > MAX_DURATION_DAYS * _UNIT_MS["days"]:
        forever = operator in ("running_count", "running_aggregate") and argument == "ttl"
        raise OperatorDefinitionError(
            f"{operator}: {argument}={value!r} is longer than {MAX_DURATION_DAYS} days;"
            f" give at most {MAX_DURATION_DAYS} days"
            + (", or omit ttl to keep keys forever" if forever else "")
        )
    return ms


def has_watermark(df: DataFrame, column: str) -> bool:
    """Whether ``column`` of ``df`` carries an event-time watermark (``withWatermark``)."""
    return WATERMARK_METADATA_KEY in df.schema[column].metadata


def require_event_time(operator: str, df: DataFrame, column: str) -> None:
    """The event-time column must exist, be a timestamp and carry a watermark."""
    data_type = require_column(operator, df, column, role="event_time")
    if not isinstance(data_type, TimestampType):
        raise OperatorDefinitionError(
            f"{operator}: event_time column {column!r} is {data_type.simpleString()},"
            " not timestamp; cast it with to_timestamp() first"
        )
    if not has_watermark(df, column):
        raise OperatorDefinitionError(
            f"{operator}: event_time column {column!r} has no watermark;"
            f' call df.withWatermark("{column}", "<delay>") before {operator}'
        )


# Flink's uid: a stable operator name, stored with the operator's state (Arrow metadata).
OPERATOR_NAME_METADATA_KEY = b"operator_name"
OPERATOR_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def operator_name(operator: str, name: object) -> str | None:
    """``name`` checked: None (an unnamed operator, mapped by position as before names
    existed) or 1 to 128 characters of ``[A-Za-z0-9_.-]``, so it is safe in file names,
    manifests, metric labels and CLI output. Uniqueness within a query is the user's job;
    a savepoint holding two operators of one name is refused on restore."""
    if name is None:
        return None
    if not isinstance(name, str) or not OPERATOR_NAME_PATTERN.fullmatch(name):
        raise OperatorDefinitionError(
            f"{operator}: name={name!r} is not a valid operator name; use 1 to 128 characters"
            " of A-Z a-z 0-9 _ . - (e.g. name='counts-by-user'), or omit it"
        )
    return name
