"""A seeded random walk over the faults a streaming job meets, with an exactly-once checker.

In the spirit of Spark's ``StreamTest.runStressTest`` and of Jepsen: three long-running
queries (``drivers/stress_driver.py``: Kafka -> running_count -> 2pc-jdbc upsert, Kafka ->
2pc-s3, and Kafka -> 2pc-kafka) run while the walk takes random steps: add data, SIGKILL
the whole driver, kill one of Spark's Python workers, arm a transient fault inside a
database, S3 or Kafka-transaction call (before it applies, after it applied with its answer
lost, a worker crash right after a call), terminate the sink's database sessions from
outside, restart the queries with another ``maxOffsetsPerTrigger`` or trigger interval, or
with the other 2pc-jdbc ``protocol``, or restore the stateful query from a savepoint: stop
it after a committed batch, ``eospack savepoint create``, ``restore`` (no-claim and claim in
turn, with seeded key groups and shuffle partitions) and go on on the new checkpoint.
The walk keeps the queries progressing whatever the machine's speed: a restart or restore
comes only after a commit of the stateful query, faults armed stay within
``FAULT_ALLOWANCE`` of its commits, and no events are added while ``MAX_BACKLOG`` wait.

The checker, during the walk: a versioned count never moves backwards (across restores
too); the 2pc-s3 reader never returns part of a batch nor a row twice; a read_committed
consumer of the 2pc-kafka topic never sees an event twice. After the final drain: every
produced event is in S3 and in the Kafka topic (read_committed) exactly once, every key's
count equals its events exactly, and nothing of a sink is left: no prepared transaction,
staged row or undone ledger row of 2pc-jdbc, no multipart upload of 2pc-s3, no open
transaction or undone ledger slot of 2pc-kafka. The figures end with one line per sink
(rows, lost, doubled, leftovers), printed before the final assertions so that a failed
walk shows them too.

The 2pc-kafka query needs Apache Kafka (read_committed); on tansu the walk runs without it
and says so. The default lane walks 30 steps from the fixed seed ``CI_SEED`` and restores a
savepoint by its middle step at the latest; the chaos-marked variant walks for
``EOSPACK_STRESS_MINUTES`` (default 30) from a random seed. ``EOSPACK_STRESS_SEED`` replays
a walk (the seed is printed at the start and on failure); ``EOSPACK_STRESS_STEPS`` sets the
default lane's length.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition

from eospack.commit_protocols.inspection import DONE_STATUS, SinkState
from eospack.connectors.jdbc.options import APPLICATION_NAME
from eospack.connectors.s3.options import parse_reader_options
from eospack.connectors.s3.reader import CommittedDataReader, FilesPartition, plan_read
from eospack.core import faults
from eospack.core.processes import DriverProcess
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed, read_all
from eospack.lab.testing import wait_until
from eospack.tools.checkpoint import inspect_sink
from integration_tests.jdbc_fixtures import pg_leftovers

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parents[1] / "drivers" / "stress_driver.py"
KEYS = 17
PARTITIONS = 2
FAULT_MENU: tuple[tuple[str, faults.Mode], ...] = (
    ("jdbc.decide", "before"),
    ("jdbc.decide", "after"),
    ("jdbc.commit_piece", "after"),
    ("jdbc.commit_piece", "before"),
    ("jdbc.mark_done", "before"),
    ("jdbc.prepare", "after"),
    ("jdbc.prepare", "crash"),
    ("jdbc.fence", "before"),
    ("s3.PutObject", "after"),
    ("s3.CompleteMultipartUpload", "before"),
    ("s3.CompleteMultipartUpload", "after"),
    ("s3.UploadPart", "crash"),
)
KAFKA_SINK_FAULTS: tuple[tuple[str, faults.Mode], ...] = (
    ("kafka_sink.prepare", "after"),
    ("kafka_sink.prepare", "crash"),
    ("kafka_sink.decide", "before"),
    ("kafka_sink.decide", "after"),
    ("kafka_sink.commit_piece", "after"),
)
"""2pc-kafka's calls (``run_call`` in connectors/kafka): a task's flush, the decision's
ledger write, a transaction's commit (EndTxn)."""
RESTORE = "restore from a savepoint"
CATCH_UP = "let the queries catch up"
ACTIONS = {
    "add data": 45,
    "inject a fault": 25,
    "kill a Python worker": 10,
    "terminate the database sessions": 6,
    "restart with other options": 7,
    "restart with the other protocol": 4,
    "SIGKILL the driver": 3,
    RESTORE: 3,
}
RESTARTS = (
    "restart with other options",
    "restart with the other protocol",
    "SIGKILL the driver",
    RESTORE,
)
RESTORE_KEY_GROUPS = (4, 8, 16)
RESTORE_SHUFFLE_PARTITIONS = (2, 3, 4)
FAULT_ALLOWANCE = 8
MAX_BACKLOG = 3000
"""Events produced but not yet counted beyond which a step adds none: a walk producing
faster than a loaded machine processes grows a backlog that a restore's catch-up and the
final drain must read (seen: a restore waiting more than four minutes)."""
RESTART_SECONDS = 120
RESTORE_SECONDS = 240
STEP_SECONDS = 0.6
"""The walk's clock: a step comes after a commit, or after this long, as events come in
production whatever the job is doing."""


