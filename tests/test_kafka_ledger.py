"""How a ledger tells "another process took this sink over" from other Kafka failures:
kafka-python surfaces the fence either as ``ProducerFencedError`` (EndTxn refused) or,
when its sender saw it first, as a plain ``KafkaError`` about the producer's error state."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kafka import errors as kafka_errors

from eospack.connectors.kafka.sink.ledger import _fenced


def producer_whose_last_error_is(error: Exception | None) -> Any:
    return SimpleNamespace(_transaction_manager=SimpleNamespace(last_error=error))


@pytest.mark.parametrize(
    ("raised", "last_error", "fenced"),
    [
        (kafka_errors.ProducerFencedError(), None, True),
        (kafka_errors.InvalidProducerEpochError(), None, True),
        (
            kafka_errors.KafkaError("Cannot execute transactional method: ProducerFencedError"),
            kafka_errors.ProducerFencedError(),
            True,
        ),
        (kafka_errors.KafkaTimeoutError("no answer"), None, False),
        (kafka_errors.KafkaError("error state"), kafka_errors.KafkaTimeoutError(), False),
    ],
)
def test_a_fence_is_recognised_whichever_call_reports_it(
    raised: kafka_errors.KafkaError, last_error: Exception | None, fenced: bool
) -> None:
    assert _fenced(producer_whose_last_error_is(last_error), raised) is fenced
