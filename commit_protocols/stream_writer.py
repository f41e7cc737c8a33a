"""The stream writer both 2PC sinks share: prepare on executors, coordinate on the driver."""

from __future__ import annotations

import logging
import threading
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from eospack.core.fault_points import AFTER_PREPARE, fault_point
from eospack.core.metrics import RECORDER
from eospack.core.spark_features import STREAM_ARROW_WRITER

from .coordinator import (
    TwoPhaseCommitCoordinator,
    prepared_pieces_of,
    record_committed,
    record_rolled_back,
    record_rolled_forward,
)
from .identity import TaskIdentity, current_task, parse_attempt
from .pieces import DECIDED, BatchDecision, PreparedPiece
from .resource import DecidedPieceLostError, TransactionalResource

if TYPE_CHECKING or STREAM_ARROW_WRITER.available:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
else:
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter

    class DataSourceStreamArrowWriter(DataSourceStreamWriter, DataSourceArrowWriter):
        """Spark 4.0 has no stream Arrow writer, but its write worker hands any writer
        that is a ``DataSourceArrowWriter`` the Arrow batches it got from the JVM,
        streaming or not (``pyspark/sql/worker/write_into_data_source.py``): the same
        batches as 4.1's ``DataSourceStreamArrowWriter``, with no rows built."""


logger = logging.getLogger(__name__)

_recovered_runs: set[tuple[str, str]] = set()
"""(sink id, query run) pairs whose at-least-once recovery ran in this process."""
_recovered_lock = threading.Lock()


class TwoPhaseCommitStreamWriter(DataSourceStreamArrowWriter):
    """Executors ``prepare`` each task's Arrow batches; the driver runs the coordinator.

    A sink subclasses it with three methods: ``prepare`` (executor I/O), ``open_resource``
    (the driver's view of its storage) and, for at-least-once mode, ``write_directly``.
    The writer object is pickled to executors, so it holds only the typed options.

    At-least-once mode still recovers once per query run (``recover_at_least_once``): a
    query that ran exactly-once may have left a decided batch or prepared pieces, which
    must be finished or rolled back whatever the mode of the restart.
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
            return task.piece(rows)
        piece = self.prepare(task, iterator)
        fault_point(AFTER_PREPARE, task.batch_id)
        return piece

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        try:
            self._commit_batch(messages, batchId)
        finally:
            RECORDER.flush()

    def _commit_batch(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        if not self.exactly_once:
            self._recover_once_per_run(messages, batchId)
            pieces = prepared_pieces_of(messages)
            if pieces:
                rows = sum(piece.rows for piece in pieces)
                record_committed(
                    self.sink_name, pieces[0].sink_id, "at_least_once", len(pieces), rows
                )
            return
        resource = self.open_resource()
        try:
            TwoPhaseCommitCoordinator(resource, self.sink_name).commit(messages, batchId)
        finally:
            resource.close()

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Exactly-once: the coordinator's abort. At-least-once: nothing; the rows are
        visible already, and what the first commit's recovery could not do is retried by
        the first commit after the restart (the failed commit is not remembered)."""
        if not self.exactly_once:
            return
        resource = self.open_resource()
        try:
            TwoPhaseCommitCoordinator(resource, self.sink_name).abort(messages, batchId)
        finally:
            resource.close()
            RECORDER.flush()

    def _recover_once_per_run(
        self, messages: Sequence[WriterCommitMessage | None], batch_id: int
    ) -> None:
        """At-least-once: the first commit of each query run recovers the sink.

        Remembered per (sink id, run id) in this process, the run id read off the pieces'
        attempt strings: a restarted query may commit through the same Python worker, and
        must recover again. A commit whose pieces carry no run (written without Spark's
        job group) recovers every time. A failed recovery is not remembered: the commit
        raises, the query stops, and the restart's first commit tries again.
        """
        pieces = prepared_pieces_of(messages)
        sink_ids = {piece.sink_id for piece in pieces}
        if len(sink_ids) != 1:
            return  # no piece reached the driver: the next commit knows the sink
        sink_id = sink_ids.pop()
        runs = {parse_attempt(piece.attempt).run for piece in pieces}
        run = runs.pop() if len(runs) == 1 else None
        queries = {piece.query_id for piece in pieces}
        query_id = queries.pop() if len(queries) == 1 else None
        if run is not None:
            with _recovered_lock:
                if (sink_id, run) in _recovered_runs:
                    return
        resource = self.open_resource()
        try:
            recover_at_least_once(resource, self.sink_name, sink_id, batch_id, query_id=query_id)
        finally:
            resource.close()
        if run is not None:
            with _recovered_lock:
                _recovered_runs.add((sink_id, run))
        logger.info(
            "%s at-least-once: sink %s recovered at batch %d, the first commit of query run %s",
            self.sink_name,
            sink_id,
            batch_id,
            run or "(unknown: every commit recovers)",
        )


