"""File encoders of 2pc-s3: Arrow record batches into Parquet or JSON Lines bytes.

Each encoder writes into one ``MultipartObject`` (a file-like sink that uploads full
parts as they fill) and reports how many bytes it has encoded (to roll over to the next
file at about ``targetFileSize``) and how many it still holds in memory (to bound a
task's memory across open files). Parquet is Snappy-compressed with one row group per
``row_group_bytes`` of buffered Arrow data; JSON Lines spells values Spark's JSON writer
way (ISO dates and times, base64 binary, decimals as numbers). The task writer hands them
rows without the ``partitionBy`` columns: those live in the object's directories.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from .multipart import MultipartObject


class FileEncoder(Protocol):
    """What the task writer needs of an encoder."""

    def write(self, batch: pa.RecordBatch) -> None: ...

    def encoded_bytes(self) -> int:
        """Bytes handed to the object so far."""
        ...

    def buffered_bytes(self) -> int:
        """Bytes the encoder holds that it has not handed to the object yet."""
        ...

    def close(self) -> None:
        """Hand everything left (and the file's footer) to the object."""
        ...


class ParquetEncoder:
    def __init__(self, sink: MultipartObject, schema: pa.Schema, row_group_bytes: int) -> None:
        self.sink = sink
        self.row_group_bytes = row_group_bytes
        self._writer = pq.ParquetWriter(sink, schema, compression="snappy")
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self.row_group_bytes:
            self._flush()

    def encoded_bytes(self) -> int:
        return self.sink.tell()

    def buffered_bytes(self) -> int:
        return self._pending_bytes

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if self._pending:
            table = pa.Table.from_batches(self._pending)
            self._writer.write_table(table, row_group_size=table.num_rows)
            self._pending = []
            self._pending_bytes = 0


class JsonLinesEncoder:
    def __init__(self, sink: MultipartObject) -> None:
        self.sink = sink

    def write(self, batch: pa.RecordBatch) -> None:
        lines = "".join(
            json.dumps(row, default=_json_value, separators=(",", ":"), ensure_ascii=False) + "\n"
            for row in batch.to_pylist()
        )
        self.sink.write(lines.encode())

    def encoded_bytes(self) -> int:
        return self.sink.tell()

    def buffered_bytes(self) -> int:
        return 0

    def close(self) -> None:
        return None


def _json_value(value: Any) -> Any:
    """JSON for what ``json`` cannot encode, as Spark's JSON writer spells it."""
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write a {type(value).__name__} value as JSON")
