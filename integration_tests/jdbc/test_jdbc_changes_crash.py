"""2pc-jdbc ``writeMode=changes`` when the driver dies: at each commit point of the
protocol, and at arbitrary instants while the Debezium recipe of docs/connectors/2pc-jdbc.md
applies three tables' change topics. Each ends row for row where the source tables ended,
with nothing prepared or staged left."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from eospack.connectors.jdbc.dialect import TableName, stage_table
from eospack.core.fault_points import ALL_FAULT_POINTS
from eospack.lab.services.kafka_tools import Record, create_topic, produce_sealed
from integration_tests.crash_harness import run_driver
from integration_tests.jdbc_changes_parts import (
    DEBEZIUM_TABLES,
    PASSWORD_VARIABLE,
    change_log,
    debezium_event,
    debezium_key,
    disturbed_batches,
    expected_table,
    write_change_files,
)
from integration_tests.jdbc_fixtures import pg_leftovers

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).resolve().parents[1] / "drivers" / "jdbc_changes_driver.py"
DRIVER_TIMEOUT = 300.0
STAGING_POINTS = ("after_prepare", "before_decision", "after_decision", "after_commit")
ANSI_SESSION = "SET SESSION sql_mode = CONCAT_WS(',', @@SESSION.sql_mode, 'ANSI_QUOTES')"


def pg_table(url: str, table: str, version: str = "version") -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as connection:
        return connection.execute(
            f'SELECT id, name, "{version}" FROM "{table}" ORDER BY id'
        ).fetchall()


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("protocol", "points"),
    [
        pytest.param("prepared", ALL_FAULT_POINTS, id="prepared", marks=pytest.mark.chaos),
        pytest.param("staging", STAGING_POINTS, id="staging", marks=pytest.mark.chaos),
    ],
)
def test_a_crash_at_each_commit_point_still_ends_equal_to_the_source(
    postgres, tmp_path, unique_name, protocol, points
):
    """One run per commit point, each killed there at the next batch (its restart first
    finishes the batch the previous run left), then a run to the end."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    log = change_log(seed, count=300, keys=30)
    write_change_files(tmp_path / "in", disturbed_batches(seed, log, batches=len(points) + 3))
    arguments = [
        "--source=files",
        f"--input={tmp_path / 'in'}",
        f"--tables={unique_name}",
        f"--checkpoint={tmp_path / 'cp'}",
        f"--url={postgres.endpoint.jdbc_url}",
        f"--user={postgres.endpoint.user}",
        f"--protocol={protocol}",
    ]
    for batch, point in enumerate(points, start=1):
        run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT, fault_point=f"{point}@{batch}")
        assert run.was_killed, f"{point}@{batch} was not reached: {run.explain()}"
    run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT)
    assert run.succeeded, run.explain()
    assert pg_table(postgres.endpoint.url, unique_name) == expected_table(log), f"seed {seed}"
    assert pg_leftovers(postgres.endpoint.url, unique_name) == (0, 0)


