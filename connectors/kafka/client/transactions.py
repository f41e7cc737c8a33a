"""Kafka transactions that outlive the process that opened them: the groundwork of 2pc-kafka.

A task writes its rows in a transaction and leaves it open (``begin`` then ``prepare``);
another process, the driver, commits it later by its producer id and epoch
(``commit_prepared``), as Flink's KafkaSink resumes a transaction after a restart. Nothing
else can commit it, and ``fence`` (InitProducerId on the same transactional id) aborts it.

Pinned against Apache Kafka 4.3 with kafka-python 3.0 by
``integration_tests/kafka_sink/test_kafka_transactions.py``:

- a read_committed consumer sees none of a prepared transaction's records, then all of
  them once ``commit_prepared`` ran, in whatever process;
- ``commit_prepared`` again on a committed transaction succeeds (a lost answer is retried);
- after a fence, or after the broker aborted the transaction because it stayed open
  longer than its ``transaction.timeout.ms``, ``commit_prepared`` raises
  ``TransactionFencedError``: the records are gone, and the caller must say so loudly;
- ``open_transactions`` lists the ongoing ones under a prefix (ListTransactions).
- ending a transaction whose producer ``prepare`` closed fails at once (it cannot send);
  the transaction stays open for recovery to fence.

kafka-python has no public call to resume a transaction, so ``commit_prepared`` sends the
EndTxn request its transaction manager would send, through an admin client's connections
and coordinator lookup (private parts of kafka-python), which is why the tests above pin
this exact behaviour.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import errors as kafka_errors
from kafka.admin import TransactionState as BrokerTransactionState

from ..errors import TransactionFencedError
from .ride_through import (
    ATTEMPT_SECONDS,
    RIDE_THROUGH_SECONDS,
    Retry,
)

PREPARE_CLOSE_SECONDS = 30.0
"""How long ``prepare`` waits for the producer's last acknowledgements before closing."""
END_TIMEOUT_MS = 60_000
"""How long ending a transaction may take: kafka-python's own call waits forever."""
INIT_DEADLINE_SECONDS = 60.0
"""How long a task's ``initialised_producer`` keeps making producers anew before it fails."""
COMMIT_DEADLINE_MS = int(RIDE_THROUGH_SECONDS * 1000)
"""How long ``commit_prepared`` keeps trying to end a decided transaction: the driver's
ride-through of a broker loss (``ride_through``), retrying on each new coordinator."""
CONTROL_SETTINGS = {"retry_backoff_ms": 10}
"""For every transactional producer (a task's, the ledger's, the driver's control calls):
kafka-python's sender waits its retry backoff (100 ms) between the steps of one
transactional call (find the coordinator, then InitProducerId or EndTxn), which made each
begin or commit cost 0.22 s instead of 0.04 s. It also paces retried sends after a broker
error; ``delivery.timeout.ms`` still bounds them. A ``kafka.retry.backoff.ms`` option wins."""


@dataclass(frozen=True)
class PreparedTransaction:
    """What the committing process needs: written into commit messages and decisions."""

    transactional_id: str
    producer_id: int
    epoch: int
    records: int
    """A transaction without records was never registered on the broker: nothing to end."""

    def to_json(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "records": self.records,
        }

    @classmethod
    def from_json(cls, handle: Mapping[str, Any]) -> PreparedTransaction:
        return cls(
            str(handle["transactional_id"]),
            int(handle["producer_id"]),
            int(handle["epoch"]),
            int(handle["records"]),
        )


def begin(config: Mapping[str, Any], transactional_id: str) -> KafkaProducer:
    """A producer inside a new transaction of ``transactional_id``. Initialising fences
    (and aborts) whatever an earlier producer of this id left open."""
    producer = initialised_producer(config, transactional_id)
    try:
        producer.begin_transaction()
    except BaseException:
        producer.close(timeout=0)
        raise
    return producer


