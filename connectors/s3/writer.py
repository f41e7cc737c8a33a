"""Executor side of 2pc-s3: encode a task's Arrow batches and upload them, uncompleted.

Guarantee: ``TaskWriter.prepare`` leaves every file of the task as an S3 multipart upload
whose parts are all uploaded but which is NOT completed, so no reader (of any kind) can
see it; the returned piece names each file's key, upload id and part ETags, which is all
the driver needs to complete (commit) or abort (roll back) it later. A task that fails
aborts what it started (best effort; recovery aborts what a killed task left).

Layout: ``<prefix>/[col=value/...]<transaction id>.<file number>.<parquet|jsonl>``, with
Hive-style directories for ``partitionBy`` (values escaped as Spark escapes them). The
transaction id (``eospack-<sink>-<batch>-<partition>-<attempt>``) in every key is how
recovery tells this sink's uploads from anyone else's under the same prefix. A file rolls
over to the next at about ``targetFileSize``; parts are ``PART_SIZE`` bytes except the
last (S3 needs >= 5 MiB) and are uploaded by a few threads while encoding goes on. With
``partitionBy`` a task keeps one open file per directory; once they buffer more than
``MAX_BUFFERED_BYTES`` together, the largest is closed early (smaller files, bounded
memory). A task without rows produces no file (S3 cannot complete an upload of zero parts).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError, ClientError

from commit_protocols import TaskIdentity, parse_transaction_id
from commit_protocols.pieces import PreparedPiece
from connectors.s3.client import S3WriteError, describe_error, is_no_such_upload
from connectors.s3.options import EOSPACK_DIRECTORY, S3SinkOptions

logger = logging.getLogger("eospack.s3")

PART_SIZE = 8 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS_IN_FLIGHT = 4
ROW_GROUP_BYTES = 16 * 1024 * 1024
MAX_BUFFERED_BYTES = 256 * 1024 * 1024
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Spark's ExternalCatalogUtils.escapePathName set: these become %XX in directory names.
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(code) for code in range(1, 32))


def escape_path_name(value: str) -> str:
    return "".join(f"%{ord(char):02X}" if char in _ESCAPED else char for char in value)


def unescape_path_name(value: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(value):
        char = value[index]
        if char == "%" and _is_hex(value[index + 1 : index + 3]):
            out.append(chr(int(value[index + 1 : index + 3], 16)))
            index += 3
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(char in "0123456789abcdefABCDEF" for char in text)


def partition_directory(columns: Sequence[str], values: Sequence[Any]) -> str:
    """``a=1/b=x%2Fy/`` for Hive-style partitioning ("" without partition columns)."""
    return "".join(
        f"{escape_path_name(column)}={_partition_text(value)}/"
        for column, value in zip(columns, values, strict=True)
    )


def _partition_text(value: Any) -> str:
    if value is None or value == "":
        return HIVE_DEFAULT_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return escape_path_name(str(value))


def partition_values_of_key(relative_key: str) -> dict[str, str | None]:
    """The ``column=value`` directories of a key below the prefix, unescaped (None for null)."""
    values: dict[str, str | None] = {}
    for segment in relative_key.split("/")[:-1]:
        column, separator, text = segment.partition("=")
        if not separator:
            continue
        value = unescape_path_name(text)
        values[unescape_path_name(column)] = None if value == HIVE_DEFAULT_PARTITION else value
    return values


def object_key(prefix: str, directory: str, transaction: str, number: int, extension: str) -> str:
    return f"{prefix}/{directory}{transaction}.{number:05d}.{extension}"


def transaction_id_of_key(prefix: str, key: str) -> str | None:
    """The eospack transaction id a data file's key carries, or None for any other key."""
    if not key.startswith(f"{prefix}/") or key.startswith(f"{prefix}/{EOSPACK_DIRECTORY}/"):
        return None
    name = key.rsplit("/", 1)[-1]
    transaction = name.split(".", 1)[0]
    return transaction if parse_transaction_id(transaction) is not None else None