def produce_debezium_topics(
    servers: str, prefix: str, seed: int, events: int
) -> dict[str, list[tuple[Any, ...]]]:
    """Per table a Debezium topic of about ``events / 3`` change events (two partitions,
    keyed by id, with the null-valued tombstone record Debezium sends after each delete)
    and the table the source ends with."""
    expected = {}
    per_table = max(events // len(DEBEZIUM_TABLES), 1)
    for index, table in enumerate(DEBEZIUM_TABLES):
        log = change_log(seed + index, count=per_table, keys=max(per_table // 8, 4))
        records: list[Record] = []
        for change in log:
            partition = change.id % 2
            # the LSN: one WAL position per change of the source database
            records.append(
                Record(
                    partition, debezium_key(change), debezium_event(table, change, change.version)
                )
            )
            if change.op == "d":
                records.append(Record(partition, debezium_key(change), None))
        create_topic(servers, f"{prefix}.{table}", partitions=2)
        produce_sealed(servers, f"{prefix}.{table}", records)
        expected[table] = expected_table(log)
    return expected


@dataclass(frozen=True)
class TargetDatabase:
    """What the Debezium test needs of a database: the driver's connection arguments, the
    batches done in the ledger (the kill trigger), a target's rows and its leftovers."""

    jdbc_url: str
    user: str
    password: str
    query: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]]
    leftovers: Callable[[str], tuple[int, int]]
    table_placeholder: str

    def done_batches(self, tables: list[str]) -> int:
        marks = ", ".join([self.table_placeholder] * len(tables))
        try:
            rows = self.query(
                f"SELECT count(*) FROM eospack_commits WHERE status = 'done'"
                f" AND target IN ({marks})",
                tuple(tables),
            )
        except (psycopg.errors.UndefinedTable, pymysql.err.ProgrammingError):
            return 0  # no ledger before the first query starts
        return int(rows[0][0]) if rows else 0

    def table(self, table: str) -> list[tuple[Any, ...]]:
        return self.query(f'SELECT id, name, "lsn" FROM "{table}" ORDER BY id', ())


def postgres_target(postgres: Any) -> TargetDatabase:
    url = postgres.endpoint.url

    def query(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with psycopg.connect(url) as connection:
            return connection.execute(sql, params).fetchall()

    return TargetDatabase(
        postgres.endpoint.jdbc_url,
        postgres.endpoint.user,
        "",
        query,
        lambda table: pg_leftovers(url, table),
        "%s",
    )


def mariadb_target(mariadb: Any) -> TargetDatabase:
    endpoint = mariadb.endpoint

    def query(sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with (
            contextlib.closing(endpoint.connect(init_command=ANSI_SESSION)) as connection,
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, params or None)
            return [tuple(row) for row in cursor.fetchall()]

    def leftovers(table: str) -> tuple[int, int]:
        """(0: MariaDB has no prepared pieces, rows in the table's staging table)."""
        stage = stage_table(TableName(None, table))
        exists = query(
            "SELECT count(*) FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (stage.name,),
        )
        if not exists[0][0]:
            return 0, 0
        return 0, int(query(f"SELECT count(*) FROM {stage.sql()}", ())[0][0])

    return TargetDatabase(
        endpoint.jdbc_url, endpoint.user, endpoint.password, query, leftovers, "%s"
    )


def run_debezium_recipe(
    kafka: Any,
    database: TargetDatabase,
    tmp_path: Path,
    unique_name: str,
    events: int,
    kills: int,
    batches_per_table: int,
) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    servers = kafka.endpoint.bootstrap_servers
    prefix = f"shop_{unique_name}"
    expected = produce_debezium_topics(servers, prefix, seed, events)
    per_trigger = max(events // (3 * batches_per_table), 10)
    arguments = [
        "--source=debezium",
        f"--bootstrap-servers={servers}",
        f"--topic-prefix={prefix}",
        f"--max-offsets-per-trigger={per_trigger}",
        f"--tables={','.join(DEBEZIUM_TABLES)}",
        f"--checkpoint={tmp_path / 'cp'}",
        f"--url={database.jdbc_url}",
        f"--user={database.user}",
    ]
    environment = {PASSWORD_VARIABLE: database.password} if database.password else None
    targets = {table: f"{unique_name}_{table}" for table in DEBEZIUM_TABLES}
    arguments.append(f"--target-prefix={unique_name}_")
    total_batches = len(DEBEZIUM_TABLES) * (events // len(DEBEZIUM_TABLES) // per_trigger)
    rng = random.Random(seed)
    killed = 0
    for kill in range(kills):
        # kill somewhere in the next slice of the run, at an instant decided by progress
        threshold = (kill + 1) * total_batches // (kills + 2) + rng.randrange(2)
        run = run_driver(
            DRIVER,
            arguments,
            timeout=DRIVER_TIMEOUT,
            kill_when=lambda t=threshold: database.done_batches(list(targets.values())) >= t,
            environment=environment,
        )
        killed += run.was_killed
        assert run.was_killed or run.succeeded, run.explain()
    run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT, environment=environment)
    assert run.succeeded, run.explain()
    assert killed == kills, f"only {killed} of {kills} runs were killed: the stream ended first"
    for table in DEBEZIUM_TABLES:
        assert database.table(targets[table]) == expected[table], f"table {table}, seed {seed}"
        assert database.leftovers(targets[table]) == (0, 0)


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_debezium_recipe_survives_driver_kills(kafka, postgres, tmp_path, unique_name):
    run_debezium_recipe(
        kafka,
        postgres_target(postgres),
        tmp_path,
        unique_name,
        events=300,
        kills=2,
        batches_per_table=6,
    )


@pytest.mark.chaos
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("database", ["postgres", "mariadb"])
def test_debezium_recipe_at_scale_survives_five_driver_kills(
    kafka, request, tmp_path, unique_name, database
):
    """The issue's proof: 100k inserts, updates and deletes over 3 tables (one query per
    table) through 5 driver SIGKILLs end row for row equal to the source tables."""
    server = request.getfixturevalue(database)
    target = postgres_target(server) if database == "postgres" else mariadb_target(server)
    run_debezium_recipe(
        kafka, target, tmp_path, unique_name, events=100_000, kills=5, batches_per_table=20
    )
