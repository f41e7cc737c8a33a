"""Executor side of replayable-kafka: read one OffsetRange into Arrow record batches.

A range ``[start, end)`` is read by *position*: assign the partition, seek to ``start``,
poll until the consumer's position reaches ``end``, and drop records at or beyond ``end``.
Offsets without a record (transaction markers, compacted records) are skipped by the
position moving past them, never by counting records, so reading a range again returns
exactly the same rows; with read_committed (the default) records of aborted transactions are
skipped the same way, and a range never goes beyond the last stable offset it was planned
with, so every transaction in it is decided. Offsets below the partition's earliest offset
or beyond its end are data loss: failOnDataLoss=true fails the task naming topic-partition
and offsets; false logs a warning with the number of skipped offsets and reads what is still
there. One consumer per consumer configuration is kept per Python worker process and reused
by the next task (tasks in a worker run one at a time); a consumer that failed is closed.
Every poll goes through the call-fault rig as ``kafka.poll`` (see ``broker_calls``).

kafka-python runs the fetches (connections, leaders, fetch sessions, errors, positions);
the record data of each fetched partition is decoded whole into one Arrow record batch by
``record_batches.decode`` (native when built), standing in for kafka-python's per-record
``PartitionRecords`` (``DecodedPartitionRecords``), so ``poll`` returns Arrow batches.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import (
    CorruptRecordError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    UnsupportedCodecError,
)
from kafka.protocol.consumer.offsets import IsolationLevel

from ..client import socket_reads
from ..client.authentication import raise_if_refused
from ..client.broker_calls import broker_call
from ..client.consumers import (
    decode_fetches_with,
    fetched_bytes,
    known_leader,
)
from ..errors import (
    KafkaCodecMissingError,
    KafkaReadTimeoutError,
    report_data_loss,
)
from ..records import native_path, record_batches
from .offset_ranges import OffsetRange
from .options import KafkaSourceOptions

__all__ = [
    "DecodedPartitionRecords",
    "close_idle_consumers",
    "codec_missing_error",
    "decoding_partition_records",
    "read_range",
]

log = logging.getLogger(__name__)

# Without progress for this long, ask the broker whether offsets were lost.
_STALL_CHECK_MS = 2_000
_MIN_POLL_WAIT_MS = 2
_MAX_POLL_WAIT_MS = 50
"""Polls start short and double while nothing moves: kafka-python's poll waits out its
whole timeout when a fetch moved the position but returned no record (a range ending in
a transaction marker or an aborted transaction), so a fixed 50 ms made each such range
cost 50-100 ms; the loop checks the position between polls."""

_idle_consumers: dict[tuple[tuple[str, Any], ...], KafkaConsumer] = {}


def _acquire(
    options: KafkaSourceOptions, offset_range: OffsetRange
) -> tuple[tuple[tuple[str, Any], ...], KafkaConsumer]:
    key = options.consumer_cache_key()
    consumer = _idle_consumers.pop(key, None)
    if consumer is None:
        socket_reads.use_large_reads()
        try:
            consumer = KafkaConsumer(**options.consumer_config())
        except KafkaTimeoutError as error:
            raise_if_refused(options.consumer_config(), "replayable-kafka")  # a login, named
            raise KafkaReadTimeoutError(
                f"Could not read {offset_range.describe()}: no broker of"
                f" {options.bootstrap_servers} answered within {options.poll_timeout_ms} ms"
                f" ({error}); check the brokers, or raise kafkaConsumer.pollTimeoutMs"
            ) from None
    decode_fetches_with(consumer, decoding_partition_records(options.include_headers))
    return key, consumer


def _release(key: tuple[tuple[str, Any], ...], consumer: KafkaConsumer) -> None:
    consumer.unsubscribe()
    previous = _idle_consumers.pop(key, None)
    if previous is not None:
        previous.close()
    _idle_consumers[key] = consumer


def close_idle_consumers() -> None:
    """Close the consumers this process keeps for reuse (tests, benchmarks)."""
    while _idle_consumers:
        _, consumer = _idle_consumers.popitem()
        consumer.close()


def read_range(options: KafkaSourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``offset_range`` as Arrow record batches in offset order."""
    if offset_range.size == 0:
        return
    native_path.warn_if_reference_path()
    key, consumer = _acquire(options, offset_range)
    healthy = False
    try:
        yield from _RangeReader(options, consumer, offset_range).batches()
        healthy = True
    finally:
        if healthy:
            _release(key, consumer)
        else:
            consumer.close()


