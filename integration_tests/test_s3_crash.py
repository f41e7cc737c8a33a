"""2pc-s3 under crashes: the driver is SIGKILLed at each commit step, then restarted.

One query (``drivers/s3_sink_driver.py``: one input file per micro-batch, two tasks per
batch, partitioned so each piece has two files) runs again and again from the same
checkpoint. Run k is killed at a fault point of commit_protocols in batch k:
after_prepare (parts uploaded, no manifest) and between_piece_commits (some uploads
completed) by default; in the chaos run also after_decision (manifest written, no upload
completed) and after_commit (batch committed, Spark's commit log not written). Each
restart replays the killed batch and must mend it. After every run the reader shows
exactly the batches whose files are all complete; after a final clean run every row is
there once, no upload is left dangling and every object is named by a manifest.

Each driver run costs a Spark start (~20 s here), hence two crash points by default: a
decided batch with no upload completed is rolled forward by the same path as one half
completed, and its lost answer is test_s3_faults'; after_commit's restart path (a decided
batch replayed: its new uploads aborted) is also taken by the restart after
between_piece_commits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from integration_tests.crash_harness import run_driver

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parent / "drivers" / "s3_sink_driver.py"
DRIVER_TIMEOUT = 150.0
ROWS_PER_BATCH = 200


def write_source(directory: Path, count: int) -> list[list[tuple[int, str]]]:
    """One file per batch, modification times increasing so that file k is batch k."""
    batches = []
    for batch in range(count):
        ids = list(range(batch * ROWS_PER_BATCH, (batch + 1) * ROWS_PER_BATCH))
        groups = [f"g{i % 2}" for i in ids]
        file = directory / f"part-{batch:03d}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "grp": groups}), file)
        os.utime(file, (1_700_000_000 + batch, 1_700_000_000 + batch))
        batches.append(list(zip(ids, groups, strict=True)))
    return batches


class Bucket:
    """What the test inspects under the query's prefix, straight from S3."""

    def __init__(self, s3: Any, prefix: str) -> None:
        self.client = s3.endpoint.client()
        self.bucket = s3.endpoint.bucket
        self.prefix = prefix

    def manifests(self) -> dict[int, dict[str, Any]]:
        found = {}
        for key in self._keys(f"{self.prefix}/_eospack/manifests/"):
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            manifest = json.loads(body)
            found[manifest["batch_id"]] = manifest
        return dict(sorted(found.items()))

    def upload_ids(self) -> set[str]:
        answer = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=f"{self.prefix}/")
        return {upload["UploadId"] for upload in answer.get("Uploads", ())}

    def data_keys(self) -> set[str]:
        return {key for key in self._keys(f"{self.prefix}/") if "/_eospack/" not in key}

    def _keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return [entry["Key"] for page in pages for entry in page.get("Contents", ())]


def named_upload_ids(manifest: dict[str, Any]) -> set[str]:
    return {file["upload_id"] for piece in manifest["pieces"] for file in piece["handle"]["files"]}


@pytest.mark.timeout(600)
def test_crash_after_prepare_and_between_piece_commits_then_restart_delivers_each_row_once(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str
) -> None:
    """Uploads left in progress, and a decided batch half completed (default CI; a decision
    whose answer is lost is test_s3_faults', every step the chaos lane's)."""
    crash_then_restart(spark, s3, tmp_path, unique_name, ["after_prepare", "between_piece_commits"])


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_crash_at_every_commit_step_including_after_commit(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str
) -> None:
    crash_then_restart(
        spark,
        s3,
        tmp_path,
        unique_name,
        ["after_prepare", "after_decision", "between_piece_commits", "after_commit"],
    )


def crash_then_restart(
    spark: Any, s3: Any, tmp_path: Path, unique_name: str, fault_points: list[str]
) -> None:
    """Run k (k = 0, 1, ...) is killed at ``fault_points[k]`` in batch k, then a clean run."""
    source = tmp_path / "source"
    source.mkdir()
    batches = write_source(source, len(fault_points) + 1)
    path = f"s3://{s3.endpoint.bucket}/{unique_name}"
    arguments = [
        "--source",
        str(source),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--path",
        path,
        "--endpoint-url",
        s3.endpoint.endpoint_url,
        "--partition-by",
        "grp",
    ]
    credentials = {
        "AWS_ACCESS_KEY_ID": s3.endpoint.access_key_id,
        "AWS_SECRET_ACCESS_KEY": s3.endpoint.secret_access_key,
        "AWS_DEFAULT_REGION": s3.endpoint.region,
    }
    bucket = Bucket(s3, unique_name)

    def run(fault_point: str | None) -> None:
        outcome = run_driver(
            DRIVER,
            arguments,
            timeout=DRIVER_TIMEOUT,
            fault_point=fault_point,
            environment=credentials,
        )
        expected = outcome.was_killed if fault_point else outcome.succeeded
        assert expected, f"{fault_point}: exit {outcome.returncode}\n{outcome.output[-4000:]}"

    def committed_rows() -> list[tuple[Any, ...]]:
        frame = spark.read.format("2pc-s3").option("endpointUrl", s3.endpoint.endpoint_url)
        frame = frame.option("accessKeyId", s3.endpoint.access_key_id)
        frame = frame.option("secretAccessKey", s3.endpoint.secret_access_key).load(path)
        return sorted(tuple(row) for row in frame.select("id", "grp").collect())

    def rows_of_batches(count: int) -> list[tuple[Any, ...]]:
        return sorted(row for batch in batches[:count] for row in batch)

    for batch, fault_point in enumerate(fault_points):
        run(f"{fault_point}@{batch}")
        manifests = bucket.manifests()
        uploads = bucket.upload_ids()
        if fault_point == "after_prepare":
            assert list(manifests) == list(range(batch))
            assert uploads, "the killed task's parts are uploaded, not completed"
            continue
        assert list(manifests) == list(range(batch + 1))
        decided = named_upload_ids(manifests[batch])
        if fault_point == "after_decision":
            assert decided <= uploads, "decided, no upload completed"
        elif fault_point == "between_piece_commits":
            assert 0 < len(decided & uploads) < len(decided), "some uploads completed"
        else:
            assert not decided & uploads, "every upload completed"
        visible = batch + 1 if fault_point == "after_commit" else batch
        assert committed_rows() == rows_of_batches(visible), "only whole batches are read"

    run(None)
    manifests = bucket.manifests()
    assert list(manifests) == list(range(len(batches)))
    assert committed_rows() == rows_of_batches(len(batches))
    assert bucket.upload_ids() == set(), "no dangling multipart upload"
    named = {file["key"] for manifest in manifests.values() for file in manifest["files"]}
    assert bucket.data_keys() == named, "every completed object is named by a manifest"
    assert len({manifest["sink_id"] for manifest in manifests.values()}) == 1
    assert {manifest["status"] for manifest in manifests.values()} == {"decided"}
