"""When the 2pc-kafka driver retries a broker call, and for how long: riding through the loss
of a broker (issue 37).

A transaction coordinator, a partition leader or a whole broker can go away at any moment: a
rolling restart takes each broker down once, a crash for minutes. Its duties move to another
broker within seconds (``broker.session.timeout.ms`` plus a leader election), so the driver's
commit steps (the ledger's reads and writes, each piece's EndTxn) are retried until
``RIDE_THROUGH_SECONDS`` have passed, and only then fail the query, with the failure that
caused it. Spark's own Kafka sink and Flink's ride through the same way.

The deadline, decided: 300 s (5 min). Long enough for a broker restart, a controller
failover and the reload of a transaction log partition with room to spare; short enough
that a cluster that is really gone fails the query within minutes, and far inside the task
transactions' default ``kafka.transaction.timeout.ms`` (15 min), so pieces decided before a
long ride-through can still be committed after it. A decision is never written after a
retry without checking its pieces again (``KafkaResource.record_decision``).

What is retried: every failure of the Kafka client that a change of brokers explains
(a connection lost or refused, a timeout, a coordinator or leader not available or moved,
too few replicas in sync). What is not: what no broker change cures (authentication,
authorisation, an invalid or unsupported request), failures of the program itself (any
exception that is no Kafka failure), and a fence by another process seen twice in a row (a
live process keeps taking the sink over: see ``ledger``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kafka import errors as kafka_errors

from ..errors import KafkaAuthenticationError

Result = TypeVar("Result")
logger = logging.getLogger(__name__)

RIDE_THROUGH_SECONDS = 300.0
"""How long one commit step keeps retrying a broker that is gone (see the module doc)."""
FIRST_DELAY_SECONDS = 0.1
MAX_DELAY_SECONDS = 2.0
"""Retries back off from 0.1 s, doubling, to at most 2 s: a moved coordinator is found
within a few tenths of a second, a broker down for minutes is asked every 2 s."""
ATTEMPT_SECONDS = 10.0
"""How long one attempt of a ledger step may wait for the broker before it is abandoned and
the ledger reopened (a fresh coordinator lookup; kafka-python's producer keeps asking a
coordinator that died): a ledger transaction lives at most its 10 s timeout
(``ledger.LEDGER_TRANSACTION_TIMEOUT_MS``), so waiting longer on it serves nothing."""

NOT_RETRIED = (
    KafkaAuthenticationError,
    kafka_errors.SaslAuthenticationFailedError,
    kafka_errors.AuthorizationError,
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.TransactionalIdAuthorizationFailedError,
    kafka_errors.InvalidTransactionTimeoutError,
    kafka_errors.UnsupportedVersionError,
    kafka_errors.IncompatibleBrokerVersion,
)
"""Kafka failures that no broker change cures: retrying them only delays the real error."""
RETRIED = (
    kafka_errors.KafkaConnectionError,
    kafka_errors.NodeNotReadyError,
    kafka_errors.KafkaTimeoutError,
    kafka_errors.RequestTimedOutError,
    kafka_errors.NotCoordinatorError,
    kafka_errors.CoordinatorNotAvailableError,
    kafka_errors.CoordinatorLoadInProgressError,
    kafka_errors.ConcurrentTransactionsError,
    kafka_errors.NotLeaderForPartitionError,
    kafka_errors.LeaderNotAvailableError,
    kafka_errors.NotEnoughReplicasError,
    kafka_errors.NotEnoughReplicasAfterAppendError,
)
"""Kafka failures a broker going away causes (besides any error the client marks retriable)."""


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a failure a broker change explains: see the
    module doc. A plain ``KafkaError`` (kafka-python raises one about its transaction's error
    state after a failed send) is retried unless its cause is one that is not retried."""
    chain = _causes(error)
    if any(isinstance(cause, NOT_RETRIED) for cause in chain):
        return False
    for cause in chain:
        if isinstance(cause, RETRIED) or getattr(cause, "retriable", False):
            return True
        if type(cause) is kafka_errors.KafkaError:
            return True
        if isinstance(cause, (ConnectionError, TimeoutError)):
            return True
        if getattr(cause, "transient", False):  # e.g. ledger.LedgerReadTimeoutError
            return True
    return False


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or during, innermost last."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


@dataclass
class Retry:
    """The retry state of one commit step: when it started, how often it failed, how many
    fences in a row it saw. ``next_delay`` says whether to try again, after how long."""

    started: float
    deadline_seconds: float = RIDE_THROUGH_SECONDS
    failures: int = 0
    fences: int = 0

    def next_delay(self, error: BaseException, now: float, *, fenced: bool) -> float | None:
        """The wait before the next attempt after ``error`` at ``now``, or None: give up and
        raise ``error``. A fence (another process opened the ledger) is retried at once,
        once: a second in a row means a live process keeps taking the sink over. Anything
        else is retried if transient, until the deadline (a wait never ends past it)."""
        self.failures += 1
        if fenced:
            self.fences += 1
            return 0.0 if self.fences == 1 else None
        self.fences = 0
        if not is_transient(error):
            return None
        left = self.started + self.deadline_seconds - now
        if left <= 0:
            return None
        delay = min(MAX_DELAY_SECONDS, FIRST_DELAY_SECONDS * 2 ** (self.failures - 1))
        return min(delay, left)


def asked_again(
    what: str, action: Callable[[], Result], deadline_seconds: float, sink_name: str
) -> Result:
    """Run ``action``, a query-start broker call that is safe to repeat and makes its own
    clients, again after a transient failure until ``deadline_seconds`` have passed (the
    client's request timeout): a restart while one broker is down found the dead node in
    the bootstrap metadata and failed its query at start. A failure no broker change cures
    (a refused login, a denied ACL) is raised at once."""
    retry = Retry(time.monotonic(), deadline_seconds=deadline_seconds)
    while True:
        try:
            return action()
        except Exception as error:
            delay = retry.next_delay(error, time.monotonic(), fenced=False)
            if delay is None:
                raise
            logger.warning(
                "%s: %s failed (%s: %s); asking again in %.1f s",
                sink_name,
                what,
                type(error).__name__,
                " ".join(str(error).split())[:300],
                delay,
            )
            time.sleep(delay)