def pace(condition: Callable[[], bool], at_most: float) -> bool:
    """Let the queries make progress between steps: until ``condition`` or ``at_most`` s.

    Pacing only: no check depends on it, so it may end either way.
    """
    deadline = time.monotonic() + at_most
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@dataclass(frozen=True)
class SinkOutcome:
    """One sink's end state against the produced events: what the closing figures print."""

    sink: str
    rows: int
    lost: int
    doubled: int
    leftovers: int
    what: str
    """What ``rows`` counts and what ``leftovers`` sums (read_committed records, ...)."""

    @classmethod
    def compare(
        cls, sink: str, expected: Counter[Any], actual: Counter[Any], leftovers: int, what: str
    ) -> SinkOutcome:
        return cls(
            sink,
            sum(actual.values()),
            sum((expected - actual).values()),
            sum((actual - expected).values()),
            leftovers,
            what,
        )

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.doubled == 0 and self.leftovers == 0

    def line(self) -> str:
        return (
            f"  {self.sink}: {self.rows} {self.what.split(';')[0]}, lost {self.lost},"
            f" doubled {self.doubled}, leftovers {self.leftovers}"
            f" ({self.what.split(';')[1].strip()})"
        )


@dataclass
class Figures:
    steps: Counter[str] = field(default_factory=Counter)
    armed: Counter[str] = field(default_factory=Counter)
    restores: list[str] = field(default_factory=list)
    restarts_after_failure: int = 0

    def report(
        self,
        seed: int,
        fired: list[dict[str, Any]],
        events: int,
        seconds: float,
        outcomes: list[SinkOutcome],
    ) -> str:
        """The compact block a closing note quotes: steps, faults, restarts, one line per sink."""
        fired_kinds = Counter(f"{f['call']} {f['mode']}" for f in fired)
        restarts = {
            "driver SIGKILLed": self.steps["SIGKILL the driver"],
            "with other options": self.steps["restart with other options"],
            "with the other protocol": self.steps["restart with the other protocol"],
            "of a failed query": self.restarts_after_failure,
        }
        return "\n".join(
            [
                f"stress walk seed={seed}: {sum(self.steps.values())} steps in {seconds:.0f} s,"
                f" {events} events",
                "  steps: " + ", ".join(f"{k}={v}" for k, v in sorted(self.steps.items())),
                f"  faults fired: {len(fired)} ("
                + (", ".join(f"{k}={v}" for k, v in sorted(fired_kinds.items())) or "none")
                + f"); armed but not reached: {sum(self.armed.values()) - len(fired)}",
                "  restarts: " + ", ".join(f"{k}={v}" for k, v in restarts.items()),
                f"  restores from a savepoint: {len(self.restores)}"
                + (f" ({'; '.join(self.restores)})" if self.restores else ""),
                *(outcome.line() for outcome in outcomes),
            ]
        )


