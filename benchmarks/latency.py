"""8. end-to-end latency: an event's creation to its row committed and visible in PostgreSQL.

The demo's pipeline (replayable-kafka -> running_count -> 2pc-jdbc, here its ``history``
query only, one row per key and micro-batch with the batch id) runs as its own driver
process while events are produced at steady rates. Every event's creation time is its
Kafka CreateTime (set by the producer when the event is handed to it); the moment a batch
became visible is when a reader polling the table every few milliseconds first sees its
batch id; which events a batch held comes from the query's own offset log. So the latency
of every single event is known, not a sample's.

The highest sustained rate is measured as the pipeline's capacity: a backlog is produced at
once and drained; any steady rate below that keeps the lag bounded, which the steady runs
check (the last third of a run must not be slower than the first).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import Comparison, Figure, Report, say
from benchmarks.pipeline import pipeline, spark_pipeline
from eospack.core.processes import DriverProcess
from eospack.lab.services.kafka_tools import create_topic
from eospack.lab.testing import wait_until

PARTITIONS = 4
KEYS = 1_000
TRIGGER_INTERVAL = "500 milliseconds"
MAX_OFFSETS_PER_TRIGGER = 100_000
P99_GOAL_SECONDS = 1.0
P99_GOAL_RATE = 5_000
AT_LEAST_ONCE_MARGIN = 1.1
SPARK = "Spark's own pipeline"
"""The peer contender: benchmarks/spark_pipeline.py (JVM source, state and JDBC writer)."""
SUSTAINED_GOAL = 50_000
WARM_UP_SECONDS = 3.0
TIMEOUT = 600.0


@dataclass(frozen=True)
class Window:
    """One steady rate: events created in ``[measured_from, ended)`` are measured."""

    rate: int
    started: float
    measured_from: float
    ended: float


@dataclass(frozen=True)
class Latencies:
    rate: int
    seconds: tuple[float, ...]
    sustained: bool

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


class Producer:
    """Keyed events through librdkafka (confluent-kafka): a Python producer would compete
    with Spark for the two cores at 20k events/s. Keys as the demo's, spread over
    partitions round robin."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer as KafkaProducer

        self.topic = topic
        self.producer = KafkaProducer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 10**6}
        )
        self.index = 0

    def send(self, count: int) -> None:
        for _ in range(count):
            key = f"key-{self.index * 7919 % KEYS:05d}".encode()
            self.producer.produce(
                self.topic, value=b"x" * 90, key=key, partition=self.index % PARTITIONS
            )
            self.index += 1
        self.producer.poll(0)

    def steady(self, rate: int, seconds: float) -> Window:
        """``rate`` events/s in chunks every 20 ms for ``seconds``."""
        started = time.time()
        chunk_seconds = 0.02
        sent = 0
        while (now := time.time()) < started + seconds:
            due = int((now - started + chunk_seconds) * rate) - sent
            if due > 0:
                self.send(due)
                sent += due
            time.sleep(max(0.0, chunk_seconds - (time.time() - now)))  # pacing
        self.producer.flush(30)
        return Window(rate, started, started + WARM_UP_SECONDS, started + seconds)

    def close(self) -> None:
        self.producer.flush(30)


class VisibilityWatcher(threading.Thread):
    """Polls the history table for new batch ids and records when each became visible.

    Batches of one query commit in order, so a visible batch id ``n`` means every batch up
    to ``n`` is visible. An index on batch_id keeps each poll cheap as the table grows.
    """

    def __init__(self, url: str, table: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True, name="bench-visibility-watcher")
        self.url, self.table, self.interval = url, table, interval
        self.visible_at: dict[int, float] = {}
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    @property
    def last_visible(self) -> int:
        return max(self.visible_at, default=-1)

    def run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True) as connection:
                indexed = False
                while not self.stopped.is_set():
                    try:
                        if not indexed:
                            connection.execute(
                                f"CREATE INDEX IF NOT EXISTS {self.table}_batch"
                                f" ON {self.table} (batch_id)"
                            )
                            indexed = True
                        row = connection.execute(
                            f"SELECT max(batch_id) FROM {self.table}"
                        ).fetchone()
                    except psycopg.errors.UndefinedTable:
                        row = None
                    now = time.time()
                    newest = -1 if row is None or row[0] is None else int(row[0])
                    for batch in range(self.last_visible + 1, newest + 1):
                        self.visible_at[batch] = now
                    self.stopped.wait(self.interval)  # polling period, not synchronisation
        except BaseException as error:
            self.error = error