class _RangeReader:
    def __init__(
        self, options: KafkaSourceOptions, consumer: KafkaConsumer, offset_range: OffsetRange
    ) -> None:
        self.options = options
        self.consumer = consumer
        self.range = offset_range
        self.tp = TopicPartition(offset_range.topic, offset_range.partition)
        self.position = offset_range.start
        self.checked_earliest = False
        self.waiting_for_transaction = False

    def batches(self) -> Iterator[pa.RecordBatch]:
        consumer, tp, end = self.consumer, self.tp, self.range.end
        consumer.assign([tp])
        consumer.seek(tp, self.position)
        last_progress = time.monotonic()
        last_check = last_progress
        wait_ms = _MIN_POLL_WAIT_MS
        # A poll timeout shorter than the stall check checks before it gives up: lost
        # offsets are data loss, and a wait on an open transaction is named as such.
        stall_check_ms = min(_STALL_CHECK_MS, self.options.poll_timeout_ms)
        while self.position < end:
            try:
                polled = broker_call("kafka.poll", partial(consumer.poll, timeout_ms=wait_ms))
            except OffsetOutOfRangeError:
                if not self._check_lost_offsets(force=True, seek=True):
                    raise
                last_progress = time.monotonic()
                continue
            except UnsupportedCodecError as error:
                raise codec_missing_error(self.range, error) from None
            for batch in polled.get(tp, ()):
                if batch.column(4)[0].as_py() > self.position and not self.checked_earliest:
                    self._check_lost_offsets(force=False, seek=False)
                batch = _within(batch, self.position, end)
                if batch.num_rows:
                    yield batch
            position = consumer.position(tp)
            now = time.monotonic()
            if position > self.position:
                self.position = position
                last_progress = last_check = now
                wait_ms = _MIN_POLL_WAIT_MS
                continue
            wait_ms = min(wait_ms * 2, _MAX_POLL_WAIT_MS)
            if (now - last_check) * 1000 >= stall_check_ms:
                last_check = now
                if self._check_lost_offsets(force=True, seek=True):
                    last_progress = now
                    continue
            if (now - last_progress) * 1000 >= self.options.poll_timeout_ms:
                cause = (
                    "a transaction open at that offset is not decided yet (read_committed)"
                    if self.waiting_for_transaction
                    else f"{self._leader_state()}; check the brokers"
                    f" ({self.options.bootstrap_servers})"
                )
                raise KafkaReadTimeoutError(
                    f"Could not read {self.range.describe()}: stuck at offset {self.position}"
                    f" for {self.options.poll_timeout_ms} ms; {cause}, or raise"
                    " kafkaConsumer.pollTimeoutMs"
                )

    def _leader_state(self) -> str:
        """What the consumer last learnt of the partition's leader, for a read that gives
        up: no leader (every replica down or out of sync), or the node it kept asking."""
        try:
            leader = known_leader(self.consumer, self.tp)
        except Exception:  # kafka-python internals: the message must not fail
            return "its leader is not known"
        if leader is None or leader < 0:
            return f"{self.tp.topic}-{self.tp.partition} has no leader"
        return f"its leader, node {leader}, did not serve it"

    def _check_lost_offsets(self, force: bool, seek: bool) -> bool:
        """Report offsets of the range that the broker no longer has; True if we moved on.

        ``force`` also checks for a partition that now ends before the range does; ``seek``
        moves the consumer past lost offsets (not wanted while polled records are in hand).
        """
        self.checked_earliest = True
        try:
            timeout = self.options.metadata_timeout_ms
            earliest = self.consumer.beginning_offsets([self.tp], timeout_ms=timeout)[self.tp]
            latest = self.consumer.end_offsets([self.tp], timeout_ms=timeout)[self.tp]
        except KafkaTimeoutError:
            if self.tp.partition in (self.consumer.partitions_for_topic(self.tp.topic) or ()):
                return False
            report_data_loss(
                self.options.fail_on_data_loss,
                f"Cannot read {self.range.describe()}: {self.tp.topic}-{self.tp.partition}"
                f" no longer exists, offsets from {self.position} to {self.range.end} are lost",
                skipped=self.range.end - self.position,
            )
            self.position = self.range.end
            return True
        if earliest > self.position:
            upto = min(earliest, self.range.end)
            report_data_loss(
                self.options.fail_on_data_loss,
                f"Cannot read {self.range.describe()}: offsets from {self.position} to {upto}"
                f" of {self.tp.topic}-{self.tp.partition} are gone (earliest available is"
                f" {earliest})",
                skipped=upto - self.position,
            )
            self.position = upto
            if seek and upto < self.range.end:
                self.consumer.seek(self.tp, upto)
            return True
        if force and latest < self.range.end and self.position >= latest:
            if self._held_by_open_transaction():
                return False
            report_data_loss(
                self.options.fail_on_data_loss,
                f"Cannot read {self.range.describe()}: {self.tp.topic}-{self.tp.partition}"
                f" ends at offset {latest} now, offsets from {self.position} to"
                f" {self.range.end} are lost",
                skipped=self.range.end - self.position,
            )
            self.position = self.range.end
            return True
        return False

    def _held_by_open_transaction(self) -> bool:
        """With read_committed, a range planned beyond today's last stable offset (by
        read_uncommitted, or by an earlier version) is not lost while the high watermark
        covers it: its records are there, waiting for a transaction to be decided."""
        if self.options.consumer_config()["isolation_level"] != "read_committed":
            return False
        highwater = self.consumer.highwater(self.tp)
        self.waiting_for_transaction = highwater is not None and highwater >= self.range.end
        return self.waiting_for_transaction


