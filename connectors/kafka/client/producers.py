"""The producer's private parts the sink relies on outside a transaction's begin and end
(``transactions``), behind small functions: kafka-python keeps the cause of a failed
transaction in its transaction manager only, and its ``close`` may raise before it stops
the sender thread. ``tests/test_kafka_private_api_canary.py`` fails when an installed
kafka-python lacks one of the names used here."""

from __future__ import annotations

import contextlib
import logging

from kafka import KafkaProducer

logger = logging.getLogger(__name__)


def transaction_error(producer: KafkaProducer) -> BaseException | None:
    """What the producer's transaction last failed with (a send, AddPartitionsToTxn,
    EndTxn), or None."""
    manager = producer._transaction_manager
    if manager is None:
        return None
    error: BaseException | None = manager.last_error
    return error


def failed_transaction(producer: KafkaProducer) -> BaseException | None:
    """When the producer's transaction is in its error state: the error (a plain
    ``KafkaError`` if the manager kept none); else None."""
    from kafka import errors as kafka_errors

    manager = producer._transaction_manager
    if manager is None or not manager.has_error():
        return None
    error: BaseException = manager.last_error or kafka_errors.KafkaError("the transaction failed")
    return error


def close_at_once(producer: KafkaProducer) -> None:
    """Close ``producer`` without waiting and without raising. kafka-python's
    ``close(timeout=0)`` first flushes, and a flush that cannot finish (a broker gone with a
    send in flight) raises ``Timeout waiting for future`` before the sender thread is
    stopped: the caller's real failure was hidden behind it and the thread leaked. Here the
    sender is stopped whatever the flush says."""
    try:
        producer.close(timeout=0)
    except Exception as error:  # the flush's timeout: the records are abandoned anyway
        logger.debug("2pc-kafka: closing a ledger producer at once: %r", error)
        sender = producer._sender
        if sender is not None and sender.is_alive():
            with contextlib.suppress(Exception):
                sender.force_close()
        producer._closed = True
