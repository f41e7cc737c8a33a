"""2pc-kafka rides through the loss of a broker (issue 37, "ride through broker loss").

On the 3-node cluster (RF 3, min ISR 2) a Kafka -> 2pc-kafka streaming query runs while:

- the transaction coordinator of the sink's ledger is SIGKILLed at each of the driver's
  commit points: paused before the decision is written (``kafka_sink.decide``), between
  the decision and the piece commits (``kafka_sink.commit_piece``) and between the commits
  and the mark done (``kafka_sink.mark_done``), each by a ``slow`` call fault (the test
  waits until the fault is claimed, kills the node, and the call then goes on);
- every node is restarted in turn (SIGKILL, batches committed while it is down, start,
  back in sync) while records come in at a steady rate. That query runs in a driver of its
  own (``drivers/kafka_to_kafka_driver.py``) under ``local[2,4]``: a task whose send was in
  flight when its leader or coordinator died may fail (after the producer's delivery
  timeout) and Spark retries it, as on a cluster; the session's ``local[2]`` retries no
  task, so there one unlucky kill failed the query. The query itself must never fail.

The query must never fail, the output topic read with read_committed must hold exactly the
input (nothing lost, nothing twice), and no transaction under the sink's prefix (nor its
ledger's) may stay Ongoing. Before the fix the ledger's producer kept asking the dead
coordinator: the commit hung about 60 s and failed the query, its cause hidden behind the
close's ``KafkaTimeoutError: Timeout waiting for future``. The rolling restart then failed
on the task side (a task's producer made just after its coordinator died waited out
``max.block.ms``: ``Timeout expired while initializing transactional state in 60000 ms``)
and on the driver's ListTransactions (it asks every broker: ``ECONNREFUSED``).

Ledger durability: a ledger topic the sink creates has 3 replicas and min.insync.replicas 2;
an existing weaker one is warned about once, naming what was found and the fix.

Every wait has a deadline; nothing waits by sleeping (the producer of the rolling restart
paces its sends, which is the load, not a synchronisation).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError

from eospack.commit_protocols import sink_prefix
from eospack.connectors.kafka.sink.ledger import LEDGER_ID_PREFIX
from eospack.core import faults
from eospack.core.processes import DriverProcess
from eospack.lab.services.kafka_tools import read_all
from eospack.lab.testing import wait_until

pytestmark = [pytest.mark.production_kafka, pytest.mark.integration]

STALL_SECONDS = 8.0
"""How long a paused commit call waits before it goes on: the kill lands inside it (the
test kills as soon as it sees the claim, which takes well under a second)."""
DELIVERY_SECONDS = 240.0
"""How long the output may take to hold the input after a kill: a new coordinator and new
leaders take a few seconds on the test cluster (broker.session.timeout.ms is 3 s)."""
IN_SYNC_SECONDS = 120.0


def admin_of(cluster: Any) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=cluster.endpoint.bootstrap_servers, request_timeout_ms=10_000
    )


def create_topics(cluster: Any, *names: str, partitions: int = 2) -> None:
    admin = admin_of(cluster)
    try:
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=3) for name in names]
        )
    finally:
        admin.close()
    for name in names:
        for partition in range(partitions):
            wait_until(
                lambda name=name, partition=partition: (
                    in_sync(cluster, name, partition) == [1, 2, 3]
                ),
                IN_SYNC_SECONDS,
                f"{name}-{partition} in sync on 3 nodes",
            )


def in_sync(cluster: Any, topic: str, partition: int) -> list[int]:
    """The nodes in sync for the partition; none while its metadata has not spread yet."""
    try:
        return list(cluster.in_sync_replicas(topic, partition))
    except KeyError:
        return []


def produce(cluster: Any, topic: str, values: list[str]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=cluster.endpoint.bootstrap_servers, acks="all", retries=50
    )
    try:
        for value in values:
            producer.send(topic, key=value.encode(), value=value.encode())
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=5)


def committed_values(cluster: Any, topic: str) -> list[str]:
    rows = read_all(
        cluster.endpoint.bootstrap_servers, topic, timeout=60, isolation_level="read_committed"
    )
    return sorted((value or b"").decode() for _, _, _, value in rows)


def open_transactions(cluster: Any, prefixes: tuple[str, ...]) -> list[str]:
    def ask(admin: Any) -> Any:
        return admin.list_transactions(state_filters=["Ongoing"])

    listed = cluster._ask(ask)
    return sorted(
        listing.transactional_id
        for listings in listed.values()
        for listing in listings
        if listing.transactional_id.startswith(prefixes)
    )


def start_query(spark: Any, cluster: Any, name: str, checkpoint: Path, batch: int) -> Any:
    servers = cluster.endpoint.bootstrap_servers
    return (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", f"{name}_in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(batch))
        .option("kafkaConsumer.pollTimeoutMs", "60000")
        .load()
        .select("key", "value")
        .writeStream.format("2pc-kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", f"{name}_out")
        .option("ledgerTopic", f"{name}_ledger")
        .option("sinkId", name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def wait_delivered(cluster: Any, query: Any, name: str, expected: list[str]) -> None:
    """Until the output holds ``expected``; the query failing ends the wait with its error."""

    def delivered() -> bool:
        exception = query.exception()
        assert exception is None, f"the query failed: {exception}"
        try:
            return committed_values(cluster, f"{name}_out") == expected
        except KafkaError:  # this test's reader met the dead node: ask again
            return False

    wait_until(delivered, DELIVERY_SECONDS, f"the output of {name} to hold the input", poll=1.0)


def assert_nothing_left_open(cluster: Any, name: str) -> None:
    prefixes = (sink_prefix(name), f"{LEDGER_ID_PREFIX}{name}")
    wait_until(
        lambda: open_transactions(cluster, prefixes) == [],
        60,
        "no Ongoing transaction of the sink or its ledger",
    )


@pytest.fixture
def all_nodes_up(kafka_cluster: Any) -> Iterator[Any]:
    """The cluster, every node started again after the test (whatever it killed)."""
    yield kafka_cluster
    for node_id in sorted(kafka_cluster.nodes):
        if not kafka_cluster.node(node_id).alive:
            kafka_cluster.start(node_id)


def claimed(directory: Path, call: str) -> bool:
    return any(entry["call"] == call for entry in faults.injected(directory))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "call",
    ["kafka_sink.decide", "kafka_sink.commit_piece", "kafka_sink.mark_done"],
    ids=["before_decision", "between_decision_and_commits", "between_commits_and_done"],
)
def test_the_ledger_coordinator_killed_at_a_commit_point_is_ridden_through_exactly_once(
    spark: Any, all_nodes_up: Any, unique_name: str, tmp_path: Path, call_faults: Path, call: str
) -> None:
    cluster = all_nodes_up
    name = unique_name
    create_topics(cluster, f"{name}_in", f"{name}_out")
    produced = [f"first-{index:04d}" for index in range(60)]
    produce(cluster, f"{name}_in", produced)
    query = start_query(spark, cluster, name, tmp_path / "checkpoint", batch=40)
    killed: int | None = None
    try:
        wait_delivered(cluster, query, name, sorted(produced))
        faults.arm(call_faults, call, "slow", stall_seconds=STALL_SECONDS)
        second = [f"second-{index:04d}" for index in range(60)]
        produce(cluster, f"{name}_in", second)
        produced += second
        wait_until(lambda: claimed(call_faults, call), 120, f"the commit paused at {call}")
        killed = cluster.transaction_coordinator(f"{LEDGER_ID_PREFIX}{name}")
        started = time.monotonic()
        cluster.kill(killed)
        wait_delivered(cluster, query, name, sorted(produced))
        delivered_after = time.monotonic() - started
        print(f"{call}: node {killed} killed, the input delivered {delivered_after:.1f} s later")
        third = [f"node-down-{index:04d}" for index in range(60)]
        produce(cluster, f"{name}_in", third)
        produced += third
        wait_delivered(cluster, query, name, sorted(produced))
        assert_nothing_left_open(cluster, name)
        assert query.exception() is None
        assert query.isActive
    finally:
        query.stop()
    assert committed_values(cluster, f"{name}_out") == sorted(produced)
    assert_nothing_left_open(cluster, name)


class SteadyProducer:
    """Sends ``rate`` records a second to ``topic`` until stopped; remembers what the broker
    acknowledged (a send that failed is retried until it is acknowledged)."""

    def __init__(self, cluster: Any, topic: str, rate: int) -> None:
        self.producer = KafkaProducer(
            bootstrap_servers=cluster.endpoint.bootstrap_servers,
            acks="all",
            retries=1000,
            enable_idempotence=True,
            delivery_timeout_ms=300_000,
            request_timeout_ms=10_000,
        )
        self.topic, self.rate = topic, rate
        self.sent: list[str] = []
        self.stopped = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        index = 0
        try:
            while not self.stopped.wait(1.0 / self.rate):
                value = f"steady-{index:06d}"
                self.producer.send(self.topic, key=value.encode(), value=value.encode()).get(
                    timeout=300
                )
                self.sent.append(value)
                index += 1
        except BaseException as error:
            self.failure = error

    def stop(self) -> list[str]:
        self.stopped.set()
        self.thread.join(timeout=330)
        self.producer.close(timeout=5)
        assert self.failure is None, f"the input producer failed: {self.failure!r}"
        return sorted(self.sent)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "kafka_to_kafka_driver.py"


class RollingRestartDriver:
    """The query of the rolling restart as its own driver under ``local[2,4]``: Spark retries
    a failed task as a cluster does (``spark.task.maxFailures`` 4), which the session's
    ``local[2]`` never does. A task's send in flight when its partition's leader or its
    coordinator dies can wait out the producer's delivery timeout and fail the task
    (documented in docs/connectors/2pc-kafka.md, "Tasks"); on a cluster Spark retries it
    under a new transactional id, and the query must not fail. Its progress comes from the
    driver's JSON lines, its commits from the checkpoint's commit log."""

    def __init__(self, cluster: Any, name: str, workdir: Path) -> None:
        self.checkpoint = workdir / "checkpoint"
        self.progress = workdir / "progress.jsonl"
        self.stop_file = workdir / "stop"
        self.progress.touch()
        self.process = DriverProcess(
            [
                str(DRIVER),
                *("--bootstrap-servers", cluster.endpoint.bootstrap_servers),
                *("--input", f"{name}_in", "--output", f"{name}_out"),
                *("--ledger", f"{name}_ledger", "--sink-id", name),
                *("--checkpoint", str(self.checkpoint), "--progress", str(self.progress)),
                *("--stop-file", str(self.stop_file), "--max-offsets", "200"),
                *("--master", "local[2,4]"),
            ],
            log_path=workdir / "driver.log",
        )

    def assert_running(self) -> None:
        code = self.process.poll()
        assert code is None, f"the query failed (driver exit {code}):\n{self.process.output(4000)}"

    def batches_committed(self) -> int:
        self.assert_running()
        commits = self.checkpoint / "commits"
        names = [p.name for p in commits.iterdir()] if commits.exists() else []
        return max((int(n) for n in names if n.isdigit()), default=-1)

    def progress_entries(self) -> list[dict[str, Any]]:
        lines = self.progress.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]

    def task_failures(self) -> list[str]:
        """Spark's lines about task attempts that failed (and were retried)."""
        return [line for line in self.process.output().splitlines() if "Lost task" in line]

    def stop(self) -> int:
        """Ask the driver to stop its query; its exit code (0: stopped, never failed)."""
        self.stop_file.touch()
        wait_until(lambda: self.process.poll() is not None, 120, "the driver to stop")
        return int(self.process.poll() or 0)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()


