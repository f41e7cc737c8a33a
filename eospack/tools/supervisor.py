"""Restart strategies for streaming queries: Flink's fixed-delay, exponential-delay and
failure-rate, around a function that builds and starts a job's queries.

Why: Spark restarts a failed task (``spark.task.maxFailures``) but never a failed query; a
data engineer from Flink expects the job to come back by itself after a broker blip or a
lost database connection, and to stop at once on an error no restart can fix. Restarting
is safe with eospack because every query resumes from its checkpoint and the sinks finish
or roll back what the failed run left (exactly-once holds across any number of restarts).

Guarantees: ``supervise`` returns when every query ends by itself (``Trigger.AvailableNow``);
raises ``PermanentQueryError`` without any restart when the failure is one a restart cannot
fix (a bad option, a schema mismatch, missing credentials, a decided piece lost, a sink
taken over by another run); raises ``RestartsExhaustedError`` when the strategy refuses
another restart. Each restart is logged (``eospack.tools.supervisor``, WARNING) with its cause,
count and delay.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from eospack.core.errors import EospackError

logger = logging.getLogger("eospack.supervisor")  # a logger name users configure (docs)

PERMANENT_ERROR_NAMES = (
    # eospack: options, identities, schemas and state layouts are checked before data moves
    "JdbcSinkOptionError",
    "JdbcIdentifierError",
    "JdbcSchemaError",
    "KafkaSourceOptionError",
    "KafkaSinkOptionError",
    "S3OptionError",
    "SinkIdentityError",
    "OperatorDefinitionError",
    "StateSchemaMismatchError",
    "KafkaCodecMissingError",
    "S3AccessError",
    # a human must look: data is gone, or a decided piece of output was lost, or a record
    # is larger than the output topic takes (each replay of its batch sends it again)
    "KafkaDataLossError",
    "must fit the topic's max.message.bytes",
    "DecidedPieceLostError",
    # another run of the query (or another query with its sinkId) took over the sink's
    # ledger: a restart would only fence that run in turn
    "LedgerFencedError",
    # Spark: the plan itself is wrong, or a format is not installed
    "AnalysisException",
    "DATA_SOURCE_NOT_FOUND",
    "UNRESOLVED_COLUMN",
    "password authentication failed",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
)
"""Errors no restart can fix, matched by class name or message text: a query's failure
reaches the driver as a ``StreamingQueryException`` whose message carries the original
error (raised in Spark's Python planner or worker processes) as text. Names, not classes,
so that importing the supervisor loads no connector (nor its client library)."""


class PermanentQueryError(EospackError, RuntimeError):
    """A query failed in a way no restart can fix; its cause is chained."""


class RestartsExhaustedError(EospackError, RuntimeError):
    """The restart strategy refused another restart; the last failure is chained."""


class RestartStrategy(Protocol):
    """Decides, at each failure, whether to restart and after how long."""

    def delay_after(self, failed_at: float, started_at: float) -> float | None:
        """Seconds to wait before the next start, or None to give up.

        ``failed_at`` and ``started_at`` (of the run that failed) are monotonic seconds.
        """
        ...

    def describe(self) -> str: ...


@dataclass
class FixedDelay:
    """Flink's fixed-delay: at most ``attempts`` restarts in all, ``delay`` seconds apart."""

    attempts: int
    delay: float
    restarts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _require(self.attempts >= 0, "attempts", "0 or more restarts")
        _require(self.delay >= 0, "delay", "a duration of 0 s or more")

    def delay_after(self, failed_at: float, started_at: float) -> float | None:
        if self.restarts >= self.attempts:
            return None
        self.restarts += 1
        return self.delay

    def describe(self) -> str:
        return f"fixed-delay: {self.attempts} attempts, {self.delay:g} s apart"


@dataclass
class ExponentialDelay:
    """Flink's exponential-delay: ``initial`` seconds, times ``multiplier`` after each
    failure up to ``maximum``; back to ``initial`` once a run stayed up ``reset_after``
    seconds. ``attempts`` bounds restarts in a row (None: no bound)."""

    initial: float
    maximum: float
    multiplier: float = 2.0
    reset_after: float = 3600.0
    attempts: int | None = None
    current: float = field(default=0.0, init=False)
    restarts_in_a_row: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _require(self.initial > 0, "initial", "a duration above 0 s")
        _require(self.maximum >= self.initial, "maximum", "at least the initial delay")
        _require(self.multiplier >= 1, "multiplier", "1 or more")
        _require(self.reset_after > 0, "reset after", "a duration above 0 s")
        _require(self.attempts is None or self.attempts >= 0, "attempts", "0 or more")

    def delay_after(self, failed_at: float, started_at: float) -> float | None:
        if failed_at - started_at >= self.reset_after:
            self.current, self.restarts_in_a_row = 0.0, 0
        if self.attempts is not None and self.restarts_in_a_row >= self.attempts:
            return None
        self.restarts_in_a_row += 1
        self.current = (
            self.initial if self.current == 0 else min(self.current * self.multiplier, self.maximum)
        )
        return self.current

    def describe(self) -> str:
        return (
            f"exponential-delay: {self.initial:g} s up to {self.maximum:g} s, x{self.multiplier:g},"
            f" reset after {self.reset_after:g} s up"
        )


@dataclass
class FailureRate:
    """Flink's failure-rate: restart after ``delay`` seconds unless more than
    ``max_failures`` failures fell within the last ``interval`` seconds."""

    max_failures: int
    interval: float
    delay: float
    failures: deque[float] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        _require(self.max_failures >= 1, "max failures per interval", "1 or more")
        _require(self.interval > 0, "failure rate interval", "a duration above 0 s")
        _require(self.delay >= 0, "delay", "a duration of 0 s or more")

    def delay_after(self, failed_at: float, started_at: float) -> float | None:
        self.failures.append(failed_at)
        while self.failures and self.failures[0] <= failed_at - self.interval:
            self.failures.popleft()
        return None if len(self.failures) > self.max_failures else self.delay

    def describe(self) -> str:
        return (
            f"failure-rate: at most {self.max_failures} failures per {self.interval:g} s,"
            f" {self.delay:g} s apart"
        )


def _require(condition: bool, name: str, wanted: str) -> None:
    if not condition:
        raise ValueError(f"restart strategy: {name} must be {wanted}")


def is_permanent(error: BaseException) -> bool:
    """Whether no restart can fix ``error`` (see PERMANENT_ERROR_NAMES)."""
    text = f"{type(error).__name__}: {error}"
    return any(name in text for name in PERMANENT_ERROR_NAMES)


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception)\b: .+)")


