"""The contract every two-phase-commit sink must pass, run against each sink's adapter.

Each case ends the same way (``ContractRun.assert_each_row_once``): each input row exactly
once for readers, nothing prepared, staged, in progress or open left by any sink id the
runs used, every decision done. Adding a sink means writing its adapter
(``sink_contract/adapters.py``); these cases then say what it lacks. A case that cannot
apply to a sink skips with the adapter's reason; a known hole is a strict xfail on the
sink's parameter.

Lanes. Default (CI): one SIGKILL per sink, in a ``local[2,3]`` driver whose task dies in
an earlier batch and is retried; the decision write failing before it applies and losing
its answer, and a piece commit losing its answer (Spark's abort after a partial commit);
a speculative duplicate; a batch slower than the sink's timeout; a restart with each
option change in turn (the same target addressed another way, the protocol switched
both ways), chained in one query; the delivery guarantee switched
both ways after a decided batch (the at-least-once replay of that batch may write it
again, as the manual says; nothing else may double); every documented option at once; a
sink sharing its ledger or prefix with another that is stuck mid-decision.
Chaos: a SIGKILL at every crash point, every resource call failing before and after it
applies, each option change alone (also the options that may differ), each documented
option alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eospack.core import faults
from integration_tests.sink_contract.adapters import (
    ADAPTERS,
    AT_LEAST_ONCE,
    EXACTLY_ONCE,
    BoundSink,
    DocumentedOption,
    OptionChange,
    Options,
    sink_params,
)
from integration_tests.sink_contract.harness import ContractRun

pytestmark = pytest.mark.integration


@pytest.fixture
def sink(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> Iterator[BoundSink]:
    bound = ADAPTERS[request.param].open(request, tmp_path, unique_name)
    yield bound
    bound.close()


def contract(case: str) -> Any:
    """Parametrize ``sink`` over every adapter, with the adapter's mark for ``case``."""
    return pytest.mark.parametrize("sink", sink_params(case), indirect=True)


def fired(fault_directory: Path) -> list[tuple[object, object, object]]:
    return [(f["call"], f["mode"], f["seen_batch"]) for f in faults.injected(fault_directory)]


# SIGKILLs ------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@contract("test_killed_at_a_crash_point_after_a_task_retry_then_restarted_writes_each_row_once")
def test_killed_at_a_crash_point_after_a_task_retry_then_restarted_writes_each_row_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """One driver under ``local[2,3]``: in batch 0 a task's Python worker dies right after
    its last call (prepared, never reported) and Spark retries the task; in batch 1 the
    driver is SIGKILLed at the sink's default crash point. The restart finishes or fences
    both, and writes each row once."""
    run = ContractRun(sink)
    run.add_batches(3)
    prepare = sink.adapter.calls.prepare
    if prepare is not None:
        faults.arm(call_faults, prepare, "crash", batch_id=0)
    point = sink.adapter.default_crash_point

    killed = run.run_driver(f"{point}@1", master="local[2,3]", fault_directory=call_faults)

    assert killed.was_killed, f"{point} was not reached:\n{killed.explain()}"
    if prepare is not None:
        assert fired(call_faults) == [(prepare, "crash", 0)], killed.explain()
    run.assert_nothing_doubled()
    run.run_here()
    run.assert_each_row_once()


@pytest.mark.chaos
@pytest.mark.timeout(1200)
@contract("test_killed_at_every_crash_point_then_restarted_writes_each_row_once")
def test_killed_at_every_crash_point_then_restarted_writes_each_row_once(sink: BoundSink) -> None:
    """Driver run k is SIGKILLed at crash point k in batch k; then a clean restart."""
    run = ContractRun(sink)
    points = sink.adapter.crash_points
    run.add_batches(len(points) + 1)
    for batch, point in enumerate(points):
        killed = run.run_driver(f"{point}@{batch}")
        assert killed.was_killed, f"{point} was not reached:\n{killed.explain()}"
        run.assert_nothing_doubled()
    run.run_here()
    run.assert_each_row_once()


# Call faults ---------------------------------------------------------------------------


