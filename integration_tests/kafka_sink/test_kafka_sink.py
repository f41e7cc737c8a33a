"""2pc-kafka against Apache Kafka: what only a broker can do to the sink.

The driver SIGKILLed at every crash point, tasks retried after their worker died, call
faults on the ledger write and the transaction commits, option changes across a restart
and the other cases every sink must pass are the contract suite's
(``test_sink_contract.py``, adapter ``kafka``). Here: a decided batch across a broker
SIGKILL, a decided batch the broker timed out, at-least-once, a bad option in one line
without its secret. End states are the contract's: each row once for read_committed, no
transaction of the sink left open, every decision done.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from eospack.lab.testing import wait_until
from integration_tests.sink_contract.adapters import AT_LEAST_ONCE, Kafka, KafkaSink
from integration_tests.sink_contract.harness import ContractRun

pytestmark = pytest.mark.integration


@pytest.fixture
def sink(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> KafkaSink:
    bound = Kafka.open(request, tmp_path, unique_name)
    assert isinstance(bound, KafkaSink)
    return bound


@pytest.mark.timeout(600)
def test_a_decided_batch_survives_a_broker_kill_and_is_finished_by_the_restart(
    sink: KafkaSink,
) -> None:
    """Killed after the decision, before any commit; then the broker is SIGKILLed and
    started again: the prepared transactions survive it, and the restart commits them."""
    run = ContractRun(sink)
    run.add_batches(2)
    killed = run.run_driver("after_decision@0")
    assert killed.was_killed, killed.explain()
    assert sink.rows(run.options) == Counter()
    sink.kafka.kill()
    sink.kafka.start()

    run.run_here()
    run.assert_each_row_once()


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_decided_batch_the_broker_timed_out_fails_the_restart_loudly(sink: KafkaSink) -> None:
    """The query stayed down longer than kafka.transaction.timeout.ms after deciding: the
    broker aborted its transactions. The restart must not pass the batch for done."""
    # long enough for a loaded machine to decide before it (the decision checks that
    # every transaction is still open, with a tenth of the timeout in hand: 8 s was too
    # short for a first batch on a loaded 2-core machine), short enough to wait out
    run = ContractRun(sink, {"kafka.transaction.timeout.ms": "30000"})
    run.add_batches(1)
    killed = run.run_driver("after_decision@0")
    assert killed.was_killed, killed.explain()
    wait_until(
        lambda: sink.leftovers(run.sink_ids, run.options) == [],
        90,
        "the broker to abort the timed-out transactions",
        poll=1.0,
    )
    with pytest.raises(Exception, match="DecidedPieceLostError: 2pc-kafka batch 0 of sink"):
        run.run_here()
    assert sink.rows(run.options) == Counter()


@pytest.mark.timeout(300)
def test_at_least_once_writes_every_row_without_transactions(sink: KafkaSink) -> None:
    run = ContractRun(sink, {"deliveryGuarantee": AT_LEAST_ONCE})
    run.add_batches(2)
    run.run_here()
    run.assert_each_row_once()


@pytest.mark.timeout(120)
def test_a_bad_option_fails_the_query_start_in_one_line_without_secrets(sink: KafkaSink) -> None:
    """The cases of each option are unit tests (tests/test_kafka_sink_options.py)."""
    jaas = 'org.Nope required username="u" password="hunter2-secret";'
    run = ContractRun(sink, {"kafka.sasl.jaas.config": jaas})
    run.add_batches(1)
    with pytest.raises(Exception) as raised:
        run.run_here()
    text = str(raised.value)
    assert "must be a PlainLoginModule or ScramLoginModule" in text
    assert "hunter2-secret" not in text
    assert sink.rows(run.options) == Counter()


TASK_SLOTS = 2
"""The test session's Spark runs ``local[2]``."""


@pytest.mark.timeout(420)
def test_a_query_of_many_batches_keeps_a_bounded_number_of_transactional_ids(
    sink: KafkaSink,
) -> None:
    """Issue 37's goal through a real query: the tasks of every batch take their
    transactional ids from their Python worker's pool (``producer_pool``), so after many
    batches the broker knows at most 2x the task slots of the sink's ids (one per task of
    every batch before pooling), and each row is still there once."""
    from eospack.commit_protocols.pieces import sink_prefix
    from integration_tests.kafka_sink_parts import known_transactional_ids

    run = ContractRun(sink)
    run.add_batches(12)
    run.run_here()
    run.assert_each_row_once()
    ids = {
        name
        for sink_id in run.sink_ids
        for name in known_transactional_ids(sink.bootstrap, sink_prefix(sink_id))
    }
    print(f"{len(ids)} transactional ids after 12 batches: {sorted(ids)}")
    assert 0 < len(ids) <= 2 * TASK_SLOTS
