"""The two-phase-commit coordinator that runs in a sink's driver-side commit/abort.

Commit order for batch N (``commit(messages, N)``), each step durable before the next:

1. Tasks prepared their pieces (executors, ``write()``), invisible to readers.
2. Check that every piece can still be committed (``check_prepared``: a Kafka transaction
   the broker timed out cannot); if one cannot, raise undecided: Spark's abort fences the
   batch and the replay writes it again.
   Write the decision "commit N with exactly these pieces" into the slot of (sink, N) by
   compare-and-set (``record_decision``). If the slot already holds a decision with other
   pieces, N was applied before a restart that replays it: roll the new pieces back and
   finish that decision instead (exactly once, not twice). If it holds our own pieces
   (the answer of an earlier write was lost), the decision is ours.
3. Commit every piece (idempotent, verified: a piece that is gone without having been
   committed is ``DecidedPieceLostError``), then mark the decision done. The resource may
   commit the pieces concurrently (``commit_pieces``): the decision is durable first, so
   their order does not matter.
4. Recover: finish unfinished decisions, roll back stray pieces of batches <= N (again
   where ``orphans_can_block_commit`` recovered before the decision: a zombie task may
   have prepared since, and after a query's last batch nothing else would roll it back),
   then the leftovers that carry no batch (``roll_back_unattributed``).

The one rule every path keeps: **a piece named by a decision is never rolled back, by
anyone.** Rolling a piece back is allowed only after ``fence`` has made sure that no
decision names it and none ever will (an ``aborted`` slot naming the piece refuses every
later decision that names it). So ``abort`` (which Spark calls whenever ``commit`` raises)
rolls a decided batch *forward*, and a decision that was recorded although its answer was
lost, or that lands late, can never name rolled-back pieces.

What each failure leaves, and how it is mended (Spark then replays N with the same batch
id, because its commit log has no entry for N):

======================================  ============================  ==========================
failure                                 state left behind             mended by
======================================  ============================  ==========================
crash after prepare / before decision   prepared pieces, empty slot   the replay's tasks fence
                                                                      and roll back the crashed
                                                                      run's pieces; its commit
                                                                      rolls back the rest
decision write fails before applying    empty slot                    ``abort`` fences the slot
                                                                      and rolls the pieces back
decision applied, answer lost           decided slot, our pieces      ``abort`` finds it ours:
                                                                      rolls forward
crash after decision / between commits  decided slot, some committed  the replay's commit finds
                                                                      the decision: rolls forward
a piece commit fails (connection lost)  decided slot, some committed  ``abort`` rolls forward, or
                                                                      the replay does
crash after commit                      done slot                     the replay's pieces are
                                                                      rolled back: nothing twice
a decided piece lost (lifecycle rule,   decided slot, piece gone      ``DecidedPieceLostError``
someone ran ROLLBACK PREPARED)                                        naming sink, batch, piece
======================================  ============================  ==========================

Metrics (``eospack.core.metrics``, docs/metrics.md) are recorded here, once for every sink:
decision and commit latency, committed batches, pieces and rows, batches rolled forward,
pieces rolled back, batches fenced, pieces left waiting; with metrics off each costs one
environment lookup. Each commit also logs one JSON line on ``eospack.batches``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

from eospack.core.errors import EospackError
from eospack.core.fault_points import (
    AFTER_COMMIT,
    AFTER_DECISION,
    BEFORE_DECISION,
    BETWEEN_PIECE_COMMITS,
    fault_point,
    is_armed,
)
from eospack.core.metrics import RECORDER

from .identity import SinkIdentityError, TaskIdentity, parse_attempt
from .pieces import DONE, BatchDecision, PreparedPiece
from .resource import TransactionalResource

logger = logging.getLogger(__name__)
BATCH_LOG = logging.getLogger("eospack.batches")
"""One JSON line per sink commit at INFO (docs/metrics.md, "Log line per batch")."""


class CommitProtocolError(EospackError, RuntimeError):
    """The batch cannot be committed as it stands (inconsistent messages, or pieces fenced)."""


def prepared_pieces_of(messages: Sequence[object | None]) -> list[PreparedPiece]:
    """The commit messages that are prepared pieces (failed tasks send None)."""
    return [message for message in messages if isinstance(message, PreparedPiece)]


def stale_pieces(task: TaskIdentity, listed: Iterable[PreparedPiece]) -> list[PreparedPiece]:
    """The listed pieces of the task's sink that can only be leftovers, seen from ``task``.

    - pieces of earlier batches (Spark runs batch N only after N-1 committed);
    - pieces of the same batch from another run of the query (that run is over);
    - pieces of the same batch, run and partition from a lower attempt number: Spark
      retried the task, so that attempt failed; unless speculation is on, when it may
      still be alive.

    Whether a decision names one of them is the caller's check (``roll_back_orphans``).
    """
    stale = []
    for piece in listed:
        if piece.sink_id != task.sink_id or piece.batch_id > task.batch_id:
            continue
        if piece.batch_id < task.batch_id:
            stale.append(piece)
            continue
        attempt = parse_attempt(piece.attempt)
        other_run = attempt.run is None or attempt.run != task.run
        failed_attempt = (
            piece.partition_id == task.partition_id
            and attempt.number < task.attempt_number
            and not task.speculation
        )
        if other_run or failed_attempt:
            stale.append(piece)
    return stale


def record_committed(sink: str, sink_id: str, mode: str, pieces: int, rows: int) -> None:
    """Count a committed batch (``eospack.core.metrics``; nothing when metrics are off)."""
    RECORDER.add(
        "eospack_sink_batches_committed_total", {"sink": sink, "sink_id": sink_id, "mode": mode}
    )
    RECORDER.add("eospack_sink_pieces_committed_total", {"sink": sink, "sink_id": sink_id}, pieces)
    RECORDER.add(
        "eospack_sink_rows_committed_total", {"sink": sink, "sink_id": sink_id, "mode": mode}, rows
    )


def record_rolled_forward(sink: str, sink_id: str) -> None:
    RECORDER.add(
        "eospack_sink_recovery_rolled_forward_batches_total", {"sink": sink, "sink_id": sink_id}
    )


def record_rolled_back(sink: str, sink_id: str) -> None:
    RECORDER.add(
        "eospack_sink_recovery_rolled_back_pieces_total", {"sink": sink, "sink_id": sink_id}
    )


def record_fenced(sink: str, sink_id: str) -> None:
    RECORDER.add("eospack_sink_fenced_batches_total", {"sink": sink, "sink_id": sink_id})


def record_waiting(sink: str, sink_id: str, pieces: int) -> None:
    RECORDER.set("eospack_sink_pieces_waiting", {"sink": sink, "sink_id": sink_id}, pieces)


class TwoPhaseCommitCoordinator:
    """Commits, aborts and recovers the batches of one sink against one resource."""

    def __init__(self, resource: TransactionalResource, sink_name: str = "sink") -> None:
        self.resource = resource
        self.sink_name = sink_name

    def commit(self, messages: Sequence[object | None], batch_id: int) -> BatchDecision | None:
        """Apply batch ``batch_id`` exactly once; return its decision (None for a replay)."""
        started = time.perf_counter()
        pieces = prepared_pieces_of(messages)
        sink_id = self._sink_id_of(pieces, batch_id)
        if sink_id is None:
            return None
        labels = {"sink": self.sink_name, "sink_id": sink_id}
        ours = BatchDecision(sink_id, batch_id, tuple(pieces))
        if self.resource.orphans_can_block_commit:
            self._recover_before(ours)
        fault_point(BEFORE_DECISION, batch_id)
        self.resource.check_prepared(ours)
        if self.resource.commits_atomically:
            slot = self.resource.commit_atomically(ours)
        else:
            slot = self.resource.record_decision(ours)
        applied = slot.is_decided and slot.same_pieces(ours)
        decided = time.perf_counter()
        if applied:
            RECORDER.observe("eospack_sink_decision_seconds", labels, decided - started)
            fault_point(AFTER_DECISION, batch_id)
            self._finish(slot, crash_between_pieces=True)
            RECORDER.observe("eospack_sink_commit_seconds", labels, time.perf_counter() - decided)
            record_committed(self.sink_name, sink_id, "exactly_once", len(slot.pieces), slot.rows)
        elif slot.is_decided:
            self._roll_back(self._not_named(ours.pieces, slot))
            self._finish(slot)
            self._refuse_another_querys_slot(slot, ours)
        else:
            fenced = sorted(slot.transaction_ids() & ours.transaction_ids())
            raise CommitProtocolError(
                f"{self.sink_name} batch {batch_id} of sink {sink_id} cannot commit: pieces"
                f" {', '.join(fenced)} were rolled back by an abort or a recovery before the"
                " decision; restart the query from its checkpoint: Spark replays the batch"
            )
        waiting = self.recover(sink_id, up_to_batch=batch_id, query_ids=ours.piece_query_ids())
        fault_point(AFTER_COMMIT, batch_id)
        BATCH_LOG.info(
            json.dumps(
                {
                    "sink": self.sink_name,
                    "sink_id": sink_id,
                    "batch_id": batch_id,
                    "outcome": "committed" if applied else "replay_rolled_back",
                    "rows": slot.rows if applied else ours.rows,
                    "pieces": len(pieces),
                    "decision_seconds": round(decided - started, 6),
                    "commit_seconds": round(time.perf_counter() - decided, 6),
                    "pieces_waiting": waiting,
                },
                separators=(",", ":"),
            )
        )
        if not applied:
            logger.info(
                "%s batch %d was committed before a restart: rolled back its replay (%d rows)",
                self.sink_name,
                batch_id,
                ours.rows,
            )
            return None
        logger.info(
            "%s committed batch %d: %d rows in %d pieces (sink %s)",
            self.sink_name,
            batch_id,
            slot.rows,
            len(pieces),
            sink_id,
        )
        return slot

    def _refuse_another_querys_slot(self, slot: BatchDecision, ours: BatchDecision) -> None:
        """A slot decided by another streaming query is no replay of ours: two queries share
        the sink id (a ``sinkId`` kept for a new checkpoint, or for a savepoint restored
        into a new query). Taking it for a replay would drop this batch silently; refuse
        loudly (our pieces are rolled back, the other query's decision is finished)."""
        theirs, mine = slot.query_ids(), ours.query_ids()
        if theirs and mine and not theirs & mine:
            raise SinkIdentityError(
                f"{self.sink_name} batch {ours.batch_id} of sink {ours.sink_id} was committed"
                f" by another query ({', '.join(sorted(theirs))}), not by this one"
                f" ({', '.join(sorted(mine))}): two queries share sinkId '{ours.sink_id}' (a"
                " new checkpoint or a restored savepoint is a new query): give each query its"
                " own sinkId, or leave sinkId unset to derive one"
            )

    def abort(self, messages: Sequence[object | None], batch_id: int) -> None:
        """Spark's abort: roll back what the batch prepared, unless the batch is decided.

        A decided batch is rolled forward instead (``commit`` may have failed after the
        decision, e.g. on a lost connection between two piece commits). Never raises for a
        resource failure: what cannot be done now is logged with the pieces left, and is
        done by the first commit after the query restarts.
        """
        pieces = tuple(prepared_pieces_of(messages))
        sink_id = self._sink_id_of(list(pieces), batch_id)
        if sink_id is None:
            logger.warning(
                "%s aborted batch %d: no prepared piece reached the driver; what failed tasks"
                " left is rolled back by the next commit of this sink",
                self.sink_name,
                batch_id,
            )
            return
        try:
            slot = self.resource.fence(sink_id, batch_id, pieces)
            if slot.is_decided:
                self._roll_back(self._not_named(pieces, slot))
                self._finish(slot)
                logger.warning(
                    "%s batch %d was decided when Spark aborted it: finished its commit"
                    " (%d rows) instead of rolling it back",
                    self.sink_name,
                    batch_id,
                    slot.rows,
                )
            else:
                record_fenced(self.sink_name, sink_id)
                self._roll_back(pieces)
                logger.warning(
                    "%s aborted batch %d: rolled back %d prepared pieces",
                    self.sink_name,
                    batch_id,
                    len(pieces),
                )
            self.recover(
                sink_id,
                up_to_batch=batch_id,
                query_ids=frozenset(piece.query_id for piece in pieces),
            )
        except Exception as error:  # the query fails anyway; say what is left and where
            left = ", ".join(piece.transaction_id for piece in pieces if piece.rows) or "none"
            logger.warning(
                "%s could not finish the abort of batch %d (%s: %s). Prepared pieces left: %s."
                " They are committed or rolled back by the first commit after the query"
                " restarts from its checkpoint",
                self.sink_name,
                batch_id,
                type(error).__name__,
                error,
                left,
            )

    def _recover_before(self, ours: BatchDecision) -> None:
        """Before deciding: finish decided batches and roll back every other piece of this
        batch or earlier ones, since a crashed run's prepared piece can hold row locks the
        commit needs (staging's move into the table would wait on it until lockTimeout).
        Safe: a rolled-back piece is fenced first, and no decision may name it; ours are kept.
        """
        for decision in self.resource.unfinished_decisions(ours.sink_id):
            self._finish(decision)
            record_rolled_forward(self.sink_name, ours.sink_id)
        orphans = [
            piece
            for piece in self.resource.prepared_pieces(ours.sink_id)
            if piece.batch_id <= ours.batch_id and not ours.names(piece)
        ]
        self.roll_back_orphans(ours.sink_id, orphans)

    def recover(
        self,
        sink_id: str,
        up_to_batch: int | None = None,
        query_ids: Collection[str | None] = frozenset(),
    ) -> int:
        """Finish decided batches (roll forward); roll back orphans of batches <= up_to_batch,
        and the leftovers without a batch that ``query_ids`` wrote. Returns the pieces
        left waiting (of later batches).

        Pieces of later batches are left alone: they may belong to a batch still running.
        """
        for decision in self.resource.unfinished_decisions(sink_id):
            self._finish(decision)
            record_rolled_forward(self.sink_name, sink_id)
            logger.warning(
                "%s recovery: finished the commit of batch %d (%d pieces) left by a crash",
                self.sink_name,
                decision.batch_id,
                len(decision.pieces),
            )
        listed = list(self.resource.prepared_pieces(sink_id))
        orphans = [
            piece for piece in listed if up_to_batch is None or piece.batch_id <= up_to_batch
        ]
        self.roll_back_orphans(sink_id, orphans)
        self.resource.roll_back_unattributed(sink_id, query_ids)
        waiting = len(listed) - len(orphans)
        record_waiting(self.sink_name, sink_id, waiting)
        return waiting

    def roll_back_orphans(self, sink_id: str, pieces: Iterable[PreparedPiece]) -> None:
        """Fence each batch's pieces, then roll back those no decision names (decided ones
        are committed instead)."""
        by_batch: dict[int, list[PreparedPiece]] = defaultdict(list)
        for piece in pieces:
            by_batch[piece.batch_id].append(piece)
        for batch_id, batch_pieces in sorted(by_batch.items()):
            slot = self.resource.fence(sink_id, batch_id, tuple(batch_pieces))
            if slot.is_decided:
                self._finish(slot)
            else:
                record_fenced(self.sink_name, sink_id)
            for piece in self._not_named(batch_pieces, slot) if slot.is_decided else batch_pieces:
                self.resource.rollback_piece(piece)
                record_rolled_back(self.sink_name, sink_id)
                logger.warning(
                    "%s recovery: rolled back orphaned piece %s of batch %d",
                    self.sink_name,
                    piece.transaction_id,
                    piece.batch_id,
                )

    def _finish(self, decision: BatchDecision, crash_between_pieces: bool = False) -> None:
        """Commit every piece of a decision (idempotently) and mark it done."""
        if decision.status == DONE:
            return
        pieces = list(decision.pieces)
        if crash_between_pieces and len(pieces) > 1:
            if is_armed(BETWEEN_PIECE_COMMITS, decision.batch_id):
                self.resource.commit_piece(pieces.pop(0))  # the state the crash test needs
            fault_point(BETWEEN_PIECE_COMMITS, decision.batch_id)
        self.resource.commit_pieces(pieces)
        self.resource.mark_done(decision)

    @staticmethod
    def _not_named(pieces: Iterable[PreparedPiece], decision: BatchDecision) -> list[PreparedPiece]:
        return [piece for piece in pieces if not decision.names(piece)]

    def _roll_back(self, pieces: Iterable[PreparedPiece]) -> None:
        for piece in pieces:
            self.resource.rollback_piece(piece)
            record_rolled_back(self.sink_name, piece.sink_id)

    def _sink_id_of(self, pieces: Sequence[PreparedPiece], batch_id: int) -> str | None:
        sink_ids = {piece.sink_id for piece in pieces}
        if len(sink_ids) > 1:
            raise CommitProtocolError(
                f"{self.sink_name} batch {batch_id} got pieces of several sinks {sorted(sink_ids)}"
            )
        wrong_batch = [piece.transaction_id for piece in pieces if piece.batch_id != batch_id]
        if wrong_batch:
            raise CommitProtocolError(
                f"{self.sink_name} batch {batch_id} got pieces of other batches: {wrong_batch}"
            )
        return next(iter(sink_ids), None)
