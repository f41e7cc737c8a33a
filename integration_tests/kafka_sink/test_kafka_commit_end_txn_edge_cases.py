"""Attacks on 02647a4: ``commit_prepared`` ends a prepared transaction with its own EndTxn
(v3) over the commit's admin client instead of a transactional producer per piece.

Each test states what exactly-once (or the commit's liveness) needs of that EndTxn path:
a retried EndTxn whose first answer was lost must commit once and not report the batch
lost; a transaction the broker aborted by timeout must never be reported committed; an
admin client kept across a broker restart must still commit; an unanswering broker must
not hold the commit past ``END_TIMEOUT_MS``. Brokers that are paused or restarted are
private to this module (the session's broker is shared).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.admin import TransactionState as BrokerTransactionState

from eospack.connectors.kafka.client import transactions
from eospack.connectors.kafka.client.transactions import (
    PreparedTransaction,
    _end_transaction,
    admin_client,
    begin,
    commit_prepared,
    lost_transactions,
    prepare,
)
from eospack.connectors.kafka.errors import TransactionFencedError
from eospack.lab.services.apache_kafka import ApacheKafka
from eospack.lab.services.kafka_tools import create_topic, read_all
from eospack.lab.testing import wait_until

pytestmark = pytest.mark.integration


class FastAbortKafka(ApacheKafka):
    """A private Apache Kafka whose timed-out transactions are aborted within ~0.5 s
    (the default check runs every 10 s)."""

    def _server_properties(self) -> str:
        return super()._server_properties() + (
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=300\n"
        )


@pytest.fixture(scope="module")
def private_kafka(kafka: Any) -> Iterator[ApacheKafka]:
    if kafka.endpoint.kind != "kafka":
        pytest.skip("needs Apache Kafka (the session broker is tansu)")
    broker = FastAbortKafka()
    try:
        yield broker
    finally:
        broker.stop()


def answers(broker: ApacheKafka) -> bool:
    """Whether the broker is back (registered, unfenced) after a pause."""
    try:
        return broker._answers_metadata()
    except kafka_errors.KafkaError:
        return False


def committed_values(bootstrap: str, topic: str) -> list[str]:
    rows = read_all(bootstrap, topic, isolation_level="read_committed")
    return sorted((value or b"").decode() for _, _, _, value in rows)


def prepare_records(
    config: dict[str, Any], topic: str, transactional_id: str, records: int, **producer: Any
) -> PreparedTransaction:
    """A transaction of ``records`` records left open by a closed producer (a task's
    prepare)."""
    handle = begin({**config, **producer}, transactional_id)
    for index in range(records):
        handle.send(topic, value=f"{transactional_id}:{index}".encode())
    return prepare(handle, records)


def broker_state(admin: KafkaAdminClient, prepared: PreparedTransaction) -> Any:
    """The coordinator's state of the prepared transaction (DescribeTransactions)."""
    described = admin.describe_transactions([prepared.transactional_id])
    return described[prepared.transactional_id].state


def expected_values(transactional_id: str, records: int) -> list[str]:
    return sorted(f"{transactional_id}:{index}" for index in range(records))


@pytest.mark.timeout(120)
def test_an_end_txn_applied_but_unanswered_then_retried_over_the_same_admin_commits_once(
    real_kafka: Any, unique_name: str
) -> None:
    """The first EndTxn reaches the coordinator and commits; its answer is lost (simulated
    by sending exactly the request ``commit_prepared`` sends, and dropping its outcome); the
    retry over the same admin client must succeed, not raise TransactionFencedError
    (which ``commit_piece`` turns into DecidedPieceLostError for a committed batch)."""
    bootstrap = real_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    create_topic(bootstrap, unique_name, 1)
    prepared = prepare_records(config, unique_name, f"{unique_name}-1", 7)
    admin = admin_client(config)
    try:
        assert lost_transactions(config, [prepared], admin) == []
        admin._manager.run(
            _end_transaction, admin, prepared, True, time.monotonic() + 30
        )  # applied; its answer "lost"
        for _ in range(3):
            commit_prepared(config, prepared, admin)
    finally:
        admin.close()
    assert committed_values(bootstrap, unique_name) == expected_values(f"{unique_name}-1", 7)


