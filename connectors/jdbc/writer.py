"""Executor-side I/O of 2pc-jdbc: one task's Arrow batches into the database.

- ``prepared``: COPY inside a two-phase transaction, then ``PREPARE TRANSACTION <piece
  id>``: durable, holding its locks, invisible until the driver's ``COMMIT PREPARED``.
- ``staging``: COPY into the staging table tagged with the piece id, committed at once;
  invisible in the target until the driver moves the batch.
- at-least-once: COPY and commit straight into the target (a retried task or a replayed
  batch writes its rows again).

Upserts first COPY into the staging table and merge from there in the same
transaction (``INSERT ... ON CONFLICT``): PostgreSQL cannot prepare a transaction that
used a temporary table.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from eospack.core import faults

from ...commit_protocols import (
    PreparedPiece,
    TaskIdentity,
    TwoPhaseCommitCoordinator,
    parse_transaction_id,
    sink_prefix,
    transaction_id,
)
from ...commit_protocols.coordinator import stale_pieces
from ...commit_protocols.pieces import DECIDED, DONE
from ...commit_protocols.stream_writer import recover_at_least_once
from .dialect import CHANGE_DELETE, CHANGE_UPSERT, Connection
from .errors import JdbcWriteError
from .options import JdbcSinkOptions, dialect_for
from .planning import SinkPlan
from .resource import open_resource

logger = logging.getLogger(__name__)


def _non_empty(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """The batches, or None when there is no row at all (nothing to prepare)."""
    iterator = iter(batches)
    for batch in iterator:
        if batch.num_rows:
            return itertools.chain([batch], iterator)
    return None


class TaskWriter:
    """Writes one task's rows, for every protocol and database.

    Why one class: the steps (skip a decided batch, write, prepare or commit) are the
    same everywhere; the database's part is its ``Dialect``. Guarantees: a task of a batch
    already decided writes nothing; a piece is either prepared/staged whole with its row
    count or not at all; a failed PREPARE leaves no prepared transaction it could name.
    """

    def __init__(self, options: JdbcSinkOptions, plan: SinkPlan) -> None:
        self.options = options
        self.plan = plan
        self.columns = list(plan.columns)
        self.stage = plan.stage
        self.dialect = dialect_for(options.url)

    def prepare(self, task: TaskIdentity, batches: Iterable[pa.RecordBatch]) -> PreparedPiece:
        """Prepare the task's rows, or nothing when the batch is already decided.

        A restarted query replays its last batch; if that batch was decided before the
        crash, the replay's commit finishes it and the replay must add nothing (with a
        primary key on the target, writing it again would even fail the task). Before a
        prepared transaction is opened, the sink's stale prepared transactions are rolled
        back (``eospack.commit_protocols.stale_pieces``): they hold row locks that this task would
        otherwise wait on until ``lockTimeout``.
        """
        piece_id = transaction_id(task.sink_id, task.batch_id, task.partition_id, task.attempt)
        empty = task.piece(0)
        rows_iterator = _non_empty(batches)
        if rows_iterator is None:
            return empty
        rows_iterator = self._staged_changes(rows_iterator)
        # Autocommit: the checks below are single reads, each one round trip without a
        # transaction around it; the piece's own transaction is begun explicitly.
        connection = self.dialect.connect(self.options, autocommit=True)
        try:
            if self._decided(connection, task):
                return empty
            if self.plan.protocol == "prepared":
                rows, handle = self._prepare_transaction(connection, task, piece_id, rows_iterator)
            else:
                with self.dialect.transaction(connection):
                    rows = self.dialect.write_rows(
                        connection,
                        self.stage,
                        self.columns,
                        rows_iterator,
                        self.options.batchsize,
                        piece_id,
                    )
                handle = {"piece": piece_id}
        finally:
            connection.close()  # after PREPARE the transaction lives on without us
        return replace(empty, rows=rows, handle=handle)

    def _staged_changes(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``writeMode=changes``: each batch with its op column mapped to ``CHANGE_UPSERT``
        or ``CHANGE_DELETE`` (other modes: the batches as they are).

        A NULL or unknown operation, or a NULL version, fails the task (before anything is
        prepared or committed) with one line naming the value and the option to fix.
        """
        options = self.options
        if options.write_mode != "changes":
            return batches
        assert options.op_column is not None and options.version_column is not None
        mapping = {op: CHANGE_UPSERT for op in options.insert_ops + options.update_ops}
        mapping.update({op: CHANGE_DELETE for op in options.delete_ops})
        known = pa.array(sorted(mapping), pa.string())
        mapped = pa.array([mapping[op] for op in sorted(mapping)], pa.string())
        op_column, version_column = options.op_column, options.version_column

        def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
            index = batch.schema.get_field_index(op_column)
            ops = batch.column(index)
            positions = pc.index_in(ops, value_set=known)
            if positions.null_count:
                bad = pc.filter(ops, pc.is_null(positions)).to_pylist()[0]
                if bad is None:
                    raise JdbcWriteError(
                        f"2pc-jdbc writeMode=changes: a row has a NULL opColumn"
                        f" {op_column!r}: filter such rows out or give them an operation"
                    )
                raise JdbcWriteError(
                    f"2pc-jdbc writeMode=changes: opColumn {op_column!r} holds {bad!r}, which"
                    f" none of insertOps ({','.join(options.insert_ops)}), updateOps"
                    f" ({','.join(options.update_ops)}), deleteOps"
                    f" ({','.join(options.delete_ops)}) lists: add it to one of them or"
                    " filter such rows out"
                )
            if batch.column(batch.schema.get_field_index(version_column)).null_count:
                raise JdbcWriteError(
                    f"2pc-jdbc writeMode=changes: a row has a NULL versionColumn"
                    f" {version_column!r}, which cannot be ordered: give every change a version"
                )
            return batch.set_column(index, op_column, pc.take(mapped, positions))

        return (convert(batch) for batch in batches)

    def _prepare_transaction(
        self,
        connection: Connection,
        task: TaskIdentity,
        piece_id: str,
        batches: Iterator[pa.RecordBatch],
    ) -> tuple[int, dict[str, str]]:
        """Write the rows in the two-phase transaction ``piece_id`` and PREPARE it."""
        self._roll_back_stale(connection, task)
        self.dialect.leave_autocommit(connection)
        self.dialect.begin_prepared(connection, piece_id)
        rows = self._write(connection, piece_id, batches)
        xid = self.dialect.current_transaction_id(connection)
        try:
            faults.run_call(
                "jdbc.prepare",
                lambda: self.dialect.prepare(connection),
                error=self.dialect.operational_error,
                lose_connection=connection.close,
                batch_id=task.batch_id,
            )
        except Exception:
            self._roll_back_own_piece(piece_id)
            raise
        return rows, {"gid": piece_id, "xid": xid}

    def _roll_back_own_piece(self, gid: str) -> None:
        """PREPARE failed, or its answer was lost: roll back ``gid`` if it exists.

        Safe because this task reports no piece, so no decision can name it. Best effort:
        if the database cannot be reached now, the next commit of the sink rolls it back.
        """
        try:
            connection = self.dialect.connect(self.options, autocommit=True)
        except Exception:
            logger.warning("2pc-jdbc could not roll back %s now: the next commit will", gid)
            return
        try:
            if self.dialect.finish_prepared(connection, gid, "ROLLBACK", wait_if_busy=False):
                logger.warning("2pc-jdbc task failed after PREPARE: rolled back %s", gid)
        except Exception as error:
            logger.warning(
                "2pc-jdbc could not roll back %s now (%s): the next commit will",
                gid,
                type(error).__name__,
            )
        finally:
            connection.close()

    def _roll_back_stale(self, connection: Connection, task: TaskIdentity) -> None:
        listed = [
            PreparedPiece(*parsed, rows=1, handle={"gid": gid})
            for gid in self.dialect.prepared_gids(connection, sink_prefix(task.sink_id))
            if (parsed := parse_transaction_id(gid)) is not None
        ]
        stale = stale_pieces(task, listed)
        if not stale:
            return
        resource = open_resource(self.options, self.plan)
        try:
            TwoPhaseCommitCoordinator(resource, "2pc-jdbc").roll_back_orphans(task.sink_id, stale)
        finally:
            resource.close()

    def _decided(self, connection: Connection, task: TaskIdentity) -> bool:
        mark = self.dialect.placeholder
        row = connection.execute(
            f"SELECT 1 FROM {self.options.ledger_table.sql()}"
            f" WHERE sink_id = {mark} AND batch_id = {mark}"
            f" AND status IN ('{DECIDED}', '{DONE}')",
            (task.sink_id, task.batch_id),
        ).fetchone()
        if row is not None:
            logger.info(
                "2pc-jdbc batch %d of sink %s is already decided: its replay writes nothing",
                task.batch_id,
                task.sink_id,
            )
        return row is not None

    def write_directly(self, task: TaskIdentity, batches: Iterable[pa.RecordBatch]) -> int:
        piece_id = transaction_id(task.sink_id, task.batch_id, task.partition_id, task.attempt)
        rows_iterator = _non_empty(batches)
        if rows_iterator is None:
            return 0
        rows_iterator = self._staged_changes(rows_iterator)
        connection = self.dialect.connect(self.options, autocommit=False)
        try:
            self._finish_exactly_once_leftovers(connection, task)
            with self.dialect.transaction(connection):
                return self._write(connection, piece_id, rows_iterator)
        finally:
            connection.close()

    def _finish_exactly_once_leftovers(self, connection: Connection, task: TaskIdentity) -> None:
        """At-least-once after an exactly-once run: the prepared transactions it left hold
        row locks this task's write would wait on until ``lockTimeout``, before the driver's
        first commit could recover them. Decided ones are committed, the rest rolled back
        (``recover_at_least_once``, which leaves a decision with a lost piece to the driver)."""
        if not self.dialect.supports_prepared_transactions:
            return
        left = [
            gid
            for gid in self.dialect.prepared_gids(connection, sink_prefix(task.sink_id))
            if (parsed := parse_transaction_id(gid)) is not None and parsed[1] <= task.batch_id
        ]
        connection.commit()
        if not left:
            return
        resource = open_resource(self.options, self.plan)
        try:
            recover_at_least_once(
                resource, "2pc-jdbc", task.sink_id, task.batch_id, mark_lost=False
            )
        finally:
            resource.close()

    def _write(
        self, connection: Connection, piece_id: str, batches: Iterator[pa.RecordBatch]
    ) -> int:
        """In the open transaction: append into the target, or upsert through the staging
        table (stage the rows as ``piece_id``, merge them, delete them)."""
        options = self.options
        self.dialect.limit_lock_wait(connection, options.lock_timeout_ms)
        if options.write_mode == "append":
            return self.dialect.write_rows(
                connection, options.table, self.columns, batches, options.batchsize
            )
        rows = self.dialect.write_rows(
            connection, self.stage, self.columns, batches, options.batchsize, piece_id
        )
        self.dialect.move_from_stage(connection, options, self.plan, [piece_id])
        return rows
