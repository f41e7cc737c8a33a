"""A seeded random walk over the faults a streaming job meets, with an exactly-once checker.

In the spirit of Spark's ``StreamTest.runStressTest`` and of Jepsen: two long-running
queries (``drivers/stress_driver.py``: Kafka -> running_count -> 2pc-jdbc upsert, and
Kafka -> 2pc-s3) run while the walk takes random steps: add data, SIGKILL the whole driver,
kill one of Spark's Python workers, arm a transient fault inside a database/S3 call (before
it applies, after it applied with its answer lost, a worker crash right after a call),
terminate the sink's database sessions from outside, restart the queries with another
``maxOffsetsPerTrigger`` or trigger interval, or with the other 2pc-jdbc ``protocol``.

The checker, during the walk: a versioned count never moves backwards; the 2pc-s3 reader
never returns part of a batch nor a row twice. After the final drain: every produced event
is in S3 exactly once, every key's count equals its events exactly, and no prepared
transaction, staged row or multipart upload of the sinks is left.

The default lane walks 30 steps from the fixed seed ``CI_SEED``; the chaos-marked variant
walks for ``EOSPACK_STRESS_MINUTES`` (default 30) from a random seed and prints its figures.
``EOSPACK_STRESS_SEED`` replays a walk (the seed is printed at the start and on failure);
``EOSPACK_STRESS_STEPS`` sets the default lane's length.
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

from eospack.commit_protocols import faults
from eospack.connectors.jdbc.options import APPLICATION_NAME
from eospack.connectors.s3.options import parse_reader_options
from eospack.connectors.s3.reader import CommittedDataReader, FilesPartition, plan_read
from eospack.processes import DriverProcess
from eospack.services.kafka_tools import Record, create_topic, produce_sealed
from eospack.testing import wait_until
from integration_tests.jdbc_fixtures import pg_leftovers

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parent / "drivers" / "stress_driver.py"
KEYS = 17
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
ACTIONS = {
    "add data": 45,
    "inject a fault": 25,
    "kill a Python worker": 10,
    "terminate the database sessions": 6,
    "restart with other options": 7,
    "restart with the other protocol": 4,
    "SIGKILL the driver": 3,
}
RESTARTS = ("restart with other options", "restart with the other protocol", "SIGKILL the driver")
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


@dataclass
class Figures:
    steps: Counter[str] = field(default_factory=Counter)
    armed: Counter[str] = field(default_factory=Counter)
    restarts_after_failure: int = 0

    def report(self, seed: int, fired: list[dict[str, Any]], rows: int, seconds: float) -> str:
        fired_kinds = Counter(f"{f['call']} {f['mode']}" for f in fired)
        return "\n".join(
            [
                f"stress walk seed={seed}: {sum(self.steps.values())} steps in {seconds:.0f} s,"
                f" {rows} events",
                "  steps: " + ", ".join(f"{k}={v}" for k, v in sorted(self.steps.items())),
                "  faults fired: "
                + (", ".join(f"{k}={v}" for k, v in sorted(fired_kinds.items())) or "none"),
                f"  armed but not reached: {sum(self.armed.values()) - len(fired)}",
                f"  query restarts after a failure: {self.restarts_after_failure}",
            ]
        )


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
        }
        self.produced = 0
        self.figures = Figures()
        self.seen_counts: dict[str, tuple[int, int]] = {}
        self.committed_at_restart = 0
        self.driver: DriverProcess | None = None
        create_topic(self.servers, self.topic, partitions=2)
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
            "--control",
            str(self.control),
        ]
        environment = {
            faults.FAULT_DIRECTORY_VARIABLE: str(self.fault_directory),
            "EOSPACK_STRESS_S3_SECRET": self.s3.endpoint.secret_access_key,
        }
        self.starts += 1
        self.log_path = self.work / f"driver-{self.starts}.log"
        self.driver = DriverProcess(arguments, environment=environment, log_path=self.log_path)

    def driver_started(self, generation: int) -> bool:
        """The current driver has started its queries with settings ``generation``."""
        assert self.driver is not None
        if self.driver.poll() is not None:
            raise AssertionError(f"seed {self.seed}: the driver exited: {self.driver.output(3000)}")
        return f"generation {generation} started" in self.driver.output()

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

    def step(self) -> str:
        action = self.random.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        if action in RESTARTS:
            committed = self.committed_batches()
            if committed <= self.committed_at_restart:
                action = "add data"  # a restart comes only after a commit: queries progress
            else:
                self.committed_at_restart = committed
        self.figures.steps[action] += 1
        if action == "add data":
            self.add_data(self.random.randint(20, 300))
        elif action == "inject a fault":
            call, mode = self.random.choice(FAULT_MENU)
            faults.arm(self.fault_directory, call, mode)
            self.figures.armed[f"{call} {mode}"] += 1
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
        else:
            assert self.driver is not None
            self.driver.kill()
            self.start_driver()
        return action

    def add_data(self, count: int) -> None:
        first = self.produced
        records = [
            Record(i % 2, f"k{i % KEYS}".encode(), str(i).encode())
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

    def walk(self, keep_going: Callable[[int], bool]) -> None:
        self.add_data(200)
        self.start_driver()
        steps = 0
        while keep_going(steps):
            before = self.committed_batches()
            action = self.step()
            steps += 1
            if action in RESTARTS:
                generation = self.settings["generation"]
                wait_until(
                    lambda generation=generation: self.driver_started(generation),
                    90,
                    f"the driver to start generation {generation} (seed {self.seed})",
                )
            else:
                pace(lambda before=before: self.committed_batches() > before, at_most=STEP_SECONDS)
            self.check_counts_never_move_backwards()
            if steps % 10 == 0:
                self.s3_ids()

    def drain_and_check(self) -> None:
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
        expected = list(range(self.produced))
        wait_until(
            lambda: (
                sum(count for _, count, _ in self._counts()) == self.produced
                and sorted(self.s3_ids()) == expected
            ),
            240,
            f"the final drain (seed {self.seed})",
        )
        self.stop_driver()
        self.check_counts_never_move_backwards()
        assert Counter(self.s3_ids()) == Counter(expected), f"seed {self.seed}: S3 files"
        per_key = Counter(f"k{i % KEYS}" for i in expected)
        assert {key: count for key, count, _ in self._counts()} == dict(per_key)
        for table in self.tables.values():
            assert pg_leftovers(self.url, table) == (0, 0), f"seed {self.seed}: {table}"
        uploads = self.s3.endpoint.client().list_multipart_uploads(
            Bucket=self.s3.endpoint.bucket, Prefix=f"{self.prefix}/"
        )
        assert uploads.get("Uploads", []) == [], f"seed {self.seed}: uploads left"

    def close(self) -> None:
        if self.driver_alive():
            assert self.driver is not None
            self.driver.kill()


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


CI_SEED = 20261123
"""The walk CI runs (the issue asks for a small fixed seed set; timing still varies)."""


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
) -> None:
    print(f"\nstress walk seed={seed} (replay with EOSPACK_STRESS_SEED={seed})")
    rig = StressRig(kafka, postgres, s3, tmp_path, name, seed)
    started = time.monotonic()
    try:
        rig.walk(keep_going)
        rig.drain_and_check()
    except BaseException:
        log = rig.log_path.read_text(errors="replace")[-3000:] if rig.log_path.exists() else ""
        print(f"stress walk FAILED, seed={seed}; driver log tail:\n{log}")
        print(rig.database_activity())
        raise
    finally:
        rig.close()
    rig.figures.restarts_after_failure = rig.failures_in_log()
    print(
        rig.figures.report(
            seed, faults.injected(rig.fault_directory), rig.produced, time.monotonic() - started
        )
    )


@pytest.mark.timeout(420)
def test_random_walk_delivers_every_event_exactly_once(kafka, postgres, s3, tmp_path, unique_name):
    steps = int(os.environ.get("EOSPACK_STRESS_STEPS", "30"))
    seed = _seed(CI_SEED)
    _run_walk(kafka, postgres, s3, tmp_path, unique_name, lambda done: done < steps, seed)


@pytest.mark.chaos
@pytest.mark.timeout(3 * 3600)
def test_long_random_walk(kafka, postgres, s3, tmp_path, unique_name):
    minutes = float(os.environ.get("EOSPACK_STRESS_MINUTES", "30"))
    deadline = time.monotonic() + minutes * 60
    _run_walk(
        kafka, postgres, s3, tmp_path, unique_name, lambda _: time.monotonic() < deadline, _seed()
    )
