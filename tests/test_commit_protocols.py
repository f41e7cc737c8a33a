"""The coordinator's order and recovery rules, against an in-memory resource (pure logic)."""

from __future__ import annotations

import pytest

from eospack.commit_protocols import (
    BatchDecision,
    CommitProtocolError,
    DecidedPieceLostError,
    PreparedPiece,
    TwoPhaseCommitCoordinator,
    derive_sink_id,
    parse_transaction_id,
    stale_pieces,
    transaction_id,
    validate_sink_id,
)
from eospack.commit_protocols.identity import (
    Attempt,
    SinkIdentityError,
    TaskIdentity,
    attempt_string,
    parse_attempt,
)
from eospack.commit_protocols.pieces import ABORTED, DECIDED, DONE
from eospack.core.fault_points import _parse
from tests.in_memory_resource import InMemoryResource


@pytest.fixture(params=[False, True], ids=["piece-by-piece", "atomic"])
def resource(request) -> InMemoryResource:
    return InMemoryResource(atomic=request.param)


def test_commit_applies_every_piece_once_and_records_a_done_decision(resource):
    pieces = [resource.prepare("s1", 0, p) for p in range(3)]

    decision = TwoPhaseCommitCoordinator(resource).commit([*pieces, None], 0)

    assert decision is not None and decision.rows == 30
    assert sorted(resource.committed) == sorted(p.transaction_id for p in pieces)
    assert resource.prepared == {}
    assert resource.status("s1", 0) == DONE


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


def test_orphans_are_rolled_back_before_the_decision_because_they_may_hold_its_locks(
    resource,
):
    """A crashed run's prepared pieces (of this batch or an earlier one) can hold row locks
    the commit needs: staging's move into the table waited on them until lockTimeout, at
    every restart. They are rolled back before the decision; the batch's own are kept."""
    resource.orphans_can_block_commit = True
    earlier = resource.prepare("s1", 2, 1, attempt="0xcrashedrunx1")
    same_batch = resource.prepare("s1", 3, 1, attempt="0xcrashedrunx2")
    current = [resource.prepare("s1", 3, p, attempt="0xthisrunx3") for p in range(2)]

    TwoPhaseCommitCoordinator(resource).commit(current, 3)

    decided_at = resource.order.index("record_decision")
    assert resource.order[:decided_at].count("rollback_piece") == 2
    assert set(resource.rolled_back) == {earlier.transaction_id, same_batch.transaction_id}
    assert sorted(resource.committed) == sorted(p.transaction_id for p in current)
    assert resource.status("s1", 3) == DONE


def test_abort_rolls_back_what_the_tasks_prepared(resource):
    pieces = [resource.prepare("s1", 1, p) for p in range(2)]

    TwoPhaseCommitCoordinator(resource).abort([pieces[0], None, pieces[1]], 1)

    assert resource.prepared == {} and resource.committed == []
    assert resource.status("s1", 1) == ABORTED


def test_pieces_of_two_sinks_in_one_batch_are_refused(resource):
    pieces = [resource.prepare("s1", 0, 0), resource.prepare("s2", 0, 1)]
    with pytest.raises(CommitProtocolError, match="pieces of several sinks"):
        TwoPhaseCommitCoordinator(resource).commit(pieces, 0)
    assert resource.committed == []


def test_a_batch_without_pieces_commits_nothing(resource):
    assert TwoPhaseCommitCoordinator(resource).commit([None], 0) is None
    assert resource.slots == {}


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


def test_the_sinks_common_options_parse_alike_and_fail_in_the_sinks_error():
    from eospack.commit_protocols.sink_options import parse_sink_common_options
    from eospack.core.options import OptionReader

    class SinkOptionError(ValueError):
        pass

    def parse(**options: str):
        return parse_sink_common_options(OptionReader(options, SinkOptionError))

    assert parse() == parse(deliveryGuarantee=" Exactly-Once ")
    with pytest.raises(SinkOptionError, match="^Option sinkId is blank: leave it unset or use"):
        parse(sinkId=" ")  # a blank identity is refused, never taken for "derived"
    parsed = parse(DELIVERYGUARANTEE="AT-LEAST-ONCE", sinkid=" my_sink ")
    assert (parsed.exactly_once, parsed.sink_id) == (False, "my_sink")
    with pytest.raises(SinkOptionError, match="^Option deliveryGuarantee is 'twice': use"):
        parse(deliveryGuarantee="twice")
    with pytest.raises(SinkOptionError, match="^Option sinkId is 'a-b': use 1 to 64"):
        parse(sinkId="a-b")


def test_fault_point_names_are_checked():
    assert _parse("after_decision@3") == ("after_decision", 3)
    assert _parse("after_commit") == ("after_commit", None)
    assert _parse(None) is None
    with pytest.raises(ValueError, match="names no fault point"):
        _parse("after_lunch")


def spark_commit(coordinator: TwoPhaseCommitCoordinator, messages, batch_id: int) -> None:
    """What Spark 4.3 does: commit, and abort with the same messages when commit raises."""
    try:
        coordinator.commit(messages, batch_id)
    except Exception:
        coordinator.abort(messages, batch_id)
        raise


