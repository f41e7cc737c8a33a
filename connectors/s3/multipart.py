"""One S3 object written as a multipart upload that 2pc-s3's tasks never complete.

Guarantee: ``MultipartObject.finish`` returns only once every part is uploaded, and never
completes the upload, so no reader (of any kind) can see the object; the returned handle
(key, upload id, part ETags and checksums) is all the driver needs to complete (commit)
or abort (roll back) it later. Parts are ``PART_SIZE`` bytes except the last (S3 needs at
least ``MIN_PART_SIZE`` for every other part) and are uploaded by a task's
``PartUploader`` threads while encoding goes on, at most ``MAX_PARTS_IN_FLIGHT`` held in
memory. An object that gets no bytes still uploads one empty part. ``abort`` is best
effort: recovery aborts what a failed or killed task left. A create that botocore had to
retry may have made an upload whose answer was lost: the task looks for other uploads of
its key and aborts them (best effort too; recovery aborts every upload no decision names).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from .client import describe_error, is_no_such_upload
from .errors import S3WriteError

logger = logging.getLogger(__name__)

PART_SIZE = 8 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024
MAX_PARTS_IN_FLIGHT = 4


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
        self._create_failed = False

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
            if self._create_failed:  # an attempt may have applied with its answer lost
                self._abort_other_uploads(None)
            return
        try:
            abort_upload(self.client, self.bucket, self.key, self.upload_id)
        except (ClientError, BotoCoreError) as error:
            logger.warning(
                "could not abort the upload of s3://%s/%s (%s): the next commit of this"
                " sink aborts it",
                self.bucket,
                self.key,
                describe_error(error),
            )

    def _submit(self, body: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self._start()
        number = len(self._parts) + 1
        upload_id = self.upload_id
        self._parts.append(self.pool.submit(lambda: self._upload_part(upload_id, number, body)))

    def _start(self) -> str:
        """Create the upload. When botocore had to retry the create, an earlier attempt may
        have been applied with its answer lost: that upload is known to nobody but S3, so
        it is aborted here (every upload of this key is this task's: the key carries the
        task's unique attempt). What this cannot abort, recovery does (``resource``)."""
        try:
            answer = self._call(
                "start the upload of",
                lambda: self.client.create_multipart_upload(
                    Bucket=self.bucket, Key=self.key, ChecksumAlgorithm="CRC32"
                ),
            )
        except S3WriteError:
            self._create_failed = True
            raise
        upload_id = str(answer["UploadId"])
        if answer.get("ResponseMetadata", {}).get("RetryAttempts"):
            self._abort_other_uploads(upload_id)
        return upload_id

    def _abort_other_uploads(self, upload_id: str | None) -> None:
        """Best effort: abort every upload of this key in progress but ``upload_id``."""
        try:
            paginator = self.client.get_paginator("list_multipart_uploads")
            others = [
                str(upload["UploadId"])
                for page in paginator.paginate(Bucket=self.bucket, Prefix=self.key)
                for upload in page.get("Uploads", ())
                if upload["Key"] == self.key and upload["UploadId"] != upload_id
            ]
            for other in others:
                abort_upload(self.client, self.bucket, self.key, other)
        except (ClientError, BotoCoreError) as error:
            logger.warning(
                "could not abort the uploads of s3://%s/%s left by a create whose answer was"
                " lost (%s): the next commit of this sink aborts them",
                self.bucket,
                self.key,
                describe_error(error),
            )

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


def abort_upload(client: Any, bucket: str, key: str, upload_id: str) -> None:
    """Abort one upload; an upload already gone (``NoSuchUpload``) is left as it is."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except ClientError as error:
        if not is_no_such_upload(error):
            raise


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
