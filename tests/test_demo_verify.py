"""The demo's verdict logic: each kind of failure is counted, a clean run passes."""

from __future__ import annotations

from eospack.demo.verify import check_pipeline, count_decreases, verification_table

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
