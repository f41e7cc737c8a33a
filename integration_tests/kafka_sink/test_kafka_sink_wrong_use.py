"""2pc-kafka attacked with ordinary-but-wrong use, against Apache Kafka (issue 25 review).

Each strict xfail pins a hole an adversarial review of the changes since ca9813c proved
and that is still open (the reason names it in one line); it passes once the hole is
closed, and then the xfail marker must go. The other tests are regression tests: holes
the review proved that were closed since (each failed on 5cdaaad; a shared sinkId, the
at-least-once "marked done" rule, the stuck-ledger fence, consumer timeouts, rows routed
to the ledger topic), and attacks the sink withstood. All run at the level of the sink's
own parts (task writer, ledger, coordinator, at-least-once recovery) without a Spark
query, so each takes seconds.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from eospack.commit_protocols import TaskIdentity, TwoPhaseCommitCoordinator, derive_sink_id
from eospack.commit_protocols.pieces import DECIDED, DONE, BatchDecision
from eospack.commit_protocols.resource import DecidedPieceLostError
from eospack.commit_protocols.stream_writer import recover_at_least_once
from eospack.connectors.kafka.client.transactions import fence, open_transactions
from eospack.connectors.kafka.errors import KafkaSinkOptionError
from eospack.connectors.kafka.sink import ledger as ledger_module
from eospack.connectors.kafka.sink.cluster_identity import derived_sink_id
from eospack.connectors.kafka.sink.ledger import Ledger, forget_ledger, shared_ledger
from eospack.connectors.kafka.sink.options import parse_options
from eospack.connectors.kafka.sink.resource import KafkaResource, kafka_name
from eospack.connectors.kafka.sink.writer import prepare_task, write_directly
from eospack.core.errors import EospackError
from eospack.lab.services.kafka_tools import create_topic, transactional_producer
from integration_tests.kafka_sink_parts import committed_keys, sink_options

pytestmark = pytest.mark.integration


def keyed_rows(prefix: str, count: int, **columns: list[Any]) -> Iterator[pa.RecordBatch]:
    keys = [f"{prefix}{index}".encode() for index in range(count)]
    data: dict[str, Any] = {
        "key": pa.array(keys, pa.binary()),
        "value": pa.array([b"v"] * count, pa.binary()),
    }
    for name, values in columns.items():
        data[name] = values
    yield pa.RecordBatch.from_pydict(data)


def expected_keys(prefix: str, count: int) -> list[bytes]:
    return sorted(f"{prefix}{index}".encode() for index in range(count))


OLD_QUERY = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
"""Spark's id of a query that ran first (the same across its restarts)."""
NEW_QUERY = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"
"""Spark's id of another query (a new checkpoint, or a savepoint restored into one)."""


def attempt(run: str, number: int = 0) -> str:
    """An attempt string of a query run (``<number>x<run, 12 characters>x<random>``)."""
    return f"{number}x{run:0<12}x{run[:8]:0<8}"


