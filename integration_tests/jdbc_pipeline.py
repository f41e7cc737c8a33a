"""A 2pc-jdbc streaming pipeline in a driver subprocess or in this session, shared by the
fault, inspection and supervisor tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from eospack.core import faults
from eospack.lab.testing import await_query
from integration_tests.crash_harness import DriverRun, run_driver
from integration_tests.drivers import jdbc_sink_driver
from integration_tests.jdbc_fixtures import (
    pg_ledger,
    pg_leftovers,
    pg_rows,
    write_input_files,
)

DRIVER = Path(__file__).parent / "drivers" / "jdbc_sink_driver.py"


DRIVER_TIMEOUT = 150.0


QUERY_TIMEOUT = 120.0


def input_batches(count: int) -> list[list[tuple[int, str, int]]]:
    return [[(b * 10 + i, f"row-{b}-{i}", b) for i in range(6)] for b in range(count)]


@dataclass(frozen=True)
class QueryRun:
    """A run of the driver's query in the test's own Spark session (no crash needed)."""

    succeeded: bool
    output: str
    was_killed: bool = False

    def explain(self, tail: int = 3000) -> str:
        return self.output[-tail:]


class Pipeline:
    """One fault-test query: its input, checkpoint, table and the driver's arguments.

    ``crash`` runs the driver in its own process (a SIGKILL needs one); ``run`` runs the
    same query in the test's session, which costs no JVM start. Faults are armed in the
    session's fault directory, which both see.
    """

    def __init__(
        self, postgres: Any, tmp_path: Path, table: str, fault_directory: Path, batches: int = 4
    ) -> None:
        self.url = postgres.endpoint.url
        self.table = table
        self.batches = input_batches(batches)
        self.expected = sorted(row for batch in self.batches for row in batch)
        self.fault_directory = fault_directory
        write_input_files(tmp_path / "in", self.batches)
        self.arguments = [
            "--input",
            str(tmp_path / "in"),
            "--checkpoint",
            str(tmp_path / "checkpoint"),
            "--url",
            postgres.endpoint.jdbc_url,
            "--user",
            postgres.endpoint.user,
            "--table",
            table,
        ]
        with psycopg.connect(self.url) as connection:
            connection.execute(
                f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, name text, version bigint)'
            )

    def in_own_process(self, *extra: str, fault_point: str | None = None) -> DriverRun:
        environment = {faults.FAULT_DIRECTORY_VARIABLE: str(self.fault_directory)}
        return run_driver(
            DRIVER,
            [*self.arguments, *extra],
            timeout=DRIVER_TIMEOUT,
            fault_point=fault_point,
            environment=environment,
        )

    def crash(self, *extra: str, fault_point: str) -> DriverRun:
        crashed = self.in_own_process(*extra, fault_point=fault_point)
        assert crashed.was_killed, crashed.explain()
        return crashed

    def run(self, spark: Any, *extra: str) -> QueryRun:
        arguments = jdbc_sink_driver.parse_arguments([*self.arguments, *extra])
        try:
            await_query(jdbc_sink_driver.start_query(spark, arguments), QUERY_TIMEOUT)
        except Exception as error:  # the query's failure is the result under test
            trace = getattr(error, "_stackTrace", "") or ""
            return QueryRun(False, f"{type(error).__name__}: {error}\n{trace}")
        finally:
            spark.conf.unset(jdbc_sink_driver.CHECKPOINT_CONF)
        return QueryRun(True, "")

    def arm(self, call: str, mode: faults.Mode, batch_id: int) -> None:
        faults.arm(self.fault_directory, call, mode, batch_id)

    def fired(self) -> list[str]:
        return [f"{f['call']} {f['mode']}" for f in faults.injected(self.fault_directory)]

    def ledger(self) -> dict[int, str]:
        return {batch: status for _, batch, _, _, status in pg_ledger(self.url, self.table)}

    def assert_exactly_once(self) -> None:
        assert pg_rows(self.url, self.table) == self.expected
        assert pg_leftovers(self.url, self.table) == (0, 0)
        ledger = pg_ledger(self.url, self.table)
        assert {status for *_, status in ledger} == {"done"}
        assert sorted(batch for _, batch, *_ in ledger) == list(range(len(self.batches)))
