"""``spark.read.format("2pc-s3").load("s3://bucket/prefix")``: only committed data.

Guarantee: the reader returns the rows of exactly the files that decided manifests under
``<prefix>/_eospack/manifests/`` name (every sink writing under the prefix; at-least-once
task manifests count as decided), each once, and of a batch either all files or none: a
batch whose manifest names a file that is not yet complete (a commit in progress, or a
crash awaiting recovery) is skipped with a warning, and an abort fence (a manifest with
status ``aborted``) names no data. Stray objects and incomplete uploads under the prefix
are never read.
Partition columns come back from the Hive-style directories; the schema is the Spark
schema stored in the manifests (all sinks under one prefix must write the same one,
unless ``.schema(...)`` is given: columns a file lacks then read as null).

Cost: one listing of the objects under the prefix and one GET per manifest at planning.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError, ClientError
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from eospack.core.spark_features import arrow_schema_utc

from ...commit_protocols.pieces import DECIDED
from .client import describe_error, s3_client
from .errors import S3ReadError
from .keys import partition_values_of_key
from .options import S3ReaderOptions

logger = logging.getLogger(__name__)

PARTITION_BYTES = 128 * 1024 * 1024
FILE_OPEN_COST_BYTES = 4 * 1024 * 1024
READ_BATCH_ROWS = 65_536
PARTITION_COLUMN_TYPES = (
    StringType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    BooleanType,
    DateType,
)


@dataclass(frozen=True)
class CommittedFile:
    key: str
    size: int
    file_format: str
    partition_values: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class ReadPlan:
    schema: StructType | None
    files: tuple[CommittedFile, ...]
    batches: int
    skipped_batches: tuple[str, ...]


class FilesPartition(InputPartition):
    def __init__(self, files: Sequence[CommittedFile]) -> None:
        super().__init__(tuple(files))
        self.files = tuple(files)


def manifest_status(manifest: Mapping[str, Any]) -> str:
    """``decided`` or ``aborted``; manifests of eospack before version 2 are decisions."""
    return str(manifest.get("status") or DECIDED)


def plan_read(options: S3ReaderOptions) -> ReadPlan:
    """List the prefix once, read every manifest, keep the batches whose files all exist."""
    client = s3_client(options.connection)
    location = options.location
    existing: dict[str, int] = {}
    manifest_keys: list[str] = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=location.bucket, Prefix=location.key("")):
            for entry in page.get("Contents", ()):
                key = entry["Key"]
                if key.startswith(location.manifests_prefix):
                    if key.endswith(".json"):
                        manifest_keys.append(key)
                else:
                    existing[key] = int(entry["Size"])
    except (ClientError, BotoCoreError) as error:
        raise S3ReadError(
            f"2pc-s3 could not list {location.url} ({describe_error(error)}): check path,"
            " endpointUrl, region and credentials"
        ) from error

    def fetch(key: str) -> dict[str, Any]:
        try:
            return json.loads(client.get_object(Bucket=location.bucket, Key=key)["Body"].read())
        except (ClientError, BotoCoreError) as error:
            raise S3ReadError(
                f"2pc-s3 could not read the manifest s3://{location.bucket}/{key}"
                f" ({describe_error(error)})"
            ) from error

    with ThreadPoolExecutor(8) as pool:
        manifests = list(pool.map(fetch, sorted(manifest_keys)))
    schemas: dict[str, str] = {}
    files: list[CommittedFile] = []
    skipped: list[str] = []
    aborted = 0
    for key, manifest in zip(sorted(manifest_keys), manifests, strict=True):
        if manifest_status(manifest) != DECIDED:
            aborted += 1
            continue
        named = manifest.get("files", [])
        missing = [file["key"] for file in named if file["key"] not in existing]
        if missing:
            skipped.append(key)
            logger.warning(
                "2pc-s3 reader skips batch %s of sink %s: %d of its files are not complete"
                " yet (a commit in progress or awaiting recovery)",
                manifest.get("batch_id"),
                manifest.get("sink_id"),
                len(missing),
            )
            continue
        schema_text = json.dumps(
            {"schema": manifest["schema"], "partition_by": manifest.get("partition_by", [])},
            sort_keys=True,
        )
        schemas.setdefault(schema_text, str(manifest.get("sink_id")))
        for file in named:
            relative = file["key"][len(location.key("")) :]
            values = tuple(partition_values_of_key(relative).items())
            files.append(
                CommittedFile(file["key"], existing[file["key"]], manifest["file_format"], values)
            )
    if len(schemas) > 1:
        raise S3ReadError(
            f"sinks {sorted(schemas.values())} wrote different schemas or partitionBy under"
            f" {location.url}: pass .schema(...) to read them together, or read separate paths"
        )
    schema = None
    if schemas:
        schema = StructType.fromJson(json.loads(next(iter(schemas)))["schema"])
    batches = len(manifests) - len(skipped) - aborted
    return ReadPlan(schema, tuple(files), batches, tuple(skipped))


def group_files(files: Sequence[CommittedFile]) -> list[FilesPartition]:
    """Pack files into read tasks of about PARTITION_BYTES (Spark's file packing rule)."""
    partitions: list[FilesPartition] = []
    current: list[CommittedFile] = []
    current_bytes = 0
    for file in sorted(files, key=lambda file: -file.size):
        cost = file.size + FILE_OPEN_COST_BYTES
        if current and current_bytes + cost > PARTITION_BYTES:
            partitions.append(FilesPartition(current))
            current, current_bytes = [], 0
        current.append(file)
        current_bytes += cost
    if current or not partitions:
        partitions.append(FilesPartition(current))
    return partitions


class CommittedDataReader(DataSourceReader):
    """Reads the planned files; pickled to executors with the options and the plan."""

    def __init__(self, options: S3ReaderOptions, schema: StructType, plan: ReadPlan) -> None:
        self.options = options
        self.schema = schema
        self.plan = plan

    def partitions(self) -> Sequence[InputPartition]:
        return group_files(self.plan.files)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilesPartition)
        client = s3_client(self.options.connection)
        arrow_schema = arrow_schema_utc(self.schema)
        for file in partition.files:
            body = self._download(client, file.key)
            values = dict(file.partition_values)
            for batch in _decode(body, file.file_format, self.schema):
                yield _assemble(batch, values, self.schema, arrow_schema)

    def _download(self, client: Any, key: str) -> bytes:
        try:
            return bytes(
                client.get_object(Bucket=self.options.location.bucket, Key=key)["Body"].read()
            )
        except (ClientError, BotoCoreError) as error:
            raise S3ReadError(
                f"2pc-s3 could not read s3://{self.options.location.bucket}/{key}"
                f" ({describe_error(error)}): was it deleted after the read was planned?"
            ) from error


