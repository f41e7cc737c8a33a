"""kafka-python's record code made strict, for the pure-Python reference decoder
(``records/record_batches.py``): subclasses of ``DefaultRecordBatch``, ``MemoryRecords`` and
``Fetcher.PartitionRecords`` that override private methods and read private fields. Kept in
the client room with kafka-python's other private parts;
``tests/test_kafka_private_api_canary.py`` fails when an installed kafka-python lacks one
of the names used here."""

from __future__ import annotations

import functools
from typing import Any

LONG_MAX = 2**63 - 1
"""Kafka's largest offset + 1 (Java's Long.MAX_VALUE)."""


@functools.cache
def strict_kafka_records() -> tuple[type, type]:
    """kafka-python's ``MemoryRecords`` and ``Fetcher.PartitionRecords`` with the rules of
    Kafka's record format (v2) that kafka-python leaves out and the Java consumer and the
    native path keep, so that both paths read the same records from the same bytes or both
    refuse them: varints are int32 (the timestamp delta an int64), never read beyond (Python
    ints do not wrap where Java's do); a record's attributes are one byte (kafka-python reads
    a varint there); a batch's last offset and a record's offset stay below Long.MAX_VALUE;
    a header key of malformed UTF-8 reads as Spark's source reads it (U+FFFD), not as
    corrupt data; an empty control batch (the log cleaner keeps them) is no transaction
    marker, and a control record without a 4-byte key or with a negative version is corrupt
    (kafka-python raised ``RuntimeError``/``struct.error`` on both); a payload that fails to
    decompress is corrupt data (not the codec library's own error)."""
    from kafka.consumer.fetcher import Fetcher
    from kafka.errors import CorruptRecordError, UnsupportedCodecError
    from kafka.record import MemoryRecords
    from kafka.record.default_records import (
        ControlRecord,
        DefaultRecord,
        DefaultRecordBatch,
    )
    from kafka.record.util import decode_varint

    def number(buffer: bytearray, pos: int, bits: int) -> tuple[int, int]:
        value, pos = decode_varint(buffer, pos)
        if not -(1 << bits) <= value < 1 << bits:
            raise ValueError(f"varint {value} beyond an int{bits + 1}")
        return value, pos

    def nullable(buffer: bytearray, pos: int, end: int) -> tuple[bytes | None, int]:
        length, pos = number(buffer, pos, 31)
        if length < 0:
            return None, pos
        if pos + length > end:
            raise ValueError("truncated record")
        return bytes(buffer[pos : pos + length]), pos + length

    class StrictBatch(DefaultRecordBatch):  # type: ignore[misc]
        __slots__ = ()

        def _maybe_uncompress(self) -> None:
            """A payload that fails to decompress is corrupt data (the codec libraries
            raise their own errors: BadGzipFile, ZstdError, struct.error...)."""
            try:
                super()._maybe_uncompress()
            except UnsupportedCodecError:
                raise
            except Exception as error:
                raise CorruptRecordError(
                    f"cannot decompress the record batch at offset {self.base_offset}:"
                    f" {type(error).__name__}: {error}"
                ) from None

        def _read_msg(self, decode_varint: Any = None) -> Any:
            buffer = self._buffer
            length, pos = number(buffer, self._pos, 31)  # type: ignore[has-type]
            if length < 0:
                raise ValueError(f"negative record length {length}")
            start, end = pos, pos + length
            if end > len(buffer):
                raise ValueError("truncated record")
            pos += 1  # attributes: one byte
            timestamp_delta, pos = number(buffer, pos, 63)
            offset_delta, pos = number(buffer, pos, 31)
            offset = self.base_offset + offset_delta
            if offset >= LONG_MAX:
                raise ValueError("its offset is beyond the largest offset Kafka can hold")
            key, pos = nullable(buffer, pos, end)
            value, pos = nullable(buffer, pos, end)
            header_count, pos = number(buffer, pos, 31)
            if header_count < 0:
                raise ValueError(f"invalid number of record headers {header_count}")
            headers = []
            for _ in range(header_count):
                header_key, pos = nullable(buffer, pos, end)
                if header_key is None:
                    raise ValueError("a header key is null")
                header_value, pos = nullable(buffer, pos, end)
                headers.append((header_key.decode("utf-8", "replace"), header_value))
            if pos != end:
                raise ValueError(
                    f"invalid record size: {length} bytes, but its fields take {pos - start}"
                )
            self._pos = pos  # type: ignore[misc]
            timestamp = (
                self.max_timestamp
                if self.timestamp_type == self.LOG_APPEND_TIME
                else self.first_timestamp + timestamp_delta
            )
            if not self.is_control_batch:
                return DefaultRecord(
                    length, offset, timestamp, self.timestamp_type, key, value, headers
                )
            if key is None or len(key) < 4:
                raise ValueError("a control record without a key of 4 bytes")
            if key[0] & 0x80:
                raise ValueError("a control record key of a negative version")
            return ControlRecord(
                length, offset, timestamp, self.timestamp_type, key[:4], value, headers
            )

    class StrictMemoryRecords(MemoryRecords):  # type: ignore[misc]
        def next_batch(self, *arguments: Any, **keywords: Any) -> Any:
            batch = super().next_batch(*arguments, **keywords)
            if isinstance(batch, DefaultRecordBatch):
                if batch.base_offset + batch.last_offset_delta >= LONG_MAX:
                    raise CorruptRecordError(
                        f"the record batch at offset {batch.base_offset} has a last offset"
                        " beyond the largest offset Kafka can hold"
                    )
                batch.__class__ = StrictBatch
            return batch

    class StrictPartitionRecords(Fetcher.PartitionRecords):  # type: ignore[misc]
        def _contains_abort_marker(self, batch: Any) -> bool:
            if not batch.is_control_batch or batch.records_count <= 0:
                return False
            return bool(next(batch).abort)

    return StrictMemoryRecords, StrictPartitionRecords
