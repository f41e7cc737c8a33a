"""Why ``stop_after_batch`` holds Spark's progress lock: a query marked terminated while
Spark plans a batch is interrupted before that batch's job (Spark 4.3 checks after
planning), leaving the batch logged and not committed. The source here plans slowly
(``latestOffset`` waits for a release file), so the test can stop the query exactly
there."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from eospack.lab.testing import wait_until
from eospack.tools.checkpoint import inspect_checkpoint
from eospack.tools.stop_with_savepoint import stop_after_batch

pytestmark = pytest.mark.integration

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class SlowPlanningReader(DataSourceStreamReader):
    """One row per batch; offering batch n (``latestOffset``) writes ``planning-n`` into the
    directory and waits (up to 60 s) for ``release-n`` there."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        self.next = 0

    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
        batch = self.next + 1
        (self.directory / f"planning-{batch}").write_text("")
        deadline = time.monotonic() + 60
        while not (self.directory / f"release-{batch}").exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.next = batch
        return {"n": batch}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [InputPartition(int(end["n"]))]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        yield (int(partition.value),)  # type: ignore[attr-defined]

    def commit(self, end: dict[str, int]) -> None:
        pass


class SlowPlanningSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "eospack-test-slow-planning"

    def schema(self) -> str:
        return "n INT"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SlowPlanningReader(self.options["directory"])


def start(spark: Any, directory: Path, checkpoint: Path) -> Any:
    spark.dataSource.register(SlowPlanningSource)
    return (
        spark.readStream.format(SlowPlanningSource.name())
        .option("directory", str(directory))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def planned_and_committed(checkpoint: Path) -> tuple[int, int]:
    batches = inspect_checkpoint(checkpoint).batches
    return batches[-1].batch_id, max(b.batch_id for b in batches if b.committed)


def run_to_planning_of_batch(directory: Path, batches: int) -> None:
    """Release batches 1 .. batches - 1, wait until Spark plans batch ``batches``."""
    for batch in range(1, batches):
        (directory / f"release-{batch}").write_text("")
    wait_until(lambda: (directory / f"planning-{batches}").exists(), 120, f"planning of {batches}")


@pytest.mark.timeout(300)
def test_a_query_marked_terminated_while_planning_is_cut_before_its_batch_runs(
    spark: Any, tmp_path: Path
) -> None:
    """Spark's behaviour, the reason for the lock: this is what a naive stop leaves."""
    directory, checkpoint = tmp_path / "signals", tmp_path / "checkpoint"
    directory.mkdir()
    query = start(spark, directory, checkpoint)
    try:
        run_to_planning_of_batch(directory, 3)
        execution = query._jsq.streamingQuery()
        state = execution.state()
        package = state.get().getClass().getName().rpartition(".")[0]
        jvm = spark.sparkContext._jvm
        state.set(
            jvm.java.lang.Class.forName(f"{package}.TERMINATED$").getField("MODULE$").get(None)
        )
        (directory / "release-3").write_text("")
        assert query.awaitTermination(60) and query.exception() is None
    finally:
        query.stop()
    # offsets batch ids count from 0: the source's batch n is Spark's batch n - 1
    assert planned_and_committed(checkpoint) == (2, 1)


@pytest.mark.timeout(300)
def test_stop_after_batch_while_planning_lets_the_planned_batch_run_and_commit(
    spark: Any, tmp_path: Path
) -> None:
    directory, checkpoint = tmp_path / "signals", tmp_path / "checkpoint"
    directory.mkdir()
    query = start(spark, directory, checkpoint)
    try:
        run_to_planning_of_batch(directory, 3)
        releaser = threading.Timer(1.0, lambda: (directory / "release-3").write_text(""))
        releaser.start()
        stop_after_batch(query, timeout=60)
        assert query.awaitTermination(60) and query.exception() is None
        releaser.join()
    finally:
        query.stop()
    assert planned_and_committed(checkpoint) == (2, 2)
    assert not (directory / "planning-4").exists()
    assert json.loads((checkpoint / "offsets" / "2").read_text().splitlines()[2]) == {"n": 3}


@pytest.mark.timeout(300)
def test_stop_after_batch_catches_back_to_back_no_data_batches_under_the_default_trigger(
    spark: Any, tmp_path: Path
) -> None:
    """A ttl (processing-time timeouts) and the default trigger: Spark plans a no-data batch
    right after each batch, so the query is never idle; it still stops between two."""
    from eospack.stateful_ops import running_count

    checkpoint = tmp_path / "checkpoint"
    events = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 5)
        .load()
        .selectExpr("CAST(value % 7 AS STRING) AS key")
    )
    query = (
        running_count(events, "key", key_groups=2, ttl="1 hour")
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        wait_until(
            lambda: len([p for p in query.recentProgress if p["numInputRows"] == 0]) >= 3,
            120,
            "no-data batches",
        )
        stop_after_batch(query, timeout=60)
        assert query.awaitTermination(60) and query.exception() is None
    finally:
        query.stop()
    planned, committed = planned_and_committed(checkpoint)
    assert planned == committed
