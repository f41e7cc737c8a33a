"""12. A rolling restart of a 3-broker cluster under a running Kafka -> 2pc-kafka query.

Issue 37's goal: while records come in at ``rate`` events/s, every node of a 3-node KRaft
cluster (RF 3, min.insync.replicas 2) is SIGKILLed in turn, left down until the query has
committed 3 batches without it, started again and waited for until every replica is back
in sync. The query (replayable-kafka -> 2pc-kafka exactly-once, its own driver with task
retries as on a cluster: ``integration_tests/drivers/kafka_to_kafka_driver.py`` under
``local[2,4]``) must not fail; afterwards a ``read_committed`` read of the output must hold
exactly the acknowledged input (lost and doubled are counted, not assumed). Reported: the
rate the producer achieved, records, query failures, task failures Spark retried, lost,
doubled, p50/p99/max of the batches that started during the restart (whole trigger and
the sink's addBatch), the restart's duration and how long the query took to catch up.

On demand only (a 3-node cluster is ~1.5 GB and the run takes minutes):
``python -m benchmarks --only rolling-restart [--rate N]`` or ``make bench-rolling-restart``.
"""

from __future__ import annotations

import collections
import datetime
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Figure, Report, say
from eospack.core.processes import DriverProcess
from eospack.lab.testing import wait_until

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "integration_tests" / "drivers" / "kafka_to_kafka_driver.py"
PARTITIONS = 2
MAX_OFFSETS = 100_000
TRIGGER_MS = 1000
WARM_UP_SECONDS = 20.0
DOWN_BATCHES = 3
IN_SYNC_SECONDS = 180.0
DOWN_SECONDS = 300.0
CATCH_UP_SECONDS = 300.0


