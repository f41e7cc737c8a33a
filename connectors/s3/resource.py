"""Driver side of 2pc-s3: manifests as durable decisions, multipart uploads as pieces.

Commit order for batch N of sink S (``commit_protocols`` runs it; this module plugs in):

1. Tasks uploaded every part of their files and completed none (``writer``): invisible.
2. ``<prefix>/_eospack/manifests/<S>/<N>.json`` exists -> N was applied before a restart:
   abort the replay's uploads.
3. Put that manifest with ``IfNoneMatch="*"``: the decision. It names every file (key,
   upload id, part ETags), the Spark schema and the format. ``PreconditionFailed`` means
   someone decided N first: abort ours.
4. Complete every upload. Completing is idempotent here: ``NoSuchUpload`` for a key that
   exists means it was completed before; for a key that does not exist it is an error
   (the decided data was aborted by someone else) and the commit fails loudly.
5. Recovery (in the same commit): complete the uploads of unfinished decisions, abort
   every other upload of S of batches <= N.

"Done" is not written anywhere: a decision is unfinished exactly while one of its uploads
is still listed by ``list_multipart_uploads``. Recovery therefore costs one listing of
the sink's in-progress uploads per batch (normally empty of S's uploads) plus one GET per
batch id that still has uploads, never a scan of all manifests. Manifests are immutable
once written, so this object caches the ones it read.

Limits: a crashed query's leftovers are mended by that query's next commit (same
checkpoint); uploads of a query that never restarts stay until the bucket's lifecycle
rule ``AbortIncompleteMultipartUpload`` removes them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from commit_protocols import (
    BatchDecision,
    PreparedPiece,
    TransactionalResource,
    parse_transaction_id,
    sink_prefix,
)
from connectors.s3.client import (
    S3WriteError,
    describe_error,
    is_conflict,
    is_missing,
    is_no_such_upload,
    is_precondition_failed,
)
from connectors.s3.options import S3Location, S3SinkOptions
from connectors.s3.writer import transaction_id_of_key

logger = logging.getLogger("eospack.s3")

MANIFEST_VERSION = 1


def manifest_key(location: S3Location, sink_id: str, name: str) -> str:
    """``<prefix>/_eospack/manifests/<sinkId>/<name>.json``; name is the batch id for
    decisions, ``<batch>.<partition>.<attempt>`` for at-least-once task manifests."""
    return f"{location.manifests_prefix}{sink_id}/{name}.json"


def manifest_body(
    options: S3SinkOptions, schema_json: str, sink_id: str, batch_id: int,
    pieces: Sequence[PreparedPiece],
) -> bytes:  # fmt: skip
    files = [
        {"key": file["key"], "rows": file["rows"], "bytes": file["bytes"]}
        for piece in pieces
        for file in piece.handle.get("files", ())
    ]
    return json.dumps(
        {
            "eospack_manifest": MANIFEST_VERSION,
            "sink_id": sink_id,
            "batch_id": batch_id,
            "file_format": options.file_format,
            "partition_by": list(options.partition_by),
            "schema": json.loads(schema_json),
            "files": files,
            "pieces": [piece.to_json() for piece in pieces],
        },
        separators=(",", ":"),
    ).encode()


def complete_file(client: Any, bucket: str, file: Mapping[str, Any]) -> None:
    """Complete one prepared file; a file completed before is left as it is."""
    key, upload_id = file["key"], file["upload_id"]
    try:
        client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": [dict(part) for part in file["parts"]]},
        )  # fmt: skip
        return
    except (ClientError, BotoCoreError) as error:
        if not is_no_such_upload(error):
            raise S3WriteError(
                f"2pc-s3 could not complete s3://{bucket}/{key} ({describe_error(error)}):"
                " restart the query from its checkpoint; the commit resumes where it stopped"
            ) from error
    try:
        client.head_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as error:
        if is_missing(error):
            raise S3WriteError(
                f"2pc-s3 cannot commit s3://{bucket}/{key}: its upload {upload_id} was"
                " aborted although a manifest names it (was a lifecycle rule or another"
                " tool aborting uploads?); that batch's data is lost"
            ) from error
        raise S3WriteError(
            f"2pc-s3 could not check s3://{bucket}/{key} ({describe_error(error)}):"
            " restart the query from its checkpoint"
        ) from error


def abort_file(client: Any, bucket: str, key: str, upload_id: str) -> None:
    """Abort one prepared file; an upload already gone is left as it is."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except (ClientError, BotoCoreError) as error:
        if not is_no_such_upload(error):
            raise S3WriteError(
                f"2pc-s3 could not abort the upload of s3://{bucket}/{key}"
                f" ({describe_error(error)}): restart the query; recovery aborts it"
            ) from error


