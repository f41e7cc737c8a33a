"""The driver's side of 2pc-jdbc: the ledger and the two ways pieces are prepared.

The ledger (``ledgerTable``, default ``eospack_commits``) has one row per (sink id,
batch id): rows, protocol, commit time, status ``decided``/``done`` and the pieces as
JSON. Lookups go through its primary key; unfinished decisions through a partial index
on ``status = 'decided'``, so driver cost per batch stays constant as the ledger grows.

``prepared`` (PostgreSQL ``PREPARE TRANSACTION``), for batch N:

=================================  ==============================  =========================
step                               if the driver dies here         mended by
=================================  ==============================  =========================
tasks COPY + PREPARE TRANSACTION   prepared xacts, no decision     next planning rolls back
ledger row N ``decided``           decided, pieces still prepared  recovery COMMITs PREPARED
COMMIT PREPARED each piece         some committed                  recovery commits the rest
ledger row N ``done``              Spark replays N                 replay's tasks see N: no-op
=================================  ==============================  =========================

``staging`` (any database): tasks COPY into ``<table>_eospack_stage_<hash>`` tagged with
their piece id and commit; the driver then, in ONE transaction, inserts ledger row N
(``done``), moves the batch's staged rows into the target and deletes them. A crash
leaves either nothing of N applied (staged rows are rolled back as orphans) or all of it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from commit_protocols import (
    BatchDecision,
    PreparedPiece,
    TransactionalResource,
    parse_transaction_id,
    sink_prefix,
)
from connectors.jdbc import postgres
from connectors.jdbc import sqlite as sqlite_db
from connectors.jdbc.dialect import (
    PIECE_COLUMN,
    TableName,
    delete_from_stage_sql,
    move_from_stage_sql,
    pieces_params,
    quote,
)
from connectors.jdbc.errors import JdbcWriteError
from connectors.jdbc.options import JdbcSinkOptions

logger = logging.getLogger("eospack.jdbc")

Connection = Any  # psycopg.Connection (autocommit) or sqlite3.Connection (autocommit)


class _LedgerResource(TransactionalResource):
    """Ledger access shared by both protocols; subclasses say how pieces are finished."""

    protocol = "?"

    def __init__(self, options: JdbcSinkOptions, columns: tuple[str, ...], stage: TableName):
        self.options = options
        self.columns = list(columns)
        self.stage = stage
        self.dialect = options.url.dialect
        self.connection: Connection = (
            postgres.connect(options, autocommit=True)
            if self.dialect == "postgresql"
            else sqlite_db.connect(options)
        )
        self.placeholder = "%s" if self.dialect == "postgresql" else "?"
        self.ledger = options.ledger_table.sql()

    def _sql(self, statement: str) -> str:
        return statement.replace("%s", self.placeholder)

    def _execute(self, statement: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
        return self.connection.execute(self._sql(statement), params)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self.dialect == "postgresql":
            with self.connection.transaction():
                yield
        else:
            with sqlite_db.transaction(self.connection):
                yield

    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        row = self._execute(
            f"SELECT pieces FROM {self.ledger} WHERE sink_id = %s AND batch_id = %s",
            (sink_id, batch_id),
        ).fetchone()
        return None if row is None else BatchDecision.from_pieces_json(sink_id, batch_id, row[0])

    def _insert_decision(self, decision: BatchDecision, status: str) -> bool:
        row = self._execute(
            f"INSERT INTO {self.ledger} (sink_id, batch_id, target, protocol, rows, status, pieces)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (sink_id, batch_id) DO NOTHING RETURNING batch_id",
            (
                decision.sink_id, decision.batch_id, str(self.options.table), self.protocol,
                decision.rows, status, decision.pieces_json(),
            ),
        ).fetchone()  # fmt: skip
        return row is not None

    def record_decision(self, decision: BatchDecision) -> bool:
        return self._insert_decision(decision, "decided")

    def mark_done(self, decision: BatchDecision) -> None:
        self._execute(
            f"UPDATE {self.ledger} SET status = 'done', committed_at = CURRENT_TIMESTAMP"
            " WHERE sink_id = %s AND batch_id = %s",
            (decision.sink_id, decision.batch_id),
        )

    def unfinished_decisions(self, sink_id: str) -> list[BatchDecision]:
        rows = self._execute(
            f"SELECT batch_id, pieces FROM {self.ledger}"
            " WHERE sink_id = %s AND status = 'decided' ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
        return [BatchDecision.from_pieces_json(sink_id, int(b), pieces) for b, pieces in rows]

    def close(self) -> None:
        self.connection.close()


class PreparedTransactionResource(_LedgerResource):
    """Pieces are PostgreSQL prepared transactions whose gid is the piece's transaction id."""

    protocol = "prepared"

    def commit_piece(self, piece: PreparedPiece) -> None:
        self._finish(piece, "COMMIT PREPARED")

    def rollback_piece(self, piece: PreparedPiece) -> None:
        self._finish(piece, "ROLLBACK PREPARED")

    def _finish(self, piece: PreparedPiece, command: str) -> None:
        gid = piece.handle.get("gid")
        if not gid:
            return  # an empty piece: the task had no rows and prepared nothing
        try:
            self.connection.execute(sql.SQL(command + " {}").format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            pass  # already finished (SQLSTATE 42704): commits and rollbacks are idempotent

    def prepared_pieces(self, sink_id: str) -> list[PreparedPiece]:
        rows = self.connection.execute(
            "SELECT gid FROM pg_prepared_xacts"
            " WHERE database = current_database() AND starts_with(gid, %s)",
            (sink_prefix(sink_id),),
        ).fetchall()
        return [_piece_of(gid, {"gid": gid}) for (gid,) in rows if parse_transaction_id(gid)]


class StagingTableResource(_LedgerResource):
    """Pieces are tagged rows of the staging table, moved per batch in one transaction."""

    protocol = "staging"
    commits_atomically = True

    def commit_atomically(self, decision: BatchDecision) -> bool:
        pieces = [piece.transaction_id for piece in decision.pieces if piece.rows]
        with self._transaction():
            if not self._insert_decision(decision, "done"):
                return False
            if pieces:
                staged = self._move(pieces)
                if staged != decision.rows:
                    raise JdbcWriteError(
                        f"2pc-jdbc batch {decision.batch_id}: {staged} staged rows found for"
                        f" {decision.rows} reported by its tasks, so nothing was committed:"
                        f" restart the query to stage the batch again (the database restarted,"
                        f" which empties the unlogged {self.stage}, or the table was edited)"
                    )
        self._vacuum_stage()
        return True

    def _vacuum_stage(self) -> None:
        """Reclaim the moved rows at once (2-3 ms): otherwise every later move and recovery
        scan reads the dead rows of all batches since the last autovacuum, up to a minute's
        worth. Housekeeping only: a failure is logged and ignored."""
        if self.dialect != "postgresql":
            return
        try:
            self.connection.execute(f"VACUUM {self.stage.sql()}")
        except psycopg.Error as error:
            logger.debug("2pc-jdbc could not vacuum %s: %s", self.stage, error)

    def _move(self, pieces: list[str]) -> int:
        """Move the pieces' rows into the target, delete them; return rows deleted."""
        options = self.options
        params = pieces_params(self.dialect, pieces)
        move = move_from_stage_sql(
            self.dialect, options.table, self.stage, self.columns,
            options.upsert_keys, options.version_column, len(pieces),
        )  # fmt: skip
        self.connection.execute(move, params)
        cursor = self.connection.execute(
            delete_from_stage_sql(self.dialect, self.stage, len(pieces)), params
        )
        return int(cursor.rowcount)

    def commit_piece(self, piece: PreparedPiece) -> None:
        if piece.rows:
            with self._transaction():
                self._move([piece.transaction_id])

    def rollback_piece(self, piece: PreparedPiece) -> None:
        self.connection.execute(
            delete_from_stage_sql(self.dialect, self.stage, 1),
            pieces_params(self.dialect, [piece.transaction_id]),
        )

    def prepared_pieces(self, sink_id: str) -> list[PreparedPiece]:
        prefix = sink_prefix(sink_id)
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        column = quote(PIECE_COLUMN)
        rows = self._execute(
            f"SELECT DISTINCT {column} FROM {self.stage.sql()}"
            f" WHERE {column} >= %s AND {column} < %s",
            (prefix, upper),
        ).fetchall()
        return [_piece_of(tid, {"piece": tid}) for (tid,) in rows if parse_transaction_id(tid)]


def _piece_of(transaction_id: str, handle: dict[str, str]) -> PreparedPiece:
    parsed = parse_transaction_id(transaction_id)
    assert parsed is not None
    sink_id, batch_id, partition_id, attempt = parsed
    # rows=1: a listed piece holds rows (empty pieces are never prepared or staged).
    return PreparedPiece(sink_id, batch_id, partition_id, attempt, 1, handle)


def open_resource(
    options: JdbcSinkOptions, protocol: str, columns: tuple[str, ...], stage: TableName
) -> _LedgerResource:
    if protocol == "prepared":
        return PreparedTransactionResource(options, columns, stage)
    return StagingTableResource(options, columns, stage)


DATABASE_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    sqlite3.OperationalError,
)
