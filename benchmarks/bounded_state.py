"""18. Bounded state under ttl (issue 41): does a ``running_count`` with a processing-time
``ttl`` keep its state bounded while new keys keep arriving?

The goal: a 30-minute run with 1M new keys per 5 minutes and a 5-minute ttl keeps the state
at <= 2M keys. The query is ``running_count(events, "key", ttl=...)`` on RocksDB (changelog
checkpointing) into Spark's ``noop`` sink, ``local[2]``, a micro-batch every
``TRIGGER_SECONDS``. Its input is Spark's ``rate`` source at a steady rate
(``keys_per_period / period`` rows per second): row ``v`` brings the new key ``key-v``, and
every ``REPEAT_EVERY``-th row also repeats the key seen a fifth of the ttl earlier (a live
key, whose ttl it renews), so expiry is tested both on keys seen once and on keys touched
again. At that rate the state should settle near ``rate * ttl * 1.02`` keys (plus the
batches not yet visited): the goal allows twice the keys of one period.

Every ``sample_seconds`` (a minute in the full run) the keys in state after the last
completed batch are counted with eospack's state reader (``state_frame(...).rows``: keys,
not key groups; expired keys still stored count too) and printed on stderr, one line per
sample; the batches' durations come from the query's progress reports. The report gives
the most keys held, the keys at the end, the batch duration percentiles, and the verdict
against the goal (``2 * keys_per_period``).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import Comparison, Figure, Report, say

BENCHMARK = "18. bounded state under ttl"
TRIGGER_SECONDS = 10
"""The query's processing-time trigger: a batch every 10 s while batches keep up."""
REPEAT_EVERY = 10
"""One row in ten also repeats a live key (seen ``REPEAT_AGE`` of the ttl earlier)."""
REPEAT_AGE = 0.2
PROGRESS_POLL_SECONDS = 2.0
"""How often the query's progress reports are collected (Spark keeps the last 100)."""


@dataclass(frozen=True)
class Load:
    """What the source offers and how long: ``keys_per_period`` new keys every
    ``period_seconds``, a ``ttl_seconds`` ttl, for ``minutes``."""

    minutes: float
    keys_per_period: int
    period_seconds: float
    ttl_seconds: float
    trigger_seconds: float = TRIGGER_SECONDS

    @property
    def rows_per_second(self) -> int:
        """The rate source's rate (whole rows per second, rounded up: never fewer keys)."""
        return math.ceil(self.keys_per_period / self.period_seconds)

    @property
    def goal_keys(self) -> int:
        """Issue 41's bound: twice the new keys of one period."""
        return 2 * self.keys_per_period

    @property
    def expected_keys(self) -> int:
        """The keys a perfectly timely expiry holds: each new key for one ttl, the repeated
        ones ``REPEAT_AGE`` of a ttl longer."""
        return round(self.rows_per_second * self.ttl_seconds * (1 + REPEAT_AGE / REPEAT_EVERY))

    @property
    def sample_seconds(self) -> float:
        """A sample a minute; shorter runs sample at least 8 times."""
        return min(60.0, self.minutes * 60 / 8)

    def describe(self) -> str:
        return (
            f"{self.minutes:g} min, {self.keys_per_period:,} new keys per"
            f" {_duration(self.period_seconds)}, ttl {_duration(self.ttl_seconds)}"
        )


@dataclass(frozen=True)
class Sample:
    """The keys in state after batch ``batch_id``, counted ``elapsed`` s into the run."""

    elapsed: float
    batch_id: int
    keys: int
    count_seconds: float
    load_average: float
    """The machine's 1-minute load average then (other processes share the cores)."""


@dataclass
class Measurement:
    checkpoint: str
    samples: list[Sample] = field(default_factory=list)
    batch_seconds: dict[int, float] = field(default_factory=dict)
    """Each batch's ``triggerExecution`` duration, by batch id."""
    input_rows: dict[int, int] = field(default_factory=dict)
    run_seconds: float = 0.0

    @property
    def max_keys(self) -> int:
        return max((sample.keys for sample in self.samples), default=0)

    @property
    def end_keys(self) -> int:
        return self.samples[-1].keys if self.samples else 0

    def percentile(self, fraction: float) -> float:
        """The batch duration at ``fraction`` (nearest rank) of the batches, in seconds."""
        durations = sorted(self.batch_seconds.values())
        if not durations:
            return 0.0
        return durations[min(len(durations) - 1, max(0, math.ceil(fraction * len(durations)) - 1))]


