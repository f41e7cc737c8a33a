"""The demo's orchestrator: services, two sources, two pipelines, SIGKILLs, verdict.

Two sources write keyed events to one topic. count_1 and count_2 run the same
pipeline (``eospack.lab.demo.pipeline``) in separate driver processes; count_1 is
SIGKILLed ``--crashes`` times at random moments (each after it committed some work since
its last start; on a fast machine while the sources still produce) and restarted from its
checkpoint; count_2 is left alone. Both count while events flow (long-running queries with a
processingTime trigger); when the sources stop, both count what is left and exit, and the
verdict compares their output with what was produced.

``--sink`` chooses where the pipelines print: PostgreSQL tables through 2pc-jdbc (default)
or a Kafka topic per pipeline through 2pc-kafka. Reading that output back, while running
and at the end, is ``eospack.lab.demo.outputs``' part; everything here is the same for both.

The sources hold back after a first chunk until both pipelines have committed their first
batch: a fresh Spark driver's first micro-batch takes 10-40 s on a 2-core machine (JVM
warm-up and Spark's Python planner processes; see docs/performance.md), and a demo whose events
were all produced before anything counted would not show counting while events flow.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eospack.core.checkpoint_files import LocalFiles
from eospack.core.processes import DriverProcess
from eospack.lab.demo.metrics_view import Scrape
from eospack.lab.demo.outputs import JdbcOutput, KafkaOutput, Output, Sample
from eospack.lab.demo.verify import PipelineResult, verification_table

PIPELINE_DEADLINE_SECONDS = 600.0
CHUNKS_PER_SECOND = 4
CATCH_UP_OFFSETS_PER_TRIGGER = 10_000
"""Per query and micro-batch: a restarted counter catches up in a batch or two."""
DEMO_TRIGGER_INTERVAL = "2 seconds"
"""Two drivers share the machine: with 500 ms triggers (the pipeline's default) count_2's
micro-batches kept both of a 2-core machine's cores busy, and a restarted count_1, which
starts a JVM and a dozen Python processes, waited about 45 s for them to commit again."""


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=20_000, help="events to produce (20000)")
    parser.add_argument("--keys", type=int, default=50, help="distinct keys (50)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (4)")
    parser.add_argument("--crashes", type=int, default=3, help="SIGKILLs of count_1 (3)")
    parser.add_argument(
        "--trigger-interval",
        default=DEMO_TRIGGER_INTERVAL,
        help=f"processingTime of the pipelines' queries ({DEMO_TRIGGER_INTERVAL})",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed (7)")
    parser.add_argument(
        "--produce-seconds",
        type=float,
        default=None,
        help="spread production over this long (default: 15 s per crash, at least 30 s)",
    )
    parser.add_argument(
        "--sink",
        choices=["jdbc", "kafka"],
        default="jdbc",
        help="where the pipelines print their counts: jdbc (default), PostgreSQL tables"
        " through 2pc-jdbc; kafka, a topic per pipeline through 2pc-kafka, read back with"
        " read_committed (needs Apache Kafka, not tansu)",
    )
    parser.add_argument(
        "--guarantee",
        choices=["exactly-once", "at-least-once"],
        default="exactly-once",
        help="the sinks' deliveryGuarantee (exactly-once)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG of counts over time")
    parser.add_argument("--bootstrap-servers", default=None, help="use this Kafka, not embedded")
    parser.add_argument(
        "--jdbc-url",
        default=None,
        help="--sink jdbc: use this PostgreSQL (jdbc:postgresql://host:port/db), not embedded;"
        " user and password from --jdbc-user and EOSPACK_DEMO_JDBC_PASSWORD",
    )
    parser.add_argument("--jdbc-user", default=None)
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and checkpoints")
    parser.add_argument(
        "--metrics",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the pipelines' Prometheus metrics on 127.0.0.1:PORT while the demo runs"
        " (0: a free port) and say at the end what a scrape shows; needs"
        " pip install 'eospack[metrics]'",
    )


@dataclass
class Timeline:
    """Samples for the plot and the regression check, taken while the demo runs."""

    started: float = field(default_factory=time.monotonic)
    totals: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    crash_times: list[float] = field(default_factory=list)
    regressions: Counter[str] = field(default_factory=Counter)
    lag: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """``--metrics``: per pipeline, the source lag summed over partitions."""
    commit_ms: list[tuple[float, float]] = field(default_factory=list)
    """``--metrics``: the sinks' mean commit latency since the previous scrape."""
    _commits_seen: tuple[float, float] = (0.0, 0.0)

    def now(self) -> float:
        return time.monotonic() - self.started

    def record(self, samples: dict[str, Sample]) -> None:
        for name, sample in samples.items():
            self.regressions[name] += sample.regressions
            self.totals.setdefault(name, []).append((self.now(), sample.counted))

    def record_metrics(self, scraped: Scrape) -> None:
        now = self.now()
        for query, partitions in scraped.lag.items():
            self.lag.setdefault(query, []).append((now, sum(partitions.values())))
        commits = sum(sink.commits for sink in scraped.sinks.values())
        seconds = sum(sink.commit_seconds for sink in scraped.sinks.values())
        before_commits, before_seconds = self._commits_seen
        if commits > before_commits:
            mean = (seconds - before_seconds) / (commits - before_commits)
            self.commit_ms.append((now, mean * 1000))
        self._commits_seen = (commits, seconds)


class Producer(threading.Thread):
    """Two sources interleaving keyed events, sealed chunk by chunk (see kafka_tools)."""

    def __init__(self, bootstrap: str, topic: str, arguments: argparse.Namespace, seconds: float):
        super().__init__(daemon=True, name="demo-producer")
        self.bootstrap = bootstrap
        self.topic = topic
        self.arguments = arguments
        self.seconds = seconds
        self.produced: Counter[str] = Counter()
        self.sent = 0
        self.error: BaseException | None = None
        self.flowing = threading.Event()
        """Set by the orchestrator once both pipelines run; the rest waits for it."""

    def run(self) -> None:
        from eospack.lab.services.kafka_tools import Record, produce_sealed

        try:
            rng = random.Random(self.arguments.seed)
            chunks = max(1, int(self.seconds * CHUNKS_PER_SECOND))
            per_chunk = -(-self.arguments.events // chunks)
            started = time.monotonic()
            for chunk in range(chunks):
                size = min(per_chunk, self.arguments.events - self.sent)
                if size <= 0:
                    break
                if chunk == 1:
                    self.flowing.wait(PIPELINE_DEADLINE_SECONDS)
                    started = time.monotonic() - 1 / CHUNKS_PER_SECOND
                source = f"source-{chunk % 2 + 1}"
                records = []
                for index in range(size):
                    key = f"key-{rng.randrange(self.arguments.keys):04d}"
                    value = f"{source}:{self.sent + index}".encode()
                    partition = rng.randrange(self.arguments.partitions)
                    records.append(Record(partition, key.encode(), value))
                produce_sealed(self.bootstrap, self.topic, records)
                self.produced.update(record.key.decode() for record in records if record.key)
                self.sent += size
                pause = started + (chunk + 1) / CHUNKS_PER_SECOND - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing the sources, not synchronisation
        except BaseException as error:
            self.error = error


def committed_batches(checkpoint_dir: Path) -> int:
    """Batches the pipeline's queries committed together (Spark's own commit logs): those
    of ``current`` and ``history`` with ``--sink jdbc``, of ``output`` with ``--sink kafka``."""
    # Imported here: ``python -m eospack.lab.demo.pipeline`` imports this package first, and a
    # pipeline module already imported by it would make runpy warn about a double import.
    from eospack.lab.demo.pipeline import QUERY_DIRECTORIES

    return sum(
        sum(1 for name in LocalFiles(checkpoint_dir / query).names("commits") if name.isdigit())
        for query in QUERY_DIRECTORIES
    )


def run_demo(arguments: argparse.Namespace) -> int:
    if arguments.sink == "kafka" and (arguments.jdbc_url or arguments.jdbc_user):
        print("eospack demo: --jdbc-url and --jdbc-user apply to --sink jdbc", file=sys.stderr)
        return 2
    timeline = Timeline()

    def say(message: str) -> None:
        print(f"[{timeline.now():6.1f}s] {message}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="eospack-demo-"))
    try:
        with contextlib.ExitStack() as cleanup:
            return _run(arguments, timeline, say, workdir, cleanup)
    finally:
        if arguments.keep_workdir:
            say(f"logs and checkpoints kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(
    arguments: argparse.Namespace,
    timeline: Timeline,
    say: Callable[[str], None],
    workdir: Path,
    cleanup: contextlib.ExitStack,
) -> int:
    """The demo itself, phase by phase; ``cleanup`` stops what it starts (services, readers,
    pipelines still running after an error), in reverse order, however it ends."""
    from eospack.core.java import check_java
    from eospack.lab.services.kafka_tools import create_topic

    check_java()
    bootstrap = start_broker(arguments, say, cleanup)
    if bootstrap is None:
        return 2
    run_id = uuid.uuid4().hex[:6]
    topic = f"demo_events_{run_id}"
    create_topic(bootstrap, topic, arguments.partitions)
    names = [f"demo_{run_id}_count_1", f"demo_{run_id}_count_2"]
    output = _open_output(arguments, say, cleanup, bootstrap, names, workdir)
    cleanup.callback(output.close)
    seconds = arguments.produce_seconds or max(30.0, 15.0 * arguments.crashes)
    say(
        f"{arguments.events} events over {arguments.keys} keys into {topic}"
        f" ({arguments.partitions} partitions) during ~{seconds:.0f} s once both counters run;"
        f" {arguments.crashes} crashes of count_1; {output.describe()}"
    )
    endpoint = None
    if arguments.metrics is not None:
        from eospack.lab.demo.metrics_view import start_metrics
        from eospack.tools.metrics import MetricsUnavailableError

        try:
            endpoint = start_metrics(arguments.metrics, workdir)
        except MetricsUnavailableError as error:
            say(f"--metrics: {error}")
            return 2
        cleanup.callback(endpoint.close)
        say(f"metrics served at {endpoint.url} (Grafana: docs/grafana-dashboard.json)")
    metrics_url = endpoint.url if endpoint is not None else None
    demo = DemoRun(arguments, timeline, say, workdir, bootstrap, topic, names, output, metrics_url)
    producer = Producer(bootstrap, topic, arguments, seconds)
    producer.start()
    pipelines = start_pipelines(demo, cleanup)
    crashes = run_until_pipelines_finish(demo, producer, pipelines)
    results = verify_outputs(demo, producer, crashes)
    if endpoint is not None:
        from eospack.lab.demo.metrics_view import scrape

        for line in scrape(endpoint.url).lines():
            say(line)
    return report(demo, producer, results)


def start_broker(
    arguments: argparse.Namespace, say: Callable[[str], None], cleanup: contextlib.ExitStack
) -> str | None:
    """The bootstrap servers of ``--bootstrap-servers``, or of an embedded broker started
    here (and stopped by ``cleanup``); None, said why, if ``--sink kafka`` cannot run on it."""
    if arguments.bootstrap_servers:
        return str(arguments.bootstrap_servers)
    from eospack.lab.services import start_kafka

    say("starting the embedded Kafka broker")
    broker = start_kafka()
    cleanup.callback(broker.stop)
    if arguments.sink == "kafka" and broker.endpoint.kind != "kafka":
        say(
            "--sink kafka needs Apache Kafka (transactions, read_committed), but the"
            " embedded broker is tansu: install java and mvn (see Prerequisites)"
        )
        return None
    return broker.endpoint.bootstrap_servers


@dataclass(frozen=True)
class DemoRun:
    """What every phase of one demo run shares, fixed once the services run."""

    arguments: argparse.Namespace
    timeline: Timeline
    say: Callable[[str], None]
    workdir: Path
    bootstrap: str
    topic: str
    names: list[str]
    """The two pipelines: count_1 (the one crashed) and count_2."""
    output: Output
    metrics_url: str | None = None
    """``--metrics``: the endpoint, scraped with each progress line for the plot."""

    @property
    def done_file(self) -> Path:
        """Created once the sources finished: each pipeline then counts what is left, exits."""
        return self.workdir / "sources-finished"

    def start_pipeline(self, name: str) -> DriverProcess:
        """Pipeline ``name`` as its own driver process, on its checkpoint in the workdir
        (so a restart after a SIGKILL recovers from it); its log beside it."""
        from eospack.lab.demo.pipeline import (
            PipelineCommand,  # not at the top: see committed_batches
        )

        command = PipelineCommand(
            name=name,
            bootstrap_servers=self.bootstrap,
            topic=self.topic,
            checkpoint_dir=self.workdir / name,
            done_file=self.done_file,
            guarantee=self.arguments.guarantee,
            max_offsets_per_trigger=CATCH_UP_OFFSETS_PER_TRIGGER,
            trigger_interval=self.arguments.trigger_interval,
        )
        return DriverProcess(
            self.output.with_sink(command).arguments(),
            log_path=self.workdir / f"{name}.log",
            environment={"PYTHONWARNINGS": "ignore::FutureWarning"},
        )


def start_pipelines(demo: DemoRun, cleanup: contextlib.ExitStack) -> dict[str, DriverProcess]:
    """Both pipelines, started; the returned mapping always holds each one's current driver
    (a restart replaces it), and ``cleanup`` kills whichever still runs after an error."""
    pipelines = {name: demo.start_pipeline(name) for name in demo.names}

    def kill_running_pipelines() -> None:
        """After an error: no driver outlives the demo (each runs in its own session)."""
        for driver in pipelines.values():
            if driver.poll() is None:
                driver.kill()

    cleanup.callback(kill_running_pipelines)
    return pipelines


class CrashSchedule:
    """When to SIGKILL count_1: at a random moment within 2.5 s after it committed a batch
    since its last start, ``--crashes`` times; each kill is followed by a restart from the
    same checkpoint, which must recover exactly where the last committed batch left off."""

    def __init__(self, demo: DemoRun) -> None:
        self.demo = demo
        self.name = demo.names[0]
        self.rng = random.Random(demo.arguments.seed + 1)
        self.crashes = 0
        self.batches_at_start = 0
        self.kill_at: float | None = None

    def crash_and_restart_when_due(
        self, pipelines: dict[str, DriverProcess], finished: Mapping[str, int]
    ) -> None:
        if self.crashes >= self.demo.arguments.crashes or self.name in finished:
            return
        checkpoint = self.demo.workdir / self.name
        if self.kill_at is None and committed_batches(checkpoint) > self.batches_at_start:
            self.kill_at = time.monotonic() + self.rng.uniform(0.0, 2.5)
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            pipelines[self.name].kill()
            self.crashes += 1
            self.demo.timeline.crash_times.append(self.demo.timeline.now())
            self.demo.say(
                f"SIGKILL count_1 (crash {self.crashes}/{self.demo.arguments.crashes}); restarting"
            )
            pipelines[self.name] = self.demo.start_pipeline(self.name)
            self.batches_at_start = committed_batches(checkpoint)
            self.kill_at = None


def run_until_pipelines_finish(
    demo: DemoRun, producer: Producer, pipelines: dict[str, DriverProcess]
) -> int:
    """Poll every 0.25 s until both pipelines exit 0: sample their output, let the sources
    produce the rest once both committed a first batch, tell the pipelines when the sources
    finished, crash and restart count_1 as scheduled, and print progress every 2 s.

    Returns the number of crashes. Raises if a pipeline fails, producing fails or the
    deadline passes."""
    schedule = CrashSchedule(demo)
    last_report = 0.0
    deadline = time.monotonic() + PIPELINE_DEADLINE_SECONDS
    finished: dict[str, int] = {}

    while len(finished) < len(demo.names):
        if time.monotonic() > deadline:
            raise TimeoutError("the pipelines did not finish within the demo's deadline")
        if producer.error is not None:
            raise RuntimeError(f"producing events failed: {producer.error}")
        if not producer.is_alive() and not demo.done_file.exists():
            demo.done_file.touch()
            demo.say(f"sources finished: {producer.sent} events; counting what is left")
        demo.timeline.record(demo.output.sample())
        if not producer.flowing.is_set() and all(
            committed_batches(demo.workdir / name) > 0 for name in demo.names
        ):
            producer.flowing.set()
            demo.say("both counters committed their first batch; the sources produce the rest")
        schedule.crash_and_restart_when_due(pipelines, finished)
        collect_finished(pipelines, finished)
        if demo.timeline.now() - last_report >= 2.0:
            last_report = demo.timeline.now()
            report_progress(demo, producer, schedule.crashes)
            if demo.metrics_url is not None:
                from eospack.lab.demo.metrics_view import scrape

                demo.timeline.record_metrics(scrape(demo.metrics_url))
        time.sleep(0.25)  # polling cadence of the orchestrator
    return schedule.crashes


def collect_finished(pipelines: Mapping[str, DriverProcess], finished: dict[str, int]) -> None:
    """Record each pipeline that exited 0 in ``finished``; a pipeline exiting otherwise ends
    the demo with its last output."""
    for name, driver in pipelines.items():
        code = driver.poll()
        if code is not None and name not in finished:
            if code != 0:
                raise RuntimeError(f"pipeline {name} exited with {code}:\n{driver.output(3000)}")
            finished[name] = code


def report_progress(demo: DemoRun, producer: Producer, crashes: int) -> None:
    progress = " | ".join(
        f"{_short(name)}: {_counted(demo.timeline, name):,} counted" for name in demo.names
    )
    demo.say(
        f"produced {producer.sent:,}/{demo.arguments.events:,} | {progress} | crashes {crashes}"
    )


def verify_outputs(demo: DemoRun, producer: Producer, crashes: int) -> list[PipelineResult]:
    """Each pipeline's whole output judged against what was produced (count_1 with its
    crashes, count_2 with none), with the regressions sampled while it ran."""
    demo.timeline.record(demo.output.sample())
    results = [
        demo.output.verify(
            name, producer.produced, crashes if i == 0 else 0, demo.timeline.regressions[name]
        )
        for i, name in enumerate(demo.names)
    ]
    for result in results:
        object.__setattr__(result, "name", _short(result.name))
    return results


def report(demo: DemoRun, producer: Producer, results: list[PipelineResult]) -> int:
    """The verification table, the plot if asked, and the verdict: 0 when both counters
    equal what was produced, exactly once, else 1."""
    print()
    print(verification_table(producer.sent, results), flush=True)
    if demo.arguments.plot:
        from eospack.lab.demo.plot import plot_timeline

        shorts = {name: _short(name) for name in demo.names}
        shorts.update({name: _short(name) for name in demo.timeline.lag})
        plot_timeline(demo.timeline, shorts, demo.arguments.plot)
        demo.say(f"plot written to {demo.arguments.plot}")
        if demo.timeline.lag:
            demo.say(
                f"plotted the source lag of {len(demo.timeline.lag)} pipelines and"
                f" {len(demo.timeline.commit_ms)} commit latency samples beneath the counts"
            )
    verified = all(result.verified for result in results)
    counts_equal = results[0].counted == results[1].counted == producer.sent
    ok = verified and counts_equal
    demo.say(
        "VERIFIED: both counters equal what was produced, exactly once"
        if ok
        else "NOT VERIFIED: see the table above"
    )
    return 0 if ok else 1


def _open_output(
    arguments: argparse.Namespace,
    say: Callable[[str], None],
    cleanup: contextlib.ExitStack,
    bootstrap: str,
    names: list[str],
    workdir: Path,
) -> Output:
    """Where the pipelines print: PostgreSQL (the embedded one unless --jdbc-url) or a
    topic per pipeline on the demo's broker (no PostgreSQL started)."""
    if arguments.sink == "kafka":
        checkpoints = {name: workdir / name for name in names}
        return KafkaOutput(bootstrap, checkpoints, arguments.partitions, arguments.guarantee)
    if arguments.jdbc_url:
        jdbc_url, jdbc_user = arguments.jdbc_url, arguments.jdbc_user
    else:
        from eospack.lab.services import start_postgres

        say("starting the embedded PostgreSQL")
        postgres = start_postgres()
        cleanup.callback(postgres.stop)
        jdbc_url, jdbc_user = postgres.endpoint.jdbc_url, postgres.endpoint.user
    checkpoints = {name: workdir / name for name in names}
    return JdbcOutput(jdbc_url, jdbc_user, names, arguments.guarantee, checkpoints)


def _counted(timeline: Timeline, name: str) -> int:
    """The events a pipeline's output counts (sum of its latest counts), at the last sample."""
    samples = timeline.totals.get(name)
    return samples[-1][1] if samples else 0


def _short(name: str) -> str:
    return name.split("_", 2)[-1]