@pytest.mark.timeout(120)
def test_a_commit_after_the_broker_aborted_the_transaction_by_timeout_is_fenced(
    private_kafka: ApacheKafka, unique_name: str
) -> None:
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    create_topic(bootstrap, unique_name, 1)
    prepared = prepare_records(
        config, unique_name, f"{unique_name}-1", 3, transaction_timeout_ms=1_000
    )
    admin = admin_client(config)
    try:
        wait_until(
            lambda: broker_state(admin, prepared) != BrokerTransactionState.ONGOING,
            timeout=30,
            description="the broker to abort the timed-out transaction",
        )
        with pytest.raises(TransactionFencedError, match="it was aborted"):
            commit_prepared(config, prepared, admin)
    finally:
        admin.close()
    assert committed_values(bootstrap, unique_name) == []


@pytest.mark.timeout(240)
def test_a_commit_racing_the_brokers_timeout_abort_reports_what_the_broker_did(
    private_kafka: ApacheKafka, unique_name: str
) -> None:
    """Commit at random moments around the transaction timeout: whatever EndTxn answers
    (ConcurrentTransactions while the abort is being written, then InvalidTxnState or
    ProducerFenced), a commit that returns must have committed, and a fenced one must
    have committed nothing."""
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    chooser = random.Random(seed)
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    admin = admin_client(config)
    outcomes: list[str] = []
    try:
        for round_number in range(8):
            topic = f"{unique_name}-{round_number}"
            create_topic(bootstrap, topic, 1)
            prepared = prepare_records(config, topic, f"{topic}-t", 2, transaction_timeout_ms=800)
            threading.Event().wait(chooser.uniform(0.5, 1.6))  # a moment near the timeout
            try:
                commit_prepared(config, prepared, admin)
            except TransactionFencedError:
                outcomes.append("fenced")
                assert committed_values(bootstrap, topic) == [], (seed, round_number)
            else:
                outcomes.append("committed")
                assert committed_values(bootstrap, topic) == expected_values(f"{topic}-t", 2), (
                    seed,
                    round_number,
                )
    finally:
        admin.close()
    print(outcomes)


@pytest.mark.timeout(180)
def test_an_admin_kept_across_a_broker_restart_still_commits(
    private_kafka: ApacheKafka, unique_name: str
) -> None:
    """KafkaResource keeps one admin client for every piece of a commit. The broker
    restarts between the liveness check and the piece commits: the commit that starts
    while it is down must wait for it within COMMIT_DEADLINE_MS, as the per-piece producer
    did (its sender waited for the coordinator), instead of failing the decided batch's
    commit at once with a connection error (NodeNotReadyError, KafkaConnectionError) that
    the EndTxn loop does not retry."""
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    create_topic(bootstrap, unique_name, 1)
    prepared = prepare_records(config, unique_name, f"{unique_name}-1", 4)
    admin = admin_client(config)
    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            commit_prepared(config, prepared, admin)
        except BaseException as error:
            outcome.append(error)
        else:
            outcome.append(None)

    try:
        assert lost_transactions(config, [prepared], admin) == []
        private_kafka.kill()
        committer = threading.Thread(target=commit)
        committer.start()
        private_kafka.start()
        committer.join(timeout=transactions.COMMIT_DEADLINE_MS / 1000 + 10)
        assert not committer.is_alive(), "commit_prepared outlived COMMIT_DEADLINE_MS"
    finally:
        admin.close()
    assert outcome == [None], f"the commit failed while the broker restarted: {outcome[0]!r}"
    wait_for_committed_records(private_kafka, unique_name, prepared)


