"""Whole record batches, encoded natively, handed to kafka-python's producer.

kafka-python's producer keeps doing what it does well: metadata and leaders,
AddPartitionsToTxn for a transaction, producer id, epoch and sequence numbers, Produce
requests, retries, ordering and ``flush``. What it did record by record in Python
(partitioning, building each record batch) comes from ``record_batches.encode`` as whole
batches; ``append`` puts each into the producer's accumulator as a ready batch, which the
sender stamps with the producer's state when it drains it (``EncodedRecords`` stands in for
kafka-python's ``MemoryRecordsBuilder``).

Delivery is checked per batch: its produce future's outcome (kafka-python completes it
"successfully" with a per-record error function for a refused, expired or aborted batch)
records the first failure (``on_error``). A batch the broker refuses as too large is split
by kafka-python into smaller batches of its own; the batch's per-record futures exist only
then (``EncodedProducerBatch``), so each piece's failure is still seen.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka.producer.future import FutureRecordMetadata
from kafka.producer.producer_batch import ProducerBatch
from kafka.record import MemoryRecords

from ..records import record_batches
from ..records.record_batches import EncodedBatch

OnError = Callable[[str, BaseException], None]
"""Called with the topic and the error of a batch (or a piece of it) that failed."""

DEFAULT_BATCH_BYTES = 256 * 1024
"""The size a batch closes at unless ``kafka.batch.size`` says otherwise: larger than
kafka-python's 16 kB, because each batch costs Python work in the sender (well under the
broker's default ``max.message.bytes`` of 1 MB; a topic with a smaller limit gets its
batches split by the producer)."""

MAX_BUFFERED_BYTES = 32 * 1024 * 1024
"""How much may wait in the producer before ``append`` waits for the oldest batch (the
producer's ``buffer_memory`` default)."""


class EncodedRecords:
    """kafka-python's ``MemoryRecordsBuilder`` interface over a closed, encoded batch."""

    def __init__(self, encoded: EncodedBatch) -> None:
        self._buffer = encoded.data
        self._count = encoded.records
        self._producer_id = -1
        self._producer_epoch = -1
        self._base_sequence = -1

    def append(self, *_: Any, **__: Any) -> None:
        return None  # closed: the producer never adds records to it

    def set_producer_state(
        self, producer_id: int, producer_epoch: int, base_sequence: int, is_transactional: bool
    ) -> None:
        record_batches.set_producer_state(
            self._buffer, producer_id, producer_epoch, base_sequence, is_transactional
        )
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence

    @property
    def producer_id(self) -> int:
        return self._producer_id

    @property
    def producer_epoch(self) -> int:
        return self._producer_epoch

    @property
    def base_sequence(self) -> int:
        return self._base_sequence

    def records(self) -> MemoryRecords:
        return MemoryRecords(bytes(self._buffer))

    def close(self) -> None:
        pass

    def size_in_bytes(self) -> int:
        return len(self._buffer)

    def compression_rate(self) -> float:
        return 1.0

    def is_full(self) -> bool:
        return True

    def next_offset(self) -> int:
        return self._count

    def buffer(self) -> bytearray:
        return self._buffer


class EncodedProducerBatch(ProducerBatch):
    """A ProducerBatch of an encoded batch. kafka-python reads ``_record_futures`` only when
    it splits a batch the broker refused as too large; they are made then, one per record,
    each reporting a failure to ``on_error``."""

    def __init__(self, tp: TopicPartition, encoded: EncodedBatch, on_error: OnError) -> None:
        self._lazy_futures: list[FutureRecordMetadata] | None = None
        self._on_error = on_error
        super().__init__(tp, EncodedRecords(encoded))

    @property  # type: ignore[override]
    def _record_futures(self) -> list[FutureRecordMetadata]:
        if self._lazy_futures is None:
            self._lazy_futures = []
            for index in range(self.record_count):
                future = FutureRecordMetadata(self.produce_future, index, -1, None, -1, -1, -1)
                future.add_errback(self._on_error, self.topic_partition.topic)
                self._lazy_futures.append(future)
        return self._lazy_futures

    @_record_futures.setter
    def _record_futures(self, _: list[FutureRecordMetadata]) -> None:
        pass


class BatchSender:
    """Appends encoded batches to one producer and bounds what waits in it."""

    def __init__(self, producer: KafkaProducer, on_error: OnError) -> None:
        self.producer = producer
        self.on_error = on_error
        self.transactional = bool(producer.config.get("transactional_id"))
        self.in_flight: collections.deque[tuple[ProducerBatch, int]] = collections.deque()
        self.buffered = 0
        self.added: set[TopicPartition] = set()

    def append(self, topic: str, encoded: EncodedBatch) -> None:
        tp = TopicPartition(topic, encoded.partition)
        manager = self.producer._transaction_manager
        if self.transactional and tp not in self.added:
            manager.maybe_add_partition_to_transaction(tp)
            self.added.add(tp)
        batch = EncodedProducerBatch(tp, encoded, self.on_error)
        batch.produce_future.add_callback(self._check_outcome, topic)
        batch.produce_future.add_errback(self.on_error, topic)
        accumulator = self.producer._accumulator
        with accumulator._tp_lock(tp):
            accumulator._batches[tp].append(batch)
            accumulator._incomplete.add(batch)
        self.producer._sender.wakeup()
        self.in_flight.append((batch, len(encoded.data)))
        self.buffered += len(encoded.data)
        while self.buffered > MAX_BUFFERED_BYTES and self.in_flight:
            oldest, size = self.in_flight.popleft()
            self._wait_for(oldest)
            self.buffered -= size

    def _check_outcome(self, topic: str, result: tuple[int, int, Any]) -> None:
        """kafka-python completes a batch's produce future successfully even when the batch
        failed (refused, expired, aborted): the failure comes as a function giving each
        record's error, which only per-record futures apply. One record's error is the
        batch's."""
        record_errors = result[2]
        if record_errors is not None:
            self.on_error(topic, record_errors(0))

    def _wait_for(self, batch: ProducerBatch) -> None:
        """Until the batch is done, or split (kafka-python then drops it and sends its
        pieces), or its delivery timeout passed (the producer fails it then)."""
        incomplete = self.producer._accumulator._incomplete._incomplete
        deadline = time.monotonic() + self.producer.config["delivery_timeout_ms"] / 1000
        while not batch.produce_future.wait(0.2):
            if batch not in incomplete or time.monotonic() > deadline:
                return

    def flush(self) -> None:
        """Send everything and wait until the producer holds no unacknowledged batch.

        kafka-python's own ``flush`` waits on the batches it held when it began, and a batch
        it splits meanwhile never completes (it raises "Future not done"); this waits until
        none is left, the split pieces included. Failures reach ``on_error``."""
        accumulator = self.producer._accumulator
        deadline = time.monotonic() + self.producer.config["delivery_timeout_ms"] / 1000 + 30
        accumulator.begin_flush()
        self.producer._sender.wakeup()
        try:
            while accumulator.has_incomplete:
                for batch in accumulator._incomplete.all():
                    if not batch.produce_future.wait(0.2):
                        break
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(
                        "2pc-kafka: the producer did not finish sending within"
                        " kafka.delivery.timeout.ms"
                    )
        finally:
            accumulator._flushes_in_progress.decrement()
        self.in_flight.clear()
        self.buffered = 0
