"""Executor side of 2pc-kafka: a task's rows as Kafka records.

The input columns are those of Spark's Kafka sink: ``value`` (binary or string, required),
``key`` (binary or string), ``topic`` (string; the ``topic`` option overrides it),
``partition`` (int; else the producer's partitioner) and ``headers`` (array of struct
``key`` string, ``value`` binary). Other columns are ignored.

Exactly-once: the task writes in a Kafka transaction under a transactional id of its
worker's pool (``producer_pool``: never shared by two live tasks, re-initialised only once
nothing a decision names can be open under it), flushes, and leaves it open; its commit
message carries the piece's identity (sink, batch, partition, attempt) and the
transactional id, producer id and epoch the driver commits with.
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
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from kafka import KafkaProducer
from kafka import errors as kafka_errors

from eospack.core import faults

from ....commit_protocols import TaskIdentity
from ....commit_protocols.pieces import PreparedPiece
from ..client.authentication import naming_refused_logins
from ..client.producer_batches import DEFAULT_BATCH_BYTES, BatchSender
from ..client.producers import failed_transaction
from ..client.transactions import (
    begin,
    begin_again,
    end_transaction,
    prepare,
)
from ..errors import KafkaSendError, RecordRefusedError
from ..records import record_batches
from ..records.record_batches import EncodeSettings
from . import producer_pool
from .ledger import is_ledger_topic
from .options import KafkaSinkOptions
from .producer_pool import kept_producer

ENCODED_COLUMNS = ("key", "value", "partition", "headers")
logger = logging.getLogger(__name__)
ABORT_TIMEOUT_MS = 10_000
"""How long a failed task waits for its abort: a coordinator that died would hold it 60 s
(``END_TIMEOUT_MS``) before Spark could retry it; what stays open, recovery fences."""


def prepare_task(
    options: KafkaSinkOptions, task: TaskIdentity, batches: Iterator[pa.RecordBatch]
) -> PreparedPiece:
    """Write the task's rows into an open transaction and return it as a prepared piece.

    The transactional id comes from the worker's pool, and so does its producer when an
    earlier task of this worker left one (``producer_pool``: restarted with one
    InitProducerId, ``begin_again``). Else the producer is made and initialised (bootstrap,
    coordinator lookup, InitProducerId: about 80-110 ms, profiled) and looks the ``topic``
    option's partitions up (~50 ms). Either way on a thread of its own while this thread
    takes the task's first input batch from Spark (``opened_while_reading``); nothing is
    sent before both are there. A prepared producer is kept for the next task; a failed
    task's is closed and its id given back."""
    config = options.producer_config()
    name = producer_pool.pooled_transactional_id(task)

    def open_transaction() -> KafkaProducer:
        kept = producer_pool.take_kept_transactional(config, name)
        if kept is not None:
            try:
                begin_again(kept)
                return kept
            except Exception as error:
                logger.info(
                    "2pc-kafka: the kept producer of %s could not begin again (%s: %s);"
                    " making a new one",
                    name,
                    type(error).__name__,
                    " ".join(str(error).split())[:200],
                )
                with contextlib.suppress(Exception):
                    kept.close(timeout=0)
        with naming_refused_logins(config, "2pc-kafka"):
            producer = begin(config, name)
        if options.topic:  # the first metadata lookup (~50 ms) also while reading
            try:
                producer.partitions_for(options.topic)
            except BaseException:
                with contextlib.suppress(Exception):
                    producer.close(timeout=0)
                raise
        return producer

    try:
        producer, batches = opened_while_reading(open_transaction, batches)
    except BaseException:
        producer_pool.release_transactional_id(task, name)
        raise
    try:
        records = send_rows(producer, options, batches)
        prepared = faults.run_call(
            "kafka_sink.prepare",
            lambda: prepare(producer, records, close=False),
            error=kafka_errors.KafkaConnectionError,
            batch_id=task.batch_id,
        )
    except BaseException:
        with contextlib.suppress(Exception):  # what stays open, recovery fences
            end_transaction(producer, commit=False, timeout_ms=ABORT_TIMEOUT_MS)
        with contextlib.suppress(Exception):  # a close's flush timeout hid the cause
            producer.close(timeout=0)
        producer_pool.release_transactional_id(task, name)
        raise
    producer_pool.keep_transactional(config, producer)
    return task.piece(records, prepared.to_json())