@pytest.mark.timeout(180)
def test_a_commit_against_a_broker_that_stopped_answering_ends_by_end_timeout(
    private_kafka: ApacheKafka, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``COMMIT_DEADLINE_MS`` is the bound the module promises for committing a transaction; the
    EndTxn path checks it only between answers, so one unanswered request waits the
    admin client's request_timeout_ms (30 s by default, any ``kafka.request.timeout.ms``
    a user sets) instead."""
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    create_topic(bootstrap, unique_name, 1)
    prepared = prepare_records(config, unique_name, f"{unique_name}-1", 2)
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_MS", 3_000)
    admin = admin_client(config)
    started = 0.0
    elapsed = 0.0
    try:
        assert lost_transactions(config, [prepared], admin) == []
        private_kafka.pause()
        started = time.monotonic()
        with pytest.raises(kafka_errors.KafkaError):
            commit_prepared(config, prepared, admin)
        elapsed = time.monotonic() - started
    finally:
        private_kafka.resume()
        admin.close()
        wait_until(private_kafka._answers_metadata, timeout=60, description="the resumed broker")
    print(f"commit against a paused broker ended after {elapsed:.1f} s")
    assert elapsed < 3.0 + 2.0, f"commit_prepared took {elapsed:.1f} s, COMMIT_DEADLINE_MS is 3 s"


def transaction_version(admin: KafkaAdminClient) -> int:
    feature = admin.describe_features().get("transaction.version", {})
    return int(feature.get("finalized", (0, 0))[1])


@pytest.mark.timeout(180)
def test_end_txn_v3_commits_once_and_is_fenced_after_a_timeout_on_transaction_version_2(
    private_kafka: ApacheKafka, unique_name: str
) -> None:
    """KIP-890 (transaction.version=2) bumps epochs at the end of transactions of clients
    that speak EndTxn v5+; kafka-python's producer and ``commit_prepared`` speak v3. On a
    TV2 cluster the EndTxn path must still commit a prepared transaction exactly once
    (a retried commit succeeds) and be fenced after the broker's timeout abort."""
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    admin = admin_client(config)
    try:
        if transaction_version(admin) < 2:
            admin.update_features({"transaction.version": 2})
            wait_until(
                lambda: transaction_version(admin) == 2,
                timeout=30,
                description="transaction.version=2 to be finalized",
            )
        print(f"transaction.version: {admin.describe_features()['transaction.version']}")
        create_topic(bootstrap, unique_name, 1)
        committed = prepare_records(config, unique_name, f"{unique_name}-1", 5)
        assert lost_transactions(config, [committed], admin) == []
        admin._manager.run(_end_transaction, admin, committed, True, time.monotonic() + 30)
        commit_prepared(config, committed, admin)
        commit_prepared(config, committed, admin)

        expired = prepare_records(
            config, unique_name, f"{unique_name}-2", 3, transaction_timeout_ms=1_000
        )
        wait_until(
            lambda: broker_state(admin, expired) != BrokerTransactionState.ONGOING,
            timeout=30,
            description="the broker to abort the timed-out transaction",
        )
        with pytest.raises(TransactionFencedError, match="it was aborted"):
            commit_prepared(config, expired, admin)
    finally:
        admin.close()
    assert committed_values(bootstrap, unique_name) == expected_values(f"{unique_name}-1", 5)


@pytest.mark.timeout(180)
def test_a_commit_applied_before_a_broker_restart_is_retried_idempotently_after_it(
    private_kafka: ApacheKafka, unique_name: str
) -> None:
    """EndTxn applied, its answer lost, then the broker restarts before the retry: the
    coordinator reloads the transaction from its log, and the retry (a new commit's new
    admin client) must succeed rather than report the batch lost."""
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    create_topic(bootstrap, unique_name, 1)
    prepared = prepare_records(config, unique_name, f"{unique_name}-1", 3)
    first = admin_client(config)
    try:
        first._manager.run(_end_transaction, first, prepared, True, time.monotonic() + 30)
    finally:
        first.close()
    private_kafka.kill()
    private_kafka.start()
    commit_prepared(config, prepared)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        assert broker_state(admin, prepared) is BrokerTransactionState.COMPLETE_COMMIT
    finally:
        admin.close()
    wait_for_committed_records(private_kafka, unique_name, prepared)


