"""``format("2pc-s3")``: exactly-once Parquet / JSON Lines files in S3, and their reader.

Guarantee: with ``deliveryGuarantee=exactly-once`` (default) each micro-batch's rows land
in S3 exactly once, and a reader of this format sees each batch's files entirely or not
at all, across crashes of the driver or executors, lost or failed S3 requests (including
a lost answer to the decision's write, and a failure after the decision, when Spark's
abort rolls the batch forward instead of back), provided the query restarts from its
checkpoint. Tasks upload their files as multipart uploads without completing them; the
driver writes the batch's manifest with a conditional put (the decision) and then
completes the uploads; recovery completes decided uploads and aborts the rest
(``eospack.connectors.s3.resource``). Limits: the manifests are the truth: only
``spark.read.format("2pc-s3")`` is guaranteed to see whole batches (a plain file listing
may catch a batch between its first and last completion); a query that never restarts
leaves its last prepared uploads to the bucket's lifecycle rule, whose delay must exceed
the longest time a query may stay down (a decided upload it aborts fails the restart with
``DecidedPieceLostError``, never silently); ``complete`` output mode is not supported.
``at-least-once`` completes files in each task and may duplicate them when tasks or
batches are retried.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, WriterCommitMessage
from pyspark.sql.types import StructType

from eospack.core.logs import make_logs_visible

from ...commit_protocols import (
    TaskIdentity,
    TwoPhaseCommitCoordinator,
    TwoPhaseCommitStreamWriter,
    prepared_pieces_of,
)
from ...commit_protocols.pieces import PreparedPiece
from .client import CREDENTIALS_HINT, check_access, s3_client
from .errors import S3OptionError, S3ReadError, S3WriteError
from .options import (
    S3Connection,
    S3Location,
    S3SinkOptions,
    parse_reader_options,
    parse_sink_options,
)
from .reader import PARTITION_COLUMN_TYPES, CommittedDataReader, plan_read
from .resource import S3Resource, complete_file, write_task_manifest
from .writer import TaskWriter

SINK_NAME = "2pc-s3"


class TwoPhaseS3DataSource(DataSource):
    """``writeStream.format("2pc-s3")`` and ``read.format("2pc-s3")``: see the module doc."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> S3StreamWriter:
        make_logs_visible()
        options = parse_sink_options(self.options)
        if overwrite:
            raise S3OptionError("outputMode complete is not supported by 2pc-s3: use append")
        check_schema(options, schema)
        _check_access_once(options.connection, options.location)
        return S3StreamWriter(options, schema.json())

    def schema(self) -> StructType:
        plan = self._plan()
        if plan.schema is None:
            options = parse_reader_options(self.options)
            raise S3ReadError(
                f"no committed 2pc-s3 data under {options.location.url}: check path, or pass"
                " .schema(...) to read an empty table"
            )
        return plan.schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return CommittedDataReader(parse_reader_options(self.options), schema, self._plan())

    def _plan(self):  # type: ignore[no-untyped-def]
        plan = getattr(self, "_read_plan", None)
        if plan is None:
            plan = plan_read(parse_reader_options(self.options))
            self._read_plan = plan
        return plan


def check_schema(options: S3SinkOptions, schema: StructType) -> None:
    """partitionBy columns must exist, be of a directory-friendly type, and leave data."""
    fields = {field.name: field for field in schema.fields}
    for column in options.partition_by:
        field = fields.get(column)
        if field is None:
            raise S3OptionError(
                f"partitionBy column {column!r} is not in the DataFrame: use one of"
                f" {', '.join(schema.fieldNames())}"
            )
        if not isinstance(field.dataType, PARTITION_COLUMN_TYPES):
            raise S3OptionError(
                f"partitionBy column {column!r} has type {field.dataType.simpleString()}:"
                " use string, integer, boolean or date columns (cast it first)"
            )
    if len(options.partition_by) == len(schema.fields):
        raise S3OptionError(
            "partitionBy names every column: leave at least one column out to be written"
            " into the files"
        )


@functools.cache
def _check_access_once(connection: S3Connection, location: S3Location) -> None:
    """Bucket exists and is usable: checked at query start, once per Python process and
    connection (its credentials included) and location; a failure raises and is not
    remembered."""
    check_access(connection, location, CREDENTIALS_HINT)


class S3StreamWriter(TwoPhaseCommitStreamWriter):
    """Prepares on executors (``writer.TaskWriter``), commits on the driver (``S3Resource``)."""

    sink_name = SINK_NAME

    def __init__(self, options: S3SinkOptions, schema_json: str) -> None:
        super().__init__(options.sink_id, options.target, options.exactly_once)
        self.options = options
        self.schema_json = schema_json

    def __repr__(self) -> str:
        return f"S3StreamWriter({self.options.describe()})"

    def prepare(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> PreparedPiece:
        client = s3_client(self.options.connection)
        return TaskWriter(self.options, client).prepare(task, batches)

    def write_directly(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> int:
        client = s3_client(self.options.connection)
        piece = TaskWriter(self.options, client).prepare(task, batches)
        bucket = self.options.location.bucket
        for file in piece.handle["files"]:
            if not complete_file(client, bucket, file):
                raise S3WriteError(
                    f"2pc-s3 could not complete s3://{bucket}/{file['key']}: its upload"
                    f" {file['upload_id']} vanished before it was completed (a lifecycle rule"
                    " or another tool aborted it); the task fails and Spark may retry it"
                )
        if piece.handle["files"]:
            write_task_manifest(client, self.options, self.schema_json, piece)
        return piece.rows

    def open_resource(self) -> S3Resource:
        return S3Resource(self.options, self.schema_json, s3_client(self.options.connection))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """The coordinator's abort (never raises for S3 failures), then one log line naming
        each upload it could not complete or abort, and how to find them."""
        if not self.exactly_once:
            return
        resource = self.open_resource()
        try:
            TwoPhaseCommitCoordinator(resource, self.sink_name).abort(messages, batchId)
            resource.log_left_after_abort(prepared_pieces_of(messages), batchId)
        finally:
            resource.close()
