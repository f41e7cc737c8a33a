"""2pc-kafka against Apache Kafka: a read_committed consumer sees each row exactly once.

The crash test kills the driver at each step of the commit protocol (after the tasks
prepared, after the decision, between two transaction commits, after the commit before
Spark's commit log) in batch k of run k, then runs to the end: the output topic holds
each row once for read_committed, no transaction of the sink stays open, and every
decision in the ledger is done. read_uncommitted sees the crashed runs' aborted records
(documented). Further: at-least-once mode, bad options in one line without secrets.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer

from commit_protocols import derive_sink_id, sink_prefix
from connectors.kafka_sink.ledger import read_slots
from connectors.kafka_sink.options import DEFAULT_LEDGER_TOPIC
from connectors.kafka_sink.transactions import open_transactions
from eospack.services.kafka_tools import create_topic
from eospack.testing import await_query, wait_until
from integration_tests.crash_harness import run_driver
from integration_tests.drivers.kafka_sink_driver import start_query
from integration_tests.test_s3_crash import write_source

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parent / "drivers" / "kafka_sink_driver.py"
DRIVER_TIMEOUT = 240.0
FAULT_POINTS = ["after_prepare", "after_decision", "between_piece_commits", "after_commit"]


def records(bootstrap: str, topic: str, isolation: str) -> Counter[tuple[str, str]]:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None,
        isolation_level=isolation, consumer_timeout_ms=3000,
    )  # fmt: skip
    try:
        return Counter((record.key.decode(), record.value.decode()) for record in consumer)
    finally:
        consumer.close()


def expected_records(batches: list[list[tuple[int, str]]]) -> Counter[tuple[str, str]]:
    return Counter((group, str(row_id)) for batch in batches for row_id, group in batch)


def sink_transactions(checkpoint: Path, bootstrap: str, topic: str) -> str:
    """The transactional-id prefix of the query's sink (its id derives from the query id)."""
    query_id = json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
    return sink_prefix(derive_sink_id(query_id, f"kafka://{bootstrap}/{topic}"))


def sink_ids_in_ledger(bootstrap: str) -> set[str]:
    consumer = KafkaConsumer(
        DEFAULT_LEDGER_TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
        group_id=None, isolation_level="read_committed", consumer_timeout_ms=3000,
    )  # fmt: skip
    try:
        return {record.key.decode().split("/")[0] for record in consumer if record.key}
    finally:
        consumer.close()


