"""Options of ``format("2pc-s3")`` (sink and reader), parsed once into frozen, typed objects.

Options are read through ``eospack.core.options.OptionReader`` (case-insensitive names, one
grammar per kind of value). Credentials
(``accessKeyId``, ``secretAccessKey``, ``sessionToken``) are kept out of reprs, errors and
logs; without them the client uses boto3's default chain (environment, profile, role).
Every error is one line naming the option and the fix, raised before any data moves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from eospack.core.options import OptionReader

from ...commit_protocols.sink_options import parse_sink_common_options
from .errors import S3OptionError

FileFormat = Literal["parquet", "jsonl"]

FILE_FORMATS: tuple[FileFormat, ...] = ("parquet", "jsonl")
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
MIN_TARGET_FILE_SIZE = 1024 * 1024
EOSPACK_DIRECTORY = "_eospack"

_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix``: where a sink writes and a reader reads (prefix without slashes
    at either end)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}"

    @property
    def manifests_prefix(self) -> str:
        """Every manifest of every sink writing under this prefix lives below this key."""
        return self.key(f"{EOSPACK_DIRECTORY}/manifests/")


@dataclass(frozen=True)
class S3Connection:
    """How to reach S3; credentials None means boto3's default credential chain."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """For errors and logs: where, never who."""
        return self.endpoint_url or f"AWS S3 ({self.region or 'default region'})"


@dataclass(frozen=True)
class S3SinkOptions:
    location: S3Location
    connection: S3Connection = field(default_factory=S3Connection)
    file_format: FileFormat = "parquet"
    partition_by: tuple[str, ...] = ()
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    exactly_once: bool = True
    sink_id: str | None = None

    @property
    def target(self) -> str:
        """What the sink id is derived from together with the query id."""
        return self.location.url

    @property
    def extension(self) -> str:
        return "parquet" if self.file_format == "parquet" else "jsonl"

    def describe(self) -> str:
        return f"{self.location.url} ({self.file_format})"


@dataclass(frozen=True)
class S3ReaderOptions:
    location: S3Location
    connection: S3Connection = field(default_factory=S3Connection)


def parse_sink_options(options: Mapping[str, str]) -> S3SinkOptions:
    """Parse and validate the options of ``df.writeStream.format("2pc-s3")``."""
    reader = OptionReader(options, S3OptionError)
    common = parse_sink_common_options(reader)
    return S3SinkOptions(
        location=parse_location(reader),
        connection=_parse_connection(reader),
        file_format=reader.choice("fileFormat", FILE_FORMATS, "parquet"),  # type: ignore[arg-type]
        partition_by=_parse_partition_by(reader.text("partitionBy")),
        target_file_size=_parse_target_file_size(reader),
        exactly_once=common.exactly_once,
        sink_id=common.sink_id,
    )


def parse_reader_options(options: Mapping[str, str]) -> S3ReaderOptions:
    """Parse and validate the options of ``spark.read.format("2pc-s3")``."""
    reader = OptionReader(options, S3OptionError)
    return S3ReaderOptions(parse_location(reader), _parse_connection(reader))


def parse_location(reader: OptionReader) -> S3Location:
    """Option ``path``, ``s3://bucket/prefix`` (``s3a://`` accepted), as bucket and prefix."""
    path = reader.required("path", "s3://bucket/prefix (or pass it to .start() or .load())")
    parts = urlsplit(path)
    if parts.scheme not in ("s3", "s3a") or parts.query or parts.fragment:
        raise S3OptionError(f"path {path!r} is not an S3 location: use s3://bucket/prefix")
    bucket = parts.netloc
    if not _BUCKET_NAME.match(bucket) or ".." in bucket:
        raise S3OptionError(
            f"path {path!r} names no valid bucket: use s3://bucket/prefix with a bucket of"
            " 3 to 63 lower-case letters, digits, dots or hyphens"
        )
    prefix = parts.path.strip("/")
    if not prefix:
        raise S3OptionError(
            f"path {path!r} has no prefix: use s3://{bucket}/prefix (the sink keeps its"
            f" files and {EOSPACK_DIRECTORY}/ manifests below the prefix)"
        )
    segments = prefix.split("/")
    if any(segment in ("", ".", "..") for segment in segments):
        raise S3OptionError(
            f"path {path!r} has an empty, '.' or '..' segment: use s3://bucket/prefix"
            " with plain segments"
        )
    if EOSPACK_DIRECTORY in segments:
        raise S3OptionError(
            f"path {path!r} points inside the sink's own {EOSPACK_DIRECTORY}/ directory:"
            " use the prefix the sink writes to"
        )
    return S3Location(bucket, prefix)


def _parse_connection(reader: OptionReader) -> S3Connection:
    endpoint_url = reader.text("endpointUrl")
    if endpoint_url is not None:
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise S3OptionError(
                f"endpointUrl {endpoint_url!r} is not an HTTP URL: use e.g."
                " http://localhost:9000 or https://s3.eu-west-1.amazonaws.com"
            )
        endpoint_url = endpoint_url.rstrip("/")
    access_key_id = reader.secret("accessKeyId")
    secret_access_key = reader.secret("secretAccessKey")
    session_token = reader.secret("sessionToken")
    if (access_key_id is None) != (secret_access_key is None):
        given, missing = (
            ("accessKeyId", "secretAccessKey")
            if access_key_id is not None
            else ("secretAccessKey", "accessKeyId")
        )
        raise S3OptionError(
            f"{given} is set but {missing} is not: set both, or neither to use boto3's"
            " default credential chain"
        )
    if session_token is not None and access_key_id is None:
        raise S3OptionError(
            "sessionToken is set without accessKeyId and secretAccessKey: set all three,"
            " or none to use boto3's default credential chain"
        )
    return S3Connection(
        endpoint_url=endpoint_url,
        region=reader.text("region"),
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        session_token=session_token,
    )


def _parse_partition_by(value: str | None) -> tuple[str, ...]:
    if value is None or not value.strip():
        return ()
    columns = tuple(column.strip() for column in value.split(","))
    if any(not column for column in columns):
        raise S3OptionError(
            f"partitionBy {value!r} has an empty column name: use comma-separated names"
        )
    if len(set(columns)) != len(columns):
        raise S3OptionError(f"partitionBy {value!r} names a column twice: name each once")
    for column in columns:
        if "/" in column or "=" in column:
            raise S3OptionError(
                f"partitionBy column {column!r} contains '/' or '=': rename the column"
                " (it becomes a directory name column=value)"
            )
    return columns


def _parse_target_file_size(reader: OptionReader) -> int:
    size = reader.byte_size("targetFileSize", DEFAULT_TARGET_FILE_SIZE)
    if size < MIN_TARGET_FILE_SIZE:
        raise reader.refuse("targetFileSize", "at least 1m (default 128m)")
    return size