def run_through_call_faults(
    run: ContractRun,
    call_faults: Path,
    plan: list[tuple[str, faults.Mode]],
    per_batch: bool = True,
) -> list[tuple[str, str]]:
    """Fault ``plan[k]`` in batch k, one run per batch; return the faults never reached
    (a call a batch did not make). A fired fault fails the run, or the sink's client
    retries the call; the restart goes on. ``per_batch=False`` arms each fault for
    whichever batch first makes the call (S3 listings name no batch)."""
    not_reached: list[tuple[str, str]] = []
    for batch, (call, mode) in enumerate(plan):
        run.add_batches(1)
        faults.arm(call_faults, call, mode, batch_id=batch if per_batch else None)
        error = run.run_through_fault()
        seen = [(c, m, b if per_batch else batch) for c, m, b in fired(call_faults)]
        if (call, mode, batch) not in seen:
            assert error is None, f"{call} {mode} was not reached, and the run failed: {error}"
            for armed in call_faults.glob("*.fault"):
                armed.unlink()
            not_reached.append((call, mode))
        run.assert_nothing_doubled()
    run.add_batches(1)
    run.run_here()
    return not_reached


@pytest.mark.timeout(600)
@pytest.mark.compat
@contract("test_a_decision_write_failing_or_losing_its_answer_and_a_lost_commit_answer_each_once")
def test_a_decision_write_failing_or_losing_its_answer_and_a_lost_commit_answer_each_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """Batch 0's decision write fails before it applies (Spark's abort fences the batch),
    batch 1's applies and its answer is lost (recognised as the sink's own), batch 2's
    first piece commit applies and its answer is lost (Spark's abort after a partial
    commit must roll forward). Each run fails (or the sink's client retries the call: S3's
    botocore); the restarts write each row once."""
    calls = sink.adapter.calls
    plan: list[tuple[str, faults.Mode]] = [(calls.decide, "before"), (calls.decide, "after")]
    if calls.commit_piece is not None:
        plan.append((calls.commit_piece, "after"))
    run = ContractRun(sink)
    assert run_through_call_faults(run, call_faults, plan) == []
    run.assert_each_row_once()


@pytest.mark.chaos
@pytest.mark.timeout(1800)
@contract("test_every_resource_call_failing_before_or_after_it_applies_then_each_row_once")
def test_every_resource_call_failing_before_or_after_it_applies_then_each_row_once(
    sink: BoundSink, call_faults: Path
) -> None:
    plan: list[tuple[str, faults.Mode]] = [
        (call, mode) for call in sink.adapter.calls.every for mode in ("before", "after")
    ]
    run = ContractRun(sink)
    not_reached = run_through_call_faults(run, call_faults, plan, per_batch=False)
    print(f"{sink.adapter.name}: faults never reached: {not_reached}")
    decide = sink.adapter.calls.decide
    assert (decide, "before") not in not_reached and (decide, "after") not in not_reached
    run.assert_each_row_once()


# Retries, duplicates, slow batches -----------------------------------------------------


@pytest.mark.timeout(300)
@contract("test_a_speculative_duplicate_that_prepared_leaves_no_row_twice_and_nothing_behind")
def test_a_speculative_duplicate_that_prepared_leaves_no_row_twice_and_nothing_behind(
    sink: BoundSink,
) -> None:
    """A second attempt of batch 1's partition 0 prepared the same rows and Spark never
    took its message (a speculative copy that lost the race, killed after it prepared):
    no decision names it, and the batch's commit must leave it neither visible nor
    behind. (A speculative copy proper needs two hosts: ``test_cluster.py``.)"""
    run = ContractRun(sink)
    run.add_batches(1)
    run.run_here()
    run.add_batches(1)
    (sink_id,) = run.sink_ids
    run.prepare_piece_by_hand(sink_id, 1, 0, run.batches[1][::2])
    run.run_here()
    run.assert_each_row_once()


@pytest.mark.timeout(300)
@contract("test_a_batch_slower_than_the_sinks_timeout_replays_instead_of_wedging")
def test_a_batch_slower_than_the_sinks_timeout_replays_instead_of_wedging(
    sink: BoundSink, call_faults: Path
) -> None:
    """Batch 1's decision waits past the sink's timeout on prepared work: pieces that
    died meanwhile must fail the batch undecided (it replays), never be decided."""
    if sink.adapter.timeout_not_applicable:
        pytest.skip(sink.adapter.timeout_not_applicable)
    options, stall_seconds = sink.slow_batch()
    run = ContractRun(sink, options)
    run.add_batches(3)
    faults.arm(call_faults, sink.adapter.calls.decide, "slow", 1, stall_seconds)
    run.run_through_fault()
    run.assert_nothing_doubled()
    run.run_here()
    run.assert_each_row_once()


# Option changes across a restart -------------------------------------------------------


