"""The narrow interface a sink's storage implements to take part in two-phase commit."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from commit_protocols.pieces import BatchDecision, PreparedPiece


class TransactionalResource(ABC):
    """Driver-side view of where a sink's pieces are prepared and its decisions kept.

    Implementations: PostgreSQL prepared transactions and staging tables
    (``connectors.jdbc``), S3 multipart uploads and manifests (``connectors.s3``).
    Every method must be idempotent: recovery may repeat any of them after a crash.
    """

    commits_atomically: bool = False
    """True when ``commit_atomically`` makes decision, pieces and "done" visible in one
    step (the staging protocol); the coordinator then skips the piece-by-piece path."""

    @abstractmethod
    def find_decision(self, sink_id: str, batch_id: int) -> BatchDecision | None:
        """The durable decision for (sink, batch), or None. Must be an indexed lookup."""

    @abstractmethod
    def record_decision(self, decision: BatchDecision) -> bool:
        """Durably record ``decision``; False when a decision for the batch already exists."""

    @abstractmethod
    def commit_piece(self, piece: PreparedPiece) -> None:
        """Make a prepared piece visible; a piece already committed is left as it is."""

    @abstractmethod
    def rollback_piece(self, piece: PreparedPiece) -> None:
        """Discard a prepared piece; a piece already gone is left as it is."""

    @abstractmethod
    def mark_done(self, decision: BatchDecision) -> None:
        """Record that every piece of ``decision`` is committed."""

    @abstractmethod
    def unfinished_decisions(self, sink_id: str) -> Iterable[BatchDecision]:
        """Decisions of this sink not yet marked done (normally none, after a crash one)."""

    @abstractmethod
    def prepared_pieces(self, sink_id: str) -> Iterable[PreparedPiece]:
        """Pieces of this sink still prepared: neither committed nor rolled back."""

    def commit_atomically(self, decision: BatchDecision) -> bool:
        """Record, apply and finish ``decision`` in one step; False if already decided."""
        raise NotImplementedError(f"{type(self).__name__} does not commit atomically")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the resource is not used afterwards."""
