"""Helpers for tests of eospack and of pipelines built on it: waits with deadlines, and
session settings that last one block."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from pyspark.sql.streaming import StreamingQuery

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout: float, description: str, poll: float = 0.1
) -> T:
    """Return the first truthy value of ``condition()``; raise TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {description}")
        time.sleep(poll)


def await_query(query: StreamingQuery, timeout: float) -> None:
    """Wait for a query that ends by itself (Trigger.AvailableNow); fail if it does not.

    A query that failed re-raises its exception; one still running after ``timeout``
    is stopped and reported as a TimeoutError.
    """
    if not query.awaitTermination(timeout):  # type: ignore[arg-type]  # float seconds work
        query.stop()
        raise TimeoutError(f"streaming query {query.name or query.id} still ran after {timeout} s")
    exception = query.exception()
    if exception is not None:
        raise exception


@contextlib.contextmanager
def session_settings(spark: Any, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` on the session for queries started inside the block, then what was
    there before (a setting that was unset is unset again), also when the block fails."""
    previous = {name: spark.conf.get(name, None) for name in settings}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


def count_keys_to_noop(
    spark: Any,
    input_directory: str,
    checkpoint: str,
    key_groups: int,
    initial_state: Any = None,
    timeout: float = 3600,
) -> None:
    """Run ``running_count`` over the ``key string`` Parquet files of ``input_directory``
    into Spark's ``noop`` sink to their end (Trigger.AvailableNow) on ``checkpoint``: a
    state of as many keys as the files hold, and nothing collected to the driver."""
    from eospack.stateful_ops import running_count

    events = spark.readStream.schema("key string").parquet(input_directory)
    counts = running_count(events, "key", key_groups=key_groups, initial_state=initial_state)
    query = (
        counts.writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .trigger(availableNow=True)
        .start()
    )
    await_query(query, timeout)