class MultipartObject:
    """One S3 object written as a multipart upload that is never completed here.

    A file-like sink for the encoders: ``write`` buffers and hands each full part to the
    task's upload threads; ``finish`` uploads the rest and returns the file's handle.
    """

    def __init__(self, client: Any, bucket: str, key: str, pool: PartUploader) -> None:
        self.client = client
        self.bucket = bucket
        self.key = key
        self.pool = pool
        self.upload_id: str | None = None
        self.rows = 0
        self._buffer = bytearray()
        self._written = 0
        self._parts: list[Future[dict[str, Any]]] = []
        self.closed = False

    # File-like protocol used by pyarrow's ParquetWriter.
    def write(self, data: Any) -> int:
        self._buffer += data
        self._written += len(data)
        while len(self._buffer) >= self.pool.part_size:
            self._submit(bytes(self._buffer[: self.pool.part_size]))
            del self._buffer[: self.pool.part_size]
        return len(data)

    def tell(self) -> int:
        return self._written

    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def seal(self) -> None:
        """Hand the last (possibly short) part to the upload threads; no more writes."""
        if self._buffer or not self._parts:
            self._submit(bytes(self._buffer))
            self._buffer.clear()

    def finish(self) -> dict[str, Any]:
        """Wait for every part: the handle of the prepared (uploaded, uncompleted) file."""
        self.seal()
        parts = [future.result() for future in self._parts]
        return {
            "key": self.key,
            "upload_id": self.upload_id,
            "parts": parts,
            "rows": self.rows,
            "bytes": self._written,
        }

    def abort(self) -> None:
        """Best effort: discard the upload (recovery aborts it if this fails too)."""
        for future in self._parts:
            future.cancel()
        for future in self._parts:
            try:
                future.exception()
            except Exception:  # cancelled or failed: abort the upload anyway
                pass
        if self.upload_id is None:
            return
        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self.key, UploadId=self.upload_id
            )
        except (ClientError, BotoCoreError) as error:
            if not is_no_such_upload(error):
                logger.warning(
                    "could not abort the upload of s3://%s/%s (%s): the next commit of this"
                    " sink aborts it", self.bucket, self.key, describe_error(error),
                )  # fmt: skip

    def _submit(self, body: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self._call(
                "start the upload of",
                lambda: self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=self.key, ChecksumAlgorithm="CRC32"
                ),
            )["UploadId"]
        number = len(self._parts) + 1
        upload_id = self.upload_id
        self._parts.append(self.pool.submit(lambda: self._upload_part(upload_id, number, body)))

    def _upload_part(self, upload_id: str, number: int, body: bytes) -> dict[str, Any]:
        answer = self._call(
            f"upload part {number} of",
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=self.key,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ChecksumAlgorithm="CRC32",
            ),
        )
        part = {"PartNumber": number, "ETag": answer["ETag"]}
        if answer.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = answer["ChecksumCRC32"]
        return part

    def _call(self, what: str, call: Any) -> Any:
        try:
            return call()
        except (ClientError, BotoCoreError) as error:
            raise S3WriteError(
                f"2pc-s3 could not {what} s3://{self.bucket}/{self.key}"
                f" ({describe_error(error)}): the task fails and Spark may retry it;"
                " nothing of it is visible"
            ) from error


class PartUploader:
    """The task's upload threads; at most ``MAX_PARTS_IN_FLIGHT`` parts held in memory."""

    def __init__(self, part_size: int = PART_SIZE, threads: int = MAX_PARTS_IN_FLIGHT) -> None:
        self.part_size = part_size
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="eospack-s3-part")
        self._pending: list[Future[Any]] = []
        self._limit = threads

    def submit(self, call: Any) -> Future[Any]:
        self._pending = [future for future in self._pending if not future.done()]
        while len(self._pending) >= self._limit:
            self._pending.pop(0).result()
        future = self._executor.submit(call)
        self._pending.append(future)
        return future

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class _ParquetEncoder:
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


class _JsonLinesEncoder:
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


class _OpenFile:
    def __init__(self, upload: MultipartObject, encoder: _ParquetEncoder | _JsonLinesEncoder):
        self.upload = upload
        self.encoder = encoder


