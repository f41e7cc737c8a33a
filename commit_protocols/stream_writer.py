"""The stream writer both 2PC sinks share: prepare on executors, coordinate on the driver."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from eospack.commit_protocols.coordinator import TwoPhaseCommitCoordinator
from eospack.commit_protocols.fault_points import AFTER_PREPARE, fault_point
from eospack.commit_protocols.identity import TaskIdentity, current_task
from eospack.commit_protocols.pieces import PreparedPiece
from eospack.commit_protocols.resource import TransactionalResource


class TwoPhaseCommitStreamWriter(DataSourceStreamArrowWriter):
    """Executors ``prepare`` each task's Arrow batches; the driver runs the coordinator.

    A sink subclasses it with three methods: ``prepare`` (executor I/O), ``open_resource``
    (the driver's view of its storage) and, for at-least-once mode, ``write_directly``.
    The writer object is pickled to executors, so it holds only the typed options.
    """

    sink_name = "2pc sink"

    def __init__(self, sink_id: str | None, target: str, exactly_once: bool) -> None:
        self.sink_id = sink_id
        self.target = target
        self.exactly_once = exactly_once

    @abstractmethod
    def prepare(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> PreparedPiece:
        """Write the task's rows so that they are durable but not visible (executor side)."""

    @abstractmethod
    def open_resource(self) -> TransactionalResource:
        """Connect to the sink's storage for the driver-side commit, abort and recovery."""

    @abstractmethod
    def write_directly(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> int:
        """At-least-once mode: write and make visible at once; return the row count."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task = current_task(self.sink_id, self.target)
        if not self.exactly_once:
            rows = self.write_directly(task, iterator)
            return PreparedPiece(task.sink_id, task.batch_id, task.partition_id, task.attempt, rows)
        piece = self.prepare(task, iterator)
        fault_point(AFTER_PREPARE, task.batch_id)
        return piece

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        if not self.exactly_once:
            return
        resource = self.open_resource()
        try:
            TwoPhaseCommitCoordinator(resource, self.sink_name).commit(messages, batchId)
        finally:
            resource.close()

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        if not self.exactly_once:
            return
        resource = self.open_resource()
        try:
            TwoPhaseCommitCoordinator(resource, self.sink_name).abort(messages, batchId)
        finally:
            resource.close()
