"""Executor side of 2pc-kafka: a task's rows as Kafka records.

The input columns are those of Spark's Kafka sink: ``value`` (binary or string, required),
``key`` (binary or string), ``topic`` (string; the ``topic`` option overrides it),
``partition`` (int; else the producer's partitioner) and ``headers`` (array of struct
``key`` string, ``value`` binary). Other columns are ignored.

Exactly-once: the task writes in a Kafka transaction of its own transactional id
(the eospack transaction id of sink, batch, partition and attempt), flushes, and leaves
it open; its commit message carries the producer id and epoch the driver commits with.
A task that fails aborts its transaction where it still can; what it cannot abort, the
driver's recovery fences.

Every send is checked: kafka-python reports a record the broker refused (too large for the
topic, a partition that does not exist, an authorisation error) only through the send's
future, and its ``flush`` does not raise. A task whose sends did not all succeed raises
``KafkaSendError`` after the flush, before its transaction is handed to the driver, so a
refused record can never be committed as sent (at-least-once: the task fails likewise).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from kafka import KafkaProducer
from kafka import errors as kafka_errors

from eospack.commit_protocols import TaskIdentity, faults, transaction_id
from eospack.commit_protocols.pieces import PreparedPiece
from eospack.connectors.kafka_sink.errors import KafkaSendError
from eospack.connectors.kafka_sink.ledger import is_ledger_topic
from eospack.connectors.kafka_sink.options import KafkaSinkOptions
from eospack.connectors.kafka_sink.transactions import begin, end_transaction, prepare

SEND_COLUMNS = ("key", "value", "topic", "partition", "headers")


def prepare_task(
    options: KafkaSinkOptions, task: TaskIdentity, batches: Iterator[pa.RecordBatch]
) -> PreparedPiece:
    """Write the task's rows into an open transaction and return it as a prepared piece."""
    name = transaction_id(task.sink_id, task.batch_id, task.partition_id, task.attempt)
    producer = begin(options.producer_config(), name)
    try:
        records = send_rows(producer, options, batches)
        prepared = faults.run_call(
            "kafka_sink.prepare",
            lambda: prepare(producer, records),
            error=kafka_errors.KafkaConnectionError,
            batch_id=task.batch_id,
        )
    except BaseException:
        with contextlib.suppress(Exception):  # what stays open, recovery fences
            end_transaction(producer, commit=False)
        producer.close(timeout=0)
        raise
    return task.piece(records, prepared.to_json())


def write_directly(options: KafkaSinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """At-least-once: send, flush, and count (a retried task sends its rows again)."""
    producer = KafkaProducer(**options.producer_config())
    try:
        return send_rows(producer, options, batches)
    finally:
        producer.close()


def send_rows(
    producer: KafkaProducer, options: KafkaSinkOptions, batches: Iterator[pa.RecordBatch]
) -> int:
    """Send every row, flush, and return how many; raises ``KafkaSendError`` naming the
    first record the broker refused (the caller aborts the transaction)."""
    refused = RefusedSends()
    checked_topics: dict[str, bool] = {}
    sent = 0
    for batch in batches:
        columns = {
            name: batch.column(name).to_pylist()
            for name in SEND_COLUMNS
            if name in batch.schema.names
        }
        for index in range(batch.num_rows):
            topic = options.topic or columns["topic"][index]
            if topic is None:
                raise ValueError(
                    "2pc-kafka: a row has a null topic: set the topic option or fill the"
                    " topic column"
                )
            if topic not in checked_topics:
                checked_topics[topic] = is_ledger_topic(options, topic)
            if checked_topics[topic]:
                raise KafkaSendError(
                    f"2pc-kafka: a row's topic is {topic}, a ledger topic of"
                    " 2pc-kafka (where sinks keep their decisions): route the row to another"
                    " topic (a record there could forge a decision, or hold every ledger"
                    " reader back)"
                )
            try:
                future = producer.send(
                    topic,
                    value=as_bytes(columns["value"][index]),
                    key=as_bytes(columns["key"][index]) if "key" in columns else None,
                    partition=columns["partition"][index] if "partition" in columns else None,
                    headers=headers_of(columns["headers"][index]) if "headers" in columns else None,
                )
            except kafka_errors.KafkaError as error:
                raise send_error(topic, error) from None
            future.add_errback(refused.remember, topic)
        sent += batch.num_rows
    producer.flush()
    refused.raise_first()
    return sent


class RefusedSends:
    """The first send the broker (or the producer's delivery) failed, from the futures'
    errbacks, which run on kafka-python's sender thread."""

    def __init__(self) -> None:
        self.first: tuple[str, BaseException] | None = None

    def remember(self, topic: str, error: BaseException) -> None:
        if self.first is None:
            self.first = (topic, error)

    def raise_first(self) -> None:
        if self.first is not None:
            raise send_error(*self.first)


SIZE_FIX = (
    ": a record (key, value and headers) must fit the topic's max.message.bytes and"
    " kafka.max.request.size"
)


def send_error(topic: str, error: BaseException) -> KafkaSendError:
    """One line: where, the broker's error, and the fix when one is known."""
    name = type(error).__name__
    text = " ".join(str(error).split())
    fix = SIZE_FIX if "TooLarge" in name else ""
    return KafkaSendError(
        f"2pc-kafka could not write a record to topic {topic}: {name}: {text}{fix}"
    )


def as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()


def headers_of(value: list[dict[str, Any]] | None) -> list[tuple[str, bytes]] | None:
    if not value:
        return None
    return [(str(header["key"]), as_bytes(header["value"]) or b"") for header in value]
