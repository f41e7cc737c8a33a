"""10. A micro-batch's fixed cost, phase by phase: the demo pipeline's query against Spark's own.

Both queries run in the benchmark's session, one after the other, with a ``processingTime``
trigger of 500 ms: eospack's (replayable-kafka -> running_count -> 2pc-jdbc, exactly-once)
and the same written with Spark alone (its Kafka source, ``groupBy(key).count()``, its JDBC
writer in ``foreachBatch``, at-least-once). Each is fed, one batch at a time:

- batches of 1,000 keyed events (the steady case), and
- batches with no new input: an aborted Kafka transaction moves the end offset past its
  records and marker, and both sources read committed data only, so the batch runs every
  step (read planning, tasks, state, sink, commit) on zero rows.

Where the time goes comes from Spark's own accounting: each batch's ``durationMs``
(offset lookup, planning, write-ahead log, the batch's run, the commit log) and, from
Spark's event log, the wall time of the batch's first stage (the source's read tasks;
Spark's also pre-aggregate) and of the rest (state and sink tasks). What is left of the
batch's run after its stages is driver work: for eospack the sink's commit through
Spark's Python commit runner, for Spark the ``foreachBatch`` call around its job.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.harness import Comparison, Figure, Report, say
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.lab.testing import wait_until

PARTITIONS = 4
KEYS = 1_000
ROWS_PER_BATCH = 1_000
EMPTY_GOAL_SECONDS = 0.3
TRIGGER = "500 milliseconds"
TIMEOUT = 120.0
PHASES = (
    ("latestOffset", "offset lookup (latestOffset)"),
    ("queryPlanning", "planning"),
    ("walCommit", "offset log (walCommit)"),
    ("read stage", "read tasks (first stage)"),
    ("state and write stages", "state and sink tasks (later stages)"),
    ("driver", "driver: sink commit / foreachBatch"),
    ("commitOffsets", "commit log (commitOffsets)"),
    ("triggerExecution", "whole batch (triggerExecution)"),
)


@dataclass(frozen=True)
class BatchCost:
    """Milliseconds per phase of one micro-batch."""

    phases: dict[str, float]


def event_log_settings(directory: Path) -> dict[str, str]:
    """The session settings under which :func:`event_log_stages` can read the stages."""
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def event_log_stages(event_log: Path, query_id: str) -> dict[int, tuple[float, float, float]]:
    """Batch id -> (wall ms of its jobs, of its first stage, of its later stages)."""
    files = sorted(
        (path for path in event_log.rglob("*") if path.is_file()),
        key=lambda path: path.stat().st_mtime,
    )
    if not files:
        return {}
    jobs: dict[int, dict[str, Any]] = {}
    stage_times: dict[int, tuple[int, int]] = {}
    with files[-1].open(encoding="utf-8") as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break  # the line Spark is writing
            kind = event["Event"]
            if kind == "SparkListenerJobStart":
                description = event.get("Properties", {}).get("spark.job.description") or ""
                if f"id = {query_id}" not in description or "batch = " not in description:
                    continue
                batch = int(description.rsplit("batch = ", 1)[1].split()[0])
                jobs[event["Job ID"]] = {
                    "batch": batch,
                    "start": event["Submission Time"],
                    "stages": event["Stage IDs"],
                }
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in jobs:
                jobs[event["Job ID"]]["end"] = event["Completion Time"]
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                if "Submission Time" in info:
                    stage_times[info["Stage ID"]] = (
                        info["Submission Time"],
                        info["Completion Time"],
                    )
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for job in jobs.values():
        if "end" in job:
            by_batch.setdefault(job["batch"], []).append(job)
    result = {}
    for batch, batch_jobs in by_batch.items():
        ran = [stage_times[s] for job in batch_jobs for s in job["stages"] if s in stage_times]
        if not ran:
            continue
        ran.sort()
        first_end = ran[0][1]
        later_end = max(end for _, end in ran)
        wall = sum(job["end"] - job["start"] for job in batch_jobs)
        result[batch] = (float(wall), float(first_end - ran[0][0]), float(later_end - first_end))
    return result


def aborted_transaction(bootstrap: str, topic: str, transactional_id: str) -> None:
    """Ten records in a transaction that is aborted: offsets move, no committed row."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for index in range(10):
        producer.produce(topic, key=b"aborted", value=b"x", partition=index % PARTITIONS)
    producer.flush(30)
    producer.abort_transaction(30)


