"""Stand-ins for ``pyspark.sql.streaming.datasource`` on Spark lines without it (4.0, 4.1).

There Spark calls a Python stream reader's ``latestOffset()`` with no start and no limit,
and never calls ``getDefaultReadLimit`` or ``prepareForTriggerAvailableNow``: these classes
only let ``source/data_source.py`` be written once (see ``eospack.core.spark_features``).
"""

from __future__ import annotations

from dataclasses import dataclass


class ReadLimit:
    """No limit is ever handed to a reader on these lines."""


@dataclass(frozen=True)
class ReadAllAvailable(ReadLimit):
    pass


@dataclass(frozen=True)
class ReadMinRows(ReadLimit):
    min_rows: int


@dataclass(frozen=True)
class ReadMaxRows(ReadLimit):
    max_rows: int


class SupportsTriggerAvailableNow:
    """Spark 4.0 and 4.1 run Trigger.AvailableNow without asking the reader."""

    def prepareForTriggerAvailableNow(self) -> None:  # pragma: no cover - never called
        """Never called by these Spark lines."""
