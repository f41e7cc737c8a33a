"""What 2pc-kafka will stand on, pinned against Apache Kafka: a transaction left open by a
process that died is committed by another process from its producer id and epoch, a
retried commit is harmless, and a fenced transaction refuses the commit loudly instead of
losing records silently (``connectors/kafka/client/transactions.py``); one the broker timed
out does the same, tested through the sink (test_kafka_sink)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka import errors as kafka_errors

from eospack.connectors.kafka.client.transactions import (
    PreparedTransaction,
    begin,
    commit_prepared,
    end_transaction,
    fence,
    open_transactions,
    prepare,
)
from eospack.connectors.kafka.errors import TransactionFencedError
from eospack.lab.services.kafka_tools import create_topic, read_all

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parents[1] / "drivers" / "kafka_transaction_driver.py"
ROOT = Path(__file__).parents[2]


def prepare_in_a_process_that_dies(
    bootstrap: str, topic: str, transactional_id: str, records: int, timeout_ms: int = 600_000
) -> PreparedTransaction:
    finished = subprocess.run(
        [
            sys.executable,
            str(DRIVER),
            bootstrap,
            topic,
            transactional_id,
            str(records),
            str(timeout_ms),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return PreparedTransaction.from_json(json.loads(finished.stdout.strip().splitlines()[-1]))


def values(bootstrap: str, topic: str, isolation: str) -> list[str]:
    """Every record value of ``topic`` as a consumer with ``isolation`` sees it, sorted."""
    rows = read_all(bootstrap, topic, isolation_level=isolation)
    return sorted(value.decode() for _, _, _, value in rows)


@pytest.mark.timeout(180)
def test_a_transaction_left_open_by_a_dead_process_is_committed_from_its_producer_id(
    real_kafka: Any, unique_name: str
) -> None:
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    config = {"bootstrap_servers": bootstrap}
    prepared = prepare_in_a_process_that_dies(bootstrap, unique_name, f"{unique_name}-1", 20)
    expected = sorted(f"{unique_name}-1:{index}" for index in range(20))

    assert values(bootstrap, unique_name, "read_committed") == []
    assert values(bootstrap, unique_name, "read_uncommitted") == expected
    assert open_transactions(config, unique_name) == [f"{unique_name}-1"]

    commit_prepared(config, prepared)
    assert values(bootstrap, unique_name, "read_committed") == expected
    commit_prepared(config, prepared)  # the answer of the first was lost: retried
    assert values(bootstrap, unique_name, "read_committed") == expected
    assert open_transactions(config, unique_name) == []


@pytest.mark.timeout(180)
def test_a_fenced_transaction_is_gone_and_refuses_its_commit(
    real_kafka: Any, unique_name: str
) -> None:
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 2)
    config = {"bootstrap_servers": bootstrap}
    prepared = prepare_in_a_process_that_dies(bootstrap, unique_name, f"{unique_name}-1", 5)
    empty = prepare(begin(config, f"{unique_name}-2"), records=0)  # a task without rows

    assert open_transactions(config, unique_name) == [f"{unique_name}-1"]
    fence(config, prepared.transactional_id)
    assert open_transactions(config, unique_name) == []
    with pytest.raises(TransactionFencedError, match=f"{unique_name}-1 .* it was aborted"):
        commit_prepared(config, prepared)
    commit_prepared(config, empty)  # nothing to end, and no error
    assert values(bootstrap, unique_name, "read_committed") == []


@pytest.mark.timeout(120)
def test_ending_a_prepared_transactions_closed_producer_fails_at_once(
    real_kafka: Any, unique_name: str
) -> None:
    """A task whose prepare failed after it closed its producer (the flush applied, its
    answer lost) tries to abort: a closed producer can send nothing, so ending must fail
    at once instead of waiting out END_TIMEOUT_MS for an answer that cannot come; the
    transaction stays open for the driver's recovery to fence."""
    bootstrap = real_kafka.endpoint.bootstrap_servers
    create_topic(bootstrap, unique_name, 1)
    producer = begin({"bootstrap_servers": bootstrap}, f"{unique_name}-1")
    producer.send(unique_name, value=b"prepared")
    prepare(producer, records=1)

    with pytest.raises(kafka_errors.KafkaError, match="is closed") as raised:
        end_transaction(producer, commit=False)
    assert not isinstance(raised.value, kafka_errors.KafkaTimeoutError)
    assert open_transactions({"bootstrap_servers": bootstrap}, unique_name) == [f"{unique_name}-1"]
    fence({"bootstrap_servers": bootstrap}, f"{unique_name}-1")


@pytest.mark.timeout(120)
def test_a_kept_ledger_rereads_after_another_process_took_the_sink_over(
    real_kafka: Any, unique_name: str
) -> None:
    """A driver keeps its ledger open between commits; a restarted query (another process)
    opens its own, fencing the kept one. The kept one's stale view must not decide: its next
    step rereads and finds what the other wrote."""
    from eospack.commit_protocols.pieces import DECIDED, BatchDecision, PreparedPiece
    from eospack.connectors.kafka.sink.ledger import Ledger
    from eospack.connectors.kafka.sink.options import parse_options
    from eospack.connectors.kafka.sink.resource import KafkaResource

    options = parse_options(
        {
            "kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers,
            "topic": unique_name,
            "ledgerTopic": f"{unique_name}-ledger",
        }
    )
    sink = "keptledger"

    def piece(batch_id: int, attempt: int) -> PreparedPiece:
        return PreparedPiece(sink, batch_id, 0, str(attempt), 0, {"records": 0})

    first = KafkaResource(options)
    first.mark_done(first.record_decision(BatchDecision(sink, 0, (piece(0, 0),))))
    assert KafkaResource(options)._with_ledger(sink, lambda ledger: ledger) is (
        first._with_ledger(sink, lambda ledger: ledger)
    ), "the ledger is kept between commits"

    other_process = Ledger(options, sink)
    theirs = other_process.write(BatchDecision(sink, 1, (piece(1, 0),)))
    other_process.close()

    ours = KafkaResource(options).record_decision(BatchDecision(sink, 1, (piece(1, 1),)))
    assert ours == theirs and ours.status == DECIDED
    assert KafkaResource(options).unfinished_decisions(sink) == [theirs]