def test_abort_of_a_decided_batch_rolls_it_forward_instead_of_back():
    resource = InMemoryResource()
    pieces = [resource.prepare("s1", 5, p) for p in range(3)]
    resource.fail("commit_piece", nth=2)  # the connection drops between two commits

    with pytest.raises(ConnectionError):
        spark_commit(TwoPhaseCommitCoordinator(resource), pieces, 5)

    assert sorted(resource.committed) == sorted(p.transaction_id for p in pieces)
    assert resource.rolled_back == [] and resource.prepared == {}
    assert resource.status("s1", 5) == DONE


@pytest.mark.parametrize("atomic", [False, True], ids=["piece-by-piece", "atomic"])
def test_a_decision_whose_answer_was_lost_is_recognised_as_ours(atomic):
    resource = InMemoryResource(atomic=atomic)
    pieces = [resource.prepare("s1", 2, p) for p in range(2)]
    resource.fail("record_decision", mode="after")

    with pytest.raises(ConnectionError):
        spark_commit(TwoPhaseCommitCoordinator(resource), pieces, 2)

    assert sorted(resource.committed) == sorted(p.transaction_id for p in pieces)
    assert resource.rolled_back == []
    assert resource.status("s1", 2) == DONE


def test_an_abort_fence_refuses_a_late_decision_naming_rolled_back_pieces():
    resource = InMemoryResource()
    coordinator = TwoPhaseCommitCoordinator(resource)
    pieces = [resource.prepare("s1", 3, p, attempt="a") for p in range(2)]
    coordinator.abort(pieces, 3)  # the decision write is still in flight somewhere

    with pytest.raises(CommitProtocolError, match="were rolled back by an abort or a recovery"):
        coordinator.commit(pieces, 3)  # ... and lands late
    assert resource.committed == [] and resource.status("s1", 3) == ABORTED

    replay = [resource.prepare("s1", 3, p, attempt="b") for p in range(2)]
    coordinator.commit(replay, 3)
    assert sorted(resource.committed) == sorted(p.transaction_id for p in replay)
    assert resource.status("s1", 3) == DONE


def test_an_abort_that_cannot_reach_the_resource_leaves_the_pieces_and_does_not_raise(caplog):
    resource = InMemoryResource()
    pieces = [resource.prepare("s1", 4, p) for p in range(2)]
    resource.fail("fence")

    TwoPhaseCommitCoordinator(resource, "2pc-test").abort(pieces, 4)

    assert set(resource.prepared) == {p.transaction_id for p in pieces}
    assert "Prepared pieces left: " + pieces[0].transaction_id in caplog.text


def test_recovery_commits_a_listed_piece_that_a_decision_names_instead_of_rolling_it_back():
    resource = InMemoryResource()
    pieces = tuple(resource.prepare("s1", 6, p) for p in range(2))
    resource.record_decision(BatchDecision("s1", 6, pieces))

    TwoPhaseCommitCoordinator(resource).roll_back_orphans("s1", list(pieces))

    assert sorted(resource.committed) == sorted(p.transaction_id for p in pieces)
    assert resource.rolled_back == [] and resource.status("s1", 6) == DONE


def test_a_decided_piece_that_someone_rolled_back_fails_loudly_on_replay():
    resource = InMemoryResource()
    pieces = tuple(resource.prepare("s1", 8, p) for p in range(2))
    resource.record_decision(BatchDecision("s1", 8, pieces))  # crash after the decision
    resource.rollback_piece(pieces[1])  # a DBA's ROLLBACK PREPARED, a lifecycle rule
    replay = [resource.prepare("s1", 8, p, attempt="r") for p in range(2)]

    with pytest.raises(DecidedPieceLostError, match=pieces[1].transaction_id):
        TwoPhaseCommitCoordinator(resource).commit(replay, 8)
    assert resource.status("s1", 8) == DECIDED


def task(batch: int, partition: int, attempt: str, speculation: bool = False) -> TaskIdentity:
    return TaskIdentity("s1", batch, partition, attempt, speculation)


def test_stale_pieces_are_earlier_batches_other_runs_and_failed_attempts():
    run_a, run_b = attempt_string(0, "aaaa-1111"), attempt_string(0, "bbbb-2222")
    retry_b = attempt_string(1, "bbbb-2222")
    listed = {
        "earlier batch": PreparedPiece("s1", 4, 1, run_b, 1),
        "other run": PreparedPiece("s1", 5, 1, run_a, 1),
        "older eospack": PreparedPiece("s1", 5, 0, "0xdeadbeef12", 1),
        "failed attempt": PreparedPiece("s1", 5, 0, run_b, 1),
        "other partition": PreparedPiece("s1", 5, 1, run_b, 1),
        "later batch": PreparedPiece("s1", 6, 0, run_a, 1),
        "other sink": PreparedPiece("s2", 4, 0, run_a, 1),
    }
    stale = stale_pieces(task(5, 0, retry_b), listed.values())
    names = {name for name, piece in listed.items() if piece in stale}
    assert names == {"earlier batch", "other run", "older eospack", "failed attempt"}

    speculative = stale_pieces(task(5, 0, retry_b, speculation=True), listed.values())
    assert listed["failed attempt"] not in speculative