class PacedProducer:
    """Sends ``rate`` records a second (in slices every 10 ms) with an idempotent producer
    that outlasts a broker restart; remembers each record the broker acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            retries=1_000_000,
            delivery_timeout_ms=300_000,
            request_timeout_ms=10_000,
            linger_ms=5,
            batch_size=64 * 1024,
        )
        self.topic, self.rate = topic, rate
        self.acknowledged: list[bytes] = []
        self.failures: list[BaseException] = []
        self.sent = 0
        self.started = 0.0
        self.stopped_at = 0.0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.started = time.monotonic()
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.01):
            due = int((time.monotonic() - self.started) * self.rate)
            while self.sent < due:
                value = f"{self.sent:010d}".encode()
                future = self.producer.send(self.topic, key=value, value=value)
                future.add_callback(lambda _, value=value: self.acknowledged.append(value))
                future.add_errback(self.failures.append)
                self.sent += 1
        self.stopped_at = time.monotonic()

    def stop(self) -> list[bytes]:
        self.stopping.set()
        self.thread.join(timeout=60)
        self.producer.flush(timeout=330)
        self.producer.close(timeout=10)
        if self.failures:
            raise RuntimeError(f"the input producer failed: {self.failures[0]!r}")
        return self.acknowledged

    def achieved_rate(self) -> float:
        return self.sent / max(1e-9, self.stopped_at - self.started)


def committed_batches(checkpoint: Path) -> int:
    """The highest batch id Spark committed (its commit log), -1 before the first."""
    commits = checkpoint / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.exists() else []
    return max(ids, default=-1)


def back_in_sync(cluster: Any) -> bool:
    """Every replica of every partition in sync (the transaction state log's included)."""
    from kafka.errors import KafkaError

    try:
        described = cluster._ask(lambda admin: admin.describe_topics())
    except KafkaError:
        return False
    return all(
        sorted(partition["isr_nodes"]) == sorted(partition["replica_nodes"])
        for topic in described
        for partition in topic["partitions"]
    )


def output_counts(bootstrap: str, topic: str) -> collections.Counter[bytes]:
    from eospack.lab.services.kafka_tools import read_all

    rows = read_all(bootstrap, topic, timeout=300, isolation_level="read_committed")
    return collections.Counter(value or b"" for _, _, _, value in rows)


def rows_committed(progress: Path) -> int:
    """Input rows of the batches the query ran to the end (each batch id once: a replayed
    batch reports again under its id)."""
    rows: dict[int, int] = {}
    for line in progress.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if entry["numInputRows"]:
            rows[entry["batchId"]] = entry["numInputRows"]
    return sum(rows.values())


def ongoing_transactions(bootstrap: str, prefixes: tuple[str, ...]) -> list[str]:
    """Transactional ids under ``prefixes`` whose transaction is still open (Ongoing)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        listed = admin.list_transactions(state_filters=["Ongoing"])
    finally:
        admin.close()
    return sorted(
        entry.transactional_id
        for entries in listed.values()
        for entry in entries
        if entry.transactional_id.startswith(prefixes)
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def batches_between(progress: Path, start: float, end: float) -> list[dict[str, Any]]:
    """Batches with rows that started between the wall-clock times ``start`` and ``end``."""
    found = []
    for line in progress.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        began = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
        if entry["numInputRows"] and start <= began.timestamp() <= end:
            found.append(entry)
    return found


def run(report: Report, rate: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from eospack.commit_protocols import sink_prefix
    from eospack.connectors.kafka.sink.ledger import LEDGER_ID_PREFIX
    from eospack.lab.services.kafka_cluster import ApacheKafkaCluster

    say(f"rolling restart: starting a 3-node cluster, then {rate:,} events/s")
    workdir = Path(tempfile.mkdtemp(prefix="eospack-bench-rolling-"))
    name = f"bench_rolling_{time.time_ns()}"
    with ApacheKafkaCluster(brokers=3) as cluster:
        bootstrap = cluster.endpoint.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            admin.create_topics(
                [
                    NewTopic(f"{name}_{role}", num_partitions=PARTITIONS, replication_factor=3)
                    for role in ("in", "out")
                ]
            )
        finally:
            admin.close()
        wait_until(lambda: back_in_sync(cluster), IN_SYNC_SECONDS, "the new topics in sync")
        checkpoint, progress = workdir / "checkpoint", workdir / "progress.jsonl"
        stop_file = workdir / "stop"
        progress.touch()
        driver = DriverProcess(
            [
                str(DRIVER),
                *("--bootstrap-servers", bootstrap, "--input", f"{name}_in"),
                *("--output", f"{name}_out", "--ledger", f"{name}_ledger"),
                *("--sink-id", name, "--checkpoint", str(checkpoint)),
                *("--progress", str(progress), "--stop-file", str(stop_file)),
                *("--max-offsets", str(MAX_OFFSETS), "--trigger-ms", str(TRIGGER_MS)),
                *("--master", "local[2,4]"),
            ],
            log_path=workdir / "driver.log",
        )
        producer = PacedProducer(bootstrap, f"{name}_in", rate)
        failures = 0

        def running() -> None:
            nonlocal failures
            if driver.poll() is not None:
                failures += 1
                raise RuntimeError(f"the query failed:\n{driver.output(3000)}")

        def committed() -> int:
            running()
            return committed_batches(checkpoint)

        try:
            wait_until(lambda: committed() >= 0, 240, "the query's first batch")
            producer.start()
            steady_from = time.time() + WARM_UP_SECONDS / 2  # the first batches warm up
            warm_until = time.monotonic() + WARM_UP_SECONDS
            wait_until(lambda: time.monotonic() >= warm_until and committed() >= 3, 240, "warm")
            restart_started, wall_started = time.monotonic(), time.time()
            for node in sorted(cluster.nodes):
                cluster.kill(node)
                down_at = committed()
                wait_until(
                    lambda down_at=down_at: committed() >= down_at + DOWN_BATCHES,
                    DOWN_SECONDS,
                    f"{DOWN_BATCHES} batches committed with node {node} down",
                )
                cluster.start(node)
                wait_until(lambda: back_in_sync(cluster), IN_SYNC_SECONDS, f"node {node} in sync")
                say(f"  node {node} restarted ({time.monotonic() - restart_started:.1f} s in)")
            restart_seconds = time.monotonic() - restart_started
            wall_ended = time.time()
            acknowledged = producer.stop()
            caught_up_from = time.monotonic()

            def caught_up() -> bool:
                running()
                return rows_committed(progress) >= len(acknowledged)

            wait_until(caught_up, CATCH_UP_SECONDS, "the output to hold the input", poll=1.0)
            catch_up_seconds = time.monotonic() - caught_up_from
            running()
            stop_file.touch()
            wait_until(lambda: driver.poll() is not None, 120, "the driver to stop")
            if driver.poll() != 0:
                failures += 1
        finally:
            producer.stopping.set()
            stop_file.touch()
            if driver.poll() is None:
                try:
                    wait_until(lambda: driver.poll() is not None, 60, "the driver to stop")
                except TimeoutError:
                    driver.kill()
        log = driver.output()
        found = output_counts(bootstrap, f"{name}_out")
        wanted = collections.Counter(acknowledged)
        lost = sum((wanted - found).values())
        doubled = sum((found - wanted).values())
        left_open = ongoing_transactions(
            bootstrap, (sink_prefix(name), f"{LEDGER_ID_PREFIX}{name}")
        )
    batches = batches_between(progress, wall_started, wall_ended)
    whole = [float(b["durationMs"].get("triggerExecution", 0)) for b in batches]
    add = [float(b["durationMs"].get("addBatch", 0)) for b in batches]
    steady = [
        float(b["durationMs"].get("triggerExecution", 0))
        for b in batches_between(progress, steady_from, wall_started)
    ]
    task_failures = log.count("Lost task")
    # p99 of fewer than 100 batches is their slowest one.
    figure = Figure(
        f"2pc-kafka through a rolling restart at {rate:,}/s offered",
        (restart_seconds,),
        len(acknowledged),
        "s",
    )
    report.add_figure("12. rolling restart of 3 brokers", figure)
    summary = (
        f"rolling restart (issue 37 goal: {rate:,} events/s offered): producer achieved"
        f" {producer.achieved_rate():,.0f} events/s, {len(acknowledged):,} records; query"
        f" failures {failures}, task failures retried {task_failures}; lost {lost}, doubled"
        f" {doubled}; transactions left Ongoing {len(left_open)}; restart of 3 nodes"
        f" {restart_seconds:.1f} s; {len(batches)} batches with rows started during it:"
        f" batch (triggerExecution) p50 {percentile(whole, 0.5) / 1000:.2f} s,"
        f" p99 {percentile(whole, 0.99) / 1000:.2f} s, max {max(whole, default=0) / 1000:.2f} s;"
        f" addBatch (write and commit) p50 {percentile(add, 0.5) / 1000:.2f} s,"
        f" p99 {percentile(add, 0.99) / 1000:.2f} s; in the {WARM_UP_SECONDS / 2:.0f} s before"
        f" the restart batch p50"
        f" {statistics.median(steady) / 1000 if steady else 0:.2f} s; caught up"
        f" {catch_up_seconds:.1f} s after the producer stopped"
    )
    report.notes.append(summary)
    say(f"  {summary}")
    if failures or lost or doubled or left_open:
        raise RuntimeError(f"rolling restart: the goal failed ({summary}); log in {workdir}")
