"""A 2pc-s3 streaming pipeline in a driver subprocess or in this session, shared by the
fault and inspection tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eospack.commit_protocols.pieces import DECIDED
from eospack.core import faults
from eospack.lab.testing import await_query
from integration_tests.crash_harness import run_driver
from integration_tests.drivers.s3_sink_driver import start_query
from integration_tests.s3_parts import (
    connection_options,
)
from integration_tests.sink_contract.adapters import Bucket
from integration_tests.sink_contract.inputs import write_source

DRIVER = Path(__file__).parent / "drivers" / "s3_sink_driver.py"


DRIVER_TIMEOUT = 150.0


QUERY_TIMEOUT = 120.0


class Pipeline:
    """The crash driver's query: input files, checkpoint, fault directory; runs as a child
    driver (faults armed, or killed at a fault point) or restarts in the test's session."""

    def __init__(self, s3: Any, tmp_path: Path, prefix: str, batches: int) -> None:
        self.s3 = s3
        self.prefix = prefix
        self.source = tmp_path / "source"
        self.source.mkdir()
        self.batches = write_source(self.source, batches)
        self.checkpoint = tmp_path / "checkpoint"
        self.path = f"s3://{s3.endpoint.bucket}/{prefix}"
        self.fault_directory = tmp_path / "faults"
        self.bucket = Bucket(s3, prefix)

    def run_driver(self, fault_point: str | None = None) -> Any:
        endpoint = self.s3.endpoint
        arguments = [
            "--source",
            str(self.source),
            "--checkpoint",
            str(self.checkpoint),
            "--path",
            self.path,
            "--endpoint-url",
            endpoint.endpoint_url,
            "--partition-by",
            "grp",
        ]
        environment = {
            "AWS_ACCESS_KEY_ID": endpoint.access_key_id,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret_access_key,
            "AWS_DEFAULT_REGION": endpoint.region,
            faults.FAULT_DIRECTORY_VARIABLE: str(self.fault_directory),
        }
        return run_driver(
            DRIVER,
            arguments,
            timeout=DRIVER_TIMEOUT,
            fault_point=fault_point,
            environment=environment,
        )

    def restart_here(self, spark: Any) -> None:
        """The same query in the test's SparkSession (same checkpoint: same sink id)."""
        query = start_query(
            spark,
            str(self.source),
            str(self.checkpoint),
            self.path,
            self.s3.endpoint.endpoint_url,
            "grp",
            connection_options(self.s3),
        )
        await_query(query, QUERY_TIMEOUT)

    def arm(self, call: str, mode: faults.Mode, batch_id: int, times: int = 1) -> None:
        faults.arm(self.fault_directory, call, mode, batch_id, times=times)

    def committed_rows(self, spark: Any) -> list[tuple[Any, ...]]:
        frame = spark.read.format("2pc-s3").options(**connection_options(self.s3))
        return sorted(tuple(row) for row in frame.load(self.path).select("id", "grp").collect())

    def rows_of_batches(self, *batch_ids: int) -> list[tuple[Any, ...]]:
        return sorted(row for batch in batch_ids for row in self.batches[batch])

    def assert_exactly_once(self, spark: Any) -> None:
        assert self.committed_rows(spark) == self.rows_of_batches(*range(len(self.batches)))
        assert self.bucket.upload_ids() == set(), "no upload left in progress"
        manifests = self.bucket.manifests()
        assert list(manifests) == list(range(len(self.batches)))
        assert {manifest["status"] for manifest in manifests.values()} == {DECIDED}
        named = {file["key"] for manifest in manifests.values() for file in manifest["files"]}
        assert named <= self.bucket.data_keys()
