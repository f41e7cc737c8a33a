"""Metrics of the pack, carried across processes as snapshot files.

Most are recorded by driver-side code (below); the source's read tasks and the stateful
operators' UDF calls record theirs in the executors' Python workers the same way, their
snapshot rewritten on a timer shortly after (``Recorder.flush_soon``), once for all the
tasks or key-group calls that record meanwhile (docs/metrics.md says which).

Where the numbers are made: a Python data source's driver-side code (the stream reader's
``latestOffset``/``commit``, the stream writer's ``commit``/``abort``) runs in Python
processes the JVM starts, not in the user's PySpark process (checked on Spark 4.3: the
user's process, the source runner and the commit runner were three pids, the runners
long-lived across batches). So the endpoint (``eospack.metrics.serve``, in the user's
process) cannot see them in memory.

Decision: each process that records keeps its metrics in memory and rewrites one snapshot
file, ``<dir>/<pid>-<process start>.json``, atomically (write a temporary file, then
``os.replace``) after each recording; the endpoint reads every file of the directory at
scrape time and merges them (counters and histograms summed over processes, a gauge's
newest value wins). Why files, not a push to the endpoint: nothing to connect to or retry
in the hot path, a scrape never waits on a query, a process that dies (a driver SIGKILL)
leaves its counters behind so totals never go down, and it works for several queries and
sessions at once. Recordings only change memory; the file is rewritten once per driver-side
operation (a planned batch, a sink's commit or abort), ~1.7 KB. Cost measured on the 2-core
machine under a load average of 10: ~2 ms per rewrite (the file system's create and rename),
one per batch on the sink's commit path and one in the source's planning, against
micro-batches of 200 ms and more; off, a recording costs ~4 us (an environment lookup).

The directory is ``EOSPACK_METRICS_DIR`` in the process's environment: unset means off,
and every recording costs one dictionary lookup. ``eospack.metrics.serve`` sets it for the
processes Spark starts afterwards. Recording never raises: a metric is never worth a
failed batch (an unwritable directory is logged once).

This module is pure (no Spark, no prometheus_client): the model and the snapshot format.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

METRICS_DIR_VARIABLE = "EOSPACK_METRICS_DIR"

SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    math.inf,
)
"""Upper bounds of every ``*_seconds`` histogram (Prometheus' ``le``), the last one +Inf."""

FLUSH_DELAY_SECONDS = 0.25
"""How long an executor-side recording waits for others before its process's file is
rewritten (``Recorder.flush_soon``): a scrape sees it at most this much later."""

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class MetricInfo:
    """A metric's name (Prometheus conventions: unit in the name, ``_total`` counters),
    kind, label names and help text (the same text as docs/metrics.md)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str


def _metrics(*infos: MetricInfo) -> dict[str, MetricInfo]:
    return {info.name: info for info in infos}


METRICS = _metrics(
    MetricInfo(
        "eospack_kafka_source_lag_records",
        "gauge",
        ("query", "topic", "partition"),
        "Broker end offset minus the end offset of the last batch Spark committed",
    ),
    MetricInfo(
        "eospack_kafka_source_records_total",
        "counter",
        ("query",),
        "Offsets planned into micro-batches (records, and transaction markers on Kafka)",
    ),
    MetricInfo(
        "eospack_kafka_source_batch_records",
        "gauge",
        ("query",),
        "Offsets of the last planned micro-batch",
    ),
    MetricInfo(
        "eospack_kafka_source_planning_seconds",
        "histogram",
        ("query",),
        "Time latestOffset took to plan a batch (broker metadata and end offsets included)",
    ),
    MetricInfo(
        "eospack_kafka_source_fetch_seconds",
        "histogram",
        ("query",),
        "Time a read task spent fetching and decoding its offset ranges (executor side)",
    ),
    MetricInfo(
        "eospack_kafka_source_read_bytes_total",
        "counter",
        ("query",),
        "Key and value bytes read tasks returned (executor side; retried tasks count again)",
    ),
    MetricInfo(
        "eospack_state_keys",
        "gauge",
        ("query", "operator"),
        "Keys a stateful operator holds after the last batch (summed over its key groups)",
    ),
    MetricInfo(
        "eospack_state_bytes",
        "gauge",
        ("query", "operator"),
        "Bytes of a stateful operator's encoded state after the last batch (summed over its"
        " key groups)",
    ),
    MetricInfo(
        "eospack_state_timeouts_fired_total",
        "counter",
        ("query", "operator"),
        "Key-group timeouts that fired (processing time or watermark) and ran on_timeout",
    ),
    MetricInfo(
        "eospack_state_keys_expired_total",
        "counter",
        ("query", "operator"),
        "Keys fired timeouts removed from state",
    ),
    MetricInfo(
        "eospack_state_late_rows_dropped_total",
        "counter",
        ("query",),
        "Rows Spark dropped behind the watermark before the query's stateful operators",
    ),
    MetricInfo(
        "eospack_sink_decision_seconds",
        "histogram",
        ("sink", "sink_id"),
        "From the driver's commit call to the batch's recorded decision",
    ),
    MetricInfo(
        "eospack_sink_commit_seconds",
        "histogram",
        ("sink", "sink_id"),
        "Committing the decided batch's pieces and marking the decision done",
    ),
    MetricInfo(
        "eospack_sink_batches_committed_total",
        "counter",
        ("sink", "sink_id", "mode"),
        "Batches the sink committed (mode exactly_once or at_least_once)",
    ),
    MetricInfo(
        "eospack_sink_pieces_committed_total",
        "counter",
        ("sink", "sink_id"),
        "Prepared pieces (one per task) committed by batch commits",
    ),
    MetricInfo(
        "eospack_sink_rows_committed_total",
        "counter",
        ("sink", "sink_id", "mode"),
        "Rows of committed batches",
    ),
    MetricInfo(
        "eospack_sink_recovery_rolled_forward_batches_total",
        "counter",
        ("sink", "sink_id"),
        "Decided batches a recovery finished (a crash between decision and commit)",
    ),
    MetricInfo(
        "eospack_sink_recovery_rolled_back_pieces_total",
        "counter",
        ("sink", "sink_id"),
        "Prepared pieces no decision named, rolled back by a recovery or an abort",
    ),
    MetricInfo(
        "eospack_sink_pieces_waiting",
        "gauge",
        ("sink", "sink_id"),
        "Prepared pieces (prepared transactions, staged pieces, open Kafka transactions,"
        " staged objects) of the sink left after its last commit, abort or recovery",
    ),
    MetricInfo(
        "eospack_sink_fenced_batches_total",
        "counter",
        ("sink", "sink_id"),
        "Batch slots fenced by an abort or a recovery, so no late decision can name a"
        " rolled-back piece",
    ),
)


@dataclass
class Histogram:
    """Cumulative-free bucket counts (one per bound of SECONDS_BUCKETS), sum and count."""

    counts: list[int] = field(default_factory=lambda: [0] * len(SECONDS_BUCKETS))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        for index, bound in enumerate(SECONDS_BUCKETS):
            if value <= bound:
                self.counts[index] += 1
                break
        self.total += value
        self.count += 1

    def merge(self, other: Histogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.count += other.count


@dataclass
class Snapshot:
    """One process's metrics: counters, gauges (value and when it was set), histograms."""

    counters: dict[tuple[str, Labels], float] = field(default_factory=dict)
    gauges: dict[tuple[str, Labels], tuple[float, float]] = field(default_factory=dict)
    histograms: dict[tuple[str, Labels], Histogram] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "counters": [[n, dict(lb), v] for (n, lb), v in self.counters.items()],
            "gauges": [[n, dict(lb), v, t] for (n, lb), (v, t) in self.gauges.items()],
            "histograms": [
                [n, dict(lb), h.counts, h.total, h.count] for (n, lb), h in self.histograms.items()
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        snapshot = cls()
        for name, labels, value in data.get("counters", ()):
            snapshot.counters[(name, _labels(labels))] = float(value)
        for name, labels, value, at in data.get("gauges", ()):
            snapshot.gauges[(name, _labels(labels))] = (float(value), float(at))
        for name, labels, counts, total, count in data.get("histograms", ()):
            if len(counts) == len(SECONDS_BUCKETS):
                snapshot.histograms[(name, _labels(labels))] = Histogram(
                    list(counts), float(total), int(count)
                )
        return snapshot

    def merge(self, other: Snapshot) -> None:
        """Add ``other`` (another process): counters and histograms add up, the newest
        value of a gauge wins."""
        for key, value in other.counters.items():
            self.counters[key] = self.counters.get(key, 0.0) + value
        for key, (value, at) in other.gauges.items():
            if key not in self.gauges or self.gauges[key][1] <= at:
                self.gauges[key] = (value, at)
        for key, histogram in other.histograms.items():
            mine = self.histograms.setdefault(key, Histogram())
            mine.merge(histogram)


def _labels(labels: Mapping[str, Any]) -> Labels:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


class Recorder:
    """This process's metrics and its snapshot file (see the module docstring)."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self._lock = threading.Lock()
        self._file_name = f"{os.getpid()}-{int(time.time() * 1000)}.json"
        self._failed = False
        self._dirty = False
        self._made: str | None = None
        self._flush_scheduled = False
        self._timer: threading.Timer | None = None

    @staticmethod
    def directory() -> str | None:
        return os.environ.get(METRICS_DIR_VARIABLE) or None

    @staticmethod
    def point_at(directory: str) -> None:
        """Record into ``directory`` from now on: for a process Spark starts without the
        pack's environment (a stateful operator's UDF worker), told by what it runs."""
        if os.environ.get(METRICS_DIR_VARIABLE) != directory:
            os.environ[METRICS_DIR_VARIABLE] = directory

    def add(self, name: str, labels: Mapping[str, Any], amount: float = 1.0) -> None:
        if self.directory() is None:
            return
        with self._lock:
            key = (name, _labels(labels))
            self.snapshot.counters[key] = self.snapshot.counters.get(key, 0.0) + amount
            self._dirty = True

    def set(
        self, name: str, labels: Mapping[str, Any], value: float, at: float | None = None
    ) -> None:
        self.set_many(name, [(labels, value)], at)

    def set_many(
        self,
        name: str,
        values: Iterable[tuple[Mapping[str, Any], float]],
        at: float | None = None,
    ) -> None:
        """Set gauges; ``at`` orders a gauge's values across processes (the newest wins):
        this process's wall clock unless given (a stateful operator's key group gives its
        batch id, which no executor's clock skew can reorder)."""
        if self.directory() is None:
            return
        now = time.time() if at is None else at
        with self._lock:
            for labels, value in values:
                self.snapshot.gauges[(name, _labels(labels))] = (float(value), now)
            self._dirty = True

    def observe(self, name: str, labels: Mapping[str, Any], seconds: float) -> None:
        if self.directory() is None:
            return
        with self._lock:
            self.snapshot.histograms.setdefault((name, _labels(labels)), Histogram()).observe(
                seconds
            )
            self._dirty = True

    def flush_soon(self, delay_seconds: float = FLUSH_DELAY_SECONDS) -> None:
        """Flush within ``delay_seconds`` on a timer thread, once however many recordings
        ask meanwhile: for executor-side recordings (a read task, a stateful operator's
        key-group call), which come many per batch and per process and must not each
        rewrite the file (its size grows with the key groups a worker served)."""
        if self.directory() is None:
            return
        with self._lock:
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        self._timer = threading.Timer(delay_seconds, self._scheduled_flush)
        self._timer.daemon = True
        self._timer.start()

    def _scheduled_flush(self) -> None:
        """The timer's flush. It clears the schedule before it copies the metrics, so a
        recording that comes while it writes schedules a flush of its own."""
        with self._lock:
            self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Rewrite this process's snapshot file atomically if anything changed since the
        last flush; never raises. Called once at the end of each driver-side operation
        (a planned batch, a sink's commit or abort), not per recording."""
        directory = self.directory()
        if directory is None or not self._dirty:
            return
        try:
            with self._lock:
                text = json.dumps(self.snapshot.to_json(), separators=(",", ":"))
                self._dirty = False
            if self._made != directory:
                os.makedirs(directory, exist_ok=True)
                self._made = directory
            temporary = os.path.join(directory, f".{self._file_name}.tmp")
            with open(temporary, "w") as file:
                file.write(text)
            os.replace(temporary, os.path.join(directory, self._file_name))
        except OSError as error:
            self._made, self._dirty = None, True  # retried, the directory made again
            if not self._failed:
                self._failed = True
                log.warning("eospack metrics: cannot write to %s (%s)", directory, error)


RECORDER = Recorder()
"""The process's recorder: ``from eospack.core.metrics import RECORDER``."""


def read_directory(directory: str | Path) -> Snapshot:
    """Every process's snapshot in ``directory``, merged; unreadable files are skipped (a
    file is replaced atomically, so a reader sees an old or a new one, never half), and so
    is JSON of another shape (another tool's ``*.json``): a scrape never fails on a file."""
    merged = Snapshot()
    for path in sorted(Path(directory).glob("*.json")):
        try:
            one = Snapshot.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            continue
        merged.merge(one)
    return merged