def events(spark: Any, load: Load) -> Any:
    """One ``key string`` row per rate-source row (a new key), plus a repeat of a live key
    on every ``REPEAT_EVERY``-th row once the run is old enough to have one."""
    from pyspark.sql import functions as F

    lag = repeat_lag(load)
    value = F.col("value")
    new = F.concat(F.lit("key-"), value.cast("string"))
    repeated = F.concat(F.lit("key-"), (value - F.lit(lag)).cast("string"))
    keys = F.when((value % REPEAT_EVERY == 0) & (value >= lag), F.array(new, repeated)).otherwise(
        F.array(new)
    )
    rate = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", load.rows_per_second)
        .option("numPartitions", 2)
        .load()
    )
    return rate.select(F.explode(keys).alias("key"))


def repeat_lag(load: Load) -> int:
    """How many rows back a repeated key was new: ``REPEAT_AGE`` of a ttl at the rate."""
    return max(1, round(load.rows_per_second * load.ttl_seconds * REPEAT_AGE))


def keys_of_rows(load: Load, first: int, end: int) -> list[str]:
    """The keys ``events`` makes of the rate source's values ``first`` to ``end``
    (exclusive), in order: what a test replays to know the state exactly."""
    lag = repeat_lag(load)
    keys = []
    for value in range(first, end):
        keys.append(f"key-{value}")
        if value % REPEAT_EVERY == 0 and value >= lag:
            keys.append(f"key-{value - lag}")
    return keys


def keys_in_state(spark: Any, checkpoint: str, batch_id: int) -> int:
    """The keys stored after ``batch_id`` (eospack's state reader: keys, not key groups)."""
    from eospack.stateful_ops.state_reader import state_frame

    stored = state_frame(spark, checkpoint, batch_id)
    return 0 if stored is None else stored.rows


def measure(
    spark: Any,
    load: Load,
    work: Path,
    progress: Callable[[str], None] | None = None,
) -> Measurement:
    """Run the query for ``load.minutes`` on ``spark`` (RocksDB state store for this query)
    and sample it; ``progress`` receives one line per sample (stderr by default)."""
    from eospack.lab.testing import session_settings
    from eospack.stateful_ops import running_count
    from eospack.stateful_ops.state_store import state_store_conf

    show = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    checkpoint = str(work / "checkpoint")
    measurement = Measurement(checkpoint)
    with session_settings(spark, state_store_conf("rocksdb", changelog=True)):
        counts = running_count(
            events(spark, load), "key", ttl=f"{round(load.ttl_seconds * 1000)} ms"
        )
        query = (
            counts.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .outputMode("update")
            .trigger(processingTime=f"{round(load.trigger_seconds * 1000)} milliseconds")
            .start()
        )
    started = time.monotonic()
    end = started + load.minutes * 60
    next_sample = started + load.sample_seconds
    try:
        while True:
            now = time.monotonic()
            if query.exception() is not None:
                raise RuntimeError(f"bounded state: the query failed: {query.exception()}")
            collect_progress(query, measurement)
            if now >= next_sample or now >= end:
                take_sample(spark, checkpoint, measurement, started, show)
                next_sample += load.sample_seconds
            if now >= end:
                break
            time.sleep(min(PROGRESS_POLL_SECONDS, max(0.0, min(next_sample, end) - now)))
    finally:
        query.stop()
    measurement.run_seconds = time.monotonic() - started
    collect_progress(query, measurement)
    take_sample(spark, checkpoint, measurement, started, show)  # the state at the end
    return measurement


def collect_progress(query: Any, measurement: Measurement) -> None:
    """Each completed batch's duration and rows (Spark keeps the last 100 reports: polled
    every ``PROGRESS_POLL_SECONDS``, none is missed while batches take longer)."""
    for report in query.recentProgress:
        duration = report.durationMs.get("triggerExecution")
        if duration is not None:
            measurement.batch_seconds[report.batchId] = duration / 1000
            measurement.input_rows[report.batchId] = report.numInputRows


