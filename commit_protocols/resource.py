"""The narrow interface a sink's storage implements to take part in two-phase commit."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence

from eospack.core.errors import EospackError

from .inspection import DecisionState, Leftover, SinkState, cleanup_line
from .pieces import BatchDecision, PreparedPiece


class DecidedPieceLostError(EospackError, RuntimeError):
    """A piece that a decision names is gone without having been committed: its rows are lost.

    Raised by ``commit_piece`` when the resource can tell (a marker, a transaction status,
    a HEAD of the object) that the piece was rolled back or aborted by someone else; the
    message names the sink, the batch and the piece.
    """


class TransactionalResource(ABC):
    """Driver-side view of where a sink's pieces are prepared and its decisions kept.

    Implementations: PostgreSQL/SQLite prepared transactions and staging tables
    (``eospack.connectors.jdbc``), S3 multipart uploads and manifests (``eospack.connectors.s3``).

    Decisions live in one durable *slot* per (sink, batch) that changes only by
    compare-and-set (see ``BatchDecision``): absent -> decided -> done, or absent -> aborted
    (a fence naming pieces rolled back) -> decided with other pieces. Every method must be
    idempotent: recovery may repeat any of them after a crash or a lost answer.
    """

    commits_atomically: bool = False
    """True when ``commit_atomically`` makes decision, pieces and "done" visible in one
    step (the staging protocol); the coordinator then skips the piece-by-piece path."""

    orphans_can_block_commit: bool = False
    """True when a leftover piece can hold locks that this batch's commit needs (a prepared
    transaction's row locks): the coordinator then rolls leftovers back before deciding,
    at the cost of one more listing per commit."""

    @abstractmethod
    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        """What the slot of (sink, batch) holds, or None. Must be an indexed lookup.

        A resource that does not record "done" returns ``decided`` for a finished batch;
        the coordinator then re-commits its pieces, which must verify rather than assume.
        """

    @abstractmethod
    def record_decision(self, decision: BatchDecision) -> BatchDecision:
        """Write ``decision`` into its slot if the slot is empty or holds an abort fence that
        ``accepts`` it; return what the slot holds afterwards (``decision`` itself when it
        was written, the existing record otherwise)."""

    @abstractmethod
    def fence(
        self, sink_id: str, batch_id: int, pieces: tuple[PreparedPiece, ...]
    ) -> BatchDecision:
        """Make sure no later decision of (sink, batch) can name ``pieces``, then return the slot.

        Empty slot: write an ``aborted`` fence with ``pieces``. A fence: widen it. A decision:
        leave it (the caller then rolls back only the pieces it does not name).
        """

    @abstractmethod
    def commit_piece(self, piece: PreparedPiece) -> None:
        """Make a prepared piece visible; a piece already committed is left as it is.

        Raises ``DecidedPieceLostError`` when the piece is gone and was not committed.
        """

    def commit_pieces(self, pieces: Sequence[PreparedPiece]) -> None:
        """Commit every piece of a decision; the default commits them one by one and stops
        at the first failure (``commit_piece``'s contract, piece by piece).

        A resource whose pieces can be committed concurrently overrides this to pay one
        round trip instead of one per piece (2pc-kafka sends every EndTxn at once); it must
        raise as ``commit_piece`` would if any piece failed. Committing is idempotent, so
        ``abort``'s roll-forward or the next run's recovery finishes what failed."""
        for piece in pieces:
            self.commit_piece(piece)

    @abstractmethod
    def rollback_piece(self, piece: PreparedPiece) -> None:
        """Discard a prepared piece; a piece already gone is left as it is."""

    @abstractmethod
    def mark_done(self, decision: BatchDecision) -> None:
        """Record that every piece of ``decision`` is committed."""

    @abstractmethod
    def unfinished_decisions(self, sink_id: str) -> Iterable[BatchDecision]:
        """Decisions of this sink not yet done (normally none, after a crash one)."""

    @abstractmethod
    def prepared_pieces(self, sink_id: str) -> Iterable[PreparedPiece]:
        """Pieces of this sink still prepared: neither committed nor rolled back."""

    def roll_back_unattributed(  # noqa: B027 - optional hook
        self, sink_id: str, query_ids: Collection[str | None]
    ) -> None:
        """Roll back the leftovers of the sink written by ``query_ids`` (the queries whose
        pieces the recovering commit or abort holds; None for a piece that names no query)
        that carry no batch id (2pc-kafka's pooled
        transactional ids: ``connectors/kafka/sink/producer_pool.py``). Recovery calls it last,
        after every unfinished decision is finished and the batches' orphans are rolled
        back, and only at a batch's commit or abort (or the first commit of a run), when no
        task of a later batch has begun: anything such a leftover holds is named by no
        decision that exists or can still be written. Resources whose pieces all carry
        their batch need not implement it."""

    def check_prepared(self, decision: BatchDecision) -> None:  # noqa: B027 - optional hook
        """Raise when a piece ``decision`` would name can no longer be committed (its
        transaction ended before the decision, e.g. the broker aborted it after its
        timeout): the coordinator then does not decide, Spark's abort fences the batch and
        the replay writes it again, instead of a decided batch that is half lost. Called
        just before the decision; resources whose prepared pieces cannot expire need not
        implement it."""

    def commit_atomically(self, decision: BatchDecision) -> BatchDecision:
        """Record, apply and finish ``decision`` in one step, under the rules of
        ``record_decision``; return what the slot holds afterwards."""
        raise NotImplementedError(f"{type(self).__name__} does not commit atomically")

    # Inspection (read only: see ``eospack.commit_protocols.inspection``) ----------------

    sink_format: str = "2pc"
    """The format name users write (``2pc-jdbc``, ``2pc-s3``, ``2pc-kafka``)."""

    cleanup_advice: str = (
        "start the query again from this checkpoint: its first commit finishes what a"
        " decision names and rolls back the rest"
    )
    """What cleans what the sink left behind, one line."""

    def inspect(self, sink_id: str) -> SinkState:
        """The sink's decisions, prepared pieces and leftovers as they are now. Read only:
        nothing is written, fenced, committed or rolled back (a crashed query's restart
        finds everything as it was)."""
        decisions = tuple(self.inspected_decisions(sink_id))
        pieces = list(self.prepared_pieces(sink_id))
        prepared = tuple(sorted({piece.transaction_id for piece in pieces}))
        leftovers = tuple(self.leftovers(sink_id, pieces))
        return SinkState(
            self.sink_format,
            sink_id,
            self.describe_target(),
            decisions,
            prepared,
            leftovers,
            cleanup_line(decisions, leftovers, self.cleanup_advice),
        )

    def inspected_decisions(self, sink_id: str) -> Iterable[DecisionState]:
        """Every decision slot of the sink, by batch id, read without writing. The default
        lists ``unfinished_decisions``, which suits a resource whose listing is a pure
        read; a resource that keeps finished slots too, or whose listing opens (fences)
        something, overrides it."""
        return [DecisionState.of(decision) for decision in self.unfinished_decisions(sink_id)]

    def leftovers(self, sink_id: str, prepared: list[PreparedPiece]) -> Iterable[Leftover]:
        """What the sink left behind, one entry per thing a user could find in the store
        (given the pieces ``prepared_pieces`` just listed)."""
        names = sorted({piece.transaction_id for piece in prepared})
        return [Leftover("prepared piece", name) for name in names]

    def describe_target(self) -> str:
        """Where the sink writes, without credentials."""
        return type(self).__name__

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the resource is not used afterwards."""
