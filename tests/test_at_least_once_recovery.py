"""At-least-once mode's recovery (``TwoPhaseCommitStreamWriter``): what an exactly-once run
left is finished by the first commit of each query run, once per run (pure logic, against
the in-memory resource of test_commit_protocols)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa
import pytest

from eospack.commit_protocols import (
    BatchDecision,
    DecidedPieceLostError,
    PreparedPiece,
    TaskIdentity,
    TwoPhaseCommitStreamWriter,
)
from eospack.commit_protocols.identity import attempt_string
from eospack.commit_protocols.pieces import DONE
from eospack.commit_protocols.stream_writer import recover_at_least_once
from tests.in_memory_resource import InMemoryResource

EXACTLY_ONCE_RUN = "11111111-aaaa-4000-8000-000000000000"
QUERY_ID = "query-0000"
"""Spark's id of the query whose runs these tests play (kept across its restarts)."""


class Writer(TwoPhaseCommitStreamWriter):
    """An at-least-once writer whose storage is ``resource``; counts its opens."""

    sink_name = "test sink"

    def __init__(self, resource: InMemoryResource) -> None:
        super().__init__(None, "memory://", exactly_once=False)
        self.resource = resource
        self.opened = 0

    def prepare(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> PreparedPiece:
        raise NotImplementedError

    def write_directly(self, task: TaskIdentity, batches: Iterator[pa.RecordBatch]) -> int:
        raise NotImplementedError

    def open_resource(self) -> InMemoryResource:
        self.opened += 1
        return self.resource


def direct_pieces(sink_id: str, batch_id: int, run: str | None) -> list[PreparedPiece]:
    """What at-least-once tasks send the driver: rows written, nothing prepared."""
    return [
        PreparedPiece(sink_id, batch_id, partition, attempt_string(0, run), 10, {}, QUERY_ID)
        for partition in range(2)
    ]


def new_run() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def sink_id() -> str:
    """Unique per test: the writer remembers recovered (sink, run) pairs per process."""
    return f"s{uuid.uuid4().hex[:12]}"


def exactly_once_left(
    resource: InMemoryResource, sink_id: str, batch_id: int, query_id: str = QUERY_ID
) -> tuple[tuple[PreparedPiece, ...], PreparedPiece]:
    """An exactly-once run decided ``batch_id`` (two pieces still prepared) and left a
    stray prepared piece of the same batch (a failed attempt), then stopped."""
    run = attempt_string(0, EXACTLY_ONCE_RUN)
    decided = tuple(
        replace(resource.prepare(sink_id, batch_id, p, attempt=run), query_id=query_id)
        for p in range(2)
    )
    resource.record_decision(BatchDecision(sink_id, batch_id, decided))
    stray = resource.prepare(sink_id, batch_id, 0, attempt=attempt_string(1, EXACTLY_ONCE_RUN))
    return decided, stray


def test_the_first_commit_of_a_run_finishes_the_decided_batch_and_rolls_back_strays(
    sink_id: str,
) -> None:
    resource = InMemoryResource()
    decided, stray = exactly_once_left(resource, sink_id, 3)
    later = resource.prepare(sink_id, 9, 0)  # a later batch's: not this commit's business
    writer = Writer(resource)

    writer.commit(direct_pieces(sink_id, 3, new_run()), 3)

    assert sorted(resource.committed) == sorted(piece.transaction_id for piece in decided)
    assert resource.rolled_back == [stray.transaction_id]
    assert resource.status(sink_id, 3) == DONE
    assert set(resource.prepared) == {later.transaction_id}


def test_recovery_runs_once_per_run_and_again_for_a_restart_in_the_same_process(
    sink_id: str,
) -> None:
    resource = InMemoryResource()
    writer = Writer(resource)
    run = new_run()
    writer.commit(direct_pieces(sink_id, 3, run), 3)
    writer.commit(direct_pieces(sink_id, 4, run), 4)
    writer.commit([None, *direct_pieces(sink_id, 5, run)], 5)
    assert writer.opened == 1

    exactly_once_left(resource, sink_id, 6)  # an exactly-once run in between, then a restart
    writer.commit(direct_pieces(sink_id, 6, new_run()), 6)

    assert writer.opened == 2
    assert resource.status(sink_id, 6) == DONE and resource.prepared == {}


def test_pieces_without_a_run_recover_at_every_commit_and_no_piece_opens_nothing(
    sink_id: str,
) -> None:
    writer = Writer(InMemoryResource())
    writer.commit(direct_pieces(sink_id, 1, None), 1)
    writer.commit(direct_pieces(sink_id, 2, None), 2)
    writer.commit([None, None], 3)
    assert writer.opened == 2


def test_a_lost_decided_piece_is_marked_done_with_a_warning_since_the_replay_rewrote_it(
    sink_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark replays the undecided batch N; at-least-once tasks wrote each of its rows
    before this commit, so the lost piece's rows are there. Exactly-once runs after it
    must not fail forever on a piece no one can bring back."""
    resource = InMemoryResource()
    (lost, kept), _ = exactly_once_left(resource, sink_id, 3)
    resource.rollback_piece(lost)  # the broker timed it out, or someone rolled it back
    writer = Writer(resource)

    with caplog.at_level(logging.WARNING):
        writer.commit(direct_pieces(sink_id, 3, new_run()), 3)

    assert resource.committed == [kept.transaction_id]
    assert resource.status(sink_id, 3) == DONE
    assert resource.unfinished_decisions(sink_id) == []
    assert any(
        f"batch 3 of sink {sink_id} was decided" in record.getMessage()
        and lost.transaction_id in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.parametrize(("decided_batch", "committing"), [(0, 0), (5, 3)])
def test_a_lost_piece_of_batch_0_or_of_a_later_batch_still_fails_and_is_retried(
    sink_id: str, decided_batch: int, committing: int
) -> None:
    """Batch 0's replay may start at a fresh initialOffset(), and a later batch was not
    replayed by this run: no argument that the rows are there, so the error stands."""
    resource = InMemoryResource()
    (lost, _), _ = exactly_once_left(resource, sink_id, decided_batch)
    resource.rollback_piece(lost)
    writer = Writer(resource)
    run = new_run()

    with pytest.raises(DecidedPieceLostError):
        writer.commit(direct_pieces(sink_id, committing, run), committing)
    with pytest.raises(DecidedPieceLostError):  # not remembered as recovered
        writer.commit(direct_pieces(sink_id, committing, run), committing)
    assert resource.status(sink_id, decided_batch) == "decided"


def test_abort_in_at_least_once_mode_touches_nothing(sink_id: str) -> None:
    resource = InMemoryResource()
    exactly_once_left(resource, sink_id, 2)
    writer = Writer(resource)

    writer.abort(direct_pieces(sink_id, 2, new_run()), 2)

    assert writer.opened == 0 and resource.committed == [] and resource.rolled_back == []


def test_a_task_recovering_before_its_write_leaves_a_lost_piece_to_the_driver(
    sink_id: str,
) -> None:
    """2pc-jdbc's at-least-once tasks recover before writing (the leftovers' row locks):
    their rows are not written yet, so a decision with a lost piece stays decided (its
    other piece committed, a stray of the batch rolled back) until the driver's commit,
    after the tasks wrote, marks it done."""
    resource = InMemoryResource()
    (lost, kept), stray = exactly_once_left(resource, sink_id, 3)
    resource.rollback_piece(lost)

    recover_at_least_once(resource, "test sink", sink_id, 3, mark_lost=False)

    assert resource.committed == [kept.transaction_id]
    assert stray.transaction_id in resource.rolled_back and resource.prepared == {}
    assert resource.status(sink_id, 3) == "decided"

    Writer(resource).commit(direct_pieces(sink_id, 3, new_run()), 3)
    assert resource.status(sink_id, 3) == DONE


def test_a_lost_piece_of_another_querys_decision_is_never_marked_done(sink_id: str) -> None:
    """Two queries share the sinkId: this at-least-once run never replayed the other
    query's input, so the other's lost rows stay a loud loss (issue 25 review)."""
    resource = InMemoryResource()
    (lost, _), _ = exactly_once_left(resource, sink_id, 3, query_id="another-query")
    resource.rollback_piece(lost)

    with pytest.raises(DecidedPieceLostError):
        Writer(resource).commit(direct_pieces(sink_id, 3, new_run()), 3)
    assert resource.status(sink_id, 3) == "decided"