@pytest.mark.timeout(900)
def test_driver_killed_at_each_commit_step_then_restarted_writes_each_row_once(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    source = tmp_path / "source"
    source.mkdir()
    batches = write_source(source, len(FAULT_POINTS) + 1)
    before = sink_ids_in_ledger(bootstrap) if _ledger_exists(bootstrap) else set()
    arguments = [
        "--source", str(source), "--checkpoint", str(tmp_path / "checkpoint"),
        "--bootstrap-servers", bootstrap, "--topic", unique_name,
    ]  # fmt: skip
    for batch, fault_point in enumerate(FAULT_POINTS):
        run = run_driver(
            DRIVER, arguments, timeout=DRIVER_TIMEOUT, fault_point=f"{fault_point}@{batch}"
        )
        assert run.was_killed, f"{fault_point}@{batch} was not reached:\n{run.explain()}"
        committed = records(bootstrap, unique_name, "read_committed")
        assert max(committed.values(), default=1) == 1, f"a record twice after {fault_point}"
    query = start_query(spark, str(source), str(tmp_path / "checkpoint"), bootstrap, unique_name)
    await_query(query, DRIVER_TIMEOUT)

    assert records(bootstrap, unique_name, "read_committed") == expected_records(batches)
    (sink_id,) = sink_ids_in_ledger(bootstrap) - before
    config = {"bootstrap_servers": bootstrap}
    assert open_transactions(config, sink_prefix(sink_id)) == []
    slots = read_slots(config, DEFAULT_LEDGER_TOPIC, sink_id)
    assert {slot.status for slot in slots.values()} == {"done"}
    assert max(slots) == len(batches) - 1 and len(slots) <= 2  # older slots forgotten
    uncommitted = records(bootstrap, unique_name, "read_uncommitted")
    assert uncommitted - expected_records(batches), "the crashed runs' aborted records"


def _ledger_exists(bootstrap: str) -> bool:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return DEFAULT_LEDGER_TOPIC in consumer.topics()
    finally:
        consumer.close()


@pytest.mark.timeout(600)
def test_a_decided_batch_survives_a_broker_kill_and_is_finished_by_the_restart(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """Killed after the decision, before any commit; then the broker is SIGKILLed and
    started again: the prepared transactions survive it, and the restart commits them."""
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    source = tmp_path / "source"
    source.mkdir()
    batches = write_source(source, 2)
    arguments = [
        "--source", str(source), "--checkpoint", str(tmp_path / "checkpoint"),
        "--bootstrap-servers", bootstrap, "--topic", unique_name,
    ]  # fmt: skip
    run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT, fault_point="after_decision@0")
    assert run.was_killed, run.explain()
    assert records(bootstrap, unique_name, "read_committed") == Counter()
    real_kafka.kill()
    real_kafka.start()

    query = start_query(spark, str(source), str(tmp_path / "checkpoint"), bootstrap, unique_name)
    await_query(query, DRIVER_TIMEOUT)
    assert records(bootstrap, unique_name, "read_committed") == expected_records(batches)
    prefix = sink_transactions(tmp_path / "checkpoint", bootstrap, unique_name)
    assert open_transactions({"bootstrap_servers": bootstrap}, prefix) == []


@pytest.mark.timeout(600)
def test_a_decided_batch_the_broker_timed_out_fails_the_restart_loudly(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    """The query stayed down longer than kafka.transaction.timeout.ms after deciding: the
    broker aborted its transactions. The restart must not pass the batch for done."""
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    source = tmp_path / "source"
    source.mkdir()
    write_source(source, 1)
    timeout = {"kafka.transaction.timeout.ms": "1000"}
    arguments = [
        "--source", str(source), "--checkpoint", str(tmp_path / "checkpoint"),
        "--bootstrap-servers", bootstrap, "--topic", unique_name,
        "--option", "kafka.transaction.timeout.ms=1000",
    ]  # fmt: skip
    run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT, fault_point="after_decision@0")
    assert run.was_killed, run.explain()
    config = {"bootstrap_servers": bootstrap}
    prefix = sink_transactions(tmp_path / "checkpoint", bootstrap, unique_name)
    wait_until(
        lambda: open_transactions(config, prefix) == [],
        60,
        "the broker to abort the timed-out transactions",
        poll=1.0,
    )
    query = start_query(
        spark, str(source), str(tmp_path / "checkpoint"), bootstrap, unique_name, timeout
    )
    with pytest.raises(Exception, match="DecidedPieceLostError: 2pc-kafka batch 0 of sink"):
        await_query(query, DRIVER_TIMEOUT)
    assert records(bootstrap, unique_name, "read_committed") == Counter()


@pytest.mark.timeout(300)
def test_at_least_once_writes_every_row_without_transactions(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str
) -> None:
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    source = tmp_path / "source"
    source.mkdir()
    batches = write_source(source, 2)
    query = start_query(
        spark, str(source), str(tmp_path / "checkpoint"), bootstrap, unique_name,
        {"deliveryGuarantee": "at-least-once"},
    )  # fmt: skip
    await_query(query, DRIVER_TIMEOUT)
    assert records(bootstrap, unique_name, "read_committed") == expected_records(batches)
    prefix = sink_transactions(tmp_path / "checkpoint", bootstrap, unique_name)
    assert open_transactions({"bootstrap_servers": bootstrap}, prefix) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kafka.bootstrap.servers": ""}, "Option kafka.bootstrap.servers is required"),
        ({"deliveryGuarantee": "twice"}, "Option deliveryGuarantee is 'twice'"),
        ({"kafka.transactional.id": "mine"}, "gives each task its own transactional id"),
        ({"kafka.acks": "1"}, "the sink sets acks=all"),
        ({"kafka.no.such.setting": "1"}, "kafka.no.such.setting is not a producer setting"),
        ({"kafka.transaction.timeout.ms": "10"}, "use at least 1000"),
        ({"topic": ""}, "needs a topic: set the topic option, or write a topic column"),
        (
            {"kafka.sasl.jaas.config": 'org.Nope required password="hunter2-secret";'},
            "must be a PlainLoginModule or ScramLoginModule",
        ),
    ],
)
def test_bad_options_fail_before_any_data_moves_in_one_line(
    spark: Any, real_kafka: Any, tmp_path: Path, unique_name: str,
    options: dict[str, str], message: str,
) -> None:  # fmt: skip
    source = tmp_path / "source"
    source.mkdir()
    write_source(source, 1)
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    with pytest.raises(Exception) as raised:
        query = start_query(
            spark, str(source), str(tmp_path / "checkpoint"), bootstrap, unique_name, options
        )
        await_query(query, 60)
    text = str(raised.value)
    assert message in text and "hunter2-secret" not in text
    assert records(bootstrap, unique_name, "read_uncommitted") == Counter()