@pytest.mark.timeout(900)
def test_a_rolling_restart_of_every_node_fails_no_query_and_loses_or_doubles_nothing(
    all_nodes_up: Any, unique_name: str, tmp_path: Path
) -> None:
    cluster = all_nodes_up
    name = unique_name
    create_topics(cluster, f"{name}_in", f"{name}_out")
    driver = RollingRestartDriver(cluster, name, tmp_path)
    steady = SteadyProducer(cluster, f"{name}_in", rate=20)
    watched = (f"{name}_in", f"{name}_out", f"{name}_ledger")

    def back_in_sync(node: int) -> bool:
        """A rolling restart's gate before the next node: every replica of every partition
        in sync again, the transaction state log's included (else the next kill can leave
        one of its partitions below min.insync.replicas and every transaction waits)."""
        try:
            described = cluster._ask(lambda admin: admin.describe_topics())
        except KafkaError:
            return False
        return all(
            sorted(partition["isr_nodes"]) == sorted(partition["replica_nodes"])
            for topic in described
            for partition in topic["partitions"]
        ) and all(
            node in in_sync(cluster, topic, partition)
            for topic in watched
            for partition in range(1 if topic.endswith("_ledger") else 2)
        )

    def delivered(expected: list[str]) -> bool:
        driver.assert_running()
        try:
            return committed_values(cluster, f"{name}_out") == expected
        except KafkaError:  # this test's reader met a node on its way back: ask again
            return False

    try:
        # The driver's JVM starts first (30-40 s on 2 cores), then batches flow.
        wait_until(lambda: driver.batches_committed() >= 2, 240, "the query committing batches")
        restart_started = time.monotonic()
        first_batch = driver.batches_committed()
        for node in sorted(cluster.nodes):
            cluster.kill(node)
            down_at = driver.batches_committed()
            wait_until(
                lambda down_at=down_at: driver.batches_committed() >= down_at + 3,
                DELIVERY_SECONDS,
                f"3 batches committed with node {node} down",
            )
            cluster.start(node)
            wait_until(
                lambda node=node: back_in_sync(node), IN_SYNC_SECONDS, f"node {node} in sync"
            )
            print(f"node {node} restarted ({time.monotonic() - restart_started:.1f} s in)")
        restart_seconds = time.monotonic() - restart_started
        expected = steady.stop()
        wait_until(
            lambda: delivered(expected),
            DELIVERY_SECONDS,
            f"the output of {name} to hold the input",
            poll=1.0,
        )
        assert_nothing_left_open(cluster, name)
        driver.assert_running()
        durations = [
            float(entry["durationMs"].get("addBatch", 0))
            for entry in driver.progress_entries()
            if entry["batchId"] >= first_batch and entry["numInputRows"]
        ]
        retried = driver.task_failures()
        print(
            f"rolling restart: {restart_seconds:.1f} s, {len(expected)} records,"
            f" {len(durations)} batches with rows, addBatch (write and commit) p50"
            f" {percentile(durations, 0.5):.0f} ms, p99 {percentile(durations, 0.99):.0f} ms,"
            f" max {max(durations, default=0):.0f} ms; {len(retried)} task attempts failed"
            " and were retried" + "".join(f"\n  {line}" for line in retried)
        )
        assert driver.stop() == 0, (
            f"the driver did not stop cleanly:\n{driver.process.output(4000)}"
        )
    finally:
        steady.stopped.set()
        driver.kill()
    assert committed_values(cluster, f"{name}_out") == sorted(steady.sent)
    assert_nothing_left_open(cluster, name)


