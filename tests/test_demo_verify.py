"""The demo's verdict logic: each kind of failure is counted, a clean run passes; a
2pc-kafka output topic's records become the same current counts and history."""

from __future__ import annotations

import json

import pytest

from eospack.lab.demo.verify import (
    PrintedCounts,
    check_pipeline,
    count_decreases,
    verification_table,
)

PRODUCED = {"a": 3, "b": 2}
CLEAN_HISTORY = [("a", 1, 1, 0), ("a", 3, 2, 4), ("b", 2, 1, 4)]


def test_a_clean_pipeline_is_verified():
    result = check_pipeline("count_1", 2, PRODUCED, {"a": 3, "b": 2}, CLEAN_HISTORY, 0, 0)
    assert result.verified
    assert (result.counted, result.lost, result.duplicated, result.history_regressions) == (
        5,
        0,
        0,
        0,
    )


def test_lost_and_doubled_counts_are_reported_per_key():
    result = check_pipeline("p", 0, PRODUCED, {"a": 2, "b": 4}, CLEAN_HISTORY, 0, 0)
    assert (result.lost, result.duplicated, result.verified) == (1, 2, False)


def test_a_history_row_printed_twice_is_a_duplicate():
    history = [*CLEAN_HISTORY, ("a", 3, 2, 4)]
    result = check_pipeline("p", 0, PRODUCED, {"a": 3, "b": 2}, history, 0, 0)
    assert (result.duplicated, result.verified) == (1, False)


def test_a_count_going_backwards_is_a_regression():
    history = [("a", 3, 1, 0), ("a", 2, 2, 1), ("b", 2, 1, 0)]
    result = check_pipeline("p", 0, PRODUCED, {"a": 3, "b": 2}, history, 1, 0)
    assert result.history_regressions == 2


def test_regressions_follow_the_micro_batch_that_printed_them():
    history = [("a", 3, 2, 1), ("a", 2, 3, 5), ("b", 2, 1, 0)]
    result = check_pipeline("p", 0, PRODUCED, {"a": 3, "b": 2}, history, 0, 0)
    assert result.history_regressions == 1


def test_leftovers_fail_the_verdict():
    assert not check_pipeline("p", 0, PRODUCED, {"a": 3, "b": 2}, CLEAN_HISTORY, 0, 1).verified


def test_count_decreases_between_samples():
    assert count_decreases({"a": 3, "b": 1}, {"a": 2, "b": 5, "c": 1}) == 1


def test_verification_table_lists_every_check():
    result = check_pipeline("count_1", 2, PRODUCED, {"a": 3, "b": 2}, CLEAN_HISTORY, 0, 0)
    table = verification_table(5, [result])
    for label in ("produced", "counted", "lost", "duplicated", "history regressions", "verified"):
        assert label in table
    assert table.splitlines()[-1].split()[-1] == "yes"


def printed(count: int, version: int) -> bytes:
    """A 2pc-kafka record value as the demo pipeline prints it."""
    return json.dumps({"count": count, "version": version}).encode()


def test_printed_counts_keep_the_last_count_per_key_and_every_record_with_its_offset():
    counts = PrintedCounts()
    for key, count, version, offset in [("a", 1, 1, 0), ("b", 2, 1, 1), ("a", 3, 2, 2)]:
        assert not counts.add(key.encode(), printed(count, version), offset)
    assert counts.current == {"a": 3, "b": 2}
    assert counts.counted == 5
    assert counts.history == [("a", 1, 1, 0), ("b", 2, 1, 1), ("a", 3, 2, 2)]
    result = check_pipeline("p", 0, PRODUCED, counts.current, counts.history, 0, 0)
    assert result.verified


def test_printed_counts_count_a_count_going_down_in_offset_order():
    counts = PrintedCounts()
    counts.add(b"a", printed(3, 2), 4)
    assert counts.add(b"a", printed(2, 3), 7)
    assert (counts.regressions, counts.current) == (1, {"a": 2})
    result = check_pipeline("p", 0, {"a": 2}, counts.current, counts.history, 0, 0)
    assert result.history_regressions == 1


def test_a_record_printed_again_by_an_at_least_once_replay_is_a_duplicate():
    counts = PrintedCounts()
    for offset, (count, version) in enumerate([(1, 1), (3, 2), (3, 2)]):
        counts.add(b"a", printed(count, version), offset)
    counts.add(b"b", printed(2, 1), 0)
    assert counts.regressions == 0 and counts.current == {"a": 3, "b": 2}
    result = check_pipeline("p", 1, PRODUCED, counts.current, counts.history, 0, 0)
    assert (result.lost, result.duplicated, result.verified) == (0, 1, False)


@pytest.mark.parametrize(
    ("key", "value"), [(None, b'{"count": 1, "version": 1}'), (b"a", b"nope"), (b"a", b"{}")]
)
def test_a_record_that_is_not_a_printed_count_is_refused_with_its_offset(key, value):
    with pytest.raises(ValueError, match="offset 9"):
        PrintedCounts().add(key, value, 9)
