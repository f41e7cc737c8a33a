"""Attacks on sink inspection's promises against the real stores (issue 29 session):
inspection only reads (it creates nothing), and a sink addressed another way than the
query did is never reported as "nothing to clean" while the real sink has a decided batch
waiting for its commit. Pure-logic attacks are in ``tests/test_inspection_attacks.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eospack.cli import main
from eospack.commit_protocols.inspection import DECIDED_STATUS, NOTHING_TO_CLEAN
from eospack.tools.checkpoint import CheckpointInspectError, inspect_sink
from integration_tests.sink_contract.adapters import ADAPTERS, BoundSink
from integration_tests.sink_contract.harness import ContractRun

pytestmark = pytest.mark.integration


def test_inspecting_a_sqlite_url_where_no_database_is_creates_none(tmp_path: Path) -> None:
    """A mistyped ``jdbc:sqlite:`` path made sqlite3 create an empty database file there
    (and switch it to WAL): inspection wrote, and then reported the empty file as a sink
    with nothing to clean. It refuses in one line and leaves the directory as it was."""
    missing = tmp_path / "typo.db"

    with pytest.raises(CheckpointInspectError) as raised:
        inspect_sink("2pc-jdbc", "query-1", {"url": f"jdbc:sqlite:{missing}", "dbtable": "t"})

    assert sorted(tmp_path.iterdir()) == [], "inspection created a database file"
    message = str(raised.value)
    assert "\n" not in message and str(missing) in message and "url" in message


@pytest.fixture
def postgres_sink(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> Iterator[BoundSink]:
    bound = ADAPTERS["jdbc-prepared"].open(request, tmp_path, unique_name)
    yield bound
    bound.close()


@pytest.mark.timeout(300)
def test_a_decided_batch_is_never_hidden_as_nothing_to_clean_when_the_sink_is_addressed_otherwise(
    postgres_sink: BoundSink, call_faults: Path
) -> None:
    """The query wrote ``dbtable=<t>``. Inspected as ``public.<t>`` (the same table to
    PostgreSQL) it is the same sink, since the sink id drops the default schema: batch 1
    shows decided. Inspected under another query id, the derived id is unknown: the answer
    names it and says how to address the sink, never "nothing to clean" (the attack of
    issue 29, where ``public.<t>`` still derived another id). With the query's own
    address, the restart finishes batch 1 and nothing is left."""
    run = ContractRun(postgres_sink)
    run.leave_batch_one_decided(call_faults)
    query_id = run.query_id()
    assert query_id is not None

    as_written = inspect_sink("2pc-jdbc", query_id, run.options)
    assert [d.status for d in as_written.unfinished] == [DECIDED_STATUS]

    with_schema = {**run.options, "dbtable": f"public.{run.options['dbtable']}"}
    same = inspect_sink("2pc-jdbc", query_id, with_schema)
    assert same.sink_id == as_written.sink_id
    assert [d.status for d in same.unfinished] == [DECIDED_STATUS]

    other = inspect_sink("2pc-jdbc", "another-query-id", run.options)
    assert other.sink_id != as_written.sink_id
    assert other.cleanup != NOTHING_TO_CLEAN, "a decided batch hidden behind nothing to clean"
    assert f"no decision of sink {other.sink_id} found" in other.cleanup

    run.run_here()
    assert inspect_sink("2pc-jdbc", query_id, run.options).cleanup == NOTHING_TO_CLEAN
    run.assert_each_row_once()


@pytest.fixture
def kafka_sink(
    request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
) -> Iterator[BoundSink]:
    bound = ADAPTERS["kafka"].open(request, tmp_path, unique_name)
    yield bound
    bound.close()


@pytest.mark.timeout(300)
def test_the_cli_never_says_nothing_to_clean_for_a_kafka_sink_inspected_without_its_topic(
    kafka_sink: Any, call_faults: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The query wrote ``topic``; ``--topic`` left out derives the id of a sink writing a
    topic column. Before: "nothing to clean" while batch 1 is decided and its task
    transactions are open. After: the derived id is named as unknown, with the fix."""
    run = ContractRun(kafka_sink)
    run.leave_batch_one_decided(call_faults)
    arguments = ["checkpoint", "inspect", str(run.checkpoint)]
    arguments += ["--kafka-bootstrap-servers", kafka_sink.bootstrap]
    arguments += ["--ledger-topic", kafka_sink.ledger_topic]
    capsys.readouterr()

    assert main([*arguments, "--topic", kafka_sink.topic]) == 0
    with_topic = capsys.readouterr().out
    assert "batch 1: decided" in with_topic and "start the query again" in with_topic

    assert main(arguments) == 0
    without_topic = capsys.readouterr().out
    assert NOTHING_TO_CLEAN not in without_topic, "a decided batch hidden behind nothing to clean"
    assert "no decision of sink" in without_topic and "sinkId" in without_topic

    run.run_here()
    run.assert_each_row_once()