def initialised_producer(config: Mapping[str, Any], transactional_id: str) -> KafkaProducer:
    """A transactional producer of ``transactional_id``, initialised (InitProducerId).

    Riding through a coordinator that died (issue 37): kafka-python's producer made just
    after the kill keeps asking the dead coordinator until its ``max_block_ms`` (60 s by
    default) ends, and a task hung that long and failed its query; a producer made anew
    finds the new coordinator at once. So each attempt waits at most ``ATTEMPT_SECONDS``
    (or a smaller ``kafka.max.block.ms``), and a timed-out or disconnected attempt is
    closed and made again until ``INIT_DEADLINE_SECONDS`` (60 s, the old single wait) have
    passed; then the last failure is raised and Spark's task retry
    (``spark.task.maxFailures``) takes over. Nothing was sent yet: a new attempt is safe."""
    settings = {**CONTROL_SETTINGS, **config}
    attempt_ms = min(int(ATTEMPT_SECONDS * 1000), int(settings.get("max_block_ms", 60_000)))
    retry = Retry(time.monotonic(), deadline_seconds=INIT_DEADLINE_SECONDS)
    while True:
        producer = KafkaProducer(transactional_id=transactional_id, **settings)
        try:
            producer.config["max_block_ms"] = attempt_ms  # bounds init_transactions only
            producer.init_transactions()
            producer.config["max_block_ms"] = settings.get("max_block_ms", 60_000)
            return producer
        except (kafka_errors.KafkaTimeoutError, kafka_errors.KafkaConnectionError) as error:
            with contextlib.suppress(Exception):
                producer.close(timeout=0)
            delay = retry.next_delay(error, time.monotonic(), fenced=False)
            if delay is None:
                raise
            time.sleep(delay)
        except BaseException:
            with contextlib.suppress(Exception):
                producer.close(timeout=0)
            raise


def begin_again(producer: KafkaProducer) -> None:
    """Start a new transaction on a kept producer whose last one ``prepare`` left open
    (``producer_pool``): InitProducerId again, as a new producer of the id would, then
    begin. The coordinator ends whatever the id still has open first (the driver's commit
    normally did; a leftover is aborted) and answers a new epoch, so the new transaction
    can never join or be taken for the old one.

    kafka-python's transaction manager still believes the old transaction its own and
    open, and has no call to forget it: its state is set back to uninitialised here
    (private parts, pinned by
    ``integration_tests/kafka_sink/test_kafka_producer_reuse.py``). Refused while the
    producer still has anything in flight; the caller then makes a new one.
    One attempt of at most ``ATTEMPT_SECONDS``: a failure is raised and the caller closes
    this producer and makes a new one (``begin``, which rides through)."""
    from kafka.producer.transaction_manager import TransactionState

    manager = producer._transaction_manager
    with manager._lock:
        if (
            manager._pending_requests
            or manager.has_in_flight_transactional_request()
            or producer._accumulator.has_incomplete
        ):
            raise kafka_errors.IllegalStateError("the kept producer still has requests in flight")
        manager._current_state = TransactionState.UNINITIALIZED
        manager._last_error = None
        manager._transaction_started = False
        manager._new_partitions_in_transaction.clear()
        manager._pending_partitions_in_transaction.clear()
        manager._partitions_in_transaction.clear()
        manager._pending_txn_offset_commits.clear()
    producer._init_transactions_result = None
    block_ms = producer.config["max_block_ms"]
    producer.config["max_block_ms"] = min(int(ATTEMPT_SECONDS * 1000), int(block_ms))
    try:
        producer.init_transactions()
    finally:
        producer.config["max_block_ms"] = block_ms
    producer.begin_transaction()


def prepare(producer: KafkaProducer, records: int, close: bool = True) -> PreparedTransaction:
    """Flush the ``records`` sent in the open transaction, close the producer (unless
    ``close`` is false: it is kept for ``begin_again``) without ending the transaction, and
    return how to commit it. Raises what a send failed with."""
    producer.flush()
    identity = producer._transaction_manager.producer_id_and_epoch
    prepared = PreparedTransaction(
        producer.config["transactional_id"], identity.producer_id, identity.epoch, records
    )
    if close:
        producer.close(timeout=PREPARE_CLOSE_SECONDS)
    return prepared