class TaskWriter:
    """Writes one task's rows into prepared (uploaded, uncompleted) files."""

    def __init__(self, options: S3SinkOptions, client: Any, part_size: int = PART_SIZE) -> None:
        self.options = options
        self.client = client
        self.part_size = part_size
        self.row_group_bytes = max(1024 * 1024, min(ROW_GROUP_BYTES, options.target_file_size // 4))

    def prepare(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> PreparedPiece:
        transaction = PreparedPiece(
            task.sink_id, task.batch_id, task.partition_id, task.attempt, 0
        ).transaction_id
        pool = PartUploader(self.part_size)
        open_files: dict[str, _OpenFile] = {}
        prepared: list[_OpenFile] = []
        numbers = iter(range(1, 10**6))
        rows = 0
        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                rows += batch.num_rows
                for directory, rows_of_directory in self._split(batch):
                    current = open_files.get(directory)
                    if current is None:
                        current = self._open(pool, directory, transaction, next(numbers), batch)
                        open_files[directory] = current
                    current.encoder.write(rows_of_directory)
                    current.upload.rows += rows_of_directory.num_rows
                    if current.encoder.encoded_bytes() >= self.options.target_file_size:
                        prepared.append(self._close(open_files, directory))
                if len(open_files) > 1 and _buffered(open_files) > MAX_BUFFERED_BYTES:
                    largest = max(open_files, key=lambda name: _buffered_of(open_files[name]))
                    prepared.append(self._close(open_files, largest))
            for current in open_files.values():
                current.encoder.close()
            prepared.extend(open_files.values())
            open_files.clear()
            files = [current.upload.finish() for current in prepared]
        except BaseException:
            for current in [*prepared, *open_files.values()]:
                current.upload.abort()
            raise
        finally:
            pool.shutdown()
        return PreparedPiece(
            task.sink_id, task.batch_id, task.partition_id, task.attempt, rows, {"files": files}
        )

    def _close(self, open_files: dict[str, _OpenFile], directory: str) -> _OpenFile:
        """Finish encoding a file and hand its last part to the upload threads."""
        current = open_files.pop(directory)
        current.encoder.close()
        current.upload.seal()
        return current

    def _open(
        self, pool: PartUploader, directory: str, transaction: str, number: int,
        batch: pa.RecordBatch,
    ) -> _OpenFile:  # fmt: skip
        options = self.options
        key = object_key(options.location.prefix, directory, transaction, number, options.extension)
        upload = MultipartObject(self.client, options.location.bucket, key, pool)
        if options.file_format == "parquet":
            schema = self._data_schema(batch.schema)
            return _OpenFile(upload, _ParquetEncoder(upload, schema, self.row_group_bytes))
        return _OpenFile(upload, _JsonLinesEncoder(upload))

    def _data_schema(self, schema: pa.Schema) -> pa.Schema:
        for column in self.options.partition_by:
            schema = schema.remove(schema.get_field_index(column))
        return schema

    def _split(self, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
        """(partition directory, the batch's rows in it without partition columns)."""
        columns = self.options.partition_by
        if not columns:
            yield "", batch
            return
        data = batch.drop_columns(list(columns))
        keys = pa.Table.from_batches([batch.select(list(columns))])
        distinct = keys.group_by(list(columns), use_threads=False).aggregate([])
        if distinct.num_rows == 1:
            yield partition_directory(columns, _row(distinct, columns, 0)), data
            return
        for index in range(distinct.num_rows):
            values = _row(distinct, columns, index)
            mask = None
            for column, value in zip(columns, values, strict=True):
                array = batch.column(column)
                matches = pc.is_null(array) if value is None else pc.equal(array, value)
                matches = pc.fill_null(matches, False)
                mask = matches if mask is None else pc.and_(mask, matches)
            yield partition_directory(columns, values), data.filter(mask)


def _buffered_of(current: _OpenFile) -> int:
    return current.encoder.buffered_bytes() + current.upload.buffered_bytes()


def _buffered(open_files: dict[str, _OpenFile]) -> int:
    return sum(_buffered_of(current) for current in open_files.values())


def _row(table: pa.Table, columns: Sequence[str], index: int) -> list[Any]:
    return [table.column(name)[index].as_py() for name in columns]