def recover_at_least_once(
    resource: TransactionalResource,
    sink_name: str,
    sink_id: str,
    batch_id: int,
    *,
    mark_lost: bool = True,
    query_id: str | None = None,
) -> None:
    """What an exactly-once run left, finished by the first at-least-once commit of a run.

    Run at the commit of ``batch_id``, the first batch of this run (the first one missing
    from Spark's commit log), after its tasks wrote every row of it directly:

    - every unfinished decision is rolled forward (its pieces committed, marked done): a
      piece named by a decision is never rolled back, so a later exactly-once run finds
      nothing undecided (the decided batch's rows may then be visible twice: at least once);
    - every prepared piece of a batch <= ``batch_id`` that no decision names is rolled
      back (Kafka: the open transactions that pin the output's last stable offset;
      PostgreSQL: prepared transactions holding row locks; S3: multipart uploads).

    A decided piece found lost (``DecidedPieceLostError``: the broker timed out the
    transaction, someone ran ROLLBACK PREPARED, a lifecycle rule aborted the upload) does
    not stop an at-least-once run when its batch is 1 <= N <= ``batch_id``: the other
    pieces are committed, the decision is marked done and a warning names the lost ones.
    Why that is safe: a decision of batch N exists only if Spark ran N, and a commit that
    did not finish its decision raised, so Spark's commit log lacks N unless an
    at-least-once run committed it. Either way an at-least-once run replayed N from
    Spark's offset log (the same input range) and wrote each of its rows directly: this
    run's tasks did so for N = ``batch_id`` before this commit, an earlier run for N below
    it. So every row of N is in the sink at least once, and marking the slot done only
    stops exactly-once restarts from failing forever on pieces no one can bring back.
    Only for a decision this very query made (``query_id``, Spark's id of the running
    query, is among the decision's pieces' query ids): another query sharing the sinkId
    never replayed its input. Not for batch 0 (Spark replays an uncommitted batch 0 from a
    fresh ``initialOffset()``, which a source may answer differently) nor for a batch above
    ``batch_id``: those raise ``DecidedPieceLostError`` as in exactly-once mode.

    ``mark_lost=False`` is for a task that recovers before it writes (2pc-jdbc: the
    leftovers hold row locks its writes would wait on): its rows are not written yet, so a
    decision with a lost piece is left decided (its other pieces committed) for the
    driver's commit to mark, and nothing is raised.
    """
    decided: dict[int, BatchDecision] = {}
    for decision in resource.unfinished_decisions(sink_id):
        _finish_or_mark_lost(resource, sink_name, decision, batch_id, mark_lost, query_id)
        if decision.status == DECIDED:
            record_rolled_forward(sink_name, sink_id)
        decided[decision.batch_id] = decision
    orphans = [piece for piece in resource.prepared_pieces(sink_id) if piece.batch_id <= batch_id]
    for piece in orphans:
        if piece.batch_id in decided and not decided[piece.batch_id].names(piece):
            # A decision is final: no later one can name this piece, no fence is needed
            # (and fencing would finish the decision again, lost pieces included).
            resource.rollback_piece(piece)
            record_rolled_back(sink_name, sink_id)
            logger.warning(
                "%s at-least-once recovery: rolled back orphaned piece %s of batch %d",
                sink_name,
                piece.transaction_id,
                piece.batch_id,
            )
    undecided = [piece for piece in orphans if piece.batch_id not in decided]
    TwoPhaseCommitCoordinator(resource, sink_name).roll_back_orphans(sink_id, undecided)
    resource.roll_back_unattributed(sink_id, {query_id})


def _finish_or_mark_lost(
    resource: TransactionalResource,
    sink_name: str,
    decision: BatchDecision,
    batch_id: int,
    mark_lost: bool,
    query_id: str | None,
) -> None:
    if decision.status != DECIDED:
        return
    lost: list[tuple[PreparedPiece, DecidedPieceLostError]] = []
    for piece in decision.pieces:
        try:
            resource.commit_piece(piece)
        except DecidedPieceLostError as error:
            lost.append((piece, error))
    if lost and not mark_lost:
        return
    ours = query_id is not None and query_id in decision.query_ids()
    if lost and not (ours and 1 <= decision.batch_id <= batch_id):
        raise lost[0][1]
    resource.mark_done(decision)
    if lost:
        logger.warning(
            "%s at-least-once recovery: batch %d of sink %s was decided by an exactly-once run"
            " but %d of its pieces were lost before they could be committed (%s, %d rows;"
            " %s); this at-least-once run replayed the batch and wrote each of its rows, so"
            " the batch is marked done",
            sink_name,
            decision.batch_id,
            decision.sink_id,
            len(lost),
            ", ".join(piece.transaction_id for piece, _ in lost),
            sum(piece.rows for piece, _ in lost),
            type(lost[0][1]).__name__,
        )
    else:
        logger.warning(
            "%s at-least-once recovery: finished the commit of batch %d (%d pieces) that an"
            " exactly-once run of sink %s decided before it stopped",
            sink_name,
            decision.batch_id,
            len(decision.pieces),
            decision.sink_id,
        )