CODEC_PACKAGES = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}
"""The package kafka-python decodes each codec with (gzip is in Python itself)."""


def codec_missing_error(offset_range: OffsetRange, error: Exception) -> KafkaCodecMissingError:
    """One line naming the range, the codec and the package to install, for kafka-python's
    "Libraries for zstd compression codec not found"."""
    match = re.search(r"Libraries for (\w+) compression codec", str(error))
    codec = match.group(1) if match else "an unknown codec"
    package = CODEC_PACKAGES.get(codec)
    fix = (
        f"pip install {package} (eospack depends on it through kafka-python[{codec}]; install"
        " it wherever Spark's Python workers run)"
        if package
        else f"kafka-python says: {error}"
    )
    return KafkaCodecMissingError(
        f"Cannot read {offset_range.describe()}: its records are compressed with {codec} and"
        f" this Python has no {codec} decoder: {fix}"
    )


def _within(batch: pa.RecordBatch, start: int, end: int) -> pa.RecordBatch:
    """The rows with start <= offset < end (rows are in offset order)."""
    offsets = batch.column(4).to_numpy()
    first, last = np.searchsorted(offsets, (start, end))
    if first == 0 and last == batch.num_rows:
        return batch
    return batch.slice(int(first), int(last - first))


def decoding_partition_records(include_headers: bool) -> Callable[..., DecodedPartitionRecords]:
    """The stand-in for ``Fetcher.PartitionRecords`` of a consumer reading ``include_headers``."""

    def create(*arguments: Any, **keywords: Any) -> DecodedPartitionRecords:
        return DecodedPartitionRecords(*arguments, include_headers=include_headers, **keywords)

    return create


class DecodedPartitionRecords:
    """kafka-python's ``Fetcher.PartitionRecords`` for one fetched partition, decoded whole:
    ``take`` returns one Arrow record batch (the records at or after the fetch offset) and
    moves ``next_fetch_offset`` past the last batch in the data, which the fetcher makes the
    consumer's position. Same contract as the original, one object per fetch instead of
    one per record."""

    def __init__(
        self,
        fetch_offset: int,
        tp: TopicPartition,
        records: Any,
        *,
        include_headers: bool,
        check_crcs: bool = True,
        isolation_level: int = IsolationLevel.READ_UNCOMMITTED,
        aborted_transactions: Any = None,
        metric_aggregator: Any = None,
        on_drain: Callable[[Any], None] = lambda _: None,
        **_: Any,
    ) -> None:
        self.fetch_offset = fetch_offset
        self.topic_partition = tp
        self.next_fetch_offset = fetch_offset
        self.leader_epoch = -1
        self.include_headers = include_headers
        self.check_crcs = check_crcs
        self.read_committed = isolation_level == IsolationLevel.READ_COMMITTED
        self.aborted = [(t.producer_id, t.first_offset) for t in aborted_transactions or ()]
        self.metric_aggregator = metric_aggregator
        self.on_drain = on_drain
        self.raw: bytes | None = fetched_bytes(records)
        self.bytes_read = 0
        self.records_read = 0

    def __bool__(self) -> bool:
        return self.raw is not None

    def take(self, n: int | None = None) -> list[pa.RecordBatch]:
        if self.raw is None:
            return []
        try:
            decoded = record_batches.decode(
                self.raw,
                self.fetch_offset,
                self.topic_partition.topic,
                self.topic_partition.partition,
                read_committed=self.read_committed,
                aborted_transactions=self.aborted,
                include_headers=self.include_headers,
                check_crcs=self.check_crcs,
            )
        except record_batches.CorruptRecordsError as error:
            self.drain()
            raise CorruptRecordError(str(error)) from None
        self.next_fetch_offset = decoded.next_fetch_offset
        self.leader_epoch = decoded.leader_epoch
        self.bytes_read = len(self.raw)
        self.records_read = decoded.batch.num_rows
        self.drain()
        return [decoded.batch] if decoded.batch.num_rows else []

    def drain(self) -> None:
        if self.raw is not None:
            self.raw = None
            if self.metric_aggregator:
                self.metric_aggregator.record(
                    self.topic_partition, self.bytes_read, self.records_read
                )
            self.on_drain(self)
