"""The driver's side of 2pc-jdbc: the ledger and the two kinds of prepared pieces.

The ledger (``ledgerTable``, default ``eospack_commits``) holds the decision slot of each
(sink id, batch id): rows, protocol, commit time, status ``decided``/``done``/``aborted``
and the pieces as JSON. Slots change by compare-and-set in one transaction holding the
slot's row lock (``_write_slot``). Lookups go through the primary key; unfinished
decisions through a partial index on ``status = 'decided'``, so driver cost per batch
stays constant as the ledger grows.

A piece is either a PostgreSQL prepared transaction (handle ``gid``, ``xid``) or a tag in
the staging table (handle ``piece``). One resource finishes both kinds, whatever today's
``protocol`` option says: a decision is rolled forward by what it recorded, so a query
restarted with another protocol still commits what a crashed run decided, and recovery
lists leftovers of both kinds.

``prepared`` (PostgreSQL ``PREPARE TRANSACTION``), for batch N:

=================================  ==============================  =========================
step                               if the driver dies here         mended by
=================================  ==============================  =========================
tasks COPY + PREPARE TRANSACTION   prepared xacts, no decision     the replay's tasks roll
                                                                   them back (fenced)
ledger row N ``decided``           decided, pieces still prepared  the replay's commit
                                                                   COMMITs PREPARED
COMMIT PREPARED each piece         some committed                  the replay commits the rest
ledger row N ``done``              Spark replays N                 replay's tasks see N: no-op
=================================  ==============================  =========================

``COMMIT PREPARED`` of a gid that is gone (SQLSTATE 42704) is checked, not assumed: the
piece recorded its transaction id, and ``pg_xact_status`` tells committed (an earlier
commit whose answer was lost) from rolled back (someone ran ``ROLLBACK PREPARED``: the
rows are lost, ``DecidedPieceLostError``).

``staging`` (any database): tasks COPY into ``<table>_eospack_stage_<hash>`` tagged with
their piece id and commit; the driver then, in ONE transaction, writes slot N ``done``,
moves the batch's staged rows into the target and deletes them. A crash leaves either
nothing of N applied (staged rows are rolled back as orphans) or all of it.
"""

from __future__ import annotations

import logging
import os
import select
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
import pymysql

from eospack.core import faults

from ...commit_protocols import (
    BatchDecision,
    PreparedPiece,
    TransactionalResource,
    derive_sink_id,
    parse_transaction_id,
    sink_prefix,
)
from ...commit_protocols.inspection import DecisionState, Leftover, SinkState
from ...commit_protocols.pieces import ABORTED, DECIDED, DONE
from ...commit_protocols.resource import DecidedPieceLostError
from .dialect import PIECE_COLUMN, TableName, quote, stage_table
from .errors import JdbcSinkOptionError, JdbcWriteError
from .options import JdbcSinkOptions, dialect_for, parse_options
from .planning import SinkPlan

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


