"""The protocol's inspection interface (``TransactionalResource.inspect``) on the in-memory
resource: what it reports, that it only reads, and its one-line views (pure logic; each
sink's own implementation is tested against its service in
``integration_tests/sinks/test_sink_inspection.py``)."""

from __future__ import annotations

from collections import Counter

from eospack.commit_protocols import BatchDecision, TwoPhaseCommitCoordinator
from eospack.commit_protocols.inspection import (
    DecisionState,
    Leftover,
    SinkState,
)
from eospack.commit_protocols.pieces import ABORTED
from tests.in_memory_resource import InMemoryResource


def crashed_after_the_decision() -> tuple[InMemoryResource, BatchDecision]:
    """Batch 7 decided with two pieces, none committed, and an orphan of batch 7's other
    attempt that no decision names."""
    resource = InMemoryResource()
    pieces = tuple(resource.prepare("s1", 7, partition) for partition in range(2))
    decision = resource.record_decision(BatchDecision("s1", 7, pieces))
    resource.prepare("s1", 7, 0, attempt="orphan")
    resource.calls.clear()
    resource.order.clear()
    return resource, decision


def test_inspect_reports_the_decided_batch_and_every_prepared_piece_as_leftovers() -> None:
    resource, decision = crashed_after_the_decision()

    state = resource.inspect("s1")

    assert state.decisions == (DecisionState(7, "decided", 20, 2),)
    assert state.unfinished == state.decisions
    expected = sorted(resource.prepared)
    assert list(state.prepared_pieces) == expected and len(expected) == 3
    assert [leftover.what for leftover in state.leftovers] == [
        f"prepared piece {name}" for name in expected
    ]
    assert state.cleanup.startswith("start the query again from this checkpoint")
    assert not state.is_clean and state.leftover_count() == 3 + 1
    assert decision.transaction_ids() <= set(state.prepared_pieces)


def test_inspect_only_reads_and_the_query_then_recovers_what_it_reported() -> None:
    resource, decision = crashed_after_the_decision()
    prepared, slots = dict(resource.prepared), dict(resource.slots)

    first = resource.inspect("s1")
    assert resource.inspect("s1") == first

    assert resource.calls == Counter() and resource.order == []
    assert resource.prepared == prepared and resource.slots == slots
    assert resource.committed == [] and resource.rolled_back == []

    TwoPhaseCommitCoordinator(resource).recover("s1", up_to_batch=7)
    assert sorted(resource.committed) == sorted(decision.transaction_ids())
    assert resource.inspect("s1") == SinkState(
        "2pc", "s1", "InMemoryResource", (), (), (), "nothing to clean"
    )


def test_an_abort_fence_is_a_finished_batch_and_no_leftover() -> None:
    fence = BatchDecision("s1", 3, (), ABORTED)
    state = SinkState("2pc-x", "s1", "x", (DecisionState.of(fence),), (), (), "nothing to clean")
    assert state.decisions[0].status == "aborted (fence)"
    assert state.is_clean and state.leftover_count() == 0


def test_the_text_lines_name_every_decision_piece_and_leftover() -> None:
    state = SinkState(
        "2pc-s3",
        "s1",
        "s3://bucket/prefix",
        (DecisionState(0, "done", 5, 1), DecisionState(1, "decided", 6, 2)),
        ("eospack-s1-1-0-a",),
        (Leftover("multipart upload", "prefix/k (u1)"), Leftover("staged rows", "12", 12)),
        "start the query again",
    )
    assert state.lines() == [
        "2pc-s3 sink s1 (s3://bucket/prefix):",
        "  batch 0: done, 5 rows, 1 pieces",
        "  batch 1: decided, 6 rows, 2 pieces",
        "  prepared pieces: 1",
        "    eospack-s1-1-0-a",
        "  left behind: 2",
        "    multipart upload prefix/k (u1)",
        "    staged rows 12",
        "  start the query again",
    ]
    assert state.leftover_count() == 1 + 12 + 1