FENCED_ERRORS = (
    kafka_errors.ProducerFencedError,
    kafka_errors.InvalidProducerEpochError,
    kafka_errors.InvalidTxnStateError,
    kafka_errors.InvalidProducerIdMappingError,
)
"""EndTxn answers meaning the transaction can no longer be committed by this epoch."""
RETRIED_ERRORS = (
    kafka_errors.ConcurrentTransactionsError,
    kafka_errors.CoordinatorLoadInProgressError,
    kafka_errors.NotCoordinatorError,
    kafka_errors.CoordinatorNotAvailableError,
)
"""EndTxn answers asking to try again (the last two after finding the coordinator again)."""
RETRIED_FAILURES = (
    kafka_errors.KafkaConnectionError,
    kafka_errors.NodeNotReadyError,
    kafka_errors.RequestTimedOutError,
    kafka_errors.KafkaTimeoutError,
    *RETRIED_ERRORS,
)
"""Failures of the lookup or the request itself (no answer) that a retry may get past."""


def commit_prepared(
    config: Mapping[str, Any],
    prepared: PreparedTransaction,
    admin: KafkaAdminClient | None = None,
) -> None:
    """Commit a transaction another producer left open: EndTxn(commit) with its producer
    id and epoch, sent to its transaction coordinator over ``admin`` (one client serves
    every piece of a commit; a new one is made and closed when none is given). Idempotent;
    raises ``TransactionFencedError`` when it was aborted instead.

    The request is the one kafka-python's transaction manager sends for
    ``commit_transaction`` (EndTxn up to v3, the pre-KIP-890 protocol), without a producer
    per piece: that cost ~40 ms of client start-up per piece in the driver."""
    if not prepared.records:
        return
    client = admin if admin is not None else admin_client(config)
    try:
        deadline = time.monotonic() + COMMIT_DEADLINE_MS / 1000
        client._manager.run(_end_transaction, client, prepared, True, deadline)
    finally:
        if admin is None:
            client.close()


def commit_prepared_together(
    prepared: list[PreparedTransaction], admin: KafkaAdminClient
) -> list[BaseException | None]:
    """Commit every one of ``prepared`` at once: each EndTxn is ``commit_prepared``'s
    (same request, same ride-through, same deadline), all in flight together on ``admin``'s
    one network loop, so a commit of N pieces costs one round trip instead of N (profiled:
    two sequential EndTxn 21 ms, together about half; more with more pieces).

    Returns, per transaction in order, None when it is committed or the failure that ended
    its tries (``TransactionFencedError`` when it was aborted instead): every transaction is
    tried to the end whatever happens to the others, so a failure never leaves a sibling
    half-tried, and the caller decides what to raise. Idempotent like ``commit_prepared``."""
    asked = [transaction for transaction in prepared if transaction.records]
    outcomes: dict[int, BaseException | None] = {}
    if asked:
        deadline = time.monotonic() + COMMIT_DEADLINE_MS / 1000
        results = admin._manager.run(_end_all, admin, asked, deadline)
        outcomes = {
            id(transaction): result for transaction, result in zip(asked, results, strict=True)
        }
    return [outcomes.get(id(transaction)) for transaction in prepared]


async def _end_all(
    admin: KafkaAdminClient, prepared: list[PreparedTransaction], deadline: float
) -> list[BaseException | None]:
    """Start an ``_end_transaction`` (commit) per transaction on the admin's loop, then wait
    for each: they run concurrently, each with its own coordinator lookup and retries."""
    manager = admin._manager
    futures = [
        manager.call_soon(_end_transaction, admin, transaction, True, deadline)
        for transaction in prepared
    ]
    results: list[BaseException | None] = []
    for future in futures:
        try:
            await future
            results.append(None)
        except Exception as failure:
            results.append(failure)
    return results


