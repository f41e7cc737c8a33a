"""Attacks on 2pc-kafka's ride-through of a broker loss (issue 37): a decision written after
the ride-through must never name pieces that died during it. Stand-ins for the ledger; the
real-broker behaviour is in ``integration_tests/kafka_sink/test_kafka_ride_through.py``."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka import errors as kafka_errors

from eospack.commit_protocols.pieces import BatchDecision, PreparedPiece
from eospack.connectors.kafka.errors import PreparedTransactionLostError
from eospack.connectors.kafka.sink import resource as resource_module
from eospack.connectors.kafka.sink.options import parse_options
from eospack.connectors.kafka.sink.resource import KafkaResource


@dataclass
class Broker:
    """The ledger topic as the broker holds it, and how many ledger opens fail first."""

    slots: dict[int, BatchDecision] = field(default_factory=dict)
    writes: list[BatchDecision] = field(default_factory=list)
    failed_opens: int = 0


class StandInLedger:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.slots = dict(broker.slots)
        self.lock = threading.RLock()

    def write(self, slot: BatchDecision) -> BatchDecision:
        self.broker.writes.append(slot)
        self.broker.slots[slot.batch_id] = slot
        self.slots[slot.batch_id] = slot
        return slot


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    broker = Broker()
    current: dict[str, StandInLedger] = {}

    def shared_ledger(options: Any, sink_id: str) -> tuple[StandInLedger, bool]:
        if broker.failed_opens:
            broker.failed_opens -= 1
            raise kafka_errors.KafkaTimeoutError("Timeout expired while initializing")
        if "ledger" not in current:
            current["ledger"] = StandInLedger(broker)
            return current["ledger"], False
        return current["ledger"], True

    def forget_ledger(ledger: StandInLedger) -> None:
        current.pop("ledger", None)

    monkeypatch.setattr(resource_module, "shared_ledger", shared_ledger)
    monkeypatch.setattr(resource_module, "forget_ledger", forget_ledger)
    monkeypatch.setattr(resource_module.time, "sleep", lambda seconds: None)
    return broker


def decision() -> BatchDecision:
    piece = PreparedPiece("sink", 7, 0, "0", 3, {"transactional_id": "t"})
    return BatchDecision("sink", 7, (piece,))


def test_pieces_that_died_while_the_ledger_could_not_be_opened_are_never_decided(
    broker: Broker,
) -> None:
    """The coordinator checked the pieces, then opening the ledger failed for as long as the
    ride-through lasts (a coordinator gone for minutes): the pieces may have timed out
    meanwhile, so the late decision must check them again. Before the fix only a failed
    *write* counted as a retry: the decision was written naming dead pieces (a batch lost,
    DecidedPieceLostError at its commit, instead of replayed)."""
    broker.failed_opens = 3
    options = parse_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "out", "sinkId": "sink"}
    )
    kafka = KafkaResource(options)

    def lost(decision: BatchDecision) -> None:
        raise PreparedTransactionLostError("the transactions ended before the decision")

    kafka.check_prepared = lost  # type: ignore[method-assign]
    with pytest.raises(PreparedTransactionLostError):
        kafka.record_decision(decision())
    assert broker.writes == []
    assert kafka.retried_ledger_steps == 3
