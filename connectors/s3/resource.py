"""Driver side of 2pc-s3: manifests as decision slots, multipart uploads as pieces.

The slot of batch N of sink S is the object ``<prefix>/_eospack/manifests/<S>/<N>.json``,
changed only by S3's conditional writes: created with ``IfNoneMatch="*"``, replaced with
``IfMatch=<ETag>`` (``PreconditionFailed``/``ConditionalRequestConflict``: someone changed it
first, read it and decide again). It holds either the decision (status ``decided``: every
file's key, upload id and part ETags, the Spark schema and the format) or an abort fence
(status ``aborted``, no files: the pieces that were rolled back, which no later decision
may name). A decision is final. "Done" is not written: a decided batch is finished when
none of its uploads is in progress, and re-committing it verifies each file.

Commit order for batch N (``commit_protocols`` runs it; this module plugs in):

1. Tasks uploaded every part of their files and completed none (``writer``): invisible.
2. Create the manifest (the decision). If it exists: a decision with our pieces is ours
   (the answer to an earlier write was lost and botocore's retry got 412); a decision with
   other pieces means N was applied before a restart: abort ours, complete (verify) its
   files; a fence that names none of our pieces is replaced by our decision.
3. Complete every upload. Nothing is taken for done from an absence: for a decision
   this commit wrote, ``NoSuchUpload`` is followed by a HEAD of the key; for one it found
   (a replay, an abort rolling forward) each file is first looked up in the listing of
   uploads in progress, and a file not in progress must exist as an object. A decided
   file that is neither raises ``DecidedPieceLostError`` naming sink, batch, piece and key.
4. Recovery: one listing of the sink's uploads in progress under the prefix (shared with
   step 3); complete those a decision names by upload id (one GET per batch that still
   has uploads), fence and abort the rest of batches <= N, including uploads under a
   decided piece's keys that its decision does not name. No scan of the manifests: the
   cost per batch stays constant (a clean commit: one PUT, one completion per file, one
   listing).

What each failure leaves, and how it is mended (Spark replays N after a restart, because
its commit log has no entry for N; ``abort`` is what Spark calls when ``commit`` raises):

========================================  ==========================  ======================
failure                                   left behind                 mended by
========================================  ==========================  ======================
task killed / crash before the manifest   uploads in progress, no     the replay's commit
                                          manifest                    fences and aborts them
manifest PUT fails before applying        no manifest                 ``abort`` writes a fence,
                                                                      aborts the uploads
manifest PUT applied, answer lost         manifest naming our files   the retry's 412 reads
(retry answers 412 / 409)                                             it: ours, commit goes on
crash after the manifest, or between      manifest, some uploads      the replay's commit
completions                               still in progress           completes them
a completion fails (connection lost)      same                        ``abort`` completes them
                                                                      (rolls forward), or the
                                                                      replay does
a create applied, answer lost (botocore   an upload of the task's     the task (its create was
retried it: the task uses the retry's)    key that nobody knows of    retried: it lists its
                                                                      key), else the next
                                                                      commit's recovery
a decided upload aborted behind the       manifest naming a key that  ``DecidedPieceLostError``
sink's back (lifecycle rule shorter than  never existed               (delete the manifest and
the downtime, another tool)                                           restart to rewrite N)
abort itself fails (S3 unreachable)       uploads in progress         logged with keys and
                                                                      upload ids; the first
                                                                      commit after a restart
========================================  ==========================  ======================

Limits: a crashed query's leftovers are mended by that query's next commit (same
checkpoint); uploads of a query that never restarts stay until the bucket's lifecycle
rule ``AbortIncompleteMultipartUpload`` removes them, and that rule's delay must exceed
the longest time a query may stay down (it would abort a decided batch's uploads).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ...commit_protocols import (
    BatchDecision,
    DecidedPieceLostError,
    PreparedPiece,
    TransactionalResource,
    derive_sink_id,
    parse_transaction_id,
    sink_prefix,
)
from ...commit_protocols.inspection import DecisionState, Leftover, SinkState
from ...commit_protocols.pieces import ABORTED, DECIDED, DONE
from .client import (
    describe_error,
    is_conflict,
    is_missing,
    is_no_such_upload,
    is_precondition_failed,
    s3_client,
)
from .errors import S3WriteError
from .keys import transaction_id_of_key
from .options import S3Location, S3SinkOptions, parse_sink_options
from .reader import manifest_status

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 2
"""2 added ``status`` (``decided`` or ``aborted``); a manifest without it is a decision."""
SLOT_WRITE_ATTEMPTS = 5
"""Conditional writes that lose a race are retried after reading the slot again."""


def manifest_key(location: S3Location, sink_id: str, name: str) -> str:
    """``<prefix>/_eospack/manifests/<sinkId>/<name>.json``; name is the batch id for
    decisions, ``<batch>.<partition>.<attempt>`` for at-least-once task manifests."""
    return f"{location.manifests_prefix}{sink_id}/{name}.json"


def manifest_body(
    options: S3SinkOptions,
    schema_json: str,
    sink_id: str,
    batch_id: int,
    pieces: Sequence[PreparedPiece],
    status: str = DECIDED,
) -> bytes:
    """The manifest of a decision (its files and pieces) or of a fence (pieces, no files)."""
    files = [
        {"key": file["key"], "rows": file["rows"], "bytes": file["bytes"]}
        for piece in (pieces if status == DECIDED else ())
        for file in piece.handle.get("files", ())
    ]
    return json.dumps(
        {
            "eospack_manifest": MANIFEST_VERSION,
            "sink_id": sink_id,
            "batch_id": batch_id,
            "status": status,
            "file_format": options.file_format,
            "partition_by": list(options.partition_by),
            "schema": json.loads(schema_json),
            "files": files,
            "pieces": [piece.to_json() for piece in pieces],
        },
        separators=(",", ":"),
    ).encode()


def complete_file(client: Any, bucket: str, file: Mapping[str, Any]) -> bool:
    """Complete one prepared file; True when it is complete (now or before), False when
    its upload is gone and its key does not exist (someone aborted it)."""
    key, upload_id = file["key"], file["upload_id"]
    try:
        client.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [dict(part) for part in file["parts"]]},
        )
        return True
    except (ClientError, BotoCoreError) as error:
        if not is_no_such_upload(error):
            raise S3WriteError(
                f"2pc-s3 could not complete s3://{bucket}/{key} (upload {upload_id},"
                f" {describe_error(error)}): restart the query from its checkpoint; the"
                " commit resumes where it stopped"
            ) from error
    try:
        client.head_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError) as error:
        if is_missing(error):
            return False
        raise S3WriteError(
            f"2pc-s3 could not check s3://{bucket}/{key} ({describe_error(error)}):"
            " restart the query from its checkpoint"
        ) from error
    return True


def abort_file(client: Any, bucket: str, key: str, upload_id: str) -> None:
    """Abort one prepared file; an upload already gone is left as it is."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except (ClientError, BotoCoreError) as error:
        if not is_no_such_upload(error):
            raise S3WriteError(
                f"2pc-s3 could not abort s3://{bucket}/{key} (upload {upload_id},"
                f" {describe_error(error)}): the first commit after the query restarts"
                " aborts it"
            ) from error