async def _end_transaction(
    admin: KafkaAdminClient, prepared: PreparedTransaction, commit: bool, deadline: float
) -> None:
    """EndTxn until the coordinator answers for good or ``deadline`` passes (the commit
    path's ride-through: ``ride_through.RIDE_THROUGH_SECONDS``). Each try finds the
    coordinator again (a broker that died is replaced by another within seconds) and waits
    at most the client's ``request_timeout_ms`` for an answer, so a request lost with its
    broker is sent again to the new coordinator instead of waiting out the deadline. A
    connection that fails, a node not ready or a coordinator not known yet are retried like
    the retried answers, backing off to 2 s; ending again is idempotent. A timeout is never
    taken for a fence: past the deadline it raises ``KafkaTimeoutError`` naming the last
    failure."""
    from kafka.protocol.metadata import CoordinatorType
    from kafka.protocol.producer.transaction import EndTxnRequest

    manager = admin._manager
    transactional_id = prepared.transactional_id
    key = (CoordinatorType.TRANSACTION, transactional_id)
    request_timeout_ms = int(admin.config.get("request_timeout_ms") or 30_000)
    started = time.monotonic()
    retry = Retry(started, deadline_seconds=max(0.0, deadline - started))
    last_failure: str = "no answer"
    while True:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise kafka_errors.KafkaTimeoutError(
                f"ending transaction {transactional_id} took over"
                f" {time.monotonic() - started:.0f} s: the broker did not answer"
                f" (last: {last_failure})"
            )
        try:
            lookup = manager.call_soon(
                admin._find_coordinator_id, transactional_id, CoordinatorType.TRANSACTION
            )
            coordinator = await manager.wait_for(lookup, min(left_ms, request_timeout_ms))
            request = EndTxnRequest(
                transactional_id=transactional_id,
                producer_id=prepared.producer_id,
                producer_epoch=prepared.epoch,
                committed=commit,
                max_version=3,
            )
            left_ms = max(1, int((deadline - time.monotonic()) * 1000))
            response = await manager.send(
                request, node_id=coordinator, request_timeout_ms=min(left_ms, request_timeout_ms)
            )
        except kafka_errors.KafkaError as failure:
            if not isinstance(failure, RETRIED_FAILURES) and not failure.retriable:
                raise
            last_failure = f"{type(failure).__name__}: {failure}"
            manager.cluster._coordinators.pop(key, None)
            await admin._net.sleep(retry.next_delay(failure, time.monotonic(), fenced=False) or 0)
            continue
        error = kafka_errors.for_code(response.error_code)
        if error is kafka_errors.NoError:
            return
        if issubclass(error, FENCED_ERRORS):
            raise TransactionFencedError(
                f"transaction {transactional_id} (producer {prepared.producer_id},"
                f" epoch {prepared.epoch}) cannot be committed: {error.__name__}; it was"
                " aborted (fenced, or open longer than transaction.timeout.ms)"
            )
        if not issubclass(error, RETRIED_ERRORS):
            raise error(f"EndTxn of transaction {transactional_id}")
        last_failure = error.__name__
        if issubclass(
            error, (kafka_errors.NotCoordinatorError, kafka_errors.CoordinatorNotAvailableError)
        ):
            manager.cluster._coordinators.pop(key, None)
        await admin._net.sleep(0.02)


def end_transaction(
    producer: KafkaProducer, commit: bool, timeout_ms: int = END_TIMEOUT_MS
) -> None:
    """Commit (or abort) the producer's transaction, waiting at most ``timeout_ms``: a
    broker that stopped answering raises ``KafkaTimeoutError`` instead of hanging the
    caller (the ledger waits one attempt, then reopens with a fresh coordinator lookup).
    Ending again later is safe (the outcome is idempotent). A closed producer (``prepare``
    closes it) can send nothing: that fails at once."""
    if producer._closed:
        raise kafka_errors.KafkaError(
            f"the producer of transaction {producer.config['transactional_id']} is closed:"
            " it cannot end the transaction (recovery fences it)"
        )
    manager = producer._transaction_manager
    result = manager.begin_commit() if commit else manager.begin_abort()
    producer._sender.wakeup()
    if not result.wait(timeout_ms=timeout_ms):
        cause = producer._transaction_manager.last_error
        raise kafka_errors.KafkaTimeoutError(
            f"ending transaction {producer.config['transactional_id']} took over"
            f" {timeout_ms / 1000:.0f} s: the broker did not answer"
            + (f" (last error: {type(cause).__name__})" if cause is not None else "")
        )


def fence(config: Mapping[str, Any], transactional_id: str) -> None:
    """Abort whatever ``transactional_id`` left open, and refuse its old epoch from now on.
    A failure raises what InitProducerId failed with, never a failure of the close after it
    (kafka-python's ``close(timeout=0)`` can raise a flush timeout of its own)."""
    producer = initialised_producer(config, transactional_id)
    with contextlib.suppress(Exception):
        producer.close(timeout=0)


def open_transactions(config: Mapping[str, Any], prefix: str) -> list[str]:
    """The transactional ids under ``prefix`` whose transaction is open (Ongoing), sorted."""
    admin = admin_client(config)
    try:
        listed = admin.list_transactions(state_filters=["Ongoing"])
    finally:
        admin.close()
    return sorted(
        listing.transactional_id
        for listings in listed.values()
        for listing in listings
        if listing.transactional_id.startswith(prefix)
    )


