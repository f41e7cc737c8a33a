"""2pc-jdbc under crashes: the driver is SIGKILLed at every fault point of commit_protocols
(one chained run per point, each restarting from the previous run's checkpoint), and the
database is killed mid-stream. Every restart must leave each input row exactly once in
the table, no prepared transaction or staged row of the sink, and every ledger row done."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eospack.testing import await_query, wait_until
from integration_tests.crash_harness import run_driver
from integration_tests.jdbc_fixtures import (
    pg_ledger,
    pg_leftovers,
    pg_rows,
    stream_input,
    write_input_files,
)

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).parent / "drivers" / "jdbc_sink_driver.py"
DRIVER_TIMEOUT = 150.0

# Each run is killed at its point in the batch after the previous run's last commit.
CRASH_PLANS = {
    "prepared": [
        "after_prepare@1",
        "before_decision@2",
        "after_decision@3",
        "between_piece_commits@4",
        "after_commit@5",
    ],
    "staging": ["after_prepare@1", "after_decision@2", "after_commit@3"],
}


def input_batches(count: int) -> list[list[tuple[int, str, int]]]:
    return [[(b * 10 + i, f"row-{b}-{i}", b) for i in range(6)] for b in range(count)]


def assert_no_duplicates_so_far(url: str, table: str, expected: list[tuple[Any, ...]]) -> None:
    rows = pg_rows(url, table) if table_exists(url, table) else []
    duplicated = [row for row, count in Counter(rows).items() if count > 1]
    assert duplicated == [], f"rows applied twice: {duplicated}"
    assert set(rows) <= set(expected)


def table_exists(url: str, table: str) -> bool:
    with psycopg.connect(url) as connection:
        row = connection.execute("SELECT to_regclass(%s)", (f'"{table}"',)).fetchone()
    return bool(row and row[0])


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "protocol",
    [
        # by default the prepared protocol's driver is killed after prepare and after the
        # decision (test_jdbc_faults) and between piece commits (test_cluster); every point
        # here and in the end-to-end gauntlet in release checks. Staging, every point:
        # after_commit is killed by default nowhere else
        pytest.param("prepared", marks=pytest.mark.chaos),
        "staging",
    ],
)
def test_kill_at_every_fault_point_then_restart_applies_each_row_exactly_once(
    postgres, tmp_path, unique_name, protocol
):
    url = postgres.endpoint.url
    plan = CRASH_PLANS[protocol]
    batches = input_batches(len(plan) + 2)
    write_input_files(tmp_path / "in", batches)
    expected = sorted(row for batch in batches for row in batch)
    arguments = [
        "--input",
        str(tmp_path / "in"),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--url",
        postgres.endpoint.jdbc_url,
        "--user",
        postgres.endpoint.user,
        "--table",
        unique_name,
        "--protocol",
        protocol,
    ]
    # A primary key makes a duplicate fail loudly, and makes a replayed row wait on the
    # lock of a crashed run's prepared row unless recovery rolled that back first.
    with psycopg.connect(url) as connection:
        connection.execute(
            f'CREATE TABLE "{unique_name}" (id bigint PRIMARY KEY, name text, version bigint)'
        )

    for fault_point in plan:
        run = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT, fault_point=fault_point)
        assert run.was_killed, f"{fault_point} was not reached:\n{run.explain()}"
        assert_no_duplicates_so_far(url, unique_name, expected)

    final = run_driver(DRIVER, arguments, timeout=DRIVER_TIMEOUT)
    assert final.succeeded, final.explain()
    assert pg_rows(url, unique_name) == expected
    assert pg_leftovers(url, unique_name) == (0, 0)
    ledger = pg_ledger(url, unique_name)
    assert {status for *_, status in ledger} == {"done"}
    assert sorted(batch for _, batch, *_ in ledger) == list(range(len(batches)))
    assert sum(rows for _, _, rows, *_ in ledger) == len(expected)


@pytest.mark.timeout(300)
def test_database_restart_mid_stream_fails_clearly_and_recovers_exactly_once(
    spark, tmp_path, unique_name
):
    from eospack.services import start_postgres

    server = start_postgres(max_prepared_transactions=16)
    try:
        url = server.endpoint.url
        batches = input_batches(12)
        write_input_files(tmp_path / "in", batches)
        options = {
            "url": server.endpoint.jdbc_url,
            "user": server.endpoint.user,
            "dbtable": unique_name,
            "createTableIfNotExists": "true",
            "protocol": "prepared",
        }

        def start() -> Any:
            return (
                stream_input(spark, tmp_path / "in", partitions=2)
                .writeStream.format("2pc-jdbc")
                .options(**options)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )

        query = start()
        wait_until(
            lambda: table_exists(url, unique_name) and len(pg_ledger(url, unique_name)) >= 2,
            60,
            "two committed batches",
        )
        server.kill()
        with pytest.raises(Exception) as caught:
            await_query(query, 120)
        # A task that cannot connect fails the job ("Writing job failed"): its cause is in
        # the JVM trace. A commit that loses the server fails with its own message.
        message = f"{caught.value}\n{getattr(caught.value, '_stackTrace', '')}"
        assert "could not connect to postgresql://" in message or (
            "2pc-jdbc lost postgresql://" in message and "connection error" in message
        ), message[:2000]

        server.start()
        assert_no_duplicates_so_far(url, unique_name, sorted(r for b in batches for r in b))
        await_query(start(), 120)
        assert pg_rows(url, unique_name) == sorted(r for b in batches for r in b)
        assert pg_leftovers(url, unique_name) == (0, 0)
        assert {status for *_, status in pg_ledger(url, unique_name)} == {"done"}
    finally:
        server.stop()