class JdbcResource(TransactionalResource):
    """The ledger, prepared transactions and staged pieces of one target table.

    Why: the coordinator (``commit_protocols``) decides and finishes batches through this
    one object, whatever the database; what differs between databases is asked of the
    ``Dialect``. Guarantees: a ledger slot changes only by compare-and-set inside one
    transaction; a staged batch's move, delete and ``done`` slot commit together or not
    at all; a decided prepared piece found gone is checked by its transaction id.
    """

    sink_format = "2pc-jdbc"
    cleanup_advice = (
        "start the query again from this checkpoint: its first commit finishes what a"
        " decision names and rolls back the rest (never ROLLBACK PREPARED by hand: a"
        " decided piece rolled back is data lost)"
    )

    def __init__(self, options: JdbcSinkOptions, plan: SinkPlan) -> None:
        self.options = options
        self.plan = plan
        self.protocol = plan.protocol
        self.commits_atomically = plan.protocol == "staging"
        self.stage = plan.stage
        self.dialect = dialect_for(options.url)
        self.orphans_can_block_commit = (
            self.dialect.orphans_can_block_commit or plan.protocol == "prepared"
        )
        self.connection = _idle_connections.take(options) or self.dialect.connect(
            options, autocommit=True
        )
        self.ledger = options.ledger_table.sql()

    # Calls, through the fault rig ------------------------------------------------------

    def _call(self, name: str, action: Callable[[], Result], batch_id: int | None) -> Result:
        """Run one database call as ``jdbc.<name>`` (see ``eospack.core.faults``)."""
        return faults.run_call(
            f"jdbc.{name}",
            action,
            error=self.dialect.operational_error,
            lose_connection=self.connection.close,
            batch_id=batch_id,
        )

    def _execute(self, statement: str, params: tuple[Any, ...] | list[Any] = ()) -> Any:
        return self.connection.execute(statement.replace("%s", self.dialect.placeholder), params)

    # The decision slot -----------------------------------------------------------------

    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        row = self._call(
            "find_decision",
            lambda: self._execute(
                f"SELECT pieces, status FROM {self.ledger} WHERE sink_id = %s AND batch_id = %s",
                (sink_id, batch_id),
            ).fetchone(),
            batch_id,
        )
        if row is None:
            return None
        return BatchDecision.from_pieces_json(sink_id, batch_id, row[0], str(row[1]))

    def record_decision(self, decision: BatchDecision) -> BatchDecision:
        return self._call("decide", lambda: self._decide(decision), decision.batch_id)

    def _decide(self, decision: BatchDecision) -> BatchDecision:
        """An empty slot (every batch's case) takes the decision in one autocommitted
        statement; a slot that holds something goes through the locked compare-and-set."""
        if self._insert_slot(decision, DECIDED):
            return BatchDecision(decision.sink_id, decision.batch_id, decision.pieces, DECIDED)
        return self._with_slot(decision, DECIDED)

    def fence(
        self, sink_id: str, batch_id: int, pieces: tuple[PreparedPiece, ...]
    ) -> BatchDecision:
        fence = BatchDecision(sink_id, batch_id, pieces, ABORTED)
        return self._call("fence", lambda: self._with_slot(fence, ABORTED), batch_id)

    def commit_atomically(self, decision: BatchDecision) -> BatchDecision:
        return self._call("decide", lambda: self._commit_staged(decision), decision.batch_id)

    def _with_slot(self, wanted: BatchDecision, status: str) -> BatchDecision:
        with self.dialect.transaction(self.connection):
            return self._write_slot(wanted, status)

    def _write_slot(self, wanted: BatchDecision, status: str) -> BatchDecision:
        """Inside a transaction: put ``wanted`` with ``status`` into its slot where the rules
        allow (see ``BatchDecision``); return what the slot holds now."""
        if self._insert_slot(wanted, status):
            return BatchDecision(wanted.sink_id, wanted.batch_id, wanted.pieces, status)
        lock = self.dialect.lock_clause
        row = self._execute(
            f"SELECT pieces, status FROM {self.ledger} WHERE sink_id = %s AND batch_id = %s{lock}",
            (wanted.sink_id, wanted.batch_id),
        ).fetchone()
        slot = BatchDecision.from_pieces_json(wanted.sink_id, wanted.batch_id, row[0], str(row[1]))
        if status == ABORTED:
            if slot.is_decided:
                return slot
            widened = slot.fenced_with(wanted.pieces)
            if widened != slot:
                self._update_slot(widened, ABORTED)
            return widened
        if not slot.accepts(wanted):
            return slot
        written = BatchDecision(wanted.sink_id, wanted.batch_id, wanted.pieces, status)
        self._update_slot(written, status)
        return written

    def _insert_slot(self, decision: BatchDecision, status: str) -> bool:
        return self.dialect.insert_slot(
            self.connection,
            self.options.ledger_table,
            (
                decision.sink_id,
                decision.batch_id,
                str(self.options.table),
                self.protocol,
                decision.rows,
                status,
                decision.pieces_json(),
            ),
        )

    def _update_slot(self, decision: BatchDecision, status: str) -> None:
        self._execute(
            f'UPDATE {self.ledger} SET status = %s, pieces = %s, "rows" = %s, protocol = %s,'
            " committed_at = CURRENT_TIMESTAMP WHERE sink_id = %s AND batch_id = %s",
            (
                status,
                decision.pieces_json(),
                decision.rows,
                self.protocol,
                decision.sink_id,
                decision.batch_id,
            ),
        )

    def mark_done(self, decision: BatchDecision) -> None:
        self._call(
            "mark_done",
            lambda: self._execute(
                f"UPDATE {self.ledger} SET status = '{DONE}', committed_at = CURRENT_TIMESTAMP"
                f" WHERE sink_id = %s AND batch_id = %s AND status = '{DECIDED}'",
                (decision.sink_id, decision.batch_id),
            ),
            decision.batch_id,
        )

    def unfinished_decisions(self, sink_id: str) -> list[BatchDecision]:
        if self.protocol == "direct" and not self._ledger_exists():
            return []  # no exactly-once run created the ledger: nothing was ever decided
        rows = self._execute(
            f"SELECT batch_id, pieces FROM {self.ledger}"
            f" WHERE sink_id = %s AND status = '{DECIDED}' ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
        return [BatchDecision.from_pieces_json(sink_id, int(b), pieces) for b, pieces in rows]

    # Pieces ----------------------------------------------------------------------------

    def commit_piece(self, piece: PreparedPiece) -> None:
        if piece.handle.get("gid"):
            self._call("commit_piece", lambda: self._commit_prepared(piece), piece.batch_id)
        elif piece.handle.get("piece") and piece.rows:

            def move() -> None:
                with self.dialect.transaction(self.connection):
                    self._move([piece.transaction_id])

            self._call("commit_piece", move, piece.batch_id)

    def rollback_piece(self, piece: PreparedPiece) -> None:
        gid = piece.handle.get("gid")
        if gid:
            self._call(
                "rollback_piece",
                lambda: self.dialect.finish_prepared(self.connection, gid, "ROLLBACK"),
                None,
            )
        elif piece.handle.get("piece"):
            self._call(
                "rollback_piece",
                lambda: self.connection.execute(
                    self.dialect.delete_from_stage_sql(self.stage, 1),
                    self.dialect.pieces_params([piece.transaction_id]),
                ),
                None,
            )

    def _commit_prepared(self, piece: PreparedPiece) -> None:
        gid = str(piece.handle["gid"])
        if self.dialect.finish_prepared(self.connection, gid, "COMMIT"):
            return
        xid = piece.handle.get("xid")
        if xid == "":
            logger.info(
                "2pc-jdbc: %s (batch %d) is gone after its decision: taken as committed (the"
                " database keeps no outcome of finished XA transactions; a lost commit answer)",
                gid,
                piece.batch_id,
            )
            return
        if xid is None:
            logger.warning(
                "2pc-jdbc cannot verify that %s (batch %d, written by an older eospack) was"
                " committed: it is gone, so it is taken as committed",
                gid,
                piece.batch_id,
            )
            return
        status = self.dialect.transaction_status(self.connection, str(xid))
        if status == "committed":
            return
        fix = (
            f"if its rows are in {self.options.table} after all, mark the batch done"
            f" (UPDATE {self.options.ledger_table} SET status = 'done' WHERE sink_id ="
            f" '{piece.sink_id}' AND batch_id = {piece.batch_id}) and restart the query"
        )
        if status == "aborted":
            raise DecidedPieceLostError(
                f"2pc-jdbc sink {piece.sink_id} batch {piece.batch_id}: prepared transaction"
                f" {gid} (partition {piece.partition_id}, {piece.rows} rows) was rolled back by"
                f" someone else although the batch was decided, so its rows are lost: {fix}"
            )
        raise DecidedPieceLostError(
            f"2pc-jdbc sink {piece.sink_id} batch {piece.batch_id}: prepared transaction {gid}"
            f" is gone and {self.options.url.display()} no longer knows whether transaction"
            f" {xid} committed (status {status}): {fix}"
        )

    def prepared_pieces(self, sink_id: str) -> list[PreparedPiece]:
        """Prepared transactions and staged pieces of this sink, whatever today's protocol."""
        found = [
            _piece_of(gid, {"gid": gid})
            for gid in self.dialect.prepared_gids(self.connection, sink_prefix(sink_id))
        ]
        found += [_piece_of(tid, {"piece": tid}) for tid in self._staged_pieces(sink_id)]
        return [piece for piece in found if piece is not None]

    def _staged_pieces(self, sink_id: str) -> list[str]:
        """The piece ids in the staging table of this sink, whatever today's protocol (a
        run with ``staging`` may have left some). Once the table was seen it is taken to
        exist (one statement instead of a catalog lookup first); if it was dropped since,
        the failed statement, with no effect in autocommit, is followed by the lookup."""
        if self.stage not in _stages_seen and not self._stage_exists():
            return []
        prefix = sink_prefix(sink_id)
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        column = quote(PIECE_COLUMN)
        try:
            rows = self._execute(
                f"SELECT DISTINCT {column} FROM {self.stage.sql()}"
                f" WHERE {column} >= %s AND {column} < %s",
                (prefix, upper),
            ).fetchall()
        except Exception:
            _stages_seen.discard(self.stage)
            if self._stage_exists():
                raise
            return []
        _stages_seen.add(self.stage)
        return [str(tid) for (tid,) in rows]

    def _ledger_exists(self) -> bool:
        return self.dialect.table_columns(self.connection, self.options.ledger_table) is not None

    def _stage_exists(self) -> bool:
        return self.dialect.table_columns(self.connection, self.stage) is not None

    # Inspection (read only) ----------------------------------------------------------

    def describe_target(self) -> str:
        return self.options.describe()

    def inspected_decisions(self, sink_id: str) -> list[DecisionState]:
        """Every ledger row of the sink (none when no exactly-once run created the ledger)."""
        if not self._ledger_exists():
            return []
        rows = self._execute(
            f"SELECT batch_id, status, pieces FROM {self.ledger}"
            " WHERE sink_id = %s ORDER BY batch_id",
            (sink_id,),
        ).fetchall()
        return [
            DecisionState.of(BatchDecision.from_pieces_json(sink_id, int(b), pieces, str(status)))
            for b, status, pieces in rows
        ]

    def leftovers(self, sink_id: str, prepared: list[PreparedPiece]) -> list[Leftover]:
        """Each prepared transaction of the sink, and its rows in the staging table."""
        found = [
            Leftover("prepared transaction", str(piece.handle["gid"]))
            for piece in prepared
            if piece.handle.get("gid")
        ]
        staged = self._staged_row_count(sink_id) if self._stage_exists() else 0
        return found + ([Leftover("staged rows", str(staged), staged)] if staged else [])

    def _staged_row_count(self, sink_id: str) -> int:
        prefix = sink_prefix(sink_id)
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        column = quote(PIECE_COLUMN)
        row = self._execute(
            f"SELECT count(*) FROM {self.stage.sql()} WHERE {column} >= %s AND {column} < %s",
            (prefix, upper),
        ).fetchone()
        return int(row[0]) if row else 0

    # Staging -----------------------------------------------------------------------------

    def _commit_staged(self, decision: BatchDecision) -> BatchDecision:
        """Slot ``done``, the move and the delete of the staged rows, in one transaction."""
        if any(piece.handle.get("gid") for piece in decision.pieces):
            # Tasks prepared transactions (the protocol resolved differently when the batch
            # was planned): decide, and let the coordinator commit them piece by piece.
            return self._with_slot(decision, DECIDED)
        with self.dialect.transaction(self.connection):
            slot = self._write_slot(decision, DONE)
            if not (slot.status == DONE and slot.same_pieces(decision)):
                return slot
            staged_pieces = [p.transaction_id for p in decision.pieces if p.handle.get("piece")]
            if staged_pieces:
                staged = self._move(staged_pieces)
                expected = sum(p.rows for p in decision.pieces if p.handle.get("piece"))
                if staged != expected:
                    raise JdbcWriteError(
                        f"2pc-jdbc batch {decision.batch_id}: {staged} staged rows found for"
                        f" {expected} reported by its tasks, so nothing was committed:"
                        f" restart the query to stage the batch again (the database restarted,"
                        f" which empties the unlogged {self.stage}, or the table was edited)"
                    )
        self.dialect.vacuum_stage(self.connection, self.stage)
        return slot

    def _move(self, pieces: list[str]) -> int:
        """Move the pieces' rows into the target, delete them; return rows deleted."""
        return self.dialect.move_from_stage(self.connection, self.options, self.plan, pieces)

    def close(self) -> None:
        """Keep a healthy connection for this process's next commit, else close it."""
        _idle_connections.give_back(self.options, self.connection)


class _IdleConnections:
    """The driver's connection of each sink, kept between commits in this process.

    Why: Spark runs every commit of a query in the same Python worker, and a new
    PostgreSQL connection costs a server process and cold catalog caches, 4-7 ms of a
    commit's 12-18 ms at small batches. Guarantees: a connection is handed to one user at
    a time; it is reused only if it is open, idle outside any transaction, the server has
    sent nothing since (checked on the socket: a terminated session or a stopped server
    has), it answers one round trip within ``ROUND_TRIP_SECONDS`` (a server whose address
    moved away at a failover, or a partition, sends nothing but answers nothing either),
    and only within ``MAX_IDLE_SECONDS`` (one kept longer, e.g. for options a restart no
    longer uses, is closed at the next give-back); else it is closed and the caller
    connects anew. A connection of any other kind (SQLite's, opened in microseconds) is
    closed, not kept. The protocol never relies on a session:
    every decision is one statement or one transaction, so reuse changes no outcome.
    """

    MAX_IDLE_SECONDS = 60.0
    ROUND_TRIP_SECONDS = 2.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[JdbcSinkOptions, tuple[Any, float]] = {}

    def take(self, options: JdbcSinkOptions) -> Any | None:
        with self._lock:
            kept = self._idle.pop(options, None)
        if kept is None:
            return None
        connection, since = kept
        if time.monotonic() - since <= self.MAX_IDLE_SECONDS and self.answers(connection):
            return connection
        _close_quietly(connection)
        return None

    @classmethod
    def answers(cls, connection: Any) -> bool:
        """Usable, and answers one round trip within ``ROUND_TRIP_SECONDS``: a server
        that went away without a word leaves nothing on the socket, and the commit's first
        statement would be reset (its address moved to another host at a failover) or wait
        without bound (a network partition, a firewall that forgot the session). A
        connection that does not answer in time is closed: a new one costs milliseconds."""
        if not cls.usable(connection):
            return False
        pgconn = connection.pgconn
        deadline = time.monotonic() + cls.ROUND_TRIP_SECONDS
        try:
            pgconn.send_query(b"SELECT 1")
            while True:
                while pgconn.is_busy():
                    remaining = deadline - time.monotonic()
                    readable, _, _ = select.select([pgconn.socket], [], [], max(remaining, 0))
                    if not readable:
                        return False
                    pgconn.consume_input()
                result = pgconn.get_result()
                if result is None:
                    break
                if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                    return False
        except (OSError, ValueError, psycopg.Error):
            return False
        return pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def give_back(self, options: JdbcSinkOptions, connection: Any) -> None:
        if not self.usable(connection):
            _close_quietly(connection)
            return
        now = time.monotonic()
        with self._lock:
            previous = self._idle.pop(options, None)
            # Kept for options no longer used (a restart with another ledgerTable, user,
            # password or url): closed here, or they would stay logged in for ever.
            stale = [
                key for key, (_, since) in self._idle.items() if now - since > self.MAX_IDLE_SECONDS
            ]
            closing = [self._idle.pop(key)[0] for key in stale]
            if previous is not None:
                closing.append(previous[0])
            self._idle[options] = (connection, now)
        for kept in closing:
            if kept is not connection:
                _close_quietly(kept)

    @staticmethod
    def usable(connection: Any) -> bool:
        if not isinstance(connection, psycopg.Connection):
            return False
        if connection.closed or connection.broken:
            return False
        pgconn = connection.pgconn
        if (
            pgconn.status != psycopg.pq.ConnStatus.OK
            or pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE
        ):
            return False
        try:
            # Idle, the server has nothing to say: anything readable is a termination
            # notice or the end of the stream (a terminated session, a stopped server).
            readable, _, _ = select.select([pgconn.socket], [], [], 0)
        except (OSError, ValueError, psycopg.Error):
            return False
        return not readable


def _close_quietly(connection: Any) -> None:
    try:
        connection.close()
    except Exception as error:  # closing a dead connection: nothing is left to do
        logger.debug("2pc-jdbc could not close a connection: %s", type(error).__name__)


_idle_connections = _IdleConnections()
_stages_seen: set[TableName] = set()
"""Staging tables seen to exist in this process (a stage is dropped only by a query
start that finds it empty with other columns, and then created again)."""


def _piece_of(transaction_id: str, handle: dict[str, str]) -> PreparedPiece | None:
    parsed = parse_transaction_id(transaction_id)
    if parsed is None:
        return None
    sink_id, batch_id, partition_id, attempt = parsed
    # rows=1: a listed piece holds rows (empty pieces are never prepared or staged).
    return PreparedPiece(sink_id, batch_id, partition_id, attempt, 1, handle)


def open_resource(options: JdbcSinkOptions, plan: SinkPlan) -> JdbcResource:
    return JdbcResource(options, plan)


def inspect_sink(query_id: str, options: Mapping[str, str]) -> SinkState:
    """The state of the 2pc-jdbc sink that a query of ``query_id`` writes with ``options``
    (``url``, ``dbtable``, optional ``user``, ``password``, ``ledgerTable``, ``sinkId``),
    its id derived as the sink derives it. Read only (``TransactionalResource.inspect``)."""
    parsed = parse_options(options)
    if parsed.url.dialect == "sqlite" and not os.path.isfile(parsed.url.path):
        # sqlite3 would create an empty database there: inspection never writes.
        raise JdbcSinkOptionError(
            f"url jdbc:sqlite:{parsed.url.path} names no database file: give the url the"
            " query wrote"
        )
    sink_id = parsed.sink_id or derive_sink_id(query_id, parsed.target)
    plan = SinkPlan(parsed.protocol, (), stage_table(parsed.table))
    resource = JdbcResource(parsed, plan)
    try:
        return resource.inspect(sink_id)
    finally:
        resource.close()


DATABASE_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    sqlite3.OperationalError,
    pymysql.err.OperationalError,
    pymysql.err.InterfaceError,
)
