"""5. recovery time after SIGKILL and 7. the demo pipeline's events/s, EO versus ALO.

Both run the demo's pipeline (``eospack.demo.pipeline``: replayable-kafka ->
running_count -> 2pc-jdbc current + history tables) as a separate driver process.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Comparison, Figure, Report, say
from eospack.demo.run import committed_batches
from eospack.processes import DriverProcess
from eospack.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.testing import wait_until

TIMEOUT = 600.0


def fill_keyed_topic(bootstrap: str, topic: str, events: int, keys: int = 1000) -> None:
    create_topic(bootstrap, topic, 4)
    records = (
        Record(index % 4, f"key-{index * 7919 % keys:05d}".encode(), b"x" * 90)
        for index in range(events)
    )
    produce_sealed(bootstrap, topic, records, batch_size=512 * 1024, linger_ms=20)


def pipeline(name: str, bootstrap: str, topic: str, postgres: Any, workdir: Path,
             guarantee: str, per_trigger: int, done: bool) -> DriverProcess:  # fmt: skip
    done_file = workdir / f"{name}.done"
    if done:
        done_file.touch()
    return DriverProcess(
        [
            "-m",
            "eospack.demo.pipeline",
            "--name",
            name,
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
            "--done-file",
            str(done_file),
            "--guarantee",
            guarantee,
            "--max-offsets-per-trigger",
            str(per_trigger),
        ],
        log_path=workdir / f"{name}.log",
    )


def seconds_to_next_commit(driver: DriverProcess, checkpoint: Path, already: int) -> float:
    started = time.monotonic()

    def committed() -> bool:
        if driver.poll() is not None:
            raise RuntimeError(f"pipeline exited early:\n{driver.output(3000)}")
        return committed_batches(checkpoint) > already

    wait_until(committed, TIMEOUT, "the pipeline's next committed batch", poll=0.02)
    return time.monotonic() - started


def recovery(
    report: Report, bootstrap: str, postgres: Any, repetitions: int, warm_up: bool = True
) -> None:
    """Seconds from a driver start to its first commit: after a SIGKILL vs from scratch.

    Repetition 0 warms the machine up (JVM files, Python bytecode) and is not reported,
    unless ``warm_up`` is False (quick runs).
    """
    topic = f"bench_recovery_{int(time.time())}"
    fill_keyed_topic(bootstrap, topic, 50_000)
    fresh, restarted = [], []
    for repetition in range(0 if warm_up else 1, repetitions + 1):
        workdir = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
        name = f"bench_recovery_{repetition}"
        say(f"recovery: repetition {repetition} (0 is the warm-up): fresh start")
        driver = pipeline(name, bootstrap, topic, postgres, workdir, "exactly-once", 1000, False)
        first = seconds_to_next_commit(driver, workdir / name, 0)
        driver.kill()
        say("recovery: SIGKILLed after its first batch; restarting from the checkpoint")
        already = committed_batches(workdir / name)
        driver = pipeline(name, bootstrap, topic, postgres, workdir, "exactly-once", 1000, False)
        again = seconds_to_next_commit(driver, workdir / name, already)
        driver.kill()
        if repetition > 0:
            fresh.append(first)
            restarted.append(again)
    report.add(
        Comparison(
            "5. recovery: restart to first commit",
            "demo pipeline",
            Figure("restart after SIGKILL", tuple(restarted), 1, "s"),
            Figure("fresh start", tuple(fresh), 1, "s"),
            target=1.5,
            higher_is_better=False,
        )
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