@pytest.mark.timeout(120)
def test_a_second_query_with_the_same_sink_id_does_not_lose_its_batch_silently(
    real_kafka: Any, unique_name: str
) -> None:
    """The manual asks a query that sets ``sinkId`` to set a new one after a savepoint
    restore, but nothing checks it: the slot (sink, batch) does not say which query
    decided it, so the new query's batch with the same number is taken for a replay of
    the old query's, and its rows are rolled back without an error. Expected: the new
    query's rows committed, or the commit refused in one line naming sinkId."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    sink_id = f"shared_{unique_name[-8:]}"
    options = sink_options(real_kafka, unique_name, sinkId=sink_id)
    old_query = TaskIdentity(sink_id, 1, 0, attempt("aaaaaaaa"), query_id=OLD_QUERY)
    old_piece = prepare_task(options, old_query, keyed_rows("old", 5))
    TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka").commit([old_piece], 1)

    new_query = TaskIdentity(sink_id, 1, 0, attempt("bbbbbbbb"), query_id=NEW_QUERY)
    new_piece = prepare_task(options, new_query, keyed_rows("new", 5))
    refused = False
    try:
        TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka").commit([new_piece], 1)
    except EospackError as error:
        refused = "sinkId" in str(error)
    finally:
        forget_ledger(shared_ledger(options, sink_id)[0])

    assert refused or committed_keys(real_kafka, unique_name) == sorted(
        expected_keys("old", 5) + expected_keys("new", 5)
    )


@pytest.mark.timeout(120)
def test_at_least_once_recovery_does_not_mark_done_a_lost_batch_it_never_rewrote(
    real_kafka: Any, unique_name: str
) -> None:
    """Query A (exactly-once) decided batch 3 and crashed; its transaction was then aborted
    (it stayed down past the timeout). Before, A's restart failed loudly with
    DecidedPieceLostError. Query B (at-least-once) shares A's sinkId: its first commit, at
    batch 5, finds A's decision with a lost piece and marks it done, reasoning that its
    own replay rewrote batch 3; but B never read A's input. A's restart then replays
    batch 3, finds the slot done and rolls the replay back: A's rows are lost without a
    word. Expected: the loss stays loud (or A's replayed rows are committed)."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    sink_id = f"shared_{unique_name[-8:]}"
    exactly_once = sink_options(real_kafka, unique_name, sinkId=sink_id)
    at_least_once = sink_options(
        real_kafka, unique_name, sinkId=sink_id, deliveryGuarantee="at-least-once"
    )
    config = {"bootstrap_servers": real_kafka.endpoint.bootstrap_servers}

    crashed = prepare_task(
        exactly_once,
        TaskIdentity(sink_id, 3, 0, attempt("aaaaaaaa"), query_id=OLD_QUERY),
        keyed_rows("a", 5),
    )
    KafkaResource(exactly_once).record_decision(BatchDecision(sink_id, 3, (crashed,)))
    forget_ledger(shared_ledger(exactly_once, sink_id)[0])  # A's driver dies
    fence(config, kafka_name(crashed))  # its transaction times out while A is down

    with contextlib.suppress(DecidedPieceLostError):  # loud in B would do as well
        recover_at_least_once(
            KafkaResource(at_least_once), "2pc-kafka", sink_id, 5, query_id=NEW_QUERY
        )

    replay = prepare_task(
        exactly_once,
        TaskIdentity(sink_id, 3, 0, attempt("cccccccc"), query_id=OLD_QUERY),
        keyed_rows("a", 5),
    )
    loud = False
    try:
        TwoPhaseCommitCoordinator(KafkaResource(exactly_once), "2pc-kafka").commit([replay], 3)
    except DecidedPieceLostError:
        loud = True
    finally:
        forget_ledger(shared_ledger(exactly_once, sink_id)[0])

    assert loud or committed_keys(real_kafka, unique_name) == expected_keys("a", 5)


@pytest.mark.timeout(120)
def test_a_live_sink_fenced_by_another_sinks_reader_mid_decision_redoes_its_decision(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead driver (C) left a ledger transaction open on the shared ledger topic. Sink A
    opens its ledger, stalls behind C for 3 s and fences "the stuck writers": every
    eospack ledger transaction open at that instant. Sink B, alive, is writing its
    decision just then (the first commit of its driver, so its ledger was opened in this
    step): B's transaction is milliseconds old, yet fenced, and B's commit fails with
    LedgerFencedError ("another query with the same sinkId", which the supervisor treats
    as permanent) instead of rereading and deciding again, as the ledger's doc promises
    for a fence. Deterministic: B's write is started at the moment A decides to fence."""
    options = sink_options(real_kafka, unique_name)
    bootstrap = real_kafka.endpoint.bootstrap_servers
    Ledger(options, "warm").close()  # the ledger topic exists
    dead = transactional_producer(bootstrap, "eospack-ledger-dead_driver", retry_backoff_ms=10)
    dead.begin_transaction()
    dead.send(options.ledger_topic, key=b"dead_driver/7", value=b'{"status":"decided"}').get(30)

    real_fence = ledger_module.fence_stuck_ledger_writers
    real_end = ledger_module.end_transaction
    b_open = threading.Event()
    b_may_end = threading.Event()
    outcome: dict[str, Any] = {}

    def end_transaction(producer: Any, commit: bool, **bounds: Any) -> None:
        if producer.config["transactional_id"] == "eospack-ledger-sink_b":
            producer.flush()  # B's decision record is on the ledger partition
            b_open.set()
            b_may_end.wait(60)
        real_end(producer, commit, **bounds)

    def decide_b() -> None:
        try:
            outcome["slot"] = KafkaResource(options).record_decision(BatchDecision("sink_b", 0, ()))
        except BaseException as error:  # reported by the assertion below
            outcome["error"] = error

    def fence_stuck(config: dict[str, Any], partition: Any, sink_id: str, **more: Any) -> list[str]:
        if sink_id != "sink_a":
            return real_fence(config, partition, sink_id, **more)
        writer = threading.Thread(target=decide_b)
        writer.start()
        outcome["writer"] = writer
        assert b_open.wait(60), "sink B never began its decision"
        opened = time.monotonic()
        fenced = real_fence(config, partition, sink_id, **more)
        outcome["b_age_when_fenced"] = time.monotonic() - opened
        b_may_end.set()
        return fenced

    monkeypatch.setattr(ledger_module, "end_transaction", end_transaction)
    monkeypatch.setattr(ledger_module, "fence_stuck_ledger_writers", fence_stuck)
    try:
        Ledger(options, "sink_a").close()
        outcome["writer"].join(60)
    finally:
        b_may_end.set()
        dead.close(timeout=0)
        with contextlib.suppress(Exception):
            forget_ledger(shared_ledger(options, "sink_b")[0])

    print(f"sink A fenced {outcome['b_age_when_fenced']:.2f} s after sink B began its transaction")
    assert "error" not in outcome, repr(outcome.get("error"))
    assert outcome["slot"].status == DECIDED


@pytest.mark.timeout(120)
def test_a_query_that_crashed_before_the_sink_id_change_does_not_apply_its_batch_again(
    real_kafka: Any, unique_name: str
) -> None:
    """A query ran on ca9813c, whose sink id was derived from the bootstrap string as typed;
    its driver died after committing batch 4's transactions, before Spark's commit log
    recorded the batch. The restart runs the upgraded eospack, which derives the sink id
    from the cluster's id: a new sink, with no decision for batch 4, so the replay commits
    batch 4 a second time (and the old id's open transactions are never fenced)."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    bootstrap = real_kafka.endpoint.bootstrap_servers
    raw = {"kafka.bootstrap.servers": bootstrap, "topic": unique_name}
    raw["ledgerTopic"] = f"{unique_name}_ledger"
    options = parse_options(raw)
    query_id = "4b1f0e52-2d7e-4a8c-9a51-0f5c9d8e7a61"
    old_sink_id = derive_sink_id(query_id, f"kafka://{bootstrap}/{unique_name}")  # ca9813c
    new_sink_id = derived_sink_id(query_id, raw)
    assert new_sink_id != old_sink_id

    before = prepare_task(
        options, TaskIdentity(old_sink_id, 4, 0, attempt("aaaaaaaa")), keyed_rows("r", 5)
    )
    resource = KafkaResource(options)
    resource.commit_piece(
        resource.record_decision(BatchDecision(old_sink_id, 4, (before,))).pieces[0]
    )
    forget_ledger(shared_ledger(options, old_sink_id)[0])  # the driver dies before done

    replay = prepare_task(
        options,
        TaskIdentity(new_sink_id, 4, 0, attempt("bbbbbbbb"), query_id=query_id),
        keyed_rows("r", 5),
    )
    try:
        TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka").commit([replay], 4)
    finally:
        forget_ledger(shared_ledger(options, new_sink_id)[0])

    assert committed_keys(real_kafka, unique_name) == expected_keys("r", 5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "setting",
    [{"kafka.request.timeout.ms": "500"}, {"kafka.connections.max.idle.ms": "20000"}],
    ids=["request-timeout-500", "idle-20s"],
)
def test_producer_timeouts_the_consumer_refuses_do_not_wedge_the_ledger(
    real_kafka: Any, unique_name: str, setting: dict[str, str]
) -> None:
    """Hole 4 fixed the producer-only names, not the values: the ledger's consumer takes
    every setting a KafkaConsumer knows, and refuses ``request_timeout_ms <=
    fetch_max_wait_ms`` (500) or ``connections_max_idle_ms <= request_timeout_ms`` (its
    default 30000), which a producer accepts. Every commit and abort then fails, and the
    tasks' transactions stay open, pinning the output's last stable offset."""
    options = sink_options(real_kafka, unique_name, **setting)
    resource = KafkaResource(options)
    try:
        decided = resource.record_decision(BatchDecision("timeouts", 0, ()))
        resource.mark_done(decided)
    finally:
        with contextlib.suppress(Exception):
            forget_ledger(shared_ledger(options, "timeouts")[0])
    reopened = Ledger(sink_options(real_kafka, unique_name), "timeouts")
    reopened.close()
    assert {batch: slot.status for batch, slot in reopened.slots.items()} == {0: DONE}


@pytest.mark.timeout(60)
def test_a_dead_drivers_ledger_transaction_delays_a_reader_seconds_not_its_timeout(
    real_kafka: Any, unique_name: str
) -> None:
    """Held: a ledger transaction a dead driver left open (here with kafka-python's 60 s
    default timeout, as an older eospack had) is fenced by the first reader after about
    3 s; the reader sees every decision behind it and does not wait for the timeout."""
    options = sink_options(real_kafka, unique_name)
    ledger = Ledger(options, "reader")
    ledger.mark_done(BatchDecision("reader", 0, ()))
    ledger.close()
    dead = transactional_producer(
        real_kafka.endpoint.bootstrap_servers, "eospack-ledger-old_driver", retry_backoff_ms=10
    )
    dead.begin_transaction()
    dead.send(options.ledger_topic, key=b"old_driver/1", value=b'{"status":"decided"}').get(30)
    writer = Ledger(options, "reader")
    writer.write(BatchDecision("reader", 1, ()))
    writer.close()

    started = time.monotonic()
    reopened = Ledger(options, "reader")
    took = time.monotonic() - started
    reopened.close()
    dead.close(timeout=0)

    assert {batch: slot.status for batch, slot in reopened.slots.items()} == {
        0: DONE,
        1: DECIDED,
    }
    assert took < 15, f"the reader waited {took:.1f} s"


@pytest.mark.timeout(60)
def test_a_partition_column_out_of_range_commits_nothing_and_leaves_nothing_open(
    real_kafka: Any, unique_name: str
) -> None:
    """Held for the guarantee: a row whose partition column names a partition the topic
    does not have fails the task before anything is handed to the driver, and its
    transaction is aborted (kafka-python raises ValueError there, not a KafkaSendError)."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 2)
    options = sink_options(real_kafka, unique_name)
    task = TaskIdentity("out_of_range", 0, 0, attempt("aaaaaaaa"))
    partitions = pa.array([0, 1, 7, 0], pa.int32())

    with pytest.raises(Exception, match="partition"):
        prepare_task(options, task, keyed_rows("p", 4, partition=partitions))

    config = {"bootstrap_servers": real_kafka.endpoint.bootstrap_servers}
    assert open_transactions(config, "eospack-out_of_range") == []
    assert committed_keys(real_kafka, unique_name) == []


def topic_rows(topic: str, keys: list[bytes], values: list[bytes]) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array([topic] * len(keys), pa.string()),
        }
    )


