"""The contract suite's 2pc-s3 adapter: a bucket of the S3 endpoint, multipart uploads in
progress as leftovers."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from eospack.commit_protocols import sink_prefix
from integration_tests.sink_contract.base import (
    EXACTLY_ONCE,
    BoundSink,
    CallFaults,
    DocumentedOption,
    OptionChange,
    Options,
    Rows,
    SinkAdapter,
    _switch,
)


class Bucket:
    """What a test inspects under one prefix, straight from S3."""

    def __init__(self, s3: Any, prefix: str) -> None:
        self.client = s3.endpoint.client()
        self.bucket = s3.endpoint.bucket
        self.prefix = prefix

    def manifests(self, sink_id: str | None = None) -> dict[int, dict[str, Any]]:
        """Each batch's decision manifest (of one sink, or of the only one), by batch id."""
        found = {}
        below = f"{self.prefix}/_eospack/manifests/{sink_id + '/' if sink_id else ''}"
        for key in self._keys(below):
            if key.rsplit("/", 1)[-1].count(".") != 1:
                continue  # at-least-once task manifests: <batch>.<partition>.<attempt>.json
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            manifest = json.loads(body)
            found[manifest["batch_id"]] = manifest
        return dict(sorted(found.items()))

    def all_manifests(self) -> list[dict[str, Any]]:
        keys = self._keys(f"{self.prefix}/_eospack/manifests/")
        bodies = (
            self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read() for key in keys
        )
        return [json.loads(body) for body in bodies]

    def uploads(self) -> list[dict[str, Any]]:
        answer = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{self.prefix}/")
        return list(answer.get("Uploads", ()))

    def upload_ids(self) -> set[str]:
        return {upload["UploadId"] for upload in self.uploads()}

    def data_keys(self) -> set[str]:
        return {key for key in self._keys(f"{self.prefix}/") if "/_eospack/" not in key}

    def _keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return [entry["Key"] for page in pages for entry in page.get("Contents", ())]


def named_upload_ids(manifest: Mapping[str, Any]) -> set[str]:
    return {file["upload_id"] for piece in manifest["pieces"] for file in piece["handle"]["files"]}


class S3Sink(BoundSink):
    def __init__(self, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
        super().__init__(request, tmp_path, name)
        self.s3 = request.getfixturevalue("s3")
        self.path = f"s3://{self.s3.endpoint.bucket}/{name}"
        self.bucket = Bucket(self.s3, name)

    def credentials(self) -> Options:
        endpoint = self.s3.endpoint
        return {
            "endpointUrl": endpoint.endpoint_url,
            "accessKeyId": endpoint.access_key_id,
            "secretAccessKey": endpoint.secret_access_key,
            "region": endpoint.region,
        }

    def base_options(self) -> Options:
        return {"path": self.path, "partitionBy": "grp", **self.credentials()}

    def rows(self, options: Options) -> Rows:
        frame = self.spark.read.format("2pc-s3").options(**self.credentials()).load(self.path)
        if not self.bucket.all_manifests():
            return Counter()
        return Counter((int(r[0]), str(r[1])) for r in frame.select("id", "grp").collect())

    def leftovers(self, sink_ids: set[str], options: Options) -> list[str]:
        return [
            f"upload in progress {upload['Key']}"
            for upload in self.bucket.uploads()
            if any(sink_prefix(sink_id) in upload["Key"] for sink_id in sink_ids)
        ]

    def decisions(self, sink_ids: set[str], options: Options) -> dict[tuple[str, int], str]:
        in_progress = self.bucket.upload_ids()
        found = {}
        for manifest in self.bucket.all_manifests():
            if manifest["sink_id"] not in sink_ids or "status" not in manifest:
                continue
            if manifest["status"] == "aborted":
                status = "aborted"
            elif named_upload_ids(manifest) & in_progress:
                status = "pending"
            else:
                status = "done"
            found[(manifest["sink_id"], int(manifest["batch_id"]))] = status
        return found


def _s3_path_form(form: str) -> Callable[[BoundSink, Options], Options]:
    def change(sink: BoundSink, options: Options) -> Options:
        path: str = sink.path  # type: ignore[attr-defined]
        forms = {"s3a": path.replace("s3://", "s3a://", 1), "trailing_slash": f"{path}/"}
        return {**options, "path": forms[form]}

    return change


def _s3_endpoint_localhost(sink: BoundSink, options: Options) -> Options:
    return {**options, "endpointUrl": options["endpointUrl"].replace("127.0.0.1", "localhost")}


class S3(SinkAdapter):
    name = "s3"
    sink_format = "2pc-s3"
    data_source = "eospack.connectors.s3.sink:TwoPhaseS3DataSource"
    fixtures = ("s3",)
    calls = CallFaults(
        decide="s3.PutObject",
        commit_piece="s3.CompleteMultipartUpload",
        prepare="s3.UploadPart",
        every=(
            "s3.CreateMultipartUpload",
            "s3.UploadPart",
            "s3.PutObject",
            "s3.GetObject",
            "s3.CompleteMultipartUpload",
            "s3.AbortMultipartUpload",
            "s3.ListMultipartUploads",
        ),
    )
    documented_options = (
        DocumentedOption("path", lambda sink: sink.path),  # type: ignore[attr-defined]
        DocumentedOption("fileFormat", "jsonl"),
        DocumentedOption("partitionBy", "grp"),
        DocumentedOption("targetFileSize", "1m"),
        DocumentedOption("endpointUrl", lambda sink: sink.s3.endpoint.endpoint_url),  # type: ignore[attr-defined]
        DocumentedOption("region", lambda sink: sink.s3.endpoint.region),  # type: ignore[attr-defined]
        DocumentedOption("accessKeyId", lambda sink: sink.s3.endpoint.access_key_id),  # type: ignore[attr-defined]
        DocumentedOption("secretAccessKey", lambda sink: sink.s3.endpoint.secret_access_key),  # type: ignore[attr-defined]
        DocumentedOption("sessionToken", "contract-session-token"),
        DocumentedOption("deliveryGuarantee", EXACTLY_ONCE),
        DocumentedOption("sinkId", "contract_documented_options"),
    )
    option_changes = (
        OptionChange("path_s3a", _s3_path_form("s3a")),
        OptionChange("path_trailing_slash", _s3_path_form("trailing_slash")),
        OptionChange("endpoint_localhost", _s3_endpoint_localhost),
        OptionChange("targetFileSize", _switch("targetFileSize", "2m"), chaos_only=True),
        OptionChange("fileFormat_jsonl", _switch("fileFormat", "jsonl"), chaos_only=True),
    )
    timeout_not_applicable = (
        "an S3 multipart upload has no timeout of its own (only a bucket lifecycle rule"
        " aborts it: test_s3_faults' decided-upload-aborted test)"
    )
    bound = S3Sink


# 2pc-kafka -----------------------------------------------------------------------------
