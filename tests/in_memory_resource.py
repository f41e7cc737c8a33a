"""A transactional resource kept in memory: the commit protocols' unit tests drive the
coordinator against it, with faults injected by hand."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from eospack.commit_protocols import (
    BatchDecision,
    DecidedPieceLostError,
    PreparedPiece,
    TransactionalResource,
)
from eospack.commit_protocols.pieces import ABORTED, DECIDED, DONE


class InMemoryResource(TransactionalResource):
    """Prepared pieces, committed pieces and decision slots, as plain collections.

    ``lose_next`` names a method whose next call applies and then raises (its answer lost);
    ``fail_next`` one whose next call raises before applying.
    """

    def __init__(self, atomic: bool = False) -> None:
        self.commits_atomically = atomic
        self.prepared: dict[str, PreparedPiece] = {}
        self.committed: list[str] = []
        self.rolled_back: list[str] = []
        self.slots: dict[tuple[str, int], BatchDecision] = {}
        self.calls: Counter[str] = Counter()
        self.order: list[str] = []
        self.faults: dict[tuple[str, int], str] = {}

    def fail(self, name: str, nth: int = 1, mode: str = "before") -> None:
        """Make the ``nth`` next call of ``name`` fail before it applies or after (lost)."""
        self.faults[(name, self.calls[name] + nth)] = mode

    def _faults(self, name: str, action):
        self.calls[name] += 1
        self.order.append(name)
        mode = self.faults.pop((name, self.calls[name]), None)
        if mode == "before":
            raise ConnectionError(f"{name} failed before it applied")
        result = action()
        if mode == "after":
            raise ConnectionError(f"{name} applied, answer lost")
        return result

    def prepare(
        self, sink_id: str, batch_id: int, partition_id: int, attempt: str = "0"
    ) -> PreparedPiece:
        piece = PreparedPiece(sink_id, batch_id, partition_id, attempt, rows=10)
        self.prepared[piece.transaction_id] = piece
        return piece

    def find_decision(self, sink_id, batch_id):
        return self.slots.get((sink_id, batch_id))

    def _put(self, decision, status):
        key = (decision.sink_id, decision.batch_id)
        slot = self.slots.get(key)
        if slot is None or slot.accepts(decision):
            self.slots[key] = replace(decision, status=status)
        return self.slots[key]

    def record_decision(self, decision):
        return self._faults("record_decision", lambda: self._put(decision, DECIDED))

    def fence(self, sink_id, batch_id, pieces):
        def apply():
            slot = self.slots.get((sink_id, batch_id))
            if slot is None:
                slot = BatchDecision(sink_id, batch_id, (), ABORTED)
            if not slot.is_decided:
                slot = slot.fenced_with(pieces)
                self.slots[(sink_id, batch_id)] = slot
            return slot

        return self._faults("fence", apply)

    def commit_piece(self, piece):
        def apply():
            if self.prepared.pop(piece.transaction_id, None) is not None:
                self.committed.append(piece.transaction_id)
            elif piece.transaction_id in self.rolled_back:
                raise DecidedPieceLostError(f"{piece.transaction_id} was rolled back")

        self._faults("commit_piece", apply)

    def rollback_piece(self, piece):
        def apply():
            if self.prepared.pop(piece.transaction_id, None) is not None:
                self.rolled_back.append(piece.transaction_id)

        self._faults("rollback_piece", apply)

    def mark_done(self, decision):
        key = (decision.sink_id, decision.batch_id)
        self.slots[key] = replace(self.slots[key], status=DONE)

    def unfinished_decisions(self, sink_id):
        return [d for (s, _), d in self.slots.items() if s == sink_id and d.status == DECIDED]

    def prepared_pieces(self, sink_id):
        return [p for p in self.prepared.values() if p.sink_id == sink_id]

    def commit_atomically(self, decision):
        def apply():
            slot = self._put(decision, DONE)
            if slot.status == DONE and slot.same_pieces(decision):
                for piece in decision.pieces:
                    self.prepared.pop(piece.transaction_id)
                    self.committed.append(piece.transaction_id)
            return slot

        return self._faults("record_decision", apply)

    def status(self, sink_id: str, batch_id: int) -> str | None:
        slot = self.slots.get((sink_id, batch_id))
        return None if slot is None else slot.status