class S3Resource(TransactionalResource):
    """Slots are manifests; pieces are a task's multipart uploads (see the module doc).

    One object serves one commit or abort. It remembers decided slots (final), the
    decisions it wrote itself, the batches it finished, and the uploads it completed or
    aborted (``settled``), so that one listing of uploads serves the whole commit or abort
    and ``unsettled`` can say what an abort left.
    """

    sink_format = "2pc-s3"
    cleanup_advice = (
        "start the query again from this checkpoint: its first commit completes the"
        " uploads a decision names and aborts the rest (never abort them by hand: a decided"
        " upload aborted is data lost)"
    )

    def __init__(self, options: S3SinkOptions, schema_json: str, client: Any) -> None:
        self.options = options
        self.location = options.location
        self.schema_json = schema_json
        self.client = client
        self._decided: dict[tuple[str, int], BatchDecision] = {}
        self._done: set[tuple[str, int]] = set()
        self._written: set[tuple[str, int]] = set()
        self._listed: dict[str, list[dict[str, Any]]] = {}
        self.settled: set[str] = set()
        """Upload ids this object completed or aborted (or found already gone)."""

    # The decision slot -------------------------------------------------------------------

    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        read = self._read_slot(sink_id, batch_id)
        return None if read is None else read[0]

    def record_decision(self, decision: BatchDecision) -> BatchDecision:
        return self._write_slot(replace(decision, status=DECIDED))

    def fence(
        self, sink_id: str, batch_id: int, pieces: tuple[PreparedPiece, ...]
    ) -> BatchDecision:
        return self._write_slot(BatchDecision(sink_id, batch_id, pieces, ABORTED))

    def mark_done(self, decision: BatchDecision) -> None:
        """Remembered by this object only: S3 keeps no "done" (see the module doc)."""
        self._done.add((decision.sink_id, decision.batch_id))

    def _write_slot(self, wanted: BatchDecision) -> BatchDecision:
        """Compare-and-set ``wanted`` into its slot under the rules of ``BatchDecision``;
        return what the slot holds afterwards."""
        slot_id = (wanted.sink_id, wanted.batch_id)
        if slot_id in self._decided:
            return self._as_known(self._decided[slot_id])
        key = self._slot_key(wanted.sink_id, wanted.batch_id)
        if self._put_slot(key, wanted, etag=None):
            return self._remember(self._wrote(wanted))
        for _ in range(SLOT_WRITE_ATTEMPTS):
            read = self._read_slot(wanted.sink_id, wanted.batch_id)
            if read is None:  # removed since (by hand): create it again
                if self._put_slot(key, wanted, etag=None):
                    return self._remember(self._wrote(wanted))
                continue
            slot, etag = read
            if slot.is_decided:
                return slot
            if wanted.status == ABORTED:
                target = slot.fenced_with(wanted.pieces)
                if target == slot:
                    return slot
            elif slot.accepts(wanted):
                target = wanted
            else:
                return slot
            if self._put_slot(key, target, etag):
                return self._remember(self._wrote(target))
        raise S3WriteError(
            f"2pc-s3 could not write s3://{self.location.bucket}/{key}: it changed"
            f" {SLOT_WRITE_ATTEMPTS} times while being written; another query is writing with"
            f" sinkId {wanted.sink_id}: give each query its own sinkId (or none)"
        )

    def _put_slot(self, key: str, slot: BatchDecision, etag: str | None) -> bool:
        """One conditional PUT: create (``etag`` None) or replace the version ``etag``.
        False when the condition failed (the slot exists, or changed since it was read)."""
        body = manifest_body(
            self.options,
            self.schema_json,
            slot.sink_id,
            slot.batch_id,
            slot.pieces,
            slot.status,
        )
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            self.client.put_object(
                Bucket=self.location.bucket,
                Key=key,
                Body=body,
                ContentType="application/json",
                **condition,
            )
        except (ClientError, BotoCoreError) as error:
            if is_precondition_failed(error) or is_conflict(error):
                return False
            if etag is not None and is_missing(error):
                return False
            raise self._error(
                f"write the manifest s3://{self.location.bucket}/{key}", error
            ) from error
        return True

    def _read_slot(self, sink_id: str, batch_id: int) -> tuple[BatchDecision, str] | None:
        """(what the slot holds, its ETag for a conditional replace), or None when empty."""
        cached = self._decided.get((sink_id, batch_id))
        if cached is not None:
            return self._as_known(cached), ""
        key = self._slot_key(sink_id, batch_id)
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
        slot = BatchDecision(sink_id, batch_id, pieces, manifest_status(manifest))
        return self._remember(slot), str(answer["ETag"])

    def _wrote(self, slot: BatchDecision) -> BatchDecision:
        if slot.is_decided:
            self._written.add((slot.sink_id, slot.batch_id))
        return slot

    def _remember(self, slot: BatchDecision) -> BatchDecision:
        if slot.is_decided:
            self._decided[(slot.sink_id, slot.batch_id)] = slot
            return self._as_known(slot)
        return slot

    def _as_known(self, slot: BatchDecision) -> BatchDecision:
        done = (slot.sink_id, slot.batch_id) in self._done
        return replace(slot, status=DONE) if done else slot

    def _slot_key(self, sink_id: str, batch_id: int) -> str:
        return manifest_key(self.location, sink_id, str(batch_id))

    # Pieces ------------------------------------------------------------------------------

    def commit_piece(self, piece: PreparedPiece) -> None:
        """Complete the piece's files. For a decision this object did not write (a replay,
        a recovery, an abort rolling forward) each file is checked first against the
        listing of uploads in progress (the one recovery uses): a file not in progress is
        complete if its key exists, else lost. Never assumed done from an absence."""
        bucket = self.location.bucket
        in_progress: set[str] | None = None
        if (piece.sink_id, piece.batch_id) not in self._written:
            in_progress = {upload["UploadId"] for upload in self._uploads(piece.sink_id)}
        for file in piece.handle.get("files", ()):
            if in_progress is not None and file["upload_id"] not in in_progress:
                complete = self._exists(file["key"])
            else:
                complete = complete_file(self.client, bucket, file)
            if not complete:
                manifest = self._slot_key(piece.sink_id, piece.batch_id)
                raise DecidedPieceLostError(
                    f"2pc-s3 sink {piece.sink_id} batch {piece.batch_id}: piece"
                    f" {piece.transaction_id} is lost: s3://{bucket}/{file['key']} was never"
                    f" completed and its upload {file['upload_id']} is gone (aborted by a"
                    " lifecycle rule or another tool while the batch waited for its commit),"
                    f" so its {file.get('rows', '?')} rows are not in S3; to write the batch"
                    f" again, delete s3://{bucket}/{manifest} and restart the query from its"
                    " checkpoint"
                )
            self.settled.add(str(file["upload_id"]))

    def _exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.location.bucket, Key=key)
        except (ClientError, BotoCoreError) as error:
            if is_missing(error):
                return False
            raise self._error(f"check s3://{self.location.bucket}/{key}", error) from error
        return True

    def rollback_piece(self, piece: PreparedPiece) -> None:
        for file in piece.handle.get("files", ()):
            abort_file(self.client, self.location.bucket, file["key"], file["upload_id"])
            self.settled.add(str(file["upload_id"]))

    def unfinished_decisions(self, sink_id: str) -> Iterable[BatchDecision]:
        """Decisions naming an upload still in progress (one GET per batch with uploads)."""
        listed = self._uploads(sink_id)
        listed_ids = {upload["UploadId"] for upload in listed}
        found = []
        for batch_id in sorted({_batch_of(upload) for upload in listed}):
            slot = self.find_decision(sink_id, batch_id)
            if slot is not None and slot.status == DECIDED and listed_ids & _upload_ids(slot):
                found.append(slot)
        return found

    def prepared_pieces(self, sink_id: str) -> Iterable[PreparedPiece]:
        """The sink's uploads in progress, one piece per transaction id; but the uploads
        of a decided transaction that its decision does not name by upload id form a piece
        of their own (``UnnamedUploads``), which no decision names: recovery aborts it.
        They are what a create whose answer was lost leaves (botocore's retry made the
        upload the task went on with) when the task could not abort them itself."""
        by_transaction: dict[str, list[dict[str, Any]]] = {}
        for upload in self._uploads(sink_id):
            files = by_transaction.setdefault(upload["transaction"], [])
            files.append({"key": upload["Key"], "upload_id": upload["UploadId"]})
        pieces: list[PreparedPiece] = []
        for transaction, files in sorted(by_transaction.items()):
            parsed = parse_transaction_id(transaction)
            if parsed is None:
                continue
            sink, batch_id, partition_id, attempt = parsed
            piece = PreparedPiece(sink, batch_id, partition_id, attempt, 0, {"files": files})
            decision = self._decision_naming(piece)
            if decision is None:
                pieces.append(piece)
                continue
            named = _upload_ids(decision)
            unnamed = [file for file in files if file["upload_id"] not in named]
            if len(unnamed) < len(files):
                kept = [file for file in files if file["upload_id"] in named]
                pieces.append(replace(piece, handle={"files": kept}))
            if unnamed:
                pieces.append(
                    UnnamedUploads(sink, batch_id, partition_id, attempt, 0, {"files": unnamed})
                )
        return pieces

    def _decision_naming(self, piece: PreparedPiece) -> BatchDecision | None:
        """The decision of the piece's batch if it names the piece's transaction (decisions
        are final, so the answer never goes stale); one GET per undecided batch."""
        slot = self._decided.get((piece.sink_id, piece.batch_id))
        if slot is None:
            slot = self.find_decision(piece.sink_id, piece.batch_id)
        if slot is None or not slot.is_decided or not slot.names(piece):
            return None
        return slot

    def _uploads(self, sink_id: str) -> list[dict[str, Any]]:
        """This sink's uploads in progress under the prefix, with their transaction id:
        listed once per object; those it settled since are left out."""
        listed = self._listed.get(sink_id)
        if listed is None:
            listed = self._list_uploads(sink_id)
            self._listed[sink_id] = listed
        return [upload for upload in listed if upload["UploadId"] not in self.settled]

    def _list_uploads(self, sink_id: str) -> list[dict[str, Any]]:
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

    # Inspection (read only) ----------------------------------------------------------

    def describe_target(self) -> str:
        return self.location.url

    def inspected_decisions(self, sink_id: str) -> list[DecisionState]:
        """Every manifest of the sink (one listing, one GET each); a decided batch is done
        when none of the uploads it names is still in progress (S3 keeps no "done")."""
        prefix = f"{self.location.manifests_prefix}{sink_id}/"
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            names = [
                item["Key"][len(prefix) :].removesuffix(".json")
                for page in pages
                for item in page.get("Contents", ())
            ]
        except (ClientError, BotoCoreError) as error:
            raise self._error(f"list the manifests under {self.location.url}", error) from error
        unfinished = {decision.batch_id for decision in self.unfinished_decisions(sink_id)}
        found = []
        for batch_id in sorted(int(name) for name in names if name.isdigit()):
            decision = self.find_decision(sink_id, batch_id)
            if decision is not None:
                found.append(DecisionState.of(decision, finished=batch_id not in unfinished))
        return found

    def leftovers(self, sink_id: str, prepared: list[PreparedPiece]) -> list[Leftover]:
        """Each of the sink's multipart uploads in progress."""
        return [
            Leftover("multipart upload", f"{upload['Key']} ({upload['UploadId']})")
            for upload in sorted(self._uploads(sink_id), key=lambda upload: upload["Key"])
        ]

    # What an abort left ------------------------------------------------------------------

    def unsettled(self, pieces: Iterable[PreparedPiece]) -> list[tuple[str, str]]:
        """(key, upload id) of the pieces' files this object neither completed nor aborted."""
        return [
            (str(file["key"]), str(file["upload_id"]))
            for piece in pieces
            for file in piece.handle.get("files", ())
            if str(file["upload_id"]) not in self.settled
        ]

    def log_left_after_abort(self, pieces: Sequence[PreparedPiece], batch_id: int) -> None:
        """Name every file an abort could not settle, and how to find and mend them."""
        left = self.unsettled(pieces)
        if not left or not pieces:
            return
        bucket = self.location.bucket
        sink_id = pieces[0].sink_id
        logger.warning(
            "2pc-s3 batch %d of sink %s: %d uploads are left in progress: %s. If"
            " s3://%s/%s says status decided they belong to the batch and are completed,"
            " otherwise aborted, by the first commit after the query restarts from its"
            " checkpoint; list them with: aws s3api list-multipart-uploads --bucket %s"
            " --prefix %s",
            batch_id,
            sink_id,
            len(left),
            ", ".join(f"s3://{bucket}/{key} (upload {upload_id})" for key, upload_id in left),
            bucket,
            self._slot_key(sink_id, batch_id),
            bucket,
            self.location.key(""),
        )

    def _error(self, what: str, error: BaseException) -> S3WriteError:
        return S3WriteError(
            f"2pc-s3 could not {what} ({describe_error(error)}): restart the query from its"
            " checkpoint once S3 answers; exactly-once holds"
        )