def first_line(error: BaseException) -> str:
    """The line of a (long, multi-line) Spark error that says what went wrong: the original
    Python error's ``Class: message`` line (module path dropped), else the first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    errors = [
        match.group(1)
        for line in lines
        if not line.startswith(("org.apache.", "java.", "py4j.", "scala."))
        and (match := _ERROR_LINE.match(line))
    ]
    named = [line for line in errors if any(name in line for name in PERMANENT_ERROR_NAMES)]
    chosen = (named or errors or [f"{type(error).__name__}: {lines[0] if lines else ''}"])[0]
    return chosen[:500]


class Query(Protocol):
    """What the supervisor needs of a StreamingQuery."""

    @property
    def name(self) -> str | None: ...

    @property
    def isActive(self) -> bool: ...

    def awaitTermination(self, timeout: int | None = None) -> bool | None: ...

    def exception(self) -> Any: ...

    def stop(self) -> None: ...


StartQueries = Callable[[], "Query | Iterable[Query] | None"]


def supervise(
    start_queries: StartQueries,
    strategy: RestartStrategy,
    *,
    poll_seconds: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``start_queries`` (it builds and starts the job's queries and returns them) and
    restart it by ``strategy`` whenever one of its queries fails or it raises.

    On a failure the job's other queries are stopped first, so a restart starts all of
    them again from their checkpoints. Returns the number of restarts made.
    """
    restarts = 0
    while True:
        started_at = clock()
        try:
            queries = _as_list(start_queries())
            failure = _wait_for_end_or_failure(queries, poll_seconds)
        except Exception as error:  # a failure while starting counts like one while running
            failure = error
        if failure is None:
            return restarts
        if is_permanent(failure):
            logger.error("not restarting: %s", first_line(failure))
            raise PermanentQueryError(first_line(failure)) from failure
        delay = strategy.delay_after(clock(), started_at)
        if delay is None:
            logger.error("no restart left (%s): %s", strategy.describe(), first_line(failure))
            raise RestartsExhaustedError(
                f"{strategy.describe()}: gave up after {restarts} restarts;"
                f" last failure {first_line(failure)}"
            ) from failure
        restarts += 1
        logger.warning(
            "restart %d in %.1f s (%s) after %s",
            restarts,
            delay,
            strategy.describe(),
            first_line(failure),
        )
        sleep(delay)


def _as_list(started: Query | Iterable[Query] | None) -> list[Query]:
    if started is None:
        return []
    if hasattr(started, "awaitTermination"):
        return [started]  # type: ignore[list-item]
    return list(started)  # type: ignore[arg-type]


def _wait_for_end_or_failure(queries: Sequence[Query], poll_seconds: float) -> BaseException | None:
    """Wait until every query ended (None) or one failed (its exception, others stopped)."""
    while True:
        running = False
        for query in queries:
            try:
                ended = query.awaitTermination(poll_seconds) if query.isActive else True  # type: ignore[arg-type]
            except Exception as error:  # awaitTermination re-raises a query's failure
                _stop_all(queries)
                return error
            failure = query.exception() if ended else None
            if failure is not None:
                _stop_all(queries)
                return failure
            running = running or not ended
        if not running:
            return None


def _stop_all(queries: Sequence[Query]) -> None:
    for query in queries:
        try:
            if query.isActive:
                query.stop()
        except Exception as error:  # stopping a failed job: keep going, say so
            logger.warning("could not stop %s: %s", query.name, first_line(error))
