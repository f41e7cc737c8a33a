"""boto3 clients for 2pc-s3, one per Python process and connection, and S3 error kinds.

Errors are classified by botocore error code (and HTTP status for HEAD requests, which
carry no body), never by message text. Messages built here name the bucket, key and
error code; credentials never reach them.

Fault layer (tests only): when ``eospack.core.faults`` is enabled (``EOSPACK_FAULT_DIR``
set when the process started), every client created here gets a botocore ``before-send``
handler that claims faults named ``s3.<OperationName>`` (``s3.PutObject``,
``s3.CompleteMultipartUpload``, ``s3.UploadPart``, ...), for the batch its key belongs to,
and turns them into what the network would do: ``before`` raises a connection error
without sending, ``after`` sends the request (S3 applies it) and then raises a
connection-closed error (the answer is lost), ``stall`` waits ``stall_seconds`` and raises
a read timeout, ``crash`` sends the request and SIGKILLs the process (a worker dying).
botocore treats the errors like real network failures and retries the call (a ``before``
fault is transient unless armed as many times as the client's attempts). With faults off
no handler is registered: nothing is added to any request.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from eospack.core import faults

from ...commit_protocols import parse_transaction_id
from .errors import S3AccessError
from .options import EOSPACK_DIRECTORY, S3Connection, S3Location

MISSING_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound", "404"})
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "Forbidden",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
    }
)
PRECONDITION_FAILED_CODES = frozenset({"PreconditionFailed", "412"})
CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "409"})
NO_SUCH_UPLOAD_CODES = frozenset({"NoSuchUpload"})

S3_ERRORS: tuple[type[BaseException], ...] = (ClientError, BotoCoreError)
"""What a boto3 call raises when S3 refuses or cannot be reached."""

_POOL_CONNECTIONS = 16
_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()


def s3_client(connection: S3Connection, max_attempts: int = 5) -> Any:
    """A boto3 S3 client shared by every task and thread of this Python worker process;
    a call is sent at most ``max_attempts`` times (the first included) before it fails."""
    key = (
        connection.endpoint_url,
        connection.region,
        connection.access_key_id,
        connection.secret_access_key,
        connection.session_token,
        max_attempts,
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = new_client(connection, max_attempts)
            _clients[key] = client
        return client


def new_client(connection: S3Connection, max_attempts: int) -> Any:
    """A new boto3 S3 client (with the fault layer's handler when faults are enabled)."""
    import boto3  # imported here: Spark imports this module in every data source lookup
    from botocore.config import Config

    config = Config(
        retries={"total_max_attempts": max_attempts, "mode": "standard"},
        connect_timeout=10,
        read_timeout=120,
        max_pool_connections=_POOL_CONNECTIONS,
        s3={"addressing_style": "path"} if connection.endpoint_url else None,
    )
    session = boto3.session.Session()
    client = session.client(
        "s3",
        endpoint_url=connection.endpoint_url,
        region_name=connection.region,
        aws_access_key_id=connection.access_key_id,
        aws_secret_access_key=connection.secret_access_key,
        aws_session_token=connection.session_token,
        config=config,
    )
    if faults.enabled():
        client.meta.events.register("before-send.s3", inject_fault)
    return client


_MANIFEST_NAME = re.compile(rf"/{EOSPACK_DIRECTORY}/manifests/[^/]+/(\d+)(?:\.[^/]*)?\.json$")
_raw_sessions: list[Any] = []


def batch_of_url(url: str) -> int | None:
    """The batch a request's object belongs to: from a data file's transaction id or a
    manifest's name; None for requests about no batch (listings, the bucket)."""
    path = unquote(urlsplit(url).path)
    manifest = _MANIFEST_NAME.search(path)
    if manifest is not None:
        return int(manifest.group(1))
    parsed = parse_transaction_id(path.rsplit("/", 1)[-1].split(".", 1)[0])
    return parsed[1] if parsed is not None else None


def inject_fault(request: Any, event_name: str, **_: Any) -> None:
    """botocore ``before-send`` handler of the fault layer (see the module doc)."""
    operation = event_name.rsplit(".", 1)[-1]
    fault = faults.claim(f"s3.{operation}", batch_of_url(request.url))
    if fault is None:
        return None
    endpoint = f"{request.url.split('?', 1)[0]} ({fault.describe()})"
    if fault.mode == "slow":
        time.sleep(fault.stall_seconds)
        return None
    if fault.mode in ("after", "crash", "kill-executor"):
        _send_raw(request)
        if fault.mode == "kill-executor":
            faults.kill_executor()
        if fault.mode in ("crash", "kill-executor"):
            os.kill(os.getpid(), signal.SIGKILL)
        raise ConnectionClosedError(endpoint_url=endpoint)
    if fault.mode == "stall":
        time.sleep(fault.stall_seconds)
        raise ReadTimeoutError(endpoint_url=endpoint)
    raise EndpointConnectionError(endpoint_url=endpoint)


def _send_raw(request: Any) -> None:
    """Send a prepared request outside the client (so S3 applies it) and drop the answer."""
    from botocore.httpsession import URLLib3Session

    with _clients_lock:
        if not _raw_sessions:
            _raw_sessions.append(URLLib3Session())
        session = _raw_sessions[0]
    response = session.send(request)
    _ = response.content


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