def _decode(body: bytes, file_format: str, schema: StructType) -> Iterator[pa.RecordBatch]:
    if file_format == "parquet":
        yield from pq.ParquetFile(pa.BufferReader(body)).iter_batches(READ_BATCH_ROWS)
        return
    if not body:
        return
    explicit = pa.schema([pa.field(field.name, _json_type(field.dataType)) for field in schema])
    table = pajson.read_json(
        pa.BufferReader(body),
        parse_options=pajson.ParseOptions(
            explicit_schema=explicit, unexpected_field_behavior="ignore"
        ),
    )
    yield from table.to_batches(READ_BATCH_ROWS)


def _json_type(data_type: DataType) -> pa.DataType:
    """What pyarrow's JSON reader parses; timestamps, dates etc. are cast afterwards."""
    arrow_type = arrow_schema_utc(StructType().add("c", data_type)).field(0).type
    if pa.types.is_temporal(arrow_type) or pa.types.is_decimal(arrow_type):
        return pa.string() if not pa.types.is_decimal(arrow_type) else pa.float64()
    return arrow_type


def _assemble(
    batch: pa.RecordBatch,
    partition_values: Mapping[str, str | None],
    schema: StructType,
    arrow_schema: pa.Schema,
) -> pa.RecordBatch:
    rows = batch.num_rows
    names = set(batch.schema.names)
    arrays = []
    for field, arrow_field in zip(schema.fields, arrow_schema, strict=True):
        if field.name in partition_values:
            value = _partition_value(partition_values[field.name], field.dataType)
            arrays.append(pa.repeat(pa.scalar(value, arrow_field.type), rows))
        elif field.name in names:
            column = batch.column(field.name)
            if not column.type.equals(arrow_field.type):
                column = column.cast(arrow_field.type)
            arrays.append(column)
        else:
            arrays.append(pa.nulls(rows, arrow_field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _partition_value(text: str | None, data_type: DataType) -> Any:
    if text is None:
        return None
    if isinstance(data_type, (ByteType, ShortType, IntegerType, LongType)):
        return int(text)
    if isinstance(data_type, BooleanType):
        return text.lower() == "true"
    if isinstance(data_type, DateType):
        return datetime.date.fromisoformat(text)
    return text