def keyed_rows(bootstrap: str, topic: str, start: int) -> None:
    records = (
        Record(index % PARTITIONS, f"key-{index * 7919 % KEYS:05d}".encode(), b"x" * 90)
        for index in range(start, start + ROWS_PER_BATCH)
    )
    produce_sealed(bootstrap, topic, records, linger_ms=20)


def measure_query(
    query: Any,
    event_log: Path,
    feed: Callable[[], None],
    wanted: Callable[[int], bool],
    batches: int,
) -> list[BatchCost]:
    """Feed ``batches`` times; each time wait for the next batch to end. A feed split
    between two batches leaves batches that ``wanted`` (rows) leaves out."""
    costs: list[tuple[int, int, dict[str, float]]] = []
    for _ in range(batches):
        last = query.lastProgress["batchId"] if query.lastProgress else -1
        feed()

        def ran(last: int = last) -> Any:
            if query.exception() is not None:
                raise RuntimeError(f"{query.name} failed: {query.exception()}")
            progress = query.lastProgress
            return progress if progress and progress["batchId"] > last else None

        progress = wait_until(ran, TIMEOUT, f"{query.name}'s next batch", poll=0.02)
        costs.append((progress["batchId"], progress["numInputRows"], dict(progress["durationMs"])))

    def logged() -> dict[int, tuple[float, float, float]] | None:
        found = event_log_stages(event_log, str(query.id))
        return found if all(batch in found for batch, _, _ in costs) else None

    stages = wait_until(logged, TIMEOUT, "the event log to hold every measured batch", poll=0.2)
    result = []
    for batch, rows, durations in costs:
        if not wanted(rows):
            continue
        wall, first, later = stages[batch]
        phases = {name: float(durations.get(name, 0)) for name, _ in PHASES if name in durations}
        phases["read stage"] = first
        phases["state and write stages"] = later
        phases["driver"] = max(float(durations.get("addBatch", 0)) - wall, 0.0)
        result.append(BatchCost(phases))
    if not result:
        raise RuntimeError(f"{query.name}: no batch of the wanted size ran")
    return result


def medians(costs: list[BatchCost]) -> dict[str, float]:
    return {
        name: statistics.median(cost.phases.get(name, 0.0) for cost in costs) for name, _ in PHASES
    }


def eospack_query(
    spark: Any, bootstrap: str, topic: str, postgres: Any, workdir: Path, run: str = "steady"
) -> Any:
    """The demo pipeline's query; each ``run`` has its own checkpoint and table."""
    from eospack.stateful_ops import running_count

    events = (
        spark.readStream.format("replayable-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
    )
    return (
        running_count(events, "key", output_mode="append")
        .writeStream.format("2pc-jdbc")
        .queryName(f"{topic}_eospack_{run}")
        .option("url", postgres.endpoint.jdbc_url)
        .option("user", postgres.endpoint.user)
        .option("dbtable", f"{topic}_eospack_{run}")
        .option("createTableIfNotExists", "true")
        .option("writeMode", "append")
        .option("batchIdColumn", "batch_id")
        .option("checkpointLocation", str(workdir / f"{topic}_eospack_{run}"))
        .trigger(processingTime=TRIGGER)
        .start()
    )


def spark_query(
    spark: Any,
    bootstrap: str,
    topic: str,
    postgres: Any,
    workdir: Path,
    isolation: str = "read_uncommitted",
) -> Any:
    """Spark's pipeline; its source reads ``isolation`` (Spark's default read_uncommitted
    for the steady batches; read_committed, as a user of transactions sets it, for the
    batches without new input, which aborted records would otherwise fill)."""
    url, user = postgres.endpoint.jdbc_url, postgres.endpoint.user

    def write(batch: Any, batch_id: int) -> None:
        batch.write.jdbc(
            url,
            f"{topic}_spark",
            mode="append",
            properties={"user": user, "driver": "org.postgresql.Driver"},
        )

    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", isolation)
        .load()
        .selectExpr("CAST(key AS STRING) AS key")
        .groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .queryName(f"{topic}_spark_{isolation}")
        .foreachBatch(write)
        .option("checkpointLocation", str(workdir / f"{topic}_spark_{isolation}"))
        .trigger(processingTime=TRIGGER)
        .start()
    )


