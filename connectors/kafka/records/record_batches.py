"""Kafka record batches into Arrow and back: the native path and its pure-Python reference.

Both Kafka connectors move data through this module only. ``decode`` turns the record data
of one partition of a Fetch response into an Arrow record batch of the source's schema;
``encode`` turns rows of Spark's Kafka sink columns into record batches (format v2) ready
for a Produce request. Each has two implementations with one contract:

- the native one, ``eospack._native`` (Rust, ``native/``), built with the package when a
  Rust compiler is there; Arrow data crosses through the Arrow C data interface, no copy;
- the reference one: kafka-python's own record code (``Fetcher.PartitionRecords`` on a
  ``MemoryRecords``, ``DefaultRecordBatchBuilder``) and pyarrow, record by record in Python.

``integration_tests/kafka_source/test_record_batches_differential.py`` holds them together
on batches written by kafka-python, librdkafka and the Java producer. Legacy message sets (magic 0
and 1, which a broker may still return for old data) are always decoded by the reference.
``EOSPACK_NATIVE=0`` selects the reference path everywhere (it is what runs on a machine
that could not build the extension, with one warning per query).
"""

from __future__ import annotations

import logging
from collections import namedtuple
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..client.strict_records import strict_kafka_records
from ..errors import (
    CorruptRecordsError,
    RecordRefusedError,
    TimestampOutOfRangeError,
)
from . import schema as record_schema
from .native_path import (
    NATIVE,
    active_path,
)

log = logging.getLogger(__name__)

HEADER_BYTES = 61
"""The fixed part of a record batch (format v2) before its records."""

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
"""The attribute bits of each ``compression.type`` a record batch can carry."""

HEADER_ITEM = record_schema.arrow_header_item()
HEADERS = record_schema.arrow_headers()
ARROW_SCHEMA = record_schema.arrow_schema(include_headers=False)
ARROW_SCHEMA_WITH_HEADERS = record_schema.arrow_schema(include_headers=True)
"""The source's rows, as Spark's own Kafka source has them (pyspark's Arrow types)."""

AbortedTransaction = namedtuple("AbortedTransaction", ["producer_id", "first_offset"])


@dataclass(frozen=True)
class DecodedRecords:
    batch: pa.RecordBatch
    """The records at or after the fetch offset, in offset order, in the source's schema."""
    next_fetch_offset: int
    """Where the next fetch starts: past the last batch read (markers, aborted and
    compacted offsets included)."""
    leader_epoch: int


LONG_MAX = 2**63 - 1
MAX_TIMESTAMP_MILLIS = LONG_MAX // 1000
"""Milliseconds since the epoch whose microseconds still fit a long (Spark's TimestampType)."""
MIN_TIMESTAMP_MILLIS = -MAX_TIMESTAMP_MILLIS


def timestamp_out_of_range(topic: str, partition: int, offset: int, millis: int) -> str:
    """The one-line error of both paths (the native one is ``timestamp_out_of_range`` in
    ``native/src/decode.rs``)."""
    return (
        f"Record {topic}-{partition} at offset {offset} has timestamp {millis} ms, outside what"
        f" Spark's TimestampType holds ({MIN_TIMESTAMP_MILLIS} to {MAX_TIMESTAMP_MILLIS} ms since"
        " the epoch; Spark's own Kafka source fails on it too): fix the producer's timestamps"
        " (milliseconds since the epoch) or skip these offsets with startingOffsets"
    )


def decode(
    raw: bytes,
    fetch_offset: int,
    topic: str,
    partition: int,
    *,
    read_committed: bool,
    aborted_transactions: Sequence[tuple[int, int]] = (),
    include_headers: bool,
    check_crcs: bool = True,
    native: bool | None = None,
) -> DecodedRecords:
    """The records of one partition's Fetch data; ``aborted_transactions`` are the
    response's (producer id, first offset) pairs. ``native`` forces a path (tests)."""
    use_native = NATIVE is not None if native is None else native
    if use_native:
        if NATIVE is None:
            raise RuntimeError(active_path())
        try:
            result = NATIVE.decode_records(
                raw if isinstance(raw, bytes) else bytes(raw),
                fetch_offset,
                topic,
                partition,
                read_committed,
                [(int(pid), int(first)) for pid, first in aborted_transactions],
                include_headers,
                check_crcs,
            )
        except OverflowError as error:
            raise TimestampOutOfRangeError(str(error)) from None
        except ValueError as error:
            raise CorruptRecordsError(str(error)) from None
        if result is not None:
            schema, array, next_fetch_offset, leader_epoch = result
            batch = pa.RecordBatch._import_from_c_capsule(schema, array)
            return DecodedRecords(batch, next_fetch_offset, leader_epoch)
    return reference_decode(
        raw,
        fetch_offset,
        topic,
        partition,
        read_committed=read_committed,
        aborted_transactions=aborted_transactions,
        include_headers=include_headers,
        check_crcs=check_crcs,
    )