class S3Resource(TransactionalResource):
    """Decisions are manifests; pieces are a task's multipart uploads (see module doc)."""

    def __init__(self, options: S3SinkOptions, schema_json: str, client: Any) -> None:
        self.options = options
        self.location = options.location
        self.schema_json = schema_json
        self.client = client
        self._decisions: dict[tuple[str, int], BatchDecision] = {}

    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        cached = self._decisions.get((sink_id, batch_id))
        if cached is not None:
            return cached
        key = manifest_key(self.location, sink_id, str(batch_id))
        try:
            answer = self.client.get_object(Bucket=self.location.bucket, Key=key)
            manifest = json.loads(answer["Body"].read())
        except (ClientError, BotoCoreError) as error:
            if is_missing(error):
                return None
            raise self._error(
                f"read the manifest s3://{self.location.bucket}/{key}", error
            ) from error
        pieces = tuple(PreparedPiece.from_json(piece) for piece in manifest["pieces"])
        decision = BatchDecision(sink_id, batch_id, pieces)
        self._decisions[(sink_id, batch_id)] = decision
        return decision

    def record_decision(self, decision: BatchDecision) -> bool:
        key = manifest_key(self.location, decision.sink_id, str(decision.batch_id))
        body = manifest_body(
            self.options, self.schema_json, decision.sink_id, decision.batch_id, decision.pieces
        )
        try:
            self.client.put_object(
                Bucket=self.location.bucket, Key=key, Body=body, IfNoneMatch="*",
                ContentType="application/json",
            )  # fmt: skip
        except (ClientError, BotoCoreError) as error:
            if is_precondition_failed(error):
                return False
            if is_conflict(error) and self.find_decision(decision.sink_id, decision.batch_id):
                return False
            raise self._error(
                f"write the manifest s3://{self.location.bucket}/{key}", error
            ) from error
        self._decisions[(decision.sink_id, decision.batch_id)] = decision
        return True

    def commit_piece(self, piece: PreparedPiece) -> None:
        for file in piece.handle.get("files", ()):
            complete_file(self.client, self.location.bucket, file)

    def rollback_piece(self, piece: PreparedPiece) -> None:
        for file in piece.handle.get("files", ()):
            abort_file(self.client, self.location.bucket, file["key"], file["upload_id"])

    def mark_done(self, decision: BatchDecision) -> None:
        """Nothing to write: a decision is done once none of its uploads is listed."""

    def unfinished_decisions(self, sink_id: str) -> Iterable[BatchDecision]:
        listed = self._listed_uploads(sink_id)
        listed_ids = {upload["UploadId"] for upload in listed}
        for batch_id in sorted({_batch_of(upload) for upload in listed}):
            decision = self.find_decision(sink_id, batch_id)
            if decision is not None and listed_ids & _upload_ids(decision):
                yield decision

    def prepared_pieces(self, sink_id: str) -> Iterable[PreparedPiece]:
        by_transaction: dict[str, list[dict[str, Any]]] = {}
        listed = self._listed_uploads(sink_id)
        decided: set[str] = set()
        for batch_id in {_batch_of(upload) for upload in listed}:
            decision = self.find_decision(sink_id, batch_id)
            decided |= _upload_ids(decision) if decision is not None else set()
        for upload in listed:
            if upload["UploadId"] in decided:
                continue  # decided: completed by unfinished_decisions, never aborted
            files = by_transaction.setdefault(upload["transaction"], [])
            files.append({"key": upload["Key"], "upload_id": upload["UploadId"]})
        for transaction, files in sorted(by_transaction.items()):
            parsed = parse_transaction_id(transaction)
            if parsed is None:
                continue
            sink, batch_id, partition_id, attempt = parsed
            yield PreparedPiece(sink, batch_id, partition_id, attempt, 0, {"files": files})

    def _listed_uploads(self, sink_id: str) -> list[dict[str, Any]]:
        """This sink's multipart uploads in progress under the prefix, with their txid."""
        wanted = sink_prefix(sink_id)
        uploads: list[dict[str, Any]] = []
        paginator = self.client.get_paginator("list_multipart_uploads")
        try:
            for page in paginator.paginate(
                Bucket=self.location.bucket, Prefix=self.location.key("")
            ):
                for upload in page.get("Uploads", ()):
                    transaction = transaction_id_of_key(self.location.prefix, upload["Key"])
                    if transaction is not None and transaction.startswith(wanted):
                        uploads.append({**upload, "transaction": transaction})
        except (ClientError, BotoCoreError) as error:
            raise self._error(f"list the uploads under {self.location.url}", error) from error
        return uploads

    def _error(self, what: str, error: BaseException) -> S3WriteError:
        return S3WriteError(
            f"2pc-s3 could not {what} ({describe_error(error)}): restart the query from its"
            " checkpoint once S3 answers; exactly-once holds"
        )


def _batch_of(upload: Mapping[str, Any]) -> int:
    parsed = parse_transaction_id(upload["transaction"])
    assert parsed is not None
    return parsed[1]


def _upload_ids(decision: BatchDecision) -> set[str]:
    return {
        file["upload_id"] for piece in decision.pieces for file in piece.handle.get("files", ())
    }


def write_task_manifest(
    client: Any, options: S3SinkOptions, schema_json: str, piece: PreparedPiece
) -> None:
    """At-least-once: name a task's completed files so that the reader finds them."""
    name = f"{piece.batch_id}.{piece.partition_id}.{piece.attempt}"
    key = manifest_key(options.location, piece.sink_id, name)
    body = manifest_body(options, schema_json, piece.sink_id, piece.batch_id, [piece])
    try:
        client.put_object(
            Bucket=options.location.bucket, Key=key, Body=body, ContentType="application/json"
        )
    except (ClientError, BotoCoreError) as error:
        raise S3WriteError(
            f"2pc-s3 could not write the manifest s3://{options.location.bucket}/{key}"
            f" ({describe_error(error)}): the task fails and Spark may retry it"
        ) from error
