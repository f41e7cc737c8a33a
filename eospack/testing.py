"""Helpers for tests of eospack and of pipelines built on it: waits with deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
