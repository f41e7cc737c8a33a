"""Sink inspection through the protocol (``TransactionalResource.inspect``), per sink,
against the real services: a batch decided but not committed and its prepared pieces are
reported exactly, inspecting changes nothing, and after the restart nothing is left.

Each case also reads the store directly (the contract adapter's ``leftovers``: PostgreSQL's
``pg_prepared_xacts`` and stage table, S3's ``ListMultipartUploads``, Kafka's
``ListTransactions``): the one cross-check per sink that catches a resource that
under-reports.

Runs in the test's session (no driver process): batch 1's first piece commit fails before
it applies, twice (in Spark's commit and in its abort, which rolls a decided batch
forward), so the query fails with batch 1 decided and every piece still prepared.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eospack.cli import main
from eospack.commit_protocols import sink_prefix
from eospack.commit_protocols.inspection import (
    DECIDED_STATUS,
    DONE_STATUS,
    NOTHING_TO_CLEAN,
    SinkState,
)
from eospack.tools.checkpoint import inspect_sink
from integration_tests.sink_contract.adapters import ADAPTERS, BoundSink
from integration_tests.sink_contract.harness import ContractRun

pytestmark = pytest.mark.integration

INSPECTED = ("jdbc-prepared", "s3", "kafka")


@pytest.fixture(params=INSPECTED)
def sink(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> Iterator[BoundSink]:
    bound = ADAPTERS[request.param].open(request, tmp_path, unique_name)
    yield bound
    bound.close()


def inspect(run: ContractRun) -> SinkState:
    query_id = run.query_id()
    assert query_id is not None
    return inspect_sink(run.sink.adapter.sink_format, query_id, run.options)


def raw_names(sink: BoundSink, run: ContractRun) -> list[str]:
    """What the store itself lists as left behind, by the name each leftover carries."""
    return sorted(line.rsplit(" ", 1)[-1] for line in sink.leftovers(run.sink_ids, run.options))


def named_in(state: SinkState) -> list[str]:
    """The store names (gid, key, transactional id) that ``state``'s leftovers mention."""
    names = []
    for leftover in state.leftovers:
        names.append(leftover.name.split(" (", 1)[0])
    return sorted(names)


@pytest.mark.timeout(420)
def test_inspect_reports_a_decided_batch_and_its_prepared_pieces_changes_nothing_then_clean(
    sink: BoundSink, call_faults: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = ContractRun(sink)
    run.leave_batch_one_decided(call_faults)
    (sink_id,) = run.sink_ids

    crashed = inspect(run)
    assert crashed.format == sink.adapter.sink_format and crashed.sink_id == sink_id
    assert [(d.batch_id, d.status) for d in crashed.decisions] == [
        (0, DONE_STATUS),
        (1, DECIDED_STATUS),
    ]
    assert crashed.decisions[1].rows == len(run.batches[1])
    assert crashed.prepared_pieces, "batch 1's pieces are still prepared"
    assert all(
        piece.startswith(f"{sink_prefix(sink_id)}1-") for piece in crashed.prepared_pieces
    ), crashed.prepared_pieces
    assert crashed.leftovers and crashed.cleanup.startswith("start the query again")
    # The cross-check: the store lists exactly what the resource reports.
    assert named_in(crashed) == raw_names(sink, run)
    decisions_before = sink.decisions(run.sink_ids, run.options)
    assert decisions_before == {(sink_id, 0): "done", (sink_id, 1): "pending"}

    assert inspect(run) == crashed, "a second inspection saw something else"
    assert raw_names(sink, run) == named_in(crashed), "inspection changed the store"
    assert sink.decisions(run.sink_ids, run.options) == decisions_before

    run.run_here()
    recovered = inspect(run)
    assert [(d.batch_id, d.status) for d in recovered.decisions] == [
        (0, DONE_STATUS),
        (1, DONE_STATUS),
    ]
    assert recovered.prepared_pieces == () and recovered.leftovers == ()
    assert recovered.cleanup == NOTHING_TO_CLEAN and recovered.is_clean
    run.assert_each_row_once()

    if sink.adapter.sink_format == "2pc-kafka":
        assert_the_cli_reports_the_kafka_sink(sink, run, recovered, capsys)


def assert_the_cli_reports_the_kafka_sink(
    sink: Any, run: ContractRun, recovered: SinkState, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    arguments = [
        "checkpoint",
        "inspect",
        str(run.checkpoint),
        "--json",
        "--kafka-bootstrap-servers",
        sink.bootstrap,
        "--topic",
        sink.topic,
        "--ledger-topic",
        sink.ledger_topic,
    ]
    assert main(arguments) == 0
    (reported,) = json.loads(capsys.readouterr().out)["sinks"]
    assert reported["kind"] == "2pc-kafka" and reported["sink_id"] == recovered.sink_id
    assert [(row["batch_id"], row["status"]) for row in reported["batches"]] == [
        (0, "done"),
        (1, "done"),
    ]
    assert reported["open_transactions"] == [] and reported["cleanup"] == NOTHING_TO_CLEAN


@pytest.mark.timeout(120)
def test_inspecting_a_kafka_sink_never_fences_another_sinks_stuck_ledger_transaction(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ledger reader of the commit path fences an eospack ledger transaction that holds
    it back for ``LEDGER_STALL_SECONDS``; inspection only waits (here 6 s, past the stall)
    and then says in one line why it could not read, leaving the transaction open."""
    from eospack.connectors.kafka.client.transactions import open_transactions
    from eospack.connectors.kafka.sink import ledger
    from eospack.tools.checkpoint import CheckpointInspectError

    monkeypatch.setattr(ledger, "INSPECTION_READ_TIMEOUT_SECONDS", ledger.LEDGER_STALL_SECONDS + 3)
    sink = ADAPTERS["kafka"].open(request, tmp_path, unique_name)
    stuck = "eospack-ledger-another_sink_mid_decision"
    try:
        options = sink.base_options()
        with sink.another_sink_mid_decision(options):
            with pytest.raises(CheckpointInspectError) as raised:
                inspect_sink("2pc-kafka", "2e1f0c4a-inspection-query", options)
            still_open = open_transactions(sink.config(), stuck)  # type: ignore[attr-defined]
    finally:
        sink.close()
    assert "\n" not in str(raised.value) and "ledger topic" in str(raised.value)
    assert still_open == [stuck], "inspection fenced another sink's ledger transaction"