def opened_while_reading(
    open_producer: Callable[[], KafkaProducer], batches: Iterator[pa.RecordBatch]
) -> tuple[KafkaProducer, Iterator[pa.RecordBatch]]:
    """Run ``open_producer`` on a thread while the first batch is read, and return the
    producer with the batches (the first one put back in front). A failure of either is
    raised after both finished; a producer opened for a task that then failed to read is
    closed (its empty transaction is never registered on the broker)."""
    opened: list[KafkaProducer] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            opened.append(open_producer())
        except BaseException as failure:
            failures.append(failure)

    opener = threading.Thread(target=run, name="2pc-kafka-open-transaction", daemon=True)
    opener.start()
    try:
        first = next(batches, None)
    except BaseException:
        opener.join()
        for producer in opened:
            with contextlib.suppress(Exception):
                producer.close(timeout=0)
        raise
    opener.join()
    if failures:
        raise failures[0]
    rest = batches if first is None else itertools.chain([first], batches)
    return opened[0], rest


def write_directly(options: KafkaSinkOptions, batches: Iterator[pa.RecordBatch]) -> int:
    """At-least-once: send, flush, and count (a retried task sends its rows again). The
    producer is the worker's kept one (``producer_pool``): a task of a reused Python
    worker pays no bootstrap and no first metadata lookup."""
    config = options.producer_config()

    def make() -> KafkaProducer:
        with naming_refused_logins(config, "2pc-kafka"):
            return KafkaProducer(**config)

    with kept_producer(config, make) as producer:
        return send_rows(producer, options, batches)


def send_rows(
    producer: KafkaProducer, options: KafkaSinkOptions, batches: Iterator[pa.RecordBatch]
) -> int:
    """Send every row, flush, and return how many; raises ``KafkaSendError`` naming the
    first record the broker refused (the caller aborts the transaction).

    Rows become record batches whole (``record_batches.encode``: Kafka's default
    partitioner, murmur2 of the key, sticky for rows without key and partition) and go to
    the producer as such (``producer_batches``)."""
    refused = RefusedSends()
    sender = BatchSender(producer, refused.remember)
    topics = TopicChecks(options)
    sticky: dict[str, int] = {}
    batch_bytes = int(producer.config.get("batch_size") or 0)
    if "batch_size" not in dict(options.producer_params):
        batch_bytes = DEFAULT_BATCH_BYTES
    compression = producer.config.get("compression_type") or "none"
    sent = 0
    for batch in batches:
        for topic, rows in rows_by_topic(options, batch):
            topics.check(topic)
            partitions = producer.partitions_for(topic)
            settings = EncodeSettings(
                partitions=len(partitions),
                max_batch_bytes=min(batch_bytes, int(producer.config["max_request_size"])),
                max_record_bytes=int(producer.config["max_request_size"]),
                compression=compression,
                timestamp_ms=int(time.time() * 1000),
            )
            try:
                encoded, sticky[topic] = record_batches.encode(
                    rows, settings, sticky.get(topic, random.randrange(len(partitions)))
                )
            except RecordRefusedError as error:
                raise refused_error(topic, error) from None
            for piece in encoded:
                sender.append(topic, piece)
        sent += batch.num_rows
        refused.raise_first()
    sender.flush()
    refused.raise_first()
    failure = failed_transaction(producer)
    if failure is not None:
        raise send_error(options.topic or "(several)", failure)
    return sent


def rows_by_topic(
    options: KafkaSinkOptions, batch: pa.RecordBatch
) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The rows of each topic (the ``topic`` option, else the ``topic`` column), with the
    columns the encoder reads."""
    names = [name for name in ENCODED_COLUMNS if name in batch.schema.names]
    rows = batch.select(names)
    if options.topic:
        yield options.topic, rows
        return
    if "topic" not in batch.schema.names:
        raise ValueError("2pc-kafka: set the topic option or give the rows a topic column")
    topic_column = batch.column("topic")
    if topic_column.null_count:
        raise ValueError(
            "2pc-kafka: a row has a null topic: set the topic option or fill the topic column"
        )
    topics = pc.unique(topic_column).to_pylist()
    if len(topics) == 1:
        yield topics[0], rows
        return
    for topic in topics:
        yield topic, rows.filter(pc.equal(topic_column, topic))


class TopicChecks:
    """Each topic a task writes is checked once: never a ledger topic of 2pc-kafka."""

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options
        self.checked: dict[str, bool] = {}

    def check(self, topic: str) -> None:
        if topic not in self.checked:
            self.checked[topic] = is_ledger_topic(self.options, topic)
        if self.checked[topic]:
            raise KafkaSendError(
                f"2pc-kafka: a row's topic is {topic}, a ledger topic of"
                " 2pc-kafka (where sinks keep their decisions): route the row to another"
                " topic (a record there could forge a decision, or hold every ledger"
                " reader back)"
            )


def refused_error(topic: str, error: RecordRefusedError) -> Exception:
    """A record too large for ``max.request.size`` as kafka-python would say it; a
    partition the topic lacks as the ValueError kafka-python raised."""
    text = str(error)
    if "max.request.size" in text:
        return send_error(topic, kafka_errors.MessageSizeTooLargeError(text))
    return ValueError(f"2pc-kafka could not write a row to topic {topic}: {text}")


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