def lost_transactions(
    config: Mapping[str, Any],
    prepared: list[PreparedTransaction],
    admin: KafkaAdminClient | None = None,
) -> list[PreparedTransaction]:
    """The ones of ``prepared`` that can no longer be committed: their transaction is not
    open any more under the producer id and epoch that prepared it (DescribeTransactions:
    the broker aborted it after its timeout, someone fenced it, or it was never begun), or
    is too close to its timeout (``deadline_margin_ms``; measured against the broker's start
    time with this machine's clock).
    Transactions without records were never registered and are never lost."""
    asked = [transaction for transaction in prepared if transaction.records]
    if not asked:
        return []
    client = admin if admin is not None else admin_client(config)
    try:
        described = client.describe_transactions(
            sorted({transaction.transactional_id for transaction in asked})
        )
    except kafka_errors.TransactionalIdNotFoundError:
        return asked
    finally:
        if admin is None:
            client.close()
    lost = []
    now_ms = time.time() * 1000
    for transaction in asked:
        state = described.get(transaction.transactional_id)
        alive = (
            state is not None
            and state.state == BrokerTransactionState.ONGOING
            and state.producer_id == transaction.producer_id
            and state.producer_epoch == transaction.epoch
            and now_ms - state.transaction_start_time_ms
            < state.transaction_timeout_ms - deadline_margin_ms(state.transaction_timeout_ms)
        )
        if not alive:
            lost.append(transaction)
    return lost


def open_epochs(
    admin: KafkaAdminClient, transactional_ids: list[str]
) -> dict[str, tuple[int, int]]:
    """Producer id and epoch of each of ``transactional_ids`` whose transaction is open
    (DescribeTransactions); an id the broker does not know or whose transaction ended is
    left out."""
    if not transactional_ids:
        return {}
    try:
        described = admin.describe_transactions(sorted(set(transactional_ids)))
    except kafka_errors.TransactionalIdNotFoundError:
        described = {}
        for name in transactional_ids:  # one unknown id fails the whole request
            with contextlib.suppress(kafka_errors.TransactionalIdNotFoundError):
                described.update(admin.describe_transactions([name]))
    return {
        name: (state.producer_id, state.producer_epoch)
        for name, state in described.items()
        if state.state == BrokerTransactionState.ONGOING
    }


def deadline_margin_ms(timeout_ms: int) -> int:
    """How long before its timeout a transaction counts as lost already. Past its timeout a
    transaction is lost even while the broker still says Ongoing (its sweep of expired
    transactions runs every 10 s); the margin covers the decision and the commits that
    follow the check (a tenth of the timeout, at most 5 s)."""
    return min(timeout_ms // 10, 5_000)


def consumer_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``config`` that a consumer takes: the sink's ``kafka.*`` options are
    producer settings, and KafkaConsumer refuses the producer-only ones
    (``compression_type``, ``linger_ms``, ...) and timeouts a producer accepts but a
    consumer does not in combination (it needs ``fetch_max_wait_ms < request_timeout_ms <
    connections_max_idle_ms``): the request timeout given is kept, the other two are fitted
    around it."""
    settings = {key: value for key, value in config.items() if key in KafkaConsumer.DEFAULT_CONFIG}
    defaults = KafkaConsumer.DEFAULT_CONFIG
    request_timeout = int(settings.get("request_timeout_ms", defaults["request_timeout_ms"]))
    idle = int(settings.get("connections_max_idle_ms", defaults["connections_max_idle_ms"]))
    settings["connections_max_idle_ms"] = max(idle, request_timeout + 1000)
    fetch_wait = int(settings.get("fetch_max_wait_ms", defaults["fetch_max_wait_ms"]))
    settings["fetch_max_wait_ms"] = max(1, min(fetch_wait, request_timeout // 2))
    return settings


def admin_client(config: Mapping[str, Any]) -> KafkaAdminClient:
    """An admin client with the settings of ``config`` that an admin client takes."""
    return KafkaAdminClient(
        **{key: value for key, value in config.items() if key in KafkaAdminClient.DEFAULT_CONFIG}
    )
