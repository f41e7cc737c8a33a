"""1. The fixed cost per query of replayable-kafka against Spark's own Kafka source (JVM).

The same query as the source benchmark (AvailableNow from the earliest offsets,
read_committed, the noop sink, a fresh checkpoint) over a topic of one record, on the
shared warm session, both sources alternating after one warm-up each: what a query costs
whatever it reads. ``python -m benchmarks --only fixed-cost`` runs it alone; the source
benchmark reports the same row after its large topics.

Where the time goes comes from each query's progress: the time outside any micro-batch
(query start and end; for replayable-kafka mostly its source runner, a fresh Python
process per query, and the first metadata answer) and the phases of batch 0 (planning
offsets, reading, the logs' commits).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

from benchmarks.data import fill_topic
from benchmarks.harness import Comparison, Figure, Report, say
from benchmarks.spark_reads import read_with_spark

TIMEOUT = 120.0
GOAL_SECONDS = 1.5
# The phases of batch 0 reported (the options both sources get: benchmarks.spark_reads).
BATCH_PHASES = (
    "latestOffset",
    "getBatch",
    "queryPlanning",
    "addBatch",
    "walCommit",
    "commitOffsets",
)


def timed_query(spark, bootstrap: str, topic: str, source: str) -> tuple[float, dict[str, float]]:
    """Seconds of one AvailableNow query over ``topic`` (start to end, as a user waits for
    it) and seconds by phase: "outside batches" and batch 0's durations."""
    started = time.perf_counter()
    query = read_with_spark(spark, bootstrap, topic, source)
    seconds = time.perf_counter() - started
    progress = [dict(p["durationMs"]) for p in query.recentProgress]
    in_batches = sum(p.get("triggerExecution", 0) for p in progress) / 1000
    phases = {"outside batches": seconds - in_batches}
    first: Mapping[str, int] = progress[0] if progress else {}
    phases.update({name: first.get(name, 0) / 1000 for name in BATCH_PHASES})
    return seconds, phases


def run(report: Report, spark, bootstrap: str, repetitions: int, spark_kafka: bool) -> Figure:
    """Add the fixed-cost row (with Spark's source as the peer when on the classpath) and a
    note of where the time goes; return replayable-kafka's figure."""
    topic = f"bench_fixed_cost_{time.time_ns()}"
    fill_topic(bootstrap, topic, 1, partitions=1)
    contenders = ["replayable-kafka", *(["kafka"] if spark_kafka else [])]
    # A query takes about a second: at least five repetitions for a steady median.
    repetitions = max(repetitions, 5)
    say(f"fixed cost: {' and '.join(contenders)} over a one-record topic, {repetitions} times")
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    phases: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for index in range(repetitions + 1):
        for name in contenders:
            elapsed, split = timed_query(spark, bootstrap, topic, name)
            if index > 0:  # the first round warms both up
                seconds[name].append(elapsed)
                phases[name].append(split)
    ours = Figure("replayable-kafka, one record", tuple(seconds["replayable-kafka"]), 1, "s")
    if spark_kafka:
        jvm = Figure("Spark's kafka source, one record", tuple(seconds["kafka"]), 1, "s")
        report.add(
            Comparison(
                "1. source: fixed cost per query", "1 record", ours, jvm, higher_is_better=False
            )
        )
    else:
        report.add_figure("1. source: fixed cost per query", ours)
    met = "met" if ours.median_seconds <= GOAL_SECONDS else "NOT met"
    breakdown = "; ".join(f"{name}: {_describe(phases[name])}" for name in contenders)
    report.notes.append(
        f"fixed cost per query: replayable-kafka {ours.median_seconds:.2f} s, goal"
        f" <= {GOAL_SECONDS} s {met}. Medians by phase (s): {breakdown}"
    )
    return ours


def _describe(runs: list[dict[str, float]]) -> str:
    names = list(runs[0]) if runs else []
    return ", ".join(
        f"{name} {statistics.median(run[name] for run in runs):.2f}"
        for name in names
        if statistics.median(run[name] for run in runs) >= 0.005 or name == "outside batches"
    )