def reference_decode(
    raw: bytes,
    fetch_offset: int,
    topic: str,
    partition: int,
    *,
    read_committed: bool,
    aborted_transactions: Sequence[tuple[int, int]] = (),
    include_headers: bool,
    check_crcs: bool = True,
) -> DecodedRecords:
    """kafka-python's consumer record code on the same bytes, then pyarrow."""
    from kafka import TopicPartition
    from kafka.errors import CorruptRecordError
    from kafka.protocol.consumer.offsets import IsolationLevel

    memory_records, partition_records = strict_kafka_records()
    level = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    records = partition_records(
        fetch_offset,
        TopicPartition(topic, partition),
        memory_records(bytes(raw)),
        check_crcs=check_crcs,
        isolation_level=level,
        aborted_transactions=[AbortedTransaction(*pair) for pair in aborted_transactions],
    )
    try:
        taken = records.take()
    except CorruptRecordError as error:
        raise CorruptRecordsError(str(error)) from None
    batch = records_to_arrow(taken, topic, partition, include_headers)
    return DecodedRecords(batch, records.next_fetch_offset, records.leader_epoch)


def records_to_arrow(
    records: Sequence[Any], topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """kafka-python ConsumerRecords as columns: one transpose, no per-row objects."""
    schema = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
    if not records:
        return pa.RecordBatch.from_pylist([], schema=schema)
    columns = list(zip(*records, strict=True))
    count = len(records)
    # ConsumerRecord fields: topic, partition, leader_epoch, offset, timestamp,
    # timestamp_type, key, value, headers, ...
    arrays = [
        pa.array(columns[6], pa.binary()),
        pa.array(columns[7], pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([partition] * count, pa.int32()),
        pa.array(columns[3], pa.int64()),
        _timestamps(_no_timestamp(columns[4]), columns[3], topic, partition),
        pa.array(_no_timestamp(columns[5]), pa.int32()),
    ]
    if include_headers:
        arrays.append(_headers(columns[8]))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _no_timestamp(values: Sequence[int | None]) -> Sequence[int]:
    """A message of magic 0 has no timestamp (kafka-python: None): the Java consumer reads
    ``NO_TIMESTAMP`` (-1) and ``NO_TIMESTAMP_TYPE`` (-1), so Spark's source has
    1969-12-31T23:59:59.999Z and -1 there, not nulls."""
    if None not in values:
        return values  # type: ignore[return-value]
    return [-1 if value is None else value for value in values]


def _timestamps(
    millis: Sequence[int], offsets: Sequence[int], topic: str, partition: int
) -> pa.Array:
    """Record timestamps (ms) as Spark's microseconds, checked: the first record beyond
    Spark's range fails the read (kafka-python adds base and delta as Python ints, so a sum
    beyond a long is seen too)."""
    try:
        return pc.multiply_checked(pa.array(millis, pa.int64()), 1000).cast(
            pa.timestamp("us", tz="UTC")
        )
    except (OverflowError, pa.ArrowInvalid):
        for offset, value in zip(offsets, millis, strict=True):
            if not MIN_TIMESTAMP_MILLIS <= value <= MAX_TIMESTAMP_MILLIS:
                message = timestamp_out_of_range(topic, partition, offset, value)
                raise TimestampOutOfRangeError(message) from None
        raise


def _headers(per_record: Sequence[Any]) -> pa.Array:
    """headers array<struct<key, value>>; null for a record without headers, as in Spark."""
    offsets = [0]
    keys: list[str] = []
    values: list[bytes | None] = []
    valid = []
    for headers in per_record:
        if headers:
            for key, value in headers:
                keys.append(key)
                values.append(value)
        offsets.append(len(keys))
        valid.append(bool(headers))
    items = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADER_ITEM)
    )
    mask = pa.array([not v for v in valid], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), items, type=HEADERS, mask=mask)


@dataclass(frozen=True)
class EncodedBatch:
    partition: int
    records: int
    data: bytearray
    """A record batch (format v2) without producer state: ``set_producer_state`` stamps
    producer id, epoch, base sequence and the transactional bit when it is sent."""


@dataclass(frozen=True)
class EncodeSettings:
    partitions: int
    """The topic's partition count (Kafka's default partitioner: murmur2 of the key)."""
    max_batch_bytes: int
    """A batch closes before its records pass this size (a larger record goes alone)."""
    max_record_bytes: int
    """A record whose batch alone is larger is refused (the producer's max.request.size)."""
    compression: str
    timestamp_ms: int


def encode(
    rows: pa.RecordBatch,
    settings: EncodeSettings,
    sticky_partition: int,
    *,
    native: bool | None = None,
) -> tuple[list[EncodedBatch], int]:
    """Rows with the sink's columns (``value``; optional ``key``, ``partition``,
    ``headers``) as record batches, in row order within each partition. Rows without
    partition and key go to ``sticky_partition`` until its batch is full, then to the next
    (KIP-480's sticky partitioner); the sticky partition to continue with is returned."""
    use_native = NATIVE is not None if native is None else native
    if not use_native:
        return reference_encode(rows, settings, sticky_partition)
    if NATIVE is None:
        raise RuntimeError(active_path())
    schema_capsule, array_capsule = rows.__arrow_c_array__()
    try:
        batches, sticky = NATIVE.encode_records(
            schema_capsule,
            array_capsule,
            settings.partitions,
            sticky_partition,
            settings.max_batch_bytes,
            settings.max_record_bytes,
            settings.timestamp_ms,
            CODECS[settings.compression],
        )
    except ValueError as error:
        raise RecordRefusedError(str(error)) from None
    return [EncodedBatch(*batch) for batch in batches], sticky


