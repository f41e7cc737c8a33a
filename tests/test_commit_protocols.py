"""The coordinator's order and recovery rules, against an in-memory resource (pure logic)."""

from __future__ import annotations

import pytest

from commit_protocols import (
    BatchDecision,
    CommitProtocolError,
    PreparedPiece,
    TransactionalResource,
    TwoPhaseCommitCoordinator,
    derive_sink_id,
    parse_transaction_id,
    query_id_from_checkpoint,
    validate_sink_id,
)
from commit_protocols.fault_points import _parse
from commit_protocols.identity import SinkIdentityError


class InMemoryResource(TransactionalResource):
    """Prepared pieces, committed pieces and a ledger, as plain collections."""

    def __init__(self, atomic: bool = False) -> None:
        self.commits_atomically = atomic
        self.prepared: dict[str, PreparedPiece] = {}
        self.committed: list[str] = []
        self.decisions: dict[tuple[str, int], tuple[BatchDecision, bool]] = {}

    def prepare(
        self, sink_id: str, batch_id: int, partition_id: int, attempt: str = "0"
    ) -> PreparedPiece:
        piece = PreparedPiece(sink_id, batch_id, partition_id, attempt, rows=10)
        self.prepared[piece.transaction_id] = piece
        return piece

    def find_decision(self, sink_id, batch_id):
        found = self.decisions.get((sink_id, batch_id))
        return found[0] if found else None

    def record_decision(self, decision):
        key = (decision.sink_id, decision.batch_id)
        if key in self.decisions:
            return False
        self.decisions[key] = (decision, False)
        return True

    def commit_piece(self, piece):
        if self.prepared.pop(piece.transaction_id, None) is not None:
            self.committed.append(piece.transaction_id)

    def rollback_piece(self, piece):
        self.prepared.pop(piece.transaction_id, None)

    def mark_done(self, decision):
        self.decisions[(decision.sink_id, decision.batch_id)] = (decision, True)

    def unfinished_decisions(self, sink_id):
        return [d for (s, _), (d, done) in self.decisions.items() if s == sink_id and not done]

    def prepared_pieces(self, sink_id):
        return [p for p in self.prepared.values() if p.sink_id == sink_id]

    def commit_atomically(self, decision):
        if not self.record_decision(decision):
            return False
        for piece in decision.pieces:
            self.commit_piece(piece)
        self.mark_done(decision)
        return True


@pytest.fixture(params=[False, True], ids=["piece-by-piece", "atomic"])
def resource(request) -> InMemoryResource:
    return InMemoryResource(atomic=request.param)


def test_commit_applies_every_piece_once_and_records_a_done_decision(resource):
    pieces = [resource.prepare("s1", 0, p) for p in range(3)]

    decision = TwoPhaseCommitCoordinator(resource).commit([*pieces, None], 0)

    assert decision is not None and decision.rows == 30
    assert sorted(resource.committed) == sorted(p.transaction_id for p in pieces)
    assert resource.prepared == {}
    assert resource.decisions[("s1", 0)][1] is True


def test_replayed_batch_is_not_applied_twice_and_its_new_pieces_are_rolled_back(resource):
    coordinator = TwoPhaseCommitCoordinator(resource)
    first = [resource.prepare("s1", 4, p, attempt="a") for p in range(2)]
    coordinator.commit(first, 4)
    replay = [resource.prepare("s1", 4, p, attempt="b") for p in range(2)]

    assert coordinator.commit(replay, 4) is None

    assert sorted(resource.committed) == sorted(p.transaction_id for p in first)
    assert resource.prepared == {}


def test_recovery_rolls_a_decided_batch_forward():
    resource = InMemoryResource()
    pieces = tuple(resource.prepare("s1", 7, p) for p in range(2))
    resource.record_decision(BatchDecision("s1", 7, pieces))  # crash right after the decision
    replay = [resource.prepare("s1", 7, p, attempt="r") for p in range(2)]

    TwoPhaseCommitCoordinator(resource).commit(replay, 7)

    assert sorted(resource.committed) == sorted(p.transaction_id for p in pieces)
    assert resource.prepared == {}
    assert resource.unfinished_decisions("s1") == []


def test_recovery_rolls_back_orphans_up_to_the_batch_and_keeps_later_and_foreign_pieces(resource):
    orphan = resource.prepare("s1", 2, 0, attempt="crashed")
    later = resource.prepare("s1", 9, 0)
    other_sink = resource.prepare("s2", 1, 0)
    current = resource.prepare("s1", 3, 0)

    TwoPhaseCommitCoordinator(resource).commit([current], 3)

    assert resource.committed == [current.transaction_id]
    assert set(resource.prepared) == {later.transaction_id, other_sink.transaction_id}
    assert orphan.transaction_id not in resource.prepared


def test_abort_rolls_back_what_the_tasks_prepared(resource):
    pieces = [resource.prepare("s1", 1, p) for p in range(2)]

    TwoPhaseCommitCoordinator(resource).abort([pieces[0], None, pieces[1]], 1)

    assert resource.prepared == {} and resource.committed == []
    assert resource.decisions == {}


def test_pieces_of_two_sinks_in_one_batch_are_refused(resource):
    pieces = [resource.prepare("s1", 0, 0), resource.prepare("s2", 0, 1)]
    with pytest.raises(CommitProtocolError, match="pieces of several sinks"):
        TwoPhaseCommitCoordinator(resource).commit(pieces, 0)
    assert resource.committed == []


def test_a_batch_without_pieces_commits_nothing(resource):
    assert TwoPhaseCommitCoordinator(resource).commit([None], 0) is None
    assert resource.decisions == {}


def test_transaction_ids_round_trip_and_decisions_serialise():
    piece = PreparedPiece("abc123", 12, 3, "0xdeadbeef", 5, {"gid": "x"})
    assert parse_transaction_id(piece.transaction_id) == ("abc123", 12, 3, "0xdeadbeef")
    assert parse_transaction_id("someone-else") is None
    decision = BatchDecision("abc123", 12, (piece,))
    assert BatchDecision.from_pieces_json("abc123", 12, decision.pieces_json()) == decision


def test_sink_id_changes_with_the_query_and_the_target():
    assert derive_sink_id("q1", "public.t") == derive_sink_id("q1", "public.t")
    assert derive_sink_id("q1", "public.t") != derive_sink_id("q2", "public.t")
    assert derive_sink_id("q1", "public.t") != derive_sink_id("q1", "public.u")
    assert validate_sink_id("my_sink_1") == "my_sink_1"
    with pytest.raises(SinkIdentityError, match="sinkId 'a-b' is not usable"):
        validate_sink_id("a-b")


def test_query_id_is_read_from_a_local_checkpoint(tmp_path):
    (tmp_path / "metadata").write_text('{"id":"5f1c"}\n')
    assert query_id_from_checkpoint(str(tmp_path)) == "5f1c"
    assert query_id_from_checkpoint(f"file://{tmp_path}") == "5f1c"
    assert query_id_from_checkpoint(str(tmp_path / "missing")) is None
    assert query_id_from_checkpoint("s3a://bucket/checkpoint") is None


def test_fault_point_names_are_checked():
    assert _parse("after_decision@3") == ("after_decision", 3)
    assert _parse("after_commit") == ("after_commit", None)
    assert _parse(None) is None
    with pytest.raises(ValueError, match="names no fault point"):
        _parse("after_lunch")
