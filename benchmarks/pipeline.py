"""5. recovery time after SIGKILL and 7. the demo pipeline's events/s, EO versus ALO.

Both run the demo's pipeline (``eospack.lab.demo.pipeline``: replayable-kafka ->
running_count -> 2pc-jdbc current + history tables) as a separate driver process.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import Comparison, Figure, Report, say
from eospack.core.processes import DriverProcess
from eospack.lab.demo.pipeline import MILESTONE_PREFIX, PipelineCommand
from eospack.lab.demo.run import committed_batches
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.lab.testing import wait_until

TIMEOUT = 600.0
RECOVERY_RATE = 2_000
TRIGGER_NOTE = "500 ms, the pipeline's default"


def fill_keyed_topic(bootstrap: str, topic: str, events: int, keys: int = 1000) -> None:
    create_topic(bootstrap, topic, 4)
    records = (
        Record(index % 4, f"key-{index * 7919 % keys:05d}".encode(), b"x" * 90)
        for index in range(events)
    )
    produce_sealed(bootstrap, topic, records, batch_size=512 * 1024, linger_ms=20)


def pipeline(
    name: str,
    bootstrap: str,
    topic: str,
    postgres: Any,
    workdir: Path,
    guarantee: str,
    per_trigger: int,
    done: bool,
    extra: Sequence[str] = (),
    environment: dict[str, str] | None = None,
) -> DriverProcess:
    """The demo's pipeline as its own driver process; ``extra`` are more of its arguments,
    ``environment`` more variables of its environment."""
    done_file = workdir / f"{name}.done"
    if done:
        done_file.touch()
    command = PipelineCommand(
        name=name,
        bootstrap_servers=bootstrap,
        topic=topic,
        checkpoint_dir=workdir / name,
        done_file=done_file,
        jdbc_url=postgres.endpoint.jdbc_url,
        jdbc_user=postgres.endpoint.user,
        guarantee=guarantee,
        max_offsets_per_trigger=per_trigger,
        more=tuple(extra),
    )
    return DriverProcess(
        command.arguments(),
        log_path=workdir / f"{name}.log",
        environment=environment,
    )


def seconds_to_next_commit(driver: DriverProcess, checkpoint: Path, already: int) -> float:
    started = time.monotonic()

    def committed() -> bool:
        if driver.poll() is not None:
            raise RuntimeError(f"pipeline exited early:\n{driver.output(3000)}")
        return committed_batches(checkpoint) > already

    wait_until(committed, TIMEOUT, "the pipeline's next committed batch", poll=0.02)
    return time.monotonic() - started


class SteadyProducer(threading.Thread):
    """Keyed events at a steady rate (chunks every 0.1 s) until stopped: a live stream."""

    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(daemon=True, name="bench-steady-producer")
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        try:
            index, started, chunk = 0, time.monotonic(), max(self.rate // 10, 1)
            while not self.stopped.is_set():
                for _ in range(chunk):
                    key = f"key-{index * 7919 % 1000:05d}".encode()
                    producer.send(self.topic, key=key, value=b"x" * 90, partition=index % 4)
                    index += 1
                producer.flush()
                ahead = started + index / self.rate - time.monotonic()
                self.stopped.wait(max(ahead, 0.0))  # pacing, not synchronisation
        except BaseException as error:
            self.error = error
        finally:
            producer.close()


MILESTONES = ("python", "imports", "session", "queries")
PHASES = {
    "python": "interpreter start",
    "imports": "imports (pyspark, pandas, eospack)",
    "session": "JVM and Spark session",
    "queries": "query start (checkpoint, planning)",
    "commit": "first batch: replay/recovery, run, 2PC commit",
}


def milestones(driver: DriverProcess, launched: float) -> dict[str, float]:
    """Seconds from the launch to each milestone the pipeline printed (see pipeline.py)."""
    found = {}
    for line in driver.output().splitlines():
        if line.startswith(MILESTONE_PREFIX):
            name, stamp = line[len(MILESTONE_PREFIX) :].split()
            found[name] = float(stamp) - launched
    return found


def phases(marks: dict[str, float], total: float) -> dict[str, float]:
    """Durations of PHASES from cumulative milestone times."""
    points = [("python", marks.get("python", 0.0))]
    points += [(name, marks.get(name, points[-1][1])) for name in MILESTONES[1:]]
    points.append(("commit", total))
    result, previous = {}, 0.0
    for name, at in points:
        result[name] = at - previous
        previous = at
    return result


def spark_pipeline(
    name: str,
    bootstrap: str,
    topic: str,
    postgres: Any,
    workdir: Path,
    jars: Sequence[Path],
    extra: Sequence[str] = (),
) -> DriverProcess:
    """The peer: the same pipeline with Spark's Kafka source, state and JDBC writer;
    ``extra`` are more of its arguments."""
    command = [
        "-m",
        "benchmarks.spark_pipeline",
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--jdbc-url",
        postgres.endpoint.jdbc_url,
        "--jdbc-user",
        postgres.endpoint.user,
        "--checkpoint-dir",
        str(workdir / name),
        "--jars",
        ",".join(str(jar) for jar in jars),
        *extra,
    ]
    return DriverProcess(command, log_path=workdir / f"{name}.log")


def recovery(
    report: Report,
    bootstrap: str,
    postgres: Any,
    repetitions: int,
    warm_up: bool = True,
    peer_jars: Sequence[Path] = (),
) -> None:
    """Seconds from a driver's launch to its first commit: after a SIGKILL during a steady
    stream, versus a fresh start, with where the time goes; with ``peer_jars`` (Spark's
    Kafka connector and PostgreSQL's JDBC driver) the same for Spark's own pipeline.

    Repetition 0 warms the machine up (JVM files, Python bytecode) and is not reported,
    unless ``warm_up`` is False (quick runs).
    """
    topic = f"bench_recovery_{int(time.time())}"
    create_topic(bootstrap, topic, 4)
    producer = SteadyProducer(bootstrap, topic, RECOVERY_RATE)
    producer.start()
    fresh, restarted, peer_fresh, peer_restarted = [], [], [], []
    fresh_phases: list[dict[str, float]] = []
    restart_phases: list[dict[str, float]] = []
    peer_phases: list[dict[str, float]] = []
    peer_fresh_phases: list[dict[str, float]] = []
    try:
        for repetition in range(0 if warm_up else 1, repetitions + 1):
            workdir = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
            name = f"bench_recovery_{repetition}_{int(time.time())}"

            def start(name: str = name, workdir: Path = workdir) -> DriverProcess:
                return pipeline(
                    name, bootstrap, topic, postgres, workdir, "exactly-once", 2000, False
                )

            def start_peer(name: str = f"{name}_spark", workdir: Path = workdir) -> DriverProcess:
                return spark_pipeline(name, bootstrap, topic, postgres, workdir, peer_jars)

            contenders = [("eospack", start, fresh, restarted, fresh_phases, restart_phases)]
            if peer_jars:
                contenders.append(
                    (
                        "Spark's own",
                        start_peer,
                        peer_fresh,
                        peer_restarted,
                        peer_fresh_phases,
                        peer_phases,
                    )
                )
            for label, launch, firsts, agains, first_phases, again_phases in contenders:
                checkpoint = workdir / (name if label == "eospack" else f"{name}_spark")
                say(f"recovery: repetition {repetition} (0 is the warm-up): {label}, fresh start")
                launched = time.time()
                driver = launch()
                first = seconds_to_next_commit(driver, checkpoint, 0)
                first_marks = milestones(driver, launched)
                seconds_to_next_commit(driver, checkpoint, committed_batches(checkpoint))
                driver.kill()
                say(f"recovery: {label} SIGKILLed mid-stream; restarting from the checkpoint")
                already = committed_batches(checkpoint)
                launched = time.time()
                driver = launch()
                again = seconds_to_next_commit(driver, checkpoint, already)
                again_marks = milestones(driver, launched)
                driver.kill()
                if producer.error is not None:
                    raise RuntimeError(f"the steady producer failed: {producer.error}")
                if repetition > 0:
                    firsts.append(first)
                    agains.append(again)
                    first_phases.append(phases(first_marks, first))
                    again_phases.append(phases(again_marks, again))
    finally:
        producer.stopped.set()
        producer.join(30)
    restart = Figure("restart after SIGKILL", tuple(restarted), 1, "s")
    comparisons = [(restart, Figure("fresh start", tuple(fresh), 1, "s"), 1.5)]
    if peer_restarted:
        comparisons += [
            (restart, Figure("Spark's own pipeline, restart", tuple(peer_restarted), 1, "s"), 1.0),
            (
                Figure("fresh start", tuple(fresh), 1, "s"),
                Figure("Spark's own pipeline, fresh start", tuple(peer_fresh), 1, "s"),
                1.0,
            ),
        ]
    for subject, baseline, target in comparisons:
        report.add(
            Comparison(
                "5. recovery: restart to first commit",
                f"demo pipeline, {RECOVERY_RATE:,} events/s",
                subject,
                baseline,
                target=target,
                higher_is_better=False,
            )
        )

    def breakdown(samples: list[dict[str, float]]) -> str:
        return ", ".join(
            f"{PHASES[phase]} {statistics.median(s[phase] for s in samples):.1f} s"
            for phase in PHASES
        )

    report.notes.append(
        f"recovery: two concurrent queries (processingTime {TRIGGER_NOTE}), events produced at"
        f" {RECOVERY_RATE:,}/s throughout; medians. Restart: {breakdown(restart_phases)}."
        f" Fresh start: {breakdown(fresh_phases)}."
    )
    if peer_phases:
        report.notes.append(
            "recovery peer: Spark's own pipeline (Kafka source from spark-sql-kafka,"
            " groupBy(key).count(), Spark's JDBC writer in foreachBatch, at-least-once), two"
            f" queries like the demo pipeline's. Restart: {breakdown(peer_phases)}."
            f" Fresh start: {breakdown(peer_fresh_phases)}."
        )


def end_to_end(
    report: Report, bootstrap: str, postgres: Any, events: int, repetitions: int
) -> None:
    topic = f"bench_e2e_{int(time.time())}"
    say(f"end to end: producing {events:,} keyed events")
    fill_keyed_topic(bootstrap, topic, events)
    batch = max(events // 3, 1_000)  # offsets per trigger: the first batch and two more
    figures = {}
    for guarantee in ("exactly-once", "at-least-once"):
        seconds = []
        for repetition in range(repetitions):
            workdir = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
            name = f"bench_e2e_{guarantee.replace('-', '_')}_{repetition}"
            say(f"end to end: {guarantee}, repetition {repetition + 1}/{repetitions}")
            driver = pipeline(name, bootstrap, topic, postgres, workdir, guarantee, batch, True)
            seconds_to_next_commit(driver, workdir / name, 0)
            started = time.monotonic()
            wait_until(lambda d=driver: d.poll() is not None, TIMEOUT, "the pipeline to drain")
            if driver.poll() != 0:
                raise RuntimeError(f"pipeline failed:\n{driver.output(3000)}")
            seconds.append(time.monotonic() - started)
        figures[guarantee] = Figure(
            f"pipeline {guarantee}", tuple(seconds), events - batch, "events/s"
        )
    report.notes.append(
        "end to end: events/s after the first committed batch (JVM start-up excluded),"
        " both tables (current upsert + history append) written by 2pc-jdbc"
    )
    report.add(
        Comparison(
            "7. end to end", f"{events:,} events", figures["exactly-once"], figures["at-least-once"]
        )
    )


def metrics_overhead(
    report: Report, bootstrap: str, postgres: Any, events: int, repetitions: int
) -> None:
    """15. The demo's pipeline (benchmark 7's, exactly-once) with metrics on
    (``EOSPACK_METRICS_DIR`` set: the source's lag, the sinks' counters and histograms,
    a snapshot file per batch) and off, interleaved per repetition; events/s after the
    first committed batch. Issue 40's goal: on >= 0.98x off."""
    from eospack.core.metrics import METRICS_DIR_VARIABLE

    topic = f"bench_metrics_{int(time.time())}"
    say(f"metrics overhead: producing {events:,} keyed events")
    fill_keyed_topic(bootstrap, topic, events)
    batch = max(events // 10, 1_000)
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    for repetition in range(repetitions):
        for setting in ("on", "off") if repetition % 2 == 0 else ("off", "on"):
            workdir = Path(tempfile.mkdtemp(prefix="bench-metrics-"))
            name = f"bench_metrics_{setting}_{repetition}"
            environment = (
                {METRICS_DIR_VARIABLE: str(workdir / "metrics")} if setting == "on" else {}
            )
            say(f"metrics overhead: metrics {setting}, repetition {repetition + 1}/{repetitions}")
            driver = pipeline(
                name,
                bootstrap,
                topic,
                postgres,
                workdir,
                "exactly-once",
                batch,
                True,
                environment=environment,
            )
            seconds_to_next_commit(driver, workdir / name, 0)
            started = time.monotonic()
            wait_until(lambda d=driver: d.poll() is not None, TIMEOUT, "the pipeline to drain")
            if driver.poll() != 0:
                raise RuntimeError(f"pipeline failed:\n{driver.output(3000)}")
            seconds[setting].append(time.monotonic() - started)
            if setting == "on" and not any((workdir / "metrics").iterdir()):
                raise RuntimeError("metrics on, but the pipeline wrote no snapshot")
    on, off = (
        Figure(f"pipeline, metrics {setting}", tuple(seconds[setting]), events - batch, "events/s")
        for setting in ("on", "off")
    )
    report.notes.append(
        "metrics overhead: benchmark 7's pipeline (exactly-once, 10 batches), events/s after"
        " the first committed batch, metrics on and off alternating"
    )
    report.add(Comparison("15. metrics overhead", f"{events:,} events", on, off, 0.98))