def wait_for_committed_records(
    broker: ApacheKafka, topic: str, prepared: PreparedTransaction
) -> None:
    """Wait until a read_committed consumer sees exactly the prepared records (markers are
    written after EndTxn is answered). Records that never appear fail the test unless the
    broker logged that it skipped their markers: Kafka's own race, an expected failure."""
    expected = expected_values(prepared.transactional_id, prepared.records)
    seen: list[list[str]] = []

    def settled() -> bool:
        seen.append(committed_values(broker.endpoint.bootstrap_servers, topic))
        return seen[-1] == expected or broker_skipped_markers(broker, prepared.transactional_id)

    wait_until(settled, timeout=30, description="the committed records")
    if seen[-1] != expected:
        pytest.xfail(
            "Kafka's own race: the restarted coordinator completed the commit but skipped"
            " its markers (the partition's leader was not in its metadata yet), so the"
            " records stay invisible to read_committed; our retried EndTxn was answered"
        )


def broker_skipped_markers(broker: ApacheKafka, transactional_id: str) -> bool:
    """Whether the broker's log says its transaction coordinator skipped the markers of
    ``transactional_id`` (Kafka 4.3 takes a partition whose leader its metadata cache does
    not know yet, right after a restart, for a deleted one)."""
    skipped = "Couldn't find leader endpoint for partitions"
    return any(
        skipped in line and transactional_id in line
        for line in broker.log_file.read_text(errors="replace").splitlines()
    )


@pytest.mark.timeout(120)
def test_a_closed_resource_leaves_no_admin_thread(real_kafka: Any, unique_name: str) -> None:
    """KafkaResource's kept admin client must not outlive ``close()`` (a commit's
    resource is closed in a ``finally``, on error paths too)."""
    from eospack.connectors.kafka.sink.options import parse_options
    from eospack.connectors.kafka.sink.resource import KafkaResource

    options = parse_options(
        {"kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers, "topic": unique_name}
    )
    before = {thread.ident for thread in threading.enumerate()}
    for _ in range(3):
        resource = KafkaResource(options)
        resource.admin().describe_cluster()
        resource.close()
    wait_until(
        lambda: {thread.ident for thread in threading.enumerate()} <= before,
        timeout=10,
        description="the admin clients' threads to end",
    )


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_commit_with_a_long_request_timeout_ends_by_the_unpatched_end_timeout(
    private_kafka: ApacheKafka, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same hole with a deadline shorter than the request timeout: a sink given
    ``kafka.request.timeout.ms=90000`` (its admin client takes it) waited 90 s on a broker
    that stopped answering. (The commit's own deadline is the 5-minute ride-through,
    ``COMMIT_DEADLINE_MS``; 10 s here keeps the test short.)"""
    monkeypatch.setattr(transactions, "COMMIT_DEADLINE_MS", 10_000)
    bootstrap = private_kafka.endpoint.bootstrap_servers
    config = {"bootstrap_servers": bootstrap}
    create_topic(bootstrap, unique_name, 1)
    prepared = prepare_records(config, unique_name, f"{unique_name}-1", 2)
    slow = {**config, "request_timeout_ms": 90_000}
    admin = admin_client(slow)
    elapsed = 0.0
    try:
        assert lost_transactions(slow, [prepared], admin) == []
        private_kafka.pause()
        started = time.monotonic()
        with pytest.raises(kafka_errors.KafkaError):
            commit_prepared(slow, prepared, admin)
        elapsed = time.monotonic() - started
    finally:
        private_kafka.resume()
        admin.close()
        wait_until(private_kafka._answers_metadata, timeout=60, description="the resumed broker")
    limit = transactions.COMMIT_DEADLINE_MS / 1000
    assert elapsed < limit + 2.0, f"commit_prepared took {elapsed:.1f} s, deadline {limit} s"