class OffsetLog:
    """Batch id -> partition -> [start, end) offsets, read from a query's offset log.

    Read again on every :meth:`ranges` call and remembered: Spark deletes all but the last
    100 batches' offset files (``minBatchesToRetain``), and a run has more batches than
    that. replayable-kafka's offsets carry each batch's starts (``@starts``); Spark's Kafka
    source's hold ends only, so a batch starts where the one before ended (0 for the
    first: both pipelines start at the earliest offsets of a new topic).
    """

    def __init__(self, checkpoint: Path, topic: str) -> None:
        self.checkpoint, self.topic = checkpoint, topic
        self.logged: dict[int, dict[str, Any]] = {}

    def ranges(self) -> dict[int, dict[int, tuple[int, int]]]:
        directory = self.checkpoint / "offsets"
        if directory.is_dir():
            for entry in directory.iterdir():
                if not entry.name.isdigit() or int(entry.name) in self.logged:
                    continue
                try:
                    lines = entry.read_text(encoding="utf-8").splitlines()
                except FileNotFoundError:
                    continue  # purged by Spark since the listing
                if len(lines) > 2:
                    self.logged[int(entry.name)] = json.loads(lines[2])
        ranges: dict[int, dict[int, tuple[int, int]]] = {}
        previous: dict[str, int] = {}
        for batch in sorted(self.logged):
            offsets = self.logged[batch]
            ends = {partition: int(end) for partition, end in offsets.get(self.topic, {}).items()}
            starts = offsets.get("@starts", {}).get(self.topic)
            if starts is None:
                starts = {partition: previous.get(partition, 0) for partition in ends}
            ranges[batch] = {
                int(partition): (int(starts[partition]), end)
                for partition, end in ends.items()
                if partition in starts
            }
            previous = ends
        return ranges