def restart_with_changes(run: ContractRun, call_faults: Path, changes: list[OptionChange]) -> None:
    """Run k replays batch k-1 (its decision applied, its answer lost: Spark did not record
    it) with change k applied, and loses the answer of batch k's decision in turn. The
    replay must be recognised, whatever the change (or refused in one line naming the
    option, where the change allows it, and then the previous options finish it)."""
    run.add_batches(1)
    run.run_here()
    for batch, change in enumerate(changes, start=1):
        run.add_batches(1)
        faults.arm(call_faults, run.sink.adapter.calls.decide, "after", batch_id=batch)
        before = dict(run.options)
        changed = change.change(run.sink, before)
        try:
            run.run_here(changed)
        except Exception as error:
            message = str(error)
            refused = change.refusal_allowed is not None and change.refusal_allowed in message
            if not refused and (run.sink.adapter.calls.decide, "after", batch) not in fired(
                call_faults
            ):
                raise AssertionError(
                    f"{change.name}: the restart failed: {message[:2000]}"
                ) from error
            if refused:
                run.run_through_fault(before)
        run.assert_nothing_doubled()
        for armed in call_faults.glob("*.fault"):  # at-least-once makes no decision
            armed.unlink()
    run.add_batches(1)
    run.run_here()


@pytest.mark.timeout(600)
@contract("test_a_restart_with_the_delivery_guarantee_switched_both_ways_finishes_what_was_decided")
def test_a_restart_with_the_delivery_guarantee_switched_both_ways_finishes_what_was_decided(
    sink: BoundSink, call_faults: Path
) -> None:
    """Batch 1 is decided and left unfinished: its piece commits fail before they apply,
    and so does the roll-forward of Spark's abort (an atomic protocol: applied, its
    answer lost). The restart runs at-least-once: it must finish the decided batch (or
    refuse in one line naming deliveryGuarantee, the exactly-once restart then finishing
    it); its replay of batch 1 may write batch 1 again (the manual: at-least-once), nothing
    else. At-least-once then runs a batch of its own, once; switched back, exactly-once
    runs, applies its rows once and leaves nothing prepared, open or undecided."""
    run = ContractRun(sink)
    run.add_batches(1)
    run.run_here()
    exactly_once = dict(run.options)
    at_least_once = {**exactly_once, "deliveryGuarantee": AT_LEAST_ONCE}
    calls = sink.adapter.calls
    run.add_batches(1)
    if calls.commit_piece is not None:
        # enough for every retry of the commit and of the abort's roll-forward
        faults.arm(call_faults, calls.commit_piece, "before", batch_id=1, times=12)
    else:
        faults.arm(call_faults, calls.decide, "after", batch_id=1)
    run.run_through_fault()
    for armed in call_faults.glob("*.fault"):
        armed.unlink()
    replayed = Counter(run.batches[1])

    try:
        run.run_here(at_least_once)
    except Exception as error:
        assert "deliveryGuarantee" in str(error), str(error)[:3000]
        run.run_here(exactly_once)
    assert sink.leftovers(run.sink_ids, run.options) == [], "the decided batch left open"
    run.assert_nothing_doubled(at_least_once=replayed)
    run.add_batches(1)
    run.run_here(at_least_once)
    run.assert_nothing_doubled(at_least_once=replayed)
    run.add_batches(1)
    run.run_here(exactly_once)
    run.assert_each_row_once(at_least_once=replayed)


def change_params() -> list[Any]:
    return [
        pytest.param(
            name,
            change.name,
            marks=[change.mark] if change.mark else [],
            id=f"{name}-{change.name}",
        )
        for name, adapter in ADAPTERS.items()
        for change in adapter.option_changes
    ]


@pytest.mark.timeout(900)
@contract("test_a_restart_with_each_option_changed_in_turn_keeps_each_row_once")
def test_a_restart_with_each_option_changed_in_turn_keeps_each_row_once(
    sink: BoundSink, call_faults: Path
) -> None:
    """The adapter's changes in turn, one restart each, on one checkpoint: the same
    target addressed another way, the protocol switched and switched back (the
    guarantee: the next case; options that may differ: each alone in the chaos lane)."""
    run = ContractRun(sink)
    changes = [change for change in sink.adapter.option_changes if not change.chaos_only]
    restart_with_changes(run, call_faults, changes)
    run.assert_each_row_once()


@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("sink", "change_name"), change_params(), indirect=["sink"])
def test_a_restart_with_one_option_changed_keeps_each_row_once(
    sink: BoundSink, call_faults: Path, change_name: str
) -> None:
    changes = {change.name: change for change in sink.adapter.option_changes}
    chain = [changes[change_name]]
    while chain[0].follows is not None:
        chain.insert(0, changes[chain[0].follows])
    run = ContractRun(sink)
    restart_with_changes(run, call_faults, chain)
    run.assert_each_row_once()