def run(
    report: Report,
    spark: Any,
    bootstrap: str,
    postgres: Any,
    workdir: Path,
    event_log: Path,
    batches: int,
    spark_peer: bool,
) -> None:
    """Steady and empty batches of both queries; the comparisons and the phase table."""
    # (label, topic name, the query for steady batches, the query for empty ones)
    contenders = [("eospack", "eospack", eospack_query, partial(eospack_query, run="empty"))]
    if spark_peer:
        read_committed = partial(spark_query, isolation="read_committed")
        contenders.append(("Spark's own", "spark", spark_query, read_committed))
    else:
        report.notes.append("micro-batch: Spark's own pipeline left out (jars missing)")
    steady: dict[str, list[BatchCost]] = {}
    empty: dict[str, list[BatchCost]] = {}
    for label, name, steady_query, empty_query in contenders:
        topic = f"bench_batch_{name}_{int(time.time())}"
        create_topic(bootstrap, topic, PARTITIONS)
        fed = [0]

        def rows(topic: str = topic, fed: list[int] = fed) -> None:
            keyed_rows(bootstrap, topic, fed[0])
            fed[0] += ROWS_PER_BATCH

        def nothing(topic: str = topic) -> None:
            aborted_transaction(bootstrap, topic, f"{topic}-aborter")

        rows()
        for kind, start_query in (("steady", steady_query), ("empty", empty_query)):
            query = start_query(spark, bootstrap, topic, postgres, workdir)
            try:
                wait_until(
                    lambda query=query: (
                        query.lastProgress is not None and query.lastProgress["numInputRows"] > 0
                    ),
                    TIMEOUT,
                    f"{label}'s first batch",
                    poll=0.05,
                )
                if kind == "steady":
                    say(f"micro-batch: {label}, {batches} batches of {ROWS_PER_BATCH:,} rows")
                    steady[label] = measure_query(
                        query, event_log, rows, lambda n: n >= ROWS_PER_BATCH // 2, batches
                    )
                else:
                    say(f"micro-batch: {label}, {batches} batches without new input")
                    empty[label] = measure_query(
                        query, event_log, nothing, lambda n: n == 0, batches
                    )
            finally:
                query.stop()
    report_costs(report, steady, empty)


def report_costs(
    report: Report, steady: dict[str, list[BatchCost]], empty: dict[str, list[BatchCost]]
) -> None:
    def figure(label: str, costs: list[BatchCost]) -> Figure:
        seconds = tuple(cost.phases["triggerExecution"] / 1000 for cost in costs)
        return Figure(label, seconds, 1, "s")

    eospack_empty = figure("eospack, no new input", empty["eospack"])
    report.add(
        Comparison(
            "10. micro-batch cost",
            "no new input",
            eospack_empty,
            Figure("the goal", (EMPTY_GOAL_SECONDS,), 1, "s"),
            target=1.0,
            higher_is_better=False,
        )
    )
    if "Spark's own" in steady:
        report.add(
            Comparison(
                "10. micro-batch cost",
                "no new input",
                eospack_empty,
                figure("Spark's own pipeline", empty["Spark's own"]),
                higher_is_better=False,
            )
        )
        report.add(
            Comparison(
                "10. micro-batch cost",
                f"{ROWS_PER_BATCH:,} rows",
                figure("eospack", steady["eospack"]),
                figure("Spark's own pipeline", steady["Spark's own"]),
                higher_is_better=False,
            )
        )
    columns = [
        (f"{label}, {kind}", costs[label])
        for kind, costs in ((f"{ROWS_PER_BATCH:,} rows", steady), ("no input", empty))
        for label in costs
    ]
    table = [
        "micro-batch phases, medians in ms ("
        + "; ".join(f"{name}: {len(costs)} batches" for name, costs in columns)
        + "):",
        "",
        "| phase | " + " | ".join(name for name, _ in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    per_column = [medians(costs) for _, costs in columns]
    for key, description in PHASES:
        table.append(f"| {description} | " + " | ".join(f"{m[key]:.0f}" for m in per_column) + " |")
    report.notes.append("\n".join(table))
