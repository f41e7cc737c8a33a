"""boto3 clients for 2pc-s3, one per Python process and connection, and S3 error kinds.

Errors are classified by botocore error code (and HTTP status for HEAD requests, which
carry no body), never by message text. Messages built here name the bucket, key and
error code; credentials never reach them.
"""

from __future__ import annotations

import threading
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
)

from connectors.s3.options import S3Connection, S3Location

MISSING_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound", "404"})
DENIED_CODES = frozenset(
    {
        "AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
        "InvalidToken", "ExpiredToken", "TokenRefreshRequired", "AllAccessDisabled",
        "AccountProblem", "InvalidClientTokenId", "UnrecognizedClientException",
    }
)  # fmt: skip
PRECONDITION_FAILED_CODES = frozenset({"PreconditionFailed", "412"})
CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "409"})
NO_SUCH_UPLOAD_CODES = frozenset({"NoSuchUpload"})

S3_ERRORS: tuple[type[BaseException], ...] = (ClientError, BotoCoreError)
"""What a boto3 call raises when S3 refuses or cannot be reached."""

_POOL_CONNECTIONS = 16
_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()


class S3AccessError(RuntimeError):
    """The bucket is missing, access is denied, or the endpoint cannot be reached."""


class S3WriteError(RuntimeError):
    """An upload, commit or read failed against S3 (the task or commit fails; Spark retries)."""


def s3_client(connection: S3Connection, max_attempts: int = 5) -> Any:
    """A boto3 S3 client shared by every task and thread of this Python worker process."""
    key = (
        connection.endpoint_url, connection.region, connection.access_key_id,
        connection.secret_access_key, connection.session_token, max_attempts,
    )  # fmt: skip
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _new_client(connection, max_attempts)
            _clients[key] = client
        return client


def _new_client(connection: S3Connection, max_attempts: int) -> Any:
    import boto3  # imported here: Spark imports this module in every data source lookup
    from botocore.config import Config

    config = Config(
        retries={"max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        max_pool_connections=_POOL_CONNECTIONS,
        s3={"addressing_style": "path"} if connection.endpoint_url else None,
    )
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=connection.endpoint_url,
        region_name=connection.region,
        aws_access_key_id=connection.access_key_id,
        aws_secret_access_key=connection.secret_access_key,
        aws_session_token=connection.session_token,
        config=config,
    )


def error_code(error: BaseException) -> str:
    """The S3 error code of a ClientError (the HTTP status for bodiless HEAD answers)."""
    if not isinstance(error, ClientError):
        return type(error).__name__
    code = str(error.response.get("Error", {}).get("Code") or "")
    if code:
        return code
    return str(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "unknown")


def is_missing(error: BaseException) -> bool:
    return isinstance(error, ClientError) and error_code(error) in MISSING_CODES


def is_denied(error: BaseException) -> bool:
    return isinstance(error, ClientError) and error_code(error) in DENIED_CODES


def is_precondition_failed(error: BaseException) -> bool:
    return isinstance(error, ClientError) and error_code(error) in PRECONDITION_FAILED_CODES


def is_conflict(error: BaseException) -> bool:
    return isinstance(error, ClientError) and error_code(error) in CONFLICT_CODES


def is_no_such_upload(error: BaseException) -> bool:
    return isinstance(error, ClientError) and error_code(error) in NO_SUCH_UPLOAD_CODES


def describe_error(error: BaseException) -> str:
    """A short, credential-free description: the S3 error code or the connection failure."""
    if isinstance(error, ClientError):
        return f"S3 error {error_code(error)}"
    if isinstance(error, EndpointConnectionError):
        return "endpoint unreachable"
    return type(error).__name__


def check_access(connection: S3Connection, location: S3Location, option_hint: str) -> None:
    """Raise S3AccessError unless the bucket exists and its uploads under the prefix can be
    listed (what the sink's recovery needs). ``option_hint`` says which options to fix."""
    client = s3_client(connection, max_attempts=2)
    try:
        client.head_bucket(Bucket=location.bucket)
        client.list_multipart_uploads(Bucket=location.bucket, Prefix=location.key(""), MaxUploads=1)
    except ClientError as error:
        if is_missing(error):
            raise S3AccessError(
                f"bucket {location.bucket!r} of path {location.url} does not exist at"
                f" {connection.describe()}: create it, or fix path/endpointUrl"
            ) from error
        if is_denied(error):
            raise S3AccessError(
                f"access to bucket {location.bucket!r} of path {location.url} was denied"
                f" ({error_code(error)}): check {option_hint}"
            ) from error
        raise S3AccessError(
            f"cannot use path {location.url} at {connection.describe()}"
            f" ({describe_error(error)}): check path, endpointUrl and region"
        ) from error
    except NoCredentialsError as error:
        raise S3AccessError(
            f"no AWS credentials found for path {location.url}: set accessKeyId and"
            " secretAccessKey, or configure boto3's default chain (AWS_ACCESS_KEY_ID,"
            " ~/.aws/credentials, an instance role)"
        ) from error
    except BotoCoreError as error:
        raise S3AccessError(
            f"cannot reach S3 at {connection.describe()} for path {location.url}"
            f" ({describe_error(error)}): check endpointUrl and region"
        ) from error


CREDENTIALS_HINT = (
    "accessKeyId/secretAccessKey (or boto3's default credential chain) and the bucket policy"
)