def set_producer_state(
    batch: bytearray, producer_id: int, epoch: int, base_sequence: int, transactional: bool
) -> None:
    """Stamp the producer's state into an encoded batch (in place) and fix its CRC."""
    if NATIVE is not None:
        NATIVE.set_producer_state(batch, producer_id, epoch, base_sequence, transactional)
        return
    reference_set_producer_state(batch, producer_id, epoch, base_sequence, transactional)


def reference_set_producer_state(
    batch: bytearray, producer_id: int, epoch: int, base_sequence: int, transactional: bool
) -> None:
    import struct

    from kafka.record.util import calc_crc32c

    attributes = struct.unpack_from(">h", batch, 21)[0]
    attributes = attributes | 0x10 if transactional else attributes & ~0x10
    struct.pack_into(">h", batch, 21, attributes)
    struct.pack_into(">qhi", batch, 43, producer_id, epoch, base_sequence)
    struct.pack_into(">I", batch, 17, calc_crc32c(bytes(batch[21:])))


def reference_encode(
    rows: pa.RecordBatch, settings: EncodeSettings, sticky_partition: int
) -> tuple[list[EncodedBatch], int]:
    """kafka-python's ``DefaultRecordBatchBuilder``, record by record: the same batches."""
    from kafka.partitioner.default import murmur2
    from kafka.record.default_records import DefaultRecordBatchBuilder

    names = rows.schema.names
    column = {name: rows.column(name).to_pylist() for name in names}
    keys = column.get("key", [None] * rows.num_rows)
    values = column["value"]
    explicit = column.get("partition", [None] * rows.num_rows)
    headers = column.get("headers", [None] * rows.num_rows)
    count = settings.partitions
    if count <= 0:
        raise RecordRefusedError("the topic has no partitions")
    open_batches: dict[int, DefaultRecordBatchBuilder] = {}
    sizes: dict[int, int] = {}
    done: list[EncodedBatch] = []
    sticky = sticky_partition % count

    def builder() -> DefaultRecordBatchBuilder:
        return DefaultRecordBatchBuilder(
            magic=2,
            compression_type=CODECS[settings.compression],
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=2**31 - 1,
        )

    def close(partition: int) -> None:
        batch = open_batches.pop(partition)
        records = sizes.pop(partition)
        data = bytearray(batch.build())
        write_no_leader_epoch(data)
        done.append(EncodedBatch(partition, records, data))

    def full(partition: int, key: bytes | None, value: bytes | None, headers: Any) -> bool:
        record_size = DefaultRecordBatchBuilder.size_in_bytes(
            sizes[partition], 0, key, value, headers
        )
        return open_batches[partition].size() + record_size > settings.max_batch_bytes

    for row in range(rows.num_rows):
        key = _as_bytes(keys[row])
        value = _as_bytes(values[row])
        record_headers = [
            (str(item["key"]), _as_bytes(item["value"])) for item in (headers[row] or [])
        ]
        if any(item["key"] is None for item in headers[row] or []):
            raise RecordRefusedError("a header has a null key")
        wanted = explicit[row]
        if wanted is not None and not 0 <= wanted < count:
            raise RecordRefusedError(
                f"a row asks for partition {wanted}, but the topic has {count} partitions"
            )
        unkeyed = wanted is None and key is None
        target = (
            wanted
            if wanted is not None
            else (murmur2(key) & 0x7FFFFFFF) % count
            if key is not None
            else sticky
        )
        delta = sizes.get(target, 0)
        record_size = DefaultRecordBatchBuilder.size_in_bytes(delta, 0, key, value, record_headers)
        if HEADER_BYTES + record_size > settings.max_record_bytes:
            raise RecordRefusedError(
                f"a record of {HEADER_BYTES + record_size} bytes (key, value and headers) is"
                f" larger than max.request.size ({settings.max_record_bytes} bytes)"
            )
        if target in open_batches and full(target, key, value, record_headers):
            close(target)
            if unkeyed:
                sticky = (sticky + 1) % count
                target = sticky
                if target in open_batches and full(target, key, value, record_headers):
                    close(target)
        batch = open_batches.get(target)
        if batch is None:
            batch = open_batches[target] = builder()
            sizes[target] = 0
        batch.append(sizes[target], settings.timestamp_ms, key, value, record_headers)
        sizes[target] += 1
    for partition in sorted(open_batches):
        close(partition)
    return done, sticky


def write_no_leader_epoch(data: bytearray) -> None:
    """kafka-python writes partition leader epoch 0 where the Java producer writes -1 (the
    broker sets it either way); the reference writes -1 too, so both paths give equal
    bytes. The CRC does not cover the field."""
    import struct

    struct.pack_into(">i", data, 12, -1)


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()
