"""2pc-jdbc into MariaDB (the embedded 10.11 server; MySQL 8 takes the same SQL) through
real streaming queries: append and upsert exactly once, values as Spark's JDBC writer
stores them, the url and option refusals, a crash of the query and a SIGKILL of the
server between two batches, each ending with exact row sets and nothing staged left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eospack.connectors.jdbc.dialect import TableName, stage_table
from eospack.lab.testing import await_query
from integration_tests.jdbc_fixtures import stream_input, write_input_files

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 120.0

APPEND_BATCHES = [
    [(1, "a", 1), (2, "", 1), (3, None, 1)],
    [(4, 'd,"quoted"\nline\twith\\backslash', 1), (5, "é🙂", 1)],
    [(6, "f", 1)],
]
UPSERT_BATCHES = [
    [(1, "one@1", 1), (2, "two@5", 5)],
    [(1, "one@3", 3), (2, "two@2", 2), (3, "three@1", 1)],
    [(1, "one@2", 2), (3, "three@4", 4), (3, "three@2", 2), (4, "four@1", 1)],
]
UPSERT_EXPECTED = [(1, "one@3", 3), (2, "two@5", 5), (3, "three@4", 4), (4, "four@1", 1)]


def sink_options(server: Any, table: str, **extra: str) -> dict[str, str]:
    options = {
        "url": server.endpoint.jdbc_url,
        "user": server.endpoint.user,
        "dbtable": table,
        "createTableIfNotExists": "true",
        **extra,
    }
    if server.endpoint.password:
        options["password"] = server.endpoint.password
    return options


def query(server: Any, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    connection = server.endpoint.connect(init_command="SET SESSION time_zone = '+00:00'")
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params or None)
            return list(cursor.fetchall())
    finally:
        connection.close()


def rows(server: Any, table: str) -> list[tuple[Any, ...]]:
    return query(server, f"SELECT id, name, version FROM `{table}` ORDER BY id")


def staged_rows(server: Any, table: str) -> int:
    stage = stage_table(TableName(None, table)).name
    if not query(server, "SELECT 1 FROM information_schema.TABLES WHERE TABLE_NAME = %s", (stage,)):
        return 0
    return int(query(server, f"SELECT count(*) FROM `{stage}`")[0][0])


def ledger(server: Any, table: str) -> list[tuple[Any, ...]]:
    return query(
        server,
        "SELECT batch_id, `rows`, protocol, status FROM eospack_commits WHERE target = %s"
        " ORDER BY batch_id",
        (table,),
    )


def run_query(spark: Any, source: Path, checkpoint: Path, options: dict[str, str]) -> Any:
    running = (
        stream_input(spark, source)
        .writeStream.format("2pc-jdbc")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    await_query(running, QUERY_TIMEOUT)
    return running


@pytest.mark.timeout(300)
@pytest.mark.parametrize("write_mode", ["append", "upsert"])
def test_append_and_upsert_apply_every_row_exactly_once(
    spark, mariadb, tmp_path, unique_name, write_mode
):
    upsert = write_mode == "upsert"
    write_input_files(tmp_path / "in", UPSERT_BATCHES if upsert else APPEND_BATCHES)
    options = sink_options(mariadb, unique_name, writeMode=write_mode)
    if upsert:
        options.update(upsertKeys="id", versionColumn="version")

    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)

    expected = UPSERT_EXPECTED if upsert else sorted(r for b in APPEND_BATCHES for r in b)
    assert rows(mariadb, unique_name) == expected
    assert ledger(mariadb, unique_name) == [
        (0, 3 if not upsert else 2, "staging", "done"),
        (1, 2 if not upsert else 3, "staging", "done"),
        (2, 1 if not upsert else 4, "staging", "done"),
    ]
    assert staged_rows(mariadb, unique_name) == 0

    write_input_files(tmp_path / "in", [[(100, "late", 9)]])
    run_query(spark, tmp_path / "in", tmp_path / "checkpoint", options)
    assert rows(mariadb, unique_name) == sorted([*expected, (100, "late", 9)])
    assert staged_rows(mariadb, unique_name) == 0