def test_attempt_strings_carry_the_attempt_number_and_the_run():
    attempt = attempt_string(3, "36b9e0c7-2061-4f6c-b363-b010d8a67ecd")
    assert parse_attempt(attempt) == Attempt(3, "36b9e0c72061")
    assert parse_attempt("0xdeadbeef12") == Attempt(0, None)
    assert parse_transaction_id(transaction_id("s1", 2, 1, attempt)) == ("s1", 2, 1, attempt)


def test_a_batch_another_query_committed_under_a_shared_sink_id_is_refused_not_skipped(
    resource: InMemoryResource,
) -> None:
    """Two queries under one sinkId (a restored savepoint keeping it): the second query's
    batch 1 finds the slot the first query decided. It is no replay of its own: taking
    it for one would roll its rows back silently. The commit fails naming sinkId, its
    pieces rolled back, and the other query's decision stays as it was."""
    from dataclasses import replace

    from eospack.commit_protocols.identity import SinkIdentityError

    coordinator = TwoPhaseCommitCoordinator(resource)
    first = replace(resource.prepare("shared", 1, 0, "0xaaaax1"), query_id="first")
    coordinator.commit([first], 1)
    second = replace(resource.prepare("shared", 1, 0, "0xbbbbx1"), query_id="second")

    with pytest.raises(SinkIdentityError, match="two queries share sinkId 'shared'"):
        spark_commit(coordinator, [second], 1)

    assert second.transaction_id in resource.rolled_back
    assert resource.slots[("shared", 1)].pieces == (first,)
    assert resource.status("shared", 1) == DONE


def test_a_replay_of_the_same_query_is_still_skipped_quietly(resource: InMemoryResource) -> None:
    from dataclasses import replace

    coordinator = TwoPhaseCommitCoordinator(resource)
    first = replace(resource.prepare("sink", 1, 0, "0xaaaax1"), query_id="q")
    coordinator.commit([first], 1)
    replay = replace(resource.prepare("sink", 1, 0, "0xbbbbx1"), query_id="q")

    assert coordinator.commit([replay], 1) is None
    assert replay.transaction_id in resource.rolled_back


def test_waiting_pieces_and_fences_are_recorded_as_recovery_leaves_them(monkeypatch, tmp_path):
    """The gauge counts the pieces left after a commit's recovery (a later batch's), the
    counter the batch slots fenced (the orphan's batch, then an aborted batch)."""
    from eospack.core import metrics

    monkeypatch.setenv(metrics.METRICS_DIR_VARIABLE, str(tmp_path))
    recorder = metrics.Recorder()
    monkeypatch.setattr("eospack.commit_protocols.coordinator.RECORDER", recorder)
    resource = InMemoryResource()
    resource.prepare("s1", 2, 0, attempt="crashed")
    resource.prepare("s1", 9, 0)
    coordinator = TwoPhaseCommitCoordinator(resource, "2pc-test")
    labels = (("sink", "2pc-test"), ("sink_id", "s1"))

    coordinator.commit([resource.prepare("s1", 3, 0)], 3)

    assert recorder.snapshot.gauges[("eospack_sink_pieces_waiting", labels)][0] == 1
    assert recorder.snapshot.counters[("eospack_sink_fenced_batches_total", labels)] == 1
    rolled_back = ("eospack_sink_recovery_rolled_back_pieces_total", labels)
    assert recorder.snapshot.counters[rolled_back] == 1

    coordinator.abort([resource.prepare("s1", 10, 0)], 10)

    assert recorder.snapshot.gauges[("eospack_sink_pieces_waiting", labels)][0] == 0
    assert recorder.snapshot.counters[("eospack_sink_fenced_batches_total", labels)] == 3


def test_each_commit_logs_one_json_line_with_what_it_did(caplog):
    """``eospack.batches``: one parseable line per commit, the replay's included."""
    import json

    resource = InMemoryResource()
    coordinator = TwoPhaseCommitCoordinator(resource, "2pc-test")
    with caplog.at_level("INFO", logger="eospack.batches"):
        coordinator.commit([resource.prepare("s1", 4, 0), resource.prepare("s1", 4, 1)], 4)
        coordinator.commit([resource.prepare("s1", 4, 0, attempt="replay")], 4)

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "eospack.batches"]
    timings = {"decision_seconds", "commit_seconds"}
    assert [{k: v for k, v in line.items() if k not in timings} for line in lines] == [
        {
            "sink": "2pc-test",
            "sink_id": "s1",
            "batch_id": 4,
            "outcome": "committed",
            "rows": 20,
            "pieces": 2,
            "pieces_waiting": 0,
        },
        {
            "sink": "2pc-test",
            "sink_id": "s1",
            "batch_id": 4,
            "outcome": "replay_rolled_back",
            "rows": 10,
            "pieces": 1,
            "pieces_waiting": 0,
        },
    ]
    assert all(line[key] >= 0 for line in lines for key in timings)