# Documented options --------------------------------------------------------------------


def option_values(sink: BoundSink, documented: list[DocumentedOption]) -> Options:
    values: Options = {}
    for option in documented:
        values.update(option.extra)
        values[option.name] = option.sample(sink) if callable(option.sample) else option.sample
    return values


@pytest.mark.timeout(300)
@contract("test_every_documented_option_at_once_through_a_real_query")
def test_every_documented_option_at_once_through_a_real_query(sink: BoundSink) -> None:
    """Each option of the sink's docs page table with a valid value, in one query of two
    batches: none may fail the query, wedge it or leave anything behind."""
    values = option_values(sink, list(sink.adapter.documented_options))
    values["sinkId"] = f"documented_{sink.name[-8:]}"
    run = ContractRun(sink, values)
    run.add_batches(2)
    run.run_here()
    run.assert_each_row_once()


def documented_params() -> list[Any]:
    return [
        pytest.param(
            name,
            option.name,
            marks=[option.mark] if option.mark else [],
            id=f"{name}-{option.name}",
        )
        for name, adapter in ADAPTERS.items()
        for option in adapter.documented_options
    ]


@pytest.mark.chaos
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("sink", "option_name"), documented_params(), indirect=["sink"])
def test_each_documented_option_alone_through_a_real_query(
    sink: BoundSink, option_name: str
) -> None:
    (option,) = [o for o in sink.adapter.documented_options if o.name == option_name]
    values = option_values(sink, [option])
    if option.name == "sinkId":
        values["sinkId"] = f"documented_{sink.name[-8:]}"
    run = ContractRun(sink, values)
    run.add_batches(2)
    run.run_here()
    run.assert_each_row_once()


# A shared ledger or prefix -------------------------------------------------------------


@pytest.mark.timeout(300)
@contract("test_a_sink_sharing_its_ledger_with_another_that_crashed_mid_decision_finds_its_own")
def test_a_sink_sharing_its_ledger_with_another_that_crashed_mid_decision_finds_its_own(
    sink: BoundSink, call_faults: Path
) -> None:
    """Another sink of the same target, ledger and prefix crashed with a piece prepared
    and its decision write open. This sink's batch 1, decided and half committed when the
    driver's Python worker died, must still be found as its own by Spark's abort and the
    restart (never applied twice), and the other sink's prepared piece must be neither
    committed nor needed for this sink's end state."""
    run = ContractRun(sink)
    run.add_batches(1)
    run.run_here()
    other_id = f"other_{sink.name[-8:]}"
    other_rows = [(1_000_000 + i, f"g{i % 2}") for i in range(5)]
    writer, other_piece = run.prepare_piece_by_hand(other_id, 0, 0, other_rows)
    try:
        with sink.another_sink_mid_decision(run.options):
            run.add_batches(2)
            # decided, a piece committed (atomic protocols: the decision applied), then
            # the driver's Python worker dies: what it kept of the ledger dies with it, so
            # Spark's abort and the restart must find the decision by reading the ledger
            call = sink.adapter.calls.commit_piece or sink.adapter.calls.decide
            faults.arm(call_faults, call, "crash", batch_id=1)
            run.run_through_fault()
            assert (call, "crash", 1) in fired(call_faults)
            run.run_here()
        assert sink.leftovers({other_id}, run.options), "the other sink's piece was touched"
    finally:
        # before reading: an open transaction of the other sink on the output topic
        # holds back every read_committed reader (2pc-kafka's documented cost)
        run.roll_back_by_hand(writer, other_piece)
    assert sink.leftovers({other_id}, run.options) == []
    run.assert_each_row_once()


def test_every_adapter_declares_what_the_cases_rely_on() -> None:
    """Pure check of the adapters (no service): crash point, option changes, options."""
    for adapter in ADAPTERS.values():
        assert adapter.default_crash_point in adapter.crash_points, adapter.name
        changes = {change.name: change for change in adapter.option_changes}
        assert changes, adapter.name
        assert all(c.follows in changes for c in changes.values() if c.follows), adapter.name
        documented = {option.name: option.sample for option in adapter.documented_options}
        assert documented.get("deliveryGuarantee") == EXACTLY_ONCE, adapter.name


def test_every_registered_sink_has_a_contract_adapter() -> None:
    """Pure check (no service): a sink in ``eospack.tools.formats`` without an adapter would never
    meet the contract's cases."""
    from eospack.tools.formats import sinks

    adapted = {adapter.sink_format for adapter in ADAPTERS.values()}
    assert adapted == {entry.name for entry in sinks()}
