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
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from commit_protocols import (
    PreparedPiece,
    TaskIdentity,
    TwoPhaseCommitCoordinator,
    faults,
    parse_transaction_id,
    sink_prefix,
    transaction_id,
)
from commit_protocols.coordinator import stale_pieces
from commit_protocols.pieces import DECIDED, DONE
from connectors.jdbc import postgres
from connectors.jdbc import sqlite as sqlite_db
from connectors.jdbc.dialect import (
    TableName,
    delete_from_stage_sql,
    move_from_stage_sql,
    pieces_params,
)
from connectors.jdbc.options import JdbcSinkOptions
from connectors.jdbc.resource import open_resource

logger = logging.getLogger("eospack.jdbc")


def _non_empty(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """The batches, or None when there is no row at all (nothing to prepare)."""
    iterator = iter(batches)
    for batch in iterator:
        if batch.num_rows:
            return itertools.chain([batch], iterator)
    return None


class TaskWriter:
    """Writes one task's rows; the same object is used for every protocol."""

    def __init__(
        self, options: JdbcSinkOptions, columns: tuple[str, ...], stage: TableName
    ) -> None:
        self.options = options
        self.columns = list(columns)
        self.stage = stage

    def prepare(
        self, protocol: str, task: TaskIdentity, batches: Iterable[pa.RecordBatch]
    ) -> PreparedPiece:
        """Prepare the task's rows, or nothing when the batch is already decided.

        A restarted query replays its last batch; if that batch was decided before the
        crash, the replay's commit finishes it and the replay must add nothing (with a
        primary key on the target, writing it again would even fail the task). Before a
        prepared transaction is opened, the sink's stale prepared transactions are rolled
        back (``commit_protocols.stale_pieces``): they hold row locks that this task would
        otherwise wait on until ``lockTimeout``.
        """
        piece_id = transaction_id(task.sink_id, task.batch_id, task.partition_id, task.attempt)
        empty = PreparedPiece(task.sink_id, task.batch_id, task.partition_id, task.attempt, 0)
        rows_iterator = _non_empty(batches)
        if rows_iterator is None:
            return empty
        if self.options.url.dialect == "sqlite":
            sqlite_connection = sqlite_db.connect(self.options)
            try:
                if self._decided(sqlite_connection, "?", task):
                    return empty
                with sqlite_db.transaction(sqlite_connection):
                    rows = sqlite_db.insert_batches(
                        sqlite_connection,
                        self.stage,
                        self.columns,
                        rows_iterator,
                        self.options.batchsize,
                        piece_id,
                    )
            finally:
                sqlite_connection.close()
            return replace(empty, rows=rows, handle={"piece": piece_id})
        connection = postgres.connect(self.options)
        try:
            decided = self._decided(connection, "%s", task)
            connection.commit()
            if decided:
                return empty
            if protocol == "prepared":
                self._roll_back_stale(connection, task)
                connection.tpc_begin(piece_id)
                with connection.cursor() as cursor:
                    rows = self._write_postgres(cursor, piece_id, rows_iterator)
                    xid = postgres.current_transaction_id(cursor)
                try:
                    faults.run_call(
                        "jdbc.prepare",
                        connection.tpc_prepare,
                        error=psycopg.OperationalError,
                        lose_connection=connection.close,
                        batch_id=task.batch_id,
                    )
                except Exception:
                    self._roll_back_own_piece(piece_id)
                    raise
                handle = {"gid": piece_id, "xid": xid}
            else:
                with connection.transaction(), connection.cursor() as cursor:
                    postgres.set_piece(cursor, piece_id)
                    rows = postgres.copy_batches(
                        cursor, self.stage, self.columns, rows_iterator, self.options.batchsize
                    )
                handle = {"piece": piece_id}
        finally:
            connection.close()  # after PREPARE the transaction lives on without us
        return replace(empty, rows=rows, handle=handle)

    def _roll_back_own_piece(self, gid: str) -> None:
        """PREPARE failed, or its answer was lost: roll back ``gid`` if it exists.

        Safe because this task reports no piece, so no decision can name it. Best effort:
        if the database cannot be reached now, the next commit of the sink rolls it back.
        """
        try:
            connection = postgres.connect(self.options)
        except Exception:
            logger.warning("2pc-jdbc could not roll back %s now: the next commit will", gid)
            return
        try:
            connection.autocommit = True
            connection.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
            logger.warning("2pc-jdbc task failed after PREPARE: rolled back %s", gid)
        except psycopg.errors.UndefinedObject:
            pass  # PREPARE did not apply
        except Exception as error:
            logger.warning(
                "2pc-jdbc could not roll back %s now (%s): the next commit will",
                gid,
                type(error).__name__,
            )
        finally:
            connection.close()

    def _roll_back_stale(self, connection: Any, task: TaskIdentity) -> None:
        listed = [
            PreparedPiece(*parsed, rows=1, handle={"gid": gid})
            for gid in postgres.prepared_gids(connection, sink_prefix(task.sink_id))
            if (parsed := parse_transaction_id(gid)) is not None
        ]
        stale = stale_pieces(task, listed)
        connection.commit()
        if not stale:
            return
        resource = open_resource(self.options, "prepared", tuple(self.columns), self.stage)
        try:
            TwoPhaseCommitCoordinator(resource, "2pc-jdbc").roll_back_orphans(task.sink_id, stale)
        finally:
            resource.close()

    def _decided(self, connection: Any, placeholder: str, task: TaskIdentity) -> bool:
        row = connection.execute(
            f"SELECT 1 FROM {self.options.ledger_table.sql()}"
            f" WHERE sink_id = {placeholder} AND batch_id = {placeholder}"
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
        if self.options.url.dialect == "sqlite":
            sqlite_connection = sqlite_db.connect(self.options)
            try:
                with sqlite_db.transaction(sqlite_connection):
                    return self._write_sqlite(sqlite_connection, piece_id, rows_iterator)
            finally:
                sqlite_connection.close()
        connection = postgres.connect(self.options)
        try:
            with connection.transaction(), connection.cursor() as cursor:
                return self._write_postgres(cursor, piece_id, rows_iterator)
        finally:
            connection.close()

    def _write_postgres(self, cursor: Any, piece_id: str, batches: Iterator[pa.RecordBatch]) -> int:
        """Append by COPY into the target, or upsert through the staging table."""
        options = self.options
        cursor.execute(f"SET LOCAL lock_timeout = '{options.lock_timeout_ms}ms'")
        if options.write_mode == "append":
            return postgres.copy_batches(
                cursor, options.table, self.columns, batches, options.batchsize
            )
        postgres.set_piece(cursor, piece_id)
        rows = postgres.copy_batches(cursor, self.stage, self.columns, batches, options.batchsize)
        self._merge(cursor, "postgresql", piece_id)
        return rows

    def _write_sqlite(
        self, connection: Any, piece_id: str, batches: Iterator[pa.RecordBatch]
    ) -> int:
        options = self.options
        if options.write_mode == "append":
            return sqlite_db.insert_batches(
                connection, options.table, self.columns, batches, options.batchsize
            )
        rows = sqlite_db.insert_batches(
            connection, self.stage, self.columns, batches, options.batchsize, piece_id
        )
        self._merge(connection, "sqlite", piece_id)
        return rows

    def _merge(self, executor: Any, dialect: Any, piece_id: str) -> None:
        options = self.options
        params = pieces_params(dialect, [piece_id])
        executor.execute(
            move_from_stage_sql(
                dialect,
                options.table,
                self.stage,
                self.columns,
                options.upsert_keys,
                options.version_column,
                1,
            ),
            params,
        )
        executor.execute(delete_from_stage_sql(dialect, self.stage, 1), params)
