"""4. The stateful operators versus Spark's built-in streaming operators, same data, same run.

Every contender reads the same Parquet files (one file per micro-batch, ``maxFilesPerTrigger``
1, ``Trigger.AvailableNow``) into Spark's ``noop`` sink, on the session's state store, so a
row's ratio is the operator's cost against Spark's own for the same output. The two contenders
of a row take turns (see ``measure_alternating``); only the first row has a warm-up run of
each, the later rows find the JVM and the Python workers warm, which keeps ``--only stateful``
near five minutes on 2 cores:

- ``running_count(df, "key")`` versus ``groupBy("key").count()`` (update mode): the same
  counts per key changed in a batch, at 10k keys (dense: every batch touches every key) and at
  as many keys as rows (every batch brings new keys, state grows to 1M keys).
- ``deduplicate(df, "key", ttl, event_time="ts")`` versus ``dropDuplicatesWithinWatermark
  ("key")`` with a watermark delay equal to ``ttl`` (append mode). That is the built-in with
  deduplicate's semantics: a key is remembered from its first row until the watermark passes
  that row's event time plus ``ttl`` (Spark: plus the watermark delay), repeats in between are
  dropped, and the key column does not include the event time. ``dropDuplicates`` with a
  watermark would need the event time among the key columns (a duplicate must then carry the
  same timestamp), which is another operator. The one difference: among a key's new rows in
  one batch deduplicate emits the earliest event time and Spark an arbitrary one; the number
  of rows emitted is the same.
- ``sessionize(df, "key", "ts", gap)`` versus ``groupBy(session_window("ts", gap),
  "key").count()`` (append mode, same watermark): both emit, once the watermark passes a
  session's end, the key, the session's start (first event), end (last event + gap) and the
  number of events.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.data import keyed_parquet_directory
from benchmarks.harness import Comparison, Figure, Report, say
from eospack.lab.testing import await_query, session_settings
from eospack.stateful_ops.state_store import state_store_conf

TIMEOUT = 900.0
FILES = 5
# Events: one per millisecond; every BURST_ROWS rows a pause of PAUSE_MS closes the sessions.
BURST_ROWS = 50_000
PAUSE_MS = 60_000
EVENT_KEYS = 10_000
DEDUPLICATE_KEYS = 100_000
TTL = "10 minutes"
GAP = "30 seconds"
WATERMARK = "10 seconds"


def event_parquet_directory(directory: Path, rows: int, keys: int, files: int) -> Path:
    """``rows`` rows of (key string, ts timestamp, value long) over ``keys`` keys.

    Row i happens at i ms plus ``PAUSE_MS`` per ``BURST_ROWS`` rows before it; key i * 7919 mod
    ``keys`` (every key in turn, each ``keys`` rows apart).
    """
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for index in range(files):
        start = index * per_file
        positions = np.arange(start, min(start + per_file, rows), dtype=np.int64)
        micros = (positions + positions // BURST_ROWS * PAUSE_MS) * 1000 + 1_767_225_600_000_000
        table = pa.table(
            {
                "key": pa.array(np.char.add("k", (positions * 7919 % keys).astype(str))),
                "ts": pa.array(micros, pa.timestamp("us")),
                "value": pa.array(positions),
            }
        )
        pq.write_table(table, directory / f"part-{index:05d}.parquet")
    return directory


def run_stream(spark, directory: Path, schema: str, query: Callable, output_mode: str) -> None:
    events = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))
    started = (
        query(events)
        .writeStream.format("noop")
        .outputMode(output_mode)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="bench-stateful-"))
        .trigger(availableNow=True)
        .start()
    )
    await_query(started, TIMEOUT)


def running_count_query(events):
    from eospack.stateful_ops import running_count

    return running_count(events, "key")


def count_query(events):
    return events.groupBy("key").count()


def deduplicate_query(events):
    from eospack.stateful_ops import deduplicate

    return deduplicate(events.withWatermark("ts", TTL), "key", TTL, event_time="ts")


def drop_duplicates_query(events):
    return events.withWatermark("ts", TTL).dropDuplicatesWithinWatermark(["key"])


def sessionize_query(events):
    from eospack.stateful_ops import sessionize

    return sessionize(events.withWatermark("ts", WATERMARK), "key", "ts", GAP)


def session_window_query(events):
    from pyspark.sql import functions as F

    sessions = (
        events.withWatermark("ts", WATERMARK)
        .groupBy(F.session_window("ts", GAP).alias("session"), "key")
        .count()
    )
    return sessions.select(
        "key",
        F.col("session.start").alias("session_start"),
        F.col("session.end").alias("session_end"),
        "count",
    )


def measure_alternating(
    runs: list[Callable[[], object]], repetitions: int, warmups: int
) -> list[tuple[float, ...]]:
    """Seconds per repetition of each run, the contenders taking turns (A B A B ...).

    On a machine shared with other jobs the load drifts within a minute; measured one after
    the other (A A A B B B) a contender's median takes whatever load its block met, and the
    ratio moved by up to 1.5x between runs of the same code (11-26). Taking turns puts both
    medians under the same load.
    """
    timings: list[list[float]] = [[] for _ in runs]
    for index in range(warmups + repetitions):
        for position, run in enumerate(runs):
            started = time.perf_counter()
            run()
            if index >= warmups:
                timings[position].append(time.perf_counter() - started)
    return [tuple(seconds) for seconds in timings]


def compare(
    report: Report,
    spark,
    name: str,
    size: str,
    directory: Path,
    schema: str,
    rows: int,
    repetitions: int,
    contenders: tuple[tuple[str, Callable], tuple[str, Callable]],
    output_mode: str,
    target: float,
    warmups: int,
) -> None:
    runs = [
        lambda q=query: run_stream(spark, directory, schema, q, output_mode)
        for _, query in contenders
    ]
    timings = measure_alternating(runs, repetitions, warmups)
    figures = [
        Figure(label, seconds, rows)
        for (label, _), seconds in zip(contenders, timings, strict=True)
    ]
    report.add(Comparison(name, size, figures[0], figures[1], target))


@contextmanager
def state_store(spark, provider: str | None) -> Iterator[None]:
    """Queries started inside use ``provider`` (None: the session's store), both contenders."""
    if provider is None:
        yield
        return
    with session_settings(spark, state_store_conf(provider)):
        yield


def run(report: Report, spark, workdir: Path, rows: int, keys: int, repetitions: int) -> None:
    """The four rows: running_count at ``keys`` and at ``rows`` keys, deduplicate, sessionize.

    The row with as many keys as rows runs both contenders on RocksDB (changelog
    checkpointing): Spark's default store keeps every retained version of 1M keys on the JVM
    heap, and the built-in count ran out of the default 1 GiB heap there (11-26).
    """
    count_schema = "key string, value long"
    for distinct in (keys, rows):
        store = None if distinct == keys else "rocksdb"
        say(
            f"stateful: running_count, {rows:,} rows over {distinct:,} keys in {FILES} batches"
            f"{', RocksDB state store' if store else ''}"
        )
        directory = keyed_parquet_directory(
            workdir / f"keyed-{rows}-{distinct}", rows, distinct, FILES
        )
        with state_store(spark, store):
            compare(
                report,
                spark,
                "4. stateful count",
                f"{rows:,} rows, {distinct:,} keys{', RocksDB' if store else ''}",
                directory,
                count_schema,
                rows,
                repetitions,
                (("running_count", running_count_query), ("groupBy(key).count()", count_query)),
                "update",
                1.0 if distinct == keys else 0.8,
                warmups=1 if distinct == keys else 0,
            )
    event_schema = "key string, ts timestamp, value long"
    deduplicate_keys = min(DEDUPLICATE_KEYS, rows // 10)
    say(f"stateful: deduplicate, {rows:,} rows over {deduplicate_keys:,} keys, ttl {TTL}")
    directory = event_parquet_directory(workdir / f"dedup-{rows}", rows, deduplicate_keys, FILES)
    compare(
        report,
        spark,
        "4. stateful deduplicate",
        f"{rows:,} rows, {deduplicate_keys:,} keys, ttl {TTL}",
        directory,
        event_schema,
        rows,
        repetitions,
        (
            ("deduplicate", deduplicate_query),
            ("dropDuplicatesWithinWatermark", drop_duplicates_query),
        ),
        "append",
        0.8,
        warmups=0,
    )
    event_keys = min(EVENT_KEYS, rows // 100)
    say(f"stateful: sessionize, {rows:,} rows over {event_keys:,} keys, gap {GAP}")
    directory = event_parquet_directory(workdir / f"sessions-{rows}", rows, event_keys, FILES)
    compare(
        report,
        spark,
        "4. stateful sessionize",
        f"{rows:,} rows, {event_keys:,} keys, gap {GAP}",
        directory,
        event_schema,
        rows,
        repetitions,
        (("sessionize", sessionize_query), ("session_window count", session_window_query)),
        "append",
        0.8,
        warmups=0,
    )