class CommittedTopic:
    """A read_committed consumer of the 2pc-kafka output that keeps its place between
    checks: each check reads what was committed since (to the last stable offset)."""

    def __init__(self, servers: str, topic: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=servers,
            enable_auto_commit=False,
            group_id=None,
            isolation_level="read_committed",
        )
        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.consumer.assign(self.partitions)
        self.consumer.seek_to_beginning(*self.partitions)
        self.ids: Counter[int] = Counter()

    def read_new(self, timeout: float = 30) -> Counter[int]:
        ends = self.consumer.end_offsets(self.partitions)
        deadline = time.monotonic() + timeout
        while any(self.consumer.position(tp) < ends[tp] for tp in self.partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read the 2pc-kafka topic to {ends}")
            for messages in self.consumer.poll(timeout_ms=200).values():
                self.ids.update(int(message.value) for message in messages)
        return self.ids

    def close(self) -> None:
        self.consumer.close()


class StressRig:
    """The services, the driver process and the checker of one walk."""

    def __init__(
        self, kafka: Any, postgres: Any, s3: Any, tmp_path: Path, name: str, seed: int
    ) -> None:
        self.random = random.Random(seed)
        self.seed = seed
        self.servers = kafka.endpoint.bootstrap_servers
        self.topic = f"{name}_events"
        self.postgres = postgres
        self.url = postgres.endpoint.url
        self.check_url = f"{self.url}?options=-c%20statement_timeout%3D15000"
        self.tables = {"counts": f"{name}_counts"}
        self.s3 = s3
        self.s3_path = f"s3://{s3.endpoint.bucket}/{name}"
        self.prefix = name
        self.kafka_sink = kafka.endpoint.kind == "kafka"
        """2pc-kafka's checks need read_committed, which tansu does not honour."""
        self.output_topic = f"{name}_out"
        self.sink_id = f"{name}_events"
        self.ledger_topic = f"{name}_ledger"
        """The walk's own ledger: an open ledger transaction left by another test's crashed
        driver in the shared default ledger would make the walk depend on test order."""
        self.fault_menu = FAULT_MENU + (KAFKA_SINK_FAULTS if self.kafka_sink else ())
        self.fault_directory = tmp_path / "faults"
        self.fault_directory.mkdir()
        self.control = tmp_path / "control.json"
        self.work = tmp_path
        self.starts = 0
        self.log_path = tmp_path / "driver-0.log"
        self.checkpoint_root = tmp_path / "checkpoints"
        self.settings: dict[str, Any] = {
            "generation": 0,
            "max_offsets_per_trigger": 200,
            "trigger_ms": 300,
            "protocol": "prepared",
            "stop": False,
            "restore": {"number": 0},
        }
        self.restore_modes = ["no-claim", "claim"]
        self.random.shuffle(self.restore_modes)
        self.produced = 0
        self.figures = Figures()
        self.seen_counts: dict[str, tuple[int, int]] = {}
        self.committed_at_restart = 0
        self.last_detail = ""
        self.driver: DriverProcess | None = None
        self.started = time.monotonic()
        self.trace_path = tmp_path / "walk.log"
        """One line per step (when, what, in which driver log): a failure names its step."""
        create_topic(self.servers, self.topic, partitions=PARTITIONS)
        self.output: CommittedTopic | None = None
        if self.kafka_sink:
            create_topic(self.servers, self.output_topic, partitions=PARTITIONS)
            self.output = CommittedTopic(self.servers, self.output_topic)
        self._write_control()

    # The driver --------------------------------------------------------------------------

    def start_driver(self) -> None:
        endpoint = self.postgres.endpoint
        arguments = [
            str(DRIVER),
            "--bootstrap-servers",
            self.servers,
            "--topic",
            self.topic,
            "--jdbc-url",
            endpoint.jdbc_url,
            "--jdbc-user",
            endpoint.user,
            "--table-prefix",
            self.prefix,
            "--s3-endpoint",
            self.s3.endpoint.endpoint_url,
            "--s3-path",
            self.s3_path,
            "--s3-access-key",
            self.s3.endpoint.access_key_id,
            "--checkpoint-root",
            str(self.checkpoint_root),
            "--savepoint-root",
            str(self.work / "savepoints"),
            "--control",
            str(self.control),
        ]
        if self.kafka_sink:
            arguments += [
                "--kafka-output-topic",
                self.output_topic,
                "--kafka-sink-id",
                self.sink_id,
                "--kafka-ledger-topic",
                self.ledger_topic,
            ]
        environment = {
            faults.FAULT_DIRECTORY_VARIABLE: str(self.fault_directory),
            "EOSPACK_STRESS_S3_SECRET": self.s3.endpoint.secret_access_key,
        }
        self.starts += 1
        self.log_path = self.work / f"driver-{self.starts}.log"
        self.driver = DriverProcess(arguments, environment=environment, log_path=self.log_path)

    def driver_says(self, line: str) -> bool:
        """The current driver has printed ``line`` (and is still running)."""
        assert self.driver is not None
        if self.driver.poll() is not None:
            raise AssertionError(f"seed {self.seed}: the driver exited: {self.driver.output(3000)}")
        return line in self.driver.output()

    def driver_alive(self) -> bool:
        return self.driver is not None and self.driver.poll() is None

    def stop_driver(self, timeout: float = 120) -> None:
        assert self.driver is not None
        self._write_control(stop=True)
        driver = self.driver
        wait_until(lambda: driver.poll() is not None, timeout, "the driver to stop")
        assert driver.process.returncode == 0, driver.output(4000)

    def _write_control(self, **changes: Any) -> None:
        self.settings.update(changes)
        temporary = self.control.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.settings))
        os.replace(temporary, self.control)

    # Steps -------------------------------------------------------------------------------

    def step(self, restore_due: bool = False) -> str:
        """Take one step; ``restore_due``: restore now if the queries allow a restart."""
        action = self.random.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        if restore_due:
            action = RESTORE
        if action in RESTARTS and self.committed_batches() <= self.committed_at_restart:
            action = "add data"  # a restart comes only after a commit: queries progress
        if action == "inject a fault" and not self.may_arm_a_fault():
            action = "add data"
        if action == "add data" and self.backlog() > MAX_BACKLOG:
            action = CATCH_UP  # the step only paces
        self.figures.steps[action] += 1
        self.last_detail = ""
        if action == "add data":
            self.add_data(self.random.randint(20, 300))
        elif action == "inject a fault":
            call, mode = self.random.choice(self.fault_menu)
            faults.arm(self.fault_directory, call, mode)
            self.figures.armed[f"{call} {mode}"] += 1
            self.last_detail = f" {call} {mode}"
        elif action == "kill a Python worker":
            self.kill_a_python_worker()
        elif action == "terminate the database sessions":
            with psycopg.connect(self.url, autocommit=True) as connection:
                connection.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (APPLICATION_NAME,),
                )
        elif action == "restart with other options":
            self._write_control(
                generation=self.settings["generation"] + 1,
                max_offsets_per_trigger=self.random.choice([30, 200, 2000]),
                trigger_ms=self.random.choice([100, 300, 1000]),
            )
        elif action == "restart with the other protocol":
            protocol = "staging" if self.settings["protocol"] == "prepared" else "prepared"
            self._write_control(generation=self.settings["generation"] + 1, protocol=protocol)
        elif action == RESTORE:
            self.request_restore()
        elif action == "SIGKILL the driver":
            assert self.driver is not None
            self.driver.kill()
            self.start_driver()
        return action

    def backlog(self) -> int:
        """Events the counts query has not counted yet (as last checked)."""
        return self.produced - sum(count for count, _ in self.seen_counts.values())

    def may_arm_a_fault(self) -> bool:
        """The faults armed stay within ``FAULT_ALLOWANCE`` of the stateful query's commits:
        each fired fault fails a task or a query, and armed at the walk's pace they kept the
        counts query restarting (seen in a five-minute walk on a loaded machine: one commit,
        no restart or restore step ever allowed). A short walk still arms its first faults
        before the first commit."""
        armed = sum(self.figures.armed.values())
        return armed - self.committed_batches() < FAULT_ALLOWANCE

    def trace(self, line: str) -> None:
        with self.trace_path.open("a") as trace:
            trace.write(
                f"{time.monotonic() - self.started:7.1f} s  {line} (driver-{self.starts}.log)\n"
            )

    def trace_tail(self, lines: int = 15) -> str:
        if not self.trace_path.exists():
            return ""
        return "\n".join(self.trace_path.read_text().splitlines()[-lines:])

    def request_restore(self) -> None:
        """Ask the driver to move the stateful query to a new checkpoint through a savepoint:
        no-claim and claim in turn, key groups and shuffle partitions chosen by the seed."""
        number = len(self.figures.restores) + 1
        mode = self.restore_modes[(number - 1) % 2]
        key_groups = self.random.choice(RESTORE_KEY_GROUPS)
        partitions = self.random.choice(RESTORE_SHUFFLE_PARTITIONS)
        self._write_control(
            restore={
                "number": number,
                "mode": mode,
                "key_groups": key_groups,
                "shuffle_partitions": partitions,
            }
        )
        self.figures.restores.append(f"{mode} key_groups={key_groups} partitions={partitions}")
        self.last_detail = f" {number}: {self.figures.restores[-1]}"

    def wait_for_restart(self, action: str) -> None:
        if action == RESTORE:
            number = self.settings["restore"]["number"]
            line, timeout = f"restore {number} started", RESTORE_SECONDS
        else:
            line = f"generation {self.settings['generation']} started"
            timeout = RESTART_SECONDS
        wait_until(
            lambda: self.driver_says(line), timeout, f"the driver's {line!r} (seed {self.seed})"
        )
        self.committed_at_restart = self.committed_batches()
        self.trace(f"the driver printed {line!r}")

    def add_data(self, count: int) -> None:
        first = self.produced
        records = [
            Record(i % PARTITIONS, f"k{i % KEYS}".encode(), str(i).encode())
            for i in range(first, first + count)
        ]
        produce_sealed(self.servers, self.topic, records)
        self.produced += count

    def kill_a_python_worker(self) -> None:
        """SIGKILL one Python worker forked by the driver's JVM (executor task or commit)."""
        assert self.driver is not None
        workers = [
            pid
            for pid in _session_processes(self.driver.pid)
            if pid != self.driver.pid and _is_forked_pyspark_worker(pid)
        ]
        if workers:
            try:
                os.kill(self.random.choice(workers), signal.SIGKILL)
            except ProcessLookupError:
                pass

    # Checks ------------------------------------------------------------------------------

    def committed_batches(self) -> int:
        """Batches of the counts table done, by every sink id that wrote it (a restored
        query's sink is a new one)."""
        with psycopg.connect(self.check_url) as connection:
            exists = connection.execute("SELECT to_regclass('eospack_commits')").fetchone()
            if not exists or exists[0] is None:
                return 0
            row = connection.execute(
                "SELECT count(*) FROM eospack_commits WHERE target = ANY(%s) AND status = 'done'",
                (list(self.tables.values()),),
            ).fetchone()
        return int(row[0]) if row else 0

    def check_counts_never_move_backwards(self) -> None:
        for key, count, version in self._counts():
            before = self.seen_counts.get(key, (0, 0))
            assert (count, version) >= before, (
                f"seed {self.seed}: count of {key} moved backwards: {before} -> {(count, version)}"
            )
            assert count >= before[0] and version >= before[1], f"seed {self.seed}: {key}"
            self.seen_counts[key] = (count, version)

    def check_kafka_never_twice(self) -> None:
        """A read_committed consumer never sees an event twice, whatever is still open."""
        if self.output is None:
            return
        doubled = sorted(event for event, seen in self.output.read_new().items() if seen > 1)
        assert not doubled, (
            f"seed {self.seed}: read_committed saw events twice in the 2pc-kafka topic:"
            f" {doubled[:10]} ({len(doubled)} events)"
        )

    def _counts(self) -> list[tuple[str, int, int]]:
        with psycopg.connect(self.check_url) as connection:
            exists = connection.execute(
                "SELECT to_regclass(%s)", (f'"{self.tables["counts"]}"',)
            ).fetchone()
            if not exists or exists[0] is None:
                return []
            return connection.execute(
                f'SELECT key, count, version FROM "{self.tables["counts"]}"'
            ).fetchall()

    def s3_ids(self) -> list[int]:
        """Read the committed files the way the 2pc-s3 reader does; check whole batches."""
        options = parse_reader_options(self._s3_options())
        plan = plan_read(options)
        if plan.schema is None:
            return []
        reader = CommittedDataReader(options, plan.schema, plan)
        ids: list[int] = []
        rows_by_file = {}
        for partition in reader.partitions():
            for file in partition.files:  # type: ignore[attr-defined]
                batches = list(reader.read(FilesPartition([file])))
                rows_by_file[file.key] = sum(batch.num_rows for batch in batches)
                for batch in batches:
                    ids.extend(int(value) for value in batch.column("id").to_pylist())
        self._check_whole_batches(rows_by_file)
        return ids

    def _check_whole_batches(self, rows_by_file: dict[str, int]) -> None:
        client = self.s3.endpoint.client()
        listing = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.s3.endpoint.bucket, Prefix=f"{self.prefix}/_eospack/manifests/"
        )
        for page in listing:
            for entry in page.get("Contents", ()):
                manifest = json.loads(
                    client.get_object(Bucket=self.s3.endpoint.bucket, Key=entry["Key"])[
                        "Body"
                    ].read()
                )
                files = manifest.get("files", [])
                returned = [file["key"] for file in files if file["key"] in rows_by_file]
                assert returned in ([], [file["key"] for file in files]), (
                    f"seed {self.seed}: the 2pc-s3 reader returned part of batch"
                    f" {manifest.get('batch_id')}: {len(returned)} of {len(files)} files"
                )
                for file in files:
                    if file["key"] in rows_by_file:
                        assert rows_by_file[file["key"]] == file["rows"], file["key"]

    def _s3_options(self) -> dict[str, str]:
        endpoint = self.s3.endpoint
        return {
            "path": self.s3_path,
            "endpointUrl": endpoint.endpoint_url,
            "accessKeyId": endpoint.access_key_id,
            "secretAccessKey": endpoint.secret_access_key,
        }

    def _kafka_state(self) -> SinkState:
        """The 2pc-kafka sink as its resource reports it (read only: nothing is fenced)."""
        options = {
            "kafka.bootstrap.servers": self.servers,
            "topic": self.output_topic,
            "ledgerTopic": self.ledger_topic,
            "sinkId": self.sink_id,
        }
        return inspect_sink("2pc-kafka", "(unused: sinkId is given)", options)

    def kafka_open_transactions(self) -> list[str]:
        """The sink's open transactions: its tasks' and its own ledger's."""
        return [leftover.name for leftover in self._kafka_state().leftovers]

    def kafka_slots_not_done(self) -> dict[int, str]:
        """Each ledger slot of the 2pc-kafka sink whose status is not done (none after a
        drain; done slots older than the previous batch are deleted by the sink)."""
        decisions = self._kafka_state().decisions
        return {d.batch_id: d.status for d in decisions if d.status != DONE_STATUS}

    def jdbc_ledger_not_done(self) -> int:
        with psycopg.connect(self.check_url) as connection:
            row = connection.execute(
                "SELECT count(*) FROM eospack_commits WHERE target = ANY(%s) AND status <> 'done'",
                (list(self.tables.values()),),
            ).fetchone()
        return int(row[0]) if row else 0

    def database_activity(self) -> str:
        """What the database is doing (for a failure report): sessions, waits, prepared."""
        with psycopg.connect(self.check_url, autocommit=True) as connection:
            sessions = connection.execute(
                "SELECT pid, application_name, state, wait_event_type, left(query, 120)"
                " FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchall()
            locks = connection.execute(
                "SELECT l.pid, l.relation::regclass::text, l.mode, l.granted FROM pg_locks l"
                " WHERE l.relation IS NOT NULL AND NOT l.granted"
            ).fetchall()
            prepared = connection.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
        return "\n".join(
            [
                "sessions:",
                *map(str, sessions),
                "waiting locks:",
                *map(str, locks),
                "prepared:",
                *map(str, prepared),
            ]
        )

    def failures_in_log(self) -> int:
        logs = self.work.glob("driver-*.log")
        return sum(log.read_text(errors="replace").count("failed, restarting:") for log in logs)

    # The walk ----------------------------------------------------------------------------

    def walk(self, keep_going: Callable[[int], bool], restore_by: int | None = None) -> None:
        """Steps start once the driver started its queries (a walk that began with the
        driver's process ended before the driver ran any batch: its faults never fired).
        ``restore_by``: the step by which the walk has restored a savepoint at least once,
        waiting for a committed batch of the stateful query if need be."""
        self.add_data(200)
        self.start_driver()
        wait_until(
            lambda: self.driver_says("generation 0 started"),
            RESTART_SECONDS,
            f"the driver to start its queries (seed {self.seed})",
        )
        self.trace("the driver started its queries")
        steps = 0
        while keep_going(steps):
            before = self.committed_batches()
            due = restore_by is not None and steps >= restore_by and not self.figures.restores
            if due:  # a savepoint needs a committed batch of the running checkpoint
                wait_until(
                    lambda: self.committed_batches() > self.committed_at_restart,
                    RESTART_SECONDS,
                    f"a commit of the counts before the restore (seed {self.seed})",
                )
            action = self.step(restore_due=due)
            steps += 1
            self.trace(f"step {steps}: {action}{self.last_detail}")
            if action in RESTARTS:
                self.wait_for_restart(action)
            else:
                pace(lambda before=before: self.committed_batches() > before, at_most=STEP_SECONDS)
            self.check_counts_never_move_backwards()
            self.check_kafka_never_twice()
            if steps % 10 == 0:
                self.s3_ids()

    def drained(self) -> bool:
        """Every event counted, in S3 and in the Kafka topic, and 2pc-kafka done (checked
        before the stop: a stop during a commit may leave its last mark for the restart)."""
        if sum(count for _, count, _ in self._counts()) != self.produced:
            return False
        if self.output is not None and set(self.output.read_new()) != set(range(self.produced)):
            return False
        if len(set(self.s3_ids())) != self.produced:
            return False
        return self.output is None or (
            not self.kafka_open_transactions() and not self.kafka_slots_not_done()
        )

    def drain(self) -> None:
        """Disarm what did not fire, add the last events, restart with large batches and wait
        until every sink has every event; then stop the driver."""
        for pending in self.fault_directory.glob("*.fault"):
            pending.unlink(missing_ok=True)
        self.add_data(100)
        self._write_control(
            generation=self.settings["generation"] + 1,
            max_offsets_per_trigger=5000,
            trigger_ms=200,
        )
        if not self.driver_alive():
            self.start_driver()
        self.trace(f"drain: {self.produced} events")
        wait_until(self.drained, 240, f"the final drain (seed {self.seed})", poll=0.5)
        self.trace("drained")
        self.stop_driver()

    def outcomes(self) -> list[SinkOutcome]:
        """Each sink against the produced events, read after the driver stopped."""
        expected = Counter(range(self.produced))
        per_key = Counter(f"k{event % KEYS}" for event in expected)
        counted = Counter({key: count for key, count, _ in self._counts()})
        prepared, staged = pg_leftovers(self.url, self.tables["counts"])
        uploads = self.s3.endpoint.client().list_multipart_uploads(
            Bucket=self.s3.endpoint.bucket, Prefix=f"{self.prefix}/"
        )
        found = [
            SinkOutcome.compare(
                "2pc-jdbc counts",
                per_key,
                counted,
                prepared + staged + self.jdbc_ledger_not_done(),
                "events counted; prepared transactions, staged rows, ledger rows not done",
            ),
            SinkOutcome.compare(
                "2pc-s3 files",
                expected,
                Counter(self.s3_ids()),
                len(uploads.get("Uploads", [])),
                "rows; multipart uploads in progress",
            ),
        ]
        if self.output is not None:
            records = read_all(self.servers, self.output_topic, isolation_level="read_committed")
            found.append(
                SinkOutcome.compare(
                    "2pc-kafka events",
                    expected,
                    Counter(int(value) for *_, value in records if value is not None),
                    len(self.kafka_open_transactions()) + len(self.kafka_slots_not_done()),
                    "records (read_committed); open transactions, ledger slots not done",
                )
            )
        return found

    def close(self) -> None:
        if self.driver_alive():
            assert self.driver is not None
            self.driver.kill()
        if self.output is not None:
            self.output.close()


def _session_processes(session_id: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == session_id:  # session id is field 6 of stat
            found.append(int(entry))
    return found


def _is_forked_pyspark_worker(pid: int) -> bool:
    """A worker is a child of pyspark's daemon and runs the daemon's command line."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        stat = Path(f"/proc/{pid}/stat").read_text()
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        parent_command = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ")
    except (OSError, ValueError):
        return False
    return b"pyspark.daemon" in command and b"pyspark.daemon" in parent_command


CI_SEED = 20261764
"""The walk CI runs (the issue asks for a small fixed seed set; timing still varies). Its
30 steps arm faults of 2pc-kafka, 2pc-jdbc and 2pc-s3, kill Python workers, terminate the
database sessions, restart once with other options and restore once (claim, other key
groups and shuffle partitions); no SIGKILL of the driver (the crash tests and the chaos
lane's walk have those), which keeps the default lane's walk short."""


def _seed(default: int | None = None) -> int:
    given = os.environ.get("EOSPACK_STRESS_SEED")
    if given:
        return int(given)
    return default if default is not None else random.randrange(2**31)


def _run_walk(
    kafka: Any,
    postgres: Any,
    s3: Any,
    tmp_path: Path,
    name: str,
    keep_going: Callable[[int], bool],
    seed: int,
    restore_by: int | None = None,
) -> None:
    """Walk, drain, print the figures (also when the drain or a sink's end state fails),
    then assert each sink exact: nothing lost, nothing doubled, nothing left."""
    print(f"\nstress walk seed={seed} (replay with EOSPACK_STRESS_SEED={seed})")
    rig = StressRig(kafka, postgres, s3, tmp_path, name, seed)
    if not rig.kafka_sink:
        print("stress walk: no 2pc-kafka query (the broker is tansu; read_committed needs Kafka)")
    started = time.monotonic()
    drain_error: BaseException | None = None
    try:
        rig.walk(keep_going, restore_by)
        try:
            rig.drain()
        except (TimeoutError, AssertionError) as error:
            drain_error = error
        outcomes = rig.outcomes()
    except BaseException:
        log = rig.log_path.read_text(errors="replace")[-3000:] if rig.log_path.exists() else ""
        print(f"stress walk FAILED, seed={seed}; last steps:\n{rig.trace_tail()}")
        print(f"driver log tail:\n{log}")
        print(rig.database_activity())
        raise
    finally:
        rig.close()
    rig.figures.restarts_after_failure = rig.failures_in_log()
    fired = faults.injected(rig.fault_directory)
    print(rig.figures.report(seed, fired, rig.produced, time.monotonic() - started, outcomes))
    if drain_error is not None:
        log = rig.log_path.read_text(errors="replace")[-3000:] if rig.log_path.exists() else ""
        print(f"stress walk FAILED in the drain, seed={seed}; last steps:\n{rig.trace_tail()}")
        print(f"driver log tail:\n{log}")
        raise drain_error
    inexact = [outcome for outcome in outcomes if not outcome.exact]
    if inexact:
        print(f"stress walk FAILED, seed={seed}; last steps:\n{rig.trace_tail()}")
    assert not inexact, f"seed {seed}: " + "; ".join(o.line().strip() for o in inexact)
    rig.check_counts_never_move_backwards()


@pytest.mark.timeout(480)
def test_random_walk_delivers_every_event_exactly_once(kafka, postgres, s3, tmp_path, unique_name):
    steps = int(os.environ.get("EOSPACK_STRESS_STEPS", "30"))
    seed = _seed(CI_SEED)
    _run_walk(
        kafka,
        postgres,
        s3,
        tmp_path,
        unique_name,
        lambda done: done < steps,
        seed,
        restore_by=steps // 2,
    )


@pytest.mark.chaos
@pytest.mark.timeout(3 * 3600)
def test_long_random_walk(kafka, postgres, s3, tmp_path, unique_name):
    minutes = float(os.environ.get("EOSPACK_STRESS_MINUTES", "30"))
    deadline = time.monotonic() + minutes * 60
    _run_walk(
        kafka, postgres, s3, tmp_path, unique_name, lambda _: time.monotonic() < deadline, _seed()
    )
