"""The two-phase-commit coordinator that runs in a sink's driver-side commit/abort.

Commit order for batch N (``commit(messages, N)``), each step durable before the next:

1. Tasks prepared their pieces (executors, ``write()``), invisible to readers.
2. If a decision for (sink, N) exists, N was applied before the restart that replays it:
   roll the new pieces back and stop (exactly once, not twice).
3. Record the decision "commit N with these pieces" (the ledger row / the manifest).
4. Commit every piece (idempotent), then mark the decision done.
5. Recover: finish unfinished decisions, roll back stray pieces of batches <= N.

What a crash at each point leaves, and how it is mended (Spark then replays N with the
same batch id, because its commit log has no entry for N):

=====================  ===============================  ==================================
crash point            state left behind                recovery on the replay of N
=====================  ===============================  ==================================
after_prepare          prepared pieces, no decision     replay prepares anew; step 5 rolls
                                                        the orphans back
before_decision        prepared pieces, no decision     same as above
after_decision         decision, pieces prepared        step 2 sees the decision; step 5
                                                        commits its pieces (roll forward)
between_piece_commits  decision, some pieces committed  step 5 commits the rest
after_commit           decision done                    step 2 rolls the replay's pieces
                                                        back; nothing applied twice
=====================  ===============================  ==================================

Commits and rollbacks must be idempotent in every resource; the coordinator may repeat
them. ``abort`` rolls back what the failed batch's tasks prepared.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from commit_protocols.fault_points import (
    AFTER_COMMIT,
    AFTER_DECISION,
    BEFORE_DECISION,
    BETWEEN_PIECE_COMMITS,
    fault_point,
)
from commit_protocols.pieces import BatchDecision, PreparedPiece
from commit_protocols.resource import TransactionalResource

logger = logging.getLogger("eospack.commit")


class CommitProtocolError(RuntimeError):
    """The batch's commit messages are inconsistent (a bug, or two sinks sharing a path)."""


def prepared_pieces_of(messages: Sequence[object | None]) -> list[PreparedPiece]:
    """The commit messages that are prepared pieces (failed tasks send None)."""
    return [message for message in messages if isinstance(message, PreparedPiece)]


class TwoPhaseCommitCoordinator:
    """Commits, aborts and recovers the batches of one sink against one resource."""

    def __init__(self, resource: TransactionalResource, sink_name: str = "sink") -> None:
        self.resource = resource
        self.sink_name = sink_name

    def commit(self, messages: Sequence[object | None], batch_id: int) -> BatchDecision | None:
        """Apply batch ``batch_id`` exactly once; return its decision (None for a replay)."""
        pieces = prepared_pieces_of(messages)
        sink_id = self._sink_id_of(pieces, batch_id)
        if sink_id is None:
            return None
        decision = BatchDecision(sink_id, batch_id, tuple(pieces))
        applied = self._apply(decision)
        self.recover(sink_id, up_to_batch=batch_id)
        fault_point(AFTER_COMMIT, batch_id)
        if not applied:
            logger.info(
                "%s batch %d was committed before a restart: rolled back its replay (%d rows)",
                self.sink_name, batch_id, decision.rows,
            )  # fmt: skip
            return None
        logger.info(
            "%s committed batch %d: %d rows in %d pieces (sink %s)",
            self.sink_name, batch_id, decision.rows, len(pieces), sink_id,
        )  # fmt: skip
        return decision

    def abort(self, messages: Sequence[object | None], batch_id: int) -> None:
        """Roll back whatever the tasks of the failed batch prepared."""
        pieces = prepared_pieces_of(messages)
        for piece in pieces:
            self.resource.rollback_piece(piece)
        logger.warning(
            "%s aborted batch %d: rolled back %d prepared pieces",
            self.sink_name, batch_id, len(pieces),
        )  # fmt: skip

    def recover(self, sink_id: str, up_to_batch: int | None = None) -> None:
        """Finish decided batches (roll forward); roll back orphans of batches <= up_to_batch.

        Pieces of later batches are left alone: they may belong to a batch still running.
        """
        for decision in self.resource.unfinished_decisions(sink_id):
            for piece in decision.pieces:
                self.resource.commit_piece(piece)
            self.resource.mark_done(decision)
            logger.warning(
                "%s recovery: finished the commit of batch %d (%d pieces) left by a crash",
                self.sink_name, decision.batch_id, len(decision.pieces),
            )  # fmt: skip
        for piece in self.resource.prepared_pieces(sink_id):
            if up_to_batch is None or piece.batch_id <= up_to_batch:
                self.resource.rollback_piece(piece)
                logger.warning(
                    "%s recovery: rolled back orphaned piece %s of batch %d",
                    self.sink_name, piece.transaction_id, piece.batch_id,
                )  # fmt: skip

    def _apply(self, decision: BatchDecision) -> bool:
        """Steps 2-4; False when the batch had been decided before (a replay)."""
        if self.resource.find_decision(decision.sink_id, decision.batch_id) is not None:
            self._roll_back_all(decision.pieces)
            return False
        fault_point(BEFORE_DECISION, decision.batch_id)
        if self.resource.commits_atomically:
            if not self.resource.commit_atomically(decision):
                self._roll_back_all(decision.pieces)
                return False
            fault_point(AFTER_DECISION, decision.batch_id)
            return True
        if not self.resource.record_decision(decision):
            self._roll_back_all(decision.pieces)
            return False
        fault_point(AFTER_DECISION, decision.batch_id)
        for index, piece in enumerate(decision.pieces):
            if index == 1:
                fault_point(BETWEEN_PIECE_COMMITS, decision.batch_id)
            self.resource.commit_piece(piece)
        self.resource.mark_done(decision)
        return True

    def _roll_back_all(self, pieces: Sequence[PreparedPiece]) -> None:
        for piece in pieces:
            self.resource.rollback_piece(piece)

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