class UnnamedUploads(PreparedPiece):
    """Uploads in progress under a decided piece's keys whose upload ids its decision does
    not name. Its transaction id differs from the piece's, so no decision names it and the
    coordinator rolls it back (aborts the uploads); the decided piece is left as it is."""

    @property
    def transaction_id(self) -> str:
        return f"{super().transaction_id} (uploads its decision does not name)"


def _batch_of(upload: Mapping[str, Any]) -> int:
    parsed = parse_transaction_id(upload["transaction"])
    assert parsed is not None
    return parsed[1]


def _upload_ids(decision: BatchDecision) -> set[str]:
    return {
        str(file["upload_id"])
        for piece in decision.pieces
        for file in piece.handle.get("files", ())
    }


def inspect_sink(query_id: str, options: Mapping[str, str]) -> SinkState:
    """The state of the 2pc-s3 sink that a query of ``query_id`` writes with ``options``
    (``path``, optional ``endpointUrl``, ``region``, credentials, ``sinkId``; without
    credentials boto3's default chain), its id derived as the sink derives it. Read only
    (``TransactionalResource.inspect``)."""
    parsed = parse_sink_options(options)
    sink_id = parsed.sink_id or derive_sink_id(query_id, parsed.target)
    resource = S3Resource(parsed, "", s3_client(parsed.connection))
    try:
        return resource.inspect(sink_id)
    finally:
        resource.close()


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
