"""Executor side of 2pc-s3: encode a task's Arrow batches and upload them, uncompleted.

Guarantee: ``TaskWriter.prepare`` leaves every file of the task as an S3 multipart upload
whose parts are all uploaded but which is NOT completed (``multipart``), so no reader (of
any kind) can see it; the returned piece names each file's key, upload id and part ETags,
which is all the driver needs to complete (commit) or abort (roll back) it later. A task
that fails aborts what it started (best effort; recovery aborts what a killed task left).

Files: keys follow ``keys`` (Hive-style directories for ``partitionBy``, the transaction
id in every key), contents ``encoders``. A file rolls over to the next at about
``targetFileSize``. With ``partitionBy`` a task keeps one open file per directory; once
they buffer more than ``MAX_BUFFERED_BYTES`` together, the largest is closed early
(smaller files, bounded memory). A task without rows produces no file (S3 cannot complete
an upload of zero parts).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...commit_protocols import TaskIdentity
from ...commit_protocols.pieces import PreparedPiece
from .encoders import FileEncoder, JsonLinesEncoder, ParquetEncoder
from .keys import object_key, partition_directory
from .multipart import PART_SIZE, MultipartObject, PartUploader
from .options import S3SinkOptions

ROW_GROUP_BYTES = 16 * 1024 * 1024
MAX_BUFFERED_BYTES = 256 * 1024 * 1024


class _OpenFile:
    def __init__(self, upload: MultipartObject, encoder: FileEncoder):
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
                        self._close(open_files, prepared, directory)
                if len(open_files) > 1 and _buffered(open_files) > MAX_BUFFERED_BYTES:
                    largest = max(open_files, key=lambda name: _buffered_of(open_files[name]))
                    self._close(open_files, prepared, largest)
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
        return task.piece(rows, {"files": files})

    def _close(
        self, open_files: dict[str, _OpenFile], prepared: list[_OpenFile], directory: str
    ) -> None:
        """Finish encoding a file and hand its last part to the upload threads; the file
        moves to ``prepared`` first, so that a failure here still aborts its upload."""
        current = open_files.pop(directory)
        prepared.append(current)
        current.encoder.close()
        current.upload.seal()

    def _open(
        self,
        pool: PartUploader,
        directory: str,
        transaction: str,
        number: int,
        batch: pa.RecordBatch,
    ) -> _OpenFile:
        options = self.options
        key = object_key(options.location.prefix, directory, transaction, number, options.extension)
        upload = MultipartObject(self.client, options.location.bucket, key, pool)
        if options.file_format == "parquet":
            schema = self._data_schema(batch.schema)
            return _OpenFile(upload, ParquetEncoder(upload, schema, self.row_group_bytes))
        return _OpenFile(upload, JsonLinesEncoder(upload))

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
