"""The pure logic of 2pc-kafka's ride-through of a broker loss (issue 37): which failures are
retried and for how long, how a ledger step is retried on a ledger opened afresh (a write
whose answer was lost is read back, never written twice), and the warning about a ledger
topic weaker than the sink creates it. Against real brokers:
``integration_tests/kafka_sink/test_kafka_ride_through.py``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka import errors as kafka_errors

from eospack.commit_protocols.pieces import DECIDED, DONE, BatchDecision, PreparedPiece
from eospack.connectors.kafka.client.ride_through import (
    MAX_DELAY_SECONDS,
    RIDE_THROUGH_SECONDS,
    Retry,
    is_transient,
)
from eospack.connectors.kafka.errors import (
    KafkaAuthenticationError,
    LedgerFencedError,
    LedgerReadTimeoutError,
    PreparedTransactionLostError,
)
from eospack.connectors.kafka.sink import resource as resource_module
from eospack.connectors.kafka.sink.ledger import ledger_topic_durability, ledger_topic_settings
from eospack.connectors.kafka.sink.options import parse_options
from eospack.connectors.kafka.sink.resource import KafkaResource

# What is retried ---------------------------------------------------------------------


def caused_by(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (kafka_errors.KafkaConnectionError("ECONNREFUSED"), True),
        (kafka_errors.KafkaTimeoutError("ending transaction took over 10 s"), True),
        (kafka_errors.NodeNotReadyError(), True),
        (kafka_errors.NotCoordinatorError(), True),
        (kafka_errors.CoordinatorNotAvailableError(), True),
        (kafka_errors.NotEnoughReplicasError(), True),
        (kafka_errors.KafkaError("Cannot execute transactional method"), True),
        (LedgerReadTimeoutError("could not read the ledger topic"), True),
        (ConnectionResetError(), True),
        (kafka_errors.TopicAuthorizationFailedError(), False),
        (kafka_errors.TransactionalIdAuthorizationFailedError(), False),
        (KafkaAuthenticationError("2pc-kafka: Kafka at ... refused the password"), False),
        (
            caused_by(
                kafka_errors.KafkaError("error state"),
                kafka_errors.TransactionalIdAuthorizationFailedError(),
            ),
            False,
        ),
        (PreparedTransactionLostError("the transactions ended before the decision"), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_only_failures_a_broker_change_explains_are_retried(
    error: BaseException, transient: bool
) -> None:
    assert is_transient(error) is transient


def test_retries_back_off_to_two_seconds_and_stop_at_the_deadline() -> None:
    retry = Retry(started=100.0)
    lost = kafka_errors.KafkaConnectionError("ECONNREFUSED")
    delays = [retry.next_delay(lost, 101.0, fenced=False) for _ in range(8)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, MAX_DELAY_SECONDS, 2.0, 2.0]
    assert retry.next_delay(lost, 100.0 + RIDE_THROUGH_SECONDS - 0.5, fenced=False) == 0.5
    assert retry.next_delay(lost, 100.0 + RIDE_THROUGH_SECONDS, fenced=False) is None


def test_a_failure_no_broker_change_cures_is_not_retried() -> None:
    retry = Retry(started=0.0)
    assert retry.next_delay(kafka_errors.TopicAuthorizationFailedError(), 1.0, fenced=False) is None


def test_a_fence_is_retried_once_and_a_second_fence_in_a_row_gives_up() -> None:
    retry = Retry(started=0.0)
    fence = LedgerFencedError("another process now writes this sink's decisions")
    assert retry.next_delay(fence, 1.0, fenced=True) == 0.0
    assert retry.next_delay(fence, 1.0, fenced=True) is None
    again = Retry(started=0.0)
    assert again.next_delay(fence, 1.0, fenced=True) == 0.0
    assert again.next_delay(kafka_errors.KafkaTimeoutError(), 1.0, fenced=False) == 0.2
    assert again.next_delay(fence, 1.0, fenced=True) == 0.0, "not two fences in a row"


# A ledger step retried on a ledger opened afresh ---------------------------------------


@dataclass
class Topic:
    """The ledger topic as the broker holds it: what a freshly opened ledger reads."""

    slots: dict[int, BatchDecision] = field(default_factory=dict)
    failures: list[tuple[str, BaseException]] = field(default_factory=list)
    """Failures to inject, in order: (when, error) with when "before" (not applied) or
    "after" (applied, its answer lost)."""
    writes: list[BatchDecision] = field(default_factory=list)
    opened: int = 0
    closed: int = 0


class FakeLedger:
    def __init__(self, topic: Topic) -> None:
        self.topic = topic
        self.slots = dict(topic.slots)
        self.lock = threading.RLock()
        topic.opened += 1

    def write(self, slot: BatchDecision) -> BatchDecision:
        when, error = self.topic.failures.pop(0) if self.topic.failures else ("", None)
        if when == "before":
            raise error  # type: ignore[misc]
        self.topic.writes.append(slot)
        self.topic.slots[slot.batch_id] = slot
        if when == "after":
            raise error  # type: ignore[misc]
        self.slots[slot.batch_id] = slot
        return slot

    def mark_done(self, slot: BatchDecision) -> None:
        kept = self.slots.get(slot.batch_id)
        if kept is not None and kept.status == DONE:
            return
        self.write(BatchDecision(slot.sink_id, slot.batch_id, slot.pieces, DONE))


@pytest.fixture
def topic(monkeypatch: pytest.MonkeyPatch) -> Topic:
    topic = Topic()
    current: dict[str, FakeLedger] = {}

    def shared_ledger(options: Any, sink_id: str) -> tuple[FakeLedger, bool]:
        if "ledger" not in current:
            current["ledger"] = FakeLedger(topic)
            return current["ledger"], False
        return current["ledger"], True

    def forget_ledger(ledger: FakeLedger) -> None:
        topic.closed += 1
        current.pop("ledger", None)

    monkeypatch.setattr(resource_module, "shared_ledger", shared_ledger)
    monkeypatch.setattr(resource_module, "forget_ledger", forget_ledger)
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    return topic


def resource(checked: list[int]) -> KafkaResource:
    options = parse_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "out", "sinkId": "sink"}
    )
    kafka = KafkaResource(options)
    kafka.check_prepared = lambda decision: checked.append(decision.batch_id)  # type: ignore[method-assign]
    return kafka


def decision(batch_id: int = 7) -> BatchDecision:
    piece = PreparedPiece("sink", batch_id, 0, "0", 3, {"transactional_id": "t"})
    return BatchDecision("sink", batch_id, (piece,))


def test_a_decision_whose_answer_was_lost_is_read_back_and_never_written_twice(
    topic: Topic,
) -> None:
    topic.failures.append(("after", kafka_errors.KafkaTimeoutError("no answer")))
    checked: list[int] = []
    slot = resource(checked).record_decision(decision())
    assert slot.status == DECIDED and slot.same_pieces(decision())
    assert len(topic.writes) == 1, "the retry read the applied write back instead"
    assert (topic.opened, topic.closed) == (2, 1)
    assert checked == [], "a decided slot needs no new check of its pieces"


def test_a_decision_that_failed_before_it_applied_is_checked_again_then_written(
    topic: Topic,
) -> None:
    topic.failures.append(("before", kafka_errors.KafkaConnectionError("ECONNREFUSED")))
    checked: list[int] = []
    slot = resource(checked).record_decision(decision())
    assert slot.status == DECIDED
    assert len(topic.writes) == 1
    assert checked == [7], "the pieces are checked alive again before a late decision"


def test_pieces_lost_during_the_ride_through_leave_the_batch_undecided(
    topic: Topic,
) -> None:
    topic.failures.append(("before", kafka_errors.KafkaConnectionError("ECONNREFUSED")))
    kafka = resource([])

    def lost(decision: BatchDecision) -> None:
        raise PreparedTransactionLostError("the transactions ended before the decision")

    kafka.check_prepared = lost  # type: ignore[method-assign]
    with pytest.raises(PreparedTransactionLostError):
        kafka.record_decision(decision())
    assert topic.writes == []


def test_a_failure_no_broker_change_cures_is_raised_at_once_as_itself(topic: Topic) -> None:
    denied = kafka_errors.TopicAuthorizationFailedError("ledger topic")
    topic.failures.append(("before", denied))
    with pytest.raises(kafka_errors.TopicAuthorizationFailedError) as raised:
        resource([]).record_decision(decision())
    assert raised.value is denied
    assert (topic.opened, topic.closed) == (1, 1)


def test_mark_done_whose_answer_was_lost_is_not_written_again(topic: Topic) -> None:
    decided = decision()
    topic.slots[decided.batch_id] = decided
    topic.failures.append(("after", kafka_errors.KafkaTimeoutError("no answer")))
    resource([]).mark_done(decided)
    assert [slot.status for slot in topic.writes] == [DONE]
    assert topic.slots[decided.batch_id].status == DONE


def test_giving_up_raises_the_last_real_failure(
    topic: Topic, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(float(second) for second in range(0, 10_000, 100))
    monkeypatch.setattr(resource_module.time, "monotonic", lambda: next(clock))
    failures = [kafka_errors.KafkaTimeoutError(f"no answer {index}") for index in range(10)]
    topic.failures.extend(("before", failure) for failure in failures)
    with pytest.raises(kafka_errors.KafkaTimeoutError) as raised:
        resource([]).record_decision(decision())
    assert raised.value is failures[2], "retried while under the 300 s deadline"


# Ledger durability -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("brokers", "replication", "configs"),
    [
        (1, 1, {}),
        (2, 2, {}),
        (3, 3, {"min.insync.replicas": "2"}),
        (5, 3, {"min.insync.replicas": "2"}),
    ],
)
def test_the_ledger_topic_is_created_rf_3_with_min_isr_2_where_the_cluster_allows(
    brokers: int, replication: int, configs: dict[str, str]
) -> None:
    created_replication, created = ledger_topic_settings(brokers)
    assert created_replication == replication
    assert {key: created[key] for key in created if key == "min.insync.replicas"} == configs
    assert created["cleanup.policy"] == "compact"


def test_a_ledger_topic_as_strong_as_created_is_not_warned_about() -> None:
    for brokers, replication, min_isr in ((1, 1, 1), (2, 2, 1), (3, 3, 2), (3, 3, 3), (2, 2, None)):
        assert (
            ledger_topic_durability(
                "ledger",
                "b:9092",
                brokers=brokers,
                replication=replication,
                min_insync_replicas=min_isr,
            )
            is None
        ), (brokers, replication, min_isr)


def test_a_ledger_topic_with_min_isr_1_is_warned_about_with_the_kafka_configs_fix() -> None:
    warning = ledger_topic_durability(
        "ledger", "b:9092", brokers=3, replication=3, min_insync_replicas=1
    )
    assert warning == (
        "2pc-kafka's ledger topic ledger (where the sink keeps its decisions) may be less"
        " durable than the sink would create it (replication factor 3 and"
        " min.insync.replicas 2): its min.insync.replicas is 1. A decision acknowledged by"
        " one broker that is then lost can make a restart apply a batch twice or leave it"
        " unfinished; the sink goes on. Fix: kafka-configs.sh --bootstrap-server b:9092"
        " --alter --entity-type topics --entity-name ledger --add-config"
        " min.insync.replicas=2"
    )


def test_a_ledger_topic_with_one_replica_is_warned_about_with_the_reassignment_first() -> None:
    warning = ledger_topic_durability(
        "ledger", "b:9092", brokers=3, replication=1, min_insync_replicas=1
    )
    assert warning is not None
    assert "it has 1 replica(s) where the cluster's 3 brokers allow 3" in warning
    assert "its min.insync.replicas is 1" in warning
    fix = warning.split("Fix: ", 1)[1]
    assert fix.index("kafka-reassign-partitions.sh") < fix.index("kafka-configs.sh")


def test_a_min_isr_that_may_not_be_read_is_said_to_be_unchecked() -> None:
    warning = ledger_topic_durability(
        "ledger", "b:9092", brokers=3, replication=3, min_insync_replicas=None
    )
    assert warning is not None
    assert "its min.insync.replicas cannot be checked (DescribeConfigs on the topic was" in warning
    assert "grant DESCRIBE_CONFIGS" in warning


# A task's producer made anew while its coordinator moves -------------------------------


class FakeProducer:
    """Times out its InitProducerId ``stuck`` times (a coordinator that died), then works."""

    made: list[FakeProducer] = []
    stuck = 0

    def __init__(self, **config: Any) -> None:
        self.config = dict(config)
        self.closed = False
        self.waited_ms: int | None = None
        FakeProducer.made.append(self)

    def init_transactions(self) -> None:
        self.waited_ms = self.config["max_block_ms"]
        if len(FakeProducer.made) <= FakeProducer.stuck:
            raise kafka_errors.KafkaTimeoutError("Timeout expired while initializing")

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


@pytest.fixture
def fake_producers(monkeypatch: pytest.MonkeyPatch) -> type[FakeProducer]:
    from eospack.connectors.kafka.client import transactions

    FakeProducer.made = []
    monkeypatch.setattr(transactions, "KafkaProducer", FakeProducer)
    monkeypatch.setattr(transactions.time, "sleep", lambda seconds: None)
    return FakeProducer


def test_a_producer_whose_init_times_out_is_made_anew_each_attempt_bounded(
    fake_producers: type[FakeProducer],
) -> None:
    from eospack.connectors.kafka.client.transactions import initialised_producer

    fake_producers.stuck = 2
    producer = initialised_producer({"bootstrap_servers": "b:1"}, "eospack-s-1-0-a")
    assert len(fake_producers.made) == 3
    assert [made.closed for made in fake_producers.made] == [True, True, False]
    assert {made.waited_ms for made in fake_producers.made} == {10_000}
    assert producer.config["max_block_ms"] == 60_000, "later sends wait as configured"


def test_a_smaller_max_block_ms_bounds_each_attempt(fake_producers: type[FakeProducer]) -> None:
    from eospack.connectors.kafka.client.transactions import initialised_producer

    fake_producers.stuck = 0
    initialised_producer({"bootstrap_servers": "b:1", "max_block_ms": 2_000}, "eospack-s-1-0-a")
    assert fake_producers.made[0].waited_ms == 2_000


def test_a_producer_that_never_initialises_fails_within_the_tasks_deadline(
    fake_producers: type[FakeProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from eospack.connectors.kafka.client import transactions

    fake_producers.stuck = 1_000
    clock = iter(float(second) for second in range(0, 10_000, 10))
    monkeypatch.setattr(transactions.time, "monotonic", lambda: next(clock))
    with pytest.raises(kafka_errors.KafkaTimeoutError):
        transactions.initialised_producer({"bootstrap_servers": "b:1"}, "eospack-s-1-0-a")
    assert len(fake_producers.made) == 6, "attempts until INIT_DEADLINE_SECONDS (60 s)"
    assert all(made.closed for made in fake_producers.made)
