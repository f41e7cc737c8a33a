"""Restart strategies and the supervisor loop, with stand-in queries and a fake clock."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from eospack.cli import duration_seconds
from eospack.connectors.kafka.errors import KafkaSendError, KafkaSinkOptionError, LedgerFencedError
from eospack.tools.supervisor import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    PermanentQueryError,
    RestartsExhaustedError,
    is_permanent,
    supervise,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@dataclass
class StandInQuery:
    """Ends by itself, or fails with ``error``, after ``runs_for`` seconds of the clock."""

    clock: FakeClock
    error: Exception | None = None
    runs_for: float = 1.0
    name: str | None = "stand-in"
    stopped: bool = False
    started_at: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started_at = self.clock.now

    @property
    def isActive(self) -> bool:
        return not self.stopped and self.clock.now < self.started_at + self.runs_for

    def awaitTermination(self, timeout: float | None = None) -> bool:
        self.clock.now = max(self.clock.now, self.started_at + self.runs_for)
        if self.error is not None and not self.stopped:
            raise self.error
        return True

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


def starts(clock: FakeClock, outcomes: list[Exception | None], runs_for: float = 1.0):
    """A start function whose n-th run has one query ending with ``outcomes[n]``."""
    calls: list[StandInQuery] = []

    def start() -> StandInQuery:
        query = StandInQuery(clock, outcomes[len(calls)], runs_for)
        calls.append(query)
        return query

    return start, calls


TRANSIENT = RuntimeError("StreamingQueryException: KafkaBrokerUnreachableError: no broker")
PERMANENT = RuntimeError(
    "StreamingQueryException: [PYTHON_DATA_SOURCE_ERROR]\n"
    "eospack.connectors.jdbc.errors.JdbcSinkOptionError: writeMode 'bogus': use append or upsert"
)


def test_fixed_delay_restarts_transient_failures_until_the_queries_end() -> None:
    clock = FakeClock()
    start, calls = starts(clock, [TRANSIENT, TRANSIENT, None])
    restarts = supervise(start, FixedDelay(3, 10.0), clock=clock, sleep=clock.sleep)
    assert restarts == 2 and len(calls) == 3
    assert clock.slept == [10.0, 10.0]


def test_fixed_delay_gives_up_after_its_attempts_with_the_last_cause() -> None:
    clock = FakeClock()
    start, calls = starts(clock, [TRANSIENT] * 5)
    with pytest.raises(RestartsExhaustedError, match="gave up after 2 restarts") as caught:
        supervise(start, FixedDelay(2, 1.0), clock=clock, sleep=clock.sleep)
    assert "KafkaBrokerUnreachableError" in str(caught.value)
    assert caught.value.__cause__ is TRANSIENT
    assert len(calls) == 3


def test_a_permanent_error_stops_at_once_with_its_own_line() -> None:
    clock = FakeClock()
    start, calls = starts(clock, [PERMANENT, None])
    with pytest.raises(PermanentQueryError) as caught:
        supervise(start, FixedDelay(5, 1.0), clock=clock, sleep=clock.sleep)
    assert len(calls) == 1 and clock.slept == []
    assert "JdbcSinkOptionError: writeMode 'bogus'" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_failure_while_starting_is_restarted_like_one_while_running() -> None:
    clock = FakeClock()
    attempts: list[int] = []

    def start() -> StandInQuery:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("broker not reachable yet")
        return StandInQuery(clock)

    assert supervise(start, FixedDelay(1, 0.0), clock=clock, sleep=clock.sleep) == 1


def test_other_queries_of_the_job_are_stopped_when_one_fails() -> None:
    clock = FakeClock()
    runs: list[tuple[StandInQuery, StandInQuery]] = []

    def start() -> list[StandInQuery]:
        failing = StandInQuery(clock, TRANSIENT if not runs else None, runs_for=1.0)
        long_running = StandInQuery(clock, None, runs_for=100.0 if not runs else 1.0)
        runs.append((failing, long_running))
        return [failing, long_running]

    assert supervise(start, FixedDelay(1, 0.0), clock=clock, sleep=clock.sleep) == 1
    assert runs[0][1].stopped


def test_exponential_delay_doubles_up_to_its_maximum_and_resets_after_a_healthy_run() -> None:
    strategy = ExponentialDelay(initial=1.0, maximum=5.0, multiplier=2.0, reset_after=60.0)
    delays = [strategy.delay_after(failed_at=10.0, started_at=9.0) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert strategy.delay_after(failed_at=200.0, started_at=100.0) == 1.0  # up 100 s: reset
    assert strategy.delay_after(failed_at=201.0, started_at=200.5) == 2.0


def test_exponential_delay_bounds_restarts_in_a_row() -> None:
    strategy = ExponentialDelay(initial=1.0, maximum=5.0, attempts=2, reset_after=60.0)
    assert [strategy.delay_after(1.0, 0.0) for _ in range(3)] == [1.0, 2.0, None]
    assert strategy.delay_after(100.0, 0.0) == 1.0  # a healthy run: in a row again from 0


def test_failure_rate_refuses_when_too_many_failures_fall_in_the_interval() -> None:
    strategy = FailureRate(max_failures=2, interval=60.0, delay=5.0)
    assert strategy.delay_after(0.0, 0.0) == 5.0
    assert strategy.delay_after(10.0, 5.0) == 5.0
    assert strategy.delay_after(20.0, 15.0) is None  # three in 60 s
    fresh = FailureRate(max_failures=2, interval=60.0, delay=5.0)
    assert [fresh.delay_after(t, t) for t in (0.0, 50.0, 100.0, 150.0)] == [5.0] * 4


@pytest.mark.parametrize(
    "make",
    [
        lambda: FixedDelay(-1, 1.0),
        lambda: ExponentialDelay(initial=0.0, maximum=1.0),
        lambda: ExponentialDelay(initial=2.0, maximum=1.0),
        lambda: FailureRate(max_failures=0, interval=1.0, delay=1.0),
    ],
)
def test_bad_strategy_settings_fail_with_one_line(make) -> None:
    with pytest.raises(ValueError, match="^restart strategy: .* must be "):
        make()


def test_permanent_errors_are_told_by_name_or_spark_condition() -> None:
    assert is_permanent(PERMANENT)
    assert is_permanent(RuntimeError("[DATA_SOURCE_NOT_FOUND] Failed to find 2pc-jdbc"))
    assert is_permanent(RuntimeError("StateSchemaMismatchError: key_groups 8 != 16"))
    assert not is_permanent(TRANSIENT)
    assert not is_permanent(ConnectionError("connection reset by peer"))


def as_spark_reports(error_class: type[Exception], message: str) -> RuntimeError:
    """What the driver gets when a Python planner or worker raised ``error_class``."""
    return RuntimeError(
        "StreamingQueryException: [PYTHON_DATA_SOURCE_ERROR]\n"
        f"{error_class.__module__}.{error_class.__name__}: {message}"
    )


@pytest.mark.parametrize(
    ("error_class", "message"),
    [
        (KafkaSinkOptionError, "kafka.bootstrap.servers is required: set it to host:port"),
        (
            LedgerFencedError,
            "2pc-kafka sink s1: another process now writes this sink's decisions to"
            " eospack-ledger: this one stops; give each query its own sinkId (or none)",
        ),
        (
            KafkaSendError,
            "2pc-kafka could not write a record to topic out: MessageSizeTooLargeError: [Error"
            " 10] MessageSizeTooLargeError: a record (key, value and headers) must fit the"
            " topic's max.message.bytes and kafka.max.request.size",
        ),
    ],
)
def test_2pc_kafka_option_fenced_ledger_and_oversized_record_errors_stop_at_once(
    error_class: type[Exception], message: str
) -> None:
    """No restart fixes a bad 2pc-kafka option, nor a ledger another run took over (a
    restart would only fence that run in turn), nor a record larger than the topic takes
    (the replay sends it again); the supervisor used to retry them."""
    clock = FakeClock()
    start, calls = starts(clock, [as_spark_reports(error_class, message), None])
    with pytest.raises(PermanentQueryError) as caught:
        supervise(start, FixedDelay(5, 1.0), clock=clock, sleep=clock.sleep)
    assert len(calls) == 1 and clock.slept == []
    assert str(caught.value) == f"{error_class.__name__}: {message}"
    assert is_permanent(error_class(message))


def test_the_supervisor_module_does_not_import_kafka_python() -> None:
    """It names connector errors as text, so a job without Kafka never loads kafka-python."""
    code = (
        "import sys, eospack.tools.supervisor;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] == 'kafka'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]"


def test_durations_of_the_command_line() -> None:
    assert duration_seconds("500ms") == 0.5
    assert duration_seconds("10s") == 10.0
    assert duration_seconds("2min") == 120.0
    for bad in ("10", "ten s", "-1s", "3d"):
        with pytest.raises(Exception, match="is not a duration"):
            duration_seconds(bad)