# Ledger durability ---------------------------------------------------------------------


def ledger_options(cluster: Any, ledger_topic: str) -> Any:
    from eospack.connectors.kafka.sink.options import parse_options

    return parse_options(
        {
            "kafka.bootstrap.servers": cluster.endpoint.bootstrap_servers,
            "topic": f"{ledger_topic}_out",
            "ledgerTopic": ledger_topic,
        }
    )


@pytest.mark.timeout(120)
def test_a_new_ledger_topic_is_replicated_3_times_with_min_insync_replicas_2(
    kafka_cluster: Any, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    from eospack.connectors.kafka.sink.ledger import ensure_ledger_topic

    topic = f"{unique_name}_ledger"
    with caplog.at_level("WARNING", logger="eospack.connectors.kafka.sink.ledger"):
        ensure_ledger_topic(ledger_options(kafka_cluster, topic))
    admin = admin_of(kafka_cluster)
    try:
        (described,) = admin.describe_topics([topic])
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, ["min.insync.replicas"])]
        )
    finally:
        admin.close()
    assert [len(partition["replica_nodes"]) for partition in described["partitions"]] == [3]
    entry = configs["topic"][topic]["min.insync.replicas"]
    assert entry["value"] == "2", entry
    assert [r for r in caplog.records if topic in r.getMessage()] == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("replication", "min_insync", "found"),
    [
        (3, "1", "its min.insync.replicas is 1"),
        (1, "1", "it has 1 replica(s) where the cluster's 3 brokers allow 3"),
    ],
)
def test_a_weaker_existing_ledger_topic_is_warned_about_once_at_query_start(
    kafka_cluster: Any,
    unique_name: str,
    caplog: pytest.LogCaptureFixture,
    replication: int,
    min_insync: str,
    found: str,
) -> None:
    from eospack.connectors.kafka.sink.ledger import LEDGER_TOPIC_CONFIGS, ensure_ledger_topic

    topic = f"{unique_name}_ledger"
    admin = admin_of(kafka_cluster)
    try:
        admin.create_topics(
            [
                NewTopic(
                    topic,
                    num_partitions=1,
                    replication_factor=replication,
                    topic_configs={**LEDGER_TOPIC_CONFIGS, "min.insync.replicas": min_insync},
                )
            ]
        )
    finally:
        admin.close()
    options = ledger_options(kafka_cluster, topic)
    with caplog.at_level("WARNING", logger="eospack.connectors.kafka.sink.ledger"):
        ensure_ledger_topic(options)
        ensure_ledger_topic(options)  # a second query start in the same process
    warnings = [r.getMessage() for r in caplog.records if topic in r.getMessage()]
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning.startswith(f"2pc-kafka's ledger topic {topic} (where the sink keeps")
    assert found in warning
    assert f"--entity-name {topic} --add-config min.insync.replicas=2" in warning
    assert kafka_cluster.endpoint.bootstrap_servers in warning