def take_sample(
    spark: Any,
    checkpoint: str,
    measurement: Measurement,
    started: float,
    show: Callable[[str], None],
) -> None:
    """Count the keys after the last completed batch (skipped before the first one)."""
    if not measurement.batch_seconds:
        show(f"bounded state: {time.monotonic() - started:6.0f} s: no batch completed yet")
        return
    batch_id = max(measurement.batch_seconds)
    if measurement.samples and measurement.samples[-1].batch_id == batch_id:
        return
    counting = time.monotonic()
    keys = keys_in_state(spark, checkpoint, batch_id)
    sample = Sample(
        counting - started, batch_id, keys, time.monotonic() - counting, os.getloadavg()[0]
    )
    measurement.samples.append(sample)
    recent = [measurement.batch_seconds[b] for b in sorted(measurement.batch_seconds)[-6:]]
    show(
        f"bounded state: {sample.elapsed:6.0f} s: batch {batch_id}: {keys:,} keys in state"
        f" (counted in {sample.count_seconds:.1f} s); last batches"
        f" {', '.join(f'{s:.1f}' for s in recent)} s; load {sample.load_average:.1f}"
    )


def add_rows(report: Report, load: Load, measurement: Measurement, load_average: str) -> None:
    """The verdict (most keys held against the goal), batch percentiles and the notes."""
    size = load.describe()
    report.add(
        Comparison(
            BENCHMARK,
            size,
            Figure("most keys held", (float(measurement.max_keys),), 1, "keys"),
            Figure("the goal", (float(load.goal_keys),), 1, "keys"),
            target=1.0,
            higher_is_better=False,
        )
    )
    report.add_figure(
        BENCHMARK, Figure("keys at the end", (float(measurement.end_keys),), 1, "keys")
    )
    for label, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0)):
        report.add_figure(
            BENCHMARK,
            Figure(f"batch duration {label}", (measurement.percentile(fraction),), 1, "s"),
        )
    rows = sum(measurement.input_rows.values())
    samples = "; ".join(
        f"{sample.elapsed / 60:.1f} min {sample.keys:,} (load {sample.load_average:.1f})"
        for sample in measurement.samples
    )
    durations = list(measurement.batch_seconds.values())
    report.notes.append(
        f"bounded state ({size}; rate source {load.rows_per_second:,} rows/s plus one repeat"
        f" of a live key per {REPEAT_EVERY} rows; RocksDB, noop sink, trigger"
        f" {load.trigger_seconds:g} s):"
        f" {len(durations)} batches, {rows:,} rows in {measurement.run_seconds / 60:.1f} min"
        f" ({rows / max(measurement.run_seconds, 1e-9):,.0f} rows/s); keys in state most"
        f" {measurement.max_keys:,}, at the end {measurement.end_keys:,} (timely expiry"
        f" would hold about {load.expected_keys:,}); batch duration mean"
        f" {statistics.fmean(durations) if durations else 0:.2f} s; load average"
        f" {load_average}"
    )
    report.notes.append(f"bounded state: keys in state, by time into the run: {samples}")


def run(report: Report, load: Load, load_average: Callable[[], str]) -> None:
    """The benchmark in a Spark session of its own (the on-demand benchmarks' way)."""
    from eospack.tools.spark import local_session

    say(f"bounded state: {load.describe()}, {load.rows_per_second:,} rows/s")
    spark = local_session("eospack-bounded-state-benchmark")
    work = Path(tempfile.mkdtemp(prefix="eospack-bounded-state-"))
    try:
        measurement = measure(spark, load, work)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    add_rows(report, load, measurement, load_average())


def duration_seconds(text: str) -> float:
    """A command-line duration ("5 minutes", "30 seconds", "500 ms") in seconds."""
    import argparse

    from eospack.stateful_ops.errors import OperatorDefinitionError
    from eospack.stateful_ops.validation import duration_ms

    try:
        return duration_ms("bounded-state", "duration", text) / 1000
    except OperatorDefinitionError as error:
        raise argparse.ArgumentTypeError(str(error).split(": ", 1)[-1]) from None


def _duration(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