@pytest.mark.timeout(120)
def test_a_row_routed_to_the_ledger_topic_cannot_forge_another_sinks_decision(
    real_kafka: Any, unique_name: str
) -> None:
    """``ledgerTopic`` equal to the ``topic`` option is refused, but a ``topic`` column is
    not checked: a job that routes rows by a topic field of its input (a topic mirror,
    a router) writes a row into the ledger topic with the sink's own credentials. Here
    an at-least-once sink writes the record ``victim/0 -> done``; the victim's batch 0 is
    then taken for a replay of a committed batch and its rows are rolled back silently.
    Expected: the row refused (the task fails in one line), or the victim unaffected."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    victim = sink_options(real_kafka, unique_name, sinkId="victim")
    router = parse_options(
        {
            "kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers,
            "ledgerTopic": victim.ledger_topic,
            "deliveryGuarantee": "at-least-once",
        }
    )
    Ledger(victim, "warm").close()  # the ledger topic exists
    refused = False
    try:
        write_directly(
            router,
            topic_rows(victim.ledger_topic, [b"victim/0"], [b'{"status":"done","pieces":[]}']),
        )
    except EospackError:
        refused = True

    piece = prepare_task(
        victim, TaskIdentity("victim", 0, 0, attempt("aaaaaaaa")), keyed_rows("v", 5)
    )
    try:
        TwoPhaseCommitCoordinator(KafkaResource(victim), "2pc-kafka").commit([piece], 0)
    finally:
        forget_ledger(shared_ledger(victim, "victim")[0])

    assert refused or committed_keys(real_kafka, unique_name) == expected_keys("v", 5)


@pytest.mark.timeout(120)
def test_an_exactly_once_row_routed_to_the_ledger_topic_does_not_wedge_the_ledger(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's transaction stays open on the ledger partition until the driver commits
    it, but the driver must first read the ledger past it; the stall rule fences only
    ledger transactions, so the read waits until READ_TIMEOUT_SECONDS (120 s, lowered
    here to 8 s) and the commit fails; Spark's abort cannot open the ledger either, and so
    does every other 2pc-kafka sink of the cluster until the broker times the task's
    transaction out (15 minutes by default); the replay does it again.
    Expected: the row refused at the task, or the batch committed."""
    monkeypatch.setattr(ledger_module, "READ_TIMEOUT_SECONDS", 8.0)
    options = sink_options(real_kafka, unique_name)
    routed = parse_options(
        {
            "kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers,
            "ledgerTopic": options.ledger_topic,
            "kafka.transaction.timeout.ms": "60000",
        }
    )
    Ledger(options, "warm").close()  # the ledger topic exists
    task = TaskIdentity("router", 0, 0, attempt("aaaaaaaa"))
    try:
        piece = prepare_task(routed, task, topic_rows(options.ledger_topic, [b"k"], [b"v"]))
    except EospackError:
        return  # refused at the task: nothing reaches the ledger
    try:
        TwoPhaseCommitCoordinator(KafkaResource(routed), "2pc-kafka").commit([piece], 0)
    finally:
        fence({"bootstrap_servers": real_kafka.endpoint.bootstrap_servers}, kafka_name(piece))
        with contextlib.suppress(Exception):
            forget_ledger(shared_ledger(routed, "router")[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("change", ["sinkId-added", "topic-as-column"])
def test_a_restart_naming_the_sink_another_way_does_not_apply_its_batch_again(
    real_kafka: Any, unique_name: str, tmp_path: Any, change: str
) -> None:
    """The query ran with ``topic=<out>`` and a derived sink id; its driver died after
    committing batch 4's transactions, before Spark's commit log recorded the batch. The
    restart names the same output another way: it adds ``sinkId`` (to name the sink), or
    writes a constant ``topic`` column instead of the option. Either gives another sink
    id, which finds no decision for batch 4, so the replay is committed a second time;
    the query-start check of the checkpoint does not notice. Expected: the restart
    refused at query start (as for ledgerTopic), or the batch applied once."""
    from eospack.connectors.kafka.sink.checkpoint_record import check_against_record

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    base = {
        "kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers,
        "ledgerTopic": f"{unique_name}_ledger",
        "checkpointLocation": str(tmp_path / "checkpoint"),
    }
    first_raw = {**base, "topic": unique_name}
    second_raw = (
        {**first_raw, "sinkId": f"named_{unique_name[-8:]}"} if change == "sinkId-added" else base
    )
    first, second = parse_options(first_raw), parse_options(second_raw)
    query_id = "0d6f3c1e-7b9a-4e52-8c4d-2a1b3c4d5e6f"
    first_id = derived_sink_id(query_id, first_raw)
    second_id = derived_sink_id(query_id, second_raw)
    check_against_record(first)

    before = prepare_task(
        first,
        TaskIdentity(first_id, 4, 0, attempt("aaaaaaaa"), query_id=query_id),
        keyed_rows("r", 5),
    )
    resource = KafkaResource(first)
    decided = resource.record_decision(BatchDecision(first_id, 4, (before,)))
    resource.commit_piece(decided.pieces[0])
    forget_ledger(shared_ledger(first, first_id)[0])  # the driver dies before done

    try:
        check_against_record(second)  # the restart's query start
    except KafkaSinkOptionError as refused:
        assert "keep sinkId, the topic option and the cluster" in str(refused)
        return  # refused before any data moved: a pass
    rows = (
        keyed_rows("r", 5)
        if second.topic
        else keyed_rows("r", 5, topic=pa.array([unique_name] * 5, pa.string()))
    )
    replay = prepare_task(
        second, TaskIdentity(second_id, 4, 0, attempt("bbbbbbbb"), query_id=query_id), rows
    )
    try:
        TwoPhaseCommitCoordinator(KafkaResource(second), "2pc-kafka").commit([replay], 4)
    finally:
        forget_ledger(shared_ledger(second, second_id)[0])

    assert committed_keys(real_kafka, unique_name) == expected_keys("r", 5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_lost_answer_of_the_prepared_check_replays_the_batch_once(
    real_kafka: Any,
    unique_name: str,
    mode: str,
    call_faults: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held: kafka_sink.check_prepared (DescribeTransactions before the decision) failing,
    or losing its answer: the commit raises undecided, Spark's abort fences the slot and
    rolls the pieces back, and the replay commits the batch once."""
    from eospack.core import faults

    monkeypatch.setattr(faults, "_DIRECTORY", str(call_faults))
    faults.arm(call_faults, "kafka_sink.check_prepared", mode, batch_id=2)  # type: ignore[arg-type]
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    sink_id = f"check_{unique_name[-8:]}"
    options = sink_options(real_kafka, unique_name, sinkId=sink_id)
    first = prepare_task(
        options, TaskIdentity(sink_id, 2, 0, attempt("aaaaaaaa")), keyed_rows("c", 5)
    )
    coordinator = TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka")
    try:
        with pytest.raises(Exception, match="injected fault"):
            coordinator.commit([first], 2)
        coordinator.abort([first], 2)
        replay = prepare_task(
            options, TaskIdentity(sink_id, 2, 0, attempt("bbbbbbbb")), keyed_rows("c", 5)
        )
        coordinator.commit([replay], 2)
    finally:
        forget_ledger(shared_ledger(options, sink_id)[0])

    assert [fault["call"] for fault in faults.injected(call_faults)] == [
        "kafka_sink.check_prepared"
    ]
    assert committed_keys(real_kafka, unique_name) == expected_keys("c", 5)
    config = {"bootstrap_servers": real_kafka.endpoint.bootstrap_servers}
    assert open_transactions(config, f"eospack-{sink_id}-") == []


@pytest.mark.timeout(120)
def test_a_query_ahead_under_a_shared_sink_id_does_not_erase_another_querys_decision(
    real_kafka: Any, unique_name: str
) -> None:
    """Query A decided batch 10 and committed its transaction, then its driver died before
    marking it done. Query B shares the sinkId (a sinkId kept for a new checkpoint) and is
    far ahead: its commit of batch 100 forgets the sink's slots below 99, A's decided slot
    among them. The shared sinkId is refused loudly only when two queries meet in one
    slot; here A's restart finds the slot gone, decides its replay of batch 10 afresh and
    commits it a second time. Expected: refused loudly, or A's rows once."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    sink_id = f"shared_{unique_name[-8:]}"
    options = sink_options(real_kafka, unique_name, sinkId=sink_id)
    crashed = prepare_task(
        options,
        TaskIdentity(sink_id, 10, 0, attempt("aaaaaaaa"), query_id=OLD_QUERY),
        keyed_rows("a", 5),
    )
    resource = KafkaResource(options)
    resource.commit_piece(
        resource.record_decision(BatchDecision(sink_id, 10, (crashed,))).pieces[0]
    )
    forget_ledger(shared_ledger(options, sink_id)[0])  # A's driver dies before done

    ahead = prepare_task(
        options,
        TaskIdentity(sink_id, 100, 0, attempt("bbbbbbbb"), query_id=NEW_QUERY),
        keyed_rows("b", 3),
    )
    loud = False
    try:
        TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka").commit([ahead], 100)
        forget_ledger(shared_ledger(options, sink_id)[0])  # another driver
        replay = prepare_task(
            options,
            TaskIdentity(sink_id, 10, 0, attempt("cccccccc"), query_id=OLD_QUERY),
            keyed_rows("a", 5),
        )
        TwoPhaseCommitCoordinator(KafkaResource(options), "2pc-kafka").commit([replay], 10)
    except EospackError:
        loud = True
    finally:
        forget_ledger(shared_ledger(options, sink_id)[0])

    assert loud or committed_keys(real_kafka, unique_name) == sorted(
        expected_keys("a", 5) + expected_keys("b", 3)
    )


@pytest.mark.timeout(120)
def test_a_row_routed_to_another_sinks_custom_ledger_topic_cannot_forge_its_decision(
    real_kafka: Any, unique_name: str
) -> None:
    """The victim keeps its decisions in a ledgerTopic of its own; a router sink (default
    ledgerTopic, at-least-once, rows routed by a topic column) writes ``victim/0 -> done``
    there. The victim's batch 0 is then taken for a replay of a committed batch and its
    rows are rolled back without an error (the forged slot names no query, so the
    shared-sinkId check does not apply). Expected: the row refused, or the victim
    unaffected (a slot that names no transaction of the sink is not taken for a commit)."""
    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    victim = sink_options(real_kafka, unique_name, sinkId="victim")
    router = parse_options(
        {
            "kafka.bootstrap.servers": real_kafka.endpoint.bootstrap_servers,
            "deliveryGuarantee": "at-least-once",
        }
    )
    Ledger(victim, "warm").close()  # the victim's ledger topic exists
    refused = False
    try:
        write_directly(
            router,
            topic_rows(victim.ledger_topic, [b"victim/0"], [b'{"status":"done","pieces":[]}']),
        )
    except EospackError:
        refused = True

    piece = prepare_task(
        victim,
        TaskIdentity("victim", 0, 0, attempt("aaaaaaaa"), query_id=OLD_QUERY),
        keyed_rows("v", 5),
    )
    try:
        TwoPhaseCommitCoordinator(KafkaResource(victim), "2pc-kafka").commit([piece], 0)
    finally:
        forget_ledger(shared_ledger(victim, "victim")[0])

    assert refused or committed_keys(real_kafka, unique_name) == expected_keys("v", 5)


@pytest.mark.timeout(120)
def test_the_prepared_check_refuses_a_transaction_past_its_timeout(
    real_kafka: Any, unique_name: str
) -> None:
    """The broker aborts timed-out transactions in a periodic sweep
    (``transaction.abort.timed.out.transaction.cleanup.interval.ms``, 10 s by default), so
    a transaction past ``transaction.timeout.ms`` still shows Ongoing, same producer id
    and epoch, for up to 10 s. The check then lets the batch be decided; if the sweep
    comes before the commits, the decided batch is half lost and every restart fails
    (DecidedPieceLostError), the very case the check was added against. Expected: a
    piece whose deadline (DescribeTransactions' start time + timeout) has passed, or is
    about to, fails the batch undecided."""
    from kafka import KafkaAdminClient
    from kafka.admin import TransactionState

    from eospack.connectors.kafka.errors import PreparedTransactionLostError
    from eospack.lab.testing import wait_until

    create_topic(real_kafka.endpoint.bootstrap_servers, unique_name, 1)
    options = sink_options(real_kafka, unique_name, **{"kafka.transaction.timeout.ms": "1000"})
    admin = KafkaAdminClient(bootstrap_servers=real_kafka.endpoint.bootstrap_servers)

    def past_deadline_but_ongoing(piece: Any) -> str:
        """'yes' once past its deadline and still Ongoing, 'aborted' if the sweep came."""
        name = piece.handle["transactional_id"]  # the pooled id, not the piece's name
        described = admin.describe_transactions([name])[name]
        if described.state != TransactionState.ONGOING:
            return "aborted"
        deadline_ms = described.transaction_start_time_ms + described.transaction_timeout_ms
        return "yes" if time.time() * 1000 > deadline_ms + 200 else ""

    try:
        for number in range(6):  # the sweep may come first: try a new transaction
            piece = prepare_task(
                options,
                TaskIdentity("deadline", 0, number, attempt(f"run{number}")),
                keyed_rows("d", 3),
            )
            seen = wait_until(functools.partial(past_deadline_but_ongoing, piece), 30, "deadline")
            if seen == "yes":
                break
        else:
            pytest.fail("the broker's sweep aborted every transaction at its deadline")
        with pytest.raises(PreparedTransactionLostError):
            KafkaResource(options).check_prepared(BatchDecision("deadline", 0, (piece,)))
    finally:
        admin.close()


@pytest.mark.timeout(120)
def test_a_slow_sink_fenced_by_another_sinks_reader_redoes_its_decision(
    real_kafka: Any, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sink B's driver stalls for a few seconds inside a ledger write (a loaded machine, a
    slow EndTxn), in the first commit of its driver process. Sink A opens its ledger
    meanwhile, waits 3 s behind B's transaction and fences it, as designed. The ledger's
    doc promises that a live owner then rereads and does its step again; but B's ledger
    was opened in this step, so ``_with_ledger`` raises LedgerFencedError, whose message
    blames "another query with the same sinkId" and which the supervisor treats as
    permanent: a healthy query stops for good. Expected: B decides its batch."""
    options = sink_options(real_kafka, unique_name)
    Ledger(options, "warm").close()  # the ledger topic exists
    real_end = ledger_module.end_transaction
    b_open = threading.Event()
    a_has_read = threading.Event()
    outcome: dict[str, Any] = {}

    def end_transaction(producer: Any, commit: bool, **bounds: Any) -> None:
        if producer.config["transactional_id"] == "eospack-ledger-slow_b" and not b_open.is_set():
            producer.flush()  # B's decision record is on the ledger partition
            b_open.set()
            a_has_read.wait(60)  # B's driver stalls here
        real_end(producer, commit, **bounds)

    def decide_b() -> None:
        try:
            outcome["slot"] = KafkaResource(options).record_decision(BatchDecision("slow_b", 0, ()))
        except BaseException as error:  # reported by the assertion below
            outcome["error"] = error

    monkeypatch.setattr(ledger_module, "end_transaction", end_transaction)
    writer = threading.Thread(target=decide_b)
    writer.start()
    try:
        assert b_open.wait(60), "sink B never began its decision"
        Ledger(options, "reader_a").close()  # stalls 3 s behind B, fences it, reads
    finally:
        a_has_read.set()
        writer.join(60)
        with contextlib.suppress(Exception):
            forget_ledger(shared_ledger(options, "slow_b")[0])

    assert "error" not in outcome, repr(outcome.get("error"))
    assert outcome["slot"].status == DECIDED