def creation_times(bootstrap: str, topic: str) -> dict[tuple[int, int], float]:
    """(partition, offset) -> CreateTime in seconds, read back from the topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False}
    )
    ends = {}
    for partition in range(PARTITIONS):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        ends[partition] = high
    consumer.assign([TopicPartition(topic, partition, 0) for partition in range(PARTITIONS)])
    created: dict[tuple[int, int], float] = {}
    deadline = time.monotonic() + TIMEOUT
    while len(created) < sum(ends.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading back {topic}: {len(created)} of {sum(ends.values())}")
        for message in consumer.consume(10_000, timeout=1.0):
            if message.error() is None:
                created[(message.partition(), message.offset())] = message.timestamp()[1] / 1000
    consumer.close()
    return created


def event_latencies(
    ranges: dict[int, dict[int, tuple[int, int]]],
    visible_at: dict[int, float],
    created: dict[tuple[int, int], float],
) -> Iterator[tuple[float, float]]:
    """(creation time, latency) of every event of every visible batch."""
    for batch, partitions in ranges.items():
        if batch not in visible_at:
            continue
        for partition, (start, end) in partitions.items():
            for offset in range(start, end):
                at = created.get((partition, offset))
                if at is not None:
                    yield at, visible_at[batch] - at


def summarise(window: Window, events: list[tuple[float, float]]) -> Latencies:
    inside = sorted(
        (at, latency) for at, latency in events if window.measured_from <= at < window.ended
    )
    if not inside:
        raise RuntimeError(f"no event of the {window.rate:,}/s window was measured")
    third = max(len(inside) // 3, 1)
    first = sorted(latency for _, latency in inside[:third])
    last = sorted(latency for _, latency in inside[-third:])
    # Bounded lag: the last third's median within a trigger and a half of the first's.
    sustained = last[len(last) // 2] <= first[len(first) // 2] + 0.75
    return Latencies(window.rate, tuple(latency for _, latency in inside), sustained)


def run_guarantee(
    bootstrap: str,
    postgres: Any,
    guarantee: str,
    rates: list[int],
    seconds: float,
    backlog: int,
    peer_jars: list[Path] | None = None,
) -> tuple[list[Latencies], float]:
    """Steady windows at each rate, then a backlog drained: latencies and capacity.
    ``guarantee`` is eospack's delivery guarantee, or :data:`SPARK` for Spark's pipeline
    (its jars in ``peer_jars``)."""
    suffix = "spark" if guarantee == SPARK else guarantee.replace("-", "_")
    name = f"bench_latency_{suffix}_{int(time.time())}"
    topic = name
    workdir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    create_topic(bootstrap, topic, PARTITIONS)
    producer = Producer(bootstrap, topic)
    watcher = VisibilityWatcher(postgres.endpoint.url, f"{name}_history")
    driver: DriverProcess | None = None
    try:
        producer.send(PARTITIONS * 10)
        producer.close()
        if guarantee == SPARK:
            driver = spark_pipeline(
                name,
                bootstrap,
                topic,
                postgres,
                workdir,
                peer_jars or [],
                extra=[
                    "--name",
                    name,
                    "--tables",
                    "history",
                    "--trigger-interval",
                    TRIGGER_INTERVAL,
                    "--max-offsets-per-trigger",
                    str(MAX_OFFSETS_PER_TRIGGER),
                ],
            )
        else:
            driver = pipeline(
                name,
                bootstrap,
                topic,
                postgres,
                workdir,
                guarantee,
                MAX_OFFSETS_PER_TRIGGER,
                done=False,
                extra=["--tables", "history", "--trigger-interval", TRIGGER_INTERVAL],
            )
        watcher.start()
        offset_log = OffsetLog(workdir / name / "history", topic)

        def caught_up() -> bool:
            if driver is not None and driver.poll() is not None:
                raise RuntimeError(f"pipeline exited early:\n{driver.output(3000)}")
            if watcher.error is not None:
                raise RuntimeError(f"polling PostgreSQL failed: {watcher.error}")
            ranges = offset_log.ranges()
            covered = sum(
                end - start
                for batch, partitions in ranges.items()
                if batch in watcher.visible_at
                for start, end in partitions.values()
            )
            return covered >= producer.index

        wait_until(caught_up, TIMEOUT, "the pipeline's first visible batch", poll=0.05)
        windows = []
        for rate in rates:
            say(f"latency: {guarantee}, {rate:,} events/s for {seconds:.0f} s")
            windows.append(producer.steady(rate, seconds))
            wait_until(caught_up, TIMEOUT, f"the {rate:,}/s events to be visible", poll=0.05)
        say(f"latency: {guarantee}, a backlog of {backlog:,} events")
        backlog_started = time.time()
        producer.send(backlog)
        producer.close()
        wait_until(caught_up, TIMEOUT, "the backlog to drain", poll=0.01)
        capacity = backlog / (max(watcher.visible_at.values()) - backlog_started)
        ranges = offset_log.ranges()
    finally:
        watcher.stopped.set()
        watcher.join(10)
        if driver is not None:
            driver.kill()
    events = list(event_latencies(ranges, watcher.visible_at, creation_times(bootstrap, topic)))
    return [summarise(window, events) for window in windows], capacity


def run(report: Report, bootstrap: str, postgres: Any, quick: bool, peer_jars: list[Path]) -> None:
    """eospack's pipeline exactly-once and at-least-once, and Spark's own when its jars
    (``peer_jars``: Spark's Kafka connector, PostgreSQL's JDBC driver) are there."""
    rates = [P99_GOAL_RATE] if quick else [1_000, P99_GOAL_RATE, 20_000]
    seconds = 10.0 if quick else 20.0
    backlog = 100_000 if quick else 400_000
    results: dict[str, tuple[list[Latencies], float]] = {}
    contenders = ["exactly-once", "at-least-once"] + ([SPARK] if peer_jars else [])
    if not peer_jars:
        report.notes.append("latency: Spark's own pipeline left out (jars missing)")
    for guarantee in contenders:
        results[guarantee] = run_guarantee(
            bootstrap, postgres, guarantee, rates, seconds, backlog, peer_jars
        )
    for guarantee, (latencies, capacity) in results.items():
        for measured in latencies:
            lag = "bounded" if measured.sustained else "GROWING"
            report.notes.append(
                f"latency {guarantee} at {measured.rate:,} events/s: p50"
                f" {measured.percentile(0.5):.2f} s, p95 {measured.percentile(0.95):.2f} s,"
                f" p99 {measured.percentile(0.99):.2f} s over {len(measured.seconds):,}"
                f" events; lag {lag}"
            )
        report.notes.append(
            f"latency {guarantee}: capacity {capacity:,.0f} events/s (a {backlog:,}-event"
            " backlog drained)"
        )
    settings = (
        f"processingTime {TRIGGER_INTERVAL}, maxOffsetsPerTrigger {MAX_OFFSETS_PER_TRIGGER:,},"
        f" {PARTITIONS} partitions, {KEYS:,} keys, 2 shuffle partitions, 8 key groups"
    )
    report.notes.append(
        f"latency settings: {settings}; first {WARM_UP_SECONDS:.0f} s of each rate not"
        " measured; visibility polled every 5 ms"
    )
    if SPARK in results:
        report.notes.append(
            f"latency peer: {SPARK} (Spark's Kafka source, groupBy(key).count(), Spark's JDBC"
            " writer appending each batch's counts with its batch id in foreachBatch,"
            " at-least-once), same trigger, same visibility measure"
        )
    exactly_once = {m.rate: m for m in results["exactly-once"][0]}
    at_least_once = {m.rate: m for m in results["at-least-once"][0]}
    p99 = exactly_once[P99_GOAL_RATE].percentile(0.99)
    report.add(
        Comparison(
            "8. latency p99",
            f"{P99_GOAL_RATE:,} events/s",
            Figure("exactly-once p99", (p99,), 1, "s"),
            Figure("the goal", (P99_GOAL_SECONDS,), 1, "s"),
            target=1.0,
            higher_is_better=False,
        )
    )
    report.add(
        Comparison(
            "8. latency p99",
            f"{P99_GOAL_RATE:,} events/s",
            Figure("exactly-once p99", (p99,), 1, "s"),
            Figure("at-least-once p99", (at_least_once[P99_GOAL_RATE].percentile(0.99),), 1, "s"),
            target=AT_LEAST_ONCE_MARGIN,
            higher_is_better=False,
        )
    )
    if SPARK in results:
        spark_p99 = {m.rate: m for m in results[SPARK][0]}[P99_GOAL_RATE].percentile(0.99)
        report.add(
            Comparison(
                "8. latency p99",
                f"{P99_GOAL_RATE:,} events/s",
                Figure("exactly-once p99", (p99,), 1, "s"),
                Figure(f"{SPARK} p99", (spark_p99,), 1, "s"),
                higher_is_better=False,
            )
        )
    capacity = results["exactly-once"][1]
    report.add(
        Comparison(
            "8. sustained rate",
            f"{backlog:,}-event backlog",
            Figure("exactly-once", (1.0,), capacity, "events/s"),
            Figure("the goal", (1.0,), SUSTAINED_GOAL, "events/s"),
            target=1.0,
        )
    )
    report.add(
        Comparison(
            "8. sustained rate",
            f"{backlog:,}-event backlog",
            Figure("exactly-once", (1.0,), capacity, "events/s"),
            Figure("at-least-once", (1.0,), results["at-least-once"][1], "events/s"),
        )
    )
    if SPARK in results:
        report.add(
            Comparison(
                "8. sustained rate",
                f"{backlog:,}-event backlog",
                Figure("exactly-once", (1.0,), capacity, "events/s"),
                Figure(SPARK, (1.0,), results[SPARK][1], "events/s"),
            )
        )
